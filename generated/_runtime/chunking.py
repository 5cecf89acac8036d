# SPDX-License-Identifier: Apache-2.0
"""A request with a tensor over one storage binding cut into pieces: batch items first, then channel
ranges within an item, every binding offset on the device's alignment.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .errors import ContractError
from .numeric import storage_nbytes, inner, numel


@dataclass(frozen=True)
class _Piece:
    shapes: Mapping[str, tuple]
    attrs: Mapping[str, object]
    slices: Mapping[str, tuple]
    copies: Mapping[str, tuple]


def _pad4(nbytes):
    return -(-nbytes // 4) * 4


def chunk_request(contract, request):
    """The pieces of a request that has a tensor over maxStorageBufferBindingSize, else None.

    Batch items first (the fewest pieces), channel ranges within an item when one item is too
    large; every binding offset a multiple of minStorageBufferOffsetAlignment. Where no cut
    exists, the refusal names the tensor and the limit.
    """
    dtype_names = contract.dtype_names(request)
    itemsize = {k: np.dtype(v).itemsize for k, v in dtype_names.items()}
    # Kernels count elements in u32: a piece also stays under 2**31 elements of its smallest type.
    limit = min(request.caps.limits["maxStorageBufferBindingSize"], 2**31 * min(itemsize.values()))
    size = {k: storage_nbytes(request.shapes[k], dtype_names[k]) for k in request.shapes}
    over = sorted((k for k in request.shapes if size[k] > limit), key=lambda k: -size[k])  # largest first
    if not over:
        return None

    def refuse(why):
        key = over[0]
        kind = "input" if key in {t.key for t in contract.inputs} else "output"
        nbytes = storage_nbytes(request.shapes[key], dtype_names[key])
        return ContractError(
            contract.op,
            f"{kind} {request.names.get(key, key)}",
            "maxStorageBufferBindingSize",
            f"{request.shapes[key]} {dtype_names[key]} needs {nbytes} bytes, over the device's "
            f"maxStorageBufferBindingSize = {limit}, and {why}",
        )

    spec = contract.chunking
    if spec is None:
        raise refuse("this op cannot run in pieces")
    batch = [k for k in spec.batch if k in request.shapes]
    if any(k not in batch for k in over):
        raise refuse(f"the op can cut only {', '.join(spec.batch)}")
    items = request.shapes[batch[0]][0]
    if any(request.shapes[k][0] != items for k in batch):
        raise refuse("the tensors it can cut do not share one batch axis")
    per_item = {k: numel(request.shapes[k]) // items * itemsize[k] for k in batch}
    align = request.caps.limits["minStorageBufferOffsetAlignment"]
    # Outputs, and inputs whose items start on the alignment, are bound in place; the other
    # inputs (a (N, C) skip) have their range copied into scratch, which needs only 4 bytes.
    outputs = {t.key for t in contract.outputs}
    sliced = {k: b for k, b in per_item.items() if k in outputs or b % align == 0}
    copied = {k: b for k, b in per_item.items() if k not in sliced}
    step = math.lcm(
        *(align // math.gcd(align, b) for b in sliced.values()),
        *(4 // math.gcd(4, b) for b in copied.values()),
    )
    count = limit // max(per_item.values()) // step * step
    if count >= 1:
        return tuple(
            _batch_piece(request, sliced, copied, start, min(start + count, items))
            for start in range(0, items, count)
        )
    if not spec.channels:
        raise refuse("one batch item alone is over it, and the op cannot cut channels")
    return _channel_pieces(contract, request, spec, itemsize, limit, align, refuse)


def _batch_piece(request, sliced, copied, start, stop):
    shapes = dict(request.shapes)
    for key in {**sliced, **copied}:
        shapes[key] = (stop - start,) + tuple(request.shapes[key][1:])
    slices = {key: (start * b, _pad4((stop - start) * b)) for key, b in sliced.items()}
    copies = {key: (start * b, _pad4((stop - start) * b)) for key, b in copied.items()}
    return _Piece(shapes, dict(request.attrs), slices, copies)


def _channel_pieces(contract, request, spec, itemsize, limit, align, refuse):
    """Pieces of channel ranges within each batch item, whole groups kept together."""
    channels = [k for k in spec.channels if k in request.shapes]
    per_channel = [k for k in spec.per_channel if k in request.shapes]
    if any(k not in channels and k not in per_channel for k in request.shapes):
        raise refuse("one batch item alone is over it, and not every tensor can be cut by channel")
    items, total = request.shapes[channels[0]][:2]
    unit = total // request.attrs[spec.groups_attribute] if spec.groups_attribute else 1
    for key in per_channel:  # a copy moves whole 4-byte words: an f16 range starts at an even channel
        unit = math.lcm(unit, 4 // math.gcd(4, itemsize[key]))
    per_channel_bytes = {k: inner(request.shapes[k], 1) * itemsize[k] for k in channels}
    step = math.lcm(unit, *(align // math.gcd(align, b) for b in per_channel_bytes.values()))
    if items > 1 and any(total * b % align for b in per_channel_bytes.values()):
        raise refuse(
            f"its batch items do not start at multiples of minStorageBufferOffsetAlignment = {align}"
        )
    count = limit // max(per_channel_bytes.values()) // step * step
    if count < 1:
        raise refuse(f"even the smallest piece it can be cut into ({step} channels) is over it")
    pieces = []
    for item in range(items):
        for first in range(0, total, count):
            last = min(first + count, total)
            shapes = dict(request.shapes)
            for key in channels:
                shapes[key] = (1, last - first) + tuple(request.shapes[key][2:])
            for key in per_channel:
                shapes[key] = (last - first,)
            attrs = dict(request.attrs)
            if spec.groups_attribute:
                attrs[spec.groups_attribute] = (last - first) // (
                    total // request.attrs[spec.groups_attribute]
                )
            slices = {
                k: ((item * total + first) * b, _pad4((last - first) * b))
                for k, b in per_channel_bytes.items()
            }
            copies = {k: (first * itemsize[k], _pad4((last - first) * itemsize[k])) for k in per_channel}
            pieces.append(_Piece(shapes, attrs, slices, copies))
    return tuple(pieces)
