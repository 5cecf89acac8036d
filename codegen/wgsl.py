"""Render stage: ResolvedOp + templates/ -> WGSL text and its interface record per (variant, pass,
specialization).

Binding times (docs/MANIFEST.md, "Binding times"): string and boolean values with a finite domain
are specialization values, the only names a template sees through Jinja; a template reads a numeric
value with `{{ value.NAME }}`, which renders a WGSL `override` constant (declared here for the
values the render read) or, for a per-call value, a field of the `Params` uniform. What else the
shader is (its workgroup size and arrays, subgroups, f16) the template declares through `shader`
(shader_facts.py); the render returns those facts as data, and nothing reads them back from the
text. The resource declarations (`@group(0) @binding(i)`) come from the manifest's binding list, so
a template holds only the computation.

Each template is read once (`_ReadOnce`) and every specialization rendered once; the render itself
says which template line (of the pass's template or of a macro file it imports) made each line of
WGSL (`_LineMarkers`), so naga's errors are mapped without reading or rendering anything again.
Rendering problems are `Problem`s at the template line Jinja failed on.
"""

from __future__ import annotations

import functools
import re
import traceback
import weakref
from typing import NamedTuple
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
from jinja2.lexer import Token

from generated._runtime.plans import ShaderInterface

from .domains import key_combinations
from .problems import CompileError, Problem, TemplateLocation, closest
from .resolve import ResolvedOp, ResolvedPass, ResolvedVariant, Value
from .shader_facts import TEMPLATE_GLOBALS, WGSL_TYPES, ShaderFacts, ValueScope, recording

BUFFER_ACCESS = {"read-only-storage": "storage, read", "storage": "storage, read_write"}
BUILTIN_OVERRIDES = ("WORKGROUP_SIZE", "DISPATCH_FOLD_WIDTH")
# The WebGPU device feature the `enable f16;` directive needs: a shader that enables it on a device
# without it fails to compile (a wgpu validation error when the shader module is made).
F16_FEATURE = ("f16", "shader-f16")
# The names of the template objects (shader_facts.TEMPLATE_GLOBALS): no pass value may take one.
TEMPLATE_OBJECTS = tuple(TEMPLATE_GLOBALS)
# Macro libraries that op templates import (`{% import "_lib/stats.wgsl.jinja" as stats %}`): never an
# op template themselves.
LIBRARY = "_lib"


@dataclass(frozen=True)
class Specialization:
    key: tuple  # values of `key_names`, in order
    context: dict  # what Jinja saw
    wgsl: str
    body_first_line: int  # 1-based line of the rendered template inside `wgsl`
    interface: ShaderInterface  # what the shader declares: the runtime's record of it
    facts: ShaderFacts  # what the template declared while it rendered (the record is made from these)
    # For each line of the rendered template (line `body_first_line` of `wgsl` on), the template
    # line that wrote it (an imported macro's line, where a macro wrote it); None where unknown.
    line_map: tuple[TemplateLocation | None, ...] = ()


@dataclass(frozen=True)
class ScopeUniform:
    """A numeric scope value the shader reads from `Params` (dispatch time) instead of an override.

    The compiler adds one for every value a body reads (`{{ value.NAME }}`) that depends on the
    request (shapes, ranks, attributes, requested outputs) and sizes no workgroup array and no
    workgroup: the read renders as `params.<name>`, so a new shape reuses the pipeline. `declared` means the manifest's Params
    already has a field of that name, which the value then reads instead of adding one.
    """

    name: str
    type: str  # u32 | f32
    value: Value
    declared: bool


class KeyName(NamedTuple):
    """One position of a specialization key: a template value, a binding's element type, or
    whether a binding with a `when` is bound."""

    name: str  # the template value, or the binding
    element_type: bool = False
    bound: bool = False

    def __str__(self) -> str:
        return (
            f"{self.name} element type"
            if self.element_type
            else (f"{self.name} bound" if self.bound else self.name)
        )


@dataclass(frozen=True)
class RenderedPass:
    variant: ResolvedVariant
    pass_: ResolvedPass
    template: str  # repository-relative path
    key_names: tuple[KeyName, ...]  # template values, then bindings' element types
    specializations: tuple[Specialization, ...]
    scope_uniforms: tuple[ScopeUniform, ...] = ()  # appended to Params after the manifest's fields
    libraries: tuple[str, ...] = ()  # repository-relative paths of the templates it imports (templates/_lib/)

    @property
    def uniform_fields(self) -> tuple[tuple[str, str], ...]:
        """The pass's Params layout: the manifest's fields, then the compiler's, unpadded."""
        fields = [(f.name, f.type) for b in self.pass_.ir.bindings for f in b.fields]
        return tuple(fields) + tuple((u.name, u.type) for u in self.scope_uniforms if not u.declared)


