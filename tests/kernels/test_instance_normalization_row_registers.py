"""InstanceNormalization-6's plane_row_registers: GroupNorm's row-in-registers design with a plane as
the row. Tunables shrink workgroups and planes, so lavapipe meets tails, spare bucket units, odd
workgroup sizes, partial subgroups and 1-3 workgroups a plane; every split gives the bits of one
workgroup (also at subgroup widths 4 and 8, in a child process); selection and fallback without
subgroups; refusals.

Every case runs on the wgpu device (Mesa's software Vulkan in CI) with fresh random inputs per run
(the seed is printed on failure), outputs poisoned with NaN before the run, and is compared with a
float64 NumPy reference (docs/TESTING.md tolerances) and with onnxruntime on the CPU.
"""

from __future__ import annotations

import numpy as np
import pytest

from generated import ContractError
from generated import instance_normalization as inn
from tests.kernels.group_norm_support import held_units
from tests.kernels.instance_norm_support import (
    NO_ROW_REGISTERS,
    assert_matches_both_oracles,
    dtypes_of,
    random_inputs,
    reference,
    run_at_subgroup_size,
    run_poisoned,
    shapes_of,
)
from tests.oracles import assert_close, rng_for, seed_note


# --- plane_row_registers ------------------------------------------------------------------------------
# GroupNorm's row-in-registers design with a plane as the row: planes x split workgroups, each
# loading its whole plane into registers (a bucket of units an invocation: vec4<f32>, or 8 halves
# as vec4<u32>), two-pass statistics with subgroupAdd, a share of the stores each. Tunables shrink
# workgroups and planes, so lavapipe meets tails, spare bucket units, odd workgroup sizes, partial
# subgroups and 1-3 workgroups a plane.

REGISTERS = "plane_row_registers"
REGISTER_CAPS = {"features": ["shader-f16", "subgroups"]}
# The H200's facts as wgpu reports them: subgroups, 1024 invocations a workgroup, 2 GiB bindings.
H200_CAPS = {
    **REGISTER_CAPS,
    "limits": {
        "maxComputeInvocationsPerWorkgroup": 1024,
        "maxComputeWorkgroupSizeX": 1024,
        "maxStorageBufferBindingSize": 2**31,
    },
}
SPLIT_SMALL_PLANES = {"REGISTER_SPLIT_MIN_HIDDEN": 1}

# (shape, tunables, (workgroup, split, bucket) for f32, the same for f16): a unit is 4 f32 or
# 8 f16 values; an invocation holds ceil(units / workgroup) units, rounded up to a bucket.
REGISTER_CASES = [
    ((3, 5, 32), {}, (8, 1, "1"), (4, 1, "1")),  # 8 / 4 units a plane: one each
    ((2, 6, 8), {}, (2, 1, "1"), (1, 1, "1")),  # a plane of one f16 unit, one invocation
    (
        (2, 3, 40, 44),
        {"REGISTER_SINGLE_WORKGROUP_SIZE": 100},
        (100, 1, "5"),
        (100, 1, "3"),
    ),  # 440 / 220 units: tails
    (
        (1, 2, 16, 96),
        {"REGISTER_SINGLE_WORKGROUP_SIZE": 33},
        (33, 1, "12"),
        (33, 1, "6"),
    ),  # 384 / 192 units on 33
    (
        (2, 3, 14, 32),
        {"REGISTER_SINGLE_WORKGROUP_SIZE": 16},
        (16, 1, "8"),
        (16, 1, "4"),
    ),  # 7 -> 8, 3.5 -> 4: spare units
    ((1, 3, 4, 8, 16), {"REGISTER_SINGLE_WORKGROUP_SIZE": 16}, (16, 1, "8"), (16, 1, "4")),  # rank 5
    (
        (1, 2, 64, 80),
        {**SPLIT_SMALL_PLANES, "REGISTER_WORKGROUP_SIZE": 64},
        (64, 2, "20"),
        (64, 2, "10"),
    ),  # two workgroups a plane
    (
        (2, 2, 32, 36),
        {**SPLIT_SMALL_PLANES, "REGISTER_WORKGROUP_SIZE": 32, "REGISTER_SPLIT": 3},
        (32, 3, "10"),
        (32, 3, "5"),
    ),
    (
        (1, 1, 96, 32),
        {"REGISTER_SINGLE_WORKGROUP_SIZE": 32, "REGISTER_MAX_UNITS": 24},
        (32, 1, "24"),
        (32, 1, "12"),
    ),  # largest bucket
    ((2, 16, 24, 40), {}, (256, 1, "1"), (128, 1, "1")),  # defaults: 32 planes of 960 values
]


