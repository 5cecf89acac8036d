"""The render stage: a template problem stops the build and points at the template line (naga
validation failures, in the build's process or its validation process; Jinja errors and syntax
errors; an imported macro's line; through conditionals, comments and filled lines), every problem
printed once; shader names; and each template read and parsed once, from the one render.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from codegen import build as builder
from codegen.build import build
from codegen.manifest import load_manifests
from codegen.problems import CompileError, Problem, TemplateLocation
from codegen.resolve import resolve_op
from tests.compiler.compiler_support import (
    MACRO_FILE,
    MANIFESTS,
    TEMPLATES,
    TINY_MANIFEST,
    TINY_TEMPLATE,
    problem_messages,
    run_cli,
    tiny_repo,
    with_macro,
)


# ---------------------------------------------------------------------------------------------
# naga validation failures stop the build and point at the template line


BROKEN_TEMPLATE = """\
{# A template with a type error on line 9; this comment and the blank line must not shift it. #}
@compute {{ shader.workgroup_size(value.WORKGROUP_SIZE) }}
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= params.count) {
        return;
    }

    let wrong: u32 = x[i];
    y[i] = x[i] * params.alpha;
}
"""


def test_naga_failure_names_template_line_and_specialization(tiny, device):
    (tiny.templates / "tiny.wgsl.jinja").write_text(BROKEN_TEMPLATE)
    with pytest.raises(CompileError) as info:
        build(tiny.manifests, tiny.templates, device=device)
    (problem,) = problem_messages(info.value)
    head = problem.splitlines()[0]
    assert (
        head
        == "templates/tiny.wgsl.jinja:9: naga rejected variant copy, pass main, specialization [x element type='f32', y element type='f32']:"
    )
    assert "wrong" in problem  # naga's own message follows


def test_naga_failure_found_in_the_validation_process(tiny):
    """Without a device of the caller's, naga runs in a process of its own (validate.NagaProcess);
    its messages point at the template line as the in-process validation's do."""
    (tiny.templates / "tiny.wgsl.jinja").write_text(BROKEN_TEMPLATE)
    with pytest.raises(CompileError) as info:
        build(tiny.manifests, tiny.templates)
    (problem,) = problem_messages(info.value)
    head = problem.splitlines()[0]
    assert (
        head
        == "templates/tiny.wgsl.jinja:9: naga rejected variant copy, pass main, specialization [x element type='f32', y element type='f32']:"
    )
    assert "wrong" in problem


def test_build_validated_in_its_own_process_is_the_build_on_the_callers_device(tiny, tiny_files):
    assert build(tiny.manifests, tiny.templates) == tiny_files


def test_validation_process_that_fails_is_a_problem(tiny, monkeypatch):
    from codegen import validate as validation

    monkeypatch.setattr(validation.sys, "executable", "/bin/false")  # exits 1 at once, reading nothing
    with pytest.raises(CompileError) as info:
        build(tiny.manifests, tiny.templates)
    assert problem_messages(info.value) == ["the validation process (naga) exited with status 1"]


def _fake_python(tmp_path, body):
    script = tmp_path / "fake-python"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


def test_validation_process_failure_quotes_what_it_printed(tiny, tmp_path, monkeypatch):
    from codegen import validate as validation

    monkeypatch.setattr(
        validation.sys, "executable", _fake_python(tmp_path, "echo 'no Vulkan driver found' >&2; exit 3")
    )
    with pytest.raises(CompileError) as info:
        build(tiny.manifests, tiny.templates)
    assert problem_messages(info.value) == [
        "the validation process (naga) exited with status 3; it printed: no Vulkan driver found"
    ]


def test_validation_process_that_cannot_start_is_a_problem(tiny, tmp_path, monkeypatch):
    from codegen import validate as validation

    monkeypatch.setattr(validation.sys, "executable", str(tmp_path / "no-such-python"))
    with pytest.raises(CompileError) as info:
        build(tiny.manifests, tiny.templates)
    (message,) = problem_messages(info.value)
    assert message.startswith("the validation process (naga) did not start: "), message


def test_validation_process_that_never_answers_is_stopped(tiny, tmp_path, monkeypatch):
    from codegen import validate as validation

    monkeypatch.setattr(validation.sys, "executable", _fake_python(tmp_path, "exec sleep 60"))
    monkeypatch.setattr(validation, "VALIDATION_TIMEOUT_S", 1)
    with pytest.raises(CompileError) as info:
        build(tiny.manifests, tiny.templates)
    assert problem_messages(info.value) == ["the validation process (naga) gave no answer in 1 s"]


