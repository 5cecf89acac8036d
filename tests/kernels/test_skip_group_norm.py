"""com.microsoft SkipGroupNorm through the generated kernels: every variant with and without a bias
and S, both layouts.

Every kernel call runs on the wgpu device (Mesa's software Vulkan in CI) with fresh random inputs per
run (seeded by tests.oracles.rng_for; the seed is printed on failure) and NaN-poisoned outputs (out=),
and is compared with tests/oracles.py's float64 skip_group_norm_ref under docs/TESTING.md's tolerances:
Y, and S = X + skip + bias rounded to T. The correctness cases are manifests/com.microsoft.SkipGroupNorm/
test.json (generated.skip_group_norm.cases.TEST_CASES): each runs its split and its fused variant
(forced) for every T x M it lists; together they cover every variant, with and without a bias and S,
in both layouts with f32 and f16
for T and for M.

Also: ONNX Runtime's published SkipGroupNorm unit-test vectors (tests/kernels/skip_group_norm_ort_vectors.py,
transcribed with their source named); agreement with the GroupNormalization kernels on NCHW data with
a zero skip and no bias; Y bit-identical whether or not S is requested; bit-identical repeated runs;
data far from zero; folded dispatches; natural selection (split for few large groups, fused
otherwise); and every contract rule refused with a ContractError before any GPU work.
ONNX Runtime's CPU provider has no SkipGroupNorm kernel, so there is no live onnxruntime comparison.
The split and fused variants use no subgroups (every reduction is a fixed-order tree in workgroup
memory). The registers variant (issue 12: a channels-last row in registers, subgroupAdd sums) is
tested in their own section below, at lavapipe's subgroup width 8, including workgroups that are not
a multiple of it; tests/kernels/profile_cases.py runs them at width 4 too. Tests that compare with natural
selection pass caps without subgroups (F16_CAPS) where they mean the split / fused rule.
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
from tests.kernels import skip_group_norm_ort_vectors as ort
from tests.device_helpers import poisoned_call
from tests.oracles import assert_close, rng_for, seed_note, skip_group_norm_for_call, skip_group_norm_ref

FAMILIES = ("split", "fused")
# Each variant with and without a bias and S: the shaders it specializes for them.
FLAVOURS = tuple(
    f"{family}_{member}" for member in ("bias_sum", "bias_plain", "sum", "plain") for family in FAMILIES
)
NO_F16_CAPS = {"features": []}
F16_CAPS = {"features": ["shader-f16"]}
DTYPE = {"float32": np.float32, "float16": np.float16}


def flavour_for(family, has_bias, outputs):
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
    variant = family
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


def test_cases_cover_every_flavour_layout_and_dtype_pair():
    covered = set()
    for case, t, m in CASE_PARAMS:
        for family in FAMILIES:
            flavour = flavour_for(family, "bias" in case["inputs"], case["outputs"])
            covered.add((flavour, case["attrs"].get("channels_last", 1) != 0, t, m))
    wanted = set(itertools.product(FLAVOURS, (True, False), DTYPE, DTYPE))
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
            variant="split",
            caps=F16_CAPS,
        )
        stats, combine, _ = p.passes
        # Shape values are uniforms (one pipeline for many shapes); the vector width is the
        # specialization's constant in the slab shader and a uniform of the combine.
        o = {
            **stats.overrides,
            **stats.uniforms,
            "vectorWidth": {**combine.overrides, **combine.uniforms}["vectorWidth"],
        }
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
        assert p.variant == expected_family(case), p.explanation


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
    H200 measurements behind SPLIT_MIN_GROUP_VALUES = 32768, in
    docs/history/2026-12-performance-diary.md, "Kernel changes, round 2", change 6)."""
    assert len(BENCH_CASES) == 12
    for case in BENCH_CASES:
        shapes = {k: tuple(v) for k, v in case["inputs"].items()}
        dtypes = {k: v[0] for k, v in case["dtypes"].items()}
        outputs = tuple(case["outputs"])
        family = "split" if shapes["X"] == (2, 64, 64, 320) else "fused"
        p = sgn.plan(shapes, dtypes, attrs=case["attrs"], outputs=outputs, caps=F16_CAPS)
        assert p.variant == family, (case["name"], p.explanation)
        if family == "split":
            stats, combine, normalize = p.passes
            assert stats.dispatch == normalize.dispatch and combine.dispatch == (64, 1, 1)
            tiles, _, slabs = stats.dispatch
            # 128 slabs of 32 positions an item (the defaults measured on the H200,
            # docs/history/2026-12-performance-diary.md, round 5); these caps allow 256 invocations,
            # the H200's 1024: 160 lanes a position, 6 positions a pass.
            assert (tiles, slabs) == (2, 128) and stats.workgroup_size == 256, (case["name"], stats.dispatch)
            assert {**combine.overrides, **combine.uniforms}["vectorWidth"] in (2, 4)
            if shapes["X"] == (2, 64, 64, 320) and dtypes["T"] == "float16":
                on_h200 = sgn.plan(shapes, dtypes, attrs=case["attrs"], outputs=outputs, caps=H200_CAPS)
                assert on_h200.variant == p.variant, (case["name"], on_h200.explanation)
                wide = on_h200.passes[0]
                numbers = {**wide.overrides, **wide.uniforms}
                assert (wide.dispatch, wide.workgroup_size) == ((2, 1, 128), 1024), case["name"]
                assert (numbers["laneColumns"], numbers["laneRows"]) == (160, 6), case["name"]
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
        assert other.variant == family


