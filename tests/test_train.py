"""The training code (h3.train) on the CPU: the packed forward is the model's own forward, the conditioning is what
the pipeline feeds, training lowers the loss and a resumed run lands on the same state, the LoRA ships in the format
diffusers' MiniMaxH3LoraLoaderMixin converts."""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from h3.train import conditioning
from h3.train.common import Budget, TrainConfig
from h3.train.packing import (
    audio_rows, packed_forward, patchify, ref2va_layout, row_timesteps, t2va_layout, unpatchify,
)
from h3.tiny_trained import TRANSFORMER_CONFIG

ROW = 24 * TRANSFORMER_CONFIG["patch_size"][1] * TRANSFORMER_CONFIG["patch_size"][2]  # latent values a video row
VIDEO_ROWS = 37 * (8 // TRANSFORMER_CONFIG["patch_size"][1]) ** 2  # 5 s at 128x128
SMALL_DIT = {**TRANSFORMER_CONFIG, "num_layers": 2, "hidden_size": 64, "ffn_dim": 96, "time_embed_dim": 32,
             "time_embed_hidden_dim": 64}


def small_dit(seed=0):
    from diffusers import MiniMaxH3Transformer3DModel

    torch.manual_seed(seed)
    model = MiniMaxH3Transformer3DModel(**SMALL_DIT)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)
    return model


@pytest.fixture(scope="module")
def components():
    from h3.tiny_trained import init_components

    return init_components()


@pytest.fixture(scope="module")
def checkpoint(components, tmp_path_factory):
    from h3.tiny_trained import save_checkpoint

    return save_checkpoint(components, tmp_path_factory.mktemp("ckpt") / "tiny")


def packed_inputs(layout, batch: int, seed: int):
    """Seeded video rows, audio rows, 9 text rows and per-request timesteps for ``batch`` requests of ``layout``."""
    gen = torch.Generator().manual_seed(seed)
    video = torch.randn(batch, len(layout.video_indices), ROW, generator=gen)
    audio = torch.randn(batch, len(layout.audio_indices), 32, generator=gen)
    text = torch.randn(batch, 9, 32, generator=gen)
    return video, audio, text, torch.rand(batch, generator=gen), torch.rand(batch, generator=gen)


def stock_forward(model, layout, video, audio, text, tv, ta, i):
    """Request ``i`` of a packed batch alone through the model's own forward (its layout, its timesteps)."""
    timestep, index = torch.unique(row_timesteps(layout, tv[i:i + 1], ta[i:i + 1])[0], sorted=True,
                                   return_inverse=True)
    return model(hidden_states=video[i:i + 1], audio_hidden_states=audio[i:i + 1],
                 encoder_hidden_states=text[i:i + 1], timestep=timestep, timestep_indices=index,
                 token_tags=layout.token_tags, position_ids=layout.position_ids, video_indices=layout.video_indices,
                 audio_indices=layout.audio_indices, text_indices=layout.text_indices, return_dict=False)


@pytest.mark.parametrize("anchors", [(), ("first",), ("first", "last")])
def test_packed_forward_equals_the_stock_forward_per_request(anchors):
    model = small_dit().eval()
    tags = torch.ones(9, dtype=torch.long)
    tags[2:6] = 0  # a vision block, tagged video
    layout = t2va_layout(tags, anchors)
    b = 3
    video, audio, text, tv, ta = packed_inputs(layout, b, seed=1)
    with torch.no_grad():
        pv, pa = packed_forward(model, layout, video, audio, text, tv, ta)
        for i in range(b):
            sv, sa = stock_forward(model, layout, video, audio, text, tv, ta, i)
            torch.testing.assert_close(pv[i], sv[0], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(pa[i], sa[0], rtol=1e-5, atol=1e-6)
    # The processor swap is undone.
    from diffusers.models.transformers.transformer_minimax_h3 import MiniMaxH3AttnProcessor

    assert all(isinstance(m.processor, MiniMaxH3AttnProcessor) for m in model.modules() if hasattr(m, "processor"))


def test_sparse_packed_forward_is_the_sparse_lever_per_request():
    """The compensation LoRA's student (block-sparse attention per packed request, as a token mask under SDPA) is what
    the ``sparse_attention`` lever computes at inference (its routing, flex_attention on the kept blocks) request by
    request; and it is not dense attention (the mask matters at this sparsity)."""
    from h3.levers.sparse_attention import SparseAttentionConfig, apply_sparse_attention

    model = small_dit().eval()
    tags = torch.ones(9, dtype=torch.long)
    layout = t2va_layout(tags)
    b = 2
    video, audio, text, tv, ta = packed_inputs(layout, b, seed=2)
    seen = []
    hook = model.transformer_blocks[0].attn.register_forward_hook(lambda _m, _i, out: seen.append(out))
    with torch.no_grad():
        pv, pa = packed_forward(model, layout, video, audio, text, tv, ta, sparse=(16, 0.75))
        packed_forward(model, layout, video, audio, text, tv, ta)
        hook.remove()
        # The training's student routes every stream's queries (h3.train.packing), the lever's default only video's.
        handle = apply_sparse_attention(model, SparseAttentionConfig(enabled=True, block_size=16, sparsity=0.75,
                                                                     dense_steps=0, streams=["video", "audio", "text"]))
        try:
            for i in range(b):
                sv, sa = stock_forward(model, layout, video, audio, text, tv, ta, i)
                torch.testing.assert_close(pv[i], sv[0], rtol=1e-4, atol=1e-5)
                torch.testing.assert_close(pa[i], sa[0], rtol=1e-4, atol=1e-5)
            assert handle.telemetry()["realized_sparsity"] > 0.6
        finally:
            handle.remove()
    sparse_out, dense_out = seen
    assert (sparse_out - dense_out).norm() > 0.05 * dense_out.norm()


def test_sparse_packed_forward_routes_only_the_configured_streams_as_the_lever_does():
    """With the token streams given (the compensation's ``compensate_streams``, default video only: issue 50), the
    packed student sparsifies only those streams' queries, the others attending densely, as the ``sparse_attention``
    lever does with the same ``streams``, request by request; and it differs from the every-stream routing."""
    from h3.levers.sparse_attention import SparseAttentionConfig, apply_sparse_attention

    model = small_dit().eval()
    layout = t2va_layout(torch.ones(9, dtype=torch.long))
    b = 2
    video, audio, text, tv, ta = packed_inputs(layout, b, seed=3)
    with torch.no_grad():
        pv, pa = packed_forward(model, layout, video, audio, text, tv, ta, sparse=(16, 0.75, ("video",)))
        every_v, every_a = packed_forward(model, layout, video, audio, text, tv, ta, sparse=(16, 0.75))
        handle = apply_sparse_attention(model, SparseAttentionConfig(enabled=True, block_size=16, sparsity=0.75,
                                                                     dense_steps=0, streams=["video"]))
        try:
            for i in range(b):
                sv, sa = stock_forward(model, layout, video, audio, text, tv, ta, i)
                torch.testing.assert_close(pv[i], sv[0], rtol=1e-4, atol=1e-5)
                torch.testing.assert_close(pa[i], sa[0], rtol=1e-4, atol=1e-5)
            assert handle.telemetry()["streams_touched"] == ["video"]
        finally:
            handle.remove()
    # The every-stream routing fails the same comparison: the audio queries' dense attention is another output.
    assert not torch.allclose(pa, every_a, rtol=1e-4, atol=1e-5)


def test_compensation_file_states_the_streams_it_was_trained_for():
    """The compensation LoRA's metadata names its token streams (``h3_sparse_streams``: what the ``compensation_lora``
    lever and the executed check compare with the recipe's ``sparse_attention.streams``); the default is the lever's
    (video only); a stream the lever does not know is refused before any training."""
    from h3.levers.compensation_lora import STREAMS_KEY
    from h3.train.compensate import compensation_metadata, compensation_routing

    meta = compensation_metadata(TrainConfig(), "0" * 64)
    assert meta[STREAMS_KEY] == "video" and STREAMS_KEY == "h3_sparse_streams"
    assert (meta["h3_sparse_block_size"], meta["h3_sparse_sparsity"], meta["h3_sparse_dense_steps"]) == \
        ("32", "0.85", "0")
    both = replace(TrainConfig(), compensate_streams=("video", "audio"))
    assert compensation_metadata(both, "0" * 64)[STREAMS_KEY] == "video,audio"
    assert compensation_routing(both).streams == ["video", "audio"]
    with pytest.raises(ValueError, match="pixels"):
        compensation_routing(replace(TrainConfig(), compensate_streams=("pixels",)))


def test_patchify_is_the_pipelines():
    from diffusers.modular_pipelines.minimax_h3.before_denoise import patchify_video_latents

    x = torch.randn(2, 24, 5, 8, 8)
    assert torch.equal(patchify(x)[1], patchify_video_latents(x[1:], tuple(TRANSFORMER_CONFIG["patch_size"])))
    assert torch.equal(unpatchify(patchify(x), 5, 8, 8), x)
    a = torch.randn(2, 2, 32, 7)
    assert torch.equal(audio_rows(a)[0], a[0].permute(0, 2, 1).reshape(-1, 32))


def _pipeline_call(root, workflow_kwargs, prompt):
    """The transformer's keyword arguments at the pipeline's second step, and the pipeline itself."""
    from diffusers.modular_pipelines import ModularPipeline

    pipe = ModularPipeline.from_pretrained(str(root), local_files_only=True)
    pipe.load_components(dtype=torch.float32, local_files_only=True, pretrained_model_name_or_path=str(root))
    target = pipe.transformer_ref if "references" in workflow_kwargs else pipe.transformer
    calls = []
    hook = target.register_forward_pre_hook(
        lambda m, a, kw: calls.append({k: (v.clone() if torch.is_tensor(v) else v) for k, v in kw.items()}),
        with_kwargs=True)
    pipe(prompt=prompt, generator=torch.Generator().manual_seed(0), num_inference_steps=3, height=128, width=128,
         num_frames=124, output_type="pt", **workflow_kwargs)
    hook.remove()
    return pipe, calls[-1]


@pytest.mark.parametrize("workflow", ["t2va", "fl2va", "ref2va"])
def test_training_conditioning_is_what_the_pipeline_feeds(checkpoint, workflow):
    """Text rows, modality tags, rotary positions, row timesteps and conditioning rows of every workflow, against the
    diffusers pipeline run on the same checkpoint (the model casts positions to float32, so they are compared there)."""
    from PIL import Image

    from diffusers.modular_pipelines.minimax_h3.references import MiniMaxH3ImageReference
    from h3.world.render import reference_image, render_video
    from h3.world.scene import sample_scene

    scene = sample_scene(5, 3)
    frames = render_video([scene], frame_count=124)[0]
    first, last, ref = frames[0], frames[-1], reference_image(scene)
    prompt = scene.caption(refer_first=workflow == "ref2va")
    kwargs = {"t2va": {}, "fl2va": {"image": Image.fromarray(first.numpy()), "last_image": Image.fromarray(last.numpy())},
              "ref2va": {"references": [MiniMaxH3ImageReference(image=Image.fromarray(ref.numpy()))]}}[workflow]
    pipe, kw = _pipeline_call(checkpoint, kwargs, prompt)
    tok, proc = pipe.tokenizer, pipe.processor
    cond = None
    if workflow == "t2va":
        ids, tags = conditioning.t2va_tokens(tok, prompt)
        vision, layout = None, t2va_layout(torch.tensor(tags))
    else:
        images = [first.permute(2, 0, 1), last.permute(2, 0, 1)] if workflow == "fl2va" else [ref.permute(2, 0, 1)]
        vision = conditioning.image_features(proc, images)
        counts = conditioning.image_token_counts(proc, vision)
        if workflow == "fl2va":
            ids, tags = conditioning.fl2va_tokens(tok, prompt, counts)
            layout = t2va_layout(torch.tensor(tags), ("first", "last"))
        else:
            ids, tags = conditioning.ref2va_tokens(tok, prompt, counts[0])
            layout = ref2va_layout(torch.tensor(tags))
        cond = conditioning.keyframe_latents(pipe.vae, torch.stack(images))
    text = conditioning.encode(pipe.text_encoder, proc, [(ids, vision)])[0]
    torch.testing.assert_close(text, kw["encoder_hidden_states"][0], rtol=0, atol=0)
    for name in ("token_tags", "video_indices", "audio_indices", "text_indices"):
        assert torch.equal(getattr(layout, name), kw[name]), name
    assert torch.equal(layout.position_ids.float(), kw["position_ids"].float())
    tv = kw["timestep"][kw["timestep_indices"][layout.video_indices[-1]]]
    ta = kw["timestep"][kw["timestep_indices"][layout.audio_indices[-1]]]
    assert torch.equal(row_timesteps(layout, tv[None], ta[None])[0], kw["timestep"][kw["timestep_indices"]])
    if cond is not None:
        n = layout.num_condition_video_rows
        # The pipeline's rows are 0.999 * latent + 0.001 * its own noise draw.
        noise_part = (kw["hidden_states"][0, :n] - 0.999 * patchify(cond).reshape(n, -1)) / 0.001
        assert noise_part.abs().max() < 6 and abs(float(noise_part.std()) - 1) < 0.1


def test_batched_keyframe_latents_equal_encode_vae_condition(components):
    from diffusers.modular_pipelines.minimax_h3.encoders import encode_vae_condition

    vae = components["vae"]
    frames = torch.randint(0, 256, (3, 3, 128, 128), dtype=torch.uint8)
    batched = conditioning.keyframe_latents(vae, frames)
    for i in range(3):
        single = encode_vae_condition(vae, frames[i:i + 1, :, None], (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), 42)
        # The pipeline rounds the sampled latent to float16: a 1-ulp float32 difference of the batched convolution
        # can flip one float16 rounding (2^-11 relative).
        torch.testing.assert_close(batched[i:i + 1], single, rtol=2 ** -10, atol=1e-6)


def synthetic_pool(n=6, seed=0):
    """A pool whose video latents are a function of the caption's first word id: learnable by a small DiT."""
    from h3.train.pool import Pool

    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(3, 24, 37, 8, 8, generator=gen)
    texts, tags, clips, tasks, video = [], [], [], [], []
    for i in range(n):
        kind = i % 3
        video.append(base[kind] + 0.1 * torch.randn(24, 37, 8, 8, generator=gen))
        text = torch.randn(7, 32, generator=gen) * 0.1
        text[0, kind] += 3.0
        texts.append(text.to(torch.bfloat16)); tags.append((1,) * 7); clips.append(i); tasks.append("t2va")
    audio = torch.randn(n, 2, 32, 207, generator=gen) * 0.5
    keyframes = torch.zeros(0, 24, 1, 8, 8)
    return Pool(video=torch.stack(video).to(torch.bfloat16), audio=audio.to(torch.bfloat16),
                keyframe_first=keyframes, keyframe_last=keyframes, reference=keyframes, texts=texts, tags=tags,
                clips=clips, tasks=tasks)


def dit_config(**kw):
    return TrainConfig.smoke(dit_batch=3, dit_warmup=3, dit_lr=2e-3, dit_task_mix=(1.0, 0.0, 0.0), log_every=1,
                             checkpoint_every=1000, **kw)


def test_dit_training_lowers_the_loss(tmp_path):
    """The flow-matching loss on fixed held-aside draws (the same noise, levels and requests) falls with training."""
    from h3.train.dit import Batches, flow_loss, init_dit, train_dit

    cfg = dit_config(dit_steps=60)
    pool = synthetic_pool()

    def held_aside(model):
        batches = Batches(pool, cfg)
        with torch.no_grad():
            return float(np.mean([flow_loss(model, batches, batches.draw(10_000 + i), cfg)[0].item()
                                  for i in range(6)]))

    start = small_dit()
    init_dit(start)
    trained = copy.deepcopy(start)
    result = train_dit(trained, pool, cfg, tmp_path, Budget(None))
    assert result["done"] and len(result["log"]) == 60
    before, after = held_aside(start), held_aside(trained)
    assert after < 0.85 * before, (before, after)


def test_dit_resumed_slices_land_on_the_same_state(tmp_path):
    from h3.train.common import load_state
    from h3.train.dit import train_dit

    cfg = dit_config(dit_steps=6)
    pool = synthetic_pool()
    straight = train_dit(small_dit(), pool, cfg, tmp_path / "a", Budget(None))
    first = train_dit(small_dit(), pool, cfg, tmp_path / "b", Budget(None), stop_after=4)
    assert not first["done"] and first["step"] == 4
    # A fresh process: new model object, state read back from disk.
    second = train_dit(small_dit(seed=99), pool, cfg, tmp_path / "b", Budget(None))
    assert second["done"] and second["log"] == straight["log"]
    a, b = load_state(tmp_path / "a" / "dit" / "state.pt"), load_state(tmp_path / "b" / "dit" / "state.pt")
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
        assert torch.equal(a["ema"][key], b["ema"][key]), key
    for sa, sb in zip(a["opt"]["state"].values(), b["opt"]["state"].values()):
        assert torch.equal(sa["exp_avg"], sb["exp_avg"]) and torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])


