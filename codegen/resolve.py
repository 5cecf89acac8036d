"""Name-resolution stage: ir.Op -> ResolvedOp, every manifest expression compiled in its scope.

Scopes nest as docs/MANIFEST.md, "Scopes", says: manifest `derive` values are visible everywhere;
`when` and `demoteWhen` see only those; variant values (`constants`/`derive`) are visible to the variant's
intermediates and passes; pass values (`source.inputs`/`derive`) to that pass's dispatch,
uniforms, element types and template. Derived values compile on first use, which orders them and
finds cycles. The contract (rules every variant needs) is extracted here too.

Every expression is compiled even after one fails, so one run reports every problem; a value that
failed is reported once, where it is written, and not again by each value that reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import jinja2.nodes as nodes

from generated._runtime.caps import WEBGPU_DEFAULT_LIMITS

from .expr import (
    DERIVED,
    REQUEST,
    VALUES,
    Compiled,
    Compiler,
    ExprError,
    Scope,
    Symbol,
    compile_expr,
    parse,
    request_local,
    snake,
)
from .ir import Derive, Expr, Op, Pass, Tensor, UniformField, Variant
from .problems import CompileError, Problem

DEVICE_LOCALS = {
    "limits": f"{REQUEST}.caps.limits",
    "features": f"{REQUEST}.caps.features",
    "wgsl_features": f"{REQUEST}.caps.wgsl_language_features",
    "adapter_info": f"{REQUEST}.caps.adapter_info",
    "dispatch_fold_width": f"fold_width({REQUEST}.caps)",
}


# Preamble locals that come from the request itself, dispatch-time facts (docs/MANIFEST.md, "Binding times"):
# shapes and ranks (`shape_<key>`), attributes (`attr_<name>`), and `request` (`has(shapes, ...)`, `outputs.has`).
_REQUEST_LOCAL_PREFIXES = (request_local("shape", ""), request_local("attr", ""))


def reads_request(code: Compiled) -> bool:
    """Whether compiled text reads a shape, a rank, an attribute or the requested outputs itself."""
    return REQUEST in code.locals or any(local.startswith(_REQUEST_LOCAL_PREFIXES) for local in code.locals)


@dataclass(frozen=True)
class Value:
    """One named value as the generated code computes it: `var = python  # name: source`."""

    name: str
    var: str
    expr: Expr
    code: Compiled
    # Depends, directly or through derived values, on shapes, ranks, attributes or the requested
    # outputs: a value that changes from request to request, bound at dispatch time (`Params`).
    request_dependent: bool = False


@dataclass(frozen=True)
class Subject:
    """What a contract clause is about, as an error names it: `input X`, `attribute num_groups`,
    `dtype T`, or the device (`kind` "device", no name)."""

    kind: str  # "input" | "output" | "attribute" | "dtype" | "device"
    name: str = ""  # the tensor's role, the attribute, the type variable

    def __str__(self) -> str:
        return f"{self.kind} {self.name}" if self.name else self.kind


@dataclass(frozen=True)
class Rule:
    """One contract clause: every variant needs it, so breaking it is the caller's error."""

    source: str  # the clause in manifest syntax
    code: Compiled
    subject: Subject
    facts: tuple[tuple[str, Compiled], ...]  # the names the clause reads, to print their values
    # The clause is `f16Ok(dtypes.T)`: it fails only for float16 on a device without shader-f16.
    needs_shader_f16: bool = False
    # The bind key of the input the subject names, or None: a refusal names that input as the
    # caller did (`request.names`), the subject's ONNX name where the request has none.
    input_key: str | None = None

    @property
    def reads_derived(self) -> bool:
        return DERIVED in self.code.locals


class NamedCode(NamedTuple):
    """A compiled expression and the name it is known by (a dispatch key, a binding's name)."""

    name: str
    code: Compiled


class FieldCode(NamedTuple):
    """A Params field and its compiled `value`."""

    field: UniformField
    code: Compiled


class ClauseCode(NamedTuple):
    """An expression and its compiled form: a `when` / `demoteWhen` clause, a binding's element type."""

    expr: Expr
    code: Compiled


class ShapeCode(NamedTuple):
    """An output tensor or an intermediate, and its compiled shape."""

    of: Any  # ir.Tensor | ir.Intermediate
    code: Compiled


