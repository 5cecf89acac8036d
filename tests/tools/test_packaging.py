"""Packaging: the license, the metadata, and the wheel, sdist and editable install that pip builds.

pyproject.toml builds with hatchling, which pip (and `python -m build`, for the sdist) installs from
the package index into an isolated build environment, so these builds need the index. The runtime
wheel is installed into a fresh venv outside the repository (no pip in it, no system site-packages);
wgpu and numpy, with what they need, come from the test interpreter's site-packages through a folder
of links to exactly those distributions, so nothing of the repository (nor its editable install) is
visible there.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
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

import generated
from tests.oracles import (
    assert_close,
    batch_normalization_ref,
    group_normalization_ref,
    instance_normalization_ref,
    node_reference,
    microsoft_group_norm_ref,
    skip_group_norm_ref,
)

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
# The one source of the version (pyproject.toml: dynamic, [tool.hatch.version]).
VERSION = re.search(
    r'^__version__ = "([^"]+)"', (REPO / "generated" / "__init__.py").read_text(), re.M
).group(1)
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
    assert (
        (REPO / "generated" / "REPORT.md")
        .read_text()
        .rstrip()
        .endswith("<!-- SPDX-License-Identifier: Apache-2.0 -->")
    )


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
    _pip("wheel", "--no-deps", "--wheel-dir", str(out), str(REPO))
    (path,) = out.glob("*.whl")
    return path


def _generated_files(root: Path) -> list[str]:
    """Every file under root/generated but caches, relative to it."""
    return sorted(
        p.relative_to(root / "generated").as_posix()
        for p in (root / "generated").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )


def _metadata(text: bytes) -> Metadata:
    metadata = Metadata.from_email(text, validate=True)
    assert metadata.metadata_version == "2.4"  # PEP 639's; hatchling's default, 2.5, needs packaging>=26
    assert (metadata.name, str(metadata.version)) == (PROJECT["name"], VERSION)
    assert (metadata.license_expression, metadata.license_files) == ("Apache-2.0", ["LICENSE"])
    assert str(metadata.requires_python) == ">=3.11"
    assert sorted(str(r) for r in metadata.requires_dist if not r.marker) == sorted(PROJECT["dependencies"])
    assert set(metadata.provides_extra) == {"codegen", "test", "bench", "check"}
    return metadata


def test_the_wheel_holds_one_namespaced_package_and_its_license(wheel):
    assert wheel.name == f"{DIST}-py3-none-any.whl"
    archive = zipfile.ZipFile(wheel)
    names = archive.namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"webgpu_norm_kernels", f"{DIST}.dist-info"}, tops
    packaged = sorted(n.split("/", 1)[1] for n in names if n.startswith("webgpu_norm_kernels/"))
    assert packaged == _generated_files(REPO)
    assert archive.read(f"{DIST}.dist-info/licenses/LICENSE") == (REPO / "LICENSE").read_bytes()
    _metadata(archive.read(f"{DIST}.dist-info/METADATA"))
    assert "Generator: hatchling " in archive.read(f"{DIST}.dist-info/WHEEL").decode()
    assert (
        "webgpu-norm-kernels = webgpu_norm_kernels.__main__:main"
        in archive.read(f"{DIST}.dist-info/entry_points.txt").decode()
    )
    # Reproducible: one fixed timestamp (SOURCE_DATE_EPOCH, else hatchling's), normalized permissions.
    assert len({info.date_time for info in archive.infolist()}) == 1
    assert {info.external_attr >> 16 & 0o777 for info in archive.infolist()} <= {0o644, 0o755}


def test_the_wheel_takes_every_file_of_generated_but_caches(tmp_path):
    """Shaders and data files in subfolders go in as they are; __pycache__ and *.pyc stay out."""
    root = tmp_path / "tree"
    root.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", ".gitignore"):
        shutil.copy2(REPO / name, root / name)
    shutil.copytree(REPO / "generated", root / "generated", ignore=shutil.ignore_patterns("__pycache__"))
    extra = {
        "batch_normalization/shaders/stats.wgsl": "@compute @workgroup_size(64) fn main() {}\n",
        "batch_normalization/data/tuning.json": "{}\n",
        "data/nested/deeper/facts.json": "[]\n",
    }
    for relative, text in extra.items():
        (root / "generated" / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / "generated" / relative).write_text(text)
    (root / "generated" / "data" / "__pycache__").mkdir()
    (root / "generated" / "data" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"cache")
    (root / "generated" / "stray.pyc").write_bytes(b"cache")
    out = tmp_path / "out"
    _pip("wheel", "--no-deps", "--wheel-dir", str(out), str(root), cwd=tmp_path)
    (path,) = out.glob("*.whl")
    names = zipfile.ZipFile(path).namelist()
    packaged = sorted(n.split("/", 1)[1] for n in names if n.startswith("webgpu_norm_kernels/"))
    expected = sorted(name for name in _generated_files(root) if not name.endswith(".pyc"))
    assert packaged == expected and set(extra) <= set(packaged), packaged
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)


SDIST_TOPS = {
    "PKG-INFO",
    ".gitignore",
    "pyproject.toml",
    "README.md",
    "LICENSE",
    "codegen",
    "generated",
    "editable",
    "manifests",
    "templates",
    "tests",
    "docs",
    "scripts",
    ".ci",
}


def test_the_sdist_has_the_sources_and_builds_the_same_wheel(wheel, tmp_path):
    out = tmp_path / "sdist"
    _run([sys.executable, "-m", "build", "--sdist", "--outdir", str(out), str(REPO)], cwd=tmp_path)
    (sdist,) = out.glob("*.tar.gz")
    assert sdist.name == f"{DIST}.tar.gz"
    with tarfile.open(sdist) as archive:
        members = {m.name: m for m in archive.getmembers()}
        pkg_info = archive.extractfile(f"{DIST}/PKG-INFO").read()
    assert {name.split("/")[1] for name in members} == SDIST_TOPS
    sources = [
        "LICENSE",
        "pyproject.toml",
        "README.md",
        "codegen/__main__.py",
        "codegen/emit.py",
        "generated/__init__.py",
        "editable/webgpu_norm_kernels/__main__.py",
        "scripts/bootstrap",
        ".ci/run",
    ]
    for needed in sources:
        assert f"{DIST}/{needed}" in members, needed
    prefix = f"{DIST}/generated/"
    assert sorted(m[len(prefix) :] for m in members if m.startswith(prefix)) == _generated_files(REPO)
    assert any(m.startswith(f"{DIST}/manifests/") and m.endswith("manifest.json") for m in members)
    assert any(m.startswith(f"{DIST}/templates/") and m.endswith(".wgsl.jinja") for m in members)
    assert not any("__pycache__" in m or m.endswith(".pyc") for m in members)
    # scripts/bootstrap and .ci/run stay runnable; one fixed timestamp (reproducible)
    assert members[f"{DIST}/scripts/bootstrap"].mode == members[f"{DIST}/.ci/run"].mode == 0o755
    assert len({m.mtime for m in members.values()}) == 1
    _metadata(pkg_info)
    rebuilt = tmp_path / "from-sdist"
    _pip("wheel", "--no-deps", "--wheel-dir", str(rebuilt), str(sdist), cwd=tmp_path)
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
from webgpu_norm_kernels import group_norm

data = dict(np.load(sys.argv[1]))
out = {
    "bn": batch_normalization.batch_normalization(data["x"], *(data[n] for n in ("c0", "c1", "c2", "c3"))),
    "gn": group_normalization.group_normalization(data["x"], data["c0"], data["c1"], num_groups=4),
    "in": instance_normalization.instance_normalization(data["x"], data["c0"], data["c1"]),
}
out["sgn_y"], out["sgn_s"] = skip_group_norm.skip_group_norm(
    data["xs"], data["c0"], data["c1"], data["skip"], data["c2"], groups=2, activation=1, return_sum=True
)
# The layer family, over the last axis (8) of xs.
from webgpu_norm_kernels import layer_normalization, rms_normalization, simplified_layer_normalization
from webgpu_norm_kernels import skip_layer_normalization, skip_simplified_layer_normalization

out["ln"] = layer_normalization.layer_normalization(data["xs"], data["c0"], data["c1"])
out["rms"] = rms_normalization.rms_normalization(data["xs"], data["c0"])
out["sln"] = simplified_layer_normalization.simplified_layer_normalization(data["xs"], data["c0"])
x3, skip3 = data["xs"].reshape(6, 5, 8), data["skip"].reshape(6, 5, 8)  # the Skip forms take rank 2 or 3
out["skln"] = skip_layer_normalization.skip_layer_normalization(x3, skip3, data["c0"], data["c1"])
out["sksln"] = skip_simplified_layer_normalization.skip_simplified_layer_normalization(x3, skip3, data["c0"])
out["mgn"] = group_norm.group_norm(data["xs"].astype(np.float16), data["c0"], data["c1"], groups=4, activation=1)
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
    site = Path(
        _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip()
    )
    _link_farm(tmp_path / "deps", [str(r) for r in PROJECT["dependencies"]])
    (site / "deps.pth").write_text(str(tmp_path / "deps") + "\n")
    _pip(
        "--python",
        str(python),
        "install",
        "--no-deps",
        "--no-index",
        "--no-compile",
        str(wheel),
        cwd=tmp_path,
    )

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
    result = _run(
        [str(python), "-I", str(script), str(tmp_path / "in.npz"), str(tmp_path / "out.npz")], cwd=tmp_path
    )
    facts = json.loads(result.stdout.splitlines()[-1])
    assert Path(facts["file"]).is_relative_to(site / "webgpu_norm_kernels"), facts
    assert not facts["generated"] and not facts["codegen"], facts
    assert not any(Path(p).resolve().is_relative_to(REPO) for p in facts["path"] if p), facts["path"]
    assert facts["version"] == VERSION and facts["ops"] == sorted(str(e) for e in generated.ops().values())
    out = np.load(tmp_path / "out.npz")
    c = [data[f"c{i}"] for i in range(4)]
    assert_close(out["bn"], batch_normalization_ref(data["x"], *c), np.float32, "wheel: BatchNormalization")
    assert_close(
        out["gn"], group_normalization_ref(data["x"], c[0], c[1], 4), np.float32, "wheel: GroupNormalization"
    )
    assert_close(
        out["in"],
        instance_normalization_ref(data["x"], c[0], c[1]),
        np.float32,
        "wheel: InstanceNormalization",
    )
    ref_y, ref_s = skip_group_norm_ref(data["xs"], c[0], c[1], data["skip"], c[2], 2, 1e-5, 1, 1, np.float32)
    assert_close(out["sgn_y"], ref_y, np.float32, "wheel: SkipGroupNorm Y")
    assert_close(out["sgn_s"], ref_s, np.float32, "wheel: SkipGroupNorm S")
    xs, x3, skip3 = data["xs"], data["xs"].reshape(6, 5, 8), data["skip"].reshape(6, 5, 8)
    for name, package, inputs in (
        ("ln", "layer_normalization", {"x": xs, "scale": c[0], "b": c[1]}),
        ("rms", "rms_normalization", {"x": xs, "scale": c[0]}),
        ("sln", "simplified_layer_normalization", {"x": xs, "scale": c[0]}),
        ("skln", "skip_layer_normalization", {"input": x3, "skip": skip3, "gamma": c[0], "beta": c[1]}),
        ("sksln", "skip_simplified_layer_normalization", {"input": x3, "skip": skip3, "gamma": c[0]}),
    ):
        module = importlib.import_module(f"generated.{package}")
        expected = next(iter(node_reference(module, inputs, {}).values()))
        assert_close(out[name], expected, np.float32, f"wheel: {package}")
    ref = microsoft_group_norm_ref(data["xs"].astype(np.float16), c[0], c[1], 4, 1e-5, 1, 1)
    assert_close(out["mgn"], ref, np.float16, "wheel: com.microsoft GroupNorm")
    # The console script runs the package's __main__ (no command: usage, exit 2).
    script_run = subprocess.run(
        [str(environment / "bin" / "webgpu-norm-kernels")], capture_output=True, text=True, timeout=60
    )
    assert script_run.returncode == 2 and "usage: python -m webgpu_norm_kernels COMMAND" in script_run.stderr


def test_the_editable_install_imports_the_repository_packages(tmp_path):
    """pip install -e . (scripts/bootstrap) gives codegen and generated from the repository, from any
    folder, and a `webgpu-norm-kernels` command that runs generated's __main__."""
    environment = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(environment)
    python = environment / "bin" / "python"
    purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site = Path(_run([str(python), "-c", purelib]).stdout.strip())
    _pip("--python", str(python), "install", "--no-deps", "-e", str(REPO), cwd=tmp_path)
    # hatchling's dev mode: a .pth with the repository root and editable/, nothing copied.
    (pth,) = site.glob("*.pth")
    assert pth.read_text().split() == [str(REPO), str(REPO / "editable")]
    installed = importlib.metadata.Distribution.at(next(site.glob(f"{DIST}.dist-info")))
    assert not [f for f in installed.files if not str(f).startswith((f"{DIST}.dist-info/", pth.name, "../"))]
    # Found, not imported: numpy is not in this venv yet.
    code = "import codegen.onnx_versions as v, importlib.util as u; print(v.__file__); print(u.find_spec('generated').origin)"
    result = _run([str(python), "-I", "-c", code], cwd=tmp_path)
    module, init = result.stdout.split()
    assert (
        Path(module) == REPO / "codegen" / "onnx_versions.py"
        and Path(init) == REPO / "generated" / "__init__.py"
    )
    # The wheel's name is only the editable/ stand-in, for the command: none of the kernels.
    code = "import webgpu_norm_kernels as k; print(k.__file__, hasattr(k, 'ops'))"
    assert _run([str(python), "-I", "-c", code], cwd=tmp_path).stdout.split() == [
        str(REPO / "editable" / "webgpu_norm_kernels" / "__init__.py"),
        "False",
    ]
    # The command (webgpu_norm_kernels.__main__:main, as in the wheel) runs generated/'s __main__ from the
    # repository: without numpy the import gets that far; with it, no command prints the usage (exit 2).
    script = environment / "bin" / "webgpu-norm-kernels"
    script_run = subprocess.run([str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert "No module named 'numpy'" in script_run.stderr, script_run.stderr
    assert f'File "{REPO / "generated" / "__init__.py"}"' in script_run.stderr, script_run.stderr
    _link_farm(tmp_path / "deps", [str(r) for r in PROJECT["dependencies"]])
    (site / "deps.pth").write_text(str(tmp_path / "deps") + "\n")
    script_run = subprocess.run([str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert script_run.returncode == 2, script_run.stderr
    assert "usage: python -m generated COMMAND" in script_run.stderr, script_run.stderr
