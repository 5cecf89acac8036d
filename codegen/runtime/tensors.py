"""Tensors resident on a GPU (`Tensor`, and `TensorIn`, what the calls take), and the checks of a
Tensor's shape, dtype, device and buffer.
"""

from __future__ import annotations

import functools
import numbers
import weakref
from collections import abc
from collections.abc import Mapping
from typing import Any, Union

import numpy as np

from .caps import default_device
from .errors import ContractError
from .numeric import _storage_nbytes, numel


_NP_DTYPES = {"float32": np.dtype("float32"), "float16": np.dtype("float16")}  # dtype.name is slow


def _buffer_usage():
    import wgpu

    return wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST


def checked_shape(op, subject, value):
    """A shape as a tuple of ints; anything that is not a sequence of whole numbers >= 0 is refused."""
    if type(value) is tuple and all(type(d) is int and d >= 0 for d in value):
        return value  # the common case, cheaply
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
        raise ContractError(op, subject, "shape", f"a shape is a sequence of whole numbers, got {value!r}")
    dims = []
    for d in value:
        if isinstance(d, bool) or not isinstance(d, numbers.Integral):
            raise ContractError(
                op, subject, "whole dimensions", f"dimension {d!r} of {tuple(value)!r} is not a whole number"
            )
        if d < 0:
            raise ContractError(
                op, subject, "dimensions >= 0", f"dimension {int(d)} of {tuple(value)!r} is negative"
            )
        dims.append(int(d))
    return tuple(dims)


# A caller may destroy `tensor.buffer` itself, and wgpu reports no destroyed state, while
# wgpu-native aborts the whole process when a submission uses a destroyed buffer. So the runtime
# wraps the destroy() of each buffer class it sees in a Tensor (once) to remember which buffers
# were destroyed: a call refuses them by name instead.
_destroyed_buffers: weakref.WeakSet = weakref.WeakSet()
_watched_classes: set = set()
_destroys = [0]  # buffers destroyed so far: Sequence.run() rechecks its buffers only when it moved


