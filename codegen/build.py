"""Build stage: manifests/ + templates/ -> {path relative to OUT: text}, and the one writer.

`build()` is a pure function of the sources (manifests, templates, the runtime and tool sources
copied verbatim); `write()` replaces, through a temporary file and `os.replace`, only the files
whose bytes changed; `stale()` is what `--check` reports. The CLI (`__main__.py`) only parses
arguments and prints.
"""

from __future__ import annotations

import difflib
import os
import tempfile
import tomllib
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from .emit import Source, banner, emit_cases, emit_op_init, emit_package_init, emit_runtime, emit_shaders_module, emit_variant, format_source, module_name
from .expr import snake
from .manifest import load_manifests
from .problems import CompileError, Problem
from .report import emit_report
from .resolve import resolve_op
from .sources import CASE_FILES, TEMPLATE_SUFFIX, Snapshot, read_snapshot
from .store import store_shaders
from .validate import NagaProcess, validate
from .wgsl import missing_templates, render_op

# The runtime package: each module copied verbatim into generated/_runtime/.
RUNTIME_SOURCE = Path(__file__).with_name("runtime")
BENCH_SOURCE = Path(__file__).with_name("bench.py")
ONNX_VERSIONS_SOURCE = Path(__file__).with_name("onnx_versions.py")
# Copied verbatim, each under its name in generated/.
VERBATIM_SOURCES = {
    "bench.py": BENCH_SOURCE,
    "bench_calls.py": Path(__file__).with_name("bench_calls.py"),
    "bench_torch.py": Path(__file__).with_name("bench_torch.py"),
    "doctor.py": Path(__file__).with_name("doctor.py"),
    "__main__.py": Path(__file__).with_name("package_main.py"),
    "onnx_nodes.py": Path(__file__).with_name("onnx_nodes.py"),
    "check_model.py": Path(__file__).with_name("check_model.py"),
    "registry.py": Path(__file__).with_name("registry.py"),
}
# The compiler's own project: its version is the generated package's when MANIFESTS has none beside it.
OWN_PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def selected_ops(manifests: Path, only: tuple[str, ...] = (), snapshot: Snapshot | None = None):
    """The manifests' ops, or those `only` names (op id, name or module name); unknown names and an
    empty folder are a one-problem CompileError."""
    if not manifests.is_dir():
        raise CompileError([Problem(None, f"{manifests}: no such folder of <op id>/manifest.json")])
    loaded = load_manifests(manifests, snapshot)
    if not loaded:
        raise CompileError([Problem(None, f"{manifests}: no <op id>/manifest.json in this folder")])
    names = {name: op for op in loaded for name in (op.id, op.name, module_name_of(op))}
    unknown = [name for name in only if name not in names]
    if unknown:
        ops = f"ops are {', '.join(op.id for op in loaded)} (or their module names {', '.join(module_name_of(op) for op in loaded)})"
        raise CompileError([Problem(None, f"--only {unknown[0]}: no such op; {ops}")])
    return [op for op in loaded if not only or any(names[name] is op for name in only)]


def module_name_of(op) -> str:
    """The op package's name (`group_normalization`), from an ir.Op."""
    return snake(op.name)


def copied_sources() -> dict[str, Path]:
    """{path as the banners name it: file} of everything copied verbatim, and onnx_versions.py."""
    copied = {f"{RUNTIME_SOURCE.parent.name}/{RUNTIME_SOURCE.name}/{p.name}": p for p in sorted(RUNTIME_SOURCE.glob("*.py"))}
    for path in [ONNX_VERSIONS_SOURCE, *VERBATIM_SOURCES.values()]:
        copied[f"{path.parent.name}/{path.name}"] = path
    return copied


def build(manifests: Path, templates: Path, only: tuple[str, ...] = (), device=None) -> dict[str, str]:
    """Every generated file as {path relative to OUT: text}; raises CompileError listing every problem.

    With `only`, just those ops' own files (their package folders): nothing shared is rebuilt.
    Every source is read once, first (sources.read_snapshot); nothing after that opens a source.
    """
    # Resolved, so that the render stage's name for the folder (its last part) is the snapshot's.
    templates = templates.resolve()
    with _validator(device) as validator, ThreadPoolExecutor(max_workers=1) as background:
        snapshot = read_snapshot(manifests, templates, copied_sources())
        emitted, skipped = _rendered_ops(manifests, templates, only, snapshot)
        rendered_all = [item for _, rendered in emitted for item in rendered]
        # naga runs while this thread emits and formats (its thread only waits on the validation
        # process, or on wgpu-native, which releases the GIL).
        validated = background.submit(validator, rendered_all) if rendered_all else None
        files: dict[str, object] = {}
        for op, rendered in emitted:
            files.update(_op_files(op, rendered, snapshot))
        files = _format_python(files)
        report = validated.result() if validated else None
    if only:
        return files
    all_sources = [Source(op.ir.source, op.ir.sha256) for op, _ in emitted]
    # The registry ops() comes from the ONNX version tables too.
    onnx_versions = f"{ONNX_VERSIONS_SOURCE.parent.name}/{ONNX_VERSIONS_SOURCE.name}"
    all_sources.append(Source(onnx_versions, snapshot.sha256(onnx_versions)))
    files["__init__.py"] = emit_package_init([op for op, _ in emitted], all_sources, project_version(manifests.resolve().parent))
    # PEP 561: the package's annotations are meant for type checkers (a banner is not "partial").
    files["py.typed"] = banner([])
    files.update(runtime_files(snapshot))
    for relative, path in VERBATIM_SOURCES.items():
        name = f"{path.parent.name}/{path.name}"
        files[relative] = emit_runtime(snapshot.text(name), Source(name, snapshot.sha256(name)))
    files = _format_python(files)  # the package __init__
    files["REPORT.md"] = emit_report(emitted, skipped, report, files)
    return files


