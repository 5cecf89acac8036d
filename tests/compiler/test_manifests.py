"""Manifests load in both dialects (inputs and outputs as a list, or keyed by name: docs/MANIFEST.md,
"Two dialects"), and every loading error is data that names the manifest file and the JSON pointer:
missing keys, bad bindings and buffers, invalid JSON, every hole in the schema, suggestions for
misspelt keys, values and names; every problem of every file reported, each once.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from codegen.manifest import load_manifest, load_manifests
from codegen.problems import CompileError
from codegen.resolve import resolve_op
from tests.compiler.compiler_support import (
    GENERATED,
    MANIFESTS,
    REPO,
    TEMPLATES,
    TINY_MANIFEST,
    problem_messages,
    write_manifest,
)


# ---------------------------------------------------------------------------------------------
# both dialects load


def test_the_three_manifests_load(ops):
    assert {
        "ai.onnx.BatchNormalization",
        "ai.onnx.GroupNormalization",
        "ai.onnx.InstanceNormalization",
    } <= set(ops)
    for op in ops.values():
        assert op.source == f"manifests/{op.id}/manifest.json"
        assert op.sha256 == hashlib.sha256((REPO / op.source).read_bytes()).hexdigest()


def _tensor(op, key):
    return next(t for t in op.tensors if t.key == key)


def _variant(op, id_):
    return next(v for v in op.variants if v.id == id_)


def test_list_dialect_batch_normalization(ops):
    op = ops["ai.onnx.BatchNormalization"]
    assert (op.domain, op.name, op.since_version) == ("ai.onnx", "BatchNormalization", 15)
    assert [(t.key, t.role) for t in op.inputs] == [
        ("x", "X"),
        ("scale", "scale"),
        ("b", "B"),
        ("inputMean", "input_mean"),
        ("inputVar", "input_var"),
    ]
    assert _tensor(op, "inputMean").role == "input_mean"
    y = _tensor(op, "y")
    assert y.is_output and y.role == "Y" and y.shape.source == "shapes.X" and y.rank.source == "ranks.X"
    assert _tensor(op, "scale").rank.literal == 1 and _tensor(op, "scale").rank.is_literal
    attributes = {a.name: a for a in op.attributes}
    assert attributes["epsilon"].default == 1e-05
    assert attributes["momentum"].default == 0.9 and attributes["momentum"].allowed is None
    assert attributes["training_mode"].allowed == (0,)
    assert dict(op.tunables) == {"WORKGROUP_SIZE": 256}
    # `constants` are the variant's named values.
    assert [d.name for d in _variant(op, "inference_scalar").derives] == ["scalar", "usesF16"]
    # A named binding set expands into the pass's bindings; `arg` gives the resource.
    bindings = _variant(op, "nc_inference_vec4").passes[0].bindings
    assert [(b.name, b.kind, b.resource, b.buffer) for b in bindings] == [
        ("x", "input", "x", "read-only-storage"),
        ("scale", "input", "scale", "read-only-storage"),
        ("bias", "input", "b", "read-only-storage"),
        ("input_mean", "input", "inputMean", "read-only-storage"),
        ("input_var", "input", "inputVar", "read-only-storage"),
        ("y", "output", "y", "storage"),
        ("params", "uniform", "params", "uniform"),
    ]
    assert [f.name for f in bindings[-1].fields] == ["count4", "channels4", "epsilon"]
    assert _variant(op, "nc_inference_vec4").passes[0].dispatch.form == "threads"


def test_list_dialect_group_normalization(ops):
    op = ops["ai.onnx.GroupNormalization"]
    splitk = _variant(op, "group_splitk")
    assert len(splitk.passes) == 2
    assert len(splitk.intermediates) == 1 and splitk.intermediates[0].id == "partials"
    assert splitk.intermediates[0].shape.source == "[groupRows * groupSplitCount, 4]"
    assert [b.kind for b in splitk.passes[0].bindings if b.name == "partials"] == ["intermediate"]
    # seed 002 writes one `when` as a plain string: one clause, pointing at the string itself.
    stash = _variant(op, "group_stash_f16_serial")
    assert len(stash.when) == 1
    assert stash.when[0].source == "groupStashF16Ok"
    assert stash.when[0].origin.pointer == f"/variants/{stash.order}/when"
    num_groups = next(a for a in op.attributes if a.name == "num_groups")
    assert num_groups.required and num_groups.default is None
    assert _variant(op, "group_subgroup").passes[0].subgroup_width == "portable"


def test_keyed_dialect_instance_normalization(ops):
    op = ops["ai.onnx.InstanceNormalization"]
    assert _tensor(op, "b").role == "B"
    assert _tensor(op, "input").role == "input" and _tensor(op, "output").is_output
    # `{default: v}` objects become plain defaults.
    assert dict(op.tunables)["WORKGROUP_SIZE"] == 1024
    assert next(a for a in op.attributes if a.name == "epsilon").default == 1e-05
    splitk = _variant(op, "plane_splitk_vec4")
    assert [p.id for p in splitk.passes] == ["partials", "combine", "apply"]
    assert [i.id for i in splitk.intermediates] == ["partials", "stats"]
    assert [d.name for d in splitk.passes[1].derives] == ["workgroupSize"]  # per-pass derive
    # Pool references by key, and the pool entry's own `name` wins (`input_2` binds as `input`).
    apply_bindings = splitk.passes[2].bindings
    assert [b.name for b in apply_bindings][:2] == ["input", "stats"]
    assert apply_bindings[0].origin.pointer == "/bindings/input_2"
    # `demoteWhen` and `requires` load.
    batched = _variant(op, "plane_batched_vec4")
    assert len(batched.demote_when) == 1 and "reportedNonWave32Adapter" in batched.demote_when[0].source
    assert batched.demote_when[0].origin.pointer == f"/variants/{batched.order}/demoteWhen/0"
    assert _variant(op, "plane_subgroup_vec4_scalar_io").required_features == ("subgroups",)
    assert _variant(op, "plane_subgroup").required_features == ()


def test_every_expression_of_every_manifest_compiles(ops):
    for op in ops.values():
        resolved = resolve_op(op)
        assert len(resolved.variants) == len(op.variants)
        assert [v.name for v in resolved.derives] and len(resolved.derives) == len(op.derives)
        for variant in resolved.variants:
            assert all(code.type == "bool" for _, code in variant.when + variant.demote_when)
            for p in variant.passes:
                assert {k for k, _ in p.dispatch} == {k for k, _ in p.ir.dispatch.values}


def test_report_lists_every_op_as_emitted_or_compiled_not_emitted(ops):
    report = (GENERATED / "REPORT.md").read_text()
    emitted_part, marker, skipped_part = report.partition("## Compiled but not emitted")
    for op in ops.values():
        ready = [v for v in op.variants if all((TEMPLATES / p.template).exists() for p in v.passes)]
        waiting = [v for v in op.variants if v not in ready]
        if ready:
            assert f"## {op.title} (" in emitted_part, f"{op.id} should be emitted"
            for variant in ready:
                assert f"| `{variant.id}` |" in emitted_part, f"{op.id} {variant.id} should be emitted"
        else:
            assert f"## {op.title} (" not in emitted_part
        if waiting:
            assert (
                marker
            ), f"{op.id} has variants without templates; REPORT.md lists none as compiled but not emitted"
            assert op.title in skipped_part
            for variant in waiting:
                for p in variant.passes:
                    if not (TEMPLATES / p.template).exists():
                        assert p.template in skipped_part, f"{op.id} {variant.id}: {p.template}"
        else:
            assert op.title not in skipped_part


# ---------------------------------------------------------------------------------------------
# loading errors name file and JSON pointer


def _problems(tmp_path: Path, data) -> list[str]:
    path = write_manifest(tmp_path, data)
    with pytest.raises(CompileError) as info:
        load_manifest(path, tmp_path)
    assert str(info.value) == "\n".join(problem_messages(info.value))
    return problem_messages(info.value)


def _bn() -> dict:
    return json.loads((MANIFESTS / "ai.onnx.BatchNormalization" / "manifest.json").read_text())


def _in() -> dict:
    return json.loads((MANIFESTS / "ai.onnx.InstanceNormalization" / "manifest.json").read_text())


FILE = "manifests/test.Broken/manifest.json"


def test_missing_variants(tmp_path):
    data = _bn()
    del data["variants"]
    assert _problems(tmp_path, data) == [f"{FILE}#/variants: required key is missing"]


def test_several_missing_keys_are_all_reported(tmp_path):
    problems = _problems(tmp_path, {"domain": "test", "inputs": []})
    assert problems == [
        f"{FILE}#/{key}: required key is missing" for key in ("name", "sinceVersion", "outputs", "variants")
    ]


def test_binding_set_that_does_not_exist(tmp_path):
    data = _bn()
    data["variants"][1]["passes"][0]["bindings"] = "noSuchSet"
    (problem,) = _problems(tmp_path, data)
    assert problem.startswith(
        f"{FILE}#/variants/1/passes/0/bindings: unknown binding set `noSuchSet`; known: "
    )
    assert "ncInferenceVec4" in problem  # lists the known sets (none is close)


def test_bad_buffer_type_in_a_binding_set(tmp_path):
    data = _bn()
    data["bindingSets"]["ncInferenceVec4"][5]["buffer"] = {"type": "write-only"}
    (problem,) = _problems(tmp_path, data)
    assert problem.startswith(
        f"{FILE}#/bindingSets/ncInferenceVec4/5/buffer/type: buffer type must be one of"
    )
    assert "'write-only'" in problem


def test_bad_buffer_type_inline_in_a_pass(tmp_path):
    data = _in()
    data["variants"][3]["passes"][0]["bindings"].append(
        {"name": "scale", "buffer": "storage-ish", "elementType": "f32"}
    )
    index = len(data["variants"][3]["passes"][0]["bindings"]) - 1
    problems = _problems(tmp_path, data)
    assert any(
        p.startswith(f"{FILE}#/variants/3/passes/0/bindings/{index}/buffer: buffer type must be one of")
        for p in problems
    ), problems


def test_bad_buffer_type_in_the_bindings_pool(tmp_path):
    data = _in()
    data["bindings"]["scale"]["buffer"] = "bogus"
    problems = _problems(tmp_path, data)
    # A pool entry is reported where it is written, however many passes use it.
    assert problems and all(p.startswith(f"{FILE}#/bindings/scale/buffer: ") for p in problems), problems
    assert any("buffer type must be one of" in p and "'bogus'" in p for p in problems), problems


def test_binding_not_in_the_pool(tmp_path):
    data = _in()
    data["variants"][0]["passes"][0]["bindings"].append("nosuch")
    index = len(data["variants"][0]["passes"][0]["bindings"]) - 1
    (problem,) = _problems(tmp_path, data)
    assert problem.startswith(
        f"{FILE}#/variants/0/passes/0/bindings/{index}: unknown pooled binding `nosuch`; known: bias, input, "
    )


def test_binding_to_an_unknown_resource(tmp_path):
    data = _bn()
    data["bindingSets"]["inferenceScalar"][2]["arg"] = "beta"
    (problem,) = _problems(tmp_path, data)
    assert (
        problem
        == f"{FILE}#/bindingSets/inferenceScalar/2/arg: unknown tensor or intermediate `beta`; known: b, inputMean, inputVar, scale, x, y"
    )


def test_input_bound_writable(tmp_path):
    data = _bn()
    data["bindingSets"]["inferenceScalar"][0]["buffer"] = {"type": "storage"}
    assert _problems(tmp_path, data) == [
        f"{FILE}#/bindingSets/inferenceScalar/0/buffer: input 'x' must be bound read-only"
    ]


def test_bad_uniform_field_type(tmp_path):
    data = _bn()
    data["bindingSets"]["ncInferenceVec4"][6]["struct"]["fields"][1]["type"] = "u64"
    (problem,) = _problems(tmp_path, data)
    assert problem.startswith(
        f"{FILE}#/bindingSets/ncInferenceVec4/6/struct/fields/1/type: uniform field type must be one of"
    )


def test_bad_dispatch(tmp_path):
    data = _bn()
    data["variants"][2]["passes"][0]["dispatch"] = {"threads": "numel(shapes.Y)"}
    assert _problems(tmp_path, data) == [
        f"{FILE}#/variants/2/passes/0/dispatch: a `threads` dispatch needs `workgroupSize`"
    ]


def test_output_without_shape(tmp_path):
    data = _bn()
    del data["outputs"][0]["shape"]
    assert _problems(tmp_path, data) == [f"{FILE}#/outputs/0/shape: required key is missing"]


def test_expression_that_is_not_a_string_or_number(tmp_path):
    data = _bn()
    data["derive"]["weird"] = [1, 2]
    (problem,) = _problems(tmp_path, data)
    assert (
        problem
        == f"{FILE}#/derive/weird: expected an expression (a string of expression source, a number or a boolean), got an array"
    )


def test_invalid_json_names_the_file_and_position(tmp_path):
    (problem,) = _problems(tmp_path, '{"domain": "test",\n "name": }')
    # A JSON syntax error is about the whole file (pointer ""): the line and column say where.
    assert problem.startswith(f"{FILE}#: not valid JSON: ")
    assert "line 2 column 10" in problem


def test_manifest_that_is_not_an_object(tmp_path):
    assert _problems(tmp_path, "[1, 2]") == [f"{FILE}#: expected a manifest (a JSON object), got an array"]


def test_load_manifests_collects_problems_of_every_file(tmp_path):
    write_manifest(tmp_path, "{", "test.A")
    data = _bn()
    del data["variants"]
    write_manifest(tmp_path, data, "test.B")
    with pytest.raises(CompileError) as info:
        load_manifests(tmp_path / "manifests")
    problems = problem_messages(info.value)
    assert len(problems) == 2
    assert problems[0].startswith("manifests/test.A/manifest.json#: not valid JSON")
    assert problems[1] == "manifests/test.B/manifest.json#/variants: required key is missing"


# ---------------------------------------------------------------------------------------------
# errors as data: the schema, every hole in it a located problem, each problem reported once


def test_the_docs_the_compiler_cites_are_in_the_repository():
    """Every `docs/NAME.md, "Section"` the compiler's sources cite names a file of docs/ and one of
    its headings; the manifest language is described in docs/MANIFEST.md, schema included."""
    cited = []
    for path in sorted((REPO / "codegen").glob("*.py")) + [REPO / "codegen" / "manifest.schema.json"]:
        text = " ".join(path.read_text().split())  # a citation may wrap over lines
        cited += [
            (path.name, doc, section)
            for doc, section in re.findall(r'docs/(\w+)\.md(?:,\s*|\s*\(\s*)"([^"]+)"', text)
        ]
    assert {doc for _, doc, _ in cited} >= {"MANIFEST"}, cited
    for source, doc, section in cited:
        headings = re.findall(r"^#+\s+(.+?)\s*$", (REPO / "docs" / f"{doc}.md").read_text(), re.M)
        assert any(
            h.lower().startswith(section.lower()) for h in headings
        ), f"{source} cites docs/{doc}.md, {section!r}: no such heading"
    manifest_doc = (REPO / "docs" / "MANIFEST.md").read_text()
    assert "codegen/manifest.schema.json" in manifest_doc


def test_every_manifest_fits_the_schema():
    from jsonschema import Draft202012Validator

    from codegen.schema import schema, schema_problems

    Draft202012Validator.check_schema(schema())
    for path in sorted(MANIFESTS.glob("*/manifest.json")):
        assert schema_problems(json.loads(path.read_text()), path.name) == [], path


def _branches(node):
    """Every `anyOf` list in the schema, with the JSON pointer it is at."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "anyOf":
                yield value
            yield from _branches(value)
    elif isinstance(node, list):
        for item in node:
            yield from _branches(item)


