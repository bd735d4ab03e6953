"""Audio dropout: a gap inside the soundtrack (the level falls and comes back).

The track's level in ``window_ms`` windows (RMS over channels, dBFS). A window is dropped when its level is more
than ``drop_db`` below the track's median level of its non-silent windows, or under -90 dBFS; a dropout is a run of
dropped windows with sound (not dropped) on *both* sides: silence before a sound starts or after it ends is not a
dropout. ``dropout_ms`` is the longest dropout (higher is worse); flagged at ``THRESHOLD_MS`` or longer (calibrated:
bench/artifact_detectors/results/artifact_detectors.md).
"""

from __future__ import annotations

import numpy as np

from gates.metrics.detection import Detection

higher_is_better = False
NAME = "dropout_ms"
THRESHOLD_MS = 25.0
WINDOW_MS = 10.0
DROP_DB = 40.0


def levels_db(audio: np.ndarray, sample_rate: int, window_ms: float = WINDOW_MS) -> np.ndarray:
    x = np.asarray(audio, np.float64)
    x = x[None] if x.ndim == 1 else x
    if not np.isfinite(x).all():
        raise ValueError("the audio track has NaN/Inf samples")
    n = max(1, int(round(window_ms * sample_rate / 1000.0)))
    count = x.shape[1] // n
    if count < 3:
        raise ValueError(f"a track of {x.shape[1]} samples is too short for {window_ms} ms windows")
    blocks = x[:, : count * n].reshape(x.shape[0], count, n)
    rms = np.sqrt((blocks ** 2).mean(axis=(0, 2)))
    return 20.0 * np.log10(np.maximum(rms, 1e-10))


def audio_dropout(audio: np.ndarray, sample_rate: int, window_ms: float = WINDOW_MS, drop_db: float = DROP_DB,
                  threshold_ms: float = THRESHOLD_MS) -> Detection:
    level = levels_db(audio, sample_rate, window_ms)
    sounding = level > -90.0
    if not sounding.any():
        return Detection(0.0, float(threshold_ms), False, {"silent": True})
    reference = float(np.median(level[sounding]))
    dropped = (level < reference - drop_db) | ~sounding
    longest, start_at, run_start = 0, None, None
    for i, d in enumerate(dropped):
        if d and run_start is None:
            run_start = i
        elif not d and run_start is not None:
            if run_start > 0 and i - run_start > longest:  # sound before the run and after it
                longest, start_at = i - run_start, run_start
            run_start = None
    ms = longest * window_ms
    return Detection(float(ms), float(threshold_ms), ms >= threshold_ms,
                     {"start_s": None if start_at is None else round(start_at * window_ms / 1000.0, 3),
                      "median_level_dbfs": round(reference, 2)})
