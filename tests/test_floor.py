"""Noise floors: determinism of a repeated recipe and the new-seed floor, written in the shape policies read."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gates.base import GateResult
from h3eval.cli import app
from h3eval.floor import newseed_floor_from_run
from h3eval.policy import load_floor

runner = CliRunner()


@pytest.fixture(scope="module")
def floor_run(tmp_path_factory, fast_recipe_file):
    root = tmp_path_factory.mktemp("floor")
    prompts = root / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": "a cat", "source": "test"}) + "\n")
    result = runner.invoke(app, ["floor", "--recipe", str(fast_recipe_file), "--prompts", str(prompts),
                                 "--seeds", "0,1", "--gates", "audio", "--out", str(root / "run")])
    assert result.exit_code == 0, result.output
    return root, result.output


def newseed_values(run_dir, metric):
    return [GateResult.model_validate_json(p.read_text()).metrics[metric].value
            for p in sorted((run_dir / "gates" / "audio" / "fast-newseed").glob("*.json"))]


def test_floor_is_the_mean_over_new_seed_pairs(floor_run):
    root, output = floor_run
    run = root / "run"
    assert "determinism: identical over 2 repeat pair(s)" in output
    values = newseed_values(run, "stft_distance")
    assert len(values) == 2 and all(v > 0 for v in values)
    floor = load_floor(run / "floor.json")
    assert floor.metrics["audio.stft_distance"] == pytest.approx(sum(values) / 2, rel=1e-12)
    # The new-seed view files the next seed's clip under this seed.
    assert (run / "clips" / "fast-newseed" / "a-s0.mp4").read_bytes() == (run / "clips" / "fast" / "a-s1.mp4").read_bytes()
    # The repeat side is the same recipe again: every audio distance exactly zero.
    repeats = [GateResult.model_validate_json(p.read_text())
               for p in sorted((run / "gates" / "audio" / "fast-repeat").glob("*.json"))]
    assert len(repeats) == 2 and all(r.metrics["stft_distance"].value == 0.0 for r in repeats)


def test_floor_from_an_existing_run_gives_the_same_floor(floor_run):
    root, _ = floor_run
    out = newseed_floor_from_run(root / "run", "fast", root / "from-run", gates=("audio",), progress=False)
    assert out["metrics"]["audio.stft_distance"] == load_floor(root / "run" / "floor.json").metrics["audio.stft_distance"]
    assert out["counts"]["audio.stft_distance"] == 2


def test_floor_needs_two_seeds(tmp_path, fast_recipe_file):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": "a cat"}) + "\n")
    result = runner.invoke(app, ["floor", "--recipe", str(fast_recipe_file), "--prompts", str(prompts),
                                 "--seeds", "0", "--gates", "audio", "--out", str(tmp_path / "run")])
    assert result.exit_code == 3 and "at least two seeds" in result.output
    assert not (tmp_path / "run").exists()


def test_a_damaged_gate_result_stops_the_floor(tmp_path, fast_recipe):
    """A new-seed result that does not parse is never silently left out of the floor's mean: the file is named."""
    from h3eval.floor import floor_from_results
    from h3eval.store import GateResultError, RunStore

    store = RunStore(tmp_path / "run")
    bad = store.gate_result_path("audio", f"{fast_recipe.name}-newseed", "a", 0)
    bad.parent.mkdir(parents=True)
    bad.write_text('{"gate": "audio", "pair": ')
    with pytest.raises(GateResultError, match=r"a-s0\.json is not a valid gate result"):
        floor_from_results(store, fast_recipe, ["audio"])


def test_floor_from_run_on_the_command_line(floor_run):
    """``h3eval floor --from-run RUN --recipe NAME``: the same floor as the function (and as generating it), from the
    run's clips; with --prompts as well it is refused (exit 3) and writes nothing."""
    root, _ = floor_run
    result = runner.invoke(app, ["floor", "--from-run", str(root / "run"), "--recipe", "fast", "--gates", "audio",
                                 "--out", str(root / "cli-from-run")])
    assert result.exit_code == 0, result.output
    assert (load_floor(root / "cli-from-run" / "floor.json").metrics["audio.stft_distance"]
            == load_floor(root / "run" / "floor.json").metrics["audio.stft_distance"])
    bad = runner.invoke(app, ["floor", "--from-run", str(root / "run"), "--recipe", "fast", "--prompts", "x.jsonl",
                              "--out", str(root / "bad")])
    assert bad.exit_code == 3 and "leave out --prompts" in bad.output and not (root / "bad").exists()