def test_every_schema_alternative_has_a_title_and_its_own_json_type():
    """schema.py reports the errors of the one alternative whose JSON type a value has, and names
    the alternatives by their title when none has it: both need this of the schema."""
    from codegen.schema import schema

    definitions = schema()["$defs"]

    def types_of(branch) -> set[str]:
        while "$ref" in branch and "type" not in branch:
            branch = definitions[branch["$ref"].rsplit("/", 1)[1]]
        declared = branch["type"]
        return {declared} if isinstance(declared, str) else set(declared)

    def titled_parents(node):
        if isinstance(node, dict):
            if "anyOf" in node:
                yield node
            for value in node.values():
                yield from titled_parents(value)
        elif isinstance(node, list):
            for item in node:
                yield from titled_parents(item)

    for parent in titled_parents(schema()):
        assert "title" in parent, parent
        seen: set[str] = set()
        for branch in parent["anyOf"]:
            types = types_of(branch)
            assert not types & seen, f"two alternatives of {parent['title']!r} take {types & seen}"
            seen |= types


def test_a_uniform_field_without_value_is_a_located_problem(tmp_path):
    """It was a KeyError with no location."""
    data = json.loads(json.dumps(TINY_MANIFEST))
    del data["variants"][0]["passes"][0]["bindings"][2]["struct"][0]["value"]
    assert _problems(tmp_path, data) == [
        f"{FILE}#/variants/0/passes/0/bindings/2/struct/0/value: required key is missing"
    ]


