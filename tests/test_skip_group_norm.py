"""com.microsoft SkipGroupNorm through the generated kernels: all eight variants, both layouts.

Every kernel call runs on the wgpu device (Mesa's software Vulkan in CI) with fresh random inputs per
run (seeded by tests.oracles.rng_for; the seed is printed on failure) and NaN-poisoned outputs (out=),
and is compared with tests/oracles.py's float64 skip_group_norm_ref under DESIGN §7's tolerances:
Y, and S = X + skip + bias rounded to T. The correctness cases are manifests/com.microsoft.SkipGroupNorm/
test.json (generated.skip_group_norm.cases.TEST_CASES): each runs its split and its fused variant
(forced) for every T x M it lists; together they cover every variant in both layouts with f32 and f16
for T and for M.

Also: ONNX Runtime's published SkipGroupNorm unit-test vectors (tests/skip_group_norm_ort_vectors.py,
transcribed with their source named); agreement with the GroupNormalization kernels on NCHW data with
a zero skip and no bias; Y bit-identical whether or not S is requested; bit-identical repeated runs;
data far from zero; folded dispatches; natural selection (split for few large groups, fused
otherwise); and every contract rule refused with a ContractError before any GPU work.
ONNX Runtime's CPU provider has no SkipGroupNorm kernel, so there is no live onnxruntime comparison.
No variant uses subgroups (every reduction is a fixed-order tree in workgroup memory), so there is no
subgroup-width test here.
"""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

from generated import ContractError, Tensor
from generated import group_normalization as gn
from generated import skip_group_norm as sgn
from generated.skip_group_norm.cases import BENCH_CASES, TEST_CASES
from tests import skip_group_norm_ort_vectors as ort
from tests.device_helpers import poisoned_call
from tests.oracles import assert_close, rng_for, seed_note, skip_group_norm_for_call, skip_group_norm_ref

FAMILIES = ("split", "fused")
VARIANTS = tuple(
    f"{family}_{member}" for member in ("bias_sum", "bias_plain", "sum", "plain") for family in FAMILIES
)
NO_F16_CAPS = {"features": []}
F16_CAPS = {"features": ["shader-f16"]}
DTYPE = {"float32": np.float32, "float16": np.float16}


def variant_for(family, has_bias, outputs):
    return f"{family}_{'bias_' if has_bias else ''}{'sum' if 'S' in outputs else 'plain'}"


def layout(shape, channels_last):
    """(N, C, H * W) of an X shape in its layout."""
    if channels_last:
        n, h, w, c = shape
    else:
        n, c, h, w = shape
    return n, c, h * w


def expected_family(case):
    """The manifest's rule: split for few (< SPLIT_MAX_ROWS) rows of >= SPLIT_MIN_GROUP_VALUES values."""
    n, c, hw = layout(case["inputs"]["X"], case["attrs"].get("channels_last", 1))
    groups = case["attrs"]["groups"]
    tunables = sgn.TUNABLES | case.get("tunables", {})
    few_rows = n * groups < tunables["SPLIT_MAX_ROWS"]
    return "split" if few_rows and c // groups * hw >= tunables["SPLIT_MIN_GROUP_VALUES"] else "fused"


def random_inputs(rng, shapes, t, m, offset=0.0):
    """X with a random spread and a mean `offset` spreads from zero; skip, bias, gamma and beta random."""
    t, m = np.dtype(t), np.dtype(m)
    channels = shapes["gamma"][0]
    spread = rng.uniform(0.5, 2.0)
    inputs = {
        "X": (rng.standard_normal(shapes["X"]) * spread + offset * spread).astype(t),
        "skip": (rng.standard_normal(shapes["skip"]) * rng.uniform(0.2, 1.5) + rng.uniform(-1, 1)).astype(t),
        "gamma": rng.uniform(-2, 2, channels).astype(m),
        "beta": rng.uniform(-1, 1, channels).astype(m),
    }
    if "bias" in shapes:
        inputs["bias"] = rng.uniform(-1, 1, channels).astype(t)
    return inputs


def run_poisoned(inputs, attrs, outputs=("Y",), **kwargs):
    return poisoned_call(sgn, inputs, outputs, attrs=attrs, **kwargs)


def reference(inputs, attrs):
    return skip_group_norm_for_call(inputs, attrs)


def check(result, inputs, attrs, context):
    y_ref, s_ref = reference(inputs, attrs)
    dtype = inputs["X"].dtype
    assert_close(result["Y"], y_ref, dtype, context + " Y")
    if "S" in result:
        assert_close(result["S"], s_ref, dtype, context + " S")
        if dtype == np.float16:
            # The f32 sum of three f16 values is (nearly always) exact, then rounded once: within one
            # ulp of the exactly rounded sum even where it cancels. (An f32 sum rounds twice.)
            assert_within_one_ulp(result["S"], s_ref, dtype, context + " S")


