"""Run-level ghost test: a faint stale copy in every pair of a run, pooled over the run's pairs (seed 001's ghost).

A ghost from an attention or cache defect is the same kind of copy in every pair a recipe renders, at a strength
(alpha 0.05) that one pair cannot separate from what a codec does at the per-pair false-alarm rate the gate's
Benjamini-Hochberg test needs (the window evidence of a 0.05 ghost is about 0.03-0.05, and a pair p-value below
0.01 / 16 needs about 0.06). Pooled over 16 pairs the same evidence is clear. Per pair the statistic is
``ghost_stale_evidence``: the mean over the pair's windows of the in-place copy's evidence
(:attr:`gates.metrics.ghost_config.PooledWindow.stale_evidence`: frame ``t - lag`` at the same pixels, lag 1..4, the
one-sided lower bound of its pooled strength over the visible, non-aligned blocks). The in-place copy is one fixed
copy per lag (not the best of the 81 shifts the pair test searches), so benign pairs score near 0 on it; a blur or a
blocky re-encode is absorbed by the fit's nuisance regressors. The run FAILs when the mean over its pairs exceeds
``THRESHOLD`` (bench/artifact_detectors/results/ghost_runs.md: fitted on data made there, rates published on held-out
footage and held-out tiny prompts). A NaN or infinite pair statistic is refused, never read as a pass.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from gates.metrics.ghost_config import FrameScores

higher_is_better = False
NAME = "ghost_stale_evidence"
THRESHOLD = 0.013
"""bench/artifact_detectors/results/ghost_runs.md: fit_threshold on the fit pairs gave 0.0129 (28 fit sources, 4
clean, blurred and blocky kinds); rounded up."""
Z = 3.09
"""One-sided normal quantile of the fitted bound (0.1%)."""
RUN = 16


def pair_statistic(fs: "FrameScores") -> float:
    """``ghost_stale_evidence`` of one pair: the mean over its windows of the in-place copy's evidence (0.0 without
    windows, and for an identical pair)."""
    if not fs.windows:
        return 0.0
    return float(np.mean([w.stale_evidence for w in fs.windows]))


def run_statistic(values) -> float:
    """The run's statistic: the mean of its pairs' ``ghost_stale_evidence``; ValueError on none or a non-finite one."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1 or v.size == 0:
        raise ValueError(f"expected a non-empty list of pair statistics, got shape {v.shape}")
    if not np.isfinite(v).all():
        raise ValueError("a pair's ghost_stale_evidence is NaN or infinite")
    return float(v.mean())


def run_fails(values, threshold: float = THRESHOLD) -> bool:
    """True when the run's mean ``ghost_stale_evidence`` exceeds ``threshold``."""
    if not math.isfinite(threshold):
        raise ValueError(f"threshold {threshold} is not finite")
    return run_statistic(values) > threshold


def fit_threshold(null_kinds: dict[str, list[float]], run: int = RUN, z: float = Z) -> float:
    """The largest over benign kinds of ``mean + z * sd / sqrt(run)`` of their pair statistics (a run made only of
    that kind stays below it with probability about 1 - Phi(-z), the normal approximation of the run mean)."""
    bounds = []
    for kind, values in null_kinds.items():
        v = np.asarray(values, dtype=np.float64)
        if v.size < 2 or not np.isfinite(v).all():
            raise ValueError(f"benign kind {kind!r}: need at least 2 finite pair statistics, got {v.size}")
        bounds.append(float(v.mean() + z * v.std(ddof=1) / math.sqrt(run)))
    return max(bounds)
