# SPDX-License-Identifier: Apache-2.0
"""Tensors resident on a GPU (`Tensor`, and `TensorIn`, what the calls take), the checks of a
Tensor's shape, dtype, device and buffer, and of a caller's command encoder (`check_encoder`); a
Tensor of the runtime's making takes its buffer from the device's pool and gives it back.
"""

from __future__ import annotations

import numbers
import sys
import threading
from collections import abc
from collections.abc import Mapping
from typing import Any, Union

import numpy as np

from .allocator import pool_of, STORAGE_USAGE
from .buffer_watch import buffer_destroyed, count_buffer_change, release_later, watch_buffer_class
from .caps import checked_device, default_device, device_caps, refusing_lost_device
from .errors import ContractError
from .numeric import numel, storage_nbytes
from .transfers import checked_out_array, ReadBack, upload


_NP_DTYPES = {"float32": np.dtype("float32"), "float16": np.dtype("float16")}  # dtype.name is slow
_WGSL_DTYPE_NAMES = {"f32": "float32", "f16": "float16"}


def checked_shape(op, subject, value):
    """A shape as a tuple of ints; anything that is not a sequence of whole numbers >= 0 is refused."""
    if type(value) is tuple and all(type(d) is int and d >= 0 for d in value):
        return value  # the common case, cheaply
    if (
        isinstance(value, (str, bytes, Mapping))
        or not hasattr(value, "__iter__")
        or (isinstance(value, np.ndarray) and value.ndim != 1)
    ):
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


def refuse_masked(op, subject, value):
    """A numpy masked array with masked values: the kernels would read them as ordinary values (ONNX
    has no masks), so the caller's mask would be silently ignored."""
    if isinstance(value, np.ma.MaskedArray) and np.ma.is_masked(value):
        raise ContractError(
            op,
            subject,
            "no masked values",
            "a masked array: the kernels read every value and cannot apply its mask; "
            "pass array.filled(value) or array.data",
        )


def tensor_dtype(op, subject, dtype):
    """A Tensor's dtype as numpy's: float32 or float16 (the kernels' types), given in either byte
    order and kept in the native one (a GPU buffer holds little-endian data: a big-endian dtype made
    read-backs byte-swapped garbage); the WGSL names "f32" and "f16" too, as plan() takes them (numpy
    reads "f16" as float128)."""
    try:
        value = np.dtype(_WGSL_DTYPE_NAMES.get(dtype, dtype) if isinstance(dtype, str) else dtype)
    except (TypeError, ValueError):
        value = None
    if value is None or value.name not in _NP_DTYPES:
        got = f"dtype {value}" if value is not None else repr(dtype)
        hint = " (convert with .astype(numpy.float32))" if value is not None and value.kind in "fiub" else ""
        raise ContractError(
            op, subject, "float32 or float16", f"a Tensor holds float32 or float16 data, got {got}{hint}"
        )
    return _NP_DTYPES[value.name]


def _checked_buffer(buffer: Any) -> None:
    """A Tensor's buffer must be a wgpu GPUBuffer (whose destroy() is then watched)."""
    import wgpu

    if not isinstance(buffer, wgpu.GPUBuffer):
        raise ContractError(
            "Tensor",
            "buffer",
            "a GPUBuffer",
            f"a Tensor is made over a wgpu GPUBuffer (device.create_buffer()), not {type(buffer).__name__}",
        )
    watch_buffer_class(type(buffer))


# The usages a buffer may have (WebGPU's GPUBufferUsage bits), and the two that combine with one
# other only: MAP_READ with COPY_DST, MAP_WRITE with COPY_SRC.
_ALL_USAGES = 0x3FF
_MAP_PARTNERS = {0x01: 0x08, 0x02: 0x04}


