"""What the expression compiler's tests share: a small hand-built Scope and the request it stands for,
`compile_source` / `evaluate` (the compiled Python run with `eval` in a namespace that holds only
what the code says it needs), `compile_error` (which checks that the error names the file, JSON
pointer and expression), and a tiny manifest resolved through load_manifest + resolve_op.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from generated import _runtime as runtime
from codegen.expr import Compiled, ExprError, Scope, Symbol, compile_expr
from codegen.ir import Expr, Origin
from codegen.manifest import load_manifest
from codegen.resolve import resolve_op

FILE = "manifests/test.Expr/manifest.json"
POINTER = "/derive/value"
ORIGIN = Origin(FILE, POINTER)


def _symbol(python: str, kind: str, *locals_: str) -> Symbol:
    return Symbol(python, kind, frozenset(locals_))


SYMBOLS = {
    ("shapes", "X"): _symbol("shape_x", "shape", "shape_x"),
    ("shapes", "Y"): _symbol("shape_y", "shape", "shape_y"),
    ("ranks", "X"): _symbol("len(shape_x)", "int", "shape_x"),
    ("attrs", "n"): _symbol("attr_n", "int", "attr_n"),
    ("attrs", "zero"): _symbol("attr_zero", "int", "attr_zero"),
    ("attrs", "eps"): _symbol("attr_eps", "float", "attr_eps"),
    ("dtypes", "T"): _symbol("dtype_t", "str", "dtype_t"),
    ("device", "features"): _symbol("features", "set", "features"),
    ("device", "adapterInfo"): _symbol("adapter_info", "map", "adapter_info"),
    ("device", "adapterInfo", "k"): _symbol('adapter_info["k"]', "int", "adapter_info"),
    ("device", "limits", "maxComputeWorkgroupSizeX"): _symbol(
        'limits["maxComputeWorkgroupSizeX"]', "int", "limits"
    ),
    ("flag",): _symbol("flag", "bool", "flag"),
}

# What the generated preamble would define for one request.
LOCALS = {
    "shape_x": (2, 3, 4, 5),
    "shape_y": (2, 3, 4, 6),
    "attr_n": 3,
    "attr_zero": 0,
    "attr_eps": 1e-05,
    "dtype_t": "f16",
    "features": frozenset({"shader-f16"}),
    "adapter_info": {"k": 7},
    "limits": {"maxComputeWorkgroupSizeX": 256},
    "flag": True,
}

SCOPE = Scope(SYMBOLS.get, lambda: ", ".join(".".join(path) for path in SYMBOLS))


def compile_source(source: str, expect=None, scope: Scope = SCOPE) -> Compiled:
    return compile_expr(Expr(source, None, ORIGIN), scope, expect)


def run(code: Compiled, **overrides):
    """Evaluate compiled Python with only the helpers and locals the compiled code declares."""
    names = {}
    for helper in code.helpers:
        names[helper] = math if helper == "math" else getattr(runtime, helper)
    values = {**LOCALS, **overrides}
    local_names = {name: values[name] for name in code.locals}
    return eval(code.python, names, local_names)  # noqa: S307 - the compiler's output under test


def evaluate(source: str, **overrides):
    return run(compile_source(source), **overrides)


def compile_error(source: str, expect=None) -> ExprError:
    with pytest.raises(ExprError) as info:
        compile_source(source, expect)
    error = info.value
    text = str(error)
    # Every compile error names file, JSON pointer and the expression, in that layout.
    assert text.startswith(f"{FILE}#{POINTER}: "), text
    assert text.endswith(f": `{source}`"), text
    assert error.origin == ORIGIN and error.source == source
    return error


def tiny_manifest(**changes) -> dict:
    data = {
        "domain": "test",
        "name": "Expr",
        "sinceVersion": 1,
        "inputs": {"x": {"dtype": "T"}},
        "outputs": {"y": {"dtype": "T", "shape": "shapes.x"}},
        "typeConstraints": {"T": ["float32"]},
        "derive": {"rows": "dim(shapes.x, 0)", "wide": "rows > 4"},
        "variants": [{"id": "only", "when": ["wide"]}],
    }
    data.update(changes)
    return data


def resolve_tiny(tmp_path: Path, data: dict):
    folder = tmp_path / "manifests" / "test.Expr"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").write_text(json.dumps(data, indent=1))
    return resolve_op(load_manifest(folder / "manifest.json", tmp_path))