def make_environment(templates_dir: Path) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
        extensions=["jinja2.ext.do"],  # `{% do shader.uses_subgroups() %}`: a declaration, no text
    )
    env.filters["fill_lines"] = fill_lines
    env.globals.update(TEMPLATE_GLOBALS)
    return env


# Unicode private-use characters: they occur in no WGSL text, no Jinja filter treats them as
# whitespace or a line break, and case changes leave them alone.
_MARK_OPEN, _MARK_CLOSE = "\ue000", "\ue001"
_MARK = re.compile(f"{_MARK_OPEN}([^{_MARK_CLOSE}]*):(\\d+){_MARK_CLOSE}")
FILL_WIDTH = 100  # columns, indentation included


def fill_lines(text: str, width: int = FILL_WIDTH) -> str:
    """`text` with its whole lines joined by a space, greedily, into lines of at most `width`
    columns: the `fill_lines` filter, around the statements a template unrolls
    (`{% filter fill_lines %}{% for j in range(unit_count) %}...{% endfor %}{% endfilter %}`).

    Unrolled loops must stay unrolled (a loop ran 1.3-2.1x slower on the GPU), and one statement a
    line made a bucket of 96 units 96 lines a loop in every shader store. WGSL reads the filled
    text as it read the lines: only whitespace changes. A line is never split, and never joined
    with a blank line, a line of another indentation or a line holding a comment (`//` would
    swallow what followed). A filled line keeps the line mark of its first line (`_LineMarkers`),
    so naga's errors there point at the template line of its first statement.
    """
    *lines, tail = text.split("\n")
    filled: list[list[str]] = []  # [indentation, joined statements, mark]
    for line in lines:
        found = _MARK.search(line)
        content = _MARK.sub("", line)
        body = content.strip()
        indent = content[: len(content) - len(content.lstrip())]
        last = filled[-1] if filled else None
        joinable = last is not None and body and last[1] and "//" not in body + last[1] and last[0] == indent
        if joinable and len(indent) + len(last[1]) + 1 + len(body) <= width:
            last[1] += " " + body
            # A line whose newline came from a value has no mark: take the first joined one's.
            last[2] = last[2] or (found.group(0) if found else "")
        else:
            filled.append([indent, body, found.group(0) if found else ""])
    return "".join(f"{indent}{body}{mark}\n" for indent, body, mark in filled) + tail


class _LineMarkers(jinja2.ext.Extension):
    """Marks, in the render itself, which template line made each line of the output.

    Every newline of literal template text gets `<open>name:line<close>` before it, in every
    template the environment loads (imported macro files too). Only `data` tokens change, never a
    tag, an expression or a comment, so the marks change nothing but the text around them;
    `_unmark` takes them out of the rendered text and returns them as its line map.
    """

    def filter_stream(self, stream):
        for token in stream:
            if token.type != "data" or "\n" not in token.value:
                yield token
                continue
            lines = token.value.split("\n")
            marked = [
                f"{text}{_MARK_OPEN}{stream.name}:{token.lineno + i}{_MARK_CLOSE}"
                for i, text in enumerate(lines[:-1])
            ]
            yield Token(token.lineno, "data", "\n".join(marked + lines[-1:]))


def _unmark(
    marked: str, folder: str, lines: dict | None = None
) -> tuple[str, tuple[TemplateLocation | None, ...]]:
    """The rendered text without marks, and for each of its lines the template line that made it.

    A line without a mark (its newline came from a value, not from template text) belongs to the
    template line whose mark comes next; a last line without a newline belongs to none. `lines`
    keeps each distinct marked line's (text, location) for the next call: the specializations
    of a template share most of their lines (138k lines rendered, 2.9k distinct).
    """
    lines = {} if lines is None else lines
    marked_lines = marked.split("\n")
    for line in set(marked_lines).difference(lines):
        found = _MARK.search(line)
        lines[line] = (
            _MARK.sub("", line),
            TemplateLocation(f"{folder}/{found.group(1)}", int(found.group(2))) if found else None,
        )
    unmarked = [lines[line] for line in marked_lines]
    locations = [location for _, location in unmarked]
    for i in reversed([i for i, location in enumerate(locations) if location is None]):
        locations[i] = locations[i + 1] if i + 1 < len(locations) else None
    return "\n".join([text for text, _ in unmarked]), tuple(locations)