def test_audio_vae_resumed_slices_land_on_the_same_state(tmp_path):
    from diffusers import AutoencoderKLMiniMaxH3Audio

    from h3.tiny_trained import AUDIO_VAE_CONFIG
    from h3.train.vaes import train_audio_vae

    def fresh(seed):
        torch.manual_seed(seed)
        return AutoencoderKLMiniMaxH3Audio(**AUDIO_VAE_CONFIG)

    cfg = TrainConfig.smoke(audio_vae_steps=4, audio_vae_batch=2, audio_vae_latents=4)
    straight = train_audio_vae(fresh(0), cfg, tmp_path / "a", Budget(None))
    first = train_audio_vae(fresh(0), cfg, tmp_path / "b", Budget(None), stop_after=2)
    assert not first["done"] and first["step"] == 2
    resumed_model = fresh(1)
    resumed = train_audio_vae(resumed_model, cfg, tmp_path / "b", Budget(None))
    assert resumed["log"] == straight["log"]
    a = torch.load(tmp_path / "a" / "audio_vae" / "state.pt", weights_only=False)["model"]
    for key, value in resumed_model.state_dict().items():
        assert torch.equal(value, a[key]), key


def test_distill_lora_ships_in_the_h3_format_diffusers_loads(tmp_path):
    """Exported in the original MiniMax-H3 names (fused qkv, fc1 halves in H3's order, mixed rank, metadata alpha),
    converted back by diffusers' loader to exactly the trained deltas, and the lever matches every module."""
    from safetensors import safe_open

    from h3.train.lora import DistillLora, loaded_deltas

    model = small_dit()
    lora = DistillLora(model, rank=4, adaln_rank=2, seed=0)
    with torch.no_grad():
        for name, p in lora.factors.items():
            if name.endswith("_B"):
                p.normal_(0, 1.0)
    path = tmp_path / "turbo4-tiny.safetensors"
    lora.save(path)
    with safe_open(str(path), "pt") as f:
        keys, metadata = list(f.keys()), f.metadata()
    assert all(k.startswith("diffusion_model.blocks.") for k in keys) and metadata["alpha"] == "4.0"
    assert any(".attn.qkv_proj." in k for k in keys) and any(".mlp.fc1." in k for k in keys)
    loaded, trained = loaded_deltas(path), lora.deltas(model)
    assert set(loaded) == set(trained) and len(trained) == 7 * SMALL_DIT["num_layers"]
    for name in trained:
        torch.testing.assert_close(loaded[name], trained[name], rtol=1e-5, atol=1e-7)
    # The student (hooks) and the model with the LoRA loaded through the pipeline's loader compute the same thing.
    from diffusers.modular_pipelines import MiniMaxH3Blocks

    pipe = MiniMaxH3Blocks().init_pipeline()
    pipe.update_components(transformer=copy.deepcopy(model))
    pipe.load_lora_weights(str(path), adapter_name="distill")
    layout = t2va_layout(torch.ones(5, dtype=torch.long))
    gen = torch.Generator().manual_seed(0)
    args = (layout, torch.randn(2, VIDEO_ROWS, ROW, generator=gen), torch.randn(2, 414, 32, generator=gen),
            torch.randn(2, 5, 32, generator=gen), torch.tensor([0.2, 0.7]), torch.tensor([0.4, 0.9]))
    with torch.no_grad():
        lora.attach(model)
        hooked = packed_forward(model, *args)
        lora.detach()
        peft = packed_forward(pipe.transformer, *args)
        plain = packed_forward(model, *args)
    torch.testing.assert_close(peft[0], hooked[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(peft[1], hooked[1], rtol=1e-4, atol=1e-5)
    effect = float((plain[0] - hooked[0]).abs().max())
    assert effect > 100 * float((peft[0] - hooked[0]).abs().max()) and effect > 1e-3, effect


def _saved_random_lora(model, path, rank: int, adaln_rank: int):
    """A distillation LoRA on ``model`` with every factor drawn from N(0, 1) (seeded), saved at ``path``."""
    from h3.train.lora import DistillLora

    lora = DistillLora(model, rank=rank, adaln_rank=adaln_rank, seed=0)
    with torch.no_grad():
        for p in lora.factors.values():
            p.normal_(0, 1.0)
    lora.save(path)
    return lora


def test_a_shipped_lora_loads_back_into_the_distillation_exactly(tmp_path):
    """``DistillLora.load_exported`` inverts the export (fc1 halves, the AdaLN factor's rank ratio): every factor equal
    bit for bit, the file's sha256 returned; a file of another rank, or no file, is refused naming it."""
    import hashlib

    from h3.train.lora import DistillLora

    model = small_dit()
    path = tmp_path / "turbo4-tiny.safetensors"
    trained = _saved_random_lora(model, path, rank=4, adaln_rank=2)
    fresh = DistillLora(model, rank=4, adaln_rank=2, seed=1)
    assert not all(torch.equal(fresh.factors[k], v) for k, v in trained.factors.items())
    assert fresh.load_exported(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    assert all(torch.equal(fresh.factors[k], v) for k, v in trained.factors.items())
    with pytest.raises(ValueError, match="do not fit"):
        DistillLora(model, rank=2, adaln_rank=2).load_exported(path)
    with pytest.raises(ValueError, match="do not fit"):
        DistillLora(model, rank=4, adaln_rank=1).load_exported(path)
    with pytest.raises(ValueError, match="no such LoRA file"):
        fresh.load_exported(tmp_path / "missing.safetensors")


def test_a_lower_rank_lora_is_embedded_into_a_wider_one_with_the_same_deltas(tmp_path):
    """Continuing a rank-4 LoRA at rank 8 (AdaLN 2 -> 3): every module's delta after loading equals the file's own,
    B @ A computed in float64 from the file's tensors as diffusers' loader reads them (``loaded_deltas``); the new
    columns of B are zero and the new rows of A keep the wider LoRA's init, so training can use them; a file whose
    alpha is not its rank is refused."""
    from safetensors.torch import load_file, save_file

    from h3.train.lora import DistillLora, loaded_deltas

    model = small_dit()
    path = tmp_path / "narrow.safetensors"
    _saved_random_lora(model, path, rank=4, adaln_rank=2)
    wide = DistillLora(model, rank=8, adaln_rank=3, seed=5)
    init = {k: v.detach().clone() for k, v in wide.factors.items()}
    wide.load_exported(path)
    reference = {name: d.double() for name, d in loaded_deltas(path).items()}
    got = wide.deltas(model)
    assert set(got) == set(reference)
    for name, delta in got.items():
        torch.testing.assert_close(delta.double(), reference[name], rtol=1e-5, atol=1e-5)
    for key, value in wide.factors.items():
        r = 2 if "_adaln_" in key else 4
        if key.endswith("_B"):
            assert torch.count_nonzero(value[:, r:]) == 0 and torch.count_nonzero(value[:, :r]) > 0
        else:
            assert torch.equal(value[r:], init[key][r:]) and not torch.equal(value[:r], init[key][:r])
    state = load_file(str(path))
    save_file(state, str(tmp_path / "odd.safetensors"), metadata={"format": "pt", "alpha": "8.0"})
    with pytest.raises(ValueError, match="odd.safetensors: network alpha '8.0' for its rank 4"):
        wide.load_exported(tmp_path / "odd.safetensors")


def test_text_encoding_in_batches_equals_one_at_a_time(components):
    te, tok, proc = components["text_encoder"], components["tokenizer"], components["processor"]
    prompts = ["a red circle moves left to right while a low tone hums", "a blue square moves top to bottom while a "
               "high tone hums", "a red circle moves right to left while a low tone hums"]
    items = [(conditioning.t2va_tokens(tok, p)[0], None) for p in prompts]
    batched = conditioning.encode(te, proc, items)
    for (ids, _), got in zip(items, batched):
        one = conditioning.encode(te, proc, [(ids, None)])[0]
        torch.testing.assert_close(got, one, rtol=1e-5, atol=1e-5)


def test_tiny_trained_missing_is_named(monkeypatch, tmp_path, fast_recipe):
    import h3.tiny_trained as tt
    from h3.runtime import CheckpointError, H3Runtime

    monkeypatch.setattr(tt, "TRAINED_DIR", tmp_path / "absent")
    with pytest.raises(CheckpointError, match=r"absent/modular_model_index\.json.*python -m h3\.train"):
        H3Runtime.load("tiny", fast_recipe, "cpu")


def test_exported_checkpoint_and_turbo4_tiny_load_through_the_runtime(monkeypatch, checkpoint, tmp_path):
    """The export layout loads as --model tiny (recorded as tiny-trained), and turbo4-tiny's LoRA goes through the
    LoRA lever (diffusers' MiniMaxH3LoraLoaderMixin) matching every module it targets: 7 per DiT block."""
    import shutil

    import h3.tiny_trained as tt
    from h3.recipe import load_recipe, recipe_from_dict
    from h3.runtime import GenerateRequest, H3Runtime
    from h3.train.lora import DistillLora

    root = tmp_path / "tiny"
    shutil.copytree(checkpoint, root)
    monkeypatch.setattr(tt, "TRAINED_DIR", root)
    monkeypatch.setattr(tt, "TURBO4_LORA_FILE", root / "lora" / "turbo4-tiny.safetensors")
    runtime = H3Runtime.load("tiny", load_recipe("baseline"), "cpu")
    lora = DistillLora(runtime.pipe.transformer, rank=4, adaln_rank=2)
    with torch.no_grad():
        for name, p in lora.factors.items():
            if name.endswith("_B"):
                p.normal_(0, 0.02)
    lora.save(root / "lora" / "turbo4-tiny.safetensors")
    recipe = load_recipe("turbo4-tiny").model_dump()
    recipe.update(steps=2, dtype="float32")
    runtime = H3Runtime.load("tiny", recipe_from_dict(recipe), "cpu")
    telemetry = runtime.levers["lora"].telemetry()
    blocks = len(runtime.pipe.transformer.transformer_blocks)
    assert telemetry["applied"] and telemetry["fused"]
    assert telemetry["matched_modules"] == telemetry["file_modules"] == 7 * blocks
    assert runtime.model == "tiny-trained" and runtime.default_size == (128, 128)
    record = runtime.generate(GenerateRequest(prompt="a red circle moves left to right while a low tone hums; the "
                                                     "background is plain", seed=0), tmp_path / "clip.mp4")
    assert record.shape.num_frames == 124 and record.executed.forward_passes == 2
    rows_per_frame = (128 // 16 // tt.TRANSFORMER_CONFIG["patch_size"][1]) ** 2  # 16 at the (1, 2, 2) patch
    assert record.shape.sequence_length == record.shape.num_text_tokens + 37 * rows_per_frame + 2 * 207


# --- the state that travels between device calls (h3.train.travel) ---


def _moments(state):
    return [(idx, key, t) for idx, per in state["opt"]["state"].items() for key, t in per.items()
            if t.dim() > 0]


def _assert_same_state(a, b, keys=("model", "ema")):
    for key in keys:
        if key in a:
            assert a[key].keys() == b[key].keys(), key
            for name in a[key]:
                assert torch.equal(a[key][name], b[key][name]), (key, name)
    assert a["step"] == b["step"] and a["log"] == b["log"]


def test_state_pack_fp32_resumes_exactly_and_bf16_rounds_only_the_moments(tmp_path):
    """A DiT slice ended at step 4 of 6, packed and unpacked in a fresh folder, continues to the uninterrupted run's
    state bit for bit from an fp32 pack; a bf16 pack keeps weights, EMA and log exactly and holds each moment as its
    bfloat16 rounding, so its continuation is the uninterrupted run with the moments rounded at step 4."""
    from h3.train.common import load_state, save_state
    from h3.train.dit import train_dit
    from h3.train.travel import pack_state, unpack_state

    cfg = dit_config(dit_steps=6)
    pool = synthetic_pool()
    train_dit(small_dit(), pool, cfg, tmp_path / "straight", Budget(None))
    first = train_dit(small_dit(), pool, cfg, tmp_path / "sliced", Budget(None), stop_after=4)
    assert not first["done"] and first["step"] == 4
    sliced = load_state(tmp_path / "sliced" / "dit" / "state.pt")
    straight = load_state(tmp_path / "straight" / "dit" / "state.pt")

    exact = pack_state(tmp_path / "sliced", tmp_path / "fp32.pack", moments="fp32")
    assert exact["stages"]["dit"]["moments"] == "fp32" and exact["stages"]["dit"]["step"] == 4
    unpack_state(tmp_path / "fp32.pack", tmp_path / "exact")
    assert train_dit(small_dit(seed=99), pool, cfg, tmp_path / "exact", Budget(None))["done"]
    resumed = load_state(tmp_path / "exact" / "dit" / "state.pt")
    _assert_same_state(straight, resumed)
    for (_, _, a), (_, _, b) in zip(_moments(straight), _moments(resumed)):
        assert torch.equal(a, b)

    rounded = pack_state(tmp_path / "sliced", tmp_path / "bf16.pack")
    assert rounded["stages"]["dit"]["moments"] == "bf16"
    assert (tmp_path / "bf16.pack").stat().st_size < (tmp_path / "fp32.pack").stat().st_size
    unpack_state(tmp_path / "bf16.pack", tmp_path / "rounded")
    got = load_state(tmp_path / "rounded" / "dit" / "state.pt")
    _assert_same_state(sliced, got)
    for (i, k, a), (j, m, b) in zip(_moments(sliced), _moments(got)):
        assert (i, k) == (j, m) and b.dtype == torch.float32
        assert torch.equal(b, a.to(torch.bfloat16).float()), (i, k)
    assert all(torch.equal(sliced["opt"]["state"][i]["step"], got["opt"]["state"][i]["step"])
               for i in sliced["opt"]["state"])
    # The reference: the sliced state with its moments rounded in memory, continued.
    reference = copy.deepcopy(sliced)
    for idx, key, t in _moments(reference):
        reference["opt"]["state"][idx][key] = t.to(torch.bfloat16).float()
    save_state(tmp_path / "reference" / "dit" / "state.pt", reference)
    for folder in ("rounded", "reference"):
        assert train_dit(small_dit(seed=5), pool, cfg, tmp_path / folder, Budget(None))["done"]
    a, b = (load_state(tmp_path / f / "dit" / "state.pt") for f in ("rounded", "reference"))
    _assert_same_state(a, b)
    # ... and re-packing bf16-rounded moments loses nothing more.
    pack_state(tmp_path / "rounded", tmp_path / "again.pack")
    unpack_state(tmp_path / "again.pack", tmp_path / "again")
    again = load_state(tmp_path / "again" / "dit" / "state.pt")
    rerounded = load_state(tmp_path / "rounded" / "dit" / "state.pt")
    for idx, key, t in _moments(rerounded):
        rerounded["opt"]["state"][idx][key] = t.to(torch.bfloat16).float()
    for (_, _, x), (_, _, y) in zip(_moments(rerounded), _moments(again)):
        assert torch.equal(x, y)


def _small_video_vae(seed):
    from diffusers import AutoencoderKLMiniMaxH3

    from h3.tiny_trained import VAE_CONFIG

    torch.manual_seed(seed)
    return AutoencoderKLMiniMaxH3(**{**VAE_CONFIG, "block_out_channels": (4,) * 6, "norm_num_groups": 2,
                                     "decoder_num_layers": 1, "decoder_num_attention_heads": 1,
                                     "decoder_attention_head_dim": 8, "decoder_ffn_mult": 1})


def _small_video_vae_loss(vae, cfg, step):
    """The video VAE stage's encode -> sample -> decode on a 22-frame 32x32 clip drawn from the step's seed (the real
    loss renders 128x128 world clips: seconds a step on this CPU)."""
    from h3.train.common import generators

    cpu, dev = generators(cfg.seed, "video-vae", step, cfg.device)
    x = torch.randn(1, 3, 22, 32, 32, generator=cpu)
    posterior = vae.encode(x).latent_dist
    loss = (vae.decode(posterior.sample(generator=dev)).sample - x).abs().mean()
    return loss, {"loss": loss.detach()}


def _dependent_state(step, planned):
    gen = torch.Generator().manual_seed(step)
    return {"model": {"w": torch.randn(5, generator=gen)}, "ema": {"w": torch.randn(5, generator=gen)},
            "opt": {"state": {0: {"step": torch.tensor(float(step)), "exp_avg": torch.randn(5, generator=gen),
                                  "exp_avg_sq": torch.rand(5, generator=gen)}},
                    "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.99), "params": [0]}]},
            "step": step, "total_steps": step, "planned_steps": planned, "seconds": 1.5, "log": [{"step": step}]}


def test_continue_video_vae_reopens_a_budget_ended_stage_and_drops_what_depends_on_it(tmp_path, monkeypatch):
    """A video VAE stage that a budget ended after 1 of 3 steps (with the pool, DiT and distillation built on it),
    packed and unpacked with continue=video-vae: the dependents are gone, the stage is not done, and continuing it
    lands on the uninterrupted 3-step run's weights, moments and log."""
    import h3.train.vaes as vaes
    from h3.train.common import load_state, save_state
    from h3.train.run import _cut, stage_done
    from h3.train.travel import PackError, pack_state, reopen_stage, unpack_state

    monkeypatch.setattr(vaes, "video_vae_loss", _small_video_vae_loss)
    cfg = TrainConfig.smoke(video_vae_steps=3)
    vaes.train_video_vae(_small_video_vae(0), cfg, tmp_path / "straight", Budget(None))
    ended = tmp_path / "ended"
    assert not vaes.train_video_vae(_small_video_vae(0), cfg, ended, Budget(None), stop_after=1)["done"]
    _cut(ended, "video-vae")  # what --finish-on-budget does
    assert stage_done(ended, "video-vae")
    (ended / "pool").mkdir()
    (ended / "pool" / "pool.pt").write_bytes(b"stands for the latent pool")
    save_state(ended / "dit" / "state.pt", _dependent_state(7, 30))
    save_state(ended / "distill" / "state.pt", _dependent_state(2, 9))

    manifest = pack_state(ended, tmp_path / "ended.pack", moments="fp32")
    assert sorted(manifest["stages"]) == ["distill", "dit", "video_vae"]
    info = manifest["stages"]["video_vae"]
    assert (info["step"], info["total_steps"], info["planned_steps"], info["moments"]) == (1, 1, 3, "fp32")
    cont = tmp_path / "cont"
    assert unpack_state(tmp_path / "ended.pack", cont, ["video-vae"])["dropped"] == ["dit", "distill"]
    assert sorted(p.name for p in cont.iterdir()) == ["video_vae"] and not stage_done(cont, "video-vae")
    result = vaes.train_video_vae(_small_video_vae(7), cfg, cont, Budget(None))
    assert result["done"] and result["step"] == 3
    straight = load_state(tmp_path / "straight" / "video_vae" / "state.pt")
    resumed = load_state(cont / "video_vae" / "state.pt")
    _assert_same_state(straight, resumed)
    for (_, _, a), (_, _, b) in zip(_moments(straight), _moments(resumed)):
        assert torch.equal(a, b)

    # In place (the state folder of the call itself): the pool goes too; dit re-opened drops only distill.
    assert reopen_stage(ended, "video-vae") == ["pool", "dit", "distill"]
    save_state(ended / "dit" / "state.pt", _dependent_state(7, 30))
    save_state(ended / "distill" / "state.pt", _dependent_state(2, 9))
    (ended / "pool").mkdir()
    assert reopen_stage(ended, "dit") == ["distill"] and (ended / "pool").is_dir()
    dit = load_state(ended / "dit" / "state.pt")
    assert (dit["step"], dit["total_steps"], dit["planned_steps"]) == (7, 30, 30)
    assert reopen_stage(ended, "dit", 40) == [] and load_state(ended / "dit" / "state.pt")["total_steps"] == 40
    with pytest.raises(PackError, match=r"ran 3 steps of the 3 asked"):
        reopen_stage(tmp_path / "straight", "video-vae")
    with pytest.raises(PackError, match=r"not a training stage"):
        reopen_stage(ended, "pool")
    with pytest.raises(PackError, match=r"not empty"):
        unpack_state(tmp_path / "ended.pack", cont)


def test_a_pack_that_cannot_be_used_is_refused_with_one_error(tmp_path, capsys):
    from h3.train.__main__ import main
    from h3.train.common import save_state
    from h3.train.travel import PackError, pack_state, unpack_state

    save_state(tmp_path / "run" / "state" / "dit" / "state.pt", _dependent_state(7, 7))
    save_state(tmp_path / "run" / "state" / "audio_vae" / "state.pt", _dependent_state(3, 5))
    pack = tmp_path / "state.pack"
    assert main(["pack", "--out", str(tmp_path / "run"), "--to", str(pack), "--moments", "drop"]) == 0
    out = capsys.readouterr().out
    assert "dit: step 7/7 (planned 7), moments dropped" in out
    assert "audio_vae: step 3/3 (planned 5), moments dropped" in out
    with pytest.raises(PackError, match=r"dropped its optimizer moments"):
        unpack_state(pack, tmp_path / "u0", ["dit"])
    assert not (tmp_path / "u0").exists()  # nothing written
    assert main(["unpack", "--out", str(tmp_path / "u1"), "--from", str(pack)]) == 0

    import tarfile

    data = pack.read_bytes()
    with tarfile.open(pack) as tar:
        member = tar.getmember("dit.pt.z")  # the last member
    (tmp_path / "cut.pack").write_bytes(data[:member.offset_data + member.size // 2])
    flipped = bytearray(data)
    flipped[member.offset_data + member.size // 2] ^= 0xFF
    (tmp_path / "flipped.pack").write_bytes(bytes(flipped))
    for name, message in (("cut.pack", r"not a readable state pack|sha256"), ("flipped.pack", r"sha256"),
                          ("absent.pack", r"no such pack")):
        with pytest.raises(PackError, match=message):
            unpack_state(tmp_path / name, tmp_path / "u2")
        assert main(["unpack", "--out", str(tmp_path / "u3"), "--from", str(tmp_path / name)]) == 3
        assert "error: " in capsys.readouterr().err
    assert main(["unpack", "--out", str(tmp_path / "u4"), "--from", str(pack), "--continue", "vae"]) == 3
    assert not (tmp_path / "u2").exists() and not (tmp_path / "u3").exists() and not (tmp_path / "u4").exists()

    bad = _dependent_state(4, 4)
    bad["ema"]["w"][2] = float("nan")
    save_state(tmp_path / "nan" / "state" / "dit" / "state.pt", bad)
    pack_state(tmp_path / "nan" / "state", tmp_path / "nan.pack")
    with pytest.raises(PackError, match=r"dit: ema holds non-finite values"):
        unpack_state(tmp_path / "nan.pack", tmp_path / "u5")
    bad = _dependent_state(4, 4)
    bad["seconds"] = float("inf")
    save_state(tmp_path / "inf" / "state" / "dit" / "state.pt", bad)
    pack_state(tmp_path / "inf" / "state", tmp_path / "inf.pack")
    with pytest.raises(PackError, match=r"seconds inf"):
        unpack_state(tmp_path / "inf.pack", tmp_path / "u6")


def test_video_decoder_trains_the_wide_decoder_alone_on_the_frozen_encoder(tmp_path, monkeypatch):
    """The video-decoder stage: the video-vae stage's encoder copied bit for bit and left so (the latent space the pool
    and the DiT use does not move), every decoder-side weight trained, the loss on a clip it fits falls, and resumed
    slices land on the uninterrupted run's state."""
    from diffusers import AutoencoderKLMiniMaxH3

    import h3.train.vaes as vaes
    from h3.tiny_trained import VAE_CONFIG, VAE_DECODER_CONFIG
    from h3.train.common import load_state

    torch.manual_seed(3)
    narrow = AutoencoderKLMiniMaxH3(**VAE_CONFIG).state_dict()
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, 32), torch.linspace(-1, 1, 32), indexing="ij")
    disc = ((xx - 0.3) ** 2 + yy ** 2 < 0.2).float()  # a red disc on a dark ground, as a world clip has
    clip = torch.stack([1.5 * disc - 0.8, -0.8 * disc - 0.5, -0.8 + 0 * disc])[None, :, None].expand(1, 3, 22, 32, 32)

    def one_clip_loss(vae, cfg, step, stage="video-vae", batch=None):
        assert stage == "video-decoder" and batch == cfg.video_decoder_batch
        posterior = vae.encode(clip).latent_dist
        loss = (vae.decode(posterior.mode()).sample - clip).abs().mean()
        return loss, {"loss": loss.detach()}

    monkeypatch.setattr(vaes, "video_vae_loss", one_clip_loss)
    cfg = TrainConfig.smoke(video_decoder_steps=30, video_decoder_lr=2e-3, log_every=1)
    vae = vaes.wide_vae(narrow, cfg.seed)
    assert vae.config.decoder_num_layers == VAE_DECODER_CONFIG["decoder_num_layers"] != VAE_CONFIG["decoder_num_layers"]
    with torch.no_grad():
        before = float(one_clip_loss(vae, cfg, 0, "video-decoder", cfg.video_decoder_batch)[0])
    start = copy.deepcopy(vae.state_dict())
    assert vaes.train_video_decoder(vae, cfg, tmp_path / "a", Budget(None))["done"]
    trained = load_state(tmp_path / "a" / "video_decoder" / "state.pt")["model"]
    for name, value in trained.items():
        if name.startswith(vaes.ENCODER_SIDE):
            assert torch.equal(value, narrow[name]), name
        elif value.is_floating_point() and value.numel() > 1:
            assert not torch.equal(value, start[name]), f"{name} did not train"
    with torch.no_grad():
        after = float(one_clip_loss(vae, cfg, 0, "video-decoder", cfg.video_decoder_batch)[0])
    assert after < 0.5 * before, (before, after)

    cfg = TrainConfig.smoke(video_decoder_steps=4, log_every=1)
    straight = vaes.train_video_decoder(vaes.wide_vae(narrow, cfg.seed), cfg, tmp_path / "b", Budget(None))
    assert not vaes.train_video_decoder(vaes.wide_vae(narrow, cfg.seed), cfg, tmp_path / "c", Budget(None),
                                        stop_after=2)["done"]
    resumed = vaes.train_video_decoder(vaes.wide_vae(narrow, 99), cfg, tmp_path / "c", Budget(None))
    assert resumed["done"] and resumed["log"] == straight["log"]
    _assert_same_state(load_state(tmp_path / "b" / "video_decoder" / "state.pt"),
                       load_state(tmp_path / "c" / "video_decoder" / "state.pt"), keys=("model",))


def test_pack_moments_per_stage(tmp_path):
    """``--moments bf16,video_vae=drop``: the finished video VAE travels without its moments (what lets a wide
    decoder's state travel beside the DiT's), the others as the default says; a wrong spec is one clear error."""
    from h3.train.common import save_state
    from h3.train.travel import PackError, pack_state, parse_moments

    save_state(tmp_path / "state" / "video_vae" / "state.pt", _dependent_state(5, 5))
    save_state(tmp_path / "state" / "dit" / "state.pt", _dependent_state(7, 7))
    unfinished = _dependent_state(3, 9)
    unfinished["total_steps"] = 9
    save_state(tmp_path / "state" / "video_decoder" / "state.pt", unfinished)
    stages = pack_state(tmp_path / "state", tmp_path / "a.pack", "bf16,video_vae=drop")["stages"]
    assert {k: v["moments"] for k, v in stages.items()} == {"video_vae": "dropped", "video_decoder": "bf16",
                                                            "dit": "bf16"}
    stages = pack_state(tmp_path / "state", tmp_path / "b.pack", "fp32,video_decoder=drop,dit=drop")["stages"]
    # an unfinished stage keeps its moments (in bfloat16) even when asked to drop them
    assert {k: v["moments"] for k, v in stages.items()} == {"video_vae": "fp32", "video_decoder": "bf16",
                                                            "dit": "dropped"}
    for bad in ("bf17", "bf16,vae=drop", "bf16,fp32", "dit=none"):
        with pytest.raises(PackError, match=r"moments="):
            parse_moments(bad)


def test_teacher_picks_keep_the_old_draw_and_repeat_presentations_evenly_past_the_pool():
    """Up to the pool's t2va presentations the picks are a seeded permutation's prefix (the draw every earlier run
    made, so their records reproduce); past it, further permutations follow: every presentation recurs 2 or 3 times
    for 2.5 x the pool, none 3 times before all twice."""
    from h3.train.distill import teacher_picks

    def g():
        return torch.Generator().manual_seed(7)

    assert teacher_picks(10, 6, g()) == torch.randperm(10, generator=g()).tolist()[:6]
    picks = teacher_picks(10, 25, g())
    reference = g()
    first, second, third = (torch.randperm(10, generator=reference).tolist() for _ in range(3))
    assert picks == first + second + third[:5]
    assert sorted(picks.count(i) for i in range(10)) == [2] * 5 + [3] * 5
    with pytest.raises(ValueError, match="no t2va"):
        teacher_picks(0, 3, g())


def test_every_stage_runs_and_exports_on_the_cpu(tmp_path):
    """``python -m h3.train all --smoke`` end to end, the video decoder in its own process as on a GPU: every stage
    ends, the record names them all, and the export ships the wide decoder (a stage that hard-codes a shape of the
    old (1, 4, 4) patch fails here: the distillation's teacher noise did)."""
    import json

    from h3.tiny_trained import VAE_DECODER_CONFIG
    from h3.train.run import run

    from h3.train.pool import Pool

    # More teacher samples than the pool has t2va presentations: each recurs with another noise, and the record says
    # how many samples over how many presentations.
    # A DiT of another depth than the shipped one (issue 17's widening knobs): every stage takes it, and it exports.
    cfg = TrainConfig.smoke(distill_moment_weight=0.5, distill_motion_weight=0.5, distill_teacher_samples=11,
                            compensate_steps=2, dit_num_layers=3)
    assert run("all", cfg, tmp_path, parallel_vaes=True, finish_on_budget=True, max_seconds=900) == 0
    record = json.loads((tmp_path / "tiny" / "training_record.json").read_text())
    tasks = Pool.load(tmp_path / "state" / "pool" / "pool.pt", "cpu").tasks
    assert tasks.count("t2va") == cfg.pool_size == 8
    assert (record["stages"]["distill"]["teacher_samples"], record["stages"]["distill"]["teacher_presentations"]) \
        == (11, 8)
    groups = torch.load(tmp_path / "state" / "distill" / "teacher.pt", weights_only=False)
    assert sum(len(g["presentations"]) for g in groups) == 11
    noises = {}
    for g in groups:
        for p, noise in zip(g["presentations"], g["noise_v"]):
            noises.setdefault(p, []).append(noise)
    assert len(noises) == 8 and sorted(map(len, noises.values())) == [1, 1, 1, 1, 1, 2, 2, 2]
    assert all(not torch.equal(n[0], n[1]) for n in noises.values() if len(n) == 2)  # another noise each time
    assert set(record["stages"]) == {"video_vae", "video_decoder", "audio_vae", "audio_decoder", "dit", "distill",
                                     "compensate"}
    # The compensation LoRA ships beside the turbo one, naming the routing it trained under and the LoRA it sits on.
    from safetensors import safe_open

    from h3.levers.compensation_lora import COMPENSATES_KEY, lora_tensors_sha256

    assert record["compensation_lora"]["file"] == "lora/sparse85-tiny.safetensors"
    assert record["compensation_lora"]["ok"] and record["stages"]["compensate"]["steps"] == 2
    with safe_open(str(tmp_path / "tiny" / "lora" / "sparse85-tiny.safetensors"), framework="pt") as handle:
        meta = handle.metadata()
    assert (meta["h3_sparse_block_size"], float(meta["h3_sparse_sparsity"])) == ("32", 0.85)
    assert meta[COMPENSATES_KEY] == lora_tensors_sha256(tmp_path / "tiny" / "lora" / "turbo4-tiny.safetensors")
    assert "--set compensate_steps=2" in record["reproduce"]
    distill_rows = record["losses"]["distill"]
    assert distill_rows and all(math.isfinite(r["moment"]) and r["moment"] >= 0 for r in distill_rows)
    assert all(math.isfinite(r["motion"]) and r["motion"] >= 0 for r in distill_rows)
    assert "--set video_decoder_steps=3" in record["reproduce"]
    vae = json.loads((tmp_path / "tiny" / "vae" / "config.json").read_text())
    assert {k: vae[k] for k in VAE_DECODER_CONFIG} == VAE_DECODER_CONFIG
    from h3.tiny_trained import shipped_transformer_config

    assert shipped_transformer_config(tmp_path / "tiny") == {**TRANSFORMER_CONFIG, "num_layers": 3}
    assert "--set dit_num_layers=3" in record["reproduce"]
    assert json.loads((tmp_path / "config.json").read_text())["config"]["dit_num_layers"] == 3


def test_processes_of_one_run_write_its_json_files_at_once(tmp_path):
    """Stages beside each other write the run's config.json at the same moment (what made the every-stage test flaky
    under load: with one shared temporary name a writer's rename took the file from under the other, and that stage's
    process died). Four writers, 200 writes each: none fails, and the file is always one writer's whole JSON."""
    import json
    import threading

    from h3.train.common import write_json

    path, errors = tmp_path / "config.json", []

    def writer(index: int) -> None:
        for k in range(200):
            try:
                write_json(path, {"writer": index, "k": k, "pad": "x" * 4000})
                json.loads(path.read_text())
            except Exception as exc:  # noqa: BLE001 - every failure is counted
                errors.append(repr(exc))

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert json.loads(path.read_text())["k"] == 199
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]  # no temporary file left behind


def test_a_stage_process_that_fails_is_an_error_naming_it_and_a_paused_one_resumes():
    """The export waits for the stages beside it: one that ended done or paused on its budget gives its code (a paused
    one makes the run's code EXIT_RESUME), one that crashed is an error naming the stage, never a silent export of the
    narrow decoder in place of the wide one."""
    import subprocess
    import sys

    from h3.train.run import EXIT_RESUME, StageProcessError, _wait_beside, _wait_stage

    def process(code: int) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])

    assert _wait_stage("video-decoder", process(0)) == 0
    assert _wait_stage("video-decoder", process(EXIT_RESUME)) == EXIT_RESUME
    with pytest.raises(StageProcessError, match=r"stage video-decoder \(its own process, pid \d+\) exited with code 3"):
        _wait_stage("video-decoder", process(3))
    assert _wait_beside(None, {"video-decoder": process(0), "audio-decoder": process(0)}, 0) == 0
    assert _wait_beside(process(0), {"video-decoder": process(EXIT_RESUME)}, 0) == EXIT_RESUME
    with pytest.raises(StageProcessError, match="audio-decoder"):
        _wait_beside(None, {"video-decoder": process(0), "audio-decoder": process(1)}, 0)


def test_a_wider_dit_trains_exports_and_continues_with_its_own_shape(tmp_path, capsys):
    """Issue 17's "widen the tiny configs as far as quality needs": ``--set dit_*`` gives the DiT another shape (0
    keeps the shipped one); a checkpoint seeds a continuing run with the DiT shape in its own config.json; a run that
    asks for another shape than its DiT state's is one error naming both, before any stage loads the state; the
    trained LoRAs are checked against the shipped checkpoint's shape, not a constant."""
    import shutil

    from diffusers import MiniMaxH3Transformer3DModel

    from h3.tiny_trained import TRAINED_DIR, shipped_transformer_config
    from h3.train.common import DIT_SHAPE_SETTINGS, save_state
    from h3.train.run import check_dit_shape
    from h3.train.travel import seed_from_checkpoint

    assert TrainConfig().transformer_config() == TRANSFORMER_CONFIG == shipped_transformer_config()
    wide_cfg = TrainConfig(dit_hidden_size=160, dit_num_layers=5, dit_num_attention_heads=5, dit_ffn_dim=320)
    wide = wide_cfg.transformer_config()
    assert {k: wide[k] for k in DIT_SHAPE_SETTINGS} == {
        "hidden_size": 160, "num_layers": 5, "num_attention_heads": 5, "ffn_dim": 320}
    assert {k: v for k, v in wide.items() if k not in DIT_SHAPE_SETTINGS} == {
        k: v for k, v in TRANSFORMER_CONFIG.items() if k not in DIT_SHAPE_SETTINGS}
    with pytest.raises(ValueError, match="whole numbers >= 0"):
        TrainConfig(dit_num_layers=-1).transformer_config()

    # An exported checkpoint with the wider DiT: the copy of the shipped one with its transformer replaced.
    ckpt = tmp_path / "ckpt"
    shutil.copytree(TRAINED_DIR, ckpt)
    torch.manual_seed(0)
    wide_dit = MiniMaxH3Transformer3DModel(**wide)
    shutil.rmtree(ckpt / "transformer")
    wide_dit.save_pretrained(ckpt / "transformer")
    assert shipped_transformer_config(ckpt) == wide
    seed_from_checkpoint(ckpt, tmp_path / "state", ())
    state = torch.load(tmp_path / "state" / "dit" / "state.pt", weights_only=False)
    assert all(torch.equal(state["model"][k], v) for k, v in wide_dit.state_dict().items())

    check_dit_shape(MiniMaxH3Transformer3DModel(**wide), tmp_path / "state")  # the run's own shape: no error
    with pytest.raises(ValueError, match=r"another shape than this run's \(hidden_size=128, num_layers=4, "
                                         r"num_attention_heads=4, ffn_dim=256; [1-9]\d* tensors differ by name, "
                                         r"[1-9]\d* by shape\): continue it with the --set dit_hidden_size"):
        check_dit_shape(MiniMaxH3Transformer3DModel(**TRANSFORMER_CONFIG), tmp_path / "state")
    for name, over, message in (("layers", dict(dit_num_layers=5), r"[1-9]\d* tensors differ by name, 0 by shape"),
                                ("width", dict(dit_ffn_dim=320), r"0 tensors differ by name, [1-9]\d* by shape")):
        save_state(tmp_path / name / "dit" / "state.pt", {"model": MiniMaxH3Transformer3DModel(
            **TrainConfig(**over).transformer_config()).state_dict()})
        with pytest.raises(ValueError, match=message):
            check_dit_shape(MiniMaxH3Transformer3DModel(**TRANSFORMER_CONFIG), tmp_path / name)
    check_dit_shape(MiniMaxH3Transformer3DModel(**TRANSFORMER_CONFIG), tmp_path / "none")  # no state yet

    # `unpack --from CHECKPOINT --fresh dit`: the VAEs seeded, the DiT left to train from its initial weights (at any
    # shape); asking for it both fresh and continued, or fresh for another stage, is one error.
    from h3.train.__main__ import main

    assert main(["unpack", "--out", str(tmp_path / "fresh"), "--from", str(TRAINED_DIR), "--fresh", "dit"]) == 0
    seeded = sorted(p.parent.name for p in (tmp_path / "fresh" / "state").glob("*/state.pt"))
    assert seeded == ["audio_decoder", "audio_vae", "video_decoder", "video_vae"]
    check_dit_shape(MiniMaxH3Transformer3DModel(**wide), tmp_path / "fresh" / "state")
    for extra, message in ((["--fresh", "dit", "--continue", "dit"], "dit: both continued and fresh"),
                           (["--fresh", "audio-vae"], "--fresh audio_vae: a checkpoint can leave only dit unseeded")):
        shutil.rmtree(tmp_path / "bad", ignore_errors=True)
        capsys.readouterr()
        assert main(["unpack", "--out", str(tmp_path / "bad"), "--from", str(TRAINED_DIR), *extra]) == 3
        assert message in capsys.readouterr().err
        assert not (tmp_path / "bad" / "state").exists() or not any((tmp_path / "bad" / "state").iterdir())


def test_the_dit_ships_in_bfloat16_when_asked_and_loads_as_trained(components, tmp_path):
    """``--set export_dit_dtype=bfloat16`` halves the DiT's file (what a wider DiT needs under the 30 MB budget): its
    tensors are the trained float32 ones rounded to bfloat16, but for the modules diffusers keeps in float32 and the
    norms, stored exactly; diffusers loads it, and a bad dtype is refused before any stage trains."""
    from diffusers import MiniMaxH3Transformer3DModel
    from safetensors.torch import load_file

    from h3.train.distill import DistillLora
    from h3.train.export import DIT_FILE, export_checkpoint
    from h3.train.run import run

    transformer = components["transformer"]
    lora = DistillLora(transformer, 4, 2)
    record = {"seed": 0, "losses": {"dit": [{"step": 1, "loss": 0.5}]}}
    cfg = TrainConfig(export_dit_dtype="bfloat16")
    full = {k: v.detach().float() for k, v in transformer.state_dict().items()}
    export_checkpoint(dict(components), lora, tmp_path / "bf16", record, cfg=cfg)
    stored = load_file(str(tmp_path / "bf16" / "tiny" / DIT_FILE))
    kept = tuple(MiniMaxH3Transformer3DModel._keep_in_fp32_modules)
    for key, value in stored.items():
        exact = key.startswith(kept) or "norm" in key
        assert value.dtype == (torch.float32 if exact else torch.bfloat16), key
        assert torch.equal(value, full[key] if exact else full[key].to(torch.bfloat16)), key
    halved = sum(v.dtype == torch.bfloat16 for v in stored.values())
    assert record["dit_file"] == {"dtype": "bfloat16", "tensors_in_dtype": halved,
                                  "tensors_float32": len(stored) - halved} and halved >= 8 * 4  # 8+ a block
    total = sum(v.numel() for v in full.values())
    assert (tmp_path / "bf16" / "tiny" / DIT_FILE).stat().st_size < 0.55 * 4 * total
    loaded = MiniMaxH3Transformer3DModel.from_pretrained(tmp_path / "bf16" / "tiny" / "transformer")
    assert all(torch.equal(v.float(), stored[k].float()) for k, v in loaded.state_dict().items())
    with pytest.raises(ValueError, match="export_dit_dtype must be one of float32, bfloat16, got 'fp16'"):
        run("all", TrainConfig.smoke(export_dit_dtype="fp16"), tmp_path / "bad")
    with pytest.raises(ValueError, match="whole numbers >= 0"):
        run("all", TrainConfig.smoke(dit_hidden_size=-8), tmp_path / "bad")
    assert not (tmp_path / "bad").exists()  # nothing written, not even the run's config


def test_seeding_from_the_exported_checkpoint_continues_it(tmp_path, monkeypatch, capsys):
    """A new session has the shipped checkpoint, not the state pack it came from: ``unpack --from CHECKPOINT_DIR``
    rebuilds the states from its weights and record (exactly), ``--continue dit:N`` re-opens the DiT with AdamW
    restarted and its learning rate warmed up again from the step it resumes at, and the next ``all`` continues it,
    redoes the distillation and exports, naming the seeding in the record. A checkpoint missing a file is refused
    with one error naming it."""
    import json
    import shutil

    from safetensors.torch import load_file

    import h3.train.dit as dit_module
    from h3.train.__main__ import main
    from h3.train.common import load_state, lr_at
    from h3.train.run import run
    from h3.train.vaes import ENCODER_SIDE

    cfg = TrainConfig.smoke()
    assert run("all", cfg, tmp_path / "a", finish_on_budget=True, max_seconds=900) == 0
    ckpt = tmp_path / "a" / "tiny"
    shipped = json.loads((ckpt / "training_record.json").read_text())["stages"]

    broken = tmp_path / "broken"
    shutil.copytree(ckpt, broken)
    (broken / "transformer" / "diffusion_pytorch_model.safetensors").unlink()
    assert main(["unpack", "--out", str(tmp_path / "x"), "--from", str(broken), "--continue", "dit"]) == 3
    assert "transformer/diffusion_pytorch_model.safetensors: missing" in capsys.readouterr().err

    out = tmp_path / "b"
    steps = shipped["dit"]["steps"]
    assert main(["unpack", "--out", str(out), "--from", str(ckpt), "--continue", f"dit:{steps + 3}"]) == 0
    dit = load_state(out / "state" / "dit" / "state.pt")
    transformer = load_file(str(ckpt / "transformer" / "diffusion_pytorch_model.safetensors"))
    assert set(dit["model"]) == set(transformer)
    assert all(torch.equal(dit["model"][k], v) and torch.equal(dit["ema"][k], v) for k, v in transformer.items())
    assert (dit["step"], dit["total_steps"], dit["warm_from"]) == (steps, steps + 3, steps) and "opt" not in dit
    vae = load_file(str(ckpt / "vae" / "diffusion_pytorch_model.safetensors"))
    decoder = load_state(out / "state" / "video_decoder" / "state.pt")
    encoder = load_state(out / "state" / "video_vae" / "state.pt")["model"]
    assert all(torch.equal(decoder["model"][k], v) for k, v in vae.items())
    assert all(torch.equal(encoder[k], v) for k, v in vae.items() if k.startswith(ENCODER_SIDE))
    audio = load_file(str(ckpt / "audio_vae" / "diffusion_pytorch_model.safetensors"))
    for stage in ("audio_vae", "audio_decoder"):  # the record has an audio-decoder stage: it is seeded too
        assert all(torch.equal(load_state(out / "state" / stage / "state.pt")["model"][k], v) for k, v in audio.items())
    assert not (out / "state" / "distill").exists()

    rates = []
    real_set_lr = dit_module.set_lr
    monkeypatch.setattr(dit_module, "set_lr", lambda opt, lr: (rates.append(lr), real_set_lr(opt, lr)))
    assert run("all", cfg, out, finish_on_budget=True, max_seconds=900) == 0
    assert rates == [lr_at(k, cfg.dit_lr, cfg.dit_warmup) for k in range(3)]  # warmed up again from the resume
    assert rates[0] < cfg.dit_lr
    record = json.loads((out / "tiny" / "training_record.json").read_text())
    assert record["stages"]["dit"]["steps"] == steps + 3
    assert record["stages"]["video_decoder"]["steps"] == shipped["video_decoder"]["steps"]
    assert record["stages"]["audio_decoder"]["steps"] == shipped["audio_decoder"]["steps"]
    assert record["seeded_from_checkpoint"]["dit"]["warm_from"] == steps
    assert record["seeded_from_checkpoint"]["dit"]["checkpoint"] == str(ckpt)

    # `--fresh dit` with a DiT of another shape (session 21's plan for issue 17): the seeded VAEs, a DiT trained from
    # its initial weights at that shape, exported with it.
    fresh = tmp_path / "c"
    assert main(["unpack", "--out", str(fresh), "--from", str(ckpt), "--fresh", "dit"]) == 0
    deeper = TrainConfig.smoke(dit_num_layers=3)
    assert run("all", deeper, fresh, finish_on_budget=True, max_seconds=900) == 0
    record = json.loads((fresh / "tiny" / "training_record.json").read_text())
    assert record["stages"]["dit"]["steps"] == deeper.dit_steps and "dit" not in record["seeded_from_checkpoint"]
    assert record["stages"]["video_decoder"]["steps"] == shipped["video_decoder"]["steps"]
    exported = json.loads((fresh / "tiny" / "transformer" / "config.json").read_text())
    assert (exported["num_layers"], exported["hidden_size"]) == (3, TRANSFORMER_CONFIG["hidden_size"])
    assert all(torch.equal(load_file(str(fresh / "tiny" / "vae" / "diffusion_pytorch_model.safetensors"))[k], v)
               for k, v in vae.items())  # the shipped video VAE, untouched


def test_audio_decoder_continues_the_decoder_on_whole_clips_with_the_encoder_frozen(tmp_path):
    """The audio-decoder stage: starts from the audio-vae stage's weights, leaves every encoder-side weight (the causal
    attention included) bit for bit as it was, so the pool's latents do not move; trains the decoder side; on whole
    clips (``audio_decoder_latents`` None) its loss compares the decode, cropped to the clip's length, with the clip;
    a resumed slice lands on the uninterrupted run's state."""
    from diffusers import AutoencoderKLMiniMaxH3Audio
    from diffusers.utils.torch_utils import randn_tensor

    import h3.train.vaes as vaes
    from h3.tiny_trained import AUDIO_VAE_CONFIG
    from h3.train.common import generators, load_state
    from h3.world.render import render_audio
    from h3.world.scene import sample_scenes

    torch.manual_seed(5)
    start = AutoencoderKLMiniMaxH3Audio(**AUDIO_VAE_CONFIG).state_dict()
    cfg = TrainConfig.smoke(audio_decoder_steps=4, log_every=1)
    audio_vae = vaes.audio_decoder_vae(start)
    trainable = {n for n, p in audio_vae.named_parameters() if p.requires_grad}
    assert trainable and all(not n.startswith(vaes.AUDIO_ENCODER_SIDE) for n in trainable)
    assert any(n.startswith("pre_block.") for n, _ in audio_vae.named_parameters())  # the attention is frozen too
    straight = vaes.train_audio_decoder(audio_vae, cfg, tmp_path / "a", Budget(None))
    trained = load_state(tmp_path / "a" / "audio_decoder" / "state.pt")["model"]
    for name, value in trained.items():
        if name.startswith(vaes.AUDIO_ENCODER_SIDE):
            assert torch.equal(value, start[name]), name
    assert any(not torch.equal(trained[n], start[n]) for n in trainable)
    assert not vaes.train_audio_decoder(vaes.audio_decoder_vae(start), cfg, tmp_path / "b", Budget(None),
                                        stop_after=2)["done"]
    resumed = vaes.train_audio_decoder(vaes.audio_decoder_vae(start), cfg, tmp_path / "b", Budget(None))
    assert resumed["done"] and resumed["log"] == straight["log"]
    _assert_same_state(load_state(tmp_path / "a" / "audio_decoder" / "state.pt"),
                       load_state(tmp_path / "b" / "audio_decoder" / "state.pt"), keys=("model",))

    # whole clips: the wave term is the click-weighted L1 + 10 L2 of (decode cropped to the clip) - clip, in float64
    cfg = TrainConfig.smoke(audio_decoder_latents=None, audio_decoder_batch=1)
    audio_vae = vaes.audio_decoder_vae(start).eval()
    _, metrics = vaes.audio_vae_loss(audio_vae, cfg, 0, stage="audio-decoder", batch=1, latents=None)
    scenes = sample_scenes(vaes.scene_stream(cfg.seed, "audio-decoder"), 1, start=0)
    audio, clicks = render_audio(scenes, "cpu", return_click_mask=True)
    _, dev_g = generators(cfg.seed, "audio-decoder", 0, "cpu")
    with torch.no_grad():
        mean = audio_vae.encode(audio[:, :1]).latent_dist.mean
        z = mean + 0.05 * mean.std().clamp(min=1e-3) * randn_tensor(mean.shape, generator=dev_g, dtype=mean.dtype)
        decoded = audio_vae.decode(z).sample
    assert mean.shape[-1] * vaes.HOP >= audio.shape[-1] > (mean.shape[-1] - 1) * vaes.HOP  # the whole clip encoded
    assert decoded.shape[-1] > audio.shape[-1]
    err = decoded[..., :audio.shape[-1]].double() - audio[:, :1].double()
    weight = 1.0 + cfg.audio_vae_click_weight * clicks[:, None].double()
    wave = float((weight * err.abs()).mean() + 10 * (weight * err.pow(2)).mean())
    assert float(metrics["wave"]) == pytest.approx(wave, rel=1e-4)
    assert float(metrics["l1"]) == pytest.approx(float(err.abs().mean()), rel=1e-4)


def test_distillation_learning_rate_cosine_matches_a_float64_reference():
    """``lr_at`` with ``final`` < 1: linear warm-up, then a cosine to ``final * peak`` at the planned last step (the
    distillation's ``distill_lr_final``); with the default ``final`` = 1 it stays the constant rate of earlier runs."""
    import math

    from h3.train.common import lr_at

    peak, warmup, total, final = 1e-3, 100, 2200, 0.1
    for step in (0, 49, 99, 100, 500, 1150, 2199, 2200, 5000):
        base = peak * min(1.0, (step + 1) / warmup)
        progress = min(1.0, max(0.0, (step - warmup) / (total - warmup)))
        expected = base * (final + (1 - final) * 0.5 * (1 + math.cos(math.pi * progress))) if step >= warmup else base
        assert lr_at(step, peak, warmup, total, final) == pytest.approx(expected, rel=1e-12)
        assert lr_at(step, peak, warmup, total) == lr_at(step, peak, warmup) == base
    assert lr_at(total, peak, warmup, total, final) == pytest.approx(final * peak)
    assert lr_at(warmup + (total - warmup) // 2, peak, warmup, total, final) == pytest.approx((1 + final) / 2 * peak)


def test_moment_gap_matches_a_float64_reference_and_reads_a_planted_shrink():
    """The distillation's moment term: per sample and channel, mean and population std over tokens, squared gaps
    averaged; a student whose output is the teacher's shrunk by half around its mean scores (std / 2)^2 averaged."""
    import numpy as np

    from h3.train.distill import moment_gap

    rng = np.random.default_rng(3)
    target = rng.normal(0.3, 1.7, size=(4, 50, 6))
    x = rng.normal(-0.2, 0.9, size=(4, 50, 6))
    ref = ((x.mean(1) - target.mean(1)) ** 2).mean() + ((x.std(1) - target.std(1)) ** 2).mean()
    assert float(moment_gap(torch.tensor(x), torch.tensor(target))) == pytest.approx(ref, rel=1e-12)
    shrunk = target.mean(1, keepdims=True) + 0.5 * (target - target.mean(1, keepdims=True))
    assert float(moment_gap(torch.tensor(shrunk), torch.tensor(target))) == pytest.approx(
        ((0.5 * target.std(1)) ** 2).mean(), rel=1e-12)
    assert float(moment_gap(torch.tensor(target), torch.tensor(target))) == 0.0


def test_motion_gap_matches_a_float64_reference_and_ignores_a_constant_offset():
    """The distillation's motion term: the frame-to-frame changes of the video x0 (frame-major rows) against the
    teacher's; a student off by the same amount in every frame has none of it, one whose motion is frozen has all."""
    import numpy as np

    from h3.train.distill import motion_gap

    rng = np.random.default_rng(4)
    frames, rows = 5, 3
    target = rng.normal(size=(2, frames * rows, 4))
    x = rng.normal(size=(2, frames * rows, 4))
    d = lambda v: np.diff(v.reshape(2, frames, rows, 4), axis=1)  # noqa: E731
    ref = ((d(x) - d(target)) ** 2).mean()
    assert float(motion_gap(torch.tensor(x), torch.tensor(target), frames)) == pytest.approx(ref, rel=1e-12)
    assert float(motion_gap(torch.tensor(target + 0.7), torch.tensor(target), frames)) == pytest.approx(0, abs=1e-12)
    frozen = np.tile(target[:, :rows], (1, frames, 1))  # every frame the first one
    assert float(motion_gap(torch.tensor(frozen), torch.tensor(target), frames)) == pytest.approx(
        (d(target) ** 2).mean(), rel=1e-12)
    with pytest.raises(ValueError, match="do not split into 4 latent frames"):
        motion_gap(torch.tensor(x), torch.tensor(target), 4)


def test_reproduce_line_repeats_the_settings_and_the_distillation_plan():
    """The record's one command carries every setting that differs from the defaults and each stage's step count;
    read back by ``--set`` it gives the run's config. A distillation whose budget ended it before its plan keeps the
    plan for its learning rate's cosine (``distill_lr_steps``): a ``distill_steps`` of the steps that ran alone would
    squeeze the cosine into them (run 12's record, 2156 of 2300 steps, lost three settings and the plan)."""
    import shlex

    from h3.train.__main__ import _parse_set
    from h3.train.common import lr_at
    from h3.train.run import reproduce_line

    cfg = TrainConfig(distill_teacher_samples=2048, distill_lr_final=0.1, distill_moment_weight=1.0,
                      dit_task_mix=(0.5, 0.25, 0.25), ranks=1)
    stages = {"dit": {"steps": 15116, "planned_steps": 30000}, "distill": {"steps": 2156, "planned_steps": 2300}}
    line = reproduce_line(cfg, stages)
    words = shlex.split(line)
    assert words[:9] == ["python", "-m", "h3.train", "all", "--out", "OUT", "--seed", "17", "--device"]
    sets = [w for prev, w in zip(words, words[1:]) if prev == "--set"]
    back = _parse_set(sets, TrainConfig())
    expected = replace(cfg, dit_steps=15116, distill_steps=2156, distill_lr_steps=2300)
    assert back == expected
    # the rate of every step that ran is the original run's (planned over 2300), not a cosine over 2156
    for step in (0, 150, 1200, 2155):
        assert lr_at(step, back.distill_lr, 100, back.distill_lr_steps, back.distill_lr_final) == \
            lr_at(step, cfg.distill_lr, 100, 2300, cfg.distill_lr_final)
    assert lr_at(2155, back.distill_lr, 100, back.distill_steps, back.distill_lr_final) != \
        lr_at(2155, cfg.distill_lr, 100, 2300, cfg.distill_lr_final)
    # a plan that ran to its end, or a constant rate, needs no plan of its own
    done = {"distill": {"steps": 2300, "planned_steps": 2300}}
    assert "distill_lr_steps" not in reproduce_line(cfg, done)
    assert "distill_lr_steps" not in reproduce_line(TrainConfig(), stages)
    assert reproduce_line(TrainConfig(), {}) == "python -m h3.train all --out OUT --seed 17 --device cuda "
    # the compensation stage the same (run 17: 1770 of 2000 planned steps)
    comp = reproduce_line(TrainConfig(), {"compensate": {"steps": 1770, "planned_steps": 2000}})
    assert _parse_set([w for prev, w in zip(shlex.split(comp), shlex.split(comp)[1:]) if prev == "--set"],
                      TrainConfig()) == replace(TrainConfig(), compensate_steps=1770, compensate_lr_steps=2000)


def test_dit_learning_rate_anneals_along_its_plan_from_where_it_restarted(tmp_path):
    """``dit_lr_final`` < 1: after the warm-up the DiT's rate falls along a cosine to ``dit_lr_final * dit_lr`` over
    ``dit_lr_steps`` steps counted from the (re)start (``warm_from`` when continued from a checkpoint); the rate of
    each step is the float64 reference's. The default (1.0) keeps the constant rate the shipped DiT trained with."""
    from h3.train.common import load_state, lr_at
    from h3.train.dit import train_dit

    pool = synthetic_pool()
    for steps in (5, 8):
        cfg = dit_config(dit_steps=steps, dit_lr_final=0.1, dit_lr_steps=8)
        train_dit(small_dit(), pool, cfg, tmp_path / f"a{steps}", Budget(None))
        lr = load_state(tmp_path / f"a{steps}" / "dit" / "state.pt")["opt"]["param_groups"][0]["lr"]
        progress = (steps - 1 - 3) / (8 - 3)  # the last step ran at step index steps - 1; warm-up 3
        assert lr == pytest.approx(2e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))), rel=1e-12)
        assert lr == pytest.approx(lr_at(steps - 1, 2e-3, 3, 8, 0.1), rel=1e-12)
    # a continued stage counts its plan from warm_from (h3.train.travel re-opens a checkpoint's DiT there)
    first = dit_config(dit_steps=4)
    train_dit(small_dit(), pool, first, tmp_path / "c", Budget(None))
    path = tmp_path / "c" / "dit" / "state.pt"
    state = load_state(path)
    state.update(warm_from=4, total_steps=10)
    state.pop("opt")
    torch.save(state, path)
    train_dit(small_dit(), pool, dit_config(dit_steps=10, dit_lr_final=0.1, dit_lr_steps=6), tmp_path / "c",
              Budget(None))
    lr = load_state(path)["opt"]["param_groups"][0]["lr"]
    assert lr == pytest.approx(lr_at(9 - 4, 2e-3, 3, 6, 0.1), rel=1e-12) and 0.1 * 2e-3 < lr < 0.5 * 2e-3
    # constant by default
    train_dit(small_dit(), pool, dit_config(dit_steps=6), tmp_path / "d", Budget(None))
    assert load_state(tmp_path / "d" / "dit" / "state.pt")["opt"]["param_groups"][0]["lr"] == 2e-3


def test_a_pool_can_weigh_two_shape_scenes_more_without_moving_the_suites():
    """``two_shape_share`` is the chance that a draw has two shapes; a scene whose events fall too close is drawn
    again, which two-shape draws need more often, so the realized share is lower (15-30 % of 600 scenes at 0.3). A
    pool asking for 0.6 gets more than twice the default's two-shape scenes; 0 and 1 give none and all; the default
    draws exactly the scenes it drew before the knob existed (the shipped prompt suites are compared in
    tests/test_world.py); a share outside [0, 1] is refused."""
    from h3.world.scene import TWO_SHAPE_SHARE, sample_scenes

    assert TWO_SHAPE_SHARE == 0.3
    n = 600
    two = {share: sum(len(s.shapes) == 2 for s in sample_scenes(5, n, two_shape_share=share)) for share in (0.3, 0.6)}
    assert 0.15 * n <= two[0.3] <= 0.3 * n and two[0.6] >= 2 * two[0.3], two
    default = sample_scenes(5, 40)
    assert [s.caption() for s in default] == [s.caption() for s in sample_scenes(5, 40, two_shape_share=0.3)]
    assert all(len(s.shapes) == 1 for s in sample_scenes(5, 30, two_shape_share=0.0))
    assert all(len(s.shapes) == 2 for s in sample_scenes(5, 30, two_shape_share=1.0))
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="two_shape_share"):
            sample_scenes(5, 1, two_shape_share=bad)


