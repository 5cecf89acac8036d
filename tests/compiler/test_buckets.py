"""Buckets and finite domains: `bucketUp` / `bucketDown` in the manifest language (codegen/expr.py,
generated/_runtime/numeric.py) and the domains of specialization values (codegen/domains.py),
worked out from the expressions' trees, never by running generated Python.

docs/MANIFEST.md, "Buckets" and "Binding times".
"""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest

from codegen.domains import Domains, key_combinations
from codegen.manifest import load_manifest
from codegen.problems import CompileError
from codegen.resolve import Value, resolve_op
from codegen.wgsl import render_op
from generated import _runtime as runtime
from generated._runtime.numeric import bucket_down, bucket_up

from tests.compiler.expr_support import compile_error, compile_source, evaluate

REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------
# the builtins: parse, type, emit


def test_bucket_up_compiles_to_the_runtime_helper_with_its_list():
    code = compile_source("bucketUp(attrs.n, [1, 2, 4, 8])")
    assert code.python == "bucket_up(attr_n, (1, 2, 4, 8))"
    assert code.type == "int" and code.helpers == {"bucket_up"} and code.locals == {"attr_n"}


def test_bucket_down_and_a_one_value_list():
    code = compile_source("bucketDown(attrs.n * 2, [4])")
    assert code.python == "bucket_down(attr_n * 2, (4,))"
    assert code.helpers == {"bucket_down"}


def test_a_bucket_of_floats_is_a_float():
    assert compile_source("bucketUp(attrs.eps, [0.5, 1, 2])").type == "float"
    assert compile_source("bucketUp(attrs.eps, [1, 2])").type == "int"


@pytest.mark.parametrize(
    "source, n, expected",
    [
        ("bucketUp(attrs.n, [1, 2, 4, 8])", 3, 4),
        ("bucketUp(attrs.n, [1, 2, 4, 8])", 4, 4),  # equal to a bucket: that bucket
        ("bucketUp(attrs.n, [1, 2, 4, 8])", 9, 8),  # above the last: the last
        ("bucketUp(attrs.n, [1, 2, 4, 8])", -5, 1),
        ("bucketDown(attrs.n, [1, 2, 4, 8])", 3, 2),
        ("bucketDown(attrs.n, [1, 2, 4, 8])", 4, 4),
        ("bucketDown(attrs.n, [1, 2, 4, 8])", 0, 1),  # below the first: the first
        ("bucketDown(attrs.n, [1, 2, 4, 8])", 100, 8),
        ('"units" ~ bucketUp(attrs.n, [1, 2, 4])', 3, "units4"),
        ("attrs.n == bucketUp(attrs.n, [1, 2, 4])", 3, False),
    ],
)
def test_generated_bucket_code_runs(source, n, expected):
    assert evaluate(source, attr_n=n) == expected


@pytest.mark.parametrize(
    "source, message",
    [
        ("bucketUp(attrs.n)", "`bucketUp` takes 2 argument(s), got 1"),
        ("bucketDown(attrs.n, [1], [2])", "`bucketDown` takes 2 argument(s), got 3"),
        ("bucketUp(dtypes.T, [1, 2])", "the first argument of `bucketUp` must be a number, got str"),
        (
            "bucketUp(attrs.n, 4)",
            "`bucketUp`: the second argument must be the list of values it may give, written out `[4]`",
        ),
        (
            "bucketUp(attrs.n, attrs.zero)",
            "`bucketUp`: the second argument must be the list of values it may give, written out",
        ),
        (
            "bucketUp(attrs.n, [])",
            "`bucketUp`: the list of values is empty: a bucket needs at least one value",
        ),
        (
            "bucketUp(attrs.n, [1, attrs.n])",
            "`bucketUp`: the listed values must be number literals; item 2 is not",
        ),
        (
            'bucketUp(attrs.n, [1, "2"])',
            "`bucketUp`: the listed values must be number literals; item 2 is not",
        ),
        ("bucketUp(attrs.n, [true])", "`bucketUp`: the listed values must be number literals; item 1 is not"),
        (
            "bucketUp(attrs.n, [4, 1, 2])",
            "`bucketUp`: the listed values must ascend, each once; did you mean `[1, 2, 4]`?",
        ),
        (
            "bucketDown(attrs.n, [1, 2, 2, 8])",
            "`bucketDown`: the listed values must ascend, each once; did you mean `[1, 2, 8]`?",
        ),
    ],
)
def test_bucket_misuse_is_a_compile_error_that_says_what_to_write(source, message):
    error = compile_error(source)  # names the file, the pointer and the expression
    assert error.message == message


