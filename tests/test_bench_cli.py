"""The benchmark's command line refuses bad arguments before any benchmark runs (exit 2, naming what exists)."""

import sys
import types

import pytest

from generated import bench


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
    assert "no op here has tunable 'SPLIT_STATS_MIN_HIDDEN'" in err and "batch_normalization: WORKGROUP_SIZE" in err


def test_values_are_typed(capsys):
    assert "float32 and float16" in _refused(capsys, "--dtype", "bfloat16")
    assert "'abc' is not a number" in _refused(capsys, "--tunable", "WORKGROUP_SIZE=abc")
    assert "whole number >= 1" in _refused(capsys, "--tunable", "WORKGROUP_SIZE=0")
    assert "whole number >= 1" in _refused(capsys, "--tunable", "WORKGROUP_SIZE=1.5")
    assert "expected NAME=VALUE" in _refused(capsys, "--tunable", "WORKGROUP_SIZE")
    args = bench.parse_args(["--dtype", "f16,float32", "--tunable", "WORKGROUP_SIZE=64", "--tunable", "MAX_SLABS=2e1"])
    assert args.dtype == [("float16", "float32")] and args.tunable == [("WORKGROUP_SIZE", 64), ("MAX_SLABS", 20)]


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
    code = bench.main(["--quick", "--ops", "batch_normalization", "--dtype", "float32", "--plot", str(tmp_path / "b.png")])
    assert code == 1
    assert "plot not written: no results to plot" in capsys.readouterr().err
