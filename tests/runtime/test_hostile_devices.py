"""Hostile devices, encoders, caps and Tensors: every one is refused with a ContractError before any
GPU work, never a wgpu error or a raw TypeError / AttributeError from inside the package.

- `caps=` (a mapping, or another device's Caps) that claims shader-f16 on a device without it:
  the plan's f16 shaders would fail in create_shader_module; refused in the contract's words.
- `encoder=` that is not a GPUCommandEncoder or is another device's (checked first), or was finished
  or has a pass open (its first command fails: converted).
- `device=` that is not a GPUDevice (a string, an int, a GPUAdapter), for every entry point.
- `Tensor.empty` over maxBufferSize, and Tensors of dtypes no kernel takes (float64, object).
- caps mappings of the wrong types, and a limit `True` after the same request with `1`.
- a Tensor's shape, dtype and device are read-only; a re-pointed buffer is checked on read-back.
- a device that was destroyed: every entry point raises DeviceLostError naming the caller's call, and
  a lost process default device is replaced by the next default_device().

Shapes are tiny: lavapipe is slow.
"""

from __future__ import annotations

import numpy as np
import pytest

import generated
from generated import ContractError, Sequence, Tensor
from generated import _runtime as rt
from generated import group_normalization as gn
from generated import skip_group_norm as sgn
from tests.runtime.hostile_support import F16_PHRASE, assert_refused, refusal

GN = gn.OP
ATTRS = {"num_groups": 2}
SHAPES = {"x": (2, 4, 3), "scale": (4,), "bias": (4,)}


def gn_arrays(dtype=np.float32, shape=(2, 4, 3)):
    rng = np.random.default_rng(3)
    return {
        "x": rng.standard_normal(shape).astype(dtype),
        "scale": rng.uniform(0.5, 1.5, shape[1]).astype(dtype),
        "bias": rng.uniform(-0.5, 0.5, shape[1]).astype(dtype),
    }


def gn_tensors(dtype=np.float32):
    return {k: Tensor.from_numpy(v) for k, v in gn_arrays(dtype).items()}


@pytest.fixture(scope="module")
def adapter():
    import wgpu

    return wgpu.gpu.request_adapter_sync(power_preference="high-performance")


@pytest.fixture(scope="module")
def device_without_f16(adapter):
    device = adapter.request_device_sync(required_features=[])
    assert "shader-f16" not in device.features
    return device


@pytest.fixture(scope="module")
def other_device(adapter):
    return adapter.request_device_sync(required_features=[])


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
# Tensors: buffer size, dtypes


