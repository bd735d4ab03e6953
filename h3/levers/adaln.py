"""AdaLN modulation precompute: every block's ``adaln_proj`` depends only on the timestep, so its output for each
step of the recipe's schedule is computed once, stored as a per-block table, and the projection's weights (13.0 of
MiniMax-H3's 33.1 B parameters, seed 002) leave the device.

The tables are computed by the model's own modules on the runtime's device, from the same ``timestep`` tensors the
pipeline passes at each step, so the modulation values are bit-identical to the baseline's (seed 002 measured "AdaLN
fusion ... bitwise-identical outputs"), on one platform with MKL's reproducibility mode on (h3/determinism.py: without
it MKL rounds by operand alignment, and the precomputed tables sit at other addresses). A table is selected per forward by the exact timestep values of the call; a
timestep outside the precomputed schedule is an error, never a silent recomputation.

Tables are cached on disk under ``$H3_CACHE_DIR/adaln/``, keyed by the checkpoint hash, the LoRA that shaped the
weights, the dtype, the device type and the schedule.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from h3.levers.base import ApplyContext, LeverConfig, LeverError, LeverHandle, counts, mark_applied, unmark_applied

if TYPE_CHECKING:
    from h3.record import Executed

logger = logging.getLogger(__name__)


class AdalnConfig(LeverConfig):
    """AdaLN modulation precompute: per-block modulation tables for the recipe's schedule, ``adaln_proj`` dropped
    (recipe section ``[adaln]``)."""

    name = "adaln"
    signoff_kind = "exact"  # the judge a change of this lever implies (h3.recipe.lever_differences)
    signoff_why = "precomputed modulation tables: the same computation (seed 002: bitwise-identical)"

    precompute: bool = False
    disk_cache: bool = True
    """Keep the tables under ``$H3_CACHE_DIR/adaln/`` keyed by checkpoint, LoRA and schedule."""

    def is_on(self) -> bool:
        return self.precompute

    def apply(self, pipe, ctx: ApplyContext) -> "AdalnHandle":
        # Both LoRAs change adaln_proj: the tables are keyed by each (file, scale, fused).
        tags = [ctx.handles[name].weights_tag for name in ("lora", "compensation_lora") if name in ctx.handles]
        return apply_adaln_precompute(
            pipe, self, num_inference_steps=ctx.num_inference_steps, model_sha256=ctx.model_sha256,
            weights_tag=";".join(tags), compute_device=ctx.device,
            keep_originals=ctx.reversible, keep_on=ctx.keep_on,
        )

    def check_telemetry(self, telemetry: dict[str, Any], executed: "Executed") -> list[str]:
        """Every block's modulation from its table (projection weights dropped), one table lookup per forward of the
        request, the disk cache used only when configured."""
        (blocks, dropped), problems = counts(telemetry, "blocks", "params_dropped")
        if not problems and (blocks < 1 or dropped < 1):
            problems.append(f"{blocks} blocks precomputed, {dropped} parameters dropped")
        if (telemetry.get("disk_cache") == "off") == self.disk_cache:
            problems.append(f"recipe asks for disk_cache={self.disk_cache}, the lever reported "
                            f"{telemetry.get('disk_cache')!r}")
        if executed.forward_passes > 0:
            (lookups,), missing = counts(telemetry, "table_lookups")
            problems += missing
            if not missing and lookups != executed.forward_passes:
                problems.append(f"{lookups} table lookups in {executed.forward_passes} forwards")
        return problems


class PrecomputedAdaLNModulation(nn.Module):
    """Drop-in for ``MiniMaxH3AdaLayerNormModulation``: returns the six modulation tensors from a table.

    ``table`` is (num_keys, 6, rows, hidden) with rows padded to the widest step; the block only ``index_select``s
    the rows its ``adaln_indices`` address, so padded rows are never read. ``index`` (a 0-d buffer) selects the step,
    updated in place by the transformer's pre-hook, which keeps the module free of Python-side state for compile.
    """

    def __init__(self, table: torch.Tensor, rows: list[int]):
        super().__init__()
        self.register_buffer("table", table, persistent=False)
        self.register_buffer("index", torch.zeros((), dtype=torch.long, device=table.device), persistent=False)
        self.rows = rows

    def forward(self, temb: torch.Tensor) -> tuple[torch.Tensor, ...]:
        chosen = self.table.index_select(0, self.index.view(1))[0]
        return tuple(chosen.unbind(0))


def schedule_timesteps(pipe, num_inference_steps: int, device: torch.device) -> list[torch.Tensor]:
    """The ``timestep`` tensor the t2va pipeline passes at each step, built with the pipeline's own code."""
    from diffusers.modular_pipelines.minimax_h3.before_denoise import MiniMaxH3SetTimestepsStep

    video_sched, audio_sched = pipe.scheduler, pipe.audio_scheduler
    video_sched.set_timesteps(num_inference_steps, device=device)
    audio_sched.set_timesteps(num_inference_steps, device=device)
    # One video row and one audio row, no conditioning rows: the t2va layout reduced to its distinct timesteps.
    video_indices, audio_indices = torch.tensor([0]), torch.tensor([1])
    out = []
    for t, ta in zip(video_sched.timesteps, audio_sched.timesteps):
        unique, _ = MiniMaxH3SetTimestepsStep.build_row_timesteps(
            video_indices, audio_indices, 0, 0, 0, float(t), float(ta),
            max(float(t), pipe.keyframe_noise_aug), 1.0,
        )
        out.append(unique.to(device))
    return out


