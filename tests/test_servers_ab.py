"""A/B across servers (issue 20): one ``h3 serve`` per recipe (one per GPU in production) and
``h3eval ab --backend http --url RECIPE=URL``; a server may also serve several recipes on one shared model
(``h3 serve --recipe A --recipe B``), the layout of two H200s for a baseline and two candidates. Real servers on
loopback, the scaled-down random preset."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from h3.levers.lora import TURBO_LORA_FILE
from h3.random_model import SMALL_NOTICE
from h3.server import create_app, load_served_runtime
from h3.server_request import levers_sha256
from h3.train.seeded_lora import write_random_turbo_lora
from h3eval.commands.ab import run_ab_command
from h3eval.store import RunStore
from tests._serving import serving
from tests.conftest import FAST_RECIPE, toml_dumps


def _recipe_file(tmp_path, name, **changes):
    data = {**FAST_RECIPE, "name": name, **changes}
    path = tmp_path / f"{name}.toml"
    path.write_text(toml_dumps(data))
    return path


@pytest.fixture()
def lora_env(tmp_path, monkeypatch):
    baseline = load_served_runtime("h3-random-small", str(_recipe_file(tmp_path, "base")), "cpu")
    write_random_turbo_lora(tmp_path / "lora" / TURBO_LORA_FILE, baseline.pipe.transformer)
    monkeypatch.setenv("H3_LORA_DIR", str(tmp_path / "lora"))
    return baseline


def test_ab_over_a_server_per_recipe_and_a_multi_recipe_server(tmp_path, lora_env):
    lora = {"enabled": True, "path": f"$H3_LORA_DIR/{TURBO_LORA_FILE}", "fuse": True}
    int8 = _recipe_file(tmp_path, "int8", lora=lora, quant={"mode": "int8_w8a8"})
    sparse = _recipe_file(tmp_path, "sparse", lora=lora, bucketing={"enabled": True, "multiple": 64},
                          sparse_attention={"enabled": True, "block_size": 64, "sparsity": 0.5})
    candidates = load_served_runtime("h3-random-small", [str(int8), str(sparse)], "cpu")
    assert [r.name for r in candidates.served_recipes] == ["int8", "sparse"] and candidates.shared
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n"
                               for i, p in enumerate(["a cat", "a red kite over a hill"])))
    with serving(create_app(lora_env, tmp_path / "srv-base")) as base_url, \
            serving(create_app(candidates, tmp_path / "srv-cand")) as cand_url:
        models = __import__("httpx").get(f"{cand_url}/v1/models").json()["data"]
        assert {m["id"]: m["h3_levers_sha256"] for m in models if m["id"] in ("int8", "sparse")} == {
            r.name: levers_sha256(r) for r in candidates.served_recipes}
        result = run_ab_command(baseline=str(tmp_path / "base.toml"), candidates=[str(int8), str(sparse)],
                                prompts=prompts, out=tmp_path / "run", model="h3-random-small", backend="http",
                                urls=[f"base={base_url}", f"int8={cand_url}", f"sparse={cand_url}"], warmup=0,
                                speed_rounds=0)
    assert result.manifest.status == "complete", result.manifest.errors
    assert result.executed_mismatches == {}
    store = RunStore(tmp_path / "run")
    for name, url in (("base", base_url), ("int8", cand_url), ("sparse", cand_url)):
        for pid in ("p0", "p1"):
            record = store.read_record(name, pid, 0)
            assert record.extra["server_url"] == url and record.recipe_name == name
            assert record.weights == "random" and record.extra["weights_notice"] == SMALL_NOTICE
            assert record.extra["hash_source"] == "raw"
    # The candidates' server switched its one model between the two recipes, outside the requests' timings.
    switched = [store.read_record(n, p, 0).extra.get("server_switch_s")
                for n in ("int8", "sparse") for p in ("p0", "p1")]
    assert sum(s is not None for s in switched) >= 3
    levers = {n: store.read_record(n, "p0", 0).executed.levers for n in ("int8", "sparse")}
    assert levers["int8"]["quant"]["applied"] and not levers["int8"]["sparse_attention"]["applied"]
    assert levers["sparse"]["sparse_attention"]["applied"] and not levers["sparse"]["quant"]["applied"]
    assert store.weights_notices() == [SMALL_NOTICE]
    speed = json.loads((tmp_path / "run" / "speed.json").read_text())
    assert all(speed["protocols"]["quality_clips"][n]["executed_verified"] for n in ("base", "int8", "sparse"))


def test_a_multi_recipe_server_refuses_recipes_that_cannot_share(tmp_path):
    from h3.cli import app

    a = _recipe_file(tmp_path, "a")
    b = _recipe_file(tmp_path, "b", dtype="bfloat16")
    result = CliRunner().invoke(app, ["serve", "--model", "h3-random-small", "--recipe", str(a), "--recipe", str(b),
                                      "--device", "cpu", "--output-dir", str(tmp_path / "srv")])
    assert result.exit_code == 3, result.output
    assert "b: its dtype is bfloat16" in result.output and "cannot share one served model" in result.output
    assert not (tmp_path / "srv").exists()
