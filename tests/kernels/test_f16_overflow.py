"""float16 outputs beyond float16's range come back as infinities of the right sign, in every
variant with a float16 path (all but plane_subgroup_vec4_scalar_io, float32 only, and
group_stash_f16_serial, whose stash_type=10 statistics are float16 by the spec: it overflows inside).

WGSL leaves the float16 conversion of an out-of-range value (pack2x16float, an f16 store) to the
device: an indeterminate value, not necessarily infinity. The kernels convert the f32 result once, as
NumPy's float16 cast would, so a device that rounds out-of-range values to infinity (lavapipe; the
H200's driver) gives exactly what the float64 reference rounded to float16 gives. These tests pin
that for every variant's f16 path (8-halves loads, packed pairs, scalar f16 stores), with the
variant forced on the small request tests/kernels/profile_cases.py gives it; `python -m generated doctor`
checks the same on any device.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from generated import default_device, skip_group_norm
from tests.kernels import profile_cases
from tests.oracles import assert_close, rng_for, run_seed, seed_note

# Where the exact output is at least this large, float16 rounding gives infinity (65520 and up do).
BEYOND = 65536.0

CASES = [
    case
    for case in profile_cases.all_cases()
    if case.dtypes["T"] == "float16"
    and case.dtypes.get("M", "float16") == "float16"
    and case.dtypes.get("V", "float16") == "float16"  # RMS's Y is V
    and case.only_dtype in (None, "float16")
    and case.attrs.get("stash_type") != 10  # computes in float16 as the spec says: overflows inside
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_outputs_beyond_float16_are_infinities(case):
    device = default_device()
    caps = profile_cases.profile_caps(device)
    missing = [f for f in case.required_features if f not in caps.features]
    if missing or "shader-f16" not in caps.features:
        pytest.skip(f"the device lacks {missing or ['shader-f16']}")
    seed = run_seed()
    rng = np.random.default_rng([seed, zlib.crc32(f"overflow/{case.id}".encode())])
    inputs = profile_cases.random_inputs(case, rng)
    key = profile_cases.SCALE_KEY[case.op]
    # |gamma| 60000 (float16 holds it), the sign random a channel: normalized values beyond about
    # 1.1 in size overflow, the rest do not.
    inputs[key] = (np.sign(inputs[key].astype(np.float64) + 1e-3) * 60000.0).astype(np.float16)
    package = profile_cases.PACKAGES[case.op]
    result = profile_cases.call_case(case, inputs, device, caps)
    with np.errstate(over="ignore"):  # the reference's SiLU: exp(-y) of a large negative y is inf
        ref = profile_cases.reference(case, inputs)
    context = f"{case.id} {case.shapes} {case.attrs} {case.tunables} {seed_note(seed)}"
    first = package.OUTPUTS[0].key
    expected, got = ref[first], np.asarray(result[first], np.float64)
    beyond = np.abs(expected) >= BEYOND
    assert beyond.sum() >= 3, f"{context}: the data should overflow somewhere"
    wrong = ~(np.isinf(got) & (np.sign(got) == np.sign(expected)))[beyond]
    assert not wrong.any(), (
        f"{context}: {np.count_nonzero(wrong)} of {beyond.sum()} outputs beyond float16's range came back "
        f"as {got[beyond][wrong][:4]} for {expected[beyond][wrong][:4]}"
    )
    inside = np.abs(expected) <= 65000.0
    assert_close(got[inside], expected[inside], np.float16, f"{context} {first} (in range)")


@pytest.mark.parametrize("write_sum", [True, False], ids=["sum", "plain"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("channels_last", [1, 0], ids=["nhwc", "nchw"])
@pytest.mark.parametrize("variant", ["fused", "split", "registers"])
def test_skip_group_norm_sum_beyond_float16_is_an_infinity_the_statistics_see(
    variant, channels_last, bias, write_sum, request
):
    """S = X + skip + bias is a float16 tensor: where the sum is beyond float16's range S holds an
    infinity, and so do the statistics of its group, whose Y is then NaN throughout (as the float64
    reference rounding S to float16 first, and ONNX Runtime, give); the other groups are unaffected.
    (The f32 sum of 40000 + 40000 is finite: statistics of the unrounded sum would give finite Y.)"""
    device = default_device()
    caps = profile_cases.profile_caps(device)
    needed = ["shader-f16"] + (["subgroups"] if variant == "registers" else [])
    if any(f not in caps.features for f in needed):
        pytest.skip(f"the device lacks {needed}")
    rng, seed = rng_for(request.node.name)
    shape = (2, 4, 4, 32) if channels_last else (2, 32, 4, 4)
    x = rng.standard_normal(shape).astype(np.float16)
    skip = rng.standard_normal(shape).astype(np.float16)
    n, h, w, c = (
        int(rng.integers(0, 2)),
        int(rng.integers(0, 4)),
        int(rng.integers(0, 4)),
        int(rng.integers(0, 32)),
    )
    at = (n, h, w, c) if channels_last else (n, c, h, w)
    sign = float(rng.choice([-1.0, 1.0]))
    x[at], skip[at] = sign * 40000.0, sign * 40000.0
    inputs = {
        "X": x,
        "skip": skip,
        "gamma": rng.uniform(0.5, 2, 32).astype(np.float16),
        "beta": rng.uniform(-1, 1, 32).astype(np.float16),
    }
    if bias:
        inputs["bias"] = rng.uniform(-1, 1, 32).astype(np.float16)
    attrs = {"groups": 8, "activation": 0, "channels_last": channels_last}
    outputs = ("Y", "S") if write_sum else ("Y",)
    out = skip_group_norm.kernel(inputs, attrs=attrs, outputs=outputs, variant=variant, device=device)
    context = (
        f"{variant} channels_last={channels_last} bias={bias} outputs={outputs} sum at {at} {seed_note(seed)}"
    )
    if write_sum:
        assert np.isinf(out["S"][at]) and np.sign(out["S"][at]) == sign, context
    y = np.moveaxis(out["Y"].astype(np.float64), 3 if channels_last else 1, 1)  # (N, C, H, W)
    group = c // 4
    assert np.isnan(
        y[n, group * 4 : group * 4 + 4]
    ).all(), f"{context}: the overflowing group's Y is not all NaN"
    finite = np.ones(y.shape, bool)
    finite[n, group * 4 : group * 4 + 4] = False
    assert np.isfinite(y[finite]).all(), f"{context}: a group without the overflow is not finite"
