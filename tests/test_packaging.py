"""Packaging: the license, the metadata, and the wheel, sdist and editable install that pip builds.

The build backend (build_backend/) is standard library only, so every build here runs offline
with the pip of the test interpreter. The runtime wheel is installed into a fresh venv outside the
repository (no pip in it, no system site-packages); wgpu and numpy, with what they need, come
from the test interpreter's site-packages through a folder of links to exactly those
distributions, so nothing of the repository (nor its editable install) is visible there.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tarfile
import tomllib
import venv
import zipfile
from pathlib import Path

import numpy as np
import pytest
from packaging.markers import default_environment
from packaging.metadata import Metadata
from packaging.requirements import Requirement

from oracles import (
    assert_close,
    batch_normalization_ref,
    group_normalization_ref,
    instance_normalization_ref,
    skip_group_norm_ref,
)

REPO = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
VERSION = PROJECT["version"]
DIST = f"webgpu_norm_kernels-{VERSION}"
SPDX = "# SPDX-License-Identifier: Apache-2.0"


def _run(command, **kwargs):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.setdefault("WGPU_BACKEND_TYPE", "Vulkan")
    result = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env, **kwargs)
    assert result.returncode == 0, f"{command}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def _pip(*args, cwd=REPO):
    return _run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], cwd=cwd)


# ---------------------------------------------------------------------------------------------
# item 1: license


def test_license_is_apache_2_0_everywhere():
    text = (REPO / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply the Apache License" in text
    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]
    # Every file of the package carries the SPDX line at its top (REPORT.md at its end; py.typed is empty).
    for path in sorted((REPO / "generated").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".md", ".typed"):
            head = path.read_text().split('"""', 1)[0]
            spdx = SPDX.replace("#", "//") if path.suffix == ".wgsl" else SPDX
            assert spdx in head.splitlines(), path
    assert (REPO / "generated" / "REPORT.md").read_text().rstrip().endswith("<!-- SPDX-License-Identifier: Apache-2.0 -->")


# ---------------------------------------------------------------------------------------------
# item 3: metadata


def _wgpu_requires_python():
    return importlib.metadata.metadata("wgpu")["Requires-Python"]


def test_metadata_is_consistent():
    assert PROJECT["requires-python"] == _wgpu_requires_python() == ">=3.11"
    classifiers = PROJECT["classifiers"]
    assert "Typing :: Typed" in classifiers and "Programming Language :: Python :: 3.11" in classifiers
    assert not any(c.startswith("License ::") for c in classifiers)  # PEP 639: the expression says it
    assert "urls" not in PROJECT  # no public address exists yet: none rather than an invented one
    assert PROJECT["optional-dependencies"]["bench"] == ["matplotlib"]
    import generated

    assert generated.__version__ == VERSION
    assert (REPO / "generated" / "py.typed").exists()


# ---------------------------------------------------------------------------------------------
# item 2: the wheel, the sdist, the editable install


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    _pip("wheel", "--no-deps", "--no-index", "--wheel-dir", str(out), str(REPO))
    (path,) = out.glob("*.whl")
    return path