def test_a_continued_dit_keeps_the_latent_statistics_it_trained_with(tmp_path, capsys):
    """Every call rebuilds the pool; one drawn otherwise (here more two-shape scenes) has other per-channel latent
    statistics. Seeded from a checkpoint, the pool is normalized with the checkpoint's (its VAEs' latents_mean /
    latents_std), the DiT continues on them and the export ships them unchanged; a DiT state handed a pool normalized
    otherwise is refused with one error."""
    import json
    import shutil

    from diffusers import MiniMaxH3Transformer3DModel

    from h3.train.__main__ import main
    from h3.train.common import load_state
    from h3.train.dit import train_dit
    from h3.train.pool import Pool, latent_stats
    from h3.train.run import run

    cfg = TrainConfig.smoke()
    assert run("all", cfg, tmp_path / "a", finish_on_budget=True, max_seconds=900) == 0
    ckpt = tmp_path / "a" / "tiny"
    configs = {k: json.loads((ckpt / k / "config.json").read_text()) for k in ("vae", "audio_vae")}
    shipped = {key: [configs[folder]["latents_mean"], configs[folder]["latents_std"]]
               for key, folder in (("video", "vae"), ("audio", "audio_vae"))}
    steps = json.loads((ckpt / "training_record.json").read_text())["stages"]["dit"]["steps"]

    other = TrainConfig.smoke(pool_two_shape_share=1.0)
    fresh = tmp_path / "fresh"  # that pool with the checkpoint's VAEs and no DiT: its own statistics differ
    assert main(["unpack", "--out", str(fresh), "--from", str(ckpt)]) == 0
    (fresh / "state" / "dit" / "state.pt").unlink()
    assert run("pool", other, fresh, finish_on_budget=True, max_seconds=900) == 0
    own = latent_stats(Pool.load(fresh / "state" / "pool" / "pool.pt", "cpu"))
    assert own["audio"] != shipped["audio"] and own["video"] != shipped["video"]

    broken = tmp_path / "broken"  # a std of 0 would divide the pool by zero: refused with one error naming the file
    shutil.copytree(ckpt, broken)
    config = json.loads((broken / "audio_vae" / "config.json").read_text())
    config["latents_std"][0] = 0.0
    (broken / "audio_vae" / "config.json").write_text(json.dumps(config))
    assert main(["unpack", "--out", str(tmp_path / "x"), "--from", str(broken), "--continue", f"dit:{steps + 2}"]) == 3
    assert "audio_vae/config.json: latents_mean / latents_std must be finite" in capsys.readouterr().err

    out = tmp_path / "b"
    assert main(["unpack", "--out", str(out), "--from", str(ckpt), "--continue", f"dit:{steps + 2}"]) == 0
    assert load_state(out / "state" / "dit" / "state.pt")["latent_stats"] == shipped
    # the distillation starts from the checkpoint's LoRA (distill_init): its state at step 0 holds the file's factors
    lora_file = ckpt / "lora" / "turbo4-tiny.safetensors"
    other = replace(other, distill_init=str(lora_file))
    for stage in ("pool", "dit"):
        assert run(stage, other, out, finish_on_budget=True, max_seconds=900) == 0
    assert run("distill", other, out, stop_after=0) != 0
    from h3.train.lora import DistillLora

    expected = DistillLora(MiniMaxH3Transformer3DModel(**TRANSFORMER_CONFIG), other.lora_rank, other.lora_adaln_rank)
    sha = expected.load_exported(lora_file)
    started = load_state(out / "state" / "distill" / "state.pt")
    assert started["step"] == 0 and started["init_from"] == {"file": str(lora_file), "sha256": sha}
    assert all(torch.equal(started["lora"][k], v) for k, v in expected.state_dict().items())
    assert run("all", other, out, finish_on_budget=True, max_seconds=900) == 0
    record = json.loads((out / "tiny" / "training_record.json").read_text())
    assert record["stages"]["distill"]["init_from"]["sha256"] == sha
    assert f"--set distill_init={lora_file}" in record["reproduce"]
    assert latent_stats(Pool.load(out / "state" / "pool" / "pool.pt", "cpu")) == shipped
    assert load_state(out / "state" / "dit" / "state.pt")["latent_stats"] == shipped
    for key, folder in (("video", "vae"), ("audio", "audio_vae")):
        exported = json.loads((out / "tiny" / folder / "config.json").read_text())
        assert [exported["latents_mean"], exported["latents_std"]] == shipped[key]

    with pytest.raises(ValueError, match="other statistics than this DiT was trained with"):
        train_dit(MiniMaxH3Transformer3DModel(**TRANSFORMER_CONFIG),
                  Pool.load(fresh / "state" / "pool" / "pool.pt", "cpu"), other, out / "state", Budget(None))


