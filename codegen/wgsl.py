"""Render stage: ResolvedOp + templates/ -> WGSL text per (variant, pass, specialization).

Binding times (DESIGN §4): string and boolean values with a finite domain are specialization
values, the only names a template sees through Jinja; numeric values become WGSL `override`
constants, declared here for the names the rendered body uses; per-call values reach the shader
through the `Params` uniform. The resource declarations (`@group(0) @binding(i)`) come from the
manifest's binding list, so a template holds only the computation.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from pathlib import Path

import jinja2
import jinja2.meta

from . import runtime
from .expr import snake
from .manifest import ManifestError
from .resolve import ResolvedOp, ResolvedPass, ResolvedVariant, Value

WGSL_DTYPE = {"float32": "f32", "float16": "f16"}
BUFFER_ACCESS = {"read-only-storage": "storage, read", "storage": "storage, read_write"}
SCALAR_BYTES = {"f32": 4, "u32": 4, "i32": 4, "f16": 2}
SUBGROUP_USE = re.compile(r"\bsubgroup[A-Z]\w*\s*\(|@builtin\((subgroup_invocation_id|subgroup_size|subgroup_id|num_subgroups)\)")
BUILTIN_OVERRIDES = ("WORKGROUP_SIZE", "DISPATCH_FOLD_WIDTH")
# Macro libraries that op templates import (`{% import "_lib/stats.wgsl.jinja" as stats %}`): never an
# op template themselves.
LIBRARY = "_lib"
# WGSL comments; a template's notes reach the shader as `//` lines, which name values freely.
COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


@dataclass(frozen=True)
class Specialization:
    key: tuple  # values of `key_names`, in order
    context: dict  # what Jinja saw
    wgsl: str
    body_first_line: int  # 1-based line of the rendered template inside `wgsl`
    overrides: tuple[tuple[str, str], ...]  # (name, u32|f32) that the shader declares
    workgroup_size: str  # an override name or an integer literal
    workgroup_arrays: tuple[tuple[int, tuple[str, ...]], ...]  # (bytes per element, count factors)
    uses_subgroups: bool


@dataclass(frozen=True)
class ScopeUniform:
    """A numeric scope value the shader reads from `Params` (dispatch time) instead of an override.

    The compiler adds one for every value a body names that depends on the request (shapes,
    ranks, attributes, requested outputs) and that sizes no array: the body reads it as
    `params.<name>`, so a new shape reuses the pipeline. `declared` means the manifest's Params
    already has a field of that name, which the value then reads instead of adding one.
    """

    name: str
    type: str  # u32 | f32
    value: Value
    declared: bool


@dataclass(frozen=True)
class RenderedPass:
    variant: ResolvedVariant
    pass_: ResolvedPass
    template: str  # repository-relative path
    key_names: tuple[str, ...]  # template values, then `binding:<name>` element types
    specializations: tuple[Specialization, ...]
    scope_uniforms: tuple[ScopeUniform, ...] = ()  # appended to Params after the manifest's fields
    libraries: tuple[str, ...] = ()  # repository-relative paths of the templates it imports (templates/_lib/)

    @property
    def uniform_fields(self) -> tuple[tuple[str, str], ...]:
        """The pass's Params layout: the manifest's fields, then the compiler's, unpadded."""
        fields = [(f.name, f.type) for b in self.pass_.ir.bindings for f in b.fields]
        return tuple(fields) + tuple((u.name, u.type) for u in self.scope_uniforms if not u.declared)


def make_environment(templates_dir: Path) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


class _NotFinite(Exception):
    pass


