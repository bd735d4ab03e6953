"""The process group of one parallel runtime: which rank this process is, on which device, talking over what.

A runtime at degree N is N processes ("ranks") started by torchrun (``torch.distributed.run``; ``h3 generate --nproc
N`` and ``h3 serve --nproc N`` start it themselves, h3/parallel/launch.py). torchrun gives every rank ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``; :func:`init_world` reads them and joins the
default process group:

- on GPUs, ``cpu:gloo,cuda:nccl``: NCCL carries the tensors (all-to-all, all-gather), gloo the few small CPU
  collectives (diffusers' ``gather_size_by_comm`` picks the CPU when the group has a CPU backend, which saves a
  device round trip per call in ``ulysses_anything``; the request broadcast of the server);
- on the CPU, ``cpu:gloo``: the backend string must name the device, because diffusers reads it to choose where its
  size exchange runs (a plain ``gloo`` makes it allocate on ``torch.accelerator.current_accelerator()``, CUDA in a
  CUDA build of torch, even on a machine with no GPU).

Every collective has a timeout (``init_process_group(timeout=...)``): a rank that dies or diverges makes the others
fail within it instead of hanging. ``H3_DIST_TIMEOUT_S`` sets it (default 600 s: the longest single collective is a
VAE tile gather or a first compile, well under that).
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 600.0
_WORLD: "World | None" = None
_CONTROL = None


class ParallelError(RuntimeError):
    """The parallel runtime cannot start or run as asked; the message says why and what to change."""


@dataclass(frozen=True)
class World:
    """This process's place in the parallel runtime."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    """The default group's backend string (``cpu:gloo,cuda:nccl`` or ``cpu:gloo``)."""

    @property
    def is_writer(self) -> bool:
        """Rank 0 answers HTTP and writes files; the other ranks follow."""
        return self.rank == 0


def free_port() -> int:
    """A free TCP port on loopback (for torchrun's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launched_world_size() -> int | None:
    """WORLD_SIZE when this process was started by torchrun (or any launcher setting its variables), else None."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    return int(os.environ["WORLD_SIZE"])


def timeout_s() -> float:
    value = os.environ.get("H3_DIST_TIMEOUT_S")
    if value is None:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        raise ParallelError(f"H3_DIST_TIMEOUT_S must be a number of seconds, got {value!r}") from None
    if not seconds > 0:
        raise ParallelError(f"H3_DIST_TIMEOUT_S must be positive, got {value!r}")
    return seconds


def rank_device(device: str | torch.device | None, local_rank: int) -> torch.device:
    """The device of a rank: ``cuda:<local_rank>`` on a GPU machine (or when ``device`` says cuda), else the CPU.
    An explicit ``cuda:K`` is refused at degree > 1: each rank owns the GPU of its local rank."""
    wanted = torch.device(device) if device is not None else None
    on_cuda = wanted.type == "cuda" if wanted is not None else torch.cuda.is_available()
    if not on_cuda:
        return torch.device("cpu")
    if wanted is not None and wanted.index is not None:
        raise ParallelError(f"--device {wanted} names one GPU; at degree > 1 each rank uses cuda:<local rank>, so give "
                            "--device cuda (or leave it out)")
    if local_rank >= torch.cuda.device_count():
        raise ParallelError(f"rank with local rank {local_rank} has no GPU: this machine has "
                            f"{torch.cuda.device_count()} visible")
    return torch.device("cuda", local_rank)


def prepare_model(model: str) -> None:
    """Build the random tiny preset's (``tiny-random``) cache folder before any rank joins the group: transformers'
    ``save_pretrained`` writes no weights on a rank other than 0 once torch.distributed is initialized, so a rank
    that built the preset after joining would publish a checkpoint with an empty ``text_encoder/`` (seen: a
    CheckpointError naming its missing files). Built before joining, every rank writes a whole copy and the first
    one to finish is kept."""
    from h3.runtime import canonical_model, tiny_checkpoint_dir

    if canonical_model(model) == "tiny-random":  # the trained preset (``tiny``) ships built in the package
        tiny_checkpoint_dir()


def init_world(device: str | torch.device | None = None) -> World:
    """Join the process group torchrun set up (idempotent). Sets this rank's CUDA device. Call
    :func:`prepare_model` first."""
    global _WORLD, _CONTROL
    import torch.distributed as dist

    if _WORLD is not None:
        return _WORLD
    if launched_world_size() is None:
        raise ParallelError("not started by torchrun (RANK/WORLD_SIZE unset): use `--nproc N`, which starts the ranks")
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    dev = rank_device(device, local_rank)
    backend = "cpu:gloo,cuda:nccl" if dev.type == "cuda" else "cpu:gloo"
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        kwargs = {"device_id": dev} if dev.type == "cuda" else {}
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s()), **kwargs)
    # Small CPU messages (the server's requests to the followers, each rank's anatomy to rank 0) travel on a gloo
    # group of their own, so they never interleave with the tensors' collectives of the default group.
    _CONTROL = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s()))
    _WORLD = World(rank=rank, world_size=world_size, local_rank=local_rank, device=dev, backend=backend)
    logger.info("rank %d/%d on %s (%s)", rank, world_size, dev, backend)
    return _WORLD


def current_world() -> World | None:
    """The world this process joined, or None in a single-process runtime."""
    return _WORLD


def control_group():
    """The gloo group for small CPU messages (requests, anatomy); None before :func:`init_world`."""
    return _CONTROL


def destroy_world(barrier: bool = False) -> None:
    """Leave the world. ``barrier``: first wait until every rank got here (work that finished on every rank), so that
    no rank tears its groups down while the writer is still encoding. Session 33's CI rehearsal saw a follower abort
    at exit ("terminate called without an active exception", SIGABRT) in a 2-rank `h3 generate --nproc 2` that had
    finished its collectives, once in many launches (not reproduced in 15 more here): the ranks of `h3 generate` left
    the process group to the interpreter's teardown; they now leave it here."""
    global _WORLD, _CONTROL
    import torch.distributed as dist

    if dist.is_initialized():
        if barrier:
            dist.barrier()
        dist.destroy_process_group()
    _WORLD = _CONTROL = None
