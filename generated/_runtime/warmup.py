# SPDX-License-Identifier: Apache-2.0
"""warmup(): pipelines created ahead of calls, for one request, for ranges and lists of requests
(every register bucket, fill and workgroup size they can select), and for a package's shipped cases
and sweeps, in a thread of its own if asked (wgpu-native 0.32 creates pipelines synchronously, so a
thread is what makes it asynchronous).

Many requests are planned without the plan cache (thousands would push an app's plans out of it);
their pipelines are made once each, however many requests select them.
"""

from __future__ import annotations

import atexit
import itertools
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

from .boundary import plan_for_shapes, plan_uncached
from .caps import (
    checked_device,
    default_device,
    device_caps,
    raise_if_device_lost,
    refuse_lost_device,
    refusing_lost_device,
)
from .errors import ContractError
from .limits import check_plan_fits
from .pipelines import warm_pipelines

MAX_WARMUP_REQUESTS = 1_000_000  # a warmup() that names more is refused before any planning
_PASSES_A_BATCH = 4096  # pipelines are made for this many planned passes at a time


@dataclass(frozen=True)
class WarmupReport:
    """What a warmup of many requests did: the requests named, those planned and those refused (by
    the contract or the device: a combination of ranges no call could make), the pipelines it made
    (those that existed are not counted), the seconds it took, and the first refusal's message."""

    requests: int = 0
    planned: int = 0
    refused: int = 0
    pipelines: int = 0
    seconds: float = 0.0
    first_refusal: str | None = None

    def __add__(self, other: WarmupReport) -> WarmupReport:
        return WarmupReport(
            self.requests + other.requests,
            self.planned + other.planned,
            self.refused + other.refused,
            self.pipelines + other.pipelines,
            self.seconds + other.seconds,
            self.first_refusal or other.first_refusal,
        )


def _choices(value):
    """A range or a list stands for each of its values; anything else for itself."""
    return list(value) if isinstance(value, (range, list)) else [value]


def _shape_choices(shape):
    """The choices of each dimension of a shape (a tuple or list whose dimensions may be ranges or
    lists); a shape of another form is passed on as it is, for planning to refuse by name."""
    if isinstance(shape, (tuple, list)):
        return [_choices(d) for d in shape]
    return None


def _axes(group, dtypes, attrs):
    """The choices of a request's shapes, attributes and dtypes: [(kind, name, choices of each)]."""
    axes = []
    for name, shape in group.items():
        dims = _shape_choices(shape)
        axes.append(("shape", name, dims if dims is not None else [[shape]], dims is not None))
    for kind, mapping in (("attr", attrs), ("dtype", dtypes)):
        if isinstance(mapping, Mapping):
            axes += [(kind, name, [_choices(value)], False) for name, value in mapping.items()]
    return axes


def has_choices(shapes, dtypes, attrs) -> bool:
    """Whether a warmup() request names more than one request (a list of shape mappings, or a range or
    list of choices in place of a dimension, an attribute value or a dtype)."""
    if isinstance(shapes, (list, tuple)):
        return True
    if not isinstance(shapes, Mapping):
        return False
    return any(len(c) > 1 or isinstance(v, (range, list)) for c, v in _raw_choices(shapes, dtypes, attrs))


def _raw_choices(shapes, dtypes, attrs):
    for shape in shapes.values():
        if isinstance(shape, (tuple, list)):
            yield from ((_choices(d), d) for d in shape)
    for mapping in (attrs, dtypes):
        if isinstance(mapping, Mapping):
            yield from ((_choices(v), v) for v in mapping.values())


def requests_of(shapes, dtypes, attrs):
    """(count, iterator of (shapes, dtypes, attrs)): every request a warmup() with choices names, each
    combination of the choices of one shape mapping (or of each mapping of a list)."""
    groups = list(shapes) if isinstance(shapes, (list, tuple)) else [shapes]
    count = 0
    for group in groups:
        if isinstance(group, Mapping):
            sizes = [len(c) for _, _, dims, _ in _axes(group, dtypes, attrs) for c in dims]
            count += _product(sizes)
        else:
            count += 1
    return count, _requests(groups, dtypes, attrs)


def _product(sizes):
    total = 1
    for size in sizes:
        total *= size
    return total