def test_build_that_fails_before_validating_stops_the_validation_process(tiny, monkeypatch):
    from codegen import validate as validation

    started = []
    start = validation.NagaProcess.__init__

    def recorded(self):
        start(self)
        started.append(self)

    monkeypatch.setattr(validation.NagaProcess, "__init__", recorded)
    (tiny.templates / "tiny.wgsl.jinja").write_text("{% if %}\n")
    with pytest.raises(CompileError):
        build(tiny.manifests, tiny.templates)
    (naga,) = started
    assert naga.process.returncode is not None  # stopped and reaped, not left running


def test_naga_failure_line_after_a_multi_line_comment(tiny, device):
    template = BROKEN_TEMPLATE.replace(
        "{# A template with a type error on line 9; this comment and the blank line must not shift it. #}\n",
        "{# A template with a type error on line 10:\n   a comment over two lines, like the BatchNormalization templates'. #}\n",
    )
    (tiny.templates / "tiny.wgsl.jinja").write_text(template)
    with pytest.raises(CompileError) as info:
        build(tiny.manifests, tiny.templates, device=device)
    (problem,) = problem_messages(info.value)
    assert problem.startswith(
        "templates/tiny.wgsl.jinja:10: naga rejected variant copy"
    ), problem.splitlines()[0]


def test_naga_failure_in_a_conditional_template(tiny, device):
    manifest = json.loads(json.dumps(TINY_MANIFEST))
    manifest["typeConstraints"]["T"] = ["float32", "float16"]
    manifest["variants"][0]["derive"] = {"usesF16": 'dtypes.T == "f16"'}
    tiny_repo(tiny.root, manifest=manifest)
    template = (
        "@compute {{ shader.workgroup_size(value.WORKGROUP_SIZE) }}\n"  # 1
        "fn main(@builtin(global_invocation_id) gid: vec3<u32>) {\n"  # 2
        "    let i = gid.x;\n"  # 3
        "{% if usesF16 %}\n"  # 4
        "    let k = f16(params.alpha);\n"  # 5
        "    y[i] = x[i] * k + 1.0f;\n"  # 6: f16 + f32: only the f16 specialization is wrong
        "{% else %}\n"  # 7
        "    y[i] = x[i] * params.alpha;\n"  # 8
        "{% endif %}\n"  # 9
        "}\n"
    )
    (tiny.templates / "tiny.wgsl.jinja").write_text(template)
    with pytest.raises(CompileError) as info:
        build(tiny.manifests, tiny.templates, device=device)
    (problem,) = problem_messages(info.value)
    assert problem.startswith(
        "templates/tiny.wgsl.jinja:6: naga rejected variant copy, pass main, "
        "specialization [usesF16=True, x element type='f16', y element type='f16']:"
    ), problem


# ---------------------------------------------------------------------------------------------
# template problems: Jinja's and naga's, at the template line (an imported macro's too), from the
# one render


def _f16_tiny(tiny) -> None:
    """The tiny manifest with T in {f32, f16} and a variant value `usesF16`: two specializations."""
    manifest = json.loads(json.dumps(TINY_MANIFEST))
    manifest["typeConstraints"]["T"] = ["float32", "float16"]
    manifest["variants"][0]["derive"] = {"usesF16": 'dtypes.T == "f16"', "rows": "count"}
    tiny_repo(tiny.root, manifest=manifest)


def _resolved_tiny(tiny):
    (op,) = load_manifests(tiny.manifests)
    return resolve_op(op)


def _build_problem(tiny, device) -> Problem:
    with pytest.raises(CompileError) as info:
        build(tiny.manifests, tiny.templates, device=device)
    (problem,) = info.value.problems
    return problem


def test_naga_failure_inside_an_imported_macro_names_the_macro_line(tiny, device):
    """The old mapping marked only the pass's own template: a line a macro wrote had no line."""
    with_macro(tiny)
    problem = _build_problem(tiny, device)
    assert problem.template == TemplateLocation("templates/_lib/body.wgsl.jinja", 3)
    assert str(problem).startswith(
        "templates/_lib/body.wgsl.jinja:3: naga rejected variant copy, pass main, specialization ["
    )
    # The manifest side of it stays in the data: the pass that uses the template.
    assert str(problem.origin) == "manifests/test.Tiny/manifest.json#/variants/0/passes/0"
    assert problem.expression is None


