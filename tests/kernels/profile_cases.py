"""Every op x variant x dtype as one small case, and how to run them all on one device profile.

tests/kernels/test_device_profiles.py asserts on the outcomes; this module only runs cases and reports, so
that a child process (a profile that needs its own environment: lavapipe's 4-wide subgroups, the
OpenGL backend) can run every case once and print the outcomes as JSON:

    python -m tests.kernels.profile_cases PROFILE      # prints one line: RESULT {"facts": ..., "outcomes": ...}

An outcome is {"outcome": "right" | "wrong" | "refused" | "error", "message", "variant"}: "refused"
is a ContractError (its text in "message"), "wrong" a result outside docs/TESTING.md's tolerances (the
worst element in "message"), "error" any other exception (its traceback).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import traceback
import zlib
from dataclasses import dataclass, field

import numpy as np

from generated import ContractError, Tensor
from generated import batch_normalization as bn
from generated import group_norm as mgn
from generated import group_normalization as gn
from generated import instance_normalization as inn
from generated import layer_normalization as ln
from generated import rms_normalization as rms
from generated import simplified_layer_normalization as sln
from generated import skip_group_norm as sgn
from generated import skip_layer_normalization as skln
from generated import skip_simplified_layer_normalization as sksln
from generated._runtime import WEBGPU_DEFAULT_LIMITS, default_device, device_caps
from tests.oracles import (
    assert_close,
    batch_normalization_ref,
    group_normalization_ref,
    instance_normalization_ref,
    node_reference,
    microsoft_group_norm_ref,
    run_seed,
    seed_note,
    skip_group_norm_ref,
)

PACKAGES = {
    "batch_normalization": bn,
    "group_normalization": gn,
    "instance_normalization": inn,
    "skip_group_norm": sgn,
    "group_norm": mgn,
    "layer_normalization": ln,
    "rms_normalization": rms,
    "simplified_layer_normalization": sln,
    "skip_layer_normalization": skln,
    "skip_simplified_layer_normalization": sksln,
}
# The input the outputs scale with, per op (for SkipGroupNorm and GroupNorm its type is M).
SCALE_KEY = {
    "batch_normalization": "scale",
    "group_normalization": "scale",
    "instance_normalization": "scale",
    "skip_group_norm": "gamma",
    "layer_normalization": "scale",
    "rms_normalization": "scale",
    "simplified_layer_normalization": "scale",
    "skip_layer_normalization": "gamma",
    "skip_simplified_layer_normalization": "gamma",
    "group_norm": "gamma",
}
# The affine offset of the ops that normalize their own statistics (not BatchNormalization, whose
# statistics are inputs), where a case has one (the RMS forms have none: their Y is not an offset).
BIAS_KEY = {
    "group_normalization": "bias",
    "instance_normalization": "b",
    "skip_group_norm": "beta",
    "layer_normalization": "b",
    "skip_layer_normalization": "beta",
    "group_norm": "beta",
}
# The normalizations over the last axes: their cases carry their optional tensors in `tag`, their
# references come from generated/reference.py's node_outputs, their per-position parameters sit
# on the last axes (channel_axis -1).
LAYER_FAMILY = (
    "layer_normalization",
    "rms_normalization",
    "simplified_layer_normalization",
    "skip_layer_normalization",
    "skip_simplified_layer_normalization",
)
# The com.microsoft ops: C last unless channels_last is 0, SiLU an attribute (`activation`).
MICROSOFT_GROUP_OPS = {"skip_group_norm", "group_norm"}
# Variants whose `when` takes one dtype of T: the 8-halves BatchNorm loads are float16 only,
# plane_subgroup_vec4_scalar_io float32 only.
ONE_DTYPE = {
    "plane_subgroup_vec4_scalar_io": "float32",
    "flat_inference_halves8": "float16",
}
WAVE32_ADAPTER = {"subgroupMinSize": 32, "subgroupMaxSize": 32}


@dataclass(frozen=True)
class Case:
    """One forced-variant call: shapes by bind key, dtypes by type variable (numpy names)."""

    op: str
    variant: str
    dtypes: dict
    shapes: dict
    attrs: dict = field(default_factory=dict)
    tunables: dict = field(default_factory=dict)
    outputs: tuple | None = None
    # Extra adapter facts the variant's `when` needs (plane_subgroup_vec4_scalar_io: a wave32
    # adapter); the shader must still be right at the device's real subgroup width.
    adapter_info: dict = field(default_factory=dict)
    tag: str = ""  # the layer family's optional tensors and outputs, for the id ("-b-stats")

    @property
    def id(self):
        dtypes = "-".join(name.replace("float", "f") for name in self.dtypes.values())
        return f"{self.op}-{self.variant}{self.flavour}-{dtypes}"

    @property
    def flavour(self):
        """SkipGroupNorm's optional tensors: `-bias` when a bias is given, `-sum` or `-plain` for S,
        then `-nchw` for that layout; com.microsoft GroupNorm's layout: `-nhwc` or `-nchw`; the layer
        family's tag."""
        if self.tag:
            return self.tag
        if self.op == "group_norm":
            return "-nhwc" if self.attrs["channels_last"] else "-nchw"
        if self.outputs is None:
            return ""
        members = ("-bias" if "bias" in self.shapes else "") + ("-sum" if "S" in self.outputs else "-plain")
        return members + ("" if self.attrs.get("channels_last", 1) else "-nchw")

    @property
    def needs_f16(self):
        """T (the tensors' type) or V (RMS's scale and Y) in float16 needs shader-f16; SkipGroupNorm's
        M does not."""
        return "float16" in (self.dtypes["T"], self.dtypes.get("V"))

    @property
    def only_dtype(self):
        """The one dtype of T the variant's `when` takes (ONE_DTYPE), else None."""
        return ONE_DTYPE.get(self.variant)

    @property
    def required_features(self):
        return tuple(getattr(PACKAGES[self.op], self.variant).REQUIRED_FEATURES)


