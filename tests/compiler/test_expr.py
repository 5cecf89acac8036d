"""Unit tests of the expression compiler (codegen/expr.py): every construct, every JS corner.

Each expression is compiled against the small hand-built Scope of tests/compiler/expr_support.py and
the Python it produces is run with `eval` in a namespace that holds only what the compiled code says
it needs (`.helpers` from the runtime, `.locals` from the request), so a missing helper or local is a
failure too. Compile errors must name the manifest file, the JSON pointer and the expression
(docs/MANIFEST.md, "Expressions").
"""

from __future__ import annotations

import math

import pytest

from codegen.expr import ExprError, compile_expr, snake
from codegen.ir import Expr
from tests.compiler.expr_support import (
    ORIGIN,
    SCOPE,
    compile_error,
    compile_source,
    evaluate,
    resolve_tiny,
    run,
    tiny_manifest,
)


# ---------------------------------------------------------------------------------------------
# numbers: JS semantics


@pytest.mark.parametrize(
    "source, expected",
    [
        ("8 / 2", 4),
        ("5 / 2", 2.5),
        ("attrs.n / 2", 1.5),  # a non-literal dividend: still true division
        ("attrs.n / attrs.n", 1),
        ("1 / 4 * 2", 0.5),
        ("24 / 2 * 3", 36),
        ("24 / (2 * 3)", 4),
        ("2 * 3 / 4", 1.5),
        ("1 / (2 / 4)", 2),
    ],
)
def test_division_is_true_division(source, expected):
    assert evaluate(source) == expected


@pytest.mark.parametrize(
    "source, expected",
    [
        ("attrs.n / 0", math.inf),
        ("attrs.n / attrs.zero", math.inf),
        ("1 / 0", math.inf),
        ("(0 - 1) / 0", -math.inf),
        ("1.5 / 0.0", math.inf),
    ],
)
def test_division_by_zero_is_infinity_not_an_error(source, expected):
    assert evaluate(source) == expected


def test_zero_over_zero_is_nan():
    assert math.isnan(evaluate("attrs.zero / 0"))
    assert math.isnan(evaluate("0 / attrs.zero"))


@pytest.mark.parametrize(
    "source, expected",
    [
        ("-5 % 3", -2),  # the dividend's sign, not Python's floor modulo (1)
        ("5 % -3", 2),  # Python gives -1
        ("5 % 3", 2),
        ("-6 % 3", 0),
        ("attrs.n % 2", 1),
        ("-attrs.n % 2", -1),
        ("-5.5 % 2", -1.5),
        ("7.5 % 2", 1.5),
    ],
)
def test_modulo_takes_the_sign_of_the_dividend(source, expected):
    assert evaluate(source) == expected


def test_modulo_by_zero_is_nan():
    assert math.isnan(evaluate("attrs.n % 0"))
    assert math.isnan(evaluate("attrs.n % attrs.zero"))


@pytest.mark.parametrize(
    "source, operator", [("attrs.n // 2", "//"), ("7 // 2", "//"), ("attrs.n ** 2", "**"), ("2 ** 3", "**")]
)
def test_floor_division_and_power_do_not_exist(source, operator):
    error = compile_error(source)
    assert f"`{operator}`" in error.message and "does not exist" in error.message


@pytest.mark.parametrize(
    "source, expected",
    [
        ("2 - 3 - 4", -5),
        ("2 - (3 - 4)", 3),
        ("2 * (3 + 4)", 14),
        ("2 * 3 + 4", 10),
        ("-(2 + 3)", -5),
        ("-(2 + 3) * 2", -10),
        ("1 - -1", 2),
        ("-attrs.n", -3),
        ("+attrs.n", 3),
        ("attrs.n - (1 - 2) * 2", 5),
        ("(attrs.n + 1) % 3", 1),
        ("attrs.n + 1 % 3", 4),
        ("(1 if true else 2) * 3", 3),
        ("1 if true else 2 * 3", 1),
        ("(1 if false else 2) + 1", 3),
    ],
)
def test_arithmetic_precedence_survives_translation(source, expected):
    assert evaluate(source) == expected


