"""GroupNormalization-21 through the generated kernels: variants group_splitk, group_splitk_vec4,
group_splitk_vec4_pairs, group_stash_f16_serial, group_row_registers and group_splitk_registers.

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

group_stash_f16_serial (stash_type=10): the ONNX function body with its normalization stage in
float16. See `assert_close_f16_stage` for the tolerance and why it is looser than docs/TESTING.md's.

group_row_registers: rows x split workgroups, each loading its whole row into registers (a bucket
of units an invocation: vec4<f32>, or 8 halves as vec4<u32>), two-pass statistics with subgroupAdd,
and a share of the stores. Tunables shrink workgroups and rows, so lavapipe meets tails, spare
bucket units, odd workgroup sizes, partial subgroups and 1-3 workgroups a row.

group_splitk_registers: rows x chunks workgroups in two passes (templates norm-splitk-partials and
-apply), a chunk CHUNK_WORKGROUP_SIZE x CHUNK_UNITS_F32 / _F16 16-byte units, loaded into registers
before use; the apply pass walks the chunks in reverse. Tunables shrink chunks to a unit, so
lavapipe meets rows shorter than a chunk, short last chunks, every unit bucket, folded dispatches
(over 65535, and at a device limit of 7), f16 extremes and either walk order (the same bits).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import helper

from generated import ContractError, Tensor
from generated import group_normalization as gn
from tests.device_helpers import poisoned_call
from tests.oracles import (
    TOLERANCES,
    assert_close,
    backend_node_cases,
    group_normalization_ref,
    onnxruntime_run,
    rng_for,
    seed_note,
)

F16_CAPS = {"features": ["shader-f16"]}
NO_F16_CAPS = {"features": []}
# Several splits on small rows: one split per 64 values, and no minimum row length.
SMALL_SPLITS = {"STATS_VALUES_PER_SPLIT": 64, "SPLIT_STATS_MIN_HIDDEN": 1}
DTYPES = pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
SPLIT_VARIANTS = ("group_splitk", "group_splitk_vec4", "group_splitk_vec4_pairs")
VEC4_SPLIT_VARIANTS = ("group_splitk_vec4", "group_splitk_vec4_pairs")  # need spatial % 4 == 0


def random_inputs(rng, shape, dtype, offset=1.0):
    """X with a random spread and a mean of up to `offset` spreads away from zero; scale and bias per channel."""
    channels = shape[1]
    spread = rng.uniform(0.5, 3.0)
    mean = rng.uniform(-1.0, 1.0) * offset * spread
    return {
        "x": (rng.standard_normal(shape) * spread + mean).astype(dtype),
        "scale": rng.uniform(-2, 2, channels).astype(dtype),
        "bias": rng.uniform(-1, 1, channels).astype(dtype),
    }


def run_poisoned(inputs, **kwargs):
    return poisoned_call(gn, inputs, **kwargs)["y"]


def plan_for(inputs, attrs, **kwargs):
    shapes = {k: v.shape for k, v in inputs.items()}
    return gn.plan(shapes, {"T": inputs["x"].dtype.name}, attrs=attrs, **kwargs)


def reference(inputs, attrs):
    return group_normalization_ref(inputs["x"], inputs["scale"], inputs["bias"], **attrs)


def per_channel(values, ndim):
    return np.asarray(values, np.float64).reshape((1, -1) + (1,) * (ndim - 2))


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


# --- group_stash_f16_serial (stash_type=10) -----------------------------------------------------------


def assert_close_f16_stage(actual, ref, normalized, scale, dtype, context, extra=0.0):
    """stash_type=10: docs/TESTING.md's float16 tolerance on the normalized values, plus T's on the result.

    The function body computes the normalized values in float16 (X cast to f16, Mean, Var, StdDev,
    Deviation and their quotient each rounded to f16) and casts them back to T before scale and
    bias. The kernel rounds at the same points, but its statistics are f32 sums of the f16 values
    (exact variance, no overflow) where the body's are f16 E[x^2] - E[x]^2: Mean and StdDev may land
    on neighbouring f16 values, which moves a normalized value by a few f16 ulps. That is an f16
    computation the spec prescribes, so the f16 tolerance 2e-3 + 2e-3 |n| applies to the normalized
    value n (relative 2e-3 is 2 to 4 ulps of f16), and through `scale` it reaches Y: allowed
    |Y - ref| <= atol_T + rtol_T |ref| + |scale| (2e-3 + 2e-3 |n| + extra). For f32 tensors this is
    looser than the f32 tolerance only by the f16 stage's own error; the final scale and bias stage
    keeps T's tolerance. `extra` is a per-row allowance a caller justifies (see its use).
    """
    actual = np.asarray(actual, np.float64)
    atol, rtol = TOLERANCES[np.dtype(dtype)]
    scale = np.abs(per_channel(scale, actual.ndim))
    allowed = atol + rtol * np.abs(ref) + scale * (2e-3 + 2e-3 * np.abs(normalized) + extra)
    ok = np.abs(actual - ref) <= allowed
    if ok.all():
        return
    excess = np.where(ok, -1.0, np.nan_to_num(np.abs(actual - ref) / allowed, nan=np.inf))
    worst = np.unravel_index(np.argmax(excess), ref.shape)
    raise AssertionError(
        f"{context}: {np.count_nonzero(~ok)} of {ref.size} elements out of the f16-stage tolerance; worst at "
        f"{tuple(int(i) for i in worst)}: actual {actual[worst]!r}, expected {ref[worst]!r}, normalized {normalized[worst]!r}, "
        f"allowed {allowed[worst]:.3g}"
    )


def spec_normalized(inputs, attrs):
    """The reference's normalized (f16-stage, cast back to T) values: the reference with scale 1 and bias 0."""
    x = inputs["x"]
    ones, zeros = np.ones(x.shape[1], x.dtype), np.zeros(x.shape[1], x.dtype)
    return group_normalization_ref(x, ones, zeros, **attrs)


