"""ONNX operator versions, from the ONNX operator changelog (docs/Changelog.md, `onnx.defs`).

Hard-coded, not read from `onnx` at compile time: the compiler does not depend on onnx, and a
build must not change with the onnx installed. tests/tools/test_onnx_nodes.py checks these tables
against `onnx.defs` (onnx 1.23, opset 28).
"""

from __future__ import annotations

# (domain, op_type) -> every since_version of the op: a version is the op's definition from its
# since_version up to the opset before the next one.
ONNX_VERSIONS = {
    ("ai.onnx", "BatchNormalization"): (1, 6, 7, 9, 14, 15),
    ("ai.onnx", "GroupNormalization"): (18, 21),
    ("ai.onnx", "InstanceNormalization"): (1, 6, 22),
    ("ai.onnx", "LayerNormalization"): (17,),
    ("ai.onnx", "RMSNormalization"): (23,),
    # ONNX Runtime registers this contrib op in the ai.onnx domain at version 1 (contrib_defs.cc), so
    # it serves every ai.onnx opset; onnx.defs does not know it.
    ("ai.onnx", "SimplifiedLayerNormalization"): (1,),
    # ONNX Runtime's contrib domain: one version (docs/ContribOperators.md).
    ("com.microsoft", "SkipGroupNorm"): (1,),
    ("com.microsoft", "SimplifiedLayerNormalization"): (1,),
    ("com.microsoft", "SkipLayerNormalization"): (1,),
    ("com.microsoft", "SkipSimplifiedLayerNormalization"): (1,),
}

# Ops of ONNX Runtime's contrib set that onnx.defs does not define although they sit in the ai.onnx domain
# (tests/test_onnx_nodes.py checks the others against onnx.defs).
NOT_IN_ONNX_DEFS = {("ai.onnx", "SimplifiedLayerNormalization")}

# Other versions a package runs: (domain, op_type, since_version) -> (the package's version, how).
# Each differs from the package's version only as the note says; onnx_nodes.run_node applies it.
COMPATIBLE_VERSIONS = {
    ("ai.onnx", "BatchNormalization", 9): (
        15,
        "no training_mode attribute (inference only) and one type for every input; the same inference output",
    ),
    ("ai.onnx", "BatchNormalization", 14): (
        15,
        "input_mean and input_var may have a type of their own (U), as in 15 (run_node runs such a node "
        "in float32 and rounds Y to X's type); the same inference output",
    ),
    ("ai.onnx", "GroupNormalization", 18): (
        21,
        "scale and bias are per group, (num_groups,): run_node repeats each over its group's channels "
        "(what opset 21 changed), and the statistics are computed in float32 (stash_type 1)",
    ),
    ("ai.onnx", "InstanceNormalization", 22): (
        6,
        "22 only adds bfloat16 to T; float32 and float16 are computed as in 6",
    ),
}

# The same op written in another domain: (domain, op_type, since_version) -> ((domain, op_type,
# since_version) of the package that runs it, how). run_node runs such a node as the package's own.
OTHER_DOMAIN_VERSIONS = {
    ("com.microsoft", "SimplifiedLayerNormalization", 1): (
        ("ai.onnx", "SimplifiedLayerNormalization", 1),
        "some exporters write ONNX Runtime's ai.onnx SimplifiedLayerNormalization in the com.microsoft "
        "domain; the same op",
    ),
}
