"""Block-sparse attention: content-based top-k key blocks per query block, on PyTorch's flex_attention block masks.

Routing (per batch item and head): mean-pool the queries and keys of each ``block_size``-token block (padding rows of a
bucketed sequence excluded), score every (query block, key block) pair by the pooled dot product, and keep the
``ceil((1 - sparsity) * n)`` best key blocks of each query block. The kept blocks become a flex_attention
``BlockMask`` (``BlockMask.from_kv_blocks``, O(blocks) to build); attention inside a kept block is exact. The first
``dense_steps`` denoising steps and the ``dense_layers`` run dense through the recipe's backend (seed 001: turbo +
sparse ran "only the first denoising step ... with full attention"). At sparsity 0 every block is kept, so the sparse
path computes dense attention.

On CUDA flex_attention is compiled (a fused kernel that skips the dropped blocks); on the CPU it runs eagerly, which
computes the same values through the reference implementation.
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from h3.levers.base import LeverError, LeverHandle, mark_applied, unmark_applied
from h3.levers.bucketing import PaddingState, output_projection, project_qkv

logger = logging.getLogger(__name__)

_COMPILED_FLEX = None


@dataclass
class SparseAttentionConfig:
    block_size: int = 128
    sparsity: float = 0.5
    dense_steps: int = 1
    dense_layers: list[int] = field(default_factory=list)


def route_blocks(query: torch.Tensor, key: torch.Tensor, block_size: int, sparsity: float,
                 valid_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k key blocks per query block. query/key (B, S, H, D). Returns (kv_num_blocks (B, H, nQ) int32,
    kv_indices (B, H, nQ, nK) int32, the kept blocks first in ascending order)."""
    batch, seq, heads, dim = query.shape
    valid = seq if valid_len is None else valid_len
    n_blocks = -(-seq // block_size)
    n_valid = -(-valid // block_size)
    pad = n_blocks * block_size - seq
    weights = (torch.arange(n_blocks * block_size, device=query.device) < valid).to(torch.float32)
    weights = weights.view(1, n_blocks, block_size, 1, 1)

    def pool(x):
        x = torch.nn.functional.pad(x.float(), (0, 0, 0, 0, 0, pad)).view(batch, n_blocks, block_size, heads, dim)
        counts = weights.sum(dim=2).clamp(min=1.0)
        return (x * weights).sum(dim=2) / counts  # (B, n_blocks, H, D)

    q_pool, k_pool = pool(query), pool(key)
    scores = torch.einsum("bqhd,bkhd->bhqk", q_pool, k_pool)
    scores[..., n_valid:] = float("-inf")  # key blocks made only of padding are never kept
    # round() first: (1 - 0.7) * 10 is 3.0000000000000004 in floating point, which must keep 3 blocks, not 4.
    keep = max(1, math.ceil(round((1.0 - sparsity) * n_valid, 9)))
    top = scores.topk(keep, dim=-1).indices.sort(dim=-1).values
    rest = torch.arange(n_blocks, device=query.device).expand(batch, heads, n_blocks, n_blocks)
    chosen = torch.zeros(batch, heads, n_blocks, n_blocks, dtype=torch.bool, device=query.device)
    chosen.scatter_(-1, top, True)
    # Kept indices first (ascending), then the dropped ones: flex reads only the first kv_num_blocks entries.
    order = torch.argsort((~chosen).to(torch.int8) * n_blocks + rest, dim=-1)
    kv_indices = rest.gather(-1, order).to(torch.int32)
    kv_num_blocks = torch.full((batch, heads, n_blocks), keep, dtype=torch.int32, device=query.device)
    return kv_num_blocks, kv_indices


def kept_block_mask(kv_num_blocks: torch.Tensor, kv_indices: torch.Tensor) -> torch.Tensor:
    """(B, H, nQ, nK) bool of the kept blocks, for references and telemetry."""
    n = kv_indices.shape[-1]
    ranks = torch.arange(n, device=kv_indices.device).view(1, 1, 1, n)
    taken = ranks < kv_num_blocks.unsqueeze(-1)
    mask = torch.zeros(kv_indices.shape, dtype=torch.bool, device=kv_indices.device)
    return mask.scatter(-1, kv_indices.long(), taken)


def _as_kv_blocks(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, H, nQ, nK) bool -> (kv_num_blocks, kv_indices) with the set blocks first in ascending order."""
    n = mask.shape[-1]
    order = torch.arange(n, device=mask.device).expand_as(mask)
    indices = torch.argsort((~mask).to(torch.int32) * n + order, dim=-1).to(torch.int32)
    return mask.sum(-1, dtype=torch.int32), indices


def block_sparse_attention(query, key, value, kv_num_blocks, kv_indices, block_size, valid_len=None):
    """Attention over the kept key blocks. query/key/value (B, S, H, D) -> (B, S, H, D)."""
    global _COMPILED_FLEX
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    seq = query.shape[1]
    # The mask_mod states the kept blocks token by token as well: the compiled kernel skips the dropped blocks from
    # the block structure alone, but eager flex_attention (the CPU path) computes every score and applies only the
    # mask_mod, so both must say the same thing.
    kept = kept_block_mask(kv_num_blocks, kv_indices)
    limit = seq if valid_len is None else valid_len

    def mask_mod(b, h, q_idx, kv_idx):
        return kept[b, h, q_idx // block_size, kv_idx // block_size] & (kv_idx < limit)

    # Kept blocks holding no padding key are "full" (the compiled kernel skips the mask_mod there); the one kept block
    # that straddles the end of the real rows is "partial" (mask_mod applied).
    full, partial = kept, torch.zeros_like(kept)
    if valid_len is not None and valid_len < seq and valid_len % block_size:
        edge = valid_len // block_size
        full, partial = kept.clone(), torch.zeros_like(kept)
        partial[..., edge] = kept[..., edge]
        full[..., edge] = False
    partial_num, partial_idx = _as_kv_blocks(partial)
    full_num, full_idx = _as_kv_blocks(full)
    block_mask = BlockMask.from_kv_blocks(partial_num, partial_idx, full_num, full_idx, BLOCK_SIZE=block_size,
                                          mask_mod=mask_mod, seq_lengths=(seq, seq))
    fn = flex_attention
    if query.device.type == "cuda":
        if _COMPILED_FLEX is None:
            _COMPILED_FLEX = torch.compile(flex_attention, dynamic=False)
        fn = _COMPILED_FLEX
    q, k, v = (x.permute(0, 2, 1, 3) for x in (query, key, value))
    with warnings.catch_warnings():
        # Eager flex on the CPU is deliberate (the reference path); its "use torch.compile" warning is noise here.
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return fn(q, k, v, block_mask=block_mask).permute(0, 2, 1, 3)


class BlockSparseAttnProcessor:
    """MiniMax-H3 attention with block-sparse routing on the steps and layers the config leaves sparse."""

    _attention_backend = None
    _parallel_config = None

    def __init__(self, handle: "SparseAttentionHandle", layer: int, previous=None):
        self.handle, self.layer = handle, layer
        # Bools, not the layer index or step number: compiled blocks guard on what they read, and two values per
        # guard keep the graphs shared across the 50 blocks and all steps.
        self.dense_layer = layer in handle.config.dense_layers
        self._attention_backend = getattr(previous, "_attention_backend", None)
        self._parallel_config = getattr(previous, "_parallel_config", None)

    def __call__(self, attn, hidden_states, rotary_emb=None, attention_mask=None):
        from diffusers.models.attention_dispatch import dispatch_attention_fn

        handle, config = self.handle, self.handle.config
        query, key, value = project_qkv(attn, hidden_states, rotary_emb)
        padding: PaddingState | None = getattr(handle.transformer, "_h3_padding", None)
        valid_len = padding.valid_len if padding is not None else None
        dense = handle.dense_step or self.dense_layer
        if dense:
            mask = padding.key_mask(key.shape[1], key.shape[0], key.device) if padding is not None else None
            out = dispatch_attention_fn(query, key, value, attn_mask=mask, dropout_p=0.0, is_causal=False,
                                        backend=self._attention_backend, parallel_config=self._parallel_config)
            if not torch.compiler.is_compiling():
                handle.dense_calls += 1
        else:
            kv_num, kv_idx = route_blocks(query, key, config.block_size, config.sparsity, valid_len)
            out = block_sparse_attention(query, key, value, kv_num, kv_idx, config.block_size, valid_len)
            if not torch.compiler.is_compiling():
                n_valid = -(-(valid_len or key.shape[1]) // config.block_size)
                handle.sparse_calls += 1
                handle.kept_fraction_sum += float(kv_num[0, 0, 0]) / n_valid
        return output_projection(attn, out, query)


class SparseAttentionHandle(LeverHandle):
    name = "sparse_attention"

    def __init__(self, transformer, config: SparseAttentionConfig, previous):
        super().__init__()
        self.transformer, self.config, self.previous = transformer, config, previous
        self.step = 0
        self.dense_step = config.dense_steps > 0
        self.dense_calls = self.sparse_calls = 0
        self.dense_forwards = self.sparse_forwards = 0
        self.kept_fraction_sum = 0.0
        self.compiled = False  # set by apply_recipe_levers when the blocks are compiled: per-call counters freeze
        for i, (block, prev) in enumerate(zip(transformer.transformer_blocks, previous)):
            block.attn.set_processor(BlockSparseAttnProcessor(self, i, prev))
        self._post = transformer.register_forward_hook(self._advance, always_call=True)

    def _advance(self, *_):
        # Counted on the (never compiled) transformer, so they hold under regional compilation too.
        if self.dense_step:
            self.dense_forwards += 1
        else:
            self.sparse_forwards += 1
        self.step += 1
        self.dense_step = self.step < self.config.dense_steps

    def begin_request(self) -> None:
        self.step = 0
        self.dense_step = self.config.dense_steps > 0
        self.dense_calls = self.sparse_calls = 0
        self.dense_forwards = self.sparse_forwards = 0
        self.kept_fraction_sum = 0.0

    def telemetry(self) -> dict[str, Any]:
        return {
            "applied": not self.removed,
            "block_size": self.config.block_size,
            "target_sparsity": self.config.sparsity,
            "dense_forwards": self.dense_forwards,
            "sparse_forwards": self.sparse_forwards,
            # Per attention call, counted inside the blocks: unknown (None), not 0, when the blocks are compiled.
            "sparse_calls": None if self.compiled else self.sparse_calls,
            "dense_calls": None if self.compiled else self.dense_calls,
            "realized_sparsity": None if self.compiled or not self.sparse_calls
            else 1.0 - self.kept_fraction_sum / self.sparse_calls,
        }

    def _remove(self) -> None:
        self._post.remove()
        for block, prev in zip(self.transformer.transformer_blocks, self.previous):
            block.attn.set_processor(prev)
        unmark_applied(self.transformer, "sparse_attention")


def apply_sparse_attention(transformer, config: SparseAttentionConfig, backend: str = "native") -> SparseAttentionHandle:
    if not 0.0 <= config.sparsity < 1.0:
        raise LeverError(f"sparse_attention.sparsity must be in [0, 1), got {config.sparsity}")
    n_layers = len(transformer.transformer_blocks)
    bad = [i for i in config.dense_layers if not 0 <= i < n_layers]
    if bad:
        raise LeverError(f"sparse_attention.dense_layers {bad} out of range: the transformer has {n_layers} blocks")
    mark_applied(transformer, "sparse_attention")
    previous = [block.attn.processor for block in transformer.transformer_blocks]
    return SparseAttentionHandle(transformer, config, previous)
