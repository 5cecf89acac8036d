"""Load stage: manifest JSON (either dialect) -> ir.Op, with problems that name file and JSON pointer.

Two dialects are real and both load into one form (docs/MANIFEST.md):

* list dialect (seeds 000, 002): `inputs`/`outputs` are lists with `role`, bind keys come from
  `args`, binding lists are named in `bindingSets`, attribute and tunable defaults are plain values,
  variants carry `constants` and passes carry `source: {shader, inputs}`;
* keyed dialect (seed 003): `inputs`/`outputs` are keyed by bind key (`onnx` gives the role), a
  top-level `bindings` pool is referenced by key or overridden inline, defaults are `{default: v}`,
  variants and passes carry `derive`, variants `requires` and `demoteWhen`.

A manifest is first checked against the JSON Schema (schema.py): the reader below runs only on one
that fits, so it reads keys and kinds without checking them, and reports only what a schema cannot
say: names that must refer to something (a binding set, a pool key, a tensor, an attribute).

A manifest may `include` shared files (`_shared/<name>.json` in the manifests folder): their
tunables and derived values join the manifest's own, first, as if written there; a name defined
twice is a problem, so a reader of a manifest finds each name in exactly one place.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .ir import (
    Attribute,
    Binding,
    Chunking,
    Derive,
    Dispatch,
    Expr,
    Intermediate,
    Op,
    Origin,
    Pass,
    Tensor,
    UniformField,
    Variant,
)
from .problems import CompileError, Problem, closest
from .schema import schema_problems
from .sources import SHARED_FOLDER, relative_path

# The dispatch forms, by the key that picks each, and the keys each takes (docs/MANIFEST.md, "Dispatch").
DISPATCH_FORMS = {
    "threads": ("threads", "workgroupSize"),
    "workgroups": ("workgroups", "z"),
    "x": ("x", "y", "z"),
}


class _Reader:
    """Reads one schema-valid manifest, collecting the problems of its cross-references."""

    def __init__(self, data: dict, root: Origin):
        self.data = data
        self.root = root
        self.problems: list[Problem] = []

    def fail(self, origin: Origin, message: str) -> None:
        self.problems.append(Problem(origin, message))

    def unknown(self, origin: Origin, what: str, name: str, known) -> None:
        """`name` refers to nothing of its kind: say so, with the closest known name or the list."""
        known = sorted(known)
        suggestion = closest(name, known)
        hint = (
            f"did you mean `{suggestion}`?"
            if suggestion
            else f"known: {', '.join(known) if known else 'none'}"
        )
        self.fail(origin, f"unknown {what} `{name}`; {hint}")

    @staticmethod
    def expr(value: Any, origin: Origin) -> Expr:
        """A JSON string is expression source; a number or a boolean a literal (the schema allows no other)."""
        return Expr(value, None, origin) if isinstance(value, str) else Expr(None, value, origin)

    def derives(self, table: dict | None, origin: Origin) -> tuple[Derive, ...]:
        return tuple(Derive(name, self.expr(v, origin.child(name))) for name, v in (table or {}).items())

    @staticmethod
    def plain_default(value: Any) -> Any:
        """The keyed dialect writes `{default: v}`, the list dialect plain `v`."""
        return value.get("default") if isinstance(value, dict) else value


@dataclass(frozen=True)
class _Shared:
    """A shared file one manifest includes, read and checked against the schema's `shared`."""

    source: str  # repository-relative path
    data: dict
    root: Origin  # its whole file, included by the manifest


def load_manifest(
    path: Path, repo_root: Path, raw: bytes | None = None, files: Mapping[str, bytes] | None = None
) -> Op:
    """Read one manifest file (or its bytes `raw`, already read) into an `ir.Op`, with the shared
    files it includes (from `files`, {repository-relative path: bytes} as sources.Snapshot holds
    them, when given); raises CompileError listing every problem."""
    source = relative_path(path, repo_root.resolve())
    root = Origin(source, "")
    raw = path.read_bytes() if raw is None else raw
    data = _parsed(raw, root)
    shape_problems = schema_problems(data, source)
    if shape_problems:
        raise CompileError(shape_problems)
    reader = _Reader(data, root)
    shared = _read_shared(reader, path.parent.parent, repo_root, files)
    op = _op(reader, shared, path.parent.name, source, hashlib.sha256(raw).hexdigest())
    if reader.problems:
        raise CompileError(reader.problems)
    return op


