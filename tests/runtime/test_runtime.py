"""Unit tests of generated/_runtime/, the hand-written run-time package of the kernels."""

import math
import struct
from types import SimpleNamespace

import numpy as np
import pytest

from generated import _runtime as rt

DEFAULT_CAPS = rt.Caps.from_mapping({})


# ---------------------------------------------------------------------------------------------
# JavaScript-semantics helpers


def test_js_div():
    assert rt.js_div(8, 2) == 4
    assert rt.js_div(5, 2) == 2.5
    assert rt.js_div(1, 0) == math.inf
    assert rt.js_div(-1, 0) == -math.inf
    assert rt.js_div(1, -0.0) == -math.inf
    assert math.isnan(rt.js_div(0, 0))
    assert math.isnan(rt.js_div(math.nan, 0))


def test_js_mod():
    assert rt.js_mod(7, 3) == 1
    assert rt.js_mod(-7, 3) == -1 and isinstance(rt.js_mod(-7, 3), int)
    assert rt.js_mod(7, -3) == 1
    assert rt.js_mod(5.5, 2) == 1.5
    assert rt.js_mod(-5.5, 2) == -1.5
    assert rt.js_mod(5, math.inf) == 5
    assert math.isnan(rt.js_mod(5, 0))
    assert math.isnan(rt.js_mod(5.0, 0.0))
    assert math.isnan(rt.js_mod(math.inf, 2))


@pytest.mark.parametrize(
    "value, text",
    [
        (True, "true"),
        (False, "false"),
        (4.0, "4"),
        (4, "4"),
        (-0.0, "0"),
        (2.5, "2.5"),
        (-1.5, "-1.5"),
        (0.1, "0.1"),
        (0.30000000000000004, "0.30000000000000004"),
        (123456.789, "123456.789"),
        (1e-05, "0.00001"),
        (1e-6, "0.000001"),
        (1e-7, "1e-7"),
        (1.5e-10, "1.5e-10"),
        (1e20, "100000000000000000000"),
        (1e21, "1e+21"),
        (1.2345e25, "1.2345e+25"),
        (2**60, "1152921504606847000"),
        (math.nan, "NaN"),
        (math.inf, "Infinity"),
        (-math.inf, "-Infinity"),
        ("group", "group"),
    ],
)
def test_js_str(value, text):
    assert rt.js_str(value) == text


@pytest.mark.parametrize(
    "x, expected",
    [(-3, 1), (0, 1), (1, 1), (1.5, 2), (2, 2), (2.5, 4), (3, 4), (4, 4), (5, 8), (1024, 1024), (1025, 2048)],
)
def test_pow2ceil(x, expected):
    assert rt.pow2ceil(x) == expected
    assert isinstance(rt.pow2ceil(x), int)


def test_ceil_div():
    assert rt.ceil_div(7, 2) == 4 and isinstance(rt.ceil_div(7, 2), int)
    assert rt.ceil_div(8, 2) == 4
    assert rt.ceil_div(-7, 2) == -3
    assert rt.ceil_div(7.5, 2.5) == 3 and isinstance(rt.ceil_div(7.5, 2.5), int)
    assert rt.ceil_div(10**30 + 1, 10**15) == 10**15 + 1  # exact where floats are not


def test_shape_helpers():
    s = (2, 3, 4)
    assert rt.numel(s) == 24 and rt.numel(()) == 1
    assert rt.inner(s, 0) == 12 and rt.inner(s, 1) == 4 and rt.inner(s, -1) == 1 and rt.inner(s, -3) == 12
    assert rt.inner((2, 3), 2) == 1  # past the last dim: the empty product
    assert rt.outer(s, 0) == 1 and rt.outer(s, 2) == 6 and rt.outer(s, -1) == 6
    assert rt.dim(s, 0) == 2 and rt.dim(s, -1) == 4 and rt.dim(s, -3) == 2


@pytest.mark.parametrize("i", [3, -4])
def test_dim_out_of_range(i):
    with pytest.raises(rt.DimensionError, match="rank-3") as info:
        rt.dim((2, 3, 4), i)
    assert isinstance(info.value, IndexError) and not isinstance(info.value, rt.ContractError)


def test_onnx_dtype_code():
    codes = {"float32": 1, "float16": 10, "float64": 11, "int32": 6, "int64": 7, "bfloat16": 16}
    assert {name: rt.onnx_dtype_code(name) for name in codes} == codes
    with pytest.raises(ValueError, match="float8"):
        rt.onnx_dtype_code("float8")


