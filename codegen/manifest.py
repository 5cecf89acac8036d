"""Load stage: manifest JSON (either dialect) -> ir.Op, with errors that name file and JSON pointer.

Two dialects are real and both load into one form:

* list dialect (seeds 000, 002): `inputs`/`outputs` are lists with `role`, bind keys come from
  `args`, binding lists are named in `bindingSets`, attribute and tunable defaults are plain values,
  variants carry `constants` and passes carry `source: {shader, inputs}`;
* keyed dialect (seed 003): `inputs`/`outputs` are keyed by bind key (`onnx` gives the role), a
  top-level `bindings` pool is referenced by key or overridden inline, defaults are `{default: v}`,
  variants and passes carry `derive`, variants `requires` and `demoteWhen`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from .ir import (
    Attribute,
    Chunking,
    Binding,
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

BUFFER_TYPES = ("read-only-storage", "storage", "uniform")
UNIFORM_TYPES = ("u32", "i32", "f32")


class ManifestError(Exception):
    """Every problem a stage found, one `file#pointer: message` per line."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


class _Reader:
    """Reads one manifest, collecting problems instead of stopping at the first."""

    def __init__(self, source: str, data: Any):
        self.source = source
        self.data = data
        self.problems: list[str] = []

    def fail(self, origin: Origin, message: str) -> None:
        self.problems.append(f"{origin}: {message}")

    def expr(self, value: Any, origin: Origin) -> Expr:
        if isinstance(value, str):
            return Expr(value, None, origin)
        if isinstance(value, (bool, int, float)):
            return Expr(None, value, origin)
        self.fail(origin, f"expected an expression string, a number or a boolean, got {value!r}")
        return Expr(None, 0, origin)

    def mapping(self, value: Any, origin: Origin, what: str) -> dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.fail(origin, f"{what} must be an object, got {type(value).__name__}")
            return {}
        return value

    def sequence(self, value: Any, origin: Origin, what: str) -> list:
        if value is None:
            return []
        if not isinstance(value, list):
            self.fail(origin, f"{what} must be a list, got {type(value).__name__}")
            return []
        return value

    def derives(self, table: Any, origin: Origin, what: str) -> tuple[Derive, ...]:
        table = self.mapping(table, origin, what)
        return tuple(Derive(name, self.expr(v, origin.child(name))) for name, v in table.items())

    @staticmethod
    def plain_default(value: Any) -> Any:
        """The keyed dialect writes `{default: v}`, the list dialect plain `v`."""
        if isinstance(value, dict):
            return value.get("default")
        return value


def load_manifest(path: Path, repo_root: Path) -> Op:
    """Read one manifest file into an `ir.Op`; raises ManifestError listing every problem."""
    source = path.resolve().relative_to(repo_root.resolve()).as_posix()
    raw = path.read_bytes()
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ManifestError([f"{source}: not valid JSON: {error}"]) from None
    reader = _Reader(source, data)
    root = Origin(source, "")
    if not isinstance(data, dict):
        raise ManifestError([f"{source}#: the manifest must be a JSON object"])
    for key in ("domain", "name", "sinceVersion", "inputs", "outputs", "variants"):
        if key not in data:
            reader.fail(root.child(key), "required key is missing")
    if reader.problems:
        raise ManifestError(reader.problems)

    inputs, outputs = _tensors(reader, data, root)
    tensors = {t.key: t for t in inputs + outputs}
    op = Op(
        id=path.parent.name,
        domain=data["domain"],
        name=data["name"],
        since_version=data["sinceVersion"],
        description=data.get("description", ""),
        inputs=inputs,
        outputs=outputs,
        attributes=_attributes(reader, data, root),
        type_constraints=tuple(
            (name, tuple(types))
            for name, types in reader.mapping(
                data.get("typeConstraints"), root.child("typeConstraints"), "typeConstraints"
            ).items()
        ),
        tunables=tuple(
            (name, reader.plain_default(v))
            for name, v in reader.mapping(data.get("tunables"), root.child("tunables"), "tunables").items()
        ),
        derives=reader.derives(data.get("derive"), root.child("derive"), "derive"),
        variants=_variants(reader, data, root, tensors),
        source=source,
        sha256=hashlib.sha256(raw).hexdigest(),
        chunking=_chunking(reader, data, root, tensors),
        pipeline_constants=_pipeline_constants(reader, data, root),
    )
    if reader.problems:
        raise ManifestError(reader.problems)
    return op


