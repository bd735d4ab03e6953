"""Block-sparse attention: content-based top-k key blocks per query block, on PyTorch's flex_attention block masks.

Routing (per batch item and head): mean-pool the queries and keys of each ``block_size``-token block (padding rows of a
bucketed sequence excluded), score every (query block, key block) pair by the pooled dot product, and keep the
``ceil((1 - sparsity) * n)`` best key blocks of each query block. The kept blocks become a flex_attention
``BlockMask`` (``BlockMask.from_kv_blocks``, O(blocks) to build); attention inside a kept block is exact. The first
``dense_steps`` denoising steps and the ``dense_layers`` run dense through the recipe's backend (seed 001: turbo +
sparse ran "only the first denoising step ... with full attention"). At sparsity 0 every block is kept, so the sparse
path computes dense attention.

On CUDA flex_attention is compiled on its own (a fused kernel that skips the dropped blocks); on the CPU it runs
eagerly, which computes the same values through the reference implementation. The whole attention call (routing, the
kernel, the dense steps, the counters) runs outside the transformer's compiled graphs (:meth:`SparseAttentionHandle.
attend`, a graph break), so the compiled blocks guard neither on the step nor on the request's real length, and the
flex kernel's inputs are tensors whose shapes are the bucket's: one set of kernels for every prompt in a bucket.

Token streams (``streams``): the packed sequence holds text, audio and video rows (diffusers' ``text_indices``,
``audio_indices``, ``video_indices``, read from each transformer call). Only the query rows of the configured streams
take the sparse path; the others attend densely to every key (the same keys, the recipe's backend). The default is
video only: a published stack damaged its audio by sparsifying the audio queries (issue 50), and the executed check
flags a recipe that does. The telemetry names the streams whose queries went sparse in the request.
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import Field, field_validator, model_serializer

from h3.levers.base import ApplyContext, LeverConfig, LeverError, LeverHandle, counts, mark_applied, unmark_applied
from h3.levers.bucketing import PaddingState, attend_valid_rows, output_projection, project_qkv

if TYPE_CHECKING:
    from h3.record import Executed

logger = logging.getLogger(__name__)

FLEX_COMPILED_ON = ("cuda",)
"""Device types on which flex_attention is compiled (a test adds "cpu", with the eager backend)."""
FLEX_BACKEND = "inductor"
SPARSITY_TOLERANCE = 0.02
"""How far the realized sparsity (measured from the block masks routing handed the kernel) may sit from the configured
one, beyond the rounding to whole blocks: top-k keeps ``ceil((1 - s) * n)`` of ``n`` key blocks, so a sequence of
``n`` real key blocks realizes up to ``1 / n`` less than configured (the check allows ``max(tolerance, 1 / n)`` below
and ``tolerance`` above)."""
_FLEX = None  # (the compiled flex_attention, its graph-counting backend), shared by every handle in the process
STREAMS = ("video", "audio", "text")
"""The token streams of MiniMax-H3's packed sequence, by the transformer call's ``<stream>_indices``."""
DEFAULT_STREAMS = ["video"]


class SparseAttentionConfig(LeverConfig):
    """Content-based block-sparse attention on the transformer blocks (flex_attention block masks); recipe section
    ``[sparse_attention]``."""

    name = "sparse_attention"
    signoff_kind = "near"  # the judge a change of this lever implies (h3.recipe.lever_differences)
    signoff_why = "attention over the best key blocks only: an approximation of the same sample (ghosts: seed 001)"

    enabled: bool = False
    block_size: int = Field(default=128, ge=16)
    """Query and key block, in tokens; routing mean-pools each block."""
    sparsity: float = Field(default=0.5, ge=0.0, lt=1.0)
    """Target fraction of key blocks each query block skips (top-k keeps ``ceil((1 - sparsity) * n_blocks)``)."""
    dense_steps: int = Field(default=1, ge=0)
    """The first N denoising steps run dense (seed 001: "only the first denoising step run with full attention")."""
    dense_layers: list[int] = Field(default_factory=list)
    """Transformer block indices that always run dense."""
    streams: list[Literal["video", "audio", "text"]] = Field(default_factory=lambda: list(DEFAULT_STREAMS))
    """The token streams whose query rows take the sparse path (the others attend densely to every key). Default:
    video only; sparsifying the audio queries damaged the audio of a published stack, and the executed check flags
    it."""

    @field_validator("streams")
    @classmethod
    def _streams(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError(f"name at least one of {list(STREAMS)} (or switch the lever off)")
        if len(set(value)) != len(value):
            raise ValueError(f"{value} names a stream twice")
        return value

    @model_serializer(mode="wrap")
    def _omit_default_streams_when_off(self, handler):
        # ``streams`` was added after recipes were hashed: a recipe with the lever off keeps its hash. One with it on
        # gets a new hash, rightly: its audio and text queries now attend densely by default (another computation).
        data = handler(self)
        if isinstance(data, dict) and not self.enabled and list(self.streams) == DEFAULT_STREAMS:
            data.pop("streams", None)
        return data

    def is_on(self) -> bool:
        return self.enabled

    def apply(self, pipe, ctx: ApplyContext) -> "SparseAttentionHandle":
        return apply_sparse_attention(pipe.transformer, self)

    def check_telemetry(self, telemetry: dict[str, Any], executed: "Executed") -> list[str]:
        """The configured block and sparsity; the first ``dense_steps`` forwards dense and the rest sparse; the sparse
        forwards really routed sparsely: their realized sparsity, measured from the kept-block masks the kernel got,
        within :data:`SPARSITY_TOLERANCE` (and the rounding to whole blocks) of the configured one. A sparse lever that
        ran dense — every step dense, or routing that keeps every block — fails here."""
        problems = []
        if telemetry.get("target_sparsity") != self.sparsity or telemetry.get("block_size") != self.block_size:
            problems.append(f"recipe asks for sparsity {self.sparsity} in {self.block_size}-token blocks, the lever "
                            f"ran {telemetry.get('target_sparsity')!r} in {telemetry.get('block_size')!r}-token blocks")
        (dense_fw, sparse_fw, dense_calls, sparse_calls), missing = counts(
            telemetry, "dense_forwards", "sparse_forwards", "dense_calls", "sparse_calls")
        if missing:
            return problems + missing
        # A record written before ``streams`` existed names none (its sparse steps sparsified every stream's queries):
        # not checked for it here, flagged by executed_flags.
        if "streams" in telemetry and list(telemetry["streams"] or []) != list(self.streams):
            problems.append(f"recipe sparsifies the {list(self.streams)} queries, the lever was set for "
                            f"{telemetry.get('streams')!r}")
        touched = telemetry.get("streams_touched")
        if sparse_calls and isinstance(touched, list):
            if "unknown" in touched:
                problems.append("the transformer calls named no token streams (no <stream>_indices): every query "
                                f"row went sparse, the recipe asks for {list(self.streams)} only")
            elif not set(touched) <= set(self.streams):
                problems.append(f"sparsified the {sorted(set(touched) - set(self.streams))} queries, the recipe "
                                f"asks for {list(self.streams)} only")
        forwards = dense_fw + sparse_fw
        if executed.forward_passes > 0 and forwards != executed.forward_passes:
            problems.append(f"counted {forwards} forwards, the request ran {executed.forward_passes}")
        if dense_fw != min(self.dense_steps, forwards):
            problems.append(f"{dense_fw} dense forwards of {forwards}, recipe asks for the first {self.dense_steps} "
                            "dense")
        if dense_fw and not dense_calls:
            problems.append(f"{dense_fw} dense forwards made no dense attention call")
        layers = telemetry.get("layers")
        all_dense = isinstance(layers, int) and set(range(layers)) <= set(self.dense_layers)
        if sparse_fw and not all_dense:
            realized = telemetry.get("realized_sparsity")
            if not sparse_calls or not isinstance(realized, (int, float)) or not math.isfinite(realized):
                problems.append(f"{sparse_fw} sparse forwards made {sparse_calls} sparse attention calls, realized "
                                f"sparsity {realized!r}: the sparse steps ran dense")
            else:
                blocks = telemetry.get("min_key_blocks")
                below = max(SPARSITY_TOLERANCE, 1.0 / blocks) if isinstance(blocks, int) and blocks > 0 \
                    else SPARSITY_TOLERANCE
                if not self.sparsity - below <= realized <= self.sparsity + SPARSITY_TOLERANCE:
                    problems.append(f"realized sparsity {realized:.4f}, recipe asks for {self.sparsity} (allowed "
                                    f"[{self.sparsity - below:.4f}, {self.sparsity + SPARSITY_TOLERANCE:.4f}])")
        return problems

    def executed_flags(self, telemetry: dict[str, Any], executed: "Executed", recipe: Any = None) -> list[str]:
        """Sparsity applied to the audio queries: configured, so not a mismatch, but a known way to damage the audio
        (a published stack's bug, issue 50)."""
        touched = telemetry.get("streams_touched")
        if "streams" not in telemetry and telemetry.get("sparse_calls"):
            return ["the record predates sparse_attention.streams: its sparse steps sparsified every stream's queries, "
                    "audio included (sparsifying audio queries damaged the audio of a published stack)"]
        if isinstance(touched, list) and ("audio" in touched or "unknown" in touched):
            rows = telemetry.get("sparse_query_rows") or {}
            return [f"sparse attention covered the audio queries ({rows.get('audio', '?')} audio rows per call at "
                    f"sparsity {self.sparsity}; streams = {list(self.streams)}): sparsifying audio queries damaged the "
                    "audio of a published stack"]
        return []


def keep_blocks(sparsity: float, n_valid: int) -> int:
    """Key blocks kept per query block out of ``n_valid``. round() first: (1 - 0.7) * 10 is 3.0000000000000004 in
    floating point, which must keep 3 blocks, not 4."""
    return max(1, math.ceil(round((1.0 - sparsity) * n_valid, 9)))


def route_blocks(query: torch.Tensor, key: torch.Tensor, block_size: int, sparsity: float,
                 valid_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k key blocks per query block. query/key (B, S, H, D). Returns (kv_num_blocks (B, H, nQ) int32,
    kv_indices (B, H, nQ, nK) int32, the kept blocks first in ascending order)."""
    batch, seq, heads, dim = query.shape
    valid = seq if valid_len is None else valid_len
    n_blocks = -(-seq // block_size)
    n_valid = -(-valid // block_size)

    def pool(x):
        """Mean of each block's real rows, accumulated in float32 while reading ``x`` once (no float32 copy of the
        sequence: this runs eagerly, outside the compiled graphs). Blocks made only of padding pool to zero."""
        full = valid // block_size
        parts = [x[:, :full * block_size].unflatten(1, (full, block_size)).sum(dim=2, dtype=torch.float32)
                 / block_size]
        if valid % block_size:
            parts.append(x[:, full * block_size:valid].sum(dim=1, keepdim=True, dtype=torch.float32)
                         / (valid % block_size))
        if n_blocks > n_valid:
            parts.append(torch.zeros(batch, n_blocks - n_valid, heads, dim, dtype=torch.float32, device=x.device))
        return torch.cat(parts, dim=1)  # (B, n_blocks, H, D)

    q_pool, k_pool = pool(query), pool(key)
    scores = torch.einsum("bqhd,bkhd->bhqk", q_pool, k_pool)
    scores[..., n_valid:] = float("-inf")  # key blocks made only of padding are never kept
    keep = keep_blocks(sparsity, n_valid)
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


def flex_kernel(device: torch.device):
    """flex_attention compiled on its own on CUDA (a fused kernel, static shapes), eager elsewhere. The graphs its
    compilation produces are counted (:func:`flex_graphs`): a new one after the first is a recompile."""
    global _FLEX
    from torch.nn.attention.flex_attention import flex_attention

    from h3.levers.compile import CountingBackend

    if device.type not in FLEX_COMPILED_ON:
        return flex_attention
    if _FLEX is None or _FLEX[1].name != FLEX_BACKEND:
        counter = CountingBackend(FLEX_BACKEND, None)
        _FLEX = (torch.compile(flex_attention, backend=counter, dynamic=False), counter)
    return _FLEX[0]


def flex_graphs() -> int:
    """Graphs compiled so far for the flex kernel, in this process."""
    return _FLEX[1].graphs if _FLEX is not None else 0


def block_sparse_attention(query, key, value, kv_num_blocks, kv_indices, block_size, valid_len=None):
    """Attention over the kept key blocks. query/key/value (B, S, H, D) -> (B, S, H, D)."""
    from torch.nn.attention.flex_attention import BlockMask

    seq = query.shape[1]
    # The mask_mod states the kept blocks token by token as well: the compiled kernel skips the dropped blocks from
    # the block structure alone, but eager flex_attention (the CPU path) computes every score and applies only the
    # mask_mod, so both must say the same thing.
    kept = kept_block_mask(kv_num_blocks, kv_indices)
    # The real keys as a tensor, not an int the mask_mod closes over: the compiled kernel is guarded on a closure's
    # ints, and would recompile for every prompt length of a bucket.
    real_key = torch.arange(seq, device=query.device) < (seq if valid_len is None else valid_len)

    def mask_mod(b, h, q_idx, kv_idx):
        return kept[b, h, q_idx // block_size, kv_idx // block_size] & real_key[kv_idx]

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
    fn = flex_kernel(query.device)
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
        # A bool, not the layer index: compiled blocks guard on what they read, and two values per guard keep the
        # graphs shared across the 50 blocks.
        self.dense_layer = layer in handle.config.dense_layers
        self._attention_backend = getattr(previous, "_attention_backend", None)
        self._parallel_config = getattr(previous, "_parallel_config", None)

    def __call__(self, attn, hidden_states, rotary_emb=None, attention_mask=None):
        query, key, value = project_qkv(attn, hidden_states, rotary_emb)
        out = self.handle.attend(query, key, value, self.dense_layer, self._attention_backend, self._parallel_config)
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
        self._reset_routing()
        self._dense_rows: torch.Tensor | None = None
        """Query rows of the streams the config leaves dense, in the live call (None: every row goes sparse)."""
        self._layout_known = False
        self._stream_rows: dict[str, int] = {}
        for i, (block, prev) in enumerate(zip(transformer.transformer_blocks, previous)):
            block.attn.set_processor(BlockSparseAttnProcessor(self, i, prev))
        self._pre = transformer.register_forward_pre_hook(self._layout, with_kwargs=True)
        self._post = transformer.register_forward_hook(self._advance, always_call=True)

    def _layout(self, _module, _args, kwargs):
        """The call's token streams (diffusers' ``<stream>_indices``): which query rows stay dense."""
        indices = {name: kwargs.get(f"{name}_indices") for name in STREAMS}
        self._layout_known = all(torch.is_tensor(v) for v in indices.values())
        if not self._layout_known:
            self._dense_rows, self._stream_rows = None, {}
            return
        self._stream_rows = {name: int(indices[name].numel()) for name in STREAMS}
        dense = [indices[name].reshape(-1) for name in STREAMS if name not in self.config.streams]
        rows = torch.cat(dense) if dense else None
        self._dense_rows = rows.sort().values.long() if rows is not None and rows.numel() else None

    @torch.compiler.disable
    def attend(self, query, key, value, dense_layer: bool, backend=None, parallel_config=None):
        """One block's attention (B, S, H, D) -> (B, S, H, D), outside the compiled graphs: dense (through the
        recipe's backend, on the real rows of a bucketed sequence) on the dense steps and layers, else block-sparse."""
        padding: PaddingState | None = getattr(self.transformer, "_h3_padding", None)
        if self.dense_step or dense_layer:
            self.dense_calls += 1
            return attend_valid_rows(query, key, value, padding, backend, parallel_config)
        if getattr(parallel_config, "context_parallel_config", None) is not None:
            # Routing is per head over the whole sequence: under Ulysses each rank holds exactly that for its heads
            # (h3/parallel/attention.py); the lever's preflight refuses ring attention.
            from h3.parallel.attention import ulysses_attention

            return ulysses_attention(query, key, value, lambda q, k, v: self._sparse(q, k, v, padding, backend),
                                     parallel_config)
        return self._sparse(query, key, value, padding, backend)

    def _sparse(self, query, key, value, padding: PaddingState | None, backend=None):
        """Block-sparse attention over a whole sequence (B, S, H, D), its padding rows left out; the query rows of the
        streams the config leaves dense attend densely to every real key instead."""
        seq, block = query.shape[1], self.config.block_size
        valid_len = padding.real_rows(seq) if padding is not None else None
        kv_num, kv_idx = route_blocks(query, key, block, self.config.sparsity, valid_len)
        n_valid = -(-(valid_len or seq) // block)
        self.sparse_calls += 1
        if self._layout_known:
            for name in STREAMS:
                if name in self.config.streams:
                    self._touched_rows[name] = self._touched_rows.get(name, 0) + self._stream_rows[name]
        else:
            self._touched_rows["unknown"] = self._touched_rows.get("unknown", 0) + (valid_len or seq)
        # Measured, not derived from the config: the fraction of real key blocks the kernel's mask keeps for the real
        # query blocks (summed on the device, read at telemetry time: no sync per call).
        kept = kept_block_mask(kv_num, kv_idx)[:, :, :n_valid, :n_valid]
        self._kept_fraction_sum = self._kept_fraction_sum + kept.float().mean()
        self.min_key_blocks = n_valid if self.min_key_blocks is None else min(self.min_key_blocks, n_valid)
        out = block_sparse_attention(query, key, value, kv_num, kv_idx, block, valid_len)
        rows = self._dense_rows
        if rows is None:
            return out
        from diffusers.models.attention_dispatch import dispatch_attention_fn

        rows = rows.to(query.device)
        real = valid_len or seq
        dense = dispatch_attention_fn(query.index_select(1, rows), key[:, :real], value[:, :real], attn_mask=None,
                                      dropout_p=0.0, is_causal=False, backend=backend)
        return out.index_copy(1, rows, dense.to(out.dtype))

    def _reset_routing(self) -> None:
        self._kept_fraction_sum: torch.Tensor | float = 0.0
        self._touched_rows: dict[str, int] = {}
        """Query rows that went through the sparse path in this request, by stream ("unknown": a call that named no
        streams)."""
        self.min_key_blocks: int | None = None
        self._flex_graphs_at_start = flex_graphs()

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
        self._reset_routing()

    def telemetry(self) -> dict[str, Any]:
        return {
            "applied": not self.removed,
            "block_size": self.config.block_size,
            "target_sparsity": self.config.sparsity,
            "dense_forwards": self.dense_forwards,
            "sparse_forwards": self.sparse_forwards,
            # Per attention call: counted outside the compiled graphs, so they hold under torch.compile too.
            "sparse_calls": self.sparse_calls,
            "dense_calls": self.dense_calls,
            # Measured from the kept-block masks of the sparse calls (mean over calls, heads and real query blocks).
            "realized_sparsity": 1.0 - float(self._kept_fraction_sum) / self.sparse_calls if self.sparse_calls
            else None,
            "min_key_blocks": self.min_key_blocks,
            "layers": len(self.transformer.transformer_blocks),
            # The token streams: configured, and those whose query rows really went sparse in this request (with the
            # rows per sparse call of each), so a record shows whether audio queries were sparsified.
            "streams": list(self.config.streams),
            "streams_touched": sorted(name for name, rows in self._touched_rows.items() if rows),
            "sparse_query_rows": {name: rows // self.sparse_calls for name, rows in self._touched_rows.items()}
            if self.sparse_calls else {},
            # The separately compiled flex kernel (CUDA; eager on the CPU: 0): graphs in this process / this request.
            "flex_graphs_compiled_total": flex_graphs(),
            "flex_graphs_compiled_this_request": flex_graphs() - self._flex_graphs_at_start,
        }

    def _remove(self) -> None:
        self._pre.remove()
        self._post.remove()
        for block, prev in zip(self.transformer.transformer_blocks, self.previous):
            block.attn.set_processor(prev)
        unmark_applied(self.transformer, "sparse_attention")


def apply_sparse_attention(transformer, config: SparseAttentionConfig) -> SparseAttentionHandle:
    if not 0.0 <= config.sparsity < 1.0:
        raise LeverError(f"sparse_attention.sparsity must be in [0, 1), got {config.sparsity}")
    n_layers = len(transformer.transformer_blocks)
    bad = [i for i in config.dense_layers if not 0 <= i < n_layers]
    if bad:
        raise LeverError(f"sparse_attention.dense_layers {bad} out of range: the transformer has {n_layers} blocks")
    mark_applied(transformer, "sparse_attention")
    previous = [block.attn.processor for block in transformer.transformer_blocks]
    return SparseAttentionHandle(transformer, config, previous)
