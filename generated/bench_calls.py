# SPDX-License-Identifier: Apache-2.0
"""Benchmarks of the call boundary: the bare wgpu floor measured in the same process, and app steps.

`python -m generated.bench` runs it.

- `host_floor()`: what one dispatch costs the host through wgpu-py alone (command encoder, compute
  pass, pipeline, bind group, dispatch, submit), with the call's cached bind group and creating
  one, next to `kernel()`, `kernel(out=)` and `Sequence.run()` of the same plan.
- `run_sequences()`: the `sequences` of a bench.json (the 61 GroupNorm calls of a Stable Diffusion
  UNet step), timed as an app runs them: plain `kernel()` calls, `kernel(encoder=)` into one
  encoder, `Sequence.run()`, against the summed GPU time of the calls and PyTorch eager.
"""

from __future__ import annotations

import importlib
import statistics
import time

import numpy as np

from . import _runtime
from ._runtime import Sequence, Tensor

# A host time under this many µs (a bare queue sync's jitter on the machines measured) is reported
# as below noise, never as a negative or meaningless number.
NOISE_US = 2.0


def median_us(fn, n):
    """Median wall time of `n` calls of `fn`, in µs."""
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1e6


def host_floor(device, plan, tensors, sync, n):
    """Host µs until return of the bare wgpu work of one dispatch and of our calls on one plan.

    Every figure is the host time of the call itself (no GPU time in it); the queue is synced
    between calls so that no call waits for an earlier one's GPU work.
    """
    passes = [p for p in plan.passes if 0 not in p.dispatch]
    if not passes or plan.chunks:
        return {}
    call = _runtime.record_call(plan, tensors, device)
    # (pipeline, layout, bind group entries, dispatch) of every dispatch of the plan (a split-k plan
    # has two or three): the bare floor runs the first; the plan's floor runs all, each with a fresh
    # bind group, which is what wgpu-py alone costs for the work of the call.
    views = {**tensors, "intermediate": _runtime.intermediate_views(plan, device)}
    every_pass = [
        (*_runtime.pipeline_for(device, p), _runtime.bind_group_entries(p, views, device), b.dispatch)
        for p, b in zip(passes, call.bound)
    ]
    pipeline, layout, entries, dispatch = every_pass[0]
    item = call.bound[0]

    def bare(bind_group):
        encoder = device.create_command_encoder()
        compute = encoder.begin_compute_pass()
        compute.set_pipeline(pipeline)
        compute.set_bind_group(0, bind_group)
        compute.dispatch_workgroups(*dispatch)
        compute.end()
        device.queue.submit([encoder.finish()])

    def bare_plan():
        encoder = device.create_command_encoder()
        compute = encoder.begin_compute_pass()
        for pass_pipeline, pass_layout, pass_entries, dispatch in every_pass:
            compute.set_pipeline(pass_pipeline)
            compute.set_bind_group(0, device.create_bind_group(layout=pass_layout, entries=pass_entries))
            compute.dispatch_workgroups(*dispatch)
        compute.end()
        device.queue.submit([encoder.finish()])

    sequence = Sequence(device)
    sequence._calls.append(call)  # the plan's own recorded call: what Sequence.kernel() would record

    def timed(fn):
        samples = []
        for _ in range(n):
            sync()  # not counted: the call must not wait for an earlier one's GPU work
            started = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - started)
        return statistics.median(samples) * 1e6

    return {
        "floor_cached_us": timed(lambda: bare(item.bind_group)),
        "floor_fresh_us": timed(lambda: bare(device.create_bind_group(layout=layout, entries=entries))),
        "floor_plan_fresh_us": timed(bare_plan),
        "sequence_run_us": timed(sequence.run),
    }


def with_ratios(host):
    """Each host figure's ratio to the bare floor with a fresh bind group; noise shown as such."""
    floor = host.get("floor_fresh_us")
    if not floor or floor <= NOISE_US:
        return host
    for key in ("kernel_submit_us", "kernel_out_submit_us", "sequence_run_us", "floor_cached_us"):
        if host.get(key) is not None:
            host[key.replace("_us", "_ratio")] = host[key] / floor
    plan_floor = host.get("floor_plan_fresh_us")
    if plan_floor and plan_floor > NOISE_US and host.get("kernel_out_submit_us") is not None:
        host["kernel_out_submit_plan_ratio"] = host["kernel_out_submit_us"] / plan_floor
    return host