def half(values):
    """Round to float16 like the kernel: a value float16 cannot hold (|v| >= 65520) is kept, not made infinite."""
    values = np.asarray(values, np.float64)
    with np.errstate(over="ignore"):
        return np.where(np.abs(values) < 65520, values.astype(np.float16).astype(np.float64), values)


def stash16_exact_statistics_ref(x, scale, bias, num_groups, epsilon=1e-5):
    """The GroupNormalization-21 body for stash_type=10, every f16 value rounded where the body rounds
    it, but with Mean and Var computed exactly (float64) before their rounding and no f16 overflow:
    what the kernel promises where the body's own f16 E[x^2] - E[x]^2 cancels or overflows.
    Returns (Y, normalized, per-row allowance for Mean landing on a neighbouring f16 value)."""
    n = x.shape[0]
    rows = half(x).reshape(n, num_groups, -1)
    mean = half(rows.mean(axis=2, keepdims=True))
    std = half(np.sqrt(half(half(rows.var(axis=2, keepdims=True)) + half(np.float32(epsilon)))))
    normalized = half(half(rows - mean) / std)
    normalized = normalized.reshape(x.shape).astype(x.dtype).astype(np.float64)
    # The kernel's f32 Mean may round to the f16 neighbour of the exact mean's rounding: one ulp
    # of Mean, divided by StdDev, in normalized units.
    mean_ulp = np.spacing(np.abs(mean).astype(np.float16)).astype(np.float64) / std
    mean_ulp = np.broadcast_to(mean_ulp, rows.shape).reshape(x.shape)
    return per_channel(scale, x.ndim) * normalized + per_channel(bias, x.ndim), normalized, mean_ulp


# The body's own f16 statistics are only trustworthy where E[x^2] - E[x]^2 does not cancel (mean
# within a tenth of a spread of zero) and the f16 sum of squares cannot overflow (<= 4096 values).
STASH_CASES = [
    ((2, 6, 5, 7), 3),
    ((3, 5, 13), 5),  # num_groups == C
    ((2, 5, 13), 1),
    ((1, 6, 4, 5, 9), 2),  # rank 5
    ((2, 7, 9, 11), 7),
    ((1, 8, 16, 32), 2),  # 4096 values a row
]
STASH_DEVICES = [
    ("f32", np.float32, F16_CAPS),
    ("f32-no-shader-f16", np.float32, NO_F16_CAPS),
    ("f16", np.float16, F16_CAPS),
]


@pytest.mark.parametrize("label,dtype,caps", STASH_DEVICES, ids=[d[0] for d in STASH_DEVICES])
@pytest.mark.parametrize("shape,num_groups", STASH_CASES, ids=[f"{s}-g{g}" for s, g in STASH_CASES])
def test_stash16_against_spec_reference_and_onnxruntime(shape, num_groups, label, dtype, caps, request):
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, shape, dtype, offset=0.1)
    attrs = {"num_groups": num_groups, "stash_type": 10, "epsilon": float(rng.choice([1e-5, 1e-3, 0.1]))}
    p = plan_for(inputs, attrs, caps=caps)
    assert p.variant == "group_stash_f16_serial"
    assert p.passes[0].dispatch == (shape[0] * num_groups, 1, 1)
    actual = run_poisoned(inputs, attrs=attrs, caps=caps)
    context = f"stash 10 {label} {shape} {attrs} {seed_note(seed)}"
    assert_close_f16_stage(
        actual, reference(inputs, attrs), spec_normalized(inputs, attrs), inputs["scale"], dtype, context
    )
    ort = dict(zip(("X", "scale", "bias"), inputs.values()))
    (expected,) = onnxruntime_run("GroupNormalization", ort, attrs, opset=21)
    assert_close_f16_stage(
        actual,
        expected.astype(np.float64),
        spec_normalized(inputs, attrs),
        inputs["scale"],
        dtype,
        context + " vs onnxruntime",
    )


STASH_HARD_CASES = [
    # (name, shape, num_groups, make X): X far from zero, where the body's f16 E[x^2] - E[x]^2 cancels;
    # X ~ 1e4 with a variance far over the f16 maximum (65504), where X * X overflows;
    # 65536 values a row of spread 2, where the f16 sum of squares (about 262144) overflows.
    ("offset", (2, 4, 9, 11), 2, lambda rng, shape: rng.standard_normal(shape) + 100.0),
    ("large", (2, 6, 16, 16), 3, lambda rng, shape: rng.uniform(-2e4, 3e4, shape)),
    ("long-row", (1, 4, 128, 128), 1, lambda rng, shape: rng.standard_normal(shape) * 2.0),
]


@pytest.mark.parametrize("label,dtype,caps", STASH_DEVICES, ids=[d[0] for d in STASH_DEVICES])
@pytest.mark.parametrize(
    "name,shape,num_groups,make_x", STASH_HARD_CASES, ids=[c[0] for c in STASH_HARD_CASES]
)
def test_stash16_statistics_do_not_cancel_or_overflow(
    name, shape, num_groups, make_x, label, dtype, caps, request
):
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, shape, dtype)
    inputs["x"] = make_x(rng, shape).astype(dtype)
    attrs = {"num_groups": num_groups, "stash_type": 10}
    actual = run_poisoned(inputs, attrs=attrs, caps=caps)
    assert np.isfinite(actual).all()
    ref, normalized, mean_ulp = stash16_exact_statistics_ref(
        inputs["x"], inputs["scale"], inputs["bias"], num_groups
    )
    context = f"stash 10 {name} {label} {shape} {seed_note(seed)}"
    assert_close_f16_stage(actual, ref, normalized, inputs["scale"], dtype, context, extra=mean_ulp)
    # The same normalization, exact: only the f16 stage's rounding separates the two.
    exact = group_normalization_ref(
        inputs["x"].astype(np.float16), inputs["scale"], inputs["bias"], num_groups
    )
    assert_close_f16_stage(
        actual, exact, normalized, inputs["scale"], dtype, context + " vs exact", extra=mean_ulp
    )
    if name != "offset":
        # Where the body's f16 statistics overflow, its literal result collapses to Y = bias.
        with np.errstate(over="ignore", invalid="ignore"):
            literal = reference(inputs, attrs)
        collapsed = np.broadcast_to(per_channel(inputs["bias"], len(shape)), literal.shape)
        assert not np.isfinite(literal).all() or np.allclose(literal, collapsed)


