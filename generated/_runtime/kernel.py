# SPDX-License-Identifier: Apache-2.0
"""An op's calls that touch a GPU: kernel() (with its memo of repeated calls on the same Tensors)
and Sequence. Their arguments go through the boundary (`kernel_call`) once; what they run goes
through `calls`.
"""

from __future__ import annotations

import weakref
from collections import abc
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .boundary import kernel_call, typed_items
from .buffer_watch import buffer_changes_so_far
from .cache import per_device, watching
from .calls import (
    call_tensors,
    check_call,
    encode_calls,
    record_call,
    RecordedCall,
    run_plan,
    submit_call,
    withdraw_recorded,
)
from .caps import checked_device, default_device, refusing_lost_device
from .errors import ContractError
from .plans import OpContract
from .tensors import check_encoder, fresh_output, give_back, Tensor, TensorIn


def _contract_op(contract, *args):
    """The op a call names (its first argument is the op's contract), for refusing_lost_device."""
    return contract.op


@refusing_lost_device(_contract_op)
def run_kernel(
    contract,
    inputs,
    attrs=None,
    *,
    outputs=None,
    device=None,
    variant=None,
    caps=None,
    tunables=None,
    out=None,
    encoder=None,
):
    """kernel(): infer shapes and dtypes from the inputs, plan, run; everything checked first.

    With `encoder`, the op is recorded into that GPUCommandEncoder and nothing is submitted.
    """
    device = checked_device(contract.op, device)
    repeat_key = _repeat_key(contract, inputs, attrs, outputs, variant, caps, tunables, out)
    if repeat_key is not None:
        repeat = _repeated_call(repeat_key, device, inputs, out)
        if repeat is not None:  # the same Tensors and options as a recent call: encode it again
            results = _run_again(repeat, contract.op, inputs, out, encoder)
            if results is not None:
                return results
    call = kernel_call(contract, inputs, attrs, outputs, device, variant, caps, tunables, out)
    if repeat_key is not None and call.plan.passes:
        return _run_remembered(repeat_key, call, _tensors_in_order(inputs, out), encoder)
    results = run_plan(call.plan, call.values, call.device, call.out, call.names, encoder)
    return {o: results[o] for o in call.wanted}


# kernel() again with the same Tensors, attributes and options as a recent call (an app's loop over
# resident tensors, with out= or fresh outputs) encodes the call recorded then: nothing is planned,
# checked or looked up anew. What could differ is checked on every hit: each Tensor still has the
# buffer, shape and dtype it had, and is not destroyed; a fresh output must come from the pool in the
# buffer the recorded call binds (the last call's output, given back: what a loop that drops its
# result gets); anything else falls back to the full path, which refuses what it refused before.
# Entries drop out once a buffer they bind is collected (`watching`).
REPEATED_CALLS_SIZE = 256
repeated_call_cache = weakref.WeakKeyDictionary()  # device -> LRUCache {repeat key: RepeatedCall}


@dataclass(frozen=True)
class RepeatedCall:
    device: object
    call: RecordedCall
    described: tuple  # (shape, dtype) of each input, then of each out= Tensor, in the caller's order
    returns: tuple  # (output key, the caller's out= name, or None for a fresh output) of each returned
    fresh: tuple = ()  # (output key, shape, dtype name, weak reference to the buffer it was recorded with)


