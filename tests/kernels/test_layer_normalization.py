"""The normalizations over the last axes through the generated kernels: LayerNormalization-17,
RMSNormalization-23, ONNX Runtime's SimplifiedLayerNormalization (ai.onnx and com.microsoft) and
com.microsoft SkipLayerNormalization / SkipSimplifiedLayerNormalization, every variant (row_registers,
row_vec4, row_scalar), float32 and float16.

Fresh random inputs every run (the seed is printed on failure), NaN-poisoned outputs, judged against
generated/reference.py's float64 definitions within docs/TESTING.md's tolerances, with ONNX Runtime's
CPU provider beside them (its float32 result against the same reference, so a case the reference
gets wrong shows there too); the ONNX backend node tests of LayerNormalization and RMSNormalization
through run_node, every variant that applies; hostile data (constant rows, rows past float32's
squares, infinities, NaN) and every contract rule refused by name.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from generated import ContractError
from generated import layer_normalization as ln
from generated import rms_normalization as rms
from generated import simplified_layer_normalization as sln
from generated import skip_layer_normalization as skln
from generated import skip_simplified_layer_normalization as sksln
from generated.onnx_nodes import run_node
from tests.device_helpers import poisoned_call
from tests.runtime.hostile_support import assert_refused
from tests.oracles import (
    assert_close,
    backend_node_cases,
    node_reference,
    onnxruntime_run,
    rng_for,
    seed_note,
)

DTYPES = pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
VARIANTS = pytest.mark.parametrize("variant", ["row_registers", "row_vec4", "row_scalar"])
CAPS = {"features": ["shader-f16", "subgroups"]}
# Small teams, so that rows span several invocations and subgroups, three rows a row_registers
# workgroup (f32 rows of 96: teams of 20 in workgroups of 60, a partial last subgroup at width 8).
TUNABLES = {
    "REGISTER_WORKGROUP_SIZE": 20,
    "REGISTER_TARGET_VALUES": 1,
    "REGISTER_SHARED_WORKGROUP_SIZE": 60,
    "WORKGROUP_SIZE": 16,
}
PACKAGES = {
    "ln": ln,
    "rms": rms,
    "sln": sln,
    "skln": skln,
    "sksln": sksln,
}
# (domain, op type, opset) ONNX Runtime runs each as.
ONNX_RUNTIME = {
    "ln": ("", "LayerNormalization", 17),
    "rms": ("", "RMSNormalization", 23),
    "sln": ("", "SimplifiedLayerNormalization", 1),
    "skln": ("com.microsoft", "SkipLayerNormalization", 1),
    "sksln": ("com.microsoft", "SkipSimplifiedLayerNormalization", 1),
}


def type_vars(package, dtype):
    """Every type variable the caller gives, in `dtype`."""
    return {t: np.dtype(dtype).name for t, allowed in package.TYPE_CONSTRAINTS.items() if len(allowed) > 1}


def layer_inputs(rng, op, shape, dtype, param_shape=None, optional=True, skip_shape=None):
    """Inputs of `op` for X of `shape`: X a spread away from zero, its parameters of `param_shape`
    (the last axis by default), the optional ones when `optional`."""
    spread = rng.uniform(0.5, 3.0)
    x = ((rng.standard_normal(shape) + rng.uniform(-2, 2)) * spread).astype(dtype)
    param_shape = shape[-1:] if param_shape is None else param_shape
    if op in ("ln", "rms", "sln"):
        inputs = {"x": x, "scale": np.asarray(rng.uniform(-2, 2, param_shape)).astype(dtype)}
        if op == "ln" and optional:
            inputs["b"] = np.asarray(rng.uniform(-1, 1, param_shape)).astype(dtype)
        return inputs
    skip = (rng.standard_normal(skip_shape or shape) * rng.uniform(0.2, 1.5)).astype(dtype)
    inputs = {"input": x, "skip": skip, "gamma": rng.uniform(-2, 2, shape[-1]).astype(dtype)}
    if optional:
        inputs["bias"] = rng.uniform(-1, 1, shape[-1]).astype(dtype)
        if op == "skln":
            inputs["beta"] = rng.uniform(-1, 1, shape[-1]).astype(dtype)
    return inputs


def every_output(op):
    """Every output the op computes (SkipSimplifiedLayerNormalization's `mean` is refused)."""
    return tuple(t.key for t in PACKAGES[op].OUTPUTS if not (op == "sksln" and t.key == "mean"))


def check(op, inputs, attrs, variant, context, outputs=None, tunables=TUNABLES):
    """The kernel (NaN-poisoned outputs) against the float64 definition, every output at its type's tolerance."""
    package = PACKAGES[op]
    outputs = outputs or every_output(op)
    result = poisoned_call(
        package, inputs, outputs, attrs=attrs, variant=variant, tunables=tunables, caps=CAPS
    )
    expected = node_reference(package, inputs, attrs)
    for key in outputs:
        assert_close(result[key], expected[key], result[key].dtype, f"{context} {key}")
    return result, expected


# ---------------------------------------------------------------------------------------------------------
# Every op, variant and dtype against float64, with ONNX Runtime's CPU result beside


ROW_SHAPES = {
    "row_registers": (2, 5, 96),  # 24 f32 / 12 f16 units a row over teams of 20 / 16 invocations
    "row_vec4": (2, 3, 5, 40),
    "row_scalar": (2, 3, 5, 7),
}


@DTYPES
@VARIANTS
@pytest.mark.parametrize("op", list(PACKAGES))
def test_every_op_and_variant_against_float64_with_onnx_runtime_beside(op, variant, dtype, request):
    rng, seed = rng_for(request.node.name)
    shape = ROW_SHAPES[variant] if op in ("ln", "rms", "sln") else ROW_SHAPES[variant][-3:]
    inputs = layer_inputs(rng, op, shape, dtype)
    attrs = {"epsilon": 1e-3}
    context = f"{op} {variant} {np.dtype(dtype).name} {shape} {seed_note(seed)}"
    result, expected = check(op, inputs, attrs, variant, context)
    domain, op_type, opset = ONNX_RUNTIME[op]
    if (
        op == "ln" or dtype == np.float32
    ):  # ONNX Runtime's CPU LayerNormalization-17 refuses float16 Scale here
        names = [t.role for t in PACKAGES[op].OUTPUTS]
        keys = [t.key for t in PACKAGES[op].OUTPUTS]
        feeds = {t.role: inputs[t.key].astype(np.float32) for t in PACKAGES[op].INPUTS if t.key in inputs}
        theirs = onnxruntime_run(op_type, feeds, attrs, opset, outputs=names, domain=domain)
        for key, value in zip(keys, theirs):
            if key in expected:
                value = np.asarray(value).reshape(expected[key].shape)
                assert_close(value, expected[key], np.float32, f"{context} ONNX Runtime's {key}")


@DTYPES
@pytest.mark.parametrize(
    "shape, axis, scale_shape, bias_shape",
    [
        ((2, 3, 5, 8), 1, (5, 8), (1, 1, 8)),  # a suffix, and a suffix with leading 1s
        ((2, 3, 5, 8), 2, (5, 1), (1,)),  # 1s after the run, and one value for every position
        ((4, 6, 8), 0, (6, 8), (4, 1, 1)),  # axis 0: one row, the whole tensor
        ((3, 7), -1, (7,), None),
        ((3, 8), 1, (), ()),  # 0-d: one value for every position
    ],
)
@pytest.mark.parametrize("variant", ["row_vec4", "row_scalar"])
def test_scale_and_b_broadcast_to_the_normalized_shape(
    shape, axis, scale_shape, bias_shape, variant, dtype, request
):
    """ONNX's unidirectional broadcasting of Scale and B to X.shape[axis:], along one run of its axes."""
    if variant == "row_vec4" and int(np.prod(shape[axis % len(shape) :])) % 4:
        pytest.skip("row_vec4 takes rows of whole vectors")
    rng, seed = rng_for(request.node.name)
    inputs = layer_inputs(rng, "ln", shape, dtype, param_shape=scale_shape, optional=False)
    if bias_shape is not None:
        inputs["b"] = np.asarray(rng.uniform(-1, 1, bias_shape)).astype(dtype)
    for op in ("ln", "rms"):
        op_inputs = inputs if op == "ln" else {"x": inputs["x"], "scale": inputs["scale"]}
        check(op, op_inputs, {"axis": axis}, variant, f"{op} {variant} {shape} axis {axis} {seed_note(seed)}")


@pytest.mark.parametrize("variant", ["row_vec4", "row_scalar"])
@pytest.mark.parametrize(
    "t, v", [(np.float16, np.float32), (np.float32, np.float16)], ids=["f16-f32", "f32-f16"]
)
@pytest.mark.parametrize("op", ["rms", "sln"])
def test_rms_forms_take_scale_of_its_own_type(op, t, v, variant, request):
    """RMSNormalization-23 and SimplifiedLayerNormalization: scale and Y are V, X is T; Y in V."""
    rng, seed = rng_for(request.node.name)
    inputs = {"x": (rng.standard_normal((3, 4, 24)) + 1).astype(t), "scale": rng.uniform(-2, 2, 24).astype(v)}
    result, _ = check(op, inputs, {}, variant, f"{op} {variant} {seed_note(seed)}")
    assert result["y"].dtype == v
    plan = PACKAGES[op].plan({"x": (3, 4, 24), "scale": (24,)}, {"T": t, "V": v}, caps=CAPS)
    assert plan.variant == "row_vec4"  # row_registers holds one type: T = V


@pytest.mark.parametrize("op", sorted(PACKAGES))
def test_row_registers_sizes_a_team_by_values_and_long_rows_by_bytes(op):
    """row_registers sizes a row's team by the row's values (REGISTER_TARGET_VALUES, 16 an
    invocation), not by its 16-byte units, so an f16 row gets the invocations of an f32 row of its
    length (a 320-value f16 row got 16, half a subgroup, and ran 40 % slower than f32 on an H100);
    past REGISTER_LONG_ROW_TEAM (128) a team grows only while an invocation would read more than 64
    bytes of the row's inputs: 4096-value f16 rows of the ops without a skip take 128 invocations
    (8-12 % faster than 256 on an H200), those with input and skip keep 256."""
    package = PACKAGES[op]
    keys = {t.key for t in package.INPUTS}
    long_f16_team = 256 if "skip" in keys else 128
    for hidden, invocations in ((320, 32), (640, 64), (4096, 256)):
        shapes = {k: (hidden,) for k in ("scale", "gamma") if k in keys}
        shapes[package.INPUTS[0].key] = (8, hidden)
        if "skip" in keys:
            shapes["skip"] = (8, hidden)
        for t in ("float32", "float16"):
            dtypes = {tv: t for tv in {i.type_var for i in package.INPUTS if i.type_var}}
            plan = package.plan(shapes, dtypes, caps=CAPS)
            assert plan.variant == "row_registers", (op, hidden, t, plan.explanation)
            expected = long_f16_team if (hidden, t) == (4096, "float16") else invocations
            assert dict(plan.passes[0].pipeline_constants)["rowInvocations"] == expected, (op, hidden, t)


@pytest.mark.parametrize("team, workgroup", [(20, 160), (32, 160), (8, 256)])
@pytest.mark.parametrize("op", sorted(PACKAGES))
def test_a_row_has_the_same_bits_wherever_it_sits_in_a_shared_workgroup(op, team, workgroup, request):
    """Identical rows in every team of shared workgroups, some ending in a partial subgroup (160 at
    width 8 is whole, at width 32 or 64 it is not; teams of 20 straddle subgroups): every row's
    outputs are the same bits. A partial last subgroup inside one team used to pool its mean while
    the other teams took each invocation's own, which moved the last bits of some rows."""
    package = PACKAGES[op]
    rng, seed = rng_for(request.node.name)
    hidden = team * 4  # one f32 unit an invocation
    row = (rng.standard_normal(hidden) * 3 + 50).astype(np.float32)
    inputs = layer_inputs(rng, op, (2, 11, hidden), np.float32)
    inputs[package.INPUTS[0].key] = np.broadcast_to(row, (2, 11, hidden)).copy()
    if "skip" in inputs:
        inputs["skip"] = np.broadcast_to(inputs["skip"][0, 0], (2, 11, hidden)).copy()
    tunables = {
        "REGISTER_WORKGROUP_SIZE": team,
        "REGISTER_TARGET_VALUES": 1,
        "REGISTER_SHARED_WORKGROUP_SIZE": workgroup,
        "REGISTER_SHARED_READ_BYTES": 1 << 20,
    }
    plan = package.plan(
        {k: v.shape for k, v in inputs.items()}, type_vars(package, np.float32), caps=CAPS, tunables=tunables
    )
    constants = dict(plan.passes[0].pipeline_constants)
    assert (plan.variant, constants["rowInvocations"], constants["workgroupSize"]) == (
        "row_registers",
        team,
        workgroup,
    )
    result = poisoned_call(package, inputs, variant="row_registers", tunables=tunables, caps=CAPS)
    for key, value in result.items():
        rows = value.reshape(22, -1)
        assert (rows == rows[0]).all(), f"{op} {key}: rows differ by position {seed_note(seed)}"


@pytest.mark.parametrize("skip_shape", [(2, 9, 64), (9, 64), (1, 9, 64)], ids=["full", "2d", "batch-1"])
@pytest.mark.parametrize("op", ["skln", "sksln"])
@VARIANTS
def test_skip_is_full_or_repeated_over_the_batch(variant, op, skip_shape, request):
    rng, seed = rng_for(request.node.name)
    inputs = layer_inputs(rng, op, (2, 9, 64), np.float32, skip_shape=skip_shape)
    check(op, inputs, {"epsilon": 1e-5}, variant, f"{op} {variant} skip {skip_shape} {seed_note(seed)}")


# ---------------------------------------------------------------------------------------------------------
# The ONNX backend node tests, through run_node, every variant that applies


def _variants_for(package, inputs):
    shapes = {k: v.shape for k, v in inputs.items()}
    names = []
    for variant in ("row_registers", "row_vec4", "row_scalar"):
        try:
            package.plan(shapes, type_vars(package, inputs["x"].dtype), caps=CAPS, variant=variant)
        except ContractError:
            continue
        names.append(variant)
    return names


@pytest.mark.parametrize("prefix", ["test_layer_normalization", "test_rms_normalization"])
def test_onnx_backend_node_tests_through_run_node(prefix, device):
    cases = backend_node_cases(prefix)
    assert cases, f"the onnx wheel has no {prefix} node tests"
    package = ln if "layer" in prefix else rms
    ran = 0
    for name, model, data_sets in cases:
        (node,) = model.graph.node
        opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
        for inputs, outputs in data_sets:
            bound = dict(zip(("x", "scale", "b"), inputs))
            for variant in _variants_for(package, bound) or [None]:
                got = run_node(node, inputs, opset=opset, device=device, variant=variant)
                for expected, actual in zip(outputs, got):
                    assert_close(actual, expected, expected.dtype, f"{name} {variant}")
                ran += 1
    assert ran >= len(cases)


def test_run_node_runs_every_form_of_the_family(device):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 5, 16)).astype(np.float32)
    g, b = rng.uniform(0.5, 1.5, (2, 16)).astype(np.float32)
    skip = rng.standard_normal((5, 16)).astype(np.float32)
    nodes = [
        (helper.make_node("LayerNormalization", ["x", "g", "b"], ["y", "m", "i"]), [x, g, b], 17, "ln"),
        (helper.make_node("RMSNormalization", ["x", "g"], ["y"]), [x, g], 23, "rms"),
        (helper.make_node("SimplifiedLayerNormalization", ["x", "g"], ["y", "i"]), [x, g], 21, "sln"),
        (
            helper.make_node("SimplifiedLayerNormalization", ["x", "g"], ["y", "i"], domain="com.microsoft"),
            [x, g],
            1,
            "sln",
        ),
        (
            helper.make_node(
                "SkipLayerNormalization",
                ["x", "s", "g", "", "b"],
                ["y", "", "i", "sum"],
                domain="com.microsoft",
            ),
            [x, skip, g, None, b],
            1,
            "skln",
        ),
        (
            helper.make_node(
                "SkipSimplifiedLayerNormalization", ["x", "s", "g"], ["y", "", "i"], domain="com.microsoft"
            ),
            [x, skip, g],
            1,
            "sksln",
        ),
    ]
    for node, values, opset, op in nodes:
        got = run_node(node, values, opset=opset, device=device)
        package = PACKAGES[op]
        bound = {t.key: v for t, v in zip(package.INPUTS, values) if v is not None}
        expected = node_reference(package, bound, {})
        for t, name, value in zip(package.OUTPUTS, node.output, got):
            if name:
                assert_close(value, expected[t.key], np.float32, f"{node.domain} {node.op_type} {t.key}")
            else:
                assert value is None


