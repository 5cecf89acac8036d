# SPDX-License-Identifier: Apache-2.0
"""What the runtime knows of buffers that wgpu does not report: which were destroyed, how many
buffer changes there have been, and the lock that keeps a destroy() out of a call's checks and
submit (`calls_lock`).

A caller may destroy `tensor.buffer` itself, and wgpu reports no destroyed state, while wgpu-native
aborts the whole process when a submission uses a destroyed buffer. So the runtime wraps the
destroy() of each buffer class it sees (once, from the first device or Tensor of that class) to
remember which buffers were destroyed: a call refuses them by name instead. Both `caps` (a device
seen for the first time) and `tensors` (a Tensor's buffer) start the watch, so it lives here, below
both of them.
"""

from __future__ import annotations

import functools
import sys
import threading
import weakref
from typing import Any


# Held by every entry point for its whole call and by a watched buffer's destroy(): a destroy() in
# another thread then lands before a call's checks or after its submit, never between them (a
# submission that uses a destroyed buffer aborts wgpu-native). Re-entrant: calls nest.
calls_lock = threading.RLock()

_destroyed_buffers: weakref.WeakSet = weakref.WeakSet()
_watched_classes: set = set()
# Buffers destroyed and Tensor buffers re-pointed so far: Sequence.run() rechecks the buffers its
# calls bind only when this moved.
_buffer_changes = [0]
_watch_lock = threading.RLock()  # re-entrant, as LRUCache's lock


def watch_buffer_class(cls: type) -> None:
    """Remember every destroy() of a buffer of class `cls` from now on (the class is wrapped once)."""
    if cls in _watched_classes:
        return
    with _watch_lock:  # wrapped once, and marked watched only once it is
        if cls not in _watched_classes:
            _wrap_destroy(cls)
            _watched_classes.add(cls)


def _wrap_destroy(cls: type) -> None:
    original = getattr(cls, "destroy", None)
    if not callable(original):
        return

    @functools.wraps(original)
    def destroy(self: Any, *args: Any, **kwargs: Any) -> Any:
        with calls_lock:  # not between another thread's checks and its submit
            try:
                _destroyed_buffers.add(self)
            except TypeError:  # not weakly referable: nothing to remember it by
                pass
            _buffer_changes[0] += 1
            return original(self, *args, **kwargs)

    cls.destroy = destroy  # type: ignore[attr-defined]


def watch_buffers_of(device: Any) -> None:
    """Watch the destroy() of `device`'s buffer class from the first time a device is seen, so that
    a buffer destroyed before any Tensor was made over it is still known (wgpu reports no destroyed
    state; a submission that uses one aborts wgpu-native)."""
    buffer_class = getattr(sys.modules.get(type(device).__module__), "GPUBuffer", None)
    if isinstance(buffer_class, type):
        watch_buffer_class(buffer_class)


def buffer_destroyed(buffer: Any) -> bool:
    """Whether `buffer.destroy()` was called on a buffer of a watched class."""
    try:
        return buffer in _destroyed_buffers
    except TypeError:
        return False


def count_buffer_change() -> None:
    """A Tensor's buffer was re-pointed: recorded calls that bind the Tensor must be checked again."""
    _buffer_changes[0] += 1


def buffer_changes_so_far() -> int:
    """Buffers destroyed and Tensor buffers re-pointed in this process so far."""
    return _buffer_changes[0]
