"""Domain stage: a pass's specialization values -> every reachable combination of them, worked out
from the expressions' trees; no generated Python is run.

A specialization value (docs/MANIFEST.md, "Binding times") varies only with its leaves:

- `dtypes.<T>`: the WGSL types its type constraint allows;
- `attrs.<name>` restricted by `values`: those values;
- `bucketUp(x, [...])` / `bucketDown(x, [...])` of an `x` that the request or the device decides:
  the listed values (the bucket's declared domain);
- a boolean derived value that reads the request or the device: both outcomes.

Literals, `a if c else b`, `and`, `or`, `not`, comparisons, `~`, arithmetic and the numeric helpers
combine them. A value that reads anything else (a shape, a tunable, a device limit) other than
through a bucket or a named boolean has no finite domain: a `CompileError` at the value that names
what it reads and through which values.

A value's `Domain` holds its result for every combination of the leaves it reads, so two values
that read one leaf vary together: `scalar` is `"f16"` only where `usesF16` is true, and a pass
renders only the combinations its leaves reach, less those that a `when` clause with a finite
domain rules out.
"""

from __future__ import annotations

import itertools
import math
import operator
from dataclasses import dataclass, field
from typing import Callable

import jinja2.nodes as nodes

from generated._runtime import numeric
from generated._runtime.plans import WGSL_DTYPES

from .expr import BUCKET_HELPERS, ONNX_DTYPE_CODES, bucket_values, parse
from .problems import CompileError, Problem
from .resolve import ResolvedOp, ResolvedPass, ResolvedVariant, Value, unparse


@dataclass(frozen=True, order=True)
class Leaf:
    """One independent source of variation: `values` are what it can be, in the order they are
    rendered. Leaves sort dtypes and attributes first, then buckets, then free booleans."""

    rank: int  # 0 attribute or dtype, 1 bucket, 2 free boolean
    name: str  # manifest syntax: `attrs.mode`, `dtypes.T`, the value holding a bucket or the boolean
    where: tuple = ()  # the level of a derived value; and the call's position, for a bucket
    values: tuple = field(default=(), compare=False)


@dataclass(frozen=True)
class Domain:
    """A value for every combination of its `leaves`' values (`table`, keyed by those values in
    `leaves` order, filled in the order of their product)."""

    leaves: tuple[Leaf, ...]
    table: dict

    @staticmethod
    def constant(value) -> "Domain":
        return Domain((), {(): value})

    @staticmethod
    def of_leaf(leaf: Leaf) -> "Domain":
        return Domain((leaf,), {(v,): v for v in leaf.values})


def combine(function: Callable, *parts: Domain) -> Domain:
    """`function` of the parts' values, for every combination of all their leaves."""
    leaves = tuple(sorted(set().union(*(p.leaves for p in parts))))
    position = {leaf: i for i, leaf in enumerate(leaves)}
    reads = [[position[leaf] for leaf in p.leaves] for p in parts]
    table = {}
    for choice in itertools.product(*(leaf.values for leaf in leaves)):
        table[choice] = function(*(p.table[tuple(choice[i] for i in r)] for p, r in zip(parts, reads)))
    return Domain(leaves, table)


class NotFinite(Exception):
    """A value reads `name` (manifest syntax), which has no finite domain, through `chain`."""

    def __init__(self, name: str, chain: tuple[str, ...] = ()):
        super().__init__(name)
        self.name = name
        self.chain = chain

    def through(self, value: str) -> "NotFinite":
        return NotFinite(self.name, (value,) + self.chain)


_BINARY = {
    nodes.Add: operator.add,
    nodes.Sub: operator.sub,
    nodes.Mul: operator.mul,
    nodes.Div: numeric.js_div,
    nodes.Mod: numeric.js_mod,
    nodes.And: lambda a, b: a and b,
    nodes.Or: lambda a, b: a or b,
}
_COMPARE = {
    "eq": operator.eq,
    "ne": operator.ne,
    "lt": operator.lt,
    "lteq": operator.le,
    "gt": operator.gt,
    "gteq": operator.ge,
}
# The numeric helpers, as the generated code calls them (expr.py writes `math.floor`, `ceil_div`...).
_HELPERS = {
    "min": lambda *a: min(a),
    "max": lambda *a: max(a),
    "floor": math.floor,
    "ceil": math.ceil,
    "ceilDiv": numeric.ceil_div,
    "pow2ceil": numeric.pow2ceil,
}