def test_an_intermediate_without_id_is_a_located_problem(tmp_path):
    """It was a KeyError with no location."""
    data = _in()
    index = next(i for i, v in enumerate(data["variants"]) if v.get("intermediates"))
    del data["variants"][index]["intermediates"][0]["id"]
    assert _problems(tmp_path, data) == [
        f"{FILE}#/variants/{index}/intermediates/0/id: required key is missing"
    ]


def test_requires_given_as_a_list_is_a_located_problem(tmp_path):
    """It was an AttributeError (`list.get`) with no location."""
    data = _in()
    index = next(i for i, v in enumerate(data["variants"]) if "requires" in v)
    data["variants"][index]["requires"] = ["subgroups"]
    assert _problems(tmp_path, data) == [
        f"{FILE}#/variants/{index}/requires: expected an object with `features` (a list of WebGPU feature names), got an array"
    ]


def test_an_unknown_key_suggests_the_closest_known_key(tmp_path):
    data = _in()
    data["variants"][0]["demoteWen"] = data["variants"][0].pop("demoteWhen")
    assert _problems(tmp_path, data) == [
        f"{FILE}#/variants/0/demoteWen: unknown key `demoteWen`; did you mean `demoteWhen`?"
    ]


def test_an_unknown_key_with_nothing_close_lists_the_keys(tmp_path):
    data = _bn()
    data["chunking"]["zzz"] = 1
    assert _problems(tmp_path, data) == [
        f"{FILE}#/chunking/zzz: unknown key `zzz`; keys here: description, batch, channels, perChannel, "
        "groupsAttribute, rows, repeatedRows, rowAxis, rowScratchBytes"
    ]


