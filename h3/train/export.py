"""The last stage: the shipped checkpoint and its training record.

Writes ``<out>/tiny``: the trained components in the Hugging Face layout the runtime loads (h3.tiny_trained
.save_checkpoint: safetensors, the tiny canvas configs, ``transformer_ref`` on the same DiT), the distilled LoRA at
``lora/turbo4-tiny.safetensors`` (and the compensation LoRA when it trained), and ``training_record.json``
(command, seed, configuration, steps and seconds per stage, loss numbers, device, versions, the commit of the code).
Refuses to finish if a file is over 16 MB or the checkpoint over 30 MB (the repository's limits for shipped weights).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import shutil
from pathlib import Path

import torch

from h3.train.common import write_json

logger = logging.getLogger(__name__)

MAX_FILE_BYTES = 16 * 1000 * 1000
MAX_TOTAL_BYTES = 30 * 1000 * 1000
RECORD_NAME = "training_record.json"
PLOT_NAME = "training_losses.png"


def check_sizes(root: Path) -> dict:
    files = {p.relative_to(root).as_posix(): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}
    too_big = {k: v for k, v in files.items() if v > MAX_FILE_BYTES}
    total = sum(files.values())
    if too_big or total > MAX_TOTAL_BYTES:
        raise RuntimeError(f"checkpoint {root} over the limits (16 MB a file, 30 MB in all): {too_big or total}")
    return {"files": files, "total_bytes": total}


def verify_lora(lora, transformer, path: Path) -> dict:
    """Load the exported file through diffusers' MiniMaxH3LoraLoaderMixin conversion and compare every module's
    delta with the trained one."""
    from h3.train.lora import loaded_deltas

    loaded = loaded_deltas(path)
    trained = lora.deltas(transformer)
    missing = sorted(set(trained) - set(loaded))
    extra = sorted(set(loaded) - set(trained))
    worst = max(float((loaded[k].cpu() - trained[k].float().cpu()).abs().max() /
                      trained[k].float().abs().max().clamp(min=1e-12)) for k in trained if k in loaded)
    return {"modules_trained": len(trained), "modules_in_file": len(loaded), "missing": missing, "extra": extra,
            "max_relative_difference": worst, "ok": not missing and not extra and worst < 1e-4}


def plot_record(record: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = [s for s in ("video_vae", "audio_vae", "video_decoder", "audio_decoder", "dit", "distill", "compensate")
              if record["losses"].get(s)]
    fig, axes = plt.subplots(1, len(stages), figsize=(4.2 * len(stages), 3.4))
    for ax, stage in zip(axes if len(stages) > 1 else [axes], stages):
        rows = record["losses"][stage]
        keys = list(dict.fromkeys(k for r in rows for k in r if k != "step"))  # DMD's first rows lack the student's
        for key in keys:
            pts = [(r["step"], r[key]) for r in rows if key in r and r[key] > 0]
            if pts:
                ax.plot(*zip(*pts), label=key, lw=1)
        ax.set_yscale("log")
        ax.set_title(stage)
        ax.set_xlabel("step")
        ax.legend(fontsize=6)
    fig.suptitle(f"h3 tiny training (seed {record['seed']}, {record.get('device', '?')})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def environment(device: str) -> dict:
    import diffusers
    import transformers

    info = {"python": platform.python_version(), "torch": torch.__version__, "diffusers": diffusers.__version__,
            "transformers": transformers.__version__, "platform": platform.platform()}
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    else:
        info["device"] = f"cpu ({os.cpu_count()} cores)"
    return info


DIT_FILE = "transformer/diffusion_pytorch_model.safetensors"
EXPORT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def store_dit_in(root: Path, dtype: str) -> dict:
    """Rewrite the exported DiT's weights in ``dtype`` (of :data:`EXPORT_DTYPES`; run() refuses any other before
    training), but for the tensors of the modules diffusers keeps in float32 (``_keep_in_fp32_modules``) and of its
    norms (``_skip_layerwise_casting_patterns``): how many of each."""
    from diffusers import MiniMaxH3Transformer3DModel
    from safetensors.torch import load_file, save_file

    path = root / DIT_FILE
    kept = tuple(MiniMaxH3Transformer3DModel._keep_in_fp32_modules or ())
    skip = tuple(MiniMaxH3Transformer3DModel._skip_layerwise_casting_patterns or ())
    tensors = load_file(str(path))
    cast = {k for k, v in tensors.items()
            if v.is_floating_point() and not k.startswith(kept) and not any(p in k for p in skip)}
    save_file({k: v.to(EXPORT_DTYPES[dtype]) if k in cast else v for k, v in tensors.items()}, str(path),
              metadata={"format": "pt"})
    return {"dtype": dtype, "tensors_in_dtype": len(cast), "tensors_float32": len(tensors) - len(cast)}


def export_checkpoint(components: dict, lora, out: Path, record: dict, compensation=None, cfg=None) -> Path:
    """``compensation`` (with the run's ``cfg``): the sparse-attention compensation LoRA, written beside the turbo
    LoRA (h3.train.compensate). The DiT file in ``cfg.export_dit_dtype`` (:func:`store_dit_in`)."""
    from h3.tiny_trained import save_checkpoint

    target, staging = out / "tiny", out / ".tiny-staging"
    shutil.rmtree(staging, ignore_errors=True)
    cpu = {k: (v.to("cpu").float() if isinstance(v, torch.nn.Module) else v) for k, v in components.items()}
    save_checkpoint(cpu, staging)
    dit_dtype = getattr(cfg, "export_dit_dtype", "float32")
    if dit_dtype != "float32":
        record["dit_file"] = store_dit_in(staging, dit_dtype)
    lora_path = staging / "lora" / "turbo4-tiny.safetensors"
    lora.to("cpu").save(lora_path)
    try:
        record["lora"] = {"file": "lora/turbo4-tiny.safetensors", **verify_lora(lora, cpu["transformer"], lora_path)}
    except ImportError as exc:  # the loader's conversion needs peft's helpers on some installs
        record["lora"] = {"file": "lora/turbo4-tiny.safetensors", "verified": f"not here: {exc}"}
    if compensation is not None:
        from h3.levers.compensation_lora import lora_tensors_sha256
        from h3.train.compensate import compensation_file, compensation_metadata

        name = compensation_file(cfg)
        compensation.to("cpu").save(staging / name, compensation_metadata(cfg, lora_tensors_sha256(lora_path)))
        try:
            record["compensation_lora"] = {"file": name, **verify_lora(compensation, cpu["transformer"],
                                                                       staging / name)}
        except ImportError as exc:
            record["compensation_lora"] = {"file": name, "verified": f"not here: {exc}"}
    record["sizes"] = check_sizes(staging)
    write_json(staging / "training_record.json", record)
    try:
        plot_record(record, staging / PLOT_NAME)
        record["plot"] = PLOT_NAME
        write_json(staging / "training_record.json", record)
    except ImportError as exc:
        logger.warning("no loss plot here (%s); make it with `python -m h3.train plot`", exc)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target
