"""InstanceNormalization-6's plane_splitk_registers: GroupNorm's split-k in registers with a plane
as the row, against both oracles, on whole and cut chunks, far from zero and on constant planes,
with folded dispatches, bit-identical repeated runs and apply orders; refusals.

Every case runs on the wgpu device (Mesa's software Vulkan in CI) with fresh random inputs per run
(the seed is printed on failure), outputs poisoned with NaN before the run, and is compared with a
float64 NumPy reference (docs/TESTING.md tolerances) and with onnxruntime on the CPU.
"""

from __future__ import annotations

import numpy as np
import pytest

from generated import ContractError
from generated import instance_normalization as inn
from tests.kernels.group_norm_support import held_units
from tests.kernels.instance_norm_support import (
    assert_matches_both_oracles,
    dtypes_of,
    random_inputs,
    reference,
    run_poisoned,
    shapes_of,
)
from tests.oracles import assert_close, rng_for, seed_note


# --- plane_splitk_registers ---------------------------------------------------------------------------
# GroupNorm's split-k in registers with a plane as the row (templates norm-splitk-partials and
# norm-splitk-apply): planes x chunks workgroups in two passes, a chunk CHUNK_WORKGROUP_SIZE x
# CHUNK_UNITS_F32 / _F16 16-byte units. Tunables shrink the chunks so lavapipe meets tails, one
# invocation a workgroup, odd workgroup sizes and many chunks a plane.

CHUNKS = "plane_splitk_registers"
CHUNK_MIN = {"SPLIT_STATS_MIN_SPATIAL": 1}


def chunk_geometry(plan):
    """(workgroup, units an invocation, chunks a plane), the same in both passes."""
    geometry = [(p.workgroup_size, held_units(p), p.uniforms["chunks"]) for p in plan.passes]
    assert (
        len(geometry) == 2
        and geometry[0] == geometry[1]
        and plan.passes[0].dispatch == plan.passes[1].dispatch
    ), geometry
    return geometry[0]


# (shape, tunables, (workgroup, units, chunks) for f32, the same for f16).
CHUNK_CASES = [
    (
        (3, 5, 32),
        {**CHUNK_MIN, "CHUNK_WORKGROUP_SIZE": 16},
        (16, "8", 1),
        (16, "8", 1),
    ),  # planes of 8 / 4 units
    (
        (2, 3, 40, 44),
        {**CHUNK_MIN, "CHUNK_WORKGROUP_SIZE": 33, "CHUNK_UNITS_F32": 3, "CHUNK_UNITS_F16": 2},
        (33, "3", 5),
        (33, "2", 4),
    ),
    (
        (2, 2, 3, 2, 16),
        {**CHUNK_MIN, "CHUNK_WORKGROUP_SIZE": 1, "CHUNK_UNITS_F32": 1, "CHUNK_UNITS_F16": 1},
        (1, "1", 24),
        (1, "1", 12),
    ),  # rank 5
    (
        (1, 3, 64, 80),
        CHUNK_MIN,
        (128, "8", 2),
        (128, "8", 1),
    ),  # defaults: 1280 / 640 units, tails of 256 / 640
    (
        (2, 2, 64, 64),
        {**CHUNK_MIN, "CHUNK_WORKGROUP_SIZE": 20, "CHUNK_UNITS_F32": 16, "CHUNK_UNITS_F16": 12},
        (20, "16", 4),
        (20, "12", 3),
    ),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize(
    "shape,tunables,f32_geometry,f16_geometry", CHUNK_CASES, ids=[str(c[0]) for c in CHUNK_CASES]
)
def test_splitk_registers_against_reference_and_onnxruntime(
    shape, tunables, f32_geometry, f16_geometry, dtype, request
):
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, shape, dtype, offset=3.0)
    epsilon = float(rng.choice([1e-5, 1e-3, 0.1]))
    plan = inn.plan(
        shapes_of(inputs),
        dtypes_of(inputs),
        caps={"features": ["shader-f16"]},
        tunables=tunables,
        variant=CHUNKS,
    )
    workgroup, units, chunks = f32_geometry if dtype == np.float32 else f16_geometry
    assert chunk_geometry(plan) == (workgroup, units, chunks)
    planes = shape[0] * shape[1]
    assert plan.passes[0].dispatch == (planes * chunks, 1, 1)
    assert (plan.passes[1].uniforms["numGroups"], plan.passes[1].overrides["channelsPerGroup"]) == (
        shape[1],
        1,
    )
    actual = run_poisoned(inputs, attrs={"epsilon": epsilon}, tunables=tunables, variant=CHUNKS)
    context = f"{CHUNKS} {shape} eps={epsilon} {tunables} {seed_note(seed)}"
    assert_matches_both_oracles(actual, inputs, epsilon, dtype, context)