def _ln() -> dict:
    return json.loads((MANIFESTS / "ai.onnx.LayerNormalization" / "manifest.json").read_text())


def test_a_cut_by_rows_loads_as_bind_keys_and_its_axis(ops):
    """`rows` and `repeatedRows` name tensors by bind key or role; `rowAxis` is an attribute or a number."""
    layer = ops["ai.onnx.LayerNormalization"].chunking
    assert (layer.rows, layer.repeated_rows, layer.row_axis) == (("x", "y", "mean", "invStdDev"), (), "axis")
    assert layer.batch == layer.channels == layer.per_channel == ()
    skip = ops["com.microsoft.SkipLayerNormalization"].chunking
    assert skip.rows == ("input", "output", "mean", "inv_std_var", "input_skip_bias_sum")
    assert (skip.repeated_rows, skip.row_axis) == (("skip",), -1)
    assert ops["ai.onnx.BatchNormalization"].chunking.rows == ()


@pytest.mark.parametrize(
    "change, expected",
    [
        (
            {"rowAxis": "axes"},
            "#/chunking/rowAxis: unknown attribute `axes`; did you mean `axis`?",
        ),
        (
            {"rows": ["X", "Z"]},
            "#/chunking/rows/1: unknown tensor `Z`; known: B, InvStdDev, Mean, Scale, X, Y, b, invStdDev, mean, "
            "scale, x, y",
        ),
        (
            {"repeatedRows": ["Mean"]},
            "#/chunking/repeatedRows/0: `Mean` is in `rows` too: a tensor takes one cut",
        ),
        (
            {"batch": ["X", "Y"]},
            "#/chunking/rows: a cut by rows takes no `batch`: its pieces are ranges of rows, which already "
            "cover whole batch items",
        ),
        (
            {"rowAxis": None},
            "#/chunking/rows: needs `rowAxis`, where rows end: an attribute (`axis`) or an axis number (-1: "
            "the last)",
        ),
        ({"rows": None}, "#/chunking/rowAxis: needs `rows`, the tensors cut into ranges of rows"),
        ({"rows": []}, "#/chunking/rowAxis: needs `rows`, the tensors cut into ranges of rows"),
        (
            {"rows": None, "rowAxis": None, "rowScratchBytes": None},
            "#/chunking: names no cut: give `batch` (and maybe `channels`) or `rows` with `rowAxis`",
        ),
        (
            {"rows": None, "rowAxis": None, "rowScratchBytes": None, "channels": ["X"]},
            "#/chunking/channels: needs `batch`, the tensors cut along axis 0 first",
        ),
        ({"rowAxis": 1.5}, "#/chunking/rowAxis: expected a string or an integer, got a number"),
        (
            {"rows": None, "rowAxis": None},
            "#/chunking/rowScratchBytes: needs `rows`, the tensors cut into ranges of rows",
        ),
        ({"rowScratchBytes": 0}, "#/chunking/rowScratchBytes: 0 is less than the minimum of 1"),
    ],
    ids=[
        "unknown-attribute",
        "unknown-tensor",
        "in-both-lists",
        "beside-batch",
        "no-axis",
        "no-rows",
        "empty-rows",
        "no-cut",
        "channels-alone",
        "axis-type",
        "scratch-alone",
        "scratch-not-positive",
    ],
)
def test_chunking_problems_are_located(tmp_path, change, expected):
    """Every name in `chunking` refers to a tensor or an attribute, and it names exactly one cut:
    the runtime tries only that one, so a key of the other cut, or half of one, would be ignored."""
    data = _ln()
    for key, value in change.items():
        if value is None:
            del data["chunking"][key]
        else:
            data["chunking"][key] = value
    assert _problems(tmp_path, data) == [FILE + expected]