def register_geometry(plan):
    (p,) = plan.passes
    return p.workgroup_size, p.values["split"], held_units(p)


def register_plan(inputs, tunables, caps=REGISTER_CAPS):
    return inn.plan(shapes_of(inputs), dtypes_of(inputs), caps=caps, tunables=tunables, variant=REGISTERS)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize(
    "shape,tunables,f32_geometry,f16_geometry", REGISTER_CASES, ids=[str(c[0]) for c in REGISTER_CASES]
)
def test_row_registers_against_reference_and_onnxruntime(
    shape, tunables, f32_geometry, f16_geometry, dtype, request
):
    """Workgroups smaller than a subgroup and not a multiple of one (100, 33), tails and spare
    units in the bucket, 1-3 workgroups a plane, the largest bucket, ranks 3 to 5; data far from
    zero (the mean travels as a pair)."""
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, shape, dtype, offset=3.0)
    epsilon = float(rng.choice([1e-5, 1e-3, 0.1]))
    plan = register_plan(inputs, tunables)
    assert register_geometry(plan) == (f32_geometry if dtype == np.float32 else f16_geometry)
    (p,) = plan.passes
    planes = shape[0] * shape[1]
    assert p.dispatch == (planes * p.values["split"], 1, 1) and p.uses_subgroups
    assert (p.uniforms["numGroups"], p.overrides["channelsPerGroup"]) == (shape[1], 1)
    assert p.workgroup_storage_bytes <= p.workgroup_size * 16 + 4100 + 8  # regWorkgroupBytes
    actual = run_poisoned(
        inputs, attrs={"epsilon": epsilon}, caps=REGISTER_CAPS, tunables=tunables, variant=REGISTERS
    )
    context = f"{REGISTERS} {shape} eps={epsilon} {tunables} {seed_note(seed)}"
    assert_matches_both_oracles(actual, inputs, epsilon, dtype, context)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_row_registers_large_common_offset_and_constant_planes(dtype, request):
    """A mean 1000 (f32) or 100 (f16) times the spread costs nothing; a constant plane gives its
    channel's bias exactly (zero variance), two workgroups a plane."""
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, (2, 3, 16, 40), dtype, offset=1000.0 if dtype == np.float32 else 100.0)
    inputs["input"][1, 2] = 7.25
    tunables = {**SPLIT_SMALL_PLANES, "REGISTER_WORKGROUP_SIZE": 32}
    assert register_geometry(register_plan(inputs, tunables))[1] == 2
    actual = run_poisoned(inputs, caps=REGISTER_CAPS, tunables=tunables, variant=REGISTERS)
    assert_close(actual, reference(inputs, 1e-5), dtype, f"{REGISTERS} offset {seed_note(seed)}")
    assert np.all(actual[1, 2] == inputs["b"][2])


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_row_registers_folded_dispatch(dtype, request):
    """70000 planes, two workgroups each: 140000 workgroups folded into (65535, 3, 1)."""
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, (1, 70000, 8), dtype)
    tunables = {**SPLIT_SMALL_PLANES, "SM_COUNT_PROXY": 1_000_000}
    (p,) = register_plan(inputs, tunables).passes
    assert p.dispatch == (65535, 3, 1) and p.values["split"] == 2
    actual = run_poisoned(inputs, caps=REGISTER_CAPS, tunables=tunables, variant=REGISTERS)
    assert_close(actual, reference(inputs, 1e-5), dtype, f"{REGISTERS} folded {seed_note(seed)}")


