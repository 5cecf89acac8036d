"""Derived values carry their real types: a whole number is an `int` in the generated Derived and
Values and in every plan, and each value is what its annotation says.

Every shipped test and benchmark case of every op, every dtype it lists, planned with every
variant forced (no GPU): the derive() and values() results are checked against the NamedTuples'
annotations (`int`: an int, never 16384.0; `int | float`: a quotient of ints, an int where whole,
else the JS fraction; `float`: a number), and every number a pass hands its shader against its WGSL
type (u32 / i32: an int, f32: a float).
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import typing
from types import SimpleNamespace

import pytest

import generated._runtime as rt

OPS = ("batch_normalization", "group_normalization", "instance_normalization", "skip_group_norm")
CAPS = {
    "features": ["shader-f16", "subgroups"],
    "wgslLanguageFeatures": ["subgroup_id"],
    "adapterInfo": {"subgroupMinSize": 8, "subgroupMaxSize": 8},
}


def _wrong_types(record) -> list[str]:
    """The fields of a Derived or Values tuple whose value is not of its annotated type."""
    wrong = []
    for name, hint in typing.get_type_hints(type(record)).items():
        value = getattr(record, name)
        if hint is int:
            ok = type(value) is int
        elif hint == int | float:
            ok = type(value) is int or (type(value) is float and not value.is_integer())
        elif hint is float:
            ok = type(value) in (int, float)
        elif hint is bool:
            ok = type(value) is bool
        else:
            continue
        if not ok:
            wrong.append(f"{type(record).__name__}.{name}: {hint} holds {value!r}")
    return wrong


def _checked_contract(package, found: list[str]):
    """The op's contract with derive() and every candidate's values() checked as they run; a
    contract of its own name, so that no plan comes from the plan cache."""
    contract = package.CONTRACT

    def derive(r):
        derived = contract.derive(r)
        found.extend(_wrong_types(derived))
        return derived

    def candidate(module):
        def values(r, d):
            made = module.values(r, d)
            found.extend(f"{module.ID}: {w}" for w in _wrong_types(made))
            return made

        return SimpleNamespace(**{**vars(module), "values": values})

    return dataclasses.replace(
        contract,
        op=f"{contract.op} (types)",
        derive=derive,
        candidates=tuple(candidate(c) for c in contract.candidates),
    )


def _requests(package):
    cases = importlib.import_module(f"{package.__name__}.cases")
    for case in cases.TEST_CASES + cases.BENCH_CASES:
        shapes = {k: tuple(v) for k, v in case["inputs"].items()}
        listed = case.get("dtypes") or {}
        choices = [v if isinstance(v, list) else [v] for v in listed.values()]
        for dtypes in itertools.product(*choices):
            yield case, shapes, dict(zip(listed, dtypes))


def _wrong_pass_types(pass_plan) -> list[str]:
    wrong = []
    for name, kind in pass_plan.uniform_types:
        if name in pass_plan.uniforms:
            expected = float if kind == "f32" else int
            if type(pass_plan.uniforms[name]) is not expected:
                wrong.append(f"{pass_plan.name}: uniform {name} ({kind}) is {pass_plan.uniforms[name]!r}")
    for name, kind in pass_plan.override_types.items():
        expected = float if kind == "f32" else int
        if type(pass_plan.overrides[name]) is not expected:
            wrong.append(f"{pass_plan.name}: override {name} ({kind}) is {pass_plan.overrides[name]!r}")
    return wrong


@pytest.mark.parametrize("op", OPS)
def test_derived_values_and_plans_hold_their_declared_types(op):
    package = importlib.import_module(f"generated.{op}")
    found: list[str] = []
    contract = _checked_contract(package, found)
    planned = 0
    for case, shapes, dtypes in _requests(package):
        for variant in contract.candidates:
            try:
                plan = rt.build_plan(
                    contract,
                    shapes,
                    dtypes,
                    case.get("attrs"),
                    caps=CAPS,
                    tunables=case.get("tunables"),
                    variant=variant.ID,
                    outputs=case.get("outputs"),
                )
            except (rt.ContractError, rt.PlanError):
                continue  # the variant does not apply to this case: its values were still checked
            planned += 1
            for pass_plan in plan.passes:
                found.extend(f"{case['name']} {variant.ID}: {w}" for w in _wrong_pass_types(pass_plan))
    assert planned > 0
    assert sorted(set(found)) == []


def test_a_quotient_that_is_not_whole_is_the_fraction_its_annotation_allows():
    """GroupNormalization's `regRowUnits` (hidden / unit values) is 2.5 for rows of 10 f32 values:
    annotated `int | float`, and the fraction is kept (the row-register variant refuses the row)."""
    from generated import group_normalization as gn

    assert typing.get_type_hints(gn.Derived)["reg_row_units"] == int | float
    assert typing.get_type_hints(gn.Derived)["group_spatial"] is int
    found: list[str] = []
    contract = _checked_contract(gn, found)
    seen = []
    checked = dataclasses.replace(contract, derive=lambda r: seen.append(contract.derive(r)) or seen[-1])
    rt.build_plan(checked, {"x": (2, 4, 5), "scale": (4,), "bias": (4,)}, {"T": "float32"}, {"num_groups": 2})
    (derived,) = seen
    assert derived.reg_row_units == 2.5 and derived.group_hidden == 10 and type(derived.group_hidden) is int
    assert found == []
