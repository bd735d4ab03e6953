"""The stages in order, resumable: ``python -m h3.train all --out DIR`` runs what is not done yet.

Stages and their state under ``DIR/state``: video_vae, video_decoder (the shipped decoder on the frozen encoder: on
a GPU it trains in a second process beside the audio-vae, pool, dit and distill stages, which do not depend on it),
audio_vae (on a GPU beside video_vae when both train in one call), audio_decoder (the audio-vae stage's decoder
continued on whole clips, its encoder frozen: on a GPU in its own process beside the pool, dit and distill stages),
pool, dit, distill, compensate (the sparse-attention compensation LoRA; skipped unless ``compensate_steps``); export
writes ``DIR/tiny``
(the checkpoint that ships as h3/assets/tiny) with its training record. A slice that runs out of its wall-clock budget saves its state and exits with :data:`EXIT_RESUME`; the same command continues it. With
``finish_on_budget`` a stage whose budget is spent ends there instead (its record says how many of its planned steps
ran) and the next stage starts: what one device call of 10 minutes needs.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from h3.train.common import DIT_SHAPE_SETTINGS, Budget, Dist, TrainConfig, load_state, save_state, write_json

logger = logging.getLogger(__name__)

STAGES = ("video-vae", "video-decoder", "audio-vae", "audio-decoder", "pool", "dit", "distill", "compensate", "export")
EXIT_RESUME = 75


def components(cfg: TrainConfig) -> dict:
    from h3.tiny_trained import INIT_SEED, init_components, world_tokenizer

    comps = init_components(INIT_SEED, world_tokenizer(build=True), cfg.transformer_config())
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


def gpu_count(cfg: TrainConfig) -> int:
    return torch.cuda.device_count() if torch.device(cfg.device).type == "cuda" else 0


def stage_ranks(cfg: TrainConfig) -> int:
    """How many data-parallel ranks the dit and distill stages get: ``cfg.ranks``, at most one per GPU on CUDA (a
    CPU run with ranks > 1 uses gloo: the CPU test of the torchrun path)."""
    if torch.device(cfg.device).type == "cuda":
        return max(1, min(cfg.ranks, gpu_count(cfg)))
    return max(1, cfg.ranks)


def _torchrun(stage: str, ranks: int, out: Path, deadline: float | None, stop_after: int | None,
              finish_on_budget: bool) -> int:
    """Run one stage as ``ranks`` torchrun processes (one per GPU) and wait for them."""
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", "-m",
            "h3.train", stage, "--out", str(out), "--config", str(out / "config.json")]
    if deadline is not None:
        args += ["--deadline", repr(deadline)]
    if stop_after is not None:
        args += ["--stop-after", str(stop_after)]
    if finish_on_budget:
        args.append("--finish-on-budget")
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "4"))
    logger.info("stage %s: %d ranks: %s", stage, ranks, " ".join(args))
    return subprocess.run(args, env=env).returncode


def _stage_process(stage: str, out: Path, device: str | None, max_seconds: float | None,
                   finish_on_budget: bool) -> subprocess.Popen:
    """Start one stage as its own ``python -m h3.train`` process beside this one (same run folder and config). Its
    budget is passed as a wall-clock deadline, so that the new process's start-up (imports, components: ~10 s on a
    GPU host) counts against it: a helper given ``max_seconds`` from its own start ended that much after this process
    expected, and the export that waits for it ran past the call's end (run 5's first call)."""
    args = [sys.executable, "-m", "h3.train", stage, "--out", str(out), "--config", str(out / "config.json"),
            "--beside"]
    if device is not None:
        args += ["--device", device]
    if max_seconds is not None:
        args += ["--deadline", repr(time.time() + max_seconds)]
    if finish_on_budget:
        args.append("--finish-on-budget")
    return subprocess.Popen(args)


class StageProcessError(RuntimeError):
    """A stage that ran in its own process beside this one failed."""


def _wait_stage(stage: str, process: subprocess.Popen) -> int:
    """Wait for a stage's own process; its exit code when it ended done (0) or paused on its budget
    (:data:`EXIT_RESUME`). Any other code is an error naming the stage: the export must not ship the narrow decoder,
    or this process train a stage again, in place of one that crashed."""
    code = process.wait()
    if code not in (0, EXIT_RESUME):
        raise StageProcessError(f"stage {stage} (its own process, pid {process.pid}) exited with code {code}; "
                                "its output above says why")
    return code


def check_dit_shape(transformer, state_dir: Path) -> None:
    """A run continues a DiT state only with the shape it was trained with: a different ``--set dit_*`` (or none, for
    a widened run) is one error naming the shapes, before any stage loads the state."""
    path = state_dir / "dit" / "state.pt"
    state = load_state(path, "cpu")
    if state is None:
        return
    want = {k: tuple(v.shape) for k, v in transformer.state_dict().items()}
    have = {k: tuple(v.shape) for k, v in state["model"].items()}
    if want != have:
        config = dict(transformer.config)
        asked = ", ".join(f"{k}={config[k]}" for k in DIT_SHAPE_SETTINGS)
        raise ValueError(f"{path}: the DiT state was trained with another shape than this run's ({asked}; "
                         f"{len(set(want) ^ set(have))} tensors differ by name, "
                         f"{sum(want[k] != have[k] for k in set(want) & set(have))} by shape): continue it with the "
                         f"--set {' / '.join(DIT_SHAPE_SETTINGS.values())} it was trained with")


def _apply_stats(comps: dict, pool) -> None:
    comps["vae"].register_to_config(latents_mean=list(pool.video_stats[0]), latents_std=list(pool.video_stats[1]))
    comps["audio_vae"].register_to_config(latents_mean=list(pool.audio_stats[0]),
                                          latents_std=list(pool.audio_stats[1]))


def _prepare(cfg: TrainConfig, out: Path, beside: bool, command: str, code_commit: str) -> Dist:
    """What :func:`run` does before any stage: refuse the settings a later stage would refuse (before anything is
    written or trained), make the state folder, join the ranks (each on its GPU; only rank 0 logs below warnings),
    write the run's config.json (a single process not started beside an ``all`` run), and set the matmul flags."""
    from h3.train.export import EXPORT_DTYPES

    if cfg.export_dit_dtype not in EXPORT_DTYPES:
        raise ValueError(f"export_dit_dtype must be one of {', '.join(EXPORT_DTYPES)}, got {cfg.export_dit_dtype!r}")
    cfg.transformer_config()
    (out / "state").mkdir(parents=True, exist_ok=True)
    dist = Dist.from_env()
    if dist.world > 1:
        if torch.device(cfg.device).type == "cuda":
            cfg.device = f"cuda:{int(os.environ.get('LOCAL_RANK', dist.rank))}"
        if not dist.main:
            logging.getLogger().setLevel(logging.WARNING)
    elif not beside:
        write_json(out / "config.json", {"config": cfg.to_dict(), "command": command, "code_commit": code_commit})
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True  # fixed shapes per stage: pick the fastest 3-D convolution once
    return dist


