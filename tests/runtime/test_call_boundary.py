"""The call boundary for apps: kernel(encoder=), Sequence, warmup(), bounded caches, reuse.

Every result is compared bit for bit with a plain kernel() call of the same plan, which the
kernel test files compare with the float64 references.
"""

from __future__ import annotations

import numpy as np
import pytest

from generated import Sequence
from generated import _runtime as rt
from generated import batch_normalization as bn
from generated import group_normalization as gn
from generated import instance_normalization as inn
from generated import skip_group_norm as sgn
from generated._runtime import ContractError, Tensor, default_device

from tests.oracles import assert_close, group_normalization_ref, rng_for, seed_note

SPLIT = {"STATS_VALUES_PER_SPLIT": 64, "SPLIT_STATS_MIN_HIDDEN": 1}  # GroupNorm split-k on small rows


def bn_inputs(rng, dtype, shape=(2, 8, 4, 4)):
    c = shape[1]
    return {
        "x": rng.standard_normal(shape).astype(dtype),
        "scale": rng.uniform(-2, 2, c).astype(dtype),
        "b": rng.uniform(-1, 1, c).astype(dtype),
        "inputMean": rng.uniform(-1, 1, c).astype(dtype),
        "inputVar": rng.uniform(0.1, 2, c).astype(dtype),
    }, {}


def gn_inputs(rng, dtype, shape=(2, 8, 6, 5)):
    c = shape[1]
    inputs = {
        "x": (rng.standard_normal(shape) * 2 + 1).astype(dtype),
        "scale": rng.uniform(-2, 2, c).astype(dtype),
        "bias": rng.uniform(-1, 1, c).astype(dtype),
    }
    return inputs, {"num_groups": 4}


def in_inputs(rng, dtype, shape=(2, 4, 8, 4)):
    c = shape[1]
    return {
        "input": rng.standard_normal(shape).astype(dtype),
        "scale": rng.uniform(-2, 2, c).astype(dtype),
        "b": rng.uniform(-1, 1, c).astype(dtype),
    }, {}


def sgn_inputs(rng, dtype, shape=(2, 4, 4, 8)):
    c = shape[-1]
    inputs = {
        "X": rng.standard_normal(shape).astype(dtype),
        "gamma": rng.uniform(-2, 2, c).astype(dtype),
        "beta": rng.uniform(-1, 1, c).astype(dtype),
        "skip": rng.standard_normal(shape).astype(dtype),
        "bias": rng.uniform(-1, 1, c).astype(dtype),
    }
    return inputs, {"groups": 2, "activation": 1}


OPS = {"bn": (bn, bn_inputs), "gn": (gn, gn_inputs), "in": (inn, in_inputs), "sgn": (sgn, sgn_inputs)}


def variants_of(package, dtype, inputs, attrs):
    """Every variant that applies to this request (a forced one that does not is refused)."""
    shapes = {k: v.shape for k, v in inputs.items()}
    dtypes = {tv: np.dtype(dtype).name for tv in package.TYPE_CONSTRAINTS}
    found = []
    for c in package.CANDIDATES:
        outputs = tuple(t.key for t in package.OUTPUTS) if "sum" in c.ID else None
        try:
            package.plan(
                shapes,
                dtypes,
                attrs,
                device=default_device(),
                variant=c.ID,
                tunables=SPLIT if package is gn else None,
                outputs=outputs,
            )
        except ContractError:
            continue
        found.append((c.ID, outputs))
    return found


CASES = [(op, dtype) for op in OPS for dtype in (np.float32, np.float16)]


