"""Planted parallel bugs, for the suite's parallel-versus-single check to prove it catches them (issue 21).

Seed 001 warns that a parallel bug can look like ghosting; a check that never failed on a known bug proves nothing.
Each plant is a realistic mistake in a sequence-parallel implementation, injected into diffusers' real engine at run
time, and only when ``H3_PARALLEL_PLANT`` names it (tests and calibration runs; never a recipe key). A planted run
says so in its record (``executed.levers.parallel.planted_bug``), so it can never pass for a real one.

- ``a2a_permutation``: the Ulysses all-to-all of the *keys* sends each head group to the next rank, so every rank's
  queries meet the keys of other heads (a wrong permutation in the exchange; the query, value and output exchanges
  stay right). In both Ulysses paths: ``ulysses`` (``_all_to_all_single``) and ``ulysses_anything``
  (``all_to_all_single_any_qkv_async``).
- ``rope_offset``: the last rank applies the rotary embedding of the *first* shard, i.e. its rows get positions
  without their shard's offset (the classic missing-offset bug of sharded RoPE).
"""

from __future__ import annotations

import os
from typing import Callable

import torch

PLANTS = ("a2a_permutation", "rope_offset")
ENV = "H3_PARALLEL_PLANT"


def requested_plant() -> str | None:
    name = os.environ.get(ENV, "").strip()
    if not name:
        return None
    if name not in PLANTS:
        raise ValueError(f"{ENV}={name!r} is not a known planted bug; one of {', '.join(PLANTS)}")
    return name


def install_plant(name: str, transformer, world_size: int, rank: int) -> Callable[[], None]:
    """Install plant ``name``; returns its remover."""
    if name == "a2a_permutation":
        from diffusers.models import attention_dispatch as ad

        original = ad.__dict__["_all_to_all_single"]
        calls = [0]

        def wrong_exchange(x, group):
            # TemplatedUlyssesAttention exchanges query, key, value, then the output: the key is call 1 of 4. Its
            # dim 0 is the destination rank; rolling it sends head group r to rank r + 1.
            index = calls[0] % 4
            calls[0] += 1
            if index == 1:
                x = torch.roll(x, shifts=1, dims=0).contiguous()
            return original(x, group)

        original_any = ad.__dict__["all_to_all_single_any_qkv_async"]
        any_calls = [0]

        def wrong_exchange_any(x, group, **kwargs):
            # Called for query, key and value in turn; dim 2 holds the heads, whose contiguous groups go to the
            # ranks in order: rolling by one group sends group r to rank r + 1.
            index = any_calls[0] % 3
            any_calls[0] += 1
            if index == 1:
                world = torch.distributed.get_world_size(group)
                x = torch.roll(x, shifts=-(-x.shape[2] // world), dims=2).contiguous()
            return original_any(x, group, **kwargs)

        ad._all_to_all_single = wrong_exchange
        ad.all_to_all_single_any_qkv_async = wrong_exchange_any

        def remove():
            ad._all_to_all_single = original
            ad.all_to_all_single_any_qkv_async = original_any

        return remove
    if name == "rope_offset":
        rope = transformer.rope
        forward = type(rope).forward

        def no_offset(module, args, output):
            if rank != world_size - 1:
                return output
            (position_ids,) = args
            local = output[0].shape[0]
            full = forward(module, position_ids)  # the unsharded table; take the first shard's rows
            return tuple(t[:local] for t in full)

        handle = rope.register_forward_hook(no_offset)
        return handle.remove
    raise ValueError(f"unknown planted bug {name!r}; one of {', '.join(PLANTS)}")
