"""What a rendered template body uses, read from its text: its workgroup size, the bytes of its
workgroup arrays, whether it uses subgroups (the render stage's remaining reads of WGSL text;
everything the compiler declares itself, the overrides' types, Params, bindings and `enable`
directives, it knows as data and passes on in each shader's `ShaderInterface`).
"""

from __future__ import annotations

import re

COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
SCALAR_BYTES = {"f32": 4, "u32": 4, "i32": 4, "f16": 2}
SUBGROUP_USE = re.compile(
    r"\bsubgroup[A-Z]\w*\s*\(|@builtin\((subgroup_invocation_id|subgroup_size|subgroup_id|num_subgroups)\)"
)
_WORKGROUP_SIZE = re.compile(r"@workgroup_size\(\s*(\w+)\s*\)")
# The WebGPU device feature each WGSL extension needs: a shader that enables one without it fails
# to compile (a wgpu validation error when the shader module is made).
EXTENSION_FEATURES = {"f16": "shader-f16", "subgroups": "subgroups", "clip_distances": "clip-distances"}


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