def _pool_stage(comps: dict, cfg: TrainConfig, state_dir: Path):
    """The pool stage: the trained VAEs encode the pool (on every GPU there is), saved into the state folder."""
    from h3.train.pool import build_pool, latent_stats_of

    _load_trained(comps["vae"], state_dir, "video_vae", cfg.device)
    _load_trained(comps["audio_vae"], state_dir, "audio_vae", cfg.device)
    devices = [cfg.device] if gpu_count(cfg) < 2 else [f"cuda:{i}" for i in range(gpu_count(cfg))]
    # a DiT that continues keeps the latent statistics it trained with (a pool drawn otherwise has others)
    kept = latent_stats_of(load_state(state_dir / "dit" / "state.pt", "cpu"))
    if kept is not None:
        logger.info("pool: normalized with the latent statistics the DiT trained with")
    pool = build_pool(comps, cfg, devices=devices, stats=kept)
    pool.save(state_dir / "pool" / "pool.pt")
    return pool


def _decoder_stage(name: str, cfg: TrainConfig, state_dir: Path, budget: Budget, stop_after: int | None) -> dict:
    """The audio-decoder or video-decoder stage in this process, from the audio-vae or video-vae stage's state."""
    from h3.train.vaes import audio_decoder_vae, train_audio_decoder, train_video_decoder, wide_vae

    if name == "audio-decoder":
        audio_state = load_state(state_dir / "audio_vae" / "state.pt", "cpu")
        if audio_state is None:
            raise FileNotFoundError(f"{state_dir / 'audio_vae' / 'state.pt'}: run the audio-vae stage first")
        return train_audio_decoder(audio_decoder_vae(audio_state["model"]).to(cfg.device), cfg, state_dir,
                                   budget, stop_after)
    narrow = load_state(state_dir / "video_vae" / "state.pt", "cpu")
    if narrow is None:
        raise FileNotFoundError(f"{state_dir / 'video_vae' / 'state.pt'}: run the video-vae stage first")
    return train_video_decoder(wide_vae(narrow["model"], cfg.seed).to(cfg.device), cfg, state_dir, budget,
                               stop_after)