def test_number_kinds():
    assert compile_source("attrs.n + 1").type == "int"
    assert compile_source("attrs.n * attrs.eps").type == "float"
    assert compile_source("attrs.eps").type == "float"
    assert compile_source("-attrs.eps").type == "float"


@pytest.mark.parametrize(
    "source, annotation",
    [
        ("attrs.n + 1", "int"),
        ("attrs.n / 2", "int | float"),  # 3 / 2 is 1.5: JS division
        ("attrs.n * (attrs.n / 2) - 1", "int | float"),  # made from a quotient
        ("attrs.n / 2 if flag else 0", "int | float"),
        ("max(attrs.n, attrs.n / 2)", "int | float"),
        ("floor(attrs.n / 2)", "int"),
        ("ceil(attrs.n / 2)", "int"),
        ("ceilDiv(attrs.n, 2)", "int"),
        ("pow2ceil(attrs.n / 2)", "int"),
        ("max(1, pow2ceil(attrs.n + 1) / 2)", "int"),  # a power of two over 2: whole, or 0.5 below max's 1
        ("max(1, pow2ceil(attrs.n + 1) / 3)", "int | float"),  # 4 / 3
        ("max(0, pow2ceil(attrs.n + 1) / 2)", "int | float"),  # max(0, 0.5) is 0.5
        ("max(1, attrs.n / 2)", "int | float"),  # 3 / 2 is 1.5
        ("attrs.eps / 2", "float"),
    ],
)
def test_an_int_that_may_be_a_fraction_says_so(source, annotation):
    """Generated NamedTuples annotate each value with `Compiled.python_type`: a quotient of ints, or
    a value made from one, is `int | float`, since JS division keeps 2.5 for 5 / 2."""
    code = compile_source(source)
    assert code.python_type == annotation
    if annotation == "int":
        for n in range(0, 40):
            assert type(run(code, attr_n=n)) is int, (source, n)


def test_an_int_made_from_a_derived_quotient_is_annotated_as_one(tmp_path):
    data = tiny_manifest(
        derive={"rows": "dim(shapes.x, 0)", "half": "rows / 2", "twice": "half * 2", "wide": "rows > 4"}
    )
    types = {v.name: v.code.python_type for v in resolve_tiny(tmp_path, data).derives}
    assert types == {"rows": "int", "half": "int | float", "twice": "int | float", "wide": "bool"}


# ---------------------------------------------------------------------------------------------
# strings: `~` writes numbers as JavaScript does


@pytest.mark.parametrize(
    "source, expected",
    [
        ('"a" ~ 0.00001', "a0.00001"),  # Python would write 1e-05
        ('"v" ~ 4', "v4"),
        ('"" ~ 8 / 2', "4"),  # Python's 8 / 2 is 4.0
        ('"x" ~ 5 / 2', "x2.5"),
        ('"" ~ true', "true"),
        ('"" ~ false', "false"),
        ('"" ~ 1e21', "1e+21"),
        ('"" ~ 0.0000001', "1e-7"),
        ('"" ~ attrs.n / 0', "Infinity"),
        ('"" ~ attrs.eps', "0.00001"),
        ('"n" ~ (1 + 2)', "n3"),
        ('"n" ~ 2 * 3', "n6"),  # `*` binds tighter than `~`
        ('"vec4<" ~ dtypes.T ~ ">"', "vec4<f16>"),
        ('"a" ~ ("b" if flag else "c")', "ab"),
        ('"a" ~ "b" == "ab"', True),
        ('"" ~ (0 - 1.5)', "-1.5"),
    ],
)
def test_concatenation_writes_numbers_like_javascript(source, expected):
    assert evaluate(source) == expected


def test_concatenation_type_and_helper():
    code = compile_source('"v" ~ attrs.n')
    assert code.type == "str"
    assert "js_str" in code.helpers
    # Pure string concatenation needs no helper.
    assert compile_source('"a" ~ dtypes.T').helpers == frozenset()


@pytest.mark.parametrize("source", ['"a" ~ shapes.X', '"a" ~ device.features', '"a" ~ [1, 2]'])
def test_concatenation_refuses_containers(source):
    assert "`~`" in compile_error(source).message


