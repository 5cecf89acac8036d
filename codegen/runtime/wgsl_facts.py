"""What a WGSL text declares, read from the text itself: its overrides and their types, its
workgroup size, the bytes of its workgroup arrays, whether it uses subgroups, the fields of
its uniform struct, its bindings, and the device features its `enable` directives need.

The compiler reads a rendered shader with these same functions, so a generated
shader table need not restate what its WGSL already says; `shader_facts()` reads each distinct
text once. `snake()` is the Python name the generated code gives a WGSL or manifest name.
"""

from __future__ import annotations

import functools
import keyword
import re
from typing import NamedTuple

COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
SCALAR_BYTES = {"f32": 4, "u32": 4, "i32": 4, "f16": 2}
SUBGROUP_USE = re.compile(
    r"\bsubgroup[A-Z]\w*\s*\(|@builtin\((subgroup_invocation_id|subgroup_size|subgroup_id|num_subgroups)\)"
)
_OVERRIDE = re.compile(r"^override\s+(\w+)\s*:\s*(\w+)\s*;", re.M)
_WORKGROUP_SIZE = re.compile(r"@workgroup_size\(\s*(\w+)\s*\)")
_UNIFORM = re.compile(r"var<uniform>\s+\w+\s*:\s*(\w+)\s*;")
_BINDING = re.compile(r"@group\(0\)\s*@binding\((\d+)\)\s*var(?:<[^>]*>)?\s+(\w+)")
_ENABLE = re.compile(r"^\s*enable\s+([\w\s,]+?)\s*,?\s*;", re.M)
# The WebGPU device feature each WGSL extension needs: a shader that enables one without it fails
# to compile (a wgpu validation error when the shader module is made).
EXTENSION_FEATURES = {"f16": "shader-f16", "subgroups": "subgroups", "clip_distances": "clip-distances"}


class ShaderFacts(NamedTuple):
    overrides: tuple  # (name, "u32" | "f32" | "i32"), in declaration order
    workgroup_size: str  # an override name or an integer literal; "" when the text has none
    workgroup_arrays: tuple  # (bytes per element, factors: override names or integer literals)
    uses_subgroups: bool
    uniform_types: tuple  # (field, type) of the uniform struct, padding included; () without one


def snake(name: str) -> str:
    """`normalizationParamsOk` -> `normalization_params_ok`; `WORKGROUP_SIZE` -> `workgroup_size`."""
    text = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()
    text = re.sub(r"[^a-z0-9_]", "_", text)
    if keyword.iskeyword(text) or text[:1].isdigit():
        text += "_"
    return text


def code_of(text: str) -> str:
    """`text` with its comments blanked (line breaks kept)."""
    return COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def element_bytes(wgsl_type: str) -> int:
    match = re.fullmatch(r"\s*(?:vec([234])<\s*(\w+)\s*>|atomic<\s*(\w+)\s*>|(\w+))\s*", wgsl_type)
    if not match:
        raise ValueError(f"workgroup element type `{wgsl_type}` is not a scalar or vector")
    scalar = match.group(3) or match.group(4)  # atomic<T> is as wide as T
    if scalar:
        return SCALAR_BYTES[scalar]
    lanes = int(match.group(1))
    return SCALAR_BYTES[match.group(2)] * (4 if lanes == 3 else lanes)


def workgroup_arrays(code: str) -> tuple:
    """Bytes of every `var<workgroup>`, as element size times factors that are overrides or literals."""
    arrays = []
    for match in re.finditer(r"var<workgroup>\s+\w+\s*:\s*([^;]+);", code):
        declared = match.group(1).strip()
        array = re.fullmatch(r"array<\s*(.+?)\s*,\s*([\w\s*]+?)\s*>", declared)
        if array is None:
            arrays.append((element_bytes(declared), ()))
            continue
        factors = tuple(
            f.strip().rstrip("u") if f.strip()[:1].isdigit() else f.strip() for f in array.group(2).split("*")
        )
        arrays.append((element_bytes(array.group(1)), factors))
    return tuple(arrays)


def workgroup_size(code: str) -> str:
    """The one `@workgroup_size(NAME)` of the code: an override name, or a literal without its `u`."""
    size = _WORKGROUP_SIZE.search(code)
    if size is None:
        return ""
    return size.group(1).rstrip("u") if size.group(1)[0].isdigit() else size.group(1)


def uniform_types(code: str) -> tuple:
    """(field, type) of the struct the `var<uniform>` binding has, in order."""
    uniform = _UNIFORM.search(code)
    if uniform is None:
        return ()
    struct = re.search(rf"\bstruct\s+{uniform.group(1)}\s*\{{([^}}]*)\}}", code)
    fields = [field.split(":") for field in struct.group(1).split(",") if field.strip()]
    return tuple((name.strip(), typ.strip()) for name, typ in fields)


@functools.lru_cache(maxsize=None)
def shader_facts(text: str) -> ShaderFacts:
    """What the WGSL `text` declares (see ShaderFacts); read once per distinct text."""
    code = code_of(text)
    return ShaderFacts(
        overrides=tuple(_OVERRIDE.findall(code)),
        workgroup_size=workgroup_size(code),
        workgroup_arrays=workgroup_arrays(code),
        uses_subgroups=bool(SUBGROUP_USE.search(code)),
        uniform_types=uniform_types(code),
    )


@functools.lru_cache(maxsize=None)
def declared_bindings(text: str) -> tuple:
    """(index, WGSL variable) of every binding the text declares, in index order."""
    return tuple(sorted((int(index), name) for index, name in _BINDING.findall(code_of(text))))


@functools.lru_cache(maxsize=None)
def required_features(text: str) -> tuple:
    """(extension, WebGPU feature) of every `enable` directive of the text, in order."""
    extensions = [name.strip() for names in _ENABLE.findall(code_of(text)) for name in names.split(",")]
    return tuple((e, EXTENSION_FEATURES.get(e, e)) for e in extensions if e)
