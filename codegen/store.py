"""Stage: an op's shader store, each rendered WGSL text once, as named runs of lines.

Input: the op's RenderedPasses (wgsl.py). Output: a ShaderStore, which emit.py writes as the op's
`shaders.py` and which the variant modules name their shaders from.

Specializations of one template differ in a few lines (an alias, an element type, a bucket's
unrolled loads), so most lines recur in many shaders. The store cuts every shader into its lines
and joins the neighbours back wherever they always occur together (`_Chains`): the cuts left are
where specializations differ, down to one line inside a function, and the unrolled run of a
bucket shares its first lines with the smaller buckets'. Cut that fine, a shader would name a
hundred parts, so the store then joins more where that makes the module shorter (`_Cheaper`):
a part costs its lines once in PARTS, and its name costs about a third of a line in every shader
that names it; a two-line part that a hundred shaders name after one of three neighbours is
cheaper stored inside each of the three. Each distinct part is stored once (a line may be in
several parts), named after what it declares first (`fn chan_merge`, `struct Stats`, `binding x`),
a run inside a function after the function and its first statement (`main: let s0`), notes after
what they come before (`// main: let s0`). A shader is the names of its parts, and joining them
gives back the exact text naga validated.

A shader's own name is its template's stem and the template values that vary between the op's
specializations of that template (`group-norm-slab.f16-vec4-skip-full`): the readable key that
`plan().passes[i].spec` shows.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import PurePosixPath

from .expr import snake
from .wgsl import KeyName, RenderedPass, Specialization

PARAGRAPH_BREAK = "\n\n"
CONTINUED = "+"  # a part name with this prefix continues the previous part on the next line
# What a part name costs in SHADERS, in lines: some 25 of the 92 columns a line holds, with the
# ends of lines that no further name fills.
NAME_LINES = 0.3

_DECLARATION = re.compile(r"^(?:@compute\b.*?\bfn|fn|struct|alias|const|override|var(?:<[^>]*>)?)\s+(\w+)")
_BINDING = re.compile(r"@group\(\d+\)\s*@binding\(\d+\)\s*var(?:<[^>]*>)?\s+(\w+)")

Part = tuple[str, bool]  # (text, continues the previous part on the next line rather than after a blank line)


@dataclass(frozen=True)
class StoredShader:
    name: str
    parts: tuple[str, ...]  # part names in order; CONTINUED-prefixed ones join with a newline


@dataclass(frozen=True)
class NameToken:
    """One template value's part of a shader name: `vec4f16`, `has-bias` for True, "" for False, or
    a number after the value's name (`units8`), whose `prefix` is then that name (`units`)."""

    key: KeyName
    text: str
    prefix: str | None = None  # set where text is prefix + str(value), the value all digits


@dataclass(frozen=True)
class NameTokens:
    """What a shader's name is made of: its template's stem, then the non-empty tokens of the
    template values that tell the template's specializations apart, joined by `-` (the first of
    equal ones), or `only`; `#2`, `#3` where an earlier text took the name."""

    stem: str
    tokens: tuple[NameToken, ...]  # one a deciding template value, in key order


@dataclass(frozen=True)
class ShaderStore:
    parts: dict[str, str]  # part name -> text, in order of first use
    shaders: dict[str, StoredShader]  # shader name -> its parts, in order of first use
    names: dict[str, str]  # WGSL text -> shader name
    tokens: dict[str, NameTokens]  # shader name -> what its name is made of

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


def _glue(first: str, second: str, continued: bool) -> str:
    return first + ("\n" if continued else PARAGRAPH_BREAK) + second


def declared(line: str) -> str | None:
    """What a top-level line declares (`fn advance`, `struct Stats`, `binding x`, `override split`,
    `enable`); None for a line inside a body, a comment or an attribute line (`@compute ...`)."""
    if not line or line[0].isspace() or line.startswith(("//", "}")):
        return None
    if line.startswith("enable "):
        return "enable"
    binding = _BINDING.match(line)
    if binding:
        return f"binding {binding.group(1)}"
    match = _DECLARATION.match(line)
    if match is None:
        return None
    kind = "fn" if line.startswith("@compute") else line.split()[0].split("<")[0]
    return f"{kind} {match.group(1)}"