class _ReadOnce(jinja2.BaseLoader):
    """The environment's own loader, with each template's text read from disk once: the variable
    analysis, the render and imports all use the text read first."""

    def __init__(
        self, loader: jinja2.BaseLoader, texts: dict[str, str] | None = None, folder: Path | None = None
    ):
        self.loader = loader
        self.sources: dict[str, tuple[str, str | None]] = {}
        # Texts the build's snapshot read already (sources.Snapshot.template_texts()): served as read.
        for name, text in (texts or {}).items():
            self.sources[name] = (text, str(folder / name) if folder else None)

    def get_source(self, environment: jinja2.Environment, name: str):
        if name not in self.sources:
            source, filename, _ = self.loader.get_source(environment, name)
            self.sources[name] = (source, filename)
        source, filename = self.sources[name]
        return source, filename, lambda: True

    def load(self, environment: jinja2.Environment, name: str, globals=None) -> jinja2.Template:
        """BaseLoader.load, compiling the tree that `_tree` parsed for the variable analysis
        instead of parsing the text again."""
        _, filename, uptodate = self.get_source(environment, name)
        code = environment.compile(_tree(environment, name), name, filename)
        return environment.template_class.from_code(
            environment, code, {} if globals is None else globals, uptodate
        )

    def list_templates(self) -> list[str]:
        return self.loader.list_templates()

    def name_of(self, filename: str) -> str | None:
        """The template name of a file read, for the frames of a Jinja traceback."""
        return next((name for name, (_, read) in self.sources.items() if read == filename), None)


def _render_environment(templates_dir: Path, texts: dict[str, str] | None = None) -> jinja2.Environment:
    """`make_environment`'s environment, reading each template once (or taking it from `texts`)
    and marking its lines."""
    env = make_environment(templates_dir)
    env.loader = _ReadOnce(env.loader, texts, templates_dir)
    env.add_extension(_LineMarkers)
    return env


@functools.lru_cache(maxsize=4)
def _shared_environment(templates_dir: Path, texts: tuple[tuple[str, str], ...]) -> jinja2.Environment:
    """One environment for every op rendered from the same template texts (the ops of a build, and
    the next build's): each template, a shared library too, is parsed and compiled once."""
    return _render_environment(templates_dir, dict(texts))


@dataclass(frozen=True)
class _Declarations:
    """The header the compiler writes above a rendered body, and what it declares there."""

    text: str
    features: tuple[tuple[str, str], ...]  # (WGSL extension, WebGPU feature) of its `enable` directives
    params: tuple[tuple[str, str], ...]  # the Params struct's fields, padding included; () without one
    bindings: tuple[tuple[int, str], ...]  # (index, WGSL variable)


def _declarations(
    pass_: ResolvedPass, element_types: dict, overrides: list[tuple[str, str]], uses_f16: bool, extra: tuple
) -> _Declarations:
    """The header of one specialization: `enable f16` (where the template declared f16 code or a
    binding holds f16), the overrides, and the bindings whose element types `element_types` holds
    (those bound in it), numbered in the manifest's order."""
    lines, features, params, bindings = [], [], (), []
    if uses_f16 or any(WGSL_TYPES[t].scalar == "f16" for t in element_types.values() if t in WGSL_TYPES):
        lines.append(f"enable {F16_FEATURE[0]};")
        features.append(F16_FEATURE)
    for name, kind in overrides:
        lines.append(f"override {name}: {kind};")
    declared = [b for b in pass_.ir.bindings if b.kind == "uniform" or b.name in element_types]
    for index, binding in enumerate(declared):
        bindings.append((index, binding.name))
        if binding.kind == "uniform":
            fields = [(f.name, f.type) for f in binding.fields] + list(extra)
            params = tuple(fields + [(f"_pad{i}", "u32") for i in range(-len(fields) % 4)])
            lines.append(f"struct {binding.struct_name} {{ {', '.join(f'{n}: {t}' for n, t in params)} }}")
            lines.append(f"@group(0) @binding({index}) var<uniform> {binding.name}: {binding.struct_name};")
        else:
            access = BUFFER_ACCESS[binding.buffer]
            lines.append(
                f"@group(0) @binding({index}) var<{access}> {binding.name}: array<{element_types[binding.name]}>;"
            )
    return _Declarations("\n".join(lines) + "\n\n", tuple(features), params, tuple(bindings))