def test_a_jinja_error_names_the_template_line(tiny, device):
    """Jinja's error used to lose its line: `template `tiny.wgsl.jinja`: 'usesF61' is undefined`."""
    _f16_tiny(tiny)
    template = TINY_TEMPLATE.replace("    let i = gid.x", "{% if usesF61 %}\n{% endif %}\n    let i = gid.x")
    (tiny.templates / "tiny.wgsl.jinja").write_text(template)
    problem = _build_problem(tiny, device)
    assert problem.template == TemplateLocation("templates/tiny.wgsl.jinja", 3)
    # Both specializations fail the same way: one problem, naming the first and counting the rest.
    assert str(problem) == (
        "templates/tiny.wgsl.jinja:3: Jinja failed rendering variant copy, pass main, "
        "specialization [x element type='f32', y element type='f32'] and 1 more: 'usesF61' is undefined; did you mean `usesF16`?"
    )


def test_a_jinja_syntax_error_names_the_template_line(tiny, device):
    (tiny.templates / "tiny.wgsl.jinja").write_text(
        TINY_TEMPLATE.replace("    let i = gid.x", "{% if %}\n    let i = gid.x")
    )
    problem = _build_problem(tiny, device)
    assert (
        str(problem)
        == "templates/tiny.wgsl.jinja:3: Jinja syntax error: Expected an expression, got 'end of statement block'"
    )


def test_a_jinja_error_inside_an_imported_macro_names_the_macro_line(tiny, device):
    with_macro(tiny, macro=MACRO_FILE.replace("    let wrong: u32 = x[i];", "    let wrong = {{ nosuch }};"))
    problem = _build_problem(tiny, device)
    assert problem.template == TemplateLocation("templates/_lib/body.wgsl.jinja", 3)
    assert str(problem).endswith(": 'nosuch' is undefined")


def test_a_syntax_error_in_an_imported_macro_file_names_its_line(tiny, device):
    with_macro(tiny, macro=MACRO_FILE.replace("    let wrong: u32 = x[i];", "    {% if %}"))
    problem = _build_problem(tiny, device)
    assert problem.template == TemplateLocation("templates/_lib/body.wgsl.jinja", 3)
    assert "Jinja syntax error: Expected an expression" in problem.message


def test_a_number_read_through_jinja_names_the_line(tiny, device):
    _f16_tiny(tiny)
    (tiny.templates / "tiny.wgsl.jinja").write_text(
        TINY_TEMPLATE.replace("    let i = gid.x", "{% if rows > 1 %}\n{% endif %}\n    let i = gid.x")
    )
    problem = _build_problem(tiny, device)
    assert str(problem).startswith(
        "templates/tiny.wgsl.jinja:3: the template reads `rows` through Jinja, but it is a number"
    )


def test_the_line_map_follows_conditionals_comments_and_macros(tiny):
    """Every line of every specialization's body, mapped to the template line that wrote it."""
    _f16_tiny(tiny)
    with_macro(
        tiny,
        macro="{% macro scale(t) %}\n    let k = {{ t }}(params.alpha);\n{% endmacro %}\n",
        template=(
            '{% from "_lib/body.wgsl.jinja" import scale %}\n'  # 1
            "{# a comment\n   over two lines #}\n"  # 2, 3
            "@compute {{ shader.workgroup_size(value.WORKGROUP_SIZE) }}\n"  # 4
            "fn main(@builtin(global_invocation_id) gid: vec3<u32>) {\n"  # 5
            "{% if usesF16 %}\n"  # 6
            "{{ scale('f16') }}"  # 7: the macro writes its line 2; no newline of its own after it
            "{% else %}\n"  # 7
            "{{ scale('f32') }}"  # 8
            "{% endif %}\n"  # 8
            "    y[gid.x] = x[gid.x] * k;\n"  # 9
            "}\n"  # 10
        ),
    )
    from codegen.wgsl import render_op

    (item,) = render_op(_resolved_tiny(tiny), tiny.templates)
    for spec in item.specializations:
        body = spec.wgsl.splitlines()[spec.body_first_line - 1 :]
        lines = [(str(where) if where else None) for where in spec.line_map[: len(body)]]
        assert lines == [
            "templates/tiny.wgsl.jinja:4",
            "templates/tiny.wgsl.jinja:5",
            "templates/_lib/body.wgsl.jinja:2",
            "templates/tiny.wgsl.jinja:9",
            "templates/tiny.wgsl.jinja:10",
        ], (spec.key, body)
        assert "\ue000" not in spec.wgsl


