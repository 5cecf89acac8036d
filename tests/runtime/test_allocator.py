"""The caching allocator (issue 25 item 1) and transfers without extra copies (item 2).

A device's pool hands a buffer given back (a Tensor destroyed or collected) to the next request of
its size class; nothing in use is handed out twice (a live Tensor's buffer, one a recorded
`encoder=` or Sequence binds, one the caller kept); the byte limit holds; `empty_cache()` returns
memory; threads share the pool. Uploads are written from the array's own memory, read-backs go
through kept staging buffers into the result (`numpy(out=)`, `read_async()`).

Expected values are the numpy path's result for the same input: the same plan runs the same
shader, so a Tensor call must give the same bits, and a buffer shared by mistake shows as a
difference.
"""

from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import pytest

import generated
from generated import ContractError, Sequence, Tensor
from generated import _runtime as rt
from generated import group_normalization as gn
from generated._runtime.buffer_watch import buffer_destroyed

ATTRS = {"num_groups": 2}


def arrays_for(shape, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    c = shape[1]
    return {
        "x": rng.standard_normal(shape).astype(dtype),
        "scale": rng.uniform(0.5, 1.5, c).astype(dtype),
        "bias": rng.uniform(-0.5, 0.5, c).astype(dtype),
    }


def tensors_of(arrays):
    return {k: Tensor.from_numpy(v) for k, v in arrays.items()}


def expected_y(arrays):
    return gn.kernel(arrays, attrs=ATTRS)["y"]


def pool():
    return rt.pool_of(generated.default_device())


@pytest.fixture(autouse=True)
def default_limit():
    yield
    generated.set_cache_limit(rt.DEFAULT_CACHE_LIMIT)


# --- reuse -----------------------------------------------------------------------------------------


def test_a_dropped_output_is_the_next_calls_output():
    arrays = arrays_for((2, 4, 5, 6))
    tensors = tensors_of(arrays)
    y = gn.kernel(tensors, attrs=ATTRS)["y"]
    first = weakref.ref(y.buffer)
    del y
    before = generated.memory_stats()
    y = gn.kernel(tensors, attrs=ATTRS)["y"]
    after = generated.memory_stats()
    assert y.buffer is first(), "the dropped output's buffer was not reused"
    assert (after.hits, after.misses) == (before.hits + 1, before.misses)
    np.testing.assert_array_equal(y.numpy(), expected_y(arrays))


def test_the_numpy_path_creates_no_buffer_once_warm():
    """Uploads, outputs and read-back staging buffers all come back: a repeated numpy call misses
    nothing."""
    arrays = arrays_for((2, 4, 7, 3), seed=1)
    first = gn.kernel(arrays, attrs=ATTRS)["y"]
    before = generated.memory_stats()
    again = gn.kernel(arrays, attrs=ATTRS)["y"]
    after = generated.memory_stats()
    assert after.misses == before.misses and after.hits >= before.hits + 5  # 3 uploads, y, staging
    assert after.allocated == before.allocated
    np.testing.assert_array_equal(again, first)


def test_destroy_gives_the_buffer_back_and_size_classes_share():
    t = Tensor.empty((1000,), np.float32)
    buffer = weakref.ref(t.buffer)
    assert t.buffer.size == rt.size_class(4000) and t.pool is pool()
    t.destroy()
    u = Tensor.empty((990,), np.float32)  # 3960 bytes: the same 4096-byte class
    assert u.buffer is buffer()


# --- nothing in use is handed out twice ------------------------------------------------------------


def test_a_buffer_the_caller_keeps_is_not_handed_out_again():
    t = Tensor.empty((64,), np.float32)
    kept = t.buffer
    del t
    others = [Tensor.empty((64,), np.float32) for _ in range(4)]
    assert all(o.buffer is not kept for o in others)
    u = Tensor.empty((64,), np.float32)
    kept_too = u.buffer
    u.destroy()  # the caller holds the buffer: destroyed, as before pools
    assert buffer_destroyed(kept_too)


def test_a_tensor_over_the_callers_buffer_never_enters_the_pool():
    import wgpu

    device = generated.default_device()
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
    own = Tensor(device.create_buffer(size=256, usage=usage), (64,), np.float32, device)
    assert own.pool is None
    buffer = weakref.ref(own.buffer)
    cached = generated.memory_stats().cached
    del own
    gc.collect()
    assert buffer() is None and generated.memory_stats().cached == cached


def test_an_encoder_recording_keeps_its_buffers_until_the_caller_submits():
    """Tensors a recorded `encoder=` call binds, dropped before the caller submits: their buffers
    must not be handed to new Tensors, which would write them before the recording reads them."""
    device = generated.default_device()
    arrays = arrays_for((2, 4, 6, 6), seed=2)
    tensors = tensors_of(arrays)
    encoder = device.create_command_encoder()
    y = gn.kernel(tensors, attrs=ATTRS, encoder=encoder)["y"]
    recorded = [weakref.ref(t.buffer) for t in (*tensors.values(), y)]
    assert y.pool is None and all(t.pool is None for t in tensors.values())
    y_kept = y
    del tensors, y
    gc.collect()
    others = [tensors_of(arrays_for((2, 4, 6, 6), seed=s)) for s in (3, 4)]  # same size classes
    fresh = [gn.kernel(o, attrs=ATTRS)["y"] for o in others]
    for t in [t for o in others for t in o.values()] + fresh:
        assert all(t.buffer is not ref() for ref in recorded)
    device.queue.submit([encoder.finish()])
    np.testing.assert_array_equal(y_kept.numpy(), expected_y(arrays))
    for o, f in zip(others, fresh):
        np.testing.assert_array_equal(f.numpy(), expected_y({k: v.numpy() for k, v in o.items()}))


def test_a_sequence_keeps_its_buffers():
    arrays = arrays_for((2, 4, 3, 3), seed=5)
    tensors = tensors_of(arrays)
    sequence = Sequence()
    y = sequence.kernel(gn, tensors, attrs=ATTRS)["y"]
    x = tensors.pop("x")
    x_buffer = x.buffer
    x.destroy()  # a Sequence's Tensor destroyed: refused by run(), never handed out
    fresh = [Tensor.empty((2, 4, 3, 3), np.float32) for _ in range(3)]
    assert all(f.buffer is not x_buffer for f in fresh)
    with pytest.raises(ContractError, match="destroyed"):
        sequence.run()
    del y


def test_a_pending_read_keeps_its_values_when_the_source_is_reused():
    """read_async() then dropping the Tensor: its buffer may go to the next Tensor at once (the copy
    was submitted first: queue order), and the read still gives the values it had."""
    values = np.arange(256, dtype=np.float32)
    t = Tensor.from_numpy(values)
    source = weakref.ref(t.buffer)
    read = t.read_async()
    del t
    other = Tensor.from_numpy(np.full(256, -1.0, np.float32))
    assert other.buffer is source()
    second = Tensor.from_numpy(values * 2).read_async()  # another staging buffer of the same class
    np.testing.assert_array_equal(read.wait(), values)
    np.testing.assert_array_equal(second.wait(), values * 2)
    np.testing.assert_array_equal(other.numpy(), np.full(256, -1.0, np.float32))


def _random_step(rng, live, pending, pinned, device):
    """One random use of the pool: make, call, record, read, destroy or drop a Tensor. A Tensor a
    pending encoder binds (`pinned`) is neither read, used nor destroyed before that encoder is
    submitted (the caller's part of the deal, as in wgpu), but may be dropped."""
    action = int(rng.integers(8))
    shape = (int(rng.integers(1, 3)), 4, int(rng.integers(1, 9)))
    usable = [i for i, (t, values) in enumerate(live) if values is not None and id(t) not in pinned]
    if action == 0 or not usable:
        arrays = arrays_for(shape, seed=int(rng.integers(1 << 30)))
        live.append((Tensor.from_numpy(arrays["x"]), arrays["x"]))
    elif action in (1, 2):  # a call on a live x with a fresh output, run now or recorded
        x, values = live[usable[int(rng.integers(len(usable)))]]
        arrays = {**arrays_for(x.shape), "x": values}
        inputs = {**tensors_of(arrays), "x": x}
        if action == 1:
            live.append((gn.kernel(inputs, attrs=ATTRS)["y"], expected_y(arrays)))
        else:
            encoder = device.create_command_encoder()
            y = gn.kernel(inputs, attrs=ATTRS, encoder=encoder)["y"]
            pending.append(("encoder", encoder, None))
            pinned.update((id(x), id(y)))
            live.append((y, expected_y(arrays)))
    elif action == 3:
        t, values = live[usable[int(rng.integers(len(usable)))]]
        pending.append(("read", t.read_async(), values))
    elif action in (4, 5):
        index = int(rng.integers(len(live)))
        t, _ = live.pop(index)
        if action == 4 and id(t) not in pinned:
            t.destroy()
    else:
        live.append((Tensor.empty(shape, np.float32), None))  # values undefined: only its buffer counts


def _check_no_buffer_twice(live):
    buffers = [id(t.buffer) for t, _ in live if not t.destroyed]
    assert len(buffers) == len(set(buffers)), "two live Tensors share a buffer"
    free = {id(b) for b in pool().free_buffers()}
    assert not free & set(buffers), "a live Tensor's buffer is in the free list"


def test_nothing_in_use_is_handed_out_twice():
    """300 random uses of the pool (uploads, calls with fresh outputs, encoder= recordings submitted
    later, read_async, destroy, drop); after each, no two live Tensors share a buffer and none is
    free; at checkpoints every recording is submitted, every read waited for, and every live
    Tensor must still hold its own values."""
    device = generated.default_device()
    rng = np.random.default_rng(11)
    live, pending, pinned = [], [], set()
    for step in range(300):
        _random_step(rng, live, pending, pinned, device)
        _check_no_buffer_twice(live)
        if step % 50 == 49:
            for kind, item, expected in pending:
                if kind == "encoder":
                    device.queue.submit([item.finish()])
                else:
                    np.testing.assert_array_equal(item.wait(), expected)
            pending.clear()
            pinned.clear()
            for t, values in live:
                if values is not None:
                    np.testing.assert_array_equal(t.numpy(), values)


# --- bounds ----------------------------------------------------------------------------------------


def test_the_limit_holds_over_10000_calls_of_changing_shapes():
    """10,000 pool uses of changing shapes (uploads, fresh Tensors, and every 25th a call with a
    fresh output): the cached bytes never pass the limit, and every buffer handed out comes back."""
    limit = 64 * 1024
    generated.set_cache_limit(limit)
    gc.collect()
    start = generated.memory_stats()
    rng = np.random.default_rng(3)
    for i in range(10_000):
        n = int(rng.integers(1, 2000))
        if i % 25 == 0:
            shape = (1, 4, n % 97 + 1)
            y = gn.kernel(tensors_of(arrays_for(shape, seed=i)), attrs=ATTRS)["y"]
            del y
        elif i % 2:
            Tensor.from_numpy(np.full(n, i, np.float32))
        else:
            Tensor.empty((n,), np.float16).destroy()
        stats = generated.memory_stats()
        assert stats.cached <= limit, (i, stats)
    gc.collect()
    end = generated.memory_stats()
    assert end.allocated == start.allocated, (start, end)
    assert end.hits > start.hits and end.cached <= limit


def test_empty_cache_returns_memory():
    tensors = [Tensor.empty((n * 100,), np.float32) for n in range(1, 20)]
    buffers = [weakref.ref(t.buffer) for t in tensors]
    del tensors
    before = generated.memory_stats()
    dropped = generated.empty_cache()
    after = generated.memory_stats()
    gc.collect()
    assert dropped >= sum(rt.size_class(n * 400) for n in range(1, 20))
    assert before.cached >= dropped - before.scratch and after.cached == 0 and after.scratch == 0
    assert all(b() is None for b in buffers), "a buffer dropped by empty_cache() is still alive"


def test_cache_limit_zero_caches_nothing():
    generated.set_cache_limit(0)
    Tensor.empty((100,), np.float32).destroy()
    assert generated.memory_stats().cached == 0
    with pytest.raises(ContractError, match="set_cache_limit: nbytes"):
        generated.set_cache_limit(-1)


def test_calls_from_several_threads_share_the_pool():
    """4 threads, each 40 calls with fresh outputs and numpy calls of their own shapes and data:
    every result is right, and the pool served them (hits), its books back where they were."""
    start = generated.memory_stats()
    failures = []

    def worker(index):
        try:
            for call in range(40):
                arrays = arrays_for((2, 4, 3 + index, 2 + call % 5), seed=100 * index + call)
                expected = expected_y(arrays)
                y = gn.kernel(tensors_of(arrays), attrs=ATTRS)["y"]
                np.testing.assert_array_equal(y.numpy(), expected)
        except Exception as error:  # reported below, with the thread that met it
            failures.append((index, repr(error)))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures[0]
    gc.collect()
    end = generated.memory_stats()
    assert end.hits > start.hits + 4 * 40 and end.allocated == start.allocated


# --- transfers -------------------------------------------------------------------------------------


def test_an_upload_is_written_from_the_arrays_own_memory(monkeypatch):
    """No copy of the array before wgpu's own: write_buffer gets the array's memory; only an odd
    float16 tail is written apart, as 4 bytes."""
    device = generated.default_device()
    written = []
    original = type(device.queue).write_buffer

    def spy(queue, buffer, offset, data, *args, **kwargs):
        written.append((offset, data))
        return original(queue, buffer, offset, data, *args, **kwargs)

    monkeypatch.setattr(type(device.queue), "write_buffer", spy)
    values = np.arange(1000, dtype=np.float32).reshape(10, 100)
    Tensor.from_numpy(values)
    assert len(written) == 1 and np.shares_memory(np.asarray(written[0][1]), values)
    written.clear()
    halves = np.arange(7, dtype=np.float16)
    t = Tensor.from_numpy(halves)
    body = [data for offset, data in written if offset == 0]
    tail = [bytes(data) for offset, data in written if offset == 12]
    assert len(body) == 1 and np.shares_memory(np.asarray(body[0]), halves)
    assert tail == [halves[6:].tobytes() + bytes(2)]
    monkeypatch.undo()
    np.testing.assert_array_equal(t.numpy(), halves)


def test_read_backs_use_kept_staging_buffers(monkeypatch):
    """numpy() never goes through queue.read_buffer (a staging buffer created, mapped and destroyed
    a call, two copies); a second read of the same size creates no buffer."""
    device = generated.default_device()

    def refused(*args, **kwargs):
        raise AssertionError("queue.read_buffer used")

    monkeypatch.setattr(type(device.queue), "read_buffer", refused)
    t = Tensor.from_numpy(np.arange(300, dtype=np.float32))
    t.numpy()
    before = generated.memory_stats()
    np.testing.assert_array_equal(t.numpy(), np.arange(300, dtype=np.float32))
    assert generated.memory_stats().misses == before.misses


def test_numpy_into_the_callers_array():
    values = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float16)
    t = Tensor.from_numpy(values)
    out = np.empty((3, 5), np.float16)
    assert t.numpy(out=out) is out
    np.testing.assert_array_equal(out, values)
    readonly = np.zeros((3, 5), np.float16)
    readonly.flags.writeable = False
    for bad, rule in [
        (np.empty((5, 3), np.float16), "same shape and dtype"),
        (np.empty((3, 5), np.float32), "same shape and dtype"),
        (np.empty((5, 3), np.float16).T, "C-contiguous and writeable"),
        (readonly, "C-contiguous and writeable"),
        ([[0.0] * 5] * 3, "a numpy array"),
    ]:
        with pytest.raises(ContractError) as caught:
            t.numpy(out=bad)
        assert (caught.value.op, caught.value.subject, caught.value.rule) == ("Tensor", "numpy()", rule)


