"""No pipeline per shape (issue 10 item 3, docs/MANIFEST.md): shape- and attribute-dependent values reach
the shaders through the `Params` uniform, so a new shape reuses the pipelines of the last one.

For every op and every variant (forced with `variant=`, f32 and f16 where valid) a first shape
runs, then a second one with other N, C, H, W (and groups where the op has them), chosen so
that the variant and its workgroup size stay the same: `_runtime.pipelines_created()` must not
grow on the second call, and both results match the float64 references of tests/oracles.py
(docs/TESTING.md tolerances; NaN-poisoned outputs, fresh random data, seed printed on failure).
A second test plans 50 shapes of one variant and counts the distinct (wgsl, overrides)
pipeline keys: only the workgroup-array sizes (powers of two under a tunable) may tell them apart.
"""

from __future__ import annotations

import numpy as np
import pytest

from generated import _runtime
from generated import batch_normalization as bn
from generated import group_norm as mgn
from generated import group_normalization as gn
from generated import instance_normalization as inn
from generated import skip_group_norm as sgn
from tests.device_helpers import poisoned_call
from tests.oracles import (
    assert_close,
    batch_normalization_ref,
    group_normalization_ref,
    instance_normalization_ref,
    microsoft_group_norm_for_call,
    rng_for,
    seed_note,
    skip_group_norm_for_call,
)
from tests.kernels.group_norm_support import (
    assert_close_f16_stage,
    bucket_fill,
    expected_fill,
    held_units,
    spec_normalized,
)

F16 = {"features": ["shader-f16"]}
SUBGROUP_ID = {"features": ["shader-f16", "subgroups"], "wgslLanguageFeatures": ["subgroup_id"]}
DTYPES = pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])


def pipeline_key(p):
    return (p.wgsl, tuple(sorted(p.overrides.items())))


def run_two_shapes(package, variant, cases, make_inputs, check, dtype, rng, seed, **kwargs):
    """`cases`: two (shape, attrs); runs both, the second must create no pipeline."""
    type_keys = kwargs.pop("type_keys")
    outputs = kwargs.pop("outputs", None)
    plans = []
    for shape, attrs in cases:
        inputs = make_inputs(rng, shape, attrs, dtype)
        dtypes = {tv: inputs[key].dtype.name for tv, key in type_keys.items()}
        shapes = {k: v.shape for k, v in inputs.items()}
        plan = package.plan(shapes, dtypes, attrs=attrs, variant=variant, outputs=outputs, **kwargs)
        assert plan.variant == variant
        plans.append(plan)
        before = _runtime.pipelines_created()
        result = poisoned_call(package, inputs, outputs, attrs=attrs, variant=variant, **kwargs)
        context = f"{variant} {np.dtype(dtype).name} {shape} {attrs} {seed_note(seed)}"
        if len(plans) == 2:
            created = _runtime.pipelines_created() - before
            if kept_values_differ(plans[0].passes, plans[1].passes, kept_constants(package, variant)):
                # The manifest keeps some request-dependent values as overrides (measured to pay),
                # and they differ: a new shape may create this variant's pipelines, one a pass at most.
                assert created <= len(
                    plan.passes
                ), f"{context}: {created} pipelines for {len(plan.passes)} passes"
            else:
                assert created == 0, f"{context}: the second shape created a pipeline"
        check(inputs, attrs, result, context)
    first, second = plans
    kept = kept_constants(package, variant)
    for a, b in zip(first.passes, second.passes):
        if kept_values_differ([a], [b], kept):
            assert a.overrides.keys() == b.overrides.keys(), a.name
            continue
        assert pipeline_key(a) == pipeline_key(
            b
        ), f"{variant} {a.name}: overrides {a.overrides} != {b.overrides}"
        assert a.uniforms != b.uniforms, f"{variant} {a.name}: the shapes were meant to differ in Params"


