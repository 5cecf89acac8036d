# SPDX-License-Identifier: Apache-2.0
"""PyTorch eager peers of the benchmarks: the same op on CUDA, timed as PyTorch users run it.

`python -m generated.bench --torch` uses it. PyTorch is imported only when a peer is made.
"""

from __future__ import annotations

import statistics
import time

import numpy as np


def _torch_batch_normalization(F, t, attrs):
    return F.batch_norm(
        t["x"], t["inputMean"], t["inputVar"], t["scale"], t["b"], training=False, eps=attrs["epsilon"]
    )


def _torch_group_normalization(F, t, attrs):
    return F.group_norm(t["x"], attrs["num_groups"], t["scale"], t["bias"], eps=attrs["epsilon"])


def _torch_instance_normalization(F, t, attrs):
    return F.instance_norm(t["input"], weight=t["scale"], bias=t["b"], eps=attrs["epsilon"])


def _channel_groups(F, s, t, attrs):
    """com.microsoft's group normalization of `s` as a user writes it: group_norm over an NCHW view
    (gamma and beta in s's type), SiLU when `activation` is 1, back to s's layout."""
    channels_last = attrs.get("channels_last", 1) != 0
    nchw = s.permute(0, 3, 1, 2) if channels_last else s
    y = F.group_norm(
        nchw, attrs["groups"], t["gamma"].to(s.dtype), t["beta"].to(s.dtype), eps=attrs["epsilon"]
    )
    if attrs.get("activation"):
        y = F.silu(y)
    return y.permute(0, 2, 3, 1) if channels_last else y


def _torch_group_norm(F, t, attrs):
    return _channel_groups(F, t["X"], t, attrs)


def _torch_skip_group_norm(F, t, attrs):
    """What a user writes: add the residual and bias, then the group normalization above."""
    x, skip = t["X"], t["skip"]
    channels_last = attrs.get("channels_last", 1) != 0
    n, c = x.shape[0], x.shape[3] if channels_last else x.shape[1]
    per_channel = (n, 1, 1, c) if channels_last else (n, c, 1, 1)
    s = x + (skip if skip.shape == x.shape else skip.reshape(per_channel))
    if "bias" in t:
        s = s + (t["bias"] if channels_last else t["bias"].reshape(c, 1, 1))
    return _channel_groups(F, s, t, attrs), s


def _normalized_shape(x, attrs):
    axis = attrs.get("axis", -1) % x.dim()
    return tuple(x.shape[axis:])


def _torch_layer_normalization(F, t, attrs):
    """F.layer_norm takes Scale and B of the normalized shape: a broadcast one is expanded (a view)."""
    shape = _normalized_shape(t["x"], attrs)
    b = t["b"].expand(shape) if "b" in t else None
    return F.layer_norm(t["x"], shape, t["scale"].expand(shape), b, eps=attrs["epsilon"])


def _torch_rms_normalization(F, t, attrs):
    """F.rms_norm (PyTorch 2.4 and later); Y in scale's type as ONNX's V."""
    shape = _normalized_shape(t["x"], attrs)
    scale = t["scale"].expand(shape)
    return F.rms_norm(t["x"].to(scale.dtype), shape, scale, eps=attrs["epsilon"])


def _torch_skip_layer_normalization(F, t, attrs):
    """What a user writes: the residual add (and bias), then layer_norm over the last axis."""
    s = t["input"] + t["skip"]
    if "bias" in t:
        s = s + t["bias"]
    return F.layer_norm(s, s.shape[-1:], t["gamma"], t.get("beta"), eps=attrs["epsilon"]), s


def _torch_skip_simplified_layer_normalization(F, t, attrs):
    s = t["input"] + t["skip"]
    if "bias" in t:
        s = s + t["bias"]
    return F.rms_norm(s, s.shape[-1:], t["gamma"], eps=attrs["epsilon"]), s


