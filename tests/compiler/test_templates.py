"""templates/ and its macro library templates/_lib/ (docs/TEMPLATES.md): the naming convention,
which file is an op template, and what the compiler does with the library.

Kernel results do not depend on these: they are the tests of the other files. These pin what a
template author must keep: one name for the workgroup size, the fold width by name, snake_case
declarations, the notes as // comments, and no library file used as a pass.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path

import pytest

from codegen.manifest import load_manifests
from codegen.problems import CompileError, TemplateLocation
from codegen.resolve import resolve_op
from codegen.wgsl import KeyName, render_op
from tests.compiler.compiler_support import TINY_MANIFEST, tiny_repo

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "templates"
LIBRARY = TEMPLATES / "_lib"
# <op>-<kind>: the op's package name in kebab case; `norm-` for a template several ops share. An
# op that is another op less an input runs that op's templates, their prefix unchanged
# (docs/TEMPLATES.md): com.microsoft GroupNorm is SkipGroupNorm without the skip.
OP_PREFIXES = {
    "batch-normalization": {"BatchNormalization"},
    "group-normalization": {"GroupNormalization"},
    "instance-normalization": {"InstanceNormalization"},
    "skip-group-norm": {"SkipGroupNorm", "GroupNorm"},
}
SHARED_PREFIX = "norm"


def _shaders_by_op() -> dict[str, set[str]]:
    """Template file name -> the ops (manifest `name`) whose passes name it."""
    found: dict[str, set[str]] = {}
    for path in sorted((REPO / "manifests").glob("*/manifest.json")):
        text = path.read_text()
        name = json.loads(text)["name"]
        for shader in re.findall(r'"shader":\s*"([^"]+)"', text):
            found.setdefault(shader, set()).add(name)
    return found


def _code(text: str) -> str:
    """Template text without Jinja comments and WGSL // comments."""
    return re.sub(r"//[^\n]*", "", re.sub(r"\{#.*?#\}", "", text, flags=re.S))


OP_TEMPLATES = sorted(p.name for p in TEMPLATES.glob("*.wgsl.jinja"))
ALL_TEMPLATES = OP_TEMPLATES + sorted(f"_lib/{p.name}" for p in LIBRARY.glob("*.wgsl.jinja"))


def test_every_op_template_is_a_pass_of_its_op_and_no_library_is():
    used = _shaders_by_op()
    assert set(used) == set(OP_TEMPLATES), "a template no manifest names, or a manifest naming a missing one"
    for name, ops in used.items():
        prefix = re.fullmatch(r"([a-z0-9-]+?)-[a-z0-9-]+\.wgsl\.jinja", name)
        assert prefix, name
        owner = next(
            (p for p in sorted(OP_PREFIXES, key=len, reverse=True) if name.startswith(p + "-")), None
        )
        if owner is None:
            assert (
                name.startswith(SHARED_PREFIX + "-") and len(ops) > 1
            ), f"{name}: no op prefix, and not shared"
        else:
            assert ops == OP_PREFIXES[owner], f"{name} is named for {owner} but used by {sorted(ops)}"


@pytest.mark.parametrize("name", OP_TEMPLATES)
def test_op_template_conventions(name):
    text = (TEMPLATES / name).read_text()
    code = _code(text)
    # The notes are // comments, which reach the rendered shader; Jinja comments do not.
    assert "{#" not in text, f"{name}: write the notes as // comments"
    assert re.search(r"^// ", text, re.M), f"{name}: no notes"
    # One name for the workgroup size and for the fold width; the size is declared, never written.
    assert "@workgroup_size" not in code, f"{name}: declare the workgroup size with shader.workgroup_size"
    sizes = set(re.findall(r"shader\.workgroup_size\(value\.(\w+)\)", code))
    sizes |= set(re.findall(r"(?:workgroup|invocation)_main\(value\.(\w+)", code))
    sizes |= {"WORKGROUP_SIZE"} if "threads_main(" in code else set()  # _lib/pairs: threads dispatch
    assert sizes and sizes <= {"workgroupSize", "WORKGROUP_SIZE"}, f"{name}: workgroup size {sizes}"
    assert "65535" not in code, f"{name}: use DISPATCH_FOLD_WIDTH"


