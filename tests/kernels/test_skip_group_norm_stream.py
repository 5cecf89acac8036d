"""com.microsoft SkipGroupNorm `split_stream`: split's combine pass between a statistics pass and a
normalize pass that stream channels-last data in 16-byte units (templates/skip-group-norm-stream.wgsl.jinja).

The variant is a candidate awaiting a GPU measurement (docs/PERFORMANCE.md, open question 13): never
chosen by default, so every test here forces it. Checked against tests/oracles.py's float64 reference
(docs/TESTING.md's tolerances): the test.json cases it applies to, and geometries of its own where a
16-byte unit meets two groups (f16 with 10 or 12 channels a group, f32 with 6), with many slabs and
several lane rows, both skip forms, with and without a bias and S, f32 and f16; S bit-identical to
split's (the same rounded sum), Y bit-identical with and without S, repeated runs bit-identical, data
far from zero. Value-order patterns, f16 overflow and the device profiles run it from their own files
(test_value_order.py, test_f16_overflow.py, profile_cases.py).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from generated import ContractError
from generated import skip_group_norm as sgn
from generated.skip_group_norm.cases import BENCH_CASES, TEST_CASES
from tests.kernels.skip_group_norm_support import (
    F16_CAPS,
    H200_CAPS,
    check,
    flavour_for,
    random_inputs,
    run_poisoned,
)
from tests.oracles import assert_close, rng_for, seed_note

VARIANT = "split_stream"
MEMBERS = ("bias_sum", "bias_plain", "sum", "plain")


def applies(shapes, t, m, attrs, outputs, tunables=None, caps=F16_CAPS):
    """Whether split_stream takes the request when forced (no GPU)."""
    try:
        sgn.plan(
            shapes,
            {"T": t, "M": m},
            attrs=attrs,
            outputs=outputs,
            tunables=tunables,
            variant=VARIANT,
            caps=caps,
        )
    except ContractError:
        return False
    return True


# --- the test.json cases it applies to ------------------------------------------------------------------


def stream_cases():
    """(case, T, M) of test.json that split_stream applies to (channels-last, 16-byte units)."""
    return [
        (case, t, m)
        for case in TEST_CASES
        for t, m in itertools.product(case["dtypes"]["T"], case["dtypes"]["M"])
        if applies(
            {k: tuple(v) for k, v in case["inputs"].items()},
            t,
            m,
            case["attrs"],
            tuple(case["outputs"]),
            case.get("tunables"),
        )
    ]


CASE_PARAMS = stream_cases()


@pytest.mark.parametrize("case,t,m", CASE_PARAMS, ids=[f"{c['name']}-{t}-{m}" for c, t, m in CASE_PARAMS])
def test_cases_against_float64_reference(case, t, m, request):
    rng, seed = rng_for(request.node.name)
    shapes = {k: tuple(v) for k, v in case["inputs"].items()}
    inputs = random_inputs(rng, shapes, t, m, offset=rng.uniform(-2, 2))
    attrs = dict(case["attrs"])
    outputs = tuple(case["outputs"])
    result = run_poisoned(inputs, attrs, outputs, tunables=case.get("tunables"), variant=VARIANT)
    check(result, inputs, attrs, f"{case['name']} {VARIANT} T={t} M={m} {seed_note(seed)}")


# --- geometries of its own: units across two groups, many slabs, lane rows -------------------------------

# (X shape, groups, T, tunables): f16 units of 8 channels, f32 units of 4.
GEOMETRIES = [
    (
        (2, 6, 5, 40),
        4,
        "float16",
        {"SLAB_VALUES": 64, "WORKGROUP_SIZE": 16, "STREAM_WORKGROUP_SIZE": 16},
    ),  # 10 a group
    (
        (1, 9, 7, 96),
        8,
        "float16",
        {"SLAB_VALUES": 64, "WORKGROUP_SIZE": 16, "STREAM_WORKGROUP_SIZE": 64},
    ),  # 12 a group
    (
        (2, 5, 7, 24),
        4,
        "float32",
        {"SLAB_VALUES": 32, "WORKGROUP_SIZE": 16, "STREAM_WORKGROUP_SIZE": 32},
    ),  # 6 a group
    (
        (2, 8, 8, 64),
        8,
        "float32",
        {"SLAB_VALUES": 128, "WORKGROUP_SIZE": 64},
    ),  # 8 a group, the default workgroup
    ((1, 16, 16, 320), 32, "float16", {}),  # SDXL's channels: 40 columns, 6 lane rows
]
GEOMETRY_IDS = [f"{'x'.join(map(str, g[0]))}-g{g[1]}-{g[2]}" for g in GEOMETRIES]


def geometry_shapes(shape, full_skip, bias):
    n, c = shape[0], shape[3]
    shapes = {"X": shape, "gamma": (c,), "beta": (c,), "skip": shape if full_skip else (n, c)}
    if bias:
        shapes["bias"] = (c,)
    return shapes


@pytest.mark.parametrize("member", MEMBERS)
@pytest.mark.parametrize("skip_form", ["full", "NC"])
@pytest.mark.parametrize("shape,groups,t,tunables", GEOMETRIES, ids=GEOMETRY_IDS)
def test_geometries_against_float64_reference(shape, groups, t, tunables, skip_form, member, request):
    rng, seed = rng_for(request.node.name)
    shapes = geometry_shapes(shape, skip_form == "full", member.startswith("bias"))
    inputs = random_inputs(rng, shapes, t, "float16", offset=rng.uniform(-2, 2))
    attrs = {"groups": groups, "activation": int(rng.integers(0, 2))}
    outputs = ("Y", "S") if member.endswith("sum") else ("Y",)
    p = sgn.plan(
        shapes,
        {"T": t, "M": "float16"},
        attrs=attrs,
        outputs=outputs,
        tunables=tunables,
        variant=VARIANT,
        caps=F16_CAPS,
    )
    assert p.variant == VARIANT and p.passes[0].overrides["slabCount"] > 1, p.passes[0].overrides
    result = run_poisoned(inputs, attrs, outputs, tunables=tunables, variant=VARIANT)
    check(result, inputs, attrs, f"{VARIANT} {shape} g{groups} {skip_form} {member} {seed_note(seed)}")


def test_cases_and_geometries_cover_every_flavour_and_dtype():
    covered = {(flavour_for(VARIANT, "bias" in c["inputs"], c["outputs"]), t) for c, t, _ in CASE_PARAMS}
    covered |= {(f"{VARIANT}_{member}", g[2]) for g in GEOMETRIES for member in MEMBERS}
    wanted = {(f"{VARIANT}_{member}", t) for member in MEMBERS for t in ("float32", "float16")}
    assert wanted <= covered, sorted(wanted - covered)


# --- agreement with split, bit-identity ------------------------------------------------------------------


@pytest.mark.parametrize("skip_form", ["full", "NC"])
@pytest.mark.parametrize("shape,groups,t,tunables", GEOMETRIES, ids=GEOMETRY_IDS)
def test_agrees_with_split(shape, groups, t, tunables, skip_form, request):
    """The same rounded sum S, bit for bit (S is stored as it is formed); Y within T's tolerance of
    split's (the statistics are the same numbers summed in another order)."""
    rng, seed = rng_for(request.node.name)
    shapes = geometry_shapes(shape, skip_form == "full", True)
    inputs = random_inputs(rng, shapes, t, "float32", offset=rng.uniform(-2, 2))
    attrs = {"groups": groups, "activation": 1}
    stream = run_poisoned(inputs, attrs, ("Y", "S"), tunables=tunables, variant=VARIANT)
    split = run_poisoned(inputs, attrs, ("Y", "S"), tunables=tunables, variant="split")
    assert stream["S"].tobytes() == split["S"].tobytes(), seed_note(seed)
    assert_close(stream["Y"], split["Y"].astype(np.float64), np.dtype(t), f"vs split {seed_note(seed)}")


