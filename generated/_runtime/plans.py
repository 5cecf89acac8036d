# SPDX-License-Identifier: Apache-2.0
"""What a generated op package declares (OpContract, TensorSpec, AttributeSpec, ChunkSpec, its
shaders' interfaces and tables) and what planning makes of a call (Request, Plan, PassPlan,
Binding, Chunk); `make_pass` checks every value that reaches a pass's shader.
"""

from __future__ import annotations

import functools
import importlib.resources
import math
import numbers
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from .caps import Caps
from .errors import PlanError
from .limits import fold_width
from .numeric import f32, i32, u32


@dataclass(frozen=True)
class Request:
    """Everything that selection and planning may read about one call."""

    shapes: Mapping[str, tuple]
    dtypes: Mapping[str, str]
    attrs: Mapping[str, object]
    tunables: Mapping[str, object]
    caps: Caps
    outputs: frozenset = frozenset()  # requested outputs, by bind key and by ONNX role
    names: Mapping[str, str] = field(default_factory=dict)  # bind key -> the name the caller used


@dataclass(frozen=True)
class Binding:
    index: int
    name: str
    kind: str  # "input" | "output" | "intermediate" | "uniform"
    resource: str  # bind key, intermediate id, or "params"
    buffer: str  # "read-only-storage" | "storage" | "uniform"


@dataclass(frozen=True)
class PassPlan:
    name: str
    label: str
    template: str
    spec: tuple
    wgsl: str = field(repr=False)
    dispatch: tuple
    uniforms: Mapping[str, object]
    uniform_types: tuple
    overrides: Mapping[str, object]
    override_types: Mapping[str, str]
    bindings: tuple
    workgroup_size: int
    workgroup_storage_bytes: int
    uses_subgroups: bool
    features: tuple = ()  # (WGSL extension, WebGPU feature) the shader's `enable` directives need
    workgroup_size_name: str = ""  # the override that sets the workgroup size ("" for a literal)
    # Computed once when the plan is made, so that a call only looks them up.
    pipeline_constants: tuple = ()  # sorted (override, value) pairs as the pipeline gets them
    uniform_data: bytes = field(default=b"", repr=False)  # the packed Params struct

    @property
    def values(self):
        """Every number the pass's shader gets, whether bound as an override or through Params."""
        return {**self.overrides, **self.uniforms}


@dataclass(frozen=True)
class Plan:
    op: str
    variant: str
    passes: tuple
    inputs: Mapping[str, tuple]
    outputs: Mapping[str, tuple]
    intermediates: Mapping[str, tuple]
    explanation: tuple
    chunks: tuple = ()  # Chunk pieces of a tensor too large for one binding; passes then empty


def _uniform_value(value, kind, what):
    """A Params field's value as the WGSL type holds it: an int for u32 and i32 (a whole number in
    range), a float for f32 (finite)."""
    if kind == "u32":
        return u32(value, what)
    if kind == "i32":
        return i32(value, what)
    return f32(value, what)


def pack_uniforms(uniform_types, uniforms):
    """The bytes of a WGSL uniform struct of u32/i32/f32 fields; padding fields are zero."""
    formats = {"u32": "I", "i32": "i", "f32": "f"}
    values = [
        (
            0
            if name.startswith("_pad") and name not in uniforms
            else _uniform_value(uniforms[name], typ, f"uniform {name}")
        )
        for name, typ in uniform_types
    ]
    return struct.pack("<" + "".join(formats[typ] for _, typ in uniform_types), *values)


WGSL_DTYPES = {"float32": "f32", "float16": "f16"}  # numpy's names -> WGSL's (a Request's dtypes)
NUMPY_DTYPES = {wgsl: name for name, wgsl in WGSL_DTYPES.items()}


@dataclass(frozen=True)
class TensorSpec:
    key: str  # bind key: what `kernel()` takes and returns
    role: str  # ONNX name
    type_var: str
    optional: bool


@dataclass(frozen=True)
class AttributeSpec:
    name: str
    kind: str  # "int" | "float"
    default: object  # None: no default
    required: bool
    allowed: tuple | None
    comparison: str | None  # "float32": compare after rounding to float32