def _export_stage(comps: dict, cfg: TrainConfig, out: Path, pool, lora, compensation, command: str,
                  code_commit: str) -> None:
    """The export stage, once the decoder stages have ended: the shipped components (the wide video decoder if its
    stage ran, the audio-decoder stage's audio VAE if it ran, the DiT's EMA), the LoRAs (this process's, else the
    states'), and the training record, exported by :func:`h3.train.export.export_checkpoint`."""
    from h3.train.dit import load_ema_into
    from h3.train.distill import DistillLora
    from h3.train.export import environment, export_checkpoint
    from h3.train.vaes import wide_vae

    state_dir = out / "state"
    decoder = load_state(state_dir / "video_decoder" / "state.pt", cfg.device)
    if decoder is not None:  # the shipped decoder (a run without the stage ships the narrow one)
        comps["vae"] = wide_vae(decoder["model"], cfg.seed).to(cfg.device)
        comps["vae"].load_state_dict(decoder["model"])
    else:
        _load_trained(comps["vae"], state_dir, "video_vae", cfg.device)
    # the shipped audio VAE: the audio-decoder stage's (the audio-vae stage's encoder, frozen) if it ran
    audio_stage = "audio_decoder" if (state_dir / "audio_decoder" / "state.pt").is_file() else "audio_vae"
    _load_trained(comps["audio_vae"], state_dir, audio_stage, cfg.device)
    _apply_stats(comps, pool)
    load_ema_into(comps["transformer"], state_dir, cfg.device)
    if lora is None:
        lora = DistillLora(comps["transformer"], cfg.lora_rank, cfg.lora_adaln_rank).to(cfg.device)
        lora.load_state_dict(load_state(state_dir / "distill" / "state.pt", cfg.device)["lora"])
    compensated = load_state(state_dir / "compensate" / "state.pt", cfg.device)
    if compensated is not None and compensation is None:
        compensation = DistillLora(comps["transformer"], cfg.lora_rank, cfg.lora_adaln_rank).to(cfg.device)
        compensation.load_state_dict(compensated["lora"])
    record = training_record(cfg, state_dir, command, code_commit, environment(cfg.device))
    target = export_checkpoint(comps, lora, out, record, compensation, cfg)
    logger.info("exported %s", target)


def _decoder_beside(name: str, cfg: TrainConfig, out: Path, seconds: float, finish_on_budget: bool):
    """A decoder stage started in its own process beside the stages after it, on the last GPU."""
    process = _stage_process(name, out, f"cuda:{gpu_count(cfg) - 1}" if gpu_count(cfg) else cfg.device, seconds,
                             finish_on_budget)
    logger.info("stage %s: beside the next stages, pid %d", name, process.pid)
    return process


def _ranks_stage(name: str, ranks: int, out: Path, budget: Budget, stop_after: int | None,
                 finish_on_budget: bool) -> dict:
    """A dit or distill stage run by ``ranks`` torchrun processes; done when its state says so."""
    end = None if budget.deadline is None else time.time() + budget.left()
    code = _torchrun(name, ranks, out, end, stop_after, finish_on_budget)
    if code != 0:
        raise RuntimeError(f"stage {name}: torchrun exited with {code}")
    return {"done": stage_done(out / "state", name)}