@pytest.mark.parametrize("skip_form", ["full", "NC"])
@pytest.mark.parametrize("shape,groups,t,tunables", GEOMETRIES, ids=GEOMETRY_IDS)
def test_y_is_bit_identical_with_and_without_s(shape, groups, t, tunables, skip_form, request):
    rng, seed = rng_for(request.node.name)
    shapes = geometry_shapes(shape, skip_form == "full", True)
    inputs = random_inputs(rng, shapes, t, "float32")
    attrs = {"groups": groups, "activation": 1}
    with_s = run_poisoned(inputs, attrs, ("Y", "S"), variant=VARIANT, tunables=tunables)
    without_s = run_poisoned(inputs, attrs, ("Y",), variant=VARIANT, tunables=tunables)
    assert with_s["Y"].tobytes() == without_s["Y"].tobytes(), f"Y depends on S {seed_note(seed)}"


@pytest.mark.parametrize("t", ["float16", "float32"])
def test_repeated_runs_are_bit_identical(t, request):
    rng, _ = rng_for(request.node.name)
    shapes = {"X": (2, 24, 20, 40), "gamma": (40,), "beta": (40,), "skip": (2, 24, 20, 40), "bias": (40,)}
    inputs = random_inputs(rng, shapes, t, "float16")
    attrs = {"groups": 4 if t == "float16" else 5, "activation": 1}
    runs = [
        run_poisoned(inputs, attrs, ("Y", "S"), variant=VARIANT, tunables={"SLAB_VALUES": 128})
        for _ in range(3)
    ]
    for key in ("Y", "S"):
        assert all(r[key].tobytes() == runs[0][key].tobytes() for r in runs[1:]), key