@pytest.mark.parametrize("op,dtype", CASES, ids=[f"{o}-{np.dtype(d).name}" for o, d in CASES])
def test_encoder_is_bit_identical_to_kernel_for_every_variant(op, dtype, request):
    package, make = OPS[op]
    rng, seed = rng_for(request.node.name)
    inputs, attrs = make(rng, dtype)
    tensors = {k: Tensor.from_numpy(v) for k, v in inputs.items()}
    tunables = SPLIT if package is gn else None
    variants = variants_of(package, dtype, inputs, attrs)
    assert len(variants) >= 2, variants
    device = default_device()
    for variant, outputs in variants:
        plain = package.kernel(inputs, attrs=attrs, variant=variant, tunables=tunables, outputs=outputs)
        encoder = device.create_command_encoder()
        recorded = package.kernel(
            tensors, attrs=attrs, variant=variant, tunables=tunables, outputs=outputs, encoder=encoder
        )
        device.queue.submit([encoder.finish()])
        for key in plain:
            assert isinstance(recorded[key], Tensor)
            assert (
                recorded[key].numpy().tobytes() == plain[key].tobytes()
            ), f"{op} {variant} {key}, {seed_note(seed)}"


def test_encoder_mixes_with_the_callers_own_commands_in_one_submission(request):
    """The caller copies new data into x, we normalize, the caller copies y away: one submit."""
    rng, seed = rng_for(request.node.name)
    device = default_device()
    inputs, attrs = gn_inputs(rng, np.float32)
    fresh = (rng.standard_normal(inputs["x"].shape) * 3 - 2).astype(np.float32)
    x = Tensor.from_numpy(inputs["x"])
    staging = Tensor.from_numpy(fresh)
    scale, bias = Tensor.from_numpy(inputs["scale"]), Tensor.from_numpy(inputs["bias"])
    y = Tensor.empty(x.shape, np.float32)
    kept = Tensor.empty(x.shape, np.float32)
    encoder = device.create_command_encoder()
    encoder.copy_buffer_to_buffer(staging.buffer, 0, x.buffer, 0, x.nbytes)
    result = gn.kernel({"x": x, "scale": scale, "bias": bias}, attrs=attrs, out={"y": y}, encoder=encoder)
    encoder.copy_buffer_to_buffer(y.buffer, 0, kept.buffer, 0, y.nbytes)
    assert result["y"] is y
    device.queue.submit([encoder.finish()])
    ref = group_normalization_ref(fresh, inputs["scale"], inputs["bias"], attrs["num_groups"])
    assert_close(kept.numpy(), ref, np.float32, f"copied result, {seed_note(seed)}")


def test_encoder_takes_tensors_only_and_keeps_every_refusal():
    rng, _ = rng_for("encoder-refusals")
    inputs, attrs = gn_inputs(rng, np.float32)
    encoder = default_device().create_command_encoder()
    with pytest.raises(
        ContractError, match="input x: encoder= records GPU work, so every input must be a Tensor"
    ):
        gn.kernel(inputs, attrs=attrs, encoder=encoder)
    tensors = {k: Tensor.from_numpy(v) for k, v in inputs.items()}
    with pytest.raises(ContractError, match="num_groups"):
        gn.kernel(tensors, attrs={"num_groups": 3}, encoder=encoder)
    with pytest.raises(ContractError, match="no aliasing"):
        gn.kernel(tensors, attrs=attrs, out={"y": tensors["x"]}, encoder=encoder)


def chain(seq_or_none, tensors, encoder=None):
    """BatchNorm -> GroupNorm (split-k, with intermediates) -> InstanceNorm, on Tensors."""

    def call(package, inputs, **kwargs):
        if seq_or_none is not None:
            return seq_or_none.kernel(package, inputs, **kwargs)
        return package.kernel(inputs, **kwargs)

    y1 = call(bn, {k: tensors[k] for k in ("x", "scale", "b", "inputMean", "inputVar")})["y"]
    y2 = call(
        gn,
        {"x": y1, "scale": tensors["scale"], "bias": tensors["b"]},
        attrs={"num_groups": 4},
        variant="group_splitk",
        tunables=SPLIT,
    )["y"]
    return call(inn, {"input": y2, "scale": tensors["scale"], "b": tensors["b"]})["output"]