def test_stash16_rounds_where_the_body_rounds(request):
    """What the f16-stage tolerance cannot see: with scale 1 and bias 0, Y is the kernel's
    NormalizedU cast to T, so for f32 tensors every value must be an f16 value; and the f32 shader
    (no shader-f16, rounding emulated) must give bit for bit what the f16 shader gives on the same
    f16-representable data, and the same as on f32 data that rounds to those f16 values (XU = Cast<f16>(X)).
    """
    rng, seed = rng_for(request.node.name)
    shape = (2, 6, 5, 7)
    x32 = random_inputs(rng, shape, np.float32)["x"]
    x16 = x32.astype(np.float16)
    attrs = {"num_groups": 3, "stash_type": 10, "epsilon": 1e-3}
    results = {}
    for label, dtype, caps in STASH_DEVICES:
        ones, zeros = np.ones(shape[1], dtype), np.zeros(shape[1], dtype)
        results[label] = run_poisoned(
            {"x": x16.astype(dtype), "scale": ones, "bias": zeros}, attrs=attrs, caps=caps
        )
    for label in ("f32", "f32-no-shader-f16"):
        normalized = results[label]
        assert np.array_equal(
            normalized.astype(np.float16).astype(np.float32), normalized
        ), f"{label}: not f16 values {seed_note(seed)}"
        assert np.array_equal(
            normalized, results["f16"].astype(np.float32)
        ), f"{label} differs from the f16 shader {seed_note(seed)}"
    ones, zeros = np.ones(shape[1], np.float32), np.zeros(shape[1], np.float32)
    unrounded = run_poisoned({"x": x32, "scale": ones, "bias": zeros}, attrs=attrs, caps=NO_F16_CAPS)
    assert np.array_equal(unrounded, results["f32"]), f"X is not cast to f16 first {seed_note(seed)}"


def _unambiguous_offset_row(rng, size):
    """f16 values around 100 (where the body's own f16 E[x^2] - E[x]^2 is meaningless) whose exact
    Mean, Var and StdDev each sit at least a tenth of an f16 ulp from a rounding midpoint, so every
    correct f32 implementation rounds them to the same f16 values; and whose Mean and StdDev sit at
    least a quarter ulp from their f16 values, so that skipping either rounding shows."""
    eps16 = half(np.float32(1e-5))

    def ulps(value, to):
        return abs(value - to) / np.spacing(np.float16(to))

    for _ in range(1000):
        row = half(rng.standard_normal(size) * rng.uniform(0.5, 2.0) + 100.0)
        mean, var = row.mean(), row.var()
        std = np.sqrt(half(half(var) + eps16))
        if all(0.1 <= ulps(v, half(v)) <= 0.4 for v in (mean, var, std)):
            if ulps(mean, half(mean)) >= 0.25 and ulps(np.sqrt(var), half(std)) >= 0.25:
                return row
    raise AssertionError("no row found")


@pytest.mark.parametrize("label,dtype,caps", STASH_DEVICES, ids=[d[0] for d in STASH_DEVICES])
def test_stash16_matches_the_body_to_one_ulp_where_its_statistics_are_unambiguous(
    label, dtype, caps, request
):
    """Where Mean, Var and StdDev round unambiguously, the kernel's normalized values are the body's
    (with exact statistics) up to one f16 ulp (the last division's rounding). The f16-stage
    tolerance elsewhere could hide a missing rounding of Mean or StdDev; here an unrounded Mean moves
    values by many ulps, and an unrounded StdDev scales a whole row."""
    rng, seed = rng_for(request.node.name)
    shape = (2, 4, 8, 16)  # two groups of 256 values per batch item
    x = np.stack([_unambiguous_offset_row(rng, 256) for _ in range(4)]).reshape(shape).astype(dtype)
    ones, zeros = np.ones(4, dtype), np.zeros(4, dtype)
    actual = run_poisoned(
        {"x": x, "scale": ones, "bias": zeros}, attrs={"num_groups": 2, "stash_type": 10}, caps=caps
    )
    _, expected, _ = stash16_exact_statistics_ref(x, ones, zeros, 2)
    ulps = np.abs(actual.astype(np.float64) - expected) / np.spacing(
        np.abs(expected).astype(np.float16)
    ).astype(np.float64)
    assert (
        ulps.max() <= 1.0
    ), f"{label}: {ulps.max()} f16 ulps off at {np.unravel_index(np.argmax(ulps), shape)} {seed_note(seed)}"
    # An unrounded StdDev scales a row by 1 + (at least 1.2e-4); the final rounding alone gives
    # relative differences averaging 0 +- 1.1e-5 over the row's ~150 values with |n| > 0.5.
    for k, (a, e) in enumerate(zip(actual.reshape(4, -1).astype(np.float64), expected.reshape(4, -1))):
        big = np.abs(e) > 0.5
        bias = np.mean((a[big] - e[big]) / e[big])
        assert (
            abs(bias) < 6e-5
        ), f"{label}: row {k} scaled by 1 + {bias:.2g}: StdDev not rounded to f16? {seed_note(seed)}"


