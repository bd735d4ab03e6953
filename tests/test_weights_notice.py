"""A run on random weights says so everywhere (issue 20): "random weights: speed and memory are real, quality is not"
in its verdict (JSON and the CLI's lines), report.md, report.html, speed.md and on every dashboard page; a run on
trained weights says nothing of the kind."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dashboard.demo import make_review_run
from h3.atomic import atomic_write_json
from h3.random_model import NOTICE, SMALL_NOTICE
from h3eval import speed as speedmod
from h3eval.commands.report import run_report
from h3eval.store import RunStore
from h3eval.synth import make_synthetic_run
from h3eval.verdict import summary_lines

from verdict_fixtures import TEST_POLICY, write_clean_results, write_text

APP = str(Path(__file__).resolve().parent.parent / "dashboard" / "app.py")
PAGES = ("overview", "anatomy", "viewer", "gates", "trajectory", "verdict")


def _as_model(store: RunStore, model: str) -> None:
    manifest = store.read_manifest()
    manifest.model = model
    store.write_manifest(manifest)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("notice")
    random_run = make_synthetic_run(base / "random", candidates=("fast",), prompt_ids=[f"p{i}" for i in range(4)],
                                    seeds=(0,))
    _as_model(random_run, "h3-random")
    write_clean_results(random_run, "fast", seed=1)
    trained = make_synthetic_run(base / "trained", candidates=("fast",), prompt_ids=[f"p{i}" for i in range(4)],
                                 seeds=(0,))
    write_clean_results(trained, "fast", seed=1)
    policy = write_text(base / "test.toml", TEST_POLICY)
    return random_run, trained, policy


def test_verdict_and_reports_say_random_weights(runs):
    random_run, trained, policy = runs
    verdict, paths = run_report(random_run.root, policy, today=dt.date(2026, 11, 29))
    assert verdict.notices == [NOTICE]
    assert any(NOTICE in line for line in summary_lines(verdict))
    assert NOTICE in paths["verdict"].read_text()
    assert NOTICE in paths["markdown"].read_text().split("## Signoff")[0]  # above the signoff table
    assert NOTICE in paths["html"].read_text()
    clean, clean_paths = run_report(trained.root, policy, today=dt.date(2026, 11, 29))
    assert clean.notices == []
    assert "random weights" not in clean_paths["markdown"].read_text()
    assert "random weights" not in clean_paths["html"].read_text()


def test_a_record_that_carries_the_notice_labels_its_run(tmp_path):
    """A server's clips (the http backend) carry the notice in their records, whatever the run's --model says."""
    store = make_synthetic_run(tmp_path / "run", candidates=("fast",), prompt_ids=["p0"], seeds=(0,))
    assert store.weights_notices() == []
    record = store.load_record("fast", "p0", 0)
    record.extra["weights_notice"] = SMALL_NOTICE
    atomic_write_json(store.record_path("fast", "p0", 0), record.model_dump(mode="json"))
    assert store.weights_notices() == [SMALL_NOTICE]


def test_the_random_tiny_preset_says_so_and_the_trained_one_does_not(tmp_path):
    """``tiny-random`` runs carry a notice too, so that their reports are never read as the trained preset's."""
    from h3.random_model import weights_notice
    from h3.tiny import NOTICE as TINY_NOTICE

    store = make_synthetic_run(tmp_path / "run", candidates=("fast",), prompt_ids=["p0"], seeds=(0,))
    _as_model(store, "tiny-random")
    assert store.weights_notices() == [TINY_NOTICE] and TINY_NOTICE.startswith("random weights")
    _as_model(store, "tiny-trained")
    assert store.weights_notices() == [] and weights_notice("tiny-trained") is None


def test_speed_summary_says_random_weights():
    speed = {"run": "r", "baseline": "b", "notices": [NOTICE], "protocols": {},
             "definitions": {"quantile": "q", "speedup": "s"}}
    assert NOTICE in speedmod.render_markdown(speed).split("## ")[0]


@pytest.fixture(scope="module")
def review_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dash") / "review"
    _as_model(make_review_run(root, candidates=("fast",), prompt_ids=("p-cat",), seeds=(0,)), "h3-random")
    return root


@pytest.mark.parametrize("page", PAGES)
def test_every_dashboard_page_says_random_weights(monkeypatch, review_run, page):
    monkeypatch.setenv("H3EVAL_DASHBOARD_RUNS", str(review_run))
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params.update({"page": page})
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert any(NOTICE in w.value for w in at.warning), [w.value for w in at.warning]
