"""Provenance of a record: package versions, hardware, git state, time."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ("h3eval", "torch", "torchvision", "diffusers", "transformers", "av", "numpy", "lpips", "scipy")


@functools.lru_cache(maxsize=1)
def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    try:
        import av

        out["ffmpeg"] = ".".join(str(v) for v in av.ffmpeg_version_info[:1]) if hasattr(av, "ffmpeg_version_info") else str(av.library_versions.get("libavcodec"))
    except Exception:  # provenance must never break a run; the key is simply absent
        pass
    return out


def hardware(device: Any = "cpu") -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
    }
    from h3.determinism import numerics_platform

    info["numerics"] = numerics_platform(device)
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.device(device))
        info.update(gpu=props.name, gpu_memory_bytes=int(props.total_memory), cuda=torch.version.cuda)
    return info


def git_state(path: str | os.PathLike = ".") -> dict[str, Any]:
    """Commit and dirty flag of the checkout holding ``path`` (empty when it is not a git checkout)."""
    try:
        root = Path(path).resolve()
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        if commit.returncode != 0:
            return {}
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, timeout=10)
        return {"commit": commit.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {}


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