def render_pass(
    op: ResolvedOp,
    variant: ResolvedVariant,
    pass_: ResolvedPass,
    env: jinja2.Environment,
    templates_dir: Path,
) -> RenderedPass:
    """Every specialization of one pass; `env` comes from `_render_environment` (its loader and
    line marks are what the line maps and the problems' template lines are made from)."""
    name = pass_.ir.template
    folder = templates_dir.name
    libraries = _libraries(pass_, env, folder)
    template_values = _template_values(pass_, env, folder)
    key_values = template_values + list(pass_.binding_keys)
    conditions = [Value(f"when:{i}", f"when_{i}", expr, code) for i, (expr, code) in enumerate(variant.when)]
    combos = key_combinations(op, variant, pass_, key_values, conditions, f"{folder}/{name}")
    key_names = (
        tuple(KeyName(v.name) for v in template_values)
        + tuple(KeyName(b, element_type=True) for b, _ in pass_.element_types)
        + tuple(KeyName(b, bound=True) for b, _ in pass_.bound)
    )
    renderer = _Bodies(env, variant, pass_, folder, key_names)
    kept = {n for n, _ in op.ir.pipeline_constants + variant.ir.pipeline_constants}
    bodies, uniforms = _rendered_bodies(
        renderer, combos, tuple(v.name for v in key_values), template_values, kept
    )
    extra = tuple((u.name, u.type) for u in uniforms if not u.declared)
    numeric = _numeric_names(pass_)
    from_params = {u.name for u in uniforms}
    specializations = []
    for key, body in bodies.items():
        # The overrides are the values the render read that are not Params fields, sorted.
        overrides = [(n, numeric[n]) for n in sorted(body.facts.reads) if n not in from_params]
        values = dict(zip(key_names, key))
        element_types = {
            b: values[KeyName(b, element_type=True)]
            for b, _ in pass_.element_types
            if values.get(KeyName(b, bound=True), True)
        }
        header = _declarations(pass_, element_types, overrides, body.facts.uses_f16, extra)
        specializations.append(_specialization(key, body, header, overrides, f"{folder}/{name}"))
    return RenderedPass(
        variant, pass_, f"{folder}/{name}", key_names, tuple(specializations), uniforms, libraries
    )


def _rendered_bodies(
    renderer: _Bodies,
    combos: list[dict],
    value_names: tuple[str, ...],
    template_values: list[Value],
    kept: set,
) -> tuple[dict[tuple, _Body], tuple[ScopeUniform, ...]]:
    """Every specialization's body, and the values the pass reads from Params.

    A request-dependent value is read from Params unless `pipelineConstants` keeps it (`kept`) or
    some specialization sizes the workgroup or a workgroup array with it (WGSL allows only an
    override there). Which values size what is known only once the bodies are rendered, so the
    render starts with every request-dependent value as a uniform and renders again, with the
    sizes found as overrides, each body that read one (`params.X` becomes `X`), until no size is
    read as a uniform: the sizes only grow, so this ends, in one further render where any.
    """
    pass_ = renderer.pass_
    numeric = _numeric_names(pass_)
    candidates = frozenset(
        v.name for v in pass_.scope_values if v.name in numeric and v.request_dependent and v.name not in kept
    )
    bodies = renderer.render(combos, value_names, template_values, _value_scope(pass_, candidates))
    while True:
        moved = candidates & frozenset().union(*(body.facts.sizes for body in bodies.values()))
        if not moved:
            break
        candidates -= moved
        bodies = renderer.render(
            combos, value_names, template_values, _value_scope(pass_, candidates), bodies, moved
        )
    read = frozenset().union(*(body.facts.reads for body in bodies.values()))
    return bodies, _scope_uniforms(pass_, candidates & read, numeric)


def _value_scope(pass_: ResolvedPass, uniforms: frozenset[str]) -> ValueScope:
    """How `value.X` renders in this pass: `uniforms` from the pass's uniform binding."""
    holder = next((b.name for b in pass_.ir.bindings if b.kind == "uniform"), "params")
    others = tuple(v.name for v in pass_.scope_values if v.code.type in ("str", "bool"))
    return ValueScope(_numeric_names(pass_), uniforms, holder, others)