# ---------------------------------------------------------------------------------------------
# booleans, conditionals, comparisons


@pytest.mark.parametrize(
    "source, expected",
    [
        ("true and false", False),
        ("true and true", True),
        ("false or true", True),
        ("false or false", False),
        ("not false", True),
        ("not true and false", False),
        ("not (true and false)", True),
        ("true or false and false", True),
        ("(true or false) and false", False),
        ("not attrs.n > 2", False),
        ("not (attrs.n > 2) or true", True),
        ("flag and attrs.n == 3", True),
    ],
)
def test_logic(source, expected):
    assert evaluate(source) is expected


def test_logic_short_circuits_like_javascript():
    # The right operand would read a dimension that does not exist; it must not be evaluated.
    assert evaluate("false and dim(shapes.X, 9) == 1") is False
    assert evaluate("true or dim(shapes.X, 9) == 1") is True
    with pytest.raises(IndexError):
        evaluate("true and dim(shapes.X, 9) == 1")


@pytest.mark.parametrize(
    "source, n, expected",
    [
        ("1 if attrs.n > 2 else 2", 3, 1),
        ("1 if attrs.n > 2 else 2", 2, 2),
        ("1 if attrs.n == 1 else 2 if attrs.n == 2 else 3", 2, 2),
        ("1 if attrs.n == 1 else 2 if attrs.n == 2 else 3", 5, 3),
        ("(10 if attrs.n > 2 else 20) if flag else 30", 3, 10),
        ("1 if (attrs.n > 2 if flag else false) else 2", 3, 1),
        ('"big" if attrs.n > 2 else "small"', 1, "small"),
    ],
)
def test_conditional(source, n, expected):
    assert evaluate(source, attr_n=n) == expected


def test_conditional_kinds():
    assert compile_source("1 if flag else 2").type == "int"
    assert compile_source("1 if flag else 2.5").type == "float"
    assert compile_source('"a" if flag else "b"').type == "str"
    assert "different kinds" in compile_error('1 if flag else "a"').message


def test_conditional_needs_else():
    assert "`else`" in compile_error("1 if flag").message


@pytest.mark.parametrize(
    "source, n, expected",
    [
        ("1 < attrs.n < 4", 3, True),
        ("1 < attrs.n < 4", 5, False),
        # A chain means every pair holds (jinja2), not (0 < n) < 2, which would be true.
        ("0 < attrs.n < 2", 3, False),
        ("4 > attrs.n >= 3 > 1", 3, True),
        ("1 <= attrs.n <= 1", 1, True),
        ("attrs.n != 3", 3, False),
        ("attrs.n == 3.0", 3, True),
        ('dtypes.T == "f16"', 3, True),
        ('dtypes.T != "f32"', 3, True),
        ("flag == true", 3, True),
    ],
)
def test_comparisons_and_chains(source, n, expected):
    assert evaluate(source, attr_n=n) is expected


def test_comparison_is_boolean():
    assert compile_source("attrs.n < 2").type == "bool"


# ---------------------------------------------------------------------------------------------
# names and helpers