# --- ONNX Runtime's unit-test vectors ----------------------------------------------------------------------


def f16(values, shape=None):
    array = np.asarray(values, np.float32).astype(np.float16)  # ToFloat16 in the C++ test
    return array.reshape(shape) if shape is not None else array


@pytest.mark.parametrize("variant", [None, "split", "fused"], ids=["natural", "split", "fused"])
@pytest.mark.parametrize("channels_last", [None, 1], ids=["channels_last-absent", "channels_last-1"])
def test_onnxruntime_vectors_with_bias(channels_last, variant):
    """SkipGroupNorm_with_bias. ONNX Runtime checks within 0.02; we hold docs/TESTING.md's float16 tolerance on Y and
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
    route) while (1, 64) broadcasts; both give ONNX Runtime's Y (docs/TESTING.md float16 tolerance) and S (one ulp).
    """
    shape = ort.NO_BIAS_SHAPE
    inputs = {
        "X": f16(ort.NO_BIAS_X, shape),
        "gamma": np.asarray(ort.NO_BIAS_GAMMA, np.float32),
        "beta": np.asarray(ort.NO_BIAS_BETA, np.float32),
        "skip": f16(ort.NO_BIAS_SKIP, skip_shape),
    }
    attrs = {"groups": ort.NO_BIAS_GROUPS, "activation": 0, "epsilon": 1e-5, "channels_last": 1}
    variant = family
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
        {"X": x, "gamma": scale, "beta": bias, "skip": skip}, attrs, ("Y", "S"), variant=family
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
    with_s = run_poisoned(inputs, attrs, ("Y", "S"), variant=family, tunables=tunables)
    without_s = run_poisoned(inputs, attrs, ("Y",), variant=family, tunables=tunables)
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


@pytest.mark.parametrize("variant", ["split", "fused"])
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
    result = run_poisoned(inputs, attrs, ("Y", "S"), variant=family, tunables={"SLAB_VALUES": 64})
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
    variant = family
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
    variant = family
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
        == "split"
    )
    split = run_poisoned(inputs, attrs, ("Y", "S"))
    check(split, inputs, attrs, f"SDXL-like split {seed_note(seed)}")
    fused = run_poisoned(inputs, attrs, ("Y", "S"), variant="fused")
    assert np.array_equal(fused["S"], split["S"])
    assert_close(fused["Y"], split["Y"].astype(np.float64), np.float16, f"fused vs split {seed_note(seed)}")


def test_empty_tensors():
    for shape in ((0, 3, 4, 8), (2, 0, 4, 8)):
        x = np.zeros(shape, np.float16)
        for variant in ("split", "fused"):
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
    for variant in ("split", "fused"):
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
    with pytest.raises(ContractError, match="does not apply: needs device feature subgroups"):
        sgn.plan(shapes, dtypes, attrs=ATTRS, outputs=("Y", "S"), variant="registers", caps={"features": []})
    with pytest.raises(
        ContractError, match="unknown variant 'split_bias_sum'; known: registers, fused, split"
    ):
        sgn.plan(shapes, dtypes, attrs=ATTRS, variant="split_bias_sum")  # a flavour is not a variant
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


# --- registers (row in registers, issue 12) -----------------------------------------------------------------

REGISTER_MEMBERS = ("bias_sum", "bias_plain", "sum", "plain")
SUBGROUP_CAPS = {"features": ["shader-f16", "subgroups"]}
# The H200's facts as wgpu reports them: subgroups, 1024 invocations a workgroup.
H200_CAPS = {
    **SUBGROUP_CAPS,
    "limits": {"maxComputeInvocationsPerWorkgroup": 1024, "maxComputeWorkgroupSizeX": 1024},
}
SMALL_TARGET = {"REGISTER_SINGLE_WORKGROUP_SIZE": 1, "REGISTER_MIN_POSITION_LANES": 1}

