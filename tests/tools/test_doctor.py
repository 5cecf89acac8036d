"""`python -m generated doctor` (generated/doctor.py) and the package's
`python -m generated COMMAND` dispatcher (generated/__main__.py)."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

import generated
from generated import __main__ as package_main
from generated import batch_normalization, doctor, group_normalization, skip_group_norm
from tests.device_helpers import is_lavapipe, measured_subgroup_size

ROOT = Path(__file__).resolve().parents[2]


def _run(args, cwd, **env):
    environment = {**os.environ, "WGPU_BACKEND_TYPE": "Vulkan", **env}
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=cwd, env=environment, capture_output=True, text=True, timeout=120
    )


def test_doctor_of_a_vendored_copy_passes_and_prints_the_measured_subgroup_width(tmp_path):
    """Run from a copy under another name: the doctor and the dispatcher import only relatively."""
    target = tmp_path / "myapp" / "kernels"
    shutil.copytree(ROOT / "generated", target, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "myapp" / "__init__.py").write_text("")
    done = _run(
        ["myapp.kernels", "doctor"],
        tmp_path,
        PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    text = done.stdout
    width = 8 if is_lavapipe() and not os.environ.get("LP_NATIVE_VECTOR_WIDTH") else measured_subgroup_size()
    assert f"subgroup width: {width} (measured by a probe shader)" in text, text
    for line in (
        "adapter:",
        "backend:  Vulkan",
        "features: ",
        "maxComputeWorkgroupStorageSize",
        f"all {3 * len(doctor.CHECKS)} checks passed",
    ):
        assert line in text, text
    for op in doctor.CHECKS:
        for dtype in ("float32", "float16"):
            assert f"ok    {op} {dtype} " in text, text
        assert (
            f"ok    {op} float16 overflow, variant " in text and "infinities of the right sign" in text
        ), text


def test_doctor_exits_1_when_a_check_fails(monkeypatch):
    real = batch_normalization.kernel

    def off_by_a_half(inputs, **kwargs):
        result = real(inputs, **kwargs)
        return {key: value + np.asarray(0.5, value.dtype) for key, value in result.items()}

    monkeypatch.setattr(batch_normalization, "kernel", off_by_a_half)
    out = io.StringIO()
    assert doctor.main([], out=out) == 1
    text = out.getvalue()
    assert "FAIL  batch_normalization float32" in text and "WRONG" in text, text
    # float32, float16, and the float16 overflow check (whose in-range outputs are off too)
    assert (
        "ok    group_normalization float32" in text and f"3 of {3 * len(doctor.CHECKS)} checks FAILED" in text
    ), text


def test_doctor_fails_a_device_whose_float16_overflow_is_not_infinity(monkeypatch):
    """WGSL leaves float16 conversions of out-of-range values to the device: a kernel that came back
    with finite values there (65504, say) is a failed check."""
    real = group_normalization.kernel

    def saturating(inputs, **kwargs):
        result = real(inputs, **kwargs)
        return {key: np.clip(value, -65504, 65504).astype(value.dtype) for key, value in result.items()}

    monkeypatch.setattr(group_normalization, "kernel", saturating)
    out = io.StringIO()
    assert doctor.main([], out=out) == 1
    text = out.getvalue()
    assert (
        "FAIL  group_normalization float16 overflow, variant " in text and "instead of infinities" in text
    ), text
    assert (
        "ok    group_normalization float16 (" in text
        and f"1 of {3 * len(doctor.CHECKS)} checks FAILED" in text
    ), text


def test_doctor_exits_1_when_a_call_raises(monkeypatch):
    def broken(inputs, **kwargs):
        raise RuntimeError("the device was lost")

    monkeypatch.setattr(skip_group_norm, "kernel", broken)
    out = io.StringIO()
    assert doctor.main([], out=out) == 1
    assert (
        "FAIL  skip_group_norm float32: the call failed: RuntimeError: the device was lost" in out.getvalue()
    )


def test_doctor_exits_1_with_a_clear_message_without_an_adapter(tmp_path):
    missing = str(tmp_path / "no-such-icd.json")
    done = _run(["generated", "doctor"], ROOT, VK_ICD_FILENAMES=missing, VK_DRIVER_FILES=missing)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith("no WebGPU adapter: ") and "mesa-vulkan-drivers" in done.stdout, done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_dispatcher_forwards_and_explains(capsys):
    assert package_main.main([]) == 2
    assert package_main.main(["nope"]) == 2
    usage = capsys.readouterr().err
    assert "doctor" in usage and "bench" in usage
    assert package_main.main(["doctor", "--unknown"]) == 2
    done = _run(["generated", "bench", "--help"], ROOT)
    assert done.returncode == 0 and "python -m generated.bench" in done.stdout, done.stdout + done.stderr


def test_doctor_checks_every_op_package():
    op_packages = set(generated.op_packages())
    assert (
        set(doctor.CHECKS)
        == set(doctor.op_packages())
        == op_packages
        == {e.module.__name__.split(".")[-1] for e in generated.ops().values()}
    )