def test_stash16_f32_shader_does_not_need_shader_f16():
    shapes = {"x": (2, 6, 5), "scale": (6,), "bias": (6,)}
    p = gn.plan(shapes, {"T": "float32"}, attrs={"num_groups": 3, "stash_type": 10}, caps=NO_F16_CAPS)
    assert p.variant == "group_stash_f16_serial"
    (main,) = p.passes
    # The shader's notes (// comments) may name f16; its code must not.
    code = re.sub(r"//[^\n]*", "", main.wgsl)
    assert not re.search(r"\bf16\b", code) and "round(v / q)" in code
    assert main.workgroup_size == 256  # the WebGPU default limit
    f16 = gn.plan(shapes, {"T": "float16"}, attrs={"num_groups": 3, "stash_type": 10}, caps=F16_CAPS)
    assert "enable f16;" in f16.passes[0].wgsl
    with pytest.raises(ContractError, match=r"f16Ok\(dtypes.T\)"):
        gn.plan(shapes, {"T": "float16"}, attrs={"num_groups": 3, "stash_type": 10}, caps=NO_F16_CAPS)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_stash16_folded_dispatch(dtype, request):
    """30 rows on a device allowing 7 workgroups a dimension: (7, 5, 1) workgroups, 5 of them past the rows."""
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, (5, 6, 3, 7), dtype, offset=0.1)
    caps = {**F16_CAPS, "limits": {"maxComputeWorkgroupsPerDimension": 7}}
    attrs = {"num_groups": 6, "stash_type": 10}
    assert plan_for(inputs, attrs, caps=caps).passes[0].dispatch == (7, 5, 1)
    actual = run_poisoned(inputs, attrs=attrs, caps=caps)
    context = f"stash 10 folded {seed_note(seed)}"
    assert_close_f16_stage(
        actual, reference(inputs, attrs), spec_normalized(inputs, attrs), inputs["scale"], dtype, context
    )


# --- group_row_registers ------------------------------------------------------------------------------

SUBGROUP_CAPS = {"features": ["shader-f16", "subgroups"]}
# The H200's facts as wgpu reports them: subgroups, 1024 invocations a workgroup.
H200_CAPS = {
    **SUBGROUP_CAPS,
    "limits": {"maxComputeInvocationsPerWorkgroup": 1024, "maxComputeWorkgroupSizeX": 1024},
}
SPLIT_SHORT_ROWS = {"REGISTER_SPLIT_MIN_HIDDEN": 1}

# (shape, num_groups, tunables, (workgroup, split, bucket) for f32, the same for f16): a unit is
# 4 f32 or 8 f16 values; an invocation holds ceil(units / workgroup) units, rounded up to a bucket.
REGISTER_CASES = [
    ((3, 5, 4, 8), 5, {}, (8, 1, "1"), (4, 1, "1")),  # 8 / 4 units a row: one each
    ((2, 6, 1, 8), 6, {}, (2, 1, "1"), (1, 1, "1")),  # a row of one f16 unit, one invocation
    (
        (2, 8, 10, 44),
        2,
        {"REGISTER_SINGLE_WORKGROUP_SIZE": 100},
        (100, 1, "5"),
        (100, 1, "3"),
    ),  # 440 / 220 units: tails
    (
        (1, 4, 16, 24),
        1,
        {"REGISTER_SINGLE_WORKGROUP_SIZE": 33},
        (33, 1, "12"),
        (33, 1, "6"),
    ),  # 384 / 192 units on 33
    (
        (2, 6, 7, 32),
        3,
        {"REGISTER_SINGLE_WORKGROUP_SIZE": 16},
        (16, 1, "8"),
        (16, 1, "4"),
    ),  # 7 -> 8, 3.5 -> 4: spare units
    (
        (1, 4, 14, 32),
        2,
        {"REGISTER_SINGLE_WORKGROUP_SIZE": 16},
        (16, 1, "16"),
        (16, 1, "8"),
    ),  # 14 -> 16, 7 -> 8: spare units
    (
        (1, 8, 32, 40),
        2,
        {**SPLIT_SHORT_ROWS, "REGISTER_WORKGROUP_SIZE": 64},
        (64, 2, "20"),
        (64, 2, "10"),
    ),  # two workgroups a row
    (
        (2, 4, 24, 24),
        2,
        {**SPLIT_SHORT_ROWS, "REGISTER_WORKGROUP_SIZE": 32, "REGISTER_SPLIT": 3},
        (32, 3, "10"),
        (32, 3, "5"),
    ),
    (
        (1, 4, 24, 32),
        1,
        {"REGISTER_SINGLE_WORKGROUP_SIZE": 32, "REGISTER_MAX_UNITS": 24},
        (32, 1, "24"),
        (32, 1, "12"),
    ),  # largest bucket
    ((1, 128, 2, 8), 1, {}, (256, 1, "2"), (256, 1, "1")),  # 128 channels a group (REGISTER_MAX_CHANNELS)
]


def held_units(pass_plan):
    """The unit bucket a group_row_registers shader was specialized for (its UNITS constant)."""
    return re.search(r"const UNITS: u32 = (\d+)u;", pass_plan.wgsl).group(1)


def register_plan(inputs, attrs, tunables, caps=SUBGROUP_CAPS):
    return plan_for(inputs, attrs, caps=caps, tunables=tunables, variant="group_row_registers")


@DTYPES
@pytest.mark.parametrize(
    "shape,num_groups,tunables,f32_geometry,f16_geometry",
    REGISTER_CASES,
    ids=[f"{c[0]}-g{c[1]}" for c in REGISTER_CASES],
)
def test_row_registers_against_float64_reference(
    shape, num_groups, tunables, f32_geometry, f16_geometry, dtype, request
):
    """Workgroups smaller than a subgroup and not a multiple of one (100, 33), tails and spare
    units in the bucket, 1-3 workgroups a row, the largest bucket, a full workgroup copy of scale
    and bias; data far from zero (the mean travels as a pair)."""
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, shape, dtype, offset=3.0)
    attrs = {"num_groups": num_groups, "epsilon": float(rng.choice([1e-5, 1e-3, 0.1]))}
    (p,) = register_plan(inputs, attrs, tunables).passes
    workgroup, split, bucket = f32_geometry if dtype == np.float32 else f16_geometry
    assert (p.workgroup_size, p.values["split"], held_units(p)) == (workgroup, split, bucket)
    assert p.dispatch == (shape[0] * num_groups * split, 1, 1) and p.uses_subgroups
    actual = run_poisoned(
        inputs, attrs=attrs, caps=SUBGROUP_CAPS, tunables=tunables, variant="group_row_registers"
    )
    assert_close(actual, reference(inputs, attrs), dtype, f"{shape} {attrs} {tunables} {seed_note(seed)}")