def test_dmd_direction_is_the_loss_gradient_and_carries_samples_to_the_real_distribution():
    """DMD on one-dimensional Gaussians, float64, with the exact denoisers of N(mu, 1) under the DiT's noising: the
    student loss's gradient is the direction over the element count (autograd against the formula), and samples
    planted 2.0 away from the real mean, moved along the direction while the fake score tracks them, end at the real
    mean while keeping their spread."""
    from h3.train.dmd import distribution_loss, dmd_direction

    def denoiser(mu, xt, sigma):  # E[x0 | x_t] for x0 ~ N(mu, 1), x_t = (1 - sigma) x0 + sigma n
        c = (1 - sigma) / ((1 - sigma) ** 2 + sigma ** 2)
        return mu + c * (xt - (1 - sigma) * mu)

    gen = torch.Generator().manual_seed(0)
    x = (2.0 + torch.randn(1, 4000, 1, generator=gen, dtype=torch.float64)).requires_grad_(True)
    sigma = 0.6
    xt = (1 - sigma) * x.detach() + sigma * torch.randn(x.shape, generator=gen, dtype=torch.float64)
    real, fake = denoiser(0.0, xt, sigma), denoiser(float(x.detach().mean()), xt, sigma)
    direction = dmd_direction(x.detach(), real, fake)
    expected = (fake - real) / (x.detach() - real).abs().mean()
    torch.testing.assert_close(direction, expected, rtol=1e-12, atol=0)
    distribution_loss(x, direction).backward()
    torch.testing.assert_close(x.grad, direction / x.numel(), rtol=1e-12, atol=0)

    x = 2.0 + torch.randn(1, 4000, 1, generator=gen, dtype=torch.float64)
    for _ in range(400):
        sigma = float(0.05 + 0.9 * torch.rand(1, generator=gen, dtype=torch.float64))
        xt = (1 - sigma) * x + sigma * torch.randn(x.shape, generator=gen, dtype=torch.float64)
        x = x - 0.05 * dmd_direction(x, denoiser(0.0, xt, sigma), denoiser(float(x.mean()), xt, sigma))
    assert abs(float(x.mean())) < 0.05 and abs(float(x.std()) - 1.0) < 0.05, (float(x.mean()), float(x.std()))


