"""What the InstanceNormalization-6 tests share (tests/kernels/test_instance_normalization*.py): the
forced-variant cases and tunables that make a variant's `when` hold on small shapes, random inputs,
poisoned calls, both oracles (float64 NumPy and onnxruntime), and a script run in a child process
whose lavapipe has subgroups of a known width.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from generated import instance_normalization as inn
from tests.device_helpers import is_lavapipe, poisoned_call
from tests.oracles import assert_close, instance_normalization_ref, onnxruntime_run, tolerance_ok

ROOT = Path(__file__).resolve().parents[2]
SPLIT_VARIANTS = ("plane_splitk_vec4", "plane_splitk")
# Small thresholds so that split-k applies to small shapes, with several splits per plane.
SPLIT_SMALL = {"SPLIT_STATS_MIN_SPATIAL": 1, "STATS_VALUES_PER_SPLIT": 8}
BATCHED_SMALL = {"WORKGROUP_SIZE": 16, "BATCHED_MIN_PLANES_PER_WORKGROUP": 1}
# plane_row_registers needs its planes x split workgroups within SM_COUNT_PROXY: 1 rules it out.
NO_ROW_REGISTERS = {"SM_COUNT_PROXY": 1}
# hasSubgroupId: the split-k vec4 partials pass then reduces with subgroupAdd.
SUBGROUP_CAPS = {"features": ["shader-f16", "subgroups"], "wgslLanguageFeatures": ["subgroup_id"]}

# (variant, shape, tunables): ranks 3 to 5, N > 1, partial workgroups, several lanes per plane,
# several vec4s per lane, splits that are short or empty, spatial sizes not divisible by 4.
CASES = [
    ("plane_batched_vec4", (2, 9, 12), BATCHED_SMALL),  # 3 vec4 per plane, 4 lanes, 4 planes a workgroup
    ("plane_batched_vec4", (3, 6, 2, 8), BATCHED_SMALL),
    ("plane_batched_vec4", (4, 5, 2, 3, 8), BATCHED_SMALL),  # 12 vec4, 16 lanes, 1 plane a workgroup
    ("plane_batched_vec4", (2, 9, 160), BATCHED_SMALL),  # 40 vec4 over 16 lanes
    ("plane_batched_vec4", (5, 60, 4, 4), {}),  # defaults: 64 planes of 4 lanes a workgroup
    ("plane_batched_vec4", (3, 100, 36), {}),  # 16 planes of 16 lanes, last workgroup partial
    ("plane_splitk_vec4", (2, 3, 40), SPLIT_SMALL),  # 10 vec4 in 8 splits of 2: 3 empty splits
    ("plane_splitk_vec4", (2, 3, 4, 12), SPLIT_SMALL),
    ("plane_splitk_vec4", (2, 2, 3, 2, 8), SPLIT_SMALL),
    ("plane_splitk_vec4", (3, 5, 1000), {**SPLIT_SMALL, "WORKGROUP_SIZE": 64}),  # 128 splits
    ("plane_splitk_vec4", (1, 4, 256, 256), {}),  # defaults: 32 splits of 2048 values
    ("plane_splitk", (2, 3, 37), SPLIT_SMALL),
    ("plane_splitk", (2, 3, 5, 7), {**SPLIT_SMALL, "WORKGROUP_SIZE": 8}),
    ("plane_splitk", (2, 2, 3, 3, 5), SPLIT_SMALL),
    ("plane_splitk", (2, 3, 40), SPLIT_SMALL),  # the scalar variant also runs divisible sizes
    ("plane_splitk", (1, 3, 257, 257), {}),  # defaults: 64 splits
]


def pick(*wanted):
    """The CASES entries with these (variant, shape) pairs."""
    found = [c for c in CASES if c[:2] in wanted]
    assert len(found) == len(wanted), wanted
    return found


def case_id(case):
    variant, shape, tunables = case
    return f"{variant}-{'x'.join(map(str, shape))}" + ("-tuned" if tunables else "")


def random_inputs(rng, shape, dtype, offset=None):
    """Per-plane means and spreads that differ, so a mixed-up plane shows."""
    n, c = shape[:2]
    plane = (n, c) + (1,) * (len(shape) - 2)
    if offset is None:
        mu = rng.uniform(-2, 2, plane)
        sigma = rng.uniform(0.5, 3, plane)
    else:
        mu, sigma = np.full(plane, offset), np.ones(plane)
    return {
        "input": (rng.standard_normal(shape) * sigma + mu).astype(dtype),
        "scale": rng.uniform(-2, 2, c).astype(dtype),
        "b": rng.uniform(-1, 1, c).astype(dtype),
    }


def run_poisoned(inputs, **kwargs):
    return poisoned_call(inn, inputs, **kwargs)["output"]


def shapes_of(inputs):
    return {k: v.shape for k, v in inputs.items()}


def dtypes_of(inputs):
    return {"T": inputs["input"].dtype.name}


def reference(inputs, epsilon):
    return instance_normalization_ref(inputs["input"], inputs["scale"], inputs["b"], epsilon)


def ort_reference(inputs, epsilon):
    # InstanceNormalization runs in float32 on ORT's CPU provider: run f16 data as float32 copies.
    feed = {
        name: inputs[key].astype(np.float32)
        for name, key in (("input", "input"), ("scale", "scale"), ("B", "b"))
    }
    (expected,) = onnxruntime_run(
        "InstanceNormalization", feed, {"epsilon": epsilon}, opset=6, outputs=("output",)
    )
    return expected.astype(np.float64)


def assert_matches_both_oracles(actual, inputs, epsilon, dtype, context):
    expected = reference(inputs, epsilon)
    assert_close(actual, expected, dtype, context)
    # onnxruntime computes in T: on a plane of a few values whose spread is a few ulps of its mean,
    # its own float32 error can pass the tolerance against the float64 reference (planes of 4
    # values, KERNEL_TEST_SEED=1780234088: 1.5x the tolerance, where the kernel is at 0.03x). Such
    # elements are held to the float64 reference above only; onnxruntime must agree with it nearly
    # everywhere else to count as an oracle at all.
    ort = np.asarray(ort_reference(inputs, epsilon), np.float64)
    trusted = tolerance_ok(ort, expected, dtype)
    assert (
        trusted.mean() > 0.999
    ), f"{context}: onnxruntime itself is off the float64 reference on {np.count_nonzero(~trusted)} elements"
    assert_close(np.asarray(actual, np.float64)[trusted], ort[trusted], dtype, context + " vs onnxruntime")


def run_at_subgroup_size(script, subgroup_size, vector_width, timeout):
    """`script` in a child process whose lavapipe runs subgroups `vector_width / 32` wide, with Mesa's
    shader cache off (it does not key on LP_NATIVE_VECTOR_WIDTH); skipped off lavapipe."""
    if not is_lavapipe():
        pytest.skip("LP_NATIVE_VECTOR_WIDTH only changes lavapipe's subgroup size")
    env = {
        **os.environ,
        "LP_NATIVE_VECTOR_WIDTH": str(vector_width),
        "MESA_SHADER_CACHE_DISABLE": "true",
        "WGPU_BACKEND_TYPE": "Vulkan",
    }
    command = [sys.executable, "-c", script, str(subgroup_size)]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
