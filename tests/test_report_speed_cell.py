"""The report's speed cell: the outcome with the speedup and its CI (issue 51: it read `INCONCLUSIVE n/ax` while
speed.md showed 3.31x [2.83, 4.48])."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np

from h3eval.commands.report import run_report
from h3eval.report import speed_cell
from h3eval.synth import make_synthetic_run
from h3eval.verdict import SpeedVerdict

from verdict_fixtures import TEST_POLICY, write_clean_results, write_text

TODAY = dt.date(2026, 11, 29)


def _latency(recipe: str, prompt_id: str, seed: int) -> float:
    return {"baseline": 2.0, "fast": 1.0}[recipe] * (1 + 0.03 * int(prompt_id[1:]) + 0.01 * (recipe == "fast"))


def _table_cell(report_md: str, candidate: str) -> str:
    lines = report_md.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| candidate | overall |"))
    column = [c.strip() for c in lines[header].strip("|").split("|")].index("speed")
    row = next(line for line in lines[header + 2:] if line.startswith(f"| {candidate} |"))
    return [c.strip() for c in row.strip("|").split("|")][column]


def test_report_speed_cell_shows_the_estimate_and_ci(tmp_path):
    prompts = [f"p{i}" for i in range(8)]
    store = make_synthetic_run(tmp_path / "run", candidates=("fast",), prompt_ids=prompts, seeds=(0,),
                               latency_fn=_latency)
    write_clean_results(store, "fast", seed=1)
    verdict, paths = run_report(store.root, write_text(tmp_path / "test.toml", TEST_POLICY), today=TODAY)
    sp = verdict.candidates[0].speed
    records = [(store.read_record("baseline", p, 0), store.read_record("fast", p, 0)) for p in prompts]
    base = np.array([b.timings.generation_side_latency_s for b, _ in records], dtype=np.float64)
    cand = np.array([c.timings.generation_side_latency_s for _, c in records], dtype=np.float64)
    assert sp.speedup == np.float64(base.mean() / cand.mean())  # the cell shows the verdict's own estimate
    expected = f"{sp.outcome} {base.mean() / cand.mean():.2f}x [{sp.ci_low:.2f}, {sp.ci_high:.2f}]"
    assert sp.ci_low < sp.speedup < sp.ci_high
    assert _table_cell(paths["markdown"].read_text(), "fast") == expected
    assert f'<td class="{sp.outcome}">{expected}</td>' in paths["html"].read_text()


def _speed_json(path, protocols: dict) -> None:
    path.write_text(json.dumps({"baseline": "base", "protocols": protocols}))


def test_speed_cell_without_an_estimate_in_the_verdict(tmp_path):
    """Too few timed pairs in the verdict: the cell names speed.json's estimate (a speed protocol first), never a
    number that is not finite and positive."""
    sp = SpeedVerdict(candidate="fewer-steps", required=True, outcome="INCONCLUSIVE", raw_outcome="INCONCLUSIVE",
                      latency="generation_side_latency_s", min_speedup=1.5)
    assert speed_cell(sp, None) == "INCONCLUSIVE (no estimate: no timed pairs)"
    assert speed_cell(sp.model_copy(update={"n_pairs": 4}), None) == "INCONCLUSIVE (no estimate: 4 timed pair(s))"
    ok = {"speedup": 3.3149, "ci_low": 2.8312, "ci_high": 4.4788, "n_pairs": 12}
    _speed_json(tmp_path / "speed.json", {
        "quality_clips": {"fewer-steps": {"status": "ok", "speedup": {"speedup": 9.0, "ci_low": 8.0, "ci_high": 10.0,
                                                                      "n_pairs": 4}}},
        "mixed": {"fewer-steps": {"status": "ok", "speedup": ok}}})
    assert speed_cell(sp, tmp_path) == ("INCONCLUSIVE (no estimate in the verdict; speed.json mixed: 3.31x "
                                        "[2.83, 4.48] (n 12))")
    _speed_json(tmp_path / "speed.json", {"mixed": {"fewer-steps": {"speedup": {**ok, "ci_low": float("nan")}}}})
    assert speed_cell(sp, tmp_path) == ("INCONCLUSIVE (no estimate in the verdict; speed.json mixed: 3.31x (no CI) "
                                        "(n 12))")
    _speed_json(tmp_path / "speed.json", {"mixed": {"fewer-steps": {"speedup": {**ok, "speedup": float("inf")}}},
                                          "repeated": {"other": {"speedup": ok}}})
    assert speed_cell(sp, tmp_path) == "INCONCLUSIVE (no estimate: no timed pairs)"
    (tmp_path / "speed.json").write_text("{ truncated")
    assert speed_cell(sp, tmp_path) == "INCONCLUSIVE (no estimate: no timed pairs)"