@pytest.mark.parametrize(
    "source, expected",
    [
        ("dim(shapes.X, 0)", 2),
        ("dim(shapes.X, 3)", 5),
        ("dim(shapes.X, -1)", 5),
        ("dim(shapes.X, -4)", 2),
        ("dim(shapes.X, attrs.n)", 5),  # a non-literal index goes through the runtime helper
        ("dim(shapes.X, attrs.n - 4)", 5),  # ... negative at run time
        ("dim(shapes.X, 1) * 2", 6),
        ("inner(shapes.X, 1)", 20),
        ("inner(shapes.X, 0)", 60),
        ("inner(shapes.X, 3)", 1),
        ("inner(shapes.X, -2)", 5),
        ("outer(shapes.X, 2)", 6),
        ("outer(shapes.X, 0)", 1),
        ("outer(shapes.X, -1)", 24),
        ("numel(shapes.X)", 120),
        ("numel([2, 3])", 6),
        ("rank(shapes.X)", 4),
        ("ranks.X", 4),
        ("sameShape(shapes.X, shapes.X)", True),
        ("sameShape(shapes.X, shapes.Y)", False),
        ("sameShape(shapes.X, [2, 3, 4, 5])", True),
        ('has(device.adapterInfo, "k")', True),
        ('has(device.adapterInfo, "subgroupMinSize")', False),
        ('device.adapterInfo.has("k")', True),
        ("device.adapterInfo.k", 7),
        ('device.features.has("shader-f16")', True),
        ('device.features.has("subgroups")', False),
        ('has(device.features, "shader-f16")', True),
        ("device.limits.maxComputeWorkgroupSizeX", 256),
        ("min(3)", 3),  # JS Math.min(3); Python's min(3) raises
        ("max(attrs.n)", 3),
        ("min(attrs.n + 1) * 2", 8),  # the single argument keeps its own precedence
        ("min(3, 1, 2)", 1),
        ("min(5, 4, 3, 2, 6)", 2),
        ("max(1, 5, 2, 4)", 5),
        ("max(attrs.n, 2.5)", 3),
        ("min(attrs.n, 2.5)", 2.5),
        ("floor(2.5)", 2),
        ("floor(-2.5)", -3),
        ("floor(7 / 2)", 3),
        ("ceil(2.1)", 3),
        ("ceil(-2.1)", -2),
        ("ceil(attrs.n / 2)", 2),
        ("ceilDiv(7, 2)", 4),
        ("ceilDiv(8, 2)", 4),
        ("ceilDiv(0, 4)", 0),
        ("ceilDiv(attrs.n, 2)", 2),
        ("pow2ceil(0)", 1),
        ("pow2ceil(1)", 1),
        ("pow2ceil(2)", 2),
        ("pow2ceil(3)", 4),
        ("pow2ceil(256)", 256),
        ("pow2ceil(257)", 512),
        ("pow2ceil(2.5)", 4),
        ('onnxDtypeCode("float16")', 10),
        ('onnxDtypeCode("float32")', 1),
        ("[attrs.n, 2]", (3, 2)),
        ("[1]", (1,)),
        ("[attrs.n * 2, dim(shapes.X, -1), 1]", (6, 5, 1)),
        ("reducedShape(shapes.X, 2)", (2, 3, 1, 1)),
        ("reducedShape(shapes.X, -1)", (2, 3, 4, 1)),
        ("reducedShape(shapes.X, 0)", (1, 1, 1, 1)),
        ("broadcastStride(shapes.X, shapes.X)", 1),
        ("broadcastStride([4, 5], shapes.X)", 1),
        ("broadcastStride([4, 1], shapes.X)", 5),  # element i of X reads (i / 5) % 4
        ("broadcastStride([3, 1, 1], shapes.X)", 20),
        ("broadcastStride([1], shapes.X)", 1),
        ("broadcastStride([3, 1, 5], shapes.X)", 0),  # broadcasts along an axis inside its run
        ("broadcastStride([6], shapes.X)", 0),  # does not broadcast
        ("broadcastStride([1, 2, 3, 4, 5], shapes.X)", 0),  # more axes than X
        ("broadcastStride([1, 2, 1, 5], [1, 2, 1, 5])", 1),  # a 1 against a 1 is no broadcast
    ],
)
def test_helpers(source, expected):
    value = evaluate(source)
    assert value == expected
    if isinstance(expected, (bool, str, tuple)):
        assert type(value) is type(expected), (value, expected)
    else:
        assert not isinstance(value, bool), value


def test_helper_result_kinds():
    assert compile_source("min(attrs.n, 2)").type == "int"
    assert compile_source("min(attrs.n, 2.5)").type == "float"
    assert compile_source("floor(attrs.eps)").type == "int"
    assert compile_source("[attrs.n, 2]").type == "list"
    assert compile_source("sameShape(shapes.X, shapes.Y)").type == "bool"
    assert compile_source('device.features.has("x")').type == "bool"
    assert compile_source("shapes.X").type == "shape"
    assert compile_source("reducedShape(shapes.X, attrs.n)").type == "shape"
    assert compile_source("broadcastStride([1], shapes.X)").type == "int"


