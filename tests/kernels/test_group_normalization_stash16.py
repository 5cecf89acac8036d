"""GroupNormalization-21's group_stash_f16_serial (stash_type=10): the ONNX function body with its
normalization stage in float16, judged by tests/kernels/group_norm_support.py's
`assert_close_f16_stage` (the tolerance, and why it is looser than docs/TESTING.md's), against the
spec's reference, onnxruntime and the body with exact statistics where the body's own f16 statistics
cancel or overflow; its float32 shader needs no shader-f16; folded dispatches.

Every case runs on the wgpu device (Mesa's software Vulkan in CI) with fresh random inputs per run
(the seed is printed on failure) and NaN-poisoned outputs, against tests/oracles.py's
group_normalization_ref with docs/TESTING.md tolerances.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from generated import ContractError
from generated import group_normalization as gn
from tests.kernels.group_norm_support import (
    F16_CAPS,
    NO_F16_CAPS,
    assert_close_f16_stage,
    half,
    per_channel,
    plan_for,
    random_inputs,
    reference,
    run_poisoned,
    spec_normalized,
    stash16_exact_statistics_ref,
)
from tests.oracles import group_normalization_ref, onnxruntime_run, rng_for, seed_note


# --- group_stash_f16_serial (stash_type=10) -----------------------------------------------------------


# The body's own f16 statistics are only trustworthy where E[x^2] - E[x]^2 does not cancel (mean
# within a tenth of a spread of zero) and the f16 sum of squares cannot overflow (<= 4096 values).
STASH_CASES = [
    ((2, 6, 5, 7), 3),
    ((3, 5, 13), 5),  # num_groups == C
    ((2, 5, 13), 1),
    ((1, 6, 4, 5, 9), 2),  # rank 5
    ((2, 7, 9, 11), 7),
    ((1, 8, 16, 32), 2),  # 4096 values a row
]
STASH_DEVICES = [
    ("f32", np.float32, F16_CAPS),
    ("f32-no-shader-f16", np.float32, NO_F16_CAPS),
    ("f16", np.float16, F16_CAPS),
]


@pytest.mark.parametrize("label,dtype,caps", STASH_DEVICES, ids=[d[0] for d in STASH_DEVICES])
@pytest.mark.parametrize("shape,num_groups", STASH_CASES, ids=[f"{s}-g{g}" for s, g in STASH_CASES])
def test_stash16_against_spec_reference_and_onnxruntime(shape, num_groups, label, dtype, caps, request):
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, shape, dtype, offset=0.1)
    attrs = {"num_groups": num_groups, "stash_type": 10, "epsilon": float(rng.choice([1e-5, 1e-3, 0.1]))}
    p = plan_for(inputs, attrs, caps=caps)
    assert p.variant == "group_stash_f16_serial"
    assert p.passes[0].dispatch == (shape[0] * num_groups, 1, 1)
    actual = run_poisoned(inputs, attrs=attrs, caps=caps)
    context = f"stash 10 {label} {shape} {attrs} {seed_note(seed)}"
    assert_close_f16_stage(
        actual, reference(inputs, attrs), spec_normalized(inputs, attrs), inputs["scale"], dtype, context
    )
    ort = dict(zip(("X", "scale", "bias"), inputs.values()))
    (expected,) = onnxruntime_run("GroupNormalization", ort, attrs, opset=21)
    assert_close_f16_stage(
        actual,
        expected.astype(np.float64),
        spec_normalized(inputs, attrs),
        inputs["scale"],
        dtype,
        context + " vs onnxruntime",
    )


STASH_HARD_CASES = [
    # (name, shape, num_groups, make X): X far from zero, where the body's f16 E[x^2] - E[x]^2 cancels;
    # X ~ 1e4 with a variance far over the f16 maximum (65504), where X * X overflows;
    # 65536 values a row of spread 2, where the f16 sum of squares (about 262144) overflows.
    ("offset", (2, 4, 9, 11), 2, lambda rng, shape: rng.standard_normal(shape) + 100.0),
    ("large", (2, 6, 16, 16), 3, lambda rng, shape: rng.uniform(-2e4, 3e4, shape)),
    ("long-row", (1, 4, 128, 128), 1, lambda rng, shape: rng.standard_normal(shape) * 2.0),
]


@pytest.mark.parametrize("label,dtype,caps", STASH_DEVICES, ids=[d[0] for d in STASH_DEVICES])
@pytest.mark.parametrize(
    "name,shape,num_groups,make_x", STASH_HARD_CASES, ids=[c[0] for c in STASH_HARD_CASES]
)
def test_stash16_statistics_do_not_cancel_or_overflow(
    name, shape, num_groups, make_x, label, dtype, caps, request
):
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, shape, dtype)
    inputs["x"] = make_x(rng, shape).astype(dtype)
    attrs = {"num_groups": num_groups, "stash_type": 10}
    actual = run_poisoned(inputs, attrs=attrs, caps=caps)
    assert np.isfinite(actual).all()
    ref, normalized, mean_ulp = stash16_exact_statistics_ref(
        inputs["x"], inputs["scale"], inputs["bias"], num_groups
    )
    context = f"stash 10 {name} {label} {shape} {seed_note(seed)}"
    assert_close_f16_stage(actual, ref, normalized, inputs["scale"], dtype, context, extra=mean_ulp)
    # The same normalization, exact: only the f16 stage's rounding separates the two.
    exact = group_normalization_ref(
        inputs["x"].astype(np.float16), inputs["scale"], inputs["bias"], num_groups
    )
    assert_close_f16_stage(
        actual, exact, normalized, inputs["scale"], dtype, context + " vs exact", extra=mean_ulp
    )
    if name != "offset":
        # Where the body's f16 statistics overflow, its literal result collapses to Y = bias.
        with np.errstate(over="ignore", invalid="ignore"):
            literal = reference(inputs, attrs)
        collapsed = np.broadcast_to(per_channel(inputs["bias"], len(shape)), literal.shape)
        assert not np.isfinite(literal).all() or np.allclose(literal, collapsed)


def test_stash16_rounds_where_the_body_rounds(request):
    """What the f16-stage tolerance cannot see: with scale 1 and bias 0, Y is the kernel's
    NormalizedU cast to T, so for f32 tensors every value must be an f16 value; and the f32 shader
    (no shader-f16, rounding emulated) must give bit for bit what the f16 shader gives on the same
    f16-representable data, and the same as on f32 data that rounds to those f16 values (XU = Cast<f16>(X)).
    """
    rng, seed = rng_for(request.node.name)
    shape = (2, 6, 5, 7)
    x32 = random_inputs(rng, shape, np.float32)["x"]
    x16 = x32.astype(np.float16)
    attrs = {"num_groups": 3, "stash_type": 10, "epsilon": 1e-3}
    results = {}
    for label, dtype, caps in STASH_DEVICES:
        ones, zeros = np.ones(shape[1], dtype), np.zeros(shape[1], dtype)
        results[label] = run_poisoned(
            {"x": x16.astype(dtype), "scale": ones, "bias": zeros}, attrs=attrs, caps=caps
        )
    for label in ("f32", "f32-no-shader-f16"):
        normalized = results[label]
        assert np.array_equal(
            normalized.astype(np.float16).astype(np.float32), normalized
        ), f"{label}: not f16 values {seed_note(seed)}"
        assert np.array_equal(
            normalized, results["f16"].astype(np.float32)
        ), f"{label} differs from the f16 shader {seed_note(seed)}"
    ones, zeros = np.ones(shape[1], np.float32), np.zeros(shape[1], np.float32)
    unrounded = run_poisoned({"x": x32, "scale": ones, "bias": zeros}, attrs=attrs, caps=NO_F16_CAPS)
    assert np.array_equal(unrounded, results["f32"]), f"X is not cast to f16 first {seed_note(seed)}"


def _unambiguous_offset_row(rng, size):
    """f16 values around 100 (where the body's own f16 E[x^2] - E[x]^2 is meaningless) whose exact
    Mean, Var and StdDev each sit at least a tenth of an f16 ulp from a rounding midpoint, so every
    correct f32 implementation rounds them to the same f16 values; and whose Mean and StdDev sit at
    least a quarter ulp from their f16 values, so that skipping either rounding shows."""
    eps16 = half(np.float32(1e-5))

    def ulps(value, to):
        return abs(value - to) / np.spacing(np.float16(to))

    for _ in range(1000):
        row = half(rng.standard_normal(size) * rng.uniform(0.5, 2.0) + 100.0)
        mean, var = row.mean(), row.var()
        std = np.sqrt(half(half(var) + eps16))
        if all(0.1 <= ulps(v, half(v)) <= 0.4 for v in (mean, var, std)):
            if ulps(mean, half(mean)) >= 0.25 and ulps(np.sqrt(var), half(std)) >= 0.25:
                return row
    raise AssertionError("no row found")


@pytest.mark.parametrize("label,dtype,caps", STASH_DEVICES, ids=[d[0] for d in STASH_DEVICES])
def test_stash16_matches_the_body_to_one_ulp_where_its_statistics_are_unambiguous(
    label, dtype, caps, request
):
    """Where Mean, Var and StdDev round unambiguously, the kernel's normalized values are the body's
    (with exact statistics) up to one f16 ulp (the last division's rounding). The f16-stage
    tolerance elsewhere could hide a missing rounding of Mean or StdDev; here an unrounded Mean moves
    values by many ulps, and an unrounded StdDev scales a whole row."""
    rng, seed = rng_for(request.node.name)
    shape = (2, 4, 8, 16)  # two groups of 256 values per batch item
    x = np.stack([_unambiguous_offset_row(rng, 256) for _ in range(4)]).reshape(shape).astype(dtype)
    ones, zeros = np.ones(4, dtype), np.zeros(4, dtype)
    actual = run_poisoned(
        {"x": x, "scale": ones, "bias": zeros}, attrs={"num_groups": 2, "stash_type": 10}, caps=caps
    )
    _, expected, _ = stash16_exact_statistics_ref(x, ones, zeros, 2)
    ulps = np.abs(actual.astype(np.float64) - expected) / np.spacing(
        np.abs(expected).astype(np.float16)
    ).astype(np.float64)
    assert (
        ulps.max() <= 1.0
    ), f"{label}: {ulps.max()} f16 ulps off at {np.unravel_index(np.argmax(ulps), shape)} {seed_note(seed)}"
    # An unrounded StdDev scales a row by 1 + (at least 1.2e-4); the final rounding alone gives
    # relative differences averaging 0 +- 1.1e-5 over the row's ~150 values with |n| > 0.5.
    for k, (a, e) in enumerate(zip(actual.reshape(4, -1).astype(np.float64), expected.reshape(4, -1))):
        big = np.abs(e) > 0.5
        bias = np.mean((a[big] - e[big]) / e[big])
        assert (
            abs(bias) < 6e-5
        ), f"{label}: row {k} scaled by 1 + {bias:.2g}: StdDev not rounded to f16? {seed_note(seed)}"


def test_stash16_f32_shader_does_not_need_shader_f16():
    shapes = {"x": (2, 6, 5), "scale": (6,), "bias": (6,)}
    p = gn.plan(shapes, {"T": "float32"}, attrs={"num_groups": 3, "stash_type": 10}, caps=NO_F16_CAPS)
    assert p.variant == "group_stash_f16_serial"
    (main,) = p.passes
    # The shader's notes (// comments) may name f16; its code must not.
    code = re.sub(r"//[^\n]*", "", main.wgsl)
    assert not re.search(r"\bf16\b", code) and "round(v / q)" in code
    assert main.workgroup_size == 256  # the WebGPU default limit
    f16 = gn.plan(shapes, {"T": "float16"}, attrs={"num_groups": 3, "stash_type": 10}, caps=F16_CAPS)
    assert "enable f16;" in f16.passes[0].wgsl
    with pytest.raises(ContractError, match=r"f16Ok\(dtypes.T\)"):
        gn.plan(shapes, {"T": "float16"}, attrs={"num_groups": 3, "stash_type": 10}, caps=NO_F16_CAPS)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_stash16_folded_dispatch(dtype, request):
    """30 rows on a device allowing 7 workgroups a dimension: (7, 5, 1) workgroups, 5 of them past the rows."""
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, (5, 6, 3, 7), dtype, offset=0.1)
    caps = {**F16_CAPS, "limits": {"maxComputeWorkgroupsPerDimension": 7}}
    attrs = {"num_groups": 6, "stash_type": 10}
    assert plan_for(inputs, attrs, caps=caps).passes[0].dispatch == (7, 5, 1)
    actual = run_poisoned(inputs, attrs=attrs, caps=caps)
    context = f"stash 10 folded {seed_note(seed)}"
    assert_close_f16_stage(
        actual, reference(inputs, attrs), spec_normalized(inputs, attrs), inputs["scale"], dtype, context
    )
