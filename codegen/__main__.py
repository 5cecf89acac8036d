"""CLI: `python -m codegen MANIFESTS OUT [--check] [--only OP] [-v]`.

Builds the whole generated package in memory (`build`), then writes the files whose bytes
changed, or with `--check` lists every stale file and exits 1.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
import tomllib
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from .emit import REGENERATE, Source, format_source, banner, emit_cases, emit_op_init, emit_package_init, emit_runtime, emit_variant, module_name, sha256_of
from .manifest import ManifestError, load_manifests
from .report import emit_report
from .resolve import resolve_op
from .validate import validate
from .wgsl import missing_templates, render_op

RUNTIME_SOURCE = Path(__file__).with_name("runtime.py")
BENCH_SOURCE = Path(__file__).with_name("bench.py")
ONNX_VERSIONS_SOURCE = Path(__file__).with_name("onnx_versions.py")
# Copied verbatim, each under its name in generated/.
VERBATIM_SOURCES = {
    "bench.py": BENCH_SOURCE,
    "bench_calls.py": Path(__file__).with_name("bench_calls.py"),
    "doctor.py": Path(__file__).with_name("doctor.py"),
    "__main__.py": Path(__file__).with_name("package_main.py"),
    "onnx_nodes.py": Path(__file__).with_name("onnx_nodes.py"),
    "check_model.py": Path(__file__).with_name("check_model.py"),
}
# The compiler's own project: its version is the generated package's when MANIFESTS has none beside it.
OWN_PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


@dataclass(frozen=True)
class Options:
    manifests: Path
    out: Path
    templates: Path
    check: bool
    only: tuple[str, ...]
    verbose: bool


def build(manifests: Path, templates: Path, only: tuple[str, ...] = (), device=None) -> dict[str, str]:
    """Every generated file as {path relative to OUT: text}; raises ManifestError on any problem."""
    repo_root = manifests.resolve().parent
    ops = [resolve_op(op) for op in load_manifests(manifests) if not only or op.id in only or op.name in only]
    files: dict[str, str] = {}
    emitted, skipped, rendered_all = [], [], []
    for op in ops:
        # A variant whose templates are not written yet is left out; the op needs at least one.
        ready = tuple(v for v in op.variants if not missing_templates(v, templates))
        for variant in op.variants:
            if variant not in ready:
                skipped.append((op, variant, missing_templates(variant, templates)))
        if not ready:
            continue
        op = replace(op, variants=ready)
        rendered = list(render_op(op, templates))
        rendered_all.extend(rendered)
        emitted.append((op, rendered))
    report = validate(rendered_all, templates, device) if rendered_all else None
    runtime_source = Source(f"{RUNTIME_SOURCE.parent.name}/{RUNTIME_SOURCE.name}", sha256_of(RUNTIME_SOURCE))
    for op, rendered in emitted:
        template_paths = sorted({item.template for item in rendered})
        sources = [Source(op.ir.source, op.ir.sha256)] + [Source(t, sha256_of(repo_root / t)) for t in template_paths]
        package = module_name(op)
        files[f"{package}/__init__.py"] = emit_op_init(op, rendered, banner(sources))
        cases = emit_cases(op, manifests / op.ir.id, repo_root)
        if cases is not None:
            files[f"{package}/cases.py"] = cases
        for variant in op.variants:
            mine = [item for item in rendered if item.variant is variant]
            variant_sources = [Source(op.ir.source, op.ir.sha256)] + [
                Source(t, sha256_of(repo_root / t)) for t in sorted({item.template for item in mine})
            ]
            files[f"{package}/{variant.ir.id}.py"] = emit_variant(op, variant, mine, banner(variant_sources))
    all_sources = [Source(op.ir.source, op.ir.sha256) for op, _ in emitted]
    # The registry ops() comes from the ONNX version tables too.
    all_sources.append(Source(f"{ONNX_VERSIONS_SOURCE.parent.name}/{ONNX_VERSIONS_SOURCE.name}", sha256_of(ONNX_VERSIONS_SOURCE)))
    files["__init__.py"] = emit_package_init([op for op, _ in emitted], all_sources, project_version(repo_root))
    # PEP 561: the package's annotations are meant for type checkers (a banner is not "partial").
    files["py.typed"] = banner([])
    files["_runtime.py"] = emit_runtime(RUNTIME_SOURCE.read_text(), runtime_source)
    for relative, path in VERBATIM_SOURCES.items():
        files[relative] = emit_runtime(path.read_text(), Source(f"{path.parent.name}/{path.name}", sha256_of(path)))
    files = _format_python(files)
    files["REPORT.md"] = emit_report(emitted, skipped, report, files)
    return files


def project_version(repo_root: Path) -> str:
    """`[project] version` of the pyproject.toml beside MANIFESTS (else the compiler's own): the one
    source of the version, read by the wheel build too (build_backend/)."""
    for path in (repo_root / "pyproject.toml", OWN_PYPROJECT):
        if path.exists():
            version = tomllib.loads(path.read_text()).get("project", {}).get("version")
            if version:
                return version
    return "0+unknown"


def _format_python(files: dict) -> dict[str, str]:
    """Run black on every generated module, across the machine's cores (same bytes either way)."""
    items = list(files.items())
    workers = min(os.cpu_count() or 1, 8)
    if workers > 1:
        # spawn, not fork: forking a process that holds a wgpu device can deadlock the child.
        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            texts = list(pool.map(format_source, [item for _, item in items], chunksize=1))
    else:
        texts = [format_source(item) for _, item in items]
    return {path: text for (path, _), text in zip(items, texts)}


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


def write(files: dict[str, str], out: Path) -> list[str]:
    """Replace files whose bytes changed and delete generated files that are no longer built."""
    changed = []
    for relative, text in files.items():
        path = out / relative
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            changed.append(relative)
    for path in _leftovers(files, out):
        path.unlink()
        changed.append(f"{path.relative_to(out).as_posix()} (removed)")
    return changed


def stale(files: dict[str, str], out: Path) -> list[str]:
    found = []
    for relative, text in files.items():
        path = out / relative
        if not path.exists():
            found.append(f"{relative} (missing)")
        elif path.read_text() != text:
            found.append(relative)
    found += [f"{path.relative_to(out).as_posix()} (not generated any more)" for path in _leftovers(files, out)]
    return found


def parse_args(argv: list[str]) -> Options:
    parser = argparse.ArgumentParser(prog="python -m codegen", description=__doc__.splitlines()[0])
    parser.add_argument("manifests", type=Path, help="folder of <op id>/manifest.json")
    parser.add_argument("out", type=Path, help="the generated package folder")
    parser.add_argument("--templates", type=Path, default=None, help="template folder (default: templates/ beside MANIFESTS)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 listing stale files")
    parser.add_argument("--only", action="append", default=[], help="op id or name to build (repeatable)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    templates = args.templates or args.manifests.resolve().parent / "templates"
    return Options(args.manifests, args.out, templates, args.check, tuple(args.only), args.verbose)


def main(argv: list[str] | None = None) -> int:
    options = parse_args(sys.argv[1:] if argv is None else argv)
    started = time.perf_counter()
    try:
        files = build(options.manifests, options.templates, options.only)
    except ManifestError as error:
        print("codegen failed:", file=sys.stderr)
        for problem in error.problems:
            print(f"  {problem}", file=sys.stderr)
        return 2
    if options.check:
        found = stale(files, options.out)
        if found:
            print(f"{options.out}/ is stale; regenerate with `{REGENERATE}`:", file=sys.stderr)
            for item in found:
                print(f"  {item}", file=sys.stderr)
            return 1
        print(f"{options.out}/ is up to date ({len(files)} files)")
        return 0
    changed = write(files, options.out)
    elapsed = time.perf_counter() - started
    print(f"wrote {len(changed)} of {len(files)} files to {options.out}/ in {elapsed:.2f} s")
    if options.verbose:
        for item in changed:
            print(f"  {item}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
