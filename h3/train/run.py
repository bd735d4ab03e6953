"""The stages in order, resumable: ``python -m h3.train all --out DIR`` runs what is not done yet.

Stages and their state under ``DIR/state``: video_vae, audio_vae (run side by side on a GPU), pool, dit, distill;
export writes ``DIR/tiny`` (the checkpoint that ships as h3/assets/tiny) with its training record. A slice that runs
out of its wall-clock budget saves its state and exits with :data:`EXIT_RESUME`; the same command continues it. With
``finish_on_budget`` a stage whose budget is spent ends there instead (its record says how many of its planned steps
ran) and the next stage starts: what one device call of 10 minutes needs.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

import torch

from h3.train.common import Budget, TrainConfig, load_state, save_state, write_json

logger = logging.getLogger(__name__)

STAGES = ("video-vae", "audio-vae", "pool", "dit", "distill", "export")
EXIT_RESUME = 75


def components(cfg: TrainConfig) -> dict:
    from h3.tiny_trained import INIT_SEED, init_components, world_tokenizer

    comps = init_components(INIT_SEED, world_tokenizer(build=True))
    for name in ("transformer", "vae", "audio_vae", "text_encoder"):
        comps[name] = comps[name].to(cfg.device)
    return comps


def _stage_state(state_dir: Path, stage: str) -> dict | None:
    return load_state(state_dir / stage.replace("-", "_") / "state.pt", "cpu")


def stage_done(state_dir: Path, stage: str) -> bool:
    if stage == "pool":
        return (state_dir / "pool" / "pool.pt").is_file()
    if stage == "export":
        return False
    state = _stage_state(state_dir, stage)
    return state is not None and state["step"] >= state["total_steps"]


def _cut(state_dir: Path, stage: str) -> None:
    """finish_on_budget: end a stage at the step it reached (the record keeps the planned count too)."""
    path = state_dir / stage.replace("-", "_") / "state.pt"
    state = load_state(path, "cpu")
    state["planned_steps"] = state.get("planned_steps", state["total_steps"])
    state["total_steps"] = state["step"]
    save_state(path, state)


def _load_trained(module, state_dir: Path, stage: str, device) -> None:
    state = load_state(state_dir / stage / "state.pt", device)
    if state is None:
        raise FileNotFoundError(f"{state_dir / stage / 'state.pt'}: run the {stage.replace('_', '-')} stage first")
    module.load_state_dict(state["model"])


def _apply_stats(comps: dict, pool) -> None:
    comps["vae"].register_to_config(latents_mean=list(pool.video_stats[0]), latents_std=list(pool.video_stats[1]))
    comps["audio_vae"].register_to_config(latents_mean=list(pool.audio_stats[0]),
                                          latents_std=list(pool.audio_stats[1]))


def run(stage: str, cfg: TrainConfig, out: Path, *, max_seconds: float | None = None,
        stage_seconds: dict | None = None, stop_after: int | None = None, finish_on_budget: bool = False,
        command: str = "", code_commit: str = "", parallel_vaes: bool | None = None) -> int:
    """Run one stage or ``all``; returns 0 when what was asked is done, :data:`EXIT_RESUME` when a budget ran out."""
    from h3.train.dit import load_ema_into, train_dit
    from h3.train.distill import train_distill
    from h3.train.pool import Pool, build_pool
    from h3.train.vaes import train_audio_vae, train_video_vae

    out = Path(out)
    state_dir = out / "state"
    state_dir.mkdir(parents=True, exist_ok=True)
    write_json(out / "config.json", {"config": cfg.to_dict(), "command": command, "code_commit": code_commit})
    overall = Budget(max_seconds)
    stage_seconds = stage_seconds or {}
    todo = list(STAGES) if stage == "all" else [stage]
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    comps = components(cfg)
    pool = None
    lora = None
    helper = None
    if stage == "all" and parallel_vaes is None:
        parallel_vaes = torch.device(cfg.device).type == "cuda"
    for index, name in enumerate(todo):
        if name != "export" and stage_done(state_dir, name):
            continue
        # What the later stages of this call are budgeted is kept for them (audio-vae runs beside video-vae).
        later = sum(stage_seconds.get(n, 0.0) for n in todo[index + 1:] if n != "audio-vae" or not parallel_vaes)
        seconds = min(overall.left() - later, stage_seconds.get(name, float("inf")))
        budget = Budget(None if seconds == float("inf") else seconds)
        started = time.monotonic()
        logger.info("stage %s (budget %s s)", name, None if seconds == float("inf") else round(seconds))
        if name == "video-vae":
            if parallel_vaes and not stage_done(state_dir, "audio-vae"):
                args = [sys.executable, "-m", "h3.train", "audio-vae", "--out", str(out), "--config",
                        str(out / "config.json")]
                if "audio-vae" in stage_seconds or max_seconds is not None:
                    args += ["--max-seconds", str(min(overall.left(), stage_seconds.get("audio-vae", 1e9)))]
                if finish_on_budget:
                    args.append("--finish-on-budget")
                helper = subprocess.Popen(args)
            result = train_video_vae(comps["vae"], cfg, state_dir, budget, stop_after)
        elif name == "audio-vae":
            if helper is not None:
                helper.wait()
                helper = None
                if stage_done(state_dir, "audio-vae"):
                    continue
            result = train_audio_vae(comps["audio_vae"], cfg, state_dir, budget, stop_after)
        elif name == "pool":
            _load_trained(comps["vae"], state_dir, "video_vae", cfg.device)
            _load_trained(comps["audio_vae"], state_dir, "audio_vae", cfg.device)
            pool = build_pool(comps, cfg)
            pool.save(state_dir / "pool" / "pool.pt")
            result = {"done": True, "seconds": time.monotonic() - started}
        else:
            if pool is None:
                pool = Pool.load(state_dir / "pool" / "pool.pt", cfg.device)
            if name == "dit":
                result = train_dit(comps["transformer"], pool, cfg, state_dir, budget, stop_after)
            elif name == "distill":
                load_ema_into(comps["transformer"], state_dir, cfg.device)
                lora, result = train_distill(comps["transformer"], pool, cfg, state_dir, budget, stop_after)
            else:  # export
                from h3.train.distill import DistillLora
                from h3.train.export import environment, export_checkpoint

                for module, st in (("vae", "video_vae"), ("audio_vae", "audio_vae")):
                    _load_trained(comps[module], state_dir, st, cfg.device)
                _apply_stats(comps, pool)
                load_ema_into(comps["transformer"], state_dir, cfg.device)
                if lora is None:
                    lora = DistillLora(comps["transformer"], cfg.lora_rank, cfg.lora_adaln_rank).to(cfg.device)
                    lora.load_state_dict(load_state(state_dir / "distill" / "state.pt", cfg.device)["lora"])
                record = training_record(cfg, state_dir, command, code_commit, environment(cfg.device))
                target = export_checkpoint(comps, lora, out, record)
                logger.info("exported %s", target)
                result = {"done": True}
        logger.info("stage %s: %s in %.1f s", name, "done" if result["done"] else "paused",
                    time.monotonic() - started)
        if not result["done"]:
            if finish_on_budget and name not in ("pool", "export"):
                _cut(state_dir, name)
                continue
            return EXIT_RESUME
    if helper is not None:
        helper.wait()
    return 0


def training_record(cfg: TrainConfig, state_dir: Path, command: str, code_commit: str, env: dict) -> dict:
    from h3.world.scene import HELD_OUT_PAIRS

    stages, losses = {}, {}
    for name in ("video_vae", "audio_vae", "dit", "distill"):
        state = load_state(state_dir / name / "state.pt", "cpu")
        if state is None:
            continue
        stages[name] = {"steps": state["step"], "planned_steps": state.get("planned_steps", state["total_steps"]),
                        "seconds": round(state["seconds"], 1), "final": state["log"][-1] if state["log"] else None}
        losses[name] = state["log"]
    pool_path = state_dir / "pool" / "pool.pt"
    steps_key = {"video_vae": "video_vae_steps", "audio_vae": "audio_vae_steps", "dit": "dit_steps",
                 "distill": "distill_steps"}
    reproduce = f"python -m h3.train all --out OUT --seed {cfg.seed} --device cuda " + " ".join(
        f"--set {steps_key[name]}={info['steps']}" for name, info in stages.items())
    return {
        "command": command, "reproduce": reproduce, "code_commit": code_commit, "seed": cfg.seed,
        "config": cfg.to_dict(), **env,
        "stages": stages, "losses": losses,
        "pool": {"clips": cfg.pool_size, "keyframe_share": cfg.pool_keyframe_share,
                 "file_bytes": pool_path.stat().st_size if pool_path.is_file() else None},
        "held_out_pairs": sorted(map(list, HELD_OUT_PAIRS)),
        "text_encoder": "frozen: the seeded Qwen3-VL of h3.tiny_trained (token embeddings x EMBED_GAIN); never trained",
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
