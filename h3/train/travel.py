"""The training state that travels from one device call to the next: ``python -m h3.train pack`` / ``unpack``.

A lent device call carries at most 64 MiB (the code snapshot, about 22 MiB of wheels, and the state of the call
before) and returns at most 8 files of 16 MiB. A run's ``state/`` after one call on two H200s is 47.1 MB (run 3,
bench/tiny_training/results/tiny_train_h200.md: video VAE 19.7, audio VAE 1.7, DiT 23.9, distill 1.8), two thirds of it AdamW
moments, so it cannot travel beside the wheels as it is. A pack holds each stage's ``state.pt`` (not the latent pool,
which every call rebuilds from the seed, nor the distillation's teacher set, which is rebuilt from the DiT) with

- the weights, the DiT's EMA, the step counts and the loss logs exactly (what the next stage, the export and a
  continuation read);
- the optimizer moments (``exp_avg``, ``exp_avg_sq``) as chosen by ``moments``: ``"bf16"`` (the default) rounds them
  to bfloat16, ``"fp32"`` keeps them exactly, ``"drop"`` leaves them out for a stage at its total step count (a
  budget-ended one too, which then can no longer be continued; an unfinished stage keeps them in bfloat16).

Every tensor's bytes are regrouped by significance (byte planes: the sign/exponent byte of trained float32 weights
compresses, the low mantissa bytes do not) and each stage is zlib-compressed. Run 3's 47.1 MB of states pack into
25.6 MB with ``"bf16"``, 39.0 MB with ``"fp32"`` and 16.6 MB with ``"drop"`` (bench/tiny_training/results/tiny_train_h200.md).

The cost of ``"bf16"``: at each resume every moment is rounded once to 8 significant bits (relative error at most
2^-8), so AdamW's next updates, ``m / (sqrt(v) + eps)``, read an ``m`` off by at most 0.4% and a ``sqrt(v)`` off by at
most 0.2% of the uninterrupted run's, a difference that fades with the moments' decay (beta1 0.9, beta2 0.99: some
100 steps). The weights are untouched. A resume from a ``"bf16"`` pack is therefore not bit-identical to an
uninterrupted run; one from an ``"fp32"`` pack is (tests/test_train.py checks both). Re-packing a bf16-rounded moment
is exact, so a stage that a call does not touch loses nothing more from one call to the next.

A pack is a tar archive: ``manifest.json`` (format, version, per stage its file, size, sha256, steps and how its
moments travel) and one ``<stage>.pt.z`` per stage. :func:`unpack_state` checks all of it before it writes anything.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import os
import pickle
import shutil
import tarfile
import time
import zlib
from pathlib import Path

import torch

from h3.train.common import load_state, save_state

logger = logging.getLogger(__name__)

FORMAT = "h3.train state pack"
VERSION = 1
MOMENTS = ("bf16", "fp32", "drop")
PACKED_STAGES = ("video_vae", "audio_vae", "video_decoder", "audio_decoder", "dit", "distill")
"""Stage folders under ``state/`` that travel, in training order."""
DEPENDENTS = {"video-vae": ("pool", "video_decoder", "dit", "distill"),
              "audio-vae": ("pool", "audio_decoder", "dit", "distill"),
              "video-decoder": (), "audio-decoder": (), "dit": ("distill",), "distill": ()}
"""What a continued stage invalidates: the pool is encoded by both VAEs, each decoder decodes its VAE's encoder, the
DiT trains on the pool, the distillation's teacher is the DiT."""
_TENSOR = "__h3_tensor__"


class PackError(ValueError):
    """A pack or a state folder that cannot be used as asked (bad input: the CLI exits 3)."""


def _encode(obj):
    if torch.is_tensor(obj):
        flat = obj.detach().cpu().contiguous().reshape(-1)
        planes = flat.view(torch.uint8).reshape(-1, flat.element_size()).t().contiguous()
        return {_TENSOR: str(obj.dtype).removeprefix("torch."), "shape": list(obj.shape), "planes": planes}
    if isinstance(obj, dict):
        return {k: _encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_encode(v) for v in obj)
    return obj


def _decode(obj):
    if isinstance(obj, dict) and _TENSOR in obj:
        dtype = getattr(torch, obj[_TENSOR], None)
        if not isinstance(dtype, torch.dtype):
            raise PackError(f"unknown tensor dtype {obj[_TENSOR]!r}")
        planes = obj["planes"]
        return planes.t().contiguous().reshape(-1).view(dtype).reshape(obj["shape"])
    if isinstance(obj, dict):
        return {k: _decode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_decode(v) for v in obj)
    return obj