def _numeric_names(pass_: ResolvedPass) -> dict[str, str]:
    """Every name a shader may read as an override or a uniform, with its WGSL type."""
    numeric = {
        v.name: ("f32" if v.code.type == "float" else "u32")
        for v in pass_.scope_values
        if v.code.type in ("int", "float")
    }
    if pass_.ir.dispatch.form == "threads":
        numeric["WORKGROUP_SIZE"] = "u32"
    numeric["DISPATCH_FOLD_WIDTH"] = "u32"
    return numeric


def _specialization(
    key: tuple, body: _Body, header: _Declarations, overrides: list, template: str
) -> Specialization:
    facts = body.facts
    interface = ShaderInterface(
        template=template,
        overrides=tuple(overrides),
        params=header.params,
        workgroup_size=facts.workgroup_size,
        workgroup_arrays=tuple((a.element.stride, a.factors) for a in facts.workgroup_arrays),
        uses_subgroups=facts.uses_subgroups,
        features=header.features,
        bindings=header.bindings,
    )
    return Specialization(
        key=key,
        context=body.context,
        wgsl=header.text + body.text,
        body_first_line=header.text.count("\n") + 1,
        interface=interface,
        facts=facts,
        line_map=body.line_map,
    )


@dataclass
class _Parsed:
    """What is known of an environment's templates, kept for every op and pass that reads them;
    a failure is not kept: it is raised again, and reported where it is found."""

    trees: dict[str, jinja2.nodes.Template] = field(default_factory=dict)
    undeclared: dict[str, frozenset[str]] = field(
        default_factory=dict
    )  # names a template reads and does not set
    referenced: dict[str, tuple[str | None, ...]] = field(default_factory=dict)  # see `_referenced`
    unmarked_lines: dict[str, tuple] = field(default_factory=dict)  # see `_unmark`


_PARSED: "weakref.WeakKeyDictionary[jinja2.Environment, _Parsed]" = weakref.WeakKeyDictionary()


def _tree(env: jinja2.Environment, name: str) -> jinja2.nodes.Template:
    """A template's syntax tree, parsed once per environment however many passes read it."""
    trees = _PARSED.setdefault(env, _Parsed()).trees
    if name not in trees:
        source, filename, _ = env.loader.get_source(env, name)
        trees[name] = env.parse(source, name, filename)
    return trees[name]


def _undeclared(env: jinja2.Environment, name: str) -> frozenset[str]:
    """The names a template reads and does not set, found once per environment (Jinja finds them
    by generating the template's code: as long as compiling it)."""
    undeclared = _PARSED.setdefault(env, _Parsed()).undeclared
    if name not in undeclared:
        undeclared[name] = frozenset(jinja2.meta.find_undeclared_variables(_tree(env, name)))
    return undeclared[name]


def _referenced(env: jinja2.Environment, name: str) -> tuple[str | None, ...]:
    """The templates a template imports or includes by name (None for a computed name), found once
    per environment: the 51 passes of a build share 28 templates."""
    referenced = _PARSED.setdefault(env, _Parsed()).referenced
    if name not in referenced:
        referenced[name] = tuple(jinja2.meta.find_referenced_templates(_tree(env, name)))
    return referenced[name]


def _libraries(pass_: ResolvedPass, env: jinja2.Environment, folder: str) -> tuple[str, ...]:
    """The library templates a pass's template imports, directly or through another, sorted; a
    library named as the pass's own template is refused."""
    name = pass_.ir.template
    if name.startswith(f"{LIBRARY}/"):
        raise CompileError(
            [
                Problem(
                    pass_.ir.origin, f"`{name}` is a macro library ({folder}/{LIBRARY}/), not an op template"
                )
            ]
        )
    found: set[str] = set()
    pending = [name]
    while pending:
        try:
            referenced = _referenced(env, pending.pop())
        except (jinja2.TemplateNotFound, jinja2.TemplateSyntaxError):
            continue  # reported where the template is parsed for rendering
        for library in referenced:
            if library is not None and library not in found:
                found.add(library)
                pending.append(library)
    return tuple(f"{folder}/{library}" for library in sorted(found))


