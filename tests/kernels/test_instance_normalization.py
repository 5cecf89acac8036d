"""InstanceNormalization-6 through the generated kernels: every variant x dtype forced, natural
selection and its thresholds, folded dispatches, the subgroup path of the split-k partials (at
lavapipe's subgroup width and, in a child process, at widths 4 and 8), the ONNX backend node tests
(through natural selection) and the contract errors. Variants plane_batched_vec4, plane_splitk_vec4
and plane_splitk have their own templates; plane_row_registers (GroupNorm's norm-row-registers
template with one channel a group) and plane_splitk_registers (GroupNorm's norm-splitk-partials /
-apply templates, likewise) have files of their own beside this one.

Every case runs on the wgpu device (Mesa's software Vulkan in CI) with fresh random inputs per run
(the seed is printed on failure), outputs poisoned with NaN before the run, and is compared with a
float64 NumPy reference (docs/TESTING.md tolerances) and with onnxruntime on the CPU. Variants are forced with `variant=` (with tunables that make their
`when` hold on small shapes) and also reached by natural selection.
"""

from __future__ import annotations

import numpy as np
import pytest

from generated import ContractError
from generated import instance_normalization as inn
from tests.kernels.instance_norm_support import (
    CASES,
    NO_ROW_REGISTERS,
    SPLIT_SMALL,
    SPLIT_VARIANTS,
    SUBGROUP_CAPS,
    assert_matches_both_oracles,
    case_id,
    dtypes_of,
    pick,
    random_inputs,
    reference,
    run_at_subgroup_size,
    run_poisoned,
    shapes_of,
)
from tests.oracles import assert_close, backend_node_cases, rng_for, seed_note


# --- every variant x dtype, forced -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_forced_variant_against_reference_and_onnxruntime(case, dtype, caps, request):
    variant, shape, tunables = case
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, shape, dtype)
    epsilon = float(rng.choice([1e-5, 1e-3, 0.1]))
    kwargs = {"attrs": {"epsilon": epsilon}, "variant": variant, "tunables": tunables}
    plan = inn.plan(shapes_of(inputs), dtypes_of(inputs), caps=caps, **kwargs)
    assert plan.variant == variant
    first = plan.passes[0]
    if variant in SPLIT_VARIANTS:
        assert first.dispatch[2] == first.values["split"] > 1, first
        # Workgroup memory within instanceRowWorkgroupBytes (normWorkgroupCap * 16: a vec4
        # summary a subgroup slot, or a (count, hi, lo, M2) summary a lane for the tree).
        assert first.workgroup_storage_bytes <= first.overrides["workgroupSize"] * 16
    else:
        # Within instanceBatchedVec4StorageBytes (normWorkgroupCap * 4 * 4 + planesPerWorkgroup * 4:
        # a (count, hi, lo, M2) summary a lane).
        bound = first.overrides["workgroupSize"] * 16 + first.uniforms["planesPerWorkgroup"] * 4
        assert 0 < first.workgroup_storage_bytes <= bound, first
    actual = run_poisoned(inputs, **kwargs)
    context = f"{variant} {shape} {np.dtype(dtype).name} eps={epsilon} {seed_note(seed)}"
    assert_matches_both_oracles(actual, inputs, epsilon, dtype, context)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize(
    "case",
    pick(
        ("plane_batched_vec4", (5, 60, 4, 4)),
        ("plane_batched_vec4", (2, 9, 160)),
        ("plane_splitk_vec4", (2, 3, 40)),
        ("plane_splitk_vec4", (1, 4, 256, 256)),
        ("plane_splitk", (2, 3, 5, 7)),
        ("plane_splitk", (2, 2, 3, 3, 5)),
    ),
    ids=case_id,
)
def test_large_common_offset_keeps_accuracy(case, dtype, request):
    """Shifted Welford / two-step merges, the mean as a pair: a mean 1000 (f32) or 100 (f16) times the spread costs nothing."""
    variant, shape, tunables = case
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, shape, dtype, offset=1000.0 if dtype == np.float32 else 100.0)
    actual = run_poisoned(inputs, variant=variant, tunables=tunables)
    assert_close(actual, reference(inputs, 1e-5), dtype, f"{variant} {shape} offset {seed_note(seed)}")