def assert_within_one_ulp(actual, expected, dtype, context):
    """|actual - expected| <= one ulp of T at expected (the sum's two additions may round once more)."""
    expected_t = np.asarray(expected).astype(dtype)
    ulp = np.spacing(np.abs(expected_t)).astype(np.float64)
    error = np.abs(np.asarray(actual, np.float64) - np.asarray(expected, np.float64))
    assert (
        error <= ulp
    ).all(), f"{context}: {np.count_nonzero(error > ulp)} values more than one ulp off; worst {(error / ulp).max():.2f} ulps"


# --- the test.json cases: every variant, both layouts, f32 / f16 for T and M ------------------------------


def expanded_cases():
    """(case, T, M) for every dtype combination a case lists."""
    return [
        (case, t, m)
        for case in TEST_CASES
        for t, m in itertools.product(case["dtypes"]["T"], case["dtypes"]["M"])
    ]


CASE_PARAMS = expanded_cases()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("case,t,m", CASE_PARAMS, ids=[f"{c['name']}-{t}-{m}" for c, t, m in CASE_PARAMS])
def test_cases_against_float64_reference(case, t, m, family, request):
    rng, seed = rng_for(request.node.name)
    shapes = {k: tuple(v) for k, v in case["inputs"].items()}
    inputs = random_inputs(rng, shapes, t, m, offset=rng.uniform(-2, 2))
    attrs = dict(case["attrs"])
    outputs = tuple(case["outputs"])
    variant = variant_for(family, "bias" in shapes, outputs)
    tunables = case.get("tunables")
    p = sgn.plan(
        shapes,
        {"T": t, "M": m},
        attrs=attrs,
        outputs=outputs,
        tunables=tunables,
        variant=variant,
        caps=F16_CAPS,
    )
    assert p.variant == variant and set(p.outputs) == set(outputs)
    result = run_poisoned(inputs, attrs, outputs, tunables=tunables, variant=variant)
    check(result, inputs, attrs, f"{case['name']} {variant} T={t} M={m} {seed_note(seed)}")


def test_cases_cover_every_variant_layout_and_dtype_pair():
    covered = set()
    for case, t, m in CASE_PARAMS:
        for family in FAMILIES:
            variant = variant_for(family, "bias" in case["inputs"], case["outputs"])
            covered.add((variant, case["attrs"].get("channels_last", 1) != 0, t, m))
    wanted = set(itertools.product(VARIANTS, (True, False), DTYPE, DTYPE))
    assert wanted <= covered, sorted(wanted - covered)


def test_cases_reach_every_split_geometry():
    """The split plans of the cases (no GPU) walk every path of the slab and combine shaders."""
    seen = set()
    for case in TEST_CASES:
        shapes = {k: tuple(v) for k, v in case["inputs"].items()}
        outputs = tuple(case["outputs"])
        p = sgn.plan(
            shapes,
            {"T": "float16", "M": "float32"},
            attrs=case["attrs"],
            outputs=outputs,
            tunables=case.get("tunables"),
            variant=variant_for("split", "bias" in shapes, outputs),
            caps=F16_CAPS,
        )
        stats, combine, _ = p.passes
        # Shape values are uniforms (one pipeline for many shapes); the vector width is the
        # specialization's constant in the slab shader and a uniform of the combine.
        o = {**stats.overrides, **stats.uniforms, "vectorWidth": {**combine.overrides, **combine.uniforms}["vectorWidth"]}
        nhwc = "NHWC" if o["layoutChannelsLast"] else "NCHW"
        seen.add(f"{nhwc} vec{o['vectorWidth']}")
        seen.add(f"{nhwc} slabs > 1" if o["slabCount"] > 1 else f"{nhwc} one slab")
        if o["laneRows"] > 1:
            seen.add("lane rows > 1")
        if o["numGroups"] % o["groupsPerBlock"]:
            seen.add("partial last block")
        if o["segmentLanes"] < o["laneColumns"]:
            seen.add("several groups a tile")
        if o["laneColumns"] < o["tileWidth"] and o["layoutChannelsLast"]:
            seen.add("lane columns loop")
        if o["slabCount"] > combine.overrides["workgroupSize"]:
            seen.add("combine lanes loop")
        for size in (stats.workgroup_size, combine.workgroup_size):
            if size & (size - 1):
                seen.add("workgroup size not a power of two")
    wanted = {f"{layout} vec{w}" for layout in ("NHWC", "NCHW") for w in (1, 2, 4)}
    wanted |= {f"{layout} {slabs}" for layout in ("NHWC", "NCHW") for slabs in ("slabs > 1", "one slab")}
    wanted |= {
        "lane rows > 1",
        "partial last block",
        "several groups a tile",
        "lane columns loop",
        "combine lanes loop",
        "workgroup size not a power of two",
    }
    assert wanted <= seen, sorted(wanted - seen)


