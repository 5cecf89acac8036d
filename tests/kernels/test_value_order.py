"""Statistics that do not depend on where outliers sit: every variant of GroupNormalization-21,
InstanceNormalization-6, com.microsoft SkipGroupNorm and GroupNorm (both layouts) and the layer
family (LayerNormalization-17, RMSNormalization-23, SimplifiedLayerNormalization, com.microsoft
SkipLayerNormalization and SkipSimplifiedLayerNormalization), f32 and f16, forced with
`variant=`, on rows (a (batch item, group) row, or a plane) whose values are laid out so that a
shifted-sum scheme breaks: an outlier first, in the middle or last in every row, a large common
offset with a small spread, and two far-apart clusters. The first case is the issue's: X about
-6e4 +- 32 with the first value of each group +6e4 (f16 holds every value of it).

Tunables and caps make the rows span several invocations, subgroups and workgroups (split-k and
slab variants run several splits / slabs a row, group_row_registers, plane_row_registers and the
com.microsoft registers variants (SkipGroupNorm's in both layouts) two workgroups a row,
group_splitk_registers and plane_splitk_registers 8 or 11 chunks a row, the last one short), and the subgroup combines are planned both with and without the `subgroup_id`
language feature. Fresh random data every run (seeded, the seed is
printed on failure), NaN-poisoned outputs, float64 references from tests/oracles.py, and
docs/TESTING.md's tolerances; stash_type 10 uses tests/kernels/group_norm_support.py's f16-stage check, whose
looser bound is the f16 arithmetic the spec prescribes.
"""

from __future__ import annotations

import numpy as np
import pytest

from generated import group_norm as mgn
from generated import group_normalization as gn
from generated import instance_normalization as inn
from generated import layer_normalization as ln
from generated import rms_normalization as rms
from generated import simplified_layer_normalization as sln
from generated import skip_group_norm as sgn
from generated import skip_layer_normalization as skln
from generated import skip_simplified_layer_normalization as sksln
from tests.device_helpers import poisoned_call
from tests.oracles import (
    assert_close,
    group_normalization_ref,
    instance_normalization_ref,
    node_reference,
    microsoft_group_norm_for_call,
    rng_for,
    seed_note,
    skip_group_norm_for_call,
)
from tests.kernels.group_norm_support import assert_close_f16_stage, stash16_exact_statistics_ref

DTYPES = pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
PATTERNS = ("issue", "outlier-first", "outlier-middle", "outlier-last", "offset", "two-clusters")
PATTERN_PARAM = pytest.mark.parametrize("pattern", PATTERNS)

FEATURES = ["shader-f16", "subgroups"]
SUBGROUP_ID = {"features": FEATURES, "wgslLanguageFeatures": ["subgroup_id"]}
NO_SUBGROUP_ID = {"features": FEATURES}
WAVE32 = {**SUBGROUP_ID, "adapterInfo": {"subgroupMinSize": 32, "subgroupMaxSize": 32}}


def pattern_rows(rng, rows, length, pattern, dtype):
    """(rows, length) float64 values of one pattern, each row its own draw; every value is one
    the dtype holds within range."""
    f16 = np.dtype(dtype) == np.float16
    noise = rng.uniform(-1.0, 1.0, (rows, length))
    if pattern in ("issue", "outlier-middle", "outlier-last"):
        x = -6e4 + 32.0 * noise
        column = {"issue": np.zeros(rows, int), "outlier-last": np.full(rows, length - 1)}.get(pattern)
        if column is None:
            column = rng.integers(1, length - 1, rows)
        x[np.arange(rows), column] = 6e4
    elif pattern == "outlier-first":
        x = 1e4 + (64.0 if f16 else 4.0) * noise
        x[:, 0] = -3e4
    elif pattern == "offset":
        x = 1e4 + (64.0 if f16 else 1.0) * noise
    else:  # two clusters, members drawn at random
        x = np.where(rng.random((rows, length)) < 0.5, 6e4, -6e4) + 32.0 * noise
        x[:, 0] = 6e4 + 32.0 * noise[:, 0]
    return x