@dataclass(frozen=True)
class ResolvedPass:
    ir: Pass
    derives: tuple[Value, ...]
    dispatch: tuple[NamedCode, ...]
    uniforms: tuple[FieldCode, ...]
    element_types: tuple[NamedCode, ...]  # binding name -> WGSL type (a str value)
    scope_values: tuple[
        Value, ...
    ]  # variant then pass values, pass values winning: what the template may see
    bound: tuple[
        NamedCode, ...
    ] = ()  # binding name -> whether it is bound (a bool), for bindings with a `when`
    # The specialization keys the bindings add, as values with their expressions (domains.py reads
    # them): `binding:<name>` each element type, then `bound:<name>` each `when`.
    binding_keys: tuple[Value, ...] = ()


@dataclass(frozen=True)
class ResolvedVariant:
    ir: Variant
    when: tuple[ClauseCode, ...]
    demote_when: tuple[ClauseCode, ...]
    derives: tuple[Value, ...]
    intermediates: tuple[ShapeCode, ...]
    passes: tuple[ResolvedPass, ...]


@dataclass(frozen=True)
class ResolvedOp:
    ir: Op
    derives: tuple[Value, ...]
    output_shapes: tuple[ShapeCode, ...]
    rules: tuple[Rule, ...]
    variants: tuple[ResolvedVariant, ...]

    def attribute_kind(self, name: str) -> str:
        return _attribute_kind(self.ir, name)


def _attribute_kind(op: Op, name: str) -> str:
    for attribute in op.attributes:
        if attribute.name == name:
            sample = attribute.default if attribute.default is not None else (attribute.allowed or (0,))[0]
            return "float" if isinstance(sample, float) else "int"
    raise KeyError(name)


class _AlreadyReported(Exception):
    """A value that failed to compile was read again: its problem is in the list already, and what
    reads it fails only because of it, so nothing more is reported."""


class _Level:
    """The derived values of one scope level, compiled lazily in dependency order; a value that
    failed stays failed (`failed`), so it is compiled, and reported, once."""

    def __init__(self, derives: tuple[Derive, ...], make_scope, var_prefix: str = "", levels=None):
        self.specs = {d.name: d for d in derives}
        self.make_scope = make_scope
        self.var_prefix = var_prefix
        self.levels = levels  # () -> {"manifest" | "variant" | "pass": _Level}: where a ref points
        self.done: dict[str, Value] = {}
        self.failed: set[str] = set()
        self.active: list[str] = []

    def get(self, name: str) -> Value | None:
        if name not in self.specs:
            return None
        if name in self.done:
            return self.done[name]
        if name in self.failed:
            raise _AlreadyReported(name)
        spec = self.specs[name]
        if name in self.active:
            cycle = " -> ".join(self.active[self.active.index(name) :] + [name])
            raise ExprError(spec.expr.origin, spec.expr.text(), f"cycle between derived values: {cycle}")
        self.active.append(name)
        try:
            code = compile_expr(spec.expr, self.make_scope())
        except (ExprError, _AlreadyReported):
            self.failed.add(name)
            raise
        finally:
            self.active.pop()
        self.done[name] = Value(
            name, self.var_prefix + snake(name), spec.expr, code, self.request_dependent(code)
        )
        return self.done[name]

    def request_dependent(self, code: Compiled) -> bool:
        if reads_request(code):
            return True
        levels = self.levels() if self.levels is not None else {"manifest": self}
        # Every ref was compiled before this value (compile on first use), so it is in `done`.
        return any(levels[level].done[name].request_dependent for level, name in code.refs)

    def compiled(self) -> tuple[Value, ...]:
        """The values compiled so far: dependencies were compiled first, so insertion order is a
        valid evaluation order."""
        return tuple(self.done.values())