# ---------------------------------------------------------------------------------------------------------
# Hostile data


@DTYPES
@VARIANTS
@pytest.mark.parametrize("op", ["ln", "skln"])
def test_constant_rows_normalize_to_the_offset(op, variant, dtype, request):
    """Variance 0: Y is B (beta) exactly, Mean the value, InvStdDev 1 / sqrt(epsilon)."""
    rng, seed = rng_for(request.node.name)
    shape = (2, 4, 48)
    inputs = layer_inputs(rng, op, shape, dtype)
    first = "x" if op == "ln" else "input"
    inputs[first][0] = 1000.0
    if op == "skln":
        inputs["skip"][:] = 0.0
        inputs["bias"][:] = 0.0
    result, expected = check(op, inputs, {"epsilon": 1e-5}, variant, f"{op} {variant} {seed_note(seed)}")
    y = result["y" if op == "ln" else "output"]
    offset = inputs["b" if op == "ln" else "beta"]
    np.testing.assert_array_equal(y[0], np.broadcast_to(offset, y[0].shape), err_msg=seed_note(seed))


HUGE_CONSTANT_ROWS = [
    (variant, value)
    for variant in ("row_registers", "row_vec4", "row_scalar")
    for value in (3e19, 3e37, 3e38, -1e30)
    # row_registers takes deviations from each subgroup's mean, an ulp off a constant row's value:
    # past about 1e25 that ulp's square passes float32, and the row is one whose squared deviations
    # do (Y is 0, as below). The walks shift by a value of the row: their deviations are exact 0s.
    if variant != "row_registers" or abs(value) < 1e25
]