def test_read_async_gives_the_values_of_the_work_before_it():
    device = generated.default_device()
    arrays = arrays_for((2, 4, 8, 8), seed=9)
    tensors = tensors_of(arrays)
    y = gn.kernel(tensors, attrs=ATTRS)["y"]
    read = y.read_async()
    gn.kernel(tensors, attrs=ATTRS, out={"y": Tensor.empty(y.shape, np.float32)})  # next work
    out = np.empty(y.shape, np.float32)
    np.testing.assert_array_equal(read.wait(out=out), expected_y(arrays))
    np.testing.assert_array_equal(read.wait(), out)  # a second wait gives the same values
    assert device is y.device


def test_an_odd_float16_tensor_from_the_pool_has_a_zero_pad():
    """A pooled buffer holds what its last user left; the pad of an odd float16 count is zeroed,
    as a new buffer's was (shaders read halves in pairs)."""
    import wgpu

    device = generated.default_device()
    Tensor.from_numpy(np.full(8, 5.0, np.float16)).destroy()
    t = Tensor.empty((7,), np.float16)
    staging = device.create_buffer(size=16, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
    encoder = device.create_command_encoder()
    encoder.copy_buffer_to_buffer(t.buffer, 0, staging, 0, 16)
    device.queue.submit([encoder.finish()])
    staging.map_sync(wgpu.MapMode.READ)
    raw = bytes(staging.read_mapped())
    staging.unmap()
    assert raw[14:16] == bytes(2)


def test_a_loop_that_drops_its_output_replays_the_recorded_call(monkeypatch):
    """kernel() on the same Tensors, the last output dropped: the pool hands back the buffer the
    recorded call binds, so the call is encoded again with nothing checked, planned or recorded anew;
    while the caller still holds the last output, the next gets another buffer and a new record."""
    from generated._runtime import kernel as runtime_kernel

    arrays = arrays_for((2, 4, 6, 5), seed=21)
    tensors = tensors_of(arrays)
    expected = expected_y(arrays)
    gn.kernel(tensors, attrs=ATTRS)
    recorded = []
    original = runtime_kernel.record_call
    monkeypatch.setattr(runtime_kernel, "record_call", lambda *a: recorded.append(a) or original(*a))
    first = gn.kernel(tensors, attrs=ATTRS)["y"]
    assert recorded == []
    kept = first
    second = gn.kernel(tensors, attrs=ATTRS)["y"]
    assert len(recorded) == 1 and second.buffer is not kept.buffer
    np.testing.assert_array_equal(kept.numpy(), expected)
    np.testing.assert_array_equal(second.numpy(), expected)