def channel_axis(case):
    """The axis of C in the case's first input: -1 for a channels-last com.microsoft op and for the
    layer family (its parameters span the last axes), else 1."""
    channels_last = case.op in MICROSOFT_GROUP_OPS and case.attrs.get("channels_last", 1) != 0
    return -1 if channels_last or case.op in LAYER_FAMILY else 1


def _bn_shapes(x):
    c = (x[1],)
    return {"x": x, "scale": c, "b": c, "inputMean": c, "inputVar": c}


def _gn_shapes(x):
    return {"x": x, "scale": (x[1],), "bias": (x[1],)}


def _in_shapes(x):
    return {"input": x, "scale": (x[1],), "b": (x[1],)}


def _sgn_shapes(x, channels_last, bias, full_skip):
    c = x[3] if channels_last else x[1]
    shapes = {"X": x, "gamma": (c,), "beta": (c,), "skip": x if full_skip else (x[0], c)}
    if bias:
        shapes["bias"] = (c,)
    return shapes


def _mgn_shapes(x, channels_last):
    c = x[3] if channels_last else x[1]
    return {"X": x, "gamma": (c,), "beta": (c,)}


GN_SPLITS = {"STATS_VALUES_PER_SPLIT": 64, "SPLIT_STATS_MIN_HIDDEN": 1}
GN_REGISTERS = {"REGISTER_SPLIT_MIN_HIDDEN": 1, "REGISTER_WORKGROUP_SIZE": 20}
IN_SPLITS = {"SPLIT_STATS_MIN_SPATIAL": 1, "STATS_VALUES_PER_SPLIT": 8}
IN_BATCHED = {"WORKGROUP_SIZE": 16, "BATCHED_MIN_PLANES_PER_WORKGROUP": 1}
IN_REGISTERS = {"REGISTER_SPLIT_MIN_HIDDEN": 1, "REGISTER_WORKGROUP_SIZE": 20}
# Split-k in registers: 96 f32 / 48 f16 units a row in chunks of 20 x 3 / 20 x 2 units (2 chunks,
# the last one short), 20 invocations (a partial last subgroup at width 8).
CHUNK_UNITS = {"CHUNK_WORKGROUP_SIZE": 20, "CHUNK_UNITS_F32": 3, "CHUNK_UNITS_F16": 2}
GN_CHUNKS = {"SPLIT_STATS_MIN_HIDDEN": 1, **CHUNK_UNITS}
IN_CHUNKS = {"SPLIT_STATS_MIN_SPATIAL": 1, **CHUNK_UNITS}