def group_x(rng, shape, rows, pattern, dtype):
    """An (N, C, ...) tensor whose N * rows contiguous rows follow `pattern`."""
    n = shape[0]
    length = int(np.prod(shape)) // (n * rows)
    return pattern_rows(rng, n * rows, length, pattern, dtype).reshape(shape).astype(dtype)


# --- GroupNormalization --------------------------------------------------------------------------------

GN_SHAPE, GN_GROUPS = (2, 8, 64, 64), 2  # 4 rows of 16384 values
GN_ROW = {"WORKGROUP_SIZE": 64}  # 64 invocations a row: 256 values (64 vectors) each
GN_SPLIT = {
    "STATS_VALUES_PER_SPLIT": 2048,
    "SPLIT_STATS_MIN_HIDDEN": 1,
    "SPLIT_WORKGROUP_SIZE": 64,
}  # 8 splits
# Two workgroups a row of 256 invocations: 16 f32 / 8 f16 units an invocation in registers.
GN_REGISTERS = {"REGISTER_SPLIT_MIN_HIDDEN": 1, "REGISTER_WORKGROUP_SIZE": 256}
# Split-k in registers: rows of 4096 f32 / 2048 f16 units in 8 chunks of 64 invocations x 8 / 4
# units, or in 11 chunks of 64 x 6 / 3 units, the last one short (the outlier-last value in it).
GN_CHUNKS = {"SPLIT_STATS_MIN_HIDDEN": 1, "CHUNK_WORKGROUP_SIZE": 64, "CHUNK_UNITS_F16": 4}
GN_CHUNKS_TAIL = {**GN_CHUNKS, "CHUNK_UNITS_F32": 6, "CHUNK_UNITS_F16": 3}
GN_CONFIGS = [
    ("group_subgroup_vec4", GN_ROW, SUBGROUP_ID),
    ("group_subgroup_vec4", GN_ROW, NO_SUBGROUP_ID),
    ("group_subgroup", GN_ROW, SUBGROUP_ID),
    ("group_subgroup", GN_ROW, NO_SUBGROUP_ID),
    ("group_splitk", GN_SPLIT, NO_SUBGROUP_ID),
    ("group_splitk_vec4", GN_SPLIT, NO_SUBGROUP_ID),
    ("group_splitk_vec4_pairs", GN_SPLIT, NO_SUBGROUP_ID),
    ("group_row_registers", GN_REGISTERS, NO_SUBGROUP_ID),
    ("group_splitk_registers", GN_CHUNKS, NO_SUBGROUP_ID),
    ("group_splitk_registers", GN_CHUNKS_TAIL, NO_SUBGROUP_ID),
]


def config_id(config):
    variant, tunables, caps = config
    return (
        variant
        + ("-subgroup_id" if "wgslLanguageFeatures" in caps else "")
        + ("-tail" if "CHUNK_UNITS_F32" in tunables else "")
    )


@PATTERN_PARAM
@DTYPES
@pytest.mark.parametrize("config", GN_CONFIGS, ids=config_id)
def test_group_normalization(config, dtype, pattern, request):
    variant, tunables, caps = config
    rng, seed = rng_for(request.node.name)
    c = GN_SHAPE[1]
    inputs = {
        "x": group_x(rng, GN_SHAPE, GN_GROUPS, pattern, dtype),
        "scale": rng.uniform(-2, 2, c).astype(dtype),
        "bias": rng.uniform(-1, 1, c).astype(dtype),
    }
    attrs = {"num_groups": GN_GROUPS}
    shapes = {k: v.shape for k, v in inputs.items()}
    p = gn.plan(
        shapes, {"T": np.dtype(dtype).name}, attrs=attrs, caps=caps, tunables=tunables, variant=variant
    )
    if variant == "group_splitk_registers":
        assert p.passes[0].uniforms["chunks"] == (11 if "CHUNK_UNITS_F32" in tunables else 8)
    elif "split" in variant:
        assert p.passes[0].values["split"] == 8
    elif variant == "group_row_registers":
        assert (p.passes[0].workgroup_size, p.passes[0].values["split"]) == (256, 2)
    else:
        assert p.passes[0].workgroup_size == 64
    actual = poisoned_call(gn, inputs, attrs=attrs, caps=caps, tunables=tunables, variant=variant)["y"]
    expected = group_normalization_ref(inputs["x"], inputs["scale"], inputs["bias"], GN_GROUPS)
    assert_close(actual, expected, dtype, f"{config_id(config)} {pattern} {seed_note(seed)}")


