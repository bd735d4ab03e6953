"""Clip viewer: on top, baseline and candidate played in sync (dashboard.views.player: one controller, frame
stepping, A/B wipe and flicker); below, baseline | candidate | amplified difference | ghosting heatmap on one frame
scrubber, with the gate flags on the timeline, per-frame gate curves and the audio difference. For fl2va and
ref2va clips, each keyframe or reference image beside the frames it conditions, with the keyframe gate's scores."""

from __future__ import annotations

from pathlib import Path

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

from dashboard import data, pairview, state
from dashboard.views import ghost_strip, player
from h3.media import MediaError

GHOSTING_GATE = "ghosting"
KEYFRAME_GATE = "keyframe"


def _pairs(run: data.RunData) -> pd.DataFrame:
    """(candidate, prompt_id, seed) of every pair the run has a candidate clip or a gate result for."""
    clips = run.clips[run.clips["recipe"].isin(run.candidates)][["recipe", "prompt_id", "seed"]]
    clips = clips.rename(columns={"recipe": "candidate"})
    gates = run.gates[["candidate", "prompt_id", "seed"]] if len(run.gates) else clips.iloc[:0]
    return pd.concat([clips, gates]).drop_duplicates().sort_values(["candidate", "prompt_id", "seed"])


def _default(options: list, key: str, cast=str):
    raw = st.query_params.get(key)
    try:
        value = cast(raw) if raw is not None else None
    except ValueError:
        value = None
    return options.index(value) if value in options else 0


def _clip(run: data.RunData, recipe: str, prompt_id: str, seed: int) -> str | None:
    rows = run.clips[(run.clips["recipe"] == recipe) & (run.clips["prompt_id"] == prompt_id)
                     & (run.clips["seed"] == seed)]
    if not len(rows):
        return None
    path = rows.iloc[0]["mp4"]
    return path if Path(path).exists() else None


