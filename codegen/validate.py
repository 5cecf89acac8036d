"""Validate stage: every rendered WGSL specialization through naga, on a real wgpu device.

wgpu offers no validation without a device, so the compiler opens one (lavapipe in CI) with
`shader-f16` and subgroups, the features a specialization may use. Naga reports errors
synchronously as `wgpu.GPUValidationError` with line and column; each is mapped to the template
line that wrote that WGSL line through the specialization's `line_map` (made by the render itself),
so this stage reads and renders nothing.

A build without a device of the caller's validates in a process of its own (`NagaProcess`),
started before anything is rendered: loading wgpu's binding parses its C header with pycparser
(about 0.4 s of Python) and each shader comes back to Python twice, so in a thread of the build's
own process the device and naga held the GIL the renderer and black need (about 0.7 s of a 4 s
build on 2 cores). The process imports wgpu and this module only, and sends back naga's messages.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .problems import CompileError, Problem, TemplateLocation

if TYPE_CHECKING:
    from .wgsl import RenderedPass, Specialization

VALIDATION_FEATURES = ("shader-f16", "subgroup")
# Lavapipe validates every shader of the four ops in a few seconds; a process silent this long is stuck.
VALIDATION_TIMEOUT_S = 300


@dataclass(frozen=True)
class ValidationReport:
    adapter: str
    shaders: int


def open_validation_device():
    import wgpu

    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    missing = [f for f in VALIDATION_FEATURES if f not in adapter.features]
    if missing:
        message = f"the validation adapter ({adapter.info['device']}) lacks {missing}: install Mesa's Vulkan driver and set WGPU_BACKEND_TYPE=Vulkan"
        raise CompileError([Problem(None, message)])
    device = adapter.request_device_sync(required_features=list(VALIDATION_FEATURES))
    return adapter, device


def validate(rendered: list[RenderedPass], device=None) -> ValidationReport:
    """Create a shader module for every specialization; collect every failure, then raise CompileError.
    Without a device, the validation device is opened here."""
    adapter = None
    if device is None:
        adapter, device = open_validation_device()
    shaders = _shaders(rendered)
    failures = naga_failures(device, [(label, spec.wgsl) for label, _, spec in shaders])
    name = adapter.info["device"] if adapter is not None else "caller's device"
    return _report(shaders, failures, name)


def _shaders(rendered: list[RenderedPass]) -> list[tuple[str, RenderedPass, Specialization]]:
    """(label, pass, specialization) of every specialization, in order."""
    return [
        (f"{item.variant.ir.id}.{item.pass_.ir.id}", item, spec)
        for item in rendered
        for spec in item.specializations
    ]


def naga_failures(device, shaders: list[tuple[str, str]]) -> list[tuple[int, str]]:
    """(index, naga's message) of each (label, WGSL) that `device` refuses, in order."""
    import wgpu

    failures = []
    for index, (label, wgsl) in enumerate(shaders):
        try:
            device.create_shader_module(label=label, code=wgsl)
        except wgpu.GPUValidationError as error:
            failures.append((index, str(error)))
    return failures


def _report(shaders: list, failures: list[tuple[int, str]], adapter: str) -> ValidationReport:
    """The report, or a CompileError with each failure at its template line."""
    if failures:
        raise CompileError(
            [naga_problem(shaders[index][1], shaders[index][2], message) for index, message in failures]
        )
    return ValidationReport(adapter, len(shaders))


class NagaProcess:
    """A Python process of its own that opens the validation device as it starts, then validates
    the shaders `validate()` sends it (once) and replies with naga's messages. Use it as a context
    manager: a build that fails before it validates stops the process on its way out. What the
    process prints goes to a file, which a failure quotes (the caller's stderr may be a
    notebook's or pytest's, and a second pipe could fill while nobody reads it)."""

    def __init__(self):
        root = Path(__file__).resolve().parent.parent
        code = f"import sys; sys.path.insert(0, {str(root)!r}); from codegen.validate import serve; serve()"
        self.printed = tempfile.TemporaryFile()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", code],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.printed,
            )
        except OSError as error:
            self.printed.close()
            raise CompileError(
                [Problem(None, f"the validation process (naga) did not start: {error}")]
            ) from error

    def __enter__(self) -> NagaProcess:
        return self

    def __exit__(self, *exc) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        with contextlib.suppress(BrokenPipeError):  # what a process that stopped early left unread
            self.process.stdin.close()
        self.process.stdout.close()
        self.printed.close()

    def validate(self, rendered: list[RenderedPass]) -> ValidationReport:
        """As `validate()`, in the process: the shaders go in, naga's messages come back, within
        VALIDATION_TIMEOUT_S (a device that never opens must not hang the build). They go in one
        write and come back in one read, so this thread takes the GIL back a few times, not once
        per pipe buffer (`communicate` would, and cost black about 0.4 s of a 2.6 s build)."""
        shaders = _shaders(rendered)
        stopped = threading.Event()  # set where the watchdog had to stop the process

        def stop() -> None:
            stopped.set()
            self.process.kill()

        watchdog = threading.Timer(VALIDATION_TIMEOUT_S, stop)
        watchdog.start()
        try:
            self.process.stdin.write(json.dumps([(label, spec.wgsl) for label, _, spec in shaders]).encode())
            self.process.stdin.close()
        except BrokenPipeError:
            pass  # it stopped before reading: its reply (or its exit status) says why
        try:
            reply = self.process.stdout.read()
            self.process.wait()
        finally:
            watchdog.cancel()
        if stopped.is_set():
            raise CompileError(
                [
                    Problem(
                        None,
                        f"the validation process (naga) gave no answer in {VALIDATION_TIMEOUT_S} s{self._printed()}",
                    )
                ]
            )
        if self.process.returncode != 0 or not reply:
            message = (
                f"the validation process (naga) exited with status {self.process.returncode}{self._printed()}"
            )
            raise CompileError([Problem(None, message)])
        answer = json.loads(reply)
        if "problem" in answer:
            raise CompileError([Problem(None, answer["problem"])])
        return _report(shaders, [tuple(failure) for failure in answer["failures"]], answer["adapter"])

    def _printed(self) -> str:
        """`; it printed: ` and the end of what the process printed, or nothing where it printed nothing."""
        self.printed.seek(0)
        text = self.printed.read().decode(errors="replace").strip()
        return f"; it printed: {text[-2000:]}" if text else ""