def _repeat_key(contract, inputs, attrs, outputs, variant, caps, tunables, out):
    """The memo key of a call on resident Tensors (with out= or not), or None for any other call."""
    if caps is not None or not isinstance(inputs, Mapping) or not (out is None or isinstance(out, Mapping)):
        return None
    out = out or {}
    if not all(v is None or type(v) is Tensor for v in inputs.values()) or not all(
        type(t) is Tensor for t in out.values()
    ):
        return None
    if not all(isinstance(m, Mapping) or m is None for m in (attrs, tunables)):
        return None
    outputs_key = _outputs_key(outputs)
    if outputs_key is None:
        return None
    key = (
        id(contract),
        tuple((name, id(v)) for name, v in inputs.items()),
        tuple((name, id(t)) for name, t in out.items()),
        typed_items(attrs or {}),
        outputs_key,
        variant,
        typed_items(tunables or {}),
    )
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _outputs_key(outputs):
    """outputs= as part of a memo key, each form kept apart (a set is not the default); None for a
    form the memo does not keep (the call then takes the full path, which checks it)."""
    if outputs is None or isinstance(outputs, str):
        return ("as given", outputs)
    if isinstance(outputs, (list, tuple)):
        return ("in order", tuple(outputs))
    if isinstance(outputs, (set, frozenset)):
        return ("any order", frozenset(outputs))
    return None


def _tensors_in_order(inputs, out):
    return [v for v in inputs.values() if v is not None] + list((out or {}).values())


def _repeated_call(key, device, inputs, out):
    """The remembered call of `key`, if every Tensor is still the one it was made with."""
    current = _tensors_in_order(inputs, out)
    if not current:
        return None
    cache = repeated_call_cache.get(device if device is not None else current[0].device)
    entry = cache.get(key) if cache is not None else None
    if entry is None:
        return None
    repeat, buffer_refs = entry
    if len(current) + len(repeat.fresh) != len(buffer_refs):
        return None
    for tensor, ref, (shape, dtype) in zip(current, buffer_refs, repeat.described):
        if tensor.gone or tensor.buffer is not ref() or tensor.shape != shape or tensor.dtype != dtype:
            return None
    return repeat


def _run_again(repeat, op, inputs, out, encoder):
    """Encode a remembered call again; None (nothing done) where a fresh output did not come from the
    pool in the buffer the call binds."""
    fresh = {}
    for key, shape, dtype_name, ref in repeat.fresh:
        fresh[key] = fresh_output(shape, dtype_name, repeat.device, prefer=ref())
        if fresh[key].buffer is not ref():
            for tensor in fresh.values():  # never used: straight back
                give_back(tensor)
            return None
    if encoder is not None:
        check_encoder(op, encoder, repeat.device)
    submit_call(repeat.call, repeat.device, encoder, op)
    if encoder is not None:
        withdraw_recorded([_tensors_in_order(inputs, out), fresh.values()])
    return {key: out[name] if name is not None else fresh[key] for key, name in repeat.returns}


def _run_remembered(key, call, ordered, encoder):
    """The full path of a call that can repeat: checked, recorded, run, then remembered.

    `ordered` is the caller's input and out= Tensors, in the order `_repeated_call` compares them.
    """
    plan = call.plan
    recorder = None if encoder is None else "encoder="
    values, checked_out, device, _ = check_call(
        plan, call.values, call.device, call.out, call.names, recorder, encoder
    )
    tensors, _ = call_tensors(plan, values, device, checked_out)
    recorded = record_call(plan, tensors, device)
    submit_call(recorded, device, encoder, plan.op)
    if encoder is not None:
        withdraw_recorded(group.values() for group in tensors.values())
    outputs = tensors["output"]
    fresh = tuple(
        (k, shape, dtype_name, weakref.ref(outputs[k].buffer))
        for k, (shape, dtype_name) in plan.outputs.items()
        if k not in checked_out
    )
    returns = tuple((k, call.names[k] if k in checked_out else None) for k in call.wanted)
    repeat = RepeatedCall(device, recorded, tuple((t.shape, t.dtype) for t in ordered), returns, fresh)
    cache = per_device(repeated_call_cache, device, REPEATED_CALLS_SIZE)
    entry = [repeat, None]
    buffers = [t.buffer for t in ordered] + [outputs[k].buffer for k, *_ in fresh]
    entry[1] = watching(cache, key, entry, buffers)
    cache.put(key, entry)
    return {k: outputs[k] for k in call.wanted}