def _tensors(reader: _Reader, data: dict, root: Origin) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
    if isinstance(data["inputs"], list):
        return _list_dialect_tensors(reader, data, root)
    result = []
    for side in ("inputs", "outputs"):
        entries = reader.mapping(data[side], root.child(side), side)
        result.append(
            tuple(
                _tensor(reader, key, spec.get("onnx", key), spec, side == "outputs", root.child(side, key))
                for key, spec in entries.items()
            )
        )
    return result[0], result[1]


def _list_dialect_tensors(reader: _Reader, data: dict, root: Origin):
    """Bind keys come from `args` (`semantic` names the role); a role without an arg keeps its name."""
    args = reader.mapping(data.get("args"), root.child("args"), "args")
    key_of_role = {}
    for key, arg in args.items():
        if isinstance(arg, dict) and arg.get("kind") == "tensor":
            key_of_role[arg.get("semantic", key)] = key
    result = []
    for side in ("inputs", "outputs"):
        tensors = []
        for i, spec in enumerate(reader.sequence(data[side], root.child(side), side)):
            origin = root.child(side, i)
            if not isinstance(spec, dict) or "role" not in spec:
                reader.fail(origin, "a tensor needs a `role`")
                continue
            role = spec["role"]
            tensors.append(_tensor(reader, key_of_role.get(role, role), role, spec, side == "outputs", origin))
        result.append(tuple(tensors))
    return result[0], result[1]


def _tensor(reader: _Reader, key: str, role: str, spec: dict, is_output: bool, origin: Origin) -> Tensor:
    if "dtype" not in spec:
        reader.fail(origin.child("dtype"), "a tensor needs a `dtype` type variable")
    if is_output and "shape" not in spec:
        reader.fail(origin.child("shape"), "an output needs a `shape` expression")
    return Tensor(
        key=key,
        role=role,
        type_var=spec.get("dtype", "T"),
        rank=reader.expr(spec["rank"], origin.child("rank")) if "rank" in spec else None,
        shape=reader.expr(spec["shape"], origin.child("shape")) if "shape" in spec else None,
        is_output=is_output,
        optional=bool(spec.get("optional", False)),
        description=spec.get("description", ""),
        origin=origin,
        api_flag=spec.get("apiFlag"),
    )


def _chunking(reader: _Reader, data: dict, root: Origin, tensors: dict) -> Chunking | None:
    """The optional `chunking` object: tensor names (bind key or role) and the groups attribute."""
    origin = root.child("chunking")
    spec = reader.mapping(data.get("chunking"), origin, "chunking")
    if not spec:
        return None
    by_name = {t.key: t.key for t in tensors.values()} | {t.role: t.key for t in tensors.values()}
    unknown = sorted(set(spec) - {"description", "batch", "channels", "perChannel", "groupsAttribute"})
    for key in unknown:
        reader.fail(origin.child(key), "unknown key; chunking takes description, batch, channels, perChannel, groupsAttribute")

    def names(field: str) -> tuple[str, ...]:
        keys = []
        for i, name in enumerate(reader.sequence(spec.get(field), origin.child(field), field)):
            if name not in by_name:
                reader.fail(origin.child(field, i), f"unknown tensor {name!r}; tensors are {', '.join(sorted(by_name))}")
            else:
                keys.append(by_name[name])
        return tuple(keys)

    groups = spec.get("groupsAttribute")
    attributes = {a.name for a in _attributes(_Reader(reader.source, data), data, root)}
    if groups is not None and groups not in attributes:
        reader.fail(origin.child("groupsAttribute"), f"unknown attribute {groups!r}")
    return Chunking(names("batch"), names("channels"), names("perChannel"), groups, origin)


def _attributes(reader: _Reader, data: dict, root: Origin) -> tuple[Attribute, ...]:
    defaults = reader.mapping(data.get("attributes"), root.child("attributes"), "attributes")
    constraints = reader.mapping(
        data.get("attributeConstraints"), root.child("attributeConstraints"), "attributeConstraints"
    )
    descriptions = data.get("attributeDescriptions", {})
    names = list(defaults) + [n for n in list(constraints) + list(descriptions) if n not in defaults]
    attributes = []
    for name in dict.fromkeys(names):
        spec = defaults.get(name)
        constraint = constraints.get(name, {})
        keyed = spec if isinstance(spec, dict) else {}
        allowed = constraint.get("values", keyed.get("values"))
        attributes.append(
            Attribute(
                name=name,
                default=reader.plain_default(spec),
                required=bool(constraint.get("required", keyed.get("required", False))),
                allowed=tuple(allowed) if allowed is not None else None,
                comparison=constraint.get("comparison", keyed.get("comparison")),
                description=descriptions.get(name, keyed.get("description", "")),
                origin=root.child("attributes" if name in defaults else "attributeConstraints", name),
            )
        )
    return tuple(attributes)