class _Resolver:
    def __init__(self, op: Op):
        self.op = op
        self.tensors: dict[str, Tensor] = {}
        for tensor in op.tensors:
            self.tensors[tensor.key] = tensor
            self.tensors.setdefault(tensor.role, tensor)
        self.attributes = {a.name for a in op.attributes}
        self.tunables = dict(op.tunables)
        self.type_vars = {name for name, _ in op.type_constraints}
        self.manifest = _Level(
            op.derives, lambda: self.scope("manifest"), levels=lambda: {"manifest": self.manifest}
        )
        self.problems: list[Problem] = []

    def attempt(self, make):
        """`make()`, or None when it fails; its problem is collected (once: see `_AlreadyReported`)."""
        try:
            return make()
        except ExprError as error:
            self.problems.append(error.problem)
        except _AlreadyReported:
            pass
        return None

    def values(self, level: _Level) -> tuple[Value, ...]:
        """Every value of a level, each attempted on its own."""
        for name in level.specs:
            self.attempt(lambda: level.get(name))
        return level.compiled()

    # names --------------------------------------------------------------------------------------

    def builtin(self, path: tuple[str, ...], allow_fold: bool) -> Symbol | None:
        head, rest = path[0], path[1:]
        if head in ("shapes", "ranks") and len(rest) == 1 and rest[0] in self.tensors:
            var = request_local("shape", self.tensors[rest[0]].key)
            return Symbol(
                var if head == "shapes" else f"len({var})",
                "shape" if head == "shapes" else "int",
                frozenset({var}),
            )
        if head == "dtypes" and len(rest) == 1 and rest[0] in self.type_vars:
            var = request_local("dtype", rest[0])
            return Symbol(var, "str", frozenset({var}))
        if head == "attrs" and len(rest) == 1 and rest[0] in self.attributes:
            var = request_local("attr", rest[0])
            return Symbol(var, _attribute_kind(self.op, rest[0]), frozenset({var}))
        if head == "tunables" and len(rest) == 1 and rest[0] in self.tunables:
            var = request_local("tunable", rest[0])
            kind = "float" if isinstance(self.tunables[rest[0]], float) else "int"
            return Symbol(var, kind, frozenset({var}))
        if path == ("shapes",):
            # The local REQUEST marks both as request-dependent, never a compile-time (finite) value.
            return Symbol(
                f"{REQUEST}.shapes", "map", frozenset({REQUEST})
            )  # has(shapes, "bias"): is an optional input present
        if path == ("outputs",):
            return Symbol(
                f"{REQUEST}.outputs", "set", frozenset({REQUEST})
            )  # outputs.has("S"): was an optional output asked for
        if head == "device":
            return self.device(rest)
        if path == ("DISPATCH_FOLD_WIDTH",) and allow_fold:
            return Symbol("dispatch_fold_width", "int", frozenset({"dispatch_fold_width"}))
        return None

    @staticmethod
    def device(rest: tuple[str, ...]) -> Symbol | None:
        if len(rest) == 2 and rest[0] == "limits" and rest[1] in WEBGPU_DEFAULT_LIMITS:
            return Symbol(f'limits["{rest[1]}"]', "int", frozenset({"limits"}))
        if rest == ("features",):
            return Symbol("features", "set", frozenset({"features"}))
        if rest == ("wgslLanguageFeatures",):
            return Symbol("wgsl_features", "set", frozenset({"wgsl_features"}))
        if rest == ("adapterInfo",):
            return Symbol("adapter_info", "map", frozenset({"adapter_info"}))
        if len(rest) == 2 and rest[0] == "adapterInfo":
            return Symbol(f'adapter_info["{rest[1]}"]', "int", frozenset({"adapter_info"}))
        return None

    def scope(self, where: str, variant: _Level | None = None, pass_: _Level | None = None) -> Scope:
        """`where`: manifest | select (when/demoteWhen) | variant | pass: decides how values are read."""

        def resolve(path: tuple[str, ...]) -> Symbol | None:
            if len(path) == 1:
                for level, local_in in ((pass_, "pass"), (variant, "variant"), (self.manifest, "manifest")):
                    value = level.get(path[0]) if level is not None else None
                    if value is None:
                        continue
                    ref = frozenset({(local_in, value.name)})
                    fraction = value.code.fraction
                    if local_in == where:
                        return Symbol(value.var, value.code.type, frozenset(), ref, fraction)
                    holder = {"manifest": DERIVED, "variant": VALUES}[local_in]
                    return Symbol(
                        f"{holder}.{value.var}", value.code.type, frozenset({holder}), ref, fraction
                    )
            return self.builtin(path, allow_fold=where == "pass")

        def describe() -> str:
            names = list(self.manifest.specs)
            for level in (variant, pass_):
                names += list(level.specs) if level else []
            return ", ".join(["shapes.*", "ranks.*", "dtypes.*", "attrs.*", "tunables.*", "device.*", *names])

        return Scope(resolve, describe)

    # the op -------------------------------------------------------------------------------------

    def resolve(self) -> ResolvedOp:
        derives = self.values(self.manifest)
        outputs = [
            self.attempt(
                lambda: ShapeCode(t, compile_expr(t.shape, self.scope("manifest"), ("shape", "list")))
            )
            for t in self.op.outputs
        ]
        for tensor in self.op.tensors:
            if tensor.rank is not None:
                self.attempt(lambda: compile_expr(tensor.rank, self.scope("select"), ("int", "float")))
        variants = [self.variant(v) for v in self.op.variants]
        # The contract recompiles rank and `when` clauses compiled above: after a problem there it
        # would only report that problem again, under the clause's text.
        rules = self.attempt(self.contract) if not self.problems else None
        if self.problems:
            raise CompileError(self.problems)
        return ResolvedOp(self.op, derives, tuple(outputs), rules, tuple(variants))

    def variant(self, variant: Variant) -> ResolvedVariant:
        select = self.scope("select")
        when = tuple(
            self.attempt(lambda: ClauseCode(e, compile_expr(e, select, "bool"))) for e in variant.when
        )
        demote = tuple(
            self.attempt(lambda: ClauseCode(e, compile_expr(e, select, "bool"))) for e in variant.demote_when
        )
        level = _Level(
            variant.derives,
            lambda: self.scope("variant", level),
            levels=lambda: {"manifest": self.manifest, "variant": level},
        )
        values = self.values(level)
        intermediates = tuple(
            self.attempt(
                lambda: ShapeCode(i, compile_expr(i.shape, self.scope("variant", level), ("list", "shape")))
            )
            for i in variant.intermediates
        )
        passes = tuple(self.pass_(p, level) for p in variant.passes)
        return ResolvedVariant(variant, when, demote, values, intermediates, passes)

    def pass_(self, pass_: Pass, variant_level: _Level) -> ResolvedPass:
        level = _Level(
            pass_.derives,
            lambda: self.scope("pass", variant_level, level),
            levels=lambda: {"manifest": self.manifest, "variant": variant_level, "pass": level},
        )
        values = self.values(level)
        scope = self.scope("pass", variant_level, level)
        dispatch = tuple(
            self.attempt(lambda: NamedCode(k, compile_expr(e, scope, ("int", "float"))))
            for k, e in pass_.dispatch.values
        )
        uniforms = tuple(
            self.attempt(
                lambda: FieldCode(
                    f,
                    compile_expr(
                        f.value, scope, ("int", "float", "bool") if f.type != "f32" else ("int", "float")
                    ),
                )
            )
            for b in pass_.bindings
            for f in b.fields
        )
        typed = [
            (b.name, self.attempt(lambda: self.element_type(b.element_type, scope)))
            for b in pass_.bindings
            if b.element_type is not None
        ]
        bound = tuple(
            self.attempt(lambda: self.bound(b, scope)) for b in pass_.bindings if b.when is not None
        )
        element_types = tuple(NamedCode(name, t.code) for name, t in typed if t is not None)
        keys = [
            Value(f"binding:{name}", f"binding_{name}", t.expr, t.code) for name, t in typed if t is not None
        ]
        whens = {b.name: b.when for b in pass_.bindings}
        keys += [
            Value(f"bound:{n.name}", f"bound_{n.name}", whens[n.name], n.code) for n in bound if n is not None
        ]
        shadowed = {v.name for v in values}
        visible = tuple(v for v in variant_level.compiled() if v.name not in shadowed) + values
        return ResolvedPass(pass_, values, dispatch, uniforms, element_types, visible, bound, tuple(keys))

    def bound(self, binding, scope: Scope) -> NamedCode:
        """A binding's `when`. It must read the request only through named values (`hasBias`, a
        `derive` of `has(shapes, "bias")`): the compiler enumerates each named boolean once, so a
        `when` that read the request itself would be enumerated apart from the template value that
        says the same, and render shaders binding what their code does not have."""
        code = compile_expr(binding.when, scope, "bool")
        if reads_request(code):
            raise ExprError(
                binding.when.origin,
                binding.when.text(),
                'a binding\'s `when` must name derived values, not read the request itself: derive it (`hasBias: has(shapes, "bias")`) and name that',
            )
        return NamedCode(binding.name, code)

    def element_type(self, expr: Expr, scope: Scope) -> ClauseCode:
        """`$name` reads a value (`$T` with no value named T means dtypes.T); other text is WGSL.
        The expression read (`dtypes.T`, `ioElement`), or the text, and its code."""
        text = expr.literal if expr.is_literal else expr.source
        if not isinstance(text, str):
            raise ExprError(expr.origin, expr.text(), "an element type must be WGSL type text or `$name`")
        if not text.startswith("$"):
            return ClauseCode(expr, Compiled(repr(text), "str", 9, constant=text, is_constant=True))
        name = text[1:]
        target = Expr(name if scope.lookup((name,)) is not None else f"dtypes.{name}", None, expr.origin)
        return ClauseCode(target, compile_expr(target, scope, "str"))

    # the contract -------------------------------------------------------------------------------

    def conjuncts(self, expr: Expr) -> list[nodes.Node]:
        """The `and`-clauses of an expression, expanding manifest derives that are conjunctions."""
        out: list[nodes.Node] = []

        def walk(node: nodes.Node) -> None:
            if isinstance(node, nodes.And):
                walk(node.left)
                walk(node.right)
            elif isinstance(node, nodes.Name) and node.name in self.manifest.specs:
                spec = self.manifest.specs[node.name].expr
                if spec.is_literal:
                    out.append(nodes.Const(spec.literal))
                else:
                    walk(parse(spec.source, spec.origin))
            else:
                out.append(node)

        if expr.is_literal:
            return [nodes.Const(expr.literal)]
        walk(parse(expr.source, expr.origin))
        return out

    def contract(self) -> tuple[Rule, ...]:
        clauses: dict[str, nodes.Node] = {}
        for tensor in self.op.inputs:
            if tensor.rank is not None:
                text = f"ranks.{tensor.role} == {tensor.rank.text()}"
                if tensor.optional:
                    text = f'not has(shapes, "{tensor.key}") or {text}'
                clause = Expr(text, None, tensor.rank.origin)
                for node in self.conjuncts(clause):
                    clauses.setdefault(unparse(node), node)
        needed_by_all: set[str] | None = None
        ordered: dict[str, nodes.Node] = {}
        for variant in self.op.variants:
            mine = {}
            for entry in variant.when:
                for node in self.conjuncts(entry):
                    mine.setdefault(unparse(node), node)
            for key, node in mine.items():
                ordered.setdefault(key, node)
            needed_by_all = set(mine) if needed_by_all is None else needed_by_all & set(mine)
        for key, node in ordered.items():
            if needed_by_all and key in needed_by_all and not isinstance(node, nodes.Const):
                clauses.setdefault(key, node)
        origin_expr = Expr("", None, self.op.variants[0].origin.child("when") if self.op.variants else None)
        # The "select" scope reads derived values as `derived.name`: such rules run after derive().
        scope = self.scope("select")
        rules, seen = [], set()
        for source, node in clauses.items():
            compiler = Compiler(Expr(source, None, origin_expr.origin), scope)
            code = compiler.visit(node)
            if code.type != "bool" or code.python in seen:
                continue  # `ranks.B` and `ranks.b` are one rule under two names
            seen.add(code.python)
            facts = []
            for leaf in _leaves(node):
                text = unparse(leaf)
                if text not in dict(facts):
                    facts.append((text, compiler.visit(leaf)))
            subject, input_key = self.subject(node)
            rules.append(Rule(source, code, subject, tuple(facts), _is_f16_check(node), input_key))
        return tuple(rules)

    def subject(self, node: nodes.Node) -> tuple[Subject, str | None]:
        """What a clause is about, as a refusal's subject, and the bind key when that is an input."""
        for call in node.find_all(nodes.Call):  # outputs.has("mean"): a rule about asking for an output
            target = _path(call.node)
            if target == ("outputs", "has") and call.args and isinstance(call.args[0], nodes.Const):
                tensor = self.tensors.get(call.args[0].value)
                if tensor is not None:
                    return Subject("output", tensor.role), None
        for leaf in node.find_all((nodes.Name, nodes.Getattr)):
            path = _path(leaf)
            if path and path[0] in ("shapes", "ranks") and len(path) == 2:
                tensor = self.tensors[path[1]]
                if tensor.is_output:
                    return Subject("output", tensor.role), None
                return Subject("input", tensor.role), tensor.key
            if path and path[0] == "attrs":
                return Subject("attribute", path[1]), None
            if path and path[0] == "dtypes":
                return Subject("dtype", path[1]), None
        return Subject("device"), None


