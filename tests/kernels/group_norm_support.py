"""What the GroupNormalization-21 tests share (tests/kernels/test_group_normalization*.py, and the
runtime's and profile tests that run GroupNormalization): random inputs, poisoned calls, plans, the
float64 reference; the stash_type=10 check (`assert_close_f16_stage`) and its references; device caps;
and what a row-in-registers shader holds (its unit bucket, and how a row fills it).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from generated import group_normalization as gn
from tests.device_helpers import poisoned_call
from tests.oracles import TOLERANCES, group_normalization_ref

F16_CAPS = {"features": ["shader-f16"]}
NO_F16_CAPS = {"features": []}
# Several splits on small rows: one split per 64 values, and no minimum row length.
SMALL_SPLITS = {"STATS_VALUES_PER_SPLIT": 64, "SPLIT_STATS_MIN_HIDDEN": 1}
DTYPES = pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
SPLIT_VARIANTS = ("group_splitk", "group_splitk_vec4", "group_splitk_vec4_pairs")
VEC4_SPLIT_VARIANTS = ("group_splitk_vec4", "group_splitk_vec4_pairs")  # need spatial % 4 == 0


def random_inputs(rng, shape, dtype, offset=1.0):
    """X with a random spread and a mean of up to `offset` spreads away from zero; scale and bias per channel."""
    channels = shape[1]
    spread = rng.uniform(0.5, 3.0)
    mean = rng.uniform(-1.0, 1.0) * offset * spread
    return {
        "x": (rng.standard_normal(shape) * spread + mean).astype(dtype),
        "scale": rng.uniform(-2, 2, channels).astype(dtype),
        "bias": rng.uniform(-1, 1, channels).astype(dtype),
    }


def run_poisoned(inputs, **kwargs):
    return poisoned_call(gn, inputs, **kwargs)["y"]


def plan_for(inputs, attrs, **kwargs):
    shapes = {k: v.shape for k, v in inputs.items()}
    return gn.plan(shapes, {"T": inputs["x"].dtype.name}, attrs=attrs, **kwargs)


def reference(inputs, attrs):
    return group_normalization_ref(inputs["x"], inputs["scale"], inputs["bias"], **attrs)


def per_channel(values, ndim):
    return np.asarray(values, np.float64).reshape((1, -1) + (1,) * (ndim - 2))


def assert_close_f16_stage(actual, ref, normalized, scale, dtype, context, extra=0.0):
    """stash_type=10: docs/TESTING.md's float16 tolerance on the normalized values, plus T's on the result.

    The function body computes the normalized values in float16 (X cast to f16, Mean, Var, StdDev,
    Deviation and their quotient each rounded to f16) and casts them back to T before scale and
    bias. The kernel rounds at the same points, but its statistics are f32 sums of the f16 values
    (exact variance, no overflow) where the body's are f16 E[x^2] - E[x]^2: Mean and StdDev may land
    on neighbouring f16 values, which moves a normalized value by a few f16 ulps. That is an f16
    computation the spec prescribes, so the f16 tolerance 2e-3 + 2e-3 |n| applies to the normalized
    value n (relative 2e-3 is 2 to 4 ulps of f16), and through `scale` it reaches Y: allowed
    |Y - ref| <= atol_T + rtol_T |ref| + |scale| (2e-3 + 2e-3 |n| + extra). For f32 tensors this is
    looser than the f32 tolerance only by the f16 stage's own error; the final scale and bias stage
    keeps T's tolerance. `extra` is a per-row allowance a caller justifies (see its use).
    """
    actual = np.asarray(actual, np.float64)
    assert actual.shape == ref.shape, context
    atol, rtol = TOLERANCES[np.dtype(dtype)]
    scale = np.abs(per_channel(scale, actual.ndim))
    allowed = atol + rtol * np.abs(ref) + scale * (2e-3 + 2e-3 * np.abs(normalized) + extra)
    ok = np.abs(actual - ref) <= allowed
    if ok.all():
        return
    excess = np.where(ok, -1.0, np.nan_to_num(np.abs(actual - ref) / allowed, nan=np.inf))
    worst = np.unravel_index(np.argmax(excess), ref.shape)
    raise AssertionError(
        f"{context}: {np.count_nonzero(~ok)} of {ref.size} elements out of the f16-stage tolerance; worst at "
        f"{tuple(int(i) for i in worst)}: actual {actual[worst]!r}, expected {ref[worst]!r}, normalized {normalized[worst]!r}, "
        f"allowed {allowed[worst]:.3g}"
    )


def spec_normalized(inputs, attrs):
    """The reference's normalized (f16-stage, cast back to T) values: the reference with scale 1 and bias 0."""
    x = inputs["x"]
    ones, zeros = np.ones(x.shape[1], x.dtype), np.zeros(x.shape[1], x.dtype)
    return group_normalization_ref(x, ones, zeros, **attrs)