def _requests(groups, dtypes, attrs):
    for group in groups:
        if not isinstance(group, Mapping):
            yield group, dtypes, attrs  # refused by planning, by name
            continue
        axes = _axes(group, dtypes, attrs)
        for combination in itertools.product(*(c for _, _, dims, _ in axes for c in dims)):
            values = iter(combination)
            request = {"shape": {}, "attr": {}, "dtype": {}}
            for kind, name, dims, is_shape in axes:
                picked = [next(values) for _ in dims]
                request[kind][name] = tuple(picked) if is_shape else picked[0]
            yield (
                request["shape"],
                request["dtype"] if isinstance(dtypes, Mapping) else dtypes,
                request["attr"] if isinstance(attrs, Mapping) else attrs,
            )


def sweep_requests(sweep):
    """The requests of a package sweep (an entry of bench.json's "warmup"): every combination of its
    named dimensions (`dims`: a list, or {"from", "to", "step"}), put in place of their names in the
    inputs' shapes and the attributes, for each dtype combination."""
    dims = {name: _dimension_values(spec) for name, spec in sweep["dims"].items()}
    names = list(dims)
    for combination in itertools.product(*(dims[n] for n in names)):
        value = dict(zip(names, combination))
        shapes = {
            key: [value.get(d, d) if isinstance(d, str) else d for d in shape]
            for key, shape in sweep["inputs"].items()
        }
        attrs = {k: value.get(v, v) if isinstance(v, str) else v for k, v in sweep.get("attrs", {}).items()}
        for dtypes in dtype_combinations(sweep["dtypes"]):
            yield shapes, dtypes, attrs


def _dimension_values(spec):
    if isinstance(spec, Mapping):
        return range(spec["from"], spec["to"] + 1, spec.get("step", 1))
    return list(spec)


def dtype_combinations(dtypes):
    """Every {type variable: dtype} a case entry names (a value may be one dtype or a list)."""
    names = list(dtypes)
    choices = [dtypes[n] if isinstance(dtypes[n], list) else [dtypes[n]] for n in names]
    return [dict(zip(names, combination)) for combination in itertools.product(*choices)]


def warm_requests(contract, requests, device, *, caps=None, tunables=None, variant=None, outputs=None):
    """Plan every request (uncached) and make the pipelines of those that plan on `device`: (report,
    the first refusal). Takes no lock: a background warmup runs beside the app's calls."""
    started = time.perf_counter()
    limits = device_caps(device)
    report, first, passes, made = WarmupReport(), None, [], 0
    for shapes, dtypes, attrs in requests:
        try:
            plan, names = plan_uncached(
                contract,
                shapes,
                dtypes,
                attrs,
                caps=caps,
                tunables=tunables,
                variant=variant,
                device=device,
                outputs=outputs,
            )
            check_plan_fits(plan, limits, names)
        except ContractError as error:
            first = first or error
            report = replace(report, requests=report.requests + 1, refused=report.refused + 1)
            continue
        report = replace(report, requests=report.requests + 1, planned=report.planned + 1)
        passes += plan.passes + tuple(p for chunk in plan.chunks for p in chunk.plan.passes)
        if len(passes) >= _PASSES_A_BATCH:
            made, passes = made + warm_pipelines(device, passes), []
    made += warm_pipelines(device, passes)
    seconds = time.perf_counter() - started
    report = replace(report, pipelines=made, seconds=seconds, first_refusal=str(first) if first else None)
    return report, first


def _contract_op(contract, *args):
    return contract.op


@refusing_lost_device(_contract_op)
def warm_up(
    contract,
    shapes,
    dtypes=None,
    attrs=None,
    *,
    device=None,
    caps=None,
    tunables=None,
    variant=None,
    outputs=None,
):
    """An op's warmup(): the plan of one request, with every pipeline it needs created on `device`;
    for ranges or lists of requests (`has_choices`), every pipeline they can select, and a
    WarmupReport (refused only if no request plans: then by the first refusal).

    Plans for the device's own capabilities unless `caps` is given (the plan must still fit the
    device: a feature or limit the caps claim and it lacks is refused).
    """
    device = checked_device(contract.op, device)
    device = device if device is not None else default_device()
    refuse_lost_device(contract.op, device)  # its pipelines may all be cached: no GPU work to fail
    options = dict(caps=caps, tunables=tunables, variant=variant, device=device, outputs=outputs)
    if has_choices(shapes, dtypes, attrs):
        count, requests = requests_of(shapes, dtypes, attrs)
        if count > MAX_WARMUP_REQUESTS:
            raise ContractError(
                contract.op,
                "shapes",
                f"at most {MAX_WARMUP_REQUESTS:,} requests",
                f"the ranges name {count:,} requests, over at most {MAX_WARMUP_REQUESTS:,} requests",
            )
        options.pop("device")
        report, first = warm_requests(contract, requests, device, **options)
        if not report.planned and first is not None:
            raise first
        return report
    plan, names = plan_for_shapes(contract, shapes, dtypes, attrs, **options)
    check_plan_fits(plan, device_caps(device), names)
    warm_pipelines(device, plan.passes + tuple(p for c in plan.chunks for p in c.plan.passes))
    return plan