def test_a_misspelt_value_suggests_the_closest_allowed_value(tmp_path):
    data = _in()
    data["bindings"]["scale"]["buffer"] = "read-only-storag"
    (problem,) = _problems(tmp_path, data)
    assert problem == (
        f"{FILE}#/bindings/scale/buffer: buffer type must be one of 'read-only-storage', 'storage', 'uniform', "
        "got 'read-only-storag'; did you mean 'read-only-storage'?"
    )


def test_an_unknown_name_in_a_derive_suggests_the_closest_name(tmp_path):
    data = json.loads((MANIFESTS / "ai.onnx.GroupNormalization" / "manifest.json").read_text())
    data["derive"]["groupHidden"] = "groupChanelsPerGroup * groupSpatial"
    path = write_manifest(tmp_path, data)
    with pytest.raises(CompileError) as info:
        resolve_op(load_manifest(path, tmp_path))
    (problem,) = info.value.problems
    assert (
        problem.origin.pointer == "/derive/groupHidden"
        and problem.expression == "groupChanelsPerGroup * groupSpatial"
    )
    assert problem.message.startswith(
        "unknown name `groupChanelsPerGroup`; did you mean `groupChannelsPerGroup`? known here: "
    )


def test_a_name_that_is_no_identifier_is_a_located_problem(tmp_path):
    data = _bn()
    data["derive"]["2wide"] = "true"
    data["variants"][0]["id"] = "inference-scalar"
    assert _problems(tmp_path, data) == [
        f"{FILE}#/derive/2wide: the key `2wide` is not a name (letters, digits and `_`, not starting with a digit)",
        f"{FILE}#/variants/0/id: expected a name (letters, digits and `_`, not starting with a digit), got 'inference-scalar'",
    ]