def serve() -> None:
    """The validation process: open the device, read [(label, WGSL), ...] from stdin, write
    {"adapter": name, "failures": [(index, message), ...]} (or {"problem": message}) to stdout."""
    with os.fdopen(os.dup(1), "w") as reply:
        os.dup2(2, 1)  # whatever wgpu or the driver prints goes to stderr, not into the reply
        try:
            adapter, device = open_validation_device()
        except CompileError as error:
            json.dump({"problem": error.problems[0].message}, reply)
            return
        shaders = json.load(sys.stdin)
        json.dump({"adapter": adapter.info["device"], "failures": naga_failures(device, shaders)}, reply)


def naga_problem(item: RenderedPass, spec: Specialization, message: str) -> Problem:
    """Naga's message at the template line that wrote the WGSL line it names (`wgsl:LINE:COLUMN`)."""
    key = ", ".join(f"{n}={v!r}" for n, v in zip(item.key_names, spec.key))
    head = f"naga rejected variant {item.variant.ir.id}, pass {item.pass_.ir.id}, specialization [{key}]"
    where = TemplateLocation(item.template)
    found = re.search(r":(\d+):(\d+)", message)
    if found:
        line = int(found.group(1))
        body_line = line - spec.body_first_line + 1
        if body_line < 1:
            head += f", in the declarations the compiler writes (WGSL line {line})"
        elif body_line <= len(spec.line_map) and spec.line_map[body_line - 1] is not None:
            where = spec.line_map[body_line - 1]
    return Problem(item.pass_.ir.origin, f"{head}:\n{message}", template=where)