def _is_f16_check(node: nodes.Node) -> bool:
    """Whether a clause is `f16Ok(dtypes.<T>)` (the call itself, not a clause that contains one)."""
    return (
        isinstance(node, nodes.Call)
        and isinstance(node.node, nodes.Name)
        and node.node.name == "f16Ok"
        and len(node.args) == 1
        and (_path(node.args[0]) or ())[:1] == ("dtypes",)
    )


def _path(node: nodes.Node) -> tuple[str, ...] | None:
    if isinstance(node, nodes.Name):
        return (node.name,)
    if isinstance(node, nodes.Getattr):
        base = _path(node.node)
        return None if base is None else base + (node.attr,)
    return None


def _leaves(node: nodes.Node) -> list[nodes.Node]:
    """The readable facts inside a clause: names, dotted names and helper calls on shapes."""
    if _path(node) is not None:
        return [node]
    if (
        isinstance(node, nodes.Call)
        and isinstance(node.node, nodes.Name)
        and node.node.name in ("dim", "inner", "outer", "numel")
    ):
        return [node]
    if isinstance(node, nodes.Call):
        if isinstance(node.node, nodes.Getattr):
            return []  # device.features.has("x"): the clause itself says what is missing
        children = node.args
    else:
        children = list(node.iter_child_nodes())
    return [leaf for child in children for leaf in _leaves(child)]


