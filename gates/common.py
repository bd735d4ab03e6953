"""Small helpers shared by the gate modules: the bad-input error, an empty result for a pair, option parsing."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gates.base import GateResult, Metric, PairContext


class GateInputError(ValueError):
    """The pair cannot be scored by this gate (mismatched shapes, no audio stream, missing weights...).

    The message names the file or field; the runner writes it as the pair's ``error`` and scores the other pairs.
    """


def new_result(gate: str, ctx: PairContext) -> GateResult:
    return GateResult(gate=gate, pair=ctx.pair)


def metric(value: float | None, higher_is_better: bool, unit: str | None = None) -> Metric:
    """A Metric; a non-finite value is a bug in the gate, never written as a number."""
    if value is not None:
        value = float(value)
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"metric value {value} is not finite; gates write None (with the reason) instead")
    return Metric(value=value, higher_is_better=higher_is_better, unit=unit)


def check_options(gate: str, options: dict[str, Any], known: frozenset[str]) -> None:
    """Unknown option names are an error (a typo must not silently run the defaults)."""
    unknown = sorted(set(options) - known)
    if unknown:
        raise GateInputError(f"unknown {gate} option(s) {unknown}; known: {sorted(known)}")


def relative_to_run(ctx: PairContext, path: Path) -> str:
    return Path(os.path.relpath(Path(path).resolve(), Path(ctx.run_dir).resolve())).as_posix()


def _option(options: dict[str, Any], name: str, env: str | None) -> Any:
    if name in options and options[name] is not None:
        return options[name]
    if env and os.environ.get(env):
        return os.environ[env]
    return None


def option_str(options: dict[str, Any], name: str, default: str, env: str | None = None) -> str:
    value = _option(options, name, env)
    return default if value is None else str(value)


def option_float(options: dict[str, Any], name: str, default: float, env: str | None = None) -> float:
    value = _option(options, name, env)
    if value is None:
        return default
    try:
        return float(value)
    except (TypeError, ValueError) as exc:
        raise GateInputError(f"option {name}={value!r} is not a number") from exc


def option_int(options: dict[str, Any], name: str, default: int, env: str | None = None) -> int:
    value = _option(options, name, env)
    if value is None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise GateInputError(f"option {name}={value!r} is not an integer") from exc