@pytest.mark.parametrize(
    "case",
    pick(("plane_batched_vec4", (2, 9, 12)), ("plane_splitk_vec4", (2, 3, 40)), ("plane_splitk", (2, 3, 37))),
    ids=case_id,
)
def test_constant_planes_give_bias(case, request):
    """Zero variance: every element of a constant plane is exactly its channel's bias."""
    variant, shape, tunables = case
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, shape, np.float32)
    inputs["input"][0, 1] = 7.25
    inputs["input"][1, 2] = -3.0
    actual = run_poisoned(inputs, variant=variant, tunables=tunables)
    assert_close(actual, reference(inputs, 1e-5), np.float32, f"{variant} {shape} {seed_note(seed)}")
    assert np.all(actual[0, 1] == inputs["b"][1]) and np.all(actual[1, 2] == inputs["b"][2])


@pytest.mark.parametrize(
    "case",
    pick(
        ("plane_batched_vec4", (2, 9, 12)),
        ("plane_batched_vec4", (3, 100, 36)),
        ("plane_splitk_vec4", (2, 3, 40)),
        ("plane_splitk_vec4", (1, 4, 256, 256)),
        ("plane_splitk", (2, 3, 37)),
        ("plane_splitk", (1, 3, 257, 257)),
    ),
    ids=case_id,
)
def test_repeated_runs_are_bit_identical(case, request):
    variant, shape, tunables = case
    rng, _ = rng_for(request.node.name)
    inputs = random_inputs(rng, shape, np.float32)
    first = run_poisoned(inputs, variant=variant, tunables=tunables)
    for _ in range(2):
        assert run_poisoned(inputs, variant=variant, tunables=tunables).tobytes() == first.tobytes()


# --- natural selection ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize(
    "shape,tunables,expected",
    [
        # 262144 elements, 4 planes < 32; an f16 plane of 65536 values fits plane_row_registers'
        # registers (16 units an invocation): an SM proxy of 1 rules it out here.
        ((1, 4, 256, 256), NO_ROW_REGISTERS, "plane_splitk_registers"),
        ((1, 3, 257, 257), {}, "plane_splitk"),  # spatial 66049 is odd
        ((2, 3, 40), {**SPLIT_SMALL, **NO_ROW_REGISTERS}, "plane_splitk_registers"),  # lowered thresholds
        # 44 values a plane: whole f32 units only, so f16 falls back to plane_splitk_vec4.
        (
            (2, 3, 44),
            {**SPLIT_SMALL, **NO_ROW_REGISTERS},
            {"float32": "plane_splitk_registers", "float16": "plane_splitk_vec4"},
        ),
        ((2, 2, 3, 3, 5), SPLIT_SMALL, "plane_splitk"),
        ((5, 60, 4, 4), {}, "plane_batched_vec4"),  # no subgroup sizes reported: not demoted
        ((1, 70000, 4), {}, "plane_batched_vec4"),
        # Planes that fit the register budget on this device (subgroups): one workgroup a plane
        # of 3136 values, two a plane of 25600 values.
        ((1, 32, 56, 56), {}, "plane_row_registers"),
        ((1, 8, 160, 160), {}, "plane_row_registers"),
    ],
)
def test_natural_selection_against_reference_and_onnxruntime(shape, tunables, expected, dtype, caps, request):
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, shape, dtype)
    if isinstance(expected, dict):
        expected = expected[np.dtype(dtype).name]
    assert inn.plan(shapes_of(inputs), dtypes_of(inputs), caps=caps, tunables=tunables).variant == expected
    actual = run_poisoned(inputs, tunables=tunables)
    context = f"{expected} {shape} {np.dtype(dtype).name} {seed_note(seed)}"
    assert_matches_both_oracles(actual, inputs, 1e-5, dtype, context)


