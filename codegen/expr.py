"""Expression stage: manifest expression source -> typed tree -> Python source text.

Parsing is jinja2's own (`jinja2.parser.Parser` in `variable` state), so the grammar is exactly
the one the manifests were written for. Semantics are those of the JavaScript port of Jinja that
the original loader evaluates with (docs/MANIFEST.md, "Expressions"): JS numbers (`/` is true
division, `%` takes the sign of the dividend, no `//` or `**`), `~` writes numbers as JS does,
`when` entries must be exactly `true`. Names resolve at compile time through a `Scope`; anything unknown, cyclic, of the
wrong arity or of the wrong kind is an `ExprError` whose `Problem` names file, JSON pointer and
expression.

Types are coarse: int (a count, expected to be a whole number), float, bool, str, shape (a tuple
of ints), set (device feature sets), map (adapter info) and list (intermediate shapes). An int that
is a quotient of ints (or computed from one) is marked `fraction`: JS division gives 2.5 for 5 / 2,
and the generated code keeps that number (an exact quotient stays an int), so the generated
NamedTuples declare such a value `int | float`, and a u32 field or a dispatch size checks that it is
whole where it is used. One idiom is known whole: `max(1, pow2ceil(x) / 2)` (a power of two over a
power of two is whole or below 1, and max with a whole literal >= 1 leaves no fraction).
"""

from __future__ import annotations

import dataclasses
import functools
import keyword
import re
from dataclasses import dataclass, field
from typing import Callable

import jinja2
import jinja2.nodes as nodes
from jinja2.exceptions import TemplateSyntaxError
from jinja2.parser import Parser

from .ir import Expr, Origin
from .problems import Problem, closest

NUMERIC = ("int", "float")

ONNX_DTYPE_CODES = {
    "float32": 1,
    "uint8": 2,
    "int8": 3,
    "int32": 6,
    "int64": 7,
    "bool": 9,
    "float16": 10,
    "float64": 11,
    "bfloat16": 16,
}

# The bucket builtins (docs/MANIFEST.md, "Buckets"): manifest name -> the runtime helper
# (generated/_runtime/numeric.py) the generated code calls.
BUCKET_HELPERS = {"bucketUp": "bucket_up", "bucketDown": "bucket_down"}

# Python precedence, loosest first; an operand needing a looser binding than its position gets parens.
PREC_COND, PREC_OR, PREC_AND, PREC_NOT, PREC_CMP, PREC_ADD, PREC_MUL, PREC_UNARY, PREC_ATOM = range(1, 10)

_ENV = jinja2.Environment()


def snake(name: str) -> str:
    """The Python name the generated code gives a manifest or WGSL name:
    `normalizationParamsOk` -> `normalization_params_ok`; `WORKGROUP_SIZE` -> `workgroup_size`; an
    acronym is one word: `RMSNormalization` -> `rms_normalization`."""
    text = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()
    text = re.sub(r"[^a-z0-9_]", "_", text)
    if keyword.iskeyword(text) or text[:1].isdigit():
        text += "_"
    return text


class ExprError(Exception):
    """One expression that does not compile; `problem` is what the resolver reports."""

    def __init__(self, origin: Origin, source: str, message: str):
        self.problem = Problem(origin, message, source)
        super().__init__(str(self.problem))
        self.origin = origin
        self.source = source
        self.message = message


@dataclass(frozen=True)
class Symbol:
    """What a name means where it is used: its Python text, its type and what it needs defined."""

    python: str
    type: str
    locals: frozenset[str] = frozenset()  # preamble locals the text reads (shape_x, limits, ...)
    refs: frozenset = frozenset()  # (level, manifest name) of each derived value the text reads
    fraction: bool = False  # an int that may be a fraction (see the module docstring)


@dataclass(frozen=True)
class Compiled:
    python: str
    type: str
    prec: int
    locals: frozenset[str] = frozenset()
    refs: frozenset = frozenset()
    helpers: frozenset[str] = frozenset()
    constant: object = None  # the value, when the expression is a literal
    is_constant: bool = False
    fraction: bool = False  # an int that may be a fraction: a quotient of ints, or made from one
    fraction_below_one: bool = False  # its only possible fractions lie between 0 and 1
    power_of_two: bool = False  # a power of two >= 1 (pow2ceil's result)

    @property
    def python_type(self) -> str:
        """The annotation of the value in generated Python."""
        if self.type == "int" and self.fraction:
            return "int | float"
        return _ANNOTATIONS.get(self.type, "object")