def _statement(line: str) -> str:
    """A body line as a name: `let s0`, `var own`, or its first word (`own`, `store_unit`, `if`)."""
    match = re.match(r"(let|var)\s+(\w+)", line)
    if match:
        return f"{match.group(1)} {match.group(2)}"
    return re.match(r"[\w.]*", line).group(0) or line.split()[0]


def part_name(text: str, enclosing: str | None) -> str:
    """What a part declares first at the top level (`fn advance`, `binding x`); a run inside the
    body of `enclosing` (`fn main`) that declares nothing there, after the function and the run's
    first statement (`main: let s0`); a part of notes only is `comment` (`_part_names` names it
    after the part it comes before)."""
    code = [line for line in text.split("\n") if line.strip() and not line.strip().startswith("//")]
    if not code:
        return "comment"
    for line in code:
        name = declared(line)
        if name is not None:
            return name
    words = [line.strip() for line in code if re.search(r"\w", line)]
    first = _statement(words[0]) if words else code[0].strip()
    return f"{enclosing.split()[-1]}: {first}" if enclosing else first


def _token(key: KeyName, value: object) -> NameToken:
    """A key value as a name token: True -> the name, False -> nothing, `vec4<f16>` -> `vec4f16`,
    a number -> the name and the number."""
    name = snake(key.name).replace("_", "-")
    if value is True:
        return NameToken(key, name)
    if value is False or value is None:
        return NameToken(key, "")
    token = re.sub(r"[^0-9A-Za-z]+", "", str(value))
    if not token.isdigit():
        return NameToken(key, token)
    return NameToken(key, f"{name}{token}", name if token == str(value) else None)


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


def _shader_names(rendered: list[RenderedPass]) -> dict[str, NameTokens]:
    """WGSL text -> what its readable name is made of (`_unique` makes the names unique)."""
    by_template: dict[str, list[tuple[dict, Specialization]]] = {}
    for item in rendered:
        for spec in item.specializations:
            by_template.setdefault(item.template, []).append((dict(zip(item.key_names, spec.key)), spec))
    names: dict[str, NameTokens] = {}
    for template, specs in by_template.items():
        stem = PurePosixPath(template).name.removesuffix(".wgsl.jinja")
        columns = list(dict.fromkeys(n for values, _ in specs for n in values))
        rows = [tuple(repr(values.get(n)) for n in columns) + (spec.wgsl,) for values, spec in specs]
        kept = [columns[i] for i in deciding_columns([row[:-1] for row in rows])]
        for values, spec in specs:
            if spec.wgsl in names:
                continue
            names[spec.wgsl] = NameTokens(stem, tuple(_token(n, values.get(n)) for n in kept))
    return names


def name_from(tokens: NameTokens) -> str:
    """A shader's name before `_unique`: `group-norm-slab.f16-vec4-skip-full`."""
    return f"{tokens.stem}.{'-'.join(dict.fromkeys(t.text for t in tokens.tokens if t.text)) or 'only'}"


def _unique(names: dict[str, str]) -> dict[str, str]:
    """The names with `#2`, `#3`, ... on the second and later texts of a name already taken."""
    count: dict[str, int] = {}
    unique = {}
    for text, name in names.items():
        count[name] = count.get(name, 0) + 1
        unique[text] = name if count[name] == 1 else f"{name}#{count[name]}"
    return unique


def _line_keys(paragraph: str) -> tuple[list[str], list[tuple[str, str, int]]]:
    """A paragraph's lines, and what tells them apart for `_Chains`: (the paragraph's first line,
    the line, how often the paragraph had it before). A line is the same line only where its
    paragraph starts the same way: a `}` or `return x;` in two unrelated functions, or twice in
    one, would otherwise be one line with many neighbours, cut out of everything around it."""
    lines = paragraph.split("\n")
    seen: Counter = Counter()
    keys = []
    for line in lines:
        keys.append((lines[0], line, seen[line]))
        seen[line] += 1
    return lines, keys


