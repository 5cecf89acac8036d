"""Per-request attributes reach the shaders through the `Params` uniform, not as pipeline overrides
(docs/MANIFEST.md, "Binding times"): a new epsilon (or SkipGroupNorm activation) must not create a pipeline.

Every variant of GroupNormalization-21, InstanceNormalization-6 and com.microsoft SkipGroupNorm
and GroupNorm runs with 50 distinct epsilon values on one shape: after the first call the device's pipeline
cache (`generated._runtime.pipeline_cache[device]`) does not grow, no pass declares an `epsilon`
override, and each result matches the float64 reference for its own epsilon (docs/TESTING.md
tolerances; fresh random data per run, seed printed on failure, NaN-poisoned outputs).
"""

from __future__ import annotations

import numpy as np
import pytest

from generated import _runtime
from generated import group_norm as mgn
from generated import group_normalization as gn
from generated import instance_normalization as inn
from generated import skip_group_norm as sgn
from tests.device_helpers import poisoned_call
from tests.oracles import (
    assert_close,
    group_normalization_ref,
    instance_normalization_ref,
    microsoft_group_norm_for_call,
    rng_for,
    seed_note,
    skip_group_norm_for_call,
)
from tests.kernels.group_norm_support import assert_close_f16_stage, spec_normalized

EPSILONS = 50
F16 = {"features": ["shader-f16"]}
SUBGROUP_ID = {"features": ["shader-f16", "subgroups"], "wgslLanguageFeatures": ["subgroup_id"]}


def epsilons(rng):
    """50 distinct values from 1e-6 to 1, in random order."""
    values = np.unique(np.round(10.0 ** rng.uniform(-6, 0, 4 * EPSILONS), 9))
    assert len(values) >= EPSILONS
    return [float(v) for v in rng.permutation(values)[:EPSILONS]]


def pipeline_count():
    return len(_runtime.pipeline_cache.get(_runtime.default_device(), {}))


def run_epsilons(rng, seed, package, inputs, attrs, check, outputs=None, **kwargs):
    """Runs `package` once per epsilon; the pipeline count after the first call must hold."""
    shapes = {k: v.shape for k, v in inputs.items()}
    dtypes = {tv: inputs[key].dtype.name for tv, key in kwargs.pop("type_keys").items()}
    plan = package.plan(shapes, dtypes, attrs={**attrs, "epsilon": 1e-3}, outputs=outputs, **kwargs)
    for p in plan.passes:
        assert "epsilon" not in p.overrides, f"{p.name}: epsilon is an override"
    uses = [p for p in plan.passes if "epsilon" in p.uniforms]
    assert uses, "no pass takes epsilon as a uniform"
    count = None
    for eps in epsilons(rng):
        call_attrs = {**attrs, "epsilon": eps}
        result = poisoned_call(package, inputs, outputs, attrs=call_attrs, **kwargs)
        if count is None:
            count = pipeline_count()
        assert pipeline_count() == count, f"epsilon {eps} created a pipeline"
        check(result, call_attrs, f"{plan.variant} eps={eps} {seed_note(seed)}")


