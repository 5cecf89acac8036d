# SPDX-License-Identifier: Apache-2.0
"""The call boundary: a caller's arguments made into a Request once, keeping the caller's names, and
planned through the plan cache. Every public call of an op comes through here: plan(), explain()
and warmup() with shapes, kernel() and Sequence.kernel() with arrays or Tensors (`kernel_call`).

Each argument is refused by the caller's name for it: an input by the name the caller gave it (its
bind key or its ONNX name), an attribute, a dtype, a tunable, an output by theirs. The Request keeps
the inputs' names (`Request.names`), so that the contract's rules, planning and the checks before
GPU work refuse in the caller's words too, as they raise: nothing is reworded afterwards.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from .cache import LRUCache
from .caps import Caps, caps_of, checked_device, default_device
from .errors import ContractError
from .planning import candidate_lines, plan_request
from .plans import Plan, Request, WGSL_DTYPES
from .tensors import checked_shape, dtype_text, refuse_masked, Tensor


_DTYPE_NAMES = {
    "f32": "float32",
    "f16": "float16",
    "float32": "float32",
    "float16": "float16",
    np.dtype("float32"): "float32",
    np.dtype("float16"): "float16",
}


def _dtype_name(value):
    """numpy dtypes, ONNX names and WGSL names all mean one of float32 / float16."""
    try:
        text = _DTYPE_NAMES.get(value)
    except TypeError:  # unhashable
        text = None
    if text is None:
        try:
            text = np.dtype(value).name
        except TypeError:
            text = str(value)
    return text


_F32_MAX = float(np.finfo(np.float32).max)
_F32_TINY = float(np.finfo(np.float32).tiny)


def checked_flag(op, name, value):
    """A plain function's flag argument (return_sum=): True or False, nothing that merely converts."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ContractError(op, f"argument {name}", "a bool", f"{name}= takes True or False, got {value!r}")


def _attribute_value(op, name, spec, value):
    """One attribute value checked against its kind and the 32-bit type the kernels give it."""
    subject = f"attribute {name}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ContractError(op, subject, spec.kind, f"expected a number, got {value!r}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int beyond float's range: beyond both 32-bit types too
        kind = "32-bit int" if spec.kind == "int" else "f32 range"
        raise ContractError(
            op, subject, kind, f"{value!r} does not fit the 32-bit type the kernels use"
        ) from None
    if not finite:
        raise ContractError(op, subject, "finite", f"must be a finite number, got {value!r}")
    if spec.kind == "int":
        if not float(value).is_integer():
            raise ContractError(op, subject, "int", f"expected an integer, got {value!r}")
        value = int(value)
        if not -(2**31) <= value < 2**31:
            raise ContractError(
                op, subject, "32-bit int", f"{value} does not fit the 32-bit integer the kernels use"
            )
        return value
    value = float(value)
    if abs(value) > _F32_MAX:
        raise ContractError(
            op, subject, "f32 range", f"{value!r} does not fit a 32-bit float (the kernels compute in f32)"
        )
    if 0 < abs(value) < _F32_TINY:
        raise ContractError(
            op,
            subject,
            "f32 range",
            f"{value!r} is below the smallest normal 32-bit float and would act as 0",
        )
    return value


def _attributes(contract, attrs):
    if attrs is not None and not isinstance(attrs, Mapping):
        raise ContractError(
            contract.op,
            "attrs",
            "a mapping",
            f"attrs maps attribute names to values, got {type(attrs).__name__}",
        )
    attrs = dict(attrs or {})
    known = {a.name: a for a in contract.attributes}
    named = [name for name in attrs if not isinstance(name, str)]
    if named:
        raise ContractError(
            contract.op, "attrs", "attribute names", f"attribute names are strings, got {named[0]!r}"
        )
    unknown = sorted(set(attrs) - set(known))
    if unknown:
        raise ContractError(
            contract.op,
            f"attribute {unknown[0]}",
            "known attribute",
            f"unknown attribute{_suggest(unknown[0], known)}; known: {', '.join(known)}",
        )
    resolved = {}
    for name, spec in known.items():
        if name not in attrs:
            if spec.default is None:
                if spec.required:
                    raise ContractError(
                        contract.op,
                        f"attribute {name}",
                        "required",
                        "the attribute is required and has no default",
                    )
                continue
            resolved[name] = spec.default
            continue
        value = _attribute_value(contract.op, name, spec, attrs[name])
        if spec.allowed is not None:
            same = np.float32 if spec.comparison == "float32" else (lambda v: v)
            if not any(same(value) == same(a) for a in spec.allowed):
                allowed = ", ".join(repr(a) for a in spec.allowed)
                raise ContractError(
                    contract.op,
                    f"attribute {name}",
                    f"one of {allowed}",
                    f"{value!r} is not supported (allowed: {allowed})",
                )
        resolved[name] = value
    return resolved


