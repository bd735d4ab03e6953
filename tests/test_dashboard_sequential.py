"""The dashboard's Sequential page (issue 53) over a real `h3eval ab --sequential` run of the random-weight tiny
preset (run once for the module): every z, boundary, look, outcome and request saved on the page is the one
sequential.json holds, the boundaries are the design's (recomputed), the savings add up from the stops; a partial
(running), absent or damaged record is a message on the page, and a damaged PASS is never shown as a PASS. The
browser test loads the page in headless Chromium."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from dashboard import sequential as seq
from tests.conftest import FAST_RECIPE, toml_dumps

APP = str(Path(__file__).resolve().parent.parent / "dashboard" / "app.py")

# Sharpness non-inferior within 3.0, with a regression test: on 64x64 clips the one-step candidate is undecided at
# the first look and judged at the last; the off-identity candidate stops at the first (byte-identical PASS).
POLICY = """\
version = 1
name = "seqdash"
description = "dashboard sequential test: integrity; sharpness non-inferior within 3.0, and not consistently worse"
confidence = 0.95
min_pairs = 2
n_resamples = 999

[gates.integrity]
max_flagged = 0

[gates.reference_free.metrics.sharpness]
compare = "sides"
direction = "higher_is_better"
margin = 3.0
regression = { alpha = 0.05, min_shift = 0.0 }
"""


@pytest.fixture(scope="module")
def seq_run(tmp_path_factory) -> Path:
    """A complete sequential run: baseline `fast`, candidates `fast1` (one step) and `fast-identity`, looks at 2 and 4
    pairs (Pocock), 64x64 clips."""
    from h3eval.sequential import run_sequential

    tmp = tmp_path_factory.mktemp("seqdash")
    (tmp / "fast.toml").write_text(toml_dumps(FAST_RECIPE))
    (tmp / "fast1.toml").write_text(toml_dumps({**FAST_RECIPE, "name": "fast1", "description": "one step",
                                                "steps": 1}))
    (tmp / "policy.toml").write_text(POLICY)
    (tmp / "p.jsonl").write_text('{"id": "a", "prompt": "a cat"}\n{"id": "b", "prompt": "a red ball"}\n')
    out = tmp / "seq"
    run_sequential(out=out, baseline=str(tmp / "fast.toml"), candidates=[str(tmp / "fast1.toml")],
                   prompts=str(tmp / "p.jsonl"), seeds=[0], max_pairs=4, looks=(2, 4), design="pocock",
                   policy=str(tmp / "policy.toml"), off_identity=True, progress=False, model="tiny-random",
                   height=64, width=64, warmup=0, speed_rounds=0, device="cpu")
    state = _record(out)
    assert state["status"] == "complete" and state["savings"]["requests_saved"] > 0, state.get("stopped")
    return out


def _record(root: Path) -> dict:
    return json.loads((root / "sequential.json").read_text())


def _variant(seq_run: Path, tmp_path: Path, name: str, text: str | None) -> Path:
    """A run folder holding the real run.json and ``text`` as sequential.json (none when None)."""
    root = tmp_path / name
    root.mkdir()
    shutil.copy(seq_run / "run.json", root / "run.json")
    if text is not None:
        (root / "sequential.json").write_text(text)
    return root


def page(monkeypatch, *roots: Path, **query) -> AppTest:
    monkeypatch.setenv("H3EVAL_DASHBOARD_RUNS", os.pathsep.join(str(r) for r in roots))
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params.update({"page": "sequential", **{k: str(v) for k, v in query.items()}})
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Sequential"
    return at


def table(at: AppTest, column: str):
    matches = [d.value for d in at.dataframe if column in d.value.columns]
    assert matches, f"no table with {column!r}: {[list(d.value.columns) for d in at.dataframe]}"
    return matches[0]


def same(a, b) -> bool:
    """Equal floats, an infinity included (a p of 1 is a z of -inf); None equals None."""
    if a is None or b is None:
        return a is None and b is None
    return float(a) == float(b)


# -- a complete run ------------------------------------------------------------------------------------------------
def test_page_shows_each_look_against_the_designs_boundary(monkeypatch, seq_run):
    from h3eval.sequential import boundaries

    state = _record(seq_run)
    at = page(monkeypatch, seq_run)
    assert not at.error, [e.value for e in at.error]
    looks = table(at, "bound_worse")
    expected = [(r["look"], r["n_pairs"], cand, m) for r in state["rounds"] for cand, c in r["candidates"].items()
                for m in c["metrics"]]
    assert len(looks) == len(expected) and len(expected) >= 3
    fractions = [n / state["max_pairs"] for n in state["looks"]]
    for look, n_pairs, cand, m in expected:
        row = looks[(looks["candidate"] == cand) & (looks["look"] == look) & (looks["metric"] == m["metric"])]
        assert len(row) == 1, (cand, look, m["metric"])
        row = row.iloc[0]
        assert row["n_pairs"] == n_pairs and row["problem"] is None
        for key in ("z", "bound", "z_worse", "bound_worse", "p", "p_worse", "mean"):
            assert same(row[key], m[key]), (cand, look, key, row[key], m[key])
        assert same(row["ci_low"], m["ci"][0]) and same(row["ci_high"], m["ci"][1])
        assert row["crosses"] == (m["z"] >= m["bound"]) and row["crosses_worse"] == (m["z_worse"] >= m["bound_worse"])
        round_entry = state["rounds"][look - 1]["candidates"][cand]
        assert (row["metric_outcome"], row["outcome"], row["decision"]) == (m["outcome"], round_entry["outcome"],
                                                                           round_entry["why"])
        # The boundaries shown are the Pocock design's at this look, recomputed from its spending function: the
        # non-inferiority test at (1 - 0.95) / 2, the regression test at its alpha.
        assert row["bound"] == pytest.approx(boundaries(fractions, 0.025, "pocock")[look - 1], abs=1e-9)
        assert row["bound_worse"] == pytest.approx(boundaries(fractions, m["alpha_worse"], "pocock")[look - 1],
                                                   abs=1e-9)
    # A p of 1 (the identical candidate is never worse) is a z of -inf: shown as such, not as a number or a NaN.
    ident = looks[looks["candidate"] == "fast-identity"].iloc[0]
    assert ident["p_worse"] == 1.0 and ident["z_worse"] == -math.inf
    # One chart per metric of the candidate chosen (the first).
    first = state["candidates"][0]
    assert len(at.get("vega_lite_chart")) == len({m for (_, _, c, m) in
                                                  [(a, b, c, m["metric"]) for a, b, c, m in expected] if c == first})


def test_page_shows_where_each_candidate_stopped_and_the_requests_saved(monkeypatch, seq_run):
    state = _record(seq_run)
    at = page(monkeypatch, seq_run)
    cands = table(at, "stopped_at_look").set_index("candidate")
    stopped = state["stopped"]
    assert sorted(cands.index) == sorted(stopped) == sorted(state["candidates"])
    text = "\n".join(m.value for m in at.markdown)
    for name, s in stopped.items():
        assert (cands.loc[name, "outcome"], cands.loc[name, "stopped_at_look"], cands.loc[name, "pairs_used"]) == (
            s["outcome"], s["look"], s["n_pairs"])
        assert cands.loc[name, "requests_saved"] == state["max_pairs"] - s["n_pairs"]
        assert f"{name}: {s['outcome']} at look {s['look']} of {len(state['looks'])} ({s['n_pairs']} pairs)" in text
    # The savings shown are the record's, and they add up from the stops: the fixed design is every recipe at the
    # last look; the baseline generates until its last candidate stops.
    sv = state["savings"]
    n_max = state["max_pairs"]
    used = {"fast": max(s["n_pairs"] for s in stopped.values()), **{c: s["n_pairs"] for c, s in stopped.items()}}
    assert sv["fixed_requests"] == n_max * 3 and sv["requests"] == sum(used.values())
    assert sv["requests_saved"] == n_max * 3 - sum(used.values())
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Requests"] == f"{sv['requests']} of {sv['fixed_requests']}"
    assert metrics["Requests saved"] == str(sv["requests_saved"])
    assert metrics["Device-seconds saved"] == f"{sv['device_seconds_saved']:.1f}"
    per = table(at, "seconds_saved").set_index("recipe")
    for name, r in sv["recipes"].items():
        assert per.loc[name, "pairs_used"] == r["pairs_used"] == used[name]
        assert per.loc[name, "requests_saved"] == r["requests_saved"]
        assert per.loc[name, "seconds_saved"] == pytest.approx(r["seconds_saved"], rel=1e-12)


def test_boundary_chart_draws_the_regression_side_negative_and_marks_what_is_off_scale(seq_run):
    rec = seq.load_sequential(seq_run)
    row = _record(seq_run)["rounds"][0]["candidates"]["fast-identity"]["metrics"][0]
    frame, scale = seq.boundary_chart(rec.looks_table, "fast-identity", row["metric"])
    by = frame.set_index("series")
    assert by.loc[seq.SERIES["bound"], "drawn"] == row["bound"]
    assert by.loc[seq.SERIES["bound_worse"], "drawn"] == -row["bound_worse"]
    # -inf drawn negative is +inf: at the top edge, marked; the value kept for the tooltip.
    assert by.loc[seq.SERIES["z_worse"], "drawn"] == scale and by.loc[seq.SERIES["z_worse"], "off_scale"]
    assert by.loc[seq.SERIES["z_worse"], "value"] == -math.inf
    assert scale >= max(seq.Z_SCALE_MIN, 1.5 * row["bound"])


# -- partial, absent and damaged records ---------------------------------------------------------------------------
def _running(state: dict) -> dict:
    """The record as it stood after the first look: what a killed or ongoing run leaves."""
    first = state["rounds"][0]
    stopped = {c: s for c, s in state["stopped"].items() if s["look"] == 1}
    out = {k: v for k, v in state.items() if k not in ("savings", "ended_at")}
    return {**out, "status": "running", "rounds": [first], "stopped": stopped,
            "verdicts": {c: v for c, v in state["verdicts"].items() if c in stopped}}


def test_a_running_record_shows_its_looks_so_far_and_says_so(monkeypatch, seq_run, tmp_path):
    state = _running(_record(seq_run))
    going = [c for c in state["candidates"] if c not in state["stopped"]]
    assert going, "the fixture's one-step candidate is expected to go on after look 1"
    root = _variant(seq_run, tmp_path, "running", json.dumps(state))
    at = page(monkeypatch, root)
    assert not at.error, [e.value for e in at.error]
    warning = " ".join(w.value for w in at.warning)
    assert "still running: 1 of 2 looks recorded" in warning and all(c in warning for c in going)
    assert "Requests saved" not in [m.label for m in at.metric]  # counted when the run completes
    looks = table(at, "bound_worse")
    assert set(looks["look"]) == {1}
    cands = table(at, "stopped_at_look").set_index("candidate")
    for c in going:
        assert cands.loc[c, "outcome"] == seq.STILL_RUNNING and cands.loc[c, "pairs_used"] == state["looks"][0]
        assert pd.isna(cands.loc[c, "requests_saved"])


def _metric(state: dict, cand: str = "fast-identity") -> dict:
    return state["rounds"][0]["candidates"][cand]["metrics"][0]


def _set(path: str, value):
    """A mutation of the real record: ``path`` is a key list (int for lists)."""
    def apply(state: dict) -> dict:
        keys = path.split("/")
        node = state
        for k in keys[:-1]:
            node = node[int(k)] if isinstance(node, list) else node[k]
        last = keys[-1]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
        return state
    return apply


IDENT_M = "rounds/0/candidates/fast-identity/metrics/0"
ROW_DAMAGE = {
    # name: (mutation, the problem's words, the candidate whose shown outcome must be the damaged mark; the stop
    # records below leave the look's own rows as they are)
    "NaN z of a PASS": (_set(f"{IDENT_M}/z", float("nan")), "z is NaN", "fast-identity"),
    "p above 1": (_set(f"{IDENT_M}/p", 1.5), "outside [0.0, 1.0]", "fast-identity"),
    "z its p does not give": (_set(f"{IDENT_M}/z", 5.0), "but its p", "fast-identity"),
    "+inf z": (_set(f"{IDENT_M}/z", float("inf")), "not finite", "fast-identity"),
    "boundary not the design's": (_set(f"{IDENT_M}/bound", 0.1), "not one of the design's boundaries",
                                  "fast-identity"),
    "infinite mean": (_set(f"{IDENT_M}/mean", float("-inf")), "mean is -inf, not finite", "fast-identity"),
    "reversed CI": (_set(f"{IDENT_M}/ci", [1.0, -1.0]), "low end above its high end", "fast-identity"),
    "count as text": (_set(f"{IDENT_M}/n_pairs", "2"), "not an integer", "fast-identity"),
    "unknown outcome": (_set("rounds/0/candidates/fast-identity/outcome", "OK"), "not one of PASS", "fast-identity"),
    "stop at a look the design lacks": (_set("stopped/fast-identity/look", 3), "outside [1, ", "fast-identity"),
    "stop that the look did not record": (_set("stopped/fast-identity/outcome", "FAIL"), "is not what look 1 recorded",
                                          "fast-identity"),
}


STOP_DAMAGE = ("stop at a look the design lacks", "stop that the look did not record")


@pytest.mark.parametrize("name", list(ROW_DAMAGE))
def test_a_damaged_value_is_named_on_the_page_and_never_shown_as_a_pass(monkeypatch, seq_run, tmp_path, name):
    mutate, words, cand = ROW_DAMAGE[name]
    state = _record(seq_run)
    assert state["stopped"][cand]["outcome"] == "PASS"  # the damaged candidate is one the record PASSes
    root = _variant(seq_run, tmp_path, "damaged", json.dumps(mutate(state)))  # NaN / Infinity as Python writes them
    rec = seq.load_sequential(root)
    assert rec.status == "complete" and any(words in p for p in rec.problems), rec.problems
    at = page(monkeypatch, root)
    errors = " ".join(e.value for e in at.error)
    assert "failed their check" in errors and words in errors
    cands = table(at, "stopped_at_look").set_index("candidate")
    assert cands.loc[cand, "outcome"] == seq.DAMAGED and pd.isna(cands.loc[cand, "requests_saved"])
    assert f"{cand}: PASS" not in "\n".join(m.value for m in at.markdown)
    looks = table(at, "bound_worse")
    mine = looks[looks["candidate"] == cand]
    if name not in STOP_DAMAGE:
        assert (mine["outcome"] == seq.DAMAGED).all() and mine["z"].isna().all() and mine["bound"].isna().all()
    # The other candidate's values are still shown.
    other = looks[looks["candidate"] != cand]
    assert len(other) and other["problem"].isna().all() and other["z"].notna().all()


def test_savings_that_do_not_add_up_are_not_shown(monkeypatch, seq_run, tmp_path):
    state = _record(seq_run)
    state["savings"]["requests_saved"] += 1
    root = _variant(seq_run, tmp_path, "savings", json.dumps(state))
    at = page(monkeypatch, root)
    assert "savings.requests_saved" in " ".join(e.value for e in at.error)
    assert "Requests saved" not in [m.label for m in at.metric]
    assert table(at, "stopped_at_look")["requests_saved"].isna().all()


WHOLE_FILE = {
    "not JSON": ("{\"schema\": ", "not readable JSON"),
    "empty": ("", "not readable JSON"),
    "a list": ("[1, 2]", "JSON list, not a sequential record"),
    "another schema": (json.dumps({"schema": "h3eval.verdict", "status": "complete"}), "its schema is"),
    "unknown status": (None, "status is 'paused'"),
    "no design": (None, "it has no design"),
    "looks that do not increase": (None, "do not increase"),
    "NaN boundary in the design": (None, "design.bounds[0.025][0] is NaN"),
}


def _whole_file_text(seq_run: Path, name: str) -> str:
    text, _ = WHOLE_FILE[name]
    if text is not None:
        return text
    state = _record(seq_run)
    if name == "unknown status":
        state["status"] = "paused"
    elif name == "no design":
        del state["design"]
    elif name == "looks that do not increase":
        state["design"]["looks"] = [4, 2]
    elif name == "NaN boundary in the design":
        state["design"]["bounds"]["0.025"][0] = float("nan")
    return json.dumps(state)


@pytest.mark.parametrize("name", list(WHOLE_FILE))
def test_an_unreadable_record_is_one_message(monkeypatch, seq_run, tmp_path, name):
    root = _variant(seq_run, tmp_path, "bad", _whole_file_text(seq_run, name))
    rec = seq.load_sequential(root)
    assert rec.status == "unreadable" and WHOLE_FILE[name][1] in rec.message, rec.message
    at = page(monkeypatch, root)
    assert [e.value for e in at.error] == [rec.message]
    assert not at.dataframe and not at.metric


def test_a_run_without_a_record_says_it_is_not_sequential(monkeypatch, seq_run, tmp_path):
    root = _variant(seq_run, tmp_path, "plain", None)
    at = page(monkeypatch, root)
    assert not at.error
    assert [i.value for i in at.info] == [f"plain is not a sequential run: it has no sequential.json (`h3eval ab "
                                          "--sequential` writes one after every look)."]


# -- in a browser --------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_sequential_page_in_chromium(seq_run, tmp_path):
    """`h3eval dashboard` over the real run and a damaged copy, loaded in headless Chromium: the page shows each
    stop and the requests saved with a chart and no error element; the damaged copy shows its error, no traceback."""
    from tests.test_dashboard_browser import CHROMIUM, ERROR_SELECTOR, load

    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright-python is not installed")
    from tests._serving import streamlit_dashboard

    state = _record(seq_run)
    bad = _variant(seq_run, tmp_path, "bad", json.dumps(_set(f"{IDENT_M}/z", float("nan"))(_record(seq_run))))
    with streamlit_dashboard([seq_run, bad], tmp_path / "streamlit.log") as base, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            pg = load(browser, f"{base}/?page=sequential&run=0", "Sequential", "sequential")
            body = pg.inner_text("body")
            for name, s in state["stopped"].items():
                assert f"{name}: {s['outcome']} at look {s['look']} of {len(state['looks'])}" in body
            assert "Requests saved" in body and f"{state['savings']['requests']} of 12" in body
            assert pg.locator('[data-testid="stVegaLiteChart"]').count() >= 1
            assert pg.locator(ERROR_SELECTOR).count() == 0
            pg.close()
            pg = load(browser, f"{base}/?page=sequential&run=1", "Sequential", "sequential-damaged")
            body = pg.inner_text("body")
            assert pg.locator(ERROR_SELECTOR).count() == 1 and "is NaN" in body
            assert "Traceback" not in body and "fast-identity: PASS" not in body
            pg.close()
        finally:
            browser.close()