GN_CASES = [
    ("group_subgroup_vec4", {}, SUBGROUP_ID, 1),
    ("group_subgroup_vec4", {}, F16, 1),
    ("group_subgroup", {}, F16, 1),
    ("group_splitk", {"STATS_VALUES_PER_SPLIT": 64, "SPLIT_STATS_MIN_HIDDEN": 1}, F16, 1),
    ("group_splitk_vec4", {"STATS_VALUES_PER_SPLIT": 64, "SPLIT_STATS_MIN_HIDDEN": 1}, F16, 1),
    ("group_splitk_vec4_pairs", {"STATS_VALUES_PER_SPLIT": 64, "SPLIT_STATS_MIN_HIDDEN": 1}, F16, 1),
    ("group_splitk_registers", {"SPLIT_STATS_MIN_HIDDEN": 1, "CHUNK_WORKGROUP_SIZE": 16}, F16, 1),
    ("group_stash_f16_serial", {}, F16, 10),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize(
    "variant,tunables,caps,stash", GN_CASES, ids=[f"{c[0]}-{len(c[2])}" for c in GN_CASES]
)
def test_group_normalization_epsilon_is_a_uniform(variant, tunables, caps, stash, dtype, request):
    rng, seed = rng_for(request.node.name)
    shape = (2, 6, 8, 20)
    inputs = {
        "x": (rng.standard_normal(shape) * 2 + 1).astype(dtype),
        "scale": rng.uniform(-2, 2, 6).astype(dtype),
        "bias": rng.uniform(-1, 1, 6).astype(dtype),
    }
    attrs = {"num_groups": 3, "stash_type": stash}

    def check(result, call_attrs, context):
        expected = group_normalization_ref(inputs["x"], inputs["scale"], inputs["bias"], **call_attrs)
        if stash == 10:
            normalized = spec_normalized(inputs, call_attrs)
            assert_close_f16_stage(result["y"], expected, normalized, inputs["scale"], dtype, context)
        else:
            assert_close(result["y"], expected, dtype, context)

    run_epsilons(
        rng,
        seed,
        gn,
        inputs,
        attrs,
        check,
        caps=caps,
        tunables=tunables,
        variant=variant,
        type_keys={"T": "x"},
    )


IN_CASES = [
    ("plane_subgroup_vec4", (2, 3, 8, 12), {}, SUBGROUP_ID),
    (
        "plane_subgroup_vec4_scalar_io",
        (2, 3, 8, 16),
        {},
        {**SUBGROUP_ID, "adapterInfo": {"subgroupMinSize": 32, "subgroupMaxSize": 32}},
    ),
    ("plane_subgroup", (2, 3, 7, 9), {}, F16),
    (
        "plane_splitk_vec4",
        (2, 3, 8, 12),
        {"SPLIT_STATS_MIN_SPATIAL": 1, "STATS_VALUES_PER_SPLIT": 16},
        SUBGROUP_ID,
    ),
    ("plane_splitk", (2, 3, 7, 9), {"SPLIT_STATS_MIN_SPATIAL": 1, "STATS_VALUES_PER_SPLIT": 16}, F16),
    ("plane_splitk_registers", (2, 3, 8, 16), {"SPLIT_STATS_MIN_SPATIAL": 1, "CHUNK_WORKGROUP_SIZE": 8}, F16),
    ("plane_batched_vec4", (2, 9, 16), {"WORKGROUP_SIZE": 16, "BATCHED_MIN_PLANES_PER_WORKGROUP": 1}, F16),
    (
        "plane_row_registers",
        (2, 3, 8, 16),
        {"REGISTER_SPLIT_MIN_HIDDEN": 1, "REGISTER_WORKGROUP_SIZE": 16},
        SUBGROUP_ID,
    ),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("variant,shape,tunables,caps", IN_CASES, ids=[c[0] for c in IN_CASES])
def test_instance_normalization_epsilon_is_a_uniform(variant, shape, tunables, caps, dtype, request):
    if variant == "plane_subgroup_vec4_scalar_io" and dtype == np.float16:
        pytest.skip("f32 only")
    rng, seed = rng_for(request.node.name)
    c = shape[1]
    inputs = {
        "input": (rng.standard_normal(shape) * 2 + 1).astype(dtype),
        "scale": rng.uniform(-2, 2, c).astype(dtype),
        "b": rng.uniform(-1, 1, c).astype(dtype),
    }

    def check(result, call_attrs, context):
        expected = instance_normalization_ref(
            inputs["input"], inputs["scale"], inputs["b"], call_attrs["epsilon"]
        )
        assert_close(result["output"], expected, dtype, context)

    run_epsilons(
        rng,
        seed,
        inn,
        inputs,
        {},
        check,
        caps=caps,
        tunables=tunables,
        variant=variant,
        type_keys={"T": "input"},
    )


SGN_MEMBERS = ("bias_sum", "bias_plain", "sum", "plain")  # with and without a bias and S


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("member", SGN_MEMBERS)
@pytest.mark.parametrize("variant", ["split", "fused"])
def test_skip_group_norm_epsilon_and_activation_are_uniforms(variant, member, dtype, request):
    """Both activations share the pipelines too: the count holds across 50 epsilons x activation 0, 1."""
    rng, seed = rng_for(request.node.name)
    shape = (2, 4, 5, 16)  # NHWC, 4 groups of 4 channels
    inputs = {
        "X": (rng.standard_normal(shape) * 2 + 1).astype(dtype),
        "gamma": rng.uniform(-2, 2, 16).astype(dtype),
        "beta": rng.uniform(-1, 1, 16).astype(dtype),
        "skip": rng.standard_normal(shape).astype(dtype),
    }
    if member.startswith("bias"):
        inputs["bias"] = rng.uniform(-1, 1, 16).astype(dtype)
    outputs = ("Y", "S") if member.endswith("sum") else ("Y",)
    tunables = {"WORKGROUP_SIZE": 8, "SLAB_VALUES": 16}
    first = None
    for activation in (0, 1):
        attrs = {"groups": 4, "activation": activation}

        def check(result, call_attrs, context):
            y_ref, s_ref = skip_group_norm_for_call(inputs, call_attrs)
            assert_close(result["Y"], y_ref, dtype, f"{context} activation={activation} Y")
            if "S" in result:
                assert_close(result["S"], s_ref, dtype, f"{context} activation={activation} S")

        run_epsilons(
            rng,
            seed,
            sgn,
            inputs,
            attrs,
            check,
            outputs=outputs,
            caps=F16,
            tunables=tunables,
            variant=variant,
            type_keys={"T": "X", "M": "gamma"},
        )
        first = pipeline_count() if first is None else first
        assert pipeline_count() == first, f"activation {activation} created a pipeline"


# (variant, channels_last, T): each variant once (registers: NHWC only), both layouts and T types
# among them; SkipGroupNorm's test above runs the same shaders in every dtype.
MGN_CONFIGS = [("registers", 1, np.float16), ("split", 1, np.float32), ("fused", 0, np.float16)]


@pytest.mark.parametrize(
    "variant,channels_last,dtype",
    MGN_CONFIGS,
    ids=[f"{v}-{'nhwc' if c else 'nchw'}-{np.dtype(d).name}" for v, c, d in MGN_CONFIGS],
)
def test_microsoft_group_norm_epsilon_and_activation_are_uniforms(variant, channels_last, dtype, request):
    """com.microsoft GroupNorm (float32 gamma and beta): the pipeline count holds across 50 epsilons x
    activation 0, 1, as SkipGroupNorm's."""
    rng, seed = rng_for(request.node.name)
    shape = (2, 4, 5, 16) if channels_last else (2, 16, 4, 5)  # 4 groups of 4 channels
    inputs = {
        "X": (rng.standard_normal(shape) * 2 + 1).astype(dtype),
        "gamma": rng.uniform(-2, 2, 16).astype(np.float32),
        "beta": rng.uniform(-1, 1, 16).astype(np.float32),
    }
    tunables = {"WORKGROUP_SIZE": 8, "SLAB_VALUES": 16}
    first = None
    for activation in (0, 1):
        attrs = {"groups": 4, "activation": activation, "channels_last": channels_last}

        def check(result, call_attrs, context):
            want = microsoft_group_norm_for_call(inputs, call_attrs)
            assert_close(result["Y"], want, dtype, f"{context} activation={activation} Y")

        run_epsilons(
            rng,
            seed,
            mgn,
            inputs,
            attrs,
            check,
            outputs=("Y",),
            caps={"features": ["shader-f16", "subgroups"]} if variant == "registers" else F16,
            tunables=tunables,
            variant=variant,
            type_keys={"T": "X", "M": "gamma"},
        )
        first = pipeline_count() if first is None else first
        assert pipeline_count() == first, f"activation {activation} created a pipeline"
