"""Shared files (docs/MANIFEST.md, "Shared files"): tunables and derived values that several
manifests `include` from `manifests/_shared/`. They load as if written in each including manifest,
a name has one definition, every problem names the shared file and the manifest that included it,
and what the compiler writes names the shared file (banners, the derive comment), so that an edit
of a shared file makes every includer's package stale.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest

from codegen.build import build, module_name_of
from codegen.manifest import load_manifest, load_manifests
from codegen.problems import CompileError
from codegen.resolve import resolve_op
from codegen.sources import read_snapshot
from tests.compiler.compiler_support import (
    GENERATED,
    MANIFESTS,
    TINY_MANIFEST,
    problem_messages,
    tiny_repo,
)

SHARED = "manifests/_shared/counts.json"
TINY = "manifests/test.Tiny/manifest.json"
# TINY_MANIFEST's tunable and derived value, moved into a shared file.
COUNTS = {
    "description": "The tiny op's count, shared.",
    "tunables": {"WORKGROUP_SIZE": {"default": 64}},
    "derive": {"count": "numel(shapes.x)"},
}


def _including(**changes) -> dict:
    """TINY_MANIFEST taking its tunable and `count` from the shared file."""
    manifest = copy.deepcopy(TINY_MANIFEST)
    del manifest["tunables"], manifest["derive"]
    manifest["include"] = ["_shared/counts.json"]
    manifest.update(changes)
    return manifest


def _repo(root: Path, shared=COUNTS, manifest=None) -> Path:
    """A repository with the tiny op including `shared` (a dict, or text as written); its manifests folder."""
    # Made first, so that writing the manifest copies none of the repository's shared files.
    (root / "manifests" / "_shared").mkdir(parents=True)
    manifests, _ = tiny_repo(root, manifest=manifest or _including())
    text = shared if isinstance(shared, str) else json.dumps(shared, indent=1)
    (manifests / "_shared" / "counts.json").write_text(text)
    return manifests


def _problems(manifests: Path) -> list[str]:
    with pytest.raises(CompileError) as info:
        for op in load_manifests(manifests):
            resolve_op(op)
    return problem_messages(info.value)


def test_included_values_load_as_the_manifests_own(tmp_path):
    op = load_manifests(_repo(tmp_path))[0]
    assert op.tunables == (("WORKGROUP_SIZE", 64),)
    (count,) = op.derives
    assert (count.name, count.expr.source) == ("count", "numel(shapes.x)")
    assert (count.expr.origin.file, count.expr.origin.pointer) == (SHARED, "/derive/count")
    assert count.expr.origin.included_by == TINY
    assert op.includes == (SHARED,)
    resolve_op(op)


def test_the_snapshot_holds_the_shared_files_and_loads_them_from_there(tmp_path):
    manifests = _repo(tmp_path)
    snapshot = read_snapshot(manifests, tmp_path / "templates", {})
    assert snapshot.has(SHARED)
    # The loader takes the shared file from the snapshot, not from disk.
    (manifests / "_shared" / "counts.json").unlink()
    (op,) = load_manifests(manifests, snapshot)
    assert op.includes == (SHARED,)


def test_a_build_with_the_shared_file_writes_what_the_own_values_wrote(tmp_path, device):
    own = build(*tiny_repo(tmp_path / "own"), device=device)
    manifests = _repo(tmp_path / "shared")
    shared = build(manifests, tmp_path / "shared" / "templates", device=device)
    assert sorted(shared) == sorted(own)
    sha = hashlib.sha256((manifests / "_shared" / "counts.json").read_bytes()).hexdigest()[:16]
    init = shared["tiny/__init__.py"]
    # The banner names the shared file with its hash, so that an edit of it makes the package stale.
    assert f"#   {SHARED} (sha256 {sha})\n" in init
    assert f"#   {SHARED} (sha256 {sha})\n" in shared["tiny/copy.py"]
    assert f"#   {SHARED} (sha256 {sha})\n" in shared["_ops.py"]
    # The derive comment names the file that holds the expression.
    assert f"    # count ({SHARED}): numel(shapes.x)\n    count = numel(shape_x)\n" in init

    def without_sources(text: str) -> str:
        return "".join(
            line.replace(f" ({SHARED})", "") for line in text.splitlines(True) if "(sha256 " not in line
        )

    for path, text in own.items():
        if path.endswith(".py"):
            assert without_sources(shared[path]) == without_sources(text), path


def test_a_name_defined_in_the_shared_file_and_the_manifest_is_a_problem(tmp_path):
    manifests = _repo(tmp_path, manifest=_including(derive={"count": "2"}))
    assert _problems(manifests) == [
        f"{TINY}#/derive/count: derived value `count` is defined twice "
        f"(also at {SHARED}#/derive/count (included by {TINY})); a name has one definition"
    ]


def test_a_tunable_defined_twice_is_a_problem(tmp_path):
    manifests = _repo(tmp_path, manifest=_including(tunables={"WORKGROUP_SIZE": {"default": 32}}))
    (problem,) = _problems(manifests)
    assert problem.startswith(f"{TINY}#/tunables/WORKGROUP_SIZE: tunable `WORKGROUP_SIZE` is defined twice")


def test_two_shared_files_that_define_one_name_are_a_problem(tmp_path):
    manifests = _repo(tmp_path, manifest=_including(include=["_shared/counts.json", "_shared/more.json"]))
    (manifests / "_shared" / "more.json").write_text(
        json.dumps({"description": "again", "derive": {"count": "1"}})
    )
    (problem,) = _problems(manifests)
    assert problem.startswith(
        f"manifests/_shared/more.json#/derive/count (included by {TINY}): derived value `count` is defined twice"
    )


def test_an_unknown_shared_file_suggests_the_closest(tmp_path):
    manifests = _repo(tmp_path, manifest=_including(include=["_shared/count.json"]))
    expected = [
        f"{TINY}#/include/0: unknown shared file `_shared/count.json`; did you mean `_shared/counts.json`?"
    ]
    assert _problems(manifests) == expected
    # The same from the snapshot a build reads (the shared files it holds, not the disk's).
    snapshot = read_snapshot(manifests, tmp_path / "templates", {})
    with pytest.raises(CompileError) as info:
        load_manifests(manifests, snapshot)
    assert problem_messages(info.value) == expected


def test_a_folder_named_like_a_shared_file_is_no_shared_file(tmp_path):
    manifests = _repo(tmp_path, manifest=_including(include=["_shared/folder.json"]))
    (manifests / "_shared" / "folder.json").mkdir()
    assert not read_snapshot(manifests, tmp_path / "templates", {}).has("manifests/_shared/folder.json")
    assert _problems(manifests) == [
        f"{TINY}#/include/0: unknown shared file `_shared/folder.json`; did you mean `_shared/counts.json`?"
    ]


def test_an_include_outside_the_shared_folder_is_a_schema_problem(tmp_path):
    manifests = _repo(tmp_path, manifest=_including(include=["../test.Tiny/manifest.json"]))
    (problem,) = _problems(manifests)
    assert problem.startswith(f"{TINY}#/include/0: expected a shared file's path in the manifests folder")


def test_a_shared_file_that_does_not_fit_the_schema_is_located_in_it(tmp_path):
    broken = {**COUNTS, "derived": {}}
    del broken["description"]
    manifests = _repo(tmp_path, shared=broken)
    assert sorted(_problems(manifests)) == sorted(
        [
            f"{SHARED}#/description (included by {TINY}): required key is missing",
            f"{SHARED}#/derived (included by {TINY}): unknown key `derived`; did you mean `derive`?",
        ]
    )


def test_a_shared_file_that_is_not_json_is_located_in_it(tmp_path):
    manifests = _repo(tmp_path, shared='{"description": "x",')
    (problem,) = _problems(manifests)
    assert problem.startswith(f"{SHARED}# (included by {TINY}): not valid JSON:")


def test_an_unknown_name_in_a_shared_expression_names_the_including_manifest(tmp_path):
    # The same shared expression can be right in one manifest and wrong in another.
    manifests = _repo(tmp_path, shared={**COUNTS, "derive": {"count": "numel(shapes.input)"}})
    (problem,) = _problems(manifests)
    assert problem.startswith(f"{SHARED}#/derive/count (included by {TINY}): unknown name `shapes.input`")


def test_load_manifest_reads_the_shared_files_beside_the_manifests(tmp_path):
    _repo(tmp_path)
    op = load_manifest(tmp_path / "manifests" / "test.Tiny" / "manifest.json", tmp_path)
    assert op.includes == (SHARED,)


def test_every_shared_file_is_included_and_fits_the_schema(ops):
    from codegen.schema import schema_problems

    included = {path for op in ops.values() for path in op.includes}
    files = {f"manifests/_shared/{p.name}" for p in (MANIFESTS / "_shared").glob("*.json")}
    assert included == files, "a shared file no manifest includes is dead text"
    for path in files:
        data = json.loads((MANIFESTS.parent / path).read_text())
        assert schema_problems(data, path, definition="shared") == []


def test_the_generated_packages_name_the_shared_files_they_were_built_from(ops):
    for op in ops.values():
        if not op.includes:
            continue
        init = (GENERATED / module_name_of(op) / "__init__.py").read_text()
        for path in op.includes:
            sha = hashlib.sha256((MANIFESTS.parent / path).read_bytes()).hexdigest()[:16]
            assert f"#   {path} (sha256 {sha})\n" in init, (op.id, path)


def test_every_hole_in_an_including_manifest_or_its_shared_file_is_a_located_problem(tmp_path):
    """Break one node at a time of the manifest (its `include` too) and of its shared file: loading
    and resolving either works or raises CompileError whose every problem points into one of the
    two files; nothing else."""
    from tests.compiler.test_manifests import _broken, _node_breakages

    manifests = _repo(tmp_path)
    manifest_path = manifests / "test.Tiny" / "manifest.json"
    shared_path = manifests / "_shared" / "counts.json"
    samples = [(manifest_path, _including()), (shared_path, COUNTS)]
    tried = 0
    for path, data in samples:
        for where, value in _node_breakages(data):
            path.write_text(json.dumps(_broken(data, where, value)))
            tried += 1
            try:
                for op in load_manifests(manifests):
                    resolve_op(op)
            except CompileError as error:
                assert error.problems, where
                for problem in error.problems:
                    assert problem.origin is not None and problem.origin.file in (TINY, SHARED), (
                        where,
                        str(problem),
                    )
            except Exception as error:  # noqa: BLE001: any other exception is the defect this test finds
                pytest.fail(f"breaking {path.name} {'/'.join(map(str, where))} to {value!r} raised {error!r}")
        path.write_text(json.dumps(data))
    assert tried > 50