def _round_moments(opt: dict) -> dict:
    """The optimizer state with every floating-point moment (not the scalar step counts) in bfloat16."""
    state = {idx: {k: (v.to(torch.bfloat16) if torch.is_tensor(v) and v.is_floating_point() and v.dim() > 0 else v)
                   for k, v in per.items()} for idx, per in opt["state"].items()}
    return {**opt, "state": state}


def _widen_moments(opt: dict) -> dict:
    state = {idx: {k: (v.float() if torch.is_tensor(v) and v.dtype == torch.bfloat16 else v) for k, v in per.items()}
             for idx, per in opt["state"].items()}
    return {**opt, "state": state}


def _finished(state: dict) -> bool:
    return state["step"] >= state["total_steps"]


def parse_moments(spec: str) -> dict[str, str]:
    """``"bf16"`` or a default and per-stage choices, ``"bf16,video_vae=drop,audio_vae=drop"``: each stage's mode."""
    modes, default = {}, None
    for item in filter(None, (part.strip() for part in spec.split(","))):
        stage, eq, mode = item.rpartition("=")
        if mode not in MOMENTS or (eq and stage not in PACKED_STAGES) or (not eq and default is not None):
            raise PackError(f"moments={spec!r}: give one of {', '.join(MOMENTS)}, then STAGE=MODE for any of "
                            f"{', '.join(PACKED_STAGES)}")
        if eq:
            modes[stage] = mode
        else:
            default = mode
    return {stage: modes.get(stage, default or "bf16") for stage in PACKED_STAGES}