def chosen(shape, dtype="float32", caps=None, tunables=None):
    c = shape[1]
    return inn.plan(
        {"input": shape, "scale": (c,), "b": (c,)},
        {"T": dtype},
        caps=caps or {"features": ["shader-f16"]},
        tunables=tunables,
    ).variant


def test_selection_thresholds():
    """Split-k is preferred for fewer planes than SPLIT_STATS_BELOW_PLANES (128, about a large GPU's
    SM count) of at least SPLIT_STATS_MIN_SPATIAL values; the subgroup width plays no part. Planes
    of whole 16-byte units (4 f32 / 8 f16 values) take plane_splitk_registers, planes of whole
    vec4s only plane_splitk_vec4, the others plane_splitk."""
    registers = "plane_splitk_registers"
    assert chosen((1, 4, 256, 256)) == registers
    assert chosen((1, 4, 256, 256), "float16") == registers
    assert chosen((1, 32, 256, 256)) == registers
    assert chosen((1, 127, 256, 256)) == registers
    assert chosen((1, 128, 256, 256)) not in (
        registers,
        "plane_splitk_vec4",
    )  # planes < SPLIT_STATS_BELOW_PLANES fails
    assert chosen((1, 4, 256, 255)) != "plane_splitk"  # spatial 65280 < SPLIT_STATS_MIN_SPATIAL
    assert chosen((1, 4, 257, 257)) == "plane_splitk"
    assert chosen((1, 4, 65540)) == registers  # 16385 f32 units
    assert chosen((1, 4, 65540), "float16") == "plane_splitk_vec4"  # not whole f16 units
    wave64 = {"features": ["subgroups"], "adapterInfo": {"subgroupMinSize": 64, "subgroupMaxSize": 64}}
    assert chosen((1, 40, 256, 256), caps=wave64) == registers
    assert chosen((1, 40, 256, 256), tunables={"SPLIT_STATS_BELOW_PLANES": 40}) not in (
        registers,
        "plane_splitk_vec4",
    )
    assert chosen((1, 4, 64, 64), tunables={"SPLIT_STATS_MIN_SPATIAL": 4096}) == registers


def test_workgroup_defaults_per_variant_kind():
    """WORKGROUP_SIZE (1024, capped by the device) sizes the one-workgroup-per-plane variants; the
    batched and split-k variants keep min(WORKGROUP_SIZE, BATCHED_/SPLIT_WORKGROUP_SIZE = 256)."""
    big = {
        "features": ["shader-f16"],
        "limits": {"maxComputeInvocationsPerWorkgroup": 1024, "maxComputeWorkgroupSizeX": 1024},
    }

    def workgroups(shape, caps, tunables=None):
        c = shape[1]
        p = inn.plan(
            {"input": shape, "scale": (c,), "b": (c,)}, {"T": "float32"}, caps=caps, tunables=tunables
        )
        return p.variant, [q.workgroup_size for q in p.passes]

    assert workgroups((1, 32, 224, 224), big) == ("plane_subgroup_vec4", [1024])
    assert workgroups((1, 32, 224, 224), {"features": ["shader-f16"]}) == (
        "plane_subgroup_vec4",
        [256],
    )  # default limits
    assert workgroups((1, 4, 65540), big) == ("plane_splitk_registers", [128, 128])  # CHUNK_WORKGROUP_SIZE
    assert workgroups((1, 4, 65540), big, {"CHUNK_WORKGROUP_SIZE": 1024}) == (
        "plane_splitk_registers",
        [1024, 1024],
    )
    assert workgroups((1, 4, 65540), big, {"CHUNK_WORKGROUP_SIZE": 2048}) == (
        "plane_splitk_registers",
        [1024, 1024],
    )
    assert workgroups((1, 4, 65539), big) == ("plane_splitk", [256, 64, 256])
    assert workgroups((1, 4, 65539), big, {"SPLIT_WORKGROUP_SIZE": 1024}) == (
        "plane_splitk",
        [1024, 64, 1024],
    )
    assert workgroups((1, 4, 65539), big, {"WORKGROUP_SIZE": 128}) == ("plane_splitk", [128, 64, 128])
    assert workgroups((5, 300, 4, 4), big) == ("plane_batched_vec4", [256])
    assert workgroups((5, 300, 4, 4), big, {"BATCHED_WORKGROUP_SIZE": 100}) == ("plane_batched_vec4", [64])


