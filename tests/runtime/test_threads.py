"""Calls from several Python threads at once: the plan, pipeline, uniform and scratch caches are
shared, so one thread's call must not see another's buffers or plans. Each thread draws its own
shapes (new shapes plan and create pipelines while the other threads call), half of its
SkipGroupNorm calls forced onto the split variant (three passes through scratch buffers: partials
and statistics), and checks every result against the float64 reference."""

from __future__ import annotations

import threading
import traceback

import numpy as np

from generated import group_normalization as gn
from generated import skip_group_norm as sgn
from tests.oracles import assert_close, group_normalization_ref, rng_for, seed_note, skip_group_norm_ref

THREADS = 6
CALLS = 6


def _one_call(rng, context):
    if rng.random() < 0.5:
        c, groups = int(rng.choice([8, 16, 24])), int(rng.choice([2, 4, 8]))
        x = (
            rng.standard_normal(
                (int(rng.integers(1, 3)), c, int(rng.integers(1, 17)), int(rng.integers(1, 17)))
            )
            * 2
            + 1
        )
        x, scale, bias = (
            x.astype(np.float32),
            rng.standard_normal(c).astype(np.float32),
            rng.standard_normal(c).astype(np.float32),
        )
        y = gn.group_normalization(x, scale, bias, num_groups=groups)
        assert_close(
            y,
            group_normalization_ref(x, scale, bias, groups),
            np.float32,
            f"{context} GroupNorm {x.shape} g{groups}",
        )
        return
    c, groups = int(rng.choice([16, 32])), 4
    shape = (int(rng.integers(1, 3)), int(rng.integers(1, 9)), int(rng.integers(1, 9)), c)
    x, skip = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)
    gamma, beta, bias = (rng.standard_normal(c).astype(np.float32) for _ in range(3))
    if rng.random() < 0.5:
        y, s = sgn.skip_group_norm(x, gamma, beta, skip, bias, groups=groups, activation=1, return_sum=True)
    else:  # split: small slabs, so that every call of these shapes has several
        inputs = {"X": x, "gamma": gamma, "beta": beta, "skip": skip, "bias": bias}
        tunables = {"WORKGROUP_SIZE": 16, "SLAB_VALUES": 32}
        out = sgn.kernel(
            inputs,
            attrs={"groups": groups, "activation": 1},
            outputs=("Y", "S"),
            variant="split",
            tunables=tunables,
        )
        y, s = out["Y"], out["S"]
    y_ref, s_ref = skip_group_norm_ref(x, gamma, beta, skip, bias, groups, 1e-5, 1, 1, np.float32)
    assert_close(y, y_ref, np.float32, f"{context} SkipGroupNorm {shape} Y")
    assert_close(s, s_ref, np.float32, f"{context} SkipGroupNorm {shape} S")


def test_calls_from_several_threads_at_once(request):
    rng, seed = rng_for(request.node.name)
    seeds = rng.integers(0, 2**32, THREADS)
    failures = []
    start = threading.Barrier(THREADS)

    def worker(k):
        thread_rng = np.random.default_rng(seeds[k])
        try:
            start.wait(timeout=60)
            for i in range(CALLS):
                _one_call(thread_rng, f"thread {k} call {i} {seed_note(seed)}")
        except BaseException:
            failures.append(f"thread {k} {seed_note(seed)}:\n{traceback.format_exc()}")

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(
        thread.is_alive() for thread in threads
    ), f"a thread did not finish in 300 s (a deadlock?) {seed_note(seed)}"
    assert not failures, failures[0]


