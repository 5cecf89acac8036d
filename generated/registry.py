# SPDX-License-Identifier: Apache-2.0
"""The ONNX operator registry of the generated package: which op package runs which operator version.

The compiler writes the entries (``_ops.py``, from the manifests and the ONNX version tables); the
package's ``__init__`` re-exports `ops()` and `find_op()`.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple


class OpEntry(NamedTuple):
    """One ONNX operator version and the op package that runs it."""

    module: object  # the op package
    domain: str  # "ai.onnx" or "com.microsoft"
    op_type: str
    since_version: int
    first_opset: int  # the opsets of `domain` in which this version is the op's definition
    last_opset: int | None  # None: still the op's newest version
    note: str  # "" when the package implements this version as it is; else how run_node adapts it

    def serves(self, opset: int) -> bool:
        return self.first_opset <= opset and (self.last_opset is None or opset <= self.last_opset)

    def __str__(self):
        last = "" if self.last_opset is None else self.last_opset
        return f"{self.domain} {self.op_type}-{self.since_version} (opsets {self.first_opset}..{last})"


def ops_of(entries) -> dict:
    """{(domain, op_type, since_version): OpEntry} of `entries`."""
    return {(e.domain, e.op_type, e.since_version): e for e in entries}


def find_in(entries, domain: str, op_type: str, opset: int | None = None) -> OpEntry | None:
    """The entry that serves `op_type` at the model's `opset` of `domain` ("" is ai.onnx), or None.

    `opset=None` takes the op's newest version; an opset that is not a whole number is a TypeError
    saying so (not a failed comparison inside `serves`).
    """
    if opset is not None and (isinstance(opset, bool) or not isinstance(opset, numbers.Integral)):
        raise TypeError(f"opset is an int (the model's opset_import version) or None, got {opset!r}")
    domain = domain or "ai.onnx"
    found = [e for e in entries if (e.domain, e.op_type) == (domain, op_type)]
    if opset is None:
        return next((e for e in found if e.last_opset is None), None)
    return next((e for e in found if e.serves(opset)), None)