def render(ctx: state.Context) -> None:
    run = ctx.run
    pairs = _pairs(run)
    if run.baseline is None or not len(pairs):
        st.info(f"{run.label} has no (baseline, candidate) pairs to view.")
        return
    c1, c2, c3, c4 = st.columns(4)
    cands = sorted(pairs["candidate"].unique())
    cand = c1.selectbox("Candidate", cands, index=_default(cands, "candidate"), key="viewer_candidate")
    prompts = sorted(pairs[pairs["candidate"] == cand]["prompt_id"].unique())
    prompt = c2.selectbox("Prompt", prompts, index=_default(prompts, "prompt"), key="viewer_prompt")
    seeds = sorted(int(s) for s in pairs[(pairs["candidate"] == cand) & (pairs["prompt_id"] == prompt)]["seed"])
    seed = c3.selectbox("Seed", seeds, index=_default(seeds, "seed", int), key="viewer_seed")
    gain = c4.slider("Difference gain", 1, 64, 8, key="viewer_gain",
                     help="|baseline - candidate| is multiplied by this before display")

    results = {g: r for (g, c, p, s), r in run.gate_results.items() if c == cand and p == prompt and s == seed}
    st.caption(f"Pair **{run.baseline}** vs **{cand}**, prompt `{prompt}`, seed {seed}.")

    base_mp4 = _clip(run, run.baseline, prompt, seed)
    cand_mp4 = _clip(run, cand, prompt, seed)
    if base_mp4 is None or cand_mp4 is None:
        missing = [name for name, p in ((run.baseline, base_mp4), (cand, cand_mp4)) if p is None]
        st.info(f"Clip missing for {', '.join(missing)}: frames cannot be shown for this pair.")
        _flags(run, cand, prompt, seed, results)
        _curves(run, cand, prompt, seed, results, frame=None)
        return
    _players(run, cand, prompt, seed, base_mp4, cand_mp4)
    _flags(run, cand, prompt, seed, results)

    try:
        a = state.decode_video(base_mp4, state.mtime_ns(base_mp4))
        b = state.decode_video(cand_mp4, state.mtime_ns(cand_mp4))
    except (MediaError, OSError) as exc:  # a corrupt clip is shown as such; the integrity gate reports it too
        st.error(f"Could not decode the clips: {exc}")
        return
    if a.shape[1:] != b.shape[1:]:
        st.warning(f"Frame sizes differ (baseline {a.shape[1:3]}, candidate {b.shape[1:3]}): no difference image.")
    if len(a) != len(b):
        st.warning(f"Frame counts differ (baseline {len(a)}, candidate {len(b)}): the scrubber covers the shorter.")
    n = min(len(a), len(b))
    ghost = results.get(GHOSTING_GATE)
    worst = pairview.worst_frame(ghost)
    start = worst if worst is not None and worst < n else 0  # open where the ghosting gate saw the most
    frame = st.slider("Frame", 0, max(0, n - 1), start, key="viewer_frame") if n > 1 else 0
    if worst is not None:
        details = ", ".join(
            f"{w['frame']} (ghost_score {w.get('ghost_score', float('nan')):.3f}"
            + (f", copy of frame t-{w['lag']} shifted ({w.get('dy')}, {w.get('dx')}) px" if "lag" in w else "") + ")"
            for w in ghost["info"]["worst_frames"] if isinstance(w, dict) and "frame" in w)
        st.caption(f"Ghosting gate's worst frames: {details}")

    heat_frames, heat_other = pairview.frame_artifacts((ghost or {}).get("artifacts", []))
    cols = st.columns(4)
    # PNG, not the default JPEG: a faint ghost is exactly what lossy re-compression would blur away.
    cols[0].image(a[frame], caption=f"baseline · frame {frame}", width="stretch", output_format="PNG")
    cols[1].image(b[frame], caption=f"candidate · frame {frame}", width="stretch", output_format="PNG")
    if a.shape[1:] == b.shape[1:]:
        diff = pairview.amplified_difference(a[frame], b[frame], gain)
        cols[2].image(diff, caption=f"|difference| x {gain}", width="stretch", output_format="PNG")
        cols[2].caption(f"amplified difference: mean {diff.mean():.2f}, max {int(diff.max())} (of 255)")
    heat = _heatmap_for(heat_frames, frame)
    if heat is not None and (Path(run.root) / heat).exists():
        cols[3].image(str(Path(run.root) / heat), caption=f"ghosting heatmap · {Path(heat).name}", width="stretch")
    elif ghost is None:
        cols[3].info("No ghosting result for this pair yet.")
    elif heat_other:
        cols[3].info("The ghosting gate drew its heatmaps as a strip of its worst frames: below.")
    else:
        cols[3].info("The ghosting gate wrote no heatmap for this pair.")
    for rel in heat_other:  # whole-pair images (the ghosting strip: frames, difference and heatmap side by side)
        path = Path(run.root) / rel
        if not path.exists():
            st.warning(f"ghosting artifact listed but missing on disk: {rel}")
            continue
        strip_frames = ((ghost or {}).get("info") or {}).get("strip_frames")
        frames = tuple(int(f) for f in strip_frames) if isinstance(strip_frames, list) else None
        png = _labelled_strip(str(path), state.mtime_ns(str(path)), frames, a.shape[1], a.shape[2])
        if png is None:
            st.image(str(path), caption=f"ghosting · {Path(rel).name}", width="stretch")
            st.caption("Not the ghosting gate's strip layout (rows of baseline | candidate | difference | heatmap): "
                       "shown as written, unlabelled.")
        else:
            st.image(png, caption=f"ghosting · {Path(rel).name}", width="stretch")
            st.caption(ghost_strip.HEATMAP_MEANING.format(heat_max=ghost_strip.strip_settings()[1]))

    _conditioning(run, prompt, seed, results, a, b, frame)
    _curves(run, cand, prompt, seed, results, frame=frame)

    _audio(base_mp4, cand_mp4)


