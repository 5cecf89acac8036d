# SPDX-License-Identifier: Apache-2.0
"""Plans from requests: contract checks, derive, selection and every pass's values, chunked and empty
plans, and the plan cache behind an op's plan(), explain(), kernel() and warmup().
"""

from __future__ import annotations

from collections.abc import Mapping

from .cache import LRUCache
from .caps import Caps, caps_of, checked_device
from .chunking import chunk_request
from .errors import ContractError, PlanError
from .limits import check_binding_sizes, check_pass_limits, WORKGROUP_LIMITS
from .numeric import numel, whole
from .plans import Chunk, Plan, Request
from .requests import _check_sizes, _dtype_names, _in_callers_words, _request
from .select import candidate_verdict, select


def _chunked_plan(contract, request, variant, pieces):
    """A plan of pieces, each planned like a request of its own (pieces of one size share a plan)."""
    inputs_of = {t.key for t in contract.inputs}
    outputs = tuple(k for k in (t.key for t in contract.outputs) if k in request.outputs)
    plans, chunks = {}, []
    for piece in pieces:
        key = (tuple(sorted(piece.shapes.items())), tuple(sorted(piece.attrs.items())))
        if key not in plans:
            shapes = {k: v for k, v in piece.shapes.items() if k in inputs_of}
            sub_request = _request(
                contract, shapes, request.dtypes, piece.attrs, request.caps, request.tunables, outputs
            )
            plans[key] = _plan(contract, Request(**{**sub_request.__dict__, "names": request.names}), variant)
        chunks.append(Chunk(plans[key], piece.slices, piece.copies))
    dtype_names = _dtype_names(request, contract)
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


def _plan(contract, request, variant):
    try:
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
    except ContractError as error:
        raise _in_callers_words(contract, error, request.names) from None


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
    dtype_names = _dtype_names(request, contract)

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
    intermediates = {
        k: (tuple(whole(d, f"intermediate {k}") for d in shape), dtype)
        for k, (shape, dtype) in chosen.intermediates(request, derived, values).items()
    }
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
    dtype_names = _dtype_names(request, contract)
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


_PLAN_CACHE_SIZE = 1024
_plans = LRUCache(
    _PLAN_CACHE_SIZE
)  # request key -> (caps, plan): plans are immutable, so a repeated request reuses one
_caps_by_mapping = LRUCache(64)  # canonical caps mapping -> Caps, so that a caps= mapping keeps its plans
_default_caps = []


def _webgpu_default_caps():
    if not _default_caps:
        _default_caps.append(Caps.from_mapping({}))
    return _default_caps[0]


def _typed_items(mapping):
    """Items with their types: the plan cache must not take True for 1 (they hash alike).

    In the caller's order, unsorted: the same request in another order is only another entry."""
    return tuple([(k, v.__class__, v) for k, v in mapping.items()])


def _shape_key(shape):
    if type(shape) is tuple and all([type(d) is int for d in shape]):
        return shape
    if iter(shape) is shape:  # an iterator: reading it for a key would leave nothing to plan
        raise TypeError("an iterator is not a key")
    return (type(shape), tuple(map(type, shape)), tuple(shape))


def _plan_key(contract, shapes, dtypes, attrs, caps, tunables, variant, outputs):
    """The memo key of a request, or None for one that cannot be a key (refused while planning)."""
    try:
        key = (
            contract.op,
            tuple([(k, _shape_key(v)) for k, v in shapes.items()]),
            _typed_items(dtypes) if dtypes else None,
            _typed_items(attrs) if attrs else None,
            _typed_items(tunables) if tunables else None,
            id(caps),
            variant,
            outputs if outputs is None or isinstance(outputs, str) else tuple(outputs),
        )
        hash(key)
        return key
    except (TypeError, AttributeError):
        return None  # not a mapping, unhashable values: plan without the cache


def _cached_plan(contract, shapes, dtypes, attrs, caps, tunables, variant, outputs):
    """_plan() of the request, memoised: a repeated call costs one dictionary lookup."""
    key = _plan_key(contract, shapes, dtypes, attrs, caps, tunables, variant, outputs)
    cached = _plans.get(key) if key is not None else None
    if cached is not None and cached[0] is caps:
        return cached[1]
    plan = _plan(contract, _request(contract, shapes, dtypes, attrs, caps, tunables, outputs), variant)
    if key is not None:
        _plans.put(key, (caps, plan))
    return plan


def planning_caps(caps, device):
    """The Caps a plan is made for: the device's, a given Caps, a mapping (memoised), or WebGPU's defaults."""
    if caps is None and device is None:
        return _webgpu_default_caps()
    if isinstance(caps, Mapping):
        key = _caps_key(caps)
        if key is None:
            return caps_of(caps, device)
        cached = _caps_by_mapping.get(key)
        if cached is None:
            cached = caps_of(caps, device)
            _caps_by_mapping.put(key, cached)
        return cached
    return caps_of(caps, device)


def _caps_key(caps):
    """The memo key of a caps mapping, or None: plain names and typed values only, so that a limit
    True (refused) never finds the Caps of a limit 1 (they hash alike), and a value that is read
    as it is iterated (a generator) is read by Caps.from_mapping alone."""
    parts = []
    try:
        for name, value in caps.items():
            if isinstance(value, Mapping):
                parts.append((name, tuple(sorted(_typed_items(value)))))
            elif isinstance(value, (list, tuple, set, frozenset)) and all(type(v) is str for v in value):
                parts.append((name, tuple(sorted(value))))
            else:
                return None
        key = tuple(sorted(parts))
        hash(key)
    except (TypeError, AttributeError):
        return None  # unhashable or unorderable: Caps.from_mapping refuses it or reads it
    return key


def _op_caps(contract, caps, device):
    """planning_caps(), with a refusal of the device or the caps themselves naming the op."""
    device = checked_device(contract.op, device)
    try:
        return planning_caps(caps, device)
    except ContractError as error:
        if error.op != "caps":
            raise
        raise ContractError(contract.op, f"caps {error.subject}", error.rule, error.message) from None


def build_plan(
    contract,
    shapes,
    dtypes=None,
    attrs=None,
    *,
    caps=None,
    tunables=None,
    variant=None,
    device=None,
    outputs=None,
):
    """plan(): contract checks, derive, selection and every pass's values; no GPU work.

    Without caps= or device=, plans for WebGPU's default limits and no optional features.
    """
    return _cached_plan(
        contract, shapes, dtypes, attrs, _op_caps(contract, caps, device), tunables, variant, outputs
    )


def explain_plan(
    contract, shapes, dtypes=None, attrs=None, *, caps=None, tunables=None, device=None, outputs=None
):
    """Why each candidate was or was not taken; for a refused request, the broken rule first."""
    try:
        plan = build_plan(
            contract, shapes, dtypes, attrs, caps=caps, tunables=tunables, device=device, outputs=outputs
        )
    except ContractError as error:
        return "\n".join(
            (f"refused: {error}",)
            + _candidate_lines(contract, shapes, dtypes, attrs, caps, device, tunables, outputs)
        )
    return "\n".join(plan.explanation)


def _candidate_lines(contract, shapes, dtypes, attrs, caps, device, tunables, outputs):
    """Each candidate's own verdict on a refused request, where the request can be evaluated at all."""
    try:
        request = _request(
            contract, shapes, dtypes, attrs, _op_caps(contract, caps, device), tunables, outputs
        )
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
