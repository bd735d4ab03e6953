"""Op-input capture on the tiny preset: the clip is byte-identical, the index says what was captured, budgets hold."""

from __future__ import annotations

import json

import pytest
import torch

from h3.capture import ROW_MULTIPLE, CaptureConfig, CaptureError, OpCapture, load_index, load_tensors, parse_selection
from h3.runtime import GenerateRequest

REQUEST = dict(prompt="A person is squat", seed=0, prompt_id="squat")


@pytest.fixture(scope="module")
def plain_clip(tiny_random_runtime, tmp_path_factory):
    out = tmp_path_factory.mktemp("plain") / "plain.mp4"
    return out, tiny_random_runtime.generate(GenerateRequest(**REQUEST), out)


@pytest.fixture(scope="module")
def full_capture(tiny_random_runtime, tmp_path_factory):
    """Every step and layer, attention + linear + VAE decoder blocks, no budget pressure."""
    root = tmp_path_factory.mktemp("cap")
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    registry_before = dict(_AttentionBackendRegistry._backends)
    hooks_before = len(tiny_random_runtime.pipe.transformer._forward_pre_hooks)
    capture = OpCapture(root / "full", CaptureConfig(kinds=("attention", "linear", "vae_block")))
    with capture.attach(tiny_random_runtime.pipe):
        record = tiny_random_runtime.generate(GenerateRequest(**REQUEST), root / "clip.mp4")
    restored = (dict(_AttentionBackendRegistry._backends) == registry_before,
                len(tiny_random_runtime.pipe.transformer._forward_pre_hooks) == hooks_before)
    return root, record, restored


def test_capture_does_not_change_the_clip(plain_clip, full_capture):
    out, plain = plain_clip
    root, captured, _ = full_capture
    assert (root / "clip.mp4").read_bytes() == out.read_bytes()
    assert captured.frames_sha256 == plain.frames_sha256 and captured.pcm_sha256 == plain.pcm_sha256


def test_detach_restores_registry_and_hooks(full_capture):
    _, _, (registry_same, hooks_same) = full_capture
    assert registry_same and hooks_same


def test_index_lists_steps_layers_and_shapes(full_capture):
    root, record, _ = full_capture
    index = load_index(root / "full")
    seq = record.shape.sequence_length
    assert index["denoise_steps_seen"] == 2 and index["complete"] and not index["dropped"]
    attn = [r for r in index["records"] if r["kind"] == "attention" and "transformer_blocks" in r["module"]]
    # 2 steps x 2 transformer layers, one dispatcher call each, on the native backend.
    assert sorted((r["step"], r["layer"]) for r in attn) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(r["shapes"] == {k: [1, seq, 2, 16] for k in ("query", "key", "value")} for r in attn)
    assert {r["backend"] for r in attn} == {"native"}
    linear = {r["module"].rsplit("transformer_blocks.0.", 1)[-1]: r for r in index["records"]
              if r["kind"] == "linear" and r["step"] == 0 and r["layer"] == 0}
    assert sorted(linear) == ["attn.to_k", "attn.to_out.0", "attn.to_q", "attn.to_v", "ff.net.0.proj", "ff.net.2"]
    assert linear["ff.net.2"]["shapes"] == {"input": [1, seq, 64]} and linear["ff.net.2"]["features"] == [64, 32]
    vae = [r for r in index["records"] if r["kind"] == "vae_block"]
    assert vae and all(r["step"] is None for r in vae) and [r["call"] for r in vae] == list(range(len(vae)))
    on_disk = sum(p.stat().st_size for p in (root / "full").rglob("*.pt"))
    assert index["bytes"] <= on_disk  # torch.save adds a small header per file


def test_captured_inputs_are_the_real_ones(full_capture):
    """SDPA of the captured q/k/v is exactly the captured input of the same layer's output projection."""
    root, _, _ = full_capture
    index = load_index(root / "full")
    by_key = {(r["kind"], r["module"], r["step"]): r for r in index["records"]}
    for step in (0, 1):
        attn = by_key[("attention", "transformer.transformer_blocks.1.attn", step)]
        to_out = by_key[("linear", "transformer.transformer_blocks.1.attn.to_out.0", step)]
        qkv = load_tensors(root / "full", attn["file"])
        q, k, v = (qkv[x].permute(0, 2, 1, 3) for x in ("query", "key", "value"))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v).permute(0, 2, 1, 3).flatten(2, 3)
        assert torch.equal(out, load_tensors(root / "full", to_out["file"])["input"])


def test_linear_weights_saved_once_and_equal_the_module(tiny_random_runtime, full_capture):
    root, _, _ = full_capture
    index = load_index(root / "full")
    name = "transformer.transformer_blocks.0.attn.to_q"
    saved = load_tensors(root / "full", index["weights"][name]["file"])
    assert torch.equal(saved["weight"], tiny_random_runtime.pipe.transformer.transformer_blocks[0].attn.to_q.weight)
    assert "bias" not in saved  # MiniMax-H3's attention projections have no bias
    assert len([p for p in (root / "full" / "weights").iterdir()]) == len(index["weights"])


def test_steps_layers_selection_and_budgets(tiny_random_runtime, full_capture, tmp_path):
    root, _, _ = full_capture
    full = load_index(root / "full")
    # Per-record budget below one attention record: rows are cut to whole 128-row blocks.
    one_attention = next(r for r in full["records"] if r["kind"] == "attention" and r["layer"] == 1)["bytes"]
    config = CaptureConfig(kinds=("attention", "linear"), steps=[1], layers=[1],
                           max_record_bytes=one_attention // 3, max_bytes=one_attention)
    capture = OpCapture(tmp_path / "small", config)
    with capture.attach(tiny_random_runtime.pipe):
        tiny_random_runtime.generate(GenerateRequest(**REQUEST), tmp_path / "clip.mp4")
    index = load_index(tmp_path / "small")
    assert index["records"] and {(r["step"], r["layer"]) for r in index["records"]} == {(1, 1)}
    assert index["bytes"] <= config.max_bytes
    assert index["dropped"] and not index["complete"]  # 6 linears (each a third of it) + 1 attention do not fit
    attn = next(r for r in index["records"] if r["kind"] == "attention")
    rows, keep = attn["truncated_rows"]
    assert keep % ROW_MULTIPLE == 0 and keep < rows and attn["shapes"]["query"][1] == keep
    assert attn["orig_shapes"]["query"][1] == rows and attn["bytes"] <= config.max_record_bytes
    # The kept rows are the first rows of the full capture's same record.
    twin = next(r for r in full["records"] if r["kind"] == "attention" and r["module"] == attn["module"]
                and r["step"] == 1)
    small, big = load_tensors(tmp_path / "small", attn["file"]), load_tensors(root / "full", twin["file"])
    for name in ("query", "key", "value"):
        assert torch.equal(small[name], big[name][:, :keep])


def test_parse_selection_and_missing_index(tmp_path):
    assert parse_selection("first,middle,last", 29) == [0, 14, 28]
    assert parse_selection("0,-1", 4) == [0, 3]
    assert parse_selection("all", 4) is None
    with pytest.raises(ValueError, match="out of range"):
        parse_selection("7", 4)
    with pytest.raises(ValueError, match="'x' is not an integer"):
        parse_selection("x", 4)
    with pytest.raises(CaptureError, match="index.json is missing"):
        load_index(tmp_path)
    (tmp_path / "index.json").write_text(json.dumps({"version": 99}))
    with pytest.raises(CaptureError, match="index version 99"):
        load_index(tmp_path)
    with pytest.raises(ValueError, match="unknown capture kind"):
        CaptureConfig(kinds=("conv",))