@pytest.mark.parametrize("variant, value", HUGE_CONSTANT_ROWS)
@pytest.mark.parametrize("op", ["rms", "sln", "sksln"])
def test_rms_of_huge_constant_float32_rows_stays_inside_float32(op, value, variant, request):
    """mean(X^2) of constant rows of 3e19 .. 3e38 is past float32 (and 1 / RMS of 3e38 is not a
    normal float32); the kernels scale the row's mean and spread by a power of two first, so Y is
    the definition's X / |X| * scale."""
    rng, seed = rng_for(request.node.name)
    inputs = layer_inputs(rng, op, (2, 4, 48), np.float32)
    first = "x" if op != "sksln" else "input"
    inputs[first][0] = value
    if op == "sksln":
        inputs["skip"][0] = 0.0
        inputs["bias"][:] = 0.0
    check(op, inputs, {"epsilon": 1e-6}, variant, f"{op} {variant} {value} {seed_note(seed)}")


@VARIANTS
@pytest.mark.parametrize("pattern", ["0-2e19-2e19-2e19", "random-1e30"])
@pytest.mark.parametrize("op", ["rms", "sln", "sksln"])
def test_rms_of_rows_beyond_float32_squares_is_zero(op, pattern, variant, request):
    """Statistics are float32 (as ONNX Runtime's CPU kernels): a row whose squared deviations pass
    float32's range has 1 / RMS of 0, so Y is 0, as such a row's LayerNormalization Y is its B
    (tests/kernels/test_f32_overflow.py); the other rows match the float64 definition."""
    rng, seed = rng_for(request.node.name)
    inputs = layer_inputs(rng, op, (2, 4, 48), np.float32)
    first = "x" if op != "sksln" else "input"
    if pattern == "random-1e30":
        inputs[first][0] = rng.standard_normal((4, 48)) * 1e30
    else:
        inputs[first][0] = np.resize(np.array([0.0, 2e19, 2e19, 2e19], np.float32), (4, 48))
    if op == "sksln":
        inputs["skip"][0] = 0.0
        inputs["bias"][:] = 0.0
    package = PACKAGES[op]
    y = poisoned_call(package, inputs, variant=variant, tunables=TUNABLES, caps=CAPS)[package.OUTPUTS[0].key]
    context = f"{op} {variant} {pattern} {seed_note(seed)}"
    np.testing.assert_array_equal(y[0], np.zeros_like(y[0]), err_msg=context)
    expected = node_reference(package, inputs, {})[package.OUTPUTS[0].key]
    assert_close(y[1:], expected[1:], np.float32, context + " (the other batch item)")