def test_onnx_dtype_code_is_folded_at_compile_time():
    code = compile_source('onnxDtypeCode("float16")')
    assert code.is_constant and code.constant == 10 and code.python == "10"


def test_dim_out_of_range_fails_at_run_time():
    with pytest.raises(IndexError):
        evaluate("dim(shapes.X, 4)")
    with pytest.raises(IndexError):
        evaluate("dim(shapes.X, -5)")
    with pytest.raises(IndexError):
        evaluate("dim(shapes.X, attrs.n)", attr_n=7)


@pytest.mark.parametrize(
    "dtype, features, expected",
    [
        ("f32", frozenset(), True),
        ("f16", frozenset(), False),
        ("f16", frozenset({"shader-f16"}), True),
        ("f32", frozenset({"shader-f16"}), True),
    ],
)
def test_f16_ok(dtype, features, expected):
    code = compile_source("f16Ok(dtypes.T)")
    assert code.type == "bool"
    assert run(code, dtype_t=dtype, features=features) is expected


def test_f16_ok_inside_a_conjunction_keeps_its_meaning():
    # f16Ok compiles to an `or`: an enclosing `and` must not split it.
    source = 'f16Ok(dtypes.T) and dtypes.T == "f16"'
    assert evaluate(source, dtype_t="f16", features=frozenset()) is False
    assert evaluate(source, dtype_t="f32", features=frozenset()) is False
    assert evaluate(source, dtype_t="f16", features=frozenset({"shader-f16"})) is True
    assert evaluate("not f16Ok(dtypes.T)", dtype_t="f16", features=frozenset()) is True


def test_literal_expressions():
    """JSON values that are not strings are literals, not expression source."""
    for value, kind in ((5, "int"), (2.5, "float"), (True, "bool"), (False, "bool")):
        code = compile_expr(Expr(None, value, ORIGIN), SCOPE)
        assert code.type == kind and code.is_constant and eval(code.python) == value
    # A JSON string is source: "true" is the boolean, "\"f16\"" the string f16.
    assert evaluate("true") is True
    assert evaluate('"f16"') == "f16"


def test_locals_are_exactly_what_the_code_reads():
    code = compile_source('dim(shapes.X, 1) + attrs.n if device.features.has("a") else 0')
    assert code.locals == {"shape_x", "attr_n", "features"}
    assert compile_source("1 + 2").locals == frozenset()


# ---------------------------------------------------------------------------------------------
# compile errors: file, pointer, expression


@pytest.mark.parametrize(
    "source, fragment",
    [
        ("foo", "unknown name `foo`"),
        ("shapes.Z", "unknown name `shapes.Z`"),
        ("attrs.n + bar * 2", "unknown name `bar`"),
        ("device.limits.noSuchLimit", "unknown name `device.limits.noSuchLimit`"),
    ],
)
def test_unknown_name(source, fragment):
    error = compile_error(source)
    assert fragment in error.message
    assert "known here" in error.message and "shapes.X" in error.message


@pytest.mark.parametrize(
    "source, suggestion", [("shapes.x", "shapes.X"), ("attrs.nn", "attrs.n"), ("flga", "flag")]
)
def test_unknown_name_suggests_the_closest_known_one(source, suggestion):
    assert f"did you mean `{suggestion}`?" in compile_error(source).message


@pytest.mark.parametrize(
    "source, name", [("foo(1)", "foo"), ("pow2floor(3)", "pow2floor"), ("abs(attrs.n)", "abs")]
)
def test_unknown_function(source, name):
    message = compile_error(source).message
    assert f"unknown function `{name}`" in message
    assert "ceilDiv" in message  # lists what is known


@pytest.mark.parametrize(
    "source, fragment",
    [
        ("dim(shapes.X)", "`dim` takes 2 argument(s), got 1"),
        ("dim(shapes.X, 1, 2)", "`dim` takes 2 argument(s), got 3"),
        ("inner(shapes.X)", "`inner` takes 2"),
        ("numel(shapes.X, 1)", "`numel` takes 1"),
        ("rank()", "`rank` takes 1"),
        ("sameShape(shapes.X)", "`sameShape` takes 2"),
        ("min()", "`min` takes 1 or more"),
        ("floor(1, 2)", "`floor` takes 1"),
        ("ceilDiv(1)", "`ceilDiv` takes 2"),
        ("pow2ceil()", "`pow2ceil` takes 1"),
        ("has(device.features)", "`has` takes 2"),
        ('device.features.has("a", "b")', "`has` takes 1"),
        ("f16Ok()", "`f16Ok` takes 1"),
    ],
)
def test_wrong_arity(source, fragment):
    assert fragment in compile_error(source).message


