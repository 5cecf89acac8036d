"""Name stage: an op's RenderedPasses -> its shader files, each distinct WGSL text once, named.

Input: the op's RenderedPasses (wgsl.py). Output: ShaderFiles, which emit.py writes as the op's
`shaders/<name>.wgsl` files and the interface records of `shaders.py`, and from which the variant
modules name their shaders.

A shader's name is its template's stem and the template values that tell the op's
specializations of that template apart (`skip-group-norm-slab.f16-vec4-skip-full`): the readable
key that `plan().passes[i].spec` shows. Where two texts would get one name (the same values, in
passes whose Params differ), the later ones add their variant and pass (`origin`). emit.py writes
each file as a short header naming its template and key, then the text naga validated; the
runtime compiles the file as it is, so the line numbers of a WebGPU error are the file's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from generated._runtime.plans import ShaderInterface

from .expr import snake
from .wgsl import KeyName, RenderedPass, Specialization


@dataclass(frozen=True)
class NameToken:
    """One template value's part of a shader name: `vec4f16`, `has-bias` for True, "" for False, or
    a number after the value's name (`units8`)."""

    key: KeyName
    value: object
    text: str


@dataclass(frozen=True)
class ShaderFile:
    """One distinct shader of an op: its file name, what its header says, the text naga validated
    and its interface record."""

    name: str
    template: str
    tokens: tuple[NameToken, ...]  # the deciding template values, in key order
    origin: str | None  # `variant.pass`, where the name needs it to be unique
    text: str
    interface: ShaderInterface


@dataclass(frozen=True)
class ShaderFiles:
    files: dict[str, ShaderFile]  # name -> file, in order of first use
    names: dict[str, str]  # rendered WGSL text (as validated, without the header) -> name

    def name_of(self, specialization: Specialization) -> str:
        return self.names[specialization.wgsl]


def _token(key: KeyName, value: object) -> NameToken:
    """A key value as a name token: True -> the name, False -> nothing, `vec4<f16>` -> `vec4f16`,
    a number -> the name and the number."""
    name = snake(key.name).replace("_", "-")
    if value is True:
        return NameToken(key, value, name)
    if value is False or value is None:
        return NameToken(key, value, "")
    token = re.sub(r"[^0-9A-Za-z]+", "", str(value))
    return NameToken(key, value, f"{name}{token}" if token.isdigit() else token)


def deciding_columns(rows: list[tuple]) -> list[int]:
    """Columns of `rows` that the kept ones before them do not already determine, in order.

    The kept columns identify every row, and each dropped column is a function of the kept ones
    over all rows. The compiler renders every reachable combination, so that holds for any
    request too: a lookup on the kept columns finds the one specialization the full key would.
    """
    kept: list[int] = []
    width = len(rows[0]) if rows else 0
    for column in range(width):
        seen: dict[tuple, object] = {}
        for row in rows:
            prior = tuple(row[k] for k in kept)
            if seen.setdefault(prior, row[column]) != row[column]:
                kept.append(column)
                break
    return kept


@dataclass(frozen=True)
class _Named:
    """A rendered text before its name is made unique."""

    template: str
    tokens: tuple[NameToken, ...]
    origin: str  # `variant.pass` of its first pass: what tells two texts of one name apart
    specialization: Specialization


def _named_texts(rendered: list[RenderedPass]) -> dict[str, _Named]:
    """WGSL text -> its template and the tokens its name is made of."""
    by_template: dict[str, list[tuple[dict, RenderedPass, Specialization]]] = {}
    for item in rendered:
        for spec in item.specializations:
            by_template.setdefault(item.template, []).append(
                (dict(zip(item.key_names, spec.key)), item, spec)
            )
    named: dict[str, _Named] = {}
    for template, specs in by_template.items():
        columns = list(dict.fromkeys(n for values, _, _ in specs for n in values))
        rows = [tuple(repr(values.get(n)) for n in columns) for values, _, _ in specs]
        kept = [columns[i] for i in deciding_columns(rows)]
        for values, item, spec in specs:
            if spec.wgsl not in named:
                tokens = tuple(_token(n, values.get(n)) for n in kept)
                named[spec.wgsl] = _Named(template, tokens, f"{item.variant.ir.id}.{item.pass_.ir.id}", spec)
    return named


def name_from(template: str, tokens: tuple[NameToken, ...]) -> str:
    """A shader's name: `skip-group-norm-slab.f16-vec4-skip-full` (`only` where no value varies)."""
    stem = PurePosixPath(template).name.removesuffix(".wgsl.jinja")
    return f"{stem}.{'-'.join(dict.fromkeys(t.text for t in tokens if t.text)) or 'only'}"


def shader_files(rendered: list[RenderedPass]) -> ShaderFiles:
    """The op's shader files, from every RenderedPass of the op."""
    named = _named_texts(rendered)
    taken: set[str] = set()
    files: dict[str, ShaderFile] = {}
    names: dict[str, str] = {}
    for text, item in named.items():
        name = name_from(item.template, item.tokens)
        origin = None
        if name in taken:  # another text has these values: its variant and pass tell them apart
            origin = item.origin
            name = f"{name}.{origin.replace('_', '-').replace('.', '-')}"
        taken.add(name)
        files[name] = ShaderFile(
            name, item.template, item.tokens, origin, text, item.specialization.interface
        )
        names[text] = name
    return ShaderFiles(files, names)