def test_whole_accepts_integral_numbers():
    assert rt.whole(3, "n") == 3
    assert rt.whole(3.0, "n") == 3 and isinstance(rt.whole(3.0, "n"), int)
    assert rt.whole(np.int64(5), "n") == 5
    assert rt.whole(np.float32(2.0), "n") == 2
    assert rt.whole(-4, "n") == -4


@pytest.mark.parametrize("value", [True, 2.5, math.nan, math.inf, "3", None])
def test_whole_refuses(value):
    with pytest.raises(rt.PlanError) as info:
        rt.whole(value, "groupSize")
    error = info.value
    assert isinstance(error, rt.ContractError) and isinstance(error, ValueError)
    assert error.subject == "groupSize" and error.rule == "whole number"
    assert str(error) == f"plan: groupSize: expected a whole number, got {value!r}"


def test_u32():
    assert rt.u32(0, "n") == 0 and rt.u32(2**32 - 1, "n") == 2**32 - 1
    for value in (-1, 2**32, 0.5):
        with pytest.raises(rt.PlanError, match="uniform n"):
            rt.u32(value, "uniform n")


def test_contract_error_str_and_attributes():
    error = rt.ContractError("GroupNormalization", "num_groups", "divides channels", "3 does not divide 320")
    assert str(error) == "GroupNormalization: num_groups: 3 does not divide 320 (rule: divides channels)"
    assert (error.op, error.subject, error.rule, error.message) == (
        "GroupNormalization",
        "num_groups",
        "divides channels",
        "3 does not divide 320",
    )


# ---------------------------------------------------------------------------------------------
# Dispatch folding and limits


def test_fold_dispatch():
    assert rt.fold_dispatch(10, 1, 1, DEFAULT_CAPS, "p") == (10, 1, 1)
    assert rt.fold_dispatch(65535, 1, 1, DEFAULT_CAPS, "p") == (65535, 1, 1)
    assert rt.fold_dispatch(70000, 1, 1, DEFAULT_CAPS, "p") == (65535, 2, 1)
    assert rt.fold_dispatch(70000.0, 1, 1, DEFAULT_CAPS, "p") == (65535, 2, 1)
    assert rt.fold_dispatch(0, 1, 1, DEFAULT_CAPS, "p") == (0, 0, 0)


def test_fold_width_is_capped_at_65535():
    big = rt.Caps.from_mapping({"limits": {"maxComputeWorkgroupsPerDimension": 100000}})
    assert rt.fold_width(big) == 65535
    assert rt.fold_dispatch(70000, 1, 1, big, "p") == (65535, 2, 1)
    assert rt.fold_dispatch(1, 70000, 1, big, "p") == (1, 70000, 1)  # the device allows it
    small = rt.Caps.from_mapping({"limits": {"maxComputeWorkgroupsPerDimension": 1000}})
    assert rt.fold_width(small) == 1000
    assert rt.fold_dispatch(2500, 1, 1, small, "p") == (1000, 3, 1)


@pytest.mark.parametrize("xyz, axis", [((70000, 2, 1), "x"), ((1, 1, 70000), "z"), ((1, -1, 1), "y")])
def test_fold_dispatch_refuses_axes_over_the_limit(xyz, axis):
    with pytest.raises(rt.PlanError, match=f"dispatch {axis} .*65535") as info:
        rt.fold_dispatch(*xyz, DEFAULT_CAPS, "stats pass")
    assert info.value.subject == "stats pass"
    assert info.value.rule == "maxComputeWorkgroupsPerDimension"


def test_fold_dispatch_refuses_fractions():
    with pytest.raises(rt.PlanError, match="whole number"):
        rt.fold_dispatch(2.5, 1, 1, DEFAULT_CAPS, "p")


def test_threads_dispatch():
    assert rt.threads_dispatch(1000, 64, DEFAULT_CAPS, "p") == (16, 1, 1)
    assert rt.threads_dispatch(65535 * 64 + 1, 64, DEFAULT_CAPS, "p") == (65535, 2, 1)
    assert rt.threads_dispatch(0, 64, DEFAULT_CAPS, "p") == (0, 0, 0)