class Domains:
    """The domains of the values one pass sees, each worked out once."""

    def __init__(self, op: ResolvedOp, variant: ResolvedVariant, pass_: ResolvedPass):
        self.levels = {
            "manifest": {v.name: v for v in op.derives},
            "variant": {v.name: v for v in variant.derives},
            "pass": {v.name: v for v in pass_.derives},
        }
        self.base = {
            ("dtypes", tv): Leaf(
                0, f"dtypes.{tv}", values=tuple(WGSL_DTYPES[t] for t in types if t in WGSL_DTYPES)
            )
            for tv, types in op.ir.type_constraints
        }
        for attribute in op.ir.attributes:
            if attribute.allowed is not None:
                self.base[("attrs", attribute.name)] = Leaf(
                    0, f"attrs.{attribute.name}", values=attribute.allowed
                )
        self.known: dict[tuple[str, str], Domain | NotFinite] = {}

    def level_of(self, value: Value) -> str:
        """The level a key value is defined at; a binding's type or `when` is a level of its own."""
        for level in ("pass", "variant"):
            if self.levels[level].get(value.name) is value:
                return level
        return "binding"

    def of_value(self, level: str, value: Value) -> Domain:
        """The value's domain; a boolean without a finite one is a free leaf: either outcome."""
        key = (level, value.name)
        if key not in self.known:
            try:
                self.known[key] = self.finite(level, value)
            except NotFinite as reason:
                free = Leaf(2, value.name, (level,), (False, True))
                self.known[key] = Domain.of_leaf(free) if value.code.type == "bool" else reason
        found = self.known[key]
        if isinstance(found, NotFinite):
            raise found
        return found

    def of_condition(self, value: Value) -> Domain | None:
        """A `when` clause's domain, or None where it depends on more than finite leaves (then
        both of its outcomes stay reachable)."""
        try:
            return self.finite("select", value)
        except NotFinite:
            return None

    def finite(self, level: str, value: Value) -> Domain:
        """The value's domain from its expression; NotFinite where it has none."""
        if value.code.is_constant:  # a literal, or WGSL text as an element type
            return Domain.constant(value.code.constant)
        tree = parse(value.expr.source, value.expr.origin)
        return _Walk(self, level, value, tree).visit(tree)