@pytest.mark.parametrize("case", TEST_CASES, ids=[c["name"] for c in TEST_CASES])
def test_natural_selection_of_the_cases(case):
    """The family depends only on the shapes; bias and S pick the member."""
    shapes = {k: tuple(v) for k, v in case["inputs"].items()}
    attrs, outputs = case["attrs"], tuple(case["outputs"])
    for t, m in itertools.product(case["dtypes"]["T"], case["dtypes"]["M"]):
        p = sgn.plan(
            shapes,
            {"T": t, "M": m},
            attrs=attrs,
            outputs=outputs,
            tunables=case.get("tunables"),
            caps=F16_CAPS,
        )
        assert p.variant == variant_for(expected_family(case), "bias" in shapes, outputs), p.explanation


@pytest.mark.parametrize(
    "case", [c for c in TEST_CASES if c["name"].endswith("-natural")], ids=lambda c: c["name"]
)
def test_natural_cases_run_their_natural_variant(case, request):
    rng, seed = rng_for(request.node.name)
    shapes = {k: tuple(v) for k, v in case["inputs"].items()}
    t, m = case["dtypes"]["T"][-1], case["dtypes"]["M"][0]
    inputs = random_inputs(rng, shapes, t, m)
    result = run_poisoned(inputs, case["attrs"], tuple(case["outputs"]))
    check(result, inputs, case["attrs"], f"{case['name']} natural {seed_note(seed)}")


# --- plans for the SDXL shapes (bench.json), no GPU --------------------------------------------------------


def test_sdxl_bench_shapes_take_the_measured_family_with_sane_geometry():
    """64 rows each: split for the 40960-value groups of 64x64x320, fused for 20480 and 10240 (the
    H200 measurements behind SPLIT_MIN_GROUP_VALUES = 32768, in docs/PERFORMANCE.md)."""
    assert len(BENCH_CASES) == 12
    for case in BENCH_CASES:
        shapes = {k: tuple(v) for k, v in case["inputs"].items()}
        dtypes = {k: v[0] for k, v in case["dtypes"].items()}
        outputs = tuple(case["outputs"])
        family = "split" if shapes["X"] == (2, 64, 64, 320) else "fused"
        p = sgn.plan(shapes, dtypes, attrs=case["attrs"], outputs=outputs, caps=F16_CAPS)
        assert p.variant == variant_for(family, True, outputs), (case["name"], p.explanation)
        if family == "split":
            stats, combine, normalize = p.passes
            assert stats.dispatch == normalize.dispatch and combine.dispatch == (64, 1, 1)
            tiles, _, slabs = stats.dispatch
            assert tiles * slabs >= 320, (case["name"], stats.dispatch)  # enough workgroups to fill a large GPU
            assert stats.workgroup_size <= 512 and {**combine.overrides, **combine.uniforms}["vectorWidth"] in (2, 4)
        else:
            (fused,) = p.passes
            assert fused.dispatch == (64, 1, 1)
        # The same plan with S requested or not, bias or not: only the member changes.
        other = sgn.plan(
            shapes,
            dtypes,
            attrs=case["attrs"],
            outputs=("Y",) if "S" in outputs else ("Y", "S"),
            caps=F16_CAPS,
        )
        assert other.variant.split("_")[0] == family


# --- ONNX Runtime's unit-test vectors ----------------------------------------------------------------------


def f16(values, shape=None):
    array = np.asarray(values, np.float32).astype(np.float16)  # ToFloat16 in the C++ test
    return array.reshape(shape) if shape is not None else array


@pytest.mark.parametrize(
    "variant", [None, "split_bias_sum", "fused_bias_sum"], ids=["natural", "split", "fused"]
)
@pytest.mark.parametrize("channels_last", [None, 1], ids=["channels_last-absent", "channels_last-1"])
def test_onnxruntime_vectors_with_bias(channels_last, variant):
    """SkipGroupNorm_with_bias. ONNX Runtime checks within 0.02; we hold DESIGN §7's f16 tolerance on Y and
    S. Its expected S is up to 6 f16 ulps from the correctly rounded sum of its own (f16) inputs (where
    x + skip + bias nearly cancels: it was made from unrounded data), so S is held to one ulp of the
    exact rounded sum of the f16 inputs instead, and to the f16 tolerance against ONNX Runtime's values."""
    shape = ort.WITH_BIAS_SHAPE
    inputs = {
        "X": f16(ort.WITH_BIAS_X, shape),
        "gamma": np.asarray(ort.WITH_BIAS_GAMMA, np.float32),
        "beta": np.asarray(ort.WITH_BIAS_BETA, np.float32),
        "skip": f16(ort.WITH_BIAS_SKIP, shape),
        "bias": f16(ort.WITH_BIAS_BIAS),
    }
    attrs = {"groups": ort.WITH_BIAS_GROUPS, "activation": 0, "epsilon": 1e-5}
    if channels_last is not None:
        attrs["channels_last"] = channels_last
    result = run_poisoned(inputs, attrs, ("Y", "S"), variant=variant)
    context = f"onnxruntime SkipGroupNorm_with_bias channels_last={channels_last} {variant}"
    assert_close(result["Y"], f16(ort.WITH_BIAS_Y, shape), np.float16, context + " Y")
    assert_close(result["S"], f16(ort.WITH_BIAS_S, shape), np.float16, context + " S")
    exact_sum = inputs["X"].astype(np.float64) + inputs["skip"] + inputs["bias"]
    assert_within_one_ulp(result["S"], exact_sum, np.float16, context + " S vs the exact sum")
    check(result, inputs, {"channels_last": 1, **attrs}, context)