def _variants(reader: _Reader, data: dict, root: Origin, tensors: dict[str, Tensor]) -> tuple[Variant, ...]:
    variants = []
    for order, spec in enumerate(reader.sequence(data["variants"], root.child("variants"), "variants")):
        origin = root.child("variants", order)
        if not isinstance(spec, dict) or "id" not in spec:
            reader.fail(origin, "a variant needs an `id`")
            continue
        intermediates = tuple(
            Intermediate(i["id"], i.get("dtype", "float32"), reader.expr(i["shape"], origin.child("intermediates", n, "shape")))
            for n, i in enumerate(reader.sequence(spec.get("intermediates"), origin.child("intermediates"), "intermediates"))
        )
        # `constants` (list dialect) and `derive` (keyed dialect) are the same thing: named values
        # evaluated after selection, visible to passes and templates.
        derives = reader.derives(spec.get("constants"), origin.child("constants"), "constants") + reader.derives(
            spec.get("derive"), origin.child("derive"), "derive"
        )
        passes = tuple(
            _pass(reader, data, p, origin.child("passes", n), tensors, {i.id for i in intermediates})
            for n, p in enumerate(reader.sequence(spec.get("passes"), origin.child("passes"), "passes"))
        )
        variants.append(
            Variant(
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
                pipeline_constants=_pipeline_constants(reader, spec, origin),
            )
        )
    return tuple(variants)


def _pipeline_constants(reader: _Reader, spec: dict, origin: Origin) -> tuple[tuple[str, str], ...]:
    """`pipelineConstants`: name -> why a request-dependent value stays a pipeline override."""
    table = reader.mapping(spec.get("pipelineConstants"), origin.child("pipelineConstants"), "pipelineConstants")
    return tuple((name, str(why)) for name, why in table.items())


def _conditions(reader: _Reader, value: Any, origin: Origin) -> tuple[Expr, ...]:
    """`when` is a list of expressions, or one expression string in seed 002."""
    if value is None:
        return ()
    if isinstance(value, list):
        return tuple(reader.expr(v, origin.child(i)) for i, v in enumerate(value))
    return (reader.expr(value, origin),)


def _pass(reader: _Reader, data: dict, spec: dict, origin: Origin, tensors: dict, intermediates: set) -> Pass:
    source = spec.get("source")
    if isinstance(source, dict):
        template = source.get("shader")
        derives = reader.derives(source.get("inputs"), origin.child("source", "inputs"), "source.inputs")
    else:
        template = spec.get("shader")
        derives = reader.derives(spec.get("derive"), origin.child("derive"), "derive")
    if not template:
        reader.fail(origin, "a pass needs a `shader` (or `source.shader`) template")
    return Pass(
        id=spec.get("id", "main"),
        label=spec.get("name", spec.get("id", "main")),
        template=template or "",
        derives=derives,
        bindings=_pass_bindings(reader, data, spec.get("bindings"), origin.child("bindings"), tensors, intermediates),
        dispatch=_dispatch(reader, spec.get("dispatch"), origin.child("dispatch")),
        subgroup_width=spec.get("subgroupCollectivesWidth"),
        origin=origin,
    )


def _pass_bindings(reader: _Reader, data: dict, value: Any, origin: Origin, tensors: dict, intermediates: set):
    """A named `bindingSets` entry (list dialect) or a list of pool keys and inline objects (keyed)."""
    if isinstance(value, str):
        sets = data.get("bindingSets", {})
        if value not in sets:
            reader.fail(origin, f"binding set {value!r} is not defined in /bindingSets (known: {sorted(sets)})")
            return ()
        set_origin = Origin(origin.file, f"/bindingSets/{value}")
        specs = [(b, set_origin.child(i)) for i, b in enumerate(sets[value])]
    else:
        pool = data.get("bindings", {})
        specs = []
        for i, entry in enumerate(reader.sequence(value, origin, "bindings")):
            if isinstance(entry, str):
                if entry not in pool:
                    reader.fail(origin.child(i), f"binding {entry!r} is not in the /bindings pool")
                    continue
                specs.append(({"name": entry, **pool[entry]}, Origin(origin.file, f"/bindings/{entry}")))
            else:
                specs.append((entry, origin.child(i)))
    bindings = []
    for spec, spec_origin in specs:
        binding = _binding(reader, spec, spec_origin, tensors, intermediates)
        if binding is not None:
            bindings.append(binding)
    return tuple(bindings)