def test_demoted_batched_variant_only_wins_without_reported_sizes():
    """with reported (non-wave32) subgroup sizes plane_batched_vec4 is demoted and can
    never win; without them it wins on priority (115 over plane_subgroup_vec4's 110)."""
    sized = {
        "features": ["shader-f16", "subgroups"],
        "adapterInfo": {"subgroupMinSize": 4, "subgroupMaxSize": 64},
    }
    assert chosen((5, 60, 4, 4)) == "plane_batched_vec4"
    assert chosen((5, 60, 4, 4), caps=sized) == "plane_subgroup_vec4"
    # Over 65535 planes the demotion no longer holds.
    assert chosen((1, 70000, 4), caps=sized) == "plane_batched_vec4"
    # Too few planes for a full workgroup of them.
    assert chosen((1, 100, 4, 4)) == "plane_subgroup_vec4"


# --- folded dispatches -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "variant,shape,tunables,folded_pass",
    [
        # 70000 planes, one a workgroup: 70000 workgroups fold into (65535, 2).
        (
            "plane_batched_vec4",
            (1, 70000, 4),
            {"WORKGROUP_SIZE": 1, "BATCHED_MIN_PLANES_PER_WORKGROUP": 1},
            0,
        ),
        (
            "plane_batched_vec4",
            (1, 70000, 8),
            {"WORKGROUP_SIZE": 2, "BATCHED_MIN_PLANES_PER_WORKGROUP": 1},
            0,
        ),
        # The apply pass: 66560 vec4 / 66667 values at 1 / 2 a workgroup.
        ("plane_splitk_vec4", (1, 2, 512, 260), {"WORKGROUP_SIZE": 1}, 2),
        ("plane_splitk", (1, 2, 66667), {"WORKGROUP_SIZE": 2}, 2),
    ],
)
def test_dispatch_folds_past_65535_workgroups(variant, shape, tunables, folded_pass, caps, request):
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, shape, np.float32)
    plan = inn.plan(shapes_of(inputs), dtypes_of(inputs), caps=caps, tunables=tunables, variant=variant)
    assert plan.passes[folded_pass].dispatch == (65535, 2, 1)
    actual = run_poisoned(inputs, variant=variant, tunables=tunables)
    assert_close(actual, reference(inputs, 1e-5), np.float32, f"{variant} {shape} folded {seed_note(seed)}")


@pytest.mark.parametrize(
    "variant,shape,tunables",
    [
        # 30 planes: the row passes fold; split-k takes at most 7 planes there, its apply pass folds.
        (
            "plane_batched_vec4",
            (5, 6, 4, 4),
            {"BATCHED_MIN_PLANES_PER_WORKGROUP": 1, "BATCHED_WORKGROUP_SIZE": 4},
        ),
        ("plane_subgroup_vec4", (5, 6, 4, 4), {}),
        ("plane_subgroup", (5, 6, 4, 4), {}),
        ("plane_splitk_vec4", (1, 6, 4, 4), {**SPLIT_SMALL, "WORKGROUP_SIZE": 2}),
        ("plane_splitk", (1, 6, 4, 4), {**SPLIT_SMALL, "WORKGROUP_SIZE": 2}),
        # 6 planes x 4 chunks of one unit: 24 workgroups fold into (7, 4) in both passes.
        (
            "plane_splitk_registers",
            (1, 6, 4, 4),
            {"SPLIT_STATS_MIN_SPATIAL": 1, "CHUNK_WORKGROUP_SIZE": 1, "CHUNK_UNITS_F32": 1},
        ),
    ],
)
def test_dispatch_folds_at_a_small_device_limit(variant, shape, tunables, request):
    """A device of 7 workgroups a dimension: the shaders rebuild the flat workgroup index with
    DISPATCH_FOLD_WIDTH (7), as the dispatch folds, not with the literal 65535 they once used."""
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, shape, np.float32)
    caps = {"features": ["shader-f16"], "limits": {"maxComputeWorkgroupsPerDimension": 7}}
    plan = inn.plan(shapes_of(inputs), dtypes_of(inputs), caps=caps, tunables=tunables, variant=variant)
    assert any(p.dispatch[1] > 1 for p in plan.passes), [p.dispatch for p in plan.passes]
    actual = run_poisoned(inputs, variant=variant, tunables=tunables, caps=caps)
    assert_close(actual, reference(inputs, 1e-5), np.float32, f"{variant} folded at 7 {seed_note(seed)}")