def shown_us(value):
    """A host figure for a table: below NOISE_US it is noise, whatever its sign."""
    if value is None:
        return ""
    return f"< {NOISE_US:g} (noise)" if value < NOISE_US else f"{value:,.1f}"


# ---------------------------------------------------------------------------------------------
# App steps


def sequences_of(packages):
    """(op module, sequence entry) for every BENCH_SEQUENCES entry of the op packages."""
    found = []
    for name, op in packages.items():
        try:
            cases = importlib.import_module(f".{name}.cases", __package__)
        except ModuleNotFoundError:
            continue
        found += [(op, entry) for entry in getattr(cases, "BENCH_SEQUENCES", [])]
    return found


def sequence_runs(packages, dtypes):
    """(op module, sequence entry, dtype) for every sequence of the op packages in `dtypes` (all if empty)."""
    return [
        (op, entry, d)
        for op, entry in sequences_of(packages)
        for d in entry["dtypes"]
        if not dtypes or d in dtypes
    ]


def _calls(entry, dtype, device, rng):
    """Per call: (inputs as Tensors, attrs, out= Tensors)."""
    calls = []
    for channels, size, epsilon in entry["calls"]:
        shape = (entry["batch"], channels, size, size)
        x = rng.standard_normal(shape).astype(dtype)
        inputs = {
            "x": Tensor.from_numpy(x, device),
            "scale": Tensor.from_numpy(rng.uniform(0.5, 1.5, channels).astype(dtype), device),
            "bias": Tensor.from_numpy(rng.uniform(-0.5, 0.5, channels).astype(dtype), device),
        }
        attrs = {"num_groups": entry["num_groups"], "epsilon": epsilon}
        calls.append((inputs, attrs, {"y": Tensor.empty(shape, dtype, device)}))
    return calls


def _summed_gpu_us(op, calls, device, timer, settings):
    """The sum over calls of each call's own GPU time (calls of one shape measured once)."""
    by_shape = {}
    total = 0.0
    for inputs, attrs, out in calls:
        key = (inputs["x"].shape, attrs["epsilon"])
        if key not in by_shape:
            plan = op.plan(
                {k: v.shape for k, v in inputs.items()}, {"T": inputs["x"].dtype.name}, attrs, device=device
            )
            call = _runtime.record_call(plan, {"input": inputs, "output": out}, device)
            samples = timer.measure(
                {"op": lambda encoder, i, ts: _runtime.encode_passes(encoder, call.bound, ts)}, 1, settings
            )
            by_shape[key] = statistics.median(samples["op"]) * 1e6
        total += by_shape[key]
    return total