def _template_values(pass_: ResolvedPass, env: jinja2.Environment, folder: str) -> list[Value]:
    """The pass values the template reads through Jinja: the names it reads that the pass defines.

    A name the pass does not define stays undefined: a shared template may test it with
    `is defined`, and StrictUndefined fails the render on any other use.
    """
    origin, name = pass_.ir.origin, pass_.ir.template
    try:
        tree = _tree(env, name)
    except jinja2.TemplateNotFound:
        known = env.loader.list_templates()
        suggestion = closest(name, known)
        hint = f"; did you mean `{suggestion}`?" if suggestion else ""
        raise CompileError(
            [Problem(origin, f"template `{name}` does not exist in {folder}/{hint}")]
        ) from None
    except jinja2.TemplateSyntaxError as error:
        where = TemplateLocation(f"{folder}/{error.name or name}", error.lineno)
        raise CompileError(
            [Problem(origin, f"Jinja syntax error: {error.message}", template=where)]
        ) from None
    values = {v.name: v for v in pass_.scope_values}
    problems = [
        Problem(
            origin,
            f"the pass has a value named `{reserved}`, the name of the template's `{reserved}` object "
            "(docs/TEMPLATES.md): rename the value",
        )
        for reserved in TEMPLATE_OBJECTS
        if reserved in values
    ]
    used = sorted(v for v in _undeclared(env, name) if v in values)
    problems += [
        Problem(
            origin,
            f"the template reads `{variable}` through Jinja, but it is a number: a template reads a number "
            f"as `{{{{ value.{variable} }}}}` (a pipeline override or a Params field)",
            template=TemplateLocation(f"{folder}/{name}", _first_read(tree, variable)),
        )
        for variable in used
        if values[variable].code.type not in ("str", "bool")
    ]
    if problems:
        raise CompileError(problems)
    return [values[v] for v in used]


def _first_read(tree: jinja2.nodes.Template, variable: str) -> int | None:
    lines = [
        node.lineno
        for node in tree.find_all(jinja2.nodes.Name)
        if node.name == variable and node.ctx == "load"
    ]
    return min(lines, default=None)


@dataclass(frozen=True)
class _Body:
    """One rendered specialization of a template, before the compiler's declarations."""

    context: dict  # what Jinja saw
    text: str
    line_map: tuple[TemplateLocation | None, ...]
    facts: ShaderFacts


class _Bodies:
    """Renders a pass's template once per specialization key, recording what it declares; a
    failure is a `Problem` at the template line Jinja failed on, reported once however many
    specializations hit it."""

    def __init__(
        self,
        env: jinja2.Environment,
        variant: ResolvedVariant,
        pass_: ResolvedPass,
        folder: str,
        key_names: tuple[KeyName, ...],
    ):
        self.env, self.variant, self.pass_, self.folder = env, variant, pass_, folder
        self.key_names = key_names  # how problems name the key positions

    def render(
        self,
        combos: list[dict],
        value_names: tuple[str, ...],
        template_values: list[Value],
        scope: ValueScope,
        previous: dict[tuple, _Body] | None = None,
        moved: frozenset[str] = frozenset(),
    ) -> dict[tuple, _Body]:
        """Bodies by key: the values of `value_names` (the enumeration's names) in order. A body of
        `previous` that read none of the `moved` values renders as it did, and is kept."""
        template = self.env.get_template(self.pass_.ir.template)  # parsed already: no syntax error here
        bodies: dict[tuple, _Body] = {}
        failures: dict[tuple[TemplateLocation, str], list[tuple]] = defaultdict(list)
        for combo in combos:
            key = tuple(combo[n] for n in value_names)
            if key in bodies or any(key in keys for keys in failures.values()):
                continue
            if previous is not None and not previous[key].facts.reads & moved:
                bodies[key] = previous[key]
                continue
            context = {v.name: combo[v.name] for v in template_values}
            try:
                with recording(scope) as declared:
                    marked = template.render(context)
                    facts = declared.facts()
            except Exception as error:  # a template is code: whatever it raises is its problem
                failures[(self.location(error), self.detail(error))].append(key)
                continue
            text, line_map = _unmark(
                marked, self.folder, _PARSED.setdefault(self.env, _Parsed()).unmarked_lines
            )
            bodies[key] = _Body(context, text, line_map, facts)
        if failures:
            raise CompileError(
                [self.problem(where, detail, keys) for (where, detail), keys in failures.items()]
            )
        return bodies

    def location(self, error: Exception) -> TemplateLocation:
        """A syntax error's own line (an imported file's too); else the innermost template frame
        of the traceback, which Jinja rewrites to template file and line."""
        if isinstance(error, jinja2.TemplateSyntaxError) and error.name:
            return TemplateLocation(f"{self.folder}/{error.name}", error.lineno)
        for frame in reversed(traceback.extract_tb(error.__traceback__)):
            name = self.env.loader.name_of(frame.filename)
            if name is not None:
                return TemplateLocation(f"{self.folder}/{name}", frame.lineno)
        return TemplateLocation(f"{self.folder}/{self.pass_.ir.template}")

    def detail(self, error: Exception) -> str:
        if isinstance(error, jinja2.TemplateSyntaxError):
            return f"Jinja syntax error: {error.message}"
        if isinstance(error, jinja2.TemplateNotFound):
            return f"no template `{error.name}` in {self.folder}/"
        if not isinstance(error, jinja2.TemplateError):
            return f"{type(error).__name__}: {error}"
        undefined = re.fullmatch(r"'(\w+)' is undefined", str(error))
        suggestion = (
            closest(undefined.group(1), [v.name for v in self.pass_.scope_values]) if undefined else None
        )
        return f"{error}; did you mean `{suggestion}`?" if suggestion else str(error)

    def problem(self, where: TemplateLocation, detail: str, keys: list[tuple]) -> Problem:
        shown = ", ".join(f"{n}={v!r}" for n, v in zip(self.key_names, keys[0]))
        more = f" and {len(keys) - 1} more" if len(keys) > 1 else ""
        head = f"Jinja failed rendering variant {self.variant.ir.id}, pass {self.pass_.ir.id}, specialization [{shown}]{more}"
        return Problem(self.pass_.ir.origin, f"{head}: {detail}", template=where)


