"""Hostile devices, encoders and caps (issue 9).

- `caps=` (a mapping, or another device's Caps) that claims shader-f16 on a device without it:
  the plan's f16 shaders would fail in create_shader_module; refused in the contract's words.
- `encoder=` that is not a GPUCommandEncoder or is another device's (checked first), or was finished
  or has a pass open (its first command fails: converted).
- `device=` that is not a GPUDevice (a string, an int, a GPUAdapter), for every entry point.
- caps mappings of the wrong types, and a limit `True` after the same request with `1`.
- a device that was destroyed: every entry point raises DeviceLostError naming the caller's call, and
  a lost process default device is replaced by the next default_device().

Every one is refused with a ContractError before any GPU work, never a wgpu error or a raw
TypeError / AttributeError from inside the package (tests/runtime/hostile_support.py checks the
refusal's shape). Shapes are tiny: lavapipe is slow.
"""

from __future__ import annotations

import numpy as np
import pytest

import generated
from generated import ContractError, Sequence, Tensor
from generated import _runtime as rt
from generated import group_normalization as gn
from generated import skip_group_norm as sgn
from tests.runtime.hostile_support import ATTRS, F16_PHRASE, GN, SHAPES, assert_refused, gn_arrays, gn_tensors


# =========================================================================================================
# caps= claiming shader-f16 on a device without it


CLAIMS_F16 = {"features": ["shader-f16"]}


@pytest.mark.parametrize("name", ["x", "X"])
def test_caps_claiming_f16_kernel_is_refused_on_a_device_without_it(device_without_f16, name):
    arrays = gn_arrays(np.float16)
    inputs = {name: arrays["x"], "scale": arrays["scale"], "bias": arrays["bias"]}
    error = assert_refused(
        lambda: gn.kernel(inputs, attrs=ATTRS, device=device_without_f16, caps=CLAIMS_F16), GN, name
    )
    assert F16_PHRASE in str(error), str(error)


def test_another_devices_caps_claiming_f16_is_refused(device_without_f16):
    caps = rt.device_caps(rt.default_device())
    if "shader-f16" not in caps.features:
        pytest.skip("the default device has no shader-f16")
    inputs = gn_arrays(np.float16)
    error = assert_refused(
        lambda: gn.kernel(inputs, attrs=ATTRS, device=device_without_f16, caps=caps), GN, "x"
    )
    assert F16_PHRASE in str(error), str(error)


def test_caps_claiming_f16_warmup_is_refused_on_a_device_without_it(device_without_f16):
    created = rt.pipelines_created()
    error = assert_refused(
        lambda: gn.warmup(
            {"X": SHAPES["x"], "scale": (4,), "bias": (4,)},
            {"T": "float16"},
            ATTRS,
            device=device_without_f16,
            caps=CLAIMS_F16,
        ),
        GN,
        "X",
    )
    assert F16_PHRASE in str(error), str(error)
    assert rt.pipelines_created() == created


def test_caps_claiming_f16_skip_group_norm_is_refused(device_without_f16):
    x = np.zeros((2, 2, 3, 4), np.float16)
    params = np.ones(4, np.float16)
    error = assert_refused(
        lambda: sgn.kernel(
            {"X": x, "gamma": params, "beta": params, "skip": x},
            attrs={"groups": 2, "activation": 0},
            device=device_without_f16,
            caps={"features": ["shader-f16", "subgroups"]},
        ),
        sgn.OP,
        "X",
    )
    assert F16_PHRASE in str(error), str(error)


def test_f32_with_caps_claiming_f16_still_runs(device_without_f16):
    """f32 shaders need no shader-f16: the claim changes nothing the device cannot do."""
    inputs = gn_arrays()
    y = gn.kernel(inputs, attrs=ATTRS, device=device_without_f16, caps=CLAIMS_F16)["y"]
    np.testing.assert_array_equal(y, gn.kernel(inputs, attrs=ATTRS, device=device_without_f16)["y"])


def test_check_shader_features_reads_enable_directives():
    plan = gn.plan(SHAPES, {"T": "float16"}, ATTRS, caps=CLAIMS_F16)
    assert any("enable f16;" in p.wgsl for p in plan.passes)
    rt.check_plan_fits(plan, rt.Caps.from_mapping(CLAIMS_F16))
    with pytest.raises(ContractError, match="input X: float16 needs the device feature shader-f16"):
        rt.check_plan_fits(plan, rt.Caps.from_mapping({}), {"x": "X"})


# =========================================================================================================
# encoder=


@pytest.mark.parametrize(
    "bad", [5, "enc", b"", "device", "pass"], ids=["int", "str", "bytes", "device", "pass"]
)
def test_encoder_that_is_not_a_command_encoder(bad):
    tensors = gn_tensors()
    device = rt.default_device()
    opened = None
    if bad == "device":
        bad = device
    elif bad == "pass":
        outer = device.create_command_encoder()
        bad = opened = outer.begin_compute_pass()
    assert_refused(lambda: gn.kernel(tensors, attrs=ATTRS, encoder=bad), GN, "encoder")
    if opened is not None:
        opened.end()