class Sequence:
    """Calls recorded once and replayed with one submit: what CUDA graphs and ONNX Runtime's
    graph capture give their users.

    `kernel()` plans, checks, allocates the outputs and builds pipelines, uniforms and bind groups
    once, and returns the output Tensors; `run()` encodes every recorded dispatch into one command
    buffer and submits it, reading whatever the input Tensors hold then (write new data between
    runs with `queue.write_buffer`). Nothing is planned, allocated or created per `run()`.
    Intermediates come from the device's scratch pool (see `scratch_buffer`).
    """

    def __init__(self, device: Any = None) -> None:
        device = checked_device("Sequence", device)
        self.device = device if device is not None else default_device()
        self._calls: list[RecordedCall] = []
        # Every Tensor a recorded call binds, with the buffer it bound then: checked by run().
        self._tensors: list[tuple[Tensor, Any]] = []
        self._checked_at = -1  # buffer_changes_so_far() when run() last found them all as recorded

    @refusing_lost_device("Sequence.kernel()")
    def kernel(
        self,
        op: Any,
        inputs: Mapping[str, TensorIn | None],
        attrs: Mapping[str, float] | None = None,
        *,
        outputs: abc.Sequence[str] | None = None,
        out: Mapping[str, Tensor] | None = None,
        variant: str | None = None,
        tunables: Mapping[str, int] | None = None,
    ) -> dict[str, Tensor]:
        contract = getattr(op, "CONTRACT", op)
        if not isinstance(contract, OpContract):
            raise ContractError(
                "Sequence.kernel()",
                "op",
                "an op",
                f"takes an op module (generated.group_normalization), not {type(op).__name__}",
            )
        call = kernel_call(contract, inputs, attrs, outputs, self.device, variant, None, tunables, out)
        values, checked_out, device, _ = check_call(
            call.plan, call.values, call.device, call.out, call.names, "Sequence.kernel()"
        )
        tensors, _ = call_tensors(call.plan, values, device, checked_out)
        recorded = record_call(call.plan, tensors, device)
        withdraw_recorded(group.values() for group in tensors.values())
        if recorded.bound:
            self._calls.append(recorded)
            self._tensors += [(t, t.buffer) for group in tensors.values() for t in group.values()]
        return {o: tensors["output"][o] for o in call.wanted}

    def __len__(self) -> int:
        return len(self._calls)

    def __reduce__(self) -> Any:  # deepcopy and pickle: its calls hold GPU objects
        raise TypeError("a Sequence holds GPU pipelines and buffers and cannot be copied or pickled")

    def _check_buffers(self) -> None:
        """A destroyed buffer in a submission aborts wgpu-native, and a re-pointed one would leave
        the recorded calls on the old buffer: refuse both first. (Only when some buffer was
        destroyed or re-pointed since the last run.)"""
        for tensor, recorded in self._tensors:
            if tensor.buffer is not recorded:
                raise ContractError(
                    "Sequence",
                    "run()",
                    "as recorded",
                    f"a {tensor.shape} Tensor that a recorded call binds has another buffer now "
                    "(tensor.buffer was re-pointed): record the calls again",
                )
            if tensor.gone:
                raise ContractError(
                    "Sequence",
                    "run()",
                    "not destroyed",
                    f"a {tensor.shape} Tensor that a recorded call binds was destroyed: record the calls again",
                )

    @refusing_lost_device("Sequence.run()")
    def run(self) -> None:
        """Encode every recorded call into one command buffer and submit it."""
        if not self._calls:
            return
        if self._checked_at != buffer_changes_so_far():
            self._check_buffers()
            self._checked_at = buffer_changes_so_far()
        encoder = self.device.create_command_encoder(label="Sequence")
        encode_calls(encoder, self._calls, label="Sequence")
        self.device.queue.submit([encoder.finish()])
