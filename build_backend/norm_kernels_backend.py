"""The project's PEP 517 build backend (pyproject.toml: `build-backend`, `backend-path`).

Standard library only, so `pip wheel .` and `pip install .` work offline with nothing to
download. Metadata comes from pyproject.toml's [project] table (core metadata 2.4,
PEP 639 license expression); [tool.norm-kernels-build] says what goes where:

- wheel: the runtime package, ONE import package: `source` (generated/) installed as `package`
  (webgpu_norm_kernels), plus LICENSE in the .dist-info. The compiler is not in it: it needs
  jinja2, black and the manifests and templates, which live in the repository and the sdist.
- sdist: everything needed to regenerate and to build the same wheel (the `sdist` list).
- editable (`pip install -e .`, the development install): the repository's own top-level
  packages (`editable`: codegen, generated) found where they are, by a small import finder.

Builds are reproducible: sorted entries, fixed timestamps (SOURCE_DATE_EPOCH, else 1980-01-01),
normalized permissions, so the wheel built from the sdist is byte-identical to the one built
from the tree.
"""

from __future__ import annotations

import base64
import csv
import gzip
import hashlib
import io
import os
import re
import tarfile
import time
import tomllib
import zipfile
from pathlib import Path

ROOT = Path.cwd()  # PEP 517: hooks run in the source tree
WHEEL_TAG = "py3-none-any"
EXCLUDED_PARTS = {"__pycache__", ".pytest_cache"}
EXCLUDED_SUFFIXES = {".pyc", ".pyo"}


# ---------------------------------------------------------------------------------------------
# configuration and metadata


def _config(root=None):
    root = Path(root or ROOT)
    data = tomllib.loads((root / "pyproject.toml").read_text())
    return root, data["project"], data["tool"]["norm-kernels-build"]


def _normalized(name):
    return re.sub(r"[-_.]+", "_", name).lower()


def _dist_name(project):
    return f"{_normalized(project['name'])}-{project['version']}"


def metadata_text(root=None):
    """Core metadata 2.4 (PKG-INFO / METADATA) from the [project] table."""
    root, project, _ = _config(root)
    lines = [
        "Metadata-Version: 2.4",
        f"Name: {project['name']}",
        f"Version: {project['version']}",
        f"Summary: {project['description']}",
        f"License-Expression: {project['license']}",
    ]
    lines += [f"License-File: {name}" for name in project.get("license-files", [])]
    lines.append(f"Requires-Python: {project['requires-python']}")
    lines += [f"Classifier: {c}" for c in project.get("classifiers", [])]
    lines += [f"Project-URL: {label}, {url}" for label, url in project.get("urls", {}).items()]
    lines += [f"Requires-Dist: {r}" for r in project.get("dependencies", [])]
    for extra, requirements in project.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        for requirement in requirements:
            marker = f'extra == "{extra}"'
            if ";" in requirement:
                requirement, existing = (part.strip() for part in requirement.split(";", 1))
                marker = f"({existing}) and {marker}"
            lines.append(f"Requires-Dist: {requirement}; {marker}")
    readme = project.get("readme")
    body = ""
    if readme:
        lines.append("Description-Content-Type: text/markdown")
        body = (root / readme).read_text()
    return "\n".join(lines) + "\n\n" + body


def _entry_points(project, renamed=None):
    """entry_points.txt of the console scripts; `renamed` maps a wheel's import package to the one an
    editable install imports instead (generated/ is webgpu_norm_kernels only in the wheel)."""
    scripts = project.get("scripts", {})
    if not scripts:
        return None
    renamed = renamed or {}

    def target_of(target):  # "package.module:function" or "package:function"
        top = re.match(r"[^.:]+", target).group()
        return renamed.get(top, top) + target[len(top) :]

    return "[console_scripts]\n" + "".join(f"{name} = {target_of(target)}\n" for name, target in scripts.items())


# ---------------------------------------------------------------------------------------------
# reproducible archives


def _timestamp():
    return max(int(os.environ.get("SOURCE_DATE_EPOCH", "315532800")), 315532800)  # zip starts at 1980


def _files_under(folder: Path):
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not EXCLUDED_PARTS & set(path.parts) and path.suffix not in EXCLUDED_SUFFIXES:
            yield path


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def _write_wheel(path: Path, entries: dict[str, bytes], dist_info: str) -> None:
    """A wheel holding `entries` ({archive name: bytes}) and its RECORD, in sorted order."""
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for name, data in entries.items():
        writer.writerow([name, _record_hash(data), len(data)])
    writer.writerow([f"{dist_info}/RECORD", "", ""])
    entries = {**entries, f"{dist_info}/RECORD": record.getvalue().encode()}
    date = time.gmtime(_timestamp())[:6]
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            info = zipfile.ZipInfo(name, date_time=date)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)