def _checked_usage(usage: Any, needs: int, why: str) -> int:
    """`usage=` of Tensor.empty / from_numpy: wgpu BufferUsage flags that wgpu accepts (an int, or
    wgpu's "STORAGE | COPY_DST" text), with `needs`."""
    if isinstance(usage, str):
        from wgpu._coreutils import str_flag_to_int
        import wgpu

        try:
            usage = str_flag_to_int(wgpu.BufferUsage, usage)
        except (KeyError, ValueError, AttributeError) as error:
            raise ContractError(
                "Tensor", "usage", "BufferUsage flags", f"usage= {usage!r} is not BufferUsage flags: {error}"
            ) from None
    if isinstance(usage, bool) or not isinstance(usage, numbers.Integral) or not 0 < usage <= _ALL_USAGES:
        raise ContractError(
            "Tensor", "usage", "BufferUsage flags", f"usage= takes wgpu.BufferUsage flags, got {usage!r}"
        )
    usage = int(usage)
    for map_bit, partner in _MAP_PARTNERS.items():
        if usage & map_bit and usage & ~(map_bit | partner):
            raise ContractError(
                "Tensor",
                "usage",
                "mappable usages",
                f"usage {usage:#x}: a mappable buffer takes only MAP_READ | COPY_DST or MAP_WRITE | COPY_SRC",
            )
    if usage & needs != needs:
        raise ContractError("Tensor", "usage", "buffer usage", f"usage {usage:#x} lacks {why}")
    return usage


def check_encoder(op: str, encoder: Any, device: Any) -> None:
    """Refuse an `encoder=` that is not a GPUCommandEncoder or is another device's. (One that was
    finished or has a pass open is refused when the call's first command fails: `_submit`. wgpu
    reports neither state, and tracking it would mean wrapping wgpu's classes for the whole app.)"""
    import wgpu

    if not isinstance(encoder, wgpu.GPUCommandEncoder):
        raise ContractError(
            op,
            "encoder",
            "a GPUCommandEncoder",
            f"encoder= takes a GPUCommandEncoder (device.create_command_encoder()), not {type(encoder).__name__}",
        )
    # wgpu-py 0.32 keeps the device of a GPU object only as `_device`.
    if getattr(encoder, "_device", device) is not device:
        raise ContractError(
            op, "encoder", "same device", "the encoder belongs to another device than the call"
        )