def run(stage: str, cfg: TrainConfig, out: Path, *, max_seconds: float | None = None,
        stage_seconds: dict | None = None, stop_after: int | None = None, finish_on_budget: bool = False,
        command: str = "", code_commit: str = "", parallel_vaes: bool | None = None,
        deadline: float | None = None, beside: bool = False) -> int:
    """Run one stage or ``all``; returns 0 when what was asked is done, :data:`EXIT_RESUME` when a budget ran out.

    ``deadline`` (a ``time.time()`` value) ends the whole run at that wall-clock moment, whenever it started: what the
    torchrun ranks of a stage get, so that their start-up counts against the stage's budget. ``beside``: this process
    is a stage that an ``all`` run started beside itself (:func:`_stage_process`); the run's config.json is that run's
    and is left as it is (the stage's own ``--device`` would otherwise land in it)."""
    from h3.train.compensate import train_compensation
    from h3.train.dit import load_ema_into, train_dit
    from h3.train.distill import train_distill
    from h3.train.pool import Pool
    from h3.train.vaes import train_audio_vae, train_video_vae

    out = Path(out)
    state_dir = out / "state"
    dist = _prepare(cfg, out, beside, command, code_commit)
    if deadline is not None:  # the whole run ends then, whenever it started
        max_seconds = min(x for x in (max_seconds, deadline - time.time()) if x is not None)
    overall = Budget(max_seconds)
    stage_seconds = stage_seconds or {}
    todo = list(STAGES) if stage == "all" else [stage]
    ranks = stage_ranks(cfg) if dist.world == 1 else dist.world
    comps = components(cfg)
    if not beside and any(n in todo for n in ("dit", "distill", "compensate", "export")):
        check_dit_shape(comps["transformer"], state_dir)
    pool = lora = compensation = helper = None
    decoder_helpers: dict = {}  # stage -> its process beside the next stages (video-decoder, audio-decoder)
    if stage == "all" and parallel_vaes is None:
        parallel_vaes = torch.device(cfg.device).type == "cuda"
    beside = ("audio-vae", "video-decoder", "audio-decoder") if parallel_vaes else ()
    for index, name in enumerate(todo):
        if name != "export" and stage_done(state_dir, name) or (name == "compensate" and not cfg.compensate_steps):
            continue
        # What the later stages of this call are budgeted is kept for them (audio-vae runs beside video-vae, the
        # video decoder beside the stages after it).
        later = sum(stage_seconds.get(n, 0.0) for n in todo[index + 1:] if n not in beside)
        seconds = min(overall.left() - later, stage_seconds.get(name, float("inf")))
        budget = Budget(None if seconds == float("inf") else seconds)
        started = time.monotonic()
        logger.info("stage %s (budget %s s)", name, None if seconds == float("inf") else round(seconds))
        if name == "video-vae":
            if parallel_vaes and not stage_done(state_dir, "audio-vae"):  # beside it, on its own GPU
                limited = "audio-vae" in stage_seconds or max_seconds is not None
                helper = _stage_process("audio-vae", out, "cuda:1" if gpu_count(cfg) > 1 else None, min(
                    overall.left(), stage_seconds.get("audio-vae", 1e9)) if limited else None, finish_on_budget)
            result = train_video_vae(comps["vae"], cfg, state_dir, budget, stop_after)
        elif name == "audio-vae":
            if helper is not None:
                _wait_stage("audio-vae", helper)
                helper = None
                if stage_done(state_dir, "audio-vae"):
                    continue
            result = train_audio_vae(comps["audio_vae"], cfg, state_dir, budget, stop_after)
        elif name == "pool":
            pool = _pool_stage(comps, cfg, state_dir)
            result = {"done": True, "seconds": time.monotonic() - started}
        elif name in ("video-decoder", "audio-decoder") and parallel_vaes:
            # Its own process beside the stages after it (on the last GPU); it must end before the export.
            export = stage_seconds.get("export", 0.0) if "export" in todo[index + 1:] else 0.0
            decoder_helpers[name] = _decoder_beside(name, cfg, out, min(overall.left() - export,
                                                                        stage_seconds.get(name, 1e9)), finish_on_budget)
            continue
        elif name in ("audio-decoder", "video-decoder"):
            result = _decoder_stage(name, cfg, state_dir, budget, stop_after)
        elif name in ("dit", "distill") and ranks > 1 and dist.world == 1:
            pool = None  # the ranks load it themselves; free this process's copy
            result = _ranks_stage(name, ranks, out, budget, stop_after, finish_on_budget)
        else:
            if pool is None:
                pool = Pool.load(state_dir / "pool" / "pool.pt", cfg.device)
            if name == "dit":
                result = train_dit(comps["transformer"], pool, cfg, state_dir, budget, stop_after, dist)
            elif name == "distill":
                load_ema_into(comps["transformer"], state_dir, cfg.device)
                lora, result = train_distill(comps["transformer"], pool, cfg, state_dir, budget, stop_after, dist)
            elif name == "compensate":
                load_ema_into(comps["transformer"], state_dir, cfg.device)
                compensation, result = train_compensation(comps["transformer"], pool, cfg, state_dir, budget,
                                                          stop_after, dist)
            else:  # export
                paused = [n for n, process in decoder_helpers.items() if _wait_stage(n, process) == EXIT_RESUME]
                decoder_helpers.clear()
                if paused:  # the same command continues them, then exports
                    logger.info("stage export: waits for %s, paused on its budget", ", ".join(paused))
                    return EXIT_RESUME
                _export_stage(comps, cfg, out, pool, lora, compensation, command, code_commit)
                result = {"done": True}
        logger.info("stage %s: %s in %.1f s", name, "done" if result["done"] else "paused", time.monotonic() - started)
        if not result["done"]:
            if finish_on_budget and name not in ("pool", "export"):
                if dist.main:
                    _cut(state_dir, name)
                dist.barrier()
                continue
            # A torchrun rank exits 0 (a non-zero rank makes torchrun stop the others); the parent reads the state.
            return _wait_beside(helper, decoder_helpers, EXIT_RESUME if dist.world == 1 else 0)
    return _wait_beside(helper, decoder_helpers, 0)


