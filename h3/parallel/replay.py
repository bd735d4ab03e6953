"""Attention replayed under context parallelism, for opcheck (h3/ops.py's ``attention_cp`` op) and the tests.

:func:`cp_attention` is what one rank does with a whole (B, S, H, D) input: take its shard as diffusers' plan cuts it,
run the runtime's own attention call on it (:func:`h3.levers.bucketing.attend_valid_rows` with the recipe's
``parallel_config``: the Ulysses / ring / anything exchange, and the padding rows cut out per shard), and gather the
shards' outputs into the whole output. Run on every rank of a group, it gives every rank the output the parallel
runtime computes for that input.

:class:`ReplayWorld` is a group of ``degree`` helper processes (torch.multiprocessing, spawned once per (degree, kind,
device type) and kept for the process's life) that run :func:`cp_attention` on inputs the calling process sends
them. The caller stays a single process with no process group of its own; the gate replays captured inputs through
the real collectives.
"""

from __future__ import annotations

import atexit
import datetime
import logging
import os
import queue as queue_module
import torch

logger = logging.getLogger(__name__)

REPLAY_TIMEOUT_S = 300.0
_WORLDS: dict[tuple[int, str, str], "ReplayWorld"] = {}


def make_parallel_config(degree: int, kind: str, device: torch.device):
    """A set-up diffusers ParallelConfig for ``kind`` over the default group (what ``enable_parallelism`` builds for
    the model, without a model)."""
    import torch.distributed as dist
    from diffusers.models._modeling_parallel import ContextParallelConfig, ParallelConfig
    from torch.distributed.device_mesh import init_device_mesh

    ring = degree if kind == "ring" else 1
    ulysses = 1 if kind == "ring" else degree
    mesh = init_device_mesh(device.type, (ring, ulysses), mesh_dim_names=("ring", "ulysses"))
    cp = ContextParallelConfig(ring_degree=ring, ulysses_degree=ulysses, ulysses_anything=kind == "ulysses_anything",
                               mesh=mesh)
    config = ParallelConfig(context_parallel_config=cp)
    config.setup(dist.get_rank(), dist.get_world_size(), device, mesh=mesh)
    return config


def cp_attention(query, key, value, parallel_config, backend=None, valid_len: int | None = None,
                 slice_padding: bool = True) -> torch.Tensor:
    """The whole output of the runtime's attention call under ``parallel_config`` for a whole input (every rank
    calls it with the same input). ``valid_len`` < S: the rows past it are a bucket's padding. ``slice_padding=False``
    is the call before the fix (the shard handed to the dispatcher with its padding rows), kept to show what the fix
    changes."""
    import torch.distributed as dist
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    from h3.levers.bucketing import PaddingState, attend_valid_rows
    from h3.parallel.attention import cp_config, cp_rank, is_anything, shard_sizes

    cp = cp_config(parallel_config)
    seq = query.shape[1]
    world, rank = cp._world_size, cp_rank(cp)
    sizes = shard_sizes(seq, world, is_anything(cp))
    start = sum(sizes[:rank])
    q, k, v = (x[:, start:start + sizes[rank]].contiguous() for x in (query, key, value))
    padding = PaddingState(valid_len, seq) if valid_len is not None and valid_len < seq else None
    if slice_padding:
        out = attend_valid_rows(q, k, v, padding, backend, parallel_config)
    else:
        out = dispatch_attention_fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, backend=backend,
                                    parallel_config=parallel_config)
    # Gather the shards (uneven under *_anything): pad to the largest, all-gather, trim.
    width = max(sizes)
    send = torch.nn.functional.pad(out, (0, 0, 0, 0, 0, width - out.shape[1])).contiguous()
    parts = [torch.empty_like(send) for _ in range(world)]
    dist.all_gather(parts, send, group=cp._flattened_mesh.get_group())
    return torch.cat([part[:, :size] for part, size in zip(parts, sizes)], dim=1)


