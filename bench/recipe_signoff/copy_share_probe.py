"""Probe (issue 50, session 30; decides nothing): how much of a pair's residual around moving content does the copy the
ghosting gate fitted in each window explain? A lead for the near judge's remaining false alarms, where INT8 over
turbo4-tiny re-renders a flat-coloured subject (redder, a few pixels wider: recipe_signoff_s30.md) and the luma fit
reads its rim as a blend with a copy a few pixels aside, while the body's change, which no copy explains, is not
counted against the fit.

Share. Per window of the gate's own fit (gates/ghosting.py's order: the baseline compensated, then
gates.metrics.ghost.ghost_scores), on the gate's working luma (``to_luma`` at its factor and blur), for each scored
frame ``t`` of the window: ``r = C_t - B_t``, ``d = S - B_t`` with ``S`` the window's copy (frame ``t - lag`` rolled by
``(dy, dx)``), over the pixels where the residual or the copy's contribution is visible (``|r| > 4`` or
``|alpha d| > 2`` levels): ``share = 1 - sum |r - alpha d|^2 / sum |r|^2``. A ghost (the frame plus a faint copy)
leaves little but codec noise after the copy; a re-rendered subject leaves most of its difference.

Data. (1) The work folder's near pairs against turbo4-tiny whose gate p-value is small: INT8 below 0.02 (the false
alarms and their neighbours), every other candidate (the sparse rung and the plants) below 0.001. (2) Ghosts planted
on turbo4-tiny clips (alpha 0.10 and 0.05; lag-0 (0, 4), lag 2, lag 1 (2, 2)) through the runtime's encoder (CRF 18),
against the clean clip. Writes results/copy_share_probe.{json,md}.

    PYTHONPATH=. python bench/recipe_signoff/copy_share_probe.py --work /tmp/s27W/work [--pools 4,...,14]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.lib.ghosting import plant_ghost  # noqa: E402
from bench.lib.results import write  # noqa: E402
from gates.media_cache import load_video  # noqa: E402
from gates.metrics.ghost import downsample_factor, ghost_scores, to_luma  # noqa: E402
from gates.metrics.ghost_config import GhostingConfig  # noqa: E402
from gates.metrics.ghost_motion import compensate  # noqa: E402
from h3.media import decode_video, encode_mp4  # noqa: E402

CONFIG = GhostingConfig()
PLANTS = [(0, 0, 4, 0.10), (2, 0, 0, 0.10), (1, 2, 2, 0.10), (0, 0, 4, 0.05), (2, 0, 0, 0.05)]
"""(lag, dy, dx, alpha) of the planted ghosts."""
PLANT_PAIRS = [(13, "heldout-e-05-s132"), (12, "heldout-e-01-s121"), (4, "heldout-16-s42")]


def window_shares(base: np.ndarray, cand: np.ndarray) -> list[dict]:
    """Each window of the gate's fit: its first frame, p-value, copy, strength and ``share`` (None without a copy)."""
    factor = downsample_factor(base.shape[1], base.shape[2], CONFIG.work_long_side)
    moved = compensate(base, cand, factor).frames
    fs = ghost_scores(moved, cand, CONFIG)
    lb, lc = to_luma(moved, factor, CONFIG.blur_sigma), to_luma(cand, factor, CONFIG.blur_sigma)
    out = []
    for w in fs.windows:
        row = {"first_frame": w.frames[0], "p": w.p_value, "lag": w.lag, "shift": [w.dy, w.dx], "alpha": w.score,
               "share": None}
        if w.lag >= 0:
            left = total = 0.0
            for t in w.frames:
                if t - w.lag < 0:
                    continue
                r = lc[t] - lb[t]
                d = np.roll(lb[t - w.lag], (w.dy, w.dx), axis=(0, 1)) - lb[t]
                seen = (np.abs(r) > 4) | (np.abs(w.score * d) > 2)
                left += float(((r - w.score * d)[seen] ** 2).sum())
                total += float((r[seen] ** 2).sum())
            row["share"] = 1.0 - left / total if total > 0 else None
        out.append(row)
    return out