def run_sequence(op, entry, dtype, device, timer, settings, torch_peer):
    rng = np.random.default_rng(0)
    calls = _calls(entry, np.dtype(dtype), device, rng)
    for inputs, attrs, out in calls:  # pipelines, plans and caches made before any timing
        op.kernel(inputs, attrs=attrs, out=out)
    timer.sync()
    sequence = Sequence(device)
    for inputs, attrs, out in calls:
        sequence.kernel(op, inputs, attrs, out=out)

    def plain():
        for inputs, attrs, _ in calls:
            op.kernel(inputs, attrs=attrs)
        timer.sync()

    def into_encoder():
        encoder = device.create_command_encoder()
        for inputs, attrs, out in calls:
            op.kernel(inputs, attrs=attrs, out=out, encoder=encoder)
        device.queue.submit([encoder.finish()])
        timer.sync()

    def replay():
        sequence.run()
        timer.sync()

    def run_alone():  # host time of run() itself: the queue is idle when it starts
        timer.sync()
        started = time.perf_counter()
        sequence.run()
        elapsed = time.perf_counter() - started
        timer.sync()
        return elapsed

    reps = max(5, settings.host_iters // 4)
    result = {
        "name": entry["name"],
        "source": entry.get("source", ""),
        "dtype": dtype,
        "calls": len(calls),
        "kernel_wall_us": median_us(plain, reps),
        "encoder_wall_us": median_us(into_encoder, reps),
        "sequence_wall_us": median_us(replay, reps),
        "sequence_run_host_us": statistics.median(run_alone() for _ in range(reps)) * 1e6,
        "sync_us": median_us(timer.sync, reps),
        "summed_gpu_us": _summed_gpu_us(op, calls, device, timer, settings),
    }
    if torch_peer is not None:
        result["torch_eager_wall_us"] = torch_peer.eager_group_norm_step(
            [(tuple(i["x"].shape), a["num_groups"], a["epsilon"]) for i, a, _ in calls], dtype, reps
        )
    result["sequence_budget_us"] = result["summed_gpu_us"] + 15.0 * len(calls)
    result["sequence_run_host_us_per_call"] = result["sequence_run_host_us"] / len(calls)
    return result


def sequences_markdown(results):
    if not results:
        return ""
    lines = [
        "",
        "App steps: wall time per step (median; each step ends with one queue sync, PyTorch's with one "
        "torch.cuda.synchronize()), against the summed GPU time of its calls. Budget = summed GPU + 15 µs a call.",
        "",
        "| sequence | dtype | calls | kernel() µs | kernel(encoder=) µs | Sequence.run() µs | summed GPU µs "
        "| budget µs | PyTorch eager µs | run() host µs a call |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        torch_us = r.get("torch_eager_wall_us")
        lines.append(
            f"| {r['name']} | {r['dtype']} | {r['calls']} | {r['kernel_wall_us']:,.0f} | {r['encoder_wall_us']:,.0f} "
            f"| {r['sequence_wall_us']:,.0f} | {r['summed_gpu_us']:,.0f} | {r['sequence_budget_us']:,.0f} "
            f"| {'' if torch_us is None else f'{torch_us:,.0f}'} | {r['sequence_run_host_us_per_call']:,.1f} |"
        )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# A new shape for a variant whose pipelines exist


def neighbour_shapes(case, axis=None):
    """The case's shapes with one spatial dimension 4 larger (N 1 larger for rank-2 inputs, or where
    `axis` is 0: the layer family's parameters span its last axes): a shape never seen, which keeps
    every divisibility the variant relies on. A larger N grows every input of rank 2 or more that
    has one row per batch item (SkipGroupNorm's (N, C) skip too); rank-1 parameters stay."""
    first_key, first = next(iter(case.shapes.items()))
    if axis is not None:
        pass
    elif len(first) < 3:
        axis = 0
    elif case.attrs.get("channels_last", 0) and len(first) == 4:
        axis = 2
    else:
        axis = len(first) - 1
    grown = {}
    for key, shape in case.shapes.items():
        if axis == 0:
            grows = len(shape) >= 2 and shape[0] == first[0]
        else:
            grows = len(shape) == len(first) and shape[: axis + 1] == first[: axis + 1]
        if grows:
            shape = shape[:axis] + (shape[axis] + (1 if axis == 0 else 4),) + shape[axis + 1 :]
        grown[key] = shape
    return grown


def new_shape_first_call(op, case, arrays_for, options, device, sync):
    """The first kernel(out=) call of a neighbouring shape: ms to the end of its GPU work, the ms
    it took over a second call of that shape, the pipelines it created, and whether the variant
    stayed. Inputs and outputs are allocated before the clock starts: allocating 100+ MB is the
    app's cost whatever the shape, and is not what "a new shape" means here."""
    before = op.plan(case.shapes, case.dtypes, case.attrs, device=device, **options)
    try:
        shapes = neighbour_shapes(case)
        after = op.plan(shapes, case.dtypes, case.attrs, device=device, **options)
    except _runtime.ContractError:  # the last axis is the parameters' (the layer family): grow N
        shapes = neighbour_shapes(case, axis=0)
        after = op.plan(shapes, case.dtypes, case.attrs, device=device, **options)
    _runtime.plan_cache.clear()  # plan() above must not make the timed call's plan ahead of it
    inputs = {k: Tensor.from_numpy(a, device) for k, a in arrays_for(shapes).items()}
    out = {key: Tensor.empty(shape, dtype, device) for key, (shape, dtype) in after.outputs.items()}
    created = _runtime.pipelines_created()

    def timed_call():
        sync()
        started = time.perf_counter()
        op.kernel(inputs, attrs=case.attrs, device=device, out=out, **options)
        sync()
        return time.perf_counter() - started

    first = timed_call()
    made = _runtime.pipelines_created() - created
    again = timed_call()
    for tensor in list(inputs.values()) + list(out.values()):
        tensor.destroy()
    return {
        "new_shape_first_call_ms": first * 1e3,
        "new_shape_excess_ms": max(first - again, 0.0) * 1e3,
        "new_shape_pipelines": made,
        "new_shape_same_variant": before.variant == after.variant,
    }
