"""Errors as data: every stage reports `Problem`s, and one `CompileError` carries all of them.

A problem says where it is (a manifest `Origin`, a template line, or both), what is wrong, and the
expression it is about. Stages collect problems instead of stopping at the first, so one run
shows everything; `CompileError` drops repeats, so a problem that several paths reach (a pooled
binding used by many passes) is reported once.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass

from .ir import Origin


@dataclass(frozen=True)
class TemplateLocation:
    """A line of a template, the path repository-relative (`templates/_lib/stats.wgsl.jinja`).

    `line` is None where no line can be named: a whole-template problem, or a naga error in the
    declarations the compiler writes above the template's text.
    """

    path: str
    line: int | None = None

    def __str__(self) -> str:
        return self.path if self.line is None else f"{self.path}:{self.line}"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the sources.

    `origin`: where in a manifest (file and JSON pointer; pointer "" is the whole file), None for
    problems of the command line or the machine. `template`: the template line, for rendering and
    naga problems; such a problem is printed at its template line, and its `origin` (the pass that
    uses the template) stays in the data. `expression`: the manifest expression's source.
    """

    origin: Origin | None
    message: str
    expression: str | None = None
    template: TemplateLocation | None = None

    @property
    def where(self) -> str | None:
        if self.template is not None:
            return str(self.template)
        return None if self.origin is None else str(self.origin)

    def __str__(self) -> str:
        text = self.message if self.where is None else f"{self.where}: {self.message}"
        return text if self.expression is None else f"{text}: `{self.expression}`"


class CompileError(Exception):
    """Everything a build found wrong, each problem once, in the order found."""

    def __init__(self, problems: Iterable[Problem]):
        self.problems: tuple[Problem, ...] = tuple(dict.fromkeys(problems))
        super().__init__("\n".join(str(problem) for problem in self.problems))


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name closest to `name`, for "did you mean" (case folded: `shapes.x` finds `shapes.X`)."""
    by_folded = {candidate.lower(): candidate for candidate in known}
    close = difflib.get_close_matches(name.lower(), list(by_folded), n=1)
    return by_folded[close[0]] if close else None