def test_dmd_distillation_trains_both_loras_and_resumes_to_the_same_state(tmp_path):
    """``distill_objective = "dmd"`` on a small DiT: the first step trains the fake score alone (no student loss), the
    next ones both; the student and the fake score leave their zero start; a run cut after 2 of 4 steps and resumed in
    a fresh object lands on the straight run's log and factors bit for bit."""
    from h3.train.common import load_state
    from h3.train.distill import train_distill

    cfg = TrainConfig.smoke(distill_objective="dmd", distill_steps=4, dmd_fake_warmup=1, distill_teacher_samples=4,
                            distill_teacher_steps=3, distill_batch=2, lora_rank=4, lora_adaln_rank=2,
                            dmd_fake_rank=4, dmd_fake_adaln_rank=2, dmd_fake_updates=2, log_every=1,
                            checkpoint_every=1000)
    pool = synthetic_pool()
    straight_lora, straight = train_distill(small_dit(), pool, cfg, tmp_path / "a", Budget(None))
    assert straight["done"] and [sorted(r) for r in straight["log"]] == \
        [["fake", "step"]] + [["dmd", "fake", "loss", "step"]] * 3
    assert all(math.isfinite(v) for r in straight["log"] for v in r.values())
    a = load_state(tmp_path / "a" / "distill" / "state.pt")
    assert a["objective"] == "dmd"
    for factors in (a["lora"], a["fake"]):
        moved = [k for k, v in factors.items() if k.endswith("_B") and float(v.abs().max()) > 0]
        assert len(moved) == len([k for k in factors if k.endswith("_B")]), moved
    _, first = train_distill(small_dit(), pool, cfg, tmp_path / "b", Budget(None), stop_after=2)
    assert not first["done"] and first["step"] == 2
    _, second = train_distill(small_dit(), pool, cfg, tmp_path / "b", Budget(None))
    assert second["done"] and second["log"] == straight["log"]
    b = load_state(tmp_path / "b" / "distill" / "state.pt")
    for part in ("lora", "fake"):
        for key in a[part]:
            assert torch.equal(a[part][key], b[part][key]), (part, key)