TORCH_EQUIVALENTS = {
    "batch_normalization": _torch_batch_normalization,
    "group_normalization": _torch_group_normalization,
    "instance_normalization": _torch_instance_normalization,
    "skip_group_norm": _torch_skip_group_norm,
    "layer_normalization": _torch_layer_normalization,
    "rms_normalization": _torch_rms_normalization,
    "simplified_layer_normalization": _torch_rms_normalization,
    "skip_layer_normalization": _torch_skip_layer_normalization,
    "skip_simplified_layer_normalization": _torch_skip_simplified_layer_normalization,
    "group_norm": _torch_group_norm,
}


def back_to_back_calls(settings, copies):
    """The calls of one timed run, back to back: a PyTorch CUDA graph holds this many, and the bench
    times ours over runs of the same length (every copy of the tensors at least once)."""
    return max(copies, 20 if settings.iters > 50 else 5)


class TorchPeer:
    """PyTorch eager on CUDA, timed without Python launch overhead."""

    def __init__(self, settings):
        import torch
        import torch.nn.functional as F

        if not torch.cuda.is_available():
            raise RuntimeError("PyTorch sees no CUDA device")
        self.torch, self.F, self.settings = torch, F, settings
        self.info = {
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
            "device": torch.cuda.get_device_name(),
        }

    def copy_gbps(self, nbytes=1_000_000_000):
        """Device-to-device copy through PyTorch (CUDA), counting bytes read and written."""
        torch = self.torch
        src = torch.empty(nbytes // 8, dtype=torch.float32, device="cuda")
        dst = torch.empty_like(src)
        seconds = self._time(lambda i: dst.copy_(src), 1)[0]
        return nbytes / seconds / 1e9

    def time(self, op_name, arrays, attrs, copies):
        """(seconds per call, how it was timed), or (None, why not)."""
        equivalent = TORCH_EQUIVALENTS.get(op_name)
        if equivalent is None:
            return None, f"no PyTorch equivalent for {op_name}"
        torch = self.torch
        base = {key: torch.from_numpy(np.ascontiguousarray(a)).to("cuda") for key, a in arrays.items()}
        sets = [base] + [{key: v.clone() for key, v in base.items()} for _ in range(copies - 1)]
        try:
            return self._time(lambda i: equivalent(self.F, sets[i], attrs), copies)
        except Exception as error:  # an eager op that refuses these dtypes, say
            return None, f"{type(error).__name__}: {error}".splitlines()[0]
        finally:
            sets.clear()  # free the CUDA copies now, not at the next collection
            base.clear()
            torch.cuda.empty_cache()

    def eager_group_norm_step(self, calls, dtype, reps):
        """Median wall µs of eager F.group_norm over (shape, groups, epsilon) calls, one sync at the end."""
        torch = self.torch
        dt = {"float32": torch.float32, "float16": torch.float16}[dtype]
        tensors = [
            (
                torch.randn(shape, device="cuda", dtype=dt),
                torch.rand(shape[1], device="cuda", dtype=dt),
                torch.rand(shape[1], device="cuda", dtype=dt),
                groups,
                epsilon,
            )
            for shape, groups, epsilon in calls
        ]

        def step():
            for x, weight, bias, groups, epsilon in tensors:
                self.F.group_norm(x, groups, weight, bias, epsilon)
            torch.cuda.synchronize()

        for _ in range(3):
            step()
        samples = []
        for _ in range(reps):
            started = time.perf_counter()
            step()
            samples.append(time.perf_counter() - started)
        tensors.clear()
        torch.cuda.empty_cache()
        return statistics.median(samples) * 1e6

    def _time(self, call, copies):
        torch = self.torch
        per_graph = back_to_back_calls(self.settings, copies)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up off the default stream, as capture requires
            for i in range(3):
                call(i % copies)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for i in range(per_graph):
                    call(i % copies)
            run, how = graph.replay, "CUDA graph replay"
        except Exception:
            torch.cuda.synchronize()

            def run():
                for i in range(per_graph):
                    call(i % copies)

            how = "CUDA events around eager calls (graph capture failed)"
        run()
        torch.cuda.synchronize()
        samples = []
        for _ in range(self.settings.torch_reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e-3 / per_graph)
        return statistics.median(samples), how
