"""Hostile calls (issue 9) about what the device can do, each refused with a ContractError before any
GPU work: float16 without shader-f16 (in caps= or on the device), caps with unknown names or bad
values, tensors over the storage binding limit, workgroup tunables over the device's limit; explain()
names the broken rule instead of raising; per-device caches stay bounded over thousands of epsilons
and shapes.
Every refusal is checked for its shape (tests/runtime/hostile_support.py's check_refusal): a ContractError
(a ValueError) whose str reads "{op}: {subject}: {message} ..." and carries the rule, naming the op
and the name the caller used for the input or attribute (a bind key like `x` / `b` or an ONNX role
like `X` / `B`), never another exception type, a wgpu error, or a process abort.
"""

from __future__ import annotations

import numpy as np
import pytest

from generated import ContractError
from generated import _runtime as rt
from tests.runtime.hostile_support import (
    ALL_OPS,
    F16_PHRASE,
    OP_IDS,
    OPS,
    assert_refused,
    kernel,
    plan,
    refusal,
    word,
)


# =========================================================================================================
# float16 without shader-f16; caps with unknown names or bad values


@ALL_OPS
def test_float16_without_shader_f16_in_caps_plan(op_id):
    info = OPS[op_id]
    error = assert_refused(
        lambda: plan(info, info.shapes(), np.float16, caps={"features": []}),
        info.op,
        what="f16 plan, caps without shader-f16",
    )
    assert F16_PHRASE in str(error), str(error)


@ALL_OPS
def test_float16_without_shader_f16_in_caps_kernel(op_id):
    info = OPS[op_id]
    inputs = info.inputs(np.float16)
    error = assert_refused(
        lambda: kernel(info, inputs, caps={"features": []}),
        info.op,
        what="f16 kernel, caps without shader-f16",
    )
    assert F16_PHRASE in str(error), str(error)


@ALL_OPS
def test_float16_on_a_device_without_shader_f16(op_id, device_without_f16):
    info = OPS[op_id]
    inputs = info.inputs(np.float16)
    error = assert_refused(
        lambda: kernel(info, inputs, device=device_without_f16),
        info.op,
        what="f16 kernel on a device without shader-f16",
    )
    assert F16_PHRASE in str(error), str(error)


@pytest.mark.parametrize("op_id", ["sgn", "mgn"])
def test_float16_gamma_beta_do_not_need_shader_f16(op_id, device_without_f16):
    """SkipGroupNorm and GroupNorm bind gamma / beta (type M) as 32-bit words: an f32 X with f16 M
    runs anywhere. (The same variant on both devices: the default one has subgroups, which registers
    needs.)"""
    info = OPS[op_id]
    inputs = info.inputs(np.float32)
    inputs["gamma"] = inputs["gamma"].astype(np.float16)
    inputs["beta"] = inputs["beta"].astype(np.float16)
    shapes = {key: value.shape for key, value in inputs.items()}
    variant = plan(info, shapes, caps={"features": list(device_without_f16.features)}).variant
    y = kernel(info, inputs, device=device_without_f16)["Y"]
    np.testing.assert_array_equal(y, kernel(info, inputs, variant=variant)["Y"])


BAD_CAPS = {
    "unknown_feature": {"features": ["shader_f16"]},
    "unknown_limit": {"limits": {"maxStorageBufferSize": 1 << 20}},
    "unknown_key": {"feature": ["shader-f16"]},
    "bool_limit": {"limits": {"maxComputeWorkgroupStorageSize": True}},
    "fraction_limit": {"limits": {"maxComputeWorkgroupStorageSize": 16384.5}},
    "negative_limit": {"limits": {"maxComputeInvocationsPerWorkgroup": -1}},
    "string_limit": {"limits": {"maxComputeInvocationsPerWorkgroup": "256"}},
    "features_string": {"features": "shader-f16"},
    "not_a_mapping": ["shader-f16"],
}
CAPS_NAMES = {
    "unknown_feature": ("shader_f16",),
    "unknown_limit": ("maxStorageBufferSize",),
    "unknown_key": ("feature",),
    "bool_limit": ("maxComputeWorkgroupStorageSize",),
    "fraction_limit": ("maxComputeWorkgroupStorageSize",),
    "negative_limit": ("maxComputeInvocationsPerWorkgroup",),
    "string_limit": ("maxComputeInvocationsPerWorkgroup",),
    "features_string": ("features",),
    "not_a_mapping": ("caps",),
}