def test_a_misspelled_bucket_suggests_the_builtin():
    error = compile_error("bucketup(attrs.n, [1, 2])")
    assert error.message.startswith("unknown function `bucketup`; did you mean `bucketUp`?")


def test_a_bucket_is_a_number_where_a_string_is_expected():
    error = compile_error("bucketUp(attrs.n, [1, 2])", expect="str")
    assert error.message == "expected a value of kind str, got int"


# ---------------------------------------------------------------------------------------------
# the runtime helpers


@pytest.mark.parametrize(
    "x, expected",
    [(-1, 8), (0, 8), (8, 8), (9, 16), (16, 16), (17, 96), (96, 96), (97, 96), (10**9, 96), (12.5, 16)],
)
def test_bucket_up(x, expected):
    assert bucket_up(x, (8, 16, 96)) == expected


@pytest.mark.parametrize(
    "x, expected",
    [(-1, 1), (0, 1), (1, 1), (2.9, 2), (3, 3), (15, 12), (16, 16), (10**9, 16)],
)
def test_bucket_down(x, expected):
    assert bucket_down(x, (1, 2, 3, 12, 16)) == expected


def test_buckets_of_nan_are_the_ends_as_the_ladders_gave():
    """NaN compares false: bucketUp gives the last value and bucketDown the first, as the chains of
    booleans these builtins replaced did (`"1" if x <= 1 else ... else "24"`)."""
    assert bucket_up(math.nan, (1, 2, 24)) == 24
    assert bucket_down(math.nan, (1, 2, 16)) == 1


def test_buckets_are_exported_for_the_generated_code():
    assert runtime.bucket_up is bucket_up and runtime.bucket_down is bucket_down


# ---------------------------------------------------------------------------------------------
# domains


def _manifest(variant_derive: dict, derive: dict | None = None, when=("rows >= 1",), **changes) -> dict:
    data = {
        "domain": "test",
        "name": "Buckets",
        "sinceVersion": 1,
        "inputs": {"x": {"dtype": "T"}},
        "outputs": {"y": {"dtype": "T", "shape": "shapes.x"}},
        "typeConstraints": {"T": ["float32", "float16"]},
        "attributes": {"mode": {"default": 0, "values": [0, 1, 2]}, "alpha": {"default": 1.0}},
        "tunables": {"UNITS": {"default": 6}},
        "derive": {"rows": "dim(shapes.x, 0)", "isWide": "rows > 4", **(derive or {})},
        "variants": [
            {
                "id": "only",
                "when": list(when),
                "derive": variant_derive,
                "passes": [
                    {
                        "id": "main",
                        "shader": "t.wgsl.jinja",
                        "bindings": [
                            {"name": "x", "buffer": "read-only-storage", "elementType": "$T"},
                            {"name": "y", "buffer": "storage", "elementType": "$T"},
                        ],
                        "dispatch": {"x": "rows"},
                    }
                ],
            }
        ],
    }
    data.update(changes)
    return data


def _resolved(tmp_path: Path, data: dict):
    folder = tmp_path / "manifests" / "test.Buckets"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").write_text(json.dumps(data, indent=1))
    return resolve_op(load_manifest(folder / "manifest.json", tmp_path))