@VARIANTS
@pytest.mark.parametrize("op", list(PACKAGES))
def test_infinity_and_nan_give_nan_in_their_row_only(op, variant, request):
    """A row holding an infinity or a NaN: its statistics are NaN, so its Y and InvStdDev are NaN
    (the definition's for a NaN, and for an infinity in LayerNormalization; RMS's definition gives
    x / inf = 0 off the infinity, which float32 statistics cannot tell from a NaN row); S holds the
    value itself; every other row as usual."""
    rng, seed = rng_for(request.node.name)
    inputs = layer_inputs(rng, op, (2, 3, 48), np.float32)
    first = "x" if "x" in inputs else "input"
    inputs[first][0, 0, 5] = np.inf
    inputs[first][1, 2, 0] = np.nan
    bad_rows = np.zeros((2, 3, 1), bool)
    bad_rows[0, 0] = bad_rows[1, 2] = True
    package = PACKAGES[op]
    outputs = every_output(op)
    result = poisoned_call(package, inputs, outputs, variant=variant, tunables=TUNABLES, caps=CAPS)
    with np.errstate(invalid="ignore"):
        expected = node_reference(package, inputs, {})
    for key in outputs:
        got, want = np.asarray(result[key], np.float64), expected[key]
        context = f"{op} {variant} {key} {seed_note(seed)}"
        bad = np.broadcast_to(bad_rows, got.shape)
        if key == "input_skip_bias_sum":  # the sum holds the values themselves
            np.testing.assert_array_equal(got[~np.isfinite(want)], want[~np.isfinite(want)], err_msg=context)
        else:
            assert np.isnan(got[bad]).all(), context
        fine = np.isfinite(want) & ~bad
        assert_close(got[fine], want[fine], result[key].dtype, context + " (the other rows)")