def test_encoder_of_another_device(other_device):
    tensors = gn_tensors()
    encoder = other_device.create_command_encoder()
    error = assert_refused(lambda: gn.kernel(tensors, attrs=ATTRS, encoder=encoder), GN, "encoder")
    assert "another device" in str(error)
    other_device.queue.submit([encoder.finish()])  # left as it was: still valid


def test_finished_encoder():
    tensors = gn_tensors()
    encoder = rt.default_device().create_command_encoder()
    encoder.finish()
    error = assert_refused(lambda: gn.kernel(tensors, attrs=ATTRS, encoder=encoder), GN, "encoder")
    assert "finished" in str(error)


def test_encoder_with_an_open_pass():
    """Refused when the call's first command fails (WebGPU then marks the encoder invalid: the
    caller's own bug, named); later calls with a fresh encoder are unaffected."""
    tensors = gn_tensors()
    device = rt.default_device()
    encoder = device.create_command_encoder()
    compute = encoder.begin_compute_pass()
    error = assert_refused(lambda: gn.kernel(tensors, attrs=ATTRS, encoder=encoder), GN, "encoder")
    assert "still open" in str(error) and "new one" in str(error)
    compute.end()
    fresh = device.create_command_encoder()
    y = gn.kernel(tensors, attrs=ATTRS, encoder=fresh)["y"]
    device.queue.submit([fresh.finish()])
    np.testing.assert_array_equal(y.numpy(), gn.kernel(gn_arrays(), attrs=ATTRS)["y"])


def test_repeated_out_call_checks_its_encoder_too(other_device):
    """kernel(out=) on the same Tensors replays a recorded call: the encoder is still checked."""
    tensors = gn_tensors()
    device = rt.default_device()
    out = {"y": Tensor.empty(SHAPES["x"], np.float32)}
    encoder = device.create_command_encoder()
    gn.kernel(tensors, attrs=ATTRS, out=out, encoder=encoder)
    device.queue.submit([encoder.finish()])
    assert "finished" in str(
        assert_refused(lambda: gn.kernel(tensors, attrs=ATTRS, out=out, encoder=encoder), GN, "encoder")
    )
    foreign = other_device.create_command_encoder()
    assert_refused(lambda: gn.kernel(tensors, attrs=ATTRS, out=out, encoder=foreign), GN, "encoder")
    assert_refused(lambda: gn.kernel(tensors, attrs=ATTRS, out=out, encoder=7), GN, "encoder")
    fresh = device.create_command_encoder()
    assert gn.kernel(tensors, attrs=ATTRS, out=out, encoder=fresh)["y"] is out["y"]
    device.queue.submit([fresh.finish()])


# =========================================================================================================
# device= that is not a GPUDevice

NOT_DEVICES = {"string": "cuda", "int": 0, "adapter": "adapter"}


def not_a_device(kind, adapter):
    return adapter if NOT_DEVICES[kind] == "adapter" else NOT_DEVICES[kind]


@pytest.mark.parametrize("kind", list(NOT_DEVICES))
@pytest.mark.parametrize("entry", ["kernel", "plain", "plan", "warmup", "tensor"])
def test_device_that_is_not_a_gpu_device(kind, entry, adapter):
    device = not_a_device(kind, adapter)
    arrays = gn_arrays()
    calls = {
        "kernel": lambda: gn.kernel(arrays, attrs=ATTRS, device=device),
        "plain": lambda: gn.group_normalization(*arrays.values(), num_groups=2, device=device),
        "plan": lambda: gn.plan(SHAPES, attrs=ATTRS, device=device),
        "warmup": lambda: gn.warmup(SHAPES, attrs=ATTRS, device=device),
        "tensor": lambda: Tensor.from_numpy(arrays["x"], device),
    }
    op = "Tensor" if entry == "tensor" else GN
    error = assert_refused(calls[entry], op, "device")
    if kind == "adapter":
        assert "request_device_sync" in str(error), str(error)


@pytest.mark.parametrize("kind", list(NOT_DEVICES))
def test_sequence_and_package_warmup_refuse_a_non_device(kind, adapter):
    device = not_a_device(kind, adapter)
    assert_refused(lambda: Sequence(device), "Sequence", "device")
    assert_refused(lambda: generated.warmup(device=device), "warmup", "device")


def test_explain_with_a_non_device_explains_the_refusal():
    text = gn.explain(SHAPES, attrs=ATTRS, device="cuda")
    assert text.startswith("refused: ") and "device" in text.splitlines()[0], text


# =========================================================================================================
# caps mappings of the wrong types

BAD_CAPS = {
    "limits_none": ({"limits": None}, "limits"),
    "features_none": ({"features": None}, "features"),
    "features_nested": ({"features": [["shader-f16"]]}, "features"),
    "features_int": ({"features": 3}, "features"),
    "language_features_none": ({"wgslLanguageFeatures": None}, "wgslLanguageFeatures"),
    "adapter_info_int": ({"adapterInfo": 3}, "adapterInfo"),
    "key_not_a_string": ({1: 2}, "keys"),
    "limit_name_not_a_string": ({"limits": {1: 2}}, "limits"),
}