@pytest.mark.parametrize("outputs", [("Y", "S"), ("Y",)], ids=["with-S", "without-S"])
@pytest.mark.parametrize("skip_shape", [(1, 64), (1, 1, 1, 64)], ids=["skip-NC", "skip-N11C"])
@pytest.mark.parametrize("family", FAMILIES)
def test_onnxruntime_vectors_no_bias_broadcast_skip(family, skip_shape, outputs):
    """SkipGroupNorm_no_bias_broadcast_skip: H = W = 1, so a (1, 1, 1, 64) skip has X's shape (the exact
    route) while (1, 64) broadcasts; both give ONNX Runtime's Y (DESIGN §7 f16 tolerance) and S (one ulp)."""
    shape = ort.NO_BIAS_SHAPE
    inputs = {
        "X": f16(ort.NO_BIAS_X, shape),
        "gamma": np.asarray(ort.NO_BIAS_GAMMA, np.float32),
        "beta": np.asarray(ort.NO_BIAS_BETA, np.float32),
        "skip": f16(ort.NO_BIAS_SKIP, skip_shape),
    }
    attrs = {"groups": ort.NO_BIAS_GROUPS, "activation": 0, "epsilon": 1e-5, "channels_last": 1}
    variant = variant_for(family, False, outputs)
    result = run_poisoned(inputs, attrs, outputs, variant=variant)
    context = f"onnxruntime SkipGroupNorm_no_bias_broadcast_skip skip {skip_shape} {variant}"
    assert_close(result["Y"], f16(ort.NO_BIAS_Y, shape), np.float16, context + " Y")
    if "S" in outputs:
        assert_within_one_ulp(result["S"], f16(ort.NO_BIAS_S, shape), np.float16, context + " S")
    check(result, inputs, attrs, context)


# --- agreement with GroupNormalization ------------------------------------------------------------------


@pytest.mark.parametrize("skip_form", ["full", "NC"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    "shape,groups", [((2, 8, 5, 6), 4), ((1, 12, 16, 16), 3)], ids=["2x8x5x6-g4", "1x12x16x16-g3"]
)
def test_equals_group_normalization_with_zero_skip_and_no_bias(
    shape, groups, family, dtype, skip_form, request
):
    rng, seed = rng_for(request.node.name)
    x = (rng.standard_normal(shape) * 1.5 + 0.5).astype(dtype)
    scale = rng.uniform(-2, 2, shape[1]).astype(dtype)
    bias = rng.uniform(-1, 1, shape[1]).astype(dtype)
    skip = np.zeros(shape if skip_form == "full" else shape[:2], dtype)
    attrs = {"groups": groups, "activation": 0, "channels_last": 0}
    result = run_poisoned(
        {"X": x, "gamma": scale, "beta": bias, "skip": skip}, attrs, ("Y", "S"), variant=f"{family}_sum"
    )
    expected = gn.kernel({"x": x, "scale": scale, "bias": bias}, attrs={"num_groups": groups})["y"]
    assert_close(
        result["Y"], expected.astype(np.float64), dtype, f"vs GroupNormalization {family} {seed_note(seed)}"
    )
    assert np.array_equal(result["S"], x), "S = X + 0 must be X"


# --- bit-identity -------------------------------------------------------------------------------------------


IDENTITY_CASES = [
    # (X shape, channels_last, skip shape, groups, tunables): several slabs, blocks and lane rows.
    ((2, 6, 5, 24), 1, (2, 6, 5, 24), 3, {"WORKGROUP_SIZE": 16, "SLAB_VALUES": 32}),
    ((2, 6, 5, 24), 1, (2, 24), 3, {"WORKGROUP_SIZE": 16, "SLAB_VALUES": 32}),
    ((2, 24, 6, 5), 0, (2, 24, 6, 5), 4, {"WORKGROUP_SIZE": 16, "SLAB_VALUES": 32}),
    ((2, 24, 6, 5), 0, (2, 1, 1, 24), 4, {"WORKGROUP_SIZE": 16, "SLAB_VALUES": 32}),
]


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    "shape,channels_last,skip_shape,groups,tunables",
    IDENTITY_CASES,
    ids=[f"{c[0]}-cl{c[1]}-skip{c[2]}" for c in IDENTITY_CASES],
)
def test_y_is_bit_identical_with_and_without_s(
    shape, channels_last, skip_shape, groups, tunables, family, dtype, request
):
    rng, seed = rng_for(request.node.name)
    c = shape[3] if channels_last else shape[1]
    shapes = {"X": shape, "gamma": (c,), "beta": (c,), "skip": skip_shape, "bias": (c,)}
    inputs = random_inputs(rng, shapes, dtype, "float32")
    attrs = {"groups": groups, "activation": 1, "channels_last": channels_last}
    with_s = run_poisoned(inputs, attrs, ("Y", "S"), variant=f"{family}_bias_sum", tunables=tunables)
    without_s = run_poisoned(inputs, attrs, ("Y",), variant=f"{family}_bias_plain", tunables=tunables)
    assert (
        with_s["Y"].tobytes() == without_s["Y"].tobytes()
    ), f"{family}: Y depends on whether S was requested {seed_note(seed)}"
    check(with_s, inputs, attrs, f"{family} {seed_note(seed)}")