def clip(work: Path, pool: int, recipe: str, pair: str) -> np.ndarray:
    return load_video(work / f"pool{pool}" / "run" / "clips" / recipe / f"{pair}.mp4")[0]


def near_pairs(work: Path, pools: list[int]) -> list[dict]:
    rows = []
    for pool in pools:
        for f in sorted((work / f"pool{pool}" / "run" / "gates" / "ghosting").glob("*/vs-turbo4-tiny/*.json")):
            cand, pair = f.parent.parent.name, f.stem
            p = json.loads(f.read_text())["metrics"]["ghost_p_value"]["value"]
            if p > (0.02 if cand == "turbo4-tiny-int8" else 1e-3):
                continue
            shares = window_shares(clip(work, pool, "turbo4-tiny", pair), clip(work, pool, cand, pair))
            rows.append({"pool": pool, "candidate": cand, "pair": pair, "pair_p": p, "windows": shares})
            print(pool, cand, pair, f"p {p:.1e}", [w["share"] and round(w["share"], 3) for w in shares], flush=True)
    return rows


def planted(work: Path) -> list[dict]:
    rows = []
    for pool, pair in PLANT_PAIRS:
        base = clip(work, pool, "turbo4-tiny", pair)
        for lag, dy, dx, alpha in PLANTS:
            src = np.concatenate([base[:lag], base]) if lag else base
            ghost = plant_ghost(src, lag, base.shape[0], alpha, lag, dy, dx)
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "ghost.mp4"
                encode_mp4(path, ghost, None, fps=24, crf=18)
                cand = decode_video(path)[0][: base.shape[0]]
            shares = window_shares(base, cand)
            rows.append({"pool": pool, "pair": pair, "lag": lag, "shift": [dy, dx], "alpha": alpha,
                         "windows": shares})
            print("planted", pool, pair, lag, dy, dx, alpha, [w["share"] and round(w["share"], 3) for w in shares],
                  flush=True)
    return rows


def _span(values: list) -> str:
    v = [x for x in values if x is not None]
    return f"{min(v):.2f} .. {max(v):.2f} (median {float(np.median(v)):.2f}, n {len(v)})" if v else "-"


def report(near: list[dict], plants: list[dict]) -> list[str]:
    lines = ["| group | windows | share of the residual the copy explains |", "|---|---:|---|"]
    groups: dict[str, list] = {}
    for r in near:
        key = f"{r['candidate']} (pairs p <= {'0.02' if r['candidate'] == 'turbo4-tiny-int8' else '0.001'})"
        groups.setdefault(key, []).extend(w["share"] for w in r["windows"] if w["p"] <= 0.01)
    for r in plants:
        groups.setdefault(f"planted alpha {r['alpha']:.2f}", []).extend(w["share"] for w in r["windows"])
    for key, values in sorted(groups.items()):
        lines.append(f"| {key} | {sum(v is not None for v in values)} | {_span(values)} |")
    lines += ["", "Near pairs: windows with p <= 0.01 only (the ones that could decide). Planted: every window.",
              "", "| pool | candidate | pair | pair p | windows (first frame: p, lag (dy, dx), alpha, share) |",
              "|---:|---|---|---:|---|"]
    for r in near:
        ws = "; ".join(f"{w['first_frame']}: {w['p']:.1e}, {w['lag']} ({w['shift'][0]}, {w['shift'][1]}), "
                       f"{w['alpha']:.3f}, {'-' if w['share'] is None else round(w['share'], 3)}" for w in r["windows"])
        lines.append(f"| {r['pool']} | {r['candidate']} | {r['pair']} | {r['pair_p']:.1e} | {ws} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/recipe_signoff"))
    parser.add_argument("--pools", default=",".join(str(p) for p in range(4, 15)))
    parser.add_argument("--name", default="copy_share_probe")
    args = parser.parse_args()
    pools = [int(p) for p in args.pools.split(",") if p]
    near, plants = near_pairs(args.work, pools), planted(args.work)
    write(args.name, {"near": near, "planted": plants, "config": {"visible_residual": 4, "visible_copy": 2}},
          "\n".join(["Copy share probe (issue 50; decides nothing): bench/recipe_signoff/copy_share_probe.py's "
                     "docstring says what is measured.", "", *report(near, plants)]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