# (X shape NHWC, groups, tunables, (workgroup, split, UNITS) for f32 T, the same for f16 T). A unit
# is the widest of 4/2/1 words dividing the group's channels (f32: 4 or 2 values; f16: 8, 4 or 2
# halves); the workgroup is groupUnits x positionLanes; UNITS is the bucket (8 ... 96 words) over
# the words of one unit.
REGISTER_CASES = [
    ((2, 5, 6, 40), 4, {}, (160, 1, "4"), (160, 1, "8")),  # cpg 10: 30 positions on 32 lanes, spare units
    (
        (1, 10, 10, 20),
        1,
        {"REGISTER_SINGLE_WORKGROUP_SIZE": 40, "REGISTER_MIN_POSITION_LANES": 8},
        (40, 1, "16"),
        (40, 1, "16"),
    ),  # tail: 100 = 12 x 8 + 4
    (
        (2, 3, 4, 20),
        2,
        SMALL_TARGET,
        (5, 1, "12"),
        (5, 1, "16"),
    ),  # 5 invocations: partial subgroups, one-by-one sums
    (
        (1, 16, 16, 64),
        2,
        {"REGISTER_SPLIT_MIN_VALUES": 1, "REGISTER_WORKGROUP_SIZE": 64},
        (256, 2, "8"),
        (128, 2, "8"),
    ),  # two workgroups a row
    (
        (2, 6, 10, 24),
        3,
        {
            "REGISTER_SPLIT_MIN_VALUES": 1,
            "REGISTER_SPLIT": 3,
            "REGISTER_WORKGROUP_SIZE": 16,
            "REGISTER_MIN_POSITION_LANES": 4,
        },
        (16, 3, "8"),
        (16, 3, "4"),
    ),  # shares 3 + 3 + 2
    (
        (1, 16, 24, 10),
        1,
        {**SMALL_TARGET, "REGISTER_MAX_UNITS": 24},
        (40, 1, "48"),
        (20, 1, "96"),
    ),  # the largest bucket
    ((2, 4, 4, 12), 6, {}, (16, 1, "4"), (16, 1, "8")),  # 2 channels a group
    ((1, 3, 5, 48), 1, {}, (192, 1, "2"), (96, 1, "2")),  # one group of 48 channels
]
REGISTER_IDS = [f"{c[0]}-g{c[1]}" for c in REGISTER_CASES]


def held_units(pass_plan):
    """The UNITS bucket a registers shader was specialized for."""
    return re.search(r"const UNITS: u32 = (\d+)u;", pass_plan.wgsl).group(1)


def register_shapes(shape, member, skip_form):
    c = shape[3]
    shapes = {
        "X": shape,
        "gamma": (c,),
        "beta": (c,),
        "skip": shape if skip_form == "full" else (shape[0], c),
    }
    if member.startswith("bias"):
        shapes["bias"] = (c,)
    return shapes


def register_outputs(member):
    return ("Y", "S") if member.endswith("sum") else ("Y",)


def test_register_cases_meet_exact_and_partial_rows():
    """REGISTER_CASES run both forms of the shader in both dtypes: exactRow (spatial is UNITS x
    positionLanes, so no load is clamped and no unit tested) and the general one; one exact case
    splits its rows over two workgroups (split as an override)."""
    seen = set()
    for shape, groups, tunables, _, _ in REGISTER_CASES:
        for t in ("float32", "float16"):
            shapes = register_shapes(shape, "bias_sum", "full")
            attrs = {"groups": groups, "activation": 0}
            p = sgn.plan(
                shapes,
                {"T": t, "M": "float32"},
                attrs=attrs,
                outputs=("Y", "S"),
                tunables=tunables,
                variant="registers",
                caps=SUBGROUP_CAPS,
            )
            (main,) = p.passes
            exact = shape[1] * shape[2] == int(held_units(main)) * main.values["positionLanes"]
            assert ("exact-row" in main.spec.split(".")[1]) == exact, (shape, t, main.spec)
            seen.add((exact, t, main.overrides["split"]))
    assert {(e, t) for e, t, _ in seen} == {
        (e, t) for e in (True, False) for t in ("float32", "float16")
    }, seen
    assert (True, "float16", 2) in seen and (True, "float32", 2) in seen, seen