@pytest.mark.parametrize("t", ["float32", "float16"])
def test_data_far_from_zero(t, request):
    """Means hundreds (f16: tens) of spreads from zero: each part's block shift is its own first
    value, so nothing cancels."""
    rng, seed = rng_for(request.node.name)
    shape = (2, 7, 9, 40)
    shapes = {"X": shape, "gamma": (40,), "beta": (40,), "skip": (2, 40), "bias": (40,)}
    inputs = random_inputs(rng, shapes, t, "float32", offset=300.0 if t == "float32" else 20.0)
    if t == "float32":
        # Exact f32 sums (multiples of 2^-12 below 2^11), as in test_skip_group_norm.py.
        for key in ("X", "skip", "bias"):
            inputs[key] = (np.round(inputs[key].astype(np.float64) * 4096) / 4096).astype(np.float32)
    attrs = {"groups": 4, "activation": 0}
    result = run_poisoned(inputs, attrs, ("Y", "S"), variant=VARIANT, tunables={"SLAB_VALUES": 64})
    check(result, inputs, attrs, f"far from zero {VARIANT} {seed_note(seed)}")


@pytest.mark.parametrize("shape,groups,t,tunables", GEOMETRIES, ids=GEOMETRY_IDS)
def test_each_value_takes_its_own_groups_statistics(shape, groups, t, tunables, request):
    """Neighbouring groups far apart (means tens of spreads apart, spreads 1 and 8): a value of a
    unit that meets two groups normalized with the other group's statistics would be off by far
    more than the tolerance, in the statistics pass (its part) and in the normalize pass (its
    selected mean and scale)."""
    rng, seed = rng_for(request.node.name)
    shapes = geometry_shapes(shape, True, True)
    inputs = random_inputs(rng, shapes, t, "float32")
    group_of_channel = np.arange(shape[3]) // (shape[3] // groups)
    offsets = np.where(group_of_channel % 2 == 0, 1.0, -1.0) * (10.0 + 5.0 * group_of_channel)
    spreads = np.where(group_of_channel % 2 == 0, 1.0, 8.0)
    x = rng.standard_normal(shape) * spreads + offsets
    inputs["X"] = x.astype(t)
    attrs = {"groups": groups, "activation": 0}
    for outputs in (("Y", "S"), ("Y",)):
        result = run_poisoned(inputs, attrs, outputs, tunables=tunables, variant=VARIANT)
        check(result, inputs, attrs, f"groups apart {VARIANT} {shape} g{groups} {outputs} {seed_note(seed)}")


# --- selection: never the default --------------------------------------------------------------------------


@pytest.mark.parametrize("caps", [F16_CAPS, H200_CAPS], ids=["f16", "h200"])
def test_never_chosen_by_default(caps):
    for case in [*TEST_CASES, *BENCH_CASES]:
        shapes = {k: tuple(v) for k, v in case["inputs"].items()}
        outputs = tuple(case.get("outputs", ("Y",)))
        for t in ("float32", "float16"):
            p = sgn.plan(
                shapes,
                {"T": t, "M": t},
                attrs=case["attrs"],
                outputs=outputs,
                tunables=case.get("tunables"),
                caps=caps,
            )
            assert p.variant != VARIANT, (case["name"], p.explanation)


def test_refuses_what_it_cannot_stream():
    """NCHW, fewer channels a group than a unit holds, channels not in whole units."""
    base = {"gamma": (32,), "beta": (32,)}
    nchw = {**base, "X": (2, 32, 4, 4), "skip": (2, 32, 4, 4)}
    assert not applies(nchw, "float32", "float32", {"groups": 4, "activation": 0, "channels_last": 0}, ("Y",))
    nhwc = {**base, "X": (2, 4, 4, 32), "skip": (2, 32)}
    assert not applies(nhwc, "float16", "float16", {"groups": 8, "activation": 0}, ("Y",))  # 4 < 8 a unit
    assert applies(nhwc, "float32", "float32", {"groups": 8, "activation": 0}, ("Y",))  # 4 = 4 a unit
    odd = {"gamma": (36,), "beta": (36,), "X": (2, 4, 4, 36), "skip": (2, 36)}
    assert not applies(odd, "float16", "float16", {"groups": 2, "activation": 0}, ("Y",))  # 72 bytes
