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
