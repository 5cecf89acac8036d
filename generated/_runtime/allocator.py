# SPDX-License-Identifier: Apache-2.0
"""The caching allocator: one pool of GPU buffers per device, in size classes, that the runtime's
own Tensors (`Tensor.empty`, `Tensor.from_numpy`, a call's fresh outputs and uploads) and read-back
staging buffers take their buffers from and give them back to, with its statistics and byte limit.
PyTorch's CUDACachingAllocator is the model: a freed block goes back to its size class, and the next
request of that class takes it instead of creating a buffer (a `create_buffer` and the bind group
over it cost more host time than the rest of a call).

Why a buffer may be handed out again while work that used it may still be running: WebGPU runs a
queue's commands (submissions and `queue.write_buffer`) in order, and makes each see everything the
earlier ones wrote. A pooled buffer comes back only after every use the runtime recorded of it was
submitted (our calls submit before they return; what a recording the caller submits later binds -
`kernel(encoder=)`, `Sequence` - never comes back: `withdraw`); its next user's commands are
submitted after that, so they start after the earlier work ended. A buffer that anything else may
still hold (the caller kept `tensor.buffer`) is not taken back (tensors.py counts its references).
A caller's own buffer (`Tensor(buffer, ...)`) never enters a pool.

Evicted and emptied buffers are dropped, not destroyed: work already submitted, and a bind group
that still holds one, keep its memory until they end; nothing of ours can hand it out again.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass

from .buffer_watch import buffer_destroyed

DEFAULT_CACHE_LIMIT = 1 << 30  # bytes of free buffers a device's pool keeps (set_cache_limit)
SMALLEST_CLASS = 256

# The usages of the two kinds of pooled buffer: a Tensor's storage, a read-back's staging buffer.
STORAGE_USAGE = 0x80 | 0x04 | 0x08  # STORAGE | COPY_SRC | COPY_DST (WebGPU's GPUBufferUsage bits)
STAGING_USAGE = 0x01 | 0x08  # MAP_READ | COPY_DST


def size_class(nbytes: int) -> int:
    """The bytes of the buffer that serves a request of `nbytes`: multiples of 256 up to 4 KiB, then
    four classes an octave (2^k, 1.25, 1.5, 1.75 x 2^k), so that a class wastes under 25 % and shapes
    that differ a little share buffers."""
    if nbytes <= 4096:
        return max(SMALLEST_CLASS, -(-nbytes // SMALLEST_CLASS) * SMALLEST_CLASS)
    step = 1 << (nbytes.bit_length() - 3)
    return -(-nbytes // step) * step


@dataclass(frozen=True)
class MemoryStats:
    """One device's pool (`generated.memory_stats()`), in bytes and counts.

    allocated: buffers handed out and not given back (live Tensors, read-backs in progress);
    cached: free buffers kept for reuse (at most `limit`); peak: the most `allocated` has been;
    hits / misses: requests served from the cache / by a new buffer; scratch: the device's scratch
    pool (intermediates, shared by every call, apart from this pool); pipelines and pipeline_bytes:
    the device's cached compute pipelines and what they hold (each weighs the resident memory its
    creation took), at most pipeline_limit bytes.
    """

    allocated: int
    cached: int
    peak: int
    hits: int
    misses: int
    limit: int
    scratch: int = 0
    pipelines: int = 0
    pipeline_bytes: int = 0
    pipeline_limit: int = 0


class BufferPool:
    """One device's free buffers by (usage, size class), and its books. Thread-safe."""

    def __init__(self, device, limit=DEFAULT_CACHE_LIMIT):
        self.limit = limit
        self._device = weakref.ref(device)
        self._free: dict = {}  # (usage, size) -> [buffer, ...], the most recently given back last
        self._cached: OrderedDict = OrderedDict()  # id(buffer) -> buffer, oldest given back first
        # id(buffer) -> buffer of those handed out: a Tensor collected in a reference cycle may be
        # finalized after its buffer, whose own finalizer would release it; held here, a lent buffer
        # is never part of such garbage.
        self._lent: dict = {}
        self._lock = threading.RLock()  # re-entrant, as LRUCache's lock
        self.allocated = self.cached = self.peak = self.hits = self.misses = 0

    def allocate(self, nbytes: int, usage: int, max_size: int, prefer=None):
        """A buffer of at least `nbytes` (its class, or `max_size` where the class passes it):
        `prefer` itself where it is free in that class (a repeated call's outputs get back the buffers
        its recorded bind groups hold, whatever order they were given back in), else the most
        recently given back."""
        size = max(nbytes, min(size_class(nbytes), max_size))
        key = (usage, size)
        with self._lock:
            free = self._free.get(key)
            if prefer is not None and (prefer.usage, prefer.size) == key and id(prefer) in self._cached:
                free.remove(prefer)  # free in this class: to the top, where pop() takes it
                free.append(prefer)
            while free:
                buffer = free.pop()
                del self._cached[id(buffer)]
                self.cached -= size
                if buffer_destroyed(buffer):  # destroyed behind our back: never hand it out
                    continue
                self.hits += 1
                return self._handed_out(buffer)
        device = self._device()
        buffer = device.create_buffer(size=size, usage=usage)
        with self._lock:
            self.misses += 1
            return self._handed_out(buffer)

    def _handed_out(self, buffer):
        self._lent[id(buffer)] = buffer
        self.allocated += buffer.size
        self.peak = max(self.peak, self.allocated)
        return buffer

    def take_back(self, buffer, reusable=True):
        """A buffer this pool handed out comes back: cached for reuse if `reusable` (nothing else
        holds it), else only taken off the books. Over the limit, the oldest free buffers go."""
        size = buffer.size
        with self._lock:
            self._lent.pop(id(buffer), None)
            self.allocated -= size
            if not reusable or buffer_destroyed(buffer) or size > self.limit:
                return
            self._free.setdefault((buffer.usage, size), []).append(buffer)
            self._cached[id(buffer)] = buffer
            self.cached += size
            self._shrink(self.limit)

    def forget(self, buffer):
        """A buffer handed out leaves the pool's books for good (`withdraw`)."""
        with self._lock:
            self._lent.pop(id(buffer), None)
            self.allocated -= buffer.size

    def _shrink(self, limit):
        while self.cached > limit:
            _, buffer = self._cached.popitem(last=False)
            self._free[(buffer.usage, buffer.size)].remove(buffer)
            self.cached -= buffer.size

    def set_limit(self, limit: int):
        with self._lock:
            self.limit = limit
            self._shrink(limit)

    def empty(self):
        """Drop every free buffer; returns the bytes dropped."""
        with self._lock:
            dropped = self.cached
            self._shrink(0)
            self._free.clear()
            return dropped

    def free_buffers(self) -> list:
        """The free buffers, oldest given back first (a snapshot)."""
        with self._lock:
            return list(self._cached.values())

    def stats(self, **beside) -> MemoryStats:
        """The pool's figures, with those of the device's other caches (`beside`) added."""
        with self._lock:
            return MemoryStats(
                self.allocated, self.cached, self.peak, self.hits, self.misses, self.limit, **beside
            )


_pools: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # device -> BufferPool
_pools_lock = threading.RLock()


def pool_of(device) -> BufferPool:
    """The device's pool, made on first use."""
    pool = _pools.get(device)
    if pool is None:
        with _pools_lock:
            pool = _pools.get(device)
            if pool is None:
                pool = _pools[device] = BufferPool(device)
    return pool