def _players(run, cand, prompt, seed, base_mp4: str, cand_mp4: str) -> None:
    """Baseline and candidate played in sync (one controller), at the top of the page; two plain players when the
    pair is too large to embed."""
    rows = run.clips[(run.clips["prompt_id"] == prompt) & (run.clips["seed"] == seed)]
    shape = {r.recipe: (float(r.fps), int(r.num_frames)) for r in rows.itertuples() if r.recipe in (run.baseline, cand)}
    (fps_a, n_a), (fps_b, n_b) = shape.get(run.baseline, (0.0, 0)), shape.get(cand, (0.0, 0))
    if fps_a != fps_b:
        st.warning(f"Frame rates differ (baseline {fps_a:g}, candidate {fps_b:g} fps): the players follow the "
                   "baseline's clock.")
    if fps_a > 0 and player.fits(base_mp4, cand_mp4):
        st.caption("Synchronized players: one play, pause and seek; -1 / +1 frame (or the arrow keys) steps at the "
                   f"clip's {fps_a:g} fps; view: side by side, A/B wipe or A/B flicker.")
        player.render(base_mp4, cand_mp4, fps_a, min(n_a, n_b) if n_a and n_b else max(n_a, n_b),
                      f"{run.baseline} · {Path(base_mp4).name}", f"{cand} · {Path(cand_mp4).name}")
        return
    why = ("the records give no frame rate" if fps_a <= 0 else
           f"the two clips are over {player.MAX_EMBED_BYTES // 2**20} MiB together")
    st.info(f"Players not synchronized ({why}): two independent players.")
    v1, v2 = st.columns(2)
    v1.caption(f"baseline: {Path(base_mp4).name}")
    v1.video(base_mp4)
    v2.caption(f"candidate: {Path(cand_mp4).name}")
    v2.video(cand_mp4)


@st.cache_data(show_spinner=False, max_entries=16)
def _labelled_strip(path: str, mtime_ns: int, frames: tuple[int, ...] | None, height: int, width: int) -> bytes | None:
    from PIL import Image

    with Image.open(path) as image:
        strip = np.asarray(image.convert("RGB"))
    return ghost_strip.labelled_png(strip, list(frames) if frames is not None else None, height, width)


def _conditioning(run, prompt, seed, results, a: np.ndarray, b: np.ndarray, frame: int) -> None:
    """The pair's keyframes / reference beside the baseline and candidate frames they condition, and the keyframe
    gate's scores of both sides."""
    workflow, inputs = pairview.pair_inputs(run, prompt, seed)
    if not inputs:
        return
    st.subheader(f"Conditioning ({workflow})")
    for item in inputs:
        cols = st.columns(3)
        role = item["role"]
        if item["image"] is None:
            cols[0].warning(f"{role}: {item['problem']}")
        else:
            cols[0].image(item["image"].pixels, caption=f"{role} · sha256 {item['sha256'][:12]}", width="stretch",
                          output_format="PNG")
        index = pairview.ANCHOR_FRAME.get(role, frame)
        index = index % min(len(a), len(b)) if min(len(a), len(b)) else 0
        cols[1].image(a[index], caption=f"baseline · frame {index}", width="stretch", output_format="PNG")
        cols[2].image(b[index], caption=f"candidate · frame {index}", width="stretch", output_format="PNG")
    result = results.get(KEYFRAME_GATE)
    if result is None:
        st.info("No keyframe gate result for this pair yet (h3eval gate --gates keyframe).")
    elif result.get("status") != "ok":
        st.info(f"keyframe gate: {result.get('status')}: {result.get('error') or result.get('info', {}).get('reason')}")
    else:
        st.caption("keyframe gate: each side against the inputs (the verdict tests candidate - baseline)")
        st.dataframe(pairview.side_metrics(result), hide_index=True)


def _heatmap_for(per_frame: dict[int, str], frame: int) -> str | None:
    """The heatmap of this frame, else of the nearest earlier frame the gate drew, else its first one."""
    earlier = [f for f in per_frame if f <= frame]
    if earlier:
        return per_frame[max(earlier)]
    if per_frame:
        return per_frame[min(per_frame)]
    return None


def _flags(run, cand, prompt, seed, results) -> None:
    if not results:
        st.info("No gate results for this pair yet.")
        return
    rows = []
    for gate, r in sorted(results.items()):
        rows.append({"gate": gate, "status": r.get("status"), "flagged": r.get("flagged"),
                     "flags": "; ".join(r.get("flags") or []), "error": r.get("error"),
                     **{m: v.get("value") for m, v in (r.get("metrics") or {}).items()}})
    st.dataframe(pd.DataFrame(rows), hide_index=True, key="viewer_gates")