def make_pass(**changes):
    values = dict(
        name="main",
        label="test main",
        template="test.wgsl.jinja",
        spec=("f32",),
        wgsl="",
        dispatch=(1, 1, 1),
        uniforms={},
        uniform_types=(),
        overrides={},
        override_types={},
        bindings=(),
        workgroup_size=64,
        workgroup_storage_bytes=0,
        uses_subgroups=False,
    )
    values.update(changes)
    return rt.PassPlan(**values)


def make_plan(passes, inputs, outputs, intermediates=None):
    return rt.Plan(
        op="Test",
        variant="v",
        passes=tuple(passes),
        inputs=inputs,
        outputs=outputs,
        intermediates=intermediates or {},
        explanation=(),
    )


@pytest.mark.parametrize(
    "changes, rule",
    [
        ({"workgroup_size": 512}, "maxComputeInvocationsPerWorkgroup"),
        ({"workgroup_size": 0}, "workgroup size"),
        ({"workgroup_storage_bytes": 16385}, "maxComputeWorkgroupStorageSize"),
        ({"dispatch": (65536, 1, 1)}, "maxComputeWorkgroupsPerDimension"),
        ({"uses_subgroups": True}, "subgroups"),
    ],
)
def test_check_pass_limits_refuses(changes, rule):
    with pytest.raises(rt.PlanError) as info:
        rt.check_pass_limits("Test", make_pass(**changes), DEFAULT_CAPS)
    assert info.value.rule == rule and info.value.subject == "pass main"


def test_check_pass_limits_accepts():
    caps = rt.Caps.from_mapping({"features": ["subgroups"]})
    rt.check_pass_limits(
        "Test", make_pass(workgroup_size=256, workgroup_storage_bytes=16384, uses_subgroups=True), caps
    )


def test_check_binding_sizes():
    fits = make_plan([], {"x": ((2**25,), "float32")}, {"y": ((2**25,), "float32")})
    rt.check_binding_sizes("Test", fits, DEFAULT_CAPS)
    too_big = make_plan([], {"x": ((2**25 + 1,), "float32")}, {})
    with pytest.raises(rt.ContractError, match="134217732 bytes.*maxStorageBufferBindingSize") as info:
        rt.check_binding_sizes("Test", too_big, DEFAULT_CAPS)
    assert info.value.subject == "input x"
    big_binding = rt.Caps.from_mapping({"limits": {"maxStorageBufferBindingSize": 2**31}})
    with pytest.raises(rt.ContractError, match="maxBufferSize"):
        rt.check_binding_sizes("Test", make_plan([], {}, {}, {"t": ((2**27,), "float32")}), big_binding)


# ---------------------------------------------------------------------------------------------
# Caps


def test_caps_from_mapping_defaults():
    caps = rt.Caps.from_mapping({})
    assert caps.limits == rt.WEBGPU_DEFAULT_LIMITS
    assert caps.limits["maxComputeWorkgroupStorageSize"] == 16384
    assert caps.limits["maxComputeInvocationsPerWorkgroup"] == 256
    assert caps.features == frozenset() and caps.wgsl_language_features == frozenset()
    assert caps.adapter_info == {}


def test_caps_from_mapping_values():
    caps = rt.Caps.from_mapping(
        {
            "limits": {"maxComputeWorkgroupStorageSize": 32768},
            "features": ["shader-f16", "subgroups"],
            "wgslLanguageFeatures": ["subgroup_id"],
            "adapterInfo": {"subgroupMinSize": 32, "subgroupMaxSize": 32},
        }
    )
    assert caps.limits["maxComputeWorkgroupStorageSize"] == 32768
    assert caps.limits["maxBufferSize"] == 268435456
    assert caps.features == {"shader-f16", "subgroups"}
    assert caps.wgsl_language_features == {"subgroup_id"}
    assert caps.adapter_info["subgroupMinSize"] == 32


def test_caps_from_mapping_refuses_unknown_names():
    with pytest.raises(ValueError, match="maxWorkgroupStorage, maxWrong"):
        rt.Caps.from_mapping({"limits": {"maxWrong": 1, "maxWorkgroupStorage": 2}})
    with pytest.raises(ValueError, match="feature"):
        rt.Caps.from_mapping({"feature": ["subgroups"]})


def test_caps_of():
    assert rt.caps_of(DEFAULT_CAPS) is DEFAULT_CAPS
    assert rt.caps_of({"features": ["shader-f16"]}).features == {"shader-f16"}
    with pytest.raises(rt.ContractError, match="caps must be None, a Caps or a mapping"):
        rt.caps_of(["shader-f16"])