@pytest.mark.parametrize("objective", ["regression", "dmd"])
def test_distillation_snapshots_are_the_student_at_their_steps(tmp_path, objective):
    """``distill_snapshot_every = 2`` over 4 steps writes the student at steps 2 and 4 in the exported format: the
    step-4 file is byte for byte the final LoRA's export, the step-2 file that of a run cut after 2 steps (and differs
    from step 4's); none is written without the setting."""
    from h3.train.distill import train_distill

    cfg = TrainConfig.smoke(distill_objective=objective, distill_steps=4, dmd_fake_warmup=1, distill_teacher_samples=4,
                            distill_teacher_steps=3, distill_batch=2, lora_rank=4, lora_adaln_rank=2,
                            dmd_fake_rank=4, dmd_fake_adaln_rank=2, dmd_fake_updates=1, checkpoint_every=1000,
                            distill_snapshot_every=2)
    pool = synthetic_pool()
    final, _ = train_distill(small_dit(), pool, cfg, tmp_path / "a", Budget(None))
    shots = tmp_path / "a" / "distill" / "snapshots"
    assert sorted(p.name for p in shots.iterdir()) == ["turbo4-tiny-step00002.safetensors",
                                                       "turbo4-tiny-step00004.safetensors"]
    final.to("cpu").save(tmp_path / "final.safetensors")
    assert (shots / "turbo4-tiny-step00004.safetensors").read_bytes() == (tmp_path / "final.safetensors").read_bytes()
    cut, _ = train_distill(small_dit(), pool, replace(cfg, distill_snapshot_every=0), tmp_path / "b", Budget(None),
                           stop_after=2)
    cut.to("cpu").save(tmp_path / "cut.safetensors")
    step2 = (shots / "turbo4-tiny-step00002.safetensors").read_bytes()
    assert step2 == (tmp_path / "cut.safetensors").read_bytes() != (tmp_path / "final.safetensors").read_bytes()
    assert not (tmp_path / "b" / "distill" / "snapshots").exists()