def test_row_registers_cases_meet_every_bucket_fill():
    """REGISTER_CASES plan (so test_row_registers_against_float64_reference runs) each of the
    template's three fills, in both dtypes:
    "exact" (every unit of every invocation in the row: loads unclamped, no held() test), "last"
    (only the last unit tested) and "any" (spare bucket units); expected_fill is the definition."""
    from tests.runtime.test_pipelines_per_shape import bucket_fill, expected_fill

    seen = set()
    for shape, num_groups, tunables, _, _ in REGISTER_CASES:
        for dtype in (np.float32, np.float16):
            inputs = {
                "x": np.zeros(shape, dtype),
                "scale": np.zeros(shape[1], dtype),
                "bias": np.zeros(shape[1], dtype),
            }
            (p,) = register_plan(inputs, {"num_groups": num_groups}, tunables).passes
            fill = bucket_fill(p)
            assert fill == expected_fill(p.uniforms["rowUnits"], p.workgroup_size, int(held_units(p))), (
                shape,
                dtype,
            )
            seen.add((fill, dtype))
    assert {fill for fill, _ in seen} == {"exact", "last", "any"} and len(seen) == 6, seen


@DTYPES
def test_row_registers_folded_dispatch(dtype, request):
    """70000 rows, two workgroups each: 140000 workgroups folded into (65535, 3, 1)."""
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, (1, 70000, 8), dtype)
    attrs = {"num_groups": 70000}
    tunables = {**SPLIT_SHORT_ROWS, "SM_COUNT_PROXY": 1_000_000}
    (p,) = register_plan(inputs, attrs, tunables).passes
    assert p.dispatch == (65535, 3, 1) and p.values["split"] == 2
    actual = run_poisoned(
        inputs, attrs=attrs, caps=SUBGROUP_CAPS, tunables=tunables, variant="group_row_registers"
    )
    assert_close(actual, reference(inputs, attrs), dtype, f"folded {seed_note(seed)}")


@DTYPES
def test_row_registers_every_split_gives_the_bits_of_one_workgroup(dtype, request):
    """Every workgroup of a row computes the statistics of the whole row from the same loads in the
    same order: with 1, 2 or 3 workgroups a row the output is the same, bit for bit."""
    rng, _ = rng_for(request.node.name)
    inputs = random_inputs(rng, (2, 8, 16, 16), dtype, offset=3.0)
    attrs = {"num_groups": 2}
    runs = []
    for split in (1, 2, 3):
        tunables = {
            **SPLIT_SHORT_ROWS,
            "REGISTER_SPLIT": split,
            "REGISTER_WORKGROUP_SIZE": 64,
            "REGISTER_SINGLE_WORKGROUP_SIZE": 64,
        }
        assert register_plan(inputs, attrs, tunables).passes[0].values["split"] == split
        runs.append(
            run_poisoned(
                inputs, attrs=attrs, caps=SUBGROUP_CAPS, tunables=tunables, variant="group_row_registers"
            )
        )
    assert all(r.tobytes() == runs[0].tobytes() for r in runs[1:])


def test_row_registers_selection():
    """Taken where a row fits REGISTER_MAX_UNITS units an invocation and rows x split workgroups fit
    SM_COUNT_PROXY; two workgroups a row from REGISTER_SPLIT_MIN_HIDDEN (20480) values."""

    def chosen(shape, dtype="float32", caps=H200_CAPS, num_groups=32, **kwargs):
        c = shape[1]
        p = gn.plan(
            {"x": shape, "scale": (c,), "bias": (c,)},
            {"T": dtype},
            attrs={"num_groups": num_groups},
            caps=caps,
            **kwargs,
        )
        main = p.passes[0]
        if p.variant != "group_row_registers":
            return p.variant
        return p.variant, main.workgroup_size, main.values["split"], held_units(main)

    registers = "group_row_registers"
    # The SD UNet rows of bench.json: 40960, 20480 and 10240 values, 64 rows; 640 invocations a
    # split row, 512 a whole one (REGISTER_WORKGROUP_SIZE, REGISTER_SINGLE_WORKGROUP_SIZE).
    assert chosen((2, 320, 64, 64)) == (registers, 640, 2, "16")
    assert chosen((2, 320, 64, 64), "float16") == (registers, 640, 2, "8")
    assert chosen((2, 640, 32, 32)) == (registers, 640, 2, "8")
    assert chosen((2, 640, 32, 32), "float16") == (registers, 640, 2, "4")
    assert chosen((2, 1280, 16, 16)) == (registers, 512, 1, "5")
    assert chosen((2, 1280, 16, 16), "float16") == (registers, 512, 1, "3")
    assert chosen((2, 320, 32, 32)) == (registers, 512, 1, "5")
    # Rows of 40960 values: 66 rows at two workgroups each still fit SM_COUNT_PROXY (132); 67 rows
    # take one workgroup a row, 20 units of 512 invocations: at the budget.
    assert chosen((2, 330, 64, 64), num_groups=33) == (registers, 640, 2, "16")
    assert chosen((1, 670, 64, 64), num_groups=67) == (registers, 512, 1, "20")
    assert chosen((4, 320, 64, 64)) == (registers, 512, 1, "20")  # 128 rows: 256 workgroups at split 2
    assert chosen((4, 320, 64, 64), tunables={"SM_COUNT_PROXY": 256}) == (registers, 640, 2, "16")
    assert chosen((6, 320, 64, 64)) == "group_subgroup_vec4"  # 192 rows: over SM_COUNT_PROXY at split 1
    # Rows over the budget: VAE rows (split-k), f32 rows over 20 units at 640 invocations.
    assert chosen((1, 128, 512, 512)) == "group_splitk_registers"
    assert chosen((2, 640, 52, 52)) == "group_subgroup_vec4"  # 54080 values: 21.1 units
    assert chosen((2, 640, 52, 52), tunables={"REGISTER_MAX_UNITS": 24}) == (registers, 640, 2, "24")
    # WebGPU's default limits (256 invocations): f16 rows of 40960 values fit, f32 ones do not.
    assert chosen((2, 320, 64, 64), "float16", caps=SUBGROUP_CAPS) == (registers, 256, 2, "20")
    assert chosen((2, 320, 64, 64), caps=SUBGROUP_CAPS) == "group_subgroup_vec4"
    # No subgroups; units that would straddle channels; more channels a group than REGISTER_MAX_CHANNELS.
    assert (
        chosen((2, 320, 64, 64), caps={"features": ["shader-f16"], "limits": H200_CAPS["limits"]})
        == "group_subgroup_vec4"
    )
    assert chosen((2, 32, 4, 5), num_groups=4) != registers
    assert (
        chosen((2, 32, 2, 6), "float16", num_groups=4) != registers
    )  # 12 values a channel: not whole f16 units
    assert chosen((2, 32, 2, 6), num_groups=4)[0] == registers
    assert chosen((1, 256, 4, 4), num_groups=1) != registers  # 256 channels a group
    assert chosen((1, 256, 4, 4), num_groups=2)[0] == registers


