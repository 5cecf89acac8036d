"""Fixtures of the compiler's tests: one in-memory build of the repository's manifests, the loaded
manifests, and a temporary repository with the tiny manifest and template, and its build.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from codegen.build import build
from codegen.manifest import load_manifests
from tests.compiler.compiler_support import MANIFESTS, TEMPLATES, tiny_repo


@pytest.fixture(scope="package")
def built(device):
    """One in-memory build of every manifest, validated on the session device."""
    return build(MANIFESTS, TEMPLATES, device=device)


@pytest.fixture(scope="package")
def ops():
    return {op.id: op for op in load_manifests(MANIFESTS)}


@pytest.fixture
def tiny(tmp_path):
    """A repository with one tiny manifest and template."""
    manifests, templates = tiny_repo(tmp_path)
    return SimpleNamespace(root=tmp_path, manifests=manifests, templates=templates)


@pytest.fixture
def tiny_files(tiny, device):
    return build(tiny.manifests, tiny.templates, device=device)
