# SPDX-License-Identifier: Apache-2.0
"""Benchmarks of the generated kernels: GPU time, bytes moved, GB/s against a WGSL copy, host overhead.

    python -m generated.bench [--ops OP[,OP]] [--dtype float32|float16] [--quick]
                              [--json FILE] [--markdown FILE] [--plot FILE] [--torch]
                              [--variant ID] [--tunable NAME=VALUE] [--per-pass] [--wall-clock]

Checked before anything runs (exit 2, the message lists what exists): op, variant, tunable and
case names (a variant, tunable or case must exist in at least one of the ops run), dtypes
(float32, float16), tunable values (whole numbers >= 1), --sequences only against the ops'
sequences, output files (opened for writing first), and --plot's matplotlib (`pip install
matplotlib`, or the project's `bench` extra). Without a WebGPU adapter: one line saying so (as
doctor says it), exit 1. A plot that cannot be drawn (no results) makes the exit status 1.

Cases come from each op package's `cases.py` (`BENCH_CASES`, written from the `bench.json`
beside the op's manifest): {"name", "source", "inputs": {bind key: shape}, "dtypes": {type
variable: dtype or list of dtypes}, "attrs", and optionally "outputs", "tunables", "quick"}.
A list of dtypes gives one case per dtype (the product over type variables).

What is measured, per case:

- GPU time: a timestamp at the beginning and one at the end of a call's compute pass (every
  manifest pass of a call is one dispatch in it), median over many calls after a
  warm-up of a number of calls and a minimum time (GPU clocks ramp up under load). Calls rotate
  among several copies of their tensors, so that the working set is several times the size of
  a large GPU's L2 cache and no call finds its data in cache.
  Without the `timestamp-query` feature: wall-clock time of batches of calls, each batch ended
  by a queue sync (a small read_buffer), divided by the batch size; the output says so.
- bytes: the minimum the op must move: every input read once and every requested output
  written once. GB/s = bytes / GPU time, 1 GB = 1e9 bytes.
- copy: a WGSL kernel that copies vec4<f32> (one per invocation) over bytes / 2, timed the same
  way in batches that alternate with the op's: it reads bytes / 2 and writes bytes / 2, so it
  moves what the op must move. "% of copy" = copy time / op time = op GB/s / copy GB/s.
- host: `plan()` per call; `kernel()` on device-resident Tensors (fresh outputs each call),
  from the call to the end of its GPU work (a queue sync), minus the GPU time and minus the
  cost of the sync alone; the time until `kernel()` returns (encoding and submission); and the
  first call of the case, which creates its pipelines unless an earlier case made them.
- back to back: the same calls timed in runs (20 in a full run, as many as PyTorch's graphs hold),
  the dispatches of a whole run in one compute pass between one pair of timestamps, divided by
  the run's length; the copy the same way. A lone call's time includes what beginning and
  ending a timed compute pass cost (about 5 µs on an H100 or H200, the intercept of the copy's time
  against its bytes), which calls encoded together, as in an app's frame, share.
- with --torch: the PyTorch eager equivalent on CUDA (torch.nn.functional), timed by CUDA graph
  replay (CUDA events around eager calls if capture fails) so that Python's launch overhead is
  not counted, with the same tensor rotation, per call of a graph of back-to-back calls;
  "x torch" = PyTorch time / our time, for a lone call and for back-to-back calls (the like for
  like: both then time a run of calls).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib
import itertools
import json
import math
import pkgutil
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from . import _runtime, bench_calls, bench_ort, bench_transfers, doctor
from ._runtime import Sequence, Tensor
from .bench_torch import TorchPeer, back_to_back_calls

# Calls rotate among copies of their tensors until this many bytes are touched per round: a few
# times the L2 cache of a large GPU (the H200 has 60 MB).
ROTATION_BYTES = 256_000_000
MAX_COPIES = 16


@dataclass(frozen=True)
class Settings:
    """How hard to measure: full runs for numbers, quick runs for CI on a software rasterizer."""

    warmup: int  # calls timed and thrown away, at least
    warmup_s: float  # and for at least this long, so that the GPU's clocks have ramped up
    iters: int  # calls timed
    batch: int  # calls per command encoder (and per timestamp read-back)
    host_iters: int  # plan() and kernel() calls for the host overheads
    torch_reps: int  # graph replays
    max_copies: int

    @classmethod
    def full(cls):
        return cls(
            warmup=20, warmup_s=0.3, iters=200, batch=20, host_iters=100, torch_reps=20, max_copies=MAX_COPIES
        )

    @classmethod
    def quick(cls):
        return cls(warmup=2, warmup_s=0.0, iters=10, batch=5, host_iters=10, torch_reps=3, max_copies=2)


# ---------------------------------------------------------------------------------------------
# Cases


@dataclass(frozen=True)
class Case:
    op: str  # op package name
    name: str
    source: str
    shapes: dict  # bind key -> shape
    dtypes: dict  # type variable -> "float32" | "float16"
    attrs: dict
    outputs: tuple | None  # None: the op's required outputs
    tunables: dict
    quick: bool

    @property
    def dtype_label(self):
        return "/".join(_SHORT_DTYPE[d] for d in self.dtypes.values())


_SHORT_DTYPE = {"float32": "f32", "float16": "f16"}
_DTYPE_NAMES = {"f32": "float32", "f16": "float16", "float32": "float32", "float16": "float16"}


def op_packages():
    """{name: module} of every op package beside this module (not the private _runtime), in name order."""
    package = importlib.import_module(__package__)
    names = sorted(
        info.name
        for info in pkgutil.iter_modules(package.__path__)
        if info.ispkg and not info.name.startswith("_")
    )
    return {name: importlib.import_module(f".{name}", __package__) for name in names}


def bench_cases(op_name):
    """The op's BENCH_CASES expanded to one Case per dtype combination ([] if it has none)."""
    try:
        cases = importlib.import_module(f".{op_name}.cases", __package__)
    except ModuleNotFoundError:
        return []
    expanded = []
    for entry in cases.BENCH_CASES:
        type_vars = list(entry["dtypes"])
        choices = [
            entry["dtypes"][t] if isinstance(entry["dtypes"][t], list) else [entry["dtypes"][t]]
            for t in type_vars
        ]
        for combination in itertools.product(*choices):
            outputs = entry.get("outputs")
            expanded.append(
                Case(
                    op=op_name,
                    name=entry["name"],
                    source=entry.get("source", ""),
                    shapes={key: tuple(shape) for key, shape in entry["inputs"].items()},
                    dtypes={t: _DTYPE_NAMES[d] for t, d in zip(type_vars, combination)},
                    attrs=dict(entry.get("attrs", {})),
                    outputs=tuple(outputs) if outputs is not None else None,
                    tunables=dict(entry.get("tunables", {})),
                    quick=bool(entry.get("quick", False)),
                )
            )
    return expanded