def test_row_registers_refusals_say_why():
    shapes = {"x": (2, 32, 2, 6), "scale": (32,), "bias": (32,)}
    for dtype, caps, words in [
        ("float16", SUBGROUP_CAPS, "groupSpatial % regUnitValues == 0"),
        ("float32", F16_CAPS, "needs device feature subgroups"),
        (
            "float32",
            {**SUBGROUP_CAPS, "limits": {"maxComputeWorkgroupStorageSize": 1024}},
            "regWorkgroupBytes",
        ),
    ]:
        with pytest.raises(ContractError, match="does not apply") as caught:
            gn.plan(shapes, {"T": dtype}, attrs={"num_groups": 4}, caps=caps, variant="group_row_registers")
        assert words in str(caught.value), str(caught.value)


# --- group_splitk_registers ---------------------------------------------------------------------------

CHUNKS = "group_splitk_registers"
# Split-k for any row length (SPLIT_STATS_MIN_HIDDEN 1): tunables shrink the chunks.
CHUNK_MIN = {"SPLIT_STATS_MIN_HIDDEN": 1}


def chunk_tunables(workgroup=None, f32=None, f16=None, **extra):
    names = {"CHUNK_WORKGROUP_SIZE": workgroup, "CHUNK_UNITS_F32": f32, "CHUNK_UNITS_F16": f16}
    return {**CHUNK_MIN, **{k: v for k, v in names.items() if v is not None}, **extra}


def chunk_geometry(plan):
    """(workgroup, units an invocation, chunks a row) of a group_splitk_registers plan, the same in both passes."""
    partials, apply = plan.passes
    geometry = [(p.workgroup_size, held_units(p), p.uniforms["chunks"]) for p in plan.passes]
    assert geometry[0] == geometry[1] and partials.dispatch == apply.dispatch, geometry
    return geometry[0]


# (shape, num_groups, tunables, (workgroup, units, chunks) for f32, the same for f16): a unit is
# 4 f32 or 8 f16 values, a chunk workgroup x units units, the last chunk of a row the rest.
CHUNK_CASES = [
    ((3, 5, 4, 8), 5, chunk_tunables(16), (16, "8", 1), (16, "8", 1)),  # rows of 8 / 4 units: one short chunk
    (
        (2, 8, 10, 44),
        2,
        chunk_tunables(33, 3, 2),
        (33, "3", 5),
        (33, "2", 4),
    ),  # 440 / 220 units: tails of 44 / 22
    (
        (2, 6, 7, 32),
        3,
        chunk_tunables(8, 7, 5),
        (8, "6", 3),
        (8, "4", 2),
    ),  # 7 -> 6, 5 -> 4: 112 = 48 + 48 + 16, 56 = 32 + 24
    (
        (1, 8, 32, 40),
        2,
        CHUNK_MIN,
        (128, "8", 2),
        (128, "8", 1),
    ),  # defaults: 1280 / 640 units, a 256 / 640-unit tail
    ((2, 4, 2, 8), 4, chunk_tunables(1, 1, 1), (1, "1", 4), (1, "1", 2)),  # one invocation holding one unit
    (
        (1, 16, 2, 8),
        2,
        chunk_tunables(8, 2, 2),
        (8, "2", 2),
        (8, "2", 1),
    ),  # 8 channels of 4 / 2 units: a channel each 4 / 2 invocations
    (
        (1, 12, 3, 8),
        3,
        chunk_tunables(5, 3, 3),
        (5, "3", 2),
        (5, "3", 1),
    ),  # channels of 6 / 3 units on 5 invocations
    ((2, 4, 2, 4, 8), 2, chunk_tunables(4, 4, 4), (4, "4", 2), (4, "4", 1)),  # rank 5
    (
        (1, 4, 9, 32),
        1,
        chunk_tunables(8, 12, 13),
        (8, "12", 3),
        (8, "12", 2),
    ),  # 288 / 144 units in chunks of 96
    (
        (1, 2, 64, 64),
        1,
        chunk_tunables(16, 16, 100),
        (16, "16", 8),
        (16, "16", 4),
    ),  # the largest bucket (100 -> 16)
]


@DTYPES
@pytest.mark.parametrize(
    "shape,num_groups,tunables,f32_geometry,f16_geometry",
    CHUNK_CASES,
    ids=[f"{c[0]}-g{c[1]}" for c in CHUNK_CASES],
)
def test_splitk_registers_against_float64_reference(
    shape, num_groups, tunables, f32_geometry, f16_geometry, dtype, request
):
    """Rows shorter than one chunk, tails in the last chunk and inside an invocation's units, one
    invocation a workgroup, workgroups of 5 and 33, channels shorter than a workgroup's stride,
    ranks 3 to 5, every kind of bucket; data far from zero (the mean travels as a pair)."""
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, shape, dtype, offset=3.0)
    attrs = {"num_groups": num_groups, "epsilon": float(rng.choice([1e-5, 1e-3, 0.1]))}
    p = plan_for(inputs, attrs, caps=F16_CAPS, tunables=tunables, variant=CHUNKS)
    workgroup, units, chunks = f32_geometry if dtype == np.float32 else f16_geometry
    assert chunk_geometry(p) == (workgroup, units, chunks)
    rows = shape[0] * num_groups
    assert [q.dispatch for q in p.passes] == [(rows * chunks, 1, 1)] * 2
    assert all(q.workgroup_storage_bytes == workgroup * 16 and not q.uses_subgroups for q in p.passes)
    assert p.intermediates["partials"] == ((rows * chunks, 4), "float32")
    actual = run_poisoned(inputs, attrs=attrs, tunables=tunables, variant=CHUNKS)
    assert_close(
        actual, reference(inputs, attrs), dtype, f"{CHUNKS} {shape} {attrs} {tunables} {seed_note(seed)}"
    )


