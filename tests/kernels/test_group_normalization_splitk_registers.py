"""GroupNormalization-21's group_splitk_registers: rows x chunks workgroups in two passes (templates
norm-splitk-partials and -apply), a chunk CHUNK_WORKGROUP_SIZE x CHUNK_UNITS_F32 / _F16 16-byte units,
loaded into registers before use; the apply pass walks the chunks in reverse. Tunables shrink chunks
to a unit, so lavapipe meets rows shorter than a chunk, short last chunks, every unit bucket, folded
dispatches (over 65535, and at a device limit of 7), f16 extremes and either walk order (the same
bits); also selection on the bench cases and refusals.

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
    held_units,
    plan_for,
    random_inputs,
    reference,
    run_poisoned,
)
from tests.oracles import assert_close, rng_for, seed_note


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