# ---------------------------------------------------------------------------------------------------------
# The contract: every rule refused by name, before any GPU work


def test_contract_refusals_name_the_input_or_attribute():
    x, s = np.ones((2, 3, 4), np.float32), np.ones(4, np.float32)
    op = ln.OP
    assert_refused(lambda: ln.kernel({"x": x, "scale": s}, attrs={"axis": 3}), op, ("axis",))
    assert_refused(lambda: ln.kernel({"x": x, "scale": s}, attrs={"axis": -4}), op, ("axis",))
    assert_refused(lambda: ln.kernel({"x": x, "scale": s}, attrs={"stash_type": 16}), op, ("stash_type",))
    assert_refused(lambda: ln.kernel({"x": x, "scale": np.ones(5, np.float32)}), op, ("scale",))
    # Scale of more axes than the normalized shape, and one whose dims over 1 are not one run.
    assert_refused(lambda: ln.kernel({"x": x, "scale": np.ones((3, 4), np.float32)}), op, ("scale",))
    x4 = np.ones((2, 3, 5, 4), np.float32)
    scale = np.ones((3, 1, 4), np.float32)
    error = assert_refused(lambda: ln.kernel({"x": x4, "scale": scale}, attrs={"axis": 1}), op, ("scale",))
    assert "consecutive" in str(error)
    assert_refused(lambda: ln.kernel({"x": x, "scale": s, "b": np.ones(3, np.float32)}), op, ("b",))
    assert_refused(lambda: ln.kernel({"x": np.ones((), np.float32), "scale": s}), op, ("x",))
    assert_refused(lambda: rms.kernel({"x": x, "scale": s}, attrs={"axis": 5}), rms.OP, ("axis",))
    g = np.ones(4, np.float32)
    for package in (skln, sksln):
        assert_refused(
            lambda: package.kernel({"input": x, "skip": x[:1, :2], "gamma": g}), package.OP, ("skip",)
        )
        assert_refused(
            lambda: package.kernel({"input": x, "skip": x, "gamma": g[:3]}), package.OP, ("gamma",)
        )
        x4 = np.ones((1, 2, 3, 4), np.float32)
        assert_refused(lambda: package.kernel({"input": x4, "skip": x4, "gamma": g}), package.OP, ("input",))
        assert_refused(
            lambda: package.kernel({"input": x, "skip": x, "gamma": g, "bias": g[:2]}), package.OP, ("bias",)
        )
    error = assert_refused(
        lambda: sksln.kernel({"input": x, "skip": x, "gamma": g}, outputs=("output", "mean")),
        sksln.OP,
        ("mean",),
    )
    assert "never computed" in str(error)