@dataclass(frozen=True)
class ShaderInterface:
    """What one shader file (`<op package>/shaders/<name>.wgsl`) declares, as the compiler's render
    stage made it: the runtime binds, sizes and sets a shader from this record, never from its text."""

    template: str  # the template it was rendered from (repository path)
    overrides: tuple = ()  # (name, "u32" | "f32") in declaration order
    params: tuple = ()  # (field, "u32" | "i32" | "f32") of the Params uniform struct, padding included
    workgroup_size: int | str = 1  # an integer literal (an int) or an override's name (a str)
    workgroup_arrays: tuple = ()  # (bytes per element, factors: integer literals and override names)
    uses_subgroups: bool = False
    features: tuple = ()  # (WGSL extension, WebGPU feature) its `enable` directives need
    bindings: tuple = ()  # (index, WGSL variable) of every binding it declares, in index order


@dataclass(frozen=True)
class Shader:
    """One rendered, validated specialization of a pass's template: its text, the pass's bindings it
    declares (at the indices it gives them), and its interface record."""

    template: str
    key: str  # the shader's name: its file is shaders/<key>.wgsl in the op package
    bindings: tuple
    wgsl: str = field(repr=False)
    interface: ShaderInterface = field(default_factory=lambda: ShaderInterface(""), repr=False)


def shader_file(name: str) -> str:
    """Where shader `name` lies in its op package: the one place that turns a name into a path (the
    compiler writes the file there, the runtime reads it)."""
    return f"shaders/{name}.wgsl"


@functools.lru_cache(maxsize=None)
def shader_text(package: str, name: str) -> str:
    """The WGSL text of shader `name` of an op package (`shader_file(name)`, read once)."""
    return (
        importlib.resources.files(package).joinpath(*shader_file(name).split("/")).read_text(encoding="utf-8")
    )


class ShaderTable(Mapping):
    """{specialization key: Shader} of one pass, from the op's interface records (`shaders.py`) and
    shader files, each made on first use: a call uses one shader a pass, so importing the package
    reads no shader file."""

    def __init__(self, interfaces: Mapping, package: str, template: str, bindings: tuple, names: Mapping):
        self._interfaces = interfaces
        self._package = package
        self._template = template
        self._bindings = bindings
        self._names = dict(names)
        self._made: dict = {}

    def __getitem__(self, key) -> Shader:
        shader = self._made.get(key)
        if shader is None:
            name = self._names[key]
            interface = self._interfaces[name]
            # Two threads may both make it: the same Shader, and either is kept.
            bindings = _declared(self._bindings, interface, name)
            text = shader_text(self._package, name)
            shader = self._made[key] = Shader(self._template, name, bindings, text, interface)
        return shader

    def __contains__(self, key) -> bool:
        return key in self._names  # Mapping's own would make the Shader

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def _declared(bindings: tuple, interface: ShaderInterface, name: str) -> tuple:
    """The pass's `bindings` that shader `name` declares, with the indices it gives them: a binding
    with a manifest `when` is in the shaders where it holds, and the later ones move up."""
    by_name = {b.name: b for b in bindings}
    if any(variable not in by_name for _, variable in interface.bindings):
        # The build checks every shader against its table: this is a generator defect, not a caller's error.
        raise RuntimeError(f"shader {name} declares bindings {interface.bindings}; its table has {bindings}")
    return tuple(replace(by_name[variable], index=index) for index, variable in interface.bindings)


def shader_table(
    interfaces: Mapping, *, package: str, template: str, bindings: tuple, shaders: Mapping
) -> ShaderTable:
    """The ShaderTable of one pass of an op package: `shaders` maps its specialization keys to
    shader names, `interfaces` (the package's `shaders.SHADERS`) a name to its record."""
    return ShaderTable(interfaces, package, template, bindings, shaders)


@dataclass(frozen=True)
class OpContract:
    op: str
    inputs: tuple
    outputs: tuple
    type_constraints: Mapping
    attributes: tuple
    tunables: Mapping
    candidates: tuple
    output_shapes: object
    check_contract: object
    derive: object
    check_derived_contract: object
    chunking: object = None  # ChunkSpec, or None: a tensor over one binding is refused

    def dtype_names(self, request):
        """{bind key: numpy dtype name} of every tensor the request has a shape for."""
        spec_of = {t.key: t for t in self.inputs + self.outputs}
        return {k: NUMPY_DTYPES[request.dtypes[spec_of[k].type_var]] for k in request.shapes}


