"""Every shader's interface record (`<op>/shaders.py`) against the WGSL text it describes.

The compiler never reads a fact back from rendered WGSL: templates declare them (`value.X`,
`shader.workgroup_size`, `shader.workgroup_array`, `shader.uses_subgroups`, ...; docs/TEMPLATES.md)
and the render stage writes the declarations and the record from the same data. This test is the
independent check that the two agree: it reads each shader file with its own small WGSL patterns
(overrides, Params, bindings, the workgroup size and workgroup arrays, subgroup and f16 use) and
compares every field of the record with what the text says.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path

import pytest

from generated._runtime import ShaderInterface

GENERATED = Path(__file__).resolve().parents[2] / "generated"
OPS = ("batch_normalization", "group_normalization", "instance_normalization", "skip_group_norm")

COMMENT = re.compile(r"//[^\n]*")
SCALAR_BYTES = {"f32": 4, "u32": 4, "i32": 4, "f16": 2}
SUBGROUP_USE = re.compile(
    r"\bsubgroup[A-Z]\w*\s*\(|@builtin\((?:subgroup_invocation_id|subgroup_size|subgroup_id|num_subgroups)\)"
)


def _stride(wgsl_type: str) -> int:
    """Bytes an array element of a scalar, vector or atomic type takes."""
    vector = re.fullmatch(r"vec([234])<(\w+)>", wgsl_type)
    if vector:
        lanes = int(vector.group(1))
        return SCALAR_BYTES[vector.group(2)] * (4 if lanes == 3 else lanes)
    atomic = re.fullmatch(r"atomic<(\w+)>", wgsl_type)
    return SCALAR_BYTES[atomic.group(1) if atomic else wgsl_type]


def _size_term(term: str) -> int | str:
    term = term.strip()
    return int(term.rstrip("u")) if term[0].isdigit() else term


def interface_of_text(text: str, template: str) -> ShaderInterface:
    """What the WGSL text of a shader file declares, read from the text itself."""
    code = COMMENT.sub("", text)
    overrides = tuple(re.findall(r"^override (\w+): (\w+);$", code, re.M))
    struct = re.search(r"^struct Params \{ (.*) \}$", code, re.M)
    params = tuple(tuple(f.split(": ")) for f in struct.group(1).split(", ")) if struct else ()
    bindings = tuple((int(i), name) for i, name in re.findall(r"@binding\((\d+)\) var<[^>]*> (\w+):", code))
    sizes = re.findall(r"@workgroup_size\(([^)]*)\)", code)
    assert len(sizes) == 1 and "," not in sizes[0], f"{template}: workgroup sizes {sizes}"
    arrays = []
    for declared in re.findall(r"var<workgroup>\s+\w+\s*:\s*([^;]+);", code):
        array = re.fullmatch(r"array<\s*(.+?)\s*,\s*([\w\s*]+?)\s*>", declared.strip())
        if array is None:
            arrays.append((_stride(declared.strip()), ()))
        else:
            factors = tuple(_size_term(t) for t in array.group(2).split("*"))
            arrays.append((_stride(array.group(1)), factors))
    enables = re.findall(r"^enable (\w+);$", code, re.M)
    return ShaderInterface(
        template=template,
        overrides=overrides,
        params=params,
        workgroup_size=_size_term(sizes[0]),
        workgroup_arrays=tuple(arrays),
        uses_subgroups=SUBGROUP_USE.search(code) is not None,
        features=tuple((e, {"f16": "shader-f16"}[e]) for e in enables),
        bindings=bindings,
    )


def mismatches(record: ShaderInterface, text: str) -> list[str]:
    """The fields in which a record and its shader's text disagree, and the code's own rules: every
    declared override is read, f16 is enabled exactly where the code names it."""
    found = interface_of_text(text, record.template)
    wrong = [
        f"{field.name}: record {getattr(record, field.name)!r}, text {getattr(found, field.name)!r}"
        for field in dataclasses.fields(ShaderInterface)
        if getattr(record, field.name) != getattr(found, field.name)
    ]
    code = COMMENT.sub("", text)
    body = "\n".join(line for line in code.splitlines() if not line.startswith(("override ", "enable ")))
    for name, _ in record.overrides:
        if not re.search(rf"(?<![\w.]){name}\b", body):
            wrong.append(f"override {name} is declared and never read")
    names_f16 = re.search(r"\bf16\b", body) is not None
    if names_f16 != (("f16", "shader-f16") in record.features):
        wrong.append(f"the code {'names' if names_f16 else 'does not name'} f16; features {record.features}")
    return wrong


def _shaders(op: str):
    package = importlib.import_module(f"generated.{op}.shaders")
    for name, record in package.SHADERS.items():
        yield name, record, (GENERATED / op / "shaders" / f"{name}.wgsl").read_text()


@pytest.mark.parametrize("op", OPS)
def test_every_record_matches_its_shader_text(op):
    checked, wrong = 0, []
    for name, record, text in _shaders(op):
        wrong += [f"{name}: {w}" for w in mismatches(record, text)]
        checked += 1
    files = sorted(p.stem for p in (GENERATED / op / "shaders").glob("*.wgsl"))
    assert (
        sorted(name for name, _, _ in _shaders(op)) == files
    ), "a shader file without a record, or one too many"
    assert checked > 0 and wrong == []


def test_the_check_finds_a_record_that_disagrees_with_its_text():
    """Each field the test compares, changed in one record, is found (the check can fail)."""
    name, record, text = next(
        item
        for item in _shaders("group_normalization")
        if item[1].uses_subgroups and item[1].workgroup_arrays
    )
    assert mismatches(record, text) == []
    changes = {
        "overrides": record.overrides + (("extra", "u32"),),
        "params": record.params[:-1],
        "workgroup_size": 64,
        "workgroup_arrays": record.workgroup_arrays[1:],
        "uses_subgroups": False,
        "features": (("f16", "shader-f16"),) if not record.features else (),
        "bindings": record.bindings[:-1],
    }
    for field, value in changes.items():
        found = mismatches(dataclasses.replace(record, **{field: value}), text)
        assert any(w.startswith(field) for w in found), (name, field, found)