def test_batched_variant_natural_at_70000_planes(caps):
    plan = inn.plan({"input": (1, 70000, 4), "scale": (70000,), "b": (70000,)}, {"T": "float32"}, caps=caps)
    assert plan.variant == "plane_batched_vec4"
    assert plan.passes[0].dispatch == (274, 1, 1)  # 256 planes a workgroup


# --- the subgroup path of the split-k partials ----------------------------------------------------


SUBGROUP_WORKGROUP_SIZES = (1, 2, 4, 32, 256)


def check_subgroup_partials(workgroup_size, dtype, name):
    rng, seed = rng_for(name)
    # 520 vec4 a plane in 2 splits of 260: every lane of every workgroup size has data.
    inputs = random_inputs(rng, (2, 3, 4, 520), dtype)
    tunables = {**SPLIT_SMALL, "WORKGROUP_SIZE": workgroup_size, "STATS_VALUES_PER_SPLIT": 1040}
    kwargs = {"variant": "plane_splitk_vec4", "caps": SUBGROUP_CAPS, "tunables": tunables}
    plan = inn.plan(shapes_of(inputs), dtypes_of(inputs), **kwargs)
    assert plan.passes[0].uses_subgroups and "subgroupAdd" in plan.passes[0].wgsl
    actual = run_poisoned(inputs, **kwargs)
    context = f"subgroup partials wg={workgroup_size} {seed_note(seed)}"
    assert_close(actual, reference(inputs, 1e-5), dtype, context)
    assert run_poisoned(inputs, **kwargs).tobytes() == actual.tobytes(), context


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("workgroup_size", SUBGROUP_WORKGROUP_SIZES)
def test_splitk_subgroup_partials(workgroup_size, dtype, request):
    """Workgroups smaller than, equal to and larger than the subgroup, in this process (whatever
    subgroup size lavapipe picks here: see the subprocess test for sizes it is made to use)."""
    check_subgroup_partials(workgroup_size, dtype, request.node.name)


SUBGROUP_SIZE_SCRIPT = """
import sys
import numpy as np
from tests.kernels import test_instance_normalization as t
from tests.device_helpers import measured_subgroup_size
size = measured_subgroup_size()
if size != int(sys.argv[1]):
    print(f"lavapipe gave subgroup size {size}, expected {sys.argv[1]}")
    sys.exit(3)
for wg in t.SUBGROUP_WORKGROUP_SIZES:
    for dtype in (np.float32, np.float16):
        t.check_subgroup_partials(wg, dtype, f"subgroup{size}-{wg}-{np.dtype(dtype).name}")
print("ok")
"""


@pytest.mark.parametrize("vector_width,subgroup_size", [(128, 4), (256, 8)])
def test_splitk_subgroup_partials_at_known_subgroup_size(vector_width, subgroup_size):
    """The same cases in a process where lavapipe runs subgroups of a known size.

    Mesa's on-disk shader cache does not key on LP_NATIVE_VECTOR_WIDTH: a pipeline compiled at one
    width is silently reused at another. The subprocess runs with the cache off, so its subgroup
    size really is the one asked for.
    """
    result = run_at_subgroup_size(SUBGROUP_SIZE_SCRIPT, subgroup_size, vector_width, 120)
    if result.returncode == 3 and vector_width != 128:
        pytest.skip(
            f"this CPU's lavapipe does not honour LP_NATIVE_VECTOR_WIDTH={vector_width}: {result.stdout.strip()}"
        )
    assert result.returncode == 0 and "ok" in result.stdout, result.stdout[-4000:] + result.stderr[-4000:]


