"""The trained tiny preset: MiniMax-H3's real classes at small widths, trained on the procedural world (h3.world).

``--model tiny`` loads it from :data:`TRAINED_DIR`, a checkpoint in the Hugging Face layout of
``MiniMaxAI/MiniMax-H3`` that ships with the package (weights made by ``python -m h3.train``; the training record is
:data:`TRAINED_DIR`/``training_record.json``). The random-weight preset of h3.tiny stays available as
``--model tiny-random``.

What differs from the random preset, and why:

- **Widths**: wide enough to learn the world, narrow enough that a 29-step 5 s clip at 128x128 runs in a few seconds
  on a 2-core CPU: the DiT has 4 blocks of width 128 (4 heads of 24) over the released (1, 2, 2) patch (96 latent
  values a row, fewer than its width: see TRANSFORMER_CONFIG), the video VAE's ViT decoder 3 blocks of width 256 (see VAE_DECODER_CONFIG), the audio VAE one
  stride-800 stage each way (see AUDIO_VAE_CONFIG).
- **Tokenizer**: byte-level BPE (every string still tokenizes) whose merges make each word of the world's caption
  grammar one token, so a caption is about 20 text rows instead of about 100.
- **Text encoder**: a seeded Qwen3-VL, **frozen** (never trained). MiniMax-H3 conditions on a pretrained Qwen3-VL it
  does not fine-tune; the tiny one has no pretraining to keep, so what it must provide is a fixed, deterministic
  reading of the prompt in which every token stays identifiable: its token embeddings are scaled by
  :data:`EMBED_GAIN` so that ``hidden_states[50]`` (the layer MiniMax-H3 reads) is dominated by the token itself
  plus a mix of its prefix from the 50 random layers. The DiT's token refiner learns to read it. Frozen also means
  its outputs can be computed once per caption for training, exactly as the pipeline computes them.
- **Vision patch 8** (not 4): a 128x128 keyframe or reference image becomes 64 vision tokens instead of 256.
- **Canvas configs** of the pipeline (``canvas_short_edge``, ``canvas_max_pixels``, ``reference_image_short_edge``)
  are set to the tiny canvas, so the fl2va / ref2va blocks put keyframes and references at 128 pixels, not 768/2048.
- ``transformer_ref`` (the partition the ref2va workflow denoises with) points at the same ``transformer/`` weights:
  one DiT is trained on t2va, fl2va and ref2va layouts together.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from h3.tiny import SPECIAL_TOKENS

TRAINED_DIR = Path(__file__).parent / "assets" / "tiny"
TRAINED_LORA_DIR = TRAINED_DIR / "lora"
TURBO4_LORA_FILE = TRAINED_LORA_DIR / "turbo4-tiny.safetensors"
"""The distilled 4-step LoRA (since session 18 run 23d's DMD student at step 200, bench/tiny_training/results/tiny_train_h200.md)."""
TURBO4_RUN13_LORA_FILE = TRAINED_LORA_DIR / "turbo4-tiny-run13.safetensors"
"""The distilled 4-step LoRA shipped before it (run 13, x0 regression): the LoRA the compensation LoRAs were trained
over, so the sparse recipes keep it."""
SPARSE85_LORA_FILE = TRAINED_LORA_DIR / "sparse85-tiny.safetensors"
"""The sparse-attention compensation LoRA over run 13's turbo4-tiny (85 % in 32-token blocks, every step;
h3.train.compensate)."""
INIT_SEED = 20261130
TEXT_HIDDEN = 32
EMBED_GAIN = 12.0
CANVAS = {"canvas_short_edge": 128, "canvas_max_pixels": 128 * 224, "reference_image_short_edge": 128}

TRANSFORMER_CONFIG = dict(
    num_attention_heads=4,
    attention_head_dim=24,
    hidden_size=128,
    num_layers=4,
    num_refiner_layers=1,
    ffn_dim=256,
    in_channels=24,
    audio_in_channels=32,
    # The released (1, 2, 2): a row carries 24 x 2 x 2 = 96 latent values, fewer than the width of 128, so the output
    # head (proj_out, 128 -> 96) can move every latent value. Training runs 1-4 used (1, 4, 4) for speed (148 video rows
    # for 5 s instead of 592): a row then carries 384 values through a rank-128 head, so 256 directions of every row's
    # velocity are constant and the sampler leaves the initial noise in them; decoded, that noise is the coloured
    # speckle over every generated clip of run 4 (bench/tiny_training/results/tiny_train_h200.md).
    patch_size=(1, 2, 2),
    text_dim=TEXT_HIDDEN,
    freq_dim=64,
    time_embed_hidden_dim=128,
    time_embed_dim=64,
    # 4 rotary frequencies per axis (1, 0.1, 0.01, 0.001): 0.1 resolves one audio latent against a video frame's 6.7
    # rotary units, which audio-video sync needs; 2 * 3 * 4 = 24 channels, the whole head.
    rope_freq_dim=4,
)
VAE_CONFIG = dict(
    latent_channels=24,
    block_out_channels=(8, 16, 32, 64, 64, 64),
    layers_per_block=1,
    norm_num_groups=8,
    decoder_num_layers=2,
    decoder_num_attention_heads=4,
    decoder_attention_head_dim=32,
    decoder_num_register_tokens=2,
    decoder_ffn_mult=2,
)
VAE_DECODER_CONFIG = dict(
    # The decoder that ships: 3 blocks of width 256 (8 heads of 32, SwiGLU of 256). Its output projection maps each
    # token to a 16x16x4-pixel patch, a linear map of rank <= width, so the width bounds how sharp a shape's edge and a
    # panned texture can be; the VAE_CONFIG decoder (width 128) reached 19-23 dB on held-out clips and lost colour and
    # shape in the detector's eyes (bench/tiny_training/results/tiny_train_h200.md). It is trained by h3.train's video-decoder stage
    # on the latents of the frozen encoder that the video-vae stage trained with the narrow decoder, so the latent
    # space that the DiT learns does not move. Its size is what a resumable state (weights and AdamW moments) lets
    # travel beside the DiT's within a device call's 64 MiB.
    decoder_num_layers=3,
    decoder_num_attention_heads=8,
    decoder_attention_head_dim=32,
    decoder_ffn_mult=1,
)
AUDIO_VAE_CONFIG = dict(
    # One stride-800 stage each way (the released model has five down, seven up): the encoder's last block reads one
    # 1600-sample window per latent, the decoder's transposed convolution writes one per latent (overlap-add), and a
    # residual AMP block at 32 kHz with 4 channels shapes it. The world's tones have a whole number of periods per
    # 800-sample hop, so a steady tone is the same window in every latent frame; a click lands within its hop. Seen on
    # the CPU: this trains to the right pitch in 200 steps of waveform L1/L2, where a four-stage stack from 64
    # channels had learned none (and in two device runs with an STFT loss settled on silence;
    # bench/tiny_training/results/tiny_train_h200.md).
    encoder_dim=4,
    encoder_rates=(800,),
    latent_dim=64,
    latent_channels=32,
    num_attention_heads=2,
    decoder_dim=8,
    decoder_rates=(800,),
    decoder_kernel_sizes=(1600,),
    resblock_kernel_sizes=(3,),
    resblock_dilation_sizes=((1,),),
    sampling_rate=32000,
)
TEXT_ENCODER_CONFIG = dict(
    text_config=dict(
        hidden_size=TEXT_HIDDEN,
        intermediate_size=64,
        num_hidden_layers=51,  # MiniMax-H3 reads hidden_states[50]
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 2, 2]},
    ),
    vision_config=dict(
        depth=1,
        hidden_size=16,
        intermediate_size=32,
        num_heads=2,
        patch_size=8,
        out_hidden_size=TEXT_HIDDEN,
        num_position_embeddings=16,
        deepstack_visual_indexes=[0],
    ),
)
VISION_PATCH = 8


