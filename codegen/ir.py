"""The compiler's internal form of a manifest: frozen dataclasses, one per manifest concept.

Both manifest dialects load into these (see manifest.py); every later stage reads only these.
Every object carries the `Origin` it was read from, so any error can name file and JSON pointer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Origin:
    """Where a thing was read from: repository-relative file and RFC 6901 JSON pointer; for a shared
    file (which several manifests include) also the manifest that included it, since the same
    expression can be right in one manifest and wrong in another."""

    file: str
    pointer: str
    included_by: str | None = None

    def child(self, *keys: object) -> Origin:
        parts = [str(k).replace("~", "~0").replace("/", "~1") for k in keys]
        return Origin(self.file, "/".join([self.pointer, *parts]), self.included_by)

    def __str__(self) -> str:
        where = f"{self.file}#{self.pointer}"
        return where if self.included_by is None else f"{where} (included by {self.included_by})"


@dataclass(frozen=True)
class Expr:
    """One manifest expression: a JSON string is Jinja expression source, anything else a literal."""

    source: str | None
    literal: Any
    origin: Origin

    @property
    def is_literal(self) -> bool:
        return self.source is None

    def text(self) -> str:
        """The expression as the manifest wrote it, for comments and error messages."""
        if self.source is not None:
            return self.source
        if isinstance(self.literal, bool):
            return "true" if self.literal else "false"
        return repr(self.literal)


@dataclass(frozen=True)
class Tensor:
    key: str  # the bind key the API uses (`b`, `inputMean`)
    role: str  # the ONNX name (`B`, `input_mean`)
    type_var: str
    rank: Expr | None
    shape: Expr | None  # outputs only: the output's shape expression
    is_output: bool
    optional: bool
    description: str
    origin: Origin
    api_flag: str | None = None  # optional outputs: the plain function's keyword that asks for it


@dataclass(frozen=True)
class Attribute:
    name: str
    default: Any  # None when the attribute has no default
    required: bool
    allowed: tuple | None  # attributeConstraints.values
    comparison: str | None  # "float32": compare allowed values after rounding to float32
    description: str
    origin: Origin


@dataclass(frozen=True)
class Derive:
    """A named value: manifest `derive`, variant `constants`/`derive`, pass `derive`/`source.inputs`."""

    name: str
    expr: Expr


@dataclass(frozen=True)
class UniformField:
    name: str
    type: str  # u32 | i32 | f32
    value: Expr


@dataclass(frozen=True)
class Binding:
    name: str  # the WGSL variable
    kind: str  # input | output | intermediate | uniform
    resource: str  # tensor bind key, intermediate id, or "params"
    buffer: str  # read-only-storage | storage | uniform
    element_type: Expr | None  # "$name" references or WGSL type text; None for uniforms
    struct_name: str | None
    fields: tuple[UniformField, ...]
    origin: Origin
    # Bound only where this holds (a pass-scope boolean, e.g. `hasBias`): the shaders where it
    # does not neither declare nor bind it, and the later bindings take the next indices.
    when: Expr | None = None


@dataclass(frozen=True)
class Dispatch:
    form: str  # threads | workgroups | xyz
    values: tuple[tuple[str, Expr], ...]  # (threads, workgroupSize) | (workgroups, z) | (x, y, z)
    origin: Origin

    def get(self, key: str) -> Expr | None:
        return dict(self.values).get(key)


@dataclass(frozen=True)
class Intermediate:
    id: str
    dtype: str
    shape: Expr


@dataclass(frozen=True)
class Pass:
    id: str
    label: str
    template: str
    derives: tuple[Derive, ...]
    bindings: tuple[Binding, ...]
    dispatch: Dispatch
    subgroup_width: str | None
    origin: Origin


@dataclass(frozen=True)
class Variant:
    id: str
    priority: int
    order: int
    when: tuple[Expr, ...]
    demote_when: tuple[Expr, ...]
    required_features: tuple[str, ...]
    derives: tuple[Derive, ...]
    intermediates: tuple[Intermediate, ...]
    passes: tuple[Pass, ...]
    origin: Origin
    # As Op.pipeline_constants, for this variant's passes only.
    pipeline_constants: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Chunking:
    """How a request too large for one storage binding splits into independent sub-requests.

    `batch` tensors are cut along axis 0 (every item of a batch is independent); when one item is
    still too large, `channels` tensors are cut along axis 1 within an item, with the `(C)`
    tensors in `per_channel` cut alike and, where channels form groups, whole groups kept
    together and `groups_attribute` set to the groups of the piece. Or, for ops that normalize
    rows (the axes before `row_axis`, flattened), `rows` tensors are cut into ranges of rows, and
    `repeated_rows` tensors with them, or bound whole where they repeat over the outer axes.
    `row_axis` is an attribute's name or an axis number (negative counts from the end);
    `row_scratch_bytes`, the scratch every variant keeps a row (its statistics), is cut with the
    rows. Names are bind keys.
    """

    batch: tuple[str, ...]
    channels: tuple[str, ...]
    per_channel: tuple[str, ...]
    groups_attribute: str | None
    origin: Origin
    rows: tuple[str, ...] = ()
    repeated_rows: tuple[str, ...] = ()
    row_axis: str | int | None = None
    row_scratch_bytes: int = 0


@dataclass(frozen=True)
class Op:
    id: str  # the manifest folder: ai.onnx.BatchNormalization
    domain: str
    name: str
    since_version: int
    description: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    attributes: tuple[Attribute, ...]
    type_constraints: tuple[tuple[str, tuple[str, ...]], ...]
    tunables: tuple[tuple[str, Any], ...]
    derives: tuple[Derive, ...]
    variants: tuple[Variant, ...]
    source: str  # repository-relative manifest path
    sha256: str
    chunking: Chunking | None = None
    # The shared files the manifest includes (repository-relative paths, in its `include` order):
    # sources of the generated files as much as the manifest itself.
    includes: tuple[str, ...] = ()
    # Request-dependent values kept as pipeline overrides (the manifest's `pipelineConstants`:
    # name -> why), against the default of binding them at dispatch time through Params.
    pipeline_constants: tuple[tuple[str, str], ...] = ()

    @property
    def tensors(self) -> tuple[Tensor, ...]:
        return self.inputs + self.outputs

    @property
    def title(self) -> str:
        return f"{self.domain} {self.name}-{self.since_version}"