def test_plain_function_y_does_not_depend_on_return_sum(request):
    rng, seed = rng_for(request.node.name)
    shapes = {"X": (2, 16, 16, 128), "gamma": (128,), "beta": (128,), "skip": (2, 128)}
    inputs = random_inputs(rng, shapes, "float16", "float32")
    args = (inputs["X"], inputs["gamma"], inputs["beta"], inputs["skip"])
    y, s = sgn.skip_group_norm(*args, groups=4, activation=1, return_sum=True)
    y_only = sgn.skip_group_norm(*args, groups=4, activation=1)
    assert y.tobytes() == y_only.tobytes(), seed_note(seed)
    check({"Y": y, "S": s}, inputs, {"groups": 4, "activation": 1}, f"plain function {seed_note(seed)}")


@pytest.mark.parametrize("variant", ["split_bias_sum", "fused_bias_sum"])
def test_repeated_runs_are_bit_identical(variant, request):
    rng, _ = rng_for(request.node.name)
    shapes = {"X": (2, 24, 20, 40), "gamma": (40,), "beta": (40,), "skip": (2, 24, 20, 40), "bias": (40,)}
    inputs = random_inputs(rng, shapes, "float16", "float16")
    attrs = {"groups": 4, "activation": 1}
    runs = [
        run_poisoned(inputs, attrs, ("Y", "S"), variant=variant, tunables={"SLAB_VALUES": 128})
        for _ in range(3)
    ]
    for key in ("Y", "S"):
        assert all(r[key].tobytes() == runs[0][key].tobytes() for r in runs[1:]), key


# --- numerics and dispatch ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("channels_last", [1, 0], ids=["NHWC", "NCHW"])
@pytest.mark.parametrize("family", FAMILIES)
def test_data_far_from_zero(family, channels_last, dtype, request):
    """Means hundreds (f16: tens) of spreads from zero: the statistics are per-invocation Welford/Chan
    summaries of deviations from each invocation's first value, the mean travels as a pair
    mean0 + lo and normalize forms (s - mean0) - lo, so nothing cancels."""
    rng, seed = rng_for(request.node.name)
    shape = (2, 7, 9, 32) if channels_last else (2, 32, 7, 9)
    shapes = {"X": shape, "gamma": (32,), "beta": (32,), "skip": (2, 32), "bias": (32,)}
    inputs = random_inputs(rng, shapes, dtype, "float32", offset=300.0 if dtype == "float32" else 20.0)
    if dtype == "float32":
        # Multiples of 2^-12 below 2^11: X + skip + bias is exact in f32, as it is for f16 values, so
        # S is the reference's and Y tests the statistics alone. (Otherwise S's second rounding, 1 ulp
        # of |S| ~ 600, is a real input difference of 300 spreads' worth of f32 ulps.)
        for key in ("X", "skip", "bias"):
            inputs[key] = (np.round(inputs[key].astype(np.float64) * 4096) / 4096).astype(np.float32)
    attrs = {"groups": 4, "activation": 0, "channels_last": channels_last}
    result = run_poisoned(
        inputs, attrs, ("Y", "S"), variant=f"{family}_bias_sum", tunables={"SLAB_VALUES": 64}
    )
    check(result, inputs, attrs, f"far from zero {family} {seed_note(seed)}")


@pytest.mark.parametrize("channels_last", [1, 0], ids=["NHWC", "NCHW"])
@pytest.mark.parametrize("family", FAMILIES)
def test_folded_dispatch_on_a_small_dispatch_limit(family, channels_last, request):
    """A device allowing 7 workgroups a dimension: 36 rows fold to (7, 6); split caps slabs at 7."""
    rng, seed = rng_for(request.node.name)
    shape = (4, 5, 3, 36) if channels_last else (4, 36, 5, 3)
    shapes = {"X": shape, "gamma": (36,), "beta": (36,), "skip": shape}
    inputs = random_inputs(rng, shapes, "float32", "float16")
    attrs = {"groups": 9, "activation": 1, "channels_last": channels_last}
    caps = {**F16_CAPS, "limits": {"maxComputeWorkgroupsPerDimension": 7}}
    tunables = {"WORKGROUP_SIZE": 8, "SLAB_VALUES": 8}
    variant = f"{family}_sum"
    p = sgn.plan(
        shapes,
        {"T": "float32", "M": "float16"},
        attrs=attrs,
        outputs=("Y", "S"),
        caps=caps,
        tunables=tunables,
        variant=variant,
    )
    assert all(max(q.dispatch) <= 7 for q in p.passes)
    assert any(q.dispatch[1] > 1 for q in p.passes)  # something was folded
    result = run_poisoned(inputs, attrs, ("Y", "S"), caps=caps, tunables=tunables, variant=variant)
    check(result, inputs, attrs, f"folded {family} {seed_note(seed)}")


