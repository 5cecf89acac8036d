"""Shared helpers for the hostile-input tests of tests/runtime/ (issue 9): test_hostile_*.py, test_fuzz.py.

* `OPS`: the generated ops with their bind keys, ONNX roles, a valid base request and the
  plain function, so a test can build a valid call for any op and then break one thing.
* `MICROSOFT`: the com.microsoft ops' ids (C by `channels_last`, gamma and beta of type M).
* `ALL_OPS`, `DTYPES`: parametrize marks over every op and over float32 / float16;
  `kernel(info, inputs)`, `plan(info, shapes)`: an op's call with its base request's attributes.
* `GN`, `ATTRS`, `SHAPES`, `gn_arrays()`, `gn_tensors()`: a small valid GroupNormalization call.
* `refusal(call)`: runs a call that must be refused and returns the ContractError, failing with
  the actual outcome (a return value, another exception type) otherwise.
* `check_refusal(error, op, names, words)`: the error's shape (issue 9): a ContractError (a
  ValueError) whose str reads "{op}: {subject}: {message} ...", that names the op, the rule and
  one of the caller's `names` as a whole word.
* `run_cases_in_children(module, names)`: runs named cases in child processes (so an abort of the
  process fails a case instead of killing pytest), several cases per child; a child that dies
  marks the case it was running and a fresh child takes the rest.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from generated import ContractError, Tensor
from generated import batch_normalization as bn
from generated import group_norm as mgn
from generated import group_normalization as gn
from generated import instance_normalization as inn
from generated import layer_normalization as ln
from generated import rms_normalization as rms
from generated import simplified_layer_normalization as sln
from generated import skip_group_norm as sgn
from generated import skip_layer_normalization as skln
from generated import skip_simplified_layer_normalization as sksln

ROOT = Path(__file__).resolve().parents[2]
F16_PHRASE = "float16 needs the device feature shader-f16, which this device does not have"


@dataclass(frozen=True)
class OpInfo:
    name: str  # short id used in test ids
    module: object
    keys: tuple  # input bind keys, in the plain function's order
    roles: dict  # bind key -> ONNX role
    out_key: str
    attrs: dict  # attributes of the valid base request
    base_shape: tuple  # X of the valid base request
    optional: tuple = ()  # optional input keys
    channels_axis: int = 1
    # An axis of X no parameter reads (a request stays valid whatever its size); None: spatial_axis's rule.
    free_axis: int | None = None
    # Input keys ONNX broadcasts to the normalized shape: a 0-d value of them is a valid request.
    broadcast: tuple = ()

    def loose_skip(self, inputs):
        """`inputs` (shapes or arrays by bind key) with a skip that stays valid whatever X's free axis
        is: SkipGroupNorm's (N, C), the Skip layer norms' (sequence, hidden) repeated over the batch."""
        if self.name == "sgn":
            skip = inputs["skip"]
            inputs["skip"] = (skip[0], skip[3]) if isinstance(skip, tuple) else skip[:, 0, 0, :]
        elif "skip" in inputs:
            inputs["skip"] = inputs["skip"][1:]
        return inputs

    @property
    def op(self):
        return self.module.OP

    def channels(self, shape):
        return shape[self.channels_axis]

    @property
    def spatial_axis(self):
        """An axis of the base X no parameter reads: H for the channels-last ops, N for the layer
        family (its parameters span the last axes: free_axis), else the last."""
        if self.free_axis is not None:
            return self.free_axis
        return 1 if self.channels_axis != 1 else len(self.base_shape) - 1

    def large(self, side=64):
        """A base-rank X of about 2 * side**3 values, C = side (for limit tests)."""
        return (2,) + (side,) * (len(self.base_shape) - 1) if len(self.base_shape) == 4 else (2, side, side)

    def dtypes(self, dtype):
        """Every type variable the caller gives, in `dtype` (outputs' float32 U needs none)."""
        name = np.dtype(dtype).name
        return {t: name for t in self.module.TYPE_CONSTRAINTS if len(self.module.TYPE_CONSTRAINTS[t]) > 1}

    def shapes(self, shape=None, with_optional=False):
        """Input shapes of a valid request with X of `shape` (the base shape by default)."""
        shape = tuple(self.base_shape if shape is None else shape)
        c = (self.channels(shape),)
        first = self.keys[0]
        result = {first: shape}
        for key in self.keys[1:]:
            if key in self.optional and not with_optional:
                continue
            result[key] = shape if key == "skip" else c
        return result

    def inputs(self, dtype=np.float32, shape=None, rng=None, with_optional=False):
        """Valid, random (never all-zero) inputs for X of `shape`."""
        rng = rng if rng is not None else np.random.default_rng(0)
        shapes = self.shapes(shape, with_optional)
        result = {}
        for key, s in shapes.items():
            if key in ("inputVar",):
                result[key] = rng.uniform(0.2, 2.0, s).astype(dtype)
            else:
                result[key] = (rng.standard_normal(s) + 0.25).astype(dtype)
        return result

    def plain(self, inputs, **kwargs):
        """The plain function with `inputs` (keyed by bind key) in positional order."""
        args = [inputs.get(k) for k in self.keys]
        return self.plain_positional(args, **kwargs)

    def plain_positional(self, args, **kwargs):
        if self.name == "bn":
            return bn.batch_normalization(*args, **kwargs)
        if self.name == "gn":
            return gn.group_normalization(*args, **{"num_groups": 2, **kwargs})
        if self.name == "in":
            return inn.instance_normalization(*args, **kwargs)
        if self.name == "mgn":
            return mgn.group_norm(*args, **{"groups": 2, "activation": 0, **kwargs})
        if self.name == "sgn":
            return sgn.skip_group_norm(*args, **{"groups": 2, "activation": 0, **kwargs})
        plain = {
            "ln": ln.layer_normalization,
            "rms": rms.rms_normalization,
            "sln": sln.simplified_layer_normalization,
            "skln": skln.skip_layer_normalization,
            "sksln": sksln.skip_simplified_layer_normalization,
        }
        return plain[self.name](*args, **kwargs)

    @property
    def variants(self):
        return tuple(c.ID for c in self.module.CANDIDATES)


OPS = {
    "bn": OpInfo(
        "bn",
        bn,
        ("x", "scale", "b", "inputMean", "inputVar"),
        {"x": "X", "scale": "scale", "b": "B", "inputMean": "input_mean", "inputVar": "input_var"},
        "y",
        {},
        (2, 4, 3),
    ),
    "gn": OpInfo(
        "gn",
        gn,
        ("x", "scale", "bias"),
        {"x": "X", "scale": "scale", "bias": "bias"},
        "y",
        {"num_groups": 2},
        (2, 4, 3),
    ),
    "in": OpInfo(
        "in",
        inn,
        ("input", "scale", "b"),
        {"input": "input", "scale": "scale", "b": "B"},
        "output",
        {},
        (2, 4, 3),
    ),
    "sgn": OpInfo(
        "sgn",
        sgn,
        ("X", "gamma", "beta", "skip", "bias"),
        {k: k for k in ("X", "gamma", "beta", "skip", "bias")},
        "Y",
        {"groups": 2, "activation": 0},
        (2, 2, 3, 4),
        optional=("bias",),
        channels_axis=3,
    ),
    # The layer family: the last axis normalized, its parameters (C,) with C the last dimension.
    "ln": OpInfo(
        "ln",
        ln,
        ("x", "scale", "b"),
        {"x": "X", "scale": "Scale", "b": "B"},
        "y",
        {},
        (2, 4, 3),
        ("b",),
        -1,
        0,
        broadcast=("scale", "b"),
    ),
    "rms": OpInfo(
        "rms",
        rms,
        ("x", "scale"),
        {"x": "X", "scale": "scale"},
        "y",
        {},
        (2, 4, 3),
        (),
        -1,
        0,
        broadcast=("scale",),
    ),
    "sln": OpInfo(
        "sln",
        sln,
        ("x", "scale"),
        {"x": "X", "scale": "scale"},
        "y",
        {},
        (2, 4, 3),
        (),
        -1,
        0,
        broadcast=("scale",),
    ),
    "skln": OpInfo(
        "skln",
        skln,
        ("input", "skip", "gamma", "beta", "bias"),
        {k: k for k in ("input", "skip", "gamma", "beta", "bias")},
        "output",
        {},
        (2, 4, 3),
        ("beta", "bias"),
        -1,
        0,
    ),
    "sksln": OpInfo(
        "sksln",
        sksln,
        ("input", "skip", "gamma", "bias"),
        {k: k for k in ("input", "skip", "gamma", "bias")},
        "output",
        {},
        (2, 4, 3),
        ("bias",),
        -1,
        0,
    ),
    "mgn": OpInfo(
        "mgn",
        mgn,
        ("X", "gamma", "beta"),
        {k: k for k in ("X", "gamma", "beta")},
        "Y",
        {"groups": 2, "activation": 0},
        (2, 2, 3, 4),
        channels_axis=3,
    ),
}
OP_IDS = tuple(OPS)
# The com.microsoft ops: C at axis 3 or 1 by `channels_last`; gamma and beta of their own type M.
MICROSOFT = ("sgn", "mgn")
ALL_OPS = pytest.mark.parametrize("op_id", OP_IDS)
DTYPES = pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])