def _rendered_ops(manifests: Path, templates: Path, only: tuple[str, ...], snapshot: Snapshot):
    """(op, its RenderedPasses) of every op with a variant whose templates exist, and the
    (op, variant, missing templates) of the variants left out; an op with no such variant is a
    problem at each pass whose template is missing, and every op's problems are reported together."""
    emitted, skipped, problems = [], [], []
    loaded = selected_ops(manifests, only, snapshot)
    _check_templates(templates, snapshot)
    texts = snapshot.template_texts()
    for op in [resolve_op(op) for op in loaded]:
        # A variant whose templates are not written yet is left out; the op needs at least one.
        missing = [missing_templates(variant, templates, texts) for variant in op.variants]
        ready = tuple(variant for variant, names in zip(op.variants, missing) if not names)
        if not ready:
            problems += _unwritten(op, missing, snapshot.templates)
            continue
        skipped += [(op, variant, names) for variant, names in zip(op.variants, missing) if names]
        op = replace(op, variants=ready)
        try:
            emitted.append((op, list(render_op(op, templates, texts))))
        except CompileError as error:
            problems += error.problems
    if problems:
        raise CompileError(problems)
    return emitted, skipped


def _check_templates(templates: Path, snapshot: Snapshot) -> None:
    """The templates folder must be a folder with templates in it: else a one-problem CompileError,
    before anything renders (every op would be left out, the package empty)."""
    if not templates.is_dir():
        what = "not a folder" if templates.exists() else "no such folder"
        hint = "pass --templates, or keep templates/ beside MANIFESTS"
        raise CompileError([Problem(None, f"{templates}: {what} of *{TEMPLATE_SUFFIX} templates; {hint}")])
    if not snapshot.template_texts():
        raise CompileError([Problem(None, f"{templates}: no *{TEMPLATE_SUFFIX} templates in this folder")])


def _unwritten(op, missing: list[list[str]], folder: str) -> list[Problem]:
    """An op none of whose variants has all its templates: a problem at each pass whose template
    is missing (`missing`: each variant's missing templates)."""
    why = f"no variant of {op.ir.id} has all its templates, so none can be emitted"
    return [
        Problem(pass_.ir.origin, f"template `{folder}/{pass_.ir.template}` does not exist; {why}")
        for variant, names in zip(op.variants, missing)
        for pass_ in variant.passes
        if pass_.ir.template in names
    ]


@contextmanager
def _validator(device):
    """validate() on the caller's device, or in a NagaProcess started now: its device is open by
    the time the shaders are rendered."""
    if device is not None:
        yield lambda rendered: validate(rendered, device)
        return
    with NagaProcess() as naga:
        yield naga.validate


def _op_files(op, rendered, snapshot: Snapshot) -> dict[str, object]:
    """One op package's modules (before black): __init__, cases, shaders and a module a variant."""

    def sources(items) -> list[Source]:
        return [Source(op.ir.source, op.ir.sha256)] + [Source(t, snapshot.sha256(t)) for t in _template_paths(items)]

    package = module_name(op)
    files: dict[str, object] = {f"{package}/__init__.py": emit_op_init(op, rendered, banner(sources(rendered)))}
    folder = f"{snapshot.manifests}/{op.ir.id}"
    case_files = {
        name: (Source(f"{folder}/{name}", snapshot.sha256(f"{folder}/{name}")), snapshot.text(f"{folder}/{name}"))
        for name in CASE_FILES
        if snapshot.has(f"{folder}/{name}")
    }
    cases = emit_cases(op, case_files)
    if cases is not None:
        files[f"{package}/cases.py"] = cases
    store = store_shaders(rendered)
    files[f"{package}/shaders.py"] = emit_shaders_module(op, store, banner(sources(rendered)))
    for variant in op.variants:
        mine = [item for item in rendered if item.variant is variant]
        files[f"{package}/{variant.ir.id}.py"] = emit_variant(op, variant, mine, store, banner(sources(mine)))
    return files


