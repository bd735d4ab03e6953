"""The seeded random presets: MiniMax-H3 at its released size with random weights, made on the device.

``--model h3-random`` is the real pipeline (diffusers' MiniMax-H3 modular pipeline, the real classes) with every
component at its released configuration: the 33.1 B DiT (diffusers' defaults for ``MiniMaxH3Transformer3DModel``),
the video and audio VAEs (diffusers' defaults), and the 33.3 B Qwen3-VL conditioner (the Qwen3-VL-32B geometry:
5120 wide, 64 layers, 64 heads over 8 KV heads, the conditioner the DiT's ``text_dim`` of 5120 reads). Its weights
are drawn on the device from a seed (:class:`h3.weights.SeededWeights`), so nothing of 130 GB lies on disk and the
model is ready in seconds on an H200. It is the way to rehearse a release without the weights: **random weights:
speed and memory are real, quality is not** (every record says ``weights: "random"``; reports, verdicts and dashboard
pages say it in those words).

What is not at released size: the tokenizer is the tiny preset's byte-level one (one token per UTF-8 byte plus Qwen's
special tokens, ``h3/assets/tiny_tokenizer.json``), not Qwen's 151k BPE; a prompt is about four times as many text
tokens as Qwen's tokenizer would make of it (its rows are a small part of the DiT's sequence: 100-400 of 19-38
thousand at 5 s). The embedding table keeps Qwen's 151,936 rows, so the memory is the released model's.

``--model h3-random-small`` runs the same code with the tiny preset's small configs (float32 on a CPU in seconds):
how the builder is tested on the CPU and how the device scripts are rehearsed here. Its records say
``weights: "random"`` too, and its notice says that nothing about it is real.

Building: each component is constructed with its parameters on the meta device and its buffers computed on the
target device (accelerate's ``init_on_device(meta, include_buffers=False)``, as ``from_pretrained`` constructs a
model before loading), then every state-dict entry is materialized in the dtype ``from_pretrained`` would give it
(the model's ``_keep_in_fp32_modules`` stay float32) and every parameter is drawn from its own seed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from h3.weights import SeededWeights, draw_parameter

RANDOM_SEED = 20261201
NOTICE = "random weights: speed and memory are real, quality is not"
"""What every record, report, verdict and dashboard page of an ``h3-random`` run says."""
SMALL_NOTICE = ("random weights, scaled-down model (a CPU rehearsal of the chain): neither speed, memory nor quality "
                "is real")

# Qwen3-VL-32B, the conditioner MiniMax-H3 reads hidden_states[50] of (its DiT's text_dim is 5120).
QWEN3_VL_32B = dict(
    text_config=dict(
        hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=262144,
        rope_parameters={"rope_type": "default", "rope_theta": 5_000_000.0, "mrope_section": [24, 20, 20]},
    ),
    vision_config=dict(
        depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, patch_size=16, out_hidden_size=5120,
        num_position_embeddings=2304, deepstack_visual_indexes=[8, 16, 24],
    ),
)


@dataclass(frozen=True)
class PresetConfigs:
    """The configs of one random preset (only the configs differ between the released and the small one)."""

    name: str
    transformer: dict[str, Any]
    vae: dict[str, Any]
    audio_vae: dict[str, Any]
    text_encoder: dict[str, Any]
    """Qwen3VLConfig keyword arguments (``text_config``, ``vision_config``); the vocabulary and the special-token
    ids come from the tokenizer."""
    processor: dict[str, Any]
    """The Qwen3-VL image/video processors' patch geometry."""
    default_size: tuple[int, int]
    notice: str
    keep_vocab: bool = True
    """Keep ``text_config.vocab_size`` (the released embedding table); False sizes it to the tokenizer."""
    seed: int = RANDOM_SEED
    extra: dict[str, Any] = field(default_factory=dict)


def released() -> PresetConfigs:
    from h3.request import FULL_DEFAULT_SIZE

    return PresetConfigs(
        name="h3-random",
        transformer={},  # diffusers' defaults are the released DiT
        vae={},
        audio_vae=dict(latents_mean=[0.0] * 32, latents_std=[1.0] * 32),
        text_encoder=QWEN3_VL_32B,
        processor=dict(patch_size=16, temporal_patch_size=2, merge_size=2),
        default_size=FULL_DEFAULT_SIZE,
        notice=NOTICE,
    )


