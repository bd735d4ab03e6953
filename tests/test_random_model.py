"""The random presets (``h3-random`` at released size, ``h3-random-small`` the same builder at the tiny configs), the
weight sources that read weights again, the turbo LoRA format, and the full-size memory plan.

The full-size model cannot be drawn on a CPU; it is built through the same builder on the meta device (shapes and
dtypes, no memory), which is what its configs, sizes and the memory plan are checked on.
"""

from __future__ import annotations

import pytest
import torch

from h3 import random_model
from h3.memory import H200_CAPACITY_GIB, full_size_plan
from h3.recipe import load_recipe, recipe_from_dict
from h3.runtime import H3Runtime, GenerateRequest, save_components
from h3.weights import CheckpointWeights, SeededWeights, draw_parameter
from tests.conftest import FAST_RECIPE

COMPONENTS = ("transformer", "vae", "audio_vae", "text_encoder")


def test_random_pipeline_is_what_loading_its_checkpoint_gives(tmp_path):
    """Built on the device in bf16, the small preset equals the same weights saved in the checkpoint layout and loaded
    by diffusers' ``from_pretrained`` in bf16: every parameter and buffer, dtype and bits (the ``_keep_in_fp32_modules``
    kept float32 as the loader keeps them)."""
    from diffusers.modular_pipelines import ModularPipeline

    pipe, _ = random_model.random_pipeline(random_model.small(), "cpu", torch.bfloat16)
    names = ["transformer", "vae", "audio_vae", "text_encoder", "tokenizer", "processor", "scheduler",
             "audio_scheduler"]
    save_components({n: getattr(pipe, n) for n in names}, tmp_path / "ckpt")
    loaded = ModularPipeline.from_pretrained(str(tmp_path / "ckpt"), local_files_only=True)
    loaded.load_components(workflow="t2va", dtype=torch.bfloat16, local_files_only=True,
                           pretrained_model_name_or_path=str(tmp_path / "ckpt"))
    float32 = 0
    for name in COMPONENTS:
        ours, theirs = getattr(pipe, name), getattr(loaded, name)
        mine = {**dict(ours.named_parameters()), **dict(ours.named_buffers())}
        other = {**dict(theirs.named_parameters()), **dict(theirs.named_buffers())}
        assert mine.keys() == other.keys(), name
        for key, tensor in mine.items():
            assert tensor.dtype == other[key].dtype and torch.equal(tensor, other[key]), f"{name}.{key}"
            float32 += tensor.dtype == torch.float32
    assert float32 > 0  # the float32-pinned modules are there and stayed float32


def test_small_preset_generates_a_labelled_clip(tmp_path):
    runtime = H3Runtime.load("h3-random-small", recipe_from_dict(FAST_RECIPE), "cpu")
    record = runtime.generate(GenerateRequest(prompt="a cat", seed=1), tmp_path / "clip.mp4")
    assert record.model == "h3-random-small" and record.weights == "random"
    assert record.extra["weights_notice"] == random_model.SMALL_NOTICE
    assert (record.shape.height, record.shape.width) == (128, 128)
    again = H3Runtime.load("h3-random-small", recipe_from_dict(FAST_RECIPE), "cpu")
    assert again.model_sha256 == runtime.model_sha256
    assert again.generate(GenerateRequest(prompt="a cat", seed=1), tmp_path / "again.mp4").frames_sha256 == \
        record.frames_sha256


def test_released_configs_are_the_full_size_model():
    """The same builder on the meta device: diffusers' default DiT and VAEs, and the Qwen3-VL-32B conditioner the
    DiT's text_dim reads; the sizes the issue and the bench state (33.1 B DiT, 33.3 B text encoder)."""
    components = random_model.build_components(random_model.released(), "meta", torch.bfloat16)
    params = {n: sum(p.numel() for p in components[n].parameters()) for n in COMPONENTS}
    assert params["transformer"] == 33_122_992_896  # bench/full_size_speed/results/h200_speed_stock.json: dit.params
    assert params["vae"] == 2_603_868_984  # ... vae.params
    assert round(params["text_encoder"] / 1e9, 1) == 33.4
    transformer, text = components["transformer"], components["text_encoder"]
    assert transformer.config.num_layers == 50 and transformer.config.hidden_size == 5376
    assert text.config.text_config.hidden_size == transformer.config.text_dim == 5120
    assert text.config.text_config.num_hidden_layers == 64 > 50  # hidden_states[50] exists
    assert text.config.text_config.vocab_size == 151936
    dtypes = {p.dtype for p in transformer.parameters()}
    assert dtypes == {torch.bfloat16, torch.float32}  # the float32 projections and time embedder, as released
    assert all(p.device.type == "meta" for n in COMPONENTS for p in components[n].parameters())


