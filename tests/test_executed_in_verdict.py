"""Configured versus executed in the verdict, the reports and `h3eval ab`'s closing summary (issue 50): what ran as
the recipe asked yet is a known recipe bug (h3eval.executed.executed_flags: a cache's hit count, a LoRA's effective
scale, a partial lora.include, sparse attention on audio, quantization coverage) is shown per candidate, with the
clips it was raised on; it does not change the outcome."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from conftest import FAST_RECIPE, toml_dumps
from h3.atomic import atomic_write_json
from h3eval.executed import executed_summary_line, run_executed_flags
from h3eval.policy import load_policy
from h3eval.report import render_html, render_markdown
from h3eval.verdict import compute_verdict, read_verdict, summary_lines, write_verdict
from verdict_fixtures import TEST_POLICY, make_run, pairs_of, write_clean_results, write_text

NEVER_HIT = ("cache: the fbc cache (threshold 0.0) never hit: 0 hits in 4 forwards, every step computed (the clip is "
             "the uncached computation; seed 001: a short schedule has no redundant steps to find)")


def cached_run(tmp_path):
    """16 pairs; ``cached`` runs an fbc cache that never hit on 12 clips and hit twice on the other 4, ``plain`` runs
    no cache; both otherwise a faithful candidate under the test policy."""
    store = make_run(tmp_path / "run", candidates=("cached", "plain"), n_prompts=16)
    m = store.read_manifest()
    recipes = {**m.recipes, "cached": {**FAST_RECIPE, "name": "cached", "steps": 4,
                                       "cache": {"kind": "fbc", "threshold": 0.0}},
               "plain": {**FAST_RECIPE, "name": "plain", "steps": 4}}
    store.write_manifest(m.model_copy(update={"recipes": recipes}))
    for i, (pid, seed) in enumerate(pairs_of(store)):
        record = store.load_record("cached", pid, seed)
        cached = 0 if i < 12 else 2
        record.executed.levers["cache"] = {"applied": True, "kind": "fbc", "forwards": 4,
                                           "computed_steps": 4 - cached, "cached_steps": cached}
        atomic_write_json(store.record_path("cached", pid, seed), record.model_dump(mode="json"))
    for name in ("cached", "plain"):
        write_clean_results(store, name)
    return store


def test_the_verdict_and_the_reports_show_each_candidates_executed_flags(tmp_path):
    store = cached_run(tmp_path)
    policy = load_policy(write_text(tmp_path / "p.toml", TEST_POLICY))
    verdict = compute_verdict(store.root, policy)
    by = {c.candidate: c for c in verdict.candidates}
    assert by["cached"].executed_flags == [f"{NEVER_HIT} (12 of 16 clips)"]
    assert by["plain"].executed_flags == []
    assert by["cached"].outcome == by["plain"].outcome  # reported, not deciding
    path = write_verdict(verdict, store.root / "verdict.json")
    assert read_verdict(path).candidates[0].executed_flags == by["cached"].executed_flags
    assert json.loads(path.read_text())["candidates"][1]["executed_flags"] == []
    md = render_markdown(verdict, store.root)
    cached_section = md[md.index("## cached: "):md.index("## plain: ")]
    assert f"- configured versus executed: {NEVER_HIT} (12 of 16 clips)" in cached_section
    assert md.count("configured versus executed") == 1
    html = render_html(verdict, store.root)
    assert html.count("configured versus executed: cache: the fbc cache (threshold 0.0) never hit") == 1
    assert f"    configured versus executed: {NEVER_HIT} (12 of 16 clips)" in summary_lines(verdict)


def test_executed_summary_line_names_each_flagged_recipe_or_says_none(tmp_path):
    store = cached_run(tmp_path)
    manifest = store.read_manifest()
    assert executed_summary_line(store, manifest) == (
        f"configured versus executed: cached: {NEVER_HIT} (12 of 16 clips)")
    assert run_executed_flags(store, manifest, "baseline") == []  # {"name": ...}: not a recipe this suite computes
    plain = manifest.model_copy(update={"candidates": ["plain"]})
    assert executed_summary_line(store, plain) == "configured versus executed: no flag on baseline, plain"


def test_h3eval_ab_closes_with_the_executed_flags(tmp_path):
    """A real `h3eval ab` on the tiny-random preset: an fbc cache at threshold 0 never hits, and the closing summary
    says so in one line with its hit count."""
    from h3eval.cli import app

    recipes = []
    for name, changes in (("fast", {}), ("fast-fbc", {"cache": {"kind": "fbc", "threshold": 0.0}})):
        path = tmp_path / f"{name}.toml"
        path.write_text(toml_dumps({**FAST_RECIPE, "name": name, **changes}))
        recipes.append(path)
    prompts = write_text(tmp_path / "p.jsonl", json.dumps({"id": "a", "prompt": "a cat"}) + "\n")
    result = CliRunner().invoke(app, ["ab", "--baseline", str(recipes[0]), "--candidate", str(recipes[1]),
                                      "--prompts", str(prompts), "--out", str(tmp_path / "run"), "--warmup", "0",
                                      "--speed-rounds", "1", "--model", "tiny-random"])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if "configured versus executed" in x)
    assert line == ("  configured versus executed: fast-fbc: cache: the fbc cache (threshold 0.0) never hit: 0 hits "
                    "in 2 forwards, every step computed (the clip is the uncached computation; seed 001: a short "
                    "schedule has no redundant steps to find) (1 of 1 clips)")
