"""Property-based tests (hypothesis) of malformed calls to the generated ops (issue 9).

`test_fuzz_malformed_calls`: malformed calls (wrong key names, wrong ranks, bools, floats,
strings, None, nested lists as shapes, huge dims, bad attrs / dtypes / tunables / caps / outputs /
variant / out=) to plan(), kernel() and explain(), run by one child process that drives the whole
hypothesis loop, so a process abort fails the test instead of killing pytest. plan() and kernel()
must raise ContractError only; explain() must return text.

Each example draws a seed for its data, so the falsifying example hypothesis prints reproduces the
failure. The example database is off (nothing is written to the tree); examples are not derandomized.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
from hypothesis import HealthCheck, Phase
from hypothesis import strategies as st

from generated import ContractError, Tensor
from tests.runtime.hostile_support import OPS, ROOT, check_refusal


# ---------------------------------------------------------------------------------------------------------
# Malformed calls, the whole hypothesis loop in one child process

MALFORMED_EXAMPLES = 400


@st.composite
def malformed_calls(draw):
    """(api, op id, args, kwargs, mutations): a valid call to plan() / kernel() / explain() with one
    to three mutations, each of which makes the call invalid."""
    op_id = draw(st.sampled_from(list(OPS)))
    info = OPS[op_id]
    api = draw(st.sampled_from(["plan", "kernel", "explain"]))
    shapes = {k: list(v) for k, v in info.shapes().items()}
    attrs = dict(info.attrs)
    kwargs = {}
    dtypes = info.dtypes(np.float32)
    mutations = []
    pool = ["key", "attr", "tunable", "caps", "outputs", "variant"]
    pool += ["dim", "shape", "rank", "dtypes"] if api != "kernel" else ["value", "out"]
    for mutation in draw(st.lists(st.sampled_from(pool), min_size=1, max_size=2, unique=True)):
        if mutation == "key":
            # (an optional input is not in the base request: only a present one can be duplicated)
            named = [k for k in info.keys if info.roles[k] != k and k in shapes]
            how = draw(st.sampled_from(["rename", "drop", "extra"] + (["duplicate"] if named else [])))
            key = draw(st.sampled_from([k for k in shapes if k not in info.optional]))
            if how == "rename":
                shapes[draw(st.sampled_from([key + "_", key.upper() + "x", "", " " + key, key + "s"]))] = (
                    shapes.pop(key)
                )
            elif how == "drop":
                del shapes[key]
            elif how == "extra":
                shapes[draw(st.sampled_from(["Z", "x2", "mean", "weight"]))] = shapes[key]
            else:
                key = draw(st.sampled_from(named))
                shapes[info.roles[key]] = shapes[key]
            mutations.append(f"key:{how}:{key}")
        elif mutation == "dim":
            # Only shapes still lists (an earlier "shape" mutation may have made one a string or an int).
            listed = sorted(k for k in shapes if isinstance(shapes[k], list) and shapes[k])
            if not listed:
                continue
            key = draw(st.sampled_from(listed))
            axis = draw(st.integers(0, len(shapes[key]) - 1))
            bad = draw(
                st.sampled_from(
                    [
                        True,
                        False,
                        np.True_,
                        4.7,
                        -1,
                        -(2**40),
                        2**40,
                        2**64,
                        math.nan,
                        math.inf,
                        "4",
                        None,
                        [2],
                        (2,),
                        b"4",
                        3 + 0j,
                    ]
                )
            )
            shapes[key][axis] = bad
            mutations.append(f"dim:{key}[{axis}]={bad!r}")
        elif mutation == "shape":
            key = draw(st.sampled_from(sorted(shapes)))
            shapes[key] = draw(
                st.sampled_from([None, "2,4,3", 5, 4.0, {"a": 1}, [[2, 4, 3]], [[2], [4]], object()])
            )
            mutations.append(f"shape:{key}={shapes[key]!r}")
        elif mutation == "rank":
            key = info.keys[0]
            shapes[key] = draw(
                st.sampled_from(
                    {
                        "bn": [[4]],
                        "gn": [[2, 4]],
                        "in": [[2, 4]],
                        "sgn": [[2, 3, 4], [2, 2, 3, 4, 1]],
                        "ln": [[]],
                        "rms": [[]],
                        "sln": [[]],
                        "skln": [[3], [1, 2, 4, 3]],
                        "sksln": [[3], [1, 2, 4, 3]],
                        "mgn": [[2, 3, 4], [2, 2, 3, 4, 1]],
                    }[op_id]
                )
            )
            mutations.append(f"rank:{key}={shapes[key]!r}")
        elif mutation == "attr":
            names = [a.name for a in info.module.ATTRIBUTES]
            name = draw(st.sampled_from(names + ["alpha", "", "Epsilon"]))
            if name not in names:
                attrs[name] = 1
                mutations.append(f"attr:unknown {name!r}")
            else:
                spec = next(a for a in info.module.ATTRIBUTES if a.name == name)
                if spec.kind == "float":
                    bad = draw(
                        st.sampled_from(
                            ["1e-5", None, [1e-5], True, math.nan, math.inf, -math.inf, 1e39, {"v": 1}]
                        )
                    )
                else:
                    bad = ["2", None, [2], {"v": 2}, True, False, math.nan, math.inf, 1.5]
                    if name != "channels_last" or op_id == "mgn":  # SkipGroupNorm: any non-zero int is NHWC
                        bad += [2**64, -(2**63)]
                    bad = draw(st.sampled_from(bad))
                attrs[name] = bad
                mutations.append(f"attr:{name}={bad!r}")
            if draw(st.booleans()) and mutations[-1].startswith("attr:unknown"):
                attrs = draw(st.sampled_from([["num_groups"], "epsilon=1", 5]))
                mutations.append(f"attrs container {attrs!r}")
        elif mutation == "dtypes":
            dtypes = draw(
                st.sampled_from(
                    [
                        {"T": "float64"},
                        {"T": 5},
                        {"T": "f64"},
                        {"Q": "float32"},
                        {},
                        "float32",
                        ["float32"],
                        {"T": [np.float32]},
                    ]
                )
            )
            if (
                isinstance(dtypes, dict) and "T" in dtypes
            ):  # the other variables (M, V) valid: only T is wrong
                dtypes = {**info.dtypes(np.float32), **dtypes}
            mutations.append(f"dtypes={dtypes!r}")
        elif mutation == "tunable":
            bad = draw(
                st.sampled_from(
                    [
                        ("WORKGROUP_SIZE", True),
                        ("WORKGROUP_SIZE", 0),
                        ("WORKGROUP_SIZE", -1),
                        ("WORKGROUP_SIZE", 2.5),
                        ("WORKGROUP_SIZE", math.nan),
                        ("WORKGROUP_SIZE", "64"),
                        ("WORKGROUP_SIZE", None),
                        ("NOPE", 64),
                        ("workgroup_size", 64),
                    ]
                )
            )
            kwargs["tunables"] = draw(st.sampled_from([{bad[0]: bad[1]}, [bad]]))
            mutations.append(f"tunables={kwargs['tunables']!r}")
        elif mutation == "caps":
            kwargs["caps"] = draw(
                st.sampled_from(
                    [
                        {"features": ["shader_f16"]},
                        {"limits": {"maxNothing": 1}},
                        {"feature": []},
                        {"limits": {"maxBufferSize": True}},
                        {"limits": {"maxBufferSize": -1}},
                        {"limits": {"maxBufferSize": 2.5}},
                        {"limits": {"maxBufferSize": "1"}},
                        {"features": "shader-f16"},
                        ["shader-f16"],
                        "shader-f16",
                        5,
                    ]
                )
            )
            mutations.append(f"caps={kwargs['caps']!r}")
        elif mutation == "outputs":
            kwargs["outputs"] = draw(st.sampled_from([("Z",), 5, [None], ("",), (("Y",),)]))
            mutations.append(f"outputs={kwargs['outputs']!r}")
        elif mutation == "variant":
            if api != "explain":
                kwargs["variant"] = draw(st.sampled_from([5, "nope", "", ("x",), True]))
                mutations.append(f"variant={kwargs['variant']!r}")
            else:
                kwargs["outputs"] = ("nope",)
                mutations.append("outputs=('nope',)")
        elif mutation == "value":
            key = draw(st.sampled_from(sorted(shapes)))
            value = draw(
                st.sampled_from(
                    ([] if key in info.optional else ["none"])
                    + [
                        "string",
                        "ragged",
                        "object",
                        "int32",
                        "float64",
                        "bool",
                        *([] if key in info.broadcast else ["scalar"]),  # a 0-d value broadcasts
                        "dict",
                        "nested_none",
                    ]
                )
            )
            kwargs.setdefault("values", {})[key] = value
            mutations.append(f"value:{key}={value}")
        elif mutation == "out":
            out = draw(st.sampled_from(["numpy", "string", "unknown_key", "list", "none_value"]))
            kwargs["out"] = out
            mutations.append(f"out={out}")
    return api, op_id, shapes, attrs, dtypes, kwargs, tuple(mutations)


def _odd_value(kind, array):
    return {
        "none": None,
        "string": "abc",
        "ragged": [[1.0], [1.0, 2.0]],
        "object": np.array(list(array.ravel()), dtype=object).reshape(array.shape),
        "int32": array.astype(np.int32),
        "float64": array.astype(np.float64),
        "bool": array > 0,
        "scalar": np.float32(1.0),
        "dict": {"a": array},
        "nested_none": [None, None],
    }[kind]


def _make_call(api, op_id, shapes, attrs, dtypes, kwargs):
    info = OPS[op_id]
    module = info.module
    kwargs = dict(kwargs)
    if api == "kernel":
        base = info.inputs()
        inputs = {}
        for key, shape in shapes.items():
            source = (
                base.get(key)
                if key in base
                else base.get(next((k for k, r in info.roles.items() if r == key), key))
            )
            inputs[key] = np.ones(tuple(shape), np.float32) if source is None else source
        for key, value in kwargs.pop("values", {}).items():
            if key in inputs:
                inputs[key] = _odd_value(value, inputs[key])
        out = kwargs.pop("out", None)
        if out is not None:
            x = base[info.keys[0]]
            kwargs["out"] = {
                "numpy": {info.out_key: np.zeros_like(x)},
                "string": "y",
                "unknown_key": {"zz": Tensor.from_numpy(np.zeros_like(x))},
                "list": [Tensor.from_numpy(np.zeros_like(x))],
                "none_value": {info.out_key: None},
            }[out]
        return lambda: module.kernel(inputs, attrs=attrs, **kwargs)
    shapes = {k: (tuple(v) if isinstance(v, list) else v) for k, v in shapes.items()}
    kwargs.pop("values", None)
    kwargs.pop("out", None)
    if api == "explain":
        kwargs.pop("variant", None)
        return lambda: module.explain(shapes, dtypes, attrs, **kwargs)
    return lambda: module.plan(shapes, dtypes, attrs, **kwargs)


def malformed_child_main(examples):
    """Runs the malformed-call loop; prints START lines before each call and BAD lines for calls
    that break the rule (first of each kind), then DONE with the count."""
    from hypothesis import given as given_, settings as settings_

    seen = set()
    count = [0]

    @settings_(
        max_examples=examples,
        deadline=None,
        derandomize=False,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given_(malformed_calls())
    def loop(call):
        api, op_id, shapes, attrs, dtypes, kwargs, mutations = call
        text = f"{api} {op_id} shapes={shapes!r} attrs={attrs!r} dtypes={dtypes!r} kwargs={kwargs!r} mutations={mutations}"
        print("START " + text, flush=True)
        count[0] += 1
        fn = _make_call(api, op_id, shapes, attrs, dtypes, kwargs)
        try:
            value = fn()
            if api == "explain" and isinstance(value, str) and value:
                return
            outcome = "explain returned no text" if api == "explain" else "accepted"
        except ContractError as error:
            text += f" -> {error}"
            if api == "explain":
                outcome = "explain raised ContractError"
            else:
                try:
                    check_refusal(error, OPS[op_id].op)
                    return
                except AssertionError as bad:
                    outcome = "ContractError of the wrong shape: " + str(bad).lstrip(": ").split(";")[0][:80]
        except Exception as error:  # noqa: BLE001
            outcome = f"{type(error).__module__}.{type(error).__name__}"
            text += f" -> {str(error)[:200]}"
        # One report per (api, outcome, mutation kind); calls with several mutations are reported
        # only under outcomes no single-mutation call has shown yet.
        kinds = tuple(sorted({m.split(":")[0].split("=")[0] for m in mutations}))
        base = (api, outcome.split(" (")[0])
        key = base + (kinds if len(kinds) == 1 else "several",)
        if len(kinds) > 1 and base in seen:
            return
        if key not in seen:
            seen.update({key, base})
            print(
                "BAD "
                + json.dumps({"api": api, "outcome": outcome, "mutations": list(mutations), "call": text}),
                flush=True,
            )

    loop()
    print(f"DONE {count[0]}", flush=True)


def test_fuzz_malformed_calls():
    env = dict(
        os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), RUST_BACKTRACE="0"
    )
    env.setdefault("WGPU_BACKEND_TYPE", "Vulkan")
    code = f"import tests.runtime.test_fuzz_malformed as m; m.malformed_child_main({MALFORMED_EXAMPLES})"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    lines = proc.stdout.splitlines()
    bad = [json.loads(line[4:]) for line in lines if line.startswith("BAD ")]
    done = [line for line in lines if line.startswith("DONE ")]
    bad.sort(key=lambda b: (b["api"], b["outcome"], len(b["mutations"]), len(b["call"])))
    problems = [f"{b['api']}: {b['outcome']}: {b['call']}" for b in bad]
    if not done:
        last = next(
            (line[6:] for line in reversed(lines) if line.startswith("START ")), "<before the first call>"
        )
        tail = "\n".join(l for l in (proc.stderr or "").splitlines() if l and not l.startswith(" "))[-2000:]
        problems.append(f"the child process died (exit status {proc.returncode}) in: {last}\n{tail}")
    assert (
        not problems
    ), f"{len(problems)} kinds of malformed call not refused with a ContractError:\n" + "\n".join(problems)