def _combinations(tmp_path: Path, data: dict, *names: str) -> list[dict]:
    """The reachable combinations of the named variant values, with the variant's `when`."""
    op = _resolved(tmp_path, data)
    variant = op.variants[0]
    (pass_,) = variant.passes
    values = {v.name: v for v in pass_.scope_values}
    conditions = [Value(f"when:{i}", f"when_{i}", e, c) for i, (e, c) in enumerate(variant.when)]
    return key_combinations(
        op, variant, pass_, [values[n] for n in names], conditions, "templates/t.wgsl.jinja"
    )


def _domain(tmp_path: Path, data: dict, name: str) -> set:
    op = _resolved(tmp_path, data)
    variant = op.variants[0]
    domains = Domains(op, variant, variant.passes[0])
    value = next(v for v in variant.derives if v.name == name)
    return set(domains.of_value("variant", value).table.values())


@pytest.mark.parametrize(
    "source, expected",
    [
        ('"plain"', {"plain"}),  # a literal
        ("dtypes.T", {"f32", "f16"}),  # a dtype: its type constraint
        ("attrs.mode", {0, 1, 2}),  # an attribute restricted by `values`
        ('"vec4<" ~ dtypes.T ~ ">"', {"vec4<f32>", "vec4<f16>"}),
        ("bucketUp(rows, [1, 4, 16])", {1, 4, 16}),  # a bucket of a shape: its list
        ('"" ~ bucketDown(tunables.UNITS, [1, 2, 4, 8])', {"1", "2", "4", "8"}),  # ... of a tunable
        ('"wide" if isWide else "narrow"', {"wide", "narrow"}),  # a named boolean of a shape: both
        ("rows > 4", {False, True}),  # a boolean of a shape: both outcomes
        ('dtypes.T == "f16"', {False, True}),
        ("attrs.mode * 2 + 1", {1, 3, 5}),  # arithmetic of finite values
        ("bucketUp(attrs.mode, [1, 2])", {1, 2}),  # a bucket of a finite value: worked out
        ("max(attrs.mode, 1) == 1", {False, True}),
    ],
)
def test_the_domain_of_a_value(tmp_path, source, expected):
    assert _domain(tmp_path, _manifest({"value": source}), "value") == expected


def test_values_that_read_one_leaf_vary_together(tmp_path):
    """`scalar` and `usesF16` both read dtypes.T: two combinations, not four."""
    data = _manifest({"scalar": "dtypes.T", "usesF16": 'dtypes.T == "f16"'})
    assert _combinations(tmp_path, data, "scalar", "usesF16") == [
        {"scalar": "f32", "usesF16": False},
        {"scalar": "f16", "usesF16": True},
    ]


def test_a_bucket_and_what_is_computed_from_it(tmp_path):
    data = _manifest(
        {"units": '"" ~ unitsBucket', "exact": "rows == unitsBucket", "wide": "unitsBucket > 4"},
        derive={"unitsBucket": "bucketUp(rows, [1, 4, 16])"},
    )
    combos = _combinations(tmp_path, data, "units", "wide")
    assert combos == [
        {"units": "1", "wide": False},
        {"units": "4", "wide": False},
        {"units": "16", "wide": True},
    ]
    # `exact` reads the shape beside the bucket: a free boolean, both outcomes with every bucket.
    assert len(_combinations(tmp_path, data, "units", "exact")) == 6


def test_a_finite_when_clause_rules_combinations_out(tmp_path):
    data = _manifest({"scalar": "dtypes.T"}, when=('dtypes.T == "f32"', "rows >= 1"))
    assert _combinations(tmp_path, data, "scalar") == [{"scalar": "f32"}]


def test_a_bucket_leaf_is_shared_by_the_values_that_read_it(tmp_path):
    data = _manifest(
        {"units": '"" ~ unitsBucket', "twice": '"" ~ unitsBucket * 2'},
        derive={"unitsBucket": "bucketDown(rows, [1, 2])"},
    )
    assert _combinations(tmp_path, data, "units", "twice") == [
        {"units": "1", "twice": "2"},
        {"units": "2", "twice": "4"},
    ]