class _Domains:
    """Finds every reachable combination of a pass's specialization values.

    A value is finite when it depends only on dtypes, on attributes restricted by
    `attributeConstraints.values` and on literals; a boolean that depends on anything else (a device
    feature, a shape) is a free leaf that can be either. Reachable combinations are those of the
    product of the leaves' domains.
    """

    def __init__(self, op: ResolvedOp, variant: ResolvedVariant, pass_: ResolvedPass):
        self.levels = {
            "manifest": {v.name: v for v in op.derives},
            "variant": {v.name: v for v in variant.derives},
            "pass": {v.name: v for v in pass_.derives},
        }
        self.base = {f"dtype_{snake(tv)}": tuple(WGSL_DTYPE[t] for t in types if t in WGSL_DTYPE) for tv, types in op.ir.type_constraints}
        for attribute in op.ir.attributes:
            if attribute.allowed is not None:
                self.base[f"attr_{snake(attribute.name)}"] = attribute.allowed

    def leaves(self, value: Value) -> set:
        try:
            return self.finite_leaves(value)
        except _NotFinite:
            if value.code.type != "bool":
                raise
            return {("free", value.name)}

    def finite_leaves(self, value: Value) -> set:
        found = set()
        for local in value.code.locals - {"d", "v"}:
            if local not in self.base:
                raise _NotFinite(local)
            found.add(("base", local))
        for level, name in value.code.refs:
            found |= self.leaves(self.levels[level][name])
        return found

    def evaluate(self, value: Value, assignment: dict):
        if ("free", value.name) in assignment:
            return assignment[("free", value.name)]
        if value.code.is_constant:
            return value.code.constant
        env = {local: assignment[("base", local)] for local in value.code.locals - {"d", "v"}}
        holders = {"manifest": {}, "variant": {}}
        for level, name in value.code.refs:
            referenced = self.levels[level][name]
            # Code reads a value of its own level by bare name, an outer one through `d.`/`v.`.
            result = self.evaluate(referenced, assignment)
            env[referenced.var] = result
            if level != "pass":
                holders[level][referenced.var] = result
        env["d"] = _Namespace(holders["manifest"])
        env["v"] = _Namespace(holders["variant"])
        return eval(value.code.python, _EVAL_GLOBALS, env)  # compile-time only, never generated

    def enumerate(self, values: list[Value], conditions: list[Value]) -> list[dict]:
        """Combinations of `values`, leaving out those a finite `when` clause rules out."""
        leaves = set()
        for value in values:
            leaves |= self.leaves(value)
        deciding = []
        for condition in conditions:
            try:
                leaves |= self.finite_leaves(condition)
                deciding.append(condition)
            except _NotFinite:
                pass  # depends on shapes or the device: both outcomes stay reachable
        ordered = sorted(leaves)
        domains = [self.base[name] if kind == "base" else (False, True) for kind, name in ordered]
        combos = []
        for choice in itertools.product(*domains):
            assignment = dict(zip(ordered, choice))
            if all(self.evaluate(c, assignment) is True for c in deciding):
                combos.append({v.name: self.evaluate(v, assignment) for v in values})
        return combos


class _Namespace:
    def __init__(self, values: dict):
        self.__dict__.update(values)


_EVAL_GLOBALS = {
    "math": math,
    **{name: getattr(runtime, name) for name in ("js_div", "js_mod", "js_str", "pow2ceil", "ceil_div", "numel", "inner", "outer", "dim")},
}


def _element_bytes(wgsl_type: str) -> int:
    match = re.fullmatch(r"\s*(?:vec([234])<\s*(\w+)\s*>|(\w+))\s*", wgsl_type)
    if not match:
        raise ValueError(f"workgroup element type `{wgsl_type}` is not a scalar or vector")
    if match.group(3):
        return SCALAR_BYTES[match.group(3)]
    lanes = int(match.group(1))
    size = SCALAR_BYTES[match.group(2)] * (4 if lanes == 3 else lanes)
    return size