def kept_values_differ(first, second, kept):
    """Whether two plans' passes differ in a value the manifest keeps as an override: only then
    may the second shape make pipelines."""
    return any(a.overrides.get(k) != b.overrides.get(k) for a, b in zip(first, second) for k in kept)


def kept_constants(package, variant):
    """The variant's PIPELINE_CONSTANTS: request-dependent values its manifest keeps as overrides."""
    module = next(c for c in package.CANDIDATES if c.ID == variant)
    return module.PIPELINE_CONSTANTS


# --- BatchNormalization ---------------------------------------------------------------------------

BN_CASES = [
    ("inference_scalar", (2, 3, 5), (3, 4, 2, 3)),
    ("nc_inference_vec4", (3, 8), (5, 12)),
    ("nchw_inference_vec4", (2, 3, 4, 4), (3, 5, 2, 6)),
    ("flat_inference_vec4", (4, 3, 7, 7), (2, 5, 3, 2)),
]


def bn_inputs(rng, shape, attrs, dtype):
    c = shape[1]
    return {
        "x": (rng.standard_normal(shape) * 2 + 1).astype(dtype),
        "scale": rng.uniform(-2, 2, c).astype(dtype),
        "b": rng.uniform(-1, 1, c).astype(dtype),
        "inputMean": rng.uniform(-1, 1, c).astype(dtype),
        "inputVar": rng.uniform(0.25, 2, c).astype(dtype),
    }


def bn_check(inputs, attrs, result, context):
    i = inputs
    expected = batch_normalization_ref(
        i["x"], i["scale"], i["b"], i["inputMean"], i["inputVar"], attrs["epsilon"]
    )
    assert_close(result["y"], expected, i["x"].dtype, context)


@DTYPES
@pytest.mark.parametrize("variant,first,second", BN_CASES, ids=[c[0] for c in BN_CASES])
def test_batch_normalization_second_shape_reuses_pipelines(variant, first, second, dtype, request):
    rng, seed = rng_for(request.node.name)
    cases = [(first, {"epsilon": 1e-5}), (second, {"epsilon": 1e-3})]
    run_two_shapes(bn, variant, cases, bn_inputs, bn_check, dtype, rng, seed, caps=F16, type_keys={"T": "x"})


# 8 halves a load: float16 only.
BN_HALVES8_CASES = [
    ("flat_inference_halves8", (8, 3, 7, 7), (2, 5, 4, 4)),
]


@pytest.mark.parametrize("variant,first,second", BN_HALVES8_CASES, ids=[c[0] for c in BN_HALVES8_CASES])
def test_batch_normalization_halves8_second_shape_reuses_pipelines(variant, first, second, request):
    rng, seed = rng_for(request.node.name)
    cases = [(first, {"epsilon": 1e-5}), (second, {"epsilon": 1e-3})]
    run_two_shapes(
        bn, variant, cases, bn_inputs, bn_check, np.float16, rng, seed, caps=F16, type_keys={"T": "x"}
    )


# --- GroupNormalization ---------------------------------------------------------------------------

SPLIT_TUNABLES = {"STATS_VALUES_PER_SPLIT": 64, "SPLIT_STATS_MIN_HIDDEN": 1}
# (variant, tunables, caps, stash_type): first (2, 6, 8, 20) with 3 groups (hidden 320), then
# (3, 8, 6, 18) with 2 groups (hidden 432): the same power-of-two workgroup for every variant.
GN_CASES = [
    ("group_subgroup_vec4", {}, SUBGROUP_ID, 1),
    ("group_subgroup_vec4", {}, F16, 1),
    ("group_subgroup", {}, F16, 1),
    ("group_subgroup", {}, SUBGROUP_ID, 1),
    ("group_splitk", SPLIT_TUNABLES, F16, 1),
    ("group_splitk_vec4", SPLIT_TUNABLES, F16, 1),
    ("group_splitk_vec4_pairs", SPLIT_TUNABLES, F16, 1),
    ("group_stash_f16_serial", {}, F16, 10),
]