class Tensor:
    """A tensor resident on a GPU: a storage buffer with a shape and a dtype.

    The buffer is padded to a multiple of 4 bytes (an f16 tensor of odd length) and is at least
    4 bytes, so that copies, reads and bindings are valid; the padding is never visible.
    A Tensor made over a caller's own buffer is checked when a call uses it: the buffer must hold
    the shape's bytes (padded to 4) and have the usages the call needs; it never enters a pool.
    `Tensor.empty` and `Tensor.from_numpy` (default usage) take their buffer from the device's pool
    (`pool`), which may make it larger than the Tensor, and give it back when the Tensor is destroyed
    or collected; a new Tensor's contents are undefined, as numpy.empty's.
    """

    __slots__ = ("buffer", "shape", "dtype", "device", "storage_nbytes", "destroyed", "pool")
    # What describes the buffer is fixed at creation: a shape set later would make calls read past
    # the buffer (or short of it). `buffer` may be re-pointed: every call checks it anew.
    _FIXED = frozenset(("shape", "dtype", "device", "storage_nbytes", "destroyed", "pool"))
    buffer: Any
    shape: tuple[int, ...]
    dtype: np.dtype
    device: Any
    storage_nbytes: int
    destroyed: bool
    pool: Any

    def __init__(self, buffer: Any, shape: abc.Sequence[int], dtype: Any, device: Any) -> None:
        _checked_buffer(buffer)
        if device is None:
            raise ContractError(
                "Tensor", "device", "a GPUDevice", "a Tensor needs the device its buffer is on"
            )
        fix = object.__setattr__
        fix(self, "buffer", buffer)
        fix(self, "shape", checked_shape("Tensor", "shape", shape))
        fix(self, "dtype", tensor_dtype("Tensor", "dtype", dtype))
        fix(self, "device", checked_device("Tensor", device))
        # The bytes a binding of the whole tensor covers: its bytes padded to a multiple of 4.
        fix(self, "storage_nbytes", storage_nbytes(self.shape, self.dtype.name))
        fix(self, "destroyed", False)  # set by destroy(): a call or a read-back of it is then refused
        fix(self, "pool", None)  # the caller's buffer: never pooled

    def __setattr__(self, name: str, value: Any) -> None:
        if name in Tensor._FIXED:
            raise AttributeError(
                f"Tensor.{name} is read-only: it describes the buffer the Tensor was made over; "
                "make another Tensor(buffer, shape, dtype, device) for another view"
            )
        if name == "buffer":
            _checked_buffer(value)
            withdraw_from_pool(self)  # the pooled buffer may live on in the caller's hands
            count_buffer_change()
        object.__setattr__(self, name, value)

    # A Tensor is a GPU buffer: no copy of one can be made in Python, nor can one cross processes.
    # copy, deepcopy and pickle all reduce it first (object.__reduce_ex__ calls this).
    def __reduce__(self) -> Any:
        raise TypeError(
            "a Tensor is a GPU buffer and cannot be copied or pickled: tensor.numpy() copies its data"
        )

    def __delattr__(self, name: str) -> None:
        # Nothing of a Tensor is deleted: a Tensor without its buffer broke every call and read-back
        # with an AttributeError from inside the package.
        if name not in Tensor.__slots__:
            raise AttributeError(f"'Tensor' object has no attribute {name!r}")
        why = "re-point it to another buffer instead" if name == "buffer" else "it is read-only"
        raise AttributeError(f"Tensor.{name} cannot be deleted: {why}")

    @property
    def nbytes(self) -> int:
        return numel(self.shape) * self.dtype.itemsize

    @classmethod
    @refusing_lost_device("Tensor.empty()")
    def empty(
        cls, shape: abc.Sequence[int], dtype: Any, device: Any = None, usage: int | None = None
    ) -> Tensor:
        device = checked_device("Tensor", device)
        device = device if device is not None else default_device()
        shape = checked_shape("Tensor", "shape", shape)
        dtype = tensor_dtype("Tensor", "dtype", dtype)
        if usage is None:
            return pooled_tensor(shape, dtype, device, cls)
        size = _checked_size(shape, dtype, device)
        buffer = device.create_buffer(size=size, usage=_checked_usage(usage, 0, ""))
        return cls(buffer, shape, dtype, device)

    @classmethod
    @refusing_lost_device("Tensor.from_numpy()")
    def from_numpy(cls, array: Any, device: Any = None, usage: int | None = None) -> Tensor:
        refuse_masked("Tensor", "array", array)
        try:
            array = np.asarray(array)
        except (TypeError, ValueError) as error:
            raise ContractError(
                "Tensor", "array", "an array", f"expected a numpy array, got {type(array).__name__}: {error}"
            ) from None
        tensor_dtype("Tensor", "array", array.dtype)
        if not array.dtype.isnative:
            array = array.astype(array.dtype.newbyteorder("="))
        if not array.flags.c_contiguous:  # (np.ascontiguousarray would make a 0-d array 1-d)
            array = array.copy(order="C")
        if usage is not None:
            usage = _checked_usage(usage, 0x08, "COPY_DST, which from_numpy writes the array with")
            tensor = cls.empty(array.shape, array.dtype, device, usage)
        else:
            device = checked_device("Tensor", device)
            device = device if device is not None else default_device()
            tensor = pooled_tensor(array.shape, array.dtype, device, cls, zero_pad=False)
        upload(tensor.device, tensor.buffer, array)  # its odd float16 tail padded with zeros
        return tensor

    @property
    def gone(self) -> bool:
        """Whether its buffer was destroyed, by destroy() or by `buffer.destroy()` directly."""
        return self.destroyed or buffer_destroyed(self.buffer)

    @refusing_lost_device("Tensor.numpy()")
    def numpy(self, out: np.ndarray | None = None) -> np.ndarray:
        """Read the tensor back (waits for the GPU work that writes it), into `out` if given (a
        C-contiguous array of the Tensor's shape and dtype)."""
        return self._read_back("numpy()", out).wait(out)

    @refusing_lost_device("Tensor.read_async()")
    def read_async(self) -> ReadBack:
        """Start reading the tensor back: the copy is recorded and submitted now, after the work
        submitted before; `.wait()` (or `.wait(out=array)`) on the result gives the array once it is
        done, so that an app can submit its next work meanwhile."""
        return self._read_back("read_async()", None)

    def _read_back(self, subject, out):
        if self.gone:
            raise ContractError(
                "Tensor", subject, "not destroyed", "the Tensor was destroyed: its buffer is gone"
            )
        if out is not None:
            checked_out_array(subject, out, self.shape, self.dtype)
        nbytes = self.storage_nbytes if numel(self.shape) else 0
        if nbytes:
            check_tensor_buffer("Tensor", subject, self, ("COPY_SRC",), mappable_refused=False)
        encoder = self.device.create_command_encoder(label="read-back")
        read = ReadBack(self.device, encoder, self.buffer, nbytes, self.shape, self.dtype)
        if nbytes:
            self.device.queue.submit([encoder.finish()])
        return read

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """numpy.asarray(tensor): a blocking read-back (waits for the GPU work that writes it). The
        values live in GPU memory, so every read-back is a new array: copy=False, which asks NumPy
        for no copy, is refused as NumPy's protocol says (ValueError)."""
        if copy is False:
            raise ValueError(
                f"{self!r} lives in GPU memory: reading it back always makes a new array (use numpy.asarray(tensor))"
            )
        array = self.numpy()
        return array if dtype is None else array.astype(dtype, copy=False)

    def destroy(self) -> None:
        """Free the GPU buffer now rather than when the Tensor is collected (a pooled one goes back
        to its pool); the Tensor is unusable after (calls and read-backs refuse it); a buffer
        destroyed directly is refused too."""
        with _pool_lock:
            destroyed_before = self.destroyed
            object.__setattr__(self, "destroyed", True)
            pool = _taken_pool(self)
        if pool is not None:
            reusable = sole_holder(self)
            release_later(pool, self.buffer, reusable)
            if reusable:
                return
        elif destroyed_before:  # its buffer may be back in a pool already, in another Tensor's hands
            return
        self.buffer.destroy()

    def __del__(self) -> None:
        pool = getattr(self, "pool", None)  # (unset where __init__ failed)
        if pool is not None:
            try:
                reusable = sole_holder(self)  # first: an argument list holding the buffer counts
                release_later(pool, self.buffer, reusable)
            except TypeError:  # the interpreter is shutting down: its modules are gone
                pass

    def __enter__(self) -> Tensor:
        return self

    def __exit__(self, *exc: object) -> bool:
        self.destroy()
        return False

    def __repr__(self):
        return f"Tensor(shape={self.shape}, dtype={self.dtype.name})"


