"""Small helpers shared by the gate modules: an empty result for a pair, a checked metric, paths relative to the run.

(Options are each gate's typed schema, ``Gate.Options``; the bad-input error lives in :mod:`gates.base`.)
"""

from __future__ import annotations

import os
from pathlib import Path

from gates.base import GateInputError, GateResult, Metric, PairContext  # noqa: F401 - GateInputError: its old home


def luma32(frames):
    """BT.601 luma, float32 on 0..255, of uint8 RGB frames (..., 3): a numpy array, or a torch tensor on its device.
    The same float32 operations either way (the reference-free and integrity gates' plane)."""
    f = frames.astype("float32") if hasattr(frames, "astype") else frames.float()  # numpy, else torch
    return 0.299 * f[..., 0] + 0.587 * f[..., 1] + 0.114 * f[..., 2]


def new_result(gate: str, ctx: PairContext) -> GateResult:
    return GateResult(gate=gate, pair=ctx.pair)


def metric(value: float | None, higher_is_better: bool, unit: str | None = None) -> Metric:
    """A Metric; a non-finite value is a bug in the gate, never written as a number."""
    if value is not None:
        value = float(value)
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"metric value {value} is not finite; gates write None (with the reason) instead")
    return Metric(value=value, higher_is_better=higher_is_better, unit=unit)


def relative_to_run(ctx: PairContext, path: Path) -> str:
    return Path(os.path.relpath(Path(path).resolve(), Path(ctx.run_dir).resolve())).as_posix()


_blas = None


def blas_controller():
    """One threadpoolctl controller for the process (the BLAS libraries loaded when it is first asked for): building one
    walks the loaded libraries (dl_iterate_phdr), which must not race a first import of an extension module in another
    thread (the gates run side by side), so it is built once and its limits are set through it."""
    global _blas
    if _blas is None:
        from threadpoolctl import ThreadpoolController

        _blas = ThreadpoolController()
    return _blas


def host_workers() -> int:
    """Host threads for a gate's per-frame OpenCV/numpy loops: up to 8 on a machine of 8 cores or more (a GPU host),
    else 1 (the 2-core CPU: OpenCV already threads parts of its work, and more threads were measured no faster there;
    the gates of a pair already run side by side there)."""
    import os

    cores = os.cpu_count() or 1
    return min(8, cores) if cores >= 8 else 1
