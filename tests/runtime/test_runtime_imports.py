"""The runtime's modules (generated/_runtime/*.py) use each other's public names only, import each
other without a cycle (a function-level import counts: it hides a cycle, it does not remove it), and
each imports only the modules its package docstring lists above it.

Read from the source with `ast`, nothing imported. The counts the issue started from (issue 24 item
4): 45 imports of another module's underscore names, 14 of them re-exported by __init__.py, and a
caps <-> tensors cycle behind function-level imports.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[2] / "generated" / "_runtime"


def _sources() -> dict[str, str]:
    return {path.stem: path.read_text(encoding="utf-8") for path in sorted(RUNTIME.glob("*.py"))}


def _relative_imports(source: str):
    """(module imported, names imported from it) of every `from .x import ...` and `from . import x`,
    function-level ones included."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                yield node.module.split(".")[0], [alias.name for alias in node.names]
            else:
                for alias in node.names:
                    yield alias.name, []


def private_imports(sources: dict[str, str]) -> list[str]:
    """`importer <- module._name` for every underscore name a module imports from another."""
    return [
        f"{importer} <- {module}.{name}"
        for importer, source in sources.items()
        for module, names in _relative_imports(source)
        for name in names
        if name.startswith("_")
    ]


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """{module: the runtime modules it imports}, the package's __init__ left out (it imports all)."""
    return {
        name: {
            module for module, _ in _relative_imports(source) if module in sources and module != "__init__"
        }
        for name, source in sources.items()
        if name != "__init__"
    }


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle found by a depth-first walk, each as the path that closes it (a -> b -> a)."""
    cycles, state = [], {}  # state: 1 while on the walk's path, 2 once done

    def visit(module, path):
        state[module] = 1
        for imported in sorted(graph[module]):
            if state.get(imported) == 1:
                cycles.append(path[path.index(imported) :] + [module, imported])
            elif imported not in state:
                visit(imported, path + [module])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    return cycles


def documented_order(init_source: str) -> list[str]:
    """The modules as the package docstring lists them (``- ``name``: ...``), top to bottom."""
    return re.findall(r"^- ``(\w+)``:", ast.get_docstring(ast.parse(init_source)), re.MULTILINE)


def test_no_module_imports_another_modules_private_name():
    found = private_imports(_sources())
    assert found == [], (
        f"{len(found)} imports of another module's private name; make the shared helper public "
        "(a name without the underscore) in the module that owns it:\n" + "\n".join(found)
    )


def test_runtime_modules_import_each_other_without_a_cycle():
    cycles = import_cycles(import_graph(_sources()))
    assert cycles == [], "import cycles (move what both need below both):\n" + "\n".join(
        " -> ".join(c) for c in cycles
    )


def test_each_module_imports_only_those_listed_above_it():
    sources = _sources()
    order = documented_order(sources["__init__"])
    assert sorted(order) == sorted(m for m in sources if m != "__init__"), (
        "the package docstring of generated/_runtime/__init__.py lists every module once",
        order,
    )
    graph = import_graph(sources)
    wrong = [
        f"{module} imports {imported}, which the docstring lists below it"
        for position, module in enumerate(order)
        for imported in sorted(graph[module])
        if order.index(imported) > position
    ]
    assert wrong == [], "\n".join(wrong)


def test_the_checks_find_a_private_import_and_a_cycle():
    """The checks above on a made-up package: the faults they exist for are found."""
    sources = {
        "__init__": '"""Modules:\n\n- ``low``: x\n- ``high``: y\n"""\nfrom .low import name\n',
        "low": "def f():\n    from .high import _helper  # a cycle hidden in a function\n",
        "high": "from .low import f, _secret\nfrom . import low\n",
    }
    assert private_imports(sources) == ["low <- high._helper", "high <- low._secret"]
    assert import_graph(sources) == {"low": {"high"}, "high": {"low"}}
    assert import_cycles(import_graph(sources)) == [["high", "low", "high"]]
    assert documented_order(sources["__init__"]) == ["low", "high"]
