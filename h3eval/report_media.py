"""The images of ``report.html`` (split from :mod:`h3eval.report`, which re-exports them): speed versus quality per
candidate and the stage anatomy of each recipe (matplotlib charts; None without matplotlib, logged), and the decoded
baseline / candidate / amplified-difference strip of a pair, each as a base64 PNG.
"""

from __future__ import annotations

import base64
import io
import logging
from pathlib import Path

import numpy as np

from h3eval.store import RecordError, RunStore, read_clip_record
from h3eval.verdict import Verdict

logger = logging.getLogger(__name__)

STRIP_FRAMES = 3
"""Frames per side in a decoded strip (first, middle, last)."""
STRIP_HEIGHT = 96
DIFF_GAIN = 8.0
"""Amplification of |baseline - candidate| in the strips: a faint ghost (seed 001) becomes visible."""

_STAGES = ("text_encode", "denoise", "video_decode", "audio_decode", "frame_prep_d2h", "mux_save", "other")


def _png_b64(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        return plt
    except ImportError:
        logger.warning("matplotlib is not installed: report.html is written without charts")
        return None


def speed_quality_chart(verdict: Verdict) -> str | None:
    """Base64 PNG: per gate metric, each candidate's speedup (x, CI bars) against its metric estimate (y, CI)."""
    plt = _pyplot()
    if plt is None:
        return None
    metrics = list(dict.fromkeys((m.gate, m.metric) for c in verdict.candidates for g in c.gates for m in g.metrics
                                 if m.mean_value is not None))[:6]
    if not metrics or not any(c.speed and c.speed.speedup for c in verdict.candidates):
        return None
    cols = min(3, len(metrics))
    rows = (len(metrics) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows), squeeze=False)
    for ax, (gate, metric) in zip(axes.flat, metrics):
        for c in verdict.candidates:
            sp = c.speed
            mv = next((m for g in c.gates for m in g.metrics if (m.gate, m.metric) == (gate, metric)), None)
            if sp is None or sp.speedup is None or mv is None or mv.mean_value is None:
                continue
            xerr = [[sp.speedup - (sp.ci_low or sp.speedup)], [(sp.ci_high or sp.speedup) - sp.speedup]]
            yerr = [[mv.mean_value - (mv.ci_low if mv.ci_low is not None else mv.mean_value)],
                    [(mv.ci_high if mv.ci_high is not None else mv.mean_value) - mv.mean_value]]
            color = {"PASS": "tab:green", "FAIL": "tab:red"}.get(mv.outcome, "tab:orange")
            ax.errorbar([sp.speedup], [mv.mean_value], xerr=xerr, yerr=yerr, fmt="o", color=color, capsize=3)
            ax.annotate(c.candidate, (sp.speedup, mv.mean_value), textcoords="offset points", xytext=(5, 5),
                        fontsize=8)
            if mv.threshold is not None:
                line = mv.threshold if mv.compare == "pair" else -mv.threshold
                ax.axhline(line, color="grey", linestyle="--", linewidth=0.8)
        mv0 = next(m for c in verdict.candidates for g in c.gates for m in g.metrics
                   if (m.gate, m.metric) == (gate, metric))
        ax.set_title(f"{gate}.{metric}", fontsize=9)
        ax.set_xlabel("speedup (x)")
        ax.set_ylabel("mean value" if mv0.compare == "pair" else "mean delta (+ = better)")
    for ax in list(axes.flat)[len(metrics):]:
        ax.axis("off")
    fig.tight_layout()
    data = _png_b64(fig)
    plt.close(fig)
    return data


def _mean_anatomy(run_dir: Path, recipe: str) -> tuple[dict[str, float], int]:
    sums = {k: 0.0 for k in _STAGES}
    n = 0
    for path in RunStore(run_dir).clip_record_paths(recipe):
        try:
            rec = read_clip_record(path)
        except RecordError:
            continue
        if rec.extra.get("warmup") is True:
            continue
        anatomy = rec.timings.stage_anatomy
        for k in _STAGES:
            sums[k] += float(getattr(anatomy, k))
        n += 1
    return ({k: v / n for k, v in sums.items()} if n else {}), n