def test_splitk_registers_cases_meet_whole_and_cut_chunks():
    """CHUNK_CASES plan (so the test above runs) both chunkings in both dtypes: every row whole
    chunks (the wholeChunks specialization: no load clamp, no held() test, constant chunk counts)
    and rows whose last chunk is short; the definition is row units % chunk units == 0."""
    seen = set()
    for shape, num_groups, tunables, _, _ in CHUNK_CASES:
        for dtype in (np.float32, np.float16):
            inputs = {
                "x": np.zeros(shape, dtype),
                "scale": np.zeros(shape[1], dtype),
                "bias": np.zeros(shape[1], dtype),
            }
            p = plan_for(inputs, {"num_groups": num_groups}, caps=F16_CAPS, tunables=tunables, variant=CHUNKS)
            workgroup, units, _ = chunk_geometry(p)
            row_units = p.passes[0].uniforms["rowUnits"]
            whole = row_units % (workgroup * int(units)) == 0
            assert all(q.spec.endswith("-whole-chunks") == whole for q in p.passes), (
                shape,
                dtype,
                [q.spec for q in p.passes],
            )
            seen.add((whole, dtype))
    assert len(seen) == 4, seen


def test_splitk_registers_units_round_down_to_a_bucket():
    """CHUNK_UNITS_F32 / _F16 go down to the nearest of 1, 2, 3, 4, 6, 8, 12, 16 (each a compiled
    constant); the f16 tunable sets f16 tensors only."""
    buckets = {
        1: "1",
        2: "2",
        3: "3",
        4: "4",
        5: "4",
        6: "6",
        7: "6",
        8: "8",
        11: "8",
        12: "12",
        15: "12",
        16: "16",
        17: "16",
        1000: "16",
    }
    shapes = {"x": (1, 4, 64, 64), "scale": (4,), "bias": (4,)}
    for target, bucket in buckets.items():
        for dtype, mine, other in (
            ("float32", "CHUNK_UNITS_F32", "CHUNK_UNITS_F16"),
            ("float16", "CHUNK_UNITS_F16", "CHUNK_UNITS_F32"),
        ):
            p = gn.plan(
                shapes,
                {"T": dtype},
                attrs={"num_groups": 1},
                caps=F16_CAPS,
                tunables={**CHUNK_MIN, mine: target, other: 5},
                variant=CHUNKS,
            )
            assert chunk_geometry(p)[1] == bucket, (dtype, target)


@DTYPES
def test_splitk_registers_folded_dispatch(dtype, request):
    """4096 rows of 34 units, 17 chunks a row at 2 invocations x 1 unit: 69632 workgroups folded
    into (65535, 2, 1); two channels a group, so the fold meets the channel walk."""
    rng, seed = rng_for(request.node.name)
    shape = (2, 4096, 68 if dtype == np.float32 else 136)
    inputs = random_inputs(rng, shape, dtype)
    attrs = {"num_groups": 2048}
    tunables = chunk_tunables(2, 1, 1, SPLIT_STATS_MAX_ROWS=4096)
    p = plan_for(inputs, attrs, caps=F16_CAPS, tunables=tunables, variant=CHUNKS)
    assert chunk_geometry(p) == (2, "1", 17) and p.passes[0].dispatch == (65535, 2, 1)
    actual = run_poisoned(inputs, attrs=attrs, tunables=tunables, variant=CHUNKS)
    assert_close(actual, reference(inputs, attrs), dtype, f"folded {seed_note(seed)}")