def _workgroup_arrays(body: str) -> tuple[tuple[int, tuple[str, ...]], ...]:
    """Bytes of every `var<workgroup>`, as element size times factors that are overrides or literals."""
    arrays = []
    for match in re.finditer(r"var<workgroup>\s+\w+\s*:\s*([^;]+);", body):
        declared = match.group(1).strip()
        array = re.fullmatch(r"array<\s*(.+?)\s*,\s*([\w\s*]+?)\s*>", declared)
        if array is None:
            arrays.append((_element_bytes(declared), ()))
            continue
        factors = tuple(f.strip().rstrip("u") if f.strip()[:1].isdigit() else f.strip() for f in array.group(2).split("*"))
        arrays.append((_element_bytes(array.group(1)), factors))
    return tuple(arrays)


def _declarations(pass_: ResolvedPass, element_types: dict, overrides: list[tuple[str, str]], body: str, extra: tuple) -> str:
    lines = []
    # Comments must not turn an f32 shader into one that needs shader-f16.
    code = COMMENT.sub("", body)
    if any("f16" in t for t in element_types.values()) or re.search(r"\bf16\b", code):
        lines.append("enable f16;")
    for name, kind in overrides:
        lines.append(f"override {name}: {kind};")
    for index, binding in enumerate(pass_.ir.bindings):
        if binding.kind == "uniform":
            fields = [f"{f.name}: {f.type}" for f in binding.fields] + [f"{n}: {t}" for n, t in extra]
            fields += [f"_pad{i}: u32" for i in range(-len(fields) % 4)]
            lines.append(f"struct {binding.struct_name} {{ {', '.join(fields)} }}")
            lines.append(f"@group(0) @binding({index}) var<uniform> {binding.name}: {binding.struct_name};")
        else:
            access = BUFFER_ACCESS[binding.buffer]
            lines.append(f"@group(0) @binding({index}) var<{access}> {binding.name}: array<{element_types[binding.name]}>;")
    return "\n".join(lines) + "\n\n"


