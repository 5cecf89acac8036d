"""templates/norm-row-stats.wgsl.jinja through every variant that uses it, on the wgpu device.

GroupNormalization-21: group_subgroup_vec4, group_subgroup; InstanceNormalization-6:
plane_subgroup_vec4, plane_subgroup_vec4_scalar_io, plane_subgroup. Each is forced with
`variant=` and planned for a described device (`caps=`) with and without the WGSL language
feature `subgroup_id`, which switches the template between the subgroupAdd combine and the
workgroup-memory tree. The device itself is lavapipe in CI (subgroups 8 wide; a subprocess with
LP_NATIVE_VECTOR_WIDTH=128 makes them 4 wide), so the subgroup combine also meets workgroups
smaller than a subgroup (tiny rows: wg = pow2ceil(row) of 1, 2, 4) and many subgroups per
workgroup (wg up to 1024). Inputs are fresh random data per run (seed printed on failure),
outputs are poisoned with NaN, and results are compared with float64 references within the
docs/TESTING.md tolerances.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from generated import ContractError, Tensor
from generated import group_normalization as gn
from generated import instance_normalization as inn
from tests.device_helpers import is_lavapipe, measured_subgroup_size
from tests.oracles import (
    assert_close,
    group_normalization_ref,
    instance_normalization_ref,
    rng_for,
    seed_note,
)

ROOT = Path(__file__).resolve().parents[2]
FEATURES = ["shader-f16", "subgroups"]
# combineSubgroups = hasSubgroupId = subgroups feature and the `subgroup_id` language feature.
COMBINE_CAPS = {
    True: {"features": FEATURES, "wgslLanguageFeatures": ["subgroup_id"]},
    False: {"features": FEATURES},
}
# plane_subgroup_vec4_scalar_io needs an adapter that reports 32-wide subgroups; lavapipe's are
# 8 (or 4) wide, which makes it a portability test of the "portable" subgroup combine.
WAVE32_ADAPTER = {"subgroupMinSize": 32, "subgroupMaxSize": 32}
BIG_WORKGROUP_LIMITS = {"maxComputeInvocationsPerWorkgroup": 1024, "maxComputeWorkgroupSizeX": 1024}

GROUP_VARIANTS = ("group_subgroup_vec4", "group_subgroup")
INSTANCE_VARIANTS = ("plane_subgroup_vec4", "plane_subgroup_vec4_scalar_io", "plane_subgroup")
VARIANTS = GROUP_VARIANTS + INSTANCE_VARIANTS

# (shape, num_groups): ranks 3-5, N > 1, C and spatial sizes not divisible by 4, num_groups 1
# and C, small and large groups, rows of 1..4 values (wg 1, 2, 4: less than a subgroup), and
# more than 65535 rows (folded dispatch).
GROUP_SCALAR_SHAPES = [
    ((2, 6, 5), 3),  # rank 3, cpg 2, row 10
    ((3, 5, 3, 7), 5),  # num_groups == C, row 21
    ((2, 6, 3, 5), 1),  # num_groups == 1, row 90
    ((2, 4, 3, 2, 3), 2),  # rank 5, row 36
    ((3, 3, 1), 3),  # row 1: wg 1
    ((2, 4, 1, 1), 2),  # row 2: wg 2
    ((2, 3, 1, 3), 1),  # row 9 over C 3: wg 16
    ((2, 7, 3), 7),  # row 3: wg 4, one idle invocation
    ((2, 6, 37, 43), 2),  # rows of 4773: wg 256, many values per invocation
    ((1, 70000, 1, 2), 70000),  # 70000 rows of 2: folded dispatch
]
GROUP_VEC4_SHAPES = [
    ((2, 6, 8), 3),  # rank 3, cpg 2, row 4 vec4
    ((3, 5, 4, 3), 5),  # num_groups == C, C % 4 != 0
    ((2, 6, 2, 6), 1),  # num_groups == 1, row 18 vec4
    ((2, 3, 2, 2, 4), 3),  # rank 5
    ((2, 4, 4), 4),  # row of 1 vec4: wg 1
    ((2, 6, 2, 2), 3),  # row of 2 vec4: wg 2
    ((3, 3, 12), 1),  # row of 9 vec4: wg 16
    ((2, 12, 40, 36), 3),  # rows of 1440 vec4: wg 256
    ((1, 70000, 4), 70000),  # 70000 rows of 1 vec4: folded dispatch
]
INSTANCE_SCALAR_SHAPES = [
    (2, 3, 5),
    (3, 5, 3, 7),
    (2, 3, 2, 3, 3),  # rank 5
    (3, 5, 1),  # plane of 1: wg 1
    (2, 3, 2, 1),  # plane of 2: wg 2
    (2, 5, 3),  # plane of 3: wg 4
    (2, 3, 97, 101),  # planes of 9797: wg 256
    (2, 35000, 2),  # 70000 planes: folded dispatch
]
INSTANCE_VEC4_SHAPES = [
    (2, 3, 4),  # plane of 1 vec4: wg 1
    (2, 5, 2, 4),  # wg 2
    (3, 3, 4, 4),  # wg 4
    (2, 3, 2, 3, 4),  # rank 5, wg 8
    (2, 7, 12, 12),  # 36 vec4: wg 64
    (2, 3, 128),  # 32 vec4: the smallest plane scalar_io takes on a 32-wide adapter
    (2, 3, 60, 68),  # 1020 vec4: wg 256
    (1, 70000, 4),  # 70000 planes: folded dispatch
]

SHAPES = {
    "group_subgroup": GROUP_SCALAR_SHAPES,
    "group_subgroup_vec4": GROUP_VEC4_SHAPES,
    "plane_subgroup": [(s, None) for s in INSTANCE_SCALAR_SHAPES],
    "plane_subgroup_vec4": [(s, None) for s in INSTANCE_VEC4_SHAPES],
    "plane_subgroup_vec4_scalar_io": [(s, None) for s in INSTANCE_VEC4_SHAPES],
}


def caps_for(variant, combine, limits=None):
    caps = dict(COMBINE_CAPS[combine])
    if variant == "plane_subgroup_vec4_scalar_io":
        caps["adapterInfo"] = dict(WAVE32_ADAPTER)
    if limits:
        caps["limits"] = dict(limits)
    return caps


def applies(variant, dtype, combine, shape):
    """Whether the manifest lets `variant` run this case (else the case checks the refusal)."""
    if variant == "plane_subgroup_vec4_scalar_io":
        # f32 only, needs `subgroup_id` (so always the subgroup combine), and
        # wg = pow2ceil(spatial / 4) >= the reported subgroup size, 32.
        return dtype == np.float32 and combine and int(np.prod(shape[2:])) // 4 > 16
    return True


def random_case(rng, shape, dtype):
    """Rows with different means (a per-channel offset) and spreads, never all zero."""
    channels = shape[1]
    offset = rng.uniform(-4, 4, (1, channels) + (1,) * (len(shape) - 2))
    x = rng.standard_normal(shape) * rng.uniform(0.5, 3) + offset
    return {
        "x": x.astype(dtype),
        "scale": rng.uniform(-2, 2, channels).astype(dtype),
        "bias": rng.uniform(-1, 1, channels).astype(dtype),
        "epsilon": float(rng.choice([1e-5, 1e-3, 0.1])),
    }


def plan_for(variant, case, num_groups, caps, tunables=None):
    x = case["x"]
    shapes = {"scale": case["scale"].shape}
    if variant in GROUP_VARIANTS:
        shapes.update(x=x.shape, bias=case["bias"].shape)
        return gn.plan(
            shapes,
            {"T": x.dtype.name},
            attrs={"num_groups": num_groups, "epsilon": case["epsilon"]},
            caps=caps,
            tunables=tunables,
            variant=variant,
        )
    shapes.update(input=x.shape, b=case["bias"].shape)
    return inn.plan(
        shapes,
        {"T": x.dtype.name},
        attrs={"epsilon": case["epsilon"]},
        caps=caps,
        tunables=tunables,
        variant=variant,
    )


def run(variant, case, num_groups, caps, tunables=None):
    """The kernel writing into a NaN-poisoned output tensor; returns the output as numpy."""
    x = case["x"]
    poisoned = Tensor.from_numpy(np.full(x.shape, np.nan, x.dtype))
    if variant in GROUP_VARIANTS:
        result = gn.kernel(
            {"x": x, "scale": case["scale"], "bias": case["bias"]},
            attrs={"num_groups": num_groups, "epsilon": case["epsilon"]},
            variant=variant,
            caps=caps,
            tunables=tunables,
            out={"y": poisoned},
        )["y"]
    else:
        result = inn.kernel(
            {"input": x, "scale": case["scale"], "b": case["bias"]},
            attrs={"epsilon": case["epsilon"]},
            variant=variant,
            caps=caps,
            tunables=tunables,
            out={"output": poisoned},
        )["output"]
    result = np.asarray(result)
    assert result.shape == x.shape and result.dtype == x.dtype
    return result


def reference(variant, case, num_groups):
    if variant in GROUP_VARIANTS:
        return group_normalization_ref(case["x"], case["scale"], case["bias"], num_groups, case["epsilon"])
    return instance_normalization_ref(case["x"], case["scale"], case["bias"], case["epsilon"])


def check_case(variant, dtype, combine, shape, num_groups, name, tunables=None, limits=None):
    """Plan, check the specialization is the intended one, run poisoned, compare. Returns the plan."""
    rng, seed = rng_for(name)
    case = random_case(rng, shape, dtype)
    caps = caps_for(variant, combine, limits)
    plan = plan_for(variant, case, num_groups, caps, tunables)
    (main,) = plan.passes
    assert main.template == "templates/norm-row-stats.wgsl.jinja"
    assert main.uses_subgroups == combine, f"{variant}: expected combineSubgroups={combine}"
    actual = run(variant, case, num_groups, caps, tunables)
    context = f"{variant} {np.dtype(dtype).name} combine={combine} {shape} G={num_groups} wg={main.overrides['workgroupSize']} eps={case['epsilon']} {seed_note(seed)}"
    assert_close(actual, reference(variant, case, num_groups), dtype, context)
    return plan


MATRIX = [
    pytest.param(
        variant,
        dtype,
        combine,
        shape,
        groups,
        id=f"{variant}-{np.dtype(dtype).name}-{'subgroup' if combine else 'tree'}-{shape}",
    )
    for variant in VARIANTS
    for dtype in (np.float32, np.float16)
    for combine in (True, False)
    for shape, groups in SHAPES[variant]
]


@pytest.mark.parametrize("variant,dtype,combine,shape,num_groups", MATRIX)
def test_against_float64_reference(variant, dtype, combine, shape, num_groups, request):
    if not applies(variant, dtype, combine, shape):
        rng, _ = rng_for(request.node.name)
        case = random_case(rng, shape, dtype)
        with pytest.raises(ContractError, match="does not apply"):
            plan_for(variant, case, num_groups, caps_for(variant, combine))
        return
    check_case(variant, dtype, combine, shape, num_groups, request.node.name)


# One mid-size row per variant; the manifest rounds WORKGROUP_SIZE down to a power of two
# (33 -> 32, 100 -> 64), 1024 needs a device that allows it.
ROW_SHAPES = {
    "group_subgroup": ((2, 6, 25, 41), 3),
    "group_subgroup_vec4": ((2, 6, 36, 40), 2),
    "plane_subgroup": ((2, 3, 53, 71), None),
    "plane_subgroup_vec4": ((2, 3, 64, 68), None),
    "plane_subgroup_vec4_scalar_io": ((2, 3, 64, 68), None),
}
WORKGROUP_CASES = [(33, None, 32), (100, None, 64), (1024, BIG_WORKGROUP_LIMITS, 1024)]


@pytest.mark.parametrize(
    "requested,limits,expected_wg", WORKGROUP_CASES, ids=[str(w) for w, _, _ in WORKGROUP_CASES]
)
@pytest.mark.parametrize("combine", [True, False], ids=["subgroup", "tree"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_workgroup_size_tunable(variant, combine, requested, limits, expected_wg, request):
    if variant == "plane_subgroup_vec4_scalar_io" and not combine:
        pytest.skip("scalar_io always combines through subgroups")
    shape, groups = ROW_SHAPES[variant]
    plan = check_case(
        variant,
        np.float32,
        combine,
        shape,
        groups,
        request.node.name,
        tunables={"WORKGROUP_SIZE": requested},
        limits=limits,
    )
    assert plan.passes[0].overrides["workgroupSize"] == expected_wg


# f16 vec4 rows walk two vectors a step (`pairs`): rows of hiddenVec vectors against a workgroup of 8
# (WORKGROUP_SIZE 8), so the last step holds no second vector (9, 16 + 3), exactly two (16), or a
# second vector for only some invocations (8 + 5 = 13, 16 + 11 = 27).
PAIRS_SPATIAL = (36, 52, 64, 76, 108)  # hiddenVec 9, 13, 16, 19, 27


@pytest.mark.parametrize("spatial", PAIRS_SPATIAL)
@pytest.mark.parametrize("combine", [True, False], ids=["subgroup", "tree"])
@pytest.mark.parametrize("variant", ["group_subgroup_vec4", "plane_subgroup_vec4"])
def test_f16_pairs_cover_partial_last_steps(variant, combine, spatial, request):
    shape, groups = ((2, 4, 1, spatial), 4) if variant in GROUP_VARIANTS else ((2, 3, 1, spatial), None)
    plan = check_case(
        variant, np.float16, combine, shape, groups, request.node.name, tunables={"WORKGROUP_SIZE": 8}
    )
    (main,) = plan.passes
    assert main.overrides["workgroupSize"] == 8 and main.uniforms["hiddenVec"] == spatial // 4
    assert "2u * workgroupSize" in main.wgsl  # the f16 specialization walks in pairs; f32 does not
    f32 = plan_for(
        variant,
        random_case(rng_for(request.node.name)[0], shape, np.float32),
        groups,
        caps_for(variant, combine),
    )
    assert "2u * workgroupSize" not in f32.passes[0].wgsl


@pytest.mark.parametrize("fold_limit,expected_dispatch", [(1000, (1000, 3, 1)), (100000, (65535, 2, 1))])
@pytest.mark.parametrize("combine", [True, False], ids=["subgroup", "tree"])
@pytest.mark.parametrize("variant", GROUP_VARIANTS)
def test_group_rows_fold_at_device_width(variant, combine, fold_limit, expected_dispatch, request):
    """GroupNormalization folds rows at min(maxComputeWorkgroupsPerDimension, 65535); the
    shader must rebuild the row with DISPATCH_FOLD_WIDTH, also when the device reports a limit
    above 65535 (where params.rowStride disagrees)."""
    rows = expected_dispatch[0] * (expected_dispatch[1] - 1) + 7
    shape = (1, rows, 4) if variant == "group_subgroup_vec4" else (1, rows, 2)
    limits = {"maxComputeWorkgroupsPerDimension": fold_limit}
    plan = check_case(variant, np.float32, combine, shape, rows, request.node.name, limits=limits)
    assert plan.passes[0].dispatch == expected_dispatch


@pytest.mark.parametrize("combine", [True, False], ids=["subgroup", "tree"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_constant_rows_give_bias(variant, combine, request):
    """Zero variance (clamped, never negative): every output is the channel's bias."""
    if variant == "plane_subgroup_vec4_scalar_io" and not combine:
        pytest.skip("scalar_io always combines through subgroups")
    rng, seed = rng_for(request.node.name)
    shape, groups = ((2, 6, 16, 16), 3) if variant in GROUP_VARIANTS else ((2, 3, 16, 16), None)
    row_values = rng.uniform(-5, 5, (shape[0], groups or shape[1], 1)).astype(np.float32)
    case = {
        "x": np.broadcast_to(
            row_values, (shape[0], groups or shape[1], int(np.prod(shape[1:])) // (groups or shape[1]))
        )
        .reshape(shape)
        .copy(),
        "scale": rng.uniform(-2, 2, shape[1]).astype(np.float32),
        "bias": rng.uniform(-1, 1, shape[1]).astype(np.float32),
        "epsilon": 1e-5,
    }
    actual = run(variant, case, groups, caps_for(variant, combine))
    expected = np.broadcast_to(case["bias"].reshape(1, -1, 1, 1), shape)
    np.testing.assert_array_equal(actual, expected, err_msg=f"{variant} combine={combine} {seed_note(seed)}")


@pytest.mark.parametrize(
    "dtype,offset,spread", [(np.float32, 1e4, 1.0), (np.float16, 200.0, 4.0)], ids=["f32", "f16"]
)
@pytest.mark.parametrize("combine", [True, False], ids=["subgroup", "tree"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_large_offset_small_spread(variant, combine, dtype, offset, spread, request):
    """Rows far from zero relative to their spread: unshifted E[x^2] - E[x]^2 in f32 would lose
    every digit here; the shifted per-invocation statistics and the (mean0, lo) pair must not."""
    if not applies(variant, dtype, combine, ROW_SHAPES[variant][0]):
        pytest.skip("scalar_io: f32 and the subgroup combine only")
    rng, seed = rng_for(request.node.name)
    shape, groups = ROW_SHAPES[variant]
    case = random_case(rng, shape, dtype)
    x = offset * rng.choice(
        [-1.0, 1.0], (shape[0], shape[1]) + (1,) * (len(shape) - 2)
    ) + spread * rng.standard_normal(shape)
    case["x"] = x.astype(dtype)
    actual = run(variant, case, groups, caps_for(variant, combine))
    context = f"{variant} {np.dtype(dtype).name} combine={combine} offset={offset} {seed_note(seed)}"
    assert_close(actual, reference(variant, case, groups), dtype, context)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("combine", [True, False], ids=["subgroup", "tree"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_bit_identical_across_runs(variant, combine, dtype, request):
    if variant == "plane_subgroup_vec4_scalar_io" and not (combine and dtype == np.float32):
        pytest.skip("scalar_io: f32 and the subgroup combine only")
    rng, seed = rng_for(request.node.name)
    shape, groups = ROW_SHAPES[variant]
    case = random_case(rng, shape, dtype)
    caps = caps_for(variant, combine)
    first = run(variant, case, groups, caps)
    second = run(variant, case, groups, caps)
    assert (
        first.tobytes() == second.tobytes()
    ), f"{variant} combine={combine}: two runs differ; {seed_note(seed)}"


# ---------------------------------------------------------------------------------------------
# Subgroups 4 wide: lavapipe with LP_NATIVE_VECTOR_WIDTH=128, in a subprocess


# Tiny rows (wg 1, 2, 4 < subgroup), the partial-subgroup edge wg = 2 with 4-wide subgroups,
# and big rows (wg 256 and 1024: 64 and 256 subgroups per workgroup).
PORTABILITY_CASES = [
    ("group_subgroup", (2, 6, 5), 3, None),
    ("group_subgroup", (3, 3, 1), 3, None),
    ("group_subgroup", (2, 7, 3), 7, None),
    ("group_subgroup", (2, 6, 37, 43), 2, None),
    ("group_subgroup_vec4", (2, 6, 2, 2), 3, None),
    ("group_subgroup_vec4", (2, 12, 40, 36), 3, {"WORKGROUP_SIZE": 1024}),
    ("plane_subgroup", (2, 3, 2, 1), None, None),
    ("plane_subgroup", (2, 3, 97, 101), None, None),
    ("plane_subgroup_vec4", (3, 3, 4, 4), None, None),
    ("plane_subgroup_vec4", (2, 3, 60, 68), None, {"WORKGROUP_SIZE": 1024}),
    ("plane_subgroup_vec4_scalar_io", (2, 3, 128), None, None),
    ("plane_subgroup_vec4_scalar_io", (2, 3, 60, 68), None, None),
]


def run_portability_cases() -> dict:
    """Every PORTABILITY_CASES entry, both combines, f32 and f16 where the variant allows."""
    ran = 0
    for variant, shape, groups, tunables in PORTABILITY_CASES:
        limits = BIG_WORKGROUP_LIMITS if tunables else None
        for dtype in (np.float32, np.float16):
            for combine in (True, False):
                if not applies(variant, dtype, combine, shape):
                    continue
                check_case(
                    variant,
                    dtype,
                    combine,
                    shape,
                    groups,
                    f"portability {variant} {shape} {np.dtype(dtype).name} {combine}",
                    tunables=tunables,
                    limits=limits,
                )
                ran += 1
    return {"subgroup_size": measured_subgroup_size(), "cases": ran}


def test_subgroups_four_wide_in_subprocess():
    if not is_lavapipe():
        pytest.skip("LP_NATIVE_VECTOR_WIDTH only changes lavapipe's subgroup size")
    # Mesa's shader cache does not key on LP_NATIVE_VECTOR_WIDTH: without disabling it, pipelines
    # compiled 8 wide by an earlier process would be reused here.
    env = dict(
        os.environ, LP_NATIVE_VECTOR_WIDTH="128", MESA_SHADER_CACHE_DISABLE="true", WGPU_BACKEND_TYPE="Vulkan"
    )
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    from tests.oracles import run_seed

    env["KERNEL_TEST_SEED"] = str(run_seed())
    script = "import json, tests.kernels.test_norm_row_stats as t; print('RESULT', json.dumps(t.run_portability_cases()))"
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"subprocess failed:\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
    result = json.loads(done.stdout.split("RESULT", 1)[1])
    assert result["subgroup_size"] == 4, result
    assert result["cases"] >= 30, result


def test_in_process_subgroups_are_lavapipe_default_width():
    """The in-process cases run at lavapipe's default 8-wide subgroups (or the real device's)."""
    size = measured_subgroup_size()
    assert size >= 1 and size & (size - 1) == 0
    if is_lavapipe() and not os.environ.get("LP_NATIVE_VECTOR_WIDTH"):
        assert size == 8
