"""GroupNormalization-21's group_row_registers: rows x split workgroups, each loading its whole row
into registers (a bucket of units an invocation: vec4<f32>, or 8 halves as vec4<u32>), two-pass
statistics with subgroupAdd, and a share of the stores. Tunables shrink workgroups and rows, so
lavapipe meets tails, spare bucket units, odd workgroup sizes, partial subgroups and 1-3 workgroups
a row; also folded dispatches, every split giving the bits of one workgroup, selection and refusals.

Every case runs on the wgpu device (Mesa's software Vulkan in CI) with fresh random inputs per run
(the seed is printed on failure) and NaN-poisoned outputs, against tests/oracles.py's
group_normalization_ref with docs/TESTING.md tolerances.
"""

from __future__ import annotations

import numpy as np
import pytest

from generated import ContractError
from generated import group_normalization as gn
from tests.kernels.group_norm_support import (
    DTYPES,
    F16_CAPS,
    H200_CAPS,
    SPLIT_SHORT_ROWS,
    SUBGROUP_CAPS,
    bucket_fill,
    expected_fill,
    held_units,
    plan_for,
    random_inputs,
    reference,
    run_poisoned,
)
from tests.oracles import assert_close, rng_for, seed_note


# --- group_row_registers ------------------------------------------------------------------------------


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
