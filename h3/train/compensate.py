"""Stage 6: the sparse-attention compensation LoRA (seed 000's SLA recipe pairs 85 % sparsity with "a specially trained
LoRA to compensate for sparsification").

The student is the 4-step one of the distill stage (the DiT with the distilled LoRA, both frozen) attending
block-sparsely on every step, as the ``sparse_attention`` lever routes at inference (``compensate_block_size``,
``compensate_sparsity``, no dense step, the query rows of ``compensate_streams`` only: the lever's ``streams``); a second :class:`~h3.train.lora.DistillLora`, starting from zero (B = 0: the
uncompensated sparse student), is trained on the distillation's teacher set and objective (:func:`h3.train.distill.
fit_lora`). It ships beside the turbo LoRA as ``lora/sparse<percent>-tiny.safetensors``, in the same format, its
file naming the block size, sparsity and token streams it was trained for and the LoRA it compensates (its tensors' sha256); the
``compensation_lora`` lever loads it as a second adapter. ``compensate_steps`` 0 (the default) skips the stage.
"""

from __future__ import annotations

import logging
from pathlib import Path

from h3.train.common import Budget, Dist, TrainConfig, load_state
from h3.train.dit import Batches
from h3.train.distill import LoraPlan, fit_lora, load_teacher_set
from h3.train.lora import DistillLora
from h3.train.pool import Pool

logger = logging.getLogger(__name__)


def compensation_file(cfg: TrainConfig) -> str:
    """The shipped name of the compensation LoRA, from the sparsity it compensates (0.85: sparse85-tiny)."""
    return f"lora/sparse{round(cfg.compensate_sparsity * 100)}-tiny.safetensors"


def compensation_routing(cfg: TrainConfig):
    """The ``sparse_attention`` lever's config the compensation trains under (every step sparse), validated as a
    recipe's is: an unknown token stream in ``compensate_streams`` is refused here, before any training."""
    from h3.levers.sparse_attention import SparseAttentionConfig

    return SparseAttentionConfig(enabled=True, block_size=cfg.compensate_block_size,
                                 sparsity=cfg.compensate_sparsity, dense_steps=0, streams=list(cfg.compensate_streams))


def compensation_metadata(cfg: TrainConfig, compensates: str) -> dict[str, str]:
    """What the file states besides the network alpha: the routing it was trained under (its token streams
    included), the LoRA it sits on."""
    from h3.levers.compensation_lora import COMPENSATES_KEY, ROUTING_KEYS, STREAMS_KEY

    routing = compensation_routing(cfg)
    return {ROUTING_KEYS["block_size"]: str(routing.block_size),
            ROUTING_KEYS["sparsity"]: repr(routing.sparsity), ROUTING_KEYS["dense_steps"]: "0",
            STREAMS_KEY: ",".join(routing.streams), COMPENSATES_KEY: compensates}


def train_compensation(transformer, pool: Pool, cfg: TrainConfig, out: Path, budget: Budget,
                       stop_after: int | None = None, dist: Dist | None = None) -> tuple[DistillLora, dict]:
    """``transformer`` holds the teacher weights; the distill stage's LoRA is attached frozen under the trained one.
    Returns the compensation LoRA (detached) and the log."""
    dist = dist or Dist()
    routing = compensation_routing(cfg)
    distilled = load_state(out / "distill" / "state.pt", cfg.device)
    if distilled is None or distilled["step"] < distilled["total_steps"]:
        raise FileNotFoundError(f"{out / 'distill' / 'state.pt'}: the compensation LoRA needs the distill stage "
                                "finished (the LoRA it compensates)")
    transformer.requires_grad_(False)
    transformer.eval()
    groups = load_teacher_set(transformer, pool, cfg, out, dist)
    base = DistillLora(transformer, cfg.lora_rank, cfg.lora_adaln_rank, seed=cfg.seed).to(cfg.device)
    base.load_state_dict(distilled["lora"])
    base.requires_grad_(False)
    lora = DistillLora(transformer, cfg.lora_rank, cfg.lora_adaln_rank, seed=cfg.seed + 1).to(cfg.device)
    plan = LoraPlan(stage="compensate", steps=cfg.compensate_steps, lr=cfg.compensate_lr,
                    lr_final=cfg.compensate_lr_final, lr_steps=cfg.compensate_lr_steps,
                    sparse=(routing.block_size, routing.sparsity, tuple(routing.streams)),
                    record={"block_size": routing.block_size, "sparsity": routing.sparsity,
                            "streams": list(routing.streams)})
    base.attach(transformer)
    try:
        result = fit_lora(transformer, lora, groups, Batches(pool, cfg), cfg, out / "compensate" / "state.pt", plan,
                          budget, stop_after, dist)
    finally:
        base.detach()
    return lora, result