@DTYPES
def test_splitk_registers_fold_at_a_small_device_limit(dtype, request):
    """7 workgroups a dimension: 6 rows x 5 chunks fold into (7, 5, 1) and the shaders rebuild the
    flat index from DISPATCH_FOLD_WIDTH; 6 rows x 10 chunks (60 > 7 x 7) are refused by name."""
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, (2, 6, 10, 8), dtype)
    attrs = {"num_groups": 3}
    caps = {**F16_CAPS, "limits": {"maxComputeWorkgroupsPerDimension": 7}}
    units = 2 * 80 // (4 if dtype == np.float32 else 8)  # 40 / 20 units a row
    tunables = chunk_tunables(units // 5, 1, 1)  # 5 chunks a row
    p = plan_for(inputs, attrs, caps=caps, tunables=tunables, variant=CHUNKS)
    assert p.passes[0].dispatch == (7, 5, 1) and p.passes[0].overrides["DISPATCH_FOLD_WIDTH"] == 7
    actual = run_poisoned(inputs, attrs=attrs, caps=caps, tunables=tunables, variant=CHUNKS)
    assert_close(actual, reference(inputs, attrs), dtype, f"folded at 7 {seed_note(seed)}")
    with pytest.raises(ContractError, match="chunkDispatchY"):
        plan_for(
            inputs,
            attrs,
            caps=caps,
            tunables={**tunables, "CHUNK_WORKGROUP_SIZE": units // 9},
            variant=CHUNKS,
        )


@DTYPES
def test_splitk_registers_apply_order_does_not_change_a_bit(dtype, request):
    """Every workgroup of a row merges the row's partials in the same order, whatever order the
    apply pass walks the chunks in: reversed (CHUNK_APPLY_ORDER 1) and forward give the same bits."""
    rng, _ = rng_for(request.node.name)
    inputs = random_inputs(rng, (2, 8, 16, 40), dtype, offset=3.0)
    attrs = {"num_groups": 2}
    runs = []
    for order in (1, 2):
        tunables = chunk_tunables(16, 3, 2, CHUNK_APPLY_ORDER=order)
        assert (
            plan_for(inputs, attrs, caps=F16_CAPS, tunables=tunables, variant=CHUNKS)
            .passes[1]
            .overrides["applyOrder"]
            == order
        )
        runs.append(run_poisoned(inputs, attrs=attrs, tunables=tunables, variant=CHUNKS))
    assert runs[0].tobytes() == runs[1].tobytes()


def f16_extreme_rows(rng, rows, length):
    """f16 rows at the edges of the format: the largest finite values with one of opposite sign,
    +-65504 alternating, values near 6e4 with a spread of 32, and tiny normal values (a variance
    far below epsilon; not subnormals, which WGSL lets a device flush to zero)."""
    kinds = [
        np.full(length, 65504.0),
        np.where(np.arange(length) % 2 == 0, 65504.0, -65504.0),
        6e4 + 32.0 * rng.uniform(-1, 1, length),
        (1.0 + rng.uniform(0, 1, length)) * 2.0**-12,
    ]
    kinds[0][rng.integers(length)] = -65504.0
    return np.stack([kinds[r % len(kinds)] for r in range(rows)])


def test_splitk_registers_f16_extremes(request):
    rng, seed = rng_for(request.node.name)
    shape, num_groups = (2, 8, 16, 64), 4
    rows = f16_extreme_rows(rng, shape[0] * num_groups, int(np.prod(shape[1:])) // num_groups)
    inputs = random_inputs(rng, shape, np.float16)
    inputs["x"] = rows.reshape(shape).astype(np.float16)
    attrs = {"num_groups": num_groups}
    tunables = chunk_tunables(16, f16=3)  # 256 units a row in 6 chunks of 48
    assert chunk_geometry(plan_for(inputs, attrs, caps=F16_CAPS, tunables=tunables, variant=CHUNKS)) == (
        16,
        "3",
        6,
    )
    actual = run_poisoned(inputs, attrs=attrs, tunables=tunables, variant=CHUNKS)
    assert np.isfinite(actual).all()
    assert_close(actual, reference(inputs, attrs), np.float16, f"f16 extremes {seed_note(seed)}")


@DTYPES
def test_splitk_registers_large_common_offset_and_constant_rows(dtype, request):
    """A mean 1000 (f32) or 100 (f16) spreads from zero costs nothing, and a constant row gives
    its channels' bias exactly (zero variance)."""
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, (2, 8, 16, 40), dtype)
    spread = 1.0 if dtype == np.float32 else 0.05
    inputs["x"] = (
        rng.standard_normal(inputs["x"].shape) * spread + (1000 if dtype == np.float32 else 100) * spread
    ).astype(dtype)
    inputs["x"][1, 4:] = 7.25  # row 3 of 4 (two groups of four channels)
    attrs = {"num_groups": 2}
    tunables = chunk_tunables(16, 3, 2)
    actual = run_poisoned(inputs, attrs=attrs, tunables=tunables, variant=CHUNKS)
    assert_close(actual, reference(inputs, attrs), dtype, f"offset {seed_note(seed)}")
    assert np.all(actual[1, 4:] == inputs["bias"][4:, None, None])


def test_splitk_registers_selection_on_the_bench_cases():
    """bench.json under H200-like caps: the VAE rows of 512K values or more (2-4 MB) take
    group_splitk_registers (128 invocations, 8 units of 4 f32 or 8 f16 values); the UNet rows stay
    on group_row_registers."""
    from generated.group_normalization.cases import BENCH_CASES

    caps = {
        **H200_CAPS,
        "limits": {**H200_CAPS["limits"], "maxStorageBufferBindingSize": 2**31, "maxBufferSize": 2**31},
    }
    found = {}
    for case in BENCH_CASES:
        for dtype in case["dtypes"]["T"]:
            shapes = {k: tuple(v) for k, v in case["inputs"].items()}
            p = gn.plan(shapes, {"T": dtype}, attrs=case["attrs"], caps=caps)
            found[case["name"], dtype] = (p.variant, *chunk_geometry(p)) if p.variant == CHUNKS else p.variant
    # Chunks of 4096 f32 / 8192 f16 values; sd-vae-128's rows (256K values) are under CHUNK_MIN_HIDDEN.
    vae = {"sd-vae-512": 256, "sd-vae-256": 128}
    for (name, dtype), chosen in found.items():
        if name in vae:
            f32 = dtype == "float32"
            assert chosen == (CHUNKS, 128, "8", vae[name] if f32 else vae[name] // 2), (name, dtype)
        elif name == "sd-vae-128":
            assert chosen == ("group_splitk_vec4" if dtype == "float32" else "group_splitk_vec4_pairs"), (
                name,
                dtype,
            )
        else:
            assert chosen == "group_row_registers", (name, dtype, chosen)


def test_splitk_registers_refusals_say_why():
    shapes = {"x": (1, 8, 4, 5), "scale": (8,), "bias": (8,)}
    for dtype, caps, tunables, words in [
        (
            "float16",
            F16_CAPS,
            CHUNK_MIN,
            "groupSpatial % regUnitValues == 0",
        ),  # channels of 20 values: 2.5 f16 units
        ("float32", F16_CAPS, {}, "groupHidden >= tunables.SPLIT_STATS_MIN_HIDDEN"),
        (
            "float32",
            {**F16_CAPS, "limits": {"maxComputeWorkgroupStorageSize": 1024}},
            CHUNK_MIN,
            "chunkWorkgroupBytes",
        ),
        (
            "float32",
            F16_CAPS,
            {**CHUNK_MIN, "SPLIT_STATS_MAX_ROWS": 1},
            "groupRows <= tunables.SPLIT_STATS_MAX_ROWS",
        ),
    ]:
        with pytest.raises(ContractError, match="does not apply") as caught:
            gn.plan(
                shapes, {"T": dtype}, attrs={"num_groups": 4}, caps=caps, tunables=tunables, variant=CHUNKS
            )
        assert words in str(caught.value), str(caught.value)


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