def select_cases(ops, quick, dtypes, names=()):
    """Cases to run; with --quick, those marked quick (the op's first case where none is marked);
    with `names`, only the cases of those names."""
    chosen = []
    for op_name in ops:
        cases = bench_cases(op_name)
        if names:
            cases = [c for c in cases if c.name in names]
        if dtypes:  # before --quick's first case, which might be of another dtype
            # The first type variable (T) decides; the others (SkipGroupNorm's M) follow the case.
            cases = [c for c in cases if next(iter(c.dtypes.values())) in dtypes]
        if quick:
            marked = [c for c in cases if c.quick]
            cases = marked or cases[:1]
        chosen += cases
    return chosen


def attributes_with_defaults(op, case):
    return {a.name: a.default for a in op.ATTRIBUTES if a.default is not None} | case.attrs


def random_inputs(op, case, rng):
    """Inputs in [0.5, 1.5): positive, so that a variance input is valid; timing ignores values."""
    type_var = {t.key: t.type_var for t in op.INPUTS}
    return {
        key: rng.uniform(0.5, 1.5, size=shape).astype(np.float32).astype(case.dtypes[type_var[key]])
        for key, shape in case.shapes.items()
    }


def requested_outputs(op, case):
    """Bind keys of the outputs the case asks for."""
    if case.outputs is None:
        return [t.key for t in op.OUTPUTS if not t.optional]
    return [t.key for t in op.OUTPUTS if t.key in case.outputs or t.role in case.outputs]


def minimum_bytes(plan, outputs):
    """Every input read once, every requested output written once."""

    def nbytes(shape, dtype):
        return math.prod(shape) * np.dtype(dtype).itemsize

    return sum(nbytes(*spec) for spec in plan.inputs.values()) + sum(
        nbytes(*plan.outputs[k]) for k in outputs
    )


def rotation_copies(nbytes, settings):
    return max(2, min(settings.max_copies, math.ceil(ROTATION_BYTES / max(nbytes, 1))))


# ---------------------------------------------------------------------------------------------
# GPU timing


class GpuTimer:
    """Per-call GPU time of encoded work, from timestamp queries or, failing those, wall clock."""

    def __init__(self, device, batch, use_timestamps=True):
        import wgpu

        self.device = device
        self.batch = batch
        self.timestamps = use_timestamps and "timestamp-query" in device.features
        self.method = (
            "timestamp-query (beginning to end of a call's compute pass, which holds all its dispatches)"
            if self.timestamps
            else "wall clock: batches of calls between queue syncs (no timestamp-query)"
        )
        usage = wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
        self._sync_buffer = device.create_buffer(size=4, usage=usage)
        self._sync_readback = device.create_buffer(
            size=4, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST
        )
        if self.timestamps:
            self._queries = device.create_query_set(type=wgpu.QueryType.timestamp, count=2 * batch)
            self._resolved = device.create_buffer(
                size=16 * batch, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC
            )
        self.suspicious = False  # GPU time above wall time: ticks may not be nanoseconds

    def sync(self):
        """Wait for the queue: map a 4-byte buffer that a copy submitted last writes.

        on_submitted_work_done_sync is broken in wgpu-py 0.32, and queue.read_buffer creates,
        maps and destroys a staging buffer each time (about 200-450 µs on the H200, which app
        steps would count as theirs); a kept buffer costs one small submit and one map.
        """
        encoder = self.device.create_command_encoder()
        encoder.copy_buffer_to_buffer(self._sync_buffer, 0, self._sync_readback, 0, 4)
        self.device.queue.submit([encoder.finish()])
        self._sync_readback.map_sync("READ")
        self._sync_readback.unmap()

    def measure(self, work, copies, settings):
        """Seconds per call of each kind of work, measured in alternating batches.

        `work` maps a name to `encode(encoder, copy index, timestamps or None)`, which encodes one
        call. Alternating batches (the op, then the copy, ...) put every kind of work under the same
        clocks; the warm-up runs for a number of calls and a time (clocks ramp up under load).
        """
        samples = {name: [] for name in work}
        needed = math.ceil(settings.iters / self.batch)
        calls, measured = 0, 0
        started = time.perf_counter()
        while measured < needed:
            warm = calls < settings.warmup or time.perf_counter() - started < settings.warmup_s
            for name, encode in work.items():
                per_call = self._batch(encode, calls, copies)
                if not warm:
                    samples[name] += per_call
            calls += self.batch
            measured += 0 if warm else 1
        return samples

    def _batch(self, encode, first_call, copies):
        """One command encoder of `batch` calls, submitted and waited for; seconds per call."""
        encoder = self.device.create_command_encoder(label="bench")
        for k in range(self.batch):
            timestamps = (self._queries, 2 * k, 2 * k + 1) if self.timestamps else None
            encode(encoder, (first_call + k) % copies, timestamps)
        if self.timestamps:
            encoder.resolve_query_set(self._queries, 0, 2 * self.batch, self._resolved, 0)
        started = time.perf_counter()
        self.device.queue.submit([encoder.finish()])
        if not self.timestamps:
            self.sync()
            return [(time.perf_counter() - started) / self.batch]
        ticks = np.frombuffer(self.device.queue.read_buffer(self._resolved), np.uint64).astype(np.int64)
        wall = time.perf_counter() - started
        per_call = (ticks[1::2] - ticks[0::2]) * 1e-9  # wgpu resolves timestamps in nanoseconds
        self.suspicious |= bool(per_call.sum() > 1.05 * wall)
        return [float(t) for t in per_call if t > 0]