class _Chains:
    """Every shader cut into its lines, then joined back wherever two neighbours always occur
    together: every occurrence of the first is followed by the second (on the next line, or after
    a blank line) and every occurrence of the second follows the first. A joined run has the
    neighbours of its ends, so joining changes no other pair: one pass joins them all. Paragraphs
    recur in many shaders: each distinct one is read and cut once."""

    def __init__(self, texts: list[str]):
        self.paragraphs: dict[str, tuple[list[str], list[tuple]]] = {}
        self.after: dict[tuple, set] = {}
        self.before: dict[tuple, set] = {}
        self.shaders = [self.read(text) for text in texts]
        self.runs: dict[str, list[str]] = {}

    def read(self, text: str) -> list[str]:
        """A shader's paragraphs; the neighbours of their lines are noted."""
        paragraphs = text.split(PARAGRAPH_BREAK)
        for paragraph in paragraphs:
            if paragraph not in self.paragraphs:
                lines, keys = self.paragraphs[paragraph] = _line_keys(paragraph)
                for first, second in zip(keys, keys[1:]):
                    self.after.setdefault(first, set()).add((second, True))
                    self.before.setdefault(second, set()).add((first, True))
        keys = [self.paragraphs[p][1] for p in paragraphs]
        for i, own in enumerate(keys):
            self.before.setdefault(own[0], set()).add((keys[i - 1][-1], False) if i else None)
            self.after.setdefault(own[-1], set()).add((keys[i + 1][0], False) if i + 1 < len(keys) else None)
        return paragraphs

    def together(self, first: tuple, second: tuple, continued: bool) -> bool:
        return (
            first != second
            and self.after[first] == {(second, continued)}
            and self.before[second] == {(first, continued)}
        )

    def cut(self, paragraph: str) -> list[str]:
        """A paragraph's runs of lines that always occur together."""
        if paragraph not in self.runs:
            lines, keys = self.paragraphs[paragraph]
            runs = [[lines[0]]]
            for i in range(1, len(lines)):
                if self.together(keys[i - 1], keys[i], True):
                    runs[-1].append(lines[i])
                else:
                    runs.append([lines[i]])
            self.runs[paragraph] = ["\n".join(run) for run in runs]
        return self.runs[paragraph]

    def parts(self) -> list[list[Part]]:
        """Every shader as its runs, a paragraph's first run joined to the one before where the
        blank line between them always occurs."""
        joined_shaders = []
        for paragraphs in self.shaders:
            out: list[Part] = []
            for i, paragraph in enumerate(paragraphs):
                runs = self.cut(paragraph)
                start = 0
                if i and self.together(
                    self.paragraphs[paragraphs[i - 1]][1][-1], self.paragraphs[paragraph][1][0], False
                ):
                    out[-1] = (_glue(out[-1][0], runs[0], False), out[-1][1])
                    start = 1
                out += [(run, j > 0) for j, run in enumerate(runs) if j >= start]
            joined_shaders.append(out)
        return joined_shaders