# The package's warmup(): every op's shipped cases and sweeps.


def package_groups(op, cases, sweeps=True):
    """(variant, outputs, requests) of every group of requests a package warmup makes for one op: each
    shipped test and bench case, and each sweep of its bench.json ("warmup": WARMUP_SWEEPS), with every
    candidate variant (or the sweep's own), and its default or every output."""
    all_outputs = tuple(t.key for t in op.OUTPUTS)
    # Every output, where some are optional (SkipGroupNorm's S): shaders write or skip them.
    every = all_outputs if any(t.optional for t in op.OUTPUTS) else None
    entries = [(entry, None) for entry in list(cases.TEST_CASES) + list(cases.BENCH_CASES)]
    if sweeps:
        entries += [(sweep, sweep) for sweep in getattr(cases, "WARMUP_SWEEPS", ())]
    for entry, sweep in entries:
        given = entry.get("outputs")
        variants = [entry["variant"]] if sweep and "variant" in entry else [c.ID for c in op.CANDIDATES]
        for variant in variants:
            for outputs in dict.fromkeys((tuple(given) if given is not None else None, every)):
                if sweep is not None:
                    requests = sweep_requests(sweep)
                else:
                    requests = requests_of(entry["inputs"], entry["dtypes"], entry.get("attrs"))[1]
                yield variant, outputs, requests


def warm_packages(packages, device, sweeps=True, cancelled=None):
    """The package warmup's work (no lock: it may run in its own thread): a WarmupReport summed over
    every op; stops between groups once `cancelled` is set."""
    total = WarmupReport()
    for op, cases in packages:
        for variant, outputs, requests in package_groups(op, cases, sweeps):
            if cancelled is not None and cancelled.is_set():
                return total
            report, _ = warm_requests(op.CONTRACT, requests, device, variant=variant, outputs=outputs)
            total = total + report
    return total


class WarmupTask:
    """A package warmup in a thread of its own (`generated.warmup(wait=False)`): calls go on meanwhile
    (one whose pipeline is not made yet makes it itself). `wait()` gives the WarmupReport, or raises
    what stopped the warmup (DeviceLostError where its device was lost); `cancel()` stops it between
    groups of requests (at the latest when the interpreter exits)."""

    def __init__(self, packages, device, sweeps):
        self._cancelled = threading.Event()
        self._report = self._error = None
        self._thread = threading.Thread(
            target=self._run, args=(packages, device, sweeps), name="generated.warmup", daemon=True
        )
        _running.add(self)
        self._thread.start()

    def _run(self, packages, device, sweeps):
        try:
            self._report = warm_packages(packages, device, sweeps, self._cancelled)
        except Exception as error:  # kept for wait(), which raises it in the caller's thread
            try:
                raise_if_device_lost("warmup", error)
                self._error = error
            except Exception as lost:
                self._error = lost
        finally:
            _running.discard(self)

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> WarmupReport:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the warmup is still running after {timeout} s")
        if self._error is not None:
            raise self._error
        return self._report

    def cancel(self) -> None:
        self._cancelled.set()


_running: set = set()


@atexit.register
def _cancel_running():
    """A daemon thread still making pipelines while the interpreter finalizes could crash it."""
    for task in list(_running):
        task.cancel()
    for task in list(_running):
        task._thread.join(5)


@refusing_lost_device("warmup")
def warm_cases(packages, device=None, *, sweeps=True, wait=True):
    """`generated.warmup()`: create on `device` the pipelines that every variant of every op needs for
    its shipped test and bench cases and, with `sweeps`, its bench.json sweeps (every register
    bucket, fill and workgroup size of the register variants, over the channel groupings of the
    shipped cases), with the default tunables. `wait=False` runs it in a thread of its own and
    returns the WarmupTask at once; else the WarmupReport."""
    device = checked_device("warmup", device)
    device = device if device is not None else default_device()
    refuse_lost_device("warmup", device)
    packages = list(packages)
    if not wait:
        return WarmupTask(packages, device, sweeps)
    return warm_packages(packages, device, sweeps)