def _binding(reader: _Reader, spec: dict, origin: Origin, tensors: dict, intermediates: set) -> Binding | None:
    name = spec.get("name")
    if not name:
        reader.fail(origin, "a binding needs a `name`")
        return None
    buffer = spec.get("buffer")
    if isinstance(buffer, dict):
        buffer = buffer.get("type")
    struct = spec.get("struct")
    if struct is not None:
        buffer = buffer or "uniform"
        fields_spec = struct.get("fields", []) if isinstance(struct, dict) else struct
        struct_name = struct.get("name", "Params") if isinstance(struct, dict) else "Params"
        fields_origin = origin.child("struct", "fields") if isinstance(struct, dict) else origin.child("struct")
        fields = []
        for i, field in enumerate(fields_spec):
            if field.get("type") not in UNIFORM_TYPES:
                reader.fail(fields_origin.child(i, "type"), f"uniform field type must be one of {UNIFORM_TYPES}")
            fields.append(UniformField(field["name"], field.get("type", "u32"), reader.expr(field["value"], fields_origin.child(i, "value"))))
        return Binding(name, "uniform", "params", buffer, None, struct_name, tuple(fields), origin)
    if buffer not in BUFFER_TYPES:
        reader.fail(origin.child("buffer"), f"buffer type must be one of {BUFFER_TYPES}, got {buffer!r}")
    resource = spec.get("arg") or name
    if resource in tensors:
        kind = "output" if tensors[resource].is_output else "input"
    elif resource in intermediates:
        kind = "intermediate"
    else:
        reader.fail(origin, f"binding {name!r} names neither a tensor ({sorted(tensors)}) nor an intermediate ({sorted(intermediates)})")
        return None
    if kind == "input" and buffer != "read-only-storage":
        reader.fail(origin.child("buffer"), f"input {resource!r} must be bound read-only")
    if "elementType" not in spec:
        reader.fail(origin, f"binding {name!r} needs an `elementType`")
    return Binding(name, kind, resource, buffer, reader.expr(spec.get("elementType", "f32"), origin.child("elementType")), None, (), origin)


def _dispatch(reader: _Reader, spec: Any, origin: Origin) -> Dispatch:
    spec = reader.mapping(spec, origin, "dispatch")
    if "threads" in spec:
        form, keys = "threads", ("threads", "workgroupSize")
    elif "workgroups" in spec:
        form, keys = "workgroups", ("workgroups", "z")
    elif "x" in spec:
        form, keys = "xyz", ("x", "y", "z")
    else:
        reader.fail(origin, "dispatch needs `threads`+`workgroupSize`, `workgroups` (+`z`) or `x`/`y`/`z`")
        return Dispatch("xyz", (), origin)
    unknown = set(spec) - set(keys)
    if unknown:
        reader.fail(origin, f"unknown dispatch keys {sorted(unknown)} for the `{form}` form")
    if form == "threads" and "workgroupSize" not in spec:
        reader.fail(origin, "a `threads` dispatch needs `workgroupSize`")
    defaults = {"z": 1, "y": 1}
    values = tuple(
        (k, reader.expr(spec.get(k, defaults.get(k, 1)), origin.child(k))) for k in keys if k in spec or k in defaults
    )
    return Dispatch(form, values, origin)


def load_manifests(manifests_dir: Path) -> list[Op]:
    """Every `<op id>/manifest.json` under the folder, sorted by op id."""
    repo_root = manifests_dir.resolve().parent
    ops, problems = [], []
    for path in sorted(manifests_dir.glob("*/manifest.json")):
        try:
            ops.append(load_manifest(path, repo_root))
        except ManifestError as error:
            problems.extend(error.problems)
    if problems:
        raise ManifestError(problems)
    return ops
