"""Latent trajectory of a request: x_t and the model's x0 prediction after every denoising step, per modality.

Seed 001's ghosting passed a per-op gate because error builds up *across* steps; its authors' next step was
"inspection at the latent level". The recorder wraps the two schedulers' ``step`` (video and audio), which see
exactly the sample x_t, the velocity v and the timestep t of every step, and derives x0 the way the scheduler does
(``x0 = x_t + (1 - t) * v``; MiniMax-H3's velocity is data-ward). Nothing in the pipeline changes, so recording does
not change the clip.

Saved as ``<clip>.traj.npz`` next to the clip: ``video_t`` (S,), ``video_xt`` / ``video_x0`` (S, rows, D) in
frame-major row order (rows = latent frames × patch rows), the same for ``audio_*`` (rows = stereo channel-major
latents), plus ``video_row_stride`` when rows were subsampled for a large shape.
"""

from __future__ import annotations

import io
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from h3.anatomy import wrap_method
from h3.atomic import atomic_write_bytes

# Keep at most this many rows per step and modality on disk (a 5 s 768x1344 request has ~37k video rows: 830 MB of
# float32 over 29 steps; strided to <= 4096 rows in float16 it is ~45 MB).
MAX_ROWS = 4096


class TrajectoryRecorder:
    def __init__(self, max_rows: int = MAX_ROWS):
        self.max_rows = max_rows
        self.steps: dict[str, list[dict[str, np.ndarray | float]]] = {"video": [], "audio": []}

    def _wrap(self, scheduler: Any, modality: str):
        def make_wrapper(original):
            def step(model_output, timestep, sample, *args, **kwargs):
                # copies: on the CPU .numpy() shares memory with `sample`, which the pipeline overwrites in place
                t = float(timestep) if not isinstance(timestep, torch.Tensor) else float(timestep.float().item())
                x0 = sample.float() + (1.0 - t) * model_output.float()
                self.steps[modality].append({"t": t, "xt": sample.detach().float().cpu().numpy().copy(),
                                             "x0": x0.detach().cpu().numpy().copy()})
                return original(model_output, timestep, sample, *args, **kwargs)

            return step

        return wrap_method(scheduler, "step", make_wrapper).remove

    @contextmanager
    def attach(self, pipe: Any) -> Iterator["TrajectoryRecorder"]:
        removers = [self._wrap(pipe.scheduler, "video"), self._wrap(pipe.audio_scheduler, "audio")]
        try:
            yield self
        finally:
            for remove in removers:
                remove()

    def arrays(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for modality, steps in self.steps.items():
            if not steps:
                continue
            xt = np.stack([s["xt"] for s in steps])
            x0 = np.stack([s["x0"] for s in steps])
            xt, x0 = xt.reshape(len(steps), -1, xt.shape[-1]), x0.reshape(len(steps), -1, x0.shape[-1])
            stride = max(1, -(-xt.shape[1] // self.max_rows))
            out[f"{modality}_t"] = np.array([s["t"] for s in steps], dtype=np.float64)
            out[f"{modality}_xt"] = xt[:, ::stride].astype(np.float32 if stride == 1 else np.float16)
            out[f"{modality}_x0"] = x0[:, ::stride].astype(np.float32 if stride == 1 else np.float16)
            out[f"{modality}_row_stride"] = np.array(stride)
        return out

    def save(self, path: str | os.PathLike) -> None:
        # Uncompressed: latents are float noise that zlib shrinks by ~8 %, at 0.9 s a tiny clip's write on the 2-core
        # CPU (np.savez: 0.02 s; loading 0.12 s -> 0.02 s; bench/gates_cpu_parts/results/gates_cpu_parts.md); np.load reads either.
        buffer = io.BytesIO()
        np.savez(buffer, **self.arrays())
        atomic_write_bytes(path, buffer.getvalue())


def trajectory_path(mp4: str | os.PathLike) -> Path:
    return Path(mp4).with_suffix(".traj.npz")


def load_trajectory(path: str | os.PathLike) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {k: data[k] for k in data.files}