def _suggest(name, known):
    import difflib

    close = difflib.get_close_matches(str(name), list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _requested_outputs(contract, outputs):
    """Bind keys of the outputs asked for (default: the required ones); unknown names refused."""
    by_name = {t.key: t.key for t in contract.outputs} | {t.role: t.key for t in contract.outputs}
    if outputs is None:
        return tuple(t.key for t in contract.outputs if not t.optional)
    if isinstance(outputs, str):
        outputs = (outputs,)
    if not isinstance(outputs, (tuple, list, set, frozenset)) or not all(isinstance(o, str) for o in outputs):
        raise ContractError(
            contract.op,
            "outputs",
            "output names",
            f"outputs= takes output names, like ('Y', 'S'); got {outputs!r}",
        )
    if not outputs:
        raise ContractError(
            contract.op,
            "outputs",
            "an output",
            "outputs= names at least one output (None: the required ones)",
        )
    unknown = [o for o in outputs if o not in by_name]
    if unknown:
        raise ContractError(
            contract.op,
            f"output {unknown[0]}",
            "known output",
            f"unknown output; outputs are {', '.join(t.role for t in contract.outputs)}",
        )
    return tuple(dict.fromkeys(by_name[o] for o in outputs))


def _given_shapes(contract, shapes):
    """{bind key: shape} and {bind key: the caller's name} from shapes keyed by key or role."""
    return _inputs_by_key(contract, shapes, _input_shape, "shapes", "shapes")


def _check_required(contract, given, names):
    """Every input the op cannot do without has a shape (a value)."""
    for t in contract.inputs:
        if not t.optional and t.key not in given:
            name = names.get(t.key, t.key)
            alias = f" (ONNX name {t.role})" if t.role != name else ""
            raise ContractError(
                contract.op, f"input {name}", "required input", f"required input {name} is missing{alias}"
            )


def _inputs_by_key(contract, given, convert, subject, holds):
    """{bind key: convert(op, name, value)} and {bind key: the caller's name} of inputs named by bind
    key or ONNX role; a None value is an input left out (None shape: not given). Refused: `given`
    (the argument `subject`, mapping input names to `holds`) not a mapping, an unknown name, an input
    given twice."""
    if not isinstance(given, Mapping):
        raise ContractError(
            contract.op,
            subject,
            "a mapping",
            f"{subject} maps input names to {holds}, got {type(given).__name__}",
        )
    tensors = {t.key: t for t in contract.inputs}
    roles = {t.role: t.key for t in contract.inputs}
    values, names = {}, {}
    for name, value in given.items():
        key = name if name in tensors else roles.get(name)
        if key is None:
            known = list(tensors) + [r for r in roles if r not in tensors]
            raise ContractError(
                contract.op,
                f"input {name}",
                "known input",
                f"unknown input{_suggest(name, known)}; inputs are {', '.join(tensors)}",
            )
        if key in names:
            raise ContractError(
                contract.op,
                f"input {name}",
                "one name per input",
                f"given twice, as {names[key]!r} and {name!r}: pass it once",
            )
        names[key] = name
        if value is not None:
            values[key] = convert(contract.op, name, value)
    return values, names


def _input_shape(op, name, shape):
    return checked_shape(op, f"input {name}", shape)


def _request_dtypes(contract, dtypes):
    if dtypes is not None and not isinstance(dtypes, Mapping):
        raise ContractError(
            contract.op,
            "dtypes",
            "a mapping",
            f"dtypes maps type variables to dtypes, got {type(dtypes).__name__}",
        )
    wgsl_dtypes = {}
    for type_var, value in (dtypes or {}).items():
        name = _dtype_name(value)
        allowed = contract.type_constraints.get(type_var)
        if allowed is None:
            raise ContractError(
                contract.op,
                f"dtype {type_var}",
                "known type variable",
                f"unknown type variable; known: {', '.join(contract.type_constraints)}",
            )
        if name not in allowed:
            raise ContractError(
                contract.op, f"dtype {type_var}", f"one of {', '.join(allowed)}", f"{name} is not supported"
            )
        wgsl_dtypes[type_var] = WGSL_DTYPES[name]
    for type_var, allowed in contract.type_constraints.items():
        if type_var not in wgsl_dtypes and len(allowed) == 1:
            # A variable of one type (an output's float32 statistics) needs no dtype from the caller.
            wgsl_dtypes[type_var] = WGSL_DTYPES[allowed[0]]
        if type_var not in wgsl_dtypes:
            raise ContractError(
                contract.op, f"dtype {type_var}", "given", "pass dtypes={...} for every type variable"
            )
    return wgsl_dtypes


def _checked_tunables(contract, tunables):
    if tunables is not None and not isinstance(tunables, Mapping):
        raise ContractError(
            contract.op,
            "tunables",
            "a mapping",
            f"tunables maps names to numbers, got {type(tunables).__name__}",
        )
    unknown_tunables = sorted(set(tunables or {}) - set(contract.tunables))
    if unknown_tunables:
        raise ContractError(
            contract.op,
            f"tunable {unknown_tunables[0]}",
            "known tunable",
            f"known: {', '.join(contract.tunables)}",
        )
    for name, value in (tunables or {}).items():
        # Workgroup sizes, counts and thresholds: some divide, so 0 is refused with the rest.
        real = isinstance(value, numbers.Real) and not isinstance(value, bool)
        if not (real and math.isfinite(value) and float(value).is_integer() and 1 <= value < 2**31):
            raise ContractError(
                contract.op, f"tunable {name}", "a whole number from 1 to 2**31 - 1", f"got {value!r}"
            )
    return {**contract.tunables, **{name: int(value) for name, value in (tunables or {}).items()}}


def _request(contract, given, names, dtypes, attrs, caps, tunables, outputs):
    """The Request of a call: `given` {bind key: shape} of its inputs, `names` the caller's for them."""
    _check_required(contract, given, names)
    wgsl_dtypes = _request_dtypes(contract, dtypes)
    all_tunables = _checked_tunables(contract, tunables)
    wanted = _requested_outputs(contract, outputs)
    roles = {t.key: t.role for t in contract.outputs}
    requested = frozenset(wanted) | frozenset(roles[k] for k in wanted)
    request = Request(given, wgsl_dtypes, _attributes(contract, attrs), all_tunables, caps, requested, names)
    return replace(request, shapes={**given, **contract.output_shapes(request)})


# caps=: the Caps a plan is made for.

_caps_by_mapping = LRUCache(64)  # canonical caps mapping -> Caps, so that a caps= mapping keeps its plans
_default_caps = []


def _webgpu_default_caps():
    if not _default_caps:
        _default_caps.append(Caps.from_mapping({}))
    return _default_caps[0]


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
                parts.append((name, tuple(sorted(typed_items(value)))))
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
    """planning_caps(), with a refusal of the device or the caps themselves naming the op (a Caps
    made by the caller refuses its own faults as "caps", which knows of no op)."""
    device = checked_device(contract.op, device)
    try:
        return planning_caps(caps, device)
    except ContractError as error:
        if error.op != "caps":
            raise
        raise ContractError(contract.op, f"caps {error.subject}", error.rule, error.message) from None


# The plan cache: plans are immutable, so a repeated request reuses one, found by its arguments as
# the caller gave them (attributes, tunables, dtypes and outputs unchecked: a key is only ever
# stored for a request that planned) and its inputs' shapes and names.

PLAN_CACHE_SIZE = 1024
plan_cache = LRUCache(PLAN_CACHE_SIZE)  # request key -> (caps, plan)


def typed_items(mapping):
    """Items with their types: a memo must not take True for 1 (they hash alike).

    In the caller's order, unsorted: the same request in another order is only another entry."""
    return tuple([(k, v.__class__, v) for k, v in mapping.items()])


def _plan_key(contract, given, names, dtypes, attrs, caps, tunables, variant, outputs):
    """The memo key of a request, or None for one that cannot be a key (refused while planning).
    `given` and `names` are checked already: shapes are tuples of ints, names strings."""
    try:
        key = (
            contract.op,
            tuple(given.items()),
            tuple(names.items()),
            typed_items(dtypes) if dtypes else None,
            typed_items(attrs) if attrs else None,
            typed_items(tunables) if tunables else None,
            id(caps),
            variant,
            outputs if outputs is None or isinstance(outputs, str) else tuple(outputs),
        )
        hash(key)
        return key
    except (TypeError, AttributeError):
        return None  # not a mapping, unhashable values: plan without the cache


def _cached_plan(contract, given, names, dtypes, attrs, caps, tunables, variant, outputs):
    """The plan of a call's request, memoised: a repeated call costs one dictionary lookup."""
    key = _plan_key(contract, given, names, dtypes, attrs, caps, tunables, variant, outputs)
    cached = plan_cache.get(key) if key is not None else None
    if cached is not None and cached[0] is caps:
        return cached[1]
    request = _request(contract, given, names, dtypes, attrs, caps, tunables, outputs)
    plan = plan_request(contract, request, variant)
    if key is not None:
        plan_cache.put(key, (caps, plan))
    return plan


# plan(), explain() and warmup(): the caller gives shapes.


def plan_for_shapes(contract, shapes, dtypes, attrs, *, caps, tunables, variant, device, outputs):
    """(plan, {bind key: the caller's name} of its inputs) of a call that gives shapes."""
    planned_caps = _op_caps(contract, caps, device)
    given, names = _given_shapes(contract, shapes)
    plan = _cached_plan(contract, given, names, dtypes, attrs, planned_caps, tunables, variant, outputs)
    return plan, names


def plan_uncached(contract, shapes, dtypes, attrs, *, caps, tunables, variant, device, outputs):
    """plan_for_shapes() without the plan cache (a warmup of thousands of requests would push an app's
    plans out of it)."""
    planned_caps = _op_caps(contract, caps, device)
    given, names = _given_shapes(contract, shapes)
    request = _request(contract, given, names, dtypes, attrs, planned_caps, tunables, outputs)
    return plan_request(contract, request, variant), names


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
    return plan_for_shapes(
        contract,
        shapes,
        dtypes,
        attrs,
        caps=caps,
        tunables=tunables,
        variant=variant,
        device=device,
        outputs=outputs,
    )[0]


def explain_plan(
    contract, shapes, dtypes=None, attrs=None, *, caps=None, tunables=None, device=None, outputs=None
):
    """Why each candidate was or was not taken; for a refused request, the broken rule first, then
    each candidate's own verdict where the request could be made at all."""
    try:
        planned_caps = _op_caps(contract, caps, device)
        given, names = _given_shapes(contract, shapes)
        request = _request(contract, given, names, dtypes, attrs, planned_caps, tunables, outputs)
    except ContractError as error:
        return f"refused: {error}"
    try:
        plan = plan_request(contract, request)
    except ContractError as error:
        return "\n".join((f"refused: {error}",) + candidate_lines(contract, request))
    return "\n".join(plan.explanation)


# kernel() and Sequence.kernel(): the caller gives arrays or Tensors, and maybe out= Tensors.


@dataclass(frozen=True)
class KernelCall:
    """One kernel() call's arguments, checked and planned: what running or recording it takes."""

    plan: Plan
    values: Mapping  # input bind key -> numpy array (native byte order) or Tensor
    names: Mapping  # bind key -> the caller's name, of every input and out= Tensor
    out: Mapping  # output bind key -> the caller's out= Tensor (not yet checked against the plan)
    wanted: tuple  # bind keys of the outputs the call returns
    device: object


def kernel_call(contract, inputs, attrs, outputs, device, variant, caps, tunables, out):
    """A kernel() call's arguments checked into a KernelCall: each input converted, its dtype and
    shape read, the plan made (or found), outputs= and out= named by bind key."""
    values, names = _kernel_inputs(contract, inputs)
    dtypes = _input_dtypes(contract, values, names)
    given = {key: (v.shape if type(v.shape) is tuple else tuple(v.shape)) for key, v in values.items()}
    if device is None:
        device = next((v.device for v in values.values() if isinstance(v, Tensor)), None) or default_device()
    planned_caps = _op_caps(contract, caps, device)
    plan = _cached_plan(contract, given, names, dtypes, attrs, planned_caps, tunables, variant, outputs)
    wanted = _requested_outputs(contract, outputs)
    keyed_out, out_names = _output_names(contract, out)
    return KernelCall(plan, values, {**names, **out_names}, keyed_out, wanted, device)


def _kernel_input(op, name, value):
    """A Tensor as it is; anything else as a native-order numpy array (big-endian data converted)."""
    if isinstance(value, Tensor):
        return value
    refuse_masked(op, f"input {name}", value)
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as error:
        raise ContractError(
            op,
            f"input {name}",
            "an array",
            f"expected a numpy array or Tensor, got {type(value).__name__}: {error}",
        ) from None
    if array.dtype.kind not in "fiub":
        raise ContractError(
            op,
            f"input {name}",
            "an array",
            f"expected a float32 or float16 numpy array or Tensor, got {type(value).__name__} of dtype {array.dtype}",
        )
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    return array


def _kernel_inputs(contract, inputs):
    """{bind key: value} and {bind key: the caller's name}; None means an input left out."""
    return _inputs_by_key(contract, inputs, _kernel_input, "inputs", "arrays or Tensors")


def _input_dtypes(contract, values, names):
    """{type variable: dtype name} of the given inputs, each allowed, one per type variable."""
    tensors = {t.key: t for t in contract.inputs}
    dtypes, first = {}, {}
    for key, value in values.items():
        name = _dtype_name(value.dtype)
        type_var = tensors[key].type_var
        allowed = contract.type_constraints[type_var]
        subject = f"input {names[key]}"
        if isinstance(value, Tensor) and not (value.dtype.isnative or value.dtype.byteorder == "|"):
            raise ContractError(
                contract.op,
                subject,
                "little-endian",
                f"a Tensor's dtype must be native ({dtype_text(value.dtype)}): GPU buffers hold little-endian data",
            )
        if name not in allowed:
            hint = f" (convert with .astype(numpy.{allowed[0]}))" if value.dtype.kind in "fiub" else ""
            raise ContractError(
                contract.op,
                subject,
                f"{type_var} in {', '.join(allowed)}",
                f"dtype {name} is not supported{hint}",
            )
        if dtypes.setdefault(type_var, name) != name:
            raise ContractError(
                contract.op,
                subject,
                f"one dtype for {type_var}",
                f"dtype {name} differs from {first[type_var]}'s {dtypes[type_var]}: every {type_var} tensor must share one dtype",
            )
        first.setdefault(type_var, names[key])
    return dtypes


def _output_names(contract, out):
    """out= keyed by bind key, and the caller's names of those outputs."""
    if out is None:
        return {}, {}
    if not isinstance(out, Mapping):
        raise ContractError(
            contract.op, "out", "a mapping", f"out= maps output names to Tensors, got {type(out).__name__}"
        )
    by_name = {t.key: t.key for t in contract.outputs} | {t.role: t.key for t in contract.outputs}
    keyed, names = {}, {}
    for name, tensor in out.items():
        key = by_name.get(name)
        if key is None:
            raise ContractError(
                contract.op,
                f"out {name}",
                "known output",
                f"unknown output; outputs are {', '.join(t.key for t in contract.outputs)}",
            )
        if key in keyed:
            raise ContractError(
                contract.op,
                f"out {name}",
                "one name per output",
                f"given twice, as {names[key]!r} and {name!r}",
            )
        keyed[key], names[key] = tensor, name
    return keyed, names
