"""The generated package reads like hand-written code: no unused names, honest annotations."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

GENERATED = Path(__file__).resolve().parent.parent / "generated"
MODULES = sorted(GENERATED.rglob("*.py"))


def test_pyflakes_finds_nothing_in_the_generated_package():
    from pyflakes.api import checkPath
    from pyflakes.reporter import Reporter

    class Collect(Reporter):
        def __init__(self):
            self.found = []

        def flake(self, message):
            self.found.append(str(message))

        def unexpectedError(self, filename, message):
            self.found.append(f"{filename}: {message}")

        def syntaxError(self, filename, message, *args):
            self.found.append(f"{filename}: {message}")

    reporter = Collect()
    for path in MODULES:
        checkPath(str(path), reporter)
    assert reporter.found == []


@pytest.mark.parametrize("path", [p for p in MODULES if p.parent != GENERATED], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_derived_integers_are_annotated_int(path):
    """A NamedTuple field holding a derived integer (a count, a stride) says `int`, not `float`."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name in ("Derived", "Values"):
            for field in node.body:
                if isinstance(field, ast.AnnAssign) and field.target.id.endswith(("_count", "_stride", "_size")):
                    assert ast.unparse(field.annotation) in ("int", "bool"), f"{path.name}: {field.target.id}"
