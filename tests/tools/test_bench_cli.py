"""The benchmark's command line refuses bad arguments before any benchmark runs (exit 2, naming what exists)."""

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

import generated
from generated import bench, doctor

ROOT = Path(__file__).resolve().parents[2]


def _refused(capsys, *argv):
    with pytest.raises(SystemExit) as stopped:
        bench.main(list(argv))
    assert stopped.value.code == 2
    return capsys.readouterr().err


def test_unknown_names_are_errors_that_list_what_exists(capsys):
    err = _refused(capsys, "--ops", "batch_normalization,layer_norm")
    assert "unknown op layer_norm" in err and "group_normalization" in err

    err = _refused(capsys, "--ops", "batch_normalization", "--variant", "group_subgroup")
    assert "no op here has variant 'group_subgroup'" in err
    assert "batch_normalization: nc_inference_vec4" in err and "inference_scalar" in err

    err = _refused(capsys, "--ops", "batch_normalization", "--tunable", "SPLIT_STATS_MIN_HIDDEN=4096")
    assert (
        "no op here has tunable 'SPLIT_STATS_MIN_HIDDEN'" in err
        and "batch_normalization: WORKGROUP_SIZE" in err
    )


def test_values_are_typed(capsys):
    assert "float32 and float16" in _refused(capsys, "--dtype", "bfloat16")
    assert "'abc' is not a number" in _refused(capsys, "--tunable", "WORKGROUP_SIZE=abc")
    assert "whole number from 1 to 2**31 - 1" in _refused(capsys, "--tunable", "WORKGROUP_SIZE=0")
    assert "whole number from 1 to 2**31 - 1" in _refused(capsys, "--tunable", "WORKGROUP_SIZE=1.5")
    assert "whole number from 1 to 2**31 - 1" in _refused(capsys, "--tunable", "WORKGROUP_SIZE=2147483648")
    assert "99999999999999999999" in _refused(capsys, "--tunable", "WORKGROUP_SIZE=99999999999999999999")
    assert "expected NAME=VALUE" in _refused(capsys, "--tunable", "WORKGROUP_SIZE")
    args = bench.parse_args(
        ["--dtype", "f16,float32", "--tunable", "WORKGROUP_SIZE=64", "--tunable", "MAX_SLABS=2e1"]
    )
    assert args.dtype == [("float16", "float32")] and args.tunable == [
        ("WORKGROUP_SIZE", 64),
        ("MAX_SLABS", 20),
    ]


def test_output_files_are_opened_before_the_run(capsys, tmp_path):
    missing = tmp_path / "no" / "such" / "folder" / "b.json"
    err = _refused(capsys, "--json", str(missing))
    assert f"--json {missing}: cannot write" in err
    markdown = tmp_path / "b.md"
    err = _refused(capsys, "--markdown", str(markdown), "--json", str(tmp_path))  # a folder: not writable
    assert "--json" in err and "cannot write" in err


def test_plot_without_matplotlib_is_an_error(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    err = _refused(capsys, "--plot", str(tmp_path / "b.png"))
    assert "--plot needs matplotlib" in err and "bench extra" in err
    assert not (tmp_path / "b.png").exists()


def test_a_plot_that_cannot_be_drawn_fails_the_run(capsys, monkeypatch, tmp_path):
    """One quick float32 case for real; the plot step reports that it could not draw: exit 1."""
    monkeypatch.setitem(sys.modules, "matplotlib", types.ModuleType("matplotlib"))
    monkeypatch.setattr(bench, "plot", lambda results, meta, path: "no results to plot")
    code = bench.main(
        ["--quick", "--ops", "batch_normalization", "--dtype", "float32", "--plot", str(tmp_path / "b.png")]
    )
    assert code == 1
    assert "plot not written: no results to plot" in capsys.readouterr().err


def test_unknown_case_names_are_refused_with_the_known_ones(capsys):
    err = _refused(capsys, "--ops", "batch_normalization", "--cases", "nosuch,resnet50-layr1")
    assert "--cases: unknown case nosuch, resnet50-layr1 (did you mean 'resnet50-layer1'?)" in err, err
    assert "cases: batch_normalization: resnet50-layer1, " in err and "resnet50-stem-b1" in err, err


def test_sequences_only_without_sequences_says_so_in_one_line(capsys):
    err = _refused(capsys, "--ops", "batch_normalization", "--sequences", "only")
    assert (
        err.strip()
        == "python -m generated.bench: --sequences only: batch_normalization has no sequences to run"
    ), err


def test_bench_without_an_adapter_says_so_in_one_line(tmp_path):
    """As doctor does (the same function): no traceback, exit 1, before any case runs."""
    missing = str(tmp_path / "no-such-icd.json")
    environment = {
        **os.environ,
        "WGPU_BACKEND_TYPE": "Vulkan",
        "VK_ICD_FILENAMES": missing,
        "VK_DRIVER_FILES": missing,
    }
    for args in (["generated", "bench"], ["generated.bench"]):
        done = subprocess.run(
            [sys.executable, "-m", *args, "--quick", "--ops", "batch_normalization"],
            cwd=ROOT,
            env=environment,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 1, done.stdout + done.stderr
        said = [
            line for line in done.stderr.splitlines() if not line.startswith("Forcing backend")
        ]  # wgpu's own
        assert (
            said[0].startswith("no WebGPU adapter: ") and "mesa-vulkan-drivers" in said[1] and len(said) == 2
        ), done.stderr
        assert "Traceback" not in done.stdout + done.stderr and not done.stdout.strip(), (
            done.stdout + done.stderr
        )


def test_the_adapter_message_takes_the_runtimes_error_or_wgpus(monkeypatch, capsys):
    raw = RuntimeError(
        "Request adapter failed (3): Validation Error\n\nCaused by:\n  No suitable graphics adapter found"
    )
    own = generated.ContractError("device", "adapter", "an adapter", "no WebGPU adapter (none found)")
    for error in (raw, own, RuntimeError("no WebGPU adapter; set WGPU_BACKEND_TYPE=Vulkan")):
        text = doctor.no_adapter_message(error)
        assert text.startswith("no WebGPU adapter") and "no WebGPU adapter" not in text[1:], text
        assert "WGPU_BACKEND_TYPE=Vulkan" in text and "Traceback" not in text, text
    assert doctor.no_adapter_message(raw).startswith(
        "no WebGPU adapter: No suitable graphics adapter found\n"
    )

    def no_adapter():
        raise raw

    monkeypatch.setattr(bench._runtime, "default_device", no_adapter)
    assert bench.main(["--quick", "--ops", "batch_normalization"]) == 1
    assert capsys.readouterr().err.startswith("no WebGPU adapter: No suitable graphics adapter found\n")


def test_quick_takes_the_first_case_of_the_dtype_asked_for():
    """--quick's fallback (no case of the name marked quick) is the first case left after --dtype."""
    cases = bench.select_cases(["batch_normalization"], True, {"float16"}, {"resnet50-layer4"})
    assert [(c.name, c.dtype_label) for c in cases] == [("resnet50-layer4", "f16")]


def test_a_results_file_that_cannot_be_written_is_one_line(capsys):
    """--json on a full disk: an OSError traceback at the close before (an audit found it)."""
    import os

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")

    assert (
        bench.main(
            [
                "--quick",
                "--ops",
                "batch_normalization",
                "--cases",
                "resnet50-stem-b1",
                "--dtype",
                "float32",
                "--json",
                "/dev/full",
            ]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert "bench: could not write" in err and "Traceback" not in err