def test_device_caps(device):
    caps = rt.device_caps(device)
    assert rt.caps_of(None, device) is caps  # cached per device
    assert set(caps.limits) == set(rt.WEBGPU_DEFAULT_LIMITS)
    assert (
        caps.limits["maxComputeWorkgroupStorageSize"] == device.limits["max-compute-workgroup-storage-size"]
    )
    assert caps.limits["maxTextureDimension1D"] == device.limits["max-texture-dimension-1d"]
    # wgpu-native's "subgroup" is WebGPU's "subgroups"; lavapipe and NVIDIA both have it.
    assert "subgroup" in device.features
    assert "subgroups" in caps.features and "subgroup" not in caps.features
    # caps= from the device's own feature names, as wgpu reports them (an audit found them refused).
    assert rt.caps_of({"features": sorted(device.features)}).features == caps.features
    assert "shader-f16" in caps.features
    assert caps.wgsl_language_features == frozenset()
    assert set(caps.adapter_info) <= {"vendor", "architecture", "device", "description"}
    assert (
        rt.Caps.from_mapping(
            {
                "limits": caps.limits,
                "features": caps.features,
                "wgslLanguageFeatures": caps.wgsl_language_features,
                "adapterInfo": caps.adapter_info,
            }
        )
        == caps
    )


# ---------------------------------------------------------------------------------------------
# Selection


def candidate(id, priority, order, *, when=None, demoted=False, features=()):
    def when_fn(request, derived):
        return when(request, derived) if callable(when) else when

    def demoted_fn(request, derived):
        return demoted(request, derived) if callable(demoted) else demoted

    return SimpleNamespace(
        ID=id, PRIORITY=priority, ORDER=order, REQUIRED_FEATURES=features, when=when_fn, demoted=demoted_fn
    )


def request(features=()):
    caps = rt.Caps.from_mapping({"features": features})
    return rt.Request(
        shapes={"x": (2, 3)}, dtypes={"T": "f32"}, attrs={"epsilon": 1e-5}, tunables={}, caps=caps
    )


def test_select_takes_the_first_passing_candidate():
    a = candidate("a", 10, 0, when="rank(x) == 4")
    b = candidate("b", 5, 1)
    c = candidate("c", 0, 2)
    chosen, explanation = rt.select("Op", (a, b, c), request(), None)
    assert chosen is b
    assert explanation == (
        "a (priority 10): rejected: rank(x) == 4",
        "b (priority 5): taken",
        "c (priority 0): passes, but b was preferred",
    )


def test_select_demotes_behind_every_undemoted_candidate():
    a = candidate("a", 10, 0, demoted=True)
    b = candidate("b", 10, 1, demoted=True)
    c = candidate("c", 5, 2, when="no")
    d = candidate("d", 0, 3)
    chosen, explanation = rt.select("Op", (a, b, c, d), request(), None)
    assert chosen is d
    assert [line.split(" ")[0] for line in explanation] == ["c", "d", "a", "b"]
    assert explanation[2] == "a (priority 10): demoted: passes, but its demoteWhen holds; d was preferred"


def test_select_takes_a_demoted_candidate_when_nothing_else_passes():
    a = candidate("a", 10, 0, when="no")
    b = candidate("b", 5, 1, demoted=True)
    c = candidate("c", 0, 2, demoted=True)
    chosen, explanation = rt.select("Op", (a, b, c), request(), None)
    assert chosen is b
    assert "taken (demoted" in explanation[1]


def test_select_requires_features():
    a = candidate("a", 10, 0, features=("subgroups",))
    b = candidate("b", 0, 1)
    assert rt.select("Op", (a, b), request(), None)[0] is b
    chosen, explanation = rt.select("Op", (a, b), request(["subgroups"]), None)
    assert chosen is a
    assert (
        rt.select("Op", (a, b), request(), None)[1][0]
        == "a (priority 10): rejected: needs device feature subgroups (the device has: none)"
    )


@pytest.mark.parametrize(
    "error", [ZeroDivisionError("division by zero"), IndexError("no dim 3"), KeyError("k")]
)
def test_select_rejects_a_candidate_whose_when_raises(error):
    def when(request, derived):
        raise error

    a = candidate("a", 10, 0, when=when)
    b = candidate("b", 0, 1)
    chosen, explanation = rt.select("Op", (a, b), request(), None)
    assert chosen is b
    assert explanation[0].startswith(
        "a (priority 10): rejected: when could not be evaluated: " + type(error).__name__
    )