def _run_child(script, timeout=120):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root), RUST_BACKTRACE="0")
    env.setdefault("WGPU_BACKEND_TYPE", "Vulkan")
    return subprocess.run(
        [sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True, timeout=timeout
    )


# Thread A calls kernel() on a Tensor while thread B destroys it. The destroy used to land between
# the call's "not destroyed" check and its queue.submit, and wgpu-native aborted the process (an
# audit found it within 200 trials). Now every entry point and a watched destroy() hold one lock.
DESTROY_RACE = """
import sys, threading, time
import numpy as np
from generated import Tensor, group_normalization as gn
rng = np.random.default_rng(0)
for trial in range(120):
    x = Tensor.from_numpy(rng.standard_normal((2, 8, 32, 32)).astype(np.float32))
    s, b = Tensor.from_numpy(np.ones(8, np.float32)), Tensor.from_numpy(np.zeros(8, np.float32))
    out = Tensor.empty((2, 8, 32, 32), np.float32)
    go = threading.Event()
    def caller():
        go.wait()
        for _ in range(50):
            try:
                gn.kernel({"x": x, "scale": s, "bias": b}, attrs={"num_groups": 2}, out={"y": out})
            except Exception as error:
                if "destroyed" not in str(error):
                    print("unexpected", type(error).__name__, error)
                    sys.exit(3)
                return
    thread = threading.Thread(target=caller)
    thread.start()
    go.set()
    time.sleep(0.0005 * (trial % 20))
    x.destroy()
    thread.join()
print("done")
"""


def test_a_destroy_in_another_thread_never_aborts_a_call():
    done = _run_child(DESTROY_RACE)
    assert done.returncode == 0 and "done" in done.stdout, (
        done.returncode,
        done.stdout[-500:],
        done.stderr[-2000:],
    )


# A signal handler (or a __del__ run by the garbage collector) that calls the package while this
# thread is inside a cache's lock: with threading.Lock that deadlocked (an audit found it).
REENTRANT = """
import faulthandler, signal, sys
from generated import group_normalization as gn
shapes = {"x": (2, 8, 4), "scale": (8,), "bias": (8,)}
gn.plan(shapes, {"T": "float32"}, {"num_groups": 2})
calls, busy = [0], [False]
def handler(signum, frame):
    if busy[0]:
        return
    busy[0] = True
    calls[0] += 1
    gn.plan(shapes, {"T": "float32"}, {"num_groups": 2})
    busy[0] = False
signal.signal(signal.SIGALRM, handler)
signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
faulthandler.dump_traceback_later(60, exit=True)
for _ in range(100000):
    gn.plan(shapes, {"T": "float32"}, {"num_groups": 2})
signal.setitimer(signal.ITIMER_REAL, 0)
print("done", calls[0])
"""


def test_a_signal_handler_may_call_the_package_inside_its_caches():
    done = _run_child(REENTRANT)
    assert done.returncode == 0 and "done" in done.stdout, (
        done.returncode,
        done.stdout[-500:],
        done.stderr[-2000:],
    )
    assert int(done.stdout.split()[-1]) > 0, "the handler never ran inside a plan() call"


# A device destroyed while 4 threads call on it (issue 25 item 5): every call that meets it raises
# DeviceLostError. wgpu-py's own RuntimeError "Cannot use PollThread because it has stopped" and
# AttributeError "'NoneType' object has no attribute 'get_token'" came out of Tensor.numpy()'s
# read-back (1 to 14 of 4 x 400 calls), or the read-back waited forever for a mapping that the
# stopped poll thread never completed. A device's destroy() now waits for a call in progress.
DEVICE_DESTROYED_MIDWAY = """
import faulthandler, sys, threading, time, traceback
import numpy as np, wgpu
from generated import DeviceLostError, Tensor, group_normalization as gn
faulthandler.dump_traceback_later(300, exit=True)  # a read-back waited forever for its mapping
adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
rng = np.random.default_rng(0)
raw, lost, done = [], [0], [0]
for trial in range(4):
    device = adapter.request_device_sync(required_features=[])
    arrays = {"x": rng.standard_normal((2, 8, 16, 16)).astype(np.float32),
              "scale": np.ones(8, np.float32), "bias": np.zeros(8, np.float32)}
    tensors = {k: Tensor.from_numpy(v, device) for k, v in arrays.items()}
    go = threading.Event()
    def caller(index):
        go.wait()
        for call in range(400):
            try:
                if call % 2:
                    gn.kernel(tensors, attrs={"num_groups": 2})["y"].numpy()
                else:
                    gn.kernel(arrays, attrs={"num_groups": 2}, device=device)
                done[0] += 1
            except DeviceLostError:
                lost[0] += 1
            except Exception as error:
                raw.append(f"{type(error).__name__}: {error}")
                traceback.print_exc()
    gn.kernel(tensors, attrs={"num_groups": 2})["y"].numpy()  # pipelines made before the threads start
    threads = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    go.set()
    time.sleep(0.1 * (trial + 1))
    device.destroy()
    for thread in threads:
        thread.join()
print("raw", len(raw), raw[:3])
print("lost", lost[0], "done", done[0])
"""


def test_a_device_destroyed_while_threads_call_is_device_lost_error_only():
    done = _run_child(DEVICE_DESTROYED_MIDWAY, timeout=600)
    assert done.returncode == 0, (done.returncode, done.stdout[-500:], done.stderr[-2000:])
    assert "raw 0 " in done.stdout, done.stdout[-2000:]
    lost = int(done.stdout.split("lost ")[1].split()[0])
    assert lost > 0, done.stdout  # the destroy did land during the calls


# A destroy() from a signal handler during a call on the same thread (the README lists signal
# handlers as supported callers, and calls_lock is re-entrant) landed between the call's checks and
# its submit: a raw GPUValidationError, or wgpu-native aborted the process at submit (3 of 3 trials
# of 300 calls; issue 25 item 5). Now the destroy of a call's buffer waits for the call's end; the
# pooled Tensor's buffer goes back to the pool only when the next call starts. Both kinds of Tensor
# are destroyed: a pooled one (Tensor.from_numpy) and one over the caller's own buffer.
SIGNAL_DESTROY = """
import faulthandler, signal, sys
import numpy as np, wgpu
from generated import ContractError, Tensor, default_device, group_normalization as gn
device = default_device()
rng = np.random.default_rng(1)
x_values = rng.standard_normal((2, 8, 16, 16)).astype(np.float32)
s, b = Tensor.from_numpy(np.ones(8, np.float32)), Tensor.from_numpy(np.zeros(8, np.float32))
out = Tensor.empty((2, 8, 16, 16), np.float32)
current, landed = [None], [0]
def handler(signum, frame):
    if current[0] is not None:
        current[0].destroy()
        current[0] = None
        landed[0] += 1
signal.signal(signal.SIGALRM, handler)
faulthandler.dump_traceback_later(300, exit=True)
usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
refused = 0
for trial in range(3):
    signal.setitimer(signal.ITIMER_REAL, 0.0002 * (trial + 1), 0.0002 * (trial + 1))
    for call in range(300):
        if call % 2:
            x = Tensor.from_numpy(x_values)
        else:
            x = Tensor(device.create_buffer(size=x_values.nbytes, usage=usage), x_values.shape, np.float32, device)
            device.queue.write_buffer(x.buffer, 0, x_values)
        current[0] = x
        try:
            gn.kernel({"x": x, "scale": s, "bias": b}, attrs={"num_groups": 2}, out={"y": out})
            gn.kernel({"x": x, "scale": s, "bias": b}, attrs={"num_groups": 2})
        except ContractError as error:
            if "destroyed" not in str(error):
                print("unexpected", error)
                sys.exit(3)
            refused += 1
        except Exception as error:
            print("raw", type(error).__name__, error)
            sys.exit(4)
        current[0] = None
    signal.setitimer(signal.ITIMER_REAL, 0)
print("done", landed[0], refused)
"""


def test_a_destroy_from_a_signal_handler_during_a_call_never_reaches_wgpu():
    done = _run_child(SIGNAL_DESTROY, timeout=600)
    assert done.returncode == 0 and "done" in done.stdout, (
        done.returncode,
        done.stdout[-500:],
        done.stderr[-2000:],
    )
    landed, refused = (int(v) for v in done.stdout.split("done")[1].split())
    assert landed > 0 and refused > 0, done.stdout  # the handler did land, some of it between calls