@pytest.mark.parametrize("skip_form", ["full", "NC"])
@pytest.mark.parametrize("member", REGISTER_MEMBERS)
@pytest.mark.parametrize("t", ["float32", "float16"])
@pytest.mark.parametrize("shape,groups,tunables,f32_geometry,f16_geometry", REGISTER_CASES, ids=REGISTER_IDS)
def test_registers_against_float64_reference(
    shape, groups, tunables, f32_geometry, f16_geometry, t, member, skip_form, request
):
    """Every member, both skip forms, f32 and f16 T (M drawn from both): tails of positions, spare
    bucket units, idle position lanes, 1-3 workgroups a row, a workgroup that is not a multiple of
    the subgroup width (one-by-one sums), the largest bucket; data away from zero."""
    rng, seed = rng_for(request.node.name)
    m = str(rng.choice(["float32", "float16"]))
    shapes = register_shapes(shape, member, skip_form)
    inputs = random_inputs(rng, shapes, t, m, offset=rng.uniform(-3, 3))
    attrs = {
        "groups": groups,
        "activation": int(rng.integers(0, 2)),
        "epsilon": float(rng.choice([1e-5, 1e-3])),
    }
    outputs = register_outputs(member)
    variant = "registers"
    p = sgn.plan(
        shapes,
        {"T": t, "M": m},
        attrs=attrs,
        outputs=outputs,
        tunables=tunables,
        variant=variant,
        caps=SUBGROUP_CAPS,
    )
    (main,) = p.passes
    workgroup, split, units = f32_geometry if t == "float32" else f16_geometry
    assert (main.workgroup_size, main.values["split"], held_units(main)) == (workgroup, split, units)
    assert main.dispatch == (shape[0] * groups * split, 1, 1) and main.uses_subgroups
    result = run_poisoned(inputs, attrs, outputs, tunables=tunables, variant=variant)
    check(
        result,
        inputs,
        attrs,
        f"{variant} {shape} g{groups} skip {skip_form} T={t} M={m} {tunables} {seed_note(seed)}",
    )


@pytest.mark.parametrize("t", ["float32", "float16"])
def test_registers_every_split_gives_the_bits_of_one_workgroup(t, request):
    """Every workgroup of a row takes the statistics of the whole row from the same loads in the
    same order: with 1, 2 or 3 workgroups a row, Y and S are the same bit for bit."""
    rng, seed = rng_for(request.node.name)
    shapes = {"X": (2, 12, 10, 40), "gamma": (40,), "beta": (40,), "skip": (2, 12, 10, 40), "bias": (40,)}
    inputs = random_inputs(rng, shapes, t, "float32", offset=3.0)
    attrs = {"groups": 4, "activation": 1}
    runs = []
    for split in (1, 2, 3):
        tunables = {
            "REGISTER_SPLIT_MIN_VALUES": 1,
            "REGISTER_SPLIT": split,
            "REGISTER_WORKGROUP_SIZE": 64,
            "REGISTER_SINGLE_WORKGROUP_SIZE": 64,
        }
        p = sgn.plan(
            shapes,
            {"T": t, "M": "float32"},
            attrs=attrs,
            outputs=("Y", "S"),
            tunables=tunables,
            variant="registers",
            caps=SUBGROUP_CAPS,
        )
        assert p.passes[0].values["split"] == split
        runs.append(run_poisoned(inputs, attrs, ("Y", "S"), tunables=tunables, variant="registers"))
    for key in ("Y", "S"):
        assert all(r[key].tobytes() == runs[0][key].tobytes() for r in runs[1:]), f"{key} {seed_note(seed)}"
    check(runs[0], inputs, attrs, f"split 1 {seed_note(seed)}")


@pytest.mark.parametrize("t", ["float32", "float16"])
@pytest.mark.parametrize("skip_shape", [(2, 6, 5, 24), (2, 24)], ids=["skip-full", "skip-NC"])
def test_registers_y_is_bit_identical_with_and_without_s_and_repeatable(skip_shape, t, request):
    rng, seed = rng_for(request.node.name)
    shapes = {"X": (2, 6, 5, 24), "gamma": (24,), "beta": (24,), "skip": skip_shape, "bias": (24,)}
    inputs = random_inputs(rng, shapes, t, "float16")
    attrs = {"groups": 3, "activation": 1}
    with_s = [run_poisoned(inputs, attrs, ("Y", "S"), variant="registers") for _ in range(2)]
    without_s = run_poisoned(inputs, attrs, ("Y",), variant="registers")
    assert (
        with_s[0]["Y"].tobytes() == without_s["Y"].tobytes()
    ), f"Y depends on whether S was requested {seed_note(seed)}"
    for key in ("Y", "S"):
        assert with_s[0][key].tobytes() == with_s[1][key].tobytes(), f"repeated runs differ in {key}"
    # S has the bits of the other families' S: the same sum, rounded the same way.
    fused = run_poisoned(inputs, attrs, ("Y", "S"), variant="fused")
    assert with_s[0]["S"].tobytes() == fused["S"].tobytes(), seed_note(seed)
    check(with_s[0], inputs, attrs, f"registers {seed_note(seed)}")