COPY_WGSL = """
override FOLD: u32;

@group(0) @binding(0) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<f32>>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * FOLD) * 256u + lid;
    if (i < arrayLength(&dst)) {
        dst[i] = src[i];
    }
}
"""


class CopyKernel:
    """The reference: a vec4<f32> copy, one element per invocation, folded 2-D dispatch."""

    def __init__(self, device):
        import wgpu

        self.device = device
        self.fold = _runtime.fold_width(_runtime.device_caps(device))
        layout = device.create_bind_group_layout(
            entries=[
                {
                    "binding": 0,
                    "visibility": wgpu.ShaderStage.COMPUTE,
                    "buffer": {"type": "read-only-storage"},
                },
                {"binding": 1, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": "storage"}},
            ]
        )
        self.layout = layout
        self.pipeline = device.create_compute_pipeline(
            label="copy vec4<f32>",
            layout=device.create_pipeline_layout(bind_group_layouts=[layout]),
            compute={
                "module": device.create_shader_module(label="copy", code=COPY_WGSL),
                "entry_point": "main",
                "constants": {"FOLD": self.fold},
            },
        )

    def bind(self, nbytes):
        """A bound copy of nbytes / 2 (rounded up to whole vec4s), and the buffers it owns."""
        import wgpu

        count = max(1, math.ceil(nbytes / 2 / 16))
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST
        src = self.device.create_buffer(size=16 * count, usage=usage)
        dst = self.device.create_buffer(size=16 * count, usage=usage)
        bind_group = self.device.create_bind_group(
            layout=self.layout,
            entries=[
                {"binding": 0, "resource": {"buffer": src}},
                {"binding": 1, "resource": {"buffer": dst}},
            ],
        )
        workgroups = math.ceil(count / 256)
        dispatch = (min(workgroups, self.fold), math.ceil(workgroups / self.fold), 1)
        return _runtime.BoundPass("copy", self.pipeline, bind_group, dispatch), [src, dst]


# ---------------------------------------------------------------------------------------------
# One case


@dataclass
class Result:
    op: str
    case: str
    source: str
    dtypes: dict
    shapes: dict
    attrs: dict
    variant: str = ""
    passes: list = field(default_factory=list)  # [{name, dispatch, workgroup_size, alone_us with --per-pass}]
    bytes: int = 0
    copies: int = 0
    samples: int = 0
    gpu_us: float | None = None
    gpu_us_p10: float | None = None
    gpu_us_p90: float | None = None
    gbps: float | None = None
    copy_us: float | None = None
    copy_gbps: float | None = None
    fraction_of_copy: float | None = None
    run_calls: int = 0  # calls in a back-to-back run
    run_us: float | None = None  # GPU time a call within a back-to-back run
    copy_run_us: float | None = None
    torch_us: float | None = None
    torch_gbps: float | None = None
    speedup_vs_torch: float | None = None
    speedup_vs_torch_run: float | None = None  # PyTorch's time / run_us
    torch_timing: str | None = None
    host: dict = field(default_factory=dict)
    ort: dict = field(default_factory=dict)  # with --ort: ONNX Runtime WebGPU and ours, timed alike
    error: str | None = None


def _median_us(samples):
    return statistics.median(samples) * 1e6


def _percentile_us(samples, q):
    return float(np.percentile(samples, q)) * 1e6


class Bench:
    """Runs cases on one device, sharing the timer, the copy kernel and the PyTorch peer."""

    def __init__(
        self,
        device,
        settings,
        timer,
        torch_peer=None,
        variant=None,
        tunables=None,
        per_pass=False,
        ort_peer=None,
    ):
        self.device = device
        self.ort_peer = ort_peer
        self.per_pass = per_pass
        self.settings = settings
        self.timer = timer
        self.copy = CopyKernel(device)
        self.torch_peer = torch_peer
        self.variant = variant
        self.tunables = tunables or {}
        self.rng = np.random.default_rng(0)

    def run(self, op, case):
        result = Result(
            case.op,
            case.name,
            case.source,
            case.dtypes,
            {k: list(v) for k, v in case.shapes.items()},
            case.attrs,
        )
        owned = []  # buffers to destroy when the case is done
        try:
            self._run(op, case, result, owned)
        except Exception as error:
            result.error = f"{type(error).__name__}: {error}"
        finally:
            for buffer in owned:
                buffer.destroy()
        return result

    def _call_options(self, op, case):
        """plan()/kernel() keywords: the case's outputs and tunables, the command line's variant and tunables."""
        tunables = case.tunables | {k: v for k, v in self.tunables.items() if k in op.TUNABLES}
        variant = self.variant if self.variant in {c.ID for c in op.CANDIDATES} else None
        return {"outputs": case.outputs, "tunables": tunables or None, "variant": variant}

    def _run(self, op, case, result, owned):
        device, settings, timer = self.device, self.settings, self.timer
        options = self._call_options(op, case)
        plan = op.plan(case.shapes, case.dtypes, case.attrs, device=device, **options)
        outputs = requested_outputs(op, case)
        result.variant = plan.variant
        result.passes = [
            {"name": p.name, "dispatch": list(p.dispatch), "workgroup_size": p.workgroup_size}
            for p in plan.passes
        ]
        result.bytes = minimum_bytes(plan, outputs)
        result.copies = copies = rotation_copies(result.bytes, settings)

        arrays = random_inputs(op, case, self.rng)
        sets = []
        for _ in range(copies):
            tensors = {"input": {k: Tensor.from_numpy(a, device) for k, a in arrays.items()}}
            for kind, group in (("output", plan.outputs), ("intermediate", plan.intermediates)):
                tensors[kind] = {k: Tensor.empty(shape, dtype, device) for k, (shape, dtype) in group.items()}
            owned += [t.buffer for group in tensors.values() for t in group.values()]
            sets.append(tensors)

        # The first call creates the case's pipelines, unless an earlier case made them.
        timer.sync()
        started = time.perf_counter()
        op.kernel(sets[0]["input"], attrs=case.attrs, device=device, **options)
        timer.sync()
        first_call = time.perf_counter() - started

        self._time_gpu(plan, sets, result, owned)
        result.host = self._host_overheads(op, case, sets[0], options, result.gpu_us)
        result.host["first_call_ms"] = first_call * 1e3
        result.host["numpy_call_ms"] = self._numpy_call_ms(op, case, arrays, options)
        arrays_for = lambda shapes: random_inputs(
            op, dataclasses.replace(case, shapes=shapes), self.rng
        )  # noqa: E731
        result.host.update(
            bench_calls.new_shape_first_call(op, case, arrays_for, options, device, timer.sync)
        )

        if self.ort_peer is not None:
            shapes = {key: plan.outputs[key][0] for key in outputs}
            result.ort = self._against_ort(op, case, arrays, sets[0], options, shapes)
            result.ort["ours_numpy_ms"] = result.host["numpy_call_ms"]
        if self.torch_peer is not None:
            seconds, how = self.torch_peer.time(case.op, arrays, attributes_with_defaults(op, case), copies)
            result.torch_timing = how
            if seconds is not None:
                result.torch_us = seconds * 1e6
                result.torch_gbps = result.bytes / result.torch_us / 1e3
                result.speedup_vs_torch = result.torch_us / result.gpu_us
                result.speedup_vs_torch_run = result.torch_us / result.run_us

    def _time_gpu(self, plan, sets, result, owned):
        """The plan's GPU time on rotating input sets, against the copy kernel of the same bytes."""
        device, settings, timer, copies = self.device, self.settings, self.timer, result.copies
        runnable_index = [i for i, p in enumerate(plan.passes) if 0 not in p.dispatch]
        runnable = [plan.passes[i] for i in runnable_index]
        if not runnable:
            raise ValueError("the plan dispatches nothing (empty tensors): no GPU time to measure")
        bound = [_runtime.bind_passes(runnable, tensors, device) for tensors in sets]
        copy_bound = []
        for _ in range(copies):
            bound_copy, buffers = self.copy.bind(result.bytes)
            copy_bound.append([bound_copy])
            owned += buffers
        result.run_calls = run_calls = back_to_back_calls(settings, copies)

        def run_of(bound_sets):
            """Encodes the calls of one back-to-back run, from set i on, as one compute pass."""
            return lambda encoder, i, ts: _runtime.encode_passes(
                encoder, [item for k in range(run_calls) for item in bound_sets[(i + k) % copies]], ts
            )

        work = {
            "op": lambda encoder, i, ts: _runtime.encode_passes(encoder, bound[i], ts),
            "copy": lambda encoder, i, ts: _runtime.encode_passes(encoder, copy_bound[i], ts),
            "op_run": run_of(bound),
            "copy_run": run_of(copy_bound),
        }
        if self.per_pass and len(runnable) > 1:
            # Each dispatch alone in its own compute pass, on what the earlier ones left behind.
            for k in range(len(runnable)):
                work[k] = lambda encoder, i, ts, k=k: _runtime.encode_passes(encoder, bound[i][k : k + 1], ts)
        samples = timer.measure(work, copies, settings)
        for k, i in enumerate(runnable_index):
            if k in samples:
                result.passes[i]["alone_us"] = _median_us(samples[k])
        result.samples = len(samples["op"])
        result.gpu_us = _median_us(samples["op"])
        result.gpu_us_p10, result.gpu_us_p90 = _percentile_us(samples["op"], 10), _percentile_us(
            samples["op"], 90
        )
        result.gbps = result.bytes / result.gpu_us / 1e3
        result.copy_us = _median_us(samples["copy"])
        result.copy_gbps = result.bytes / result.copy_us / 1e3
        result.fraction_of_copy = result.copy_us / result.gpu_us
        result.run_us = _median_us(samples["op_run"]) / run_calls
        result.copy_run_us = _median_us(samples["copy_run"]) / run_calls

    def _against_ort(self, op, case, arrays, tensors, options, outputs):
        """ONNX Runtime's three paths on this case, and ours measured the same way (N calls, one sync)."""
        ort = self.ort_peer.time(op, case, arrays, attributes_with_defaults(op, case), outputs)
        timings = {
            "placement": ort.placement,
            "notes": ort.notes,
            "error_of_tolerance": ort.error_of_tolerance,
        }
        timings |= {
            "ort_numpy_ms": ort.numpy_ms,
            "ort_device_ms": ort.device_ms,
            "ort_capture_ms": ort.capture_ms,
        }
        device, sync = self.device, self.timer.sync

        def call():
            op.kernel(tensors["input"], attrs=case.attrs, device=device, out=tensors["output"], **options)

        sequence = Sequence(device)
        sequence.kernel(op, tensors["input"], case.attrs, out=tensors["output"], **options)
        timings["ours_device_ms"] = bench_ort.calls_then_one_readback_ms(call, sync, self.settings)
        timings["ours_sequence_ms"] = bench_ort.calls_then_one_readback_ms(sequence.run, sync, self.settings)
        return timings

    def _numpy_call_ms(self, op, case, arrays, options):
        """What a user's first line costs: numpy arrays in, numpy arrays out (upload, the call, read-back)."""
        call = lambda: op.kernel(arrays, attrs=case.attrs, device=self.device, **options)  # noqa: E731
        return bench_calls.median_us(call, min(5, self.settings.host_iters)) / 1e3

    def _host_overheads(self, op, case, tensors, options, gpu_us):
        """plan() per call; kernel() until it returns, and to the end of its GPU work less the GPU
        time and a bare sync: with fresh outputs, and writing into existing ones (out=)."""
        device, timer, n = self.device, self.timer, self.settings.host_iters

        def clock(fn):
            started = time.perf_counter()
            fn()
            return time.perf_counter() - started

        def kernel_call():
            op.kernel(tensors["input"], attrs=case.attrs, device=device, **options)

        def kernel_into_outputs():
            op.kernel(tensors["input"], attrs=case.attrs, device=device, out=tensors["output"], **options)

        plan_s = [
            clock(lambda: op.plan(case.shapes, case.dtypes, case.attrs, device=device, **options))
            for _ in range(n)
        ]
        submit_s, into_submit_s, end_to_end_s, into_s, sync_s = [], [], [], [], []
        for _ in range(n):
            timer.sync()
            submit_s.append(clock(kernel_call))
            timer.sync()
            into_submit_s.append(clock(kernel_into_outputs))
            timer.sync()
            end_to_end_s.append(clock(lambda: (kernel_call(), timer.sync())))
            into_s.append(clock(lambda: (kernel_into_outputs(), timer.sync())))
            sync_s.append(clock(timer.sync))
        sync_us = _median_us(sync_s)
        host = {
            "plan_us": _median_us(plan_s),
            "kernel_submit_us": _median_us(submit_s),
            "kernel_out_submit_us": _median_us(into_submit_s),
            "kernel_overhead_us": _median_us(end_to_end_s) - gpu_us - sync_us,
            "kernel_out_overhead_us": _median_us(into_s) - gpu_us - sync_us,
            "sync_us": sync_us,
        }
        plan = op.plan(case.shapes, case.dtypes, case.attrs, device=device, **options)
        host.update(bench_calls.host_floor(device, plan, tensors, timer.sync, n))
        return bench_calls.with_ratios(host)


# ---------------------------------------------------------------------------------------------
# Reports


def device_info(device):
    import wgpu

    info = device.adapter_info
    return {
        "adapter": {
            k: info.get(k)
            for k in ("vendor", "architecture", "device", "description", "adapter_type", "backend_type")
        },
        "wgpu": wgpu.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "features": sorted(device.features),
    }


def _fmt(value, digits=1):
    return "" if value is None else f"{value:,.{digits}f}"


def _gbps(value):
    """GB/s with a decimal only where it matters (a software rasterizer runs at a few GB/s)."""
    return _fmt(value, 0 if value is None or value >= 100 else 1)


def markdown(results, meta):
    lines = _meta_lines(meta) + _gpu_table(results) + _host_table(results) + _per_pass_table(results)
    lines += _ort_table(results)
    torch_notes = sorted({r.torch_timing for r in results if r.torch_timing})
    if torch_notes:
        lines += ["", "PyTorch timing: " + "; ".join(torch_notes) + "."]
    return "\n".join(lines) + "\n"


def _meta_lines(meta):
    lines = [
        f"Device: {meta['device']['adapter']['device']} ({meta['device']['adapter']['description']}, "
        f"{meta['device']['adapter']['backend_type']}); wgpu {meta['device']['wgpu']}.",
        f"GPU timing: {meta['timing']}.",
    ]
    if meta.get("warnings"):
        lines += [f"Warning: {w}" for w in meta["warnings"]]
    if meta.get("torch"):
        lines.append(
            "PyTorch: " + ", ".join(f"{k} {v}" for k, v in meta["torch"].items()) + "; "
            "\u00d7 torch = PyTorch time / our time."
        )
    if meta.get("torch_copy_gbps"):
        lines.append(f"PyTorch device-to-device copy (1 GB moved): {meta['torch_copy_gbps']:,.0f} GB/s.")
    return lines


def _gpu_table(results):
    lines = []
    lines += [
        "",
        "| op | case | dtype | shape | variant | passes | MB | GPU \u00b5s | GB/s | copy GB/s | % of copy "
        "| back to back \u00b5s | copy back to back \u00b5s | torch \u00b5s | torch GB/s | \u00d7 torch | \u00d7 torch back to back |",
        "| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        shape = "x".join(str(d) for d in next(iter(r.shapes.values())))
        dtype = "/".join(_SHORT_DTYPE[d] for d in r.dtypes.values())
        if r.error:
            lines.append(
                f"| {r.op} | {r.case} | {dtype} | {shape} | error: {r.error} |  |  |  |  |  |  |  |  |  |  |  |  |"
            )
            continue
        percent = None if r.fraction_of_copy is None else 100 * r.fraction_of_copy
        speedup = "" if r.speedup_vs_torch is None else f"{r.speedup_vs_torch:.2f}"
        speedup_run = "" if r.speedup_vs_torch_run is None else f"{r.speedup_vs_torch_run:.2f}"
        lines.append(
            f"| {r.op} | {r.case} | {dtype} | {shape} | {r.variant} | {len(r.passes)} | {_fmt(r.bytes / 1e6)} "
            f"| {_fmt(r.gpu_us)} | {_gbps(r.gbps)} | {_gbps(r.copy_gbps)} | {_fmt(percent, 0)} "
            f"| {_fmt(r.run_us)} | {_fmt(r.copy_run_us)} "
            f"| {_fmt(r.torch_us)} | {_gbps(r.torch_gbps)} | {speedup} | {speedup_run} |"
        )
    return lines


def _host_table(results):
    lines = []
    lines += [
        "",
        "Host time (medians, µs): `plan()` per call; each call's host time until it returns (submit), the "
        "queue synced between calls: `kernel()` with fresh outputs, `kernel(out=)`, `Sequence.run()` of the "
        "call recorded once, and the bare wgpu floor in the same process (one dispatch: encoder, compute pass, "
        "pipeline, bind group, submit) with the cached bind group and creating one; × floor = against the "
        "fresh-bind-group floor. Overhead = to the end of the GPU work minus GPU time and a bare sync. "
        f"Figures under {bench_calls.NOISE_US:g} µs are noise. First call: creates the case's pipelines "
        "unless an earlier case made them. New shape: the first call of the case's shapes with one spatial "
        "dimension 4 larger (a shape not seen before), with inputs and out= allocated before the clock; "
        "over a repeat = what it took more than a second call of that shape; and the pipelines it created. "
        "numpy in/out: `kernel()` on numpy arrays, returning numpy arrays (upload, call, read-back), in ms. "
        "Floor, the plan's dispatches: all of the plan's dispatches through wgpu-py alone, each with a "
        "fresh bind group.",
        "",
        "| op | case | dtype | plan | kernel() | kernel(out=) | Sequence.run() | floor, cached bg | floor, fresh bg "
        "| kernel(out=) × floor | floor, the plan's dispatches | kernel(out=) × that | Sequence × floor "
        "| kernel() overhead | kernel(out=) overhead | first call ms "
        "| new shape: first call ms (over a repeat; pipelines made) | numpy in/out ms |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        if r.error:
            continue
        dtype = "/".join(_SHORT_DTYPE[d] for d in r.dtypes.values())
        h = r.host
        shown = bench_calls.shown_us
        lines.append(
            f"| {r.op} | {r.case} | {dtype} | {_fmt(h['plan_us'])} | {shown(h['kernel_submit_us'])} "
            f"| {shown(h.get('kernel_out_submit_us'))} | {shown(h.get('sequence_run_us'))} "
            f"| {shown(h.get('floor_cached_us'))} | {shown(h.get('floor_fresh_us'))} "
            f"| {_fmt(h.get('kernel_out_submit_ratio'), 2)} | {shown(h.get('floor_plan_fresh_us'))} "
            f"| {_fmt(h.get('kernel_out_submit_plan_ratio'), 2)} | {_fmt(h.get('sequence_run_ratio'), 2)} "
            f"| {shown(h['kernel_overhead_us'])} | {shown(h['kernel_out_overhead_us'])} | {_fmt(h['first_call_ms'])} "
            f"| {_fmt(h.get('new_shape_first_call_ms'), 2)} (+{_fmt(h.get('new_shape_excess_ms'), 2)}; "
            f"{h.get('new_shape_pipelines', '')}"
            f"{'' if h.get('new_shape_same_variant', True) else ', other variant'}) "
            f"| {_fmt(h.get('numpy_call_ms'), 2)} |"
        )
    return lines


def _ort_table(results):
    rows = [r for r in results if not r.error and r.ort]
    if not rows:
        return []
    lines = [
        "",
        "Against ONNX Runtime's WebGPU provider (--ort), ms per call, each side the same way: numpy = numpy "
        "arrays in and out (`session.run()`; ours `kernel()`); device = inputs and outputs bound on the device, "
        "N calls then one read-back or sync (`io_binding`; ours `kernel(out=)`); replay = the same with ONNX "
        "Runtime's graph capture (ours a recorded `Sequence.run()`); × = ONNX Runtime / ours; error = ONNX "
        "Runtime's worst output against float64, as a fraction of check_model's tolerance. A node ONNX Runtime "
        "would place on its CPU provider is not timed.",
        "",
        "| op | case | dtype | placement | numpy: ORT | ours | × | device: ORT | ours | × | replay: ORT | ours | × "
        "| ORT error |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        o = r.ort
        cells = [r.op, r.case, "/".join(_SHORT_DTYPE[d] for d in r.dtypes.values()), o["placement"]]
        for theirs, ours in (
            ("ort_numpy_ms", "ours_numpy_ms"),
            ("ort_device_ms", "ours_device_ms"),
            ("ort_capture_ms", "ours_sequence_ms"),
        ):
            ratio = o[theirs] / o[ours] if o.get(theirs) and o.get(ours) else None
            cells += [_fmt(o.get(theirs), 3), _fmt(o.get(ours), 3), _fmt(ratio, 2)]
        cells.append(_fmt(o.get("error_of_tolerance"), 3))
        lines.append("| " + " | ".join(cells) + " |")
    notes = sorted({f"{r.op} {r.case}: {note}" for r in rows for note in r.ort.get("notes", [])})
    lines += [f"- {note}" for note in notes]
    return lines


def _per_pass_table(results):
    lines = []
    alone = [r for r in results if not r.error and any("alone_us" in p for p in r.passes)]
    if alone:
        lines += [
            "",
            "Per pass (--per-pass): each dispatch of a plan timed alone, in its own compute pass, on the "
            "intermediates the earlier ones left; a lone compute pass has a floor of its own (a few \u00b5s), "
            "so the parts add up to more than the plan's one-pass time.",
            "",
            "| op | case | dtype | pass | workgroups | workgroup size | alone \u00b5s |",
            "| --- | --- | --- | --- | --- | ---: | ---: |",
        ]
        for r in alone:
            dtype = "/".join(_SHORT_DTYPE[d] for d in r.dtypes.values())
            for p in r.passes:
                workgroups = "x".join(str(d) for d in p["dispatch"])
                lines.append(
                    f"| {r.op} | {r.case} | {dtype} | {p['name']} | {workgroups} | {p['workgroup_size']} "
                    f"| {_fmt(p.get('alone_us'))} |"
                )
    return lines


def plot(results, meta, path):
    """Achieved GB/s per case, against the copy kernel and PyTorch, as PNG into `path` (a name or a
    binary file); None when written, else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not importable"
    rows = [r for r in results if r.error is None]
    if not rows:
        return "no results to plot"
    labels = [
        f"{r.op.replace('_normalization', '_norm')}: {r.case} {'/'.join(_SHORT_DTYPE[d] for d in r.dtypes.values())}"
        for r in rows
    ]
    y = np.arange(len(rows))
    has_torch = any(r.torch_gbps for r in rows)
    height = 0.4 if has_torch else 0.7
    fig, ax = plt.subplots(figsize=(11, 0.38 * len(rows) + 1.6))
    ax.barh(
        y - (height / 2 if has_torch else 0),
        [r.gbps for r in rows],
        height,
        label="generated kernel",
        color="#2b6cb0",
    )
    if has_torch:
        ax.barh(
            y + height / 2,
            [r.torch_gbps or 0 for r in rows],
            height,
            label="PyTorch eager (CUDA)",
            color="#dd8452",
        )
    ax.scatter(
        [r.copy_gbps for r in rows],
        y,
        marker="|",
        s=260,
        color="black",
        label="WGSL vec4 copy, same bytes",
        zorder=3,
    )
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("achieved GB/s (minimum bytes: inputs read once, outputs written once)")
    ax.set_title(f"{meta['device']['adapter']['device']}: {meta['timing'].split(' (')[0]}", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")
    plt.close(fig)
    return None


# ---------------------------------------------------------------------------------------------
# Command line


def _names(values):
    return [name for value in values or [] for name in value.split(",") if name]


def _dtype(text):
    """--dtype: float32 and/or float16 (f32, f16), comma-separated."""
    names = [name for name in text.split(",") if name]
    bad = [name for name in names if name not in _DTYPE_NAMES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: the kernels' dtypes are float32 and float16")
    return tuple(_DTYPE_NAMES[name] for name in names)


def _tunable(text):
    """--tunable NAME=VALUE with a whole number from 1 to 2**31 - 1, as the kernels take it."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    try:  # an integer as typed (float() would round 99999999999999999999), or a whole float
        number = int(value) if value.strip().lstrip("+-").isdigit() else float(value)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"{name}={value}: {value!r} is not a number") from None
    if not (1 <= number < 2**31 and float(number).is_integer()):
        raise argparse.ArgumentTypeError(f"{name}={value}: a tunable is a whole number from 1 to 2**31 - 1")
    return name, int(number)


def _listing(by_op):
    return "; ".join(f"{op}: {', '.join(names) or '(none)'}" for op, names in by_op.items())


def _open_outputs(parser, wanted):
    """Open the output files before the run, so that a bad path fails now, not after the benchmarks."""
    files = {}
    for key, (option, path, mode) in wanted.items():
        if path is None:
            files[key] = None
            continue
        try:
            files[key] = open(path, mode)
        except OSError as error:
            for handle in files.values():
                if handle is not None:
                    handle.close()
            parser.error(f"{option} {path}: cannot write: {error.strerror or error}")
    return files


def parse_args(argv):
    parser = _parser()
    args = parser.parse_args(argv)
    packages = op_packages()
    args.ops = _names(args.ops) or list(packages)
    unknown = [name for name in args.ops if name not in packages]
    if unknown:
        parser.error(f"--ops: unknown op {', '.join(unknown)}; choose from {', '.join(packages)}")
    chosen = {name: packages[name] for name in args.ops}
    _check_choices(parser, args, chosen)
    _check_cases(parser, args, chosen)
    args.packages = chosen
    args.files = _open_outputs(
        parser,
        {
            "markdown": ("--markdown", args.markdown, "w"),
            "json": ("--json", args.json, "w"),
            "plot": ("--plot", args.plot, "wb"),
        },
    )
    return args


def _check_choices(parser, args, chosen):
    """--variant, --tunable and --plot against what the chosen ops and this machine have."""
    if args.variant is not None and not any(
        args.variant in {c.ID for c in op.CANDIDATES} for op in chosen.values()
    ):
        variants = {name: [c.ID for c in op.CANDIDATES] for name, op in chosen.items()}
        parser.error(f"--variant: no op here has variant {args.variant!r}; variants: {_listing(variants)}")
    for name, _ in args.tunable:
        if not any(name in op.TUNABLES for op in chosen.values()):
            tunables = {op_name: list(op.TUNABLES) for op_name, op in chosen.items()}
            parser.error(f"--tunable: no op here has tunable {name!r}; tunables: {_listing(tunables)}")
    if args.plot is not None:
        try:
            importlib.import_module("matplotlib")
        except ImportError:
            parser.error("--plot needs matplotlib: pip install matplotlib (or the project's bench extra)")


def _check_cases(parser, args, chosen):
    """--cases against the chosen ops' case names; --sequences only against their sequences."""
    names = _names(args.cases)
    by_op = {op: list(dict.fromkeys(c.name for c in bench_cases(op))) for op in chosen}
    known = {name for cases in by_op.values() for name in cases}
    unknown = [name for name in dict.fromkeys(names) if name not in known]
    if unknown:
        close = [m for name in unknown for m in difflib.get_close_matches(name, sorted(known), n=1)]
        hint = f" (did you mean {', '.join(repr(m) for m in close)}?)" if close else ""
        parser.error(f"--cases: unknown case {', '.join(unknown)}{hint}; cases: {_listing(by_op)}")
    dtypes = {name for names in args.dtype or () for name in names}
    if args.sequences == "only" and not bench_calls.sequence_runs(chosen, dtypes):
        which = f" in {', '.join(sorted(dtypes))}" if dtypes and bench_calls.sequences_of(chosen) else ""
        have = "has" if len(chosen) == 1 else "have"
        parser.exit(
            2, f"{parser.prog}: --sequences only: {', '.join(chosen)} {have} no sequences{which} to run\n"
        )


def _parser():
    parser = argparse.ArgumentParser(
        prog=f"python -m {__package__}.bench", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--ops", action="append", help="op packages to run, comma-separated (default: all)")
    parser.add_argument(
        "--dtype",
        action="append",
        type=_dtype,
        metavar="{float32,float16}",
        help="dtype of T (default: both)",
    )
    parser.add_argument("--quick", action="store_true", help="only the cases marked quick, few iterations")
    parser.add_argument("--cases", action="append", help="only the cases of these names, comma-separated")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    parser.add_argument("--markdown", metavar="FILE", help="write the Markdown tables to FILE too")
    parser.add_argument("--plot", metavar="FILE", help="write a PNG plot (needs matplotlib: the bench extra)")
    parser.add_argument("--torch", action="store_true", help="add the PyTorch eager equivalent (CUDA)")
    parser.add_argument(
        "--ort",
        action="store_true",
        help="add ONNX Runtime's WebGPU provider (needs onnxruntime-webgpu and onnx)",
    )
    parser.add_argument("--variant", metavar="ID", help="force this variant in the ops that have it")
    parser.add_argument(
        "--tunable",
        action="append",
        default=[],
        type=_tunable,
        metavar="NAME=VALUE",
        help="override a tunable in the ops that have it",
    )
    parser.add_argument(
        "--per-pass", action="store_true", help="also time each dispatch of a multi-pass plan alone"
    )
    parser.add_argument(
        "--transfers",
        choices=("auto", "only", "skip"),
        default="auto",
        help="the numpy <-> GPU transfer table against bare wgpu: auto runs it (1 and 16 MB with --quick, "
        "100 MB too without)",
    )
    parser.add_argument(
        "--wall-clock", action="store_true", help="time with queue syncs even if timestamp-query is available"
    )
    parser.add_argument(
        "--sequences",
        choices=("auto", "only", "skip"),
        default="auto",
        help="app steps from bench.json's sequences: auto runs them in full (not --quick) runs",
    )
    return parser


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        try:
            return _main(args)
        finally:
            for handle in filter(None, args.files.values()):
                handle.close()
    except OSError as error:  # a results file that fails to write (a full disk): one line, not a traceback
        print(f"bench: could not write the results: {error}", file=sys.stderr)
        return 1


def _main(args):
    settings = Settings.quick() if args.quick else Settings.full()
    packages = args.packages
    dtypes = {name for names in args.dtype or () for name in names}
    names = set(_names(args.cases))
    only_other = args.sequences == "only" or args.transfers == "only"
    cases = select_cases(list(packages), args.quick, dtypes, names) if not only_other else []
    if not cases and not only_other:
        print(_no_cases_text(packages, dtypes, names), file=sys.stderr)
        return 2
    device = doctor.open_device(sys.stderr)
    if device is None:
        return 1
    timer = GpuTimer(device, settings.batch, use_timestamps=not args.wall_clock)
    meta = {"device": device_info(device), "timing": timer.method, "quick": args.quick, "warnings": []}
    torch_peer = _torch_peer(args, settings, meta)
    ort_peer = _ort_peer(args, settings, meta)
    bench = Bench(
        device, settings, timer, torch_peer, args.variant, dict(args.tunable), args.per_pass, ort_peer
    )
    results = [_run_case(bench, packages[case.op], case) for case in cases]
    if timer.suspicious:
        meta["warnings"].append(
            "summed GPU timestamps exceeded wall time: timestamp ticks may not be nanoseconds"
        )
    transfers = []
    if args.transfers != "skip" and args.sequences != "only":
        sizes = bench_transfers.QUICK_SIZES_MB if args.quick else bench_transfers.SIZES_MB
        transfers = bench_transfers.transfer_rows(device, timer.sync, sizes)
    steps = []
    if args.sequences == "only" or (args.sequences == "auto" and not args.quick and args.transfers != "only"):
        for op, entry, dtype in bench_calls.sequence_runs(packages, dtypes):
            steps.append(bench_calls.run_sequence(op, entry, dtype, device, timer, settings, torch_peer))
            print(
                f"# sequence {entry['name']} {dtype}: {steps[-1]['sequence_wall_us']:.0f} us a step",
                file=sys.stderr,
                flush=True,
            )
    text = (markdown(results, meta) if results else "") + bench_calls.sequences_markdown(steps)
    text += "\n".join(bench_transfers.transfers_markdown(transfers) + [""]) if transfers else ""
    return _write(args.files, text, meta, results, steps, transfers)


def _no_cases_text(packages, dtypes, names):
    """One line for a run left without cases: which ops, and the filters that left none."""
    filters = " ".join(
        f"--{option} {','.join(sorted(v))}" for option, v in (("cases", names), ("dtype", dtypes)) if v
    )
    why = f"match {filters}" if filters else "(is there a bench.json beside the manifests?)"
    return f"no benchmark cases of {', '.join(packages)} {why}"


def _torch_peer(args, settings, meta):
    """The PyTorch peer with --torch (None without, or when it cannot start: a warning in meta)."""
    if not args.torch:
        return None
    try:
        torch_peer = TorchPeer(settings)
        meta["torch"] = torch_peer.info
        meta["torch_copy_gbps"] = torch_peer.copy_gbps()
    except Exception as error:
        meta["warnings"].append(f"--torch skipped: {type(error).__name__}: {error}")
        return None
    return torch_peer


def _ort_peer(args, settings, meta):
    """ONNX Runtime's WebGPU provider with --ort (None without, or when it cannot start: a warning)."""
    if not args.ort:
        return None
    try:
        ort_peer = bench_ort.OrtPeer(settings)
        meta["onnxruntime"] = ort_peer.info
    except Exception as error:
        meta["warnings"].append(f"--ort skipped: {type(error).__name__}: {error}")
        return None
    return ort_peer


def _run_case(bench, op, case):
    """One case's Result, its one-line status on stderr as it finishes."""
    result = bench.run(op, case)
    status = (
        result.error
        or f"{result.variant}: {result.gpu_us:.1f} us, {result.gbps:.0f} GB/s, {100 * result.fraction_of_copy:.0f}% of copy"
        + f"; back to back {result.run_us:.1f} us a call (copy {result.copy_run_us:.1f})"
        + ("" if result.torch_us is None else f"; PyTorch {result.torch_us:.1f} us")
    )
    print(f"# {case.op} {case.name} {case.dtype_label}: {status}", file=sys.stderr, flush=True)
    return result


def _write(files, text, meta, results, steps, transfers):
    """Print the tables, write the files asked for; the exit status (1 when a case or the plot failed)."""
    print(text)
    if files["markdown"]:
        files["markdown"].write(text)
    if files["json"]:
        json.dump(
            {
                "meta": meta,
                "results": [r.__dict__ for r in results],
                "sequences": steps,
                "transfers": transfers,
            },
            files["json"],
            indent=1,
        )
    failed = any(r.error for r in results)
    if files["plot"]:
        skipped = plot(results, meta, files["plot"])
        if skipped:
            print(f"plot not written: {skipped}", file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
