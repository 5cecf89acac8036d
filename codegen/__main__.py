"""CLI: `python -m codegen MANIFESTS OUT [--check] [--only OP] [-v]`.

Only parses the arguments and prints: `build.build()` makes the files in memory, `build.write()`
replaces those whose bytes changed, or with `--check` `build.stale()` lists every stale file and
the command exits 1. Problems (the sources', an OUT that is a file or cannot be written) are
printed one a line and the command exits 2.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .build import build, check_out, lacks_hand_written_part, stale, write
from .emit import REGENERATE
from .problems import CompileError


@dataclass(frozen=True)
class Options:
    """The parsed command line."""

    manifests: Path
    out: Path
    templates: Path
    check: bool
    only: tuple[str, ...]
    verbose: bool


def parse_args(argv: list[str]) -> Options:
    parser = argparse.ArgumentParser(prog="python -m codegen", description=__doc__.splitlines()[0])
    parser.add_argument("manifests", type=Path, help="folder of <op id>/manifest.json")
    parser.add_argument("out", type=Path, help="the generated package folder")
    parser.add_argument(
        "--templates", type=Path, default=None, help="template folder (default: templates/ beside MANIFESTS)"
    )
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 listing stale files")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        help="op id, name or module name to build (repeatable): writes only that op's files",
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    templates = args.templates or args.manifests.resolve().parent / "templates"
    return Options(args.manifests, args.out, templates, args.check, tuple(args.only), args.verbose)


def main(argv: list[str] | None = None) -> int:
    options = parse_args(sys.argv[1:] if argv is None else argv)
    started = time.perf_counter()
    try:
        check_out(options.out)
        files = build(options.manifests, options.templates, options.only)
        if options.check:
            return print_stale(options, files)
        changed = write(files, options.out, only=bool(options.only))
    except CompileError as error:
        print_problems(error)
        return 2
    elapsed = time.perf_counter() - started
    print(f"wrote {len(changed)} of {len(files)} files to {options.out}/ in {elapsed:.2f} s")
    if lacks_hand_written_part(options.out):
        print(
            f"note: {options.out}/ has no hand-written runtime (__init__.py, _runtime/): the compiler writes only "
            "the generated files; copy the repository's generated/ there first for a package that runs"
        )
    if options.verbose:
        for item in changed:
            print(f"  {item}")
    return 0


def print_stale(options: Options, files: dict[str, str]) -> int:
    """--check: 1 listing every stale file with the command that fixes them, else 0."""
    found = stale(files, options.out, only=bool(options.only))
    if found:
        print(f"{options.out}/ is stale; regenerate with `{REGENERATE}`:", file=sys.stderr)
        for item in found:
            print(f"  {item}", file=sys.stderr)
        return 1
    print(f"{options.out}/ is up to date ({len(files)} files)")
    return 0


def print_problems(error: CompileError) -> None:
    """One problem a paragraph: its first line at its location, any more (naga's report) indented below."""
    count = len(error.problems)
    print(f"codegen failed: {count} problem{'s' if count != 1 else ''}", file=sys.stderr)
    for problem in error.problems:
        first, *rest = str(problem).splitlines() or [""]
        print(f"  {first}", file=sys.stderr)
        for line in rest:
            print(f"      {line}" if line else "", file=sys.stderr)


if __name__ == "__main__":
    # One build, then the process ends: Python's cycle collector would walk the build's objects
    # again and again (black's syntax trees above all: about 0.5 s of 3.2 on 2 cores) to free
    # memory that the exit frees anyway (the peak grows from about 120 to 205 MB). Frozen, the
    # objects are also left out of the collection the interpreter runs on its way out, which with
    # the collector off would walk them all (0.6 s). The build's output is the same either way.
    gc.disable()
    status = main()
    gc.freeze()
    sys.exit(status)