@pytest.mark.parametrize("t", ["float32", "float16"])
@pytest.mark.parametrize("split", [1, 2])
def test_registers_hostile_data(split, t, request):
    """Means hundreds (f16: tens) of spreads from zero, and outliers at random places (one a group
    row of 1000 spreads, f16: 100): the two-pass statistics from registers neither cancel nor let the
    outliers' squares swamp the rest."""
    rng, seed = rng_for(request.node.name)
    shapes = {"X": (2, 7, 9, 32), "gamma": (32,), "beta": (32,), "skip": (2, 32), "bias": (32,)}
    inputs = random_inputs(rng, shapes, t, "float32", offset=300.0 if t == "float32" else 20.0)
    x = inputs["X"].astype(np.float64)
    # An outlier a (batch item, group) row, at a random position and channel of the group.
    for n in range(2):
        for g in range(4):
            h, w, c = rng.integers(0, 7), rng.integers(0, 9), g * 8 + rng.integers(0, 8)
            x[n, h, w, c] += (1000.0 if t == "float32" else 100.0) * rng.choice([-1, 1])
    inputs["X"] = x.astype(t)
    if t == "float32":
        # Multiples of 2^-12 below 2^11: the sum is exact in f32, so S is the reference's and Y tests
        # the statistics alone (as test_data_far_from_zero does).
        for key in ("X", "skip", "bias"):
            inputs[key] = (np.round(inputs[key].astype(np.float64) * 4096) / 4096).astype(np.float32)
    attrs = {"groups": 4, "activation": 0}
    tunables = {"REGISTER_SPLIT_MIN_VALUES": 1, "REGISTER_SPLIT": split}
    result = run_poisoned(inputs, attrs, ("Y", "S"), variant="registers", tunables=tunables)
    check(result, inputs, attrs, f"hostile registers split {split} {seed_note(seed)}")


def test_registers_folded_dispatch_on_a_small_dispatch_limit(request):
    """A device allowing 7 workgroups a dimension: 36 rows fold to (7, 6)."""
    rng, seed = rng_for(request.node.name)
    shapes = {"X": (4, 5, 3, 36), "gamma": (36,), "beta": (36,), "skip": (4, 5, 3, 36)}
    inputs = random_inputs(rng, shapes, "float32", "float16")
    attrs = {"groups": 9, "activation": 1}
    caps = {**SUBGROUP_CAPS, "limits": {"maxComputeWorkgroupsPerDimension": 7}}
    tunables = {"REGISTER_MIN_POSITION_LANES": 4}
    p = sgn.plan(
        shapes,
        {"T": "float32", "M": "float16"},
        attrs=attrs,
        outputs=("Y", "S"),
        caps=caps,
        tunables=tunables,
        variant="registers",
    )
    assert p.passes[0].dispatch == (7, 6, 1)
    result = run_poisoned(inputs, attrs, ("Y", "S"), caps=caps, tunables=tunables, variant="registers")
    check(result, inputs, attrs, f"folded registers {seed_note(seed)}")


def test_registers_small_device_limits(request):
    """32 invocations a workgroup, 4612 bytes of workgroup memory: 32 invocation summaries, the 256
    subgroup slots and the flag (_lib/row_stats)."""
    rng, seed = rng_for(request.node.name)
    shapes = {"X": (2, 6, 6, 80), "gamma": (80,), "beta": (80,), "skip": (2, 80), "bias": (80,)}
    limits = {
        "maxComputeInvocationsPerWorkgroup": 32,
        "maxComputeWorkgroupSizeX": 32,
        "maxComputeWorkgroupStorageSize": 4612,
    }
    caps = {**SUBGROUP_CAPS, "limits": limits}
    attrs = {"groups": 4, "activation": 1}
    p = sgn.plan(
        shapes,
        {"T": "float16", "M": "float16"},
        attrs=attrs,
        outputs=("Y", "S"),
        caps=caps,
        variant="registers",
    )
    (main,) = p.passes
    assert main.workgroup_size <= 32 and main.workgroup_storage_bytes <= 4612
    inputs = random_inputs(rng, shapes, "float16", "float16")
    result = run_poisoned(inputs, attrs, ("Y", "S"), caps=caps, variant="registers")
    check(result, inputs, attrs, f"small limits registers {seed_note(seed)}")


