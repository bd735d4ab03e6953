"""p-values of the paired ghost estimator against the benign null: a window's evidence against its calibrated
exponential tail (bench/ghosting/results/ghosting_calibration.md), the weighted Bonferroni combination with the fine lag-0
pass, and a pair's p-value by Simes' test over its windows. The run-level test over the pairs' p-values
(Benjamini-Hochberg) is h3eval.stats.ghost_run_test. A p-value: ``higher_is_better`` True."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from gates.metrics.ghost_config import GhostingConfig

if TYPE_CHECKING:
    from gates.metrics.ghost_config import FrameScores

higher_is_better = True


def tail_p(evidence: float, config: GhostingConfig, fine: bool = False) -> float:
    """The calibrated exponential tail of the coarse (or the fine pass's) benign window evidence, capped at 1."""
    if not math.isfinite(evidence):
        raise ValueError(f"window evidence {evidence} is not finite")
    if evidence <= 0:
        return 1.0
    u, p_u, scale = ((config.fine_null_tail_u, config.fine_null_tail_p, config.fine_null_tail_scale) if fine
                     else (config.null_tail_u, config.null_tail_p, config.null_tail_scale))
    return float(min(1.0, p_u * math.exp(-(evidence - u) / scale)))


def window_p_value(evidence: float, config: GhostingConfig, fine_evidence: float | None = None) -> float:
    """p-value of a window under the benign null: the coarse fit's ``evidence`` against its calibrated tail; where
    the fine lag-0 pass ran (``fine_evidence`` not None), the weighted Bonferroni combination with the fine pass's
    evidence against its own tail (GhostingConfig.fine_lag0_weight)."""
    p = tail_p(evidence, config)
    if fine_evidence is None:
        return p
    w = config.fine_lag0_weight
    return float(min(1.0, p / (1.0 - w), tail_p(fine_evidence, config, fine=True) / w))


def simes(pvalues) -> float:
    """Simes' combined p-value ``min_i m p_(i) / i`` (1.0 for none): the pair's p-value from its windows."""
    p = np.sort(np.asarray(pvalues, dtype=np.float64))
    if p.size == 0:
        return 1.0
    return float(min(1.0, np.min(p.size * p / np.arange(1, p.size + 1))))


def tested_windows(items: list, opening: int = GhostingConfig.opening_windows) -> list:
    """The windows (or their p-values) a pair's p-value combines: all but the first ``opening`` when the clip has more
    than that (GhostingConfig.opening_windows: the opening is reported, not tested), else all of them."""
    return list(items[opening:]) if len(items) > opening else list(items)


def pair_p_value(fs: "FrameScores", config: GhostingConfig | None = None) -> float:
    """The pair's p-value: Simes over its tested windows (:func:`tested_windows`; 1.0 without windows)."""
    opening = (config or GhostingConfig()).opening_windows
    return simes([w.p_value for w in tested_windows(fs.windows, opening)])