def kernel(info, inputs, **kwargs):
    return info.module.kernel(inputs, attrs={**info.attrs, **kwargs.pop("attrs", {})}, **kwargs)


def plan(info, shapes, dtype=np.float32, **kwargs):
    return info.module.plan(
        shapes, info.dtypes(dtype), attrs={**info.attrs, **kwargs.pop("attrs", {})}, **kwargs
    )


# A small valid GroupNormalization call, for the device, Tensor and audit tests.
GN = gn.OP
ATTRS = {"num_groups": 2}
SHAPES = {"x": (2, 4, 3), "scale": (4,), "bias": (4,)}


def gn_arrays(dtype=np.float32, shape=(2, 4, 3)):
    rng = np.random.default_rng(3)
    return {
        "x": rng.standard_normal(shape).astype(dtype),
        "scale": rng.uniform(0.5, 1.5, shape[1]).astype(dtype),
        "bias": rng.uniform(-0.5, 0.5, shape[1]).astype(dtype),
    }


def gn_tensors(dtype=np.float32):
    return {k: Tensor.from_numpy(v) for k, v in gn_arrays(dtype).items()}


def word(name: str, text: str) -> bool:
    """Whether `name` occurs in `text` as a whole word (so `x` is not found in `maxStorage...`)."""
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", text) is not None