def test_released_transformer_config_is_diffusers_default():
    from diffusers import MiniMaxH3Transformer3DModel

    assert random_model.released().transformer == {}
    with torch.device("meta"):
        default = MiniMaxH3Transformer3DModel()
    built = random_model.build_components(random_model.released(), "meta", torch.bfloat16)["transformer"]
    assert dict(built.config) == dict(default.config)


def test_seeded_weights_draw_each_parameter_again_exactly():
    source = SeededWeights(7)
    linear = torch.nn.Linear(64, 32).to(torch.bfloat16)
    source.fill("transformer", linear)
    drawn = linear.weight.detach().clone()
    assert float(drawn.float().std()) == pytest.approx(64**-0.5, rel=0.15)
    assert torch.count_nonzero(linear.bias) == 0
    linear.weight.data.add_(1.0)
    ptr = linear.weight.data_ptr()
    assert source.restore("transformer", linear, ["weight"]) == 1
    assert torch.equal(linear.weight, drawn) and linear.weight.data_ptr() == ptr  # in place
    other = torch.empty(32, 64, dtype=torch.bfloat16)
    draw_parameter(other, 7, "transformer", "other.weight")
    assert not torch.equal(other, drawn)  # each parameter its own stream


def test_checkpoint_weights_restore_what_the_loader_gave(tmp_path):
    """A checkpoint stored in float32 and loaded in bf16: re-read and cast again gives the loaded bits."""
    from h3.runtime import tiny_checkpoint_dir

    recipe = recipe_from_dict({**FAST_RECIPE, "dtype": "bfloat16"})
    runtime = H3Runtime.load("tiny-random", recipe, "cpu")
    assert isinstance(runtime.weight_source, CheckpointWeights)
    transformer = runtime.pipe.transformer
    names = ["transformer_blocks.0.attn.to_q.weight", "proj_in.weight"]  # a bf16 weight, a float32-pinned one
    before = {n: transformer.get_parameter(n).detach().clone() for n in names}
    assert {before[n].dtype for n in names} == {torch.bfloat16, torch.float32}
    for n in names:
        transformer.get_parameter(n).data.mul_(3.0)
    assert CheckpointWeights(tiny_checkpoint_dir()).restore("transformer", transformer, names) == 2
    for n in names:
        assert torch.equal(transformer.get_parameter(n), before[n]), n
    with pytest.raises(KeyError, match="not in the transformer weights"):
        runtime.weight_source.restore("transformer", transformer, ["no.such.weight"])


def test_a_lora_file_is_the_same_bytes_at_every_write(tmp_path):
    """safetensors writes its metadata in a different key order from one call to the next; the LoRA writer fixes the
    order, so the same adapter is the same file (and the same hash) every time, and it still loads as written."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from h3.levers.lora import save_lora_file

    state = {"b.lora_A.weight": torch.arange(12, dtype=torch.bfloat16).reshape(3, 4), "a.lora_B.weight": torch.ones(5)}
    metadata = {"format": "pt", "h3_random_lora_seed": "4004", "alpha": "2.0"}
    files = {save_lora_file(tmp_path / f"{i}.safetensors", state, metadata).read_bytes() for i in range(12)}
    assert len(files) == 1
    loaded = load_file(str(tmp_path / "0.safetensors"))
    assert all(torch.equal(loaded[k], v) for k, v in state.items())
    with safe_open(str(tmp_path / "0.safetensors"), "pt") as f:
        assert f.metadata() == metadata


def test_random_turbo_lora_has_the_published_format_and_targets(tmp_path):
    """At full size (the meta DiT) the turbo LoRA targets are seed 001's 266 layers; written for the tiny DiT, the file
    is read by diffusers' MiniMax-H3 loader (its original-name conversion) and matches every module it names."""
    from diffusers.loaders.lora_pipeline import MiniMaxH3LoraLoaderMixin

    from h3.train.seeded_lora import TURBO_ADALN_RANK, TURBO_RANK, turbo_lora_targets, write_random_turbo_lora

    meta = random_model.build_components(random_model.released(), "meta", torch.bfloat16)["transformer"]
    targets = turbo_lora_targets(meta)
    assert len(targets) == 266
    assert targets["blocks.0.attn.qkv_proj"] == (5376, 3 * 56 * 128, TURBO_RANK)
    assert targets["blocks.49.adaln_proj.linear"][2] == TURBO_ADALN_RANK
    runtime = H3Runtime.load("tiny-random", recipe_from_dict(FAST_RECIPE), "cpu")
    path = write_random_turbo_lora(tmp_path / "turbo.safetensors", runtime.pipe.transformer)
    state = MiniMaxH3LoraLoaderMixin.lora_state_dict(str(path))
    modules = {k.removeprefix("transformer.").split(".lora_")[0] for k in state}
    names = {n for n, _ in runtime.pipe.transformer.named_modules()}
    assert modules <= names
    # Fused qkv split into q, k, v: 3 diffusers modules for one original, so more modules than targets.
    assert len(modules) == len(turbo_lora_targets(runtime.pipe.transformer)) + 2 * 3
    assert write_random_turbo_lora(tmp_path / "again.safetensors", runtime.pipe.transformer).read_bytes() == \
        path.read_bytes()