@ALL_OPS
@pytest.mark.parametrize("bad", list(BAD_CAPS))
def test_bad_caps_are_refused(op_id, bad):
    info = OPS[op_id]
    caps = BAD_CAPS[bad]
    assert_refused(
        lambda: plan(info, info.shapes(), caps=caps),
        info.op,
        CAPS_NAMES[bad],
        what=f"plan() caps={caps!r}",
        names_in="text",
    )
    if op_id == "gn":
        inputs = info.inputs()
        assert_refused(
            lambda: kernel(info, inputs, caps=caps),
            info.op,
            CAPS_NAMES[bad],
            what=f"kernel() caps={caps!r}",
            names_in="text",
        )


# =========================================================================================================
# explain() never raises for a contract failure: its first line names the broken rule

EXPLAIN_CASES = {
    "gn-groups-do-not-divide": ("gn", None, {"num_groups": 3}, None),
    "gn-rank-2": ("gn", {"x": (2, 4), "scale": (4,), "bias": (4,)}, None, None),
    "bn-scale-length": (
        "bn",
        {"x": (2, 4, 3), "scale": (3,), "b": (4,), "inputMean": (4,), "inputVar": (4,)},
        None,
        None,
    ),
    "in-rank-2": ("in", {"input": (2, 4), "scale": (4,), "b": (4,)}, None, None),
    "sgn-groups-do-not-divide": ("sgn", None, {"groups": 3}, None),
    "sgn-skip-shape": (
        "sgn",
        {"X": (2, 2, 3, 4), "gamma": (4,), "beta": (4,), "skip": (2, 4, 1)},
        None,
        None,
    ),
    "gn-unknown-attribute": ("gn", None, {"alpha": 1.0}, None),
    "bn-f16-without-shader-f16": ("bn", None, None, {"features": []}),
    "in-binding-limit": ("in", None, None, {"limits": {"maxStorageBufferBindingSize": 16}}),
    "sgn-epsilon-1e39": ("sgn", None, {"epsilon": 1e39}, None),
    "mgn-groups-do-not-divide": ("mgn", None, {"groups": 3}, None),
    "mgn-channels-last-2": ("mgn", None, {"channels_last": 2}, None),
    "mgn-gamma-length": ("mgn", {"X": (2, 2, 3, 4), "gamma": (3,), "beta": (4,)}, None, None),
}


@pytest.mark.parametrize("name", list(EXPLAIN_CASES))
def test_explain_returns_the_broken_rule(name):
    op_id, shapes, attrs, caps = EXPLAIN_CASES[name]
    info = OPS[op_id]
    shapes = shapes or info.shapes()
    dtype = np.float16 if "f16" in name else np.float32
    kwargs = {"attrs": {**info.attrs, **(attrs or {})}, "caps": caps}
    error = refusal(lambda: info.module.plan(shapes, info.dtypes(dtype), **kwargs), f"{name}: plan()")
    try:
        text = info.module.explain(shapes, info.dtypes(dtype), **kwargs)
    except Exception as raised:
        raise AssertionError(
            f"{name}: explain() raised {type(raised).__name__}: {str(raised)[:400]}"
        ) from raised
    assert isinstance(text, str) and text, repr(text)
    first = text.splitlines()[0]
    assert error.rule in first, f"{name}: the first line {first!r} does not name the rule {error.rule!r}"


# =========================================================================================================
# Plan and limit errors name the op, the input (the caller's name) and the limit


@pytest.mark.parametrize(
    "op_id,by_role",
    [("bn", False), ("bn", True), ("gn", False), ("gn", True), ("in", False), ("sgn", False), ("mgn", False)],
)
def test_tensor_over_the_storage_binding_limit_names_input_and_limit(op_id, by_role):
    info = OPS[op_id]
    shapes = info.shapes(info.large())
    key = info.keys[0]
    if by_role:
        shapes[info.roles[key]] = shapes.pop(key)
        key = info.roles[key]
    # 4 KiB: planned in pieces of channel ranges (a GroupNorm group of 32 channels is 8 KiB);
    # 128 bytes: below one channel (and one SkipGroupNorm or GroupNorm item), so no cut exists and the
    # refusal names the input and the limit.
    if op_id in ("bn", "in"):
        assert plan(info, shapes, caps={"limits": {"maxStorageBufferBindingSize": 4096}}).chunks
    caps = {"limits": {"maxStorageBufferBindingSize": 128}}
    error = assert_refused(
        lambda: plan(info, shapes, caps=caps),
        info.op,
        (key,),
        ("maxStorageBufferBindingSize",),
        "binding limit",
    )
    assert info.op in str(error)