_ANNOTATIONS = {
    "int": "int",
    "float": "float",
    "bool": "bool",
    "str": "str",
    "shape": "tuple",
    "list": "tuple",
}


def _fraction(*parts: Compiled) -> bool:
    """Whether an int made from `parts` may be a fraction."""
    return any(p.fraction for p in parts)


def _is_power_of_two(value: object) -> bool:
    return type(value) is int and value >= 1 and value & (value - 1) == 0


def _is_whole_at_least_one(part: Compiled) -> bool:
    return part.is_constant and type(part.constant) is int and part.constant >= 1


class Scope:
    """Resolves dotted names (`("shapes", "X")`, `("groupHidden",)`) to Symbols."""

    def __init__(self, resolve: Callable[[tuple[str, ...]], Symbol | None], describe: Callable[[], str]):
        self._resolve = resolve
        self.describe = describe

    def lookup(self, path: tuple[str, ...]) -> Symbol | None:
        return self._resolve(path)


# The parameters of the generated functions: the call's `Request`, the op's `Derived` values and the
# chosen variant's `Values` (`derive(request)`, `when(request, derived)`, `passes(request, derived,
# values)`). Compiled code reads an outer level's value as `derived.<name>` / `values.<name>`.
REQUEST = "request"
DERIVED = "derived"
VALUES = "values"

REQUEST_LOCAL_KINDS = ("shape", "dtype", "attr", "tunable")


@functools.lru_cache(maxsize=1024)
def request_local(kind: str, name: str) -> str:
    """The local that generated code reads a request value through: `shape_<key>`, `dtype_<T>`,
    `attr_<name>`, `tunable_<name>` (emit.py defines them, resolve.py and wgsl.py name them).
    Kept per name: a build asks about 5900 times, for 59 names (snake() runs two regexes)."""
    if kind not in REQUEST_LOCAL_KINDS:
        raise ValueError(f"no request local of kind {kind!r}")
    return f"{kind}_{snake(name)}"


def parse(source: str, origin: Origin) -> nodes.Expr:
    """Parse with jinja2's own parser; the whole string must be one expression."""
    try:
        return _parsed(source)
    except TemplateSyntaxError as error:
        raise ExprError(origin, source, f"syntax error: {error.message}") from None


@functools.lru_cache(maxsize=4096)
def _parsed(source: str) -> nodes.Expr:
    """The tree of one expression text, parsed once however often it is compiled (the contract
    compiles rank and `when` clauses again; ops share clauses: 1406 parses of 355 texts). The
    tree is shared, so nothing may change it: the compiler and the contract only read it."""
    parser = Parser(_ENV, source, state="variable")
    tree = parser.parse_expression()
    if not parser.stream.current.test("eof"):
        raise TemplateSyntaxError(f"unexpected {parser.stream.current.value!r} after the expression", 1)
    return tree


def bucket_values(node: nodes.Node) -> tuple[int | float, ...]:
    """The values a bucket call may give: its second argument, a list of number literals in
    ascending order (`[1, 2, 4]`), which is the value's declared finite domain. ValueError says
    what is wrong with any other list."""
    if not isinstance(node, nodes.List):
        shown = f" `[{node.value!r}]`" if isinstance(node, nodes.Const) else ""
        raise ValueError(f"the second argument must be the list of values it may give, written out{shown}")
    if not node.items:
        raise ValueError("the list of values is empty: a bucket needs at least one value")
    values = []
    for position, item in enumerate(node.items, 1):
        number = isinstance(item, nodes.Const) and type(item.value) in (int, float)
        if not number:
            raise ValueError(f"the listed values must be number literals; item {position} is not")
        values.append(item.value)
    if any(later <= earlier for earlier, later in zip(values, values[1:])):
        ordered = ", ".join(repr(v) for v in sorted(set(values)))
        raise ValueError(f"the listed values must ascend, each once; did you mean `[{ordered}]`?")
    return tuple(values)