def gn_inputs(rng, shape, attrs, dtype):
    c = shape[1]
    return {
        "x": (rng.standard_normal(shape) * 2 + 1).astype(dtype),
        "scale": rng.uniform(-2, 2, c).astype(dtype),
        "bias": rng.uniform(-1, 1, c).astype(dtype),
    }


def gn_check(inputs, attrs, result, context):
    dtype = inputs["x"].dtype
    expected = group_normalization_ref(inputs["x"], inputs["scale"], inputs["bias"], **attrs)
    if attrs["stash_type"] == 10:
        normalized = spec_normalized(inputs, attrs)
        assert_close_f16_stage(result["y"], expected, normalized, inputs["scale"], dtype, context)
    else:
        assert_close(result["y"], expected, dtype, context)


@DTYPES
@pytest.mark.parametrize(
    "variant,tunables,caps,stash", GN_CASES, ids=[f"{c[0]}-{len(c[2])}" for c in GN_CASES]
)
def test_group_normalization_second_shape_reuses_pipelines(variant, tunables, caps, stash, dtype, request):
    rng, seed = rng_for(request.node.name)
    cases = [
        ((2, 6, 8, 20), {"num_groups": 3, "stash_type": stash, "epsilon": 1e-5}),
        ((3, 8, 6, 18), {"num_groups": 2, "stash_type": stash, "epsilon": 1e-5}),
    ]
    run_two_shapes(
        gn,
        variant,
        cases,
        gn_inputs,
        gn_check,
        dtype,
        rng,
        seed,
        caps=caps,
        tunables=tunables,
        type_keys={"T": "x"},
    )


SUBGROUPS = {"features": ["shader-f16", "subgroups"]}
# group_row_registers holds 8 f16 values a unit (spatial % 8 == 0): first (2, 6, 8, 20) with 3
# groups (80 f32 / 40 f16 units a row), then (3, 8, 8, 11) with 2 groups (88 / 44 units), both on
# 32 invocations: the same unit bucket (3 f32 units, 2 f16 units an invocation), fill ("last":
# only the last unit can fall past the row), split (1) and workgroup.
REGISTER_TUNABLES = {"REGISTER_SINGLE_WORKGROUP_SIZE": 32}


@DTYPES
def test_group_row_registers_second_shape_reuses_pipelines(dtype, request):
    rng, seed = rng_for(request.node.name)
    cases = [
        ((2, 6, 8, 20), {"num_groups": 3, "stash_type": 1, "epsilon": 1e-5}),
        ((3, 8, 8, 11), {"num_groups": 2, "stash_type": 1, "epsilon": 1e-3}),
    ]
    run_two_shapes(
        gn,
        "group_row_registers",
        cases,
        gn_inputs,
        gn_check,
        dtype,
        rng,
        seed,
        caps=SUBGROUPS,
        tunables=REGISTER_TUNABLES,
        type_keys={"T": "x"},
    )


# group_splitk_registers: the chunk geometry comes from tunables, so a second shape of whole units
# (f16: spatial % 8 == 0) whose rows are again whole chunks (the wholeChunks specialization)
# differs only in Params: first (2, 6, 8, 24) with 3 groups (384 values a row: 6 f32 / 3 f16
# chunks of 8 x 2 units), then (3, 8, 8, 16) with 2 groups (512 values: 8 / 4 chunks).
CHUNK_TUNABLES = {
    "SPLIT_STATS_MIN_HIDDEN": 1,
    "CHUNK_WORKGROUP_SIZE": 8,
    "CHUNK_UNITS_F32": 2,
    "CHUNK_UNITS_F16": 2,
}