def test_the_wheel_holds_one_namespaced_package_and_its_license(wheel):
    assert wheel.name == f"{DIST}-py3-none-any.whl"
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"webgpu_norm_kernels", f"{DIST}.dist-info"}, tops
    generated = sorted(
        p.relative_to(REPO / "generated").as_posix()
        for p in (REPO / "generated").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    assert sorted(n.split("/", 1)[1] for n in names if n.startswith("webgpu_norm_kernels/")) == generated
    archive = zipfile.ZipFile(wheel)
    assert archive.read(f"{DIST}.dist-info/licenses/LICENSE") == (REPO / "LICENSE").read_bytes()
    metadata = Metadata.from_email(archive.read(f"{DIST}.dist-info/METADATA"), validate=True)
    assert (metadata.name, str(metadata.version), metadata.license_expression) == ("webgpu-norm-kernels", VERSION, "Apache-2.0")
    assert metadata.license_files == ["LICENSE"] and str(metadata.requires_python) == ">=3.11"
    assert [str(r) for r in metadata.requires_dist if not r.marker] == ["wgpu==0.32.*", "numpy"]
    assert set(metadata.provides_extra) == {"codegen", "test", "bench"}
    assert "webgpu-norm-kernels = webgpu_norm_kernels.__main__:main" in archive.read(f"{DIST}.dist-info/entry_points.txt").decode()


def test_the_sdist_has_the_sources_and_builds_the_same_wheel(wheel, tmp_path):
    sys.path.insert(0, str(REPO / "build_backend"))
    try:
        import norm_kernels_backend as backend
    finally:
        sys.path.pop(0)
    cwd = os.getcwd()
    os.chdir(REPO)  # PEP 517 hooks run in the source tree
    try:
        sdist = tmp_path / backend.build_sdist(str(tmp_path))
    finally:
        os.chdir(cwd)
    members = tarfile.open(sdist).getnames()
    for needed in ("PKG-INFO", "LICENSE", "pyproject.toml", "README.md", "build_backend/norm_kernels_backend.py",
                   "codegen/__main__.py", "codegen/emit.py", "generated/__init__.py", "scripts/bootstrap"):
        assert f"{DIST}/{needed}" in members, needed
    assert any(m.startswith(f"{DIST}/manifests/") and m.endswith("manifest.json") for m in members)
    assert any(m.startswith(f"{DIST}/templates/") and m.endswith(".wgsl.jinja") for m in members)
    assert not any("__pycache__" in m for m in members)
    rebuilt = tmp_path / "from-sdist"
    _pip("wheel", "--no-deps", "--no-index", "--wheel-dir", str(rebuilt), str(sdist), cwd=tmp_path)
    (again,) = rebuilt.glob("*.whl")
    assert again.read_bytes() == wheel.read_bytes()


def _link_farm(folder: Path, requirements: list[str]) -> None:
    """Links to the installed files of `requirements` and everything they need (markers evaluated)."""
    folder.mkdir()
    environment = default_environment()
    todo, seen = [Requirement(r) for r in requirements], set()
    while todo:
        requirement = todo.pop()
        if requirement.marker and not requirement.marker.evaluate({**environment, "extra": ""}):
            continue
        distribution = importlib.metadata.distribution(requirement.name)
        if distribution.metadata["Name"].lower() in seen:
            continue
        seen.add(distribution.metadata["Name"].lower())
        assert distribution.version in requirement.specifier, (requirement, distribution.version)
        site = Path(distribution.locate_file(""))
        for top in {Path(str(f)).parts[0] for f in distribution.files}:
            if not top.startswith(("..", "__editable__")) and not (folder / top).exists():
                (folder / top).symlink_to(site / top)
        todo += [Requirement(r) for r in distribution.requires or []]


RUN_EVERY_OP = r"""
import importlib.util, json, sys
import numpy as np
import webgpu_norm_kernels as k
from webgpu_norm_kernels import batch_normalization, group_normalization, instance_normalization, skip_group_norm

data = dict(np.load(sys.argv[1]))
out = {
    "bn": batch_normalization.batch_normalization(data["x"], *(data[n] for n in ("c0", "c1", "c2", "c3"))),
    "gn": group_normalization.group_normalization(data["x"], data["c0"], data["c1"], num_groups=4),
    "in": instance_normalization.instance_normalization(data["x"], data["c0"], data["c1"]),
}
out["sgn_y"], out["sgn_s"] = skip_group_norm.skip_group_norm(
    data["xs"], data["c0"], data["c1"], data["skip"], data["c2"], groups=2, activation=1, return_sum=True
)
np.savez(sys.argv[2], **out)
print(json.dumps({
    "file": k.__file__, "version": k.__version__, "ops": sorted(str(e) for e in k.ops().values()),
    "generated": importlib.util.find_spec("generated") is not None,
    "codegen": importlib.util.find_spec("codegen") is not None,
    "prefix": sys.prefix, "path": sys.path,
}))
"""


def test_the_wheel_installs_and_runs_every_op_outside_the_repository(wheel, tmp_path):
    environment = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(environment)
    python = environment / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip())
    _link_farm(tmp_path / "deps", [str(r) for r in PROJECT["dependencies"]])
    (site / "deps.pth").write_text(str(tmp_path / "deps") + "\n")
    _pip("--python", str(python), "install", "--no-deps", "--no-index", "--no-compile", str(wheel), cwd=tmp_path)

    rng = np.random.default_rng(11)
    data = {
        "x": rng.standard_normal((2, 8, 3, 5)).astype(np.float32),
        "xs": rng.standard_normal((2, 3, 5, 8)).astype(np.float32),
        "skip": rng.standard_normal((2, 3, 5, 8)).astype(np.float32),
        **{f"c{i}": rng.uniform(0.5, 1.5, 8).astype(np.float32) for i in range(4)},
    }
    np.savez(tmp_path / "in.npz", **data)
    script = tmp_path / "run.py"
    script.write_text(RUN_EVERY_OP)
    # -I: no PYTHONPATH, no user site, not the script's folder: only the venv and its .pth files.
    result = _run([str(python), "-I", str(script), str(tmp_path / "in.npz"), str(tmp_path / "out.npz")], cwd=tmp_path)
    facts = json.loads(result.stdout.splitlines()[-1])
    assert Path(facts["file"]).is_relative_to(site / "webgpu_norm_kernels"), facts
    assert not facts["generated"] and not facts["codegen"], facts
    assert not any(Path(p).resolve().is_relative_to(REPO) for p in facts["path"] if p), facts["path"]
    assert facts["version"] == VERSION and len(facts["ops"]) == 8
    out = np.load(tmp_path / "out.npz")
    c = [data[f"c{i}"] for i in range(4)]
    assert_close(out["bn"], batch_normalization_ref(data["x"], *c), np.float32, "wheel: BatchNormalization")
    assert_close(out["gn"], group_normalization_ref(data["x"], c[0], c[1], 4), np.float32, "wheel: GroupNormalization")
    assert_close(out["in"], instance_normalization_ref(data["x"], c[0], c[1]), np.float32, "wheel: InstanceNormalization")
    ref_y, ref_s = skip_group_norm_ref(data["xs"], c[0], c[1], data["skip"], c[2], 2, 1e-5, 1, 1, np.float32)
    assert_close(out["sgn_y"], ref_y, np.float32, "wheel: SkipGroupNorm Y")
    assert_close(out["sgn_s"], ref_s, np.float32, "wheel: SkipGroupNorm S")
    # The console script runs the package's __main__ (no command: usage, exit 2).
    script_run = subprocess.run([str(environment / "bin" / "webgpu-norm-kernels")], capture_output=True, text=True, timeout=60)
    assert script_run.returncode == 2 and "usage: python -m webgpu_norm_kernels COMMAND" in script_run.stderr