def test_splitk_registers_cases_meet_whole_and_cut_chunks():
    """CHUNK_CASES plan both chunkings in both dtypes: planes of whole chunks (the wholeChunks
    specialization) and planes whose last chunk is short (plane units % chunk units != 0)."""
    seen = set()
    for shape, tunables, _, _ in CHUNK_CASES:
        for dtype in ("float32", "float16"):
            shapes = {"input": shape, "scale": (shape[1],), "b": (shape[1],)}
            plan = inn.plan(
                shapes, {"T": dtype}, caps={"features": ["shader-f16"]}, tunables=tunables, variant=CHUNKS
            )
            workgroup, units, _ = chunk_geometry(plan)
            whole = plan.passes[0].uniforms["rowUnits"] % (workgroup * int(units)) == 0
            assert all(q.spec.endswith("-whole-chunks") == whole for q in plan.passes), (shape, dtype)
            seen.add((whole, dtype))
    assert len(seen) == 4, seen


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_splitk_registers_large_common_offset_and_constant_planes(dtype, request):
    """A mean 1000 (f32) or 100 (f16) times the spread costs nothing; a constant plane gives its
    channel's bias exactly (zero variance), several chunks a plane."""
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, (2, 3, 16, 40), dtype, offset=1000.0 if dtype == np.float32 else 100.0)
    inputs["input"][1, 2] = 7.25
    inputs["input"][0, 1] = -3.0
    tunables = {**CHUNK_MIN, "CHUNK_WORKGROUP_SIZE": 16, "CHUNK_UNITS_F32": 3, "CHUNK_UNITS_F16": 2}
    plan = inn.plan(
        shapes_of(inputs),
        dtypes_of(inputs),
        caps={"features": ["shader-f16"]},
        tunables=tunables,
        variant=CHUNKS,
    )
    assert chunk_geometry(plan)[2] > 1
    actual = run_poisoned(inputs, tunables=tunables, variant=CHUNKS)
    assert_close(actual, reference(inputs, 1e-5), dtype, f"{CHUNKS} offset {seed_note(seed)}")
    assert np.all(actual[1, 2] == inputs["b"][2]) and np.all(actual[0, 1] == inputs["b"][1])


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_splitk_registers_folded_dispatch(dtype, request):
    """8192 planes of 17 units, one unit a workgroup: 139264 workgroups fold into (65535, 3, 1)."""
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, (2, 4096, 68 if dtype == np.float32 else 136), dtype)
    tunables = {
        **CHUNK_MIN,
        "SPLIT_STATS_MAX_PLANES": 8192,
        "SPLIT_STATS_BELOW_PLANES": 8193,
        "CHUNK_WORKGROUP_SIZE": 1,
        "CHUNK_UNITS_F32": 1,
        "CHUNK_UNITS_F16": 1,
    }
    plan = inn.plan(
        shapes_of(inputs),
        dtypes_of(inputs),
        caps={"features": ["shader-f16"]},
        tunables=tunables,
        variant=CHUNKS,
    )
    assert chunk_geometry(plan) == (1, "1", 17) and plan.passes[0].dispatch == (65535, 3, 1)
    actual = run_poisoned(inputs, tunables=tunables, variant=CHUNKS)
    assert_close(actual, reference(inputs, 1e-5), dtype, f"{CHUNKS} folded {seed_note(seed)}")


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_splitk_registers_repeated_runs_and_apply_order_are_bit_identical(dtype, request):
    """The same bits on every run and in either walk order of the apply pass (every workgroup of a
    plane merges the plane's partials in one fixed order)."""
    rng, _ = rng_for(request.node.name)
    inputs = random_inputs(rng, (2, 3, 16, 40), dtype)
    tunables = {**CHUNK_MIN, "CHUNK_WORKGROUP_SIZE": 16, "CHUNK_UNITS_F32": 3, "CHUNK_UNITS_F16": 2}
    first = run_poisoned(inputs, tunables=tunables, variant=CHUNKS)
    for order in (1, 2):
        again = run_poisoned(inputs, tunables={**tunables, "CHUNK_APPLY_ORDER": order}, variant=CHUNKS)
        assert again.tobytes() == first.tobytes(), order


def test_splitk_registers_refusals_say_why():
    shapes = {"input": (1, 3, 4, 5), "scale": (3,), "b": (3,)}
    for dtype, caps, tunables, words in [
        (
            "float16",
            {"features": ["shader-f16"]},
            CHUNK_MIN,
            "instanceSpatial % regUnitValues == 0",
        ),  # 20 values: 2.5 f16 units
        ("float32", {"features": ["shader-f16"]}, {}, "instanceSpatial >= tunables.SPLIT_STATS_MIN_SPATIAL"),
        (
            "float32",
            {"features": [], "limits": {"maxComputeWorkgroupStorageSize": 1024}},
            CHUNK_MIN,
            "chunkWorkgroupBytes",
        ),
        (
            "float32",
            {"features": []},
            {**CHUNK_MIN, "SPLIT_STATS_BELOW_PLANES": 3},
            "instancePlanes < tunables.SPLIT_STATS_BELOW_PLANES",
        ),
    ]:
        with pytest.raises(ContractError, match="does not apply") as caught:
            inn.plan(shapes, {"T": dtype}, caps=caps, tunables=tunables, variant=CHUNKS)
        assert words in str(caught.value), str(caught.value)
