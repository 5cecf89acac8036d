"""The benchmark harness (`python -m generated.bench`) runs on lavapipe and writes its JSON."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_quick_bench_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    markdown = tmp_path / "bench.md"
    env = dict(os.environ, WGPU_BACKEND_TYPE=os.environ.get("WGPU_BACKEND_TYPE", "Vulkan"))
    command = [sys.executable, "-m", "generated.bench", "--quick", "--ops", "batch_normalization"]
    run = subprocess.run(
        command + ["--json", str(out), "--markdown", str(markdown)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())

    assert report["meta"]["device"]["wgpu"]
    assert report["meta"]["timing"]
    results = report["results"]
    assert {r["op"] for r in results} == {"batch_normalization"}
    assert {r["dtypes"]["T"] for r in results} == {"float32", "float16"}
    for r in results:
        assert r["error"] is None
        assert r["case"] and r["source"] and r["variant"]
        assert r["passes"] and all(p["dispatch"] for p in r["passes"])
        x = r["shapes"]["x"]
        itemsize = 4 if r["dtypes"]["T"] == "float32" else 2
        # Minimum bytes: X read and Y written once, four per-channel vectors read once.
        assert r["bytes"] == itemsize * (2 * x[0] * x[1] * x[2] * x[3] + 4 * x[1])
        assert r["samples"] > 0 and r["copies"] >= 2
        for key in ("gpu_us", "gbps", "copy_us", "copy_gbps", "fraction_of_copy", "run_us", "copy_run_us"):
            assert r[key] > 0, key
        # Back to back: a run of calls in one compute pass, at least every copy of the tensors once.
        assert r["run_calls"] >= r["copies"]
        assert abs(r["gbps"] - r["bytes"] / r["gpu_us"] / 1e3) < 1e-6 * r["gbps"]
        assert abs(r["fraction_of_copy"] - r["copy_us"] / r["gpu_us"]) < 1e-9
        assert r["torch_us"] is None
        host = r["host"]
        for key in ("plan_us", "kernel_submit_us", "first_call_ms", "sync_us"):
            assert host[key] > 0, key
        assert "kernel_overhead_us" in host
    table = markdown.read_text()
    assert "| batch_normalization | resnet50-stem-b1 | f32 |" in table
    assert "GPU timing:" in table


def test_per_pass_times_each_dispatch_of_a_multi_pass_plan(tmp_path):
    """--per-pass on GroupNormalization's split-k (forced by a lower threshold, with the one-pass
    group_row_registers ruled out by an SM-count proxy of 1): both dispatches timed."""
    out = tmp_path / "bench.json"
    markdown = tmp_path / "bench.md"
    env = dict(os.environ, WGPU_BACKEND_TYPE=os.environ.get("WGPU_BACKEND_TYPE", "Vulkan"))
    command = [
        sys.executable,
        "-m",
        "generated.bench",
        "--quick",
        "--ops",
        "group_normalization",
        "--dtype",
        "float32",
    ]
    command += [
        "--per-pass",
        "--tunable",
        "SPLIT_STATS_MIN_HIDDEN=4096",
        "--tunable",
        "SM_COUNT_PROXY=1",
        "--tunable",
        "CHUNK_MIN_HIDDEN=1",
        "--json",
        str(out),
        "--markdown",
        str(markdown),
    ]
    run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    (result,) = json.loads(out.read_text())["results"]
    assert result["error"] is None and result["variant"] == "group_splitk_registers"
    assert len(result["passes"]) == 2 and all(p["alone_us"] > 0 for p in result["passes"])
    table = markdown.read_text()
    assert "Per pass (--per-pass)" in table
    assert "| group_normalization | sd-unet-256px | f32 | partials |" in table