def test_select_does_not_swallow_bugs():
    def when(request, derived):
        raise NameError("undefined_name")

    with pytest.raises(NameError):
        rt.select("Op", (candidate("a", 0, 0, when=when),), request(), None)


def test_select_failure_lists_facts_and_every_candidate():
    a = candidate("a", 10, 0, when="dtypes.T == 'f16'")
    b = candidate("b", 0, 1, features=("shader-f16",))
    with pytest.raises(rt.ContractError) as info:
        rt.select("Op", (a, b), request(["subgroups"]), None)
    error = info.value
    assert (error.op, error.subject, error.rule) == ("Op", "variant", "no candidate")
    text = str(error)
    for fact in ("'x': (2, 3)", "'T': 'f32'", "'epsilon': 1e-05", "features [subgroups]"):
        assert fact in text
    assert "a: dtypes.T == 'f16'" in text
    assert "b: needs device feature shader-f16" in text


def test_select_forced_variant():
    a = candidate("a", 10, 0)
    b = candidate("b", 0, 1)
    c = candidate("c", 0, 2, when="no")
    chosen, explanation = rt.select("Op", (a, b, c), request(), None, variant="b")
    assert chosen is b
    assert explanation[:2] == (
        "a (priority 10): passes, but b was forced with variant=",
        "b (priority 0): taken (forced with variant=)",
    )
    with pytest.raises(rt.ContractError, match="variant 'c' does not apply: no"):
        rt.select("Op", (a, b, c), request(), None, variant="c")
    with pytest.raises(rt.ContractError, match="unknown variant 'z'; known: a, b, c"):
        rt.select("Op", (a, b, c), request(), None, variant="z")


# ---------------------------------------------------------------------------------------------
# Uniforms


def test_pack_uniforms():
    types = (("n", "u32"), ("scale", "f32"), ("offset", "i32"), ("_pad0", "u32"))
    data = rt.pack_uniforms(types, {"n": 7, "scale": 0.5, "offset": -3})
    assert data == struct.pack("<IfiI", 7, 0.5, -3, 0)
    assert len(data) == 16
    assert rt.pack_uniforms((), {}) == b""


@pytest.mark.parametrize("n", [2.5, -1, 2**32, True])
def test_pack_uniforms_refuses_bad_u32(n):
    with pytest.raises(rt.PlanError, match="uniform n"):
        rt.pack_uniforms((("n", "u32"), ("_pad0", "u32"), ("_pad1", "u32"), ("_pad2", "u32")), {"n": n})


# ---------------------------------------------------------------------------------------------
# Running plans on the device

SCALE_WGSL = """
{enable}
override WORKGROUP_SIZE: u32;
override OFFSET: f32;
struct Params {{ n: u32, scale: f32, _pad0: u32, _pad1: u32 }}
@group(0) @binding(0) var<storage, read> x: array<{src}>;
@group(0) @binding(1) var<storage, read_write> y: array<{dst}>;
@group(0) @binding(2) var<uniform> params: Params;
@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {{
  if (g.x < params.n) {{ y[g.x] = {dst}(f32(x[g.x]) * params.scale + OFFSET); }}
}}
"""


def scale_pass(
    name, n, src, dst, scale, offset=0.0, src_kind="input", dst_kind="output", src_key="x", dst_key="y"
):
    wg = 64
    enable = "enable f16;" if "f16" in (src, dst) else ""
    return make_pass(
        name=name,
        label=f"test {name}",
        wgsl=SCALE_WGSL.format(enable=enable, src=src, dst=dst),
        dispatch=rt.threads_dispatch(n, wg, DEFAULT_CAPS, name),
        uniforms={"n": n, "scale": scale},
        uniform_types=(("n", "u32"), ("scale", "f32"), ("_pad0", "u32"), ("_pad1", "u32")),
        overrides={"WORKGROUP_SIZE": wg, "OFFSET": offset},
        override_types={"WORKGROUP_SIZE": "u32", "OFFSET": "f32"},
        bindings=(
            rt.Binding(0, "x", src_kind, src_key, "read-only-storage"),
            rt.Binding(1, "y", dst_kind, dst_key, "storage"),
            rt.Binding(2, "params", "uniform", "params", "uniform"),
        ),
        workgroup_size=wg,
    )


