# SPDX-License-Identifier: Apache-2.0
"""Bounded caches: the LRUCache every cache of the runtime is, one per device in a weak-keyed map,
and the weak references that make an entry go with the buffers it binds.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict, deque


class LRUCache:
    """A bounded, thread-safe mapping that forgets its least recently used entry.

    Every cache of the runtime is one of these, so that an app with changing shapes or
    attribute values keeps a bounded number of plans, pipelines and buffers alive.
    """

    def __init__(self, maxsize):
        self.maxsize = maxsize
        self._data = OrderedDict()
        # Re-entrant: a signal handler or a __del__ run by the garbage collector may call the
        # package while this thread holds the lock (with a plain Lock that deadlocked).
        self._lock = threading.RLock()
        # Entries to forget, queued by weak-reference callbacks (`forget_later`). A callback runs
        # whenever the garbage collector does, possibly inside this cache's own lock in the same
        # thread, so it only queues; get() and put() forget under the lock.
        self._forgotten = deque()

    def _forget_queued(self):
        while self._forgotten:
            key, value = self._forgotten.popleft()
            if self._data.get(key) is value:
                del self._data[key]

    def get(self, key, default=None):
        with self._lock:
            if self._forgotten:
                self._forget_queued()
            # One try for both steps: a re-entrant call between them may have evicted the key.
            try:
                self._data.move_to_end(key)
                return self._data[key]
            except KeyError:
                return default

    def put(self, key, value):
        with self._lock:
            if self._forgotten:
                self._forget_queued()
            self._data.pop(key, None)
            self._data[key] = value  # a new key goes last: the most recently used
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def __len__(self):
        with self._lock:
            self._forget_queued()
            return len(self._data)

    def __contains__(self, key):
        return key in self._data

    def clear(self):
        with self._lock:
            self._data.clear()

    def forget_later(self, key, value):
        """Forget `key` at the next use if it still maps to `value` (not to what replaced it)."""
        self._forgotten.append((key, value))


def watching(cache, key, value, buffers):
    """Weak references to `buffers` that make `cache` forget `key` once any of them is collected.

    A bind group keeps its buffers' GPU memory alive, so an entry must not outlive the buffers a
    caller let go of: the memory of a dropped Tensor is freed when the Tensor is, not when the
    cache gets round to forgetting it.
    """
    return tuple(weakref.ref(b, lambda _ref: cache.forget_later(key, value)) for b in buffers)


def per_device(caches, device, maxsize):
    """The LRUCache of one device in a WeakKeyDictionary of them."""
    cache = caches.get(device)
    if cache is None:
        cache = caches.setdefault(device, LRUCache(maxsize))
    return cache
