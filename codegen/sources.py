"""The one reader: every source a build consumes, read from disk once into a Snapshot.

Input: the MANIFESTS folder (with the shared files of its `_shared/`) and the templates folder,
and the compiler's own files that are copied verbatim (the runtime package, the tools). Output: a
Snapshot, {repository-relative path: bytes}, from which the stages take manifest texts, shared
files, template texts, cases and the copied sources, and the banners their sha256; no later stage
opens a source file.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

CASE_FILES = ("test.json", "bench.json")
TEMPLATE_SUFFIX = ".jinja"
# The folder of the MANIFESTS folder that holds the shared files manifests `include` (its
# manifest.schema.json `sharedPath` names the same folder).
SHARED_FOLDER = "_shared"


@dataclass(frozen=True)
class Snapshot:
    files: Mapping[str, bytes]  # repository-relative posix path -> the bytes read
    manifests: str  # the MANIFESTS folder, repository-relative ("manifests")
    # The templates folder as the render stage names it in template paths and problems: its name
    # ("templates"), which is its repository-relative path in the usual layout (templates/ beside
    # MANIFESTS) and still names no absolute path where the folder lies anywhere else.
    templates: str

    def text(self, path: str) -> str:
        return self.files[path].decode()

    def sha256(self, path: str) -> str:
        return hashlib.sha256(self.files[path]).hexdigest()

    def has(self, path: str) -> bool:
        return path in self.files

    def template_texts(self) -> dict[str, str]:
        """{template name as the Jinja loader knows it (`_lib/reduce.wgsl.jinja`): text}."""
        prefix = f"{self.templates}/"
        return {
            path[len(prefix) :]: data.decode()
            for path, data in self.files.items()
            if path.startswith(prefix) and path.endswith(TEMPLATE_SUFFIX)
        }


def relative_path(path: Path, root: Path) -> str:
    """`path` relative to `root` (posix), or its absolute path where it lies elsewhere."""
    try:
        return path.resolve().relative_to(root).as_posix()
    except ValueError:
        return path.resolve().as_posix()


def read_snapshot(manifests: Path, templates: Path, copied: Mapping[str, Path]) -> Snapshot:
    """Read every manifest with its cases, the shared files manifests include, every template and
    the `copied` files ({path as the banner names it: file}) once."""
    root = manifests.resolve().parent
    files: dict[str, bytes] = {}
    for folder in sorted(p for p in manifests.glob("*") if (p / "manifest.json").is_file()):
        for name in ("manifest.json", *CASE_FILES):
            if (folder / name).is_file():
                files[relative_path(folder / name, root)] = (folder / name).read_bytes()
    # Named by the folder they sit in (as `include` names them), whatever a link points at.
    shared_at = f"{relative_path(manifests, root)}/{SHARED_FOLDER}"
    for path in sorted((manifests / SHARED_FOLDER).glob("*.json")):
        if path.is_file():
            files[f"{shared_at}/{path.name}"] = path.read_bytes()
    # Named as the render stage names it (`wgsl.render_pass`: the folder's name), so the snapshot's
    # keys, the banners and the problems agree wherever the folder lies.
    templates_at = templates.resolve().name
    if templates.is_dir():
        for path in sorted(templates.rglob(f"*{TEMPLATE_SUFFIX}")):
            files[f"{templates_at}/{path.relative_to(templates).as_posix()}"] = path.read_bytes()
    for name, path in copied.items():
        files[str(PurePosixPath(name))] = path.read_bytes()
    return Snapshot(files, relative_path(manifests, root), templates_at)