def row_register_splits(workgroup_size, dtype, name, caps=REGISTER_CAPS):
    """One (2, 3, spatial) input run with 1, 2 and 3 workgroups a plane of workgroup_size
    invocations; spatial = 8 (3 workgroup_size + 1) puts 7 f32 / 4 f16 units on an invocation (a
    tail and spare bucket units). Checks each against the reference, returns the outputs."""
    rng, seed = rng_for(name)
    inputs = random_inputs(rng, (2, 3, 8 * (3 * workgroup_size + 1)), dtype, offset=3.0)
    runs = []
    for split in (1, 2, 3):
        tunables = {
            **SPLIT_SMALL_PLANES,
            "REGISTER_SPLIT": split,
            "REGISTER_WORKGROUP_SIZE": workgroup_size,
            "REGISTER_SINGLE_WORKGROUP_SIZE": workgroup_size,
        }
        geometry = register_geometry(register_plan(inputs, tunables, caps))
        assert geometry == (workgroup_size, split, "8" if dtype == np.float32 else "4"), geometry
        actual = run_poisoned(inputs, caps=caps, tunables=tunables, variant=REGISTERS)
        context = f"{REGISTERS} wg={workgroup_size} split={split} {np.dtype(dtype).name} {seed_note(seed)}"
        assert_close(actual, reference(inputs, 1e-5), dtype, context)
        runs.append(actual)
    return runs


ROW_REGISTER_WORKGROUP_SIZES = (1, 3, 20, 32, 64)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("workgroup_size", ROW_REGISTER_WORKGROUP_SIZES)
def test_row_registers_every_split_gives_the_bits_of_one_workgroup(workgroup_size, dtype, request):
    """Every workgroup of a plane computes the statistics of the whole plane from the same loads in
    the same order: with 1, 2 or 3 workgroups a plane the output is the same, bit for bit, for
    workgroups smaller than a subgroup, with a partial last subgroup, and whole subgroups."""
    runs = row_register_splits(workgroup_size, dtype, request.node.name)
    assert all(r.tobytes() == runs[0].tobytes() for r in runs[1:])


ROW_REGISTERS_SUBGROUP_SCRIPT = """
import sys
import numpy as np
from tests.kernels import test_instance_normalization_row_registers as t
from tests.device_helpers import measured_subgroup_size
size = measured_subgroup_size()
if size != int(sys.argv[1]):
    print(f"lavapipe gave subgroup size {size}, expected {sys.argv[1]}")
    sys.exit(3)
for wg in t.ROW_REGISTER_WORKGROUP_SIZES:
    for dtype in (np.float32, np.float16):
        runs = t.row_register_splits(wg, dtype, f"registers-subgroup{size}-{wg}-{np.dtype(dtype).name}")
        assert all(r.tobytes() == runs[0].tobytes() for r in runs[1:]), (wg, dtype)
print("ok")
"""


@pytest.mark.parametrize("vector_width,subgroup_size", [(128, 4), (256, 8)])
def test_row_registers_at_known_subgroup_size(vector_width, subgroup_size):
    """The split cases in a process where lavapipe runs subgroups of a known size (4 or 8): the
    workgroup sums rely on the lanes of a subgroup, partial ones included (Mesa's shader cache
    off: it does not key on LP_NATIVE_VECTOR_WIDTH)."""
    result = run_at_subgroup_size(ROW_REGISTERS_SUBGROUP_SCRIPT, subgroup_size, vector_width, 300)
    if result.returncode == 3 and vector_width != 128:
        pytest.skip(
            f"this CPU's lavapipe does not honour LP_NATIVE_VECTOR_WIDTH={vector_width}: {result.stdout.strip()}"
        )
    assert result.returncode == 0 and "ok" in result.stdout, result.stdout[-4000:] + result.stderr[-4000:]


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_row_registers_repeated_runs_are_bit_identical(dtype, request):
    rng, _ = rng_for(request.node.name)
    inputs = random_inputs(rng, (2, 4, 16, 24), dtype)
    tunables = {**SPLIT_SMALL_PLANES, "REGISTER_WORKGROUP_SIZE": 20}
    first = run_poisoned(inputs, caps=REGISTER_CAPS, tunables=tunables, variant=REGISTERS)
    for _ in range(2):
        assert (
            run_poisoned(inputs, caps=REGISTER_CAPS, tunables=tunables, variant=REGISTERS).tobytes()
            == first.tobytes()
        )


