"""Shape bucketing: pad MiniMax-H3's packed sequence up to a multiple of ``multiple`` rows so that prompts of
different lengths share one set of compiled kernels, while the padding contributes exactly zero.

Seed 001: a kernel JIT-compiled per exact token count cost 12-14 s per new prompt length in a real server; the fix was
SGLang's 64-token-aligned length plus "an existing masking path ... so the padding contributes exactly zero instead of
merely a small amount".

How: a pre-hook on the transformer appends padding rows to the layout tensors (``position_ids``, ``token_tags``,
``timestep_indices``); the model builds its packed buffer from their length, so the padding rows exist from the first
block on, while ``video_indices``/``audio_indices``/``text_indices`` keep addressing only the real rows, so no output
reads a padding row. Attention, the only place where rows meet, runs on the real rows alone: the call is cut out of
the compiled graph (:func:`attend_valid_rows`, a graph break like the runtime's dispatch probe), slices query, key and
value to the request's real length, and pads the output with zero rows. So no padding row reaches a real row, no
mask is needed (a key-padding mask keeps SDPA off its flash kernel, and Sage takes none), every backend can be
bucketed, and the compiled graphs around the attention see the bucket's length only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from pydantic import Field

from h3.levers.base import ApplyContext, LeverConfig, LeverError, LeverHandle, counts, mark_applied, unmark_applied

if TYPE_CHECKING:
    from h3.record import Executed

logger = logging.getLogger(__name__)


class BucketingConfig(LeverConfig):
    """Shape bucketing: pad the packed sequence to a multiple of ``multiple`` rows; attention runs on the real rows
    only (recipe section ``[bucketing]``)."""

    name = "bucketing"
    signoff_kind = "near"  # the judge a change of this lever implies (h3.recipe.lever_differences)
    signoff_why = "padded shape buckets: the same sample, rounded differently"

    enabled: bool = False
    multiple: int = Field(default=64, ge=1)
    """Bucket granularity in rows (seed 001: SGLang's 64-token-aligned length)."""

    def is_on(self) -> bool:
        return self.enabled

    def apply(self, pipe, ctx: ApplyContext) -> "BucketingHandle":
        return apply_bucketing(pipe.transformer, self)

    def check_telemetry(self, telemetry: dict[str, Any], executed: "Executed") -> list[str]:
        """Buckets of the configured multiple, each holding its real lengths, and every forward of the request
        bucketed."""
        problems = []
        if telemetry.get("multiple") != self.multiple:
            problems.append(f"recipe asks for {self.multiple}-row buckets, the lever padded to multiples of "
                            f"{telemetry.get('multiple')!r}")
        buckets, lengths = telemetry.get("buckets"), telemetry.get("valid_lengths")
        if isinstance(buckets, list) and all(isinstance(b, int) for b in buckets):
            off = [b for b in buckets if b % self.multiple]
            if off:
                problems.append(f"buckets {off} are not multiples of {self.multiple} rows")
            if isinstance(lengths, list) and lengths and buckets and max(lengths) > max(buckets):
                problems.append(f"a real length ({max(lengths)}) exceeds every bucket ({buckets})")
        else:
            problems.append(f"reported no buckets ({buckets!r})")
        if executed.forward_passes > 0:
            (forwards,), missing = counts(telemetry, "bucketed_forwards")
            problems += missing
            if not missing and forwards != executed.forward_passes:
                problems.append(f"{forwards} of the request's {executed.forward_passes} forwards were bucketed")
            if not missing and not buckets:
                problems.append("the request's forwards used no bucket")
        return problems


@dataclass
class PaddingState:
    """The live request's real length while a bucketed forward runs (read by the attention processors)."""

    valid_len: int | None = None
    padded_len: int | None = None

    def real_rows(self, seq_len: int) -> int | None:
        """The real length when a sequence of ``seq_len`` rows carries padding, else None. Read only outside the
        compiled graphs: an int read inside a compiled block would be guarded on and recompile at every length."""
        if self.valid_len is None or self.padded_len != seq_len or self.valid_len == seq_len:
            return None
        return self.valid_len


@torch.compiler.disable
def attend_valid_rows(query, key, value, padding: PaddingState | None, backend=None, parallel_config=None):
    """Attention over the real rows of a bucketed sequence: query/key/value (B, S, H, D) -> (B, S, H, D), the
    padding rows of the output zero (nobody reads them). Without padding, the plain dispatcher call."""
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    if getattr(parallel_config, "context_parallel_config", None) is not None:
        # Under context parallelism ``query`` is this rank's shard, whose length is not the padded length the state
        # holds: the slice below would compare the two, find no padding and let every padding row in as a key.
        # The shard-aware slice lives with the parallel engine (h3/parallel/attention.py).
        from h3.parallel.attention import attend_valid_rows_cp

        valid_len = padding.valid_len if padding is not None else None
        padded_len = padding.padded_len if padding is not None else None
        return attend_valid_rows_cp(query, key, value, valid_len, padded_len, backend, parallel_config)
    seq = query.shape[1]
    valid = padding.real_rows(seq) if padding is not None else None
    if valid is not None:
        query, key, value = query[:, :valid], key[:, :valid], value[:, :valid]
    out = dispatch_attention_fn(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, backend=backend,
                                parallel_config=parallel_config)
    if valid is not None:
        out = torch.nn.functional.pad(out, (0, 0, 0, 0, 0, seq - valid))
    return out


def project_qkv(attn, hidden_states, rotary_emb):
    """MiniMaxH3AttnProcessor's projection, QK-norm and RoPE (diffusers 0.42.1), shared by the lever processors."""
    from diffusers.models.transformers.transformer_minimax_h3 import _apply_rotary_emb

    if attn.fused_projections:
        query, key, value = attn.to_qkv(hidden_states).chunk(3, dim=-1)
    else:
        query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
    query = attn.norm_q(query.unflatten(-1, (attn.heads, -1)))
    key = attn.norm_k(key.unflatten(-1, (attn.heads, -1)))
    value = value.unflatten(-1, (attn.heads, -1))
    if rotary_emb is not None:
        query = _apply_rotary_emb(query, *rotary_emb)
        key = _apply_rotary_emb(key, *rotary_emb)
    return query, key, value


def output_projection(attn, hidden_states, query):
    hidden_states = hidden_states.flatten(2, 3).type_as(query)
    return attn.to_out[1](attn.to_out[0](hidden_states))


class BucketedAttnProcessor:
    """MiniMax-H3 attention that leaves the padding rows of a bucketed sequence out."""

    _attention_backend = None
    _parallel_config = None

    def __init__(self, padding: PaddingState, previous=None):
        self.padding = padding
        self._attention_backend = getattr(previous, "_attention_backend", None)
        self._parallel_config = getattr(previous, "_parallel_config", None)

    def __call__(self, attn, hidden_states, rotary_emb=None, attention_mask=None):
        query, key, value = project_qkv(attn, hidden_states, rotary_emb)
        out = attend_valid_rows(query, key, value, self.padding, self._attention_backend, self._parallel_config)
        return output_projection(attn, out, query)


def _pad(tensor: torch.Tensor, rows: int, value: int) -> torch.Tensor:
    fill = torch.full((rows, *tensor.shape[1:]), value, dtype=tensor.dtype, device=tensor.device)
    return torch.cat([tensor, fill])


class BucketingHandle(LeverHandle):
    name = "bucketing"

    def __init__(self, transformer, config: BucketingConfig, previous_processors, pad_position: int = 0,
                 pad_tag: int = 0):
        super().__init__()
        self.transformer, self.config = transformer, config
        self.pad_position, self.pad_tag = pad_position, pad_tag
        self.padding = PaddingState()
        transformer._h3_padding = self.padding
        self.previous = previous_processors
        for block, previous in zip(transformer.transformer_blocks, previous_processors):
            block.attn.set_processor(BucketedAttnProcessor(self.padding, previous))
        self.calls = 0
        self.buckets: set[int] = set()
        self.valid_lengths: set[int] = set()
        self.padded_rows = 0
        self._pre = transformer.register_forward_pre_hook(self._pad_layout, with_kwargs=True)
        self._post = transformer.register_forward_hook(self._clear, with_kwargs=True, always_call=True)

    def _pad_layout(self, _module, args, kwargs):
        if args:
            raise LeverError("bucketing expects the transformer to be called with keyword arguments (as the pipeline does)")
        seq_len = kwargs["position_ids"].shape[0]
        padded = -(-seq_len // self.config.multiple) * self.config.multiple
        extra = padded - seq_len
        if extra:
            kwargs = dict(kwargs)
            kwargs["position_ids"] = _pad(kwargs["position_ids"], extra, self.pad_position)
            kwargs["token_tags"] = _pad(kwargs["token_tags"], extra, self.pad_tag)
            kwargs["timestep_indices"] = _pad(kwargs["timestep_indices"], extra, 0)
        self.padding.valid_len, self.padding.padded_len = seq_len, padded
        self.calls += 1
        self.buckets.add(padded)
        self.valid_lengths.add(seq_len)
        self.padded_rows += extra
        return args, kwargs

    def _clear(self, *_args, **_kwargs):
        self.padding.valid_len = self.padding.padded_len = None

    def begin_request(self) -> None:
        self.calls, self.padded_rows = 0, 0
        self.buckets, self.valid_lengths = set(), set()

    def telemetry(self) -> dict[str, Any]:
        return {
            "applied": not self.removed,
            "multiple": self.config.multiple,
            "bucketed_forwards": self.calls,
            "buckets": sorted(self.buckets),
            "valid_lengths": sorted(self.valid_lengths),
            "padded_rows": self.padded_rows,
        }

    def _remove(self) -> None:
        self._pre.remove()
        self._post.remove()
        for block, previous in zip(self.transformer.transformer_blocks, self.previous):
            block.attn.set_processor(previous)
        del self.transformer._h3_padding
        unmark_applied(self.transformer, "bucketing")


def apply_bucketing(transformer, config: BucketingConfig, *, pad_position: int = 0,
                    pad_tag: int = 0) -> BucketingHandle:
    """``pad_position`` / ``pad_tag``: the padding rows' (t, h, w) positions and modality tag; tests vary them to show
    that the padding has no effect."""
    if config.multiple < 1:
        raise LeverError(f"bucketing.multiple must be >= 1, got {config.multiple}")
    mark_applied(transformer, "bucketing")
    previous = [block.attn.processor for block in transformer.transformer_blocks]
    return BucketingHandle(transformer, config, previous, pad_position, pad_tag)