def _override_value(value, kind, what):
    if kind == "f32":
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise PlanError("plan", what, "finite f32", f"expected a finite number, got {value!r}")
        return float(value)
    return u32(value, what) if kind == "u32" else i32(value, what)


def make_pass(request, shader, name, label, dispatch, uniforms, numbers_=None):
    """A PassPlan from a pass's computed values; checks every value that reaches the shader.

    `uniforms` and `numbers_` hold every Params field and override the pass's shaders may declare;
    the shader takes those its interface names. DISPATCH_FOLD_WIDTH is `fold_width(request.caps)`.
    """
    interface = shader.interface
    numbers_ = {"DISPATCH_FOLD_WIDTH": fold_width(request.caps), **(numbers_ or {})}
    overrides = {
        n: _override_value(numbers_[n], kind, f"{label}: override {n}") for n, kind in interface.overrides
    }

    def factor(term):
        return term if isinstance(term, int) else overrides[term]

    storage = sum(size * math.prod(factor(t) for t in terms) for size, terms in interface.workgroup_arrays)
    try:
        # Each field as its WGSL type holds it: the plan shows an int for a u32, a float for an f32.
        uniforms = {
            n: _uniform_value(uniforms[n], kind, f"uniform {n}")
            for n, kind in interface.params
            if n in uniforms or not n.startswith("_pad")
        }
        uniform_data = pack_uniforms(interface.params, uniforms)
    except PlanError as error:
        raise PlanError(error.op, f"{label}: {error.subject}", error.rule, error.message) from None
    return PassPlan(
        name=name,
        label=label,
        template=shader.template,
        spec=shader.key,
        wgsl=shader.wgsl,
        dispatch=dispatch,
        uniforms=uniforms,
        uniform_types=interface.params,
        overrides=overrides,
        override_types=dict(interface.overrides),
        bindings=shader.bindings,
        workgroup_size=factor(interface.workgroup_size),
        workgroup_storage_bytes=storage,
        uses_subgroups=interface.uses_subgroups,
        features=interface.features,
        workgroup_size_name="" if isinstance(interface.workgroup_size, int) else interface.workgroup_size,
        pipeline_constants=tuple(sorted(overrides.items())),  # converted and checked by _override_value
        uniform_data=uniform_data,
    )


@dataclass(frozen=True)
class ChunkSpec:
    """The manifest's `chunking`: which tensors a request too large for one binding is cut along.

    Either along the batch axis (`batch`, then `channels` within an item) or by rows (`rows`): a
    row is an index of the axes before `row_axis`, flattened, and normalizes on its own.
    """

    batch: tuple = ()  # bind keys cut along axis 0
    channels: tuple = ()  # bind keys cut along axis 1 within one batch item
    per_channel: tuple = ()  # (C) bind keys cut with the channels (copied into scratch)
    groups_attribute: str | None = None  # channels form this many groups; a piece keeps whole groups
    rows: tuple = ()  # bind keys cut into ranges of rows
    repeated_rows: tuple = ()  # cut with `rows`, or bound whole where they repeat over the outer axes
    row_axis: str | int | None = None  # the axis rows end at: an attribute's name, or an axis number
    row_scratch_bytes: int = 0  # scratch every variant keeps a row (its statistics), cut with the rows


@dataclass(frozen=True)
class Chunk:
    """One piece of a chunked plan: the plan of the piece, and where its tensors' bytes lie.

    `slices` binds a range of a whole tensor's buffer; `copies` binds scratch instead, an input's
    range copied into it first, an output's copied from it to its place after (a (C) tensor's range,
    or an item, rarely starts at a multiple of minStorageBufferOffsetAlignment).
    Both map bind keys to (byte offset, byte size).
    """

    plan: Plan
    slices: Mapping[str, tuple]
    copies: Mapping[str, tuple]