STASH_DEVICES = [
    ("f32", np.float32, {"features": ["shader-f16"]}),
    ("f32-no-shader-f16", np.float32, {"features": []}),
    ("f16", np.float16, {"features": ["shader-f16"]}),
]


@PATTERN_PARAM
@pytest.mark.parametrize("label,dtype,caps", STASH_DEVICES, ids=[d[0] for d in STASH_DEVICES])
def test_group_normalization_stash_f16(label, dtype, caps, pattern, request):
    """stash_type 10 (256 invocations a row: 64 values each): the f16 stage against the body with
    exact statistics rounded where the body rounds them."""
    rng, seed = rng_for(request.node.name)
    c = GN_SHAPE[1]
    inputs = {
        "x": group_x(rng, GN_SHAPE, GN_GROUPS, pattern, dtype),
        "scale": rng.uniform(-2, 2, c).astype(dtype),
        "bias": rng.uniform(-1, 1, c).astype(dtype),
    }
    attrs = {"num_groups": GN_GROUPS, "stash_type": 10}
    actual = poisoned_call(gn, inputs, attrs=attrs, caps=caps, variant="group_stash_f16_serial")["y"]
    assert np.isfinite(actual).all()
    ref, normalized, mean_ulp = stash16_exact_statistics_ref(
        inputs["x"], inputs["scale"], inputs["bias"], GN_GROUPS
    )
    context = f"group_stash_f16_serial {label} {pattern} {seed_note(seed)}"
    assert_close_f16_stage(actual, ref, normalized, inputs["scale"], dtype, context, extra=mean_ulp)


# --- InstanceNormalization -----------------------------------------------------------------------------

IN_SHAPE = (2, 3, 128, 128)  # 6 planes of 16384 values
IN_BATCHED_SHAPE = (4, 6, 32, 64)  # 24 planes of 512 vectors, 16 lanes a plane
IN_ROW = {"WORKGROUP_SIZE": 64}
IN_SPLIT = {"SPLIT_STATS_MIN_SPATIAL": 1, "STATS_VALUES_PER_SPLIT": 2048, "WORKGROUP_SIZE": 64}  # 8 splits
# Two workgroups a plane of 256 invocations: 16 f32 / 8 f16 units an invocation in registers.
IN_REGISTERS = {"REGISTER_SPLIT_MIN_HIDDEN": 1, "REGISTER_WORKGROUP_SIZE": 256}
# Split-k in registers, as GN_CHUNKS / GN_CHUNKS_TAIL: 8 chunks a plane, or 11 with a short last one.
IN_CHUNKS = {"SPLIT_STATS_MIN_SPATIAL": 1, "CHUNK_WORKGROUP_SIZE": 64, "CHUNK_UNITS_F16": 4}
IN_CHUNKS_TAIL = {**IN_CHUNKS, "CHUNK_UNITS_F32": 6, "CHUNK_UNITS_F16": 3}
IN_CONFIGS = [
    ("plane_subgroup_vec4", IN_ROW, SUBGROUP_ID),
    ("plane_subgroup_vec4", IN_ROW, NO_SUBGROUP_ID),
    ("plane_subgroup_vec4_scalar_io", IN_ROW, WAVE32),
    ("plane_subgroup", IN_ROW, SUBGROUP_ID),
    ("plane_subgroup", IN_ROW, NO_SUBGROUP_ID),
    ("plane_splitk_vec4", IN_SPLIT, SUBGROUP_ID),
    ("plane_splitk_vec4", IN_SPLIT, NO_SUBGROUP_ID),
    ("plane_splitk", IN_SPLIT, SUBGROUP_ID),
    ("plane_splitk", IN_SPLIT, NO_SUBGROUP_ID),
    ("plane_batched_vec4", {"WORKGROUP_SIZE": 16, "BATCHED_MIN_PLANES_PER_WORKGROUP": 1}, NO_SUBGROUP_ID),
    ("plane_row_registers", IN_REGISTERS, NO_SUBGROUP_ID),
    ("plane_splitk_registers", IN_CHUNKS, NO_SUBGROUP_ID),
    ("plane_splitk_registers", IN_CHUNKS_TAIL, NO_SUBGROUP_ID),
]


