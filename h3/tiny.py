"""The tiny preset: diffusers' and transformers' real MiniMax-H3 classes with small configs and seeded weights.

Every class is the one the released checkpoint loads (MiniMaxH3Transformer3DModel, AutoencoderKLMiniMaxH3,
AutoencoderKLMiniMaxH3Audio, MiniMaxH3Scheduler ×2, Qwen3VLForConditionalGeneration, Qwen2TokenizerFast,
Qwen3VLProcessor), so the whole pipeline code runs, on a 2-core CPU in about a second per clip. What stays at the
released values are the contracts the pipeline keys off: 24 fps, 32 kHz stereo audio at 40 latents/s (audio hop
800), the video VAE's 16× spatial / 4× temporal compression and 17-frame chunks, a (1, 2, 2) patch, and a text
encoder deep enough to expose ``hidden_states[50]``.

The tokenizer is a byte-level BPE with no merges (one token per UTF-8 byte) plus Qwen's special tokens, built with
the ``tokenizers`` library; its file ships in ``h3/assets/tiny_tokenizer.json`` so nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

TINY_SEED = 20261129
WEIGHTS = "random"
"""What the tiny preset's clip records say under ``weights``: its weights are drawn from ``TINY_SEED``."""
NOTICE = "random weights (tiny-random): noise-like clips from the real pipeline code; their quality means nothing"
"""What every record, report and dashboard page of a ``tiny-random`` run says (h3.random_model.weights_notice), so
that its clips are never taken for the trained preset's (``tiny``)."""
TINY_ASSETS = Path(__file__).parent / "assets"
TINY_TOKENIZER_FILE = TINY_ASSETS / "tiny_tokenizer.json"
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

TEXT_HIDDEN = 32

TRANSFORMER_CONFIG = dict(
    num_attention_heads=2,
    attention_head_dim=16,
    hidden_size=32,
    num_layers=2,
    num_refiner_layers=1,
    ffn_dim=64,
    in_channels=24,
    audio_in_channels=32,
    patch_size=(1, 2, 2),
    text_dim=TEXT_HIDDEN,
    freq_dim=32,
    time_embed_hidden_dim=32,
    time_embed_dim=16,
    rope_freq_dim=2,
)
VAE_CONFIG = dict(
    latent_channels=24,
    block_out_channels=(8, 8, 8, 8, 8, 8),
    layers_per_block=1,
    norm_num_groups=4,
    decoder_num_layers=1,
    decoder_num_attention_heads=2,
    decoder_attention_head_dim=8,
    decoder_num_register_tokens=1,
    decoder_ffn_mult=1,
)
AUDIO_VAE_CONFIG = dict(
    encoder_dim=4,
    latent_dim=64,
    latent_channels=32,
    num_attention_heads=2,
    # The decoder halves its width at each of its 7 upsamples, so 128 is the narrowest that stays >= 1 channel.
    decoder_dim=128,
    resblock_kernel_sizes=(3,),
    resblock_dilation_sizes=((1,),),
    sampling_rate=32000,
    latents_mean=[0.0] * 32,
    latents_std=[1.0] * 32,
)
TEXT_ENCODER_CONFIG = dict(
    text_config=dict(
        hidden_size=TEXT_HIDDEN,
        intermediate_size=64,
        # MiniMax-H3 reads hidden_states[50]: the stack must have more than 50 layers (cheap at this width).
        num_hidden_layers=51,
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
        patch_size=4,
        out_hidden_size=TEXT_HIDDEN,
        num_position_embeddings=16,
        deepstack_visual_indexes=[0],
    ),
)


def build_tokenizer_file(path: Path = TINY_TOKENIZER_FILE) -> None:
    """(Re)build the shipped tokenizer file. Run once; the file is committed."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))


def tiny_tokenizer():
    from transformers import Qwen2TokenizerFast

    if not TINY_TOKENIZER_FILE.exists():
        raise FileNotFoundError(
            f"the tiny preset's tokenizer file is missing: {TINY_TOKENIZER_FILE} (it ships with the package; "
            "rebuild it with `python -c 'import h3.tiny as t; t.build_tokenizer_file()'`)"
        )
    return Qwen2TokenizerFast(
        tokenizer_file=str(TINY_TOKENIZER_FILE),
        unk_token=None,
        bos_token=None,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )


def tiny_components() -> dict:
    """The tiny preset's components, float32, weights drawn from ``TINY_SEED``."""
    from diffusers import (
        AutoencoderKLMiniMaxH3,
        AutoencoderKLMiniMaxH3Audio,
        MiniMaxH3Transformer3DModel,
    )
    from transformers import Qwen2VLImageProcessor, Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor
    from transformers import Qwen3VLVideoProcessor

    tokenizer = tiny_tokenizer()
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS}
    text_config = json.loads(json.dumps(TEXT_ENCODER_CONFIG))
    text_config["text_config"]["vocab_size"] = len(tokenizer)

    devnull_state = torch.random.get_rng_state()
    torch.manual_seed(TINY_SEED)
    try:
        text_encoder = Qwen3VLForConditionalGeneration(
            Qwen3VLConfig(
                **text_config,
                image_token_id=ids["<|image_pad|>"],
                video_token_id=ids["<|video_pad|>"],
                vision_start_token_id=ids["<|vision_start|>"],
                vision_end_token_id=ids["<|vision_end|>"],
            )
        ).eval()
        transformer = MiniMaxH3Transformer3DModel(**TRANSFORMER_CONFIG).eval()
        vae = AutoencoderKLMiniMaxH3(**VAE_CONFIG).eval()
        audio_vae = AutoencoderKLMiniMaxH3Audio(**AUDIO_VAE_CONFIG).eval()
    finally:
        torch.random.set_rng_state(devnull_state)

    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(patch_size=4, temporal_patch_size=2, merge_size=2),
        video_processor=Qwen3VLVideoProcessor(patch_size=4, temporal_patch_size=2, merge_size=2),
        tokenizer=tokenizer,
    )
    return dict(
        transformer=transformer,
        vae=vae,
        audio_vae=audio_vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        processor=processor,
        **schedulers(),
    )


def schedulers() -> dict:
    """The video and audio flow-matching schedulers (MiniMax-H3's shifts: 12 for video, 3 for audio)."""
    from diffusers import MiniMaxH3Scheduler

    return dict(scheduler=MiniMaxH3Scheduler(shift=12.0), audio_scheduler=MiniMaxH3Scheduler(shift=3.0))


def tiny_identity() -> str:
    """What identifies the tiny preset's weights: its configs and seed (the weights are a function of them)."""
    blob = json.dumps(
        [TINY_SEED, TRANSFORMER_CONFIG, VAE_CONFIG, AUDIO_VAE_CONFIG, TEXT_ENCODER_CONFIG,
         TINY_TOKENIZER_FILE.read_bytes().decode() if TINY_TOKENIZER_FILE.exists() else None],
        sort_keys=True, default=list,
    )
    return hashlib.sha256(blob.encode()).hexdigest()