def test_the_editable_install_imports_the_repository_packages(tmp_path):
    """pip install -e . (scripts/bootstrap) gives codegen and generated from the repository, from any folder."""
    environment = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(environment)
    python = environment / "bin" / "python"
    _pip("--python", str(python), "install", "--no-deps", "--no-index", "-e", str(REPO), cwd=tmp_path)
    # Found, not imported: the throwaway venv has neither numpy nor black.
    code = "import codegen.onnx_versions as v, importlib.util as u; print(v.__file__); print(u.find_spec('generated').origin)"
    result = _run([str(python), "-I", "-c", code], cwd=tmp_path)
    module, init = result.stdout.split()
    assert Path(module) == REPO / "codegen" / "onnx_versions.py" and Path(init) == REPO / "generated" / "__init__.py"
    found = _run([str(python), "-I", "-c", "import importlib.util as u; print(u.find_spec('tests'), u.find_spec('webgpu_norm_kernels'))"], cwd=tmp_path)
    assert found.stdout.split() == ["None", "None"]  # only the two packages, not the whole repository
    # Its console script runs generated/'s __main__ (an audit found it pointed at webgpu_norm_kernels,
    # which only the wheel installs): numpy is missing here, so the import gets that far and no further.
    script = environment / "bin" / "webgpu-norm-kernels"
    script_run = subprocess.run([str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert "No module named 'numpy'" in script_run.stderr and "webgpu_norm_kernels" not in script_run.stderr, script_run.stderr