def _checked_size(shape, dtype, device):
    """The bytes of a new Tensor's buffer, refused over the device's maxBufferSize."""
    size = storage_nbytes(shape, dtype.name)
    limit = device_caps(device).limits["maxBufferSize"]
    if size > limit:
        raise ContractError(
            "Tensor",
            "shape",
            "maxBufferSize",
            f"{shape} {dtype.name} needs {size} bytes, over the device's maxBufferSize = {limit}",
        )
    return size


def pooled_tensor(shape, dtype, device, cls=Tensor, zero_pad=True, prefer=None):
    """A Tensor over a buffer from the device's pool (shape a tuple of ints, dtype numpy's float32
    or float16, both checked), `prefer` where it is free (BufferPool.allocate). The padding of an odd
    float16 count is zeroed: a pooled buffer holds what its last user left, and shaders that read
    halves in pairs read that word whole."""
    size = _checked_size(shape, dtype, device)
    pool = pool_of(device)
    buffer = pool.allocate(size, STORAGE_USAGE, device_caps(device).limits["maxBufferSize"], prefer)
    tensor = object.__new__(cls)
    fix = object.__setattr__
    for name, value in zip(Tensor.__slots__, (buffer, shape, dtype, device, size, False, pool)):
        fix(tensor, name, value)
    if zero_pad and size != numel(shape) * dtype.itemsize:
        device.queue.write_buffer(buffer, size - 4, bytes(4))
    return tensor


def fresh_output(shape, dtype_name, device, prefer=None):
    """A call's fresh output from the pool: `shape` and `dtype_name` ("float32" / "float16") as a
    plan gives them; `prefer`, a buffer, where it is free."""
    return pooled_tensor(tuple(shape), _NP_DTYPES[dtype_name], device, prefer=prefer)


# Whether a Tensor's buffer has no holder but the Tensor: the references to it are counted as
# sys.getrefcount sees them through a holder's slot, against a probe held by one slot only (so the
# count of the interpreter's own temporaries is measured, not assumed). Where the interpreter has no
# reference counts, no buffer is ever taken back for reuse.
class _Holder:
    __slots__ = ("buffer",)


def _references(holder):
    return sys.getrefcount(holder.buffer)


_probe = _Holder()
_probe.buffer = object()
_SOLE_HOLDER = _references(_probe) if hasattr(sys, "getrefcount") else None
del _probe