def test_sequence_replays_a_chain_after_its_inputs_change(request):
    rng, seed = rng_for(request.node.name)
    device = default_device()
    inputs, _ = bn_inputs(rng, np.float32, (2, 8, 8, 8))
    tensors = {k: Tensor.from_numpy(v) for k, v in inputs.items()}
    seq = Sequence(device)
    out = chain(seq, tensors)
    assert len(seq) == 3
    created = rt.pipelines_created()
    for round_ in range(5):
        x = (rng.standard_normal(inputs["x"].shape) * (round_ + 1) + round_).astype(np.float32)
        device.queue.write_buffer(tensors["x"].buffer, 0, x.tobytes())
        seq.run()
        expected = chain(None, {**tensors, "x": Tensor.from_numpy(x)})
        assert out.numpy().tobytes() == expected.numpy().tobytes(), f"round {round_}, {seed_note(seed)}"
    assert rt.pipelines_created() == created, "run() must create nothing"


def test_sequence_of_every_op_runs_many_times(request):
    rng, seed = rng_for(request.node.name)
    seq = Sequence()
    expected = {}
    results = {}
    for op, (package, make) in OPS.items():
        inputs, attrs = make(rng, np.float32)
        tensors = {k: Tensor.from_numpy(v) for k, v in inputs.items()}
        results[op] = seq.kernel(package, tensors, attrs=attrs)
        expected[op] = package.kernel(inputs, attrs=attrs)
    for _ in range(20):
        seq.run()
    for op in OPS:
        for key, value in expected[op].items():
            assert results[op][key].numpy().tobytes() == value.tobytes(), f"{op} {key}, {seed_note(seed)}"


def test_sequence_refuses_what_kernel_refuses():
    rng, _ = rng_for("sequence-refusals")
    inputs, attrs = gn_inputs(rng, np.float32)
    seq = Sequence()
    with pytest.raises(ContractError, match="Sequence.kernel\\(\\) records GPU work"):
        seq.kernel(gn, inputs, attrs=attrs)
    tensors = {k: Tensor.from_numpy(v) for k, v in inputs.items()}
    with pytest.raises(ContractError, match="num_groups"):
        seq.kernel(gn, tensors, attrs={"num_groups": 5})
    # a ContractError like every other misuse (it was a TypeError: issue 25 item 5)
    with pytest.raises(ContractError, match="Sequence.kernel\\(\\): op: takes an op module"):
        seq.kernel("group_normalization", tensors, attrs=attrs)
    assert len(seq) == 0


def test_warmup_creates_every_pipeline_a_call_needs():
    rng, _ = rng_for("warmup")
    inputs, attrs = gn_inputs(rng, np.float32, (2, 8, 6, 7))
    shapes = {k: v.shape for k, v in inputs.items()}
    plan = gn.warmup(shapes, {"T": "float32"}, attrs, variant="group_splitk", tunables=SPLIT)
    assert plan.variant == "group_splitk"
    created = rt.pipelines_created()
    gn.kernel(inputs, attrs=attrs, variant="group_splitk", tunables=SPLIT)
    assert rt.pipelines_created() == created
    assert gn.warmup(shapes, {"T": "float32"}, attrs, variant="group_splitk", tunables=SPLIT) is plan


def test_repeated_calls_on_the_same_tensors_build_no_bind_group(monkeypatch):
    rng, _ = rng_for("bind-groups")
    inputs, attrs = in_inputs(rng, np.float32)
    tensors = {k: Tensor.from_numpy(v) for k, v in inputs.items()}
    out = {"output": Tensor.empty(inputs["input"].shape, np.float32)}
    inn.kernel(tensors, out=out)
    device = default_device()
    made = []
    original = type(device).create_bind_group
    monkeypatch.setattr(
        type(device), "create_bind_group", lambda self, **kw: made.append(1) or original(self, **kw)
    )
    for _ in range(5):
        inn.kernel(tensors, out=out)
    assert made == []
    inn.kernel({**tensors, "input": Tensor.from_numpy(inputs["input"])}, out=out)  # a new buffer
    assert made != []