def scale_plan(shape, dtype, scale):
    wgsl_type = {"float32": "f32", "float16": "f16"}[dtype]
    n = rt.numel(shape)
    return make_plan(
        [scale_pass("scale", n, wgsl_type, wgsl_type, scale)], {"x": (shape, dtype)}, {"y": (shape, dtype)}
    )


@pytest.mark.parametrize("shape, dtype", [((3, 100), "float32"), ((7, 11), "float16"), ((5,), "float16")])
def test_run_plan_numpy(device, shape, dtype):
    x = np.random.default_rng(1).standard_normal(shape).astype(dtype)
    out = rt.run_plan(scale_plan(shape, dtype, 2.5), {"x": x}, device)
    assert set(out) == {"y"}
    y = out["y"]
    assert isinstance(y, np.ndarray) and y.shape == shape and y.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(y, (x.astype(np.float32) * np.float32(2.5)).astype(dtype))


def test_run_plan_with_intermediate_and_overrides(device):
    n = 1000
    passes = [
        scale_pass("first", n, "f16", "f32", 3.0, offset=1.0, dst_kind="intermediate", dst_key="t"),
        scale_pass("second", n, "f32", "f32", 0.5, src_kind="intermediate", src_key="t"),
    ]
    plan = make_plan(passes, {"x": ((n,), "float16")}, {"y": ((n,), "float32")}, {"t": ((n,), "float32")})
    x = np.arange(n).astype(np.float16)
    y = rt.run_plan(plan, {"x": x}, device)["y"]
    np.testing.assert_allclose(y, (x.astype(np.float32) * 3 + 1) * 0.5)


def test_run_plan_tensor_chaining(device):
    shape = (9,)  # odd: the f16 buffer is padded
    x = np.linspace(-2, 2, 9).astype(np.float16)
    plan = scale_plan(shape, "float16", 2.0)
    t_in = rt.Tensor.from_numpy(x, device)
    assert t_in.shape == shape and t_in.dtype == np.float16 and t_in.nbytes == 18
    t_mid = rt.run_plan(plan, {"x": t_in})["y"]  # the device comes from the tensor
    assert isinstance(t_mid, rt.Tensor) and t_mid.device is device
    t_out = rt.run_plan(plan, {"x": t_mid}, device)["y"]
    assert isinstance(t_out, rt.Tensor) and t_out.shape == shape
    np.testing.assert_array_equal(t_out.numpy(), x * 4)
    np.testing.assert_array_equal(t_in.numpy(), x)  # inputs are left alone


def test_tensor_round_trip_and_empty(device):
    empty = rt.Tensor.from_numpy(np.zeros((0, 3), np.float16), device)
    assert empty.buffer.size == 4
    assert empty.numpy().shape == (0, 3)
    t = rt.Tensor.empty((2, 3), "float32", device)
    assert t.numpy().shape == (2, 3) and t.dtype == np.float32


def test_run_plan_skips_empty_dispatches(device):
    plan = scale_plan((0, 4), "float32", 2.0)
    assert plan.passes[0].dispatch == (0, 0, 0)
    y = rt.run_plan(plan, {"x": np.zeros((0, 4), np.float32)}, device)["y"]
    assert y.shape == (0, 4) and y.dtype == np.float32


def test_run_plan_checks_before_gpu_work(device):
    limit = rt.device_caps(device).limits["maxComputeInvocationsPerWorkgroup"]
    plan = scale_plan((4,), "float32", 1.0)
    too_wide = rt.Plan(**{**plan.__dict__, "passes": (make_pass(workgroup_size=limit + 1),)})
    with pytest.raises(rt.PlanError, match="maxComputeInvocationsPerWorkgroup"):
        rt.run_plan(too_wide, {"x": np.zeros(4, np.float32)}, device)
    with pytest.raises(rt.ContractError, match="planned shape and dtype"):
        rt.run_plan(plan, {"x": np.zeros(5, np.float32)}, device)
    with pytest.raises(rt.ContractError, match="required input"):
        rt.run_plan(plan, {}, device)


