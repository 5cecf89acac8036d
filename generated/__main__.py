# SPDX-License-Identifier: Apache-2.0
"""`python -m generated COMMAND`: `doctor` (is the device right for these kernels?), `bench` or `check_model`.

It imports the package only relatively,
so a vendored copy runs as ``python -m myapp.kernels doctor``.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "doctor": ("doctor", "the device, its features, limits and subgroup width, and a check of every op"),
    "bench": ("bench", "benchmarks: GPU time, GB/s against a copy kernel (python -m <package>.bench --help)"),
    "check_model": (
        "check_model",
        "every normalization node of an ONNX model against ONNX Runtime (needs onnx, onnxruntime)",
    ),
}


def usage():
    lines = [f"usage: python -m {__package__} COMMAND [options]", "commands:"]
    lines += [f"  {name:<8} {what}" for name, (_, what) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in COMMANDS:
        print(usage(), file=sys.stderr)
        return 2
    module = importlib.import_module(f".{COMMANDS[argv[0]][0]}", __package__)
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