def test_a_loop_that_drops_two_fresh_outputs_builds_no_bind_group(monkeypatch):
    """A call with two fresh outputs (SkipGroupNorm's Y and S) in a loop that drops its results: each
    output gets back the buffer the recorded call binds, whatever order the two were given back in
    (the pool handed them out the other way round before, so every call took the full path)."""
    rng, seed = rng_for("two-fresh-outputs")
    shape = (1, 4, 4, 64)
    tensors = {
        "X": Tensor.from_numpy(rng.standard_normal(shape).astype(np.float32)),
        "skip": Tensor.from_numpy(rng.standard_normal(shape).astype(np.float32)),
        "gamma": Tensor.from_numpy(rng.uniform(0.5, 1.5, 64).astype(np.float32)),
        "beta": Tensor.from_numpy(rng.standard_normal(64).astype(np.float32)),
    }
    attrs = {"groups": 8, "activation": 0, "channels_last": 1}
    first = sgn.kernel(tensors, attrs=attrs, outputs=("Y", "S"))
    expected = {k: v.numpy() for k, v in first.items()}
    del first
    device = default_device()
    made = []
    original = type(device).create_bind_group
    monkeypatch.setattr(
        type(device), "create_bind_group", lambda self, **kw: made.append(1) or original(self, **kw)
    )
    for _ in range(5):
        results = sgn.kernel(tensors, attrs=attrs, outputs=("Y", "S"))
        got = {k: v.numpy() for k, v in results.items()}
        del results
    assert made == [], seed_note(seed)
    assert all(got[k].tobytes() == expected[k].tobytes() for k in expected), seed_note(seed)


