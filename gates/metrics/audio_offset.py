"""Audio offset against the lip-sync tolerance of ITU-R BT.1359-1 (1998), "Relative timing of sound and vision for
broadcasting": the detectability thresholds are sound 45 ms *before* the picture and 125 ms *after* it (its Figure 1;
acceptability +90 / -185 ms).

:func:`offset_flag` flags a signed offset (ms, positive: the sound is late) outside ``[-lead_ms, +lag_ms]``. The
audio gate's ``offset_ms`` is the candidate track's lag behind the baseline's (the baseline is the in-sync
reference); :func:`single_clip_offset` estimates a clip's own sound-to-picture offset from its audio onsets and
motion events (the reference-free gate's ``av_sync`` events) when at least ``min_matches`` pair up. The statistic's
direction: a larger absolute offset is worse (``higher_is_better`` False).
"""

from __future__ import annotations

import math

import numpy as np

from gates.metrics.detection import Detection

higher_is_better = False
NAME = "offset_ms"
LEAD_MS = 45.0
"""Sound before the picture: BT.1359's detectability threshold."""
LAG_MS = 125.0
"""Sound after the picture: BT.1359's detectability threshold."""


def offset_flag(offset_ms_signed: float, lead_ms: float = LEAD_MS, lag_ms: float = LAG_MS) -> Detection:
    """``statistic``: the signed offset (ms, positive when the sound is late); ``threshold``: the bound on its side."""
    x = float(offset_ms_signed)
    if not math.isfinite(x):
        raise ValueError(f"offset {offset_ms_signed!r} is not finite")
    bound = lag_ms if x >= 0 else lead_ms
    return Detection(x, float(bound), abs(x) > bound, {"lead_ms": lead_ms, "lag_ms": lag_ms,
                                                        "standard": "ITU-R BT.1359-1 detectability"})


def single_clip_offset(video_events_s: list[float], audio_onsets_s: list[float], max_ms: float = 500.0,
                       min_matches: int = 2) -> float | None:
    """Median of (audio onset - nearest motion event) in ms over events with an onset within ``max_ms``; None with
    fewer than ``min_matches`` matches."""
    deltas = []
    for v in video_events_s:
        if not audio_onsets_s:
            break
        a = min(audio_onsets_s, key=lambda o: abs(o - v))
        if abs(a - v) * 1000.0 <= max_ms:
            deltas.append((a - v) * 1000.0)
    return float(np.median(deltas)) if len(deltas) >= min_matches else None