def sole_holder(tensor) -> bool:
    """Whether nothing but `tensor` (and its pool's record of the buffers it lent) holds its buffer:
    the caller did not keep `tensor.buffer`, no Sequence records it; its pool may hand it out again."""
    return _SOLE_HOLDER is not None and _references(tensor) <= _SOLE_HOLDER + 1


_pool_lock = threading.RLock()  # a Tensor leaves its pool once, whatever threads ask (re-entrant)


def _taken_pool(tensor):
    """The Tensor's pool, which it leaves (None if it has none)."""
    with _pool_lock:
        pool = tensor.pool
        if pool is not None:
            object.__setattr__(tensor, "pool", None)
        return pool


def withdraw_from_pool(tensor) -> None:
    """The Tensor's buffer never goes back to its pool: a recording that binds it (`encoder=`, a
    Sequence) is submitted by the caller, later, and its buffer was re-pointed or may be kept."""
    pool = _taken_pool(tensor)
    if pool is not None:
        pool.forget(tensor.buffer)


def give_back(tensor) -> None:
    """A call's own temporary (an upload, an output read back), which nothing else holds, goes back
    to its pool now: its uses were submitted, so queue order makes reuse safe."""
    object.__setattr__(tensor, "destroyed", True)
    pool = _taken_pool(tensor)
    if pool is not None:
        pool.take_back(tensor.buffer)
    else:
        tensor.buffer.destroy()


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


def _check_not_mapped(op, subject, tensor, mappable_refused):
    # A submission that uses a mapped buffer aborts wgpu-native. A STORAGE buffer can be mapped only
    # at its creation, unless the device has wgpu's native mappable-primary-buffers: a call refuses
    # a mappable buffer then, since it could be mapped while a recorded call (a repeat, a Sequence)
    # binds it.
    if mappable_refused and tensor.buffer.usage & 0x03:
        raise ContractError(
            op,
            subject,
            "not mappable",
            "the Tensor's buffer has MAP_READ / MAP_WRITE usage, so it could be mapped while a recorded "
            "call binds it: bind a buffer without them and copy to a mappable one",
        )
    state = getattr(tensor.buffer, "map_state", "unmapped")
    if state != "unmapped":
        raise ContractError(
            op,
            subject,
            "unmapped",
            f"the Tensor's buffer is {state} (mapped_at_creation=True, or map_async()): call buffer.unmap() first",
        )


def check_tensor_buffer(op, subject, tensor, usages, why="", mappable_refused=True):
    """Refuse a Tensor whose buffer cannot back its shape, is mapped (or, for a call's binding,
    mappable), or lacks a usage the call needs (`why`: the reason for those usages, where it is
    not plain).

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
    _check_not_mapped(op, subject, tensor, mappable_refused)
    # wgpu-py 0.32 keeps the device of a GPU object only as `_device`; `buffer` may be re-pointed.
    if getattr(tensor.buffer, "_device", tensor.device) is not tensor.device:
        raise ContractError(
            op, subject, "same device", "the Tensor's buffer belongs to another device than the Tensor"
        )
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
            f"the Tensor's buffer needs usage {' | '.join(missing)}{why}; it was created with {has}",
        )


def checked_tensor(op, subject, value, spec, device, usages=("STORAGE",), why=""):
    """A call's array or Tensor against the plan's (shape, dtype name) `spec`; a Tensor must also be
    on the call's device with a buffer that can take the binding (`check_tensor_buffer`)."""
    shape, dtype_name = spec
    expected = _NP_DTYPES.get(dtype_name) or np.dtype(dtype_name)
    if value.shape != tuple(shape) or value.dtype != expected or not value.dtype.isnative:
        raise ContractError(
            op,
            subject,
            "planned shape and dtype",
            f"got {value.shape} {dtype_text(value.dtype)}, the plan is for {tuple(shape)} {dtype_name}",
        )
    if isinstance(value, Tensor):
        if value.device is not device:
            raise ContractError(
                op, subject, "same device", "the tensor lives on another device than the call"
            )
        check_tensor_buffer(op, subject, value, usages, why)
    return value


def dtype_text(dtype):
    """A dtype as a message shows it: its name, and its byte order where that is not the native one."""
    return (
        dtype.name if dtype.isnative or dtype.byteorder == "|" else f"{dtype.name} ({dtype.str}, big-endian)"
    )