def build_world_tokenizer():
    """Byte-level BPE whose merges make every word of the world's grammar (with and without a leading space) one
    token; any other text still tokenizes byte by byte. Deterministic: the merges are trained on a fixed corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from h3.world.scene import caption_words, sample_scenes

    scenes = sample_scenes(0, 400, "train") + sample_scenes(0, 100, "heldout")
    corpus = [s.caption() for s in scenes] + [s.caption(refer_first=True) for s in scenes[:100]]
    words = caption_words()
    corpus += [" " + " ".join(words)] * 50 + ["\n".join(words)] * 50
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=[], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    for word in words:
        for form in (word, " " + word):
            n = len(tokenizer.encode(form).ids)
            if n != 1:
                raise RuntimeError(f"world tokenizer: {form!r} is {n} tokens, not one")
    return tokenizer


def world_tokenizer(tokenizer_file: Path | None = None, build: bool = False):
    """The trained preset's Qwen2 tokenizer: from ``tokenizer_file``, else from the shipped checkpoint, else (or with
    ``build``) built by :func:`build_world_tokenizer`."""
    import tempfile

    from transformers import Qwen2TokenizerFast

    path = tokenizer_file or TRAINED_DIR / "tokenizer" / "tokenizer.json"
    if build or not Path(path).is_file():
        tmp = Path(tempfile.mkdtemp()) / "tokenizer.json"
        build_world_tokenizer().save(str(tmp))
        path = tmp
    return Qwen2TokenizerFast(tokenizer_file=str(path), unk_token=None, bos_token=None, eos_token="<|endoftext|>",
                              pad_token="<|endoftext|>")


def shipped_transformer_config(root: Path = TRAINED_DIR) -> dict:
    """The DiT shape the shipped checkpoint has: its transformer/config.json's TRANSFORMER_CONFIG keys (a training run
    may widen the DiT: ``python -m h3.train --set dit_hidden_size=...``), else TRANSFORMER_CONFIG."""
    path = Path(root) / "transformer" / "config.json"
    if not path.is_file():
        return dict(TRANSFORMER_CONFIG)
    saved = json.loads(path.read_text())
    return {k: tuple(saved[k]) if isinstance(v, tuple) else saved[k]
            for k, v in TRANSFORMER_CONFIG.items() if k in saved}


def init_components(seed: int = INIT_SEED, tokenizer=None, transformer_config: dict | None = None) -> dict:
    """The trained preset's components before training: real classes, the configs above (``transformer_config`` in
    place of TRANSFORMER_CONFIG: a training run's DiT shape), weights drawn from ``seed`` (the text encoder's are
    final: it stays frozen)."""
    from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio, MiniMaxH3Transformer3DModel
    from transformers import (
        Qwen2VLImageProcessor, Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor,
        Qwen3VLVideoProcessor,
    )

    from h3.tiny import schedulers

    tokenizer = tokenizer or world_tokenizer()
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS}
    text_config = json.loads(json.dumps(TEXT_ENCODER_CONFIG))
    text_config["text_config"]["vocab_size"] = len(tokenizer)
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        text_encoder = Qwen3VLForConditionalGeneration(Qwen3VLConfig(
            **text_config, image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
            vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])).eval()
        with torch.no_grad():
            text_encoder.model.language_model.embed_tokens.weight.mul_(EMBED_GAIN)
        text_encoder.requires_grad_(False)
        transformer = MiniMaxH3Transformer3DModel(**(transformer_config or TRANSFORMER_CONFIG))
        vae = AutoencoderKLMiniMaxH3(**VAE_CONFIG)
        audio_vae = AutoencoderKLMiniMaxH3Audio(**AUDIO_VAE_CONFIG, latents_mean=[0.0] * 32, latents_std=[1.0] * 32)
    finally:
        torch.random.set_rng_state(state)
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(patch_size=VISION_PATCH, temporal_patch_size=2, merge_size=2),
        video_processor=Qwen3VLVideoProcessor(patch_size=VISION_PATCH, temporal_patch_size=2, merge_size=2),
        tokenizer=tokenizer,
    )
    return dict(transformer=transformer, vae=vae, audio_vae=audio_vae, text_encoder=text_encoder,
                tokenizer=tokenizer, processor=processor, **schedulers())


def save_checkpoint(components: dict, directory: str | Path) -> Path:
    """Save in the HF layout with the tiny canvas configs and ``transformer_ref`` pointing at ``transformer/``."""
    from h3.checkpoint import save_components

    directory = Path(directory)
    save_components(components, directory)
    index_path = directory / "modular_model_index.json"
    index = json.loads(index_path.read_text())
    index.update(CANVAS)
    index["transformer_ref"] = ["diffusers", "MiniMaxH3Transformer3DModel", {
        "pretrained_model_name_or_path": None, "revision": None, "subfolder": "transformer",
        "type_hint": ["diffusers", "MiniMaxH3Transformer3DModel"], "variant": None}]
    index_path.write_text(json.dumps(index, indent=2) + "\n")
    return directory


def trained_identity(root: Path = TRAINED_DIR) -> str:
    """What identifies the shipped trained weights: the checkpoint's own identity (configs and weight sizes) plus
    the weight files' hashes."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file() and "lora" not in path.relative_to(root).parts:
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()