def runtime_files(snapshot: Snapshot) -> dict[str, str]:
    """{_runtime/<module>.py: text}: every module of the runtime package under its banner, verbatim
    (the sources are black-formatted already, so the copies are too)."""
    prefix = f"{RUNTIME_SOURCE.parent.name}/{RUNTIME_SOURCE.name}/"
    return {
        f"_runtime/{path[len(prefix):]}": emit_runtime(snapshot.text(path), Source(path, snapshot.sha256(path)))
        for path in sorted(snapshot.files)
        if path.startswith(prefix)
    }


def _template_paths(rendered) -> list[str]:
    """The templates these passes were rendered from, and the libraries those import, sorted."""
    return sorted({path for item in rendered for path in (item.template, *item.libraries)})


def project_version(repo_root: Path) -> str:
    """`[project] version` of the pyproject.toml beside MANIFESTS (else the compiler's own): the one
    source of the version, which hatchling also writes into the wheel's metadata."""
    for path in (repo_root / "pyproject.toml", OWN_PYPROJECT):
        if path.exists():
            version = tomllib.loads(path.read_text()).get("project", {}).get("version")
            if version:
                return version
    return "0+unknown"


def _format_python(files: dict) -> dict[str, str]:
    """Run black on every generated module, in this process: a process pool saved little once the
    shaders were stored once (about 1.8 s of black in all), and made `build()` fail when imported
    from a script without a `__main__` guard."""
    return {path: format_source(item) for path, item in files.items()}


def _leftovers(files: dict[str, str], out: Path) -> list[Path]:
    """Files we generated earlier that this build no longer writes; anything else is not ours."""
    if not out.exists():
        return []
    found = []
    for path in sorted(out.rglob("*.py")):
        relative = path.relative_to(out).as_posix()
        if relative not in files and "__pycache__" not in relative:
            with path.open() as handle:
                if handle.readline().startswith("# Generated by `python -m codegen"):
                    found.append(path)
    return found


def check_out(out: Path) -> None:
    """OUT is a folder, or a path a folder can be made at: else a one-problem CompileError (the CLI
    asks before it builds; write() and stale() ask again)."""
    existing = next(path for path in (out, *out.absolute().parents) if path.exists())
    if not existing.is_dir():
        reason = "a file, not a folder" if existing == out else f"under {existing}, which is a file"
        raise CompileError([Problem(None, f"{out}: {reason}; OUT is the folder the generated package is written into")])


def write(files: dict[str, str], out: Path, only: bool = False) -> list[str]:
    """Replace files whose bytes changed, each atomically, and delete generated files that are no
    longer built (with `only`, only inside the folders this build wrote). An OUT that is a file or
    cannot be made, or a file where a package folder goes, is a CompileError naming the path and
    the reason, raised before anything is written."""
    check_out(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CompileError([Problem(None, f"{out}: cannot create this folder: {error.strerror or error}")]) from None
    folders = {folder for relative in files for folder in Path(relative).parents if folder != Path(".")}
    in_the_way = [
        Problem(None, f"{out / folder}: a file, where the generated package has a folder")
        for folder in sorted(folders)
        if (out / folder).is_file()
    ]
    if in_the_way:
        raise CompileError(in_the_way)
    return _write_changed(files, out) + _remove_leftovers(files, out, only)


def _write_changed(files: dict[str, str], out: Path) -> list[str]:
    changed = []
    for relative, text in files.items():
        path = out / relative
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            _replace_file(path, text)
            changed.append(relative)
    return changed


def _remove_leftovers(files: dict[str, str], out: Path, only: bool) -> list[str]:
    removed = []
    folders = {Path(relative).parent for relative in files}
    for path in _leftovers(files, out):
        if only and path.relative_to(out).parent not in folders:
            continue
        path.unlink()
        removed.append(f"{path.relative_to(out).as_posix()} (removed)")
    return removed


def _replace_file(path: Path, text: str) -> None:
    """Write through a temporary file beside `path` and os.replace: never a half-written module."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as stream:
            stream.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def stale(files: dict[str, str], out: Path, only: bool = False) -> list[str]:
    """What --check reports: missing, changed, and (within the folders built, with `only`) leftover
    files; an OUT that is a file is a one-problem CompileError."""
    check_out(out)
    found = []
    for relative, text in files.items():
        path = out / relative
        if not path.exists():
            found.append(f"{relative} (missing)")
        elif path.read_text() != text:
            found.append(relative)
    folders = {Path(relative).parent for relative in files}
    found += [
        f"{path.relative_to(out).as_posix()} (not generated any more)"
        for path in _leftovers(files, out)
        if not only or path.relative_to(out).parent in folders
    ]
    return found




def stale_diff(files: dict[str, str], out: Path, limit: int = 3, lines: int = 40) -> str:
    """A unified diff of the first `limit` stale files (committed -> built), cut to `lines` lines each."""
    parts = []
    for relative, text in files.items():
        path = out / relative
        old = path.read_text() if path.exists() else ""
        if old == text:
            continue
        diff = list(difflib.unified_diff(old.splitlines(True), text.splitlines(True), f"{out.name}/{relative}", f"built/{relative}"))
        parts.append("".join(diff[:lines]) + ("...\n" if len(diff) > lines else ""))
        if len(parts) == limit:
            break
    return "\n".join(parts)
