# SPDX-License-Identifier: Apache-2.0
"""Transfers between numpy and the GPU, against the bare wgpu floor measured in the same process.

`python -m generated.bench` prints the table: for 1, 16 and 100 MB of float32, the time of an upload
(`Tensor.from_numpy` and a queue sync), a download (`tensor.numpy()`) and the round trip, beside the
least wgpu itself needs for each:

- upload floor: `queue.write_buffer` from the array's own memory into a kept buffer, and a sync;
- download floor: a copy into a kept MAP_READ buffer, `map_sync`, one copy out of the mapping into a
  kept numpy array, `unmap`.

What the package does more than that (finding a pooled buffer, checking the Tensor, a new result
array for each read-back where the floor copies into a kept one) is what the "× floor" columns show.
"""

from __future__ import annotations

import numpy as np

from ._runtime import Tensor
from .bench_calls import median_us

SIZES_MB = (1, 16, 100)
QUICK_SIZES_MB = (1, 16)


class _BareFloor:
    """What wgpu needs at least for one size: kept buffers, no allocation inside the clock."""

    def __init__(self, device, nbytes):
        import wgpu

        self.device, self.nbytes = device, nbytes
        self.buffer = device.create_buffer(
            size=nbytes,
            usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST,
        )
        self.staging = device.create_buffer(
            size=nbytes, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST
        )
        self.result = np.empty(nbytes // 4, np.float32)
        self.map_mode = wgpu.MapMode.READ

    def upload(self, array, sync):
        self.device.queue.write_buffer(self.buffer, 0, array)
        sync()

    def download(self):
        encoder = self.device.create_command_encoder()
        encoder.copy_buffer_to_buffer(self.buffer, 0, self.staging, 0, self.nbytes)
        self.device.queue.submit([encoder.finish()])
        self.staging.map_sync(self.map_mode)
        mapped = self.staging.read_mapped(copy=False)
        np.copyto(self.result, np.frombuffer(mapped, np.float32))
        self.staging.unmap()
        return self.result

    def destroy(self):
        self.buffer.destroy()
        self.staging.destroy()


def transfer_rows(device, sync, sizes_mb=SIZES_MB, reps=5):
    """One row per size: the package's upload, download and round trip, and the floor of each (ms)."""
    rows = []
    for megabytes in sizes_mb:
        array = np.random.default_rng(0).standard_normal(megabytes * 250_000, dtype=np.float32)
        floor = _BareFloor(device, array.nbytes)
        kept = Tensor.from_numpy(array, device)
        try:

            def upload():
                Tensor.from_numpy(array, device).destroy()
                sync()

            def round_trip():
                with Tensor.from_numpy(array, device) as tensor:
                    tensor.numpy()

            row = {
                "megabytes": megabytes,
                "upload_ms": median_us(upload, reps) / 1e3,
                "upload_floor_ms": median_us(lambda: floor.upload(array, sync), reps) / 1e3,
                "download_ms": median_us(kept.numpy, reps) / 1e3,
                "download_floor_ms": median_us(floor.download, reps) / 1e3,
                "round_trip_ms": median_us(round_trip, reps) / 1e3,
                "round_trip_floor_ms": median_us(
                    lambda: (floor.upload(array, lambda: None), floor.download()), reps
                )
                / 1e3,
            }
            if not (np.array_equal(kept.numpy(), array) and np.array_equal(floor.download(), array)):
                raise RuntimeError(f"a {megabytes} MB transfer read back other values than it wrote")
        finally:
            kept.destroy()
            floor.destroy()
        rows.append(row)
    return rows


def transfers_markdown(rows):
    if not rows:
        return []
    lines = [
        "",
        "Transfers (medians, ms; float32): upload = `Tensor.from_numpy` and a sync, download = "
        "`tensor.numpy()`, round trip = both; floor = bare wgpu in the same process (`write_buffer` from "
        "the array into a kept buffer; a copy into a kept MAP_READ buffer, map, one copy out); "
        "× floor = ours / floor.",
        "",
        "| MB | upload | floor | × floor | download | floor | × floor | round trip | floor | × floor |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        cells = [f"{row['megabytes']}"]
        for kind in ("upload", "download", "round_trip"):
            ours, floor = row[f"{kind}_ms"], row[f"{kind}_floor_ms"]
            cells += [f"{ours:.2f}", f"{floor:.2f}", f"{ours / floor:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines
