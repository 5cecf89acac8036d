# SPDX-License-Identifier: Apache-2.0
"""A request with a tensor over one storage binding cut into pieces: batch items first, then channel
ranges within an item; or, for ops that normalize rows, ranges of rows. Every binding offset is on
the device's alignment, or the range goes through scratch.
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
    large; or ranges of rows, where the manifest cuts by rows. Every binding offset is a multiple of
    minStorageBufferOffsetAlignment. Where no cut exists, the refusal names the tensor and the limit.
    """
    dtype_names = contract.dtype_names(request)
    itemsize = {k: np.dtype(v).itemsize for k, v in dtype_names.items()}
    # Kernels count elements in u32: a piece also stays under 2**31 elements of its smallest type.
    limit = min(request.caps.limits["maxStorageBufferBindingSize"], 2**31 * min(itemsize.values()))
    size = {k: storage_nbytes(request.shapes[k], dtype_names[k]) for k in request.shapes}
    over = sorted((k for k in request.shapes if size[k] > limit), key=lambda k: -size[k])  # largest first
    spec = contract.chunking
    scratch = _row_scratch(request, spec) if spec is not None and spec.rows else 0
    if not over and scratch <= limit:
        return None
    if not over:  # only the rows' scratch is over: the rows are cut for it
        over = [_first_rows_tensor(request, spec)]

    def refuse(why, key=None):
        key = key or over[0]
        kind = "input" if key in {t.key for t in contract.inputs} else "output"
        nbytes = storage_nbytes(request.shapes[key], dtype_names[key])
        need = f"{request.shapes[key]} {dtype_names[key]} needs {nbytes} bytes"
        if nbytes <= limit:
            need = f"the scratch of its rows ({spec.row_scratch_bytes} bytes a row) needs {scratch} bytes"
        return ContractError(
            contract.op,
            f"{kind} {request.names.get(key, key)}",
            "maxStorageBufferBindingSize",
            f"{need}, over the device's maxStorageBufferBindingSize = {limit}, and {why}",
        )

    if spec is None:
        raise refuse("this op cannot run in pieces")
    outputs = {t.key for t in contract.outputs}
    if spec.rows:
        return _cut_by_rows(request, spec, outputs, itemsize, size, over, limit, refuse)
    batch = [k for k in spec.batch if k in request.shapes]
    if any(k not in batch for k in over):
        raise refuse(f"the op can cut only {', '.join(spec.batch)}")
    items = request.shapes[batch[0]][0]
    if any(request.shapes[k][0] != items for k in batch):
        raise refuse("the tensors it can cut do not share one batch axis")
    per_item = {k: numel(request.shapes[k]) // items * itemsize[k] for k in batch}
    align = request.caps.limits["minStorageBufferOffsetAlignment"]
    for copy_outputs in (False, True):
        sliced, copied, count = _batch_cut(per_item, outputs, align, limit, copy_outputs)
        if count >= 1:
            return tuple(
                _batch_piece(request, sliced, copied, start, min(start + count, items))
                for start in range(0, items, count)
            )
    if not spec.channels:
        raise refuse("one batch item alone is over it, and the op cannot cut channels")
    return _channel_pieces(contract, request, spec, itemsize, limit, align, refuse)


def _batch_cut(per_item, outputs, align, limit, copy_outputs, off_alignment=frozenset(), scratch=0):
    """(sliced, copied, items a piece) of a cut along the batch axis. A tensor whose items start on
    the alignment is bound in place; the other inputs (a (N, C) skip) have their range copied into
    scratch, which needs only 4 bytes. Outputs are bound in place first, in pieces of as many items as
    keep their offsets aligned; where no such piece fits (`copy_outputs`), an output off the alignment
    is written into scratch and copied to its place after the piece's dispatches. `off_alignment`
    names tensors whose pieces start off the alignment whatever the piece size: always copied.
    `scratch`: the bytes of scratch an item takes (a buffer of the piece's own: no alignment)."""
    sliced = {
        k: b
        for k, b in per_item.items()
        if k not in off_alignment and (b % align == 0 or (k in outputs and not copy_outputs))
    }
    copied = {k: b for k, b in per_item.items() if k not in sliced}
    step = math.lcm(
        *(align // math.gcd(align, b) for b in sliced.values()),
        *(4 // math.gcd(4, b) for b in copied.values()),
    )
    return sliced, copied, limit // max(*per_item.values(), scratch) // step * step


def _batch_piece(request, sliced, copied, start, stop):
    shapes = dict(request.shapes)
    for key in {**sliced, **copied}:
        shapes[key] = (stop - start,) + tuple(request.shapes[key][1:])
    slices = {key: (start * b, _pad4((stop - start) * b)) for key, b in sliced.items()}
    copies = {key: (start * b, _pad4((stop - start) * b)) for key, b in copied.items()}
    return _Piece(shapes, dict(request.attrs), slices, copies)


def _channel_pieces(contract, request, spec, itemsize, limit, align, refuse):
    """Pieces of channel ranges within each batch item, whole groups kept together: bound in place
    where every piece starts on the alignment, else copied through scratch (4-byte steps)."""
    channels = [k for k in spec.channels if k in request.shapes]
    per_channel = [k for k in spec.per_channel if k in request.shapes]
    if any(k not in channels and k not in per_channel for k in request.shapes):
        raise refuse("one batch item alone is over it, and not every tensor can be cut by channel")
    items, total = request.shapes[channels[0]][:2]
    unit = total // request.attrs[spec.groups_attribute] if spec.groups_attribute else 1
    for key in per_channel:  # a copy moves whole 4-byte words: an f16 range starts at an even channel
        unit = math.lcm(unit, 4 // math.gcd(4, itemsize[key]))
    per_channel_bytes = {k: inner(request.shapes[k], 1) * itemsize[k] for k in channels}
    why = f"its batch items do not start at multiples of minStorageBufferOffsetAlignment = {align}"
    for copy in (False, True):
        # In place needs every item on the alignment; a copy needs every item on 4 bytes.
        grain = 4 if copy else align
        if items > 1 and any(total * b % grain for b in per_channel_bytes.values()):
            continue
        step = math.lcm(unit, *(grain // math.gcd(grain, b) for b in per_channel_bytes.values()))
        count = limit // max(per_channel_bytes.values()) // step * step
        if count >= 1:
            cut = _ChannelCut(items, total, count, per_channel_bytes, copy, per_channel)
            return _cut_channels(request, spec, itemsize, cut)
        why = f"even the smallest piece it can be cut into ({step} channels) is over it"
    raise refuse(why)


@dataclass(frozen=True)
class _ChannelCut:
    items: int
    total: int
    count: int  # channels a piece
    per_channel_bytes: Mapping[str, int]  # of the tensors cut by channel
    copy: bool  # those tensors copied through scratch, not bound in place
    per_channel: tuple  # (C) tensors, always copied


def _cut_channels(request, spec, itemsize, cut):
    pieces = []
    for item in range(cut.items):
        for first in range(0, cut.total, cut.count):
            last = min(first + cut.count, cut.total)
            shapes = dict(request.shapes)
            for key in cut.per_channel_bytes:
                shapes[key] = (1, last - first) + tuple(request.shapes[key][2:])
            for key in cut.per_channel:
                shapes[key] = (last - first,)
            attrs = dict(request.attrs)
            if spec.groups_attribute:
                attrs[spec.groups_attribute] = (last - first) // (
                    cut.total // request.attrs[spec.groups_attribute]
                )
            ranges = {
                k: ((item * cut.total + first) * b, _pad4((last - first) * b))
                for k, b in cut.per_channel_bytes.items()
            }
            copies = {k: (first * itemsize[k], _pad4((last - first) * itemsize[k])) for k in cut.per_channel}
            if cut.copy:
                pieces.append(_Piece(shapes, attrs, {}, {**ranges, **copies}))
            else:
                pieces.append(_Piece(shapes, attrs, ranges, copies))
    return tuple(pieces)


@dataclass(frozen=True)
class _Rows:
    """Where the rows of a request lie. A row is an index of the axes before the first normalized
    axis, flattened; the normalized axes are the last `tail` of every tensor cut by rows."""

    count: int  # rows of the request (of its first tensor cut by rows)
    tail: int
    of: Mapping[str, int]  # rows each cut tensor holds: `count`, or fewer where it repeats
    bytes: Mapping[str, int]  # bytes a row, of each cut tensor
    period: int  # rows after which the repeating tensors start over (1: none repeats)


def _cut_by_rows(request, spec, outputs, itemsize, size, over, limit, refuse):
    """The pieces of a manifest that cuts by rows; every tensor over the limit must be one it cuts."""
    # An output not asked for is not bound: it needs no cut, and must not hold one to its alignment.
    bound = [k for k in request.shapes if k not in outputs or k in request.outputs]
    rows = _row_layout(request, spec, bound, itemsize, refuse)
    widest = max(*rows.bytes.values(), spec.row_scratch_bytes)
    if widest > limit:  # and so, most often, a parameter of the normalized shape, bound whole
        raise refuse(f"one row alone ({widest} bytes) is over it")
    uncut = [k for k in over if k in bound and k not in rows.bytes]
    if uncut:
        cut = ", ".join(spec.rows + spec.repeated_rows)
        raise refuse(f"it is bound whole in every piece: the op cuts only {cut} by rows", uncut[0])
    align = request.caps.limits["minStorageBufferOffsetAlignment"]
    sizes = {k: size[k] for k in rows.bytes}
    return _row_pieces(request, rows, sizes, spec.row_scratch_bytes, outputs, align, limit, refuse)


def _row_axes(request, spec, shape):
    """How many leading axes of `shape` (a tensor cut by rows) index its rows."""
    axis = request.attrs[spec.row_axis] if isinstance(spec.row_axis, str) else spec.row_axis
    return axis + len(shape) if axis < 0 else axis  # the contract has checked it is an axis of `shape`


def _first_rows_tensor(request, spec):
    return next(k for k in spec.rows + spec.repeated_rows if k in request.shapes)


def _row_scratch(request, spec):
    """The bytes of scratch the request's rows take (spec.row_scratch_bytes a row)."""
    first = request.shapes[_first_rows_tensor(request, spec)]
    return numel(first[: _row_axes(request, spec, first)]) * spec.row_scratch_bytes


def _row_layout(request, spec, bound, itemsize, refuse):
    """The rows of a request, from the first `rows` tensor and `row_axis`. A `repeated_rows` tensor
    holds every row, or the rows of the trailing row axes only, the same for every index of the outer
    ones (a (S, H) skip of a (B, S, H) input): then it repeats every `period` rows."""
    cut = [k for k in spec.rows + spec.repeated_rows if k in bound]
    first = request.shapes[cut[0]]
    lead = _row_axes(request, spec, first)
    tail = len(first) - lead
    count = numel(first[:lead])
    of = {k: numel(request.shapes[k][: max(0, len(request.shapes[k]) - tail)]) for k in cut}
    row_bytes = {k: numel(request.shapes[k][len(request.shapes[k]) - tail :]) * itemsize[k] for k in cut}
    if count == 1:
        where = "its normalized axes start at axis 0" if lead == 0 else f"the axes before axis {lead} are 1"
        raise refuse(f"it is a single row ({where}), and the op cuts only between rows")
    if any(of[k] != count for k in spec.rows if k in of):
        raise refuse("the tensors it cuts by rows do not hold the same rows")
    # A repeat is the rows of trailing row axes of `first`, so that a piece of whole repeats is whole
    # indices of the axes before them.
    repeats = {numel(first[j:lead]) for j in range(lead + 1)}
    periods = {of[k] for k in cut if of[k] != count}
    if not periods <= repeats or len(periods) > 1:
        raise refuse("a tensor it cuts by rows repeats them in a way the pieces cannot follow")
    return _Rows(count, tail, of, row_bytes, periods.pop() if periods else 1)


def _row_pieces(request, rows, sizes, scratch, outputs, align, limit, refuse):
    """Pieces of ranges of rows, every row normalizing on its own. Pieces of whole repeats first, the
    repeating tensors bound whole in each (they are the same rows for every repeat); where one repeat
    does not fit, pieces within one repeat, those tensors cut to the piece's range of their rows.
    `scratch`: the bytes of scratch a row takes, which a piece must hold too."""
    repeating = {k for k in rows.of if rows.of[k] != rows.count}
    if all(sizes[k] <= limit for k in repeating):
        per_repeat = {k: rows.period * b for k, b in rows.bytes.items() if k not in repeating}
        for copy_outputs in (False, True):
            sliced, copied, count = _batch_cut(
                per_repeat, outputs, align, limit, copy_outputs, scratch=rows.period * scratch
            )
            if count >= 1:
                step = count * rows.period
                return tuple(
                    _row_piece(request, rows, sliced, copied, start, min(start + step, rows.count))
                    for start in range(0, rows.count, step)
                )
    if not repeating:
        raise refuse(_no_row_cut())
    return _pieces_within_repeats(request, rows, scratch, outputs, align, limit, refuse)


def _pieces_within_repeats(request, rows, scratch, outputs, align, limit, refuse):
    """Pieces that stay within one repeat of the repeating tensors, each cut to the piece's rows."""
    # Bytes from one repeat to the next in the tensors that hold every row: a piece of one repeat
    # starts where the same piece of the one before did plus these, so off the alignment it goes
    # through scratch, and off 4 bytes not even a copy can start there.
    stride = {k: rows.period * b for k, b in rows.bytes.items() if rows.of[k] == rows.count}
    if any(s % 4 for s in stride.values()):
        raise refuse(
            f"one repeat of {rows.period} rows (of a tensor repeated over the outer axes) is over it, and "
            "its repeats do not start on the 4-byte steps a copy needs"
        )
    off_alignment = {k for k, s in stride.items() if s % align}
    for copy_outputs in (False, True):
        sliced, copied, count = _batch_cut(
            rows.bytes, outputs, align, limit, copy_outputs, off_alignment, scratch
        )
        if count >= 1:
            return tuple(
                _row_piece(
                    request, rows, sliced, copied, base + first, base + min(first + count, rows.period)
                )
                for base in range(0, rows.count, rows.period)
                for first in range(0, rows.period, count)
            )
    raise refuse(_no_row_cut())


def _no_row_cut():
    # One row fits (_cut_by_rows checked): the smallest piece _batch_cut makes is then 2 rows, where a
    # row of float16 values is not whole 4-byte words.
    return "two rows, the fewest its pieces can hold (a copy moves whole 4-byte words), are over it"


def _row_piece(request, rows, sliced, copied, start, stop):
    """The piece of rows [start, stop): each cut tensor's range of bytes, at the piece's rows of its own
    (within its repeat for a repeating tensor), in a shape of its rank."""
    shapes = dict(request.shapes)
    ranges = {}
    for key in {**sliced, **copied}:
        first = start % rows.of[key]
        shapes[key] = _rows_shape(request.shapes[key], rows.tail, first, stop - start)
        ranges[key] = (first * rows.bytes[key], _pad4((stop - start) * rows.bytes[key]))
    slices = {k: r for k, r in ranges.items() if k in sliced}
    copies = {k: r for k, r in ranges.items() if k in copied}
    return _Piece(shapes, dict(request.attrs), slices, copies)


def _rows_shape(shape, tail, first, count):
    """`shape` cut to `count` rows from row `first`, of the same rank (so that an axis attribute still
    names the same axis): the trailing row axes the piece covers whole are kept, the one before them
    holds the rest, and the axes before that are 1. A piece of whole items of (B, S, H) is (k, S, H),
    which a (S, H) skip still repeats over; a piece within an item is (1, n, H)."""
    lead = len(shape) - tail
    kept, block = lead, 1
    while kept > 0 and first % (block * shape[kept - 1]) == 0 and count % (block * shape[kept - 1]) == 0:
        block *= shape[kept - 1]
        kept -= 1
    if kept == 0:
        return tuple(shape)
    return (1,) * (kept - 1) + (count // block,) + tuple(shape[kept:])
