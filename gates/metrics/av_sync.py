"""Audio-visual sync (higher is better, 0..1): audio onsets (spectral flux peaks, :func:`audio_onsets`) against motion
events (peaks of the acceleration of the mean flow of moving pixels: bounces, starts, appearances;
:func:`motion_events`), matched one to one within a tolerance; the F1 score of the match (:func:`sync_f1`). A clip
with no event on either track scores 1 (nothing is out of sync); events on one track only score 0."""

from __future__ import annotations

import numpy as np

higher_is_better = True


MOVING_PX = 0.5
"""Flow magnitude (pixels per frame at the analysed size) above which a pixel moves."""


def motion_events(flows: list[np.ndarray], fps: float, min_accel_px: float = 0.75, rel: float = 4.0) -> list[float]:
    """Times (s) of motion events: peaks of ``|v_t - v_{t-1}|`` where ``v_t`` is the mean flow of the moving pixels
    between frames t and t+1 (zero when nothing moves); a peak is the largest within two frames either side and above
    both ``min_accel_px`` and ``rel`` times the median. The event is at frame t (the frame the motion changes at)."""
    if len(flows) < 3:
        return []
    v = []
    for f in flows:
        moving = np.hypot(f[..., 0], f[..., 1]) > MOVING_PX
        v.append(f[moving].mean(axis=0) if moving.any() else np.zeros(2, np.float32))
    v = np.array(v, np.float64)
    accel = np.concatenate([[0.0], np.hypot(*(v[1:] - v[:-1]).T)])  # accel[t]: change between flows t-1 and t
    threshold = max(min_accel_px, rel * float(np.median(accel)))
    out = []
    for t in range(1, len(accel)):
        window = accel[max(0, t - 2):t + 3]
        if accel[t] >= threshold and accel[t] == window.max() and (not out or t / fps - out[-1] > 2 / fps):
            out.append(t / fps)
    return out


def audio_onsets(audio: np.ndarray, sample_rate: int, hop_s: float = 0.005, n_fft: int = 1024,
                 rel: float = 6.0, min_gap_s: float = 0.1, edge_s: float = 0.04) -> list[float]:
    """Onset times (s): peaks of the half-wave rectified spectral flux of log magnitudes (Bello et al. 2005), above
    ``rel`` times the flux's median absolute level plus a small absolute floor, at least ``min_gap_s`` apart, away
    from the track's edges (a track starts and stops abruptly: no events)."""
    mono = np.asarray(audio, np.float64)
    mono = mono.mean(axis=0) if mono.ndim == 2 else mono
    hop = max(1, int(round(hop_s * sample_rate)))
    if len(mono) < n_fft + hop:
        return []
    frames = np.lib.stride_tricks.sliding_window_view(mono, n_fft)[::hop] * np.hanning(n_fft)
    mag = np.log1p(100.0 * np.abs(np.fft.rfft(frames, axis=1)))
    flux = np.concatenate([[0.0], np.maximum(0.0, np.diff(mag, axis=0)).sum(axis=1)])
    threshold = rel * float(np.median(flux)) + 1.0
    duration = len(mono) / sample_rate
    out: list[float] = []
    for i in range(1, len(flux) - 1):
        if flux[i] >= threshold and flux[i] >= flux[i - 1] and flux[i] > flux[i + 1]:
            t = (i * hop + n_fft / 2) / sample_rate
            if edge_s <= t <= duration - edge_s and (not out or t - out[-1] >= min_gap_s):
                out.append(t)
    return out


def sync_f1(video: list[float], audio: list[float], tolerance_s: float) -> float:
    """F1 of a greedy one-to-one matching (closest pairs first) of event times within ``tolerance_s``."""
    if not video and not audio:
        return 1.0
    if not video or not audio:
        return 0.0
    candidates = sorted((abs(v - a), i, j) for i, v in enumerate(video) for j, a in enumerate(audio)
                        if abs(v - a) <= tolerance_s)
    used_v, used_a, matched = set(), set(), 0
    for _, i, j in candidates:
        if i not in used_v and j not in used_a:
            used_v.add(i)
            used_a.add(j)
            matched += 1
    return 2.0 * matched / (len(video) + len(audio))
