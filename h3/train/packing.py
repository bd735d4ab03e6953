"""Training batches through the real MiniMax-H3 forward: many requests packed into one sequence.

``MiniMaxH3Transformer3DModel.forward`` describes one packed layout that every batch item shares, timesteps included,
so a plain batch would give every item the same noise level. Flow-matching training wants one level per item. So a
training batch of B requests of one layout (same task, same number of text rows) is packed the way the model packs a
request, only B times over: rows ``[b * S, (b + 1) * S)`` are request ``b``'s, each row carries its own timestep index,
rotary position and modality tag, and :class:`SegmentedAttnProcessor` runs attention over each request's ``S`` rows
alone (a reshape to (B, S) before SDPA). Everything else is the model's own forward, unchanged: the per-modality
projections, the token refiner, the AdaLN table addressed per row, the rotary embedding, the output heads. With
B = 1 the processor is exactly diffusers' ``MiniMaxH3AttnProcessor`` (tests/test_train.py checks a packed batch
against B separate stock forwards).

The layouts come from diffusers' own blocks (``MiniMaxH3PrepareLayoutStep.build_packed_sequence``,
``MiniMaxH3Ref2VAPrepareLayoutStep.build_ref2va_packed_sequence``, ``MiniMaxH3SetTimestepsStep.build_row_timesteps``),
so training sees the rows, positions, tags and timesteps the pipeline gives the model at inference.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers.transformer_minimax_h3 import MiniMaxH3Attention, _apply_rotary_emb

from h3.tiny_trained import TRANSFORMER_CONFIG

NUM_LATENT_FRAMES = 37  # 124 frames
LATENT_SIZE = 8  # 128 px / 16
NUM_AUDIO_LATENTS = 207
AUDIO_CHANNELS = 2
PATCH = tuple(TRANSFORMER_CONFIG["patch_size"])
VIDEO_ROW = TRANSFORMER_CONFIG["in_channels"] * PATCH[0] * PATCH[1] * PATCH[2]
"""Latent values in one packed video row (96 at the (1, 2, 2) patch)."""
KEYFRAME_NOISE_AUG = 0.999
VIDEO_SHIFT, AUDIO_SHIFT = 12.0, 3.0


class SegmentedAttnProcessor:
    """diffusers' MiniMaxH3AttnProcessor over ``segments`` independent documents of equal length, packed back to back
    along the sequence (the model's batch axis stays 1).

    ``sparse`` = (block_size, sparsity): each document attends block-sparsely as the ``sparse_attention`` lever routes
    it at inference (:func:`h3.levers.sparse_attention.route_blocks` on the document's own rows, the kept blocks exact),
    computed as SDPA under the kept blocks' token mask, so that gradients flow (the compensation LoRA's training).
    ``dense_rows`` = (document rows, row indices): each document's query rows that attend densely to every key instead
    (the token streams the lever's ``streams`` leaves dense), and any attention over another sequence than the
    documents' joint one (the token refiner's, which the lever leaves alone) dense; None: every query row of every
    attention goes sparse."""

    _attention_backend = None
    _parallel_config = None

    def __init__(self, segments: int = 1, sparse: tuple[int, float] | None = None,
                 dense_rows: tuple[int, torch.Tensor] | None = None):
        self.segments, self.sparse, self.dense_rows = segments, sparse, dense_rows

    def __call__(self, attn, hidden_states, rotary_emb=None, attention_mask=None):
        query = attn.to_q(hidden_states).unflatten(-1, (attn.heads, -1))
        key = attn.to_k(hidden_states).unflatten(-1, (attn.heads, -1))
        value = attn.to_v(hidden_states).unflatten(-1, (attn.heads, -1))
        query, key = attn.norm_q(query), attn.norm_k(key)
        if rotary_emb is not None:
            query = _apply_rotary_emb(query, *rotary_emb)
            key = _apply_rotary_emb(key, *rotary_emb)
        batch, rows = query.shape[:2]
        if rows % self.segments:
            raise ValueError(f"{rows} rows do not split into {self.segments} equal documents")
        split = lambda x: x.reshape(batch * self.segments, rows // self.segments, *x.shape[2:])  # noqa: E731
        sparse, dense_rows = self.sparse, None
        if sparse is not None and self.dense_rows is not None:
            document, dense_rows = self.dense_rows
            sparse = sparse if rows // self.segments == document else None
        if sparse is not None:
            out = masked_block_sparse(split(query), split(key), split(value), *sparse, dense_rows=dense_rows)
            out = out.reshape(batch, rows, *out.shape[2:]).flatten(2, 3).type_as(query)
            return attn.to_out[1](attn.to_out[0](out))
        out = dispatch_attention_fn(split(query), split(key), split(value), attn_mask=attention_mask, dropout_p=0.0,
                                    is_causal=False, backend=self._attention_backend,
                                    parallel_config=self._parallel_config)
        out = out.reshape(batch, rows, *out.shape[2:]).flatten(2, 3).type_as(query)
        return attn.to_out[1](attn.to_out[0](out))


def masked_block_sparse(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, block_size: int,
                        sparsity: float, dense_rows: torch.Tensor | None = None) -> torch.Tensor:
    """(B, S, H, D) block-sparse attention, differentiable: the lever's routing, its kept blocks as a token mask; the
    query rows ``dense_rows`` attend to every key (the lever's dense streams: routed over all rows, then replaced)."""
    from h3.levers.sparse_attention import kept_block_mask, route_blocks

    seq = query.shape[1]
    kept = kept_block_mask(*route_blocks(query.detach(), key.detach(), block_size, sparsity))
    mask = kept.repeat_interleave(block_size, dim=2).repeat_interleave(block_size, dim=3)[:, :, :seq, :seq]
    if dense_rows is not None and dense_rows.numel():
        mask = mask.clone()
        mask[:, :, dense_rows.to(mask.device).long(), :] = True
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2)


@contextmanager
def segmented_attention(transformer, segments: int, sparse: tuple[int, float] | None = None,
                        dense_rows: tuple[int, torch.Tensor] | None = None):
    """Swap every attention processor of ``transformer`` for a :class:`SegmentedAttnProcessor` while inside."""
    modules = [m for m in transformer.modules() if isinstance(m, MiniMaxH3Attention)]
    old = [m.processor for m in modules]
    proc = SegmentedAttnProcessor(segments, sparse, dense_rows)
    for m in modules:
        m.processor = proc
    try:
        yield proc
    finally:
        for m, p in zip(modules, old):
            m.processor = p


def shifted_sigma(u: torch.Tensor, shift: float) -> torch.Tensor:
    """MiniMaxH3Scheduler's exponential shift of a base sigma ``u`` in [0, 1]."""
    return shift * u / (1 + (shift - 1) * u)


def patchify(latents: torch.Tensor, patch: tuple[int, int, int] = PATCH) -> torch.Tensor:
    """(B, C, F, H, W) -> (B, rows, C * prod(patch)): diffusers' patchify_video_latents per item."""
    pt, ph, pw = patch
    b, c, f, h, w = latents.shape
    x = latents.reshape(b, c, f // pt, pt, h // ph, ph, w // pw, pw).permute(0, 2, 4, 6, 1, 3, 5, 7)
    return x.reshape(b, (f // pt) * (h // ph) * (w // pw), c * pt * ph * pw)


def unpatchify(rows: torch.Tensor, frames: int, height: int, width: int,
               patch: tuple[int, int, int] = PATCH) -> torch.Tensor:
    """Inverse of :func:`patchify` (the pipeline's after-denoise reshape)."""
    pt, ph, pw = patch
    b, _, d = rows.shape
    c = d // (pt * ph * pw)
    x = rows.reshape(b, frames // pt, height // ph, width // pw, c, pt, ph, pw).permute(0, 4, 1, 5, 2, 6, 3, 7)
    return x.reshape(b, c, frames, height, width)


def audio_rows(latents: torch.Tensor) -> torch.Tensor:
    """(B, 2, 32, L) per-channel audio latents -> (B, 2 L, 32) channel-major rows."""
    b, ch, c, n = latents.shape
    return latents.permute(0, 1, 3, 2).reshape(b, ch * n, c)


@dataclass
class Layout:
    """One request's packed layout (shared by every request of a training batch)."""

    position_ids: torch.Tensor
    token_tags: torch.Tensor
    video_indices: torch.Tensor
    audio_indices: torch.Tensor
    text_indices: torch.Tensor
    num_condition_video_rows: int
    num_condition_audio_rows: int

    @property
    def rows(self) -> int:
        return int(self.position_ids.shape[0])


def t2va_layout(text_token_tags: torch.Tensor, keyframe_anchors: tuple[str, ...] = ()) -> Layout:
    """The t2va / fl2va layout, from diffusers' layout step."""
    from diffusers.modular_pipelines.minimax_h3.before_denoise import MiniMaxH3PrepareLayoutStep

    out = MiniMaxH3PrepareLayoutStep.build_packed_sequence(
        text_token_tags, NUM_LATENT_FRAMES, LATENT_SIZE, LATENT_SIZE, NUM_AUDIO_LATENTS, PATCH, AUDIO_CHANNELS,
        audio_tag=2, video_tag=0, keyframe_anchors=keyframe_anchors)
    return Layout(out[0].float(), *out[1:])


def ref2va_layout(text_token_tags: torch.Tensor) -> Layout:
    """The ref2va layout of one image reference at the tiny canvas, from diffusers' ref2va layout step."""
    from diffusers.modular_pipelines.minimax_h3.before_denoise import MiniMaxH3Ref2VAPrepareLayoutStep
    from diffusers.modular_pipelines.minimax_h3.references import MiniMaxH3ImageReference

    ref = MiniMaxH3ImageReference(image=torch.zeros(3, 8, 8))
    out = MiniMaxH3Ref2VAPrepareLayoutStep.build_ref2va_packed_sequence(
        text_token_tags, [ref], [torch.zeros(1, 24, 1, LATENT_SIZE, LATENT_SIZE)], [], NUM_LATENT_FRAMES,
        LATENT_SIZE, LATENT_SIZE, NUM_AUDIO_LATENTS, PATCH, AUDIO_CHANNELS, audio_tag=2, video_tag=0)
    return Layout(out[0].float(), *out[1:])


def row_timesteps(layout: Layout, t_video: torch.Tensor, t_audio: torch.Tensor) -> torch.Tensor:
    """(B, S) timestep of every row of every request (diffusers' build_row_timesteps, per request, vectorized):
    text and generated video rows at ``t_video``, generated audio rows at ``t_audio``, video conditioning rows at
    ``max(t_video, 0.999)``, audio reference rows at 1."""
    batch = t_video.shape[0]
    rows = torch.empty(batch, layout.rows, device=t_video.device, dtype=torch.float32)
    rows[:] = t_video[:, None]
    vi, ai = layout.video_indices.to(t_video.device), layout.audio_indices.to(t_video.device)
    nc, na = layout.num_condition_video_rows, layout.num_condition_audio_rows
    if nc:
        rows[:, vi[:nc]] = torch.clamp(t_video, min=KEYFRAME_NOISE_AUG)[:, None]
    rows[:, ai[na:]] = t_audio[:, None]
    if na:
        rows[:, ai[:na]] = 1.0
    return rows


def packed_forward(transformer, layout: Layout, video_rows: torch.Tensor, audio_rows_: torch.Tensor,
                   text: torch.Tensor, t_video: torch.Tensor, t_audio: torch.Tensor,
                   sparse: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run B requests of one layout through the real forward in one packed sequence (``sparse``: block-sparse
    attention per request, :class:`SegmentedAttnProcessor`: ``(block_size, sparsity)`` sparsifies every token stream's
    queries, ``(block_size, sparsity, streams)`` only those of ``streams``, as the ``sparse_attention`` lever's
    ``streams`` routes them; the other streams' query rows attend densely).

    video_rows: (B, Nv, Dv) in the order of ``layout.video_indices`` (conditioning rows first); audio_rows_: (B, Na, 32);
    text: (B, T, text_dim); t_video, t_audio: (B,). Returns the velocity of every video and audio row, (B, Nv, Dv) and
    (B, Na, 32).
    """
    device = video_rows.device
    batch, rows = video_rows.shape[0], layout.rows
    offsets = (torch.arange(batch, device=device) * rows)[:, None]
    per_row = row_timesteps(layout, t_video, t_audio).reshape(-1)
    timestep, timestep_indices = torch.unique(per_row, sorted=True, return_inverse=True)
    kwargs = dict(
        hidden_states=video_rows.reshape(1, -1, video_rows.shape[-1]),
        audio_hidden_states=audio_rows_.reshape(1, -1, audio_rows_.shape[-1]),
        encoder_hidden_states=text.reshape(1, -1, text.shape[-1]),
        timestep=timestep,
        timestep_indices=timestep_indices,
        token_tags=layout.token_tags.to(device).repeat(batch),
        position_ids=layout.position_ids.to(device).repeat(batch, 1),
        video_indices=(layout.video_indices.to(device)[None] + offsets).reshape(-1),
        audio_indices=(layout.audio_indices.to(device)[None] + offsets).reshape(-1),
        text_indices=(layout.text_indices.to(device)[None] + offsets).reshape(-1),
        return_dict=False,
    )
    dense_rows = None
    if sparse is not None and len(sparse) == 3:
        sparse, streams = tuple(sparse[:2]), sparse[2]
        dense = [getattr(layout, f"{name}_indices").reshape(-1) for name in ("video", "audio", "text")
                 if name not in streams]
        dense_rows = (rows, torch.cat(dense).sort().values.to(device) if dense else torch.zeros(0, dtype=torch.long))
    with segmented_attention(transformer, batch, sparse, dense_rows):
        video, audio = transformer(**kwargs)
    return video.reshape(batch, -1, video.shape[-1]), audio.reshape(batch, -1, audio.shape[-1])
