"""Start N ranks with torchrun (``torch.distributed.run``), the launcher PyTorch ships.

``h3 generate --nproc N`` and ``h3 serve --nproc N`` call :func:`launch` with their own module and options; torchrun
starts N copies of it on this machine with ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` and a rendezvous on a free
loopback port, each copy sees that it is a rank (h3.parallel.world.launched_world_size) and joins the group. If one
rank fails, torchrun stops the others and exits non-zero. A user may also run torchrun directly (``H3_NPROC=N torchrun
--nproc-per-node N -m h3.cli generate ...``; the degree goes in the environment, because torchrun's own parser takes a
``--nproc`` after the module for its ``--nproc-per-node``): the ranks behave the same.

Thread counts: on the CPU each rank gets ``cpu_count // N`` threads (``OMP_NUM_THREADS``, unless the caller set it),
so N ranks do not oversubscribe the cores; torchrun alone would give each rank one.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from typing import Sequence

from h3.parallel.world import free_port

logger = logging.getLogger(__name__)


def torchrun_argv(nproc: int, module: str, args: Sequence[str]) -> list[str]:
    """The torchrun command that starts ``python -m module args`` (or ``python module args`` when ``module`` is a
    ``.py`` file) as ``nproc`` ranks on this machine."""
    if nproc < 2:
        raise ValueError(f"torchrun is for 2 or more ranks, got nproc={nproc}")
    target = [module] if module.endswith(".py") else ["-m", module]
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--max-restarts", "0",
            "--monitor-interval", "0.5", *target, *[str(a) for a in args]]


def rank_env(nproc: int, env: dict[str, str] | None = None) -> dict[str, str]:
    out = dict(os.environ if env is None else env)
    out.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    out.setdefault("PYTHONUNBUFFERED", "1")
    return out


def launch(nproc: int, module: str, args: Sequence[str], env: dict[str, str] | None = None,
           timeout: float | None = None) -> int:
    """Run ``module`` as ``nproc`` ranks and wait; returns torchrun's exit status (0 when every rank succeeded, 124
    when ``timeout`` ran out). torchrun and its ranks run in a session of their own, so a timeout or an interrupt
    stops all of them, never leaving a rank behind."""
    import signal
    import threading

    argv = torchrun_argv(nproc, module, args)
    logger.info("launching %d ranks: %s", nproc, " ".join(argv))
    proc = subprocess.Popen(argv, env=rank_env(nproc, env), start_new_session=True)
    # A SIGTERM to this process (a supervisor, `timeout`) must stop the ranks too: they run in a session of their
    # own, which a signal to this process's group does not reach. Python's default SIGTERM would exit without that.
    previous = None
    if threading.current_thread() is threading.main_thread():
        def _terminated(signum, frame):
            raise KeyboardInterrupt(f"signal {signum}")

        previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        logger.error("the %d ranks did not finish within %s s; stopping them", nproc, timeout)
        _stop(proc)
        return 124
    except BaseException:
        _stop(proc)
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to torchrun, which stops its ranks (SIGTERM, then SIGKILL after its own 30 s); SIGKILL after 40 s."""
    import signal

    for sig, grace in ((signal.SIGTERM, 40.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue
