"""com.microsoft SkipGroupNorm's registers variant (issue 12): a row in registers in both layouts
(channels-last: a strided row, a unit some channels of a position; NCHW: a contiguous row, a unit
consecutive values of one channel), subgroupAdd sums, at lavapipe's subgroup width 8, including
workgroups that are not a multiple of it (tests/kernels/profile_cases.py runs them at width 4 too):
every member (with and without a bias and S), every skip form, exact and partial rows, every split
giving the bits of one workgroup, hostile data, folded dispatches, small device limits, selection on
the bench and test cases, refusals.

Every kernel call runs on the wgpu device (Mesa's software Vulkan in CI) with fresh random inputs per
run (seeded by tests.oracles.rng_for; the seed is printed on failure) and NaN-poisoned outputs (out=),
and is compared with tests/oracles.py's float64 skip_group_norm_ref under docs/TESTING.md's tolerances:
Y, and S = X + skip + bias rounded to T.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from generated import ContractError
from generated import skip_group_norm as sgn
from generated.skip_group_norm.cases import BENCH_CASES, TEST_CASES
from tests.kernels.skip_group_norm_support import (
    F16_CAPS,
    H200_CAPS,
    SUBGROUP_CAPS,
    check,
    expected_family,
    layout,
    random_inputs,
    run_poisoned,
)
from tests.oracles import rng_for, seed_note


# --- registers (row in registers, issue 12) -----------------------------------------------------------------

REGISTER_MEMBERS = ("bias_sum", "bias_plain", "sum", "plain")
LAYOUTS = pytest.mark.parametrize("channels_last", [1, 0], ids=["nhwc", "nchw"])


SMALL_TARGET = {"REGISTER_SINGLE_WORKGROUP_SIZE": 1, "REGISTER_MIN_POSITION_LANES": 1}

# (X shape NHWC, groups, tunables, (workgroup, split, UNITS) for f32 T, the same for f16 T). A unit
# is the widest of 4/2/1 words dividing the group's channels (f32: 4 or 2 values; f16: 8, 4 or 2
# halves); the workgroup is groupUnits x positionLanes; UNITS is the bucket (8 ... 32 words) over
# the words of one unit.
REGISTER_CASES = [
    ((2, 5, 6, 40), 4, {}, (160, 1, "4"), (160, 1, "8")),  # cpg 10: 30 positions on 32 lanes, spare units
    (
        (1, 10, 10, 20),
        1,
        {"REGISTER_SINGLE_WORKGROUP_SIZE": 40, "REGISTER_MIN_POSITION_LANES": 8},
        (80, 1, "8"),
        (40, 1, "16"),
    ),  # tails: 100 = 6 x 16 + 4 (f32: 16 lanes fit the 32-word budget), 12 x 8 + 4 (f16)
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
        (1, 16, 16, 10),
        1,
        {**SMALL_TARGET, "REGISTER_MAX_UNITS": 8},
        (80, 1, "16"),
        (40, 1, "32"),
    ),  # the largest bucket: 32 words
    ((2, 4, 4, 12), 6, {}, (16, 1, "4"), (16, 1, "8")),  # 2 channels a group
    ((1, 3, 5, 48), 1, {}, (192, 1, "2"), (96, 1, "2")),  # one group of 48 channels
]
REGISTER_IDS = [f"{c[0]}-g{c[1]}" for c in REGISTER_CASES]

# The same for NCHW X shapes (N, C, H, W). A unit is the widest of 4/2/1 words dividing H x W (f32:
# 4, 2 or 1 values; f16: 8, 4 or 2 halves, so an odd H x W is not covered: None); the workgroup is
# channelsPerGroup x channelLanes, any channel count a group.
NCHW_REGISTER_CASES = [
    ((2, 40, 5, 6), 4, {}, (160, 1, "4"), (160, 1, "8")),  # 15 units a channel on 16 lanes: an idle lane
    (
        (1, 12, 7, 9),
        2,
        {"REGISTER_SINGLE_WORKGROUP_SIZE": 48, "REGISTER_MIN_POSITION_LANES": 8},
        (48, 1, "8"),
        None,
    ),  # f32 units of one value, a tail: 63 = 8 x 8 - 1
    ((2, 6, 3, 4), 2, SMALL_TARGET, (3, 1, "4"), (3, 1, "4")),  # 3 invocations: one-by-one sums
    (
        (1, 32, 16, 16),
        2,
        {"REGISTER_SPLIT_MIN_VALUES": 1, "REGISTER_WORKGROUP_SIZE": 64},
        (256, 2, "4"),
        (256, 2, "2"),
    ),  # exact rows, two workgroups a row
    (
        (2, 9, 8, 8),
        3,
        {
            "REGISTER_SPLIT_MIN_VALUES": 1,
            "REGISTER_SPLIT": 3,
            "REGISTER_WORKGROUP_SIZE": 6,
            "REGISTER_MIN_POSITION_LANES": 2,
        },
        (6, 3, "8"),
        (6, 3, "4"),
    ),  # shares 3 + 3 + 2 (f16: 2 + 2 + 0)
    (
        (1, 2, 8, 31),
        1,
        {**SMALL_TARGET, "REGISTER_MAX_UNITS": 8},
        (16, 1, "8"),
        (8, 1, "8"),
    ),  # the largest bucket (32 words), a tail: 62 / 31 units a channel on 8 / 4 lanes
]
SKIP_FORMS = ("full", "NC", "N11C")
# Each NCHW case runs every member, each with one skip form (turning with the case), so every
# (member, skip form) pair runs in both dtypes (test_nchw_register_params_cover_every_member_and_skip).
NCHW_PARAMS = [
    (case, member, SKIP_FORMS[(i + k) % 3])
    for i, case in enumerate(NCHW_REGISTER_CASES)
    for k, member in enumerate(REGISTER_MEMBERS)
]
NCHW_IDS = [f"{c[0]}-g{c[1]}-{member}-skip-{form}" for c, member, form in NCHW_PARAMS]


def held_units(pass_plan):
    """The UNITS bucket a registers shader was specialized for."""
    return re.search(r"const UNITS: u32 = (\d+)u;", pass_plan.wgsl).group(1)


def register_shapes(shape, member, skip_form, channels_last=1):
    c = shape[3] if channels_last else shape[1]
    skip = {"full": shape, "NC": (shape[0], c), "N11C": (shape[0], 1, 1, c)}[skip_form]
    shapes = {"X": shape, "gamma": (c,), "beta": (c,), "skip": skip}
    if member.startswith("bias"):
        shapes["bias"] = (c,)
    return shapes


def register_outputs(member):
    return ("Y", "S") if member.endswith("sum") else ("Y",)


def line_geometry(main, channels_last):
    """(units a line: positions or a channel's units, lanes a line) of a registers pass."""
    if channels_last:
        return main.values["spatial"], main.values["positionLanes"]
    return main.values["channelUnits"], main.values["channelLanes"]


def test_register_cases_meet_exact_and_partial_rows():
    """REGISTER_CASES and NCHW_REGISTER_CASES run both forms of the shader in both dtypes and both
    layouts: exactRow (a line's units are UNITS x lanes, so no load is clamped and no unit tested)
    and the general one; an exact case in each layout splits its rows over two workgroups (split as
    an override)."""
    seen = set()
    cases = [(1, c) for c in REGISTER_CASES] + [(0, c) for c in NCHW_REGISTER_CASES]
    for channels_last, (shape, groups, tunables, _, f16_geometry) in cases:
        for t in ("float32", "float16") if f16_geometry else ("float32",):
            shapes = register_shapes(shape, "bias_sum", "full", channels_last)
            attrs = {"groups": groups, "activation": 0, "channels_last": channels_last}
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
            line_units, lanes = line_geometry(main, channels_last)
            exact = line_units == int(held_units(main)) * lanes
            assert ("exact-row" in main.spec.split(".")[1]) == exact, (shape, t, main.spec)
            assert ("nchw" in main.spec.split(".")[1]) == (not channels_last), main.spec
            seen.add((channels_last, exact, t, main.overrides["split"]))
    assert {(c, e, t) for c, e, t, _ in seen} == {
        (c, e, t) for c in (0, 1) for e in (True, False) for t in ("float32", "float16")
    }, seen
    assert {(c, t) for c, e, t, split in seen if e and split == 2} == {
        (c, t) for c in (0, 1) for t in ("float32", "float16")
    }, seen


def run_register_case(shape, channels_last, groups, tunables, geometry, t, member, skip_form, request):
    rng, seed = rng_for(request.node.name)
    m = str(rng.choice(["float32", "float16"]))
    shapes = register_shapes(shape, member, skip_form, channels_last)
    attrs = {
        "groups": groups,
        "activation": int(rng.integers(0, 2)),
        "epsilon": float(rng.choice([1e-5, 1e-3])),
        "channels_last": channels_last,
    }
    outputs = register_outputs(member)
    variant = "registers"
    planned = dict(attrs=attrs, outputs=outputs, tunables=tunables, variant=variant, caps=SUBGROUP_CAPS)
    if geometry is None:  # f16 units are words of two halves: an odd H x W has none
        with pytest.raises(ContractError, match="sgRegCovered"):
            sgn.plan(shapes, {"T": t, "M": m}, **planned)
        return
    (main,) = sgn.plan(shapes, {"T": t, "M": m}, **planned).passes
    assert (main.workgroup_size, main.values["split"], held_units(main)) == geometry
    assert main.dispatch == (shape[0] * groups * geometry[1], 1, 1) and main.uses_subgroups
    inputs = random_inputs(rng, shapes, t, m, offset=rng.uniform(-3, 3))
    result = run_poisoned(inputs, attrs, outputs, tunables=tunables, variant=variant)
    check(
        result,
        inputs,
        attrs,
        f"{variant} {shape} g{groups} channels_last={channels_last} skip {skip_form} T={t} M={m} "
        f"{tunables} {seed_note(seed)}",
    )


@pytest.mark.parametrize("skip_form", ["full", "NC"])
@pytest.mark.parametrize("member", REGISTER_MEMBERS)
@pytest.mark.parametrize("t", ["float32", "float16"])
@pytest.mark.parametrize("shape,groups,tunables,f32_geometry,f16_geometry", REGISTER_CASES, ids=REGISTER_IDS)
def test_registers_against_float64_reference(
    shape, groups, tunables, f32_geometry, f16_geometry, t, member, skip_form, request
):
    """Channels-last: every member, both skip forms, f32 and f16 T (M drawn from both): tails of
    positions, spare bucket units, idle position lanes, 1-3 workgroups a row, a workgroup that is
    not a multiple of the subgroup width (one-by-one sums), the largest bucket; data away from zero."""
    geometry = f32_geometry if t == "float32" else f16_geometry
    run_register_case(shape, 1, groups, tunables, geometry, t, member, skip_form, request)


@pytest.mark.parametrize("t", ["float32", "float16"])
@pytest.mark.parametrize("case,member,skip_form", NCHW_PARAMS, ids=NCHW_IDS)
def test_nchw_registers_against_float64_reference(case, member, skip_form, t, request):
    """NCHW: every member with a skip shaped like X, (N, C) or (N, 1, 1, C), f32 and f16 T (M drawn
    from both): units of 16, 8 and 4 bytes, tails of a channel's units, spare bucket units, an idle
    lane, 1-3 workgroups a row (one storing nothing), odd channel counts a group, a workgroup that is
    not a multiple of the subgroup width, the largest bucket; f16 with an odd H x W is refused."""
    shape, groups, tunables, f32_geometry, f16_geometry = case
    geometry = f32_geometry if t == "float32" else f16_geometry
    run_register_case(shape, 0, groups, tunables, geometry, t, member, skip_form, request)


def test_nchw_register_params_cover_every_member_and_skip():
    for t in (0, 1):  # f32, f16 (which skips the cases it does not cover)
        ran = {(member, form) for c, member, form in NCHW_PARAMS if c[3 + t] is not None}
        assert ran == {(member, form) for member in REGISTER_MEMBERS for form in SKIP_FORMS}, (t, ran)


def in_layout(n, c, h, w, channels_last):
    """The X shape of (N, C, H, W) in its layout."""
    return (n, h, w, c) if channels_last else (n, c, h, w)


@LAYOUTS
@pytest.mark.parametrize("t", ["float32", "float16"])
def test_registers_every_split_gives_the_bits_of_one_workgroup(t, channels_last, request):
    """Every workgroup of a row takes the statistics of the whole row from the same loads in the
    same order: with 1, 2 or 3 workgroups a row, Y and S are the same bit for bit."""
    rng, seed = rng_for(request.node.name)
    x = in_layout(2, 40, 12, 10, channels_last)
    shapes = {"X": x, "gamma": (40,), "beta": (40,), "skip": x, "bias": (40,)}
    inputs = random_inputs(rng, shapes, t, "float32", offset=3.0)
    attrs = {"groups": 4, "activation": 1, "channels_last": channels_last}
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
    check(runs[0], inputs, attrs, f"split 1 channels_last={channels_last} {seed_note(seed)}")


# (channels_last, skip shape) for X of 2 items, 24 channels, 6 x 5 positions.
IDENTICAL_SKIPS = [
    (1, (2, 6, 5, 24)),
    (1, (2, 24)),
    (0, (2, 24, 6, 5)),
    (0, (2, 24)),
    (0, (2, 1, 1, 24)),
]


@pytest.mark.parametrize("t", ["float32", "float16"])
@pytest.mark.parametrize(
    "channels_last,skip_shape",
    IDENTICAL_SKIPS,
    ids=[f"{'nhwc' if c else 'nchw'}-skip-{'x'.join(map(str, s))}" for c, s in IDENTICAL_SKIPS],
)
def test_registers_y_is_bit_identical_with_and_without_s_and_repeatable(
    channels_last, skip_shape, t, request
):
    rng, seed = rng_for(request.node.name)
    x = in_layout(2, 24, 6, 5, channels_last)
    shapes = {"X": x, "gamma": (24,), "beta": (24,), "skip": skip_shape, "bias": (24,)}
    inputs = random_inputs(rng, shapes, t, "float16")
    attrs = {"groups": 3, "activation": 1, "channels_last": channels_last}
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
    check(with_s[0], inputs, attrs, f"registers channels_last={channels_last} {seed_note(seed)}")


@LAYOUTS
@pytest.mark.parametrize("t", ["float32", "float16"])
@pytest.mark.parametrize("split", [1, 2])
def test_registers_hostile_data(split, t, channels_last, request):
    """Means hundreds (f16: tens) of spreads from zero, and outliers at random places (one a group
    row of 1000 spreads, f16: 100): the two-pass statistics from registers neither cancel nor let the
    outliers' squares swamp the rest. (Outliers first, in the middle and last, and two clusters:
    tests/kernels/test_value_order.py.)"""
    rng, seed = rng_for(request.node.name)
    h, w = (7, 9) if channels_last else (7, 8)  # NCHW f16 needs an even H x W
    x_shape = in_layout(2, 32, h, w, channels_last)
    shapes = {"X": x_shape, "gamma": (32,), "beta": (32,), "skip": (2, 32), "bias": (32,)}
    inputs = random_inputs(rng, shapes, t, "float32", offset=300.0 if t == "float32" else 20.0)
    x = inputs["X"].astype(np.float64)
    # An outlier a (batch item, group) row, at a random position and channel of the group.
    for n in range(2):
        for g in range(4):
            at = int(rng.integers(0, h)), int(rng.integers(0, w)), g * 8 + int(rng.integers(0, 8))
            x[(n, *at) if channels_last else (n, at[2], at[0], at[1])] += (
                1000.0 if t == "float32" else 100.0
            ) * rng.choice([-1, 1])
    inputs["X"] = x.astype(t)
    if t == "float32":
        # Multiples of 2^-12 below 2^11: the sum is exact in f32, so S is the reference's and Y tests
        # the statistics alone (as test_data_far_from_zero does).
        for key in ("X", "skip", "bias"):
            inputs[key] = (np.round(inputs[key].astype(np.float64) * 4096) / 4096).astype(np.float32)
    attrs = {"groups": 4, "activation": 0, "channels_last": channels_last}
    tunables = {"REGISTER_SPLIT_MIN_VALUES": 1, "REGISTER_SPLIT": split}
    result = run_poisoned(inputs, attrs, ("Y", "S"), variant="registers", tunables=tunables)
    check(result, inputs, attrs, f"hostile registers split {split} {x_shape} {seed_note(seed)}")


@LAYOUTS
def test_registers_folded_dispatch_on_a_small_dispatch_limit(channels_last, request):
    """A device allowing 7 workgroups a dimension: 36 rows fold to (7, 6) (NCHW: units of one f32
    value, 15 positions)."""
    rng, seed = rng_for(request.node.name)
    x = in_layout(4, 36, 5, 3, channels_last)
    shapes = {"X": x, "gamma": (36,), "beta": (36,), "skip": x}
    inputs = random_inputs(rng, shapes, "float32", "float16")
    attrs = {"groups": 9, "activation": 1, "channels_last": channels_last}
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
    check(result, inputs, attrs, f"folded registers channels_last={channels_last} {seed_note(seed)}")


@LAYOUTS
def test_registers_small_device_limits(channels_last, request):
    """32 invocations a workgroup, 4612 bytes of workgroup memory: 32 invocation summaries, the 256
    subgroup slots and the flag (_lib/row_stats). (NCHW: 20 channels a group, so one lane a channel.)"""
    rng, seed = rng_for(request.node.name)
    x = in_layout(2, 80, 6, 6, channels_last)
    shapes = {"X": x, "gamma": (80,), "beta": (80,), "skip": (2, 80), "bias": (80,)}
    limits = {
        "maxComputeInvocationsPerWorkgroup": 32,
        "maxComputeWorkgroupSizeX": 32,
        "maxComputeWorkgroupStorageSize": 4612,
    }
    caps = {**SUBGROUP_CAPS, "limits": limits}
    attrs = {"groups": 4, "activation": 1, "channels_last": channels_last}
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
    check(result, inputs, attrs, f"small limits registers channels_last={channels_last} {seed_note(seed)}")


def test_registers_lanes_fit_workgroup_memory():
    """The lanes a line gets are capped by workgroup memory too (16 bytes an invocation and 4100 more),
    not only by the invocation cap: with 8192 bytes the 5 units of a 20-channel f16 group get 32
    positions (160 invocations), NCHW's 20 channels 8 lanes, instead of a 640-invocation workgroup
    that does not fit and left the row to fused."""
    caps = {**H200_CAPS, "limits": {**H200_CAPS.get("limits", {}), "maxComputeWorkgroupStorageSize": 8192}}
    assert registers_choice((1, 16, 16, 640), caps=caps) == ("registers", 160, 1, "8")
    assert registers_choice((1, 640, 16, 16), caps=caps, channels_last=0) == ("registers", 160, 1, "4")


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
    """bench.json's SDXL cases, on the H200's facts, both T: registers with 640 invocations and two
    workgroups a row for the 40960- and 20480-value rows, one for 10240. Channels-last: 5 x 128
    positions (f16 32x32x640: units of 4 halves), or 10 x 64 for 16x16x1280's f32 vec4 units; the
    64x64x320 f16 rows (10 channels a group: 4-byte units) take split unless
    REGISTER_MIN_UNIT_BYTES allows them. NCHW: channels a group x channelLanes (10 x 64, 20 x 32,
    40 x 16), 16-byte units of one channel in both T. The f32 64x64x320 rows need 64 words an
    invocation, over the 32 of REGISTER_MAX_UNITS (measured slower than split on an H100): split.
    Without subgroups every case keeps its split / fused variant."""
    over_budget = {((2, 64, 64, 320), "float32"), ((2, 320, 64, 64), "float32")}
    expected = {  # (X, T) -> (workgroup, split, UNITS)
        ((2, 64, 64, 320), "float16"): (640, 2, "32"),
        ((2, 32, 32, 640), "float16"): (640, 2, "8"),
        ((2, 32, 32, 640), "float32"): (640, 2, "8"),
        ((2, 16, 16, 1280), "float16"): (640, 1, "2"),
        ((2, 16, 16, 1280), "float32"): (640, 1, "4"),
        ((2, 320, 64, 64), "float16"): (640, 2, "8"),
        ((2, 640, 32, 32), "float16"): (640, 2, "4"),
        ((2, 640, 32, 32), "float32"): (640, 2, "8"),
        ((2, 1280, 16, 16), "float16"): (640, 1, "2"),
        ((2, 1280, 16, 16), "float32"): (640, 1, "4"),
    }
    for case in BENCH_CASES:
        shapes = {k: tuple(v) for k, v in case["inputs"].items()}
        outputs = tuple(case["outputs"])
        for t in case["dtypes"]["T"]:
            dtypes = {"T": t, "M": case["dtypes"]["M"][0]}
            narrow = shapes["X"] == (2, 64, 64, 320) and t == "float16"
            too_long = (shapes["X"], t) in over_budget
            default = sgn.plan(shapes, dtypes, attrs=case["attrs"], outputs=outputs, caps=H200_CAPS)
            assert default.variant == ("split" if narrow or too_long else "registers"), (
                case["name"],
                t,
                default.explanation,
            )
            p = sgn.plan(
                shapes,
                dtypes,
                attrs=case["attrs"],
                outputs=outputs,
                caps=H200_CAPS,
                tunables={"REGISTER_MIN_UNIT_BYTES": 4},
            )
            if too_long:
                assert "registers (priority 130): rejected: sgRegCovered" in p.explanation, case["name"]
                continue
            assert p.variant == "registers", (case["name"], t, p.explanation)
            (main,) = p.passes
            geometry = (main.workgroup_size, main.values["split"], held_units(main))
            assert geometry == expected[shapes["X"], t], (case["name"], t)
            assert main.dispatch == (64 * main.values["split"], 1, 1)
            assert ("nchw" in main.spec.split(".")[1]) == (not case["attrs"]["channels_last"])
            without = sgn.plan(shapes, dtypes, attrs=case["attrs"], outputs=outputs, caps=F16_CAPS)
            assert not without.variant == "registers", case["name"]


# NCHW test cases whose units fit but whose row does not: 32 channels a group get 16 lanes (their
# summaries, 16 bytes an invocation and 4100 more, must fit the 16384 bytes of workgroup memory these
# caps have, WebGPU's default), and 256 vec4 units a channel on 16 lanes are 64 words an invocation,
# over the 32-word register budget.
OVER_BUDGET = {"nchw-split-natural"}


def test_registers_take_the_test_cases_that_fit():
    """test.json's cases take registers on a device with subgroups where a unit of 8 bytes or more
    fits (channels-last: an even channel count a group, for f16 a multiple of 4; NCHW: an even H x W,
    for f16 a multiple of 4); odd groups (cpg 3, 1), odd or 2 (mod 4) H x W keep their split / fused
    variant, as do the OVER_BUDGET cases."""
    seen = set()
    for case in TEST_CASES:
        shapes = {k: tuple(v) for k, v in case["inputs"].items()}
        channels_last = case["attrs"].get("channels_last", 1) != 0
        n, c, hw = layout(shapes["X"], channels_last)
        cpg = c // case["attrs"]["groups"]
        outputs = tuple(case["outputs"])
        for t in case["dtypes"]["T"]:
            run = cpg if channels_last else hw
            fits = run % (2 if t == "float32" else 4) == 0 and case["name"] not in OVER_BUDGET
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
            seen.add((channels_last, t, p.variant == "registers"))
    assert seen == {
        (c, t, r) for c in (True, False) for t in ("float32", "float16") for r in (True, False)
    }, seen


def test_registers_selection_thresholds():
    """Taken where the row's words an invocation fit 4 x REGISTER_MAX_UNITS and rows x split fit
    SM_COUNT_PROXY; else the split / fused variants, as before."""
    registers = "registers"
    # f32 64x64x320: 32 vec2<f32> units an invocation are 64 words, over the 32-word budget (measured
    # slower than split on an H100); the budget cannot be raised past the largest bucket.
    assert registers_choice((2, 64, 64, 320), "float32") == "split"
    assert registers_choice((2, 64, 64, 320), "float32", tunables={"REGISTER_MAX_UNITS": 24}) == "split"
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
    assert registers_choice((3, 64, 64, 320), tunables={"SM_COUNT_PROXY": 192})[:3] == (registers, 640, 2)
    assert registers_choice((5, 64, 64, 320)) == "split"  # 160 rows: more than one wave
    assert registers_choice((16, 64, 64, 320)) == "fused"  # 512 rows
    # Over the register budget: 128 x 128 positions of 10 channels.
    assert registers_choice((2, 128, 128, 320)) == "split"
    # No subgroups; an odd number of channels a group; WebGPU's default 256 invocations.
    assert (
        registers_choice((2, 64, 64, 320), caps={"features": ["shader-f16"], "limits": H200_CAPS["limits"]})
        == "split"
    )
    assert registers_choice((2, 16, 16, 96), groups=32) == "fused"  # 3 channels a group
    # WebGPU's default 256 invocations: 5 x 32; 4096 positions would need 128 words, 1024 need 64:
    # both over the 32-word budget. 16 x 16 positions need 16 (units of 4 halves: 2 words).
    assert registers_choice((2, 64, 64, 320), caps=SUBGROUP_CAPS) == "split"
    assert registers_choice((2, 32, 32, 640), caps=SUBGROUP_CAPS) == "fused"
    assert registers_choice((2, 16, 16, 640), caps=SUBGROUP_CAPS) == (registers, 160, 1, "8")


def test_nchw_registers_selection_thresholds():
    """NCHW by the same rules: a row of 10 channels x 512 16-byte f16 units is 640 invocations of
    8 units; any channel count a group (3 gives 3 x 32); over the budget, past one wave, too many
    rows or a workgroup past the device (1280 channels a group) take split / fused."""
    nchw = {"channels_last": 0}
    assert registers_choice((2, 320, 64, 64), **nchw) == ("registers", 640, 2, "8")
    assert registers_choice((2, 320, 64, 64), "float32", **nchw) == "split"  # 16 vec4 units: 64 words
    assert registers_choice((2, 320, 64, 64), skip="NC", bias=False, outputs=("Y",), **nchw) == (
        "registers",
        640,
        2,
        "8",
    )
    assert registers_choice((3, 320, 64, 64), **nchw) == ("registers", 640, 1, "8")
    assert registers_choice((2, 96, 16, 16), **nchw) == ("registers", 96, 1, "2")  # 3 channels a group
    assert registers_choice((5, 320, 64, 64), **nchw) == "split"  # 160 rows: more than one wave
    assert registers_choice((16, 320, 64, 64), **nchw) == "fused"  # 512 rows
    assert registers_choice((2, 320, 128, 128), **nchw) == "split"  # 32 units of 4 words a lane
    assert registers_choice((1, 1280, 16, 16), groups=1, **nchw) == "split"  # 1280 lines
    assert registers_choice((2, 320, 63, 63), "float16", **nchw) == "split"  # odd H x W: no f16 unit
    no_subgroups = {"features": ["shader-f16"], "limits": H200_CAPS["limits"]}
    assert registers_choice((2, 640, 32, 32), caps=no_subgroups, **nchw) == "fused"
    # WebGPU's default 256 invocations: 10 x 16 lanes of 32 units, 20 x 8 of 16 (64 words: over the
    # budget); 20 x 8 lanes of 4 units for 16 x 16 positions.
    assert registers_choice((2, 320, 64, 64), caps=SUBGROUP_CAPS, **nchw) == "split"
    assert registers_choice((2, 640, 32, 32), caps=SUBGROUP_CAPS, **nchw) == "fused"
    assert registers_choice((2, 640, 16, 16), caps=SUBGROUP_CAPS, **nchw) == ("registers", 160, 1, "4")


def test_registers_demoted_for_narrow_units():
    """Units under REGISTER_MIN_UNIT_BYTES (8) put registers behind split / fused; wider units
    keep them first; a caller can still force them."""
    at_default = {"REGISTER_MIN_UNIT_BYTES": 8}
    assert registers_choice((2, 64, 64, 320), tunables=at_default) == "split"  # 2 halves a unit
    assert registers_choice((2, 32, 32, 320), "float32", tunables=at_default)[0] == "registers"  # vec2<f32>
    assert registers_choice((2, 32, 32, 640), tunables=at_default)[0] == "registers"  # 4 halves
    assert registers_choice((2, 64, 64, 320), tunables=at_default, variant="registers")[0] == "registers"
    # NCHW: H x W = 3906 (and 1922) is 2 (mod 4): 2 halves a unit; 961 is odd: one f32 value a unit.
    nchw = {"channels_last": 0, "tunables": at_default}
    assert registers_choice((2, 320, 63, 62), **nchw) == "split"
    assert registers_choice((2, 320, 31, 31), "float32", **nchw) == "fused"
    assert registers_choice((2, 320, 31, 62), "float32", **nchw)[0] == "registers"  # vec2<f32>
    assert registers_choice((2, 320, 31, 31), "float32", variant="registers", **nchw) == (
        "registers",
        640,
        1,
        "16",
    )


def test_registers_refusals_say_why():
    shapes = {"X": (2, 4, 4, 12), "gamma": (12,), "beta": (12,), "skip": (2, 4, 4, 12)}
    for t, caps, attrs, words in [
        ("float32", F16_CAPS, {}, "needs device feature subgroups"),
        ("float16", SUBGROUP_CAPS, {"channels_last": 0}, "sgRegCovered"),  # 3 x 3 positions
        ("float16", SUBGROUP_CAPS, {"groups": 4}, "sgRegCovered"),  # 3 channels a group
    ]:
        a = {"groups": 6, "activation": 0, **attrs}
        x = shapes["X"] if a.get("channels_last", 1) else (2, 12, 3, 3)
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
