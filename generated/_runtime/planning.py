# SPDX-License-Identifier: Apache-2.0
"""Plans from requests: contract checks, derive, selection and every pass's values, chunked and empty
plans, and each candidate's verdict on a request (explain()).

A Request reaches this module already checked, with the caller's names for its tensors (the
boundary made it); every refusal raised here names a tensor by `request.names`.
"""

from __future__ import annotations

from dataclasses import replace

from .chunking import chunk_request
from .errors import ContractError, PlanError
from .limits import check_binding_sizes, check_pass_limits, WORKGROUP_LIMITS
from .numeric import numel, storage_nbytes, whole
from .plans import Chunk, Plan
from .select import candidate_verdict, select


def _chunked_plan(contract, request, variant, pieces):
    """A plan of pieces, each planned like a request of its own (pieces of one size share a plan)."""
    plans, chunks = {}, []
    for piece in pieces:
        key = (tuple(sorted(piece.shapes.items())), tuple(sorted(piece.attrs.items())))
        if key not in plans:
            plans[key] = plan_request(contract, _piece_request(contract, request, piece), variant)
        chunks.append(Chunk(plans[key], piece.slices, piece.copies))
    dtype_names = contract.dtype_names(request)
    inputs_of = {t.key for t in contract.inputs}
    written = {k for c in chunks for k in c.plan.outputs}
    variants = ", ".join(dict.fromkeys(c.plan.variant for c in chunks))
    limit = request.caps.limits["maxStorageBufferBindingSize"]
    explanation = (
        f"chunked: {len(chunks)} pieces, each within maxStorageBufferBindingSize = {limit} and 2**31 "
        f"elements; {len(plans)} distinct piece plan(s), variant {variants}",
    ) + chunks[0].plan.explanation
    return Plan(
        contract.op,
        variants,
        (),
        {k: (request.shapes[k], dtype_names[k]) for k in request.shapes if k in inputs_of},
        {k: (request.shapes[k], dtype_names[k]) for k in request.shapes if k in written},
        {},
        explanation,
        tuple(chunks),
    )


def _piece_request(contract, request, piece):
    """The request of one piece: its input shapes and attributes, and the output shapes they give."""
    inputs_of = {t.key for t in contract.inputs}
    inputs = {k: shape for k, shape in piece.shapes.items() if k in inputs_of}
    partial = replace(request, shapes=inputs, attrs=piece.attrs)
    return replace(partial, shapes={**inputs, **contract.output_shapes(partial)})


def plan_request(contract, request, variant=None):
    """The plan of a checked request: contract rules, then an empty, a chunked or a variant's plan.

    `variant` forces a candidate by ID. Refusals are ContractErrors in the caller's words.
    """
    contract.check_contract(request)
    _check_sizes(contract, request)
    if variant is not None and variant not in [c.ID for c in contract.candidates]:
        known = ", ".join(c.ID for c in contract.candidates)
        raise ContractError(
            contract.op, "variant", "known variant", f"unknown variant {variant!r}; known: {known}"
        )
    if _is_empty(contract, request):
        return _empty_plan(contract, request, variant)
    chunks = chunk_request(contract, request)
    if chunks is not None:
        return _chunked_plan(contract, request, variant, chunks)
    return _variant_plan(contract, request, variant)


def _check_sizes(contract, request):
    """Tensors over maxBufferSize are refused outright, whatever the variant."""
    names = contract.dtype_names(request)
    limit = request.caps.limits["maxBufferSize"]
    for t in contract.inputs + contract.outputs:
        if t.key in request.shapes:
            nbytes = storage_nbytes(request.shapes[t.key], names[t.key])
            if nbytes > limit:
                kind = "input" if t in contract.inputs else "output"
                raise ContractError(
                    contract.op,
                    f"{kind} {request.names.get(t.key, t.role)}",
                    "maxBufferSize",
                    f"{request.shapes[t.key]} {names[t.key]} needs {nbytes} bytes, over the device's maxBufferSize = {limit}",
                )


def _derived(contract, request):
    try:
        return contract.derive(request)
    except (ArithmeticError, IndexError, KeyError, TypeError, ValueError) as error:
        # The contract passed, so this is a request the manifest did not foresee: refuse it clearly.
        raise ContractError(
            contract.op,
            "request",
            "derive",
            f"the manifest's derived values cannot be computed: {type(error).__name__}: {error}",
        ) from None