@pytest.mark.parametrize("family", FAMILIES)
def test_small_device_limits(family, request):
    """32 invocations a workgroup and 192 bytes of workgroup memory (24 lanes of 8 bytes): group blocks,
    lane rows and the fused and combine workgroups shrink to fit."""
    rng, seed = rng_for(request.node.name)
    shapes = {"X": (2, 6, 6, 80), "gamma": (80,), "beta": (80,), "skip": (2, 80), "bias": (80,)}
    caps = {
        **F16_CAPS,
        "limits": {
            "maxComputeInvocationsPerWorkgroup": 32,
            "maxComputeWorkgroupSizeX": 32,
            "maxComputeWorkgroupStorageSize": 192,
        },
    }
    attrs = {"groups": 4, "activation": 1}
    variant = f"{family}_bias_sum"
    p = sgn.plan(
        shapes, {"T": "float16", "M": "float16"}, attrs=attrs, outputs=("Y", "S"), caps=caps, variant=variant
    )
    assert all(q.workgroup_size <= 24 and q.workgroup_storage_bytes <= 192 for q in p.passes)
    inputs = random_inputs(rng, shapes, "float16", "float16")
    result = run_poisoned(inputs, attrs, ("Y", "S"), caps=caps, variant=variant)
    check(result, inputs, attrs, f"small limits {family} {seed_note(seed)}")


def test_sdxl_like_shape_against_reference_and_fused(request):
    """(2, 64, 64, 320) f16 with f32 gamma/beta, 32 groups, SiLU, (N, C) skip, bias and S: split by
    natural selection (64 rows of 40960 values); the fused variant agrees within the f16 tolerance."""
    rng, seed = rng_for(request.node.name)
    shapes = {"X": (2, 64, 64, 320), "gamma": (320,), "beta": (320,), "skip": (2, 320), "bias": (320,)}
    inputs = random_inputs(rng, shapes, "float16", "float32")
    attrs = {"groups": 32, "activation": 1}
    assert (
        sgn.plan(
            shapes, {"T": "float16", "M": "float32"}, attrs=attrs, outputs=("Y", "S"), caps=F16_CAPS
        ).variant
        == "split_bias_sum"
    )
    split = run_poisoned(inputs, attrs, ("Y", "S"))
    check(split, inputs, attrs, f"SDXL-like split {seed_note(seed)}")
    fused = run_poisoned(inputs, attrs, ("Y", "S"), variant="fused_bias_sum")
    assert np.array_equal(fused["S"], split["S"])
    assert_close(fused["Y"], split["Y"].astype(np.float64), np.float16, f"fused vs split {seed_note(seed)}")


def test_empty_tensors():
    for shape in ((0, 3, 4, 8), (2, 0, 4, 8)):
        x = np.zeros(shape, np.float16)
        for variant in ("split_bias_sum", "fused_bias_sum"):
            out = sgn.kernel(
                {
                    "X": x,
                    "gamma": np.ones(8, np.float32),
                    "beta": np.zeros(8, np.float32),
                    "skip": x,
                    "bias": np.zeros(8, np.float16),
                },
                attrs={"groups": 2, "activation": 1},
                outputs=("Y", "S"),
                variant=variant,
            )
            assert out["Y"].shape == shape and out["S"].shape == shape


def test_device_tensors_chain(request):
    rng, seed = rng_for(request.node.name)
    shapes = {"X": (2, 4, 4, 16), "gamma": (16,), "beta": (16,), "skip": (2, 4, 4, 16)}
    inputs = random_inputs(rng, shapes, "float32", "float32")
    resident = {k: Tensor.from_numpy(v) for k, v in inputs.items()}
    first = sgn.kernel(resident, attrs={"groups": 4, "activation": 0}, outputs=("Y", "S"))
    assert isinstance(first["Y"], Tensor) and isinstance(first["S"], Tensor)
    second = sgn.kernel(
        {**resident, "X": first["Y"], "skip": first["S"]}, attrs={"groups": 2, "activation": 1}
    )["Y"]
    y1, s1 = reference(inputs, {"groups": 4, "activation": 0})
    y2, _ = skip_group_norm_ref(y1, inputs["gamma"], inputs["beta"], s1, None, 2, 1e-5, 1, 1, np.float32)
    assert_close(second.numpy(), y2, np.float32, f"chained calls {seed_note(seed)}")


