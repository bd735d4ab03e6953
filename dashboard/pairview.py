"""The clip viewer's pieces for the review dashboard: one pair's amplified difference, flagged and worst frames,
inputs, per-side metrics and per-frame series, the trajectory tables and the audio difference. Pure functions over
what the run store and the gates wrote, no Streamlit (tests/test_dashboard_data.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from dashboard.data import TRAJECTORY_GATE
from h3eval.store import RunStore, StoreError

if TYPE_CHECKING:
    from dashboard.data import RunData


def amplified_difference(baseline: np.ndarray, candidate: np.ndarray, gain: float) -> np.ndarray:
    """|baseline - candidate| x gain, clipped to uint8: makes faint differences (a ghost at a few grey levels)
    visible. Frames are uint8 (..., H, W, 3) of the same shape."""
    if baseline.shape != candidate.shape:
        raise ValueError(f"frame shapes differ: baseline {baseline.shape} vs candidate {candidate.shape}")
    diff = np.abs(baseline.astype(np.int16) - candidate.astype(np.int16)).astype(np.float32) * np.float32(gain)
    return np.clip(diff, 0, 255).astype(np.uint8)


_FRAME_IN_NAME = re.compile(r"(?:frame|_f|-f)[_-]?(\d+)", re.IGNORECASE)


def frame_artifacts(artifacts: list[str]) -> tuple[dict[int, str], list[str]]:
    """Split a gate's artifact paths into per-frame images ({frame: path}, from names like ``heatmap_f0012.png``
    or ``frame-12.png``) and the rest (whole-pair images such as strips)."""
    per_frame: dict[int, str] = {}
    other: list[str] = []
    for path in artifacts:
        if not path.lower().endswith((".png", ".jpg", ".jpeg", ".webp")):
            continue
        m = None
        for m in _FRAME_IN_NAME.finditer(Path(path).stem):
            pass
        if m is not None:
            per_frame[int(m.group(1))] = path
        else:
            other.append(path)
    return per_frame, other


def flagged_frames(result: dict[str, Any] | None, series_name: str | None = None) -> list[int]:
    """Frames a gate marked for this pair: the frame list the gate published (``info.ghost_frame_indices`` of the
    ghosting gate, or ``info.flagged_frames``), else the frames of ``series_name`` at or above the threshold the gate
    published (``info.threshold`` or ``info.config.frame_threshold``; the ghosting gate's rule is ">=")."""
    if not result:
        return []
    info = result.get("info") or {}
    for key in ("ghost_frame_indices", "flagged_frames"):
        listed = info.get(key)
        if isinstance(listed, list):
            return sorted(int(f) for f in listed if isinstance(f, (int, float)))
    threshold = info.get("threshold")
    if threshold is None and isinstance(info.get("config"), dict):
        threshold = info["config"].get("frame_threshold")
    series = (result.get("series") or {}).get(series_name or "", None)
    if isinstance(threshold, (int, float)) and isinstance(series, list):
        return [i for i, v in enumerate(series) if v is not None and v >= threshold]
    return []


def worst_frame(result: dict[str, Any] | None) -> int | None:
    """The frame a gate named as its worst (``info.worst_frames[0].frame``), where the viewer should open."""
    worst = ((result or {}).get("info") or {}).get("worst_frames")
    if isinstance(worst, list) and worst and isinstance(worst[0], dict) and isinstance(worst[0].get("frame"), int):
        return int(worst[0]["frame"])
    return None


ANCHOR_FRAME = {"first_frame": 0, "last_frame": -1}
"""The frame of a clip each keyframe role anchors (a reference image has none: the viewer's current frame)."""


def pair_inputs(run: RunData, prompt_id: str, seed: int) -> tuple[str, list[dict[str, Any]]]:
    """The workflow and the image inputs of the baseline clip of (prompt, seed): role, sha256 and the decoded image
    (h3.conditioning.ImageInput) or, when the run's copy is missing or altered, the problem."""
    rows = run.clips[(run.clips["recipe"] == run.baseline) & (run.clips["prompt_id"] == prompt_id)
                     & (run.clips["seed"] == seed)] if run.baseline else run.clips.iloc[:0]
    if not len(rows):
        return "t2va", []
    store, out = RunStore(run.root), []
    for role, sha in rows.iloc[0]["conditioning"] or []:
        try:
            out.append({"role": role, "sha256": sha, "image": store.read_input(sha), "problem": None})
        except StoreError as exc:
            out.append({"role": role, "sha256": sha, "image": None, "problem": str(exc)})
    return str(rows.iloc[0]["workflow"]), out


def side_metrics(result: dict[str, Any] | None) -> pd.DataFrame:
    """A ``sides`` gate result (the keyframe gate) as metric | candidate | baseline | candidate - baseline."""
    metrics = (result or {}).get("metrics") or {}
    rows = []
    for name, entry in metrics.items():
        if name.endswith(".baseline"):
            continue
        cand = entry.get("value")
        base = (metrics.get(f"{name}.baseline") or {}).get("value")
        rows.append({"metric": name, "candidate": cand, "baseline": base,
                     "candidate - baseline": cand - base if cand is not None and base is not None else None,
                     "better": "higher" if entry.get("higher_is_better") else "lower"})
    return pd.DataFrame(rows, columns=["metric", "candidate", "baseline", "candidate - baseline", "better"])


def pair_series(run: RunData, candidate: str, prompt_id: str, seed: int) -> pd.DataFrame:
    """Every per-frame series any gate wrote for this pair, long format (gate, series, index, value).
    Per-step series of the trajectory gate are left to the trajectory page."""
    rows = []
    for (gate, cand, pid, s), result in run.gate_results.items():
        if cand != candidate or pid != prompt_id or s != seed or gate == TRAJECTORY_GATE:
            continue
        for name, values in (result.get("series") or {}).items():
            for i, v in enumerate(values):
                rows.append({"gate": gate, "series": f"{gate}:{name}" if name != gate else name, "index": i,
                             "value": v})
    return pd.DataFrame(rows, columns=["gate", "series", "index", "value"])


def trajectory_table(run: RunData) -> pd.DataFrame:
    """Per-step divergence series of the trajectory gate, long format (candidate, pair, series, step, value)."""
    rows = []
    for (gate, cand, pid, seed), result in run.gate_results.items():
        if gate != TRAJECTORY_GATE:
            continue
        for name, values in (result.get("series") or {}).items():
            for step, v in enumerate(values):
                rows.append({"candidate": cand, "pair": f"{pid}-s{seed}", "series": name, "step": step, "value": v})
    return pd.DataFrame(rows, columns=["candidate", "pair", "series", "step", "value"])


TRAJECTORY_MODALITIES = ("video", "audio")


def trajectory_schedules(run: RunData) -> pd.DataFrame:
    """Per trajectory pair and modality, what the gate compared: both sides' step counts, the noise levels both
    schedules visited (the only ones the per-step series cover), whether the schedules differ (the gate's note), and
    the gate's final x0 relative L2 (its metric ``<modality>_x0_rel_l2_final``: what decodes into the clip)."""
    rows = []
    for (gate, cand, pid, seed), result in sorted(run.gate_results.items()):
        if gate != TRAJECTORY_GATE or result.get("status") != "ok":
            continue
        info, metrics = result.get("info") or {}, result.get("metrics") or {}
        for modality in TRAJECTORY_MODALITIES:
            steps = info.get(f"{modality}_steps")
            if not (isinstance(steps, list) and len(steps) == 2):
                continue
            common = info.get(f"{modality}_common_t") or []
            final = (metrics.get(f"{modality}_x0_rel_l2_final") or {}).get("value")
            rows.append({"candidate": cand, "prompt_id": pid, "seed": seed, "modality": modality,
                         "baseline_steps": int(steps[0]), "candidate_steps": int(steps[1]),
                         "common_levels": len(common), "common_t": [float(t) for t in common],
                         "differ": bool(info.get(f"{modality}_note")) or steps[0] != steps[1]
                         or len(common) != steps[0],
                         "note": info.get(f"{modality}_note"),
                         "final_x0_rel_l2": float(final) if isinstance(final, (int, float)) else None})
    return pd.DataFrame(rows, columns=["candidate", "prompt_id", "seed", "modality", "baseline_steps",
                                       "candidate_steps", "common_levels", "common_t", "differ", "note",
                                       "final_x0_rel_l2"])


def audio_difference(
    baseline: np.ndarray, candidate: np.ndarray, sample_rate: int, *, nperseg: int = 1024
) -> dict[str, np.ndarray]:
    """Mono waveforms, their difference and the log-spectrogram difference (candidate - baseline, dB).

    Inputs are float (channels, N) in [-1, 1]; the shorter length is used (an offset or length mismatch shows up
    as a large difference, which is what a reviewer should see). Uses scipy.signal.spectrogram with a Hann window.
    """
    from scipy.signal import spectrogram

    n = min(baseline.shape[-1], candidate.shape[-1])
    a = np.asarray(baseline, dtype=np.float64)[..., :n].mean(axis=0)
    b = np.asarray(candidate, dtype=np.float64)[..., :n].mean(axis=0)
    nperseg = min(nperseg, n) if n else nperseg
    freqs, times, sa = spectrogram(a, fs=sample_rate, window="hann", nperseg=nperseg)
    _, _, sb = spectrogram(b, fs=sample_rate, window="hann", nperseg=nperseg)
    floor = 1e-12  # keeps log10 finite on digital silence
    db = 10.0 * np.log10(sb + floor) - 10.0 * np.log10(sa + floor)
    return {"baseline": a, "candidate": b, "difference": b - a, "freqs": freqs, "times": times, "spec_diff_db": db}


def envelope(signal: np.ndarray, points: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Min/max envelope of ``signal`` in ``points`` buckets (bucket start index, min, max): a waveform plot that
    keeps peaks and stays small enough to draw fast."""
    n = len(signal)
    if n == 0:
        return np.array([]), np.array([]), np.array([])
    points = max(1, min(points, n))
    edges = np.linspace(0, n, points + 1).astype(int)
    lo = np.minimum.reduceat(signal, edges[:-1])
    hi = np.maximum.reduceat(signal, edges[:-1])
    return edges[:-1], lo, hi
