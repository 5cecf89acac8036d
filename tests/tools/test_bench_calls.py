"""The call-boundary benchmarks run end to end on small data (numbers are not asserted)."""

import numpy as np

from generated import bench, bench_calls
from generated import group_normalization as gn
from generated._runtime import Tensor, default_device


def test_host_floor_reports_each_figure_and_ratio():
    device = default_device()
    timer = bench.GpuTimer(device, 2)
    x = np.random.default_rng(0).standard_normal((2, 8, 4, 4)).astype(np.float32)
    tensors = {
        "input": {
            "x": Tensor.from_numpy(x),
            "scale": Tensor.from_numpy(np.ones(8, np.float32)),
            "bias": Tensor.from_numpy(np.zeros(8, np.float32)),
        },
        "output": {"y": Tensor.empty(x.shape, np.float32)},
    }
    plan = gn.plan(
        {"x": x.shape, "scale": (8,), "bias": (8,)}, {"T": "float32"}, {"num_groups": 2}, device=device
    )
    host = bench_calls.host_floor(device, plan, tensors, timer.sync, 5)
    assert set(host) == {"floor_cached_us", "floor_fresh_us", "floor_plan_fresh_us", "sequence_run_us"}
    assert all(v > 0 for v in host.values())
    ratios = bench_calls.with_ratios({**host, "kernel_submit_us": 2 * host["floor_fresh_us"]})
    assert abs(ratios["kernel_submit_ratio"] - 2) < 1e-9
    ratios = bench_calls.with_ratios({**host, "kernel_out_submit_us": 3 * host["floor_plan_fresh_us"]})
    assert abs(ratios["kernel_out_submit_plan_ratio"] - 3) < 1e-9
    assert bench_calls.shown_us(-3.0) == bench_calls.shown_us(1.0) == "< 2 (noise)"


def test_a_small_sequence_runs_every_way():
    device = default_device()
    entry = {
        "name": "tiny",
        "batch": 1,
        "num_groups": 2,
        "dtypes": ["float32"],
        "calls": [[4, 8, 1e-5], [8, 4, 1e-6], [4, 8, 1e-6]],
    }
    settings = bench.Settings.quick()
    result = bench_calls.run_sequence(
        gn, entry, "float32", device, bench.GpuTimer(device, settings.batch), settings, None
    )
    assert result["calls"] == 3
    for key in (
        "kernel_wall_us",
        "encoder_wall_us",
        "sequence_wall_us",
        "summed_gpu_us",
        "sequence_run_host_us",
    ):
        assert result[key] > 0, key
    assert result["sequence_run_host_us_per_call"] == result["sequence_run_host_us"] / 3
    assert "tiny" in bench_calls.sequences_markdown([result])


def test_the_unet_step_is_61_calls_in_two_dtypes():
    ((op, entry),) = [
        (op, e)
        for op, e in bench_calls.sequences_of(bench.op_packages())
        if e["name"] == "sd15-unet-step-512"
    ]
    assert op is gn and len(entry["calls"]) == 61 and entry["dtypes"] == ["float32", "float16"]
    assert sum(1 for _, _, eps in entry["calls"] if eps == 1e-6) == 16  # one transformer norm each


def test_a_neighbouring_shape_grows_every_per_batch_input():
    """A larger batch grows X and an (N, C) skip alike (the bench's neighbour of a SkipGroupNorm
    case was refused as a malformed call when only X grew); a spatial step grows only the tensors
    of X's shape; rank-1 parameters never grow."""
    from types import SimpleNamespace

    from generated.bench_calls import neighbour_shapes

    shapes = {"X": (2, 320, 64, 64), "gamma": (320,), "beta": (320,), "skip": (2, 320), "bias": (320,)}
    case = SimpleNamespace(shapes=shapes, attrs={"channels_last": 0})
    assert neighbour_shapes(case, axis=0) == {**shapes, "X": (3, 320, 64, 64), "skip": (3, 320)}
    assert neighbour_shapes(case) == {**shapes, "X": (2, 320, 64, 68)}
    full = {**shapes, "skip": (2, 320, 64, 64)}
    case = SimpleNamespace(shapes=full, attrs={"channels_last": 0})
    assert neighbour_shapes(case) == {**full, "X": (2, 320, 64, 68), "skip": (2, 320, 64, 68)}
    rows = SimpleNamespace(shapes={"x": (8, 768), "scale": (768,), "skip": (8, 768)}, attrs={})
    assert neighbour_shapes(rows) == {"x": (9, 768), "scale": (768,), "skip": (9, 768)}