def _parsed(raw: bytes, root: Origin) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as error:
        raise CompileError([Problem(root, f"not valid JSON: {error}")]) from None


def _read_shared(
    reader: _Reader, manifests_dir: Path, repo_root: Path, files: Mapping[str, bytes] | None
) -> tuple[_Shared, ...]:
    """The files of the manifest's `include` that exist and fit the schema, in its order; the
    problems of the others join the reader's, so the manifest's own are reported too."""
    root, shared = reader.root, []
    folder = relative_path(manifests_dir, repo_root.resolve())
    for i, name in enumerate(reader.data.get("include", ())):
        relative = f"{folder}/{name}"
        raw = _shared_bytes(manifests_dir / name, relative, files)
        if raw is None:
            known = _shared_names(manifests_dir, folder, files)
            reader.unknown(root.child("include", i), "shared file", name, known)
            continue
        file_root = Origin(relative, "", root.file)
        try:
            content = _parsed(raw, file_root)
        except CompileError as error:
            reader.problems.extend(error.problems)
            continue
        found = schema_problems(content, relative, definition="shared", included_by=root.file)
        reader.problems.extend(found)
        if not found:
            shared.append(_Shared(relative, content, file_root))
    return tuple(shared)


def _shared_bytes(path: Path, relative: str, files: Mapping[str, bytes] | None) -> bytes | None:
    """A shared file's bytes: from `files` (the snapshot's) when given, else from disk."""
    if files is not None:
        return files.get(relative)
    return path.read_bytes() if path.is_file() else None


def _shared_names(manifests_dir: Path, folder: str, files: Mapping[str, bytes] | None) -> list[str]:
    """The shared files there are, as `include` names them (`_shared/<name>.json`)."""
    prefix = f"{folder}/{SHARED_FOLDER}/"
    if files is not None:
        return sorted(path[len(folder) + 1 :] for path in files if path.startswith(prefix))
    paths = (manifests_dir / SHARED_FOLDER).glob("*.json")
    return sorted(f"{SHARED_FOLDER}/{p.name}" for p in paths if p.is_file())


def _defined_once(reader: _Reader, entries: list[tuple[str, Origin, Any]], what: str) -> list[Any]:
    """The values of (name, origin, value) entries, each name's first; a name defined again is a
    problem at the repeat, naming the first definition."""
    first: dict[str, Origin] = {}
    kept = []
    for name, origin, value in entries:
        if name in first:
            reader.fail(
                origin, f"{what} `{name}` is defined twice (also at {first[name]}); a name has one definition"
            )
            continue
        first[name] = origin
        kept.append(value)
    return kept


def _definitions(reader: _Reader, shared: tuple[_Shared, ...]) -> list[tuple[dict, Origin]]:
    """(data, root) of the shared files, in `include` order, then of the manifest itself."""
    return [(item.data, item.root) for item in shared] + [(reader.data, reader.root)]


def _tunables(reader: _Reader, shared: tuple[_Shared, ...]) -> tuple[tuple[str, Any], ...]:
    """The shared files' tunables, then the manifest's own: name -> default."""
    entries = [
        (name, root.child("tunables", name), (name, reader.plain_default(value)))
        for data, root in _definitions(reader, shared)
        for name, value in data.get("tunables", {}).items()
    ]
    return tuple(_defined_once(reader, entries, "tunable"))


def _derives(reader: _Reader, shared: tuple[_Shared, ...]) -> tuple[Derive, ...]:
    """The shared files' derived values, then the manifest's own (the compiler orders them by use)."""
    derives = [
        d
        for data, root in _definitions(reader, shared)
        for d in reader.derives(data.get("derive"), root.child("derive"))
    ]
    entries = [(d.name, d.expr.origin, d) for d in derives]
    return tuple(_defined_once(reader, entries, "derived value"))


