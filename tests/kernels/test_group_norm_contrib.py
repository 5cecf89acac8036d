"""com.microsoft GroupNorm (ONNX Runtime's contrib op, as its Stable Diffusion optimizer writes it)
through the generated kernels: every variant (registers, split, fused), both layouts, T and M in
float32 and float16, SiLU on and off.

Every kernel call runs on the wgpu device (Mesa's software Vulkan in CI) with fresh random inputs
per run (seeded by tests.oracles.rng_for; the seed is printed on failure) and NaN-poisoned outputs
(out=), and is compared with generated/reference.py's float64 `microsoft_group_norm` under
docs/TESTING.md's tolerances. Also: hostile rows (an outlier anywhere in a row, a large common
offset, float16's extremes, constant rows); Y bit-identical to SkipGroupNorm's with a zero skip
(the op is SkipGroupNorm's shaders without the skip) while its shaders bind, read and add no skip;
bit-identical repeated runs; selection as SkipGroupNorm's on the Stable Diffusion bench shapes; and
every contract rule refused with a ContractError naming the input or attribute as the caller did,
by plan() (which touches no device) and by kernel() before it uploads anything. ONNX Runtime's CPU
provider has no GroupNorm kernel: tests/tools/test_onnx_nodes.py's check_model chain runs it beside as
standard ops.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from generated import ContractError
from generated import group_norm as mgn
from generated import skip_group_norm as sgn
from generated.group_norm.cases import BENCH_CASES
from tests.device_helpers import poisoned_call
from tests.oracles import assert_close, microsoft_group_norm_for_call, rng_for, seed_note

# (variant, channels_last): registers takes channels-last X only.
CONFIGS = [("registers", 1), ("split", 1), ("split", 0), ("fused", 1), ("fused", 0)]
CONFIG_IDS = [f"{v}-{'nhwc' if c else 'nchw'}" for v, c in CONFIGS]
# Rows over several invocations, lane rows, slabs and (registers) two workgroups a row.
TUNABLES = {
    "WORKGROUP_SIZE": 16,
    "SLAB_VALUES": 32,
    "FUSED_WORKGROUP_SIZE": 16,
    "REGISTER_SPLIT_MIN_VALUES": 1,
    "REGISTER_WORKGROUP_SIZE": 16,
    "REGISTER_MIN_POSITION_LANES": 4,
}
SUBGROUP_CAPS = {"features": ["shader-f16", "subgroups"]}
DTYPES = {"f32": np.float32, "f16": np.float16}
# (channels, groups, N, H, W, activation): 8, 6 and 3 (registers: 2) channels a group take vec4,
# vec2 and scalar vectors (registers: 16-, 8- and 4-byte units).
SHAPES = [(32, 4, 2, 5, 6, 1), (24, 4, 2, 3, 7, 0), (12, 4, 3, 4, 5, 1)]
REGISTER_SHAPES = [(32, 4, 2, 5, 6, 1), (24, 4, 2, 3, 7, 0), (8, 4, 3, 4, 5, 1)]


def x_shape(n, c, h, w, channels_last):
    return (n, h, w, c) if channels_last else (n, c, h, w)


def call(inputs, attrs, variant, **kwargs):
    """The kernel into NaN-poisoned outputs, the variant forced, with TUNABLES."""
    return poisoned_call(mgn, inputs, ("Y",), attrs=attrs, variant=variant, tunables=TUNABLES, **kwargs)["Y"]


def random_inputs(rng, shape, c, t, m, offset=2.0):
    return {
        "X": ((rng.standard_normal(shape) + rng.uniform(-offset, offset)) * rng.uniform(0.5, 3)).astype(t),
        "gamma": rng.uniform(-2, 2, c).astype(m),
        "beta": rng.uniform(-1, 1, c).astype(m),
    }


@pytest.mark.parametrize("m", ["f32", "f16"])
@pytest.mark.parametrize("t", ["f32", "f16"])
@pytest.mark.parametrize("variant,channels_last", CONFIGS, ids=CONFIG_IDS)
def test_every_variant_layout_and_type(variant, channels_last, t, m, request):
    rng, seed = rng_for(request.node.name)
    for c, groups, n, h, w, activation in REGISTER_SHAPES if variant == "registers" else SHAPES:
        shape = x_shape(n, c, h, w, channels_last)
        inputs = random_inputs(rng, shape, c, DTYPES[t], DTYPES[m])
        attrs = {"groups": groups, "activation": activation, "channels_last": channels_last}
        y = call(inputs, attrs, variant)
        context = f"{variant} T={t} M={m} X {shape} {attrs} {seed_note(seed)}"
        assert_close(y, microsoft_group_norm_for_call(inputs, attrs), DTYPES[t], context)


def test_epsilon_and_the_default_layout():
    """epsilon reaches the shaders (a large one changes Y by the definition's amount); channels_last
    left out is 1 (NHWC)."""
    rng = np.random.default_rng(7)
    inputs = random_inputs(rng, (2, 3, 4, 16), 16, np.float32, np.float32)
    for epsilon in (1e-5, 0.5, 4.0):
        attrs = {"groups": 2, "activation": 0, "epsilon": epsilon}
        y = poisoned_call(mgn, inputs, attrs=attrs)["Y"]
        assert_close(y, microsoft_group_norm_for_call(inputs, attrs), np.float32, f"epsilon {epsilon}")


# --- hostile rows ----------------------------------------------------------------------------------------


def hostile_rows(rng, rows, length, pattern, f16):
    """(rows, length) float64 values of one pattern, every one a value float16 holds."""
    if pattern == "outlier-anywhere":
        x = 3.0 + 0.5 * rng.standard_normal((rows, length))
        x[np.arange(rows), rng.integers(0, length, rows)] = rng.choice([-3e3, 3e3], rows)
    elif pattern == "large-offset":
        x = 1e4 + (64.0 if f16 else 1.0) * rng.uniform(-1, 1, (rows, length))
    elif pattern == "f16-extremes":  # float16's largest, its subnormals and zero, mixed
        x = rng.choice([65504.0, -65504.0, 6e4, -6e4, 2.0**-24, -(2.0**-20), 0.0], (rows, length))
        x[:, 0] = 65504.0  # no row is constant
        x[:, 1] = -65504.0
    else:  # constant rows, a value of their own each: variance 0, Y = beta (SiLU of it)
        x = np.repeat(rng.uniform(-3e4, 3e4, (rows, 1)), length, axis=1)
    return x


@pytest.mark.parametrize("t", ["f32", "f16"])
@pytest.mark.parametrize("pattern", ["outlier-anywhere", "large-offset", "f16-extremes", "constant"])
@pytest.mark.parametrize("variant,channels_last", CONFIGS, ids=CONFIG_IDS)
def test_hostile_rows(variant, channels_last, pattern, t, request):
    rng, seed = rng_for(request.node.name)
    n, c, groups, hw = 2, 16, 2, 30
    dtype = DTYPES[t]
    rows = hostile_rows(rng, n * groups, c // groups * hw, pattern, dtype == np.float16)
    nchw = rows.reshape(n, c, 5, 6)  # a (batch item, group) row is contiguous in NCHW
    x = nchw.transpose(0, 2, 3, 1) if channels_last else nchw
    inputs = {
        "X": np.ascontiguousarray(x).astype(dtype),
        "gamma": rng.uniform(-2, 2, c).astype(np.float32),
        "beta": rng.uniform(-1, 1, c).astype(np.float32),
    }
    attrs = {"groups": groups, "activation": int(rng.integers(0, 2)), "channels_last": channels_last}
    y = call(inputs, attrs, variant)
    context = f"{variant} {pattern} T={t} {attrs} {seed_note(seed)}"
    assert_close(y, microsoft_group_norm_for_call(inputs, attrs), dtype, context)


# --- SkipGroupNorm's shaders without the skip ----------------------------------------------------------


@pytest.mark.parametrize("t", ["f32", "f16"])
@pytest.mark.parametrize("variant,channels_last", CONFIGS, ids=CONFIG_IDS)
def test_y_is_skip_group_norms_with_a_zero_skip_bit_for_bit(variant, channels_last, t, request):
    """X + 0 is X exactly, rounded to T or not: the same statistics and the same Y, bit for bit, from
    shaders that never read a skip."""
    rng, seed = rng_for(request.node.name)
    shape = x_shape(2, 24, 5, 6, channels_last)
    inputs = random_inputs(rng, shape, 24, DTYPES[t], np.float32)
    attrs = {"groups": 4, "activation": 1, "channels_last": channels_last}
    y = call(inputs, attrs, variant)
    zero_skip = {**inputs, "skip": np.zeros((2, 24), DTYPES[t])}
    skip_y = poisoned_call(sgn, zero_skip, ("Y",), attrs=attrs, variant=variant, tunables=TUNABLES)["Y"]
    assert y.tobytes() == skip_y.tobytes(), f"{variant} T={t} {seed_note(seed)}"
    again = call(inputs, attrs, variant)
    assert again.tobytes() == y.tobytes(), f"{variant} T={t}: a repeated run differs, {seed_note(seed)}"


@pytest.mark.parametrize("t", ["float32", "float16"])
@pytest.mark.parametrize("variant,channels_last", CONFIGS, ids=CONFIG_IDS)
def test_no_pass_binds_reads_or_rounds_a_skip(variant, channels_last, t):
    """GroupNorm pays for no skip: its passes bind X, gamma, beta, Y and (split) the scratch partials
    only, and no shader declares or reads a skip, a bias or S, or rounds to binary16 (`half`)."""
    shape = x_shape(2, 24, 5, 6, channels_last)
    p = mgn.plan(
        {"X": shape, "gamma": (24,), "beta": (24,)},
        {"T": t, "M": "float32"},
        attrs={"groups": 4, "activation": 1, "channels_last": channels_last},
        variant=variant,
        tunables=TUNABLES,
        caps=SUBGROUP_CAPS,
    )
    for q in p.passes:
        storage = {b.resource for b in q.bindings if b.kind != "uniform"}
        assert storage <= {"X", "gamma", "beta", "Y", "partials", "stats"}, (q.name, storage)
        code = re.sub(r"//[^\n]*", "", q.wgsl)  # the notes name the op's template, skip-group-norm-*
        for word in ("skip", "sumOut", "bias", "half"):
            assert not re.search(rf"\b{word}\w*\b", code), (q.name, word)


# --- selection ---------------------------------------------------------------------------------------------

# The H200's facts as wgpu reports them: subgroups, 1024 invocations a workgroup.
H200_CAPS = {
    **SUBGROUP_CAPS,
    "limits": {"maxComputeInvocationsPerWorkgroup": 1024, "maxComputeWorkgroupSizeX": 1024},
}


@pytest.mark.parametrize("caps", [H200_CAPS, {"features": ["shader-f16"]}], ids=["h200", "no-subgroups"])
@pytest.mark.parametrize("case", BENCH_CASES, ids=[c["name"] for c in BENCH_CASES])
def test_bench_shapes_select_as_skip_group_norm(case, caps):
    """The Stable Diffusion bench shapes take SkipGroupNorm's variant for the same X and an (N, C)
    skip (its rules and tunables, measured there); on the H200 the 64x64x320 rows (10 f16 channels a
    group: 4-byte register units, registers demoted; 64 rows of 40960 values, fused demoted) and the
    64x64x640 rows (64 words an invocation, over REGISTER_MAX_UNITS: 77.0 against 26.2 us on split on
    an H100) go to split, the others to registers."""
    x = tuple(case["inputs"]["X"])
    dtypes = {"T": "float16", "M": "float32"}
    ours = mgn.plan(case["inputs"], dtypes, attrs=case["attrs"], caps=caps).variant
    skip = {**case["inputs"], "skip": (x[0], x[3])}
    assert ours == sgn.plan(skip, dtypes, attrs=case["attrs"], caps=caps).variant
    if caps is H200_CAPS:
        assert ours == ("split" if x[1:] in ((64, 64, 320), (64, 64, 640)) else "registers"), (x, ours)


def test_register_lanes_fit_workgroup_memory_as_skip_group_norms():
    """With 8192 bytes of workgroup memory a 20-channel f16 group's 5 units get 32 positions (160
    invocations: 16 bytes each and 4100 more fit), as SkipGroupNorm's rule gives, not a workgroup of
    640 that does not fit and left the row to fused."""
    caps = {**H200_CAPS, "limits": {**H200_CAPS["limits"], "maxComputeWorkgroupStorageSize": 8192}}
    shapes = {"X": (1, 16, 16, 640), "gamma": (640,), "beta": (640,)}
    attrs = {"groups": 32, "activation": 1, "channels_last": 1}
    dtypes = {"T": "float16", "M": "float32"}
    plan = mgn.plan(shapes, dtypes, attrs=attrs, caps=caps)
    assert plan.variant == "registers", plan.explanation
    assert plan.passes[0].workgroup_size == 160 and plan.passes[0].workgroup_storage_bytes <= 8192


# --- contract errors, each before any GPU work -------------------------------------------------------------


def good(channels_last=1, t=np.float32, m=np.float32):
    shape = (2, 3, 4, 8) if channels_last else (2, 8, 3, 4)
    return {"X": np.ones(shape, t), "gamma": np.ones(8, m), "beta": np.zeros(8, m)}


ATTRS = {"groups": 4, "activation": 1}
REFUSED = [
    ({}, {"groups": 3, "activation": 1}, "attribute groups", "(gnChannels % attrs.groups) == 0"),
    ({}, {"groups": 16, "activation": 1}, "attribute groups", "gnChannels = 8, attrs.groups = 16"),
    ({}, {"groups": 0, "activation": 1}, "attribute groups", "attrs.groups >= 1"),
    ({}, {"groups": -4, "activation": 1}, "attribute groups", "attrs.groups >= 1"),
    ({}, {"groups": 2.5, "activation": 1}, "attribute groups", "expected an integer"),
    ({}, {"activation": 1}, "attribute groups", "required"),
    ({}, {"groups": 4}, "attribute activation", "required"),
    ({}, {"groups": 4, "activation": 2}, "attribute activation", "not supported (allowed: 0, 1)"),
    ({}, {"groups": 4, "activation": -1}, "attribute activation", "not supported (allowed: 0, 1)"),
    ({}, {**ATTRS, "channels_last": 2}, "attribute channels_last", "not supported (allowed: 0, 1)"),
    ({}, {**ATTRS, "channels_last": -1}, "attribute channels_last", "not supported (allowed: 0, 1)"),
    ({}, {**ATTRS, "channels_last": True}, "attribute channels_last", "channels_last"),
    ({}, {**ATTRS, "epsilon": float("nan")}, "attribute epsilon", "epsilon"),
    ({}, {**ATTRS, "alpha": 1.0}, "attribute alpha", "unknown attribute"),
    ({"gamma": np.ones(9, np.float32)}, ATTRS, "input gamma", "dim(shapes.gamma, 0) == gnChannels"),
    ({"gamma": np.ones(3, np.float32)}, ATTRS, "input gamma", "gnChannels = 8"),
    ({"beta": np.ones(4, np.float32)}, ATTRS, "input beta", "dim(shapes.beta, 0) == gnChannels"),
    ({"gamma": np.ones((8, 1), np.float32)}, ATTRS, "input gamma", "ranks.gamma == 1"),
    ({"beta": np.ones((1, 8), np.float32)}, ATTRS, "input beta", "ranks.beta == 1"),
    ({"X": np.ones((2, 12, 8), np.float32)}, ATTRS, "input X", "ranks.X == 4"),
    ({"X": np.ones((2, 3, 4, 2, 8), np.float32)}, ATTRS, "input X", "ranks.X == 4"),
]
# Refused by the types of the tensors given (plan() takes one dtype a type variable): kernel() only.
REFUSED_DTYPES = [
    ({"beta": np.zeros(8, np.float16)}, "input beta", "every M tensor must share one dtype"),
    ({"X": np.ones((2, 3, 4, 8), np.float64)}, "input X", "float64 is not supported"),
    ({"gamma": np.ones(8, np.int32)}, "input gamma", "int32"),
]


@pytest.mark.parametrize(
    "change,attrs,subject,words", REFUSED, ids=[f"{r[2]}-{i}" for i, r in enumerate(REFUSED)]
)
def test_contract_errors_name_op_subject_and_rule(change, attrs, subject, words):
    inputs = {**good(), **change}
    dtypes = {"T": inputs["X"].dtype.name, "M": inputs["gamma"].dtype.name}
    shapes = {k: v.shape for k, v in inputs.items()}
    for refuse in (
        lambda: mgn.plan(shapes, dtypes, attrs=attrs, caps={"features": ["shader-f16"]}),
        lambda: mgn.kernel(inputs, attrs=attrs),
    ):
        with pytest.raises(ContractError) as caught:
            refuse()
        text = str(caught.value)
        assert text.startswith("com.microsoft GroupNorm-1: ") and subject in text and words in text, text


@pytest.mark.parametrize("change,subject,words", REFUSED_DTYPES, ids=[r[1] for r in REFUSED_DTYPES])
def test_dtype_errors_name_the_input(change, subject, words):
    with pytest.raises(ContractError) as caught:
        mgn.kernel({**good(), **change}, attrs=ATTRS)
    text = str(caught.value)
    assert text.startswith("com.microsoft GroupNorm-1: ") and subject in text and words in text, text


def test_the_callers_role_names_and_the_nchw_channel_axis():
    """Bind keys are the ONNX names; in NCHW the channels are axis 1, so an NHWC-sized gamma is refused."""
    inputs = good(channels_last=0)
    attrs = {**ATTRS, "channels_last": 0}
    mgn.plan({k: v.shape for k, v in inputs.items()}, {"T": "float32", "M": "float32"}, attrs=attrs)
    with pytest.raises(ContractError, match="input gamma: .*gnChannels = 8"):
        mgn.kernel({**inputs, "gamma": np.ones(4, np.float32)}, attrs=attrs)
    with pytest.raises(ContractError, match="required input beta is missing"):
        mgn.kernel({**inputs, "beta": None}, attrs=attrs)


def test_float16_x_needs_shader_f16_and_float16_gamma_does_not():
    shapes = {k: v.shape for k, v in good().items()}
    with pytest.raises(ContractError, match="dtype T: float16 needs the device feature shader-f16"):
        mgn.plan(shapes, {"T": "float16", "M": "float32"}, attrs=ATTRS, caps={"features": []})
    assert mgn.plan(shapes, {"T": "float32", "M": "float16"}, attrs=ATTRS, caps={"features": []}).variant
    with pytest.raises(ContractError, match="does not apply: needs device feature subgroups"):
        mgn.plan(
            shapes, {"T": "float32", "M": "float32"}, attrs=ATTRS, variant="registers", caps={"features": []}
        )
    channels_first = {k: v.shape for k, v in good(channels_last=0).items()}
    with pytest.raises(ContractError, match="variant 'registers' does not apply"):
        mgn.plan(
            channels_first,
            {"T": "float32", "M": "float32"},
            attrs={**ATTRS, "channels_last": 0},
            variant="registers",
            caps=SUBGROUP_CAPS,
        )


def test_an_onnx_node_with_channels_last_2_is_refused_by_name():
    """ONNX Runtime's CUDA kernel reads any non-zero channels_last as 1; the schema names 0 and 1, and
    the contract here takes only those."""
    from onnx import helper

    from generated.onnx_nodes import run_node

    node = helper.make_node(
        "GroupNorm",
        ["X", "gamma", "beta"],
        ["Y"],
        domain="com.microsoft",
        groups=4,
        activation=1,
        channels_last=2,
    )
    inputs = good()
    with pytest.raises(ContractError, match="attribute channels_last: .*allowed: 0, 1"):
        run_node(node, [inputs["X"], inputs["gamma"], inputs["beta"]], opset=1)
    node = helper.make_node(
        "GroupNorm", ["X", "gamma", "beta"], ["Y"], domain="com.microsoft", groups=4.0, activation=1
    )
    with pytest.raises(
        ContractError, match="attribute groups: .*an ONNX INT attribute; the node gives a FLOAT"
    ):
        run_node(node, [inputs["X"], inputs["gamma"], inputs["beta"]], opset=1)