@DTYPES
def test_group_splitk_registers_second_shape_reuses_pipelines(dtype, request):
    rng, seed = rng_for(request.node.name)
    cases = [
        ((2, 6, 8, 24), {"num_groups": 3, "stash_type": 1, "epsilon": 1e-5}),
        ((3, 8, 8, 16), {"num_groups": 2, "stash_type": 1, "epsilon": 1e-3}),
    ]
    run_two_shapes(
        gn,
        "group_splitk_registers",
        cases,
        gn_inputs,
        gn_check,
        dtype,
        rng,
        seed,
        caps=F16,
        tunables=CHUNK_TUNABLES,
        type_keys={"T": "x"},
    )


# --- InstanceNormalization ------------------------------------------------------------------------

SPLIT_IN = {"SPLIT_STATS_MIN_SPATIAL": 1, "STATS_VALUES_PER_SPLIT": 16}
IN_CASES = [
    ("plane_subgroup_vec4", (2, 3, 8, 12), (3, 5, 4, 28), {}, SUBGROUP_ID),
    ("plane_subgroup_vec4", (2, 3, 8, 12), (3, 5, 4, 28), {}, F16),
    (
        "plane_subgroup_vec4_scalar_io",
        (2, 3, 8, 16),
        (1, 4, 4, 28),
        {},
        {**SUBGROUP_ID, "adapterInfo": {"subgroupMinSize": 32, "subgroupMaxSize": 32}},
    ),
    ("plane_subgroup", (2, 3, 7, 9), (3, 2, 5, 11), {}, F16),
    ("plane_splitk_vec4", (2, 3, 8, 12), (3, 5, 4, 28), SPLIT_IN, SUBGROUP_ID),
    ("plane_splitk", (2, 3, 7, 9), (3, 2, 5, 11), SPLIT_IN, F16),
    (
        "plane_batched_vec4",
        (2, 9, 16),
        (4, 5, 24),
        {"WORKGROUP_SIZE": 16, "BATCHED_MIN_PLANES_PER_WORKGROUP": 1},
        F16,
    ),
    # 320 then 352 values a plane (80 / 88 f32 units, 40 / 44 f16 units) on 32 invocations: the
    # same unit bucket (3 f32 units, 2 f16 units an invocation), fill ("last"), split and
    # workgroup, other N and C.
    ("plane_row_registers", (2, 3, 8, 40), (3, 5, 8, 44), {"REGISTER_SINGLE_WORKGROUP_SIZE": 32}, SUBGROUPS),
    # 384 then 512 values a plane in chunks of 8 x 2 units: 6 then 8 chunks (f32), 3 and 4 (f16),
    # whole chunks both times; the chunk geometry comes from tunables, so only the uniforms differ.
    (
        "plane_splitk_registers",
        (2, 3, 8, 48),
        (3, 5, 16, 32),
        {"SPLIT_STATS_MIN_SPATIAL": 1, "CHUNK_WORKGROUP_SIZE": 8, "CHUNK_UNITS_F32": 2, "CHUNK_UNITS_F16": 2},
        F16,
    ),
]


def in_inputs(rng, shape, attrs, dtype):
    c = shape[1]
    return {
        "input": (rng.standard_normal(shape) * 2 + 1).astype(dtype),
        "scale": rng.uniform(-2, 2, c).astype(dtype),
        "b": rng.uniform(-1, 1, c).astype(dtype),
    }


def in_check(inputs, attrs, result, context):
    expected = instance_normalization_ref(inputs["input"], inputs["scale"], inputs["b"], attrs["epsilon"])
    assert_close(result["output"], expected, inputs["input"].dtype, context)


@DTYPES
@pytest.mark.parametrize(
    "variant,first,second,tunables,caps", IN_CASES, ids=[f"{c[0]}-{len(c[4])}" for c in IN_CASES]
)
def test_instance_normalization_second_shape_reuses_pipelines(
    variant, first, second, tunables, caps, dtype, request
):
    if variant == "plane_subgroup_vec4_scalar_io" and dtype == np.float16:
        pytest.skip("f32 only")
    rng, seed = rng_for(request.node.name)
    cases = [(first, {"epsilon": 1e-5}), (second, {"epsilon": 1e-5})]
    run_two_shapes(
        inn,
        variant,
        cases,
        in_inputs,
        in_check,
        dtype,
        rng,
        seed,
        caps=caps,
        tunables=tunables,
        type_keys={"T": "input"},
    )


