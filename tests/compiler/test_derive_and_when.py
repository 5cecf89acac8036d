"""Expressions through load_manifest + resolve_op: derive order and cycles, `when` entries that must
be booleans, every problem of a manifest reported (each once); and the generated `when`, which
returns the first failing clause and passes only on exactly True.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from codegen.ir import Origin
from codegen.problems import CompileError, Problem
from tests.compiler.compiler_support import problem_messages
from tests.compiler.expr_support import FILE, resolve_tiny, tiny_manifest


# ---------------------------------------------------------------------------------------------
# through load_manifest + resolve_op: derive cycles and strict-true `when`


def test_tiny_manifest_resolves(tmp_path):
    op = resolve_tiny(tmp_path, tiny_manifest())
    assert [v.name for v in op.derives] == ["rows", "wide"]
    assert [c.python for _, c in op.variants[0].when] == ["derived.wide"]


def test_derive_order_follows_dependencies(tmp_path):
    op = resolve_tiny(tmp_path, tiny_manifest(derive={"wide": "rows > 4", "rows": "dim(shapes.x, 0)"}))
    assert [v.name for v in op.derives] == ["rows", "wide"]
    assert dict((v.name, v.code.python) for v in op.derives)["wide"] == "rows > 4"


def test_derive_cycle_is_a_compile_error_naming_the_cycle(tmp_path):
    """One cycle is one problem, reported where it is first entered (it was once reported at every
    value on it: `a -> b -> a` and again `b -> a -> b`)."""
    data = tiny_manifest(derive={"a": "b + 1", "b": "a * 2", "wide": "a > 4"})
    with pytest.raises(CompileError) as info:
        resolve_tiny(tmp_path, data)
    assert problem_messages(info.value) == [
        "manifests/test.Expr/manifest.json#/derive/a: cycle between derived values: a -> b -> a: `b + 1`"
    ]


def test_self_reference_is_a_cycle(tmp_path):
    with pytest.raises(
        CompileError, match=r"#/derive/rows: cycle between derived values: rows -> rows: `rows \+ 1`"
    ):
        resolve_tiny(tmp_path, tiny_manifest(derive={"rows": "rows + 1", "wide": "rows > 4"}))


def test_variant_derive_cycle(tmp_path):
    variant = {"id": "only", "when": ["wide"], "derive": {"p": "q", "q": "p"}}
    with pytest.raises(CompileError) as info:
        resolve_tiny(tmp_path, tiny_manifest(variants=[variant]))
    assert any(
        "#/variants/0/derive/p: " in p and "p -> q -> p" in p for p in problem_messages(info.value)
    ), problem_messages(info.value)


def test_unknown_name_in_when_names_its_pointer(tmp_path):
    variant = {"id": "only", "when": ["wide", "nosuch > 1"]}
    with pytest.raises(CompileError) as info:
        resolve_tiny(tmp_path, tiny_manifest(variants=[variant]))
    assert any(
        p.startswith("manifests/test.Expr/manifest.json#/variants/0/when/1: unknown name `nosuch`")
        and p.endswith("`nosuch > 1`")
        for p in problem_messages(info.value)
    ), problem_messages(info.value)


@pytest.mark.parametrize(
    "when, pointer, shown, got",
    [
        ([1], "/variants/0/when/0", "1", "int"),
        (["wide", "rows"], "/variants/0/when/1", "rows", "int"),
        (["wide", "dim(shapes.x, 0) / 2"], "/variants/0/when/1", "dim(shapes.x, 0) / 2", "int"),
        (['"yes"'], "/variants/0/when/0", '"yes"', "str"),
        ("rows", "/variants/0/when", "rows", "int"),  # seed 002 writes one string, not a list
    ],
)
def test_when_entries_must_be_booleans(tmp_path, when, pointer, shown, got):
    """`when` passes only on exactly `true`: an entry that cannot be a boolean is refused at compile time."""
    with pytest.raises(CompileError) as info:
        resolve_tiny(tmp_path, tiny_manifest(variants=[{"id": "only", "when": when}]))
    expected = (
        f"manifests/test.Expr/manifest.json#{pointer}: expected a value of kind bool, got {got}: `{shown}`"
    )
    assert expected in problem_messages(info.value), problem_messages(info.value)


def test_demote_when_entries_must_be_booleans(tmp_path):
    with pytest.raises(
        CompileError, match=r"#/variants/0/demoteWhen/0: expected a value of kind bool, got int: `rows`"
    ):
        resolve_tiny(
            tmp_path, tiny_manifest(variants=[{"id": "only", "when": ["wide"], "demoteWhen": ["rows"]}])
        )


def test_a_bad_derive_is_reported_once(tmp_path):
    """`rows` was reported three times: once for itself and again by each value that reads it
    (`wide`, then the `when` that reads `wide`): a failed value was compiled again on every read."""
    data = tiny_manifest(derive={"rows": "dim(shapes.x)", "wide": "rows > 4"})
    with pytest.raises(CompileError) as info:
        resolve_tiny(tmp_path, data)
    assert problem_messages(info.value) == [
        "manifests/test.Expr/manifest.json#/derive/rows: `dim` takes 2 argument(s), got 1: `dim(shapes.x)`"
    ]


def test_a_bad_variant_value_is_reported_once_across_passes(tmp_path):
    passes = [{"id": f"p{i}", "shader": "t.wgsl.jinja", "dispatch": {"x": "half"}} for i in range(3)]
    data = tiny_manifest(
        variants=[{"id": "only", "when": ["wide"], "derive": {"half": "rows / nosuch"}, "passes": passes}]
    )
    with pytest.raises(CompileError) as info:
        resolve_tiny(tmp_path, data)
    (message,) = problem_messages(info.value)
    assert message.startswith(
        "manifests/test.Expr/manifest.json#/variants/0/derive/half: unknown name `nosuch`"
    )


def test_problems_are_data(tmp_path):
    variant = {"id": "only", "when": ["wide", "nosuch > 1"]}
    with pytest.raises(CompileError) as info:
        resolve_tiny(tmp_path, tiny_manifest(variants=[variant]))
    (problem,) = info.value.problems
    assert problem == Problem(Origin(FILE, "/variants/0/when/1"), problem.message, "nosuch > 1")
    assert problem.message.startswith("unknown name `nosuch`; ") and problem.template is None


def test_every_problem_of_a_variant_is_reported(tmp_path):
    """Not only the first of a variant: each value, each clause, each pass item on its own."""
    passes = [{"id": "main", "shader": "t.wgsl.jinja", "dispatch": {"x": "bad1"}}]
    variant = {"id": "only", "when": ["wide", "bad2"], "derive": {"a": "bad3", "b": "bad4"}, "passes": passes}
    with pytest.raises(CompileError) as info:
        resolve_tiny(tmp_path, tiny_manifest(variants=[variant]))
    unknown = sorted(p.expression for p in info.value.problems)
    assert unknown == ["bad1", "bad2", "bad3", "bad4"], problem_messages(info.value)


def test_an_unknown_function_suggests_the_closest(tmp_path):
    with pytest.raises(CompileError) as info:
        resolve_tiny(
            tmp_path, tiny_manifest(derive={"rows": "ceil_div(dim(shapes.x, 0), 2)", "wide": "rows > 4"})
        )
    (problem,) = info.value.problems
    assert problem.message.startswith("unknown function `ceil_div`; did you mean `ceilDiv`? known: ")


def test_every_problem_is_reported_not_only_the_first(tmp_path):
    data = tiny_manifest(
        derive={"rows": "dim(shapes.x)", "wide": "nosuch"}, variants=[{"id": "only", "when": [2]}]
    )
    with pytest.raises(CompileError) as info:
        resolve_tiny(tmp_path, data)
    text = "\n".join(problem_messages(info.value))
    assert "#/derive/rows: `dim` takes 2" in text
    assert "#/derive/wide: unknown name `nosuch`" in text
    assert "#/variants/0/when/0: expected a value of kind bool" in text


# ---------------------------------------------------------------------------------------------
# the generated `when`: the first failing clause, and only exactly-true passes


def bn_request(shape=(8, 4), dtype="f32", features=()):
    from generated._runtime import Caps, Request

    channels = shape[1]
    shapes = {
        "x": shape,
        "scale": (channels,),
        "b": (channels,),
        "inputMean": (channels,),
        "inputVar": (channels,),
        "y": shape,
    }
    return Request(
        shapes=shapes,
        dtypes={"T": dtype},
        attrs={"epsilon": 1e-05, "momentum": 0.9, "training_mode": 0},
        tunables={"WORKGROUP_SIZE": 256},
        caps=Caps.from_mapping({"features": list(features)}),
    )


def test_generated_when_passes_with_real_derived_values():
    from generated import batch_normalization as bn
    from generated.batch_normalization import nc_inference_vec4

    r = bn_request()
    d = bn.derive(r)
    assert d.inference_contract_ok is True
    assert nc_inference_vec4.when(r, d) is None


@pytest.mark.parametrize(
    "shape, dtype, failing",
    [
        ((8, 6), "f32", "dim(shapes.X, 1) % 4 == 0"),
        ((8, 4, 2), "f32", "ranks.X == 2"),
        ((8, 4), "f16", None),  # the vec4 variants serve f16 too
        ((8, 6, 3), "f16", "ranks.X == 2"),  # the first failing clause in manifest order
    ],
)
def test_generated_when_returns_the_first_failing_clause(shape, dtype, failing):
    from generated.batch_normalization import nc_inference_vec4

    d = SimpleNamespace(inference_contract_ok=True)
    assert nc_inference_vec4.when(bn_request(shape, dtype), d) == failing


@pytest.mark.parametrize("value", [1, 1.0, "true", np.True_, [True], None, False])
def test_generated_when_treats_only_exactly_true_as_passing(value):
    from generated.batch_normalization import nc_inference_vec4

    d = SimpleNamespace(inference_contract_ok=value)
    assert nc_inference_vec4.when(bn_request(), d) == "inferenceContractOk"


def test_generated_when_of_other_variants():
    from generated import batch_normalization as bn
    from generated.batch_normalization import inference_scalar, nchw_inference_vec4

    r = bn_request((2, 3, 4, 4))
    d = bn.derive(r)
    assert inference_scalar.when(r, d) is None
    assert nchw_inference_vec4.when(r, d) is None
    odd = bn_request((2, 3, 3, 3))
    assert nchw_inference_vec4.when(odd, bn.derive(odd)) == "inner(shapes.X, 1) % 4 == 0"
    # f16 without shader-f16: the derived contract is false, so every variant refuses.
    half = bn_request((2, 3, 4, 4), "f16")
    assert bn.derive(half).inference_contract_ok is False
    assert inference_scalar.when(half, bn.derive(half)) == "inferenceContractOk"
    half_ok = bn_request((2, 3, 4, 4), "f16", ["shader-f16"])
    assert inference_scalar.when(half_ok, bn.derive(half_ok)) is None


def test_contract_rules_are_typed_not_parsed(tmp_path):
    """The contract's rules carry what emit needs as data: the subject as kind and name, and whether
    the clause is `f16Ok(dtypes.T)` itself (its message names shader-f16); no stage parses the
    clause's text or the subject's words."""
    from codegen.resolve import Subject

    data = tiny_manifest(
        typeConstraints={"T": ["float32", "float16"]},
        variants=[
            {
                "id": "only",
                "when": ["dim(shapes.x, 0) > 4", "f16Ok(dtypes.T)", 'f16Ok(dtypes.T) or dtypes.T == "f32"'],
            }
        ],
    )
    rules = {rule.source: rule for rule in resolve_tiny(tmp_path, data).rules}
    assert rules["f16Ok(dtypes.T)"].needs_shader_f16 and rules["f16Ok(dtypes.T)"].subject == Subject(
        "dtype", "T"
    )
    mixed = next(rule for source, rule in rules.items() if source.startswith("f16Ok(dtypes.T) or"))
    assert not mixed.needs_shader_f16
    rows = rules["dim(shapes.x, 0) > 4"]
    assert (
        rows.subject == Subject("input", "x") and str(rows.subject) == "input x" and not rows.needs_shader_f16
    )