_BINARY = {"Add": "+", "Sub": "-", "Mul": "*", "Div": "/", "Mod": "%", "And": "and", "Or": "or"}
_CMP = {"eq": "==", "ne": "!=", "lt": "<", "lteq": "<=", "gt": ">", "gteq": ">="}


def unparse(node: nodes.Node) -> str:
    """Manifest syntax for a parsed node (fully parenthesised where nesting is ambiguous)."""
    kind = type(node).__name__
    if isinstance(node, nodes.Const):
        if isinstance(node.value, bool):
            return "true" if node.value else "false"
        return '"' + node.value + '"' if isinstance(node.value, str) else repr(node.value)
    if _path(node) is not None:
        return ".".join(_path(node))
    if kind in _BINARY:
        return f"{_sub(node.left)} {_BINARY[kind]} {_sub(node.right)}"
    if isinstance(node, nodes.Compare):
        return _sub(node.expr) + "".join(f" {_CMP.get(o.op, o.op)} {_sub(o.expr)}" for o in node.ops)
    if isinstance(node, nodes.Not):
        return f"not {_sub(node.node)}"
    if isinstance(node, nodes.Neg):
        return f"-{_sub(node.node)}"
    if isinstance(node, nodes.Call):
        return f"{unparse(node.node)}({', '.join(unparse(a) for a in node.args)})"
    if isinstance(node, nodes.CondExpr):
        return f"{_sub(node.expr1)} if {_sub(node.test)} else {_sub(node.expr2)}"
    if isinstance(node, nodes.Concat):
        return " ~ ".join(_sub(n) for n in node.nodes)
    if isinstance(node, nodes.List):
        return "[" + ", ".join(unparse(i) for i in node.items) + "]"
    return repr(node)


def _sub(node: nodes.Node) -> str:
    text = unparse(node)
    simple = isinstance(node, (nodes.Const, nodes.Name, nodes.Getattr, nodes.Call, nodes.List))
    return text if simple else f"({text})"


def resolve_op(op: Op) -> ResolvedOp:
    """Compile every expression of the op; raises CompileError listing each problem once."""
    return _Resolver(op).resolve()