def test_a_problem_of_a_pooled_binding_is_reported_once(tmp_path):
    """Every pass that uses the pool entry reached the same problem: it was reported once a pass."""
    data = _in()
    data["bindings"]["x"]["buffer"] = "storage"  # x binds the input `input`
    users = sum(
        p["bindings"].count("x")
        for v in data["variants"]
        for p in v["passes"]
        if isinstance(p["bindings"], list)
    )
    assert users > 1
    assert _problems(tmp_path, data) == [f"{FILE}#/bindings/x/buffer: input 'input' must be bound read-only"]


def test_a_tensor_whose_type_variable_does_not_exist(tmp_path):
    data = _in()
    data["inputs"]["scale"]["dtype"] = "U"
    assert _problems(tmp_path, data) == [f"{FILE}#/inputs/scale/dtype: unknown type variable `U`; known: T"]


def _node_breakages(node, path=()):
    """(path, new value or DELETE) for every way this test breaks one node of a manifest: a member
    deleted, and every value swapped for null, for a container of the other kind (an array for an
    object, else an object) and, unless it is one, for a string that is no valid expression."""
    if isinstance(node, dict):
        items = list(node.items())
    elif isinstance(node, list):
        items = list(enumerate(node))
    else:
        return
    for key, value in items:
        here = path + (key,)
        if isinstance(node, dict):
            yield here, _DELETE
        for other in (None, [] if isinstance(value, dict) else {}, "@"):
            if type(other) is not type(value):
                yield here, other
        yield from _node_breakages(value, here)