def _dist_info_entries(root, project, dist_info, tag=WHEEL_TAG, renamed=None):
    entries = {
        f"{dist_info}/METADATA": metadata_text(root).encode(),
        f"{dist_info}/WHEEL": (
            f"Wheel-Version: 1.0\nGenerator: norm_kernels_backend\nRoot-Is-Purelib: true\nTag: {tag}\n"
        ).encode(),
    }
    scripts = _entry_points(project, renamed)
    if scripts:
        entries[f"{dist_info}/entry_points.txt"] = scripts.encode()
    for name in project.get("license-files", []):
        entries[f"{dist_info}/licenses/{name}"] = (root / name).read_bytes()
    return entries


# ---------------------------------------------------------------------------------------------
# PEP 517 / PEP 660 hooks


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    """The runtime wheel: generated/ as webgpu_norm_kernels/, nothing else importable."""
    root, project, tool = _config()
    package, source = tool["wheel"]["package"], root / tool["wheel"]["source"]
    if not (source / "__init__.py").exists():
        raise RuntimeError(f"{source}/ has no __init__.py: generate it first (python -m codegen manifests/ generated/)")
    name = _dist_name(project)
    dist_info = f"{name}.dist-info"
    entries = {f"{package}/{p.relative_to(source).as_posix()}": p.read_bytes() for p in _files_under(source)}
    entries.update(_dist_info_entries(root, project, dist_info))
    filename = f"{name}-{WHEEL_TAG}.whl"
    _write_wheel(Path(wheel_directory) / filename, entries, dist_info)
    return filename


EDITABLE_FINDER = '''"""Editable install of {project}: finds {names} in {root} (PEP 660; written by build_backend/)."""

import importlib.machinery
import sys

ROOT = {root!r}
NAMES = {names!r}


class EditableFinder:
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname in NAMES:
            return importlib.machinery.PathFinder.find_spec(fullname, [ROOT])
        return None


def install():
    if EditableFinder not in sys.meta_path:
        sys.meta_path.append(EditableFinder)
'''


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """The development install: codegen and generated imported from the repository, as they are."""
    root, project, tool = _config()
    name = _dist_name(project)
    dist_info = f"{name}.dist-info"
    finder = f"__editable___{_normalized(project['name'])}_finder"
    names = tuple(tool["editable"])
    entries = {
        f"{finder}.py": EDITABLE_FINDER.format(project=project["name"], names=names, root=str(root.resolve())).encode(),
        f"__editable__.{name}.pth": f"import {finder}; {finder}.install()\n".encode(),
    }
    # The console script's package is the wheel's name for generated/; editable imports generated.
    wheel = tool["wheel"]
    entries.update(_dist_info_entries(root, project, dist_info, renamed={wheel["package"]: wheel["source"]}))
    filename = f"{name}-0.editable-{WHEEL_TAG}.whl"
    _write_wheel(Path(wheel_directory) / filename, entries, dist_info)
    return filename


def sdist_files(root=None):
    """Paths (relative to the root) that the sdist holds, sorted."""
    root, _, tool = _config(root)
    found = set()
    for item in tool["sdist"]:
        path = root / item
        if path.is_dir():
            found |= {p.relative_to(root).as_posix() for p in _files_under(path)}
        elif path.is_file():
            found.add(item)
        else:
            raise RuntimeError(f"[tool.norm-kernels-build] sdist names {item}, which does not exist")
    return sorted(found)


def build_sdist(sdist_directory, config_settings=None):
    """Sources, manifests, templates, generated/, tests and docs: enough to regenerate, test and
    build the same wheel; PKG-INFO carries the metadata."""
    root, project, _ = _config()
    name = _dist_name(project)
    filename = f"{name}.tar.gz"
    mtime = _timestamp()
    members = [(f"{name}/PKG-INFO", metadata_text(root).encode(), 0o644)]
    for relative in sdist_files(root):
        path = root / relative
        mode = 0o755 if os.access(path, os.X_OK) else 0o644  # scripts/bootstrap and .ci/run stay runnable
        members.append((f"{name}/{relative}", path.read_bytes(), mode))
    with open(Path(sdist_directory) / filename, "wb") as raw:
        with gzip.GzipFile(fileobj=raw, mode="wb", mtime=mtime, filename="") as zipped:
            with tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as archive:
                for member, data, mode in sorted(members):
                    info = tarfile.TarInfo(member)
                    info.size, info.mtime, info.mode = len(data), mtime, mode
                    archive.addfile(info, io.BytesIO(data))
    return filename