@pytest.mark.parametrize("name", ALL_TEMPLATES)
def test_declarations_are_snake_case(name):
    code = _code((TEMPLATES / name).read_text())
    declared = set(re.findall(r"\b(?:let|var|fn)\s+([A-Za-z_]\w*)", code))
    declared |= set(re.findall(r"\{%-? (?:set|macro) (\w+)", code))
    camel = sorted(d for d in declared if re.search(r"[a-z][A-Z]", d))
    assert not camel, f"{name}: camelCase is for manifest values; declare {camel} in snake_case"


def test_a_library_file_is_not_an_op_template(tmp_path):
    manifest = copy.deepcopy(TINY_MANIFEST)
    manifest["variants"][0]["passes"][0]["shader"] = "_lib/pairs.wgsl.jinja"
    manifests, templates = tiny_repo(tmp_path, manifest=manifest)
    shutil.copytree(LIBRARY, templates / "_lib")
    op = resolve_op(load_manifests(manifests)[0])
    with pytest.raises(CompileError, match=r"`_lib/pairs.wgsl.jinja` is a macro library"):
        render_op(op, templates)


def test_a_template_renders_library_macros_and_records_the_libraries(tmp_path):
    template = (
        '{% from "_lib/pairs.wgsl.jinja" import threads_main %}\n'
        "// y = x * alpha, one element an invocation.\n"
        "fn scale_value(i: u32, v: f32) {\n"
        "    y[i] = v * params.alpha;\n"
        "}\n\n"
        '{{ threads_main("scale_value", "params.count", "f32") }}\n'
    )
    manifests, templates = tiny_repo(tmp_path, template=template)
    shutil.copytree(LIBRARY, templates / "_lib")
    (rendered,) = render_op(resolve_op(load_manifests(manifests)[0]), templates)
    assert rendered.libraries == ("templates/_lib/pairs.wgsl.jinja",)
    (spec,) = rendered.specializations
    assert spec.interface.workgroup_size == "WORKGROUP_SIZE" and "scale_value(i, f32(x[i]));" in spec.wgsl
    assert "// y = x * alpha, one element an invocation." in spec.wgsl


# ---------------------------------------------------------------------------------------------
# What a template declares (codegen/shader_facts.py): the values it reads through `value`, and
# its workgroup size, workgroup arrays, subgroup and f16 use through `shader`. The compiler
# writes the declarations and the interface record from these, and reads nothing back from text.

VALUES_TEMPLATE = """\
{% if usesF16 %}
{{ shader.workgroup_array("staged", "vec4<f32>", value.rows, 2) }}
{% endif %}
@compute {{ shader.workgroup_size(value.WORKGROUP_SIZE) }}
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= {{ value.rows }} || i >= {{ value.span }}) {
        return;
    }
    y[i] = x[i] * params.alpha;
}
"""


def _values_tiny(tmp_path, template: str = VALUES_TEMPLATE, derive: dict | None = None):
    """The tiny op with T in {f32, f16} (two specializations) and request-dependent variant values
    `rows` and `span`."""
    manifest = copy.deepcopy(TINY_MANIFEST)
    manifest["typeConstraints"]["T"] = ["float32", "float16"]
    manifest["variants"][0]["derive"] = derive or {
        "usesF16": 'dtypes.T == "f16"',
        "rows": "count",
        "span": "count * 2",
    }
    manifests, templates = tiny_repo(tmp_path, template=template, manifest=manifest)
    (rendered,) = render_op(resolve_op(load_manifests(manifests)[0]), templates)
    return rendered


def _by_uses_f16(rendered):
    position = rendered.key_names.index(KeyName("usesF16"))
    return {spec.key[position]: spec for spec in rendered.specializations}


def test_values_a_template_reads_are_overrides_or_params_fields(tmp_path):
    """`span` is request-dependent and sizes nothing: a Params field, read as params.span. `rows`
    sizes a workgroup array in the f16 specialization only, so it is an override in both (the
    render found that and rendered the f32 one again), and the record names it as the array's size."""
    rendered = _values_tiny(tmp_path)
    assert [(u.name, u.type, u.declared) for u in rendered.scope_uniforms] == [("span", "u32", False)]
    specs = _by_uses_f16(rendered)
    for spec in specs.values():
        assert "if (i >= rows || i >= params.span) {" in spec.wgsl
        assert spec.interface.overrides == (("WORKGROUP_SIZE", "u32"), ("rows", "u32"))
        assert "override rows: u32;\n" in spec.wgsl and "override span" not in spec.wgsl
        assert spec.interface.params == (
            ("count", "u32"),
            ("alpha", "f32"),
            ("span", "u32"),
            ("_pad0", "u32"),
        )
        assert spec.interface.workgroup_size == "WORKGROUP_SIZE" and spec.facts.reads >= {"rows", "span"}
    assert specs[True].interface.workgroup_arrays == ((16, ("rows", 2)),)
    assert "var<workgroup> staged: array<vec4<f32>, rows * 2>;\n" in specs[True].wgsl
    assert specs[False].interface.workgroup_arrays == () and "staged" not in specs[False].wgsl
    assert specs[True].facts.workgroup_arrays[0].variable == "staged"


