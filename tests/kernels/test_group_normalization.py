"""GroupNormalization-21 through the generated kernels: the split-k variants group_splitk,
group_splitk_vec4 and group_splitk_vec4_pairs, what every variant shares (bit-identical repeated runs,
chained device tensors), the ONNX backend node tests and the contract errors. The other variants have
files of their own: test_group_normalization_stash16.py (group_stash_f16_serial),
test_group_normalization_row_registers.py and test_group_normalization_splitk_registers.py.

Every case runs on the wgpu device (Mesa's software Vulkan in CI) with fresh random inputs per run
(the seed is printed on failure) and NaN-poisoned outputs, against tests/oracles.py's
group_normalization_ref with docs/TESTING.md tolerances and against onnxruntime, which runs
GroupNormalization-21 by expanding its ONNX function body.

group_splitk: pass `partials` reduces `split` contiguous chunks of each (batch item, group) row into
(mean0_k, lo_k, M2_k) (the chunk mean as a pair); pass `apply` merges them in two fixed-order steps
(the mean, then the squared deviations about it) and normalizes its chunk. Small STATS_VALUES_PER_SPLIT / SPLIT_STATS_MIN_HIDDEN tunables give several
splits on small data; the natural path needs groupHidden >= 65536 and at most 256 rows.
group_splitk_vec4 is the same with vec4 loads (spatial % 4 == 0: chunks of whole vectors); both
merge the partials once per workgroup (per-invocation runs, then a fixed tree).
group_splitk_vec4_pairs (chosen for f16) has each invocation take two vectors, workgroupSize apart,
in every block of 2 * workgroupSize vectors of its chunk, in both passes.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from generated import ContractError, Tensor
from generated import group_normalization as gn
from tests.kernels.group_norm_support import (
    DTYPES,
    F16_CAPS,
    NO_F16_CAPS,
    SMALL_SPLITS,
    SPLIT_SHORT_ROWS,
    SPLIT_VARIANTS,
    VEC4_SPLIT_VARIANTS,
    plan_for,
    random_inputs,
    reference,
    run_poisoned,
)
from tests.oracles import (
    assert_close,
    backend_node_cases,
    group_normalization_ref,
    onnxruntime_run,
    rng_for,
    seed_note,
)


# --- group_splitk ------------------------------------------------------------------------------------

# (shape, num_groups, tunables, expected split): ranks 3 to 5, N > 1, num_groups 1 and C, C not a
# multiple of 4, rows on both sides of one split (64 values) and of MAX_STATS_SPLITS (32 by default, 64 set).
SPLITK_CASES = [
    ((3, 5, 13), 5, SMALL_SPLITS, 1),  # num_groups == C, 13 values: one chunk
    ((1, 4, 16), 1, SMALL_SPLITS, 1),  # exactly one split's worth
    ((2, 5, 13), 1, SMALL_SPLITS, 2),  # 65 values: just over
    ((2, 6, 5, 7), 3, SMALL_SPLITS, 2),
    ((2, 3, 64), 1, SMALL_SPLITS, 4),  # 192 values: 3 splits' worth, rounded up to 4 chunks of 48
    ((1, 6, 4, 5, 9), 2, SMALL_SPLITS, 16),  # rank 5, 540 values
    ((2, 4, 1, 2000), 2, SMALL_SPLITS, 32),  # 125 splits' worth, capped at MAX_STATS_SPLITS (32)
    ((2, 4, 1, 2000), 2, {**SMALL_SPLITS, "MAX_STATS_SPLITS": 64}, 64),  # capped at 64
    ((2, 3, 7), 1, {**SMALL_SPLITS, "STATS_VALUES_PER_SPLIT": 1}, 32),  # 21 values in 32 chunks: 11 empty
    ((2, 6, 5, 7), 2, {**SMALL_SPLITS, "WORKGROUP_SIZE": 1}, 2),  # one invocation a workgroup
    ((2, 7, 9, 11), 7, {**SMALL_SPLITS, "WORKGROUP_SIZE": 100}, 2),  # 64 invocations for chunks of 50 and 49
    ((1, 6, 300), 3, {**SMALL_SPLITS, "WORKGROUP_SIZE": 33}, 16),  # 32 invocations for chunks of 37 or 38
    # spatial % 4 == 0, for the vec4 variants too: 6 vectors in 32 chunks (26 empty); 64 partials
    # merged by 32 invocations, 2 each; SPLIT_WORKGROUP_SIZE alone sets the split-k workgroup.
    ((2, 3, 8), 1, {**SMALL_SPLITS, "STATS_VALUES_PER_SPLIT": 1}, 32),
    (
        (2, 6, 4, 24),
        2,
        {**SMALL_SPLITS, "STATS_VALUES_PER_SPLIT": 4, "WORKGROUP_SIZE": 32, "MAX_STATS_SPLITS": 64},
        64,
    ),
    ((2, 8, 3, 8), 4, {**SMALL_SPLITS, "SPLIT_WORKGROUP_SIZE": 2}, 1),
]


@DTYPES
@pytest.mark.parametrize(
    "shape,num_groups,tunables,split", SPLITK_CASES, ids=[f"{s}-g{g}-split{k}" for s, g, t, k in SPLITK_CASES]
)
@pytest.mark.parametrize("variant", SPLIT_VARIANTS)
def test_splitk_against_float64_reference(variant, shape, num_groups, tunables, split, dtype, request):
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, shape, dtype, offset=3.0)
    attrs = {"num_groups": num_groups, "epsilon": float(rng.choice([1e-5, 1e-3, 0.1]))}
    if variant in VEC4_SPLIT_VARIANTS and int(np.prod(shape[2:])) % 4:
        with pytest.raises(ContractError, match="does not apply"):
            plan_for(inputs, attrs, tunables=tunables, caps=F16_CAPS, variant=variant)
        return
    p = plan_for(inputs, attrs, tunables=tunables, caps=F16_CAPS, variant=variant)
    assert [q.values["split"] for q in p.passes] == [split, split]
    assert [q.dispatch for q in p.passes] == [(shape[0] * num_groups, 1, split)] * 2
    if "SPLIT_WORKGROUP_SIZE" in tunables:
        assert p.passes[0].workgroup_size == tunables["SPLIT_WORKGROUP_SIZE"]
    actual = run_poisoned(inputs, attrs=attrs, tunables=tunables, variant=variant)
    assert_close(
        actual, reference(inputs, attrs), dtype, f"{variant} {shape} {attrs} {tunables} {seed_note(seed)}"
    )


# (shape, num_groups, {dtype: (variant, split or chunks)}): 65536, 66560, 65728 and 67596 values a row,
# with group_splitk_registers preferred at any row length (CHUNK_MIN_HIDDEN 1; at its default,
# rows under 512K values keep the older split-k, see test_selection_thresholds) and the design
# spike's f16 chunks (CHUNK_UNITS_F16 4): chunks of 128 x 8 f32 / 128 x 4 f16 units (4096 values),
# 16 chunks, or 17 with a short last chunk; rows of whole vec4s but not whole f16 units take
# group_splitk_vec4_pairs for f16, rows of odd spatial size group_splitk.
NATURAL_SPLITK_TUNABLES = {"CHUNK_MIN_HIDDEN": 1, "CHUNK_UNITS_F16": 4}
NATURAL_SPLITK_CASES = [
    (
        (1, 32, 64, 64),
        2,
        {"float32": ("group_splitk_registers", 16), "float16": ("group_splitk_registers", 16)},
    ),
    (
        (2, 16, 32, 130),
        1,
        {"float32": ("group_splitk_registers", 17), "float16": ("group_splitk_registers", 17)},
    ),
    (
        (1, 16, 4, 1027),
        1,
        {"float32": ("group_splitk_registers", 17), "float16": ("group_splitk_vec4_pairs", 32)},
    ),
    ((2, 8, 129, 131), 2, {"float32": ("group_splitk", 32), "float16": ("group_splitk", 32)}),
]


@DTYPES
@pytest.mark.parametrize(
    "shape,num_groups,expected",
    NATURAL_SPLITK_CASES,
    ids=["1x32x64x64-g2", "2x16x32x130-g1", "1x16x4x1027-g1", "2x8x129x131-g2"],
)
def test_splitk_is_selected_naturally_and_agrees_with_onnxruntime(
    shape, num_groups, expected, dtype, request
):
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, shape, dtype)
    attrs = {"num_groups": num_groups}
    p = plan_for(inputs, attrs, caps=F16_CAPS, tunables=NATURAL_SPLITK_TUNABLES)
    variant, parts = expected[np.dtype(dtype).name]
    assert p.variant == variant
    assert p.passes[0].values["chunks" if variant == "group_splitk_registers" else "split"] == parts
    actual = run_poisoned(inputs, attrs=attrs, tunables=NATURAL_SPLITK_TUNABLES)
    assert_close(actual, reference(inputs, attrs), dtype, f"{shape} vs float64 {seed_note(seed)}")
    ort = dict(zip(("X", "scale", "bias"), inputs.values()))
    (expected,) = onnxruntime_run("GroupNormalization", ort, attrs, opset=21)
    assert_close(actual, expected.astype(np.float64), dtype, f"{shape} vs onnxruntime {seed_note(seed)}")


def test_selection_thresholds():
    """group_splitk needs groupHidden >= 65536 and at most 256 rows; stash_type 10 always takes
    group_stash_f16_serial (priority 1000), on f32 tensors even without shader-f16."""

    def chosen(shape, num_groups, stash_type=1, caps=F16_CAPS, dtype="float32", tunables=None, **kwargs):
        c = shape[1]
        attrs = {"num_groups": num_groups, "stash_type": stash_type}
        tunables = {"CHUNK_MIN_HIDDEN": 1} | (tunables or {})  # its own threshold is tested below
        return gn.plan(
            {"x": shape, "scale": (c,), "bias": (c,)},
            {"T": dtype},
            attrs=attrs,
            caps=caps,
            tunables=tunables,
            **kwargs,
        ).variant

    registers = "group_splitk_registers"
    # Rows under CHUNK_MIN_HIDDEN (512K values) put it behind the older split-k variants.
    at_default = {"CHUNK_MIN_HIDDEN": 524288}
    assert chosen((1, 1, 524284), 1, tunables=at_default) == "group_splitk_vec4"
    assert chosen((1, 1, 524288), 1, tunables=at_default) == registers
    assert chosen((1, 1, 524280), 1, dtype="float16", tunables=at_default) == "group_splitk_vec4_pairs"
    assert chosen((1, 1, 524288), 1, dtype="float16", tunables=at_default) == registers
    # Where no older split-k applies (8 rows over a device's 7 workgroups a dimension), it is not
    # demoted: the one-workgroup-a-row variants do not go ahead of it.
    narrow = {"features": ["shader-f16"], "limits": {"maxComputeWorkgroupsPerDimension": 7}}
    big_chunks = {**at_default, "CHUNK_UNITS_F32": 16, "CHUNK_WORKGROUP_SIZE": 256}
    assert chosen((8, 1, 65536), 1, caps=narrow, tunables=big_chunks) == registers
    assert chosen((1, 32, 64, 64), 2) == registers  # 65536 values a row
    assert chosen((1, 32, 64, 64), 4) not in SPLIT_VARIANTS + (registers,)  # 32768
    assert chosen((1, 2, 32767), 1) not in SPLIT_VARIANTS + (registers,)  # 65534
    assert chosen((1, 1, 65536), 1) == registers
    assert chosen((1, 1, 65537), 1) == "group_splitk"  # spatial not a multiple of 4
    assert chosen((256, 1, 65536), 1) == registers
    assert chosen((257, 1, 65536), 1) not in SPLIT_VARIANTS + (
        registers,
    )  # more rows than SPLIT_STATS_MAX_ROWS
    assert chosen((2, 6, 5, 7), 3, tunables=SMALL_SPLITS) == "group_splitk"
    assert chosen((2, 6, 5, 8), 3, tunables=SMALL_SPLITS) == registers
    # Rows of whole 16-byte units: 8 f16 values a unit. Otherwise two vec4<f16> an invocation
    # (8-byte loads; group_splitk_vec4_pairs, demoted for f32).
    assert chosen((1, 32, 64, 64), 2, dtype="float16") == registers
    assert chosen((2, 6, 5, 8), 3, dtype="float16", tunables=SMALL_SPLITS) == registers
    assert chosen((1, 1, 65540), 1) == registers
    assert chosen((1, 1, 65540), 1, dtype="float16") == "group_splitk_vec4_pairs"
    assert chosen((2, 6, 5, 4), 3, dtype="float16", tunables=SMALL_SPLITS) == "group_splitk_vec4_pairs"
    assert chosen((1, 1, 65537), 1, dtype="float16") == "group_splitk"
    assert chosen((257, 1, 65536), 1, dtype="float16") not in SPLIT_VARIANTS + (registers,)
    # The old vec4 split-k where the registers variant's workgroup memory does not fit.
    tiny = {**F16_CAPS, "limits": {"maxComputeWorkgroupStorageSize": 1024}}
    assert chosen((1, 1, 65536), 1, caps=tiny, tunables={"WORKGROUP_SIZE": 64}) == "group_splitk_vec4"
    assert chosen((1, 32, 64, 64), 2, stash_type=10) == "group_stash_f16_serial"
    assert chosen((2, 6, 5, 7), 3, stash_type=10, caps=NO_F16_CAPS) == "group_stash_f16_serial"


def test_workgroup_defaults_per_variant_kind():
    """WORKGROUP_SIZE (1024, capped by the device) sizes the one-workgroup-per-row variants; split-k
    keeps min(WORKGROUP_SIZE, SPLIT_WORKGROUP_SIZE = 256)."""
    big = {
        "features": ["shader-f16"],
        "limits": {"maxComputeInvocationsPerWorkgroup": 1024, "maxComputeWorkgroupSizeX": 1024},
    }

    def workgroups(shape, caps, tunables=None, dtype="float32"):
        c = shape[1]
        p = gn.plan(
            {"x": shape, "scale": (c,), "bias": (c,)},
            {"T": dtype},
            attrs={"num_groups": 32},
            caps=caps,
            tunables=tunables,
        )
        return p.variant, [q.workgroup_size for q in p.passes]

    assert workgroups((2, 320, 64, 64), big) == ("group_subgroup_vec4", [1024])
    assert workgroups((2, 320, 64, 64), F16_CAPS) == ("group_subgroup_vec4", [256])  # default limits
    registers = "group_splitk_registers"
    assert workgroups((1, 128, 512, 512), big) == (registers, [128, 128])  # CHUNK_WORKGROUP_SIZE
    assert workgroups((1, 128, 512, 512), big, {"CHUNK_WORKGROUP_SIZE": 512}) == (registers, [512, 512])
    assert workgroups((1, 128, 512, 512), big, {"CHUNK_WORKGROUP_SIZE": 4096}) == (registers, [1024, 1024])
    assert workgroups((1, 128, 512, 512), big, dtype="float16") == (registers, [128, 128])
    # Rows of whole vec4s but not of whole 16-byte f16 units: the older split-k.
    assert workgroups((1, 128, 510, 510), big) == (registers, [128, 128])
    assert workgroups((1, 128, 510, 510), big, dtype="float16") == ("group_splitk_vec4_pairs", [256, 256])
    assert workgroups((1, 128, 510, 510), big, {"SPLIT_WORKGROUP_SIZE": 512}, "float16") == (
        "group_splitk_vec4_pairs",
        [512, 512],
    )
    assert workgroups((1, 128, 510, 510), big, {"WORKGROUP_SIZE": 64}, "float16") == (
        "group_splitk_vec4_pairs",
        [64, 64],
    )


@pytest.mark.parametrize("variant", SPLIT_VARIANTS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_splitk_with_seven_splits_and_far_from_zero_data(variant, dtype, request):
    """A device allowing 7 workgroups a dimension caps split at 7 (not a power of two), and data
    sitting 1e3 spreads from zero checks that the mean travels as a pair and the apply pass
    normalizes (x - mean0) - lo."""
    rng, seed = rng_for(request.node.name)
    shape = (3, 4, 20, 12)  # 480 values a row: 8 splits' worth
    inputs = random_inputs(rng, shape, dtype)
    spread = 0.05 if dtype == np.float16 else 1.0
    inputs["x"] = (rng.standard_normal(shape) * spread + 1000 * spread).astype(dtype)
    caps = {**F16_CAPS, "limits": {"maxComputeWorkgroupsPerDimension": 7}}
    attrs = {"num_groups": 2}
    p = plan_for(inputs, attrs, caps=caps, tunables=SMALL_SPLITS, variant=variant)
    assert p.passes[0].dispatch == (6, 1, 7) and p.passes[0].overrides["DISPATCH_FOLD_WIDTH"] == 7
    actual = run_poisoned(inputs, attrs=attrs, caps=caps, tunables=SMALL_SPLITS, variant=variant)
    assert_close(actual, reference(inputs, attrs), dtype, f"7 splits, offset data {seed_note(seed)}")


# (shape, num_groups, tunables, vectors per chunk): chunk lengths against pairs blocks of
# 2 * workgroupSize vectors: partly filled second halves, a chunk shorter than one workgroup,
# one between one and two workgroups, and one that fills its blocks exactly.
PAIRS_TAIL_CASES = [
    (
        (2, 3, 4, 25),
        1,
        {**SMALL_SPLITS, "SPLIT_WORKGROUP_SIZE": 4},
        {9, 10},
    ),  # 75 vectors, 8 chunks; blocks of 8
    ((2, 4, 2, 6), 2, {**SMALL_SPLITS, "SPLIT_WORKGROUP_SIZE": 4}, {6}),  # one chunk of 6: 4 < 6 < 8
    (
        (1, 2, 3, 4),
        1,
        {**SMALL_SPLITS, "STATS_VALUES_PER_SPLIT": 8, "SPLIT_WORKGROUP_SIZE": 4},
        {1, 2},
    ),  # shorter than 4
    (
        (1, 4, 10, 40),
        1,
        {**SMALL_SPLITS, "STATS_VALUES_PER_SPLIT": 400, "SPLIT_WORKGROUP_SIZE": 32},
        {100},
    ),  # 64 + 36
    ((1, 2, 8, 8), 1, {**SMALL_SPLITS, "SPLIT_WORKGROUP_SIZE": 4}, {16}),  # two whole blocks of 8
]


@DTYPES
@pytest.mark.parametrize(
    "shape,num_groups,tunables,counts",
    PAIRS_TAIL_CASES,
    ids=[f"{s}-g{g}-chunks{sorted(c)}" for s, g, t, c in PAIRS_TAIL_CASES],
)
@pytest.mark.parametrize("variant", VEC4_SPLIT_VARIANTS)
def test_splitk_chunks_that_do_not_fill_their_pairs_blocks(
    variant, shape, num_groups, tunables, counts, dtype, request
):
    """Every vector is read and written once when a chunk's length is not a multiple of
    2 * workgroupSize: NaN-poisoned outputs catch a skipped one, the reference a doubled one."""
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, shape, dtype, offset=3.0)
    attrs = {"num_groups": num_groups}
    p = plan_for(inputs, attrs, tunables=tunables, caps=F16_CAPS, variant=variant)
    units, split = p.passes[0].values["hiddenVec"], p.passes[0].values["split"]
    assert {units // split + (k < units % split) for k in range(split)} == counts
    assert p.passes[0].workgroup_size == p.passes[1].workgroup_size == tunables["SPLIT_WORKGROUP_SIZE"]
    actual = run_poisoned(inputs, attrs=attrs, tunables=tunables, variant=variant)
    assert_close(actual, reference(inputs, attrs), dtype, f"{variant} {shape} {tunables} {seed_note(seed)}")


# --- both variants ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "variant,attrs,tunables",
    [
        ("group_splitk", {"num_groups": 3}, SMALL_SPLITS),
        ("group_splitk_vec4", {"num_groups": 3}, SMALL_SPLITS),
        ("group_splitk_vec4_pairs", {"num_groups": 3}, SMALL_SPLITS),
        ("group_stash_f16_serial", {"num_groups": 3, "stash_type": 10}, None),
        ("group_row_registers", {"num_groups": 3}, SPLIT_SHORT_ROWS),
        (
            "group_splitk_registers",
            {"num_groups": 3},
            {"SPLIT_STATS_MIN_HIDDEN": 1, "CHUNK_WORKGROUP_SIZE": 32},
        ),
    ],
    ids=[
        "group_splitk",
        "group_splitk_vec4",
        "group_splitk_vec4_pairs",
        "group_stash_f16_serial",
        "group_row_registers",
        "group_splitk_registers",
    ],
)
@DTYPES
def test_repeated_runs_are_bit_identical(variant, attrs, tunables, dtype, request):
    rng, _ = rng_for(request.node.name)
    inputs = random_inputs(rng, (2, 6, 40, 30), dtype)
    runs = [run_poisoned(inputs, attrs=attrs, tunables=tunables, variant=variant) for _ in range(3)]
    assert all(r.tobytes() == runs[0].tobytes() for r in runs[1:])


def test_device_tensors_chain_through_split_k(request):
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, (2, 6, 5, 7), np.float32)
    resident = {k: Tensor.from_numpy(v) for k, v in inputs.items()}
    first = gn.kernel(resident, attrs={"num_groups": 2}, tunables=SMALL_SPLITS, variant="group_splitk")["y"]
    assert isinstance(first, Tensor)
    second = gn.kernel(
        {**resident, "x": first}, attrs={"num_groups": 3}, tunables=SMALL_SPLITS, variant="group_splitk"
    )["y"]
    once = reference(inputs, {"num_groups": 2})
    twice = group_normalization_ref(once, inputs["scale"], inputs["bias"], 3)
    assert_close(second.numpy(), twice, np.float32, f"chained split-k calls {seed_note(seed)}")


# --- the ONNX backend node tests -----------------------------------------------------------------------


def _attributes(node):
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


@pytest.mark.parametrize("case", backend_node_cases("test_group_normalization"), ids=lambda c: c[0])
def test_onnx_backend_node_cases(case):
    name, model, data_sets = case
    attrs = _attributes(model.graph.node[0])
    for inputs, outputs in data_sets:
        feed = dict(zip(("x", "scale", "bias"), inputs))
        expected = np.asarray(outputs[0], np.float64)
        actual = gn.kernel(feed, attrs=attrs)["y"]
        assert_close(actual, expected, feed["x"].dtype, f"{name} (natural selection)")
        for variant in SPLIT_VARIANTS:
            if variant in VEC4_SPLIT_VARIANTS and int(np.prod(feed["x"].shape[2:])) % 4:
                continue
            forced = gn.kernel(
                feed, attrs=attrs, tunables={**SMALL_SPLITS, "STATS_VALUES_PER_SPLIT": 3}, variant=variant
            )["y"]
            assert_close(forced, expected, feed["x"].dtype, f"{name} ({variant})")


# --- contract errors, each before any GPU work -------------------------------------------------------


def good(dtype=np.float32, shape=(2, 4, 3, 5)):
    c = shape[1]
    return {"x": np.ones(shape, dtype), "scale": np.ones(c, dtype), "bias": np.zeros(c, dtype)}


@pytest.mark.parametrize(
    "change,attrs,subject,words",
    [
        ({}, {}, "attribute num_groups", "required"),
        ({}, {"num_groups": 0}, "attribute num_groups", "attrs.num_groups >= 1"),
        ({}, {"num_groups": -2}, "attribute num_groups", "attrs.num_groups >= 1"),
        ({}, {"num_groups": 1.5}, "attribute num_groups", "expected an integer"),
        ({}, {"num_groups": 3}, "input x", "(dim(shapes.X, 1) % attrs.num_groups) == 0"),
        ({}, {"num_groups": 2, "stash_type": 2}, "attribute stash_type", "not supported (allowed: 1, 10)"),
        ({}, {"num_groups": 2, "stash_type": 11}, "attribute stash_type", "not supported (allowed: 1, 10)"),
        (
            {"scale": np.ones(2, np.float32)},
            {"num_groups": 2},
            "input scale",
            "dim(shapes.scale, 0) == dim(shapes.X, 1)",
        ),
        (
            {"bias": np.ones(2, np.float32)},
            {"num_groups": 2},
            "input bias",
            "dim(shapes.bias, 0) == dim(shapes.X, 1)",
        ),
        ({"scale": np.ones((4, 1), np.float32)}, {"num_groups": 2}, "input scale", "ranks.scale == 1"),
        ({"x": np.ones((2, 4), np.float32)}, {"num_groups": 2}, "input x", "ranks.X >= 3"),
        (
            {"bias": np.ones(4, np.float16)},
            {"num_groups": 2},
            "input bias",
            "every T tensor must share one dtype",
        ),
        ({"x": np.ones((2, 4, 3), np.float64)}, {"num_groups": 2}, "input x", "float64 is not supported"),
        ({}, {"num_groups": 2, "alpha": 1.0}, "attribute alpha", "unknown attribute"),
    ],
)
def test_contract_errors_name_op_subject_and_rule(change, attrs, subject, words):
    inputs = {**good(), **change}
    with pytest.raises(ContractError) as caught:
        gn.kernel(inputs, attrs=attrs)
    text = str(caught.value)
    assert text.startswith("ai.onnx GroupNormalization-21: ") and subject in text and words in text, text
    assert isinstance(caught.value, ValueError)


def test_opset18_scale_shape_is_refused_with_the_opset21_rule():
    inputs = {**good(), "scale": np.ones(2, np.float32), "bias": np.zeros(2, np.float32)}
    with pytest.raises(ContractError) as caught:
        gn.kernel(inputs, attrs={"num_groups": 2})
    text = str(caught.value)
    assert "input scale" in text and "in opset 21, scale is: Scale tensor of shape `(C)`" in text, text


@pytest.mark.parametrize(
    "variant,attrs",
    [("group_splitk", {"num_groups": 2}), ("group_stash_f16_serial", {"num_groups": 2, "stash_type": 10})],
)
def test_tensor_over_the_storage_binding_limit_is_planned_in_pieces(variant, attrs):
    shapes = {"x": (2, 4, 64, 64), "scale": (4,), "bias": (4,)}  # 128 KiB of f32
    caps = {**F16_CAPS, "limits": {"maxStorageBufferBindingSize": 64 * 1024}}
    tunables = SMALL_SPLITS if variant == "group_splitk" else None
    plan = gn.plan(shapes, {"T": "float32"}, attrs=attrs, caps=caps, tunables=tunables, variant=variant)
    assert [c.plan.variant for c in plan.chunks] == [variant, variant]
    assert [c.slices["x"] for c in plan.chunks] == [(0, 64 * 1024), (64 * 1024, 64 * 1024)]
    # Within the limit the same request is one plan.
    whole = gn.plan(
        shapes,
        {"T": "float32"},
        attrs=attrs,
        caps={**caps, "limits": {"maxStorageBufferBindingSize": 128 * 1024}},
        tunables=tunables,
        variant=variant,
    )
    assert not whole.chunks and whole.variant == variant
    # One group over the limit cannot be cut.
    with pytest.raises(
        ContractError, match="maxStorageBufferBindingSize = 16384, and even the smallest piece"
    ):
        gn.plan(
            shapes,
            {"T": "float32"},
            attrs=attrs,
            caps={**caps, "limits": {"maxStorageBufferBindingSize": 16 * 1024}},
            tunables=tunables,
            variant=variant,
        )


def test_forced_variant_that_does_not_apply_is_refused():
    shapes = {"x": (2, 4, 3, 5), "scale": (4,), "bias": (4,)}
    with pytest.raises(ContractError, match="does not apply"):
        gn.plan(shapes, {"T": "float32"}, attrs={"num_groups": 2}, variant="group_stash_f16_serial")
    with pytest.raises(ContractError, match="does not apply"):
        gn.plan(shapes, {"T": "float32"}, attrs={"num_groups": 2, "stash_type": 10}, variant="group_splitk")
    with pytest.raises(ContractError, match="does not apply"):
        gn.plan(shapes, {"T": "float32"}, attrs={"num_groups": 2}, variant="group_splitk")  # 15 values a row