# --- f16 capability -----------------------------------------------------------------------------------------


def test_f16_gamma_beta_need_no_shader_f16(request):
    """gamma/beta are read as 32-bit words and decoded per M: an f32 X with f16 gamma/beta runs on a
    device without shader-f16 (its shaders never name f16); an f16 X needs the feature."""
    rng, seed = rng_for(request.node.name)
    shapes = {"X": (2, 3, 4, 8), "gamma": (8,), "beta": (8,), "skip": (2, 8), "bias": (8,)}
    for variant in ("split_bias_sum", "fused_bias_sum"):
        p = sgn.plan(
            shapes,
            {"T": "float32", "M": "float16"},
            attrs={"groups": 2, "activation": 1},
            outputs=("Y", "S"),
            caps=NO_F16_CAPS,
            variant=variant,
        )
        for q in p.passes:
            code = re.sub(r"//[^\n]*", "", q.wgsl)
            assert not re.search(r"\bf16\b", code), q.name
        inputs = random_inputs(rng, shapes, "float32", "float16")
        result = run_poisoned(
            inputs, {"groups": 2, "activation": 1}, ("Y", "S"), caps=NO_F16_CAPS, variant=variant
        )
        check(result, inputs, {"groups": 2, "activation": 1}, f"no shader-f16 {variant} {seed_note(seed)}")
    with pytest.raises(ContractError, match=r"f16Ok\(dtypes.T\)"):
        sgn.plan(
            shapes, {"T": "float16", "M": "float32"}, attrs={"groups": 2, "activation": 1}, caps=NO_F16_CAPS
        )


# --- contract errors, each before any GPU work ---------------------------------------------------------------


def good(channels_last=1, t=np.float32, m=np.float32):
    shape = (2, 3, 4, 8) if channels_last else (2, 8, 3, 4)
    return {
        "X": np.ones(shape, t),
        "gamma": np.ones(8, m),
        "beta": np.zeros(8, m),
        "skip": np.ones(shape, t),
        "bias": np.zeros(8, t),
    }


ATTRS = {"groups": 4, "activation": 1}


@pytest.mark.parametrize(
    "change,attrs,subject,words",
    [
        (
            {"skip": np.ones((2, 8, 1, 1), np.float32)},
            ATTRS,
            "input skip",
            "sameShape(shapes.skip, shapes.X)",
        ),
        ({"skip": np.ones((2, 3, 4), np.float32)}, ATTRS, "input skip", "shapes.skip = (2, 3, 4)"),
        ({"skip": np.ones((1, 8), np.float32)}, ATTRS, "input skip", "shapes.skip = (1, 8)"),
        (
            {"skip": np.ones((2, 9), np.float32)},
            ATTRS,
            "input skip",
            "shapes.skip = (2, 9), shapes.X = (2, 3, 4, 8)",
        ),
        ({"skip": np.ones((2, 3, 4, 1), np.float32)}, ATTRS, "input skip", "shapes.skip = (2, 3, 4, 1)"),
        ({"skip": np.ones((2, 1, 1, 9), np.float32)}, ATTRS, "input skip", "sgChannels = 8"),
        ({"skip": np.ones(8, np.float32)}, ATTRS, "input skip", "[dim(shapes.X, 0), 1, 1, sgChannels]"),
        (
            {"X": np.ones((2, 12, 8), np.float32), "skip": np.ones((2, 8), np.float32)},
            ATTRS,
            "input X",
            "ranks.X == 4",
        ),
        (
            {"X": np.ones((2, 3, 4, 2, 8), np.float32), "skip": np.ones((2, 8), np.float32)},
            ATTRS,
            "input X",
            "ranks.X == 4",
        ),
        ({}, {"groups": 3, "activation": 1}, "attribute groups", "% attrs.groups) == 0"),
        ({}, {"groups": 0, "activation": 1}, "attribute groups", "attrs.groups >= 1"),
        ({}, {"groups": -4, "activation": 1}, "attribute groups", "attrs.groups >= 1"),
        ({}, {"groups": 2.5, "activation": 1}, "attribute groups", "expected an integer"),
        ({}, {"groups": 4, "activation": 2}, "attribute activation", "not supported (allowed: 0, 1)"),
        ({}, {"groups": 4, "activation": -1}, "attribute activation", "not supported (allowed: 0, 1)"),
        ({}, {"activation": 1}, "attribute groups", "required"),
        ({}, {"groups": 4}, "attribute activation", "required"),
        ({}, {**ATTRS, "alpha": 1.0}, "attribute alpha", "unknown attribute"),
        ({"gamma": np.ones(9, np.float32)}, ATTRS, "input gamma", "dim(shapes.gamma, 0) == sgChannels"),
        ({"beta": np.ones(4, np.float32)}, ATTRS, "input beta", "dim(shapes.beta, 0) == sgChannels"),
        ({"gamma": np.ones((8, 1), np.float32)}, ATTRS, "input gamma", "ranks.gamma == 1"),
        ({"beta": np.ones((1, 8), np.float32)}, ATTRS, "input beta", "ranks.beta == 1"),
        ({"bias": np.ones(7, np.float32)}, ATTRS, "input bias", "dim(shapes.bias, 0) == sgChannels"),
        ({"bias": np.ones((8, 1), np.float32)}, ATTRS, "input bias", "ranks.bias == 1"),
        ({"X": np.ones((2, 3, 4, 8), np.float64)}, ATTRS, "input X", "float64 is not supported"),
    ],
)
def test_contract_errors_name_op_subject_and_rule(change, attrs, subject, words):
    inputs = {**good(), **change}
    with pytest.raises(ContractError) as caught:
        sgn.kernel(inputs, attrs=attrs)
    text = str(caught.value)
    assert text.startswith("com.microsoft SkipGroupNorm-1: ") and subject in text and words in text, text
    assert isinstance(caught.value, ValueError)