def render_pass(op: ResolvedOp, variant: ResolvedVariant, pass_: ResolvedPass, env: jinja2.Environment, templates_dir: Path) -> RenderedPass:
    origin = pass_.ir.origin
    name = pass_.ir.template
    if name.startswith(f"{LIBRARY}/"):
        raise ManifestError([f"{origin}: `{name}` is a macro library ({templates_dir.name}/{LIBRARY}/), not an op template"])
    try:
        source = (templates_dir / name).read_text()
    except OSError:
        raise ManifestError([f"{origin}: template `{name}` does not exist in {templates_dir.name}/"]) from None
    libraries = _libraries(env, source, templates_dir)
    used = jinja2.meta.find_undeclared_variables(env.parse(source))
    values = {v.name: v for v in pass_.scope_values}
    problems = []
    # A name this pass does not define stays undefined: a shared template may test it with
    # `is defined`, and StrictUndefined fails the render on any other use.
    used = {v for v in used if v in values}
    for variable in sorted(used):
        if values[variable].code.type not in ("str", "bool"):
            problems.append(
                f"{origin}: template `{name}` reads `{variable}` through Jinja, but it is a number: "
                "numbers are pipeline overrides, use the name as a WGSL identifier instead"
            )
    if problems:
        raise ManifestError(problems)
    template_values = [values[v] for v in sorted(used)]
    element_values = [
        Value(f"binding:{binding}", f"binding_{binding}", None, code)
        for binding, code in pass_.element_types
    ]
    domains = _Domains(op, variant, pass_)
    try:
        conditions = [Value(f"when:{i}", f"when_{i}", expr, code) for i, (expr, code) in enumerate(variant.when)]
        combos = domains.enumerate(template_values + element_values, conditions)
    except _NotFinite as error:
        raise ManifestError([f"{origin}: a specialization value of template `{name}` depends on `{error}`, which has no finite domain"]) from None
    key_names = tuple(v.name for v in template_values + element_values)
    numeric = {v.name: ("f32" if v.code.type == "float" else "u32") for v in pass_.scope_values if v.code.type in ("int", "float")}
    if pass_.ir.dispatch.form == "threads":
        numeric["WORKGROUP_SIZE"] = "u32"
    numeric["DISPATCH_FOLD_WIDTH"] = "u32"
    template = env.get_template(name)
    bodies = {}
    for combo in combos:
        key = tuple(combo[n] for n in key_names)
        if key not in bodies:
            context = {v.name: combo[v.name] for v in template_values}
            bodies[key] = (combo, context, template.render(context))
    kept = {n for n, _ in op.ir.pipeline_constants + variant.ir.pipeline_constants}
    # Only code decides what a shader uses: a name in a comment declares nothing and reads nothing.
    uniforms = _scope_uniforms(pass_, kept, numeric, [_code(body) for _, _, body in bodies.values()], origin, name)
    moved = {u.name for u in uniforms}
    extra = tuple((u.name, u.type) for u in uniforms if not u.declared)
    specializations = {}
    for key, (combo, context, body) in bodies.items():
        body = _read_from_params(body, uniforms, pass_)
        code = _code(body)
        overrides = [(n, numeric[n]) for n in sorted(numeric) if n not in moved and _names(code, n)]
        element_types = {b: combo[f"binding:{b}"] for b, _ in pass_.element_types}
        header = _declarations(pass_, element_types, overrides, body, extra)
        size = re.search(r"@workgroup_size\(\s*([\w]+)\s*\)", code)
        if size is None:
            raise ManifestError([f"{origin}: template `{name}` needs `@workgroup_size(NAME)` with one override or literal (1-D workgroups)"])
        specializations[key] = Specialization(
            key=key,
            context=context,
            wgsl=header + body,
            body_first_line=header.count("\n") + 1,
            overrides=tuple(overrides),
            workgroup_size=size.group(1).rstrip("u") if size.group(1)[0].isdigit() else size.group(1),
            workgroup_arrays=_workgroup_arrays(code),
            uses_subgroups=bool(SUBGROUP_USE.search(code)),
        )
    return RenderedPass(
        variant, pass_, f"{templates_dir.name}/{name}", key_names, tuple(specializations.values()), uniforms,
        tuple(f"{templates_dir.name}/{library}" for library in libraries),
    )


def _libraries(env: jinja2.Environment, source: str, templates_dir: Path) -> tuple[str, ...]:
    """The templates `source` imports, directly or through another import, sorted."""
    found: set[str] = set()
    pending = [source]
    while pending:
        for name in jinja2.meta.find_referenced_templates(env.parse(pending.pop())):
            if name is not None and name not in found and (templates_dir / name).is_file():
                found.add(name)
                pending.append((templates_dir / name).read_text())
    return tuple(sorted(found))


def _code(body: str) -> str:
    """`body` with its comments blanked (line breaks kept)."""
    return COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), body)


def _names(body: str, name: str) -> bool:
    """Whether WGSL text uses `name` as an identifier of its own (not a member: `params.name`)."""
    return re.search(rf"(?<![\w.]){re.escape(name)}\b", body) is not None


def _array_sizes(body: str) -> set[str]:
    """Names that size an array (`array<T, NAME>`, products too) or the workgroup: these must be
    pipeline constants, WGSL allows no uniform there."""
    found = set()
    for match in re.finditer(r"array<\s*(?:[\w]+|\w+<\s*\w+\s*>)\s*,\s*([\w\s*]+?)\s*>", body):
        found |= {f.strip() for f in match.group(1).split("*")}
    for match in re.finditer(r"@workgroup_size\(([^)]*)\)", body):
        found |= {f.strip() for f in re.split(r"[,*]", match.group(1))}
    return found


