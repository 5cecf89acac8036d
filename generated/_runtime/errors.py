# SPDX-License-Identifier: Apache-2.0
"""The runtime's errors: a call that breaks the op's contract, a plan value that cannot be used, a
dimension outside a shape, a machine without a WebGPU adapter, a device that is lost.
"""

from __future__ import annotations


class ContractError(ValueError):
    """A call that breaks a rule of the op's contract; raised before any GPU work."""

    def __init__(self, op, subject, rule, message):
        super().__init__(op, subject, rule, message)
        self.op = op
        self.subject = subject
        self.rule = rule
        self.message = message

    def __str__(self):
        text = f"{self.op}: {self.subject}: {self.message}"
        return text if self.rule in self.message else f"{text} (rule: {self.rule})"


class PlanError(ContractError):
    """A plan-time value that cannot be used: not a whole number, or over a device limit."""


class DimensionError(IndexError):
    """A dimension index outside a shape's rank."""


class NoAdapterError(RuntimeError):
    """No WebGPU adapter on this machine (for the default device): `reason` is wgpu's own word."""

    def __init__(self, reason):
        super().__init__(
            f"no WebGPU adapter ({reason}); on a GPU-less Linux machine install Mesa's Vulkan driver "
            "(mesa-vulkan-drivers) and set WGPU_BACKEND_TYPE=Vulkan"
        )
        self.reason = reason

    def __reduce__(self):
        return (NoAdapterError, (self.reason,))


class DeviceLostError(RuntimeError):
    """The call's GPU device is lost: its owner destroyed it, or its driver lost it. Nothing more runs
    on it; `op` names the call that found out."""

    def __init__(self, op):
        super().__init__(
            f"{op}: the GPU device is lost (destroyed, or lost by its driver), so nothing more runs on it: "
            "make a new one (adapter.request_device_sync(); generated.default_device() makes a new one "
            "once its own is lost)"
        )
        self.op = op

    def __reduce__(self):
        return (DeviceLostError, (self.op,))
