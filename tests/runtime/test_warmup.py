"""warmup() of ranges and lists of requests, and the package's warmup() of cases and sweeps, in a
thread of its own (issue 25 item 3): after a warmup of ranges, a call of any shape in them makes no
pipeline, register buckets and fills included.

Register variants are kept small with tunables (a workgroup of 16), so that their every bucket and
fill is reached by rows of a few hundred values.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import generated
from generated import ContractError
from generated import _runtime as rt
from generated import group_normalization as gn
from generated import instance_normalization as inn
from generated._runtime.warmup import sweep_requests

SMALL_REGISTERS = {"REGISTER_SINGLE_WORKGROUP_SIZE": 16, "REGISTER_WORKGROUP_SIZE": 16}


def _row(length, channels=1):
    return {"x": (1, channels, length), "scale": (channels,), "bias": (channels,)}


@pytest.mark.parametrize("dtype,step", [("float32", 4), ("float16", 8)])
def test_after_a_warmup_of_ranges_no_shape_in_them_makes_a_pipeline(dtype, step):
    top = 20 * 16 * step  # REGISTER_MAX_UNITS units of a 16-wide workgroup
    shapes = {"x": (1, [1, 80], range(step, top + 1, step)), "scale": ([1, 80],), "bias": ([1, 80],)}
    report = gn.warmup(
        [_row(length, channels) for channels in (1, 80) for length in range(step, top + 1, step)],
        {"T": dtype},
        {"num_groups": 80},
        variant="group_row_registers",
        tunables=SMALL_REGISTERS,
    )
    assert isinstance(report, rt.WarmupReport) and report.planned and report.refused
    grid = gn.warmup(
        shapes, {"T": dtype}, {"num_groups": [1, 80]}, variant="group_row_registers", tunables=SMALL_REGISTERS
    )
    assert grid.requests == 2 * 2 * 2 * 2 * (top // step) and grid.pipelines == 0  # the same plans again
    rng = np.random.default_rng(0)
    before = rt.pipelines_created()
    specs = set()
    for _ in range(150):
        channels = int(rng.choice([1, 80]))
        length = step * int(rng.integers(1, top // step + 1))
        plan = gn.warmup(
            _row(length, channels),
            {"T": dtype},
            {"num_groups": channels},
            variant="group_row_registers",
            tunables=SMALL_REGISTERS,
        )
        specs.add(plan.passes[0].spec)
    assert rt.pipelines_created() == before, "a shape inside the warmed ranges made a pipeline"
    assert len(specs) > 10  # the random shapes did fall into many buckets and fills


def test_a_list_of_requests_counts_what_the_contract_refuses():
    report = gn.warmup(
        [_row(8), _row(12, channels=6)], {"T": ["float32", "float16"]}, {"num_groups": [1, 2, 4]}
    )
    # (1 channel: groups 1 only) + (6 channels: groups 1 and 2): 3 of 6 per dtype
    assert (report.requests, report.planned, report.refused) == (12, 6, 6)
    assert "num_groups" in report.first_refusal


def test_a_warmup_whose_every_request_is_refused_raises_the_first_refusal():
    with pytest.raises(ContractError, match="num_groups"):
        gn.warmup(_row(range(4, 40, 4), channels=6), {"T": "float32"}, {"num_groups": 4})


def test_a_warmup_of_too_many_requests_is_refused_before_planning():
    shapes = {"x": (range(1000), range(1000), range(1000)), "scale": (4,), "bias": (4,)}
    with pytest.raises(ContractError, match="1,000,000,000 requests"):
        gn.warmup(shapes, {"T": "float32"}, {"num_groups": 1})


def test_one_request_still_gives_its_plan():
    plan = gn.warmup(_row(16), {"T": "float32"}, {"num_groups": 1})
    assert isinstance(plan, rt.Plan)


def test_the_package_warmup_runs_in_a_thread_of_its_own():
    """wait=False returns at once; the task's report counts the pipelines it made, and calls made
    meanwhile run (each makes what it needs itself)."""
    task = generated.warmup(sweeps=False, wait=False)
    assert isinstance(task, rt.WarmupTask)
    x = np.random.default_rng(1).standard_normal((1, 4, 7)).astype(np.float32)
    y = inn.instance_normalization(x, np.ones(4, np.float32), np.zeros(4, np.float32))
    assert y.shape == x.shape
    report = task.wait(timeout=1200)
    assert task.done() and report.planned > 0
    assert generated.warmup(sweeps=False).pipelines == 0  # everything is there now


@pytest.mark.parametrize("package", ["group_normalization", "instance_normalization", "skip_group_norm"])
def test_each_sweep_plans_its_variant(package):
    """The sweeps of bench.json ("warmup") name requests their variant takes: a sample of each plans."""
    op = importlib.import_module(f"generated.{package}")
    cases = importlib.import_module(f"generated.{package}.cases")
    assert cases.WARMUP_SWEEPS
    for sweep in cases.WARMUP_SWEEPS:
        requests = list(sweep_requests(sweep))
        planned = 0
        for shapes, dtypes, attrs in requests[:: max(1, len(requests) // 40)]:
            try:
                plan = op.plan(
                    shapes, dtypes, attrs, variant=sweep.get("variant"), device=generated.default_device()
                )
            except ContractError:
                continue
            planned += 1
            assert "variant" not in sweep or plan.variant == sweep["variant"]
        assert planned, f"{package} sweep {sweep['name']}: no sampled request plans"