def _key(timestep: torch.Tensor) -> tuple[float, ...]:
    return tuple(float(v) for v in timestep.detach().flatten().tolist())


class AdalnHandle(LeverHandle):
    name = "adaln"

    def __init__(self, transformer, originals, keys, params_dropped, disk):
        super().__init__()
        self.transformer, self.originals, self.keys = transformer, originals, keys
        self.params_dropped, self.disk = params_dropped, disk
        self.lookups = 0
        self.modules = [block.adaln_proj for block in transformer.transformer_blocks]
        self._hook = transformer.register_forward_pre_hook(self._select, with_kwargs=True)

    def _select(self, _module, args, kwargs):
        timestep = kwargs.get("timestep", args[3] if len(args) > 3 else None)
        key = _key(timestep)
        index = self.keys.get(key)
        if index is None:
            raise LeverError(
                f"AdaLN precompute: timestep {list(key)} is not in the precomputed schedule "
                f"({len(self.keys)} steps); the recipe's step count or the scheduler changed after loading"
            )
        for module in self.modules:
            module.index.fill_(index)
        self.lookups += 1

    def begin_request(self) -> None:
        self.lookups = 0

    def telemetry(self) -> dict[str, Any]:
        return {
            "applied": not self.removed,
            "blocks": len(self.modules),
            "schedule_steps": len(self.keys),
            "params_dropped": self.params_dropped,
            "table_bytes": sum(m.table.numel() * m.table.element_size() for m in self.modules),
            "disk_cache": self.disk,
            "table_lookups": self.lookups,
        }

    def held_tensors(self) -> list[torch.Tensor]:
        return [t for m in self.originals if m is not None for t in (*m.parameters(), *m.buffers())]

    def _remove(self) -> None:
        if any(original is None for original in self.originals):
            raise LeverError("AdaLN precompute dropped the adaln_proj weights (keep_originals=False); reload the model")
        self._hook.remove()
        for block, original in zip(self.transformer.transformer_blocks, self.originals):
            # Back where the table computed (a kept copy may have been parked on the CPU).
            block.adaln_proj = original.to(block.adaln_proj.table.device)
        unmark_applied(self.transformer, "adaln")


def default_cache_dir() -> Path:
    return Path(os.environ.get("H3_CACHE_DIR", Path.home() / ".cache" / "h3")) / "adaln"


def _cache_path(cache_dir: Path | None, model_sha256: str, weights_tag: str, extra_key: dict[str, Any], transformer,
                keys: list[tuple[float, ...]], device) -> Path | None:
    if cache_dir is None:
        return None
    blob = json.dumps(
        {
            "model": model_sha256,
            "weights": weights_tag,
            "dtype": str(next(transformer.transformer_blocks[0].adaln_proj.parameters()).dtype),
            "device": torch.device(device).type,
            "blocks": len(transformer.transformer_blocks),
            "keys": [list(k) for k in keys],
            **extra_key,
        },
        sort_keys=True,
    )
    digest = hashlib.sha256(blob.encode()).hexdigest()
    return Path(cache_dir) / f"{model_sha256[:16]}-{digest[:24]}.pt"