def test_shader_names_are_template_and_deciding_values_and_unique_without_counters(built):
    """Every shader file is named by its template's stem and the values that tell its
    specializations apart; where two texts would share a name, the later adds its variant and pass."""
    files = built
    names = [path for path in files if "/shaders/" in path]
    assert len(names) == len(set(names)) > 700
    assert not any("#" in path for path in names)
    assert "group_normalization/shaders/norm-row-stats.combine-subgroups-f32.wgsl" in names
    assert "group_normalization/shaders/norm-row-stats.f32.group-subgroup-main.wgsl" in names


def test_fill_lines_packs_whole_statements_up_to_the_width():
    """The `fill_lines` filter (unrolled statements): whole lines joined by a space, greedily, never
    past the width, never split; a comment, a blank line or a change of indentation breaks the fill."""
    from codegen.wgsl import fill_lines

    text = (
        "".join(f"    s{j} += a[{j}u];\n" for j in range(12))
        + "    // note\n    t = 1;\n        u = 2;\n    v = 3;\n"
    )
    assert fill_lines(text, width=40) == (
        "    s0 += a[0u]; s1 += a[1u];\n"  # 29 columns: a third statement would make 42
        "    s2 += a[2u]; s3 += a[3u];\n"
        "    s4 += a[4u]; s5 += a[5u];\n"
        "    s6 += a[6u]; s7 += a[7u];\n"
        "    s8 += a[8u]; s9 += a[9u];\n"
        "    s10 += a[10u]; s11 += a[11u];\n"
        "    // note\n"
        "    t = 1;\n"
        "        u = 2;\n"
        "    v = 3;\n"
    )
    assert (
        fill_lines("    a = 1;\n    b = 2;") == "    a = 1;\n    b = 2;"
    )  # a last line without newline stays as it is
    long = "    x = " + "1 + " * 30 + "1;\n"
    assert fill_lines(long + long) == long + long  # a line is never split, and two long ones stay apart


def test_fill_lines_keeps_a_mark_when_the_first_line_has_none():
    """A line whose newline came from a value carries no mark; the line it is filled into takes the
    mark of the first joined statement that has one, so the line map does not lose it."""
    from codegen.wgsl import _MARK_CLOSE, _MARK_OPEN, fill_lines

    def mark(line):
        return f"{_MARK_OPEN}t.wgsl.jinja:{line}{_MARK_CLOSE}"

    text = f"    a = 1;\n    b = 2;{mark(6)}\n    c = 3;{mark(7)}\n"
    assert fill_lines(text) == f"    a = 1; b = 2; c = 3;{mark(6)}\n"


def test_filled_lines_map_to_their_first_statement(tiny):
    """A filled line keeps the template line of its first statement: naga's errors still point there."""
    _f16_tiny(tiny)
    (tiny.templates / "tiny.wgsl.jinja").write_text(
        "@compute {{ shader.workgroup_size(value.WORKGROUP_SIZE) }}\n"  # 1
        "fn main(@builtin(global_invocation_id) gid: vec3<u32>) {\n"  # 2
        "    var s = 0.0;\n"  # 3
        "{% filter fill_lines %}\n"  # 4
        "{% for j in range(30) %}\n"  # 5
        "    s += x[gid.x + {{ j }}u];\n"  # 6
        "{% endfor %}\n"  # 7
        "{% endfilter %}\n"  # 8
        "    y[gid.x] = s * params.alpha;\n"  # 9
        "}\n"  # 10
    )
    from codegen.wgsl import render_op

    (item, *_) = render_op(_resolved_tiny(tiny), tiny.templates)
    spec = item.specializations[0]
    body = spec.wgsl.splitlines()[spec.body_first_line - 1 :]
    filled = [line for line in body if line.startswith("    s += ")]
    assert len(filled) == 8 and all(len(line) <= 100 for line in filled)
    assert " ".join(line.strip() for line in filled) == " ".join(f"s += x[gid.x + {j}u];" for j in range(30))
    lines = [str(where) for where in spec.line_map[: len(body)]]
    assert lines == [
        "templates/tiny.wgsl.jinja:1",
        "templates/tiny.wgsl.jinja:2",
        "templates/tiny.wgsl.jinja:3",
    ] + ["templates/tiny.wgsl.jinja:6"] * 8 + ["templates/tiny.wgsl.jinja:9", "templates/tiny.wgsl.jinja:10"]