def registers_choice(
    shape,
    t="float16",
    caps=H200_CAPS,
    groups=32,
    skip="full",
    bias=True,
    outputs=("Y", "S"),
    channels_last=1,
    **kwargs,
):
    """(variant, workgroup, split, UNITS) for a registers plan, else the variant chosen; registers
    are not demoted for narrow units unless `tunables` say so (test_registers_demoted_for_narrow_units)."""
    kwargs["tunables"] = {"REGISTER_MIN_UNIT_BYTES": 1} | kwargs.get("tunables", {})
    c = shape[3] if channels_last else shape[1]
    shapes = {"X": shape, "gamma": (c,), "beta": (c,), "skip": shape if skip == "full" else (shape[0], c)}
    if bias:
        shapes["bias"] = (c,)
    attrs = {"groups": groups, "activation": 1, "channels_last": channels_last}
    p = sgn.plan(shapes, {"T": t, "M": "float32"}, attrs=attrs, outputs=outputs, caps=caps, **kwargs)
    if not p.variant == "registers":
        return p.variant
    (main,) = p.passes
    return p.variant, main.workgroup_size, main.values["split"], held_units(main)


def test_registers_take_the_sdxl_bench_cases():
    """bench.json's SDXL cases, on the H200's facts: registers, with 640 invocations (5 x 128
    positions) and two workgroups a row for the 40960- and 20480-value rows, one for 10240; without subgroups they keep their split / fused variants. The 64x64x320 rows (10 f16
    channels a group: 4-byte units) take split unless REGISTER_MIN_UNIT_BYTES allows them."""
    expected = {
        (2, 64, 64, 320): (640, 2, "32"),
        (2, 32, 32, 640): (640, 2, "8"),
        (2, 16, 16, 1280): (640, 1, "2"),
    }
    for case in BENCH_CASES:
        shapes = {k: tuple(v) for k, v in case["inputs"].items()}
        dtypes = {k: v[0] for k, v in case["dtypes"].items()}
        outputs = tuple(case["outputs"])
        default = sgn.plan(shapes, dtypes, attrs=case["attrs"], outputs=outputs, caps=H200_CAPS)
        narrow = shapes["X"] == (2, 64, 64, 320)
        assert default.variant == ("split" if narrow else "registers"), (case["name"], default.explanation)
        p = sgn.plan(
            shapes,
            dtypes,
            attrs=case["attrs"],
            outputs=outputs,
            caps=H200_CAPS,
            tunables={"REGISTER_MIN_UNIT_BYTES": 4},
        )
        assert p.variant == "registers", (case["name"], p.explanation)
        (main,) = p.passes
        assert (main.workgroup_size, main.values["split"], held_units(main)) == expected[shapes["X"]], case[
            "name"
        ]
        assert main.dispatch == (64 * main.values["split"], 1, 1)
        without = sgn.plan(shapes, dtypes, attrs=case["attrs"], outputs=outputs, caps=F16_CAPS)
        assert not without.variant == "registers", case["name"]


def test_registers_take_the_test_cases_that_fit():
    """test.json's channels-last cases with an even channel count a group take registers on a device
    with subgroups (f16: a multiple of 4, for units of 8 bytes or more); the NCHW ones, and odd groups
    (cpg 3, 1), keep their split / fused variant."""
    for case in TEST_CASES:
        shapes = {k: tuple(v) for k, v in case["inputs"].items()}
        n, c, hw = layout(shapes["X"], case["attrs"].get("channels_last", 1))
        cpg = c // case["attrs"]["groups"]
        outputs = tuple(case["outputs"])
        for t in case["dtypes"]["T"]:
            fits = case["attrs"].get("channels_last", 1) != 0 and cpg % (2 if t == "float32" else 4) == 0
            p = sgn.plan(
                shapes,
                {"T": t, "M": "float32"},
                attrs=case["attrs"],
                outputs=outputs,
                tunables=case.get("tunables"),
                caps=H200_CAPS,
            )
            family = "registers" if fits else expected_family(case)
            assert p.variant == family, (case["name"], t, p.explanation)