# (op, variant, shapes, attrs, tunables, adapter_info): one small request each variant applies to.
_BASE = [
    ("batch_normalization", "inference_scalar", _bn_shapes((2, 3, 5, 3)), {}, {}, {}),
    ("batch_normalization", "nc_inference_vec4", _bn_shapes((3, 8)), {}, {}, {}),
    # float16 takes two vectors an invocation: a partial last block of each.
    ("batch_normalization", "nchw_inference_vec4", _bn_shapes((3, 7, 10, 8)), {}, {}, {}),
    ("batch_normalization", "flat_inference_vec4", _bn_shapes((2, 4, 7)), {}, {"WORKGROUP_SIZE": 4}, {}),
    # 8 halves a load: 9-value planes, so loads straddle channels and batch items.
    (
        "batch_normalization",
        "flat_inference_halves8",
        _bn_shapes((8, 3, 3, 3)),
        {},
        {"WORKGROUP_SIZE": 4},
        {},
    ),
    (
        "group_normalization",
        "group_stash_f16_serial",
        _gn_shapes((2, 6, 5, 7)),
        {"num_groups": 3, "stash_type": 10},
        {},
        {},
    ),
    ("group_normalization", "group_splitk", _gn_shapes((2, 6, 5, 7)), {"num_groups": 3}, GN_SPLITS, {}),
    ("group_normalization", "group_splitk_vec4", _gn_shapes((2, 6, 4, 24)), {"num_groups": 2}, GN_SPLITS, {}),
    (
        "group_normalization",
        "group_splitk_vec4_pairs",
        _gn_shapes((2, 3, 4, 25)),
        {"num_groups": 1},
        {**GN_SPLITS, "SPLIT_WORKGROUP_SIZE": 4},
        {},
    ),
    ("group_normalization", "group_subgroup_vec4", _gn_shapes((2, 6, 12, 10)), {"num_groups": 3}, {}, {}),
    ("group_normalization", "group_subgroup", _gn_shapes((2, 6, 9, 11)), {"num_groups": 2}, {}, {}),
    # Two workgroups a row of 96 f32 / 48 f16 units, 20 invocations: a partial last subgroup at
    # width 8, a tail in the last unit row (5 and 3 units an invocation).
    (
        "group_normalization",
        "group_row_registers",
        _gn_shapes((2, 6, 12, 16)),
        {"num_groups": 3},
        GN_REGISTERS,
        {},
    ),
    (
        "group_normalization",
        "group_splitk_registers",
        _gn_shapes((2, 6, 12, 16)),
        {"num_groups": 3},
        GN_CHUNKS,
        {},
    ),
    ("instance_normalization", "plane_batched_vec4", _in_shapes((2, 9, 12)), {}, IN_BATCHED, {}),
    ("instance_normalization", "plane_subgroup_vec4", _in_shapes((2, 3, 12, 12)), {}, {}, {}),
    (
        "instance_normalization",
        "plane_subgroup_vec4_scalar_io",
        _in_shapes((2, 3, 128)),
        {},
        {},
        WAVE32_ADAPTER,
    ),
    ("instance_normalization", "plane_subgroup", _in_shapes((2, 3, 9, 11)), {}, {}, {}),
    ("instance_normalization", "plane_splitk_vec4", _in_shapes((2, 3, 40)), {}, IN_SPLITS, {}),
    ("instance_normalization", "plane_splitk", _in_shapes((2, 3, 37)), {}, IN_SPLITS, {}),
    # Two workgroups a plane of 96 f32 / 48 f16 units, 20 invocations: a partial last subgroup at
    # width 8, a tail in the last unit row (5 and 3 units an invocation).
    ("instance_normalization", "plane_row_registers", _in_shapes((2, 3, 16, 24)), {}, IN_REGISTERS, {}),
    ("instance_normalization", "plane_splitk_registers", _in_shapes((2, 3, 16, 24)), {}, IN_CHUNKS, {}),
]