def small() -> PresetConfigs:
    from h3 import tiny
    from h3.request import TINY_DEFAULT_SIZE

    return PresetConfigs(
        name="h3-random-small",
        transformer=dict(tiny.TRANSFORMER_CONFIG),
        vae=dict(tiny.VAE_CONFIG),
        audio_vae=dict(tiny.AUDIO_VAE_CONFIG),
        text_encoder=json.loads(json.dumps(tiny.TEXT_ENCODER_CONFIG)),
        processor=dict(patch_size=4, temporal_patch_size=2, merge_size=2),
        default_size=TINY_DEFAULT_SIZE,
        notice=SMALL_NOTICE,
        keep_vocab=False,
    )


PRESETS = {"h3-random": released, "h3-random-small": small}


def is_random_preset(model: str) -> bool:
    return model in PRESETS


def preset(model: str) -> PresetConfigs:
    if model not in PRESETS:
        raise KeyError(f"{model!r} is not a random preset; one of {', '.join(PRESETS)}")
    return PRESETS[model]()


def weights_notice(model: str | None) -> str | None:
    """The sentence a page or report of a run of ``model`` must show, or None for trained weights: the random presets'
    and the random tiny preset's (``tiny-random``; ``tiny`` is the trained one)."""
    if model == "tiny-random":
        from h3.tiny import NOTICE as TINY_NOTICE

        return TINY_NOTICE
    return preset(model).notice if model in PRESETS else None


def identity(configs: PresetConfigs, dtype: torch.dtype, device_type: str) -> str:
    """What identifies a preset's weights: its configs, seed, dtype and the device type they were drawn on (the CPU's
    and CUDA's generators draw different numbers from one seed), and the torch build that drew them."""
    blob = json.dumps([asdict(configs), str(dtype), device_type, torch.__version__], sort_keys=True, default=list)
    return hashlib.sha256(blob.encode()).hexdigest()


@contextlib.contextmanager
def _constructing_on(device: torch.device):
    """Parameters on the meta device, buffers computed on ``device`` (how ``from_pretrained`` constructs)."""
    from accelerate import init_on_device

    with torch.device(device if device.type != "meta" else "cpu"), \
            init_on_device(torch.device("meta"), include_buffers=device.type == "meta"):
        yield


def _keeps_float32(model: torch.nn.Module, name: str) -> bool:
    """diffusers' loading rule: a state-dict entry stays float32 when a ``_keep_in_fp32_modules`` entry is one of
    the dot-separated parts of its name (``model_loading_utils.load_model_dict_into_meta``)."""
    keep = getattr(model, "_keep_in_fp32_modules", None) or []
    return any(k in name.split(".") for k in keep)