def _curves(run, cand, prompt, seed, results, frame: int | None) -> None:
    series = pairview.pair_series(run, cand, prompt, seed).dropna(subset=["value"])
    flagged = sorted({f for g, r in results.items() for f in pairview.flagged_frames(r, "ghost_score")})
    if not len(series):
        st.caption("No per-frame series from the gates for this pair.")
        return
    st.caption("Per-frame gate series" + (f"; flagged frames: {', '.join(map(str, flagged))}" if flagged else "")
               + (f"; current frame {frame}" if frame is not None else ""))
    # One full-width chart per series on a shared frame axis, each carrying the timeline: red bands on the frames a
    # gate flagged, a blue rule on the frame the scrubber shows. (Faceted charts do not stretch to the page width.)
    x_scale = alt.Scale(domain=[0, int(series["index"].max())])
    marks = pd.DataFrame({"index": flagged})
    for name, group in series.groupby("series", sort=True):
        layers = []
        if len(marks):
            layers.append(alt.Chart(marks).mark_rule(color="#d62728", opacity=0.35, strokeWidth=3).encode(
                x=alt.X("index:Q", scale=x_scale)))
        if frame is not None:
            layers.append(alt.Chart(pd.DataFrame({"index": [frame]})).mark_rule(color="#1f77b4", strokeWidth=2)
                          .encode(x=alt.X("index:Q", scale=x_scale)))
        layers.append(alt.Chart(group).mark_line(point=len(group) <= 60).encode(
            x=alt.X("index:Q", title="frame", scale=x_scale),
            y=alt.Y("value:Q", title=name, scale=alt.Scale(zero=False)),
            tooltip=["index", "value"]))
        st.altair_chart(alt.layer(*layers).properties(height=140), width="stretch")


def _audio(base_mp4: str, cand_mp4: str) -> None:
    st.subheader("Audio difference")
    try:
        diff = state.audio_difference(base_mp4, state.mtime_ns(base_mp4), cand_mp4, state.mtime_ns(cand_mp4))
    except (MediaError, OSError, ValueError) as exc:  # no audio stream, mismatched rates: shown, not raised
        st.info(f"No audio comparison: {exc}")
        return
    sr = int(diff["sample_rate"])
    rows = []
    for name in ("baseline", "difference"):
        start, lo, hi = pairview.envelope(diff[name], 500)  # 500 buckets: peaks kept, quick to draw
        rows.append(pd.DataFrame({"t": start / sr, "min": lo, "max": hi, "track": name}))
    env = pd.concat(rows)
    wave = alt.Chart(env).mark_area(opacity=0.5).encode(
        x=alt.X("t:Q", title="seconds"), y=alt.Y("min:Q", title="amplitude (mono)"), y2="max:Q",
        color=alt.Color("track:N", scale=alt.Scale(domain=["baseline", "difference"], range=["#999999", "#d62728"]),
                        title="waveform")).properties(height=140)
    st.altair_chart(wave, width="stretch")
    db = diff["spec_diff_db"]
    rms = float(np.sqrt(np.mean(diff["difference"] ** 2))) if len(diff["difference"]) else float("nan")
    st.caption(f"RMS of the waveform difference: {rms:.5f}. Spectrogram difference candidate - baseline (dB), "
               "low frequencies at the bottom; red = louder in the candidate, blue = quieter.")
    st.image(_diverging(db[::-1]), width="stretch", clamp=True)


def _diverging(db: np.ndarray, limit: float = 20.0, bands: int = 96, width: int = 480) -> np.ndarray:
    """Blue-white-red RGB image of a dB difference (freq x time, low frequencies last) clipped to +-limit:
    frequency rows averaged into ``bands`` bands and time stretched to about ``width`` columns, so the image keeps
    a readable 5:1 shape whatever the clip length."""
    if db.size == 0:
        return np.full((1, 1, 3), 255, dtype=np.uint8)
    bands = min(bands, db.shape[0])
    edges = np.linspace(0, db.shape[0], bands + 1).astype(int)
    banded = np.add.reduceat(db, edges[:-1], axis=0) / np.diff(edges)[:, None]
    x = np.clip(banded / limit, -1.0, 1.0)
    r = np.where(x > 0, 1.0, 1.0 + x)
    b = np.where(x < 0, 1.0, 1.0 - x)
    g = 1.0 - np.abs(x)
    img = (np.stack([r, g, b], axis=-1) * 255).astype(np.uint8)
    reps = max(1, width // max(1, img.shape[1]))
    return np.repeat(img, reps, axis=1)