# --- com.microsoft SkipGroupNorm ------------------------------------------------------------------

SGN_FLAVOURS = tuple(
    f"{family}_{member}"
    for family in ("split", "fused")
    for member in ("bias_sum", "bias_plain", "sum", "plain")
)  # a variant with and without a bias and S


def sgn_inputs(rng, shape, attrs, dtype):
    c = shape[3]  # NHWC
    inputs = {
        "X": (rng.standard_normal(shape) * 2 + 1).astype(dtype),
        "gamma": rng.uniform(-2, 2, c).astype(dtype),
        "beta": rng.uniform(-1, 1, c).astype(dtype),
        "skip": rng.standard_normal(shape).astype(dtype),
    }
    if attrs.pop("_bias"):
        inputs["bias"] = rng.uniform(-1, 1, c).astype(dtype)
    return inputs


def sgn_check(inputs, attrs, result, context):
    y_ref, s_ref = skip_group_norm_for_call(inputs, attrs)
    assert_close(result["Y"], y_ref, inputs["X"].dtype, f"{context} Y")
    if "S" in result:
        assert_close(result["S"], s_ref, inputs["X"].dtype, f"{context} S")


@DTYPES
@pytest.mark.parametrize("flavour", SGN_FLAVOURS)
def test_skip_group_norm_second_shape_reuses_pipelines(flavour, dtype, request):
    rng, seed = rng_for(request.node.name)
    variant = flavour.split("_")[0]
    bias = "bias" in flavour
    cases = [
        ((2, 4, 5, 16), {"groups": 4, "activation": 0, "epsilon": 1e-5, "_bias": bias}),
        # The same power-of-two workgroups: fused (rowVectors 20 and 18 -> 32 lanes); split (8 slab
        # lanes, 10 and 15 slabs -> a 16-lane combine).
        (
            ((1, 3, 6, 8), {"groups": 2, "activation": 1, "epsilon": 1e-5, "_bias": bias})
            if variant.startswith("fused")
            else ((1, 3, 5, 24), {"groups": 6, "activation": 1, "epsilon": 1e-5, "_bias": bias})
        ),
    ]
    outputs = ("Y", "S") if flavour.endswith("sum") else ("Y",)

    def make_inputs(rng, shape, attrs, dtype):
        inputs = sgn_inputs(rng, shape, attrs, dtype)
        return inputs

    run_two_shapes(
        sgn,
        variant,
        cases,
        make_inputs,
        sgn_check,
        dtype,
        rng,
        seed,
        caps=F16,
        outputs=outputs,
        tunables={"WORKGROUP_SIZE": 8, "SLAB_VALUES": 16},
        type_keys={"T": "X", "M": "gamma"},
    )


# --- com.microsoft GroupNorm ------------------------------------------------------------------------


def mgn_inputs(rng, shape, attrs, dtype):
    c = shape[3]  # NHWC
    return {
        "X": (rng.standard_normal(shape) * 2 + 1).astype(dtype),
        "gamma": rng.uniform(-2, 2, c).astype(np.float32),
        "beta": rng.uniform(-1, 1, c).astype(np.float32),
    }


def mgn_check(inputs, attrs, result, context):
    assert_close(result["Y"], microsoft_group_norm_for_call(inputs, attrs), inputs["X"].dtype, f"{context} Y")