def half(values):
    """Round to float16 like the kernel: a value float16 cannot hold (|v| >= 65520) is kept, not made infinite."""
    values = np.asarray(values, np.float64)
    with np.errstate(over="ignore"):
        return np.where(np.abs(values) < 65520, values.astype(np.float16).astype(np.float64), values)


def stash16_exact_statistics_ref(x, scale, bias, num_groups, epsilon=1e-5):
    """The GroupNormalization-21 body for stash_type=10, every f16 value rounded where the body rounds
    it, but with Mean and Var computed exactly (float64) before their rounding and no f16 overflow:
    what the kernel promises where the body's own f16 E[x^2] - E[x]^2 cancels or overflows.
    Returns (Y, normalized, per-row allowance for Mean landing on a neighbouring f16 value)."""
    n = x.shape[0]
    rows = half(x).reshape(n, num_groups, -1)
    mean = half(rows.mean(axis=2, keepdims=True))
    std = half(np.sqrt(half(half(rows.var(axis=2, keepdims=True)) + half(np.float32(epsilon)))))
    normalized = half(half(rows - mean) / std)
    normalized = normalized.reshape(x.shape).astype(x.dtype).astype(np.float64)
    # The kernel's f32 Mean may round to the f16 neighbour of the exact mean's rounding: one ulp
    # of Mean, divided by StdDev, in normalized units.
    mean_ulp = np.spacing(np.abs(mean).astype(np.float16)).astype(np.float64) / std
    mean_ulp = np.broadcast_to(mean_ulp, rows.shape).reshape(x.shape)
    return per_channel(scale, x.ndim) * normalized + per_channel(bias, x.ndim), normalized, mean_ulp


SUBGROUP_CAPS = {"features": ["shader-f16", "subgroups"]}
# The H200's facts as wgpu reports them: subgroups, 1024 invocations a workgroup.
H200_CAPS = {
    **SUBGROUP_CAPS,
    "limits": {"maxComputeInvocationsPerWorkgroup": 1024, "maxComputeWorkgroupSizeX": 1024},
}
SPLIT_SHORT_ROWS = {"REGISTER_SPLIT_MIN_HIDDEN": 1}


def held_units(pass_plan):
    """The unit bucket a row-registers shader (group_row_registers, plane_row_registers) was
    specialized for (its UNITS constant)."""
    return re.search(r"const UNITS: u32 = (\d+)u;", pass_plan.wgsl).group(1)


def bucket_fill(pass_plan):
    """The fill a row-registers shader was specialized for: the first word of its spec's key."""
    return pass_plan.spec.split(".")[1].split("-")[0]


def expected_fill(row_units, workgroup, bucket):
    """How a row fills its unit bucket, from the definition: "exact" when it is `bucket` whole
    sweeps of the workgroup, "last" when the bucket is the row's own ceil(row / workgroup) units
    (so only an invocation's last unit can lie past the row), else "any"."""
    needed = -(-row_units // workgroup)
    if needed != bucket:
        return "any"
    return "exact" if row_units == needed * workgroup else "last"