@torch.no_grad()
def materialize(model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """Give every meta parameter its storage on ``device`` in the dtype ``from_pretrained`` would load it in, and
    persistent floating buffers that dtype too (uninitialized: the caller draws the parameters)."""
    persistent = set(model.state_dict().keys())
    for name, param in list(model.named_parameters()):
        target = torch.float32 if (_keeps_float32(model, name) or not param.is_floating_point()) else dtype
        module_name, _, attr = name.rpartition(".")
        module = model.get_submodule(module_name) if module_name else model
        module._parameters[attr] = torch.nn.Parameter(torch.empty(param.shape, dtype=target, device=device),
                                                      requires_grad=param.requires_grad)
    for name, buffer in list(model.named_buffers()):
        if name in persistent and buffer.is_floating_point():
            target = torch.float32 if _keeps_float32(model, name) else dtype
            module_name, _, attr = name.rpartition(".")
            module = model.get_submodule(module_name) if module_name else model
            module._buffers[attr] = buffer.to(device=device, dtype=target)
    return model.eval()


@torch.no_grad()
def materialize_on_host(model: torch.nn.Module, device: torch.device, dtype: torch.dtype, weights: SeededWeights,
                        component: str) -> torch.nn.Module:
    """:func:`materialize` and :meth:`SeededWeights.fill` with every parameter and persistent buffer kept in host
    memory (pinned when ``device`` is a GPU, so that streaming it needs no second copy), each parameter drawn on
    ``device`` one at a time and copied down: the same values as a build on ``device``, and never more than one
    tensor of the component on it (the 62 GiB text encoder never passes through an 80 GB card whole)."""
    persistent = set(model.state_dict().keys())
    pin = device.type == "cuda"
    for name, param in list(model.named_parameters()):
        target = torch.float32 if (_keeps_float32(model, name) or not param.is_floating_point()) else dtype
        drawn = torch.empty(param.shape, dtype=target, device=device)
        draw_parameter(drawn, weights.seed, component, name)
        host = torch.empty(param.shape, dtype=target, device="cpu", pin_memory=pin)
        host.copy_(drawn)
        del drawn
        module_name, _, attr = name.rpartition(".")
        module = model.get_submodule(module_name) if module_name else model
        module._parameters[attr] = torch.nn.Parameter(host, requires_grad=param.requires_grad)
    for name, buffer in list(model.named_buffers()):
        if name in persistent and buffer.is_floating_point():
            target = torch.float32 if _keeps_float32(model, name) else dtype
            module_name, _, attr = name.rpartition(".")
            module = model.get_submodule(module_name) if module_name else model
            module._buffers[attr] = buffer.to(device="cpu", dtype=target)
    return model.eval()


def build_components(configs: PresetConfigs, device: str | torch.device, dtype: torch.dtype,
                     on_host: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every component of the t2va pipeline for ``configs``, weights drawn on ``device`` (``meta``: shapes only);
    the components named in ``on_host`` keep their weights in host memory (:func:`materialize_on_host`)."""
    from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio, MiniMaxH3Transformer3DModel
    from transformers import (Qwen2VLImageProcessor, Qwen3VLConfig, Qwen3VLForConditionalGeneration,
                              Qwen3VLProcessor, Qwen3VLVideoProcessor)

    from h3 import tiny

    device = torch.device(device)
    tokenizer = tiny.tiny_tokenizer()
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in tiny.SPECIAL_TOKENS}
    text = json.loads(json.dumps(configs.text_encoder))
    if not configs.keep_vocab:
        text["text_config"]["vocab_size"] = len(tokenizer)
    text_config = Qwen3VLConfig(**text, image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                                vision_start_token_id=ids["<|vision_start|>"],
                                vision_end_token_id=ids["<|vision_end|>"])
    makers = {
        "text_encoder": lambda: Qwen3VLForConditionalGeneration(text_config),
        "transformer": lambda: MiniMaxH3Transformer3DModel(**configs.transformer),
        "vae": lambda: AutoencoderKLMiniMaxH3(**configs.vae),
        "audio_vae": lambda: AutoencoderKLMiniMaxH3Audio(**configs.audio_vae),
    }
    weights = SeededWeights(configs.seed)
    components: dict[str, Any] = {}
    for name, make in makers.items():
        with _constructing_on(device):
            model = make()
        if name in on_host and device.type != "meta":
            materialize_on_host(model, device, dtype, weights, name)
        else:
            materialize(model, device, dtype)
            weights.fill(name, model)
        components[name] = model
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(**configs.processor),
        video_processor=Qwen3VLVideoProcessor(**configs.processor),
        tokenizer=tokenizer,
    )
    return dict(components, tokenizer=tokenizer, processor=processor, **tiny.schedulers())


def random_pipeline(configs: PresetConfigs, device: str | torch.device, dtype: torch.dtype,
                    on_host: tuple[str, ...] = ()):
    """The real modular pipeline (``MiniMaxH3Blocks``) over :func:`build_components`, and the weight source that
    draws any of its parameters again."""
    from diffusers.modular_pipelines import MiniMaxH3Blocks

    pipe = MiniMaxH3Blocks().init_pipeline()
    pipe.update_components(**build_components(configs, device, dtype, on_host))
    return pipe, SeededWeights(configs.seed)
