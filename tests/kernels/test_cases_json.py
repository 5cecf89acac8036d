"""Every case of every op's test.json (emitted as generated/<op>/cases.py), run against the float64 references.

A case names input shapes, dtypes (a list per type variable: each combination runs), attributes
and optionally a forced variant, tunables, device caps and requested outputs. Inputs are fresh
random data each run (seed printed on failure); outputs are poisoned with NaN before the run.
"""

from __future__ import annotations

import importlib
import itertools

import numpy as np
import pytest

import generated
from tests import oracles
from tests.device_helpers import poisoned_call
from tests.oracles import assert_close, rng_for, seed_note


def _batch_normalization(inputs, attrs, dtypes):
    y = oracles.batch_normalization_ref(
        inputs["x"],
        inputs["scale"],
        inputs["b"],
        inputs["inputMean"],
        inputs["inputVar"],
        attrs.get("epsilon", 1e-5),
    )
    return {"y": y}


def _group_normalization(inputs, attrs, dtypes):
    # stash_type=10 computes in f16 and needs its own tolerance argument: group_norm_support.py.
    assert attrs.get("stash_type", 1) == 1, "test.json holds stash_type=1 cases only"
    y = oracles.group_normalization_ref(
        inputs["x"], inputs["scale"], inputs["bias"], attrs["num_groups"], attrs.get("epsilon", 1e-5)
    )
    return {"y": y}


def _instance_normalization(inputs, attrs, dtypes):
    return {
        "output": oracles.instance_normalization_ref(
            inputs["input"], inputs["scale"], inputs["b"], attrs.get("epsilon", 1e-5)
        )
    }


def _skip_group_norm(inputs, attrs, dtypes):
    y, s = oracles.skip_group_norm_for_call(inputs, attrs)
    return {"Y": y, "S": s}


def _by_position(name):
    """The layer family: generated/reference.py's node_outputs, inputs and outputs by position."""
    package = importlib.import_module(f"generated.{name}")
    return lambda inputs, attrs, dtypes: oracles.node_reference(package, inputs, attrs)


def _microsoft_group_norm(inputs, attrs, dtypes):
    return {"Y": oracles.microsoft_group_norm_for_call(inputs, attrs)}


REFERENCES = {
    "batch_normalization": _batch_normalization,
    "group_normalization": _group_normalization,
    "instance_normalization": _instance_normalization,
    "skip_group_norm": _skip_group_norm,
    **{
        name: _by_position(name)
        for name in (
            "layer_normalization",
            "rms_normalization",
            "simplified_layer_normalization",
            "skip_layer_normalization",
            "skip_simplified_layer_normalization",
        )
    },
    "group_norm": _microsoft_group_norm,
}
POSITIVE_INPUTS = {"inputVar"}  # variances


def _cases():
    found = []
    for name, package in generated.op_packages().items():
        if name not in REFERENCES:
            continue  # test_every_op_has_test_cases names it
        try:
            cases = importlib.import_module(".cases", package.__name__).TEST_CASES
        except ModuleNotFoundError:
            continue
        for case in cases:
            type_vars = sorted(case["dtypes"])
            options = [
                case["dtypes"][v] if isinstance(case["dtypes"][v], list) else [case["dtypes"][v]]
                for v in type_vars
            ]
            for combo in itertools.product(*options):
                dtypes = dict(zip(type_vars, combo))
                label = f"{name}-{case['name']}-" + "-".join(f"{v}={d}" for v, d in dtypes.items())
                found.append(pytest.param(name, package, case, dtypes, id=label))
    return found


def test_every_op_has_test_cases():
    ops = {p.values[0] for p in _cases()}
    assert ops == set(generated.op_packages()) == set(REFERENCES), (ops, set(generated.op_packages()))


@pytest.mark.parametrize("name,package,case,dtypes", _cases())
def test_case(name, package, case, dtypes, request):
    rng, seed = rng_for(request.node.name)
    type_of = {t.key: t.type_var for t in package.INPUTS}
    inputs = {}
    for key, shape in case["inputs"].items():
        dtype = np.dtype(dtypes[type_of[key]])
        if key in POSITIVE_INPUTS:
            inputs[key] = rng.uniform(0.1, 3.0, shape).astype(dtype)
        else:
            inputs[key] = (rng.standard_normal(shape) * 2 + 0.5).astype(dtype)
    attrs = case.get("attrs", {})
    outputs = tuple(case.get("outputs", [t.key for t in package.OUTPUTS if not t.optional]))
    result = poisoned_call(
        package,
        inputs,
        outputs,
        attrs=attrs,
        variant=case.get("variant"),
        tunables=case.get("tunables"),
        caps=case.get("caps"),
    )
    expected = REFERENCES[name](inputs, attrs, dtypes)
    for key in outputs:
        assert_close(
            result[key],
            expected[key],
            result[key].dtype,
            f"{request.node.name} output {key} {seed_note(seed)}",
        )
