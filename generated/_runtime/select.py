# SPDX-License-Identifier: Apache-2.0
"""Variant selection (docs/MANIFEST.md, "Variant selection"): which candidate runs a request, and why each other one does not.
"""

from __future__ import annotations

from .caps import features_text
from .errors import ContractError


_REJECTING_ERRORS = (ArithmeticError, IndexError, ValueError, TypeError, KeyError)


def candidate_verdict(candidate, request, derived):
    """Why a candidate cannot run this request (its features, then its when clauses), or None."""
    missing = [f for f in candidate.REQUIRED_FEATURES if f not in request.caps.features]
    if missing:
        return f"needs device feature {', '.join(missing)} (the device has: {features_text(request.caps.features)})"
    try:
        return candidate.when(request, derived)
    except _REJECTING_ERRORS as e:
        # A rule that cannot be evaluated for these inputs does not hold.
        return f"when could not be evaluated: {type(e).__name__}: {e}"


def select(op, candidates, request, derived, variant=None):
    """Pick a variant (docs/MANIFEST.md, "Variant selection"); returns (module, explanation lines).

    candidates come in descending priority, ties in manifest order. A candidate needs its
    features and every when clause; a demoted one goes behind every one that is not demoted.
    """
    known = [c.ID for c in candidates]
    if variant is not None and variant not in known:
        raise ContractError(
            op, "variant", "known variant", f"unknown variant {variant!r}; known: {', '.join(known)}"
        )

    reasons, demoted, notes = _verdicts(candidates, request, derived)
    order = sorted(candidates, key=lambda c: demoted.get(c.ID, False))  # stable
    passing = [c for c in order if c.ID not in reasons]

    if variant is not None:
        if variant in reasons:
            raise ContractError(
                op, "variant", "variant applies", f"variant {variant!r} does not apply: {reasons[variant]}"
            )
        chosen = next(c for c in candidates if c.ID == variant)
    elif passing:
        chosen = passing[0]
    else:
        facts = (
            f"shapes {dict(request.shapes)}, dtypes {dict(request.dtypes)}, attrs {dict(request.attrs)}, "
            f"features [{', '.join(sorted(request.caps.features))}]"
        )
        lines = "".join(f"\n  {c.ID}: {reasons[c.ID]}" for c in candidates)
        raise ContractError(op, "variant", "no candidate", f"no variant applies to {facts}:{lines}\n")

    return chosen, _explanation(order, chosen, variant, reasons, demoted, notes)


def _verdicts(candidates, request, derived):
    """({ID: why it was rejected}, {ID: demoted} of those that pass, {ID: a note on demoteWhen})."""
    reasons = {}  # ID -> why it was rejected; absent when it passes
    demoted = {}
    notes = {}
    for c in candidates:
        failed = candidate_verdict(c, request, derived)
        if failed is not None:
            reasons[c.ID] = failed
            continue
        try:
            demoted[c.ID] = bool(c.demoted(request, derived))
        except _REJECTING_ERRORS as e:
            # Like a when clause, demoteWhen holds only if it evaluates to true.
            demoted[c.ID] = False
            notes[c.ID] = f" (demoteWhen could not be evaluated: {type(e).__name__}: {e})"
    return reasons, demoted, notes


def _explanation(order, chosen, variant, reasons, demoted, notes):
    """One line per candidate, in selection order: rejected, taken, demoted or passed over."""
    how = "was forced with variant=" if variant is not None else "was preferred"
    explanation = []
    for c in order:
        head = f"{c.ID} (priority {c.PRIORITY}): "
        if c.ID in reasons:
            line = f"rejected: {reasons[c.ID]}"
        elif c is chosen:
            line = "taken"
            if variant is not None:
                line += " (forced with variant=)"
            elif demoted[c.ID]:
                line += " (demoted, but no candidate that is not demoted passes)"
        elif demoted[c.ID]:
            line = f"demoted: passes, but its demoteWhen holds; {chosen.ID} {how}"
        else:
            line = f"passes, but {chosen.ID} {how}"
        explanation.append(head + line + notes.get(c.ID, ""))
    return tuple(explanation)
