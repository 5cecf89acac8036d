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
data far from zero; folded dispatches; S as the f32 sum rounded once, in every variant.
ONNX Runtime's CPU provider has no SkipGroupNorm kernel, so there is no live onnxruntime comparison.
The split and fused variants use no subgroups (every reduction is a fixed-order tree in workgroup
memory). The registers variant has its own file (test_skip_group_norm_registers.py), the contract
and the selection rule too (test_skip_group_norm_contract.py). Tests that compare with natural
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
from tests.kernels.skip_group_norm_support import (
    DTYPE,
    F16_CAPS,
    FAMILIES,
    FLAVOURS,
    H200_CAPS,
    NO_F16_CAPS,
    SUBGROUP_CAPS,
    assert_within_one_ulp,
    check,
    expected_family,
    flavour_for,
    random_inputs,
    reference,
    run_poisoned,
)
from tests.oracles import assert_close, rng_for, seed_note, skip_group_norm_ref


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


@pytest.mark.parametrize("t", ["float32", "float16"])
def test_nchw_split_lanes_take_four_vectors_each(t):
    """NCHW split: each slab workgroup's lanes take NCHW_LANE_VECTORS (4) vectors of the slab, the
    configurations measured on an H100 for SDXL 64x64x320 (docs/PERFORMANCE.md, issue 27,
    2026-12-07): with 1024 invocations 10 slabs of 1024 vec4 a row on 256 lanes (WORKGROUP_SIZE 256,
    SLAB_VALUES 4096 by tunables before the rule), with WebGPU's default 256 invocations 20 slabs of
    512 on 128 lanes (WORKGROUP_SIZE 128 by tunable). Before, a lane took one vector."""
    shapes = {
        "X": (2, 320, 64, 64),
        "skip": (2, 320, 64, 64),
        "gamma": (320,),
        "beta": (320,),
        "bias": (320,),
    }
    attrs = {"groups": 32, "activation": 1, "channels_last": 0}
    dtypes = {"T": t, "M": "float32"}
    for caps, slabs, lanes in ((H200_CAPS, 10, 256), (F16_CAPS, 20, 128)):
        p = sgn.plan(shapes, dtypes, attrs=attrs, outputs=("Y", "S"), caps=caps, variant="split")
        stats, _, normalize = p.passes
        assert stats.dispatch == normalize.dispatch == (64, 1, slabs), stats.dispatch
        assert stats.workgroup_size == normalize.workgroup_size == lanes
        numbers = {**stats.overrides, **stats.uniforms}
        assert numbers["laneColumns"] * 4 == 10240 // slabs, numbers
    # The tunable sets it: one vector a lane is the old geometry.
    one = sgn.plan(
        shapes, dtypes, attrs=attrs, caps=H200_CAPS, variant="split", tunables={"NCHW_LANE_VECTORS": 1}
    )
    assert one.passes[0].workgroup_size == 1024


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
    docs/history/2026-12-performance-diary.md, "Kernel changes, round 2", change 6). The NCHW
    cases (channels_last = 0) take the same families: their rows are as long. (These caps have no
    subgroups; with them registers takes the cases it fits, both layouts:
    test_skip_group_norm_registers.py.)"""
    assert len(BENCH_CASES) == 18
    for case in BENCH_CASES:
        shapes = {k: tuple(v) for k, v in case["inputs"].items()}
        dtypes = {k: v[0] for k, v in case["dtypes"].items()}
        outputs = tuple(case["outputs"])
        if not case["attrs"]["channels_last"]:
            n, c, h, w = shapes["X"]
            p = sgn.plan(shapes, dtypes, attrs=case["attrs"], outputs=outputs, caps=F16_CAPS)
            assert p.variant == ("split" if c == 320 else "fused"), (case["name"], p.explanation)
            continue
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
    in every variant, with and without a bias, and both layouts, on sums that sit exactly halfway
    between two f16 values and a channel whose S reveals the order of the additions; split and fused
    also with 16 invocations, whose lanes walk several columns. (The float64 checks allow S one ulp;
    this holds the rounding itself.)"""
    rng, seed = rng_for(request.node.name)
    walks = (
        ({},)
        if variant == "registers"
        else ({}, {"WORKGROUP_SIZE": 16, "FUSED_WORKGROUP_SIZE": 16, "SLAB_VALUES": 64})
    )
    for channels_last, tunables in itertools.product((1, 0), walks):
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
