"""float32 rows whose squared deviations pass float32's range normalize to the bias, in every
variant that takes statistics (README: "Statistics are float32, as in ONNX Runtime's CPU kernels").

A summary's M2 is s2 minus the shift's share, clamped at 0; where s2 overflowed that difference
can be inf - inf = NaN, and WGSL leaves max(NaN, 0.0) to the device (lavapipe gives 0): the row's
spread was dropped and Y came back as (x - mean) / sqrt(epsilon), values of 1e21 to 1e33 (an
adversarial audit found it). Now M2 is +inf there, the variance inf and Y the bias exactly. The
other batch item's rows are untouched and still match the float64 reference.
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pytest

from tests.kernels import profile_cases
from tests.oracles import assert_close, run_seed, seed_note

# stash_type=10 takes float16 statistics, as the spec says: values this large are beyond them.
CASES = [
    c
    for c in profile_cases.all_cases()
    if profile_cases.BIAS_KEY.get(c.op) in c.shapes  # an offset to normalize to (the RMS forms have none)
    and c.dtypes["T"] == "float32"
    and c.dtypes.get("M", "float32") == "float32"
    and c.attrs.get("stash_type") != 10
]
PATTERNS = {
    # Three of four values at 2e19: s2 = 1.2e39 in every block, while s1 * q stays finite or not.
    "0-2e19-2e19-2e19": lambda rng, shape: np.resize(np.array([0.0, 2e19, 2e19, 2e19]), shape),
    "random-1e30": lambda rng, shape: rng.standard_normal(shape) * 1e30,
}


@pytest.mark.parametrize("pattern", sorted(PATTERNS))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_rows_beyond_float32_squares_normalize_to_the_bias(case, pattern):
    device, caps = profile_cases.device_for(case)
    seed = run_seed()
    rng = np.random.default_rng([seed, zlib.crc32(f"f32-overflow/{case.id}/{pattern}".encode())])
    inputs = profile_cases.random_inputs(case, rng)
    key = next(iter(inputs))
    x = inputs[key].astype(np.float64)
    x[0] = PATTERNS[pattern](rng, x[0].shape)  # every row of batch item 0
    inputs[key] = x.astype(np.float32)
    if "skip" in inputs:  # the rows X holds, unchanged by the residual
        inputs["skip"] = np.zeros_like(inputs["skip"])
        if "bias" in inputs:
            inputs["bias"] = np.zeros_like(inputs["bias"])
    microsoft = case.op in profile_cases.MICROSOFT_GROUP_OPS
    attrs = {**case.attrs, "activation": 0} if microsoft else case.attrs
    case = dataclasses.replace(case, attrs=attrs)
    result = profile_cases.call_case(case, inputs, device, caps)
    first = profile_cases.PACKAGES[case.op].OUTPUTS[0].key
    got = np.asarray(result[first], np.float64)
    bias = np.asarray(inputs[profile_cases.BIAS_KEY[case.op]], np.float64)
    expected_bias = np.broadcast_to(
        bias if profile_cases.channel_axis(case) == -1 else bias.reshape((-1,) + (1,) * (got.ndim - 2)),
        got[0].shape,
    )
    context = f"{case.id} {pattern} {case.shapes} {case.tunables} {seed_note(seed)}"
    np.testing.assert_array_equal(got[0], expected_bias, err_msg=f"{context}: batch item 0 is not the bias")
    if got.shape[0] > 1:
        reference = profile_cases.reference(case, inputs)[first]
        assert_close(got[1:], reference[1:], np.float32, f"{context}: the other batch items")


# The subgroup combine (the subgroup_id path) took a subgroup's mean from the sum of n_i hi_i and
# the workgroup's from the sum of n_k mean_k: for a row of n |x| > 3.4e38 those sums overflow, so a
# constant row (variance 0, Y = bias) came back NaN (an adversarial audit found it). Now both are
# weighted means, whose partial sums stay within the largest |mean|.
SUBGROUP_COMBINE = {"features": ["subgroups", "shader-f16"], "wgslLanguageFeatures": ["subgroup_id"]}
CONSTANT_ROW_CASES = [
    ("instance_normalization", "plane_subgroup", (1, 2, 64, 64), {}),
    ("instance_normalization", "plane_subgroup_vec4", (1, 2, 64, 64), {}),
    ("group_normalization", "group_subgroup", (1, 8, 64, 64), {"num_groups": 2}),
    ("group_normalization", "group_subgroup_vec4", (1, 8, 64, 64), {"num_groups": 2}),
]


@pytest.mark.parametrize("op,variant,shape,attrs", CONSTANT_ROW_CASES, ids=[c[1] for c in CONSTANT_ROW_CASES])
def test_constant_rows_whose_sum_passes_float32_normalize_to_the_bias(op, variant, shape, attrs):
    """Rows of 4096 / 16384 values all 1e35 (their sum is 4e38 / 1.6e39): variance 0, so Y is the
    bias in float64 and in every variant; the other batch item's values are ordinary."""
    import importlib

    package = importlib.import_module(f"generated.{op}")
    rng = np.random.default_rng(run_seed())
    x = rng.standard_normal((2,) + shape[1:]).astype(np.float32)
    x[0] = 1e35
    c = shape[1]
    bias = rng.uniform(-1, 1, c).astype(np.float32)
    keys = ("input", "scale", "b") if op == "instance_normalization" else ("x", "scale", "bias")
    inputs = dict(zip(keys, (x, rng.uniform(0.5, 1.5, c).astype(np.float32), bias)))
    result = next(iter(package.kernel(inputs, attrs=attrs, variant=variant, caps=SUBGROUP_COMBINE).values()))
    np.testing.assert_array_equal(
        result[0],
        np.broadcast_to(bias[:, None, None], result[0].shape),
        err_msg=f"{variant} {seed_note(run_seed())}",
    )
    assert np.isfinite(result[1]).all(), variant