def normalized(text: str) -> str:
    return re.sub(r"[-_ ]", "", text).lower()


class Accepted(AssertionError):
    pass


def refusal(call, what=""):
    """The ContractError `call()` raises; fails if it returns or raises anything else."""
    try:
        result = call()
    except ContractError as error:
        return error
    except BaseException as error:  # noqa: BLE001 - the point is to report every other outcome
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            raise
        raise AssertionError(
            f"{what}: expected a ContractError, got {type(error).__module__}.{type(error).__name__}: {str(error)[:600]}"
        ) from error
    raise Accepted(f"{what}: expected a ContractError, the call was accepted and returned {summary(result)}")


def summary(result):
    if isinstance(result, dict):
        return {k: summary(v) for k, v in result.items()}
    if hasattr(result, "shape") and hasattr(result, "dtype"):
        return f"{type(result).__name__}{tuple(result.shape)} {np.dtype(result.dtype).name}"
    if hasattr(result, "variant"):
        return f"Plan(variant={result.variant!r}, passes={len(result.passes)})"
    return repr(result)[:200]


def check_refusal(error, op, names=(), words=(), what="", names_in="subject"):
    """issue 9's error shape. `names`: the caller's name(s) for the input or attribute; one must
    appear as a whole word in the error's subject (names_in="subject": the field that says what is
    wrong, so a name in an op's description cannot stand in for it) or anywhere in its text
    (names_in="text"). `words`: each must appear in the text (compared without case, '-', '_', spaces)."""
    text = str(error)
    where = f"{what}: {text!r}"
    assert isinstance(error, ValueError), where
    assert error.op == op, f"{what}: op {error.op!r}, expected {op!r}; {text!r}"
    assert text.startswith(f"{error.op}: {error.subject}: {error.message}"), where
    assert error.rule and error.rule in text, f"{what}: the rule {error.rule!r} is not in the text {text!r}"
    if isinstance(names, str):
        names = (names,)
    if names:
        where = str(error.subject) if names_in == "subject" else text
        assert any(
            word(n, where) for n in names
        ), f"{what}: none of the caller's names {names} appears in the {names_in} of {text!r} (subject {error.subject!r})"
    for w in words:
        assert normalized(w) in normalized(text), f"{what}: {w!r} is not in {text!r}"