def test_an_unknown_distillation_objective_is_refused(tmp_path):
    from h3.train.distill import train_distill

    with pytest.raises(ValueError, match="distill_objective 'gan'"):
        train_distill(small_dit(), synthetic_pool(), TrainConfig.smoke(distill_objective="gan"), tmp_path,
                      Budget(None))


@pytest.mark.parametrize("fixed", [-1, 3])
def test_dmd_sees_a_random_student_step_or_the_one_it_is_given(tmp_path, monkeypatch, fixed):
    """``dmd_student_step`` -1 draws the student step per training step (over 8 steps more than one), 3 keeps the last
    one (the clip) every time; a step the student does not have is refused."""
    from h3.train import dmd
    from h3.train.distill import train_distill

    seen = []
    real = dmd.student_sample

    def spy(transformer, layout, text, xv, xa, grid, k, device):
        seen.append(k)
        return real(transformer, layout, text, xv, xa, grid, k, device)

    monkeypatch.setattr(dmd, "student_sample", spy)
    cfg = TrainConfig.smoke(distill_objective="dmd", distill_steps=8, dmd_fake_warmup=1, distill_teacher_samples=4,
                            distill_teacher_steps=3, distill_batch=1, lora_rank=2, lora_adaln_rank=1, dmd_fake_rank=2,
                            dmd_fake_adaln_rank=1, dmd_fake_updates=1, dmd_student_step=fixed)
    train_distill(small_dit(), synthetic_pool(), cfg, tmp_path / "run", Budget(None))
    assert len(seen) == 8 and all(0 <= k < 4 for k in seen)
    assert (len(set(seen)) > 1) if fixed < 0 else (seen == [3] * 8), seen
    with pytest.raises(ValueError, match="dmd_student_step 4"):
        train_distill(small_dit(), synthetic_pool(), replace(cfg, dmd_student_step=4), tmp_path / "bad", Budget(None))
