"""Tests of the compiler as a whole: the golden test, what a build writes and where, what generated
code may hold, and the command line.

The golden test rebuilds everything in memory and compares it byte for byte with the committed
`generated/`; when it fails, regenerate with `python -m codegen manifests/ generated/` (and review
the diff). The compiler's other tests: test_manifests.py (loading and its located errors),
test_tiny_build.py (the inline golden test), test_render.py (templates, naga and Jinja failures).
"""

from __future__ import annotations

import ast
import io
import os
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path
from types import SimpleNamespace

import pytest

from codegen import build as builder
from codegen.build import build
from codegen.problems import CompileError
from tests.compiler.compiler_support import (
    BANNER,
    GENERATED,
    MACRO_FILE,
    MANIFESTS,
    REGENERATE,
    REPO,
    TEMPLATES,
    problem_messages,
    run_cli,
    tiny_repo,
    with_macro,
)


def _generated_files_on_disk() -> set[str]:
    found = {
        p.relative_to(GENERATED).as_posix()
        for p in GENERATED.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    listed = subprocess.run(["git", "ls-files", "generated"], cwd=REPO, capture_output=True, text=True)
    if listed.returncode == 0:
        found |= {line[len("generated/") :] for line in listed.stdout.splitlines() if line.strip()}
    return found


def _generated_tree(folder: Path) -> dict[str, bytes]:
    """The files of `folder` that carry the compiler's banner."""
    return {path: data for path, data in _tree(folder).items() if builder.carries_banner(folder / path)}


def _tree(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


# ---------------------------------------------------------------------------------------------
# golden


def test_build_matches_committed_generated_byte_for_byte(built):
    files = built
    stale = []
    for relative, text in sorted(files.items()):
        path = GENERATED / relative
        if not path.exists():
            stale.append(f"{relative} (missing)")
        elif path.read_bytes() != text.encode("utf-8"):
            stale.append(relative)
    extra = sorted(
        p for p in _generated_files_on_disk() if p not in files and builder.carries_banner(GENERATED / p)
    )
    stale += [f"{p} (not generated any more)" for p in extra]
    assert not stale, (
        f"generated/ is stale; regenerate with `{REGENERATE}`:\n  "
        + "\n  ".join(stale)
        + "\n"
        + builder.stale_diff(files, GENERATED)
    )


def test_stale_diff_shows_what_changed(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\ny = 2\n")
    diff = builder.stale_diff({"a.py": "x = 1\ny = 3\n", "b.py": "new\n"}, tmp_path)
    assert "-y = 2\n+y = 3" in diff and "+new" in diff and "built/b.py" in diff


def test_only_writes_that_ops_files_and_refuses_unknown_names(tmp_path, device):
    import shutil

    out = tmp_path / "generated"
    shutil.copytree(GENERATED, out, ignore=shutil.ignore_patterns("__pycache__"))
    (out / "group_normalization" / "__init__.py").write_text("# hand edit\n")
    (out / "batch_normalization" / "inference_scalar.py").write_text(f"{BANNER} from\n# stale\n")
    files = build(MANIFESTS, TEMPLATES, only=("batch_normalization",), device=device)
    assert files and all(path.startswith("batch_normalization/") for path in files)
    changed = builder.write(files, out, only=True)
    assert changed == ["batch_normalization/inference_scalar.py"]
    assert (out / "group_normalization" / "__init__.py").read_text() == "# hand edit\n"  # left alone
    assert (out / "_ops.py").read_bytes() == (GENERATED / "_ops.py").read_bytes()
    for name in ("nope", "BatchNorm"):
        with pytest.raises(
            CompileError, match=f"--only {name}: no such op; ops are ai.onnx.BatchNormalization"
        ):
            build(MANIFESTS, TEMPLATES, only=(name,), device=device)
    with pytest.raises(CompileError, match="no <op id>/manifest.json in this folder"):
        build(tmp_path, TEMPLATES, device=device)


def test_writes_are_atomic(tmp_path, monkeypatch):
    target = tmp_path / "_ops.py"
    target.write_text(f"{BANNER}\nold\n")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(builder.os, "replace", broken_replace)
    with pytest.raises(OSError):
        builder.write({"_ops.py": f"{BANNER}\nnew\n"}, tmp_path)
    assert target.read_text() == f"{BANNER}\nold\n" and [p.name for p in tmp_path.iterdir()] == ["_ops.py"]


def test_build_writes_the_expected_files(built, ops):
    files = built
    assert {"_ops.py", "REPORT.md"} <= set(files)
    assert "batch_normalization/__init__.py" in files
    for variant in ops["ai.onnx.BatchNormalization"].variants:
        assert f"batch_normalization/{variant.id}.py" in files
    # The hand-written package (runtime, tools, __init__) is never written by the compiler.
    assert not any(
        path.startswith("_runtime/") or "/" not in path and path.endswith(".py") and path != "_ops.py"
        for path in files
    )


def test_the_compiler_writes_only_the_allow_list_and_every_banner_is_its_own(built):
    """The compiler writes only its allow-list (op packages, `_ops.py`, REPORT.md), every file it
    writes carries the banner, and every file of generated/ with the banner is one it writes now;
    everything else in generated/ (the runtime, the tools, `__init__.py`) is hand-written."""
    files = built
    packages = builder.op_packages_of(files)
    assert packages == {
        "batch_normalization",
        "group_normalization",
        "instance_normalization",
        "skip_group_norm",
        "group_norm",
        "layer_normalization",
        "rms_normalization",
        "simplified_layer_normalization",
        "skip_layer_normalization",
        "skip_simplified_layer_normalization",
    }
    assert all(builder.allowed(path, packages) for path in files)
    assert all(builder.BANNER_START in "".join(text.splitlines(True)[:3]) for text in files.values())
    on_disk = {
        p.relative_to(GENERATED).as_posix()
        for p in GENERATED.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    bannered = {path for path in on_disk if builder.carries_banner(GENERATED / path)}
    assert bannered == set(files)
    hand_written = on_disk - bannered
    assert {
        "__init__.py",
        "_runtime/__init__.py",
        "_runtime/tensors.py",
        "bench.py",
        "py.typed",
    } <= hand_written
    assert not any(builder.allowed(path, packages) for path in hand_written)


def test_the_compiler_never_overwrites_a_hand_written_file(tmp_path):
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "__init__.py").write_text("# mine\n")
    with pytest.raises(CompileError, match="a hand-written file"):
        builder.write({"tiny/__init__.py": f"# {builder.BANNER_START} ...\n"}, tmp_path)
    assert (tmp_path / "tiny" / "__init__.py").read_text() == "# mine\n"


def test_runtime_sources_are_black_clean_and_import_relatively():
    """The hand-written package carries the package's formatting (emit.BLACK_MODE), and imports
    itself relatively (a vendored copy under another name keeps working)."""
    import black

    from codegen.emit import BLACK_MODE

    for module in sorted(p for p in GENERATED.rglob("*.py") if not builder.carries_banner(p)):
        text = module.read_text()
        assert black.format_str(text, mode=BLACK_MODE) == text, f"{module}: run black -l 110 -t py310"
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                allowed_imports = sys.stdlib_module_names | {
                    "numpy",
                    "wgpu",
                    "onnx",
                    "onnxruntime",
                    "torch",
                    "matplotlib",
                }
                assert node.module.split(".")[0] in allowed_imports, (module.name, node.module)


def test_generated_modules_are_what_black_makes_of_them(built):
    """The build formats what it writes with one pass of black (emit.PythonSource.format); the
    public black.format_str, which runs a second pass where the first changed anything, agrees."""
    import black

    from codegen.emit import BLACK_MODE

    files = built
    modules = {path: text for path, text in files.items() if path.endswith(".py")}
    assert len(modules) > 30  # every op package: variants, shader stores, cases
    for path, text in modules.items():
        assert black.format_str(text, mode=BLACK_MODE) == text, f"{path}: not black's fixed point"


def test_build_is_deterministic_in_memory(built, device):
    files = built
    assert build(MANIFESTS, TEMPLATES, device=device) == files


def test_cli_regenerates_byte_identical_and_check_finds_stale_files(tmp_path):
    out = tmp_path / "elsewhere"
    first = run_cli("manifests/", str(out))
    assert first.returncode == 0, first.stderr
    # Another folder, another process (another hash seed): the same bytes as the committed package's
    # generated files; the hand-written rest of the package is not the compiler's to write.
    assert _tree(out) == _generated_tree(GENERATED), f"regenerate with `{REGENERATE}`"
    assert "hand-written" in first.stdout  # OUT has no runtime: the CLI says where it is

    clean = run_cli("manifests/", str(out), "--check")
    assert clean.returncode == 0, clean.stderr
    assert "up to date" in clean.stdout

    variant_files = sorted(
        p for p in out.glob("*/*.py") if p.name != "__init__.py" and p.parent.name != "_runtime"
    )
    edited, removed = variant_files[0], out / "group_normalization" / "cases.py"
    edited.write_text(edited.read_text() + "# hand edit\n")
    removed.unlink()
    (out / "batch_normalization" / "retired_variant.py").write_text(BANNER + " from\n# nothing\n")
    (out / "batch_normalization" / "mine.py").write_text("# not generated: --check leaves it alone\n")

    dirty = run_cli("manifests/", str(out), "--check")
    assert dirty.returncode == 1, dirty.stdout + dirty.stderr
    assert REGENERATE in dirty.stderr
    listed = [line.strip() for line in dirty.stderr.splitlines() if line.startswith("  ")]
    assert edited.relative_to(out).as_posix() in listed
    assert "group_normalization/cases.py (missing)" in listed
    assert "batch_normalization/retired_variant.py (not generated any more)" in listed
    assert len(listed) == 3, listed  # mine.py is not ours; nothing else changed

    again = run_cli("manifests/", str(out))
    assert again.returncode == 0, again.stderr
    assert not (out / "batch_normalization" / "retired_variant.py").exists()
    assert (out / "batch_normalization" / "mine.py").exists()
    (out / "batch_normalization" / "mine.py").unlink()
    assert _tree(out) == _generated_tree(GENERATED)


def test_cli_reports_manifest_errors_with_exit_2(tmp_path):
    (tmp_path / "manifests" / "test.Broken").mkdir(parents=True)
    (tmp_path / "manifests" / "test.Broken" / "manifest.json").write_text('{"domain": "test"}')
    result = run_cli(str(tmp_path / "manifests"), str(tmp_path / "out"), cwd=tmp_path)
    assert result.returncode == 2
    assert "manifests/test.Broken/manifest.json#/variants: required key is missing" in result.stderr
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------
# what generated code may contain


def _generated_python(files) -> dict[str, str]:
    return {path: text for path, text in files.items() if path.endswith(".py")}


def _code_without_comments(text: str) -> str:
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type != tokenize.COMMENT]
    return tokenize.untokenize(tokens)


ALLOWED_THIRD_PARTY = {"numpy", "wgpu"}
# The benchmark harness is a tool, not kernel code: it writes JSON and files, and imports PyTorch
# and matplotlib (inside functions, only when asked for). It still reads no manifest.
BENCH_ALLOWED = {"import json", "open(", "torch", "matplotlib"}
# The ONNX tools import onnx (and check_model onnxruntime) inside functions, only when they run.
TOOLS_ALLOWED = {
    "bench.py": BENCH_ALLOWED,
    "bench_torch.py": {"torch"},
    "onnx_nodes.py": {"onnx"},
    "check_model.py": {"onnx", "onnxruntime"},
}


def test_generated_code_is_standalone(built):
    files = built
    python = _generated_python(files)
    assert python
    for path, text in python.items():
        allowed = TOOLS_ALLOWED.get(path, set())
        assert "jinja2" not in text, path
        code = _code_without_comments(text)  # the banner names `python -m codegen`; code must not
        for forbidden in ("codegen", "eval(", "exec(", "manifest.json", "json.load", "import json", "open("):
            assert forbidden in allowed or forbidden not in code, f"{path} contains {forbidden!r}"
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                assert (
                    top in sys.stdlib_module_names or top in ALLOWED_THIRD_PARTY | allowed
                ), f"{path} imports {module}"


def test_committed_generated_code_is_standalone():
    """The package never imports the compiler (nor jinja2), and evaluates no text at run time."""
    for path in sorted(GENERATED.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        text = path.read_text()
        imported = {
            name.split(".")[0]
            for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for name in (
                [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            )
        }
        assert not imported & {"codegen", "jinja2", "black"}, path
        code = _code_without_comments(text)
        for forbidden in ("eval(", "exec(", "manifest.json", "json.load"):
            assert forbidden not in code, f"{path} contains {forbidden!r}"


def test_every_generated_file_starts_with_the_banner(built):
    files = built
    for path, text in _generated_python(files).items():
        assert text.startswith(BANNER), path


def test_report_has_no_error(built):
    files = built
    assert "ERROR" not in files["REPORT.md"]
    assert "ERROR" not in (GENERATED / "REPORT.md").read_text()
    assert files["REPORT.md"].startswith("# Generated kernels\n")
    assert re.search(r"Validated \d+ shaders with naga", files["REPORT.md"])
    assert max(len(line) for line in files["REPORT.md"].splitlines()) <= 200  # readable: no 100 KB line


def test_build_opens_its_own_device_and_writes_the_same_files(built):
    """What the CLI does: build() with no device opens its own validation device."""
    files = built
    assert build(MANIFESTS, TEMPLATES) == files


def test_vendored_copy_runs_under_another_name(tmp_path):
    """A team copies generated/ into its app under any package name: relative imports only."""
    target = tmp_path / "myapp" / "kernels"
    shutil.copytree(REPO / "generated", target, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "myapp" / "__init__.py").write_text("")
    script = (
        "import numpy as np, sys\n"
        "from myapp.kernels import batch_normalization as bn\n"
        "x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)\n"
        "ones, zeros = np.ones(3, np.float32), np.zeros(3, np.float32)\n"
        "y = bn.batch_normalization(x, ones, zeros, zeros, ones, epsilon=0.0)\n"
        "assert np.allclose(y, x, rtol=1e-6), y\n"
        "assert 'generated' not in sys.modules, 'the copy imported the original package'\n"
        "print('ok')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "WGPU_BACKEND_TYPE": "Vulkan"}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "ok" in done.stdout, done.stdout + done.stderr


# ---------------------------------------------------------------------------------------------
# the command line: an OUT it cannot write and a templates folder without templates are one
# problem each, before anything is written; manifests and templates that lie apart build


def _one_problem(result: subprocess.CompletedProcess) -> str:
    """The problem line of a CLI run that failed with exactly one (exit 2, as a manifest error)."""
    assert result.returncode == 2, result.stdout + result.stderr
    head, *lines = result.stderr.splitlines()
    assert head == "codegen failed: 1 problem" and len(lines) == 1, result.stderr
    return lines[0].strip()


def test_cli_refuses_an_out_that_is_a_file_before_building(tmp_path):
    manifests, _ = tiny_repo(tmp_path)
    (tmp_path / "README.md").write_text("mine\n")
    reasons = {
        "README.md": "README.md: a file, not a folder; OUT is the folder the generated package is written into",
        "README.md/sub": f"README.md/sub: under {tmp_path.resolve() / 'README.md'}, which is a file; OUT is the folder",
    }
    for out, reason in reasons.items():
        for check in ([], ["--check"]):
            line = _one_problem(run_cli(str(manifests), out, *check, cwd=tmp_path))
            assert line.startswith(reason), line
    assert (tmp_path / "README.md").read_text() == "mine\n"


@pytest.mark.skipif(
    not Path("/proc/self").is_dir(), reason="needs Linux's /proc, where no folder can be made"
)
def test_cli_reports_an_out_that_cannot_be_made(tmp_path):
    manifests, _ = tiny_repo(tmp_path)
    line = _one_problem(run_cli(str(manifests), "/proc/genout", cwd=tmp_path))
    assert line.startswith("/proc/genout: cannot create this folder: "), line


def test_write_refuses_a_file_where_a_package_folder_goes_before_writing(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "pkg").write_text("a file where the package folder goes\n")
    with pytest.raises(CompileError) as info:
        builder.write({"a.py": "x = 1\n", "pkg/sub/module.py": "x = 1\n"}, out)
    assert problem_messages(info.value) == [
        f"{out / 'pkg'}: a file, where the generated package has a folder"
    ]
    assert sorted(p.name for p in out.iterdir()) == ["pkg"]


@pytest.mark.parametrize("case", ["missing", "a file", "empty", "not beside the manifests"])
def test_cli_refuses_a_templates_folder_without_templates(tmp_path, case):
    manifests, templates = tiny_repo(tmp_path / "repo")
    (tmp_path / "empty").mkdir()
    hint = "*.jinja templates; pass --templates, or keep templates/ beside MANIFESTS"
    args, expected = {
        "missing": (
            ["--templates", str(tmp_path / "nowhere")],
            f"{tmp_path.resolve() / 'nowhere'}: no such folder of {hint}",
        ),
        "a file": (
            ["--templates", str(templates / "tiny.wgsl.jinja")],
            f"{templates.resolve() / 'tiny.wgsl.jinja'}: not a folder of {hint}",
        ),
        "empty": (
            ["--templates", str(tmp_path / "empty")],
            f"{tmp_path.resolve() / 'empty'}: no *.jinja templates in this folder",
        ),
        "not beside the manifests": ([], f"{tmp_path.resolve() / 'templates'}: no such folder of {hint}"),
    }[case]
    if case == "not beside the manifests":
        manifests = shutil.copytree(manifests, tmp_path / "manifests")
    assert _one_problem(run_cli(str(manifests), str(tmp_path / "out"), *args, cwd=tmp_path)) == expected
    assert not (tmp_path / "out").exists()


def test_an_op_without_its_templates_is_a_located_problem_and_nothing_is_written(tmp_path):
    """Every op left out used to give a package __init__ importing nothing (black refused it)."""
    manifests, templates = tiny_repo(tmp_path)
    (templates / "tiny.wgsl.jinja").rename(templates / "other.wgsl.jinja")
    line = _one_problem(run_cli(str(manifests), str(tmp_path / "out"), cwd=tmp_path))
    assert line == (
        "manifests/test.Tiny/manifest.json#/variants/0/passes/0: template `templates/tiny.wgsl.jinja` does not exist; "
        "no variant of test.Tiny has all its templates, so none can be emitted"
    )
    assert not (tmp_path / "out").exists()


def test_manifests_and_templates_that_lie_apart_build(tmp_path, device):
    """MANIFESTS outside the repository and --templates elsewhere (a KeyError on the library template
    once): the banners name the templates by the folder's name, as problems do, and no absolute path."""
    tiny_repo(tmp_path / "repo")
    templates = tmp_path / "repo" / "templates"
    with_macro(SimpleNamespace(templates=templates), MACRO_FILE.replace("    let wrong: u32 = x[i];\n", ""))
    manifests = shutil.copytree(tmp_path / "repo" / "manifests", tmp_path / "m3")
    files = build(manifests, templates, device=device)
    banner = files["tiny/copy.py"].split("# Do not edit")[0]
    for source in (
        "m3/test.Tiny/manifest.json",
        "templates/_lib/body.wgsl.jinja",
        "templates/tiny.wgsl.jinja",
    ):
        assert f"#   {source} (sha256 " in banner, banner
    assert not [
        path for path, text in files.items() if str(tmp_path.resolve()) in text or str(tmp_path) in text
    ]
    out = tmp_path / "out"
    for args, said in (([], "wrote "), (["--check"], "is up to date")):
        result = run_cli(str(manifests), str(out), "--templates", str(templates), *args, cwd=tmp_path)
        assert result.returncode == 0 and said in result.stdout, result.stdout + result.stderr
    assert _tree(out) == {path: text.encode() for path, text in sorted(files.items())}