def _wait_beside(helper, decoder_helpers: dict, code: int) -> int:
    """Before this process returns ``code``, wait for the stages still running beside it (each ends on its own
    deadline): none outlives the command, so its next run never starts a second copy of one. A stage that paused on
    its budget makes the run's code :data:`EXIT_RESUME`."""
    codes = [_wait_stage("audio-vae", helper)] if helper is not None else []
    codes += [_wait_stage(name, process) for name, process in decoder_helpers.items()]
    return EXIT_RESUME if EXIT_RESUME in codes else code


def reproduce_line(cfg: TrainConfig, stages: dict) -> str:
    """The one command that repeats a run: its seed, every setting that differs from TrainConfig's defaults (the
    device aside), and each stage's step count as it ran (TrainConfig's ``<stage>_steps``). A stage that its budget
    ended before its plan keeps the plan for its learning rate's cosine (``distill_lr_steps`` / ``dit_lr_steps``)."""
    defaults = TrainConfig().to_dict()
    steps = {f"{name}_steps": info["steps"] for name, info in stages.items()}
    settings = {k: v for k, v in cfg.to_dict().items()
                if k not in ("seed", "device", *steps) and v != defaults.get(k)}
    for stage in ("distill", "compensate"):
        ran = stages.get(stage)
        if ran and getattr(cfg, f"{stage}_lr_final") < 1.0 and ran["steps"] < ran["planned_steps"] \
                and getattr(cfg, f"{stage}_lr_steps") is None:
            steps[f"{stage}_lr_steps"] = ran["planned_steps"]
    dit = stages.get("dit")
    if dit and cfg.dit_lr_final < 1.0 and dit["steps"] < dit["planned_steps"] and cfg.dit_lr_steps is None:
        steps["dit_lr_steps"] = dit["planned_steps"]  # a cosine from scratch (a continued one states its plan)

    def text(value) -> str:  # what __main__'s --set reads back: JSON for everything but strings
        return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))

    return f"python -m h3.train all --out OUT --seed {cfg.seed} --device cuda " + " ".join(
        f"--set {k}={text(v)}" for k, v in {**settings, **steps}.items())


def training_record(cfg: TrainConfig, state_dir: Path, command: str, code_commit: str, env: dict) -> dict:
    from h3.world.scene import HELD_OUT_PAIRS

    stages, losses, seeded = {}, {}, {}
    for name in ("video_vae", "audio_vae", "video_decoder", "audio_decoder", "dit", "distill", "compensate"):
        state = load_state(state_dir / name / "state.pt", "cpu")
        if state is None:
            continue
        if "seeded_from" in state:
            seeded[name] = {**state["seeded_from"], "warm_from": state.get("warm_from")}
        stages[name] = {"steps": state["step"], "planned_steps": state.get("planned_steps", state["total_steps"]),
                        "seconds": round(state["seconds"], 1), "final": state["log"][-1] if state["log"] else None,
                        **({"init_from": state["init_from"]} if state.get("init_from") else {}),
                        **{k: state[k] for k in ("teacher_samples", "teacher_presentations", "block_size",
                                                 "sparsity") if k in state}}
        losses[name] = state["log"]
    pool_path = state_dir / "pool" / "pool.pt"
    reproduce = reproduce_line(cfg, stages)
    return {
        "command": command, "reproduce": reproduce, "code_commit": code_commit, "seed": cfg.seed,
        "config": cfg.to_dict(), **env,
        "stages": stages, "losses": losses,
        # Stages continued from an exported checkpoint (h3.train.travel.seed_from_checkpoint): the reproduce line's
        # step counts are those of an uninterrupted run, which this one approximates (AdamW restarted there).
        **({"seeded_from_checkpoint": seeded} if seeded else {}),
        "pool": {"clips": cfg.pool_size, "keyframe_share": cfg.pool_keyframe_share,
                 "file_bytes": pool_path.stat().st_size if pool_path.is_file() else None},
        "held_out_pairs": sorted(map(list, HELD_OUT_PAIRS)),
        "text_encoder": "frozen: the seeded Qwen3-VL of h3.tiny_trained (token embeddings x EMBED_GAIN); never trained",
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