def test_caches_stay_bounded_over_many_changing_shapes(monkeypatch):
    device = default_device()
    pipelines = rt.per_device(rt.pipeline_cache, device, rt.PIPELINE_CACHE_SIZE)
    monkeypatch.setattr(pipelines, "maxsize", 8)
    monkeypatch.setattr(rt.plan_cache, "maxsize", 64)
    rng, _ = rng_for("bounded")
    for hw in range(1, 41):
        inputs, attrs = gn_inputs(rng, np.float32, (1, 4, hw, 3))
        gn.kernel(inputs, attrs={"num_groups": 2})
    assert len(pipelines) <= 8 and len(rt.plan_cache) <= 64
    for n in range(10_000):  # plans alone: no GPU work
        gn.plan(
            {"x": (1 + n % 7, 8, 1 + n // 7, 3), "scale": (8,), "bias": (8,)},
            {"T": "float32"},
            {"num_groups": 2},
        )
    assert len(rt.plan_cache) <= 64
    assert all(
        len(cache) <= cache.maxsize
        for caches in (rt.uniform_buffer_cache, rt.bind_group_cache, rt.scratch_pool)
        for cache in caches.values()
    )


@pytest.mark.skipif(np.lib.NumpyVersion(np.__version__) < "2.0.0", reason="NumPy 1.x has no copy= in asarray")
def test_a_read_back_is_always_a_copy():
    """NumPy's copy=False means "no copy or an error": a read-back from the GPU is always a copy (it
    silently copied before)."""
    rng, _ = rng_for("tensor-copy")
    inputs, attrs = gn_inputs(rng, np.float32)
    expected = gn.kernel(inputs, attrs=attrs)["y"]
    resident = gn.kernel({**inputs, "x": Tensor.from_numpy(inputs["x"])}, attrs=attrs)["y"]
    with pytest.raises(ValueError, match="GPU memory"):
        np.asarray(resident, copy=False)
    with pytest.raises(ValueError, match="GPU memory"):
        np.array(resident, copy=False)
    assert np.array(resident, copy=True).tobytes() == expected.tobytes()


def test_tensor_reads_back_frees_and_mixes_with_numpy():
    rng, _ = rng_for("tensor-api")
    inputs, attrs = gn_inputs(rng, np.float32)
    expected = gn.kernel(inputs, attrs=attrs)["y"]
    mixed = gn.kernel({**inputs, "x": Tensor.from_numpy(inputs["x"])}, attrs=attrs)["y"]
    assert isinstance(mixed, Tensor)  # any Tensor in: Tensors out, numpy inputs uploaded
    assert np.asarray(mixed).tobytes() == expected.tobytes()
    assert np.asarray(mixed, dtype=np.float64).dtype == np.float64
    with Tensor.from_numpy(inputs["x"]) as t:
        assert np.array_equal(t.numpy(), inputs["x"])
    with pytest.raises(ContractError, match="the Tensor was destroyed"):
        t.numpy()
    with pytest.raises(ContractError, match="input x: the Tensor was destroyed"):
        gn.kernel({**inputs, "x": t}, attrs=attrs)


def test_package_warmup_makes_the_pipelines_of_every_shipped_case():
    import importlib

    import generated

    generated.warmup(sweeps=False)
    assert generated.warmup(sweeps=False).pipelines == 0  # everything already there
    created = rt.pipelines_created()
    rng, _ = rng_for("package-warmup")
    for package in (bn, gn, inn, sgn):
        cases = importlib.import_module(".cases", package.__name__)
        for entry in cases.TEST_CASES[:3]:
            dtypes = {tv: (d[0] if isinstance(d, list) else d) for tv, d in entry["dtypes"].items()}
            type_of = {t.key: t.type_var for t in package.INPUTS}
            inputs = {
                k: rng.uniform(0.5, 1.5, shape).astype(dtypes[type_of[k]])
                for k, shape in entry["inputs"].items()
            }
            package.kernel(inputs, attrs=entry.get("attrs"), outputs=entry.get("outputs"))
    assert rt.pipelines_created() == created, "a shipped case needed a pipeline warmup() did not make"


def test_a_repeated_out_call_reads_new_data_and_rechecks_what_can_change(request):
    """kernel(out=) on the same Tensors encodes the call it recorded the first time: it must read
    whatever the inputs hold now, and still refuse a Tensor destroyed or re-pointed meanwhile."""
    rng, seed = rng_for(request.node.name)
    device = default_device()
    inputs, attrs = gn_inputs(rng, np.float32, (2, 8, 6, 6))
    tensors = {k: Tensor.from_numpy(v) for k, v in inputs.items()}
    out = {"y": Tensor.empty(inputs["x"].shape, np.float32)}
    for round_ in range(4):
        x = (rng.standard_normal(inputs["x"].shape) * (round_ + 1) - round_).astype(np.float32)
        device.queue.write_buffer(tensors["x"].buffer, 0, x.tobytes())
        assert gn.kernel(tensors, attrs=attrs, out=out)["y"] is out["y"]
        expected = gn.kernel({**inputs, "x": x}, attrs=attrs)["y"]
        assert out["y"].numpy().tobytes() == expected.tobytes(), f"round {round_}, {seed_note(seed)}"
    assert (
        gn.kernel(tensors, attrs={**attrs, "epsilon": 0.5}, out=out)["y"].numpy().tobytes()
        != expected.tobytes()
    )
    small = device.create_buffer(size=16, usage=tensors["scale"].buffer.usage)
    kept, tensors["scale"].buffer = tensors["scale"].buffer, small
    with pytest.raises(ContractError, match="input scale: the Tensor's buffer holds 16 bytes"):
        gn.kernel(tensors, attrs=attrs, out=out)
    tensors["scale"].buffer = kept
    gn.kernel(tensors, attrs=attrs, out=out)
    out["y"].destroy()
    with pytest.raises(ContractError, match="y: the Tensor was destroyed"):
        gn.kernel(tensors, attrs=attrs, out=out)


def test_a_repeated_out_call_keys_every_form_of_outputs():
    """The memo of repeated out= calls keeps outputs= given as a set apart from the default (an audit
    found {"S"} replayed the default call: S was never written, and back the other way a call a
    fresh one refuses was replayed)."""
    rng, seed = rng_for("repeat-outputs-forms")
    arrays = {
        "X": rng.standard_normal((1, 4, 4, 8)).astype(np.float32),
        "gamma": np.ones(8, np.float32),
        "beta": np.zeros(8, np.float32),
        "skip": rng.standard_normal((1, 4, 4, 8)).astype(np.float32),
    }
    tensors = {k: Tensor.from_numpy(v) for k, v in arrays.items()}
    attrs = {"groups": 2, "activation": 0}
    y = Tensor.empty((1, 4, 4, 8), np.float32)
    assert list(sgn.kernel(tensors, attrs=attrs, out={"Y": y})) == ["Y"]
    for outputs in ({"S"}, frozenset({"S"}), ["S"], ("S",), "S"):
        got = sgn.kernel(tensors, attrs=attrs, outputs=outputs, out={"Y": y})
        assert list(got) == ["S"], (outputs, seed_note(seed))
        want = sgn.kernel(arrays, attrs=attrs, outputs=("S",))["S"]
        assert got["S"].numpy().tobytes() == want.tobytes()
    both = {"Y": Tensor.empty((1, 4, 4, 8), np.float32), "S": Tensor.empty((1, 4, 4, 8), np.float32)}
    assert list(sgn.kernel(tensors, attrs=attrs, outputs={"S"}, out=both)) == ["S"]
    with pytest.raises(ContractError, match="this call writes Y"):
        sgn.kernel(tensors, attrs=attrs, out=both)  # the default writes Y only: S is not an output


def test_caches_forget_the_tensors_a_caller_drops():
    """Bind groups hold their buffers' GPU memory: entries must go with the buffers they bind. A
    dropped Tensor's buffer goes back to the pool (its bind groups stay useful for the next Tensor
    that takes it), and leaves with empty_cache()."""
    import gc

    import generated

    device = default_device()
    rng, _ = rng_for("dropped-tensors")
    inputs, attrs = in_inputs(rng, np.float32)
    inn.kernel(
        {k: Tensor.from_numpy(v) for k, v in inputs.items()},
        out={"output": Tensor.empty(inputs["input"].shape, np.float32)},
    )
    gc.collect()
    generated.empty_cache()
    caches = {
        name: rt.per_device(getattr(rt, name), device, 1024)
        for name in ("bind_group_cache", "repeated_call_cache")
    }
    before = {name: len(cache) for name, cache in caches.items()}
    kept = []
    for _ in range(5):
        tensors = {k: Tensor.from_numpy(v) for k, v in inputs.items()}
        out = {"output": Tensor.empty(inputs["input"].shape, np.float32)}
        inn.kernel(tensors, out=out)
        inn.kernel(tensors, out=out)
        kept.append((tensors, out))
    assert all(len(cache) > before[name] for name, cache in caches.items())
    del tensors, out, kept
    gc.collect()
    generated.empty_cache()
    assert {
        name: len(cache) for name, cache in caches.items()
    } == before, "an entry outlived the buffers it binds"


def test_a_buffer_destroyed_directly_is_refused_by_name_not_an_abort():
    """wgpu reports no destroyed state and wgpu-native aborts the process on a submission that uses
    a destroyed buffer: a call after `tensor.buffer.destroy()` must be a ContractError, whether it
    would have reused a recorded call, a cached bind group or a Sequence."""
    rng, _ = rng_for("destroyed-buffer")
    inputs, attrs = gn_inputs(rng, np.float32)
    tensors = {k: Tensor.from_numpy(v) for k, v in inputs.items()}
    out = {"y": Tensor.empty(inputs["x"].shape, np.float32)}
    gn.kernel(tensors, attrs=attrs, out=out)
    seq = Sequence()
    seq.kernel(gn, tensors, attrs, out=out)
    seq.run()
    tensors["scale"].buffer.destroy()
    with pytest.raises(ContractError, match="input scale: the Tensor's buffer was destroyed"):
        gn.kernel(tensors, attrs=attrs, out=out)
    encoder = default_device().create_command_encoder()
    with pytest.raises(ContractError, match="input scale: the Tensor's buffer was destroyed"):
        gn.kernel(tensors, attrs=attrs, out=out, encoder=encoder)
    with pytest.raises(
        ContractError, match="Sequence: run\\(\\): a \\(8,\\) Tensor that a recorded call binds was destroyed"
    ):
        seq.run()
    with pytest.raises(ContractError, match="the Tensor was destroyed"):
        tensors["scale"].numpy()
    out["y"].buffer.destroy()
    with pytest.raises(ContractError, match="out y: the Tensor's buffer was destroyed"):
        gn.kernel({**tensors, "scale": Tensor.from_numpy(inputs["scale"])}, attrs=attrs, out=out)