@PATTERN_PARAM
@DTYPES
@pytest.mark.parametrize("config", IN_CONFIGS, ids=config_id)
def test_instance_normalization(config, dtype, pattern, request):
    variant, tunables, caps = config
    if variant == "plane_subgroup_vec4_scalar_io" and dtype == np.float16:
        pytest.skip("plane_subgroup_vec4_scalar_io is f32 only")
    rng, seed = rng_for(request.node.name)
    shape = IN_BATCHED_SHAPE if variant == "plane_batched_vec4" else IN_SHAPE
    c = shape[1]
    inputs = {
        "input": group_x(rng, shape, c, pattern, dtype),
        "scale": rng.uniform(-2, 2, c).astype(dtype),
        "b": rng.uniform(-1, 1, c).astype(dtype),
    }
    shapes = {k: v.shape for k, v in inputs.items()}
    p = inn.plan(shapes, {"T": np.dtype(dtype).name}, caps=caps, tunables=tunables, variant=variant)
    if variant == "plane_splitk_registers":
        assert p.passes[0].uniforms["chunks"] == (11 if "CHUNK_UNITS_F32" in tunables else 8)
    elif "splitk" in variant:
        assert p.passes[0].values["split"] == 8
    elif variant == "plane_batched_vec4":
        assert p.passes[0].uniforms["lanesPerPlane"] == 16
    elif variant == "plane_row_registers":
        assert (p.passes[0].workgroup_size, p.passes[0].values["split"]) == (256, 2)
    else:
        assert p.passes[0].workgroup_size == 64
    actual = poisoned_call(inn, inputs, caps=caps, tunables=tunables, variant=variant)["output"]
    expected = instance_normalization_ref(inputs["input"], inputs["scale"], inputs["b"])
    assert_close(actual, expected, dtype, f"{config_id(config)} {pattern} {seed_note(seed)}")


# --- SkipGroupNorm --------------------------------------------------------------------------------------

SGN_GROUPS = 4
SGN_TUNABLES = {
    "WORKGROUP_SIZE": 64,
    "SLAB_VALUES": 1024,
    "FUSED_WORKGROUP_SIZE": 64,
    "REGISTER_SPLIT_MIN_VALUES": 1,
    "REGISTER_MIN_POSITION_LANES": 4,
}
SGN_FLAVOURS = tuple(
    f"{family}_{member}"
    for family in ("split", "fused")
    for member in ("bias_sum", "bias_plain", "sum", "plain")
) + (
    "registers_bias_sum",
    "registers_plain",
)  # a variant with and without a bias and S (registers: the statistics are one code for all four)