class _Cheaper:
    """Joins neighbouring parts where the module gets shorter, best first, in rounds.

    Joining parts a and b (b on the next line, or after a blank line) wherever b follows a saves
    one name in each such place (NAME_LINES) and costs the joined text once; a or b stops costing
    its own text where no other place names it. Each round takes the joins that save lines, most
    first, at most one for any part (the savings of a part's other joins change with it), then
    counts again. Parts are numbers here: code = 2 * text id + (1 if continued).
    """

    def __init__(self, shaders: list[list[Part]]):
        self.ids: dict[str, int] = {}
        self.texts: list[str] = []
        self.lines: list[int] = []
        self.shaders = [[self.id(text) * 2 + continued for text, continued in parts] for parts in shaders]

    def id(self, text: str) -> int:
        if text not in self.ids:
            self.ids[text] = len(self.texts)
            self.texts.append(text)
            self.lines.append(text.count("\n") + 2)  # its name's line, then its text
        return self.ids[text]

    def joins(self) -> dict[tuple[int, int], int]:
        """This round's joins: (left text id, right code) -> the joined text's id."""
        pairs: Counter = Counter()
        uses: Counter = Counter()
        for codes in self.shaders:
            uses.update(code >> 1 for code in codes)
            pairs.update(zip((code >> 1 for code in codes), codes[1:]))
        saving = []
        for (left, right), count in pairs.items():
            if left == right >> 1:
                continue
            a, b = self.lines[left], self.lines[right >> 1]
            joined = a + b - (right & 1)  # a name line and both texts, with a blank line unless continued
            freed = (a if uses[left] == count else 0) + (b if uses[right >> 1] == count else 0)
            saved = count * NAME_LINES - joined + freed
            if saved > 0:
                saving.append((-saved, left, right))
        taken: set[int] = set()
        joins = {}
        for _, left, right in sorted(saving):
            if left not in taken and right >> 1 not in taken:
                taken |= {left, right >> 1}
                joins[(left, right)] = self.id(
                    _glue(self.texts[left], self.texts[right >> 1], bool(right & 1))
                )
        return joins

    def apply(self, joins: dict[tuple[int, int], int]) -> None:
        for i, codes in enumerate(self.shaders):
            out = [codes[0]]
            for code in codes[1:]:
                joined = joins.get((out[-1] >> 1, code))
                if joined is None:
                    out.append(code)
                else:
                    out[-1] = joined * 2 + (out[-1] & 1)
            self.shaders[i] = out

    def parts(self) -> list[list[Part]]:
        while joins := self.joins():
            self.apply(joins)
        return [[(self.texts[code >> 1], bool(code & 1)) for code in codes] for codes in self.shaders]


def _opens(line: str) -> str | None:
    """A top-level line's effect on the enclosing declaration: the declaration whose body it
    opens, "" for one that opens none (or closes one), None for a line inside a body."""
    if line.startswith("}"):
        return ""
    name = declared(line)
    if name is None:
        return None
    return name if line.rstrip().endswith(("{", "(", ",")) else ""


def _part_names(shaders: list[list[Part]]) -> dict[str, str]:
    """Part text -> its name, unique within the op (`part_name`), where first used; a note (a
    comment-only part) is named after the part it comes before (`// main: let s0`)."""
    names: dict[str, str] = {}
    effect: dict[str, str | None] = {}  # part text -> the enclosing declaration after it, None: unchanged
    for parts in shaders:
        enclosing = None
        for i, (text, _) in enumerate(parts):
            if text not in names:
                name = part_name(text, enclosing)
                if name == "comment" and i + 1 < len(parts):
                    name = f"// {part_name(parts[i + 1][0], enclosing)}"
                names[text] = name
            if text not in effect:
                found = [o for o in map(_opens, text.split("\n")) if o is not None]
                effect[text] = found[-1] if found else None
            enclosing = enclosing if effect[text] is None else effect[text] or None
    return _unique(names)


def store_shaders(rendered: list[RenderedPass]) -> ShaderStore:
    """The op's shader store, from every RenderedPass of the op."""
    made_of = _shader_names(rendered)
    names = _unique({text: name_from(tokens) for text, tokens in made_of.items()})
    split = _Cheaper(_Chains(list(names)).parts()).parts()
    part_names = _part_names(split)
    shaders = {}
    for (text, name), parts in zip(names.items(), split):
        shaders[name] = StoredShader(
            name, tuple((CONTINUED if continued else "") + part_names[part] for part, continued in parts)
        )
    tokens = {names[text]: made_of[text] for text in names}
    store = ShaderStore({name: text for text, name in part_names.items()}, shaders, names, tokens)
    for text, name in names.items():
        if joined(store.parts, shaders[name].parts) != text:
            raise RuntimeError(f"the shader store does not give back {name} exactly")  # a compiler bug
    return store