@ALL_OPS
def test_kernel_over_the_storage_binding_limit_names_input_and_limit(op_id):
    info = OPS[op_id]
    inputs = info.inputs()
    caps = {"features": ["shader-f16"], "limits": {"maxStorageBufferBindingSize": 16}}
    assert_refused(
        lambda: kernel(info, inputs, caps=caps),
        info.op,
        (info.keys[0],),
        ("maxStorageBufferBindingSize",),
        "kernel binding limit",
    )


WORKGROUP_TUNABLES = [
    (op_id, name)
    for op_id in OP_IDS
    for name in OPS[op_id].module.TUNABLES
    if name.endswith("WORKGROUP_SIZE")
]


@pytest.mark.parametrize("op_id,name", WORKGROUP_TUNABLES)
def test_workgroup_tunable_over_the_device_limit(op_id, name):
    """Over maxComputeInvocationsPerWorkgroup (256 by default): capped by the manifest, or refused by name."""
    info = OPS[op_id]
    shapes = info.shapes(info.large() if len(info.base_shape) == 4 else (2, 64, 4096))
    try:
        p = plan(info, shapes, tunables={name: 4096})
    except ContractError as error:
        assert word(name, str(error)) and "maxComputeInvocationsPerWorkgroup" in str(error), str(error)
        assert error.op == info.op
        return
    except Exception as error:
        raise AssertionError(f"{name}=4096: {type(error).__name__}: {error}") from error
    assert all(q.workgroup_size <= 256 for q in p.passes), [q.workgroup_size for q in p.passes]


# =========================================================================================================
# Per-device caches stay bounded: epsilon is a uniform, caches hold at most 1024 entries

CACHE_CAP = 1024
PIPELINE_GROWTH = (
    4  # pipelines a loop over one shape may add (variants and their passes), whatever epsilon is
)


def _cache_sizes(device):
    return {
        "_pipelines": len(rt.pipeline_cache.get(device, {})),
        "_uniform_buffers": len(rt.uniform_buffer_cache.get(device, {})),
        "_shader_modules": len(rt.shader_module_cache.get(device, {})),
        "_plans": len(rt.plan_cache),
    }


def test_caches_stay_bounded_over_2000_distinct_epsilons():
    device = rt.default_device()
    info = OPS["bn"]
    inputs = info.inputs(shape=(1, 4))
    kernel(info, inputs)
    start = _cache_sizes(device)["_pipelines"]
    peak = {}
    for i in range(2000):
        kernel(info, inputs, attrs={"epsilon": 1e-5 * (1 + i / 1000)})
        sizes = _cache_sizes(device)
        peak = {k: max(v, peak.get(k, 0)) for k, v in sizes.items()}
        assert (
            sizes["_pipelines"] - start <= PIPELINE_GROWTH
        ), f"epsilon #{i}: {sizes['_pipelines'] - start} new pipelines"
        assert all(v <= CACHE_CAP for v in sizes.values()), f"epsilon #{i}: {sizes}"
    assert peak["_plans"] <= CACHE_CAP and peak["_uniform_buffers"] <= CACHE_CAP, peak


def test_plan_cache_stays_bounded_over_2000_distinct_shapes():
    info = OPS["bn"]
    peak = 0
    for n in range(1, 2001):
        plan(info, info.shapes((n, 4)))
        peak = max(peak, len(rt.plan_cache))
    assert peak <= CACHE_CAP, peak


def test_group_normalization_pipelines_do_not_grow_over_2000_epsilons():
    device = rt.default_device()
    info = OPS["gn"]
    inputs = info.inputs(shape=(2, 4, 8))
    kernel(info, inputs)
    start = _cache_sizes(device)["_pipelines"]
    for i in range(2000):
        kernel(info, inputs, attrs={"epsilon": 1e-5 * (1 + i / 1000)})
        grown = _cache_sizes(device)["_pipelines"] - start
        assert (
            grown <= PIPELINE_GROWTH
        ), f"after {i + 1} distinct epsilons: {grown} new pipelines (epsilon must be a uniform)"
