# SPDX-License-Identifier: Apache-2.0
"""Data between numpy arrays and GPU buffers with no copy more than wgpu's own: an upload is written
from the array's memory (`upload`); a read-back copies into a pooled staging buffer, maps it and
copies once into the result (`ReadBack`: the copy recorded now, the array ready later).
"""

from __future__ import annotations

import numpy as np

from .allocator import pool_of, STAGING_USAGE
from .buffer_watch import release_later
from .caps import device_caps, refusing_lost_device
from .errors import ContractError


def upload(device, buffer, array) -> None:
    """Write a C-contiguous array of native byte order into `buffer` from offset 0, from the array's
    own memory (wgpu copies it once, into its staging); only a tail that is not a multiple of 4 bytes
    (an odd count of float16) is written apart, padded with zeros."""
    nbytes = array.nbytes
    whole = nbytes - nbytes % 4
    if whole:
        device.queue.write_buffer(buffer, 0, array, 0, whole)
    if whole != nbytes:
        tail = array.reshape(-1).view(np.uint8)[whole:].tobytes()
        device.queue.write_buffer(buffer, whole, tail + bytes(4 - len(tail)))


def checked_out_array(subject, out, shape, dtype):
    """`numpy(out=array)`: an array the read-back can copy into as it is."""
    if not isinstance(out, np.ndarray):
        raise ContractError(
            "Tensor", subject, "a numpy array", f"out= takes a numpy array, got {type(out).__name__}"
        )
    if out.shape != tuple(shape) or out.dtype != dtype:
        raise ContractError(
            "Tensor",
            subject,
            "same shape and dtype",
            f"out= is {out.shape} {out.dtype}, the Tensor is {tuple(shape)} {dtype.name}",
        )
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ContractError(
            "Tensor", subject, "C-contiguous and writeable", "out= must be a C-contiguous, writeable array"
        )
    return out


class ReadBack:
    """A buffer's data on its way to a numpy array: the copy into a staging buffer is recorded into an
    encoder (and submitted by whoever submits it); `wait()` maps the staging buffer once that work is
    done and copies its data into the result, once.

    `tensor.read_async()` records and submits the copy at once, so that an app can go on with its
    next work while the GPU finishes and copies; `wait()` then blocks only for what is left. The
    staging buffer comes from the device's pool and goes back after `wait()` (or when the ReadBack
    is dropped unread: its copy was submitted before any later use, so queue order keeps that safe).
    """

    def __init__(self, device, encoder, source, nbytes, shape, dtype):
        self.device, self.shape, self.dtype, self.nbytes = device, tuple(shape), dtype, nbytes
        self._result = None
        self._pool = self._staging = None
        if nbytes:
            self._pool = pool_of(device)
            limit = device_caps(device).limits["maxBufferSize"]
            self._staging = self._pool.allocate(nbytes, STAGING_USAGE, limit)
            encoder.copy_buffer_to_buffer(source, 0, self._staging, 0, nbytes)

    @refusing_lost_device("ReadBack.wait()")
    def wait(self, out=None) -> np.ndarray:
        """The array (blocks until the copy is done); into `out` (an array of the same shape and
        dtype) if given. A second wait() returns the same values again."""
        if out is not None:
            out = checked_out_array("wait()", out, self.shape, self.dtype)
        if self._result is None:
            self._result = self._read(out if out is not None else np.empty(self.shape, self.dtype))
            return self._result
        if out is not None:
            np.copyto(out, self._result)
            return out
        return self._result

    def _read(self, result):
        staging, self._staging = self._staging, None
        if staging is None:
            return result
        import wgpu

        staging.map_sync(wgpu.MapMode.READ, 0, self.nbytes)
        try:
            mapped = np.frombuffer(staging.read_mapped(0, self.nbytes, copy=False), self.dtype, result.size)
            np.copyto(result.reshape(-1), mapped)
            del mapped  # no view of the mapping may outlive unmap()
        finally:
            staging.unmap()
        self._pool.take_back(staging)  # mapped, read, unmapped: nothing uses it any more
        return result

    def __del__(self):
        staging = getattr(self, "_staging", None)
        if staging is not None:  # dropped unread: its copy was submitted; unmapped, reusable
            release_later(self._pool, staging, True)