@torch.no_grad()
def apply_adaln_precompute(pipe, config: AdalnConfig, *, num_inference_steps: int, model_sha256: str,
                           weights_tag: str = "", cache_dir: Path | None = None, compute_device: str | None = None,
                           extra_key: dict[str, Any] | None = None, keep_originals: bool = True,
                           keep_on: str | None = "cpu") -> AdalnHandle:
    """Replace every block's ``adaln_proj`` by its table for the recipe's schedule.

    ``num_inference_steps``: diffusers' step count (grid points incl. the terminal zero), as the pipeline passes it.
    ``model_sha256`` (the checkpoint) and ``weights_tag`` (what else changed the weights: LoRA file hash, scale,
    fused) key the disk cache, which lives in ``cache_dir`` (default ``$H3_CACHE_DIR/adaln``; off when
    ``config.disk_cache`` is false). ``compute_device``: where the tables are computed, the device the model runs on,
    so that they match its arithmetic bit for bit (under offloading the weights still sit on the CPU at load time);
    None: the modules' own device. ``keep_originals`` keeps the dropped modules (on ``keep_on``, the CPU by default;
    None: where they are) so that ``remove()`` can restore them; the runtime of one recipe passes False so that the
    weights are freed entirely.
    """
    transformer = pipe.transformer
    blocks = list(transformer.transformer_blocks)
    if not blocks or not all(hasattr(b, "adaln_proj") for b in blocks):
        raise LeverError("AdaLN precompute: this transformer has no per-block adaln_proj")
    first = blocks[0].adaln_proj
    if isinstance(first, PrecomputedAdaLNModulation):
        raise LeverError("lever 'adaln' is already applied to this transformer; remove it first")
    home = next(first.parameters()).device
    device = torch.device(compute_device) if compute_device else home
    steps = schedule_timesteps(pipe, num_inference_steps, device)
    keys: dict[tuple[float, ...], int] = {}
    for t in steps:
        keys.setdefault(_key(t), len(keys))
    unique_steps = {_key(t): t for t in steps}
    mark_applied(transformer, "adaln")
    try:
        directory = (cache_dir or default_cache_dir()) if config.disk_cache else None
        path = _cache_path(directory, model_sha256, weights_tag, extra_key or {}, transformer, list(keys), device)
        tables = None
        disk = "off" if path is None else "miss"
        if path is not None and path.is_file():
            tables = torch.load(path, map_location=device, weights_only=True)
            if len(tables) != len(blocks):
                tables = None
            else:
                disk = "hit"
        if tables is None:
            moved = [transformer.time_embedder, transformer.time_proj] + [b.adaln_proj for b in blocks]
            if device != home:
                for module in moved:
                    module.to(device)
            embedder_dtype = next(transformer.time_embedder.parameters()).dtype
            tembs = [transformer.time_embedder(transformer.time_proj(unique_steps[k]).to(embedder_dtype)) for k in keys]
            rows = max(t.shape[0] for t in tembs) * 3
            tables = []
            for block in blocks:
                per_key = []
                for temb in tembs:
                    six = torch.stack(block.adaln_proj(temb))  # (6, n_rows, hidden)
                    pad = rows - six.shape[1]
                    if pad:
                        six = torch.cat([six, six.new_zeros(6, pad, six.shape[2])], dim=1)
                    per_key.append(six)
                tables.append(torch.stack(per_key))
            if device != home:
                for module in moved:
                    module.to(home)
            if path is not None:
                from h3.atomic import atomic_write_bytes

                buffer = io.BytesIO()
                torch.save([t.cpu() for t in tables], buffer)
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_bytes(path, buffer.getvalue())
        originals, dropped = [], 0
        for block, table in zip(blocks, tables):
            original = block.adaln_proj
            dropped += sum(p.numel() for p in original.parameters())
            originals.append((original.to(keep_on) if keep_on is not None else original) if keep_originals else None)
            block.adaln_proj = PrecomputedAdaLNModulation(table.to(home), rows=[])
        if device.type == "cuda":
            torch.cuda.empty_cache()
    except BaseException:
        unmark_applied(transformer, "adaln")
        raise
    logger.info("AdaLN precompute: %d blocks x %d steps, %d parameters dropped (disk cache %s)",
                len(blocks), len(keys), dropped, disk)
    return AdalnHandle(transformer, originals, keys, dropped, disk)
