"""Stage: an op's shader store, each rendered WGSL text once, as named paragraphs.

Input: the op's RenderedPasses (wgsl.py). Output: a ShaderStore, which emit.py writes as the op's
`shaders.py` and which the variant modules name their shaders from.

Specializations of one template differ in a few lines (an alias, a helper function, an element
type), so most lines recur in many shaders. The store cuts every shader into parts (paragraphs,
cut again where comment turns to code and back, and the compiler's declaration block into its
lines), joins back the neighbouring parts that always occur together, and keeps each distinct part
once, under a name taken from what it declares (`fn chan_merge`, `struct Stats`, `binding x`,
`// const UNITS` for the note before `const UNITS`); a shader is the names of its parts, and
joining them gives back the exact text naga validated.

A shader's own name is its template's stem and the template values that vary between the op's
specializations of that template (`group-norm-slab.f16-vec4-skip-full`): the readable key that
`plan().passes[i].spec` shows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from .expr import snake
from .wgsl import KeyName, RenderedPass, Specialization

PARAGRAPH_BREAK = "\n\n"
CONTINUED = "+"  # a part name with this prefix continues the previous part on the next line

_DECLARATION = re.compile(r"^(?:@compute\b.*?\bfn|fn|struct|alias|const|override|var(?:<[^>]*>)?)\s+(\w+)")


@dataclass(frozen=True)
class StoredShader:
    name: str
    parts: tuple[str, ...]  # part names in order; CONTINUED-prefixed ones join with a newline


@dataclass(frozen=True)
class ShaderStore:
    parts: dict[str, str]  # part name -> text, in order of first use
    shaders: dict[str, StoredShader]  # shader name -> its parts, in order of first use
    names: dict[str, str]  # WGSL text -> shader name

    def name_of(self, specialization: Specialization) -> str:
        return self.names[specialization.wgsl]


def joined(parts: dict[str, str], names: tuple[str, ...]) -> str:
    """A shader's text from its part names: what the generated `wgsl()` does."""
    text = ""
    for i, name in enumerate(names):
        if name.startswith(CONTINUED):
            text += "\n" + parts[name[len(CONTINUED) :]]
        else:
            text += (PARAGRAPH_BREAK if i else "") + parts[name]
    return text


def paragraph_name(text: str) -> str:
    """What a part declares first (`fn advance`, `struct Stats`, `binding x`), else its first word."""
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("//")]
    if not lines:
        return "comment"
    binding = re.match(r"@group\(\d+\)\s*@binding\(\d+\)\s*var(?:<[^>]*>)?\s+(\w+)", lines[0])
    if binding:
        return f"binding {binding.group(1)}"
    if lines[0].startswith("override "):
        return f"override {lines[0].split()[1].rstrip(':')}"
    if lines[0].startswith("enable "):
        return "enable"
    joined_lines = " ".join(lines)
    match = _DECLARATION.match(joined_lines) or re.match(r"(let|var)\s+(\w+)", joined_lines)
    if match is None:
        return re.match(r"[\w.]*", lines[0]).group(0) or lines[0].split()[0]
    kind = "fn" if joined_lines.startswith("@compute") else joined_lines.split()[0].split("<")[0]
    return f"{kind} {match.group(match.lastindex)}"


def _is_comment(line: str) -> bool:
    return line.lstrip().startswith("//")


def _is_declaration(line: str) -> bool:
    """A line of the block the compiler writes before the template's text (one fact a line)."""
    return line.startswith(("enable ", "override ", "@group", "struct Params"))


def split_parts(text: str) -> list[tuple[str, bool]]:
    """(part text, continues the previous part on the next line) of a shader, in order, before the
    store joins the parts that always occur together (`_joined_runs`).

    Paragraphs are cut where their lines change from comment to code or back, so that a long
    note is stored once however many code variants follow it; the compiler's declaration block
    (enable, overrides, bindings, Params) is cut into its lines, since specializations differ
    there in one element type at a time.
    """
    parts = []
    for paragraph in text.split(PARAGRAPH_BREAK):
        lines = paragraph.split("\n")
        header = all(_is_declaration(line) for line in lines)
        runs = [[lines[0]]]
        for line in lines[1:]:
            if header or _is_comment(line) != _is_comment(runs[-1][-1]):
                runs.append([line])
            else:
                runs[-1].append(line)
        parts += [("\n".join(run), i > 0) for i, run in enumerate(runs)]
    return parts