def _worker(rank: int, degree: int, kind: str, device_type: str, port: int, jobs, results) -> None:
    import h3  # noqa: F401  (MKL reproducibility first)
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(degree))
    device = torch.device("cuda", rank) if device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "cpu:gloo"
    dist.init_process_group(backend=backend, rank=rank, world_size=degree,
                            timeout=datetime.timedelta(seconds=REPLAY_TIMEOUT_S))
    try:
        config = make_parallel_config(degree, kind, device)
        results.put(("ready", rank, None))
        while True:
            job = jobs.get()
            if job is None:
                return
            try:
                q, k, v = (job[name].to(device) for name in ("query", "key", "value"))
                with torch.no_grad():
                    out = cp_attention(q, k, v, config, job.get("backend"), job.get("valid_len"),
                                       job.get("slice_padding", True))
                results.put(("ok", rank, out.cpu() if rank == 0 else None))
            except Exception as exc:  # noqa: BLE001 - reported to the caller, which raises it
                results.put(("error", rank, f"{type(exc).__name__}: {exc}"))
    finally:
        dist.destroy_process_group()


class ReplayWorld:
    """``degree`` helper processes forming one context-parallel group of ``kind``."""

    def __init__(self, degree: int, kind: str, device_type: str = "cpu"):
        import torch.multiprocessing as mp

        from h3.parallel.world import free_port

        if device_type == "cuda" and torch.cuda.device_count() < degree:
            raise RuntimeError(f"replaying attention at degree {degree} on CUDA needs {degree} GPUs; "
                               f"{torch.cuda.device_count()} are visible")
        ctx = mp.get_context("spawn")
        self.degree, self.kind = degree, kind
        self.jobs = [ctx.Queue() for _ in range(degree)]
        self.results = ctx.Queue()
        port = free_port()
        env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // degree)))}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            self.procs = [ctx.Process(target=_worker, args=(r, degree, kind, device_type, port, self.jobs[r],
                                                            self.results), daemon=True) for r in range(degree)]
            for proc in self.procs:
                proc.start()
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        ready = 0
        while ready < degree:
            status, rank, payload = self._get()
            if status != "ready":
                self.close()
                raise RuntimeError(f"replay rank {rank} failed to start: {payload}")
            ready += 1

    def _get(self):
        try:
            return self.results.get(timeout=REPLAY_TIMEOUT_S)
        except queue_module.Empty:
            self.close()
            raise RuntimeError(f"the replay ranks did not answer within {REPLAY_TIMEOUT_S:.0f} s") from None

    def attention(self, query, key, value, backend=None, valid_len: int | None = None,
                  slice_padding: bool = True) -> torch.Tensor:
        job = {"query": query.detach().cpu(), "key": key.detach().cpu(), "value": value.detach().cpu(),
               "backend": backend, "valid_len": valid_len, "slice_padding": slice_padding}
        for q in self.jobs:
            q.put(job)
        out, errors = None, []
        for _ in range(self.degree):  # one answer per rank and job, so no answer is left for the next job
            status, rank, payload = self._get()
            if status != "ok":
                errors.append(f"rank {rank}: {payload}")
            elif rank == 0:
                out = payload
        if errors:
            raise RuntimeError("attention replay failed: " + "; ".join(errors))
        return out

    def close(self) -> None:
        for q in self.jobs:
            try:
                q.put(None)
            except (OSError, ValueError):
                pass
        for proc in self.procs if hasattr(self, "procs") else []:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()


def replay_world(degree: int, kind: str, device_type: str = "cpu") -> ReplayWorld:
    key = (degree, kind, device_type)
    if key not in _WORLDS:
        _WORLDS[key] = ReplayWorld(degree, kind, device_type)
    return _WORLDS[key]


@atexit.register
def _close_all() -> None:
    for world in _WORLDS.values():
        world.close()
    _WORLDS.clear()