@DTYPES
@pytest.mark.parametrize("variant", ["split", "fused"])
def test_microsoft_group_norm_second_shape_reuses_pipelines(variant, dtype, request):
    """SkipGroupNorm's shapes above, without the skip: the same workgroup sizes on both shapes."""
    rng, seed = rng_for(request.node.name)
    second = ((1, 3, 6, 8), {"groups": 2}) if variant == "fused" else ((1, 3, 5, 24), {"groups": 6})
    cases = [
        ((2, 4, 5, 16), {"groups": 4, "activation": 0, "epsilon": 1e-5}),
        (second[0], {**second[1], "activation": 1, "epsilon": 1e-5}),
    ]
    run_two_shapes(
        mgn,
        variant,
        cases,
        mgn_inputs,
        mgn_check,
        dtype,
        rng,
        seed,
        caps=F16,
        tunables={"WORKGROUP_SIZE": 8, "SLAB_VALUES": 16},
        type_keys={"T": "X", "M": "gamma"},
    )


# --- pipeline keys over many shapes ---------------------------------------------------------------


def random_nchw(rng, count, spatial_multiple):
    shapes = set()
    while len(shapes) < count:
        n, c = int(rng.integers(1, 5)), int(rng.integers(1, 9)) * 2
        h = int(rng.integers(4, 17))
        w = spatial_multiple * int(rng.integers(2, 9))
        shapes.add((n, c, h, w))
    return sorted(shapes)


KEY_CASES = [
    (gn, "group_subgroup_vec4", lambda s: {"num_groups": 2}, SUBGROUP_ID, {}),
    (gn, "group_splitk_vec4", lambda s: {"num_groups": 2}, F16, SPLIT_TUNABLES),
    (inn, "plane_subgroup_vec4", lambda s: {}, SUBGROUP_ID, {}),
    (inn, "plane_splitk", lambda s: {}, F16, SPLIT_IN),
    (bn, "nchw_inference_vec4", lambda s: {}, F16, {}),
]


@pytest.mark.parametrize("package,variant,attrs,caps,tunables", KEY_CASES, ids=[c[1] for c in KEY_CASES])
def test_fifty_shapes_share_a_handful_of_pipelines(package, variant, attrs, caps, tunables, request):
    rng, seed = rng_for(request.node.name)
    keys, sizes = set(), set()
    for n, c, h, w in random_nchw(rng, 50, 4):
        x = {"shape": (n, c, h, w)}
        per_channel = {"shape": (c,)}
        if package is gn:
            shapes = {"x": x["shape"], "scale": (c,), "bias": (c,)}
        elif package is inn:
            shapes = {"input": x["shape"], "scale": (c,), "b": (c,)}
        else:
            shapes = {
                "x": x["shape"],
                **{k: per_channel["shape"] for k in ("scale", "b", "inputMean", "inputVar")},
            }
        plan = package.plan(
            shapes, {"T": "float32"}, attrs=attrs(x), caps=caps, tunables=tunables, variant=variant
        )
        for p in plan.passes:
            keys.add((p.name, pipeline_key(p)))
            sizes.add((p.name, p.workgroup_size))
            assert not set(p.overrides) & set(p.uniforms), p.name
    # Only the workgroup size (a power of two up to a tunable, for the row variants) may differ.
    assert (
        len(keys) == len(sizes) <= 12
    ), f"{variant}: {len(keys)} pipeline keys for 50 shapes ({seed_note(seed)})"


def test_group_row_registers_pipelines_are_one_per_workgroup_size_and_unit_bucket(request):
    """50 shapes of group_row_registers: a pipeline is told apart only by its workgroup size, the
    specialization's unit bucket (the shader's UNITS), its fill and split, never by a shape value:
    per dtype the powers of two below the workgroup cap (one unit each) and the cap with each of
    12 buckets, times at most 3 fills and 2 splits."""
    rng, seed = rng_for(request.node.name)

    def plans():
        for n, c, h, w in random_nchw(rng, 50, 8):
            shapes = {"x": (n, c, h, w), "scale": (c,), "bias": (c,)}
            for dtype in ("float32", "float16"):
                yield shapes, dtype, gn.plan(
                    shapes,
                    {"T": dtype},
                    attrs={"num_groups": 2},
                    caps=SUBGROUPS,
                    variant="group_row_registers",
                )

    assert_one_pipeline_per_workgroup_and_bucket(plans(), seed)


