"""Every op x variant x dtype on five device profiles of the software driver (issue 9, item 6).

- no-features: a device asked for no optional feature (required_features=[]): float16 is refused
  with a ContractError that names shader-f16, the subgroup-only variants are refused, the rest
  are right against the float64 reference;
- spec-limits: the default device's features with exactly WebGPU's default limits, requested
  explicitly (wgpu-py's default is the adapter's limits);
- subgroups-8 / subgroups-4: lavapipe's subgroups 8 wide (in process) and 4 wide (a child process
  with LP_NATIVE_VECTOR_WIDTH=128 and Mesa's shader cache off: the cache does not key on the width);
- opengl: wgpu's OpenGL backend (Mesa's EGL and llvmpipe, a child process with
  WGPU_BACKEND_TYPE=OpenGL): no shader-f16 and no subgroups.

tests/kernels/profile_cases.py holds the cases and runs them; a child process runs all of its profile's
cases once (process start-up and a device cost about a second) and prints their outcomes as JSON,
and every case is then its own test here. Data are fresh each run (the seed is in every failure
message; KERNEL_TEST_SEED reproduces it, children included), outputs are NaN-poisoned.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from generated._runtime import WEBGPU_DEFAULT_LIMITS, default_device
from tests.kernels import profile_cases
from tests.device_helpers import is_lavapipe
from tests.oracles import run_seed

ROOT = Path(__file__).resolve().parents[2]
CASES = profile_cases.all_cases()

# In-process profiles: a function that makes the device. Child profiles: the environment.
IN_PROCESS = {
    "no-features": profile_cases.no_features_device,
    "spec-limits": profile_cases.spec_limits_device,
    "subgroups-8": default_device,
}
CHILDREN = {
    "subgroups-4": {
        "LP_NATIVE_VECTOR_WIDTH": "128",
        "MESA_SHADER_CACHE_DISABLE": "true",
        "WGPU_BACKEND_TYPE": "Vulkan",
    },
    "opengl": {"WGPU_BACKEND_TYPE": "OpenGL"},
}
LAVAPIPE_ONLY = {"subgroups-8", "subgroups-4"}
PROFILES = tuple(IN_PROCESS) + tuple(CHILDREN)

_results: dict = {}


def _child(profile):
    env = {**os.environ, **CHILDREN[profile], "KERNEL_TEST_SEED": str(run_seed())}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "tests.kernels.profile_cases", profile],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0 or "RESULT " not in done.stdout:
        return {"crashed": f"exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"}
    return json.loads(done.stdout.split("RESULT ", 1)[1])


def results(profile):
    """The profile's {"facts", "outcomes", "seed"}, computed once per session."""
    if profile in LAVAPIPE_ONLY and not is_lavapipe():
        pytest.skip("subgroup widths are set through lavapipe (LP_NATIVE_VECTOR_WIDTH)")
    if profile == "subgroups-8" and os.environ.get("LP_NATIVE_VECTOR_WIDTH"):
        pytest.skip(
            "LP_NATIVE_VECTOR_WIDTH is set for this process: its subgroups are not lavapipe's default 8"
        )
    if profile not in _results:
        if profile in IN_PROCESS:
            _results[profile] = profile_cases.run_all(IN_PROCESS[profile](), profile)
        else:
            _results[profile] = _child(profile)
    found = _results[profile]
    assert "crashed" not in found, f"the {profile} child process failed: {found.get('crashed')}"
    assert "no_adapter" not in found, (
        f"{profile}: wgpu found no adapter ({found.get('no_adapter')}); scripts/bootstrap installs "
        "Mesa's EGL and GL drivers (libegl1 libegl-mesa0 libgl1-mesa-dri libgles2) for the OpenGL backend"
    )
    return found


def expected(case, features):
    """("right", None) or ("refused", words the ContractError must carry) for a case on a profile."""
    if case.needs_f16 and "shader-f16" not in features:
        return "refused", "shader-f16"
    missing = [f for f in case.required_features if f not in features]
    if missing:
        return "refused", f"needs device feature {', '.join(missing)}"
    if case.only_dtype and case.dtypes["T"] != case.only_dtype:
        return "refused", f'dtypes.T == "{case.only_dtype.replace("float", "f")}"'
    return "right", None


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("profile", PROFILES)
def test_every_variant_and_dtype_on_the_profile(profile, case):
    found = results(profile)
    outcome = found["outcomes"][case.id]
    want, words = expected(case, set(found["facts"]["features"]))
    seed = f"(seed {found['seed']}: KERNEL_TEST_SEED={found['seed']} reproduces it)"
    if want == "refused":
        assert (
            outcome["outcome"] == "refused"
        ), f"{profile} {case.id}: expected a ContractError naming {words!r}, got {outcome} {seed}"
        assert (
            words in outcome["message"]
        ), f"{profile} {case.id}: the ContractError does not say {words!r}: {outcome['message']}"
    else:
        assert (
            outcome["outcome"] == "right"
        ), f"{profile} {case.id}: {outcome['outcome']}: {outcome['message']} {seed}"


def test_no_features_profile_has_no_optional_feature():
    assert results("no-features")["facts"]["features"] == []


def test_spec_limits_profile_has_exactly_webgpu_default_limits():
    assert results("spec-limits")["facts"]["limits"] == WEBGPU_DEFAULT_LIMITS


@pytest.mark.parametrize("profile,width", [("subgroups-8", 8), ("subgroups-4", 4)])
def test_subgroup_profiles_run_at_their_width(profile, width):
    facts = results(profile)["facts"]
    assert facts["subgroup_size"] == width, facts
    assert {"shader-f16", "subgroups"} <= set(facts["features"]), facts


def test_opengl_profile_is_the_opengl_backend_without_f16_or_subgroups():
    facts = results("opengl")["facts"]
    assert facts["backend"] == "OpenGL", facts
    assert "shader-f16" not in facts["features"] and "subgroups" not in facts["features"], facts
    assert facts["subgroup_size"] is None
