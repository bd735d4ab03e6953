"""Small helpers shared by the gate modules: an empty result for a pair, a checked metric, paths relative to the run.

(Options are each gate's typed schema, ``Gate.Options``; the bad-input error lives in :mod:`gates.base`.)
"""

from __future__ import annotations

import os
from pathlib import Path

from gates.base import GateInputError, GateResult, Metric, PairContext  # noqa: F401 - GateInputError: its old home


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