# --- the ONNX backend node tests -------------------------------------------------------------------


def pytest_generate_tests(metafunc):
    # Building the ONNX node cases takes seconds: only at collection, not on a plain import
    # (the subgroup-size subprocesses import this module).
    if "node_case" in metafunc.fixturenames:
        metafunc.parametrize("node_case", backend_node_cases("test_instancenorm"), ids=lambda c: c[0])


def test_onnx_backend_node_cases(node_case):
    name, model, data_sets = node_case
    node = model.graph.node[0]
    attrs = {a.name: a.f for a in node.attribute}
    for inputs, outputs in data_sets:
        feed = dict(zip(("input", "scale", "b"), inputs))
        actual = inn.kernel(feed, attrs=attrs)["output"]
        assert_close(actual, np.asarray(outputs[0], np.float64), feed["input"].dtype, name)


# --- contract errors, each before any GPU work ----------------------------------------------------


def good(dtype=np.float32, shape=(2, 3, 4)):
    c = shape[1]
    return {"input": np.ones(shape, dtype), "scale": np.ones(c, dtype), "b": np.ones(c, dtype)}


@pytest.mark.parametrize(
    "change,subject,words",
    [
        ({"input": np.ones((2, 3), np.float32)}, "input input", "ranks.input >= 3"),
        ({"input": np.ones((3,), np.float32)}, "input input", "ranks.input >= 3"),
        ({"scale": np.ones(4, np.float32)}, "input scale", "dim(shapes.scale, 0) == dim(shapes.input, 1)"),
        ({"scale": np.ones((3, 1), np.float32)}, "input scale", "ranks.scale == 1"),
        ({"b": np.ones(2, np.float32)}, "input b", "dim(shapes.b, 0) == dim(shapes.input, 1)"),
        ({"b": np.ones((1, 3), np.float32)}, "input b", "ranks.B == 1"),
        ({"scale": np.ones(3, np.float16)}, "input scale", "every T tensor must share one dtype"),
        ({"b": np.ones(3, np.float16)}, "input b", "every T tensor must share one dtype"),
        ({"input": np.ones((2, 3, 4), np.float64)}, "input input", "float64 is not supported"),
    ],
)
def test_contract_errors_name_op_input_and_rule(change, subject, words):
    inputs = {**good(), **change}
    with pytest.raises(ContractError) as caught:
        inn.kernel(inputs)
    text = str(caught.value)
    assert text.startswith("ai.onnx InstanceNormalization-6: ") and subject in text and words in text, text
    assert isinstance(caught.value, ValueError)


def test_tensor_over_the_storage_binding_limit_is_planned_in_pieces():
    caps = {"features": ["shader-f16"], "limits": {"maxStorageBufferBindingSize": 64 * 1024}}
    shapes = {"input": (2, 3, 64, 64), "scale": (3,), "b": (3,)}  # 96 KiB of f32
    plan = inn.plan(shapes, {"T": "float32"}, caps=caps)
    assert len(plan.chunks) == 2 and plan.explanation[0].startswith("chunked: 2 pieces"), plan.explanation
    # Half the size fits in one piece.
    assert not inn.plan({**shapes, "input": (1, 3, 64, 64)}, {"T": "float32"}, caps=caps).chunks
    with pytest.raises(ContractError) as caught:  # one plane of 16 KiB over an 8 KiB binding
        inn.plan(shapes, {"T": "float32"}, caps={**caps, "limits": {"maxStorageBufferBindingSize": 8 * 1024}})
    text = str(caught.value)
    assert (
        text.startswith("ai.onnx InstanceNormalization-6: input input: ")
        and "maxStorageBufferBindingSize" in text
    ), text


def test_f16_needs_the_device_feature():
    shapes = {k: v.shape for k, v in good().items()}
    with pytest.raises(ContractError, match=r"f16Ok\(dtypes.T\)"):
        inn.plan(shapes, {"T": "float16"}, caps={"features": []})