@dataclass
class _Walk:
    """The domain of one value's expression tree, node by node."""

    domains: Domains
    level: str
    value: Value
    tree: nodes.Node

    def visit(self, node: nodes.Node) -> Domain:
        if type(node) in _BINARY:
            return combine(_BINARY[type(node)], self.visit(node.left), self.visit(node.right))
        method = getattr(self, f"visit_{type(node).__name__}", None)
        if method is None:
            raise NotFinite(unparse(node))
        return method(node)

    def visit_Const(self, node: nodes.Const) -> Domain:
        return Domain.constant(node.value)

    def visit_Name(self, node: nodes.Name) -> Domain:
        levels = {name: level for level, name in self.value.code.refs}
        if node.name not in levels:
            raise NotFinite(node.name)  # DISPATCH_FOLD_WIDTH
        level = levels[node.name]
        try:
            return self.domains.of_value(level, self.domains.levels[level][node.name])
        except NotFinite as reason:
            raise reason.through(node.name) from None

    def visit_Getattr(self, node: nodes.Getattr) -> Domain:
        path = unparse(node)
        leaf = self.domains.base.get(tuple(path.split(".")))
        if leaf is None:
            raise NotFinite(path)
        return Domain.of_leaf(leaf)

    def visit_Not(self, node: nodes.Not) -> Domain:
        return combine(operator.not_, self.visit(node.node))

    def visit_Neg(self, node: nodes.Neg) -> Domain:
        return combine(operator.neg, self.visit(node.node))

    def visit_Pos(self, node: nodes.Pos) -> Domain:
        return self.visit(node.node)

    def visit_CondExpr(self, node: nodes.CondExpr) -> Domain:
        choose = lambda test, yes, no: yes if test else no  # noqa: E731
        return combine(choose, self.visit(node.test), self.visit(node.expr1), self.visit(node.expr2))

    def visit_Concat(self, node: nodes.Concat) -> Domain:
        parts = [self.visit(part) for part in node.nodes]
        return combine(lambda *texts: "".join(map(numeric.js_str, texts)), *parts)

    def visit_Compare(self, node: nodes.Compare) -> Domain:
        tests = [_COMPARE[o.op] for o in node.ops]

        def chain(first, *rest):
            operands = (first, *rest)
            return all(test(a, b) for test, a, b in zip(tests, operands, operands[1:]))

        return combine(chain, self.visit(node.expr), *[self.visit(o.expr) for o in node.ops])

    def visit_Call(self, node: nodes.Call) -> Domain:
        name = node.node.name if isinstance(node.node, nodes.Name) else None
        if name in BUCKET_HELPERS:
            return self.bucket(node, name)
        if name == "onnxDtypeCode":
            return Domain.constant(ONNX_DTYPE_CODES[node.args[0].value])
        if name not in _HELPERS:
            raise NotFinite(unparse(node))
        return combine(_HELPERS[name], *[self.visit(arg) for arg in node.args])

    def bucket(self, node: nodes.Call, name: str) -> Domain:
        """A bucket of a finite value is worked out; of any other, it is a leaf: its list."""
        buckets = bucket_values(node.args[1])
        helper = getattr(numeric, BUCKET_HELPERS[name])
        try:
            return combine(lambda x: helper(x, buckets), self.visit(node.args[0]))
        except NotFinite:
            # One leaf for each call of the value's expression (however many values read the value).
            calls = [self.tree, *self.tree.find_all(nodes.Call)]
            position = [id(call) for call in calls].index(id(node))
            return Domain.of_leaf(Leaf(1, self.value.name, (self.level, position), buckets))


def key_combinations(
    op: ResolvedOp,
    variant: ResolvedVariant,
    pass_: ResolvedPass,
    keys: list[Value],
    conditions: list[Value],
    template: str,
) -> list[dict]:
    """The distinct combinations of the `keys`' values, in the order the product of their leaves'
    values first reaches them, leaving out those a `when` clause with a finite domain rules out.
    `template` names the pass's template in the problem of a key with no finite domain."""
    domains = Domains(op, variant, pass_)
    found, problems = [], []
    for value in keys:
        try:
            found.append(domains.of_value(domains.level_of(value), value))
        except NotFinite as reason:
            problems.append(_not_finite(value, reason, template))
    if problems:
        raise CompileError(problems)
    deciding = [d for d in map(domains.of_condition, conditions) if d is not None]
    every = combine(lambda *results: results, *found, *deciding)
    names = [v.name for v in keys]
    combos, seen = [], set()
    for results in every.table.values():
        if all(result is True for result in results[len(keys) :]):
            combo = results[: len(keys)]
            # By type and text: 1, 1.0 and True hash alike but render differently.
            identity = tuple((type(v), repr(v)) for v in combo)
            if identity not in seen:
                seen.add(identity)
                combos.append(dict(zip(names, combo)))
    return combos


def _not_finite(value: Value, reason: NotFinite, template: str) -> Problem:
    through = "".join(f"`{name}`, which reads " for name in reason.chain)
    message = (
        f"`{value.name}` decides a specialization of template `{template}`, so it needs a finite domain, "
        f"but it reads {through}`{reason.name}`, which has none: bucket a number with "
        "bucketUp(x, [...]) or bucketDown(x, [...]), or name a boolean as a derived value"
    )
    return Problem(value.expr.origin, message, value.expr.text())