def test_pipelines_are_cached_per_wgsl_and_overrides(device):
    assert rt.default_device() is device
    first = scale_pass("p", 10, "f32", "f32", 1.0)
    same = scale_pass("q", 20, "f32", "f32", 2.0)  # other uniforms: the same pipeline
    other = scale_pass("p", 10, "f32", "f32", 1.0, offset=1.0)
    assert rt.pipeline_for(device, first) is rt.pipeline_for(device, same)
    assert rt.pipeline_for(device, first)[0] is not rt.pipeline_for(device, other)[0]
    assert rt.pipeline_for(device, first)[1] is rt.pipeline_for(device, other)[1]


def test_pipelines_created_counts_live_through_the_package(device):
    """The count is a function of the package, not an int it re-exports (that would be a copy)."""
    from generated._runtime import pipelines, pipelines_created

    before = rt.pipelines_created()
    fresh = scale_pass("p", 10, "f32", "f32", 1.0, offset=float(before) + 0.25)  # an override no pipeline has
    rt.pipeline_for(device, fresh)
    assert rt.pipelines_created() == pipelines_created() == pipelines.pipelines_created() == before + 1
    rt.pipeline_for(device, fresh)  # cached: nothing created
    assert rt.pipelines_created() == before + 1
    assert not hasattr(rt, "pipeline_creations")


# --- tunables: only known names, whole numbers >= 1 ------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1, 2.5, math.inf, math.nan, True, "256"], ids=repr)
def test_bad_tunable_values_are_refused_by_name_before_any_gpu_work(value):
    from generated import ContractError
    from generated import group_normalization as gn

    shapes = {"x": (1, 128, 64, 64), "scale": (128,), "bias": (128,)}
    with pytest.raises(
        ContractError,
        match=r"GroupNormalization-21: tunable STATS_VALUES_PER_SPLIT: .*a whole number from 1 to 2\*\*31 - 1",
    ):
        gn.plan(
            shapes, {"T": "float32"}, attrs={"num_groups": 32}, tunables={"STATS_VALUES_PER_SPLIT": value}
        )
    with pytest.raises(ContractError, match="tunable NOPE: known: WORKGROUP_SIZE"):
        gn.plan(shapes, {"T": "float32"}, attrs={"num_groups": 32}, tunables={"NOPE": 3})


def test_whole_number_tunables_are_accepted_as_ints_or_whole_floats():
    from generated import skip_group_norm as sgn

    shapes = {"X": (2, 8, 8, 64), "gamma": (64,), "beta": (64,), "skip": (2, 8, 8, 64)}
    dtypes = {"T": "float32", "M": "float32"}
    attrs = {"groups": 4, "activation": 0}
    assert sgn.plan(shapes, dtypes, attrs=attrs, tunables={"SPLIT_MAX_ROWS": 1}).variant == "fused"
    as_ints = {"SPLIT_MIN_GROUP_VALUES": 1, "MAX_SLABS": 8, "SLAB_VALUES": 16}
    with_ints = sgn.plan(shapes, dtypes, attrs=attrs, tunables=as_ints)
    with_floats = sgn.plan(
        shapes, dtypes, attrs=attrs, tunables={k: np.float32(v) for k, v in as_ints.items()}
    )
    assert with_ints.variant == with_floats.variant == "split"
    assert [p.dispatch for p in with_floats.passes] == [p.dispatch for p in with_ints.passes]
    assert [p.overrides for p in with_floats.passes] == [p.overrides for p in with_ints.passes]


def test_importing_the_package_reads_no_shader_and_a_plan_reads_only_its_own():
    """Shader tables make a Shader (reading its file) on first use: an app that imports the
    package reads no shader file, and a plan reads the files of its passes' shaders, once."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import generated._runtime.plans as plans
        read = []
        text_of = plans.shader_text.__wrapped__
        plans.shader_text = lambda package, name: (read.append(name), text_of(package, name))[1]
        import generated
        from generated import group_normalization as gn
        table = gn.group_row_registers.MAIN_SHADERS
        assert next(iter(table)) in table and len(table) > 1
        assert read == [], len(read)
        p = gn.plan({"x": (2, 64, 8, 8), "scale": (64,), "bias": (64,)}, {"T": "float32"}, attrs={"num_groups": 8})
        assert read == [pass_.spec for pass_ in p.passes], (read, len(p.passes))
        gn.plan({"x": (2, 64, 8, 8), "scale": (64,), "bias": (64,)}, {"T": "float32"}, attrs={"num_groups": 8})
        assert len(read) == len(p.passes)  # made once
        print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stdout + result.stderr
