# SPDX-License-Identifier: Apache-2.0
"""The device memory the runtime keeps, as the package shows it: `memory_stats()`, `empty_cache()`
and `set_cache_limit()` over a device's buffer pool (allocator.py), with its scratch pool and its
pipeline cache beside (`set_pipeline_cache_limit()`).
"""

from __future__ import annotations

import numbers

from .allocator import MemoryStats, pool_of
from .caps import checked_device, default_device, refusing_lost_device
from .errors import ContractError
from .pipelines import bind_group_cache, pipelines_of, scratch_pool


def _device_of(op, device):
    device = checked_device(op, device)
    return device if device is not None else default_device()


def _scratch_bytes(device):
    scratch = scratch_pool.get(device)
    return sum(buffer.size for buffer in scratch.values()) if scratch is not None else 0


@refusing_lost_device("memory_stats")
def memory_stats(device=None) -> MemoryStats:
    """The buffer pool of `device` (default: the default device): bytes allocated (handed out and not
    given back), cached (free, kept for reuse), the peak of allocated, hits and misses, the limit on
    cached bytes; the bytes of its scratch pool; its cached pipelines, their bytes and limit."""
    device = _device_of("memory_stats", device)
    pipelines = pipelines_of(device)
    return pool_of(device).stats(
        scratch=_scratch_bytes(device),
        pipelines=len(pipelines),
        pipeline_bytes=pipelines.weight,
        pipeline_limit=pipelines.max_weight,
    )


@refusing_lost_device("empty_cache")
def empty_cache(device=None) -> int:
    """Drop every free buffer of `device`'s pool and its scratch pool, so that wgpu frees their memory
    (at once, or when submitted work that uses them ends); returns the bytes dropped. Buffers in use
    stay where they are; the next calls create what they need again."""
    device = _device_of("empty_cache", device)
    dropped = pool_of(device).empty() + _scratch_bytes(device)
    scratch = scratch_pool.get(device)
    if scratch is not None:
        scratch.clear()
    bind_groups = bind_group_cache.get(device)
    if bind_groups is not None:
        len(bind_groups)  # forgets now the bind groups over the buffers just dropped, which hold them
    return dropped


def _checked_bytes(op, nbytes):
    if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Integral) or nbytes < 0:
        raise ContractError(
            op, "nbytes", "bytes >= 0", f"the limit is a whole number of bytes, got {nbytes!r}"
        )
    return int(nbytes)


@refusing_lost_device("set_cache_limit")
def set_cache_limit(nbytes: int, device=None) -> None:
    """Keep at most `nbytes` of free buffers in `device`'s pool (the oldest given back go first;
    0 caches nothing). The default is allocator.DEFAULT_CACHE_LIMIT, 1 GiB."""
    nbytes = _checked_bytes("set_cache_limit", nbytes)
    pool_of(_device_of("set_cache_limit", device)).set_limit(nbytes)


@refusing_lost_device("set_pipeline_cache_limit")
def set_pipeline_cache_limit(nbytes: int, device=None) -> None:
    """Keep `device`'s cached pipelines within `nbytes` by what they hold (the least recently used go
    first, at once; the most recent always stays). The default is
    pipelines.PIPELINE_CACHE_BYTES, 2 GiB: what the package's warmup() makes on the software driver."""
    nbytes = _checked_bytes("set_pipeline_cache_limit", nbytes)
    pipelines_of(_device_of("set_pipeline_cache_limit", device)).max_weight = nbytes
