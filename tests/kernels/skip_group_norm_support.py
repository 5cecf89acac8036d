"""What the com.microsoft SkipGroupNorm tests share (tests/kernels/test_skip_group_norm*.py): the split
and fused families and their flavours (with and without a bias and S), layouts, the family natural
selection picks, random inputs, poisoned calls, the float64 reference and its checks, device caps.
"""

from __future__ import annotations

import numpy as np

from generated import skip_group_norm as sgn
from tests.device_helpers import poisoned_call
from tests.oracles import assert_close, skip_group_norm_for_call

FAMILIES = ("split", "fused")
# Each variant with and without a bias and S: the shaders it specializes for them.
FLAVOURS = tuple(
    f"{family}_{member}" for member in ("bias_sum", "bias_plain", "sum", "plain") for family in FAMILIES
)
NO_F16_CAPS = {"features": []}
F16_CAPS = {"features": ["shader-f16"]}
DTYPE = {"float32": np.float32, "float16": np.float16}


def flavour_for(family, has_bias, outputs):
    return f"{family}_{'bias_' if has_bias else ''}{'sum' if 'S' in outputs else 'plain'}"


def layout(shape, channels_last):
    """(N, C, H * W) of an X shape in its layout."""
    if channels_last:
        n, h, w, c = shape
    else:
        n, c, h, w = shape
    return n, c, h * w


def expected_family(case):
    """The manifest's rule: split for few (< SPLIT_MAX_ROWS) rows of >= SPLIT_MIN_GROUP_VALUES values."""
    n, c, hw = layout(case["inputs"]["X"], case["attrs"].get("channels_last", 1))
    groups = case["attrs"]["groups"]
    tunables = sgn.TUNABLES | case.get("tunables", {})
    few_rows = n * groups < tunables["SPLIT_MAX_ROWS"]
    return "split" if few_rows and c // groups * hw >= tunables["SPLIT_MIN_GROUP_VALUES"] else "fused"


def random_inputs(rng, shapes, t, m, offset=0.0):
    """X with a random spread and a mean `offset` spreads from zero; skip, bias, gamma and beta random."""
    t, m = np.dtype(t), np.dtype(m)
    channels = shapes["gamma"][0]
    spread = rng.uniform(0.5, 2.0)
    inputs = {
        "X": (rng.standard_normal(shapes["X"]) * spread + offset * spread).astype(t),
        "skip": (rng.standard_normal(shapes["skip"]) * rng.uniform(0.2, 1.5) + rng.uniform(-1, 1)).astype(t),
        "gamma": rng.uniform(-2, 2, channels).astype(m),
        "beta": rng.uniform(-1, 1, channels).astype(m),
    }
    if "bias" in shapes:
        inputs["bias"] = rng.uniform(-1, 1, channels).astype(t)
    return inputs


def run_poisoned(inputs, attrs, outputs=("Y",), **kwargs):
    return poisoned_call(sgn, inputs, outputs, attrs=attrs, **kwargs)


def reference(inputs, attrs):
    return skip_group_norm_for_call(inputs, attrs)


def check(result, inputs, attrs, context):
    y_ref, s_ref = reference(inputs, attrs)
    dtype = inputs["X"].dtype
    assert_close(result["Y"], y_ref, dtype, context + " Y")
    if "S" in result:
        assert_close(result["S"], s_ref, dtype, context + " S")
        if dtype == np.float16:
            # The f32 sum of three f16 values is (nearly always) exact, then rounded once: within one
            # ulp of the exactly rounded sum even where it cancels. (An f32 sum rounds twice.)
            assert_within_one_ulp(result["S"], s_ref, dtype, context + " S")


def assert_within_one_ulp(actual, expected, dtype, context):
    """|actual - expected| <= one ulp of T at expected (the sum's two additions may round once more)."""
    expected_t = np.asarray(expected).astype(dtype)
    ulp = np.spacing(np.abs(expected_t)).astype(np.float64)
    error = np.abs(np.asarray(actual, np.float64) - np.asarray(expected, np.float64))
    assert (
        error <= ulp
    ).all(), f"{context}: {np.count_nonzero(error > ulp)} values more than one ulp off; worst {(error / ulp).max():.2f} ulps"


SUBGROUP_CAPS = {"features": ["shader-f16", "subgroups"]}
# The H200's facts as wgpu reports them: subgroups, 1024 invocations a workgroup.
H200_CAPS = {
    **SUBGROUP_CAPS,
    "limits": {"maxComputeInvocationsPerWorkgroup": 1024, "maxComputeWorkgroupSizeX": 1024},
}