_DELETE = object()


def _broken(data, path, value):
    data = json.loads(json.dumps(data))
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    if value is _DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return data


def _list_dialect_sample() -> dict:
    """BatchNormalization cut down to its first variant and the binding set that uses."""
    data = _bn()
    data["variants"] = data["variants"][:1]
    used = data["variants"][0]["passes"][0]["bindings"]
    data["bindingSets"] = {used: data["bindingSets"][used]}
    return data


def _keyed_dialect_sample() -> dict:
    """InstanceNormalization cut down to one split-k variant (intermediates, three passes, per-pass
    derive, pool references and inline bindings), given `requires` and `demoteWhen` too, and the
    pool entries and derives that uses."""
    data = _in()
    # Its shared files' values written in (the sample is one file: every problem is located in it).
    shared = [json.loads((MANIFESTS / name).read_text()) for name in data.pop("include", [])]
    data["derive"] = {name: value for s in shared for name, value in s.get("derive", {}).items()} | data[
        "derive"
    ]
    (variant,) = [v for v in data["variants"] if v["id"] == "plane_splitk"]
    variant |= {"requires": {"features": []}, "demoteWhen": ["reportedNonWave32Adapter"]}
    data["variants"] = [variant]
    used = {b for v in data["variants"] for p in v["passes"] for b in p["bindings"] if isinstance(b, str)}
    data["bindings"] = {key: spec for key, spec in data["bindings"].items() if key in used}
    # Only the derives those read (directly or through other derives): fewer values, faster resolves.
    needed, text = set(), json.dumps([data["variants"], data["bindings"], data["outputs"]])
    while True:
        found = {name for name in data["derive"] if re.search(rf"\b{name}\b", text)} - needed
        if not found:
            break
        needed |= found
        text = " ".join(data["derive"][name] for name in found)
    data["derive"] = {name: value for name, value in data["derive"].items() if name in needed}
    return data


@pytest.mark.parametrize("sample", ["tiny", "list dialect", "keyed dialect"])
def test_every_schema_hole_is_a_located_problem(tmp_path, sample):
    """Break one node of a manifest at a time, every node, every way: loading and resolving either
    works or raises CompileError whose every problem points into the manifest; nothing else."""
    data = {
        "tiny": lambda: TINY_MANIFEST,
        "list dialect": _list_dialect_sample,
        "keyed dialect": _keyed_dialect_sample,
    }[sample]()
    path = write_manifest(tmp_path, data)
    resolve_op(load_manifest(path, tmp_path))  # the sample itself is fine
    tried = 0
    for where, value in _node_breakages(data):
        path.write_text(json.dumps(_broken(data, where, value)))
        tried += 1
        try:
            resolve_op(load_manifest(path, tmp_path))
        except CompileError as error:
            assert error.problems, where
            for problem in error.problems:
                assert problem.origin is not None and problem.origin.file == FILE, (
                    where,
                    value,
                    str(problem),
                )
        except Exception as error:  # noqa: BLE001: any other exception is the defect this test finds
            pytest.fail(
                f"breaking {'/'.join(map(str, where))} to {value!r} raised {type(error).__name__}: {error}"
            )
    assert tried > 100