def test_two_bucket_calls_are_two_leaves(tmp_path):
    data = _manifest({"pair": '"" ~ bucketUp(rows, [1, 2]) ~ "x" ~ bucketUp(tunables.UNITS, [1, 2])'})
    assert _domain(tmp_path, data, "pair") == {"1x1", "1x2", "2x1", "2x2"}


@pytest.mark.parametrize(
    "derive, variant, reads",
    [
        ({}, {"units": '"" ~ rows'}, "reads `rows`, which reads `dim(shapes.x, 0)`"),
        ({}, {"units": '"" ~ tunables.UNITS'}, "reads `tunables.UNITS`"),
        # A condition on a shape written inline: only a named boolean is taken as both outcomes.
        ({}, {"units": '"wide" if rows > 4 else "narrow"'}, "reads `rows`, which reads `dim(shapes.x, 0)`"),
        ({}, {"units": '"" ~ attrs.alpha'}, "reads `attrs.alpha`"),  # an attribute without `values`
        (
            {"wide": "rows * 2"},
            {"units": '"n" ~ wide'},
            "reads `wide`, which reads `rows`, which reads `dim(shapes.x, 0)`",
        ),
    ],
)
def test_a_template_value_without_a_finite_domain_is_a_compile_error(tmp_path, derive, variant, reads):
    data = _manifest(variant, derive=derive)
    with pytest.raises(CompileError) as info:
        _combinations(tmp_path, data, "units")
    (problem,) = info.value.problems
    assert str(problem.origin) == "manifests/test.Buckets/manifest.json#/variants/0/derive/units"
    assert problem.expression == variant["units"]
    assert problem.message == (
        "`units` decides a specialization of template `templates/t.wgsl.jinja`, so it needs a finite "
        f"domain, but it {reads}, which has none: bucket a number with bucketUp(x, [...]) or "
        "bucketDown(x, [...]), or name a boolean as a derived value"
    )


def test_a_template_renders_once_for_each_bucket(tmp_path):
    """End to end through the render stage: one specialization for each listed value."""
    data = _manifest({"units": '"" ~ bucketUp(rows, [1, 2, 4])'}, typeConstraints={"T": ["float32"]})
    _resolved(tmp_path, data)
    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "t.wgsl.jinja").write_text(
        "@compute {{ shader.workgroup_size(1) }}\nfn main() {\n    let units = {{ units }}u;\n}\n"
    )
    (rendered,) = render_op(_resolved(tmp_path, data), templates)
    assert [s.context for s in rendered.specializations] == [{"units": "1"}, {"units": "2"}, {"units": "4"}]
    assert "let units = 4u;" in rendered.specializations[2].wgsl
    assert "@compute @workgroup_size(1)\n" in rendered.specializations[2].wgsl
    assert rendered.specializations[2].interface.workgroup_size == 1


def test_the_real_manifests_buckets_reach_every_listed_value():
    """GroupNormalization's register row: 12 unit buckets x 3 fills x 2 dtypes, as the chains of
    booleans gave before the builtins; the split-k register variant: 8 chunk buckets."""
    op = resolve_op(load_manifest(REPO / "manifests/ai.onnx.GroupNormalization/manifest.json", REPO))
    (rendered,) = [r for r in render_op(op, REPO / "templates") if r.variant.ir.id == "group_row_registers"]
    units = {s.context["units"] for s in rendered.specializations}
    assert units == {str(n) for n in (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24)}
    assert len(rendered.specializations) == 12 * 3 * 2


# ---------------------------------------------------------------------------------------------
# the compiler runs no generated source


def test_the_compiler_never_evaluates_source_text():
    """Facts travel as data: no `eval`, `exec` or `compile` of text anywhere in codegen/ (Jinja's
    own `environment.compile` of a template is a method, not the builtin)."""
    found = []
    for path in sorted((REPO / "codegen").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                if node.func.id in ("eval", "exec", "compile"):
                    found.append(f"{path.name}:{node.lineno} {node.func.id}()")
    assert found == []