def assert_refused(call, op, names=(), words=(), what="", names_in="subject"):
    error = refusal(call, what)
    check_refusal(error, op, names, words, what, names_in)
    return error


# ---------------------------------------------------------------------------------------------------------
# Cases in child processes


def run_cases_in_children(module: str, names, timeout=240):
    """{case name: result dict} for cases run by `module`'s `child_main` in child processes.

    Each child runs the names it is given in order and prints one JSON line per case, after a
    "START name" line. A child that dies in a case (an abort, a segfault) leaves that case marked
    {"outcome": "died", ...} and a fresh child runs the rest.
    """
    names = list(names)
    results = {}
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("WGPU_BACKEND_TYPE", "Vulkan")
    env["RUST_BACKTRACE"] = "0"
    code = f"import sys, json; import {module} as m; m.child_main(json.loads(sys.argv[1]))"
    while names:
        proc = subprocess.run(
            [sys.executable, "-c", code, json.dumps(names)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        current = None
        for line in proc.stdout.splitlines():
            if line.startswith("START "):
                current = line[len("START ") :]
            elif line.startswith("RESULT "):
                result = json.loads(line[len("RESULT ") :])
                results[result["name"]] = result
                current = None
        done = [n for n in names if n in results]
        if current is None and len(done) == len(names):
            break
        if current is None:
            # The child died before its first case (an import error, say): report it on all.
            tail = (proc.stderr or "")[-3000:]
            for n in names:
                results.setdefault(n, {"name": n, "outcome": "died", "rc": proc.returncode, "stderr": tail})
            break
        results[current] = {
            "name": current,
            "outcome": "died",
            "rc": proc.returncode,
            "stderr": _panic_lines(proc.stderr or ""),
        }
        names = [n for n in names if n not in results]
    return results


def _panic_lines(stderr: str) -> str:
    """The lines of a Rust panic (or the tail) without the backtrace frames."""
    keep = [
        l
        for l in stderr.splitlines()
        if l
        and not l.startswith(" ")
        and "XDG_RUNTIME_DIR" not in l
        and not l.startswith(("Forcing backend", "stack backtrace", "note: "))
    ]
    return "\n".join(keep[-12:])


def describe_outcome(fn):
    """Run fn() in a child and describe what happened, as a JSON-able dict."""
    try:
        value = fn()
    except ContractError as error:
        return {
            "outcome": "ContractError",
            "type": type(error).__name__,
            "str": str(error),
            "op": error.op,
            "subject": error.subject,
            "rule": error.rule,
            "message": error.message,
            "is_value_error": isinstance(error, ValueError),
        }
    except Exception as error:  # noqa: BLE001
        return {
            "outcome": "raised",
            "type": f"{type(error).__module__}.{type(error).__name__}",
            "str": str(error)[:800],
        }
    return {"outcome": "returned", "value": value}


def emit(name, result):
    print("RESULT " + json.dumps({"name": name, **result}, default=str), flush=True)


class ChildError(ValueError):
    """A child's ContractError, rebuilt from its fields and its str for check_refusal."""

    def __init__(self, result):
        super().__init__(result["str"])
        self.op, self.subject, self.rule, self.message = (
            result[k] for k in ("op", "subject", "rule", "message")
        )
        self.text = result["str"]

    def __str__(self):
        return self.text


def check_child_refusal(result, op, names=(), words=(), what=""):
    """check_refusal for a case run in a child."""
    outcome = result["outcome"]
    if outcome == "died":
        raise AssertionError(
            f"{what}: the process died (exit status {result['rc']}) instead of refusing:\n{result['stderr']}"
        )
    if outcome == "raised":
        raise AssertionError(f"{what}: expected a ContractError, got {result['type']}: {result['str']}")
    if outcome == "returned":
        raise Accepted(
            f"{what}: expected a ContractError, the call was accepted and returned {result['value']}"
        )
    assert result["is_value_error"], f"{what}: the ContractError is not a ValueError"
    check_refusal(ChildError(result), op, names, words, what)