def _joined_runs(shaders: list[list[tuple[str, bool]]]) -> list[list[tuple[str, bool]]]:
    """The shaders' parts, with a part and the one after it on the next line joined wherever that
    pair always occurs together: every occurrence of the first is followed by the second and every
    occurrence of the second follows the first. Joining never stores a line twice, and leaves the
    cuts only where specializations differ."""
    while True:
        after: dict[str, set] = {}
        before: dict[str, set] = {}
        for parts in shaders:
            for i, (text, continued) in enumerate(parts):
                after.setdefault(text, set()).add(parts[i + 1] if i + 1 < len(parts) else None)
                before.setdefault(text, set()).add((parts[i - 1][0], continued) if i else None)
        joined, changed = [], False
        for parts in shaders:
            out: list[tuple[str, bool]] = []
            fresh = False  # the last part was joined in this round: its neighbours are not known yet
            for text, continued in parts:
                if out and continued and not fresh and out[-1][0] != text:
                    if after[out[-1][0]] == {(text, True)} and len(before[text]) == 1:
                        out[-1] = (out[-1][0] + "\n" + text, out[-1][1])
                        fresh = changed = True
                        continue
                out.append((text, continued))
                fresh = False
            joined.append(out)
        if not changed:
            return joined
        shaders = joined


def _token(key: KeyName, value: object) -> str:
    """A key value as a name token: True -> the name, False -> nothing, `vec4<f16>` -> `vec4f16`."""
    if value is True:
        return snake(key.name).replace("_", "-")
    if value is False or value is None:
        return ""
    token = re.sub(r"[^0-9A-Za-z]+", "", str(value))
    return f"{snake(key.name).replace('_', '-')}{token}" if token.isdigit() else token


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


def _shader_names(rendered: list[RenderedPass]) -> dict[str, str]:
    """WGSL text -> a readable shader name, unique within the op."""
    by_template: dict[str, list[tuple[dict, Specialization]]] = {}
    for item in rendered:
        for spec in item.specializations:
            by_template.setdefault(item.template, []).append((dict(zip(item.key_names, spec.key)), spec))
    names: dict[str, str] = {}
    for template, specs in by_template.items():
        stem = PurePosixPath(template).name.removesuffix(".wgsl.jinja")
        columns = list(dict.fromkeys(n for values, _ in specs for n in values))
        rows = [tuple(repr(values.get(n)) for n in columns) + (spec.wgsl,) for values, spec in specs]
        kept = [columns[i] for i in deciding_columns([row[:-1] for row in rows])]
        for values, spec in specs:
            if spec.wgsl in names:
                continue
            tokens = [t for t in (_token(n, values.get(n)) for n in kept) if t]
            names[spec.wgsl] = f"{stem}.{'-'.join(dict.fromkeys(tokens)) or 'only'}"
    return _unique(names)


def _unique(names: dict[str, str]) -> dict[str, str]:
    """The names with `#2`, `#3`, ... on the second and later texts of a name already taken."""
    count: dict[str, int] = {}
    unique = {}
    for text, name in names.items():
        count[name] = count.get(name, 0) + 1
        unique[text] = name if count[name] == 1 else f"{name}#{count[name]}"
    return unique


def _part_names(shaders: list[list[tuple[str, bool]]]) -> dict[str, str]:
    """Part text -> its name, unique within the op: what it declares; a note (a comment-only
    part) is named after the part it comes before where first used (`// const UNITS`)."""
    names: dict[str, str] = {}
    for parts in shaders:
        for i, (text, _) in enumerate(parts):
            if text not in names:
                name = paragraph_name(text)
                if name == "comment" and i + 1 < len(parts):
                    name = f"// {paragraph_name(parts[i + 1][0])}"
                names[text] = name
    return _unique(names)


def store_shaders(rendered: list[RenderedPass]) -> ShaderStore:
    """The op's shader store, from every RenderedPass of the op."""
    names = _shader_names(rendered)
    split = _joined_runs([split_parts(text) for text in names])
    part_names = _part_names(split)
    shaders = {}
    for (text, name), parts in zip(names.items(), split):
        shaders[name] = StoredShader(name, tuple((CONTINUED if continued else "") + part_names[part] for part, continued in parts))
    store = ShaderStore({name: text for text, name in part_names.items()}, shaders, names)
    for text, name in names.items():
        if joined(store.parts, shaders[name].parts) != text:
            raise RuntimeError(f"the shader store does not give back {name} exactly")  # a compiler bug
    return store