def _files_opened_under(folder: Path, monkeypatch) -> list[str]:
    """Record, from now on, every file under `folder` that is opened (Path.read_text and Jinja's
    loader both come through one of the two)."""
    import builtins

    folder = folder.resolve()
    opened: list[str] = []
    real_open = io.open

    def recording_open(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and folder in Path(file).resolve().parents:
            opened.append(Path(file).resolve().relative_to(folder).as_posix())
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", recording_open)
    monkeypatch.setattr(io, "open", recording_open)
    return opened


def test_rendering_reads_each_template_once(tiny, monkeypatch):
    """The template was read twice (once to find its variables, once by Jinja's loader)."""
    from codegen.wgsl import render_op

    _f16_tiny(tiny)
    with_macro(tiny, macro=MACRO_FILE.replace("    let wrong: u32 = x[i];\n", ""))
    resolved = _resolved_tiny(tiny)
    opened = _files_opened_under(tiny.templates, monkeypatch)
    (item,) = render_op(resolved, tiny.templates)
    assert len(item.specializations) == 2
    assert sorted(opened) == ["_lib/body.wgsl.jinja", "tiny.wgsl.jinja"]


def test_each_template_is_parsed_once_for_every_op_of_a_build(monkeypatch):
    """The ops of a build share one Jinja environment (wgsl._shared_environment), and Jinja
    compiles the tree parsed for the variable analysis: a template was parsed once an op that
    used it, and once more to compile it."""
    import jinja2

    from codegen import wgsl
    from codegen.sources import read_snapshot

    wgsl._shared_environment.cache_clear()
    parsed = []
    parse = jinja2.Environment._parse

    def counted(self, source, name, filename):
        parsed.append(name)
        return parse(self, source, name, filename)

    monkeypatch.setattr(jinja2.Environment, "_parse", counted)
    emitted, _ = builder._rendered_ops(MANIFESTS, TEMPLATES, (), read_snapshot(MANIFESTS, TEMPLATES, {}))
    assert len(emitted) > 1 and any(name.startswith("_lib/") for name in parsed)
    assert sorted(parsed) == sorted(set(parsed))


def test_unmark_reads_each_distinct_line_once():
    """`_unmark` keeps each marked line it has read; a line whose newline came from a value takes
    the next mark's location, a last line without a newline none."""
    from codegen.wgsl import _MARK_CLOSE, _MARK_OPEN, _unmark

    marked = f"a{_MARK_OPEN}t.jinja:1{_MARK_CLOSE}\nvalue\nb{_MARK_OPEN}t.jinja:2{_MARK_CLOSE}\ntail"
    one, two = TemplateLocation("templates/t.jinja", 1), TemplateLocation("templates/t.jinja", 2)
    lines: dict = {}
    assert _unmark(marked, "templates", lines) == ("a\nvalue\nb\ntail", (one, two, two, None))
    assert len(lines) == 4
    assert _unmark(marked, "templates", lines) == _unmark(marked, "templates")


def test_validation_neither_reads_nor_renders_a_template(tiny, device, monkeypatch):
    """naga's line is mapped through the render's own line map: validate used to read the template
    again and render a marked copy of it to find the line."""
    import jinja2

    from codegen.validate import validate
    from codegen.wgsl import render_op

    (tiny.templates / "tiny.wgsl.jinja").write_text(BROKEN_TEMPLATE)
    rendered = list(render_op(_resolved_tiny(tiny), tiny.templates))
    opened = _files_opened_under(tiny.templates, monkeypatch)

    def no_rendering(*args, **kwargs):
        raise AssertionError("validate rendered a template")

    monkeypatch.setattr(jinja2.Template, "render", no_rendering)
    monkeypatch.setattr(jinja2.Environment, "from_string", no_rendering)
    with pytest.raises(CompileError) as info:
        validate(rendered, device=device)
    (problem,) = info.value.problems
    assert problem.template == TemplateLocation("templates/tiny.wgsl.jinja", 9)
    assert opened == []


def test_cli_prints_every_problem_once_at_its_location(tiny):
    with_macro(tiny)
    (tiny.manifests / "test.Broken").mkdir()
    (tiny.manifests / "test.Broken" / "manifest.json").write_text(
        json.dumps({**TINY_MANIFEST, "name": "Broken", "variants": [{"id": "v", "requires": []}]})
    )
    result = run_cli(str(tiny.manifests), str(tiny.root / "out"), cwd=tiny.root)
    assert result.returncode == 2, result.stderr
    lines = [
        line for line in result.stderr.splitlines() if not line.startswith(("Forcing backend", "error: XDG"))
    ]
    assert lines == [
        "codegen failed: 1 problem",
        "  manifests/test.Broken/manifest.json#/variants/0/requires: expected an object with `features` (a list of WebGPU feature names), got an array",
    ]