def test_declared_f16_and_subgroup_use_reach_the_header_and_the_record(tmp_path):
    template = VALUES_TEMPLATE.replace(
        "@compute", "{% do shader.uses_subgroups() %}\n{% do shader.uses_f16() %}\n@compute"
    )
    for spec in _by_uses_f16(_values_tiny(tmp_path, template)).values():
        assert spec.wgsl.startswith("enable f16;\n"), spec.key  # the f32 one too: its code says it names f16
        assert spec.interface.features == (("f16", "shader-f16"),) and spec.interface.uses_subgroups
    plain = _by_uses_f16(_values_tiny(tmp_path))
    assert not plain[False].wgsl.startswith("enable f16;") and plain[False].interface.features == ()
    assert plain[True].interface.features == (("f16", "shader-f16"),)  # its bindings hold f16
    assert not any(spec.interface.uses_subgroups for spec in plain.values())


@pytest.mark.parametrize(
    "change, message",
    [
        (
            ("{{ value.span }}", "{{ value.spam }}"),
            "`value.spam`: the pass has no numeric value spam; did you mean `value.span`?",
        ),
        (
            ("{{ value.span }}", "{{ value.usesF16 }}"),
            "usesF16 is a specialization value (a string or boolean): write `{{ usesF16 }}`",
        ),
        (
            ("value.rows, 2)", "'rows', 2)"),
            "a size of workgroup array staged must be `value.NAME` or a positive integer literal, got 'rows'",
        ),
        (('"vec4<f32>"', '"Stats"'), "workgroup element type 'Stats' is not one of"),
    ],
    ids=["unknown-value", "specialization-value", "size-as-text", "unknown-element-type"],
)
def test_a_bad_declaration_names_the_template_line(tmp_path, change, message):
    with pytest.raises(CompileError) as info:
        _values_tiny(tmp_path, VALUES_TEMPLATE.replace(*change))
    (problem,) = info.value.problems
    line = next(
        i for i, text in enumerate(VALUES_TEMPLATE.replace(*change).splitlines(), 1) if change[1] in text
    )
    assert problem.template == TemplateLocation("templates/tiny.wgsl.jinja", line), str(problem)
    assert message in problem.message, problem.message


@pytest.mark.parametrize(
    "change, found",
    [
        (
            (
                "@compute {{ shader.workgroup_size(value.WORKGROUP_SIZE) }}",
                "@compute @workgroup_size(WORKGROUP_SIZE)",
            ),
            "none",
        ),
        (("@compute {{", "{{ shader.workgroup_size(64) }}\n@compute {{"), "64, WORKGROUP_SIZE"),
    ],
    ids=["written-not-declared", "two-sizes"],
)
def test_a_shader_declares_exactly_one_workgroup_size(tmp_path, change, found):
    with pytest.raises(CompileError) as info:
        _values_tiny(tmp_path, VALUES_TEMPLATE.replace(*change))
    (problem,) = info.value.problems
    assert (
        "a shader declares one workgroup size, with `{{ shader.workgroup_size(value.NAME) }}`"
        in problem.message
    )
    assert problem.message.endswith(f"this one declared {found}"), problem.message


@pytest.mark.parametrize("reserved", ["value", "shader"])
def test_a_pass_value_may_not_take_the_name_of_a_template_object(tmp_path, reserved):
    derive = {"usesF16": 'dtypes.T == "f16"', "rows": "count", "span": "count", reserved: "count"}
    with pytest.raises(CompileError) as info:
        _values_tiny(tmp_path, derive=derive)
    assert any(
        f"the pass has a value named `{reserved}`, the name of the template's `{reserved}` object"
        in p.message
        for p in info.value.problems
    ), [str(p) for p in info.value.problems]