def compile_expr(expr: Expr, scope: Scope, expect: str | tuple[str, ...] | None = None) -> Compiled:
    """Compile one manifest expression to Python; `expect` restricts the result type."""
    if expr.is_literal:
        value = expr.literal
        kind = "bool" if isinstance(value, bool) else "int" if isinstance(value, int) else "float"
        result = Compiled(repr(value), kind, PREC_ATOM, constant=value, is_constant=True)
    else:
        result = Compiler(expr, scope).visit(parse(expr.source, expr.origin))
    if expect is not None:
        allowed = (expect,) if isinstance(expect, str) else expect
        if result.type not in allowed:
            raise ExprError(
                expr.origin,
                expr.text(),
                f"expected a value of kind {' or '.join(allowed)}, got {result.type}",
            )
    return result


def _merge(*parts: Compiled, **fields) -> dict:
    return dict(
        locals=frozenset().union(*(p.locals for p in parts)),
        refs=frozenset().union(*(p.refs for p in parts)),
        helpers=frozenset().union(*(p.helpers for p in parts)) | frozenset(fields.pop("helpers", ())),
        **fields,
    )


def _wrap(part: Compiled, prec: int) -> str:
    return part.python if part.prec >= prec else f"({part.python})"


@dataclass
class Compiler:
    expr: Expr
    scope: Scope
    _helpers: set = field(default_factory=set)

    def fail(self, message: str) -> ExprError:
        return ExprError(self.expr.origin, self.expr.source, message)

    def visit(self, node: nodes.Node) -> Compiled:
        method = getattr(self, f"visit_{type(node).__name__}", None)
        if method is None:
            raise self.fail(f"`{type(node).__name__}` is not part of the manifest expression language")
        return method(node)

    # literals -----------------------------------------------------------------------------------

    def visit_Const(self, node: nodes.Const) -> Compiled:
        value = node.value
        if isinstance(value, bool):
            kind = "bool"
        elif isinstance(value, int):
            kind = "int"
        elif isinstance(value, float):
            kind = "float"
        elif isinstance(value, str):
            kind = "str"
        else:
            raise self.fail(f"the literal {value!r} has no meaning here")
        return Compiled(repr(value), kind, PREC_ATOM, constant=value, is_constant=True)

    def visit_List(self, node: nodes.List) -> Compiled:
        items = [self.numeric(self.visit(item), "a list item") for item in node.items]
        text = "(" + ", ".join(i.python for i in items) + ("," if len(items) == 1 else "") + ")"
        return Compiled(text, "list", PREC_ATOM, **_merge(*items))

    # names --------------------------------------------------------------------------------------

    def path_of(self, node: nodes.Node) -> tuple[str, ...] | None:
        if isinstance(node, nodes.Name):
            return (node.name,)
        if isinstance(node, nodes.Getattr):
            base = self.path_of(node.node)
            return None if base is None else base + (node.attr,)
        return None

    def resolve(self, node: nodes.Node) -> Compiled:
        path = self.path_of(node)
        if path is None:
            raise self.fail(
                "only names and dotted names can be read (`shapes.X`, `device.limits.maxBufferSize`)"
            )
        symbol = self.scope.lookup(path)
        if symbol is None:
            known = [name.strip() for name in self.scope.describe().split(",")]
            suggestion = closest(".".join(path), known)
            hint = f"did you mean `{suggestion}`? " if suggestion else ""
            raise self.fail(f"unknown name `{'.'.join(path)}`; {hint}known here: {self.scope.describe()}")
        return Compiled(
            symbol.python,
            symbol.type,
            PREC_ATOM,
            locals=symbol.locals,
            refs=symbol.refs,
            fraction=symbol.fraction,
        )

    visit_Name = resolve
    visit_Getattr = resolve

    # operators ----------------------------------------------------------------------------------

    def numeric(self, part: Compiled, what: str) -> Compiled:
        if part.type not in NUMERIC:
            raise self.fail(f"{what} must be a number, got {part.type}")
        return part

    def boolean(self, part: Compiled, what: str) -> Compiled:
        if part.type != "bool":
            raise self.fail(f"{what} must be a boolean, got {part.type}")
        return part

    def arithmetic(self, node: nodes.BinExpr, symbol: str) -> Compiled:
        left = self.numeric(self.visit(node.left), f"the left operand of `{node.operator}`")
        right = self.numeric(self.visit(node.right), f"the right operand of `{node.operator}`")
        kind = "int" if left.type == right.type == "int" else "float"
        text = f"{_wrap(left, PREC_ADD if symbol in '+-' else PREC_MUL)} {symbol} {_wrap(right, PREC_ADD + 1 if symbol in '+-' else PREC_MUL + 1)}"
        return Compiled(
            text,
            kind,
            PREC_ADD if symbol in "+-" else PREC_MUL,
            fraction=_fraction(left, right),
            **_merge(left, right),
        )

    def visit_Add(self, node):
        return self.arithmetic(node, "+")

    def visit_Sub(self, node):
        return self.arithmetic(node, "-")

    def visit_Mul(self, node):
        return self.arithmetic(node, "*")

    def visit_Div(self, node: nodes.Div) -> Compiled:
        # JS `/` never raises: x / 0 is ±Infinity or NaN. A nonzero literal divisor needs no helper.
        left = self.numeric(self.visit(node.left), "the left operand of `/`")
        right = self.numeric(self.visit(node.right), "the right operand of `/`")
        kind = "int" if left.type == right.type == "int" else "float"
        # A power of two over a smaller or equal one is whole; over a larger one, below 1.
        below_one = left.power_of_two and right.is_constant and _is_power_of_two(right.constant)
        if kind == "float" and right.is_constant and right.constant != 0:
            return Compiled(
                f"{_wrap(left, PREC_MUL)} / {_wrap(right, PREC_MUL + 1)}",
                kind,
                PREC_MUL,
                **_merge(left, right),
            )
        # Between ints, js_div keeps an exact quotient an int (the value a plan shows is the type it
        # declares); an inexact one is the JS number, a fraction.
        return Compiled(
            f"js_div({left.python}, {right.python})",
            kind,
            PREC_ATOM,
            fraction=kind == "int",
            fraction_below_one=kind == "int" and below_one,
            **_merge(left, right, helpers={"js_div"}),
        )

    def visit_Mod(self, node: nodes.Mod) -> Compiled:
        left = self.numeric(self.visit(node.left), "the left operand of `%`")
        right = self.numeric(self.visit(node.right), "the right operand of `%`")
        kind = "int" if left.type == right.type == "int" else "float"
        return Compiled(
            f"js_mod({left.python}, {right.python})",
            kind,
            PREC_ATOM,
            fraction=_fraction(left, right),
            **_merge(left, right, helpers={"js_mod"}),
        )

    def visit_FloorDiv(self, node):
        raise self.fail("`//` does not exist in the manifest language (JS numbers): write floor(a / b)")

    def visit_Pow(self, node):
        raise self.fail("`**` does not exist in the manifest language (JS numbers)")

    def visit_Neg(self, node: nodes.Neg) -> Compiled:
        operand = self.numeric(self.visit(node.node), "the operand of unary `-`")
        return Compiled(
            f"-{_wrap(operand, PREC_UNARY)}",
            operand.type,
            PREC_UNARY,
            fraction=operand.fraction,
            **_merge(operand),
        )

    def visit_Pos(self, node: nodes.Pos) -> Compiled:
        return self.numeric(self.visit(node.node), "the operand of unary `+`")

    def visit_Concat(self, node: nodes.Concat) -> Compiled:
        parts = []
        for item in node.nodes:
            part = self.visit(item)
            if part.type == "str":
                parts.append(part)
            elif part.type in NUMERIC + ("bool",):
                parts.append(
                    Compiled(f"js_str({part.python})", "str", PREC_ATOM, **_merge(part, helpers={"js_str"}))
                )
            else:
                raise self.fail(f"`~` joins strings, numbers and booleans, not a {part.type}")
        text = " + ".join(_wrap(p, PREC_ADD + 1) for p in parts)
        return Compiled(text, "str", PREC_ADD, **_merge(*parts))

    def visit_And(self, node: nodes.And) -> Compiled:
        return self.logical(node, "and", PREC_AND)

    def visit_Or(self, node: nodes.Or) -> Compiled:
        return self.logical(node, "or", PREC_OR)

    def logical(self, node, word: str, prec: int) -> Compiled:
        left = self.boolean(self.visit(node.left), f"the left operand of `{word}`")
        right = self.boolean(self.visit(node.right), f"the right operand of `{word}`")
        return Compiled(
            f"{_wrap(left, prec)} {word} {_wrap(right, prec + 1)}", "bool", prec, **_merge(left, right)
        )

    def visit_Not(self, node: nodes.Not) -> Compiled:
        operand = self.boolean(self.visit(node.node), "the operand of `not`")
        return Compiled(f"not {_wrap(operand, PREC_NOT)}", "bool", PREC_NOT, **_merge(operand))

    _COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "lteq": "<=", "gt": ">", "gteq": ">="}

    def visit_Compare(self, node: nodes.Compare) -> Compiled:
        left = self.visit(node.expr)
        parts, text = [left], _wrap(left, PREC_CMP + 1)
        for operand in node.ops:
            if operand.op not in self._COMPARE:
                raise self.fail(f"the comparison `{operand.op}` is not part of the manifest language")
            right = self.visit(operand.expr)
            ordered = operand.op not in ("eq", "ne")
            if ordered and (left.type not in NUMERIC or right.type not in NUMERIC):
                raise self.fail(
                    f"`{self._COMPARE[operand.op]}` compares numbers, got {left.type} and {right.type}"
                )
            if not ordered and not (left.type == right.type or {left.type, right.type} <= set(NUMERIC)):
                raise self.fail(
                    f"`{self._COMPARE[operand.op]}` between a {left.type} and a {right.type} is never true"
                )
            if not ordered and left.type in ("shape", "list", "set", "map"):
                raise self.fail(
                    f"`{self._COMPARE[operand.op]}` on a {left.type} compares identity in JS: use sameShape"
                )
            text += f" {self._COMPARE[operand.op]} {_wrap(right, PREC_CMP + 1)}"
            parts.append(right)
            left = right
        return Compiled(text, "bool", PREC_CMP, **_merge(*parts))

    def visit_CondExpr(self, node: nodes.CondExpr) -> Compiled:
        if node.expr2 is None:
            raise self.fail("`a if c` needs an `else` branch")
        test = self.boolean(self.visit(node.test), "the condition of `if`")
        yes, no = self.visit(node.expr1), self.visit(node.expr2)
        if yes.type == no.type:
            kind = yes.type
        elif {yes.type, no.type} <= set(NUMERIC):
            kind = "float"
        else:
            raise self.fail(f"the branches of `if` have different kinds: {yes.type} and {no.type}")
        text = f"{_wrap(yes, PREC_COND + 1)} if {_wrap(test, PREC_COND + 1)} else {_wrap(no, PREC_COND)}"
        return Compiled(text, kind, PREC_COND, fraction=_fraction(yes, no), **_merge(test, yes, no))

    # calls --------------------------------------------------------------------------------------

    def visit_Call(self, node: nodes.Call) -> Compiled:
        if node.kwargs or node.dyn_args or node.dyn_kwargs:
            raise self.fail("calls take positional arguments only")
        if isinstance(node.node, nodes.Getattr) and node.node.attr == "has":
            target = self.resolve(node.node.node)
            if target.type not in ("set", "map"):
                raise self.fail(f"`.has()` needs a feature set, got {target.type}")
            return self.membership(target, node.args)
        if not isinstance(node.node, nodes.Name):
            raise self.fail("only the helper functions and `<set>.has(...)` can be called")
        name = node.node.name
        handler = getattr(self, f"call_{name}", None)
        if handler is None:
            known = sorted(n[5:] for n in dir(self) if n.startswith("call_"))
            suggestion = closest(name, known)
            hint = f"did you mean `{suggestion}`? " if suggestion else ""
            raise self.fail(f"unknown function `{name}`; {hint}known: {', '.join(known)}")
        return handler(node.args)

    def arity(self, name: str, args: list, count: int | tuple[int, int]) -> list[Compiled]:
        low, high = (count, count) if isinstance(count, int) else count
        if not low <= len(args) <= high:
            expected = str(low) if low == high else f"{low} or more" if high > 99 else f"{low} to {high}"
            raise self.fail(f"`{name}` takes {expected} argument(s), got {len(args)}")
        return [self.visit(a) for a in args]

    def shape_arg(self, name: str, part: Compiled) -> Compiled:
        if part.type not in ("shape", "list"):
            raise self.fail(f"the first argument of `{name}` must be a shape (`shapes.X`), got {part.type}")
        return part

    def membership(self, target: Compiled, args: list) -> Compiled:
        (key,) = self.arity("has", args, 1)
        if key.type != "str":
            raise self.fail(f"`has` looks up a string, got {key.type}")
        return Compiled(
            f"{_wrap(key, PREC_CMP + 1)} in {target.python}", "bool", PREC_CMP, **_merge(target, key)
        )

    def helper(
        self, name: str, text: str, kind: str, *parts: Compiled, helpers=(), fraction: bool = False
    ) -> Compiled:
        return Compiled(text, kind, PREC_ATOM, fraction=fraction, **_merge(*parts, helpers=helpers))

    def call_dim(self, args):
        shape, index = self.arity("dim", args, 2)
        self.shape_arg("dim", shape)
        self.numeric(index, "the index of `dim`")
        if index.is_constant and isinstance(index.constant, int):
            # Python indexing already counts negative indices from the end, as `dim` does.
            return Compiled(f"{shape.python}[{index.python}]", "int", PREC_ATOM, **_merge(shape, index))
        return self.helper(
            "dim", f"dim({shape.python}, {index.python})", "int", shape, index, helpers={"dim"}
        )

    def shape_helper(self, name: str, args, count) -> Compiled:
        parts = self.arity(name, args, count)
        self.shape_arg(name, parts[0])
        for p in parts[1:]:
            self.numeric(p, f"the index of `{name}`")
        return self.helper(
            name, f"{name}({', '.join(p.python for p in parts)})", "int", *parts, helpers={name}
        )

    def call_inner(self, args):
        return self.shape_helper("inner", args, 2)

    def call_outer(self, args):
        return self.shape_helper("outer", args, 2)

    def call_numel(self, args):
        return self.shape_helper("numel", args, 1)

    def call_reducedShape(self, args):
        shape, axis = self.arity("reducedShape", args, 2)
        self.shape_arg("reducedShape", shape)
        self.numeric(axis, "the axis of `reducedShape`")
        return self.helper(
            "reduced_shape",
            f"reduced_shape({shape.python}, {axis.python})",
            "shape",
            shape,
            axis,
            helpers={"reduced_shape"},
        )

    def call_broadcastStride(self, args):
        part, whole = self.arity("broadcastStride", args, 2)
        self.shape_arg("broadcastStride", part)
        if whole.type not in ("shape", "list"):
            raise self.fail(f"the second argument of `broadcastStride` must be a shape, got {whole.type}")
        return self.helper(
            "broadcast_stride",
            f"broadcast_stride({part.python}, {whole.python})",
            "int",
            part,
            whole,
            helpers={"broadcast_stride"},
        )

    def call_rank(self, args):
        (shape,) = self.arity("rank", args, 1)
        self.shape_arg("rank", shape)
        return self.helper("rank", f"len({shape.python})", "int", shape)

    def call_sameShape(self, args):
        left, right = self.arity("sameShape", args, 2)
        self.shape_arg("sameShape", left)
        self.shape_arg("sameShape", right)
        return Compiled(f"{left.python} == {right.python}", "bool", PREC_CMP, **_merge(left, right))

    def call_has(self, args):
        if len(args) != 2:
            raise self.fail(f"`has` takes 2 argument(s), got {len(args)}")
        target = self.visit(args[0])
        if target.type not in ("set", "map"):
            raise self.fail(
                f"the first argument of `has` must be a feature set or `device.adapterInfo`, got {target.type}"
            )
        return self.membership(target, args[1:])

    def extremum(self, name: str, args) -> Compiled:
        parts = [self.numeric(p, f"an argument of `{name}`") for p in self.arity(name, args, (1, 999))]
        kind = "int" if all(p.type == "int" for p in parts) else "float"
        fraction = _fraction(*parts)
        if name == "max" and any(_is_whole_at_least_one(p) for p in parts):
            # The maximum is at least 1, so no fraction below 1 can be it.
            fraction = any(p.fraction and not p.fraction_below_one for p in parts)
        return self.helper(
            name,
            f"{name}({', '.join(p.python for p in parts)})" if len(parts) > 1 else _wrap(parts[0], PREC_ATOM),
            kind,
            *parts,
            fraction=fraction,
        )

    def call_min(self, args):
        return self.extremum("min", args)

    def call_max(self, args):
        return self.extremum("max", args)

    def rounding(self, name: str, args) -> Compiled:
        (value,) = self.arity(name, args, 1)
        self.numeric(value, f"the argument of `{name}`")
        return self.helper(name, f"math.{name}({value.python})", "int", value, helpers={"math"})

    def call_floor(self, args):
        return self.rounding("floor", args)

    def call_ceil(self, args):
        return self.rounding("ceil", args)

    def call_ceilDiv(self, args):
        parts = [self.numeric(p, "an argument of `ceilDiv`") for p in self.arity("ceilDiv", args, 2)]
        return self.helper(
            "ceil_div", f"ceil_div({parts[0].python}, {parts[1].python})", "int", *parts, helpers={"ceil_div"}
        )

    def call_pow2ceil(self, args):
        (value,) = self.arity("pow2ceil", args, 1)
        self.numeric(value, "the argument of `pow2ceil`")
        made = self.helper("pow2ceil", f"pow2ceil({value.python})", "int", value, helpers={"pow2ceil"})
        return dataclasses.replace(made, power_of_two=True)

    def bucket(self, name: str, args) -> Compiled:
        """`bucketUp(x, [a, b, c])`: the smallest listed value >= x (the last above them all);
        `bucketDown`: the largest <= x (the first below them all)."""
        if len(args) != 2:
            raise self.fail(f"`{name}` takes 2 argument(s), got {len(args)}")
        value = self.numeric(self.visit(args[0]), f"the first argument of `{name}`")
        try:
            buckets = bucket_values(args[1])
        except ValueError as error:
            raise self.fail(f"`{name}`: {error}") from None
        kind = "int" if all(type(b) is int for b in buckets) else "float"
        listed = "(" + ", ".join(repr(b) for b in buckets) + ("," if len(buckets) == 1 else "") + ")"
        helper = BUCKET_HELPERS[name]
        return self.helper(helper, f"{helper}({value.python}, {listed})", kind, value, helpers={helper})

    def call_bucketUp(self, args):
        return self.bucket("bucketUp", args)

    def call_bucketDown(self, args):
        return self.bucket("bucketDown", args)

    def call_f16Ok(self, args):
        (dtype,) = self.arity("f16Ok", args, 1)
        if dtype.type != "str":
            raise self.fail(f"`f16Ok` takes a dtype (`dtypes.T`), got {dtype.type}")
        features = self.resolve(nodes.Getattr(nodes.Name("device", "load"), "features", "load"))
        text = f'{_wrap(dtype, PREC_CMP + 1)} != "f16" or "shader-f16" in {features.python}'
        return Compiled(text, "bool", PREC_OR, **_merge(dtype, features))

    def call_onnxDtypeCode(self, args):
        (name,) = self.arity("onnxDtypeCode", args, 1)
        if not name.is_constant or name.constant not in ONNX_DTYPE_CODES:
            raise self.fail(
                f"`onnxDtypeCode` takes a literal TensorProto type name, one of {sorted(ONNX_DTYPE_CODES)}"
            )
        code = ONNX_DTYPE_CODES[name.constant]
        return Compiled(repr(code), "int", PREC_ATOM, constant=code, is_constant=True)