def test_registers_selection_thresholds():
    """Taken where the row's words an invocation fit 4 x REGISTER_MAX_UNITS and rows x split fit
    SM_COUNT_PROXY; else the split / fused variants, as before."""
    registers = "registers"
    assert registers_choice((2, 64, 64, 320), "float32") == (registers, 640, 2, "32")  # 32 vec2<f32> units
    assert registers_choice((2, 32, 32, 640), "float32") == (registers, 640, 2, "8")
    assert registers_choice((2, 16, 16, 1280), "float32") == (registers, 640, 1, "4")  # cpg 40: 10 vec4<f32>
    assert registers_choice((2, 64, 64, 320), skip="NC", bias=False, outputs=("Y",)) == (
        "registers",
        640,
        2,
        "32",
    )
    # 66 rows x 2 workgroups fit SM_COUNT_PROXY (132); 67 or 96 rows take one workgroup a row, of
    # 5 x 128 invocations holding 32 units each (f16 words, f32 vec2 units).
    assert registers_choice((2, 64, 64, 330), groups=33)[2] == 2
    assert registers_choice((1, 64, 64, 670), groups=67)[2] == 1
    assert registers_choice((3, 64, 64, 320)) == (registers, 640, 1, "32")
    assert registers_choice((3, 64, 64, 320), "float32") == (registers, 640, 1, "32")
    assert registers_choice((3, 64, 64, 320), tunables={"SM_COUNT_PROXY": 192})[:3] == (registers, 640, 2)
    assert registers_choice((5, 64, 64, 320)) == "split"  # 160 rows: more than one wave
    assert registers_choice((16, 64, 64, 320)) == "fused"  # 512 rows
    # Over the register budget: 128 x 128 positions of 10 channels.
    assert registers_choice((2, 128, 128, 320)) == "split"
    # No subgroups; NCHW; an odd number of channels a group; WebGPU's default 256 invocations.
    assert (
        registers_choice((2, 64, 64, 320), caps={"features": ["shader-f16"], "limits": H200_CAPS["limits"]})
        == "split"
    )
    assert registers_choice((2, 320, 64, 64), channels_last=0) == "split"
    assert registers_choice((2, 16, 16, 96), groups=32) == "fused"  # 3 channels a group
    # WebGPU's default 256 invocations: 5 x 32; 4096 positions would need 128 words, 1024 need 64.
    assert registers_choice((2, 64, 64, 320), caps=SUBGROUP_CAPS) == "split"
    assert registers_choice((2, 32, 32, 640), caps=SUBGROUP_CAPS) == (registers, 160, 2, "32")


def test_registers_demoted_for_narrow_units():
    """Units under REGISTER_MIN_UNIT_BYTES (8) put registers behind split / fused; wider units
    keep them first; a caller can still force them."""
    at_default = {"REGISTER_MIN_UNIT_BYTES": 8}
    assert registers_choice((2, 64, 64, 320), tunables=at_default) == "split"  # 2 halves a unit
    assert registers_choice((2, 64, 64, 320), "float32", tunables=at_default)[0] == "registers"  # vec2<f32>
    assert registers_choice((2, 32, 32, 640), tunables=at_default)[0] == "registers"  # 4 halves
    assert registers_choice((2, 64, 64, 320), tunables=at_default, variant="registers")[0] == "registers"


def test_registers_refusals_say_why():
    shapes = {"X": (2, 4, 4, 12), "gamma": (12,), "beta": (12,), "skip": (2, 4, 4, 12)}
    for t, caps, attrs, words in [
        ("float32", F16_CAPS, {}, "needs device feature subgroups"),
        ("float32", SUBGROUP_CAPS, {"channels_last": 0}, "sgRegCovered"),
        ("float16", SUBGROUP_CAPS, {"groups": 4}, "sgRegCovered"),  # 3 channels a group
    ]:
        a = {"groups": 6, "activation": 0, **attrs}
        x = shapes["X"] if a.get("channels_last", 1) else (2, 12, 4, 4)
        with pytest.raises(ContractError, match="does not apply") as caught:
            sgn.plan(
                {**shapes, "X": x, "skip": x},
                {"T": t, "M": "float32"},
                attrs=a,
                caps=caps,
                variant="registers",
            )
        assert words in str(caught.value), str(caught.value)


# (X, skip, bias) of channel 0 in test_s_is_the_f32_sum_rounded_once, per T: (X + skip) + bias in
# f32 rounds differently from X + (skip + bias), and (f16) from the exact sum rounded once.
ORDER_REVEALING = {
    "float32": (1.0, 2.0**-24, 2.0**-24),  # 1; X + (skip + bias) is 1 + 2^-23
    "float16": (1024.0, 0.5, 2.0**-14),  # 1024.5 in f32, a tie, so 1024; the exact sum gives 1025
}


