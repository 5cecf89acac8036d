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
from codegen.problems import CompileError
from codegen.resolve import resolve_op
from codegen.wgsl import render_op
from tests.test_codegen import TINY_MANIFEST, _tiny_repo

REPO = Path(__file__).resolve().parent.parent
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
    # One name for the workgroup size and for the fold width.
    sizes = set(re.findall(r"@workgroup_size\((\w+)\)", code))
    sizes |= set(re.findall(r'(?:workgroup|invocation)_main\("(\w+)"', code))
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
    manifests, templates = _tiny_repo(tmp_path, manifest=manifest)
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
    manifests, templates = _tiny_repo(tmp_path, template=template)
    shutil.copytree(LIBRARY, templates / "_lib")
    (rendered,) = render_op(resolve_op(load_manifests(manifests)[0]), templates)
    assert rendered.libraries == ("templates/_lib/pairs.wgsl.jinja",)
    (spec,) = rendered.specializations
    assert spec.interface.workgroup_size == "WORKGROUP_SIZE" and "scale_value(i, f32(x[i]));" in spec.wgsl
    assert "// y = x * alpha, one element an invocation." in spec.wgsl
