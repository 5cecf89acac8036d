"""Hostile Tensors and Sequences (issue 9).

- `Tensor.empty` over maxBufferSize, and Tensors of dtypes no kernel takes (float64, object);
  big-endian dtypes hold native data.
- a Tensor's shape, dtype and device are read-only, its buffer cannot be deleted; a re-pointed
  buffer is checked on read-back, and a Sequence refuses a Tensor whose buffer was re-pointed.
- no adapter is one clear error; a Tensor or Sequence cannot be copied, and says why.

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
from tests.runtime.hostile_support import ATTRS, GN, assert_refused, gn_arrays, gn_tensors, refusal


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
