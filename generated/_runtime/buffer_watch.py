# SPDX-License-Identifier: Apache-2.0
"""What the runtime knows of buffers that wgpu does not report: which were destroyed, how many
buffer changes there have been; the lock that keeps a destroy() out of a call's checks and submit
(`calls_lock`), and the call scope (`in_call`) that holds it: what a destroy() or a Tensor's end
does on the thread of a call in progress (a signal handler, a `__del__`) waits for the call's end.

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
from collections import deque
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

# How deep the thread holding calls_lock is in entry points (only that thread changes it): a
# signal handler or a `__del__` on that thread runs inside the call it interrupted, at depth > 0.
_call_depth = [0]
# Native destroy()s that such a handler asked for during a call: done when the outermost call ends.
_deferred_destroys: list = []
# Buffers that Tensors gave back (destroy(), or collected): (pool, buffer, reusable). Taken back by
# their pools when the next outermost call starts, never during a call: a call past its checks
# keeps using what it checked, even if a signal handler destroys one of its Tensors meanwhile.
_released: deque = deque()


class _CallScope:
    """`with in_call:` is the scope of an entry point: calls_lock held, released buffers taken back
    when the outermost call starts, destroy()s deferred during it done when it ends. (A class, not a
    generator: it is entered on every call.)"""

    def __enter__(self):
        calls_lock.acquire()
        if _call_depth[0] == 0:
            try:
                take_back_released()
            except BaseException:
                calls_lock.release()
                raise
        _call_depth[0] += 1

    def __exit__(self, *exc):
        _call_depth[0] -= 1
        try:
            if _call_depth[0] == 0:
                _destroy_deferred()
        finally:
            calls_lock.release()
        return False


in_call = _CallScope()


def release_later(pool, buffer, reusable):
    """Give `buffer` back to `pool` (whose `take_back(buffer, reusable)` is called) at the start of the
    next outermost call. Takes no lock: a `__del__` may call it on any thread, at any time."""
    _released.append((pool, buffer, reusable))


def take_back_released():
    """Hand every buffer given back so far to its pool (calls_lock held, no call in progress)."""
    while _released:
        try:
            pool, buffer, reusable = _released.popleft()
        except IndexError:  # another thread took the last one between the test and the pop
            return
        pool.take_back(buffer, reusable)


def _destroy_deferred():
    while _deferred_destroys:
        buffer, original, args, kwargs = _deferred_destroys.pop()
        original(buffer, *args, **kwargs)


def watch_buffer_class(cls: type) -> None:
    """Remember every destroy() of a buffer of class `cls` from now on (the class is wrapped once)."""
    if cls in _watched_classes:
        return
    with _watch_lock:  # wrapped once, and marked watched only once it is
        if cls not in _watched_classes:
            _wrap_destroy(cls, remember=True)
            _watched_classes.add(cls)


def _wrap_destroy(cls: type, remember: bool) -> None:
    """destroy() of `cls` under calls_lock, deferred to the end of the call of this thread if any,
    and (`remember`) the object kept as destroyed from then on."""
    original = getattr(cls, "destroy", None)
    if not callable(original):
        return

    @functools.wraps(original)
    def destroy(self: Any, *args: Any, **kwargs: Any) -> Any:
        with calls_lock:  # not between another thread's checks and its submit
            if remember:
                try:
                    _destroyed_buffers.add(self)
                except TypeError:  # not weakly referable: nothing to remember it by
                    pass
                _buffer_changes[0] += 1
            if _call_depth[0]:
                # This thread is inside a call (a signal handler or a __del__ interrupted it, maybe
                # between its checks and its submit): a buffer is refused from now on, and
                # destroyed once the call has submitted what it checked.
                _deferred_destroys.append((self, original, args, kwargs))
                return None
            return original(self, *args, **kwargs)

    cls.destroy = destroy  # type: ignore[attr-defined]


def watch_destroys_of(device: Any) -> None:
    """From the first time a device is seen: watch the destroy() of its buffer class, so that a buffer
    destroyed before any Tensor was made over it is still known (wgpu reports no destroyed state; a
    submission that uses one aborts wgpu-native), and make its own class's destroy() wait for a call
    in progress too. A device destroyed during a call stopped wgpu-py's poll thread under it: a
    read-back waiting for its mapping waited forever, or met wgpu-py's own errors."""
    module = sys.modules.get(type(device).__module__)
    buffer_class = getattr(module, "GPUBuffer", None)
    if isinstance(buffer_class, type):
        watch_buffer_class(buffer_class)
    device_class = type(device)
    if device_class not in _watched_classes:
        with _watch_lock:
            if device_class not in _watched_classes:
                _wrap_destroy(device_class, remember=False)
                _watched_classes.add(device_class)


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