def pack_state(state_dir: Path, dest: Path, moments: str = "bf16") -> dict:
    """Write the stages' states under ``state_dir`` into the pack ``dest`` (atomically); returns its manifest.
    ``moments``: see :func:`parse_moments` (a finished stage's can be dropped: one whose budget ended and that the
    next call does not continue)."""
    modes = parse_moments(moments)
    state_dir, dest = Path(state_dir), Path(dest)
    members, manifest = {}, {"format": FORMAT, "version": VERSION, "moments": moments, "stages": {},
                             "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    for stage in PACKED_STAGES:
        state = load_state(state_dir / stage / "state.pt", "cpu")
        if state is None:
            continue
        how, mode = "fp32", modes[stage]
        if "opt" not in state:
            how = "dropped"
        elif mode == "drop" and _finished(state):
            state = {k: v for k, v in state.items() if k != "opt"}
            how = "dropped"
        elif mode != "fp32":
            state = {**state, "opt": _round_moments(state["opt"])}
            how = "bf16"
        buf = io.BytesIO()
        torch.save(_encode(state), buf)
        data = zlib.compress(buf.getvalue(), 6)
        name = f"{stage}.pt.z"
        members[name] = data
        manifest["stages"][stage] = {
            "file": name, "bytes": len(data), "raw_bytes": (state_dir / stage / "state.pt").stat().st_size,
            "sha256": hashlib.sha256(data).hexdigest(), "step": int(state["step"]),
            "total_steps": int(state["total_steps"]),
            "planned_steps": int(state.get("planned_steps", state["total_steps"])), "moments": how}
    if not members:
        raise PackError(f"{state_dir}: no stage state to pack (looked for {', '.join(PACKED_STAGES)})")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    with tarfile.open(tmp, "w") as tar:
        for name, data in [("manifest.json", json.dumps(manifest, indent=1).encode())] + list(members.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, dest)
    return manifest


def _read_pack(src: Path) -> tuple[dict, dict[str, dict]]:
    """The manifest and every stage's decoded state, all checked; raises :class:`PackError` naming what is wrong."""
    src = Path(src)
    if not src.is_file():
        raise PackError(f"{src}: no such pack")
    try:
        with tarfile.open(src, "r:") as tar:
            files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise PackError(f"{src}: not a readable state pack ({exc}); was every part concatenated?") from exc
    try:
        manifest = json.loads(files.pop("manifest.json"))
    except (KeyError, ValueError) as exc:
        raise PackError(f"{src}: no readable manifest.json ({exc})") from exc
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise PackError(f"{src}: not a {FORMAT} version {VERSION} (format {manifest.get('format')!r}, "
                        f"version {manifest.get('version')!r})")
    stages = manifest.get("stages")
    if not isinstance(stages, dict) or not stages or set(stages) - set(PACKED_STAGES):
        raise PackError(f"{src}: the manifest's stages {sorted(stages or {})} are not among {PACKED_STAGES}")
    if set(files) != {info.get("file") for info in stages.values()}:
        raise PackError(f"{src}: members {sorted(files)} do not match the manifest's "
                        f"{sorted(info.get('file') for info in stages.values())}")
    states = {}
    for stage, info in stages.items():
        data = files[info["file"]]
        if hashlib.sha256(data).hexdigest() != info.get("sha256"):
            raise PackError(f"{src}: {info['file']} does not match its sha256 (a damaged or truncated part?)")
        try:
            state = _decode(torch.load(io.BytesIO(zlib.decompress(data)), map_location="cpu", weights_only=True))
        except PackError:
            raise
        except (zlib.error, pickle.UnpicklingError, RuntimeError, ValueError, EOFError, TypeError, KeyError,
                AttributeError) as exc:
            raise PackError(f"{src}: {info['file']} does not decode ({exc})") from exc
        states[stage] = _check_state(state, f"{src}: {stage}")
    return manifest, states


def _checkpoint_latent_stats(ckpt: Path) -> dict | None:
    """The latent statistics a checkpoint's DiT was trained with: its VAEs' ``latents_mean`` / ``latents_std`` (the
    pipeline normalizes with them); None when a config lacks them (a checkpoint from before they were kept), a
    PackError when one holds a non-finite value or a std that is not positive."""
    out = {}
    for key, folder in (("video", "vae"), ("audio", "audio_vae")):
        try:
            config = json.loads((ckpt / folder / "config.json").read_text())
            pair = [[float(v) for v in config["latents_mean"]], [float(v) for v in config["latents_std"]]]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not all(math.isfinite(v) for part in pair for v in part) or min(pair[1]) <= 0:
            raise PackError(f"{ckpt / folder / 'config.json'}: latents_mean / latents_std must be finite, the std "
                            "positive")
        out[key] = pair
    return out


def _check_state(state, where: str) -> dict:
    if not isinstance(state, dict) or not {"step", "total_steps", "seconds", "log"} <= set(state):
        raise PackError(f"{where}: not a stage state (needs step, total_steps, seconds, log)")
    step, total = state["step"], state["total_steps"]
    planned = state.get("planned_steps", total)
    if not all(isinstance(v, int) and v >= 0 for v in (step, total, planned)) or step > total:
        raise PackError(f"{where}: step counts out of range (step {step!r}, total {total!r}, planned {planned!r})")
    if not isinstance(state["seconds"], (int, float)) or not math.isfinite(state["seconds"]) or state["seconds"] < 0:
        raise PackError(f"{where}: seconds {state['seconds']!r} is not a finite non-negative number")
    for key, value in state.items():
        if key == "opt":
            if not isinstance(value, dict) or not isinstance(value.get("state"), dict):
                raise PackError(f"{where}: its optimizer state is not an optimizer state_dict")
            tensors = [t for per in value["state"].values() for t in per.values()]
        else:
            tensors = value.values() if isinstance(value, dict) else []
        for t in tensors:
            if torch.is_tensor(t) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise PackError(f"{where}: {key} holds non-finite values")
    return state


def unpack_state(src: Path, state_dir: Path, continue_stages=()) -> dict:
    """Unpack ``src`` into the empty (or absent) ``state_dir``, then re-open ``continue_stages`` (see
    :func:`reopen_stage`; an item may be ``"stage:steps"``). Returns the manifest, with ``"dropped"``: the stage
    folders that the continued stages invalidated."""
    state_dir = Path(state_dir)
    if state_dir.exists() and any(state_dir.iterdir()):
        raise PackError(f"{state_dir}: not empty; unpack into a fresh run folder")
    wanted = [_parse_continue(item) for item in continue_stages]
    manifest, states = _read_pack(src)
    for stage, _ in wanted:
        key = stage.replace("-", "_")
        if key not in states:
            raise PackError(f"continue {stage}: the pack has no {key} state (it has {', '.join(states)})")
        if "opt" not in states[key] and "seeded_from" not in states[key]:
            raise PackError(f"continue {stage}: the pack dropped its optimizer moments (pack --moments drop); "
                            f"it cannot be continued")
    for stage, state in states.items():
        if "opt" in state:
            state = {**state, "opt": _widen_moments(state["opt"])}
        save_state(state_dir / stage / "state.pt", state)
    dropped = []
    for stage, steps in wanted:
        dropped += reopen_stage(state_dir, stage, steps)
    manifest["dropped"] = dropped
    return manifest


def _parse_continue(item: str) -> tuple[str, int | None]:
    stage, _, steps = item.strip().partition(":")
    if stage not in DEPENDENTS:
        raise PackError(f"continue {item!r}: not a training stage; known: {', '.join(DEPENDENTS)}")
    if steps and not (steps.isdigit() and int(steps) > 0):
        raise PackError(f"continue {item!r}: the step count must be a positive integer")
    return stage, int(steps) if steps else None


def reopen_stage(state_dir: Path, stage: str, steps: int | None = None) -> list[str]:
    """Re-open a stage that a budget ended (``--finish-on-budget`` set its total to the step it reached): its total
    becomes its planned step count again (or ``steps``), and the stage folders that depend on it are removed, so that
    ``python -m h3.train all`` continues it and redoes what follows. Returns the removed folders."""
    if stage not in DEPENDENTS:
        raise PackError(f"continue {stage!r}: not a training stage; known: {', '.join(DEPENDENTS)}")
    path = Path(state_dir) / stage.replace("-", "_") / "state.pt"
    state = load_state(path, "cpu")
    if state is None:
        raise PackError(f"continue {stage}: no state at {path}")
    if "opt" not in state and "seeded_from" not in state:
        raise PackError(f"continue {stage}: {path} has no optimizer moments (packed with --moments drop)")
    if "opt" not in state:  # seeded from a checkpoint: AdamW restarts, so its learning rate warms up again
        state["warm_from"] = state["step"]
    planned = state.get("planned_steps", state["total_steps"])
    total = steps if steps is not None else planned
    if total <= state["step"]:
        raise PackError(f"continue {stage}: it ran {state['step']} steps of the {total} asked; ask for more "
                        f"({stage}:STEPS)")
    state["total_steps"] = state["planned_steps"] = total
    save_state(path, state)
    dropped = []
    for name in DEPENDENTS[stage]:
        folder = Path(state_dir) / name
        if folder.exists():
            shutil.rmtree(folder)
            dropped.append(name)
    logger.info("continue %s: %d -> %d steps; dropped %s", stage, state["step"], total, dropped or "nothing")
    return dropped


CHECKPOINT_FILES = {"video_vae": "vae/diffusion_pytorch_model.safetensors",
                    "audio_vae": "audio_vae/diffusion_pytorch_model.safetensors",
                    "dit": "transformer/diffusion_pytorch_model.safetensors"}
RECORD_FILE = "training_record.json"


FRESH_STAGES = ("dit",)
"""What ``unpack --from CHECKPOINT --fresh`` may leave unseeded: the DiT, so that a run trains one from its initial
weights on the shipped VAEs (a DiT of another shape: ``--set dit_*``)."""


def _checkpoint_record(ckpt: Path, state_dir: Path) -> dict:
    """The training record of the checkpoint :func:`seed_from_checkpoint` seeds from, once the run folder is known
    empty and the checkpoint has its weight files; else a PackError naming what is wrong."""
    if state_dir.exists() and any(state_dir.iterdir()):
        raise PackError(f"{state_dir}: not empty; seed into a fresh run folder")
    for name in (RECORD_FILE, *CHECKPOINT_FILES.values()):
        if not (ckpt / name).is_file():
            raise PackError(f"{ckpt / name}: missing; seeding from a checkpoint needs the exported "
                            f"{RECORD_FILE} and the video VAE, audio VAE and transformer weights")
    try:
        record = json.loads((ckpt / RECORD_FILE).read_text())
        record["stages"], record.get("losses", {})  # what the seeding reads: a record without them is refused here
    except (ValueError, KeyError, TypeError) as exc:
        raise PackError(f"{ckpt / RECORD_FILE}: not a training record ({exc})") from exc
    return record


def _growth(grow: str, shipped_config: dict, fresh: list[str], wanted: list) -> dict:
    """``--grow-dit``'s request checked against the checkpoint's DiT and the other options (PackError on bad input);
    the run that trains the grown DiT asks for its depth with ``--set dit_num_layers=N``."""
    from h3.train.grow import GrowError, parse_grow

    try:
        growth = parse_grow(grow, shipped_config["num_layers"])
    except GrowError as exc:
        raise PackError(str(exc)) from None
    if "dit" in fresh:
        raise PackError("--grow-dit with --fresh dit: a fresh DiT has nothing to grow; choose one")
    if "dit" not in {stage for stage, _ in wanted}:
        raise PackError("--grow-dit needs --continue dit[:STEPS]: a grown DiT that does not train is the shipped "
                        "one with blocks that add nothing")
    return growth


def _grown(dit: dict, shipped_config: dict, growth: dict) -> tuple[dict, dict]:
    """The shipped DiT's weights grown as ``growth`` asks (:func:`h3.train.grow.grow_dit`), checked whole against the
    grown shape, and what grew into what."""
    from diffusers import MiniMaxH3Transformer3DModel

    from h3.train.grow import GrowError, grow_dit

    try:
        dit, grown_config, grown = grow_dit(dit, shipped_config, growth["num_layers"], growth["init"])
    except GrowError as exc:
        raise PackError(str(exc)) from None
    MiniMaxH3Transformer3DModel(**grown_config).load_state_dict(dit, strict=True)  # the grown shape, whole
    return dit, grown


def _dit_state(ckpt: Path, base: dict, dit: dict, grown: dict | None) -> dict:
    """The DiT stage's state from the checkpoint's weights (grown or not): weights and EMA alike, the checkpoint's
    latent statistics (required for a grown DiT: it continues the shipped function only on latents normalized as
    the shipped DiT was trained), and ``seeded_from.grown`` when it grew."""
    stats = _checkpoint_latent_stats(ckpt)
    if grown is not None and stats is None:
        raise PackError(f"{ckpt}: its VAE configs keep no latents_mean / latents_std; a grown DiT continues the "
                        "shipped function only on latents normalized as it was trained")
    state = {**base, "model": dit, "ema": {k: v.clone() for k, v in dit.items() if v.is_floating_point()},
             **({"latent_stats": stats} if stats else {})}
    if grown is not None:
        state["seeded_from"]["grown"] = grown
    return state


def seed_from_checkpoint(ckpt: Path, state_dir: Path, continue_stages=(), fresh=(), grow: str = "") -> dict:
    """Training state rebuilt from an exported checkpoint (the one shipped in h3/assets/tiny), for a run that
    continues it when the state pack it was exported from is gone: a pack lives outside git (it is 35 MB, and the
    repository travels with every device call), so a new session has only what the repository ships.

    What it holds, from the checkpoint and its ``training_record.json`` (step counts, loss logs, seconds):

    - ``video_vae``: the shipped encoder (what the pool and the decoder stage read) inside a narrow VAE_CONFIG model
      whose narrow decoder is a seeded stand-in (the run's own was never shipped; nothing after the decoder stage
      reads it);
    - ``video_decoder``: the shipped video VAE (wide decoder, frozen encoder);
    - ``audio_vae``: the shipped audio VAE (its encoder is the audio-vae stage's; its decoder that stage's or, when the
      record has an ``audio_decoder`` stage, that stage's, which then gets the same weights as its state);
    - ``dit``: the shipped transformer (the run's EMA) as both the weights and the EMA;
    - no ``distill``: the next ``all`` redoes the distillation from the DiT (its LoRA ships in another format).

    No optimizer moments travel: a stage re-opened with ``continue_stages`` starts AdamW afresh and warms its learning
    rate up again from the step it resumes at (``warm_from``), so a continued run is not the uninterrupted run's
    continuation bit for bit; each state says so in ``seeded_from``, and the next training record lists it.

    ``fresh`` (:data:`FRESH_STAGES`): stages not seeded at all; the next ``all`` trains them from their initial
    weights (and, for the DiT, from a pool normalized with fresh latent statistics).

    ``grow`` (``"num_layers=8"``): the DiT grown to more blocks that compute the shipped function exactly
    (:mod:`h3.train.grow`, :func:`_dit_state`); it needs ``continue_stages`` to re-open the DiT."""
    from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio, MiniMaxH3Transformer3DModel
    from safetensors.torch import load_file

    from h3.tiny_trained import AUDIO_VAE_CONFIG, INIT_SEED, VAE_CONFIG, VAE_DECODER_CONFIG, shipped_transformer_config
    from h3.train.vaes import ENCODER_SIDE

    ckpt, state_dir = Path(ckpt), Path(state_dir)
    record = _checkpoint_record(ckpt, state_dir)
    stages_info, losses = record["stages"], record.get("losses", {})
    wanted = [_parse_continue(item) for item in continue_stages]
    fresh = [stage.replace("-", "_") for stage in fresh]
    if unknown := [stage for stage in fresh if stage not in FRESH_STAGES]:
        raise PackError(f"--fresh {','.join(unknown)}: a checkpoint can leave only {', '.join(FRESH_STAGES)} "
                        "unseeded")
    if both := sorted({stage.replace("-", "_") for stage, _ in wanted} & set(fresh)):
        raise PackError(f"{', '.join(both)}: both continued and fresh; choose one")
    shipped_config = shipped_transformer_config(ckpt)
    growth = _growth(grow, shipped_config, fresh, wanted) if grow else None  # refused before anything is read

    def weights(stage: str, model) -> dict:
        try:
            tensors = load_file(str(ckpt / CHECKPOINT_FILES[stage]))
            model.load_state_dict(tensors, strict=True)
        except (RuntimeError, OSError, ValueError) as exc:
            raise PackError(f"{ckpt / CHECKPOINT_FILES[stage]}: does not fit the {stage} model ({exc})") from exc
        return {k: v.clone() for k, v in model.state_dict().items()}

    def base(stage: str) -> dict:
        info = stages_info.get(stage)
        if not isinstance(info, dict) or not isinstance(info.get("steps"), int) or info["steps"] < 0:
            raise PackError(f"{ckpt / RECORD_FILE}: no step count for the {stage} stage")
        seconds = info.get("seconds", 0.0)
        if not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds < 0:
            raise PackError(f"{ckpt / RECORD_FILE}: {stage} seconds {seconds!r} is not a finite non-negative number")
        return {"step": info["steps"], "total_steps": info["steps"],
                "planned_steps": int(info.get("planned_steps", info["steps"])), "seconds": float(seconds),
                "log": list(losses.get(stage, [])),
                "seeded_from": {"checkpoint": str(ckpt), "code_commit": record.get("code_commit", ""),
                                "steps": info["steps"], "moments": "none (AdamW restarts, learning rate warms up)"}}

    rng = torch.random.get_rng_state()
    torch.manual_seed(INIT_SEED)
    try:
        wide = weights("video_vae", AutoencoderKLMiniMaxH3(**{**VAE_CONFIG, **VAE_DECODER_CONFIG}))
        narrow = AutoencoderKLMiniMaxH3(**VAE_CONFIG)
        audio = weights("audio_vae", AutoencoderKLMiniMaxH3Audio(**AUDIO_VAE_CONFIG))
        # the checkpoint's own DiT shape (a run may have widened it); the continuing run must ask for the same one
        dit = None if "dit" in fresh else weights("dit", MiniMaxH3Transformer3DModel(**shipped_config))
    finally:
        torch.random.set_rng_state(rng)
    grown = None
    if growth is not None:
        dit, grown = _grown(dit, shipped_config, growth)
    narrow_state = narrow.state_dict()
    narrow_state.update({k: v for k, v in wide.items() if k.startswith(ENCODER_SIDE)})
    states = {
        "video_vae": {**base("video_vae"), "model": narrow_state},
        "video_decoder": {**base("video_decoder"), "model": wide},
        "audio_vae": {**base("audio_vae"), "model": audio},
    }
    if dit is not None:
        states["dit"] = _dit_state(ckpt, base("dit"), dit, grown)
    if "audio_decoder" in stages_info:
        states["audio_decoder"] = {**base("audio_decoder"), "model": {k: v.clone() for k, v in audio.items()}}
    for stage, _ in wanted:
        if stage.replace("-", "_") not in states:
            raise PackError(f"continue {stage}: a checkpoint seeds {', '.join(states)} (not {stage})")
    for stage, state in states.items():
        save_state(state_dir / stage / "state.pt", _check_state(state, f"{ckpt}: {stage}"))
    dropped = []
    for stage, steps in wanted:
        dropped += reopen_stage(state_dir, stage, steps)
    return {"stages": {k: {"step": v["step"], "total_steps": v["total_steps"], "planned_steps": v["planned_steps"]}
                       for k, v in states.items()}, "dropped": dropped, "checkpoint": str(ckpt),
            **({"grown": grown} if grown is not None else {})}