def test_full_size_memory_plan():
    """The residency choice of the H200 rehearsal, from the released sizes: baseline and the two candidates share one
    model on one H200 only with the text encoder streamed; resident, the FP8 candidate's extra weights do not fit;
    one runtime per recipe needs a GPU each."""
    recipes = [load_recipe(n) for n in ("baseline", "turbo4-fp8-sage-compile", "turbo4-sparse")]
    shared = full_size_plan(recipes, text_encoder="offload", shared=True)
    sizes = shared["components_gib"]
    assert sizes["transformer"] == pytest.approx(61.7, abs=0.05)
    assert sizes["text_encoder"] == pytest.approx(62.1, abs=0.05)
    assert shared["text_encoder_streamed_gib"] == pytest.approx(58.1, abs=0.1)
    assert shared["lever_extra_gib"]["turbo4-fp8-sage-compile"] == pytest.approx(30.8, abs=0.1)
    assert shared["fits_one_gpu_together"] and shared["per_process_gib"]["shared"] < 115
    resident = full_size_plan(recipes, text_encoder="resident", shared=True)
    assert not resident["fits_one_gpu_each"] and resident["per_process_gib"]["shared"] > H200_CAPACITY_GIB
    separate = full_size_plan(recipes, text_encoder="resident", shared=False)
    assert separate["fits_one_gpu_each"] and not separate["fits_one_gpu_together"]
    assert separate["all_processes_gib"] > 2.5 * H200_CAPACITY_GIB  # three models: three cards


def _streamed_equals_resident(tmp_path, device):
    recipe = recipe_from_dict(FAST_RECIPE)
    clips = {}
    for residency in ("resident", "offload"):
        runtime = H3Runtime.load("h3-random-small", recipe, device, text_encoder=residency)
        record = runtime.generate(GenerateRequest(prompt="a cat", seed=1), tmp_path / f"{residency}.mp4")
        assert record.extra["text_encoder"]["residency"] == residency
        clips[residency] = record.frames_sha256
        del runtime
    # Streaming moves the same weights, not different ones: the clip is the same to the bit.
    assert clips["offload"] == clips["resident"]


def test_streamed_text_encoder_gives_the_resident_clip(tmp_path):
    _streamed_equals_resident(tmp_path, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_streamed_text_encoder_gives_the_resident_clip_on_gpu(tmp_path):
    # The 2026-12-01 H200 run: Qwen3-VL's outer model looks up embed_tokens before the language model's onload hook.
    _streamed_equals_resident(tmp_path, "cuda")


def test_streaming_survives_diffusers_reapplying_group_offloading(tmp_path):
    """diffusers' LoRA loading re-applies group offloading at every component's top level
    (``_maybe_remove_and_reapply_group_offloading``); for Qwen3-VL that is one group for the whole conditioner that
    MiniMax-H3's text step (it calls ``text_encoder.model``) never onloads. The streaming layout must come back."""
    from diffusers.hooks.group_offloading import _maybe_remove_and_reapply_group_offloading

    from h3.levers.offload import _groups
    from h3.residency import _language_model, _streaming_intact

    recipe = recipe_from_dict(FAST_RECIPE)
    resident = H3Runtime.load("h3-random-small", recipe, "cpu").generate(
        GenerateRequest(prompt="a cat", seed=1), tmp_path / "resident.mp4")
    runtime = H3Runtime.load("h3-random-small", recipe, "cpu", text_encoder="offload")
    text_encoder = runtime.pipe.components["text_encoder"]
    language = _language_model(text_encoder)
    assert _streaming_intact(language)
    _maybe_remove_and_reapply_group_offloading(text_encoder)  # what pipe.load_lora_weights does to every component
    assert not _streaming_intact(language)
    assert any(g.offload_leader is text_encoder for g in _groups(text_encoder))  # diffusers' whole-model group
    record = runtime.generate(GenerateRequest(prompt="a cat", seed=1), tmp_path / "again.mp4")
    assert _streaming_intact(language)
    assert not any(g.offload_leader is text_encoder for g in _groups(text_encoder))
    # one group per decoder layer again, plus the resident top-level one
    assert len(_groups(language)) == len(language.layers) + 1
    assert record.frames_sha256 == resident.frames_sha256