def _op(reader: _Reader, shared: tuple[_Shared, ...], op_id: str, source: str, sha256: str) -> Op:
    data, root = reader.data, reader.root
    inputs, outputs = _tensors(reader)
    tensors = {t.key: t for t in inputs + outputs}
    attributes = _attributes(data, root)
    return Op(
        id=op_id,
        domain=data["domain"],
        name=data["name"],
        since_version=data["sinceVersion"],
        description=data.get("description", ""),
        inputs=inputs,
        outputs=outputs,
        attributes=attributes,
        type_constraints=tuple(
            (name, tuple(types)) for name, types in data.get("typeConstraints", {}).items()
        ),
        tunables=_tunables(reader, shared),
        derives=_derives(reader, shared),
        variants=_variants(reader, tensors),
        source=source,
        sha256=sha256,
        includes=tuple(item.source for item in shared),
        chunking=_chunking(reader, tensors, attributes),
        pipeline_constants=_pipeline_constants(data),
    )


def _tensors(reader: _Reader) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
    """Both sides, in either dialect (the schema makes `outputs` the same kind as `inputs`)."""
    data, root = reader.data, reader.root
    if isinstance(data["inputs"], list):
        return _list_dialect_tensors(reader)
    sides = []
    for side in ("inputs", "outputs"):
        entries = data[side].items()
        sides.append(
            tuple(
                _tensor(reader, key, spec.get("onnx", key), spec, side == "outputs", root.child(side, key))
                for key, spec in entries
            )
        )
    return sides[0], sides[1]


def _list_dialect_tensors(reader: _Reader) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
    """Bind keys come from `args` (`semantic` names the role); a role without an arg keeps its name."""
    data, root = reader.data, reader.root
    roles = {spec["role"] for side in ("inputs", "outputs") for spec in data[side]}
    key_of_role = {}
    for key, arg in data.get("args", {}).items():
        role = arg.get("semantic", key)
        if role not in roles:
            reader.unknown(root.child("args", key, "semantic"), "tensor role", role, roles)
        key_of_role[role] = key
    sides = []
    for side in ("inputs", "outputs"):
        sides.append(
            tuple(
                _tensor(
                    reader,
                    key_of_role.get(spec["role"], spec["role"]),
                    spec["role"],
                    spec,
                    side == "outputs",
                    root.child(side, i),
                )
                for i, spec in enumerate(data[side])
            )
        )
    return sides[0], sides[1]


def _tensor(reader: _Reader, key: str, role: str, spec: dict, is_output: bool, origin: Origin) -> Tensor:
    type_vars = reader.data.get("typeConstraints", {})
    if spec["dtype"] not in type_vars:
        reader.unknown(origin.child("dtype"), "type variable", spec["dtype"], type_vars)
    return Tensor(
        key=key,
        role=role,
        type_var=spec["dtype"],
        rank=reader.expr(spec["rank"], origin.child("rank")) if "rank" in spec else None,
        shape=reader.expr(spec["shape"], origin.child("shape")) if "shape" in spec else None,
        is_output=is_output,
        optional=spec.get("optional", False),
        description=spec.get("description", ""),
        origin=origin,
        api_flag=spec.get("apiFlag"),
    )


def _chunking(
    reader: _Reader, tensors: dict[str, Tensor], attributes: tuple[Attribute, ...]
) -> Chunking | None:
    """The optional `chunking` object: tensor names (bind key or role), the groups attribute, and for a
    cut by rows the axis rows end at (an attribute or an axis number)."""
    origin = reader.root.child("chunking")
    spec = reader.data.get("chunking")
    if not spec:
        return None
    by_name = {t.key: t.key for t in tensors.values()} | {t.role: t.key for t in tensors.values()}

    def keys(field: str) -> tuple[str, ...]:
        found = []
        for i, name in enumerate(spec.get(field, [])):
            if name in by_name:
                found.append(by_name[name])
            else:
                reader.unknown(origin.child(field, i), "tensor", name, by_name)
        return tuple(found)

    attribute_names = [a.name for a in attributes]
    groups = spec.get("groupsAttribute")
    if groups is not None and groups not in attribute_names:
        reader.unknown(origin.child("groupsAttribute"), "attribute", groups, attribute_names)
    row_axis = spec.get("rowAxis")
    if isinstance(row_axis, str) and row_axis not in attribute_names:
        reader.unknown(origin.child("rowAxis"), "attribute", row_axis, attribute_names)
    chunking = Chunking(
        batch=keys("batch"),
        channels=keys("channels"),
        per_channel=keys("perChannel"),
        groups_attribute=groups,
        origin=origin,
        rows=keys("rows"),
        repeated_rows=keys("repeatedRows"),
        row_axis=row_axis,
        row_scratch_bytes=spec.get("rowScratchBytes", 0),
    )
    for i, name in enumerate(spec.get("repeatedRows", [])):
        if by_name.get(name) in chunking.rows:
            reader.fail(origin.child("repeatedRows", i), f"`{name}` is in `rows` too: a tensor takes one cut")
    _check_chunking_cuts(reader, spec, origin)
    return chunking