def registers_chosen(shape, dtype="float32", caps=H200_CAPS, tunables=None):
    """The variant plan() picks, with its (workgroup, split, bucket) where it is plane_row_registers."""
    c = shape[1]
    p = inn.plan({"input": shape, "scale": (c,), "b": (c,)}, {"T": dtype}, caps=caps, tunables=tunables)
    return (p.variant, *register_geometry(p)) if p.variant == REGISTERS else p.variant


def test_row_registers_selection_on_the_bench_cases():
    """bench.json under H200-like caps: the style and UNet planes that fit REGISTER_MAX_UNITS (20)
    units an invocation take plane_row_registers, the f32 224x224 plane too (12544 units, 19.6 at
    640 invocations); the VAE planes do not (split-k)."""
    from generated.instance_normalization.cases import BENCH_CASES

    found = {}
    for case in BENCH_CASES:
        for dtype in case["dtypes"]["T"]:
            found[case["name"], dtype] = registers_chosen(tuple(case["inputs"]["input"]), dtype)
    assert found == {
        ("style-conv1", "float32"): (REGISTERS, 640, 2, "20"),
        ("style-conv1", "float16"): (REGISTERS, 640, 2, "10"),
        ("style-conv2", "float32"): (REGISTERS, 512, 1, "8"),
        ("style-conv2", "float16"): (REGISTERS, 512, 1, "4"),
        ("style-conv3", "float32"): (REGISTERS, 512, 1, "2"),
        ("style-conv3", "float16"): (REGISTERS, 512, 1, "1"),
        ("legacy-gn-unet-64", "float32"): (REGISTERS, 640, 2, "16"),
        ("legacy-gn-unet-64", "float16"): (REGISTERS, 640, 2, "8"),
        ("legacy-gn-vae-512", "float32"): "plane_splitk_registers",
        ("legacy-gn-vae-512", "float16"): "plane_splitk_registers",
    }


