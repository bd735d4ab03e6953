"""opcheck: float64 references against slow loops, planted broken ops rejected, correct ops passed, the gate end to
end on the tiny preset (capture, replay, sweep, tables), and not-applicable ops never passing."""

from __future__ import annotations

import csv
import json
import math
import shutil

import pytest
import torch
import torch.nn.functional as F

from gates.base import ClipSide, GateInputError, PairContext, PairRef, get_gate
from h3eval.gaterun import run_info
from gates.opcheck import Budget, check_op, error_stats, sweep_op
from h3.ops import (NotApplicable, Op, OpOutput, attention_reference, get_op, ops_for_recipe, reference_op,
                    register_op, route_reference, spec, unregister_op)
from h3.runtime import GenerateRequest
from h3eval.store import PromptSuiteRef, RunManifest, RunStore, utc_now
from tests.conftest import FAST_RECIPE

BLOCK = 16


def qkv(seq=40, heads=2, dim=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return {k: torch.randn(1, seq, heads, dim, generator=gen) for k in ("query", "key", "value")}


# -- planted ops: plain torch implementations, correct and broken ----------------------------------------------------
def _sdpa(q, k, v, scale=None, mask=None):
    q, k, v = (x.permute(0, 2, 1, 3) for x in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale).permute(0, 2, 1, 3)


def _route_f32(q, k, block, sparsity):
    """The routing the lever documents, in float32 (pool blocks, rank pooled dot products, keep the top-k)."""
    b, s, h, d = q.shape
    n = -(-s // block)
    pad = n * block - s
    counts = torch.full((n,), float(block))
    counts[-1] = block - pad
    pool = lambda x: F.pad(x, (0, 0, 0, 0, 0, pad)).view(b, n, block, h, d).sum(2) / counts.view(1, n, 1, 1)  # noqa
    scores = torch.einsum("bqhd,bkhd->bhqk", pool(q), pool(k))
    keep = max(1, math.ceil(round((1 - sparsity) * n, 9)))
    return torch.zeros(b, h, n, n, dtype=torch.bool).scatter_(-1, scores.topk(keep, dim=-1).indices, True)


def _sparse_f32(inputs, kept, block):
    s = inputs["query"].shape[1]
    idx = torch.arange(s) // block
    mask = kept[:, :, idx][:, :, :, idx]
    return _sdpa(inputs["query"], inputs["key"], inputs["value"], mask=mask)


def _sparse_ref(inputs, block_size, sparsity, decisions=None, **_):
    # The shipped block-sparse reference: float64 attention over the op's kept blocks, float64 ranking's decisions.
    return get_op("block_sparse").reference(inputs, block_size=block_size, sparsity=sparsity, decisions=decisions)


# The shipped float64 references of the attention and linear ops.
_attention_ref = get_op("attention:native").reference
_linear_ref = get_op("linear").reference


def _correct_sparse(inputs, device, block_size, sparsity, **_):
    kept = _route_f32(inputs["query"], inputs["key"], block_size, sparsity)
    return OpOutput(_sparse_f32(inputs, kept, block_size), kept)


def _mask_off_by_one(inputs, device, block_size, sparsity, **_):
    kept = _route_f32(inputs["query"], inputs["key"], block_size, sparsity).roll(1, dims=-1)
    return OpOutput(_sparse_f32(inputs, kept, block_size), kept)


def _scale_1pct(inputs, device, **_):
    d = inputs["query"].shape[-1]
    return OpOutput(_sdpa(inputs["query"], inputs["key"], inputs["value"], scale=1.01 / math.sqrt(d)))


def _swapped_heads(inputs, device, **_):
    out = _sdpa(inputs["query"], inputs["key"], inputs["value"])
    return OpOutput(out[:, :, [1, 0] + list(range(2, out.shape[2]))])


def _dropped_last_row(inputs, device, **_):
    # The last key/value row never reaches the softmax (an off-by-one loop bound).
    return OpOutput(_sdpa(inputs["query"], inputs["key"][:, :-1], inputs["value"][:, :-1]))


def _wrong_at_65(inputs, device, **_):
    # Right everywhere except when the sequence is one past a 64-row boundary (a tail-handling bug).
    q, k, v = inputs["query"], inputs["key"], inputs["value"]
    if q.shape[1] > 64 and q.shape[1] % 64 == 1:
        k, v = k[:, :-1], v[:, :-1]
    return OpOutput(_sdpa(q, k, v))


def _linear_scale_1pct(inputs, device, **_):
    return OpOutput(F.linear(inputs["input"], inputs["weight"] * 1.01, inputs.get("bias")))


def _linear_dropped_last_row(inputs, device, **_):
    out = F.linear(inputs["input"], inputs["weight"], inputs.get("bias"))
    return OpOutput(torch.cat([out[:, :-1], torch.zeros_like(out[:, -1:])], dim=1))


PLANTED = {
    "test:sparse_correct": ("attention", _correct_sparse, _sparse_ref),
    "test:sparse_mask_off_by_one": ("attention", _mask_off_by_one, _sparse_ref),
    "test:attention_scale_1pct": ("attention", _scale_1pct, _attention_ref),
    "test:attention_swapped_heads": ("attention", _swapped_heads, _attention_ref),
    "test:attention_dropped_last_row": ("attention", _dropped_last_row, _attention_ref),
    "test:attention_wrong_at_65": ("attention", _wrong_at_65, _attention_ref),
    "test:linear_scale_1pct": ("linear", _linear_scale_1pct, _linear_ref),
    "test:linear_dropped_last_row": ("linear", _linear_dropped_last_row, _linear_ref),
}


@pytest.fixture(scope="module", autouse=True)
def planted_ops():
    for name, (kind, run, ref) in PLANTED.items():
        register_op(Op(name, kind, run, ref, description="planted by tests/test_opcheck.py"))
    yield
    for name in PLANTED:
        unregister_op(name)


# -- references --------------------------------------------------------------------------------------------------
def test_attention_reference_matches_slow_loop():
    inputs = qkv(seq=5, heads=2, dim=3, seed=1)
    ref = attention_reference(inputs["query"], inputs["key"], inputs["value"])
    q, k, v = (inputs[x][0].tolist() for x in ("query", "key", "value"))  # [s][h][d]
    for h in range(2):
        for i in range(5):
            logits = [sum(q[i][h][d] * k[j][h][d] for d in range(3)) / math.sqrt(3) for j in range(5)]
            top = max(logits)
            w = [math.exp(x - top) for x in logits]
            total = sum(w)
            for d in range(3):
                expected = sum(w[j] / total * v[j][h][d] for j in range(5))
                assert ref[0, i, h, d].item() == pytest.approx(expected, rel=1e-12, abs=1e-14)


def test_block_sparse_reference_matches_slow_loop():
    """Kept blocks from float64 pooled scores; attention restricted to them (block 2, 5 rows: last block is 1 row)."""
    inputs = qkv(seq=5, heads=1, dim=2, seed=2)
    kept = route_reference(inputs["query"], inputs["key"], block_size=2, sparsity=0.5)
    q, k = inputs["query"][0, :, 0].double().tolist(), inputs["key"][0, :, 0].double().tolist()
    blocks = [[0, 1], [2, 3], [4]]
    pooled = lambda x, b: [sum(x[r][d] for r in b) / len(b) for d in range(2)]  # noqa: E731
    for qi, qb in enumerate(blocks):
        scores = [sum(a * c for a, c in zip(pooled(q, qb), pooled(k, kb))) for kb in blocks]
        keep = math.ceil(0.5 * 3)  # 2 of 3 blocks
        expected = sorted(range(3), key=lambda j: -scores[j])[:keep]
        assert sorted(torch.nonzero(kept[0, 0, qi]).flatten().tolist()) == sorted(expected)
    out = attention_reference(inputs["query"], inputs["key"], inputs["value"], kept=kept, block_size=2)
    v = inputs["value"][0, :, 0].double().tolist()
    for i in range(5):
        cols = [j for j in range(5) if kept[0, 0, i // 2, j // 2]]
        logits = [sum(q[i][d] * k[j][d] for d in range(2)) / math.sqrt(2) for j in cols]
        w = [math.exp(x - max(logits)) for x in logits]
        for d in range(2):
            assert out[0, i, 0, d].item() == pytest.approx(sum(wj / sum(w) * v[j][d] for wj, j in zip(w, cols)),
                                                           rel=1e-12)


def test_error_stats_against_definitions():
    ref = torch.tensor([3.0, -4.0, 0.0, 12.0], dtype=torch.float64)
    out = ref + torch.tensor([0.1, 0.1, 0.1, -0.1])
    stats = error_stats(out, ref)
    assert stats["rel_l2"] == pytest.approx(0.2 / 13.0, rel=1e-6)
    assert stats["max_abs"] == pytest.approx(0.1, rel=1e-6)
    assert stats["bias"] == pytest.approx(0.05 / (13.0 / 2.0), rel=1e-6)  # mean error / RMS(ref) = 13/2
    cos = float(out.double() @ ref) / (float(out.double().norm()) * 13.0)
    assert stats["cosine"] == pytest.approx(cos, rel=1e-12)
    nan = out.clone()
    nan[1] = float("nan")
    assert error_stats(nan, ref)["nonfinite"] == 1


# -- planted bugs fail, correct ops pass (tiny random tensors) ----------------------------------------------------
BUDGET = Budget()


@pytest.mark.parametrize("candidate", ["attention:native", "attention:_native_math", "attention:flex"])
def test_correct_attention_backends_pass(candidate):
    row = check_op(qkv(), spec("attention:native"), spec(candidate), "cpu", "float32", BUDGET)
    assert row["status"] == "pass", row["reasons"]
    assert row["cand"]["rel_l2"] < 1e-6 and row["cand"]["cosine"] > 1 - 1e-12


def test_correct_block_sparse_passes_at_half_sparsity():
    row = check_op(qkv(seq=64), spec("attention:native"), spec("test:sparse_correct", block_size=BLOCK, sparsity=0.5),
                   "cpu", "float32", BUDGET)
    assert row["status"] == "pass", row["reasons"]
    assert row["flip_rate"] == 0.0
    # Its math differs from dense (half the blocks dropped): reported, not judged.
    assert row["cand_vs_baseline_math_rel_l2"] > 0.05


@pytest.mark.parametrize("planted, why", [
    ("test:sparse_mask_off_by_one", "flip rate"),
    ("test:attention_scale_1pct", "rel L2"),
    ("test:attention_swapped_heads", "rel L2"),
    ("test:attention_dropped_last_row", "rel L2"),
])
def test_planted_attention_bugs_fail(planted, why):
    params = dict(block_size=BLOCK, sparsity=0.5) if "sparse" in planted else {}
    row = check_op(qkv(seq=64), spec("attention:native"), spec(planted, **params), "cpu", "float32", BUDGET)
    assert row["status"] == "fail"
    assert any(why in reason for reason in row["reasons"]), row["reasons"]
    if "sparse" in planted:  # the decisions are wrong: most kept blocks differ from the float64 ranking's
        assert row["flip_rate"] > 0.2
    else:  # far outside the budget, not a marginal call
        assert row["rel_l2_ratio"] > 100


@pytest.mark.parametrize("planted", ["test:linear_scale_1pct", "test:linear_dropped_last_row"])
def test_planted_linear_bugs_fail_and_linear_passes(planted):
    gen = torch.Generator().manual_seed(3)
    inputs = {"input": torch.randn(1, 24, 32, generator=gen), "weight": torch.randn(48, 32, generator=gen) / 6,
              "bias": torch.randn(48, generator=gen)}
    assert check_op(inputs, spec("linear"), spec("linear"), "cpu", "float32", BUDGET)["status"] == "pass"
    row = check_op(inputs, spec("linear"), spec(planted), "cpu", "float32", BUDGET)
    assert row["status"] == "fail" and row["cand"]["rel_l2"] > 1e-3


def test_scale_error_of_1pct_is_measured_as_such():
    gen = torch.Generator().manual_seed(4)
    inputs = {"input": torch.randn(1, 24, 32, generator=gen), "weight": torch.randn(48, 32, generator=gen),
              "bias": torch.zeros(48)}
    row = check_op(inputs, spec("linear"), spec("test:linear_scale_1pct"), "cpu", "float32", BUDGET)
    assert row["cand"]["rel_l2"] == pytest.approx(0.01, rel=1e-4)


def test_nan_the_baseline_does_not_have_fails():
    register_op(Op("test:nan_row", "attention",
                   lambda i, d, **_: OpOutput(_sdpa(i["query"], i["key"], i["value"]).index_fill(1, torch.tensor([3]),
                                                                                                  float("nan"))),
                   _attention_ref))
    try:
        row = check_op(qkv(), spec("attention:native"), spec("test:nan_row"), "cpu", "float32", BUDGET)
    finally:
        unregister_op("test:nan_row")
    assert row["status"] == "fail" and any("NaN/Inf" in r for r in row["reasons"])


def test_sweep_catches_an_op_wrong_at_one_shape():
    example = {"shapes": {"query": [1, 40, 2, 16]}}
    assert check_op(qkv(seq=40), spec("attention:native"), spec("test:attention_wrong_at_65"), "cpu", "float32",
                    BUDGET)["status"] == "pass"
    rows = sweep_op("attention", spec("attention:native"), spec("test:attention_wrong_at_65"), example, "cpu",
                    "float32", BUDGET)
    failed = sorted({r["shapes"]["query"][1] for r in rows if r["status"] == "fail"})
    assert failed == [65, 129]  # 64 + 1 and 2 * 64 + 1: the boundary straddles of the default 64-row block
    assert {r["shapes"]["query"][2] for r in rows} == {1, 3}


# -- not applicable ------------------------------------------------------------------------------------------------
def test_cuda_only_backend_on_cpu_is_not_applicable():
    row = check_op(qkv(), spec("attention:native"), spec("attention:_native_flash"), "cpu", "float32", BUDGET)
    assert row["status"] == "not_applicable" and "needs a CUDA device" in row["reasons"][0]


def test_lever_ops_pass_against_their_float64_math():
    """The lever modules are part of the tree: their ops must run and pass here (not "not applicable")."""
    inputs = qkv(seq=300, dim=16)
    row = check_op(inputs, spec("attention:native"), spec("block_sparse", block_size=128, sparsity=0.0), "cpu",
                   "float32", BUDGET)
    assert row["status"] == "pass" and row["flip_rate"] == 0.0, row.get("reasons")
    assert row["cand_vs_baseline_math_rel_l2"] < 1e-6  # sparsity 0 keeps every block: dense math
    gen = torch.Generator().manual_seed(5)
    linear = {"input": torch.randn(1, 24, 32, generator=gen), "weight": torch.randn(48, 32, generator=gen) / 6}
    for mode in ("int8_weight_only", "int8_w8a8"):
        row = check_op(linear, spec("linear"), spec(f"quant:{mode}"), "cpu", "float32", BUDGET)
        assert row["status"] == "pass" and row["flip_rate"] <= BUDGET.max_flip_rate, row.get("reasons")
    fp8 = check_op(linear, spec("linear"), spec("quant:fp8_w8a8"), "cpu", "float32", BUDGET)
    assert fp8["status"] == "not_applicable" and "needs a GPU with FP8 tensor cores" in fp8["reasons"][0]


def test_only_a_missing_lever_module_is_not_applicable(monkeypatch):
    """h3.ops.lever_module: the module itself missing is "not present"; an ImportError while importing it (a broken
    lever or a missing dependency of it) propagates, so it can never turn into "not applicable"."""
    import importlib

    import h3.ops as ops

    with pytest.raises(NotApplicable, match=r"lever module not present: h3\.levers\.no_such_lever"):
        ops.lever_module("no_such_lever")

    def broken(name):
        raise ImportError("cannot import name 'fused_kernel' from 'torch.nn.functional'")

    monkeypatch.setattr(importlib, "import_module", broken)
    with pytest.raises(ImportError, match="fused_kernel"):
        ops.lever_module("quantization")

    def missing_dependency(name):
        raise ModuleNotFoundError("No module named 'sageattention'", name="sageattention")

    monkeypatch.setattr(importlib, "import_module", missing_dependency)
    with pytest.raises(ModuleNotFoundError, match="sageattention"):
        ops.lever_module("sparse_attention")
    linear = {"input": torch.randn(1, 4, 32), "weight": torch.randn(48, 32)}
    row = check_op(linear, spec("linear"), spec("quant:int8_w8a8"), "cpu", "float32", BUDGET)
    assert row["status"] == "fail" and "ModuleNotFoundError" in row["reasons"][0]  # a failure, not "not applicable"


def test_quant_reference_is_the_quantized_math():
    """The int8 weight-only reference is x @ (round(w / s) * s)^T with s = max|w| / 127 per output row."""
    gen = torch.Generator().manual_seed(6)
    w, x = torch.randn(3, 4, generator=gen), torch.randn(2, 4, generator=gen)
    out = reference_op(spec("quant:int8_weight_only"), {"input": x, "weight": w}).out
    for o in range(3):
        s = max(abs(float(v)) for v in w[o]) / 127
        codes = [max(-127, min(127, round(float(v) / s))) for v in w[o]]
        for r in range(2):
            assert out[r, o].item() == pytest.approx(sum(float(x[r, i]) * codes[i] * s for i in range(4)), rel=1e-12)


# -- what recipes dispatch -----------------------------------------------------------------------------------------
def test_ops_for_recipe_routes_records():
    recipe = {**FAST_RECIPE, "attention": {"backend": "_native_math"},
              "sparse_attention": {"enabled": True, "block_size": 64, "sparsity": 0.5, "dense_steps": 1,
                                   "dense_layers": [0]},
              "quant": {"mode": "int8_w8a8", "exclude": [r"(^|\.)proj_out$"]}}
    ops = ops_for_recipe(recipe)
    attn = lambda layer, step: {"kind": "attention", "module": f"transformer.transformer_blocks.{layer}.attn",  # noqa
                                "layer": layer, "step": step}
    assert ops.for_record(attn(1, 1)) == spec("block_sparse", block_size=64, sparsity=0.5)
    assert ops.for_record(attn(1, 0)).name == "attention:_native_math"  # dense first step
    assert ops.for_record(attn(0, 3)).name == "attention:_native_math"  # dense layer
    refiner = {"kind": "attention", "module": "transformer.token_refiner.refiner_blocks.0.attn", "layer": 0, "step": 2}
    assert ops.for_record(refiner).name == "attention:_native_math"
    lin = lambda name, feats: {"kind": "linear", "module": f"transformer.{name}", "features": feats}  # noqa: E731
    assert ops.for_record(lin("transformer_blocks.0.attn.to_q", [32, 32])).name == "quant:int8_w8a8"
    assert ops.for_record(lin("proj_out", [32, 96])).name == "linear"  # excluded
    assert ops.for_record(lin("transformer_blocks.0.attn.to_q", [32, 36])).name == "linear"  # kernel shape
    plain = ops_for_recipe(FAST_RECIPE)  # main's schema before the levers: no sparse, no quant sections
    assert plain.for_record(attn(1, 1)).name == "attention:native"
    assert plain.for_record(lin("transformer_blocks.0.attn.to_q", [32, 32])).name == "linear"
    with pytest.raises(NotApplicable, match="vae_block"):
        plain.for_record({"kind": "vae_block", "module": "vae.decoder.transformer_blocks.0"})
    with pytest.raises(KeyError, match="known ops"):
        get_op("nope")


# -- the gate end to end on the tiny preset -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def run(tiny_random_runtime, tmp_path_factory):
    """A run with the fast baseline clip and a candidate recipe on the math SDPA backend."""
    root = tmp_path_factory.mktemp("run")
    store = RunStore(root)
    candidate = {**FAST_RECIPE, "name": "fast-math", "attention": {"backend": "_native_math"}}
    # The levers' recipe sections (h3.levers); the gate reads the resolved dict, so this works before they land.
    levers = {**FAST_RECIPE, "name": "fast-levers", "quant": {"mode": "int8_w8a8", "exclude": [r"(^|\.)proj_out$"]},
              "sparse_attention": {"enabled": True, "block_size": 128, "sparsity": 0.5, "dense_steps": 1,
                                   "dense_layers": []}}
    store.write_manifest(RunManifest(created_at=utc_now(), updated_at=utc_now(), model="tiny-random", kind="ab",
                                     baseline="fast", candidates=["fast-math", "fast-levers"],
                                     recipes={"fast": tiny_random_runtime.recipe.resolved(), "fast-math": candidate,
                                              "fast-levers": levers}, seeds=[0],
                                     prompts=PromptSuiteRef(path="squat.jsonl", sha256="0" * 64, ids=["squat"])))
    clip = store.clip_path("fast", "squat", 0)
    clip.parent.mkdir(parents=True)
    record = tiny_random_runtime.generate(GenerateRequest(prompt="A person is squat", seed=0, prompt_id="squat"), clip)
    for name in ("fast-math", "fast-levers"):  # the gate never reads the candidate's clip; the runner checks it exists
        copy = store.clip_path(name, "squat", 0)
        copy.parent.mkdir(parents=True)
        shutil.copy(clip, copy)
        shutil.copy(clip.with_suffix(".json"), copy.with_suffix(".json"))
    side = ClipSide("fast", clip, json.loads(record.model_dump_json()))
    gate = get_gate("opcheck")

    def evaluate(candidate="fast-math", **options):
        art = root / "gates" / "opcheck" / candidate
        art.mkdir(parents=True, exist_ok=True)
        ctx = PairContext(run_dir=root, pair=PairRef(baseline="fast", candidate=candidate, prompt_id="squat", seed=0),
                          baseline=side, candidate=ClipSide(candidate, clip, side.record), artifact_dir=art,
                          options={"steps": "all", "layers": "all", **options}, run=run_info(store.read_manifest()))
        return gate.evaluate(ctx)

    return root, evaluate, gate


def test_gate_passes_correct_backend_and_writes_tables(run):
    root, evaluate, _ = run
    result = evaluate()
    assert result.status == "ok" and not result.flagged, result.flags
    assert result.metrics["failed_records"].value == 0
    assert result.metrics["worst_rel_l2_ratio"].higher_is_better is False
    assert result.info["capture"]["reproduces_baseline_clip"] is True
    table = json.loads((root / result.artifacts[0]).read_text())
    captured = [r for r in table["rows"] if r["source"] == "capture"]
    # 2 steps x (2 transformer layers + 1 refiner) attention calls, 2 steps x 2 layers x 6 linears.
    assert sum(r["kind"] == "attention" for r in captured) == 6 and sum(r["kind"] == "linear" for r in captured) == 24
    assert {r["cand_op"] for r in captured if r["kind"] == "attention"} == {"attention:_native_math"}
    assert set(table["by_step"]) == {"0", "1", "sweep"} and set(table["by_layer"]) >= {"0", "1"}
    with open(root / result.artifacts[1]) as f:
        assert len(list(csv.DictReader(f))) == len(table["rows"])


@pytest.mark.parametrize("planted", ["test:attention_swapped_heads", "test:attention_scale_1pct",
                                     "test:attention_dropped_last_row"])
def test_gate_rejects_planted_attention_on_captured_inputs(run, planted):
    _, evaluate, _ = run
    result = evaluate(attention_op=planted, sweep="false")
    assert result.flagged and result.metrics["failed_records"].value == 6  # every captured attention call
    assert result.metrics["worst_rel_l2_ratio"].value > 100


def test_gate_rejects_planted_linear_and_sweep_only_bug(run):
    _, evaluate, _ = run
    linear = evaluate(linear_op="test:linear_scale_1pct", sweep="false")
    assert linear.flagged and linear.metrics["failed_records"].value == 24
    sweep_only = evaluate(attention_op="test:attention_wrong_at_65")
    # The captured sequence is not 64k+1 long, so only the sweep rows fail.
    table = json.loads((run[0] / sweep_only.artifacts[0]).read_text())
    failed = [r for r in table["rows"] if r["status"] == "fail"]
    assert sweep_only.flagged and failed and {r["source"] for r in failed} == {"sweep"}


def test_gate_cuda_only_candidate_on_cpu_is_not_applicable(run):
    _, evaluate, _ = run
    result = evaluate(attention_op="attention:_native_flash", sweep="false")
    assert result.status == "not_applicable" and not result.flagged
    assert any("needs a CUDA device" in reason for reason in result.info["not_applicable"])
    assert result.metrics["not_applicable_records"].value == 6


def test_gate_on_lever_recipe_passes(run):
    """Candidate with int8 W8A8 and block-sparse attention (dense first step): every lever record runs and passes
    against its float64 math (the lever modules are in the tree: "not applicable" would be a failure here)."""
    root, evaluate, _ = run
    result = evaluate("fast-levers", sweep="false")
    table = json.loads((root / result.artifacts[0]).read_text())
    rows = [r for r in table["rows"] if r["source"] == "capture"]
    sparse = [r for r in rows if r.get("cand_op", "").startswith("block_sparse")]
    quant = [r for r in rows if r.get("cand_op", "").startswith("quant:")]
    assert {r["step"] for r in sparse} == {1} and len(sparse) == 2  # step 0 dense; the refiner stays dense
    assert len(quant) == 24
    assert result.status == "ok" and not result.flagged, result.flags
    assert all(r["status"] == "pass" for r in sparse + quant)
    assert result.metrics["flip_rate_max"].value <= BUDGET.max_flip_rate
    assert result.metrics["failed_records"].value == 0.0 and result.metrics["not_applicable_records"].value == 0.0


def test_gate_rejects_block_mask_off_by_one_on_captured_inputs(run):
    params = dict(block_size=128, sparsity=0.5)
    register_op(Op("test:sparse_off_by_one_128", "attention", lambda i, d, **_: _mask_off_by_one(i, d, **params),
                   lambda i, decisions=None, **_: _sparse_ref(i, decisions=decisions, **params)))
    register_op(Op("test:sparse_correct_128", "attention", lambda i, d, **_: _correct_sparse(i, d, **params),
                   lambda i, decisions=None, **_: _sparse_ref(i, decisions=decisions, **params)))
    try:
        _, evaluate, _ = run
        broken = evaluate(attention_op="test:sparse_off_by_one_128", sweep="false")
        correct = evaluate(attention_op="test:sparse_correct_128", sweep="false")
    finally:
        unregister_op("test:sparse_off_by_one_128")
        unregister_op("test:sparse_correct_128")
    # The 4 transformer-block calls fail; the 2 refiner calls (17 rows: one block, where a roll by one block is the
    # identity) pass.
    assert broken.flagged and broken.metrics["failed_records"].value == 4
    assert broken.metrics["flip_rate_max"].value > 0.2
    assert all("flip rate" in flag for flag in broken.flags)
    assert not correct.flagged and correct.status == "ok" and correct.metrics["flip_rate_max"].value == 0.0


def test_reference_follows_the_ops_decisions_and_keeps_its_own():
    """A code on the other side of a rounding tie moves the reference output by exactly code step x scale; the
    reference's own decisions (for the flip rate) stay the float64 ones."""
    gen = torch.Generator().manual_seed(7)
    w, x = torch.randn(3, 4, generator=gen), torch.randn(2, 4, generator=gen)
    inputs = {"input": x, "weight": w}
    own = reference_op(spec("quant:int8_w8a8"), inputs)
    shifted = own.decisions.clone()
    shifted[12] += 1  # the first activation code (after the 3 x 4 weight codes): row 0, column 0
    moved = reference_op(spec("quant:int8_w8a8"), inputs, shifted)
    assert torch.equal(moved.decisions, own.decisions)
    x_scale = float(x[0].abs().max()) / 127
    w_deq = [max(-127, min(127, round(float(w[o, 0]) / (float(w[o].abs().max()) / 127)))) * float(w[o].abs().max())
             / 127 for o in range(3)]
    delta = (moved.out - own.out)[0]
    for o in range(3):
        assert float(delta[o]) == pytest.approx(x_scale * w_deq[o], rel=1e-9)
    assert torch.equal(moved.out[1], own.out[1])


@pytest.mark.parametrize("candidate, status", [("attention:_native_math", "pass"), ("attention:flex", "pass"),
                                               ("test:attention_scale_1pct", "fail"),
                                               ("test:attention_swapped_heads", "fail")])
def test_bfloat16_budget_passes_backends_and_rejects_planted(candidate, status):
    inputs = {k: v.to(torch.bfloat16) for k, v in qkv(seq=300).items()}
    row = check_op(inputs, spec("attention:native"), spec(candidate), "cpu", "bfloat16", BUDGET)
    assert row["status"] == status, row["reasons"]
    assert 1e-3 < row["base"]["rel_l2"] < 4e-3  # the bf16 baseline path's own error: about one output rounding


def test_bfloat16_linear_scale_error_of_1pct_fails():
    gen = torch.Generator().manual_seed(8)
    inputs = {"input": torch.randn(1, 64, 64, generator=gen).bfloat16(),
              "weight": (torch.randn(96, 64, generator=gen) / 8).bfloat16()}
    assert check_op(inputs, spec("linear"), spec("linear"), "cpu", "bfloat16", BUDGET)["status"] == "pass"
    row = check_op(inputs, spec("linear"), spec("test:linear_scale_1pct"), "cpu", "bfloat16", BUDGET)
    assert row["status"] == "fail" and row["cand"]["rel_l2"] == pytest.approx(0.01, rel=0.05)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("backend", ["_native_flash", "_native_efficient", "_native_cudnn"])
def test_cuda_attention_backends_pass_in_bfloat16(backend):
    inputs = {k: v.to(torch.bfloat16) for k, v in qkv(seq=300, heads=2, dim=64).items()}
    row = check_op(inputs, spec("attention:native"), spec(f"attention:{backend}"), "cuda", "bfloat16", BUDGET)
    assert row["status"] == "pass", row["reasons"]
    broken = check_op(inputs, spec("attention:native"), spec("test:attention_swapped_heads"), "cuda", "bfloat16",
                      BUDGET)
    assert broken["status"] == "fail"


@pytest.mark.gpu
@needs_cuda
def test_fp8_w8a8_on_cuda_passes():
    gen = torch.Generator().manual_seed(9)
    inputs = {"input": torch.randn(1, 64, 64, generator=gen).bfloat16(),
              "weight": (torch.randn(96, 64, generator=gen) / 8).bfloat16()}
    row = check_op(inputs, spec("linear"), spec("quant:fp8_w8a8"), "cuda", "bfloat16", BUDGET)
    if torch.cuda.get_device_capability() >= (8, 9):
        assert row["status"] == "pass" and row["flip_rate"] <= BUDGET.max_flip_rate, row.get("reasons")
    else:  # no FP8 tensor cores: said so, never a pass
        assert row["status"] == "not_applicable" and "compute capability 8.9+" in row["reasons"][0]


def _int8_weight_only(rounding):
    """A test-local int8 weight-only linear (no lever needed) with a chosen rounding of w / s."""

    def run(inputs, device, **_):
        w = inputs["weight"].float()
        scale = w.abs().amax(dim=1, keepdim=True) / 127
        codes = rounding(w / scale).clamp(-127, 127)
        return OpOutput(F.linear(inputs["input"].float(), codes * scale), codes.double().flatten())

    return run


def test_quant_ties_are_not_flips_but_truncation_is():
    """Rounding a .5 tie away from zero (vs half-to-even) is a correct choice; truncating every code is not."""
    ref = get_op("quant:int8_weight_only").reference
    half_up = lambda v: torch.sign(v) * torch.floor(v.abs() + 0.5)  # noqa: E731
    register_op(Op("test:int8_half_up", "linear", _int8_weight_only(half_up), ref))
    register_op(Op("test:int8_truncate", "linear", _int8_weight_only(torch.trunc), ref))
    try:
        # Row absmax 1 -> s = 1/127: 2.5/127 and -6.5/127 sit on ties, where half-up and half-to-even differ.
        weight = torch.tensor([[1.0, 2.5 / 127, -6.5 / 127, 0.3], [0.25, -0.5, 0.125, 1.0]] * 8)
        inputs = {"input": torch.randn(1, 8, 4, generator=torch.Generator().manual_seed(10)), "weight": weight}
        tie = check_op(inputs, spec("linear"), spec("test:int8_half_up"), "cpu", "float32", BUDGET)
        trunc = check_op(inputs, spec("linear"), spec("test:int8_truncate"), "cpu", "float32", BUDGET)
    finally:
        unregister_op("test:int8_half_up")
        unregister_op("test:int8_truncate")
    raw = _int8_weight_only(half_up)(inputs, "cpu").decisions != ref(inputs).decisions
    assert int(raw.sum()) >= 8  # the ties really were decided differently (2.5 -> 3 against 2, in every row pair)
    assert tie["status"] == "pass" and tie["flip_rate"] == 0.0, tie["reasons"]
    assert trunc["status"] == "fail" and trunc["flip_rate"] > 0.1


def test_gate_reuses_the_capture_and_names_a_missing_recipe(run):
    root, evaluate, _ = run
    evaluate(sweep="false")
    index = root / "gates" / "opcheck" / "captures" / "fast" / "squat-s0" / "index.json"
    stamp = index.stat().st_mtime_ns
    again = evaluate(sweep="false")
    assert index.stat().st_mtime_ns == stamp and again.status == "ok"
    # Every gate refuses an option it does not declare (the runner hands each gate only its own).
    with pytest.raises(GateInputError, match=r"unknown opcheck option\(s\) \['unrelated_option'\]"):
        evaluate(sweep="false", unrelated_option="1")
    assert not list(index.parent.parent.glob(".*partial"))  # no staging left behind
    missing = evaluate("no-such-recipe")
    assert missing.status == "error" and "run.json" in missing.error and "'no-such-recipe'" in missing.error


def test_candidate_that_crashes_on_a_shape_fails_that_shape():
    """Swapping heads 0 and 1 raises on the sweep's one-head shapes: a failure of those rows, not a gate error."""
    rows = sweep_op("attention", spec("attention:native"), spec("test:attention_swapped_heads"),
                    {"shapes": {"query": [1, 40, 2, 16]}}, "cpu", "float32", BUDGET)
    one_head = [r for r in rows if r["shapes"]["query"][2] == 1]
    assert one_head and all(r["status"] == "fail" and "raised IndexError" in r["reasons"][0] for r in one_head)
    assert all(r["status"] == "fail" for r in rows if r["shapes"]["query"][2] == 3)
    with pytest.raises(KeyError):  # the baseline op itself failing is the gate's error, never the candidate's
        check_op({"query": torch.zeros(1, 2, 1, 4)}, spec("attention:native"), spec("attention:native"), "cpu",
                 "float32", BUDGET)


def test_gate_runner_runs_opcheck_over_the_run(run):
    """`h3eval gate RUN --gates opcheck`: every pair scored through h3eval.gaterun, results where the verdict reads."""
    from gates.base import GateResult
    from h3eval.gaterun import run_gates

    root, _, _ = run
    summary = run_gates(root, ["opcheck"], device="cpu", options={"opcheck.sweep": "false"}, progress=False)
    assert summary.pairs == 2 and summary.scored["opcheck"] == 2 and not summary.errors, summary.errors
    for candidate in ("fast-math", "fast-levers"):
        result = GateResult.model_validate_json((root / "gates/opcheck" / candidate / "squat-s0.json").read_text())
        assert result.status == "ok" and not result.flagged and result.metrics["failed_records"].value == 0
        assert result.info["capture"]["dir"] == "gates/opcheck/captures/fast/squat-s0"
