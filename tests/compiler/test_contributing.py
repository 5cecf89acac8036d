"""docs/CONTRIBUTING.md's walk-throughs, done as written in a copy of the repository: a runtime edit
leaves `--check` clean, the op it adds builds and runs, and the variant it adds is selected."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "CONTRIBUTING.md").read_text()
FILE_BLOCK = re.compile(r"^```\w+ file=(\S+)\n(.*?)^```$", re.S | re.M)
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)
SHELL_BLOCK = re.compile(r"^```sh\n(.*?)^```$", re.S | re.M)


def _copy_of_the_repository(root: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__")
    for folder in ("codegen", "generated", "manifests", "templates"):
        shutil.copytree(REPO / folder, root / folder, ignore=ignore)


def _run(root: Path, *command: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": str(root),
        "WGPU_BACKEND_TYPE": os.environ.get("WGPU_BACKEND_TYPE", "Vulkan"),
    }
    return subprocess.run(
        [sys.executable, *command], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )


def _regenerate(root: Path) -> None:
    result = _run(root, "-m", "codegen", "manifests/", "generated/")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_walk_throughs_work_as_written(tmp_path):
    files = dict(FILE_BLOCK.findall(DOC))
    python = PYTHON_BLOCK.findall(DOC)
    shell = SHELL_BLOCK.findall(DOC)
    assert len(files) == 4 and len(python) == 2 and len(shell) == 2
    _copy_of_the_repository(tmp_path)

    # Change the runtime: a comment-only edit, and --check stays clean.
    edit, check = shell[1].strip().splitlines()
    assert edit.startswith("echo ") and "--check" in check
    with (tmp_path / "generated" / "_runtime" / "numeric.py").open("a") as module:
        module.write("# a comment\n")
    checked = _run(tmp_path, "-m", "codegen", "manifests/", "generated/", "--check")
    assert checked.returncode == 0, checked.stdout + checked.stderr

    # Add an op: its manifest and template, regenerate, the doc's Python.
    for path in ("manifests/test.Scale/manifest.json", "templates/scale.wgsl.jinja"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(files[path])
    _regenerate(tmp_path)
    assert (tmp_path / "generated" / "scale" / "shaders" / "scale.only.wgsl").is_file()
    ran = _run(tmp_path, "-c", python[0])
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == ["[ 0.  3.  6.  9. 12. 15. 18. 21. 24. 27.]", "scalar"]

    # Add a variant: first in the manifest's variants, with its template.
    manifest_path = tmp_path / "manifests" / "test.Scale" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["variants"].insert(0, json.loads(files["manifests/test.Scale/variants/vec4.json"]))
    manifest_path.write_text(json.dumps(manifest, indent=2))
    (tmp_path / "templates" / "scale-vec4.wgsl.jinja").write_text(files["templates/scale-vec4.wgsl.jinja"])
    _regenerate(tmp_path)
    ran = _run(tmp_path, "-c", python[1])
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[:2] == ["vec4", "scalar"], lines
    assert "vec4" in "\n".join(lines[2:]) and "count % 4 == 0" in "\n".join(lines[2:])