def _tie_heavy_inputs(rng, shapes, t, channels_last):
    """X, skip and bias whose f32 sums often land exactly halfway between two f16 values (an f16 X
    plus a skip of a quarter or half of X's spacing, also near 32768, where the spacing is 32),
    mixed with plain random values; channel 0 holds ORDER_REVEALING's values everywhere."""
    t = np.dtype(t)
    x = rng.choice([-1, 1], shapes["X"]) * rng.uniform(0.5, 2000, shapes["X"])
    x[rng.random(shapes["X"]) < 0.05] = 32768.0
    x = x.astype(np.float16).astype(np.float64)
    spacing = np.spacing(np.abs(x).astype(np.float16)).astype(np.float64)
    skip_full = np.where(
        rng.random(shapes["X"]) < 0.5,
        spacing * rng.choice([0.5, 0.25, -0.5], shapes["X"]),
        rng.standard_normal(shapes["X"]),
    )
    skip = skip_full if shapes["skip"] == shapes["X"] else rng.standard_normal(shapes["skip"])
    bias = rng.choice([0.0, 2.0**-11, 2.0**-12], shapes["gamma"])
    x0, skip0, bias0 = ORDER_REVEALING[t.name]
    channel = (..., 0) if channels_last else (slice(None), 0)
    x[channel] = x0
    if skip.shape == x.shape:
        skip[channel] = skip0
    else:  # (N, C)
        skip[:, 0] = skip0
    bias[0] = bias0
    inputs = {
        "X": x.astype(t),
        "skip": skip.astype(t),
        "gamma": rng.uniform(-2, 2, shapes["gamma"]).astype(np.float32),
        "beta": rng.uniform(-1, 1, shapes["beta"]).astype(np.float32),
    }
    if "bias" in shapes:
        inputs["bias"] = bias.astype(t)
    return inputs


def _f32_sum_rounded_once(inputs, channels_last):
    """S as the kernels form it: (X + skip) + bias in f32, in that order, then rounded once to T."""
    x = inputs["X"].astype(np.float32)
    skip = inputs["skip"].astype(np.float32)
    if skip.shape != x.shape:  # (N, C) or (N, 1, 1, C): one value a batch item and channel
        n, c = x.shape[0], x.shape[3] if channels_last else x.shape[1]
        skip = skip.reshape(n, c)
        skip = skip[:, None, None, :] if channels_last else skip[:, :, None, None]
    s = x + skip
    if "bias" in inputs:
        bias = inputs["bias"].astype(np.float32)
        s = s + (bias if channels_last else bias[:, None, None])
    return s.astype(inputs["X"].dtype)


@pytest.mark.parametrize("skip_form", ["full", "NC"])
@pytest.mark.parametrize("t", ["float32", "float16"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("variant", ["split", "fused", "registers"])
def test_s_is_the_f32_sum_rounded_once(variant, bias, t, skip_form, request):
    """S bit for bit: (X + skip) + bias in f32, in that order, rounded once to T with ties to even,
    in every variant, with and without a bias, and both layouts (registers takes channels-last only), on sums
    that sit exactly halfway between two f16 values and a channel whose S reveals the order of the
    additions; split and fused also with 16 invocations, whose lanes walk several columns. (The
    float64 checks allow S one ulp; this holds the rounding itself.)"""
    rng, seed = rng_for(request.node.name)
    layouts = (1,) if variant == "registers" else (1, 0)
    walks = (
        ({},)
        if variant == "registers"
        else ({}, {"WORKGROUP_SIZE": 16, "FUSED_WORKGROUP_SIZE": 16, "SLAB_VALUES": 64})
    )
    for channels_last, tunables in itertools.product(layouts, walks):
        x_shape = (2, 6, 5, 40) if channels_last else (2, 40, 6, 5)
        skip_shape = x_shape if skip_form == "full" else (2, 40)
        shapes = {"X": x_shape, "gamma": (40,), "beta": (40,), "skip": skip_shape}
        if bias:
            shapes["bias"] = (40,)
        inputs = _tie_heavy_inputs(rng, shapes, t, channels_last)
        attrs = {"groups": 4, "activation": 1, "channels_last": channels_last}
        caps = SUBGROUP_CAPS if variant == "registers" else None
        result = run_poisoned(
            inputs, attrs, ("Y", "S"), variant=variant, caps=caps, tunables=tunables or None
        )
        expected = _f32_sum_rounded_once(inputs, channels_last)
        got = result["S"]
        bits = np.uint16 if t == "float16" else np.uint32
        differ = got.view(bits) != expected.view(bits)
        assert not differ.any(), (
            f"{variant} T={t} skip {skip_form} channels_last={channels_last} {tunables} {seed_note(seed)}: "
            f"{np.count_nonzero(differ)} of {differ.size} S values are not the f32 sum rounded once, "
            f"e.g. {got[differ][:4]} for {expected[differ][:4]}"
        )