def _sgn_base():
    """The three SkipGroupNorm variants with and without a bias and S, both layouts, both skip
    forms, SiLU on and off."""
    base = []
    for i, (family, member) in enumerate(
        (f, m) for m in ("bias_sum", "bias_plain", "sum", "plain") for f in ("split", "fused")
    ):
        channels_last = i % 2
        x = (2, 5, 6, 24) if channels_last else (2, 24, 5, 6)
        shapes = _sgn_shapes(x, channels_last, member.startswith("bias"), full_skip=i % 4 < 2)
        attrs = {"groups": 4, "activation": (i // 2) % 2, "channels_last": channels_last}
        outputs = ("Y", "S") if member.endswith("sum") else ("Y",)
        tunables = {"WORKGROUP_SIZE": 16, "SLAB_VALUES": 64}
        base.append(("skip_group_norm", family, shapes, attrs, tunables, {}, outputs))
    # registers, channels-last: 10 channels a group, 5 x 4 = 20 invocations (a partial last
    # subgroup at widths 8 and 16, full at 4), 30 positions (a tail), two workgroups a row. NCHW:
    # 6 channels a group x 4 lanes = 24 invocations (a partial last subgroup at width 16), 15 units
    # a channel (f32 2 values, f16 2 halves: a tail, and spare bucket units), two workgroups a row.
    tunables = {
        "REGISTER_SPLIT_MIN_VALUES": 1,
        "REGISTER_WORKGROUP_SIZE": 16,
        "REGISTER_MIN_POSITION_LANES": 4,
    }
    for channels_last, x in ((1, (2, 5, 6, 40)), (0, (2, 24, 5, 6))):
        for i, member in enumerate(("bias_sum", "bias_plain", "sum", "plain")):
            shapes = _sgn_shapes(
                x, channels_last, member.startswith("bias"), full_skip=(i + channels_last) % 2 == 1
            )
            attrs = {"groups": 4, "activation": i % 2, "channels_last": channels_last}
            outputs = ("Y", "S") if member.endswith("sum") else ("Y",)
            base.append(("skip_group_norm", "registers", shapes, attrs, tunables, {}, outputs))
    return base


# Row in registers: 96 values a row (24 f32 / 12 f16 units) over teams of at most 20 invocations of
# one unit each, three teams a workgroup (f32: 60 invocations, a partial last subgroup at width 8),
# or rows of 240 f32 values over 20 invocations of 3 units (the bucket of 4: a spare unit each).
LN_REGISTERS = {
    "REGISTER_WORKGROUP_SIZE": 20,
    "REGISTER_TARGET_VALUES": 1,
    "REGISTER_SHARED_WORKGROUP_SIZE": 60,
}
LN_ROWS = {"WORKGROUP_SIZE": 16}  # rows of 40 and 7 values over 16 invocations


def _layer_base():
    """(op, variant, shapes, attrs, tunables, outputs, tag, dtype pairs) of the layer family: every
    variant with its optional inputs and outputs on in one case and off in another, Scale and B
    broadcast, the skip of the Skip forms full and repeated over the batch."""
    same = (("float32", "float32"), ("float16", "float16"))
    mixed = same + (("float16", "float32"), ("float32", "float16"))
    ln_stats = ("y", "mean", "invStdDev")
    skip_all = ("output", "mean", "inv_std_var", "input_skip_bias_sum")
    simple_all = ("output", "inv_std_var", "input_skip_bias_sum")
    return [
        (
            "layer_normalization",
            "row_registers",
            {"x": (2, 5, 96), "scale": (96,), "b": (96,)},
            {"axis": -1},
            LN_REGISTERS,
            ln_stats,
            "-b-stats",
            same,
        ),
        (
            "layer_normalization",
            "row_registers",
            {"x": (2, 3, 4, 60), "scale": (4, 60)},
            {"axis": 2},
            LN_REGISTERS,
            ("y",),
            "-plain",
            same,
        ),
        (
            "layer_normalization",
            "row_vec4",
            {"x": (2, 3, 5, 8), "scale": (5, 8), "b": (1, 8)},
            {"axis": 2},
            LN_ROWS,
            ("y", "invStdDev"),
            "-b-inv",
            same,
        ),
        (
            "layer_normalization",
            "row_scalar",
            {"x": (3, 5, 7), "scale": (7,)},
            {"axis": -1, "epsilon": 1e-3},
            LN_ROWS,
            ("y", "mean"),
            "-mean",
            same,
        ),
        (
            "rms_normalization",
            "row_registers",
            {"x": (2, 5, 96), "scale": (96,)},
            {},
            LN_REGISTERS,
            None,
            "",
            same,
        ),
        (
            "rms_normalization",
            "row_vec4",
            {"x": (2, 3, 5, 8), "scale": (1, 8)},
            {"axis": 2},
            LN_ROWS,
            None,
            "",
            mixed,
        ),
        ("rms_normalization", "row_scalar", {"x": (3, 5, 7), "scale": (7,)}, {}, LN_ROWS, None, "", mixed),
        (
            "simplified_layer_normalization",
            "row_registers",
            {"x": (2, 5, 96), "scale": (96,)},
            {},
            LN_REGISTERS,
            ("y", "inv_std_var"),
            "-inv",
            same,
        ),
        (
            "simplified_layer_normalization",
            "row_vec4",
            {"x": (4, 40), "scale": (40,)},
            {},
            LN_ROWS,
            ("y", "inv_std_var"),
            "-inv",
            same,
        ),
        (
            "simplified_layer_normalization",
            "row_scalar",
            {"x": (3, 5, 7), "scale": (7,)},
            {"axis": 1},
            LN_ROWS,
            ("y",),
            "-plain",
            (("float16", "float32"), ("float32", "float16")),
        ),
        (
            "skip_layer_normalization",
            "row_registers",
            {"input": (2, 5, 96), "skip": (5, 96), "gamma": (96,), "beta": (96,), "bias": (96,)},
            {},
            LN_REGISTERS,
            skip_all,
            "-beta-bias-all",
            same,
        ),
        (
            "skip_layer_normalization",
            "row_registers",
            {"input": (10, 96), "skip": (10, 96), "gamma": (96,)},
            {},
            LN_REGISTERS,
            ("output",),
            "-plain",
            same,
        ),
        (
            "skip_layer_normalization",
            "row_vec4",
            {"input": (2, 3, 40), "skip": (2, 3, 40), "gamma": (40,), "beta": (40,)},
            {"epsilon": 1e-5},
            LN_ROWS,
            ("output", "input_skip_bias_sum"),
            "-beta-sum",
            same,
        ),
        (
            "skip_layer_normalization",
            "row_scalar",
            {"input": (2, 3, 7), "skip": (1, 3, 7), "gamma": (7,), "bias": (7,)},
            {},
            LN_ROWS,
            skip_all,
            "-bias-all",
            same,
        ),
        (
            "skip_simplified_layer_normalization",
            "row_registers",
            {"input": (2, 5, 96), "skip": (5, 96), "gamma": (96,), "bias": (96,)},
            {},
            LN_REGISTERS,
            simple_all,
            "-bias-all",
            same,
        ),
        (
            "skip_simplified_layer_normalization",
            "row_vec4",
            {"input": (2, 3, 40), "skip": (2, 3, 40), "gamma": (40,)},
            {},
            LN_ROWS,
            ("output", "input_skip_bias_sum"),
            "-sum",
            same,
        ),
        (
            "skip_simplified_layer_normalization",
            "row_scalar",
            {"input": (2, 3, 7), "skip": (3, 7), "gamma": (7,), "bias": (7,)},
            {},
            LN_ROWS,
            ("output", "inv_std_var"),
            "-bias-inv",
            same,
        ),
    ]


def _mgn_base():
    """com.microsoft GroupNorm: split and fused in both layouts, registers channels-last, SiLU on
    and off; the shapes and tunables of the SkipGroupNorm cases above (the same shaders, no skip)."""
    base = []
    for i, (family, channels_last) in enumerate(((f, c) for f in ("split", "fused") for c in (1, 0))):
        x = (2, 5, 6, 24) if channels_last else (2, 24, 5, 6)
        attrs = {"groups": 4, "activation": i % 2, "channels_last": channels_last}
        tunables = {"WORKGROUP_SIZE": 16, "SLAB_VALUES": 64}
        base.append(("group_norm", family, _mgn_shapes(x, channels_last), attrs, tunables, {}, None))
    tunables = {
        "REGISTER_SPLIT_MIN_VALUES": 1,
        "REGISTER_WORKGROUP_SIZE": 16,
        "REGISTER_MIN_POSITION_LANES": 4,
    }
    attrs = {"groups": 4, "activation": 1, "channels_last": 1}
    base.append(("group_norm", "registers", _mgn_shapes((2, 5, 6, 40), 1), attrs, tunables, {}, None))
    return base


def all_cases():
    """Every variant of every op, with T in float32 and float16 (and SkipGroupNorm's and
    com.microsoft GroupNorm's M in both, RMS's V with T and apart)."""
    cases = []
    for op, variant, shapes, attrs, tunables, info in _BASE:
        for t in ("float32", "float16"):
            cases.append(Case(op, variant, {"T": t}, shapes, attrs, tunables, None, info))
    for op, variant, shapes, attrs, tunables, info, outputs in _sgn_base() + _mgn_base():
        for t in ("float32", "float16"):
            for m in ("float32", "float16"):
                cases.append(Case(op, variant, {"T": t, "M": m}, shapes, attrs, tunables, outputs, info))
    for op, variant, shapes, attrs, tunables, outputs, tag, pairs in _layer_base():
        has_v = "V" in PACKAGES[op].TYPE_CONSTRAINTS
        for t, v in pairs:
            dtypes = {"T": t, "V": v} if has_v else {"T": t}
            cases.append(Case(op, variant, dtypes, shapes, attrs, tunables, outputs, {}, tag))
    return cases


# ---------------------------------------------------------------------------------------------
# Inputs and references


def random_inputs(case, rng):
    """Data away from zero with spreads that differ per channel, so a mixed-up element shows; each
    input in the dtype of its type variable."""
    type_vars = {spec.key: spec.type_var for spec in PACKAGES[case.op].INPUTS}
    # The mean up to 2 spreads from zero; a tenth for stash_type=10, whose float16 reference
    # statistics (E[x^2] - E[x]^2) cancel away from zero.
    offset = 0.1 if case.attrs.get("stash_type") == 10 else 2.0
    inputs = {}
    for key, shape in case.shapes.items():
        if len(shape) > 1 and key not in ("skip",):
            spread = rng.uniform(0.5, 3.0)
            values = (rng.standard_normal(shape) + rng.uniform(-offset, offset)) * spread
        elif key == "skip":
            values = rng.standard_normal(shape) * rng.uniform(0.2, 1.5) + rng.uniform(-1, 1)
        elif key == "inputVar":
            values = rng.uniform(0.1, 3, shape)
        else:
            values = rng.uniform(-2, 2, shape)
        inputs[key] = values.astype(case.dtypes[type_vars[key]])
    return inputs


def reference(case, inputs):
    """{output key: float64 reference} from tests/oracles.py."""
    a = case.attrs
    if case.op in LAYER_FAMILY:
        return node_reference(PACKAGES[case.op], inputs, a)
    if case.op == "batch_normalization":
        return {"y": batch_normalization_ref(*inputs.values(), a.get("epsilon", 1e-5))}
    if case.op == "group_normalization":
        return {"y": group_normalization_ref(inputs["x"], inputs["scale"], inputs["bias"], **a)}
    if case.op == "instance_normalization":
        return {"output": instance_normalization_ref(inputs["input"], inputs["scale"], inputs["b"])}
    if case.op == "group_norm":
        y = microsoft_group_norm_ref(
            inputs["X"],
            inputs["gamma"],
            inputs["beta"],
            a["groups"],
            a.get("epsilon", 1e-5),
            a["activation"],
            a["channels_last"],
        )
        return {"Y": y}
    y, s = skip_group_norm_ref(
        inputs["X"],
        inputs["gamma"],
        inputs["beta"],
        inputs["skip"],
        inputs.get("bias"),
        a["groups"],
        a.get("epsilon", 1e-5),
        a["activation"],
        a["channels_last"],
        inputs["X"].dtype,
    )
    return {"Y": y, "S": s}


def compare(case, inputs, actual, ref, context):
    """AssertionError when an output is out of tolerance.

    stash_type=10 computes its normalized values in float16 as the spec prescribes: docs/TESTING.md's f16
    tolerance on them, carried through scale (tests/kernels/group_norm_support.py's assert_close_f16_stage says why).
    """
    if case.attrs.get("stash_type") == 10:
        from tests.kernels.group_norm_support import assert_close_f16_stage, spec_normalized

        normalized = spec_normalized(inputs, case.attrs)
        assert_close_f16_stage(actual["y"], ref["y"], normalized, inputs["scale"], inputs["x"].dtype, context)
        return
    for key, value in actual.items():
        assert_close(value, ref[key], np.asarray(value).dtype, f"{context} {key}")


# ---------------------------------------------------------------------------------------------
# Running


def profile_caps(device):
    """What plans see on a profile: the device's snapshot, plus `subgroup_id` where it has subgroups.

    wgpu reports no WGSL language features; naga accepts `subgroup_id` wherever subgroups work, and
    claiming it lets the subgroup-combine paths (the ones a subgroup width can break) be planned.
    """
    caps = device_caps(device)
    if "subgroups" in caps.features:
        caps = dataclasses.replace(caps, wgsl_language_features=frozenset({"subgroup_id"}))
    return caps


def device_for(case):
    """(the default device, its profile_caps) for a pytest test of `case`; skips the test where
    the device lacks a feature the case's variant requires."""
    import pytest

    device = default_device()
    caps = profile_caps(device)
    missing = [f for f in case.required_features if f not in caps.features]
    if missing:
        pytest.skip(f"the device lacks {missing}")
    return device, caps


def call_case(case, inputs, device, caps):
    """The case's forced-variant call on `inputs`, into NaN-poisoned outputs: {output key: array}."""
    package = PACKAGES[case.op]
    if case.adapter_info:
        caps = dataclasses.replace(caps, adapter_info={**caps.adapter_info, **case.adapter_info})
    outputs = case.outputs or (package.OUTPUTS[0].key,)
    shapes = {key: value.shape for key, value in inputs.items()}
    dtypes = {t: np.dtype(name).name for t, name in case.dtypes.items()}
    plan = package.plan(
        shapes,
        dtypes,
        case.attrs,
        outputs=outputs,
        caps=caps,
        variant=case.variant,
        tunables=case.tunables or None,
    )
    out = {
        key: Tensor.from_numpy(np.full(shape, np.nan, dtype), device)
        for key, (shape, dtype) in plan.outputs.items()
    }
    return package.kernel(
        inputs,
        attrs=case.attrs,
        outputs=case.outputs,
        device=device,
        caps=caps,
        variant=case.variant,
        tunables=case.tunables or None,
        out=out,
    )


def run_case(case, device, caps, profile, seed):
    """The case on `device` with NaN-poisoned outputs, judged against the float64 reference."""
    rng = np.random.default_rng([seed, zlib.crc32(f"{profile}/{case.id}".encode())])
    inputs = random_inputs(case, rng)
    context = f"{profile} {case.id} {case.shapes} {case.attrs} {case.tunables} {seed_note(seed)}"
    try:
        result = call_case(case, inputs, device, caps)
    except ContractError as error:
        return {"outcome": "refused", "message": str(error)}
    except Exception:
        return {"outcome": "error", "message": f"{context}\n{traceback.format_exc()}"}
    try:
        compare(case, inputs, result, reference(case, inputs), context)
    except AssertionError as error:
        return {"outcome": "wrong", "message": str(error)}
    return {"outcome": "right", "message": ""}


def measured_subgroup_size(device):
    """The subgroup_size builtin in a 64-wide 1-D workgroup on `device` (doctor's probe), or None."""
    from generated.doctor import measured_subgroup_width

    sizes = measured_subgroup_width(device)
    return sizes if sizes is None or len(sizes) != 1 else sizes[0]


def device_facts(device, caps):
    info = device.adapter_info
    return {
        "backend": info.get("backend_type"),
        "adapter": info.get("device"),
        "features": sorted(caps.features),
        "limits": dict(caps.limits),
        "subgroup_size": measured_subgroup_size(device),
    }


def run_all(device, profile, seed=None):
    """{"facts": device facts, "outcomes": {case id: outcome}} for every case on one device."""
    seed = run_seed() if seed is None else seed
    caps = profile_caps(device)
    outcomes = {case.id: run_case(case, device, caps, profile, seed) for case in all_cases()}
    return {"facts": device_facts(device, caps), "outcomes": outcomes, "seed": seed}


# ---------------------------------------------------------------------------------------------
# Devices of the in-process profiles, from the default device's adapter


def no_features_device():
    """A device asked for no optional feature (and the adapter's limits, wgpu's default)."""
    return default_device().adapter.request_device_sync(required_features=[])


def spec_limits_device():
    """A device with the default device's features and exactly WebGPU's default limits.

    wgpu-py requests the adapter's limits unless told otherwise; its names are kebab case with
    "1D" as "-1d", matched here with the dashes removed and the case folded.
    """
    adapter = default_device().adapter
    native = {name.replace("-", "").lower(): name for name in adapter.limits}
    limits = {native[name.lower()]: value for name, value in WEBGPU_DEFAULT_LIMITS.items()}
    features = [f for f in ("shader-f16", "subgroup", "timestamp-query") if f in adapter.features]
    return adapter.request_device_sync(required_features=features, required_limits=limits)


def main(argv):
    """Child process entry: run every case on this process's default device, print one JSON line."""
    (profile,) = argv
    try:
        device = default_device()
    except RuntimeError as error:
        print("RESULT " + json.dumps({"no_adapter": str(error)}))
        return 0
    print("RESULT " + json.dumps(run_all(device, profile)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