def test_tensor_over_max_buffer_size():
    limit = rt.device_caps(rt.default_device()).limits["maxBufferSize"]
    shape = (limit // 4 + 1,)
    error = assert_refused(lambda: Tensor.empty(shape, np.float32), "Tensor", "shape")
    assert str(shape) in str(error) and "maxBufferSize" in str(error), str(error)


@pytest.mark.parametrize(
    "array",
    [np.ones(3), np.array([object(), 1]), np.ones(3, np.int32), np.ones(3, np.complex64)],
    ids=["float64", "object", "int32", "complex64"],
)
def test_tensor_from_numpy_refuses_dtypes_no_kernel_takes(array):
    error = assert_refused(lambda: Tensor.from_numpy(array), "Tensor", "array")
    assert "float32 or float16" in str(error)


@pytest.mark.parametrize("dtype", ["float64", "float33", None, "int8"])
def test_tensor_empty_refuses_dtypes_no_kernel_takes(dtype):
    assert_refused(lambda: Tensor.empty((3,), dtype), "Tensor", "dtype")


@pytest.mark.parametrize("dtype", [">f4", ">f2", np.dtype("float32").newbyteorder(">"), "<f4"])
def test_tensor_empty_and_views_of_big_endian_dtypes_hold_native_data(dtype):
    """A GPU buffer holds little-endian data: a Tensor described as big-endian read back byte-swapped
    garbage (an audit found [4.6e-41, ...] for [1, 2, 3])."""
    device = rt.default_device()
    values = np.array([1.0, 2.0, -3.5, 0.25], np.dtype(dtype).newbyteorder("="))
    source = Tensor.from_numpy(values)
    for tensor in (
        Tensor.empty(values.shape, dtype),
        Tensor(device.create_buffer(size=16, usage=source.buffer.usage), (4,), dtype, device),
    ):
        assert tensor.dtype.isnative and tensor.dtype.name == values.dtype.name
        encoder = device.create_command_encoder()
        encoder.copy_buffer_to_buffer(source.buffer, 0, tensor.buffer, 0, source.nbytes)
        device.queue.submit([encoder.finish()])
        np.testing.assert_array_equal(tensor.numpy(), values)


def test_tensor_from_numpy_keeps_float32_float16_and_converts_big_endian():
    for array in (np.arange(3, dtype=np.float32), np.arange(3, dtype=np.float16), np.arange(3, dtype=">f4")):
        tensor = Tensor.from_numpy(array)
        assert tensor.dtype.isnative and tensor.dtype.name == array.dtype.name
        np.testing.assert_array_equal(tensor.numpy(), array)


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


# =========================================================================================================
# What describes a Tensor's buffer is read-only


@pytest.mark.parametrize(
    "name, value",
    [("shape", (4, 4, 3)), ("dtype", np.dtype("float16")), ("device", None), ("storage_nbytes", 1 << 20)],
)
def test_tensor_description_is_read_only(name, value):
    arrays = gn_arrays()
    tensor = Tensor.from_numpy(arrays["x"][:1])
    with pytest.raises(AttributeError, match=f"Tensor.{name} is read-only"):
        setattr(tensor, name, value)
    with pytest.raises(AttributeError, match="read-only"):
        delattr(tensor, name)
    assert tensor.shape == (1, 4, 3) and tensor.dtype == np.float32
    y = gn.kernel({**arrays, "x": tensor}, attrs=ATTRS)["y"]
    assert y.shape == (1, 4, 3)


def test_tensor_buffer_cannot_be_deleted():
    """del tensor.buffer left a Tensor every call and read-back broke on with an AttributeError from
    inside the package (an audit found it); re-pointing stays possible and checked."""
    arrays = gn_arrays()
    tensor = Tensor.from_numpy(arrays["x"])
    with pytest.raises(AttributeError, match="Tensor.buffer cannot be deleted: re-point it"):
        del tensor.buffer
    with pytest.raises(AttributeError, match="no attribute 'colour'"):
        del tensor.colour
    np.testing.assert_array_equal(tensor.numpy(), arrays["x"])
    assert gn.kernel({**arrays, "x": tensor}, attrs=ATTRS)["y"].shape == arrays["x"].shape


def test_masked_arrays_with_masked_values_are_refused():
    """The kernels cannot apply a mask: a masked 1e6 silently dominated the statistics (an audit found
    it). A masked array with nothing masked is its data."""
    arrays = gn_arrays()
    masked = np.ma.masked_array(arrays["x"], mask=np.zeros(arrays["x"].shape, bool))
    np.testing.assert_array_equal(
        gn.kernel({**arrays, "x": masked}, attrs=ATTRS)["y"], gn.kernel(arrays, attrs=ATTRS)["y"]
    )
    masked[0, 0, 0] = np.ma.masked
    error = assert_refused(lambda: gn.kernel({**arrays, "x": masked}, attrs=ATTRS), GN, "input x")
    assert "masked array" in str(error)
    with pytest.raises(ContractError, match="masked array"):
        Tensor.from_numpy(masked)


def test_attribute_names_that_are_not_strings_are_refused():
    """A non-string key among unknown ones raised sorted()'s TypeError (an audit found it)."""
    error = assert_refused(lambda: gn.kernel(gn_arrays(), attrs={**ATTRS, 1: 2, "zz": 3}), GN, "attrs")
    assert "attribute names are strings, got 1" in str(error)


def test_destroyed_cannot_be_reset():
    tensor = Tensor.from_numpy(np.ones(4, np.float32))
    tensor.destroy()
    with pytest.raises(AttributeError, match="read-only"):
        tensor.destroyed = False
    assert_refused(tensor.numpy, "Tensor", "numpy()")


def test_a_repointed_buffer_is_checked_on_read_back(other_device):
    device = rt.default_device()
    tensor = Tensor.from_numpy(np.ones((4, 4), np.float32))
    kept = tensor.buffer
    tensor.buffer = device.create_buffer(size=16, usage=kept.usage)
    error = assert_refused(tensor.numpy, "Tensor", "numpy()")
    assert "holds 16 bytes" in str(error)
    tensor.buffer = other_device.create_buffer(size=64, usage=kept.usage)
    assert "another device" in str(assert_refused(tensor.numpy, "Tensor", "numpy()"))
    tensor.buffer = kept
    np.testing.assert_array_equal(tensor.numpy(), np.ones((4, 4), np.float32))


def test_tensor_needs_a_device():
    import wgpu

    buffer = rt.default_device().create_buffer(size=16, usage=wgpu.BufferUsage.STORAGE)
    assert_refused(lambda: Tensor(buffer, (4,), np.float32, None), "Tensor", "device")
    assert_refused(lambda: Tensor(buffer, (4,), np.float32, "cuda"), "Tensor", "device")
    assert refusal(lambda: Tensor(buffer, (4,), np.float64, rt.default_device())).subject == "dtype"


# --- Sequence over re-pointed buffers; no adapter; copies -------------------------------------


def _recorded_sequence():
    tensors = gn_tensors()
    sequence = Sequence()
    y = sequence.kernel(gn, tensors, ATTRS)["y"]
    return sequence, tensors, y


@pytest.mark.parametrize("which", ["input", "output"])
@pytest.mark.parametrize("destroy_old", [False, True], ids=["kept", "destroyed"])
def test_sequence_refuses_a_tensor_whose_buffer_was_repointed(which, destroy_old):
    """A recorded call binds the buffer a Tensor had then: after `tensor.buffer = other`, run()
    would read the old buffer (silently stale), or, with the old one destroyed, abort the process
    in wgpu-native's submit. Refused by name instead; pointing it back runs again."""
    sequence, tensors, y = _recorded_sequence()
    sequence.run()
    tensor = tensors["x"] if which == "input" else y
    old = tensor.buffer
    tensor.buffer = rt.default_device().create_buffer(size=old.size, usage=old.usage)
    error = refusal(sequence.run)
    assert error.subject == "run()" and "re-pointed" in str(error), str(error)
    if destroy_old:
        old.destroy()
        assert "re-pointed" in str(refusal(sequence.run))
        return
    tensor.buffer = old
    sequence.run()
    np.testing.assert_array_equal(y.numpy(), gn.kernel(gn_arrays(), attrs=ATTRS)["y"])


def test_no_adapter_is_one_clear_error(monkeypatch):
    """wgpu 0.32 raises (where older versions returned None) when it finds no adapter: the default
    device says so in one line and how to get one, and the error names wgpu's own reason."""
    import wgpu

    from generated._runtime import caps as caps_module

    def no_adapter(**_):
        raise RuntimeError(
            "Request adapter failed (3): Validation Error\n\nCaused by:\n  No suitable graphics adapter found"
        )

    monkeypatch.setattr(caps_module, "_default_device", None)
    monkeypatch.setattr(wgpu.gpu, "request_adapter_sync", no_adapter)
    with pytest.raises(generated.NoAdapterError) as info:
        rt.default_device()
    assert info.value.reason == "No suitable graphics adapter found"
    assert str(info.value).startswith("no WebGPU adapter (No suitable graphics adapter found); ")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("how", ["copy", "deepcopy", "pickle"])
def test_a_tensor_or_sequence_cannot_be_copied_and_says_why(how):
    import copy
    import pickle

    action = {"copy": copy.copy, "deepcopy": copy.deepcopy, "pickle": pickle.dumps}[how]
    sequence, tensors, _ = _recorded_sequence()
    with pytest.raises(TypeError, match="a Tensor is a GPU buffer"):
        action(tensors["x"])
    with pytest.raises(TypeError, match="a Sequence holds GPU pipelines"):
        action(sequence)


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


# --- buffers, usages, caps and values an audit found reaching wgpu or Python's own errors --------


def mapped_tensor(dtype=np.float32, shape=(2, 4, 3)):
    import wgpu

    device = generated.default_device()
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC
    buffer = device.create_buffer(size=nbytes, usage=usage, mapped_at_creation=True)
    return Tensor(buffer, shape, dtype, device)


def test_a_mapped_buffer_is_refused_wherever_it_would_be_submitted():
    """A submission that uses a still-mapped buffer aborts wgpu-native (the whole process): as an
    input, as out=, read back, or recorded into a Sequence, it is refused by name first."""
    arrays = gn_arrays()
    cases = {
        "input x": lambda: gn.kernel({**arrays, "x": mapped_tensor()}, attrs=ATTRS),
        "out y": lambda: gn.kernel(gn_tensors(), attrs=ATTRS, out={"y": mapped_tensor()}),
        "numpy()": lambda: mapped_tensor().numpy(),
        "Sequence input x": lambda: Sequence().kernel(
            gn, {**gn_tensors(), "x": mapped_tensor()}, attrs=ATTRS
        ),
    }
    for subject, call in cases.items():
        error = refusal(call)
        assert "is mapped" in error.message and "unmap()" in error.message and error.rule == "unmapped", (
            subject,
            error,
        )


def test_a_call_in_pieces_needs_copy_sources_where_it_copies():
    """A call whose tensors pass maxStorageBufferBindingSize runs in pieces; a cut within a batch
    item copies each piece's per-channel inputs (scale, bias) to aligned scratch, so a scale buffer
    without COPY_SRC is refused up front, naming why, not left to fail in wgpu's finish() (or the
    caller's, with encoder=). X is bound by ranges, never copied: it needs no COPY_SRC, nor does
    any input of a call cut only between batch items."""
    import wgpu

    no_copy_src = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST
    attrs = {"num_groups": 6}
    arrays = gn_arrays(shape=(1, 12, 1024))
    caps = {"limits": {"maxStorageBufferBindingSize": 4 * 4 * 1024}}
    plan = gn.plan({k: v.shape for k, v in arrays.items()}, {"T": "float32"}, attrs, caps=caps)
    assert {key for chunk in plan.chunks for key in chunk.copies} == {"scale", "bias"}
    expected = gn.kernel(arrays, attrs=attrs)["y"]
    for key in ("x", "scale"):
        tensors = {
            k: Tensor.from_numpy(v, usage=no_copy_src if k == key else None) for k, v in arrays.items()
        }
        if key == "scale":
            error = refusal(lambda: gn.kernel(tensors, attrs=attrs, caps=caps))
            assert (
                error.subject == "input scale" and "COPY_SRC (the call runs in pieces" in error.message
            ), error
        else:
            np.testing.assert_allclose(
                gn.kernel(tensors, attrs=attrs, caps=caps)["y"].numpy(), expected, rtol=1e-5, atol=1e-5
            )
    batch_cut = gn_arrays(shape=(4, 4, 512))
    batch_caps = {"limits": {"maxStorageBufferBindingSize": 4 * 4 * 512}}
    tensors = {k: Tensor.from_numpy(v, usage=no_copy_src) for k, v in batch_cut.items()}
    np.testing.assert_allclose(
        gn.kernel(tensors, attrs=ATTRS, caps=batch_caps)["y"].numpy(),
        gn.kernel(batch_cut, attrs=ATTRS)["y"],
        rtol=1e-5,
        atol=1e-5,
    )


def test_a_mappable_buffer_is_refused_for_a_call_and_string_usages_are_read(adapter):
    """With wgpu's native mappable-primary-buffers a STORAGE buffer can also be MAP_READ, and a map
    while a recorded call (a repeat of kernel(out=), a Sequence) binds it would abort wgpu-native:
    a call refuses such a buffer. usage= also takes wgpu's "STORAGE | COPY_DST" text."""
    import wgpu

    tensor = Tensor.empty((4,), "float32", usage="STORAGE | COPY_SRC | COPY_DST")
    assert (
        tensor.buffer.usage
        == wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
    )
    assert (
        "BufferUsage flags" in refusal(lambda: Tensor.empty((4,), "float32", usage="STORAGE | NOPE")).message
    )
    if "mappable-primary-buffers" not in adapter.features:
        pytest.skip("the adapter has no mappable-primary-buffers")
    device = adapter.request_device_sync(required_features=["mappable-primary-buffers"])
    usage = (
        wgpu.BufferUsage.STORAGE
        | wgpu.BufferUsage.COPY_SRC
        | wgpu.BufferUsage.COPY_DST
        | wgpu.BufferUsage.MAP_READ
    )
    mappable = Tensor(device.create_buffer(size=96, usage=usage), (2, 4, 3), np.float32, device)
    tensors = {k: Tensor.from_numpy(v, device) for k, v in gn_arrays().items()}
    error = refusal(lambda: gn.kernel(tensors, attrs=ATTRS, out={"y": mappable}))
    assert error.rule == "not mappable", error
    error = refusal(lambda: gn.kernel({**tensors, "x": mappable}, attrs=ATTRS))
    assert error.rule == "not mappable" and error.subject == "input x", error


@pytest.mark.parametrize(
    "usage,words",
    [
        (0, "BufferUsage flags"),
        (-1, "BufferUsage flags"),
        (True, "BufferUsage flags"),
        (1 << 12, "BufferUsage flags"),
        (0x81, "mappable"),
    ],
)
def test_tensor_empty_refuses_usages_wgpu_would_refuse(usage, words):
    error = refusal(lambda: Tensor.empty((3,), "float32", usage=usage))
    assert words in error.message, error


def test_tensor_from_numpy_needs_copy_dst_and_keeps_a_0d_shape():
    import wgpu

    error = refusal(lambda: Tensor.from_numpy(np.ones(3, np.float32), usage=wgpu.BufferUsage.STORAGE))
    assert "COPY_DST" in error.message, error
    scalar = Tensor.from_numpy(np.float32(3.5))
    assert scalar.shape == () and scalar.numpy() == np.float32(3.5)


@pytest.mark.parametrize("buffer", [None, "buffer", 3, np.zeros(4)])
def test_a_tensor_is_made_over_a_gpu_buffer_only(buffer):
    error = refusal(lambda: Tensor(buffer, (4,), np.float32, generated.default_device()))
    assert error.subject == "buffer" and type(buffer).__name__ in error.message, error
    tensor = Tensor.from_numpy(np.ones(4, np.float32))
    with pytest.raises(ContractError, match="GPUBuffer"):
        tensor.buffer = buffer


@pytest.mark.parametrize(
    "limits,words",
    [
        ({"maxComputeWorkgroupsPerDimension": 0}, "at least 1"),
        ({"maxComputeInvocationsPerWorkgroup": 0}, "at least 1"),
        ({"minStorageBufferOffsetAlignment": 0}, "power of two"),
        ({"minStorageBufferOffsetAlignment": 3}, "power of two"),
        ({"minUniformBufferOffsetAlignment": 96}, "power of two"),
    ],
)
def test_caps_limits_no_device_can_have_are_refused(limits, words):
    error = refusal(lambda: gn.plan(SHAPES, {"T": "float32"}, ATTRS, caps={"limits": limits}))
    assert words in error.message, error
    assert words in gn.explain(SHAPES, {"T": "float32"}, ATTRS, caps={"limits": limits}).splitlines()[0]


@pytest.mark.parametrize(
    "limits,words",
    [
        ({"maxStorageBuffersPerShaderStage": 1}, "storage buffers, over maxStorageBuffersPerShaderStage = 1"),
        ({"maxBindGroups": 0}, "1 bind group, over maxBindGroups = 0"),
        ({"maxUniformBufferBindingSize": 4}, "bytes of Params, over maxUniformBufferBindingSize = 4"),
        ({"maxBindingsPerBindGroup": 2}, "bindings in its group, over maxBindingsPerBindGroup = 2"),
    ],
)
def test_caps_with_fewer_bindings_than_a_pass_needs_are_refused(limits, words):
    """Limits below WebGPU's defaults exist (OpenGL devices allow 4 storage buffers a stage): a
    pass that binds more than the caps allow is refused by name, not planned for wgpu to refuse
    its pipeline mid-call (an audit found them accepted and ignored)."""
    error = refusal(lambda: gn.plan(SHAPES, {"T": "float32"}, ATTRS, caps={"limits": limits}))
    assert words in error.message, error


def test_a_caps_instance_gets_the_checks_of_a_mapping():
    """dataclasses.replace on a Caps (device_caps() returns one) skipped every check: KeyError,
    ZeroDivisionError and a string of features matched as substrings (an audit found them)."""
    import dataclasses

    from generated._runtime import Caps

    base = Caps.from_mapping({})
    assert dataclasses.replace(base, limits={}).limits == base.limits  # left-out limits: WebGPU's defaults
    for change, words in (
        ({"limits": {"minStorageBufferOffsetAlignment": 0}}, "an alignment is a power of two"),
        ({"limits": {"maxBufferSize": "big"}}, "limits.maxBufferSize"),
        ({"limits": {"maxBufferSise": 4}}, "unknown WebGPU limits: maxBufferSise"),
        ({"features": "shader-f16 subgroups"}, "features must be a list of names"),
    ):
        with pytest.raises(ContractError) as raised:
            dataclasses.replace(base, **change)
        assert words in str(raised.value), (change, raised.value)


@pytest.mark.parametrize("name", ["epsilon", "num_groups"])
def test_an_attribute_beyond_floats_range_is_refused(name):
    attrs = {**ATTRS, name: 10**400}
    error = refusal(lambda: gn.kernel(gn_arrays(), attrs=attrs))
    assert error.subject == f"attribute {name}" and "32-bit" in error.message, error
    assert "32-bit" in gn.explain(SHAPES, {"T": "float32"}, attrs).splitlines()[0]


def test_shapes_that_are_0d_arrays_or_iterators():
    error = refusal(lambda: gn.plan({**SHAPES, "x": np.array(5)}, {"T": "float32"}, ATTRS))
    assert "a shape is a sequence" in error.message, error
    once = gn.plan({**SHAPES, "x": (d for d in SHAPES["x"])}, {"T": "float32"}, ATTRS)
    assert once.variant == gn.plan(SHAPES, {"T": "float32"}, ATTRS).variant  # read once, planned right


def test_outputs_naming_none_is_refused():
    error = refusal(lambda: gn.kernel(gn_arrays(), attrs=ATTRS, outputs=()))
    assert error.subject == "outputs" and "at least one output" in error.message, error


@pytest.mark.parametrize("flag", ["no", 1, None, np.float32(1)])
def test_a_plain_functions_output_flag_is_a_bool(flag):
    """return_sum="no" used to ask for S (any truthy value did); a flag is True or False."""
    x = np.ones((1, 2, 2, 4), np.float32)
    c = np.ones(4, np.float32)
    error = refusal(lambda: sgn.skip_group_norm(x, c, c, x, None, groups=2, activation=0, return_sum=flag))
    assert error.subject == "argument return_sum" and "True or False" in error.message, error
    y, s = sgn.skip_group_norm(x, c, c, x, None, groups=2, activation=0, return_sum=np.bool_(True))
    assert y.shape == s.shape == x.shape


WATCHED_BEFORE_ANY_TENSOR = """
import numpy as np, wgpu
import generated
from generated import group_normalization as gn
device = generated.default_device()  # the package sees a device; no Tensor exists yet
buffer = device.create_buffer(size=2 * 8 * 16 * 4, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
buffer.destroy()
x = generated.Tensor(buffer, (2, 8, 16), np.float32, device)
try:
    gn.kernel({"x": x, "scale": np.ones(8, np.float32), "bias": np.zeros(8, np.float32)}, attrs={"num_groups": 4})
    print("ran")
except generated.ContractError as error:
    print("refused:", error.rule)
"""


def test_a_buffer_destroyed_before_any_tensor_is_known_once_the_device_was_seen():
    """wgpu reports no destroyed state, so the package watches destroy() from the first device it
    sees (here the default one), not from the first Tensor: a fresh process, where no Tensor has
    been made yet, still refuses the destroyed buffer by name (a submission with it can abort)."""
    import os
    import subprocess
    import sys

    child = subprocess.run(
        [sys.executable, "-c", WATCHED_BEFORE_ANY_TENSOR],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    assert "refused: not destroyed" in child.stdout, (child.stdout, child.stderr[-2000:])


def test_tensor_dtypes_take_the_wgsl_names_as_plan_does():
    """numpy reads "f16" as float128: Tensor.empty((3,), "f16") was refused as "dtype float128"."""
    assert Tensor.empty((3,), "f16").dtype == np.float16
    assert Tensor.empty((3,), "f32").dtype == np.float32
    with pytest.raises(ContractError, match="float32 or float16"):
        Tensor.empty((3,), "f64")
