"""com.microsoft SkipGroupNorm's registers variant (issue 12): a channels-last row in registers,
subgroupAdd sums, at lavapipe's subgroup width 8, including workgroups that are not a multiple of it
(tests/kernels/profile_cases.py runs them at width 4 too): every member (with and without a bias and
S), exact and partial rows, every split giving the bits of one workgroup, hostile data, folded
dispatches, small device limits, selection on the bench and test cases, refusals.

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
        if not case["attrs"]["channels_last"]:  # registers is channels-last only
            assert default.variant != "registers", case["name"]
            continue
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