def _check_chunking_cuts(reader: _Reader, spec: dict, origin: Origin) -> None:
    """One cut a manifest: along the batch axis (`batch`, then `channels`), or by rows (`rows` with
    `rowAxis`); the runtime tries nothing else, so a key of the other cut, or a lone half of one,
    would be silently ignored."""
    given = [k for k, v in spec.items() if k != "description" and v != []]
    batch_keys = [k for k in given if k in ("batch", "channels", "perChannel", "groupsAttribute")]
    row_keys = [k for k in given if k in ("rows", "repeatedRows", "rowAxis", "rowScratchBytes")]
    if not batch_keys and not row_keys:
        reader.fail(origin, "names no cut: give `batch` (and maybe `channels`) or `rows` with `rowAxis`")
    elif batch_keys and row_keys:
        reader.fail(
            origin.child(row_keys[0]),
            f"a cut by rows takes no {', '.join(f'`{k}`' for k in batch_keys)}: its pieces are ranges of rows,"
            " which already cover whole batch items",
        )
    elif batch_keys and "batch" not in given:
        reader.fail(origin.child(batch_keys[0]), "needs `batch`, the tensors cut along axis 0 first")
    elif row_keys and "rows" not in given:
        reader.fail(origin.child(row_keys[0]), "needs `rows`, the tensors cut into ranges of rows")
    elif row_keys and "rowAxis" not in given:
        reader.fail(
            origin.child("rows"),
            "needs `rowAxis`, where rows end: an attribute (`axis`) or an axis number (-1: the last)",
        )


def _attributes(data: dict, root: Origin) -> tuple[Attribute, ...]:
    """`attributes` (plain defaults or `{default, ...}`), with `attributeConstraints` and
    `attributeDescriptions` (list dialect) merged in; a name in only those is an attribute too."""
    defaults = data.get("attributes", {})
    constraints = data.get("attributeConstraints", {})
    descriptions = data.get("attributeDescriptions", {})
    attributes = []
    for name in dict.fromkeys([*defaults, *constraints, *descriptions]):
        spec = defaults.get(name)
        constraint = constraints.get(name, {})
        keyed = spec if isinstance(spec, dict) else {}
        allowed = constraint.get("values", keyed.get("values"))
        attributes.append(
            Attribute(
                name=name,
                default=_Reader.plain_default(spec),
                required=constraint.get("required", keyed.get("required", False)),
                allowed=tuple(allowed) if allowed is not None else None,
                comparison=constraint.get("comparison", keyed.get("comparison")),
                description=descriptions.get(name, keyed.get("description", "")),
                origin=root.child("attributes" if name in defaults else "attributeConstraints", name),
            )
        )
    return tuple(attributes)


def _variants(reader: _Reader, tensors: dict[str, Tensor]) -> tuple[Variant, ...]:
    return tuple(_variant(reader, spec, order, tensors) for order, spec in enumerate(reader.data["variants"]))


def _variant(reader: _Reader, spec: dict, order: int, tensors: dict[str, Tensor]) -> Variant:
    origin = reader.root.child("variants", order)
    intermediates = tuple(
        Intermediate(
            i["id"],
            i.get("dtype", "float32"),
            reader.expr(i["shape"], origin.child("intermediates", n, "shape")),
        )
        for n, i in enumerate(spec.get("intermediates", []))
    )
    # `constants` (list dialect) and `derive` (keyed dialect) are the same thing: named values
    # evaluated after selection, visible to passes and templates.
    derives = reader.derives(spec.get("constants"), origin.child("constants")) + reader.derives(
        spec.get("derive"), origin.child("derive")
    )
    resources = _Resources(tensors, {i.id for i in intermediates})
    passes = tuple(
        _pass(reader, p, origin.child("passes", n), resources) for n, p in enumerate(spec.get("passes", []))
    )
    return Variant(
        id=spec["id"],
        priority=spec.get("priority", 0),
        order=order,
        when=_conditions(reader, spec.get("when"), origin.child("when")),
        demote_when=_conditions(reader, spec.get("demoteWhen"), origin.child("demoteWhen")),
        required_features=tuple(spec.get("requires", {}).get("features", ())),
        derives=derives,
        intermediates=intermediates,
        passes=passes,
        origin=origin,
        pipeline_constants=_pipeline_constants(spec),
    )