def sgn_x(rng, channels_last, pattern, dtype):
    """X of 2 batch items, 32 channels, 32 x 32 positions (4 groups of 8192 values) in its layout;
    a group's first value (channel g * 8, position 0) comes first in memory in both layouts."""
    n, c, hw = 2, 32, 1024
    rows = pattern_rows(rng, n * SGN_GROUPS, c // SGN_GROUPS * hw, pattern, dtype)
    nchw = rows.reshape(n, c, hw)
    if channels_last:
        return nchw.transpose(0, 2, 1).reshape(n, 32, 32, c).astype(dtype)
    return nchw.reshape(n, c, 32, 32).astype(dtype)


def on_grid(values):
    """Multiples of 2^-8: X + skip + bias is then exact in f32 for every pattern (|S| < 65536), so
    the kernel's two f32 roundings of the sum (X + skip, then + bias) equal the reference's one.
    Otherwise one ulp of S (1e-3 at the 1e4 offset, where the spread is about 0.6) alone moves Y
    past the tolerance: a property of the sum, not of the statistics tested here."""
    return np.round(np.asarray(values) * 256.0) / 256.0


@PATTERN_PARAM
@DTYPES
@pytest.mark.parametrize("channels_last", [1, 0], ids=["nhwc", "nchw"])
@pytest.mark.parametrize("flavour", SGN_FLAVOURS)
def test_skip_group_norm(flavour, channels_last, dtype, pattern, request):
    rng, seed = rng_for(request.node.name)
    variant = flavour.split("_")[0]
    x = sgn_x(rng, channels_last, pattern, dtype)
    c = 32
    inputs = {
        "X": x,
        "gamma": rng.uniform(-2, 2, c).astype(dtype),
        "beta": rng.uniform(-1, 1, c).astype(dtype),
        "skip": on_grid(rng.uniform(-0.5, 0.5, x.shape)).astype(dtype),
    }
    if "bias" in flavour:
        inputs["bias"] = on_grid(rng.uniform(-0.5, 0.5, c)).astype(dtype)
    outputs = ("Y", "S") if flavour.endswith("sum") else ("Y",)
    attrs = {"groups": SGN_GROUPS, "activation": int(rng.integers(0, 2)), "channels_last": channels_last}
    shapes = {k: v.shape for k, v in inputs.items()}
    name = np.dtype(dtype).name
    p = sgn.plan(
        shapes,
        {"T": name, "M": name},
        attrs=attrs,
        outputs=outputs,
        tunables=SGN_TUNABLES,
        variant=variant,
        caps={"features": FEATURES},
    )
    first = p.passes[0]
    if variant == "split":
        assert first.values["slabCount"] > 1, first.uniforms
    elif variant == "fused":
        assert first.overrides["workgroupSize"] < first.uniforms["rowVectors"]
    else:  # two workgroups a row, each of several subgroups
        assert first.overrides["split"] == 2 and first.overrides["workgroupSize"] > 8, first.values
    result = poisoned_call(sgn, inputs, outputs, attrs=attrs, tunables=SGN_TUNABLES, variant=variant)
    y_ref, s_ref = skip_group_norm_for_call(inputs, attrs)
    context = f"{variant} channels_last={channels_last} {pattern} activation={attrs['activation']} {seed_note(seed)}"
    assert_close(result["Y"], y_ref, dtype, context + " Y")
    if "S" in result:
        assert_close(result["S"], s_ref, dtype, context + " S")


# --- com.microsoft GroupNorm ----------------------------------------------------------------------------

MGN_TUNABLES = SGN_TUNABLES  # the same shaders
MGN_CONFIGS = [
    ("registers", 1),
    ("split", 1),
    ("split", 0),
    ("fused", 1),
    ("fused", 0),
]  # registers: NHWC only


@PATTERN_PARAM
@DTYPES
@pytest.mark.parametrize(
    "variant,channels_last", MGN_CONFIGS, ids=[f"{v}-{'nhwc' if c else 'nchw'}" for v, c in MGN_CONFIGS]
)
def test_microsoft_group_norm(variant, channels_last, dtype, pattern, request):
    """SkipGroupNorm's shaders without the skip: X itself is what the statistics see."""
    rng, seed = rng_for(request.node.name)
    x = sgn_x(rng, channels_last, pattern, dtype)
    c = 32
    inputs = {
        "X": x,
        "gamma": rng.uniform(-2, 2, c).astype(np.float32),  # M float32 with either T, as SD exports
        "beta": rng.uniform(-1, 1, c).astype(np.float32),
    }
    attrs = {"groups": SGN_GROUPS, "activation": int(rng.integers(0, 2)), "channels_last": channels_last}
    shapes = {k: v.shape for k, v in inputs.items()}
    p = mgn.plan(
        shapes,
        {"T": np.dtype(dtype).name, "M": "float32"},
        attrs=attrs,
        tunables=MGN_TUNABLES,
        variant=variant,
        caps={"features": FEATURES},
    )
    first = p.passes[0]
    if variant == "split":
        assert first.values["slabCount"] > 1, first.values
    elif variant == "fused":
        assert first.overrides["workgroupSize"] < first.uniforms["rowVectors"]
    else:  # two workgroups a row, each of several subgroups
        assert first.overrides["split"] == 2 and first.overrides["workgroupSize"] > 8, first.values
    result = poisoned_call(mgn, inputs, ("Y",), attrs=attrs, tunables=MGN_TUNABLES, variant=variant)
    context = f"{variant} channels_last={channels_last} {pattern} activation={attrs['activation']} {seed_note(seed)}"
    assert_close(result["Y"], microsoft_group_norm_for_call(inputs, attrs), dtype, context + " Y")


# --- The layer family (LayerNormalization, RMSNormalization, SimplifiedLayerNormalization, the Skip forms)

LAYER_ROWS, LAYER_HIDDEN = 8, 4096  # 2 x 4 rows of 4096 values
# row_registers: the row over 64 invocations of 16 f32 / 8 f16 units (the largest buckets, 64
# registers either way); row_vec4 / row_scalar: 64 invocations a row, 16 vectors or 64 values each.
LAYER_TUNABLES = {
    ("row_registers", "float32"): {"REGISTER_WORKGROUP_SIZE": 64, "REGISTER_TARGET_VALUES": 1},
    ("row_registers", "float16"): {"REGISTER_WORKGROUP_SIZE": 64, "REGISTER_TARGET_VALUES": 1},
    ("row_vec4", "float32"): {"WORKGROUP_SIZE": 64},
    ("row_vec4", "float16"): {"WORKGROUP_SIZE": 64},
    ("row_scalar", "float32"): {"WORKGROUP_SIZE": 64},
    ("row_scalar", "float16"): {"WORKGROUP_SIZE": 64},
}
LAYER_OPS = {
    "layer_normalization": ln,
    "rms_normalization": rms,
    "simplified_layer_normalization": sln,
    "skip_layer_normalization": skln,
    "skip_simplified_layer_normalization": sksln,
}
LAYER_CONFIGS = [(op, variant) for op in LAYER_OPS for variant in ("row_registers", "row_vec4", "row_scalar")]


def layer_inputs(rng, op, x):
    """X (the Skip forms: as input, with a small skip on on_grid's grid, so that the f32 sum is
    exact, and a bias); Scale / gamma, and B / beta where the op has one, of X's last axis."""
    hidden, dtype = x.shape[-1], x.dtype
    params = {"gamma": rng.uniform(-2, 2, hidden).astype(dtype)}
    if op.startswith("skip"):
        inputs = {"input": x, "skip": on_grid(rng.uniform(-0.5, 0.5, x.shape)).astype(dtype), **params}
        inputs["bias"] = on_grid(rng.uniform(-0.5, 0.5, hidden)).astype(dtype)
        if op == "skip_layer_normalization":
            inputs["beta"] = rng.uniform(-1, 1, hidden).astype(dtype)
        return inputs
    inputs = {"x": x, "scale": params["gamma"]}
    if op == "layer_normalization":
        inputs["b"] = rng.uniform(-1, 1, hidden).astype(dtype)
    return inputs


def check_layer_family(package, op, inputs, variant, tunables, context):
    """Every output of `op` (statistics included) from a poisoned call against the float64 definition."""
    outputs = tuple(
        t.key for t in package.OUTPUTS if t.key != "mean" or op != "skip_simplified_layer_normalization"
    )
    caps = {"features": FEATURES}
    result = poisoned_call(package, inputs, outputs, caps=caps, tunables=tunables, variant=variant)
    expected = node_reference(package, inputs, {})
    for key in outputs:
        if key == "mean" and "two-clusters" in context:
            check_mean_by_what_it_normalizes(inputs, result, expected, op, f"{context} {key}")
            continue
        assert_close(result[key], expected[key], result[key].dtype, f"{context} {key}")


@PATTERN_PARAM
@DTYPES
@pytest.mark.parametrize("config", LAYER_CONFIGS, ids=lambda c: f"{c[0]}-{c[1]}")
def test_layer_family(config, dtype, pattern, request):
    """Every output, statistics included, against the float64 definition."""
    op, variant = config
    package = LAYER_OPS[op]
    rng, seed = rng_for(request.node.name)
    x = pattern_rows(rng, LAYER_ROWS, LAYER_HIDDEN, pattern, dtype).reshape(2, 4, LAYER_HIDDEN).astype(dtype)
    inputs = layer_inputs(rng, op, x)
    tunables = LAYER_TUNABLES[variant, np.dtype(dtype).name]
    shapes = {k: v.shape for k, v in inputs.items()}
    dtypes = {t: np.dtype(dtype).name for t, allowed in package.TYPE_CONSTRAINTS.items() if len(allowed) > 1}
    p = package.plan(shapes, dtypes, caps={"features": FEATURES}, tunables=tunables, variant=variant)
    invocations = dict(p.passes[0].pipeline_constants).get("rowInvocations", p.passes[0].workgroup_size)
    assert invocations == 64
    check_layer_family(package, op, inputs, variant, tunables, f"{op} {variant} {pattern} {seed_note(seed)}")


# Short rows share a row_registers workgroup, a team of invocations a row: 16 values a row make
# teams of one invocation (eight rows in one of lavapipe's 8-wide subgroups, whose mean would mix
# them), 256 values teams of 16 (two whole subgroups a row).
SHARED_HIDDEN = {16: "narrower", 256: "wider"}


@PATTERN_PARAM
@DTYPES
@pytest.mark.parametrize(
    "hidden", sorted(SHARED_HIDDEN), ids=lambda h: f"teams-{SHARED_HIDDEN[h]}-than-a-subgroup"
)
@pytest.mark.parametrize("op", sorted(LAYER_OPS))
def test_layer_family_rows_sharing_a_workgroup(op, hidden, dtype, pattern, request):
    """Rows side by side in one workgroup with opposite offsets (every other row negated): no row's
    statistics may borrow another's, the mean a subgroup takes its deviations from included."""
    package = LAYER_OPS[op]
    rng, seed = rng_for(request.node.name)
    rows = 24
    signs = np.where(np.arange(rows) % 2 == 0, 1.0, -1.0)[:, None]
    x = (pattern_rows(rng, rows, hidden, pattern, dtype) * signs).reshape(2, rows // 2, hidden).astype(dtype)
    inputs = layer_inputs(rng, op, x)
    shapes = {k: v.shape for k, v in inputs.items()}
    dtypes = {t: np.dtype(dtype).name for t, allowed in package.TYPE_CONSTRAINTS.items() if len(allowed) > 1}
    p = package.plan(shapes, dtypes, caps={"features": FEATURES}, variant="row_registers")
    constants = dict(p.passes[0].pipeline_constants)
    assert (constants["rowInvocations"] < 8) == (SHARED_HIDDEN[hidden] == "narrower")
    assert constants["workgroupSize"] >= 2 * constants["rowInvocations"]
    context = f"{op} row_registers {hidden} values a row {pattern} {seed_note(seed)}"
    check_layer_family(package, op, inputs, "row_registers", {}, context)


def check_mean_by_what_it_normalizes(inputs, result, expected, op, context):
    """Rows of two clusters at +-6e4 have a mean near 0 that their values cancel to: float32
    statistics hold it to about eps of the values (6e4 * 6e-8), not of itself (ONNX Runtime's float32
    sum is off by 4e-3 on these rows), so the float64 mean is not a float32 target. Mean is judged by
    what it is for: (X - Mean) * InvStdDev, the normalized values, within the float32 tolerance of
    the exact ones (an error d in Mean moves them by d / std)."""
    x = (inputs["x"] if "x" in inputs else inputs["input"]).astype(np.float64)
    if op.startswith("skip"):
        x = x + inputs["skip"].astype(np.float64) + inputs["bias"].astype(np.float64)
    normalized = (x - np.asarray(result["mean"], np.float64)) * expected[
        "inv_std_var" if op.startswith("skip") else "invStdDev"
    ]
    exact = (x - expected["mean"]) * expected["inv_std_var" if op.startswith("skip") else "invStdDev"]
    assert_close(normalized, exact, np.float32, context + " (X - Mean) * InvStdDev")