def _scope_uniforms(pass_: ResolvedPass, kept: set, numeric: dict, bodies: list[str], origin, name: str) -> tuple:
    """The request-dependent numeric values the bodies name and no array size needs, in scope order;
    `kept`: the manifest's `pipelineConstants`, left as overrides."""
    sizes = set().union(*(_array_sizes(b) for b in bodies)) if bodies else set()
    declared = {f.name: f for b in pass_.ir.bindings for f in b.fields}
    found = []
    for value in pass_.scope_values:
        if value.name not in numeric or not value.request_dependent or value.name in sizes | kept:
            continue
        if not any(_names(body, value.name) for body in bodies):
            continue
        kind = numeric[value.name]
        if value.name in declared and declared[value.name].type != kind:
            raise ManifestError([
                f"{origin}: Params field `{value.name}` is {declared[value.name].type}, but the value of that name the "
                f"template `{name}` reads is {kind}: rename one of them"
            ])
        found.append(ScopeUniform(value.name, kind, value, value.name in declared))
    if found and not any(b.kind == "uniform" for b in pass_.ir.bindings):
        names = ", ".join(u.name for u in found)
        raise ManifestError([
            f"{origin}: template `{name}` reads request-dependent values ({names}), which reach the shader through "
            "the uniform Params: add a uniform binding (`params`) to the pass"
        ])
    return tuple(found)


def _read_from_params(body: str, uniforms: tuple, pass_: ResolvedPass) -> str:
    """The body with every scope uniform read as `<uniform binding>.<name>` (`params.hidden`)."""
    if not uniforms:
        return body
    holder = next(b.name for b in pass_.ir.bindings if b.kind == "uniform")
    names = re.compile(rf"(?<![\w.])({'|'.join(re.escape(u.name) for u in uniforms)})\b")
    # Code between comments is rewritten; the comments stay as the template wrote them.
    parts = re.split(f"({COMMENT.pattern})", body, flags=re.S)
    return "".join(part if i % 2 else names.sub(lambda m: f"{holder}.{m.group(1)}", part) for i, part in enumerate(parts))


def render_op(op: ResolvedOp, templates_dir: Path) -> tuple[RenderedPass, ...]:
    env = make_environment(templates_dir)
    rendered, problems = [], []
    for variant in op.variants:
        names = {v.name for p in variant.passes for v in p.scope_values}
        for name, _ in op.ir.pipeline_constants + variant.ir.pipeline_constants:
            if name not in names:
                problems.append(f"{variant.ir.origin}: pipelineConstants names `{name}`, which is no value of this variant's passes")
        for pass_ in variant.passes:
            try:
                rendered.append(render_pass(op, variant, pass_, env, templates_dir))
            except ManifestError as error:
                problems.extend(error.problems)
            except jinja2.TemplateError as error:
                problems.append(f"{pass_.ir.origin}: template `{pass_.ir.template}`: {error}")
    if problems:
        raise ManifestError(problems)
    return tuple(rendered)


def missing_templates(variant: ResolvedVariant, templates_dir: Path) -> list[str]:
    return sorted({p.ir.template for p in variant.passes if not (templates_dir / p.ir.template).exists()})


def template_line(templates_dir: Path, name: str, context: dict, body_line: int) -> int | None:
    """Which template line produced line `body_line` of the rendered body (for naga's errors).

    Renders a copy with a `//@L<n>` marker at the end of every plain template line; trim_blocks
    drops whole tag lines, so rendered and marked bodies have the same lines. A line that a
    library macro wrote has no marker: it is the line of the call, whose marker ends the macro's
    output (the next marked line).
    """
    source = (templates_dir / name).read_text().splitlines()
    marked = "\n".join(line if any(tag in line for tag in ("{%", "%}", "{#", "#}")) else f"{line}//@L{n}" for n, line in enumerate(source, 1))
    body = make_environment(templates_dir).from_string(marked + "\n").render(context).splitlines()
    if not 0 < body_line <= len(body):
        return None
    for line in body[body_line - 1 :]:
        found = re.search(r"//@L(\d+)$", line)
        if found:
            return int(found.group(1))
    return None