def _pipeline_constants(spec: dict) -> tuple[tuple[str, str], ...]:
    """`pipelineConstants`: name -> why a request-dependent value stays a pipeline override."""
    return tuple(spec.get("pipelineConstants", {}).items())


def _conditions(reader: _Reader, value: Any, origin: Origin) -> tuple[Expr, ...]:
    """`when` is a list of expressions, or one expression string in seed 002."""
    if value is None:
        return ()
    if isinstance(value, list):
        return tuple(reader.expr(v, origin.child(i)) for i, v in enumerate(value))
    return (reader.expr(value, origin),)


class _Resources:
    """What a variant's bindings may name: its op's tensors (bind key or role) and its intermediates."""

    def __init__(self, tensors: dict[str, Tensor], intermediates: set[str]):
        self.tensors = tensors
        self.intermediates = intermediates

    def kind(self, name: str) -> str | None:
        if name in self.tensors:
            return "output" if self.tensors[name].is_output else "input"
        return "intermediate" if name in self.intermediates else None


def _pass(reader: _Reader, spec: dict, origin: Origin, resources: _Resources) -> Pass:
    source = spec.get("source")
    if source is not None:
        template = source["shader"]
        derives = reader.derives(source.get("inputs"), origin.child("source", "inputs"))
    else:
        template = spec.get("shader")
        derives = reader.derives(spec.get("derive"), origin.child("derive"))
    if not template:
        reader.fail(origin, "a pass needs a `shader` (or `source.shader`) template")
    return Pass(
        id=spec.get("id", "main"),
        label=spec.get("name", spec.get("id", "main")),
        template=template or "",
        derives=derives,
        bindings=_pass_bindings(reader, spec.get("bindings"), origin.child("bindings"), resources),
        dispatch=_dispatch(reader, spec.get("dispatch", {}), origin.child("dispatch")),
        subgroup_width=spec.get("subgroupCollectivesWidth"),
        origin=origin,
    )


def _pass_bindings(reader: _Reader, value: Any, origin: Origin, resources: _Resources) -> tuple[Binding, ...]:
    """A named `bindingSets` entry (list dialect) or a list of pool keys and inline objects (keyed)."""
    data = reader.data
    if isinstance(value, str):
        sets = data.get("bindingSets", {})
        if value not in sets:
            reader.unknown(origin, "binding set", value, sets)
            return ()
        set_origin = reader.root.child("bindingSets", value)
        found = (
            (_inline_binding(reader, b, {}, set_origin.child(i)), set_origin.child(i))
            for i, b in enumerate(sets[value])
        )
        specs = [(spec, spec_origin) for spec, spec_origin in found if spec is not None]
    else:
        pool = data.get("bindings", {})
        specs = []
        for i, entry in enumerate(value or []):
            if not isinstance(entry, str):
                spec = _inline_binding(reader, entry, pool, origin.child(i))
                if spec is not None:
                    specs.append((spec, origin.child(i)))
            elif entry in pool:
                specs.append(({"name": entry, **pool[entry]}, reader.root.child("bindings", entry)))
            else:
                reader.unknown(origin.child(i), "pooled binding", entry, pool)
    bindings = (_binding(reader, spec, spec_origin, resources) for spec, spec_origin in specs)
    return tuple(b for b in bindings if b is not None)


def _inline_binding(reader: _Reader, entry: dict, pool: dict, origin: Origin) -> dict | None:
    """A binding object of a pass's list: `use` names a pool entry, which the object's other keys
    override (`{"use": "bias", "when": "hasBias"}`); without `use` the object is the binding."""
    if "use" not in entry:
        if "name" not in entry:
            reader.fail(origin, "a binding needs a `name`, or `use` naming a pooled binding")
            return None
        return entry
    key = entry["use"]
    if key not in pool:
        reader.unknown(origin.child("use"), "pooled binding", key, pool)
        return None
    return {"name": key, **pool[key], **{k: v for k, v in entry.items() if k != "use"}}