def test_bias_must_have_t_not_m():
    """bias is of type T: an f32 bias with f16 X (and f32 gamma/beta, type M) is refused."""
    inputs = {**good(t=np.float16, m=np.float32), "bias": np.zeros(8, np.float32)}
    with pytest.raises(ContractError, match="input bias.*every T tensor must share one dtype"):
        sgn.kernel(inputs, attrs=ATTRS)
    inputs = {**good(t=np.float32, m=np.float16), "bias": np.zeros(8, np.float16)}
    with pytest.raises(ContractError, match="input bias.*every T tensor must share one dtype"):
        sgn.kernel(inputs, attrs=ATTRS)


def test_nchw_refuses_an_nc11_skip_but_takes_n11c():
    """The broadcast forms are (N, C) and (N, 1, 1, C) in either layout; (N, C, 1, 1) is not one."""
    inputs = good(channels_last=0)
    attrs = {**ATTRS, "channels_last": 0}
    with pytest.raises(ContractError, match="input skip"):
        sgn.kernel({**inputs, "skip": np.ones((2, 8, 1, 1), np.float32)}, attrs=attrs)
    shapes = {k: v.shape for k, v in inputs.items()}
    sgn.plan({**shapes, "skip": (2, 1, 1, 8)}, {"T": "float32", "M": "float32"}, attrs=attrs)
    sgn.plan({**shapes, "skip": (2, 8)}, {"T": "float32", "M": "float32"}, attrs=attrs)


def test_requests_the_variants_cannot_serve_are_refused():
    shapes = {k: v.shape for k, v in good().items()}
    dtypes = {"T": "float32", "M": "float32"}
    with pytest.raises(ContractError, match="known output"):
        sgn.plan(shapes, dtypes, attrs=ATTRS, outputs=("Y", "Z"))
    with pytest.raises(ContractError, match="does not apply"):
        sgn.plan(shapes, dtypes, attrs=ATTRS, variant="split_plain")  # a bias is given
    with pytest.raises(ContractError, match="does not apply"):
        sgn.plan(shapes, dtypes, attrs=ATTRS, outputs=("Y", "S"), variant="fused_bias_plain")
    with pytest.raises(ContractError, match="required input"):
        sgn.plan({k: v for k, v in shapes.items() if k != "skip"}, dtypes, attrs=ATTRS)


def test_selection_rule():
    """Fused unless rows = N * groups < SPLIT_MAX_ROWS (512) and a group holds >= SPLIT_MIN_GROUP_VALUES (32768)."""

    def family(shape, groups, channels_last=1, **kwargs):
        c = shape[3] if channels_last else shape[1]
        shapes = {"X": shape, "gamma": (c,), "beta": (c,), "skip": shape}
        attrs = {"groups": groups, "activation": 0, "channels_last": channels_last}
        return sgn.plan(
            shapes, {"T": "float16", "M": "float32"}, attrs=attrs, caps=F16_CAPS, **kwargs
        ).variant.split("_")[0]

    assert family((2, 64, 64, 320), 32) == "split"  # 64 rows of 40960
    assert family((2, 32, 32, 640), 32) == "fused"  # 64 rows of 20480
    assert family((2, 16, 16, 1280), 32) == "fused"  # 64 rows of 10240
    assert family((2, 320, 64, 64), 32, channels_last=0) == "split"
    assert family((2, 16, 16, 256), 32) == "fused"  # 2048 values a group
    assert family((16, 64, 64, 320), 32) == "fused"  # 512 rows
    assert family((15, 64, 64, 320), 32) == "split"  # 480 rows
    assert family((1, 32, 32, 32), 1) == "split"  # 32768 values
    assert family((1, 32, 32, 31), 1) == "fused"  # 31744
    assert family((1, 16, 16, 32), 1, tunables={"SPLIT_MIN_GROUP_VALUES": 8192}) == "split"
    assert family((2, 16, 16, 1280), 32, tunables={"SPLIT_MAX_ROWS": 1}) == "fused"