def stage_anatomy_chart(verdict: Verdict, run_dir: Path) -> str | None:
    """Base64 PNG: mean stage anatomy per recipe (stacked horizontal bars, seconds), warm-up excluded."""
    plt = _pyplot()
    if plt is None:
        return None
    recipes = [verdict.baseline, *(c.candidate for c in verdict.candidates)]
    rows = [(r, *_mean_anatomy(run_dir, r)) for r in recipes]
    rows = [(r, a, n) for r, a, n in rows if n]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(rows) + 1.4))
    colors = plt.get_cmap("tab10").colors
    for i, (recipe, anatomy, n) in enumerate(rows):
        left = 0.0
        for j, stage in enumerate(_STAGES):
            width = anatomy[stage]
            ax.barh(i, width, left=left, color=colors[j % len(colors)], label=stage if i == 0 else None)
            left += width
        ax.text(left, i, f" {left:.3g} s (n={n})", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [r for r, _, _ in rows])
    ax.invert_yaxis()
    ax.set_xlabel("mean seconds per request")
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.35))
    fig.tight_layout()
    data = _png_b64(fig)
    plt.close(fig)
    return data


def _sample_frames(path: Path, count: int, num_frames: int | None) -> list[np.ndarray]:
    """``count`` frames spread over the clip (first, middle, last), decoding once and keeping only those.

    ``num_frames`` comes from the clip record; without it every frame is decoded and kept (small clips only).
    """
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        if not num_frames:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
            idx = np.linspace(0, len(frames) - 1, count).round().astype(int)
            return [frames[i] for i in idx]
        wanted = set(np.linspace(0, num_frames - 1, count).round().astype(int).tolist())
        return [f.to_ndarray(format="rgb24") for i, f in enumerate(container.decode(stream)) if i in wanted]


def _resize(img: np.ndarray, height: int) -> np.ndarray:
    from PIL import Image

    h, w = img.shape[:2]
    return np.asarray(Image.fromarray(img).resize((max(1, round(w * height / h)), height)))


def decoded_strip(run_dir: Path, baseline: str, candidate: str, prompt_id: str, seed: int) -> str | None:
    """Base64 PNG: rows baseline / candidate / amplified |difference| at the first, middle and last frame."""
    from PIL import Image

    store = RunStore(run_dir)
    base_mp4 = store.clip_path(baseline, prompt_id, seed)
    cand_mp4 = store.clip_path(candidate, prompt_id, seed)
    if not (base_mp4.exists() and cand_mp4.exists()):
        return None
    num_frames = None
    try:
        num_frames = read_clip_record(base_mp4.with_suffix(".json")).shape.num_frames
    except RecordError:
        pass  # no record: decode every frame of the (then presumably small) clip
    try:
        base = _sample_frames(base_mp4, STRIP_FRAMES, num_frames)
        cand = _sample_frames(cand_mp4, STRIP_FRAMES, num_frames)
    except Exception as exc:  # noqa: BLE001 - a clip that does not decode is the integrity gate's finding
        logger.warning("strip for %s/%s-s%s not made: %s", candidate, prompt_id, seed, exc)
        return None
    if len(base) != len(cand) or not base or base[0].shape != cand[0].shape:
        return None
    rows = []
    for frames in (base, cand):
        rows.append(np.concatenate([_resize(f, STRIP_HEIGHT) for f in frames], axis=1))
    diffs = [np.clip(np.abs(b.astype(np.float32) - c.astype(np.float32)) * DIFF_GAIN, 0, 255).astype(np.uint8)
             for b, c in zip(base, cand)]
    rows.append(np.concatenate([_resize(d, STRIP_HEIGHT) for d in diffs], axis=1))
    buf = io.BytesIO()
    Image.fromarray(np.concatenate(rows, axis=0)).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")
