# SPDX-License-Identifier: Apache-2.0
"""ONNX Runtime's WebGPU execution provider on the bench's cases: `python -m generated.bench --ort`.

The peer a user would pick instead of these kernels, timed on the same cases, machine and process.
Each case becomes a one-node ONNX model (the op's ONNX name, inputs and attributes), and runs three
ways, each against ours done the same way:

- numpy: `session.run()` on numpy arrays, returning numpy arrays (ours: `kernel()` on numpy arrays);
- device: inputs and outputs bound on the device (`io_binding`), N calls then one read-back, per
  call (ours: `kernel(tensors, out=)` N times, then one sync);
- capture: the same with the provider's graph capture on
  (`ep.webgpuexecutionprovider.enableGraphCapture`; ours: a recorded `Sequence.run()`).

A node ONNX Runtime would run on its CPU provider instead (the session is made with CPU fallback
disabled, so such a node fails to load) is reported as such and not timed as WebGPU. Every output
is checked against the float64 definition of the op (`reference.node_outputs`), with the
tolerances check_model uses. `onnxruntime-webgpu` (it installs as `onnxruntime`) is optional and
never a dependency of the kernels.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import ops, reference
from .bench_calls import median_us
from .check_model import worst_error

PROVIDER = "WebGpuExecutionProvider"
GRAPH_CAPTURE = "ep.webgpuexecutionprovider.enableGraphCapture"
ONNX_ELEMENT_TYPES = {"float32": 1, "float16": 10}


@dataclass
class OrtTimes:
    """One case through ONNX Runtime; times in ms, None where a path did not run (`notes` says why)."""

    placement: str = ""  # "WebGPU", or why it is not timed as WebGPU
    numpy_ms: float | None = None
    device_ms: float | None = None
    capture_ms: float | None = None
    error_of_tolerance: float | None = None  # its worst output error against float64, / tolerance
    notes: list = field(default_factory=list)


def op_entry(op):
    """The newest registry entry of an op package: its ONNX domain, name and version."""
    entries = [e for e in ops().values() if e.module is op]
    return max(entries, key=lambda e: e.since_version)


def single_node_model(op, case, attrs, outputs):
    """The case as a one-node ONNX model; the ONNX input names in order, and the output names.
    `outputs`: {bind key: shape} of the outputs the case asks for."""
    from onnx import helper

    entry = op_entry(op)
    given = [spec for spec in op.INPUTS if spec.key in case.shapes]
    inputs = [
        helper.make_tensor_value_info(
            spec.role, ONNX_ELEMENT_TYPES[case.dtypes[spec.type_var]], list(case.shapes[spec.key])
        )
        for spec in given
    ]
    node_inputs = [spec.role if spec.key in case.shapes else "" for spec in op.INPUTS]
    while node_inputs and not node_inputs[-1]:
        node_inputs.pop()
    wanted = [spec for spec in op.OUTPUTS if spec.key in outputs]
    node_outputs = [spec.role if spec.key in outputs else "" for spec in op.OUTPUTS]
    while node_outputs and not node_outputs[-1]:
        node_outputs.pop()
    domain = "" if entry.domain == "ai.onnx" else entry.domain  # ONNX writes its own domain as ""
    node = helper.make_node(entry.op_type, node_inputs, node_outputs, domain=domain, **attrs)
    graph_outputs = [
        helper.make_tensor_value_info(
            spec.role, ONNX_ELEMENT_TYPES[case.dtypes[spec.type_var]], list(outputs[spec.key])
        )
        for spec in wanted
    ]
    opsets = [helper.make_opsetid("", max(entry.since_version, 17) if entry.domain == "ai.onnx" else 17)]
    if entry.domain != "ai.onnx":
        opsets.append(helper.make_opsetid(entry.domain, entry.since_version))
    graph = helper.make_graph([node], case.name, inputs, graph_outputs)
    # The IR version ONNX Runtime releases of the last two years all load (onnx writes its newest).
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    return model, [spec.role for spec in given], [spec.role for spec in wanted], entry


def calls_then_one_readback_ms(call, wait, settings):
    """ms per call of `call` made N times back to back, then `wait` once (a read-back or a sync):
    how an app runs a model's steps, and the same measure for both sides."""
    calls = max(10, settings.iters // 10)

    def many():
        for _ in range(calls):
            call()
        wait()

    return median_us(many, 3) / 1e3 / calls


class OrtPeer:
    """ONNX Runtime with its WebGPU provider (or, for the tests, another provider given by name)."""

    def __init__(self, settings, provider=PROVIDER, device_name="webgpu"):
        import onnxruntime

        if provider not in onnxruntime.get_available_providers():
            raise RuntimeError(
                f"this onnxruntime ({onnxruntime.__version__}, {onnxruntime.__file__}) has no {provider}: "
                "pip install onnxruntime-webgpu"
            )
        self.ort, self.settings = onnxruntime, settings
        self.provider, self.device_name = provider, device_name
        self.info = {
            "onnxruntime": onnxruntime.__version__,
            "provider": provider,
            "module": onnxruntime.__file__,
        }

    def _session(self, model, capture=False):
        options = self.ort.SessionOptions()
        if self.provider != "CPUExecutionProvider":  # a node without a kernel then fails to load
            options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        if capture:
            options.add_session_config_entry(GRAPH_CAPTURE, "1")
        return self.ort.InferenceSession(model.SerializeToString(), options, providers=[self.provider])

    def time(self, op, case, arrays, attrs, outputs) -> OrtTimes:
        times = OrtTimes()
        model, input_names, output_names, entry = single_node_model(op, case, attrs, outputs)
        feeds = {spec.role: arrays[spec.key] for spec in op.INPUTS if spec.key in arrays}
        try:
            session = self._session(model)
        except Exception as error:  # no kernel on the provider: ONNX Runtime would run it on the CPU
            times.placement = f"not on {self.provider}: {str(error).splitlines()[0][:200]}"
            return times
        times.placement = self.provider
        reps = max(3, min(20, self.settings.host_iters // 5))
        results = session.run(output_names, feeds)
        times.error_of_tolerance = self._error(entry, op, case, feeds, attrs, output_names, results)
        times.numpy_ms = median_us(lambda: session.run(output_names, feeds), reps) / 1e3
        sessions = {"device": lambda: session, "capture": lambda: self._session(model, capture=True)}
        for path, make_session in sessions.items():
            try:
                setattr(times, f"{path}_ms", self._bound_ms(make_session(), feeds, outputs, op, case))
            except Exception as error:
                times.notes.append(f"{path}: {type(error).__name__}: {str(error).splitlines()[0][:200]}")
        return times

    def _error(self, entry, op, case, feeds, attrs, output_names, results):
        """The worst output's error against float64, as a fraction of check_model's tolerance."""
        inputs = [feeds.get(spec.role) for spec in op.INPUTS]
        inputs = [None if a is None else a.astype(np.float64) for a in inputs]
        expected = reference.node_outputs(entry.domain, entry.op_type, inputs, attrs, entry.since_version)
        roles = [spec.role for spec in op.OUTPUTS]
        worst = 0.0
        for name, actual in zip(output_names, results):
            dtype = np.asarray(actual).dtype.name
            worst = max(worst, worst_error(actual, expected[roles.index(name)], dtype)[1])
        return worst

    def _bound_ms(self, session, feeds, outputs, op, case):
        """Per call: inputs and outputs bound on the device, N calls, one read-back at the end."""
        binding = session.io_binding()
        for name, array in feeds.items():
            binding.bind_ortvalue_input(
                name, self.ort.OrtValue.ortvalue_from_numpy(array, self.device_name, 0)
            )
        for spec in op.OUTPUTS:
            if spec.key in outputs:
                shape = list(outputs[spec.key])
                dtype = np.dtype(case.dtypes[spec.type_var])
                value = self.ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype, self.device_name, 0)
                binding.bind_ortvalue_output(spec.role, value)
        for _ in range(3):  # the first runs load kernels (and, with capture, record the graph)
            session.run_with_iobinding(binding)
        binding.copy_outputs_to_cpu()
        return calls_then_one_readback_ms(
            lambda: session.run_with_iobinding(binding), binding.copy_outputs_to_cpu, self.settings
        )