def _binding(reader: _Reader, spec: dict, origin: Origin, resources: _Resources) -> Binding | None:
    name = spec["name"]
    buffer = spec.get("buffer")
    if isinstance(buffer, dict):
        buffer = buffer["type"]
    struct = spec.get("struct")
    if struct is not None:
        if "when" in spec:
            reader.fail(
                origin.child("when"),
                "the uniform is bound by every shader of a pass: it cannot have a `when`",
            )
        return _uniform_binding(reader, name, buffer, struct, origin)
    resource = spec.get("arg") or name
    kind = resources.kind(resource)
    if kind is None:
        known = sorted({*resources.tensors, *resources.intermediates})
        # A pooled binding's `name` may be its key, not a member: then the binding itself is the place.
        reader.unknown(
            origin.child("arg") if "arg" in spec else origin, "tensor or intermediate", resource, known
        )
        return None
    if buffer is None or buffer == "uniform":
        reader.fail(
            origin.child("buffer"),
            f"{kind} {resource!r} needs a storage buffer: read-only-storage or storage",
        )
    elif kind == "input" and buffer != "read-only-storage":
        reader.fail(origin.child("buffer"), f"input {resource!r} must be bound read-only")
    if "elementType" not in spec:
        reader.fail(origin, f"binding {name!r} needs an `elementType`")
    element_type = reader.expr(spec.get("elementType", "f32"), origin.child("elementType"))
    when = reader.expr(spec["when"], origin.child("when")) if "when" in spec else None
    return Binding(name, kind, resource, buffer or "storage", element_type, None, (), origin, when)


def _uniform_binding(reader: _Reader, name: str, buffer: str | None, struct: Any, origin: Origin) -> Binding:
    """A `struct` binding: a list of fields, or `{name, fields}`."""
    if buffer not in (None, "uniform"):
        reader.fail(origin.child("buffer"), f"a binding with a `struct` is a uniform buffer, not {buffer!r}")
    fields_spec, struct_name = (
        (struct["fields"], struct.get("name", "Params")) if isinstance(struct, dict) else (struct, "Params")
    )
    fields_origin = origin.child("struct", "fields") if isinstance(struct, dict) else origin.child("struct")
    fields = tuple(
        UniformField(
            field["name"], field["type"], reader.expr(field["value"], fields_origin.child(i, "value"))
        )
        for i, field in enumerate(fields_spec)
    )
    return Binding(name, "uniform", "params", "uniform", None, struct_name, fields, origin)


def _dispatch(reader: _Reader, spec: dict, origin: Origin) -> Dispatch:
    form = next((key for key in DISPATCH_FORMS if key in spec), None)
    if form is None:
        reader.fail(origin, "dispatch needs `threads`+`workgroupSize`, `workgroups` (+`z`) or `x`/`y`/`z`")
        return Dispatch("xyz", (), origin)
    keys = DISPATCH_FORMS[form]
    form = "xyz" if form == "x" else form
    unknown = set(spec) - set(keys)
    if unknown:
        reader.fail(origin, f"unknown dispatch keys {sorted(unknown)} for the `{form}` form")
    if form == "threads" and "workgroupSize" not in spec:
        reader.fail(origin, "a `threads` dispatch needs `workgroupSize`")
    defaults = {"z": 1, "y": 1}
    values = tuple(
        (k, reader.expr(spec.get(k, defaults.get(k, 1)), origin.child(k)))
        for k in keys
        if k in spec or k in defaults
    )
    return Dispatch(form, values, origin)


def load_manifests(manifests_dir: Path, snapshot=None) -> list[Op]:
    """Every `<op id>/manifest.json` under the folder (as `snapshot`, a sources.Snapshot, holds it,
    when given), sorted by op id; the problems of all of them."""
    repo_root = manifests_dir.resolve().parent
    ops, problems = [], []
    for path in sorted(manifests_dir.glob("*/manifest.json")):
        relative = relative_path(path, repo_root)
        try:
            if snapshot:
                ops.append(load_manifest(path, repo_root, snapshot.files[relative], snapshot.files))
            else:
                ops.append(load_manifest(path, repo_root))
        except CompileError as error:
            problems.extend(error.problems)
    if problems:
        raise CompileError(problems)
    return ops