def test_row_registers_selection_thresholds():
    """Taken where a plane fits REGISTER_MAX_UNITS units an invocation and planes x split
    workgroups fit SM_COUNT_PROXY; two workgroups a plane from REGISTER_SPLIT_MIN_HIDDEN (20480)
    values; needs subgroups (without them the other variants run)."""
    chosen = registers_chosen
    # Planes of 40960 values: 66 planes at two workgroups each still fit SM_COUNT_PROXY (132); 67
    # planes take one workgroup a plane (REGISTER_SINGLE_WORKGROUP_SIZE 512: 20 units each).
    assert chosen((2, 33, 40960)) == (REGISTERS, 640, 2, "16")
    assert chosen((1, 67, 40960)) == (REGISTERS, 512, 1, "20")
    assert chosen((4, 32, 40960)) == (REGISTERS, 512, 1, "20")  # 128 planes: 256 workgroups at split 2
    assert (
        chosen((1, 67, 40960), tunables={"REGISTER_SINGLE_WORKGROUP_SIZE": 256}) == "plane_subgroup_vec4"
    )  # 40 units
    assert chosen((4, 32, 40960), tunables={"SM_COUNT_PROXY": 256}) == (REGISTERS, 640, 2, "16")
    # One workgroup a plane: 132 planes fit, 133 do not.
    assert chosen((1, 132, 56, 56)) == (REGISTERS, 512, 1, "2")
    assert chosen((1, 133, 56, 56)) == "plane_subgroup_vec4"
    # The f32 224x224 plane: 19.6 units at 640 invocations, 24.5 at 512 (over the budget even at
    # the largest bucket). 1024 invocations a workgroup would hold it in 16 units each, with more
    # workgroup memory than WebGPU's default 16384 bytes, so only where the device reports more.
    assert chosen((1, 32, 224, 224)) == (REGISTERS, 640, 2, "20")
    assert (
        chosen((1, 32, 224, 224), tunables={"REGISTER_WORKGROUP_SIZE": 512, "REGISTER_MAX_UNITS": 24})
        == "plane_subgroup_vec4"
    )
    wide = {"REGISTER_WORKGROUP_SIZE": 1024}
    assert chosen((1, 32, 224, 224), tunables=wide) == "plane_subgroup_vec4"
    roomy = {**H200_CAPS, "limits": {**H200_CAPS["limits"], "maxComputeWorkgroupStorageSize": 32768}}
    assert chosen((1, 32, 224, 224), caps=roomy, tunables=wide) == (REGISTERS, 1024, 2, "16")
    # WebGPU's default limits (256 invocations): f16 planes of 40960 values fit, f32 ones do not.
    assert chosen((2, 32, 40960), "float16", caps=REGISTER_CAPS) == (REGISTERS, 256, 2, "20")
    assert chosen((2, 32, 40960), caps=REGISTER_CAPS) == "plane_subgroup_vec4"
    # No subgroups: the other variants, the same as before the variant existed.
    no_subgroups = {"features": ["shader-f16"], "limits": H200_CAPS["limits"]}
    assert chosen((2, 32, 40960), caps=no_subgroups) == "plane_subgroup_vec4"
    assert chosen((1, 64, 112, 112), "float16", caps=no_subgroups) == "plane_subgroup_vec4"
    # Planes that are not whole units: 60 values are 15 f32 units but not whole f16 units; 49 neither.
    assert chosen((1, 4, 6, 10))[0] == REGISTERS
    assert chosen((1, 4, 6, 10), "float16") == "plane_subgroup_vec4"
    assert chosen((1, 4, 7, 7)) == "plane_subgroup"
    # Few planes of 65536 values: f32 needs 32 units (split-k), f16 16 (registers, over split-k).
    assert chosen((1, 4, 256, 256)) == "plane_splitk_registers"
    assert chosen((1, 4, 256, 256), "float16") == (REGISTERS, 640, 2, "16")


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_row_registers_fall_back_without_subgroups(dtype, request):
    """A plane that takes plane_row_registers where subgroups are runs on plane_subgroup_vec4 when
    the caps lack them, and is right."""
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, (1, 32, 56, 56), dtype)
    with_subgroups = inn.plan(shapes_of(inputs), dtypes_of(inputs), caps=REGISTER_CAPS).variant
    caps = {"features": ["shader-f16"]}
    without = inn.plan(shapes_of(inputs), dtypes_of(inputs), caps=caps).variant
    assert (with_subgroups, without) == (REGISTERS, "plane_subgroup_vec4")
    actual = run_poisoned(inputs, caps=caps)
    assert_close(actual, reference(inputs, 1e-5), dtype, f"fallback {seed_note(seed)}")


def test_row_registers_refusals_say_why():
    shapes = {"input": (2, 3, 2, 6), "scale": (3,), "b": (3,)}
    for dtype, caps, words in [
        ("float16", REGISTER_CAPS, "instanceSpatial % regUnitValues == 0"),  # 12 values: not whole f16 units
        ("float32", {"features": ["shader-f16"]}, "needs device feature subgroups"),
        ("float32", {**REGISTER_CAPS, "limits": {"maxComputeWorkgroupStorageSize": 16}}, "regWorkgroupBytes"),
        ("float32", REGISTER_CAPS, "regSplit * instancePlanes <= tunables.SM_COUNT_PROXY"),
    ]:
        tunables = NO_ROW_REGISTERS if "SM_COUNT_PROXY" in words else None
        with pytest.raises(ContractError, match="does not apply") as caught:
            inn.plan(shapes, {"T": dtype}, caps=caps, tunables=tunables, variant=REGISTERS)
        assert words in str(caught.value), str(caught.value)