@pytest.mark.parametrize("name", list(BAD_CAPS))
def test_caps_mapping_of_the_wrong_types(name):
    caps, what = BAD_CAPS[name]
    assert_refused(lambda: gn.plan(SHAPES, attrs=ATTRS, caps=caps), GN, what, names_in="text")
    assert_refused(lambda: gn.kernel(gn_arrays(), attrs=ATTRS, caps=caps), GN, what, names_in="text")


def test_bool_limit_is_refused_after_the_same_caps_with_1():
    """The caps memo must not take True for 1 (they hash alike), whatever came first."""
    limit = "maxComputeWorkgroupsPerDimension"
    try:
        gn.plan(SHAPES, attrs=ATTRS, caps={"limits": {limit: 1}})
    except ContractError:
        pass  # one workgroup a dimension may not fit: only the caps themselves matter here
    assert_refused(
        lambda: gn.plan(SHAPES, attrs=ATTRS, caps={"limits": {limit: True}}), GN, limit, names_in="text"
    )


def test_caps_features_from_an_iterator_are_read_once():
    features = iter(["shader-f16", "timestamp-query"])  # a combination no other test memoised
    plan = gn.plan(SHAPES, {"T": "float16"}, ATTRS, caps={"features": features})
    assert plan.variant == gn.plan(SHAPES, {"T": "float16"}, ATTRS, caps=CLAIMS_F16).variant


# --- a lost device ---------------------------------------------------------------------------------


def lost_device_calls(device, tensors, out, sequence):
    """Every public entry point, on a device that is lost by the time they run."""
    return {
        "kernel() of arrays": lambda: gn.kernel(gn_arrays(), attrs=ATTRS, device=device),
        "kernel() of Tensors, out=": lambda: gn.kernel(tensors, attrs=ATTRS, out={"y": out}),
        "kernel() of Tensors": lambda: gn.kernel(tensors, attrs=ATTRS),
        "Sequence.run()": sequence.run,
        "Sequence.kernel()": lambda: sequence.kernel(gn, tensors, attrs=ATTRS),
        "Tensor.numpy()": out.numpy,
        "Tensor.from_numpy()": lambda: Tensor.from_numpy(np.ones(3, np.float32), device),
        "Tensor.empty()": lambda: Tensor.empty((3,), "float32", device),
        "warmup() of a new shape": lambda: gn.warmup(
            {"x": (1, 8, 4), "scale": (8,), "bias": (8,)}, {"T": "float32"}, ATTRS, device=device
        ),
        "warmup() of pipelines it made": lambda: gn.warmup(SHAPES, {"T": "float32"}, ATTRS, device=device),
        "package warmup()": lambda: generated.warmup(device),
    }


EXPECTED_OP = {
    "package warmup()": "warmup",
    "Sequence.run()": "Sequence.run()",
    "Sequence.kernel()": "Sequence.kernel()",
    "Tensor.numpy()": "Tensor.numpy()",
    "Tensor.from_numpy()": "Tensor.from_numpy()",
    "Tensor.empty()": "Tensor.empty()",
}


def test_a_destroyed_device_is_one_clear_error_at_every_entry_point(adapter):
    """After device.destroy(), every entry point raises DeviceLostError naming the call the caller
    made (not wgpu's "Parent device is lost" validation error), and the process goes on. The same
    call that worked before the destroy is among them (its repeat memo holds the recorded call)."""
    device = adapter.request_device_sync(required_features=[])
    tensors = {k: Tensor.from_numpy(v, device) for k, v in gn_arrays().items()}
    out = Tensor.empty((2, 4, 3), "float32", device)
    sequence = Sequence(device)
    sequence.kernel(gn, tensors, attrs=ATTRS)
    gn.kernel(tensors, attrs=ATTRS, out={"y": out})
    gn.warmup(SHAPES, {"T": "float32"}, ATTRS, device=device)
    device.destroy()
    for name, call in lost_device_calls(device, tensors, out, sequence).items():
        with pytest.raises(generated.DeviceLostError) as caught:
            call()
        op = EXPECTED_OP.get(name, GN)
        assert str(caught.value).startswith(f"{op}: the GPU device is lost"), (name, str(caught.value))
        assert caught.value.op == op


def test_a_lost_default_device_is_replaced_by_the_next_default_device(adapter, monkeypatch):
    """Where the lost device is the process default one, the error also forgets it, so that
    default_device() (and every call without device=) makes a new one."""
    from generated._runtime import caps as runtime_caps

    lost = adapter.request_device_sync(required_features=[])
    monkeypatch.setattr(runtime_caps, "_default_device", lost)
    assert generated.default_device() is lost
    lost.destroy()
    with pytest.raises(generated.DeviceLostError):
        gn.kernel(gn_arrays(), attrs=ATTRS)
    fresh = generated.default_device()
    assert fresh is not lost
    np.testing.assert_allclose(
        gn.kernel(gn_arrays(), attrs=ATTRS)["y"], gn.kernel(gn_arrays(), attrs=ATTRS, device=fresh)["y"]
    )