def test_float16_scale_needs_shader_f16_even_for_float32_x():
    error = assert_refused(
        lambda: rms.plan(
            {"x": (2, 4), "scale": (4,)}, {"T": "float32", "V": "float16"}, caps={"features": []}
        ),
        rms.OP,
        ("V",),
    )
    assert "shader-f16" in str(error)


def test_a_row_of_no_values_has_nan_statistics():
    """X.shape[axis:] with a 0 and Mean asked for: the mean of nothing is NaN, as in the definition."""
    x = np.zeros((2, 3, 0), np.float32)
    result = ln.kernel({"x": x, "scale": np.zeros(0, np.float32)}, outputs=("y", "mean", "invStdDev"))
    assert result["y"].shape == (2, 3, 0)
    assert result["mean"].shape == (2, 3, 1) and np.isnan(result["mean"]).all()
    assert np.isnan(result["invStdDev"]).all()


def test_the_statistics_copy_runs_only_for_statistics_asked_for():
    """A pass dispatched with no workgroups is left out of the plan: no pipeline, no bind group."""
    shapes = {"x": (2, 8, 64), "scale": (64,)}
    plain = ln.plan(shapes, {"T": "float32"}, caps=CAPS)
    assert [p.name for p in plain.passes] == ["main"]
    with_stats = ln.plan(shapes, {"T": "float32"}, caps=CAPS, outputs=("y", "invStdDev"))
    assert [p.name for p in with_stats.passes] == ["main", "statsOut"]
    # The statistics are float32 (U has one type: the caller gives none), in X's shape kept as 1s.
    assert with_stats.outputs["invStdDev"] == ((2, 8, 1), "float32")
