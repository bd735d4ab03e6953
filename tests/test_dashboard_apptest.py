"""Every dashboard page rendered with streamlit.testing's AppTest over a review run of known content; the values
shown are checked against the same numbers computed independently (float64 loops, the demo's written values)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from dashboard.pairview import amplified_difference
from dashboard.demo import BASELINE, ghost_series, latency, lpips_series, make_review_run
from h3.media import decode_audio, decode_video
from h3eval.store import RunStore

APP = str(Path(__file__).resolve().parent.parent / "dashboard" / "app.py")
PROMPTS = ("p-cat", "p-car")
SEEDS = (0, 1)
ERROR_PAIR = ("fast", "p-cat", 0)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("apptest")
    full = base / "full"
    make_review_run(full, prompt_ids=PROMPTS, seeds=SEEDS, error_pair=ERROR_PAIR)
    bare = base / "bare"  # clips only: no gates, no verdict, no rate
    make_review_run(bare, candidates=("fast",), prompt_ids=("p-cat",), seeds=(0,), gates=False, verdict=False,
                    hourly_rate=None)
    return {"full": full, "bare": bare}


def app(monkeypatch, *roots: Path, **query) -> AppTest:
    monkeypatch.setenv("H3EVAL_DASHBOARD_RUNS", os.pathsep.join(str(r) for r in roots))
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params.update({k: str(v) for k, v in query.items()})
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def frame_with(at: AppTest, column: str):
    """The first table on the page that has ``column`` (AppTest does not expose a dataframe's key)."""
    matches = [d.value for d in at.dataframe if column in d.value.columns]
    assert matches, f"no table with a {column!r} column; tables: {[list(d.value.columns) for d in at.dataframe]}"
    return matches[0]


def gen_latency(recipe: str, pid: str, seed: int) -> float:
    return 0.95 * latency(recipe, pid, seed)  # synth's generation-side share of the request


def test_overview_shows_speed_quality_and_verdict(monkeypatch, runs):
    at = app(monkeypatch, runs["full"])
    assert at.title[0].value == "Overview"
    speed = at.dataframe[0].value.set_index("recipe")
    for cand in ("fast", "faster"):
        b = [gen_latency(BASELINE, p, s) for p in PROMPTS for s in SEEDS]
        c = [gen_latency(cand, p, s) for p in PROMPTS for s in SEEDS]
        assert speed.loc[cand, "speedup"] == pytest.approx(sum(b) / sum(c), rel=1e-9)
        r2f = [latency(cand, p, s) for p in PROMPTS for s in SEEDS]  # synth's request-to-file latency
        assert speed.loc[cand, "dollars_per_clip"] == pytest.approx(np.median(r2f) * 13.16 / 3600, rel=1e-9)
        lo, hi = (float(x) for x in speed.loc[cand, "speedup_95ci"].strip("[]").split(","))
        assert lo <= speed.loc[cand, "speedup"] <= hi
    assert speed.loc["fast", "verdict"] == "PASS" and speed.loc["faster", "verdict"] == "FAIL"
    assert speed.loc[BASELINE, "speedup"] == 1.0

    assert at.selectbox(key="overview_metric").value == "lpips · lpips_mean"
    quality = at.dataframe[1].value.set_index("recipe")
    fast_mean = np.mean([np.mean(lpips_series("fast", p, s, 24)) for p in PROMPTS for s in SEEDS
                         if ("fast", p, s) != ERROR_PAIR])
    assert quality.loc["fast", "quality"] == pytest.approx(fast_mean, rel=1e-9)
    assert quality.loc["fast", "n_missing"] == 1
    # fast: slower but better; faster: faster but worse -> both on the front
    assert quality["pareto"].tolist() == [True, True]

    at.selectbox(key="overview_metric").set_value("ghosting · ghost_score_max").run()
    quality = at.dataframe[1].value.set_index("recipe")
    assert quality.loc["faster", "quality"] == pytest.approx(max(ghost_series("faster", 24)))


def test_overview_across_runs_and_missing_pieces(monkeypatch, runs):
    at = app(monkeypatch, runs["full"], runs["bare"])
    speed = at.dataframe[0].value
    assert sorted(set(speed["run"])) == ["bare", "full"]
    bare = speed[speed["run"] == "bare"].set_index("recipe")
    assert bare.loc["fast", "verdict"] == "no verdict yet"
    assert bare.loc["fast", "speedup_95ci"] == "n/a (fewer than 2 pairs)"
    assert bare["dollars_per_clip"].isna().all()  # no rate: shown missing, never 0
    # typing a rate fills in $/clip for the run without one, and only for it
    at.number_input(key="hourly_rate").set_value(3600.0).run()
    bare = at.dataframe[0].value.set_index(["run", "recipe"])
    assert bare.loc[("bare", "fast"), "dollars_per_clip"] == pytest.approx(latency("fast", "p-cat", 0))
    full_fast = [latency("fast", p, s) for p in PROMPTS for s in SEEDS]
    assert bare.loc[("full", "fast"), "dollars_per_clip"] == pytest.approx(np.median(full_fast) * 13.16 / 3600)


def test_overview_without_gates_says_so(monkeypatch, runs):
    at = app(monkeypatch, runs["bare"])
    assert any("No gate results in these runs yet" in i.value for i in at.info)


def test_anatomy_stage_means(monkeypatch, runs):
    at = app(monkeypatch, runs["full"], page="anatomy")
    table = at.dataframe[0].value.set_index("recipe")
    mean_lat = np.mean([latency("faster", p, s) for p in PROMPTS for s in SEEDS])
    # synth's split of a request: 2% text encode, 85% denoise, 8% video decode, 1% audio, 4% prep, 5% mux
    for stage, share in (("text_encode", 0.02), ("denoise", 0.85), ("video_decode", 0.08), ("audio_decode", 0.01),
                         ("frame_prep_d2h", 0.04), ("mux_save", 0.05)):
        assert table.loc["faster", stage] == pytest.approx(share * mean_lat, rel=1e-9)
    assert table.loc["faster", "denoise_share"] == pytest.approx(0.85 / 1.05)


def test_viewer_pair_from_link(monkeypatch, runs):
    at = app(monkeypatch, runs["full"], page="viewer", candidate="faster", prompt="p-cat", seed=0)
    assert [s.value for s in at.selectbox][:3] == ["faster", "p-cat", 0]
    gates = frame_with(at, "gate").set_index("gate")
    assert bool(gates.loc["ghosting", "flagged"]) is True
    assert gates.loc["ghosting", "flags"] == "ghost_score above 0.4 on 24 frames"
    assert gates.loc["lpips", "lpips_mean"] == pytest.approx(np.mean(lpips_series("faster", "p-cat", 0, 24)))
    frame = at.slider(key="viewer_frame")
    assert (frame.min, frame.max) == (0, 23)
    captions = [c for img in at.get("image") for c in img.captions]
    # opens on the ghosting gate's worst frame (3); the nearest heatmap the gate drew at or before it is frame 0's
    assert "baseline · frame 3" in captions and "candidate · frame 3" in captions
    assert "ghosting heatmap · p-cat-s0_heatmap_f0000.png" in captions
    assert frame.value == 3
    assert "Ghosting gate's worst frames: 3 (ghost_score 0.630, copy of frame t-0 shifted (0, 6) px)" in [
        c.value for c in at.caption]

    store = RunStore(runs["full"])
    a = decode_video(store.clip_path(BASELINE, "p-cat", 0))[0]
    b = decode_video(store.clip_path("faster", "p-cat", 0))[0]
    diff = amplified_difference(a[12], b[12], 8)
    at.slider(key="viewer_frame").set_value(12).run()
    captions = [c for img in at.get("image") for c in img.captions]
    assert "ghosting heatmap · p-cat-s0_heatmap_f0012.png" in captions and "candidate · frame 12" in captions
    assert f"amplified difference: mean {diff.mean():.2f}, max {int(diff.max())} (of 255)" in [
        c.value for c in at.caption]
    assert diff.mean() > 2  # the planted ghost is there to see
    timeline = next(c.value for c in at.caption if c.value.startswith("Per-frame gate series"))
    assert "flagged frames: " + ", ".join(str(i) for i in range(24)) in timeline and "current frame 12" in timeline

    wa, _ = decode_audio(store.clip_path(BASELINE, "p-cat", 0))
    wb, _ = decode_audio(store.clip_path("faster", "p-cat", 0))
    n = min(wa.shape[1], wb.shape[1])
    rms = np.sqrt(np.mean((wb[:, :n].astype(np.float64).mean(0) - wa[:, :n].astype(np.float64).mean(0)) ** 2))
    assert any(c.value.startswith(f"RMS of the waveform difference: {rms:.5f}.") for c in at.caption)
    # The synchronized players come first on the page and carry exactly the pair's two clips, at the clip's fps.
    players = at.get("iframe")
    assert len(players) == 1 and not at.get("video")
    page = players[0].proto.srcdoc
    assert embedded_clip(page, "clipA") == store.clip_path(BASELINE, "p-cat", 0).read_bytes()
    assert embedded_clip(page, "clipB") == store.clip_path("faster", "p-cat", 0).read_bytes()
    assert 'data-fps="24.0" data-frames="24"' in page
    kinds = [type(e).__name__ + ":" + getattr(e, "type", "") for e in at.main]
    assert kinds.index("UnknownElement:iframe") < kinds.index("Dataframe:dataframe")  # above the gate table


def embedded_clip(page: str, element_id: str) -> bytes:
    import base64
    import re

    m = re.search(rf'<script id="{element_id}" type="application/octet-stream">([^<]*)</script>', page)
    assert m, f"no {element_id} in the player page"
    return base64.b64decode(m.group(1))


def test_viewer_missing_clip_and_missing_gates(monkeypatch, runs, tmp_path):
    root = tmp_path / "gap"
    make_review_run(root, candidates=("fast",), prompt_ids=("p-cat",), seeds=(0, 1), gates=False, verdict=False)
    RunStore(root).clip_path("fast", "p-cat", 1).unlink()
    at = app(monkeypatch, root, page="viewer", candidate="fast", prompt="p-cat", seed=1)
    infos = [i.value for i in at.info]
    assert "No gate results for this pair yet." in infos
    assert any(i.startswith("Clip missing for fast") for i in infos)
    at = app(monkeypatch, root, page="viewer", candidate="fast", prompt="p-cat", seed=0)
    assert "No ghosting result for this pair yet." in [i.value for i in at.info]


def test_gates_worst_first_with_links(monkeypatch, runs):
    at = app(monkeypatch, runs["full"], page="gates")
    assert at.selectbox(key="gates_gate").value == "ghosting"
    counts = frame_with(at, "ok").set_index("candidate")
    assert counts.loc["faster", "flagged"] == 4 and counts.loc["fast", "flagged"] == 0
    table = frame_with(at, "view")
    assert list(table["candidate"][:4]) == ["faster"] * 4  # highest ghost score first
    assert list(table.columns).count("metric:ghost_score_max") == 1 and "metric:lpips_mean" not in table.columns
    first = table.iloc[0]
    assert first["view"] == f"?page=viewer&run=0&candidate=faster&prompt={first['prompt_id']}&seed={first['seed']}"

    at.selectbox(key="gates_gate").set_value("lpips").run()
    assert any("fast/p-cat-s0 (error: decode failed: candidate clip truncated at frame 7)" in w.value
               for w in at.warning)
    table = frame_with(at, "view")
    assert (table.iloc[0]["candidate"], table.iloc[0]["prompt_id"], table.iloc[0]["seed"]) == ERROR_PAIR
    assert np.isnan(table.iloc[0]["metric:lpips_mean"])
    values = table["metric:lpips_mean"].iloc[1:].tolist()
    assert values == sorted(values, reverse=True)  # lower is better: worst (highest) first


def test_gates_say_whether_the_candidates_judge_uses_them(monkeypatch, tmp_path):
    """From verdict.json: `faster` judged as resample, whose verdict lists no ghosting gate, though ghosting flags
    every pair; from the release policy (no verdict.json): each recipe's declared [signoff] kind picks the judge."""
    import json

    from h3eval.demo import policy_path
    from h3eval.policy import load_policy

    root = tmp_path / "judged"
    store = make_review_run(root, candidates=("fast", "faster"), prompt_ids=("p-cat",), seeds=(0, 1))
    verdict = json.loads(store.verdict_path.read_text())
    for entry in verdict["candidates"]:
        entry["judge"] = "near" if entry["candidate"] == "fast" else "resample"
        if entry["candidate"] == "faster":
            entry["gates"] = [g for g in entry["gates"] if g["gate"] != "ghosting"]
    store.verdict_path.write_text(json.dumps(verdict))
    at = app(monkeypatch, root, page="gates")
    assert at.selectbox(key="gates_gate").value == "ghosting"
    counts = frame_with(at, "in the verdict").set_index("candidate")
    assert counts.loc["faster", "in the verdict"] == "not used by this candidate's judge (resample)"
    assert counts.loc["fast", "in the verdict"] == "used by the judge"
    assert ("faster: ghosting flagged 2 of 2 pairs, but not used by this candidate's judge (resample): these flags "
            "are shown for review and do not decide its verdict.") in [i.value for i in at.info]
    assert any("from verdict.json (policy demo)" in c.value for c in at.caption)

    store.verdict_path.unlink()  # no verdict yet: the release policy's judges, by each recipe's declared kind
    manifest = store.read_manifest()
    manifest.recipes["fast"]["signoff"] = {"kind": "near"}
    manifest.recipes["faster"]["signoff"] = {"kind": "resample"}
    store.write_manifest(manifest)
    release = load_policy(policy_path("release")).policy
    assert "ghosting" in release.gates_for("near") and "ghosting" not in release.gates_for("resample")
    at = app(monkeypatch, root, page="gates")
    counts = frame_with(at, "in the verdict").set_index("candidate")
    assert counts.loc["faster", "in the verdict"] == "not used by this candidate's judge (resample)"
    assert counts.loc["fast", "in the verdict"] == "used by the judge"
    assert any("from policy release (no verdict.json yet)" in c.value for c in at.caption)
    at.selectbox(key="gates_gate").set_value("trajectory").run()
    counts = frame_with(at, "in the verdict").set_index("candidate")
    near = release.gates_for("near")
    assert counts.loc["fast", "in the verdict"] == (
        "not used by this candidate's judge (near)" if "trajectory" not in near
        else "used by the judge" + ("" if near["trajectory"].required else " (advisory)"))


def test_gates_and_trajectory_and_verdict_absent(monkeypatch, runs):
    at = app(monkeypatch, runs["bare"], page="gates")
    assert any("No gate results in bare yet" in i.value for i in at.info)
    at = app(monkeypatch, runs["bare"], page="trajectory")
    assert any(i.value.startswith("No trajectory in this run") for i in at.info)
    at = app(monkeypatch, runs["bare"], page="verdict")
    assert any(i.value.startswith("No verdict yet for bare") for i in at.info)


def test_trajectory_curves(monkeypatch, runs):
    at = app(monkeypatch, runs["full"], page="trajectory")
    assert at.selectbox(key="trajectory_series").options == ["video_x0_rel_l2", "video_xt_rel_l2"]
    table = frame_with(at, "last step").set_index("candidate")
    assert table.loc["faster", "median video_x0_rel_l2 at last step"] == pytest.approx(0.03 * 8 * 1.5)
    pairs = frame_with(at, "first divergent step")
    assert len(pairs) == 2 * len(PROMPTS) * len(SEEDS)
    row = pairs[(pairs.candidate == "faster") & (pairs.prompt_id == "p-car") & (pairs.seed == 1)].iloc[0]
    assert row["video_x0_rel_l2 at last step"] == pytest.approx(0.03 * 8 * 1.5)
    assert row["view"] == "?page=viewer&run=0&candidate=faster&prompt=p-car&seed=1"
    at.selectbox(key="trajectory_series").set_value("video_xt_rel_l2").run()
    table = frame_with(at, "last step").set_index("candidate")
    assert table.loc["fast", "median video_xt_rel_l2 at last step"] == pytest.approx(0.01 * 8)


def test_trajectory_says_when_schedules_differ(monkeypatch, tmp_path):
    """The gate's own result for a 29-step baseline against an 8-step candidate: one common noise level (the start,
    where both agree: 0), and a final x0 0.22 apart. The page says the schedules differ and shows the final x0."""
    from dashboard.demo import schedule_trajectories

    root = tmp_path / "steps"
    make_review_run(root, candidates=("fast", "faster"), prompt_ids=("p-cat",), seeds=(0, 1),
                    schedule_differs=("faster",))
    at = app(monkeypatch, root, page="trajectory")
    warning = next(w.value for w in at.warning if "faster: schedules differ" in w.value)
    finals = []
    for seed in (0, 1):
        base, cand = schedule_trajectories(seed + len("p-cat"), 0.22)
        b, c = base["video_x0"][-1].astype(np.float64), cand["video_x0"][-1].astype(np.float64)
        finals.append(np.linalg.norm(c - b) / np.linalg.norm(b))  # float64, independent of the gate's rel_l2
    assert "(29 vs 8 steps) on 2 of 2 pair(s)" in warning and "1 noise level(s) both schedules visit (t = 1)" in warning
    assert f"relative L2 {np.median(finals):.3g} median over 2 pair(s)" in warning
    assert not any("fast: schedules differ" in w.value for w in at.warning)
    table = frame_with(at, "last step").set_index("candidate")
    assert table.loc["faster", "schedules"] == "differ: 29 vs 8 steps"
    assert np.isnan(table.loc["faster", "median video_x0_rel_l2 at last step"])  # no flat zero shown as a result
    assert table.loc["faster", "median final video x0 rel-L2"] == pytest.approx(np.median(finals), rel=1e-6)
    assert table.loc["fast", "median video_x0_rel_l2 at last step"] == pytest.approx(0.01 * 8 * 1.5)
    pairs = frame_with(at, "steps (baseline vs candidate)")
    row = pairs[(pairs.candidate == "faster") & (pairs.seed == 1)].iloc[0]
    assert row["steps (baseline vs candidate)"] == "29 vs 8" and row["common noise levels"] == 1
    assert row["final video x0 rel-L2"] == pytest.approx(finals[1], rel=1e-6)


def test_verdict_page(monkeypatch, runs):
    at = app(monkeypatch, runs["full"], page="verdict")
    assert at.metric[0].label == "Overall" and at.metric[0].value == "FAIL"
    assert "- faster: ghosting flagged" in at.markdown[0].value
    assert "too few to detect a 0.01 LPIPS margin" in at.warning[0].value
    rows = frame_with(at, "scope").set_index("scope")
    assert rows.loc["faster", "status"] == "FAIL"
    assert rows.loc["faster / ghosting", "reasons"] == "ghost_score_max above 0.4 on 4 of 4 pairs"
    assert rows.loc["fast / lpips", "status"] == "PASS"
    assert rows.loc["fast / speed", "status"] == "PASS"


def test_unreadable_files_listed_in_sidebar(monkeypatch, tmp_path):
    root = tmp_path / "broken"
    make_review_run(root, candidates=("fast",), prompt_ids=("p-cat",), seeds=(0,), trajectory=False)
    (root / "gates" / "lpips" / "fast" / "p-cat-s0.json").write_text("{ truncated")
    at = app(monkeypatch, root, page="gates")
    at.selectbox(key="gates_gate").set_value("lpips").run()
    assert any("fast/p-cat-s0 (unreadable: p-cat-s0.json could not be read)" in w.value for w in at.warning)
    assert any("p-cat-s0.json: unreadable JSON" in c.value for c in at.sidebar.caption)


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> Path:
    """Clips from another stack brought in with `h3eval import`, no manifest: no latency, no anatomy, no gates."""
    from typer.testing import CliRunner

    from dashboard.demo import make_import_folders
    from h3eval.cli import app as cli

    root = tmp_path_factory.mktemp("imported")
    base, cand = make_import_folders(root / "src", prompt_ids=("p-cat", "p-car"), seeds=(0,))
    out = root / "imported"
    result = CliRunner().invoke(cli, ["import", "--baseline-dir", f"sglang-base={base}", "--candidate-dir",
                                      f"sglang-fp8={cand}", "--out", str(out)])
    assert result.exit_code == 0, result.output
    record = RunStore(out).read_record("sglang-fp8", "p-cat", 0)
    assert record.timings.generation_side_latency_s == 0  # what the pages must not read as a latency
    assert "timings.generation_side_latency_s" in record.extra["unreported"]
    return out


@pytest.mark.parametrize("page", ["overview", "anatomy", "viewer", "gates", "trajectory", "verdict"])
def test_imported_run_without_timing_renders_every_page(monkeypatch, imported, page):
    at = app(monkeypatch, imported, page=page)  # no exception, no error element
    infos = [i.value for i in at.info]
    if page in ("overview", "anatomy"):
        assert any(i.startswith("imported: no timing data for this run") for i in infos), infos
    if page == "overview":
        speed = at.dataframe[0].value.set_index("recipe")
        assert speed.loc["sglang-fp8", "speedup_95ci"] == "no timing data"
        assert speed.loc["sglang-fp8", "n"] == 0 and speed[["speedup", "p50_latency_s"]].isna().all().all()
    if page == "viewer":
        assert len(at.get("iframe")) == 1  # the synchronized players need no timing


@pytest.mark.parametrize("page", ["overview", "anatomy", "viewer", "gates", "trajectory", "verdict"])
def test_not_a_run_directory_is_shown_not_raised(monkeypatch, tmp_path, page):
    at = app(monkeypatch, tmp_path / "typo", page=page)
    assert any("run.json: missing (not a run directory?)" in c.value for c in at.sidebar.caption)
    assert at.info, f"{page}: says nothing about the empty run"


def test_viewer_with_the_ghosting_gates_strip(monkeypatch, tmp_path):
    """The ghosting gate's own result shape: a strip PNG for the pair, flagged frames in info.ghost_frame_indices."""
    from PIL import Image

    from gates.base import GateResult, Metric, PairRef
    from h3.atomic import atomic_write_json

    root = tmp_path / "strip"
    make_review_run(root, candidates=("fast",), prompt_ids=("p-cat",), seeds=(0,), gates=False, verdict=False)
    rel = "gates/ghosting/fast/p-cat-s0-ghosting-strip.png"
    (root / rel).parent.mkdir(parents=True)
    from gates.ghosting import GhostingConfig, render_strip

    store = RunStore(root)
    frames_a = decode_video(store.clip_path(BASELINE, "p-cat", 0))[0]
    frames_b = decode_video(store.clip_path("fast", "p-cat", 0))[0]
    n = len(frames_a)
    scores = SimpleNamespace(lag=np.full(n, 1), dy=np.zeros(n, int), dx=np.full(n, 3))
    Image.fromarray(render_strip(frames_a, frames_b, scores, [21, 22, 23], GhostingConfig())).save(root / rel)
    result = GateResult(
        gate="ghosting", pair=PairRef(baseline=BASELINE, candidate="fast", prompt_id="p-cat", seed=0),
        metrics={"ghost_score_max": Metric(value=0.05, higher_is_better=False)},
        series={"ghost_score": [0.01] * 20 + [0.05] * 4}, flagged=True, flags=["ghosting: 4 of 24 frames"],
        artifacts=[rel],
        info={"config": {"frame_threshold": 0.03}, "ghost_frame_indices": [20, 21, 22, 23],
              "worst_frames": [{"frame": 22, "ghost_score": 0.05, "lag": 1, "dy": 0, "dx": 3}],
              "strip_frames": [21, 22, 23]},
    )
    atomic_write_json(root / "gates/ghosting/fast/p-cat-s0.json", result.model_dump(mode="json"))
    at = app(monkeypatch, root, page="viewer")
    captions = [c for img in at.get("image") for c in img.captions]
    assert "ghosting · p-cat-s0-ghosting-strip.png" in captions
    assert "The ghosting gate drew its heatmaps as a strip of its worst frames: below." in [i.value for i in at.info]
    meaning = "Heatmap cell: how many 8-bit luma levels the displaced copy adds"
    assert any(c.value.startswith(meaning) for c in at.caption)
    Image.fromarray(np.full((32, 96, 3), 200, dtype=np.uint8)).save(root / rel)  # not the gate's layout
    at = app(monkeypatch, root, page="viewer")
    assert any(c.value.startswith("Not the ghosting gate's strip layout") for c in at.caption)
    assert at.slider(key="viewer_frame").value == 22
    timeline = next(c.value for c in at.caption if c.value.startswith("Per-frame gate series"))
    assert "flagged frames: 20, 21, 22, 23;" in timeline


# -- a real run: the trained tiny preset through `h3eval ab`, the real gates, the verdict -----------------------------
# Two captions of the world the trained preset learned (its clips show these shapes moving, with their tones).
REAL_PROMPTS = {"r-circle": "a red circle moves left to right while a low tone hums; it bounces once; the background "
                            "is plain",
                "r-square": "a blue square moves top to bottom while a high tone hums; the background is striped"}
REAL_GATES = ("integrity", "fidelity", "ghosting", "audio", "trajectory")


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Path:
    """What `h3eval ab`, `h3eval gate` and `h3eval report` write for the trained tiny preset (``tiny``, the
    dashboard's default data: the demo's run is made on it): baseline ``fast`` (2 steps, float32) against
    ``fast-int8`` (INT8 W8A8 linears, a real lever with a real, small effect), 2 world captions x 1 seed (124 frames of
    128x128, the tiny default), latent trajectories recorded, every CPU gate (LPIPS on the package's random trunk: no
    weights here), and the release policy's verdict (no floor file: its floor-relative metrics are INCONCLUSIVE, as a
    user sees them)."""
    import json

    from h3eval.ab import run_ab_from_args
    from h3eval.demo import policy_path
    from h3eval.gaterun import run_gates
    from h3eval.report import run_report
    from tests.conftest import FAST_RECIPE, toml_dumps

    root = tmp_path_factory.mktemp("real")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": k, "prompt": v}) + "\n" for k, v in REAL_PROMPTS.items()))
    (root / "fast.toml").write_text(toml_dumps(FAST_RECIPE))
    (root / "fast-int8.toml").write_text(toml_dumps({**FAST_RECIPE, "name": "fast-int8",
                                                     "quant": {"mode": "int8_w8a8"}}))
    run = root / "run"
    result = run_ab_from_args(baseline=str(root / "fast.toml"), candidates=[str(root / "fast-int8.toml")],
                              prompts=str(prompts), out=run, seeds="0", warmup=0, speed_rounds=0, trajectory=True,
                              model="tiny", device="cpu")
    assert result.manifest.model == "tiny-trained"
    assert result.manifest.status == "complete", result.manifest.errors
    summary = run_gates(run, list(REAL_GATES), device="cpu", options={"fidelity.lpips_trunk": "rand"},
                        progress=False)
    assert not summary.errors, summary.errors
    run_report(run, policy_path("release"))
    return run


def _real_results(run: Path, gate: str) -> dict[tuple[str, int], dict]:
    """The gate's per-pair result files of the candidate, read here with json (not through dashboard.data)."""
    import json

    out = {}
    for path in sorted((run / "gates" / gate / "fast-int8").glob("*.json")):
        result = json.loads(path.read_text())
        out[(result["pair"]["prompt_id"], result["pair"]["seed"])] = result
    return out


def test_real_run_overview_shows_the_gates_real_metrics(monkeypatch, real_run):
    import json

    results = _real_results(real_run, "fidelity")
    assert len(results) == 2
    at = app(monkeypatch, real_run)
    # The fidelity gate writes lpips_mean: the page opens on it (no gate named "lpips" exists).
    assert at.selectbox(key="overview_metric").value == "fidelity · lpips_mean"
    quality = at.dataframe[1].value.set_index("recipe")
    lpips = [r["metrics"]["lpips_mean"]["value"] for r in results.values()]
    assert all(v > 0 for v in lpips)  # INT8 W8A8 changed the frames a little
    assert quality.loc["fast-int8", "quality"] == pytest.approx(np.mean(lpips), rel=1e-12)
    assert quality.loc["fast-int8", "n_scored"] == 2 and quality.loc["fast-int8", "n_missing"] == 0
    speed = at.dataframe[0].value.set_index("recipe")
    store = RunStore(real_run)
    gen = {(r, p): store.read_record(r, p, 0).timings.generation_side_latency_s
           for r in ("fast", "fast-int8") for p in REAL_PROMPTS}
    assert speed.loc["fast-int8", "speedup"] == pytest.approx(
        sum(gen["fast", p] for p in REAL_PROMPTS) / sum(gen["fast-int8", p] for p in REAL_PROMPTS), rel=1e-9)
    verdict = json.loads((real_run / "verdict.json").read_text())
    assert speed.loc["fast-int8", "verdict"] == verdict["candidates"][0]["outcome"]
    options = at.selectbox(key="overview_metric").options
    for gate, metric in (("ghosting", "ghost_score_max"), ("audio", "stft_distance"),
                         ("trajectory", "video_x0_rel_l2_final"), ("integrity", "frames_flagged")):
        if f"{gate} · {metric}" in options:
            at.selectbox(key="overview_metric").set_value(f"{gate} · {metric}").run()
            values = [r["metrics"][metric]["value"] for r in _real_results(real_run, gate).values()]
            shown = at.dataframe[1].value.set_index("recipe").loc["fast-int8", "quality"]
            assert shown == pytest.approx(np.mean(values), rel=1e-12), (gate, metric)
    assert "ghosting · ghost_score_max" in options and "trajectory · video_x0_rel_l2_final" in options


def test_real_run_trajectory_page_shows_the_gates_series(monkeypatch, real_run):
    results = _real_results(real_run, "trajectory")
    names = sorted({name for r in results.values() for name in r["series"]})
    assert "video_x0_rel_l2" in names
    at = app(monkeypatch, real_run, page="trajectory")
    assert at.selectbox(key="trajectory_series").options == names
    at.selectbox(key="trajectory_series").set_value("video_x0_rel_l2").run()
    table = frame_with(at, "last step").set_index("candidate")
    last = [r["series"]["video_x0_rel_l2"][-1] for r in results.values()]
    assert table.loc["fast-int8", "median video_x0_rel_l2 at last step"] == pytest.approx(np.median(last), rel=1e-12)
    assert table.loc["fast-int8", "last step"] == len(next(iter(results.values()))["series"]["video_x0_rel_l2"]) - 1


def test_real_run_gates_viewer_and_verdict_pages(monkeypatch, real_run):
    import json

    at = app(monkeypatch, real_run, page="gates")
    at.selectbox(key="gates_gate").set_value("fidelity").run()
    table = frame_with(at, "view")
    results = _real_results(real_run, "fidelity")
    for _, row in table.iterrows():
        assert row["metric:lpips_mean"] == pytest.approx(
            results[(row["prompt_id"], int(row["seed"]))]["metrics"]["lpips_mean"]["value"], rel=1e-12)
    values = table["metric:lpips_mean"].tolist()
    assert values == sorted(values, reverse=True)  # lower is better: worst first

    at = app(monkeypatch, real_run, page="viewer", candidate="fast-int8", prompt="r-circle", seed=0)
    gates = frame_with(at, "gate").set_index("gate")
    assert set(REAL_GATES) <= set(gates.index)
    assert gates.loc["fidelity", "lpips_mean"] == pytest.approx(
        results[("r-circle", 0)]["metrics"]["lpips_mean"]["value"])
    assert at.slider(key="viewer_frame").max == 123  # 124 frames: 5 s, the shortest H3 request
    store = RunStore(real_run)
    a = decode_video(store.clip_path("fast", "r-circle", 0))[0]
    b = decode_video(store.clip_path("fast-int8", "r-circle", 0))[0]
    frame = at.slider(key="viewer_frame").value
    diff = amplified_difference(a[frame], b[frame], 8)
    assert f"amplified difference: mean {diff.mean():.2f}, max {int(diff.max())} (of 255)" in [
        c.value for c in at.caption]

    verdict = json.loads((real_run / "verdict.json").read_text())
    at = app(monkeypatch, real_run, page="verdict")
    assert at.metric[0].label == "Overall" and at.metric[0].value == verdict["outcome"]
    rows = frame_with(at, "scope").set_index("scope")
    assert rows.loc["fast-int8", "status"] == verdict["candidates"][0]["outcome"]
    for gate in verdict["candidates"][0]["gates"]:
        assert rows.loc[f"fast-int8 / {gate['gate']}", "status"] == gate["outcome"]
