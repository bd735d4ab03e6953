"""Thresholds of a signoff policy and the noise floor they may be stated against (split from :mod:`h3eval.policy`,
which re-exports every name here).

A threshold is a number in the metric's units, a fraction of the metric's new-seed noise floor
(:class:`FloorFraction`, read from a floor file: :func:`load_floor`, written by :func:`write_floor`) or a fraction of
the baseline's mean score over the run's pairs (:class:`BaselineFraction`); :func:`resolve_threshold` gives its value
and where it came from, or says why it is unknown (the metric is then INCONCLUSIVE, never a pass).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field

from h3.atomic import sha256_file
from h3.schema import FINITE_NUMBERS

FLOOR_VERSION = 1


class PolicyError(ValueError):
    """A policy or floor file that cannot be used; the message names the file and the key."""


class _Strict(BaseModel):
    # Strict: a boolean or a string is not a number (``min_pairs = true`` is not 1); finite: a NaN threshold compares
    # false against everything and would pass a failing candidate (issue 26), so nan and inf are refused at load.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, **FINITE_NUMBERS)


class FloorFraction(_Strict):
    """A threshold stated as a fraction of the metric's new-seed noise floor."""

    fraction_of_floor: float = Field(gt=0)
    """Multiplier of the floor value (e.g. 0.1 = a tenth of what a new seed changes)."""
    at_least: float = Field(default=0.0, ge=0)
    """The threshold is never below this (in the metric's units): a score that never moves between seeds (no
    clipping on any clip: a floor of 0) would otherwise leave a margin of 0, which no candidate can be shown to meet."""


class BaselineFraction(_Strict):
    """A ``sides`` metric's non-inferiority margin (or regression shift) stated as a fraction of the baseline's mean
    score over the run's pairs: "the candidate may lose at most 5 % of the baseline's dynamic degree". A margin on
    the scale of the mean, which the test is on (issue 50), read from the run itself (no floor file)."""

    fraction_of_baseline: float = Field(gt=0, lt=1)
    """Multiplier of |mean baseline score| over the pairs judged."""
    at_least: float = Field(default=0.0, ge=0)
    """The threshold is never below this (in the metric's units): a score whose baseline mean is near 0 (silence,
    clipping) is given an absolute margin instead."""


Threshold = float | FloorFraction | BaselineFraction



# -- noise floor ---------------------------------------------------------------------------------------------------
class NoiseFloor(BaseModel):
    """A floor file as read: ``metrics`` maps ``<gate>.<metric>`` to the metric's new-seed floor."""

    model_config = ConfigDict(frozen=True)
    path: Path
    sha256: str
    metrics: dict[str, float]


def load_floor(path: str | Path) -> NoiseFloor:
    path = Path(path)
    if path.is_dir():
        raise PolicyError(f"noise-floor file {path} is a directory")
    if not path.is_file():
        raise PolicyError(f"noise-floor file {path} does not exist")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PolicyError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("metrics"), dict):
        raise PolicyError(f"{path}: a noise-floor file needs a top-level object with a `metrics` object")
    if data.get("version", FLOOR_VERSION) != FLOOR_VERSION:
        raise PolicyError(f"{path}: unsupported floor version {data.get('version')!r} (reads {FLOOR_VERSION})")
    metrics: dict[str, float] = {}
    for key, value in data["metrics"].items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise PolicyError(f"{path}: metrics.{key} must be a finite number >= 0, got {value!r}")
        metrics[key] = float(value)
    return NoiseFloor(path=path, sha256=sha256_file(path), metrics=metrics)


def write_floor(path: str | Path, metrics: Mapping[str, float], **provenance: Any) -> NoiseFloor:
    """Write a noise-floor file in the shape :func:`load_floor` reads (for ``h3eval floor``), atomically.

    ``metrics`` maps ``<gate>.<metric>`` to the floor value; ``provenance`` (run, n pairs, date...) is kept beside it.
    """
    from h3.atomic import atomic_write_json

    if "metrics" in provenance or "version" in provenance:
        raise PolicyError("`metrics` and `version` are set by write_floor itself")
    path = Path(path)
    for key, value in metrics.items():
        if key.count(".") < 1:
            raise PolicyError(f"floor key {key!r} must be '<gate>.<metric>'")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            # Checked before writing, so that a bad floor never reaches the disk.
            raise PolicyError(f"{path}: metrics.{key} must be a finite number >= 0, got {value!r}")
    atomic_write_json(path, {"version": FLOOR_VERSION, "metrics": {k: float(v) for k, v in metrics.items()},
                             **provenance})
    return load_floor(path)


class ThresholdResolution(BaseModel):
    value: float | None
    """None when a fraction of the floor was asked and the floor is unknown."""
    source: str
    """``policy`` or ``0.1 x floor 0.41 (fidelity.lpips_mean from floor.json)``, or why it is unknown."""


def resolve_threshold(threshold: Threshold, key: str, floor: NoiseFloor | None,
                      baseline_mean: float | None = None) -> ThresholdResolution:
    """The threshold's value: as written, a fraction of ``key``'s floor, or a fraction of the baseline's mean score
    (``baseline_mean``, over the pairs judged; None: unknown)."""
    if isinstance(threshold, BaselineFraction):
        if baseline_mean is None or not math.isfinite(baseline_mean):
            return ThresholdResolution(value=None, source=f"fraction {threshold.fraction_of_baseline} of the "
                                                          f"baseline's mean {key}, which no usable pair gives")
        value = threshold.fraction_of_baseline * abs(baseline_mean)
        source = f"{threshold.fraction_of_baseline} x the baseline's mean {abs(baseline_mean):.6g} ({key})"
        if value < threshold.at_least:
            value, source = threshold.at_least, f"at_least {threshold.at_least:g} (> {source})"
        return ThresholdResolution(value=value, source=source)
    if isinstance(threshold, FloorFraction):
        if floor is None:
            return ThresholdResolution(value=None, source=f"fraction {threshold.fraction_of_floor} of the floor of "
                                                          f"{key}, but no noise-floor file was given")
        if key not in floor.metrics:
            return ThresholdResolution(value=None, source=f"fraction {threshold.fraction_of_floor} of the floor of "
                                                          f"{key}, which {floor.path.name} does not have")
        base = floor.metrics[key]
        value = threshold.fraction_of_floor * base
        source = f"{threshold.fraction_of_floor} x floor {base:.6g} ({key} from {floor.path.name})"
        if value < threshold.at_least:
            value, source = threshold.at_least, f"at_least {threshold.at_least:g} (> {source})"
        return ThresholdResolution(value=value, source=source)
    return ThresholdResolution(value=float(threshold), source="policy")