def _scope_uniforms(pass_: ResolvedPass, read: frozenset[str], numeric: dict) -> tuple[ScopeUniform, ...]:
    """The request-dependent values the bodies read from Params (`read`), in scope order."""
    origin, name = pass_.ir.origin, pass_.ir.template
    declared = {f.name: f for b in pass_.ir.bindings for f in b.fields}
    found = []
    for value in pass_.scope_values:
        if value.name not in read:
            continue
        kind = numeric[value.name]
        if value.name in declared and declared[value.name].type != kind:
            message = (
                f"Params field `{value.name}` is {declared[value.name].type}, but the value of that name the "
                f"template `{name}` reads is {kind}: rename one of them"
            )
            raise CompileError([Problem(origin, message)])
        found.append(ScopeUniform(value.name, kind, value, value.name in declared))
    if found and not any(b.kind == "uniform" for b in pass_.ir.bindings):
        names = ", ".join(u.name for u in found)
        message = (
            f"template `{name}` reads request-dependent values ({names}), which reach the shader through "
            "the uniform Params: add a uniform binding (`params`) to the pass"
        )
        raise CompileError([Problem(origin, message)])
    return tuple(found)


def render_op(
    op: ResolvedOp, templates_dir: Path, texts: dict[str, str] | None = None
) -> tuple[RenderedPass, ...]:
    """Every pass of every variant, each specialization rendered once; raises CompileError.
    `texts`: the template texts, by name, where the caller read them already."""
    env = (
        _render_environment(templates_dir)
        if texts is None
        else _shared_environment(templates_dir, tuple(sorted(texts.items())))
    )
    rendered, problems = [], []
    for variant in op.variants:
        names = {v.name for p in variant.passes for v in p.scope_values}
        for name, _ in op.ir.pipeline_constants + variant.ir.pipeline_constants:
            if name not in names:
                suggestion = closest(name, names)
                hint = f"; did you mean `{suggestion}`?" if suggestion else ""
                problems.append(
                    Problem(
                        variant.ir.origin,
                        f"pipelineConstants names `{name}`, which is no value of this variant's passes{hint}",
                    )
                )
        for pass_ in variant.passes:
            try:
                rendered.append(render_pass(op, variant, pass_, env, templates_dir))
            except CompileError as error:
                problems.extend(error.problems)
    if problems:
        raise CompileError(problems)
    return tuple(rendered)


def missing_templates(variant: ResolvedVariant, templates_dir: Path, names=None) -> list[str]:
    """The variant's templates that are not written yet (not in `names`, where given, else not on disk)."""
    exists = (lambda t: t in names) if names is not None else (lambda t: (templates_dir / t).exists())
    return sorted({p.ir.template for p in variant.passes if not exists(p.ir.template)})
