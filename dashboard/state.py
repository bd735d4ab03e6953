"""Shared state of the dashboard's pages: the cached loading of runs and media, and the sidebar choices.

Caching is what keeps a warm page under its time budget: a run is parsed once per change of its files
(:func:`dashboard.data.fingerprint`), a clip is decoded once per (path, mtime).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np
import pandas as pd
import streamlit as st

from dashboard import data, pairview
from dashboard import sequential as seq

logger = logging.getLogger(__name__)


@dataclass
class Context:
    """What every page gets: the loaded runs and the sidebar's choices."""

    runs: list[data.RunData]
    run_index: int = 0
    hourly_rate_override: float | None = None
    """$/hour typed in the sidebar, used for runs whose run.json has no ``gpu_hourly_rate``."""

    @property
    def run(self) -> data.RunData:
        return self.runs[self.run_index]

    def rate_for(self, run: data.RunData) -> float | None:
        return run.hourly_rate if run.hourly_rate is not None else self.hourly_rate_override


@st.cache_data(show_spinner=False, max_entries=64)
def _load_run(root: str, label: str, key: tuple) -> data.RunData:
    del key  # only part of the cache key
    return data.load_run(root, label)


def _labels(roots: list[str]) -> list[str]:
    names = [os.path.basename(os.path.normpath(r)) or r for r in roots]
    return [n if names.count(n) == 1 else f"{n} ({i + 1})" for i, n in enumerate(names)]


def load_runs(roots: list[str]) -> list[data.RunData]:
    return [_load_run(r, label, data.fingerprint(r)) for r, label in zip(roots, _labels(roots))]


@st.cache_data(show_spinner=False, max_entries=64)
def speed_table(root: str, key: tuple, rate: float | None, _run: data.RunData) -> pd.DataFrame:
    del root, key
    return data.speed_table(_run, rate)


def cached_speed_table(run: data.RunData, rate: float | None) -> pd.DataFrame:
    return speed_table(run.root, data.fingerprint(run.root), rate, run)


@st.cache_data(show_spinner=False, max_entries=64)
def quality_table(root: str, key: tuple, gate: str, metric: str, _run: data.RunData) -> pd.DataFrame:
    del root, key
    return data.quality_table(_run, gate, metric)


def cached_quality_table(run: data.RunData, gate: str, metric: str) -> pd.DataFrame:
    return quality_table(run.root, data.fingerprint(run.root), gate, metric, run)


@st.cache_data(show_spinner=False, max_entries=8)
def decode_video(path: str, mtime_ns: int) -> np.ndarray:
    """Frames uint8 (T, H, W, 3) of an MP4, decoded once per (path, mtime)."""
    from h3.media import decode_video as _decode

    frames, _fps = _decode(path)
    return frames


@st.cache_data(show_spinner=False, max_entries=8)
def decode_audio(path: str, mtime_ns: int) -> tuple[np.ndarray, int]:
    from h3.media import decode_audio as _decode

    return _decode(path)


@st.cache_data(show_spinner=False, max_entries=8)
def audio_difference(base: str, base_mtime: int, cand: str, cand_mtime: int) -> dict[str, np.ndarray]:
    a, sr_a = decode_audio(base, base_mtime)
    b, sr_b = decode_audio(cand, cand_mtime)
    if sr_a != sr_b:
        raise ValueError(f"sample rates differ: {base} {sr_a} Hz vs {cand} {sr_b} Hz")
    out = pairview.audio_difference(a, b, sr_a)
    out["sample_rate"] = np.array(sr_a)
    return out


@st.cache_data(show_spinner=False, max_entries=16)
def _sequential(root: str, label: str, key: tuple) -> seq.SequentialRecord:
    del key  # only part of the cache key
    return seq.load_sequential(root, label)


def cached_sequential(root: str, label: str) -> seq.SequentialRecord:
    """The run's sequential.json, read and checked once per change of the file (its mtime and size: a running
    sequential run rewrites it after every look)."""
    try:
        st_ = os.stat(seq.sequential_path(root))
        key: tuple = (st_.st_mtime_ns, st_.st_size)
    except OSError:
        key = ()
    return _sequential(root, label, key)


def mtime_ns(path: str) -> int:
    return os.stat(path).st_mtime_ns


def sidebar_run(runs: list[data.RunData]) -> int:
    """The run the per-run pages show (viewer, gates, trajectory, verdict); ``?run=N`` preselects it."""
    if len(runs) == 1:
        st.sidebar.caption(f"Run: **{runs[0].label}**")
        return 0
    if "run_index" not in st.session_state:
        try:
            wanted = int(st.query_params.get("run", 0))
        except ValueError:
            wanted = 0
        st.session_state["run_index"] = wanted if 0 <= wanted < len(runs) else 0
    return st.sidebar.selectbox(
        "Run (per-run pages)", list(range(len(runs))), key="run_index", format_func=lambda i: runs[i].label
    )


def sidebar_rate(runs: list[data.RunData]) -> float | None:
    """A $/hour for runs that did not record ``gpu_hourly_rate``; None (no $/clip shown) until one is typed."""
    missing = [r.label for r in runs if r.hourly_rate is None]
    if not missing:
        st.sidebar.caption("$/hour from each run's `gpu_hourly_rate`.")
        return None
    return st.sidebar.number_input(
        "Machine $/hour (runs without gpu_hourly_rate)",
        min_value=0.0,
        value=None,
        step=0.5,
        key="hourly_rate",
        help="Used for $/clip of: " + ", ".join(missing),
    )


def show_notices(runs: list[data.RunData]) -> None:
    """On top of every page: what a run's weights make of its numbers (random weights: speed and memory are real,
    quality is not)."""
    for run in runs:
        for notice in run.notices:
            st.warning(f"{run.label}: {notice}")


def show_problems(runs: list[data.RunData]) -> None:
    for run in runs:
        if run.problems:
            with st.sidebar.expander(f"{run.label}: {len(run.problems)} unreadable file(s)"):
                for p in run.problems:
                    st.caption(p)