@pytest.mark.parametrize(
    "source, fragment",
    [
        ("shapes.X + 1", "must be a number, got shape"),
        ("1 - shapes.X", "must be a number, got shape"),
        ('"a" * 2', "must be a number, got str"),
        ("-dtypes.T", "must be a number, got str"),
        ("true + 1", "must be a number, got bool"),
        ("not 3", "must be a boolean, got int"),
        ("attrs.n and true", "must be a boolean, got int"),
        ('true or "yes"', "must be a boolean, got str"),
        ("1 if attrs.n else 2", "must be a boolean, got int"),
        ('"a" < 1', "compares numbers, got str and int"),
        ("shapes.X < shapes.Y", "compares numbers"),
        ("dtypes.T == 1", "never true"),
        ("flag == 1", "never true"),
        ("shapes.X == shapes.Y", "use sameShape"),
        ("dim(attrs.n, 0)", "must be a shape"),
        ("dim(shapes.X, dtypes.T)", "must be a number"),
        ("numel(attrs.n)", "must be a shape"),
        ("sameShape(shapes.X, 3)", "must be a shape"),
        ('has(attrs.n, "a")', "must be a feature set"),
        ("device.features.has(1)", "looks up a string, got int"),
        ('shapes.X.has("a")', "needs a feature set"),
        ("f16Ok(1)", "takes a dtype"),
        ('onnxDtypeCode("float99")', "literal TensorProto type name"),
        ("onnxDtypeCode(dtypes.T)", "literal TensorProto type name"),
        ('["a", 1]', "must be a number"),
        ('max(1, "a")', "must be a number"),
        ("ceil(shapes.X)", "must be a number"),
    ],
)
def test_wrong_kind(source, fragment):
    assert fragment in compile_error(source).message


@pytest.mark.parametrize(
    "source", ["1 +", "(1", "1 2", "dim(shapes.X, 1", "attrs.", "1 +* 2", "", "{{ attrs.n }}"]
)
def test_syntax_error(source):
    assert "syntax error" in compile_error(source).message


@pytest.mark.parametrize(
    "source",
    [
        "shapes.X[0]",  # subscripts: use dim()
        "attrs.n | abs",  # filters
        "(1, 2)",  # tuples
        '{"a": 1}',  # dicts
        "1 in [1, 2]",  # membership: use has()
        "dim(shapes.X, i=1)",  # keyword arguments
        "shapes.X.foo(1)",  # method calls other than has()
    ],
)
def test_constructs_outside_the_language(source):
    compile_error(source)


def test_expected_kind():
    assert compile_source("attrs.n > 1", "bool").type == "bool"
    assert compile_source("attrs.n", ("int", "float")).type == "int"
    error = compile_error("attrs.n", "bool")
    assert "expected a value of kind bool, got int" in error.message
    with pytest.raises(ExprError, match=r"#/derive/value: expected a value of kind bool, got int: `1`"):
        compile_expr(Expr(None, 1, ORIGIN), SCOPE, "bool")


@pytest.mark.parametrize(
    "name, expected",
    [
        ("normalizationParamsOk", "normalization_params_ok"),
        ("WORKGROUP_SIZE", "workgroup_size"),
        ("X", "x"),
        ("inputMean", "input_mean"),
        ("input_var", "input_var"),
        ("group2Rows", "group2_rows"),
        ("class", "class_"),
        ("2d", "2d_"),
        ("a-b", "a_b"),
        ("RMSNormalization", "rms_normalization"),  # an acronym is one word
        ("SkipSimplifiedLayerNormalization", "skip_simplified_layer_normalization"),
    ],
)
def test_snake(name, expected):
    assert snake(name) == expected
