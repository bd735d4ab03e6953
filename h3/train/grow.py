"""A trained DiT grown to more blocks without changing what it computes: ``unpack --from CKPT --grow-dit num_layers=8``.

diffusers 0.42.1's MiniMaxH3TransformerBlock writes into the residual stream through two terms only,
``gate_msa * attn.to_out[0](...)`` and ``gate_mlp * ff.net[2](...)``. A block whose two output projections are zero
adds exactly zero, whatever its other weights, so blocks inserted with those two matrices zeroed make the grown model
compute the checkpoint's function (tests/test_train_grow.py: the grown shipped DiT against the shipped one, float64,
max abs difference 0 on random latents, timesteps and text). The new blocks' other weights are not zero: each is a
copy of the block it follows (``init=copy``, the default: attention and adaLN already shaped to the features it
reads) or the block a fresh model of the grown shape draws at :data:`h3.tiny_trained.INIT_SEED` (``init=fresh``). So
the gates are not zero, the first backward reaches the two output projections (the gradient of a zero linear map is
the upstream gradient times its input, neither zero), and from the first optimizer step on every other weight of the
block. The adaLN-Zero alternative (zero gate rows, what :func:`h3.train.dit.init_dit` does for a DiT from scratch)
keeps the function too, but there the first backward reaches only those gate rows, which then scale a projection that
is already trained in the copied block; zeroing the projections keeps the shipped gates and lets the new block learn
what to write.

New blocks are spread over the stack: old block ``i`` is followed by ``floor((i+1) a / n) - floor(i a / n)`` new ones
(``a`` added, ``n`` old), so 4 -> 8 interleaves one after each and 4 -> 6 puts one after blocks 1 and 3.

Only depth grows. A wider hidden state is not the same function: RMSNorm over zero-padded channels divides by
``sqrt(mean(x^2) + eps)`` over more channels, and its weight can absorb the mean's factor but not ``eps``'s.
"""

from __future__ import annotations

import torch


class GrowError(ValueError):
    """A growth that cannot be done as asked (bad input; h3.train.travel reports it as a PackError: the CLI exits 3)."""


BLOCKS = "transformer_blocks."
ZEROED = ("attn.to_out.0.", "ff.net.2.")
"""The parameter prefixes (inside a block) of the two projections that write into the residual stream."""
INITS = ("copy", "fresh")


def parse_grow(spec: str, have_layers: int) -> dict:
    """``"num_layers=8"`` or ``"num_layers=8,init=fresh"`` -> ``{"num_layers": 8, "init": "copy"}``; a GrowError
    naming the problem for an unknown key, a count that is not a whole number larger than ``have_layers``, or an
    unknown init."""
    out, seen = {"init": "copy"}, set()
    for item in filter(None, (part.strip() for part in spec.split(","))):
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or key in seen:
            raise GrowError(f"--grow-dit {spec!r}: give KEY=VALUE items, each once (num_layers=N[,init=copy|fresh])")
        seen.add(key)
        if key == "num_layers":
            if not value.isdigit():
                raise GrowError(f"--grow-dit {spec!r}: num_layers must be a whole number, got {value!r}")
            out["num_layers"] = int(value)
        elif key == "init":
            if value not in INITS:
                raise GrowError(f"--grow-dit {spec!r}: init must be one of {', '.join(INITS)}, got {value!r}")
            out["init"] = value
        elif key in ("hidden_size", "ffn_dim", "num_attention_heads", "attention_head_dim"):
            raise GrowError(f"--grow-dit {key}: only depth grows function-preservingly (RMSNorm's eps does not "
                            "scale with a zero-padded width); grow num_layers")
        else:
            raise GrowError(f"--grow-dit {spec!r}: unknown key {key!r}; known: num_layers, init")
    if "num_layers" not in out:
        raise GrowError(f"--grow-dit {spec!r}: name the new depth, num_layers=N")
    if out["num_layers"] <= have_layers:
        raise GrowError(f"--grow-dit num_layers={out['num_layers']}: the checkpoint's DiT has {have_layers} blocks; "
                        f"growing needs more than that")
    return out


def layer_plan(old: int, new: int) -> list[tuple[int, bool]]:
    """Per block of the grown stack, (the old block it comes from or follows, whether it is new)."""
    added, plan = new - old, []
    for i in range(old):
        plan.append((i, False))
        plan += [(i, True)] * ((i + 1) * added // old - i * added // old)
    return plan


def grow_dit(weights: dict[str, torch.Tensor], config: dict, num_layers: int, init: str = "copy",
             seed: int | None = None) -> tuple[dict[str, torch.Tensor], dict, dict]:
    """The DiT ``weights`` of shape ``config`` grown to ``num_layers`` blocks (see the module docstring): the grown
    state dict, its config, and what was done (``from`` / ``to`` layer counts, the new blocks' indices, the init, the
    zeroed parameters) for the state's ``seeded_from``."""
    from diffusers import MiniMaxH3Transformer3DModel

    from h3.tiny_trained import INIT_SEED

    old = int(config["num_layers"])
    if num_layers <= old:
        raise GrowError(f"grow to {num_layers} blocks: the DiT has {old}; growing needs more")
    if init not in INITS:
        raise GrowError(f"grow init {init!r}: one of {', '.join(INITS)}")
    suffixes = sorted(k[len(f"{BLOCKS}0."):] for k in weights if k.startswith(f"{BLOCKS}0."))
    zeroed = [s for s in suffixes if s.startswith(ZEROED)]
    if {s.split(".")[0] for s in zeroed} != {"attn", "ff"}:  # a diffusers whose block writes through other modules
        raise GrowError(f"the DiT's blocks have no {' / '.join(ZEROED)} output projections (keys {suffixes}): "
                        "this diffusers' block cannot be grown as the identity here")
    grown_config = {**config, "num_layers": num_layers}
    drawn = None
    if init == "fresh":
        rng = torch.random.get_rng_state()
        torch.manual_seed(INIT_SEED if seed is None else seed)
        try:
            drawn = MiniMaxH3Transformer3DModel(**grown_config).state_dict()
        finally:
            torch.random.set_rng_state(rng)
    grown = {k: v.clone() for k, v in weights.items() if not k.startswith(BLOCKS)}
    plan = layer_plan(old, num_layers)
    for position, (source, new) in enumerate(plan):
        for suffix in suffixes:
            value = weights[f"{BLOCKS}{source}.{suffix}"]
            if new and drawn is not None:
                value = drawn[f"{BLOCKS}{position}.{suffix}"].to(value.dtype)
            grown[f"{BLOCKS}{position}.{suffix}"] = torch.zeros_like(value) if new and suffix in zeroed \
                else value.clone()
    info = {"from": {"num_layers": old}, "to": {"num_layers": num_layers},
            "new_blocks": [p for p, (_, new) in enumerate(plan) if new],
            "init": init, **({"copied_from": [s for s, new in plan if new]} if init == "copy" else
                             {"drawn_with_seed": INIT_SEED if seed is None else seed}),
            "zeroed": zeroed}
    return grown, grown_config, info
