"""Tile-parallel video VAE decode: the spatiotemporal tiles of one decode scattered over the ranks, decoded, gathered
and stitched (seed 000: "Tile tasks are distributed across ranks, then the outputs are gathered and stitched
together"; 8 RTX 5090s decoded 6.42x faster than one).

diffusers' ``AutoencoderKLMiniMaxH3._decode`` cuts the latent video into temporal chunks and each chunk into spatial
tiles, and calls ``self.decoder(self.post_quant_conv(tile))`` once per (chunk, tile): a *task*. Tasks are
independent (the ViT decoder keeps no state between calls) and, for one decode, all of the same shape (every chunk
slice has ``tokens_chunk_size + token_overlap`` latent frames; every spatial tile the tile size, or the whole frame).
So the decode runs diffusers' own ``_decode`` twice around one exchange, changing nothing of its arithmetic:

1. **collect**: ``_decode`` runs with the decoder swapped for a recorder that keeps each task's input (the
   ``post_quant_conv`` output) and returns a placeholder of the output's shape (found once per input shape with
   PyTorch's fake tensors, which run no kernel);
2. **decode**: rank r decodes the contiguous block ``tasks[r*n//N : (r+1)*n//N]`` with the real decoder; one
   ``all_gather`` gives every rank every output;
3. **stitch**: ``_decode`` runs again with the decoder swapped for a replayer that hands back the outputs in task
   order, and diffusers' blending and cropping stitch them as in a single process.

Each task is decoded by the same module from the same input as in one process, and the stitching is the same code
on the same values, so the result is the single-process tiled decode bit for bit on one platform (one GPU model,
or one CPU model with MKL's reproducibility mode; tests/test_parallel.py checks it with ``torch.equal``). The
``post_quant_conv`` (a 1x1x1 convolution over the latents) runs in both passes on every rank: cheap next to the
decoder. Every rank ends with the whole video, so the pipeline after the decode runs unchanged on every rank.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)


class _Recorder(nn.Module):
    def __init__(self, decoder: nn.Module):
        super().__init__()
        self.inner = [decoder]  # a list: not a registered submodule
        self.inputs: list[torch.Tensor] = []
        self._shapes: dict[tuple, tuple[torch.Size, torch.dtype]] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.inputs.append(x)
        key = (tuple(x.shape), x.dtype, x.device)
        if key not in self._shapes:
            from torch._subclasses.fake_tensor import FakeTensorMode

            with FakeTensorMode(allow_non_fake_inputs=True) as mode:
                out = self.inner[0](mode.from_tensor(x))
            self._shapes[key] = (out.shape, out.dtype)
        shape, dtype = self._shapes[key]
        return torch.zeros(shape, dtype=dtype, device=x.device)


class _Replayer(nn.Module):
    def __init__(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor]):
        super().__init__()
        self.outputs, self.inputs, self.calls = outputs, inputs, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.calls
        if k >= len(self.outputs) or x.shape != self.inputs[k].shape:
            raise RuntimeError(f"tile-parallel decode: the second pass asked for task {k} of shape {tuple(x.shape)}, "
                               "which the first pass did not record; the VAE's tiling changed between the passes")
        self.calls += 1
        return self.outputs[k]


def task_block(n_tasks: int, world: int, rank: int) -> range:
    """The contiguous block of tasks rank ``rank`` decodes (sizes differ by at most one)."""
    return range(rank * n_tasks // world, (rank + 1) * n_tasks // world)


class TileParallelDecode:
    """Replaces ``vae._decode`` (an instance attribute) on every rank; :meth:`remove` restores it."""

    def __init__(self, vae, group=None, world_size: int | None = None, rank: int | None = None):
        import torch.distributed as dist

        self.vae = vae
        self.group = group
        self.world_size = world_size if world_size is not None else dist.get_world_size(group)
        self.rank = rank if rank is not None else dist.get_rank(group)
        self.original = vae._decode
        self.had_attr = "_decode" in vars(vae)
        self.last: dict[str, Any] = {}
        vae._decode = self._decode

    def _decode(self, z: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        vae = self.vae
        decoder = vae.decoder
        recorder = _Recorder(decoder)
        vae.decoder = recorder
        try:
            self.original(z)  # pass 1: the tasks and their shapes, nothing decoded
        finally:
            vae.decoder = decoder
        inputs = recorder.inputs
        n = len(inputs)
        mine = task_block(n, self.world_size, self.rank)
        t0 = time.perf_counter()
        own = [decoder(inputs[k]) for k in mine]
        if any(o.shape != own[0].shape for o in own):
            raise RuntimeError("tile-parallel decode: tasks of one decode gave outputs of different shapes")
        shape, dtype = recorder._shapes[(tuple(inputs[0].shape), inputs[0].dtype, inputs[0].device)]
        width = max(len(task_block(n, self.world_size, r)) for r in range(self.world_size))
        send = torch.zeros((width, *shape), dtype=dtype, device=z.device)
        for i, out in enumerate(own):
            send[i] = out
        gathered = torch.empty((self.world_size * width, *shape), dtype=dtype, device=z.device)
        t1 = time.perf_counter()
        dist.all_gather_into_tensor(gathered, send, group=self.group)
        t_gather = time.perf_counter() - t1
        outputs = [gathered[r * width + i] for r in range(self.world_size)
                   for i in range(len(task_block(n, self.world_size, r)))]
        replayer = _Replayer(outputs, inputs)
        vae.decoder = replayer
        try:
            result = self.original(z)  # pass 3: diffusers' own blending and stitching
        finally:
            vae.decoder = decoder
        if replayer.calls != n:
            raise RuntimeError(f"tile-parallel decode: the second pass used {replayer.calls} of {n} tasks")
        self.last = {"tasks": n, "tasks_this_rank": len(mine), "gather_s": t_gather,
                     "decode_and_gather_s": time.perf_counter() - t0}
        return result

    def remove(self) -> None:
        if self.had_attr:
            self.vae._decode = self.original
        else:
            del self.vae._decode