def test_plane_row_registers_pipelines_are_one_per_workgroup_size_and_unit_bucket(request):
    """The same for InstanceNorm's plane_row_registers (GroupNorm's template, one channel a group)
    over 50 shapes, planes of 8 to 20000 values (buckets up to 20 units at 256 invocations):
    pipelines differ only by workgroup size, unit bucket, fill and split."""
    rng, seed = rng_for(request.node.name)

    def plans():
        for n, c, _, _ in random_nchw(rng, 50, 8):
            spatial = 8 * int(rng.integers(1, 2501))
            shapes = {"input": (n, c, spatial), "scale": (c,), "b": (c,)}
            for dtype in ("float32", "float16"):
                yield shapes, dtype, inn.plan(
                    shapes, {"T": dtype}, caps=SUBGROUPS, variant="plane_row_registers"
                )

    assert_one_pipeline_per_workgroup_and_bucket(plans(), seed)


def assert_one_pipeline_per_workgroup_and_bucket(plans, seed):
    """Over (shapes, dtype, plan) of a row-in-registers variant: pipelines differ only by dtype,
    workgroup size, unit bucket, the bucket's fill and split (1 or REGISTER_SPLIT: both overrides
    and specializations that take a handful of values), never by a shape value."""
    keys, kinds = set(), set()
    for shapes, dtype, plan in plans:
        (p,) = plan.passes
        keys.add(pipeline_key(p))
        fill = bucket_fill(p)
        assert fill == expected_fill(p.uniforms["rowUnits"], p.workgroup_size, int(held_units(p))), (
            shapes,
            dtype,
            p.spec,
        )
        kinds.add((dtype, p.workgroup_size, held_units(p), fill, p.overrides["split"]))
        assert not set(p.overrides) & set(p.uniforms), p.name
        # A workgroup below the cap (256 under WebGPU's default limits) covers its row at once.
        assert p.workgroup_size == 256 or held_units(p) == "1", (shapes, p.workgroup_size, held_units(p))
    assert len(keys) == len(
        kinds
    ), f"{len(keys)} pipeline keys for {len(kinds)} (dtype, workgroup, bucket, fill, split) ({seed_note(seed)})"


# --- the compiler's choice, for every shader ------------------------------------------------------


def test_no_request_dependent_override_except_array_and_workgroup_sizes():
    """Every override of every rendered shader is either fixed per device (tunables, limits,
    dtypes) or sizes a workgroup array / the workgroup; request-dependent values are uniforms."""
    from pathlib import Path

    from codegen.manifest import load_manifests
    from codegen.resolve import resolve_op
    from codegen.wgsl import render_op

    root = Path(__file__).resolve().parents[2]
    checked = 0
    for op in load_manifests(root / "manifests"):
        resolved = resolve_op(op)
        for item in render_op(resolved, root / "templates"):
            values = {v.name: v for v in item.pass_.scope_values}
            for uniform in item.scope_uniforms:
                assert uniform.value.request_dependent, uniform.name
            for spec in item.specializations:
                sizes = {spec.interface.workgroup_size} | {
                    f for _, factors in spec.interface.workgroup_arrays for f in factors
                }
                kept = {n for n, _ in op.pipeline_constants + item.variant.ir.pipeline_constants}
                for name, _ in spec.interface.overrides:
                    value = values.get(name)
                    shape_dependent = value is not None and value.request_dependent
                    allowed = name in sizes or name in kept  # kept: the manifest's measured pipelineConstants
                    assert (
                        not shape_dependent or allowed
                    ), f"{op.name} {item.variant.ir.id}.{item.pass_.ir.id}: {name}"
                    checked += 1
                assert f"params.{spec.interface.workgroup_size}" not in spec.wgsl
    assert checked > 100
