"""Attention under context parallelism, where the levers change the attention call: the padding rows of a bucketed
sequence, and block-sparse attention. Both go through diffusers' own context-parallel engine
(``attention_dispatch._templated_context_parallel_attention``: the Ulysses all-to-all, ring, and their ``*_anything``
variants for uneven lengths); nothing here exchanges tensors itself.

**Padding rows under CP** (the bucketing lever). Single-process, :func:`h3.levers.bucketing.attend_valid_rows`
slices query, key and value to the request's real rows. Under CP each rank holds one shard of the padded sequence,
so that slice compared the *local* length with the *global* padded length, found them different and sliced nothing:
every padding row took part in attention as a key (the bug the issue names). Here each rank cuts the padding rows
out of *its own shard* (the padding sits at the end of the global sequence, so only the last shard(s) hold any) and
the call runs through the ``*_anything`` variant of the same mesh, which exchanges uneven local lengths: the
attention sees exactly the real rows, in order, on every backend, with no mask.

**Block-sparse attention under Ulysses.** Routing is per (batch, head) over the whole sequence, and Ulysses gives
each rank the whole sequence for its heads: diffusers' Ulysses exchange runs with the block-sparse kernel as its
``forward_op``, so each rank routes and attends its heads exactly as the single process does. Ring attention keeps
the keys spread over the ranks and never holds a head's whole key set, so top-k routing cannot run under it (the
lever refuses that combination at preflight).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

import torch

logger = logging.getLogger(__name__)

_ANYTHING: dict[int, Any] = {}


def cp_config(parallel_config) -> Any | None:
    """The ContextParallelConfig of a diffusers ParallelConfig when context parallelism is on (degree > 1)."""
    cp = getattr(parallel_config, "context_parallel_config", None) if parallel_config is not None else None
    if cp is None or cp._world_size is None or cp._world_size <= 1:
        return None
    return cp


def is_anything(cp) -> bool:
    return bool(cp.ulysses_anything or cp.ring_anything)


def shard_sizes(total: int, world: int, anything: bool) -> list[int]:
    """Rows of each rank's shard of a ``total``-row sequence, as diffusers' sharders cut it: equal chunks
    (``EquipartitionSharder``, which requires divisibility) or ``tensor_split`` (``PartitionAnythingSharder``: the
    first ``total % world`` ranks get one row more)."""
    if not anything:
        if total % world:
            raise ValueError(f"{total} rows do not split into {world} equal shards")
        return [total // world] * world
    base, extra = divmod(total, world)
    return [base + (1 if r < extra else 0) for r in range(world)]


def cp_rank(cp) -> int:
    """This rank's index in the context-parallel mesh, the index diffusers' sharders use."""
    import torch.distributed as dist

    return dist.get_rank(cp._flattened_mesh.get_group())


def anything_variant(parallel_config):
    """The same mesh and degrees with ``ulysses_anything`` / ``ring_anything`` on: uneven local lengths allowed.
    Built once per config (set up on the same mesh, so it uses the same process groups)."""
    from diffusers.models._modeling_parallel import ParallelConfig

    cp = parallel_config.context_parallel_config
    if is_anything(cp):
        return parallel_config
    key = id(parallel_config)
    cached = _ANYTHING.get(key)
    if cached is not None and cached[0] is parallel_config:
        return cached[1]
    ring = cp.ring_degree > 1
    if ring and cp.ulysses_degree > 1:
        raise ValueError("padding rows under combined ring x ulysses parallelism are not supported by diffusers' "
                         "*_anything attention")
    variant_cp = dataclasses.replace(cp, ulysses_anything=not ring, ring_anything=ring, mesh=cp._mesh)
    variant_cp.setup(cp._rank, cp._world_size, cp._device, cp._mesh)
    variant = ParallelConfig(context_parallel_config=variant_cp)
    variant._rank, variant._world_size, variant._device, variant._mesh = (
        parallel_config._rank, parallel_config._world_size, parallel_config._device, parallel_config._mesh)
    _ANYTHING[key] = (parallel_config, variant)
    return variant


def attend_valid_rows_cp(query, key, value, valid_len: int | None, padded_len: int | None, backend, parallel_config):
    """Attention over the real rows of a bucketed sequence under CP: this rank's shard (B, S_local, H, D) in, the same
    shape out with its padding rows zero. ``valid_len``/``padded_len`` are the global lengths (None: no padding)."""
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    cp = cp_config(parallel_config)
    seq_local = query.shape[1]
    if cp is None or valid_len is None or padded_len is None or valid_len >= padded_len:
        return dispatch_attention_fn(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                     backend=backend, parallel_config=parallel_config)
    world, rank = cp._world_size, cp_rank(cp)
    sizes = shard_sizes(padded_len, world, is_anything(cp))
    if sizes[rank] != seq_local:
        raise RuntimeError(f"rank {rank} holds {seq_local} rows, but a {padded_len}-row sequence over {world} ranks "
                           f"gives it {sizes[rank]}: the padding state does not describe this forward")
    start = sum(sizes[:rank])
    local_valid = max(0, min(seq_local, valid_len - start))
    if cp.ring_degree > 1:
        # Ring attention merges per-chunk partial results by their log-sum-exp; a chunk with no key would give the
        # first merge NaN. Padding is less than one bucket, far less than a shard, at any real size.
        last_valid = valid_len - sum(sizes[:-1])
        if last_valid <= 0:
            raise RuntimeError(f"ring attention with padding needs at least one real row on every rank; the last "
                               f"shard ({sizes[-1]} rows) is all padding ({padded_len - valid_len} rows)")
    out = dispatch_attention_fn(query[:, :local_valid], key[:, :local_valid], value[:, :local_valid], attn_mask=None,
                                dropout_p=0.0, is_causal=False, backend=backend,
                                parallel_config=anything_variant(parallel_config))
    if local_valid < seq_local:
        out = torch.nn.functional.pad(out, (0, 0, 0, 0, 0, seq_local - local_valid))
    return out


def ulysses_attention(query, key, value, fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
                      parallel_config):
    """``fn`` (any exact per-head attention on (B, S, H, D)) run under diffusers' Ulysses exchange: each rank gets the
    whole sequence for its share of the heads, runs ``fn``, and the output goes back to sequence shards."""
    from diffusers.models.attention_dispatch import _templated_context_parallel_attention

    cp = cp_config(parallel_config)
    if cp is None:
        return fn(query, key, value)
    if cp.ring_degree > 1:
        raise RuntimeError("this attention needs a head's whole sequence at once; ring attention never gathers it")

    def forward_op(ctx, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse, _save_ctx=True,
                   _parallel_config=None):
        if return_lse:
            raise RuntimeError("the block-sparse forward op returns no log-sum-exp")
        return fn(q, k, v)

    return _templated_context_parallel_attention(query, key, value, None, 0.0, False, None, False, False,
                                                 forward_op=forward_op, backward_op=None,
                                                 _parallel_config=parallel_config)