def _watch_destroy(cls: type) -> None:
    if cls in _watched_classes:
        return
    _watched_classes.add(cls)
    original = getattr(cls, "destroy", None)
    if not callable(original):
        return

    @functools.wraps(original)
    def destroy(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            _destroyed_buffers.add(self)
        except TypeError:  # not weakly referable: nothing to remember it by
            pass
        _destroys[0] += 1
        return original(self, *args, **kwargs)

    cls.destroy = destroy  # type: ignore[attr-defined]


def buffer_destroyed(buffer: Any) -> bool:
    """Whether `buffer.destroy()` was called on a buffer some Tensor was made over."""
    try:
        return buffer in _destroyed_buffers
    except TypeError:
        return False


def destroys_so_far() -> int:
    return _destroys[0]


class Tensor:
    """A tensor resident on a GPU: a storage buffer with a shape and a dtype.

    The buffer is padded to a multiple of 4 bytes (an f16 tensor of odd length) and is at least
    4 bytes, so that copies, reads and bindings are valid; the padding is never visible.
    A Tensor made over a caller's own buffer is checked when a call uses it: the buffer must hold
    the shape's bytes (padded to 4) and have the usages the call needs.
    """

    __slots__ = ("buffer", "shape", "dtype", "device", "storage_nbytes", "destroyed")

    def __init__(self, buffer: Any, shape: abc.Sequence[int], dtype: Any, device: Any) -> None:
        _watch_destroy(type(buffer))
        self.buffer = buffer
        self.shape: tuple[int, ...] = checked_shape("Tensor", "shape", shape)
        self.dtype = np.dtype(dtype)
        self.device = device
        # The bytes a binding of the whole tensor covers: its bytes padded to a multiple of 4.
        self.storage_nbytes = _storage_nbytes(self.shape, self.dtype.name)
        self.destroyed = False  # set by destroy(): a call or a read-back of it is then refused

    @property
    def nbytes(self) -> int:
        return numel(self.shape) * self.dtype.itemsize

    @classmethod
    def empty(
        cls, shape: abc.Sequence[int], dtype: Any, device: Any = None, usage: int | None = None
    ) -> Tensor:
        device = device if device is not None else default_device()
        shape = checked_shape("Tensor", "shape", shape)
        size = _storage_nbytes(shape, np.dtype(dtype).name)
        buffer = device.create_buffer(size=size, usage=_buffer_usage() if usage is None else usage)
        return cls(buffer, shape, dtype, device)

    @classmethod
    def from_numpy(cls, array: Any, device: Any = None, usage: int | None = None) -> Tensor:
        array = np.asarray(array)
        if not array.dtype.isnative:
            array = array.astype(array.dtype.newbyteorder("="))
        array = np.ascontiguousarray(array)
        tensor = cls.empty(array.shape, array.dtype, device, usage)
        data = array.tobytes()
        if len(data) % 4:
            data += bytes(4 - len(data) % 4)
        if data:
            tensor.device.queue.write_buffer(tensor.buffer, 0, data)
        return tensor

    @property
    def gone(self) -> bool:
        """Whether its buffer was destroyed, by destroy() or by `buffer.destroy()` directly."""
        return self.destroyed or buffer_destroyed(self.buffer)

    def numpy(self) -> np.ndarray:
        """Read the tensor back (waits for the GPU work that writes it)."""
        if self.gone:
            raise ContractError(
                "Tensor", "numpy()", "not destroyed", "the Tensor was destroyed: its buffer is gone"
            )
        if numel(self.shape) == 0:
            return np.empty(self.shape, self.dtype)
        data = self.device.queue.read_buffer(self.buffer, 0, self.storage_nbytes)
        return np.frombuffer(data, self.dtype, count=numel(self.shape)).reshape(self.shape)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """numpy.asarray(tensor): a blocking read-back (waits for the GPU work that writes it)."""
        array = self.numpy()
        return array if dtype is None else array.astype(dtype)

    def destroy(self) -> None:
        """Free the GPU buffer now rather than when the Tensor is collected; the Tensor is unusable after
        (calls and read-backs refuse it); a buffer destroyed directly is refused too."""
        self.destroyed = True
        self.buffer.destroy()

    def __enter__(self) -> Tensor:
        return self

    def __exit__(self, *exc: object) -> bool:
        self.destroy()
        return False

    def __repr__(self):
        return f"Tensor(shape={self.shape}, dtype={self.dtype.name})"


# What the public calls take and give for a tensor: a numpy array or a device Tensor.
TensorIn = Union[np.ndarray, Tensor]


def _usage_names(flags):
    import wgpu

    return [
        name
        for name in ("STORAGE", "COPY_SRC", "COPY_DST", "UNIFORM")
        if flags & getattr(wgpu.BufferUsage, name)
    ]


# WebGPU's GPUBufferUsage flags (the values wgpu.BufferUsage has), without importing wgpu here.
_USAGE_FLAGS = {"COPY_SRC": 0x04, "COPY_DST": 0x08, "UNIFORM": 0x40, "STORAGE": 0x80}


def check_tensor_buffer(op, subject, tensor, usages):
    """Refuse a Tensor whose buffer cannot back its shape, or lacks a usage the call needs.

    A Tensor of no elements is never bound, so its buffer may be anything, 0 bytes included.
    """
    if tensor.destroyed:
        raise ContractError(op, subject, "not destroyed", "the Tensor was destroyed: its buffer is gone")
    if buffer_destroyed(tensor.buffer):
        raise ContractError(
            op,
            subject,
            "not destroyed",
            "the Tensor's buffer was destroyed (buffer.destroy()): make a new Tensor",
        )
    if numel(tensor.shape) == 0:
        return
    need = tensor.storage_nbytes
    size = tensor.buffer.size
    if size < need:
        padded = " (its bytes padded to a multiple of 4)" if need != tensor.nbytes else ""
        raise ContractError(
            op,
            subject,
            "buffer size",
            f"the Tensor's buffer holds {size} bytes, but a {tensor.shape} {tensor.dtype.name} tensor needs {need}{padded}",
        )
    flags = tensor.buffer.usage
    missing = [u for u in usages if not flags & _USAGE_FLAGS[u]]
    if missing:
        has = " | ".join(_usage_names(tensor.buffer.usage)) or "none of STORAGE, COPY_SRC, COPY_DST"
        raise ContractError(
            op,
            subject,
            "buffer usage",
            f"the Tensor's buffer needs usage {' | '.join(missing)}; it was created with {has}",
        )


def _checked_tensor(op, subject, value, spec, device):
    shape, dtype_name = spec
    expected = _NP_DTYPES.get(dtype_name) or np.dtype(dtype_name)
    if value.shape != tuple(shape) or value.dtype != expected or not value.dtype.isnative:
        raise ContractError(
            op,
            subject,
            "planned shape and dtype",
            f"got {value.shape} {_dtype_text(value.dtype)}, the plan is for {tuple(shape)} {dtype_name}",
        )
    if isinstance(value, Tensor):
        if value.device is not device:
            raise ContractError(
                op, subject, "same device", "the tensor lives on another device than the call"
            )
        check_tensor_buffer(op, subject, value, ("STORAGE",))
    return value


def _dtype_text(dtype):
    return (
        dtype.name if dtype.isnative or dtype.byteorder == "|" else f"{dtype.name} ({dtype.str}, big-endian)"
    )