def _check_element_counts(contract, request):
    """Kernels count a tensor's elements in u32: a piece over that is refused by name."""
    for t in contract.inputs + contract.outputs:
        count = numel(request.shapes.get(t.key, ()))
        if count >= 2**32:
            kind = "input" if t in contract.inputs else "output"
            raise ContractError(
                contract.op,
                f"{kind} {request.names.get(t.key, t.role)}",
                "u32 element count",
                f"{request.shapes[t.key]} has {count} elements; the kernels count elements in 32-bit "
                "integers, so one piece holds at most 4294967295",
            )


def _variant_plan(contract, request, variant):
    _check_element_counts(contract, request)
    derived = _derived(contract, request)
    contract.check_derived_contract(request, derived)
    chosen, explanation = select(contract.op, contract.candidates, request, derived, variant)
    values = chosen.values(request, derived)
    dtype_names = contract.dtype_names(request)

    def described(keys):
        return {k: (request.shapes[k], dtype_names[k]) for k in keys}

    inputs = described(t.key for t in contract.inputs if t.key in request.shapes)
    try:
        passes = chosen.passes(request, derived, values)
    except PlanError as error:
        raise PlanError(
            contract.op, f"variant {chosen.ID}: {error.subject}", error.rule, error.message
        ) from None
    # A pass dispatched with no workgroups has nothing to run (the layer family's statistics copy
    # when no statistics output is asked for): left out, it costs no pipeline and no bind group.
    passes = tuple(p for p in passes if 0 not in p.dispatch)
    # Requested outputs, and any other output the chosen passes write (allocated, not returned).
    bound = {b.resource for p in passes for b in p.bindings if b.kind == "output"}
    outputs = described(t.key for t in contract.outputs if t.key in request.outputs or t.key in bound)
    intermediates = _intermediates(contract, chosen.intermediates(request, derived, values))
    plan = Plan(contract.op, chosen.ID, passes, inputs, outputs, intermediates, explanation)
    check_binding_sizes(contract.op, plan, request.caps, request.names)
    for pass_plan in passes:
        try:
            check_pass_limits(contract.op, pass_plan, request.caps)
        except PlanError as error:
            name = pass_plan.workgroup_size_name
            if (
                error.rule == "workgroup size"
                or name not in contract.tunables
                or error.rule not in WORKGROUP_LIMITS
            ):
                raise
            raise ContractError(
                contract.op,
                f"tunable {name}",
                error.rule,
                f"{name} = {request.tunables[name]} sets the workgroup size of pass {pass_plan.name}: {error.message}",
            ) from None
    return plan


def _is_empty(contract, request):
    """Every requested output has no elements: there is nothing to compute."""
    keys = [t.key for t in contract.outputs if t.key in request.outputs]
    return bool(keys) and all(numel(request.shapes[k]) == 0 for k in keys)


def _empty_plan(contract, request, variant):
    """A plan with no passes: outputs of the contract's (empty) shapes, no dispatch, no scratch."""
    try:  # rules on derived values still hold for an empty request, where they can be computed
        derived = contract.derive(request)
    except (ArithmeticError, IndexError, KeyError, TypeError, ValueError):
        derived = None
    if derived is not None:
        contract.check_derived_contract(request, derived)
    dtype_names = contract.dtype_names(request)
    inputs = {
        t.key: (request.shapes[t.key], dtype_names[t.key]) for t in contract.inputs if t.key in request.shapes
    }
    outputs = {
        t.key: (request.shapes[t.key], dtype_names[t.key])
        for t in contract.outputs
        if t.key in request.outputs
    }
    empty = ", ".join(f"{k} {request.shapes[k]}" for k in outputs)
    explanation = (
        f"nothing to compute: every output is empty ({empty}); no variant runs and nothing is dispatched",
    )
    return Plan(contract.op, variant or "none", (), inputs, outputs, {}, explanation)


def _intermediates(contract, intermediates):
    """A variant's scratch buffers, {id: (shape, dtype)}, every dimension a whole number."""
    try:
        return {
            k: (tuple(whole(d, f"intermediate {k}") for d in shape), dtype)
            for k, (shape, dtype) in intermediates.items()
        }
    except PlanError as error:  # whole() knows the value, the op is ours to name
        raise PlanError(contract.op, error.subject, error.rule, error.message) from None


def candidate_lines(contract, request):
    """Each candidate's own verdict on a request, where its derived values can be computed at all."""
    try:
        derived = contract.derive(request)
    except (ArithmeticError, IndexError, KeyError, TypeError, ValueError):
        return ()
    lines = []
    for c in contract.candidates:
        reason = candidate_verdict(c, request, derived)
        lines.append(
            f"{c.ID} (priority {c.PRIORITY}): " + (f"rejected: {reason}" if reason else "its own rules pass")
        )
    return tuple(lines)
