"""dashboard.data, dashboard.verdicts and dashboard.pairview: the numbers the pages show, checked against float64
loops, scipy and planted content."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.stats
import typer
from typer.testing import CliRunner

from dashboard import data, pairview, verdicts
from dashboard.demo import BASELINE, ghost_series, latency, lpips_series, make_review_run
from h3.media import decode_video
from h3eval import stats as S
from h3eval.commands import dashboard as dashboard_cmd

PROMPTS = ("p-cat", "p-car")
SEEDS = (0, 1)
WARMUP = ("fast", "p-car", 1)
ERROR_PAIR = ("fast", "p-cat", 0)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("review") / "run-a"
    make_review_run(root, prompt_ids=PROMPTS, seeds=SEEDS, warmup=WARMUP, error_pair=ERROR_PAIR)
    return root


@pytest.fixture(scope="module")
def run(run_dir) -> data.RunData:
    return data.load_run(run_dir)


# -- statistics ----------------------------------------------------------------------------------------------------
def test_dollars_per_clip_reproduces_seed_001():
    # Seed 001: ~80 s baseline 5 s clip at $13.16/h for the pod is "about $0.29 of GPU time". The one definition
    # (h3eval.stats.usd_per_clip) takes the p50 of the request-to-file latencies.
    assert round(S.usd_per_clip([80.0], 13.16), 2) == 0.29
    assert S.usd_per_clip([70.0, 80.0, 500.0], 13.16) == pytest.approx(80.0 * 13.16 / 3600)
    assert S.usd_per_clip([80.0], None) is None


def test_pareto_front_matches_brute_force():
    rng = np.random.default_rng(5)
    pts = pd.DataFrame({"x": rng.uniform(1, 5, 30), "y": rng.uniform(0, 1, 30)})
    pts.loc[3, "y"] = np.nan
    for higher in (True, False):
        mask = data.pareto_front(pts, "x", "y", higher)
        for i in range(len(pts)):
            xi, yi = pts.x[i], pts.y[i]
            if math.isnan(yi):
                assert not mask[i]
                continue
            better = (lambda a, b: a >= b) if higher else (lambda a, b: a <= b)
            dominated = any(
                pts.x[j] >= xi and better(pts.y[j], yi) and (pts.x[j] > xi or pts.y[j] != yi)
                for j in range(len(pts)) if j != i and not math.isnan(pts.y[j])
            )
            assert mask[i] == (not dominated)
    assert mask.sum() >= 1


# -- the run ------------------------------------------------------------------------------------------------------
def test_load_run_reads_everything(run):
    assert run.problems == []
    assert run.baseline == BASELINE and run.candidates == ["fast", "faster"]
    assert len(run.clips) == 3 * len(PROMPTS) * len(SEEDS)
    assert run.clips["warmup"].sum() == 1
    assert set(run.gates["gate"]) == {"lpips", "ghosting", "trajectory"}
    assert run.metric_directions["lpips"] == {"lpips_mean": False, "ssim_mean": True}
    assert verdicts.overall_verdict(run.verdict) == "FAIL"
    assert run.hourly_rate == 13.16


def test_speed_table_against_float64_loop(run):
    table = data.speed_table(run).set_index("recipe")
    assert table.loc[BASELINE, "speedup"] == 1.0
    for cand in ("fast", "faster"):
        pairs = [(p, s) for p in PROMPTS for s in SEEDS if (cand, p, s) != WARMUP]
        # synth writes generation-side = 0.95 x request-to-file latency
        b = [0.95 * latency(BASELINE, p, s) for p, s in pairs]
        c = [0.95 * latency(cand, p, s) for p, s in pairs]
        assert table.loc[cand, "n"] == len(pairs)
        assert table.loc[cand, "speedup"] == pytest.approx(sum(b) / sum(c), rel=1e-9)
        lo, hi = table.loc[cand, "speedup_ci_low"], table.loc[cand, "speedup_ci_high"]
        assert min(bi / ci for bi, ci in zip(b, c)) - 1e-9 <= lo <= table.loc[cand, "speedup"] <= hi
        # The same CI as the verdict's and speed.json's: one bootstrap (h3eval.stats), same draws.
        reference = S.speedup(b, c).ci
        assert (lo, hi) == pytest.approx((reference.low, reference.high), rel=1e-12)
        cs = sorted(c)
        median = (cs[len(cs) // 2] if len(cs) % 2 else (cs[len(cs) // 2 - 1] + cs[len(cs) // 2]) / 2)
        assert table.loc[cand, "p50_latency_s"] == pytest.approx(median, rel=1e-9)
        assert table.loc[cand, "real_time_factor"] == pytest.approx(median / 1.0, rel=1e-9)  # 24 frames at 24 fps
        r2f = [latency(cand, p, s) for p, s in pairs]  # synth's request-to-file latency
        assert table.loc[cand, "dollars_per_clip"] == pytest.approx(np.median(r2f) * 13.16 / 3600, rel=1e-9)
    assert table.loc["fast", "verdict"] == "PASS" and table.loc["faster", "verdict"] == "FAIL"
    # the warm-up request's 1000 s never reaches a figure
    assert table["p50_latency_s"].max() < 100


def test_speed_table_rate_override_and_missing_rate(run):
    table = data.speed_table(run, hourly_rate=3600.0).set_index("recipe")
    assert table.loc[BASELINE, "dollars_per_clip"] == pytest.approx(
        np.median([latency(BASELINE, p, s) for p in PROMPTS for s in SEEDS]))


def test_stage_anatomy_means_exclude_warmup(run):
    table = data.stage_anatomy([run])
    fast = table[(table.recipe == "fast")].set_index("stage")
    pairs = [(p, s) for p in PROMPTS for s in SEEDS if ("fast", p, s) != WARMUP]
    # synth's split: denoise is 85% of the request-to-file latency
    assert fast.loc["denoise", "seconds"] == pytest.approx(np.mean([0.85 * latency("fast", p, s) for p, s in pairs]))
    assert fast.loc["denoise", "n"] == 3
    assert list(table[table.recipe == BASELINE]["stage"]) == list(data.STAGES)


def test_quality_table_leaves_errors_out(run):
    q = data.quality_table(run, "lpips", "lpips_mean").set_index("recipe")
    scored = [(p, s) for p in PROMPTS for s in SEEDS if ("fast", p, s) != ERROR_PAIR]
    expected = np.mean([np.mean(lpips_series("fast", p, s, 24)) for p, s in scored])
    assert q.loc["fast", "n_scored"] == 3 and q.loc["fast", "n_missing"] == 1
    assert q.loc["fast", "quality"] == pytest.approx(expected, rel=1e-9)
    assert q.loc["faster", "n_missing"] == 0


def test_worst_first_respects_direction(run):
    lp = run.gates[run.gates.gate == "lpips"]
    ordered = data.worst_first(lp, "lpips_mean", higher_is_better=False)
    values = pd.to_numeric(ordered["metric:lpips_mean"], errors="coerce").tolist()
    assert math.isnan(values[0])  # the unscored pair first
    assert values[1:] == sorted(values[1:], reverse=True)
    ordered = data.worst_first(lp, "ssim_mean", higher_is_better=True)
    values = pd.to_numeric(ordered["metric:ssim_mean"], errors="coerce").tolist()
    assert values[1:] == sorted(values[1:])


def test_verdict_rows_and_candidate_status(run):
    rows = verdicts.verdict_rows(run.verdict).set_index("scope")
    assert rows.loc["overall", "status"] == "FAIL"
    assert rows.loc["overall", "warnings"] == "4 pairs per candidate: too few to detect a 0.01 LPIPS margin"
    assert rows.loc["faster / ghosting", "status"] == "FAIL"
    assert rows.loc["faster", "reasons"] == "ghosting flagged on every pair"
    assert rows.loc["fast / lpips / lpips_mean", "reasons"] == "lpips_mean within margin for fast"
    assert rows.loc["fast / speed", "status"] == "PASS"
    assert sorted(rows.index) == sorted(
        ["overall"] + [f"{c}{s}" for c in ("fast", "faster")
                       for s in ("", " / lpips", " / lpips / lpips_mean", " / ghosting", " / speed")])
    assert verdicts.candidate_verdict(run.verdict, "fast") == "PASS"
    assert verdicts.candidate_verdict(run.verdict, "faster") == "FAIL"
    assert verdicts.candidate_verdict(None, "fast") is None
    assert verdicts.candidate_verdict({"overall": "PASS"}, "fast") is None
    # an older or hand-written shape: "overall" and "status", candidates as a mapping
    legacy = {"overall": "INCONCLUSIVE", "candidates": {"x": {"status": "INCONCLUSIVE", "reasons": ["4 < 16 pairs"],
                                                              "gates": {"lpips": {"status": "PASS"}}}}}
    rows = verdicts.verdict_rows(legacy).set_index("scope")
    assert verdicts.overall_verdict(legacy) == "INCONCLUSIVE"
    assert rows.loc["x", "reasons"] == "4 < 16 pairs" and rows.loc["x / lpips", "status"] == "PASS"


def test_bad_files_are_reported_not_raised(tmp_path):
    root = tmp_path / "broken"
    make_review_run(root, candidates=("fast",), prompt_ids=("p-cat",), seeds=(0,), verdict=False,
                    trajectory=False)
    bad = root / "gates" / "lpips" / "fast" / "p-cat-s0.json"
    bad.write_text("{ not json")
    (root / "verdict.json").write_text("[1, 2]")
    loaded = data.load_run(root)
    row = loaded.gates[loaded.gates.gate == "lpips"].iloc[0]
    assert row["status"] == "unreadable"
    assert any(str(bad) in p for p in loaded.problems)
    assert loaded.verdict is None and any("verdict.json" in p for p in loaded.problems)
    missing = data.load_run(tmp_path / "nowhere")
    assert missing.manifest is None and "run.json: missing" in missing.problems[0]
    assert len(missing.clips) == 0 and len(missing.gates) == 0


def test_fingerprint_changes_when_a_gate_lands(tmp_path):
    root = tmp_path / "fp"
    make_review_run(root, candidates=("fast",), prompt_ids=("p-cat",), seeds=(0,), gates=False, verdict=False)
    before = data.fingerprint(root)
    assert data.fingerprint(root) == before
    (root / "gates" / "lpips" / "fast").mkdir(parents=True)
    (root / "gates" / "lpips" / "fast" / "p-cat-s0.json").write_text("{}")
    assert data.fingerprint(root) != before


# -- viewer pieces ------------------------------------------------------------------------------------------------
def test_amplified_difference_against_float64(run):
    a = decode_video(run.clips[(run.clips.recipe == BASELINE)].iloc[0]["mp4"])[0]
    planted = a.copy()
    planted[:, 10:20, 10:20, :] = np.clip(planted[:, 10:20, 10:20, :].astype(int) + 3, 0, 255)
    got = pairview.amplified_difference(a, planted, 16)
    ref = np.clip(np.abs(a.astype(np.float64) - planted.astype(np.float64)) * 16, 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(got, ref)
    assert got[:, 10:20, 10:20].max() == 48 and got[:, 30:, 30:].max() == 0
    with pytest.raises(ValueError, match="frame shapes differ"):
        pairview.amplified_difference(a, a[:, :32], 2)


def test_planted_ghost_shows_in_difference(run):
    clips = run.clips.set_index(["recipe", "prompt_id", "seed"])
    a = decode_video(clips.loc[(BASELINE, "p-cat", 0), "mp4"])[0]
    b = decode_video(clips.loc[("faster", "p-cat", 0), "mp4"])[0]
    c = decode_video(clips.loc[("fast", "p-cat", 0), "mp4"])[0]
    ghost = pairview.amplified_difference(a, b, 8).astype(float).mean()
    clean = pairview.amplified_difference(a, c, 8).astype(float).mean()
    assert ghost > 5 * max(clean, 0.5)


def test_frame_artifacts_and_flagged_frames(run):
    result = run.gate_results[("ghosting", "faster", "p-cat", 0)]
    per_frame, other = pairview.frame_artifacts(result["artifacts"] + ["gates/ghosting/faster/strip.png", "x.json"])
    assert sorted(per_frame) == [0, 12] and other == ["gates/ghosting/faster/strip.png"]
    expected = [i for i, v in enumerate(ghost_series("faster", 24)) if v > 0.4]
    assert pairview.flagged_frames(result, "ghost_score") == expected
    no_list = {"info": {"threshold": 0.61}, "series": {"ghost_score": ghost_series("faster", 24)}}
    assert pairview.flagged_frames(no_list, "ghost_score") == [i for i in range(24) if i % 4 >= 1]  # ">=", the gate's rule
    # the ghosting gate's own shape: listed frames win; else its config's threshold
    gate_shape = {"info": {"ghost_frame_indices": [5, 2], "config": {"frame_threshold": 0.0}}}
    assert pairview.flagged_frames(gate_shape, "ghost_score") == [2, 5]
    by_config = {"info": {"config": {"frame_threshold": 0.62}}, "series": {"ghost_score": ghost_series("faster", 24)}}
    assert pairview.flagged_frames(by_config, "ghost_score") == [i for i in range(24) if i % 4 >= 2]
    assert pairview.worst_frame(result) == 3 and pairview.worst_frame({"info": {}}) is None


def test_pair_series_and_trajectory_table(run):
    series = pairview.pair_series(run, "fast", "p-car", 1)
    lp = series[series.series == "lpips"]["value"].tolist()
    assert lp == lpips_series("fast", "p-car", 1, 24)
    assert "trajectory" not in set(series.gate)
    traj = pairview.trajectory_table(run)
    x0 = traj[(traj.candidate == "faster") & (traj.series == "video_x0_rel_l2") & (traj.pair == "p-cat-s0")]
    assert x0["value"].tolist() == pytest.approx([0.03 * (s + 1) * 1.5 for s in range(8)])


def test_audio_difference_planted_gain():
    rng = np.random.default_rng(0)
    a = rng.uniform(-0.5, 0.5, size=(2, 32000)).astype(np.float32)
    b = a * 0.5  # a candidate 6.02 dB quieter everywhere
    out = pairview.audio_difference(a, b, 32000)
    np.testing.assert_allclose(out["difference"], b.mean(0).astype(np.float64) - a.mean(0).astype(np.float64))
    assert np.median(out["spec_diff_db"]) == pytest.approx(20 * np.log10(0.5), abs=1e-4)  # the 1e-12 floor


def test_envelope_matches_loop():
    x = np.random.default_rng(1).normal(size=1003)
    _start, lo, hi = pairview.envelope(x, 10)
    edges = np.linspace(0, 1003, 11).astype(int)
    for k in range(10):
        assert lo[k] == x[edges[k]:edges[k + 1]].min() and hi[k] == x[edges[k]:edges[k + 1]].max()


# -- command ------------------------------------------------------------------------------------------------------
def test_command_argv_and_errors(run_dir, tmp_path):
    argv = dashboard_cmd.streamlit_argv([run_dir], port=8765)
    assert argv[1:4] == ["-m", "streamlit", "run"] and argv[4].endswith("dashboard/app.py")
    assert argv[argv.index("--server.address") + 1] == "127.0.0.1"
    assert argv[argv.index("--server.port") + 1] == "8765"
    assert argv[argv.index("--") + 1:] == [str(run_dir.resolve())]
    app = typer.Typer()
    dashboard_cmd.register(app)
    app.command("noop")(lambda: None)  # a second command keeps typer in multi-command mode
    result = CliRunner().invoke(app, ["dashboard", str(tmp_path / "nope")])
    assert result.exit_code == 3  # bad input (issue 26): exit 3, one line
    assert "nope" in result.output and "run.json is missing" in result.output
    (tmp_path / "dir" / "run.json").mkdir(parents=True)
    result = CliRunner().invoke(app, ["dashboard", str(tmp_path / "dir")])
    assert result.exit_code == 3 and "run.json is a directory" in result.output
    result = CliRunner().invoke(app, ["dashboard", str(run_dir), "--port", "70000"])
    assert result.exit_code == 3 and "--port 70000 is not a TCP port" in result.output


def test_speed_quality_merges_runs_and_marks_front(run, tmp_path):
    other = tmp_path / "run-b"
    make_review_run(other, candidates=("fastest",), prompt_ids=PROMPTS, seeds=SEEDS, trajectory=False)
    runs = [run, data.load_run(other)]
    speed = pd.concat([data.speed_table(r) for r in runs], ignore_index=True)
    quality = pd.concat([data.quality_table(r, "lpips", "lpips_mean") for r in runs], ignore_index=True)
    table = data.speed_quality(speed, quality, higher_is_better=False).set_index("label")
    assert sorted(table.index) == ["run-a / fast", "run-a / faster", "run-b / fastest"]
    # demo lpips levels: fast 0.02 < faster 0.06 < fastest 0.12; speed factors 0.5 > 0.25 > 0.2 of the baseline:
    # each is faster and worse than the last, so none dominates another
    assert table["pareto"].tolist() == [True, True, True]
    worse = quality.copy()
    worse.loc[worse.recipe == "fastest", "quality"] = 0.01  # now fastest is both fastest and best
    table = data.speed_quality(speed, worse, higher_is_better=False).set_index("label")
    assert table["pareto"].to_dict() == {"run-a / fast": False, "run-a / faster": False, "run-b / fastest": True}


def test_single_recipe_run_has_latency_but_no_speedup(tmp_path):
    root = tmp_path / "single"
    make_review_run(root, candidates=("fast",), prompt_ids=("p-cat",), seeds=(0, 1), gates=False, verdict=False)
    manifest = json.loads((root / "run.json").read_text())
    manifest["baseline"], manifest["candidates"] = None, []  # what `h3eval generate` writes: one recipe, no pairs
    (root / "run.json").write_text(json.dumps(manifest))
    table = data.speed_table(data.load_run(root)).set_index("recipe")
    assert sorted(table.index) == [BASELINE, "fast"] and set(table["role"]) == {"recipe"}
    assert table["speedup"].isna().all()
    assert table.loc["fast", "p50_latency_s"] == pytest.approx(
        np.median([0.95 * latency("fast", "p-cat", s) for s in (0, 1)]))


def test_unreported_timings_are_left_out_not_read_as_zero(tmp_path):
    """Clips imported without latencies hold zeros (listed in ``extra.unreported``): speed is computed over the clips
    that report one, $/clip over those that report request-to-file, and a run without any says it has no timing."""
    from h3.atomic import atomic_write_json

    store = make_review_run(tmp_path / "partial", candidates=("fast",), prompt_ids=PROMPTS, seeds=SEEDS)
    untimed = ("p-car", 1)  # this pair's candidate record reports nothing; every record lacks request-to-file
    for recipe in (BASELINE, "fast"):
        for pid in PROMPTS:
            for seed in SEEDS:
                record = store.load_record(recipe, pid, seed)
                fields = ["timings.request_to_file_latency_s"]
                record.timings.request_to_file_latency_s = 0.0
                if recipe == "fast" and (pid, seed) == untimed:
                    fields += ["timings.generation_side_latency_s", "stage_anatomy"]
                    record.timings.generation_side_latency_s = 0.0
                record.extra["unreported"] = fields
                atomic_write_json(store.record_path(recipe, pid, seed), record.model_dump(mode="json"))
    run = data.load_run(store.root)
    assert data.has_timing(run)
    row = data.speed_table(run, 13.16).set_index("recipe").loc["fast"]
    pairs = [(p, s) for p in PROMPTS for s in SEEDS if (p, s) != untimed]
    base = np.array([run.clips.set_index(["recipe", "prompt_id", "seed"]).loc[(BASELINE, p, s),
                                                                              "generation_side_latency_s"]
                     for p, s in pairs], dtype=np.float64)
    cand = np.array([0.95 * latency("fast", p, s) for p, s in pairs], dtype=np.float64)
    assert row["n"] == 3 and row["speedup"] == pytest.approx(base.mean() / cand.mean(), rel=1e-12)
    assert row["p50_latency_s"] == pytest.approx(np.median(cand), rel=1e-12)
    assert row["dollars_per_clip"] is None and row["p50_request_to_file_s"] is None  # never priced from zeros
    anatomy = data.stage_anatomy([run]).set_index(["recipe", "stage"])
    assert anatomy.loc[("fast", "denoise"), "n"] == 3

    for pid in PROMPTS:  # nothing timed at all: no row is computed from the zeros
        for seed in SEEDS:
            for recipe in (BASELINE, "fast"):
                record = store.load_record(recipe, pid, seed)
                record.timings.generation_side_latency_s = 0.0
                record.extra["unreported"] = ["timings.generation_side_latency_s", "stage_anatomy",
                                              "timings.request_to_file_latency_s"]
                atomic_write_json(store.record_path(recipe, pid, seed), record.model_dump(mode="json"))
    run = data.load_run(store.root)
    assert not data.has_timing(run) and not len(data.stage_anatomy([run]))
    table = data.speed_table(run, 13.16)
    assert (table["n"] == 0).all() and table[["speedup", "p50_latency_s", "dollars_per_clip"]].isna().all().all()


def test_judge_use_from_a_verdict_names_why_a_candidate_has_no_judge():
    verdict = {"policy_name": "release", "candidates": [
        {"candidate": "imported", "judge": None, "reasons": [
            "recipe 'imported' declares no [signoff] kind; policy 'release' judges by kind (exact, near, resample) "
            "and does not guess one"], "gates": [{"gate": "integrity", "required": True}]},
        {"candidate": "turbo", "judge": "resample", "gates": [{"gate": "integrity", "required": True},
                                                             {"gate": "vbench", "required": False}]}]}
    run = data.RunData(root="x", label="x", manifest={"baseline": "b", "candidates": ["imported", "turbo", "gone"]},
                       clips=pd.DataFrame(columns=data.CLIP_COLUMNS), gates=pd.DataFrame(columns=data.GATE_COLUMNS),
                       gate_results={}, metric_directions={}, verdict=verdict)
    use = verdicts.judge_use(run)
    assert use["imported"].describe("integrity") == "used"
    assert use["imported"].describe("ghosting") == (
        "not used: no judge (recipe 'imported' declares no [signoff] kind; policy 'release' judges by kind (exact, "
        "near, resample) and does not guess one)")
    assert use["turbo"].describe("ghosting") == "not used by this candidate's judge (resample)"
    assert use["turbo"].describe("vbench") == "used by the judge (advisory)"
    assert use["gone"].describe("ghosting") == "unknown (verdict.json does not judge this candidate)"
    assert {u.source for u in use.values()} == {"verdict.json (policy release)"}
