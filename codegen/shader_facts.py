"""Shader facts: what a template declares while it renders -> one typed `ShaderFacts` a render.

A template says what its shader reads and is through two objects of the render environment, never
through text the compiler reads back:

- `{{ value.hiddenSize }}` reads a pass value: the read is recorded, and it renders the value's WGSL
  name, `hiddenSize` where it is a pipeline override or `params.hiddenSize` where it reaches the
  shader through the uniform `Params` (docs/MANIFEST.md, "Binding times");
- `shader` declares the rest: `{{ shader.workgroup_size(value.workgroupSize) }}` renders
  `@workgroup_size(workgroupSize)`, `{{ shader.workgroup_array("slots", "vec4<u32>",
  value.workgroupSize) }}` a `var<workgroup>` array (`shader.workgroup_variable` one that is not an
  array), and `{% do shader.uses_subgroups() %}` / `{% do shader.uses_f16() %}` say that the code
  calls subgroup functions or names f16 (`enable f16;` and the runtime's device checks follow
  from these).

The render stage (wgsl.py) renders each specialization inside `recording(scope)` and gets back the
facts; from them it writes the declarations above the body and the runtime's `ShaderInterface`.
`tests/compiler/test_shader_interface.py` checks every record against the WGSL it describes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import jinja2

from .problems import closest

# Bytes of a WGSL scalar; a vector's array stride is lanes times that (a vec3 takes four lanes).
SCALAR_BYTES = {"f32": 4, "u32": 4, "i32": 4, "f16": 2}


@dataclass(frozen=True)
class WgslType:
    """A WGSL scalar or vector type, or an atomic, as the compiler knows it: what array element
    stride it has and what scalar it holds (an `f16` needs `enable f16;`)."""

    text: str
    scalar: str
    stride: int  # bytes an array element takes


def _wgsl_types() -> dict[str, WgslType]:
    types = {}
    for scalar, size in SCALAR_BYTES.items():
        types[scalar] = WgslType(scalar, scalar, size)
        for lanes in (2, 3, 4):
            text = f"vec{lanes}<{scalar}>"
            types[text] = WgslType(text, scalar, size * (4 if lanes == 3 else lanes))
    for scalar in ("u32", "i32"):
        types[f"atomic<{scalar}>"] = WgslType(f"atomic<{scalar}>", scalar, SCALAR_BYTES[scalar])
    return types


WGSL_TYPES = _wgsl_types()


class ValueText(str):
    """What `{{ value.X }}` renders (`X` or `params.X`), knowing the value's name: a macro that takes
    it as a size (`shader.workgroup_array`) records the value, not the text."""

    name: str

    def __new__(cls, text: str, name: str) -> ValueText:
        made = super().__new__(cls, text)
        made.name = name
        return made


@dataclass(frozen=True)
class WorkgroupArray:
    """One `var<workgroup>` declaration: an array of `element` sized by the product of `factors`
    (integer literals and override names), or with no factors a variable of that type."""

    variable: str
    element: WgslType
    factors: tuple[int | str, ...] = ()


@dataclass(frozen=True)
class ShaderFacts:
    """What one rendered specialization declared."""

    reads: frozenset[str]  # the pass values it read through `value`
    workgroup_size: int | str  # an integer literal or an override name (1-D workgroups)
    workgroup_arrays: tuple[WorkgroupArray, ...]
    uses_subgroups: bool
    uses_f16: bool  # the code names f16 (bindings of an f16 type say so on their own)

    @property
    def sizes(self) -> frozenset[str]:
        """The values that size the workgroup or a workgroup array: WGSL allows no uniform there,
        so they stay pipeline overrides."""
        factors = {f for array in self.workgroup_arrays for f in array.factors}
        return frozenset(f for f in factors | {self.workgroup_size} if isinstance(f, str))


@dataclass(frozen=True)
class ValueScope:
    """What `value.X` may read in one pass, and how it renders each value."""

    numeric: Mapping[str, str]  # every value a shader may read -> its WGSL type (u32 | f32)
    uniforms: frozenset[str]  # those read from Params, as `<holder>.<name>`
    holder: str  # the uniform binding's name (`params`)
    others: tuple[str, ...] = ()  # the pass's string and boolean values (read as `{{ name }}`)


@dataclass
class _Recording:
    """The declarations of the render in progress."""

    scope: ValueScope
    reads: set[str] = field(default_factory=set)
    sizes: list[int | str] = field(default_factory=list)
    arrays: list[WorkgroupArray] = field(default_factory=list)
    subgroups: bool = False
    f16: bool = False

    def read(self, name: str) -> ValueText:
        scope = self.scope
        if name not in scope.numeric:
            if name in scope.others:
                raise jinja2.TemplateRuntimeError(
                    f"`value.{name}`: {name} is a specialization value (a string or boolean): write `{{{{ {name} }}}}`"
                )
            suggestion = closest(name, list(scope.numeric))
            hint = f"; did you mean `value.{suggestion}`?" if suggestion else ""
            raise jinja2.TemplateRuntimeError(f"`value.{name}`: the pass has no numeric value {name}{hint}")
        self.reads.add(name)
        return ValueText(f"{scope.holder}.{name}" if name in scope.uniforms else name, name)

    def facts(self) -> ShaderFacts:
        distinct = list(dict.fromkeys(self.sizes))
        if len(distinct) != 1:
            found = "none" if not distinct else ", ".join(map(str, distinct))
            raise jinja2.TemplateRuntimeError(
                "a shader declares one workgroup size, with `{{ shader.workgroup_size(value.NAME) }}` "
                f"(an override or an integer literal; 1-D workgroups); this one declared {found}"
            )
        return ShaderFacts(frozenset(self.reads), distinct[0], tuple(self.arrays), self.subgroups, self.f16)


_RECORDING: ContextVar[_Recording | None] = ContextVar("shader_recording", default=None)


def _current() -> _Recording:
    recording = _RECORDING.get()
    if recording is None:
        raise jinja2.TemplateRuntimeError("`value` and `shader` exist only while the compiler renders a pass")
    return recording


def _size(term: object, what: str) -> int | str:
    """A size term as the record keeps it: an integer literal, or the name of the value read."""
    if isinstance(term, ValueText):
        _current().reads.add(term.name)
        return term.name
    if isinstance(term, int) and not isinstance(term, bool) and term > 0:
        return term
    raise jinja2.TemplateRuntimeError(
        f"{what} must be `value.NAME` or a positive integer literal, got {term!r}"
    )


def _type(element: object) -> WgslType:
    if element not in WGSL_TYPES:
        known = ", ".join(sorted(WGSL_TYPES))
        raise jinja2.TemplateRuntimeError(f"workgroup element type {element!r} is not one of {known}")
    return WGSL_TYPES[element]


class _Value:
    """`value` in a template: `{{ value.X }}` reads pass value X (see the module docstring)."""

    def __getattr__(self, name: str) -> ValueText:
        if name.startswith("_"):  # Python's and Jinja's own probes (`__html__`, ...)
            raise AttributeError(name)
        return _current().read(name)


class _Shader:
    """`shader` in a template: the declarations the compiler's records are made of."""

    @staticmethod
    def workgroup_size(size) -> str:
        term = _size(size, "the workgroup size")
        _current().sizes.append(term)
        return f"@workgroup_size({term})"

    @staticmethod
    def workgroup_array(variable: str, element: str, *factors) -> str:
        if not factors:
            raise jinja2.TemplateRuntimeError(
                f"workgroup array {variable}: give its size, or declare it with shader.workgroup_variable"
            )
        sizes = tuple(_size(f, f"a size of workgroup array {variable}") for f in factors)
        _current().arrays.append(WorkgroupArray(variable, _type(element), sizes))
        return f"var<workgroup> {variable}: array<{element}, {' * '.join(str(f) for f in factors)}>;"

    @staticmethod
    def workgroup_variable(variable: str, element: str) -> str:
        _current().arrays.append(WorkgroupArray(variable, _type(element)))
        return f"var<workgroup> {variable}: {element};"

    @staticmethod
    def uses_subgroups() -> str:
        _current().subgroups = True
        return ""

    @staticmethod
    def uses_f16() -> str:
        _current().f16 = True
        return ""


# Added to the render environment's globals (wgsl.make_environment): imported macro files see them too.
TEMPLATE_GLOBALS = {"value": _Value(), "shader": _Shader()}


@contextmanager
def recording(scope: ValueScope) -> Iterator[_Recording]:
    """Record what the templates rendered inside this block declare; `.facts()` after the render."""
    token = _RECORDING.set(_Recording(scope))
    try:
        yield _RECORDING.get()
    finally:
        _RECORDING.reset(token)
