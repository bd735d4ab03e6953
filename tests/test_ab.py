"""`h3eval ab`: interleaved A/B runs, configured-versus-executed, off-identity, recompile flag, resume, speed math."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
from typer.testing import CliRunner

from h3.record import ClipRecord
from h3.recipe import Recipe, recipe_from_dict
from h3eval import speed as speedmod
from h3eval.ab import check_executed, off_identity
from h3eval.store import read_finished_record
from h3eval.commands.ab import register, run_ab_command
from h3eval.store import RunStore
from h3eval.synth import make_synthetic_run, moving_square_frames, synthetic_record, tone_pcm
from tests.conftest import FAST_RECIPE, toml_dumps

LONG_PROMPT = ("an old fisherman repairs his net on a wooden dock at sunrise while seagulls circle overhead and "
               "waves slap against the hull of his boat as the light turns from grey to gold")


def write_prompts(path: Path, prompts: dict[str, str]) -> Path:
    path.write_text("".join(json.dumps({"id": k, "prompt": v}) + "\n" for k, v in prompts.items()))
    return path


def write_recipe(directory: Path, **changes) -> Path:
    data = {**FAST_RECIPE, **changes}
    path = directory / f"{data['name']}.toml"
    path.write_text(toml_dumps(data))
    return path


class RecipeView:
    """The session's loaded tiny runtime (recipe ``fast``) reporting under another recipe's name.

    What executes is whatever the loaded runtime does: a recipe that asks for something else than ``fast`` still
    runs ``fast`` — exactly the misconfiguration the configured-versus-executed check must catch. ``sleep_s``
    plants a per-shape JIT compile: the first transformer call at each new input shape in this process sleeps.
    """

    def __init__(self, runtime, recipe: Recipe, calls: list, kill_at: int | None = None, sleep_s: float = 0.0):
        self.runtime, self.recipe, self.calls, self.kill_at, self.sleep_s = runtime, recipe, calls, kill_at, sleep_s
        self.seen_shapes: set = set()

    def _pre_hook(self, module, args, kwargs):
        key = tuple(tuple(t.shape) for t in [*args, *kwargs.values()] if hasattr(t, "shape"))
        if key not in self.seen_shapes:
            self.seen_shapes.add(key)
            time.sleep(self.sleep_s)

    def generate(self, request, out, extra=None, **kwargs):
        if self.kill_at is not None and len(self.calls) == self.kill_at:
            raise KeyboardInterrupt  # the user's Ctrl-C between two requests
        self.calls.append(Path(out))
        loaded = self.runtime.recipe
        self.runtime.recipe = loaded.model_copy(update={"name": self.recipe.name})
        handle = (self.runtime.pipe.transformer.register_forward_pre_hook(self._pre_hook, with_kwargs=True)
                  if self.sleep_s else None)
        try:
            return self.runtime.generate(request, out, extra, **kwargs)
        finally:
            self.runtime.recipe = loaded
            if handle is not None:
                handle.remove()


def view_factory(runtime, calls, kill_at=None, sleepy=()):
    def factory(model, recipe, device):
        return RecipeView(runtime, recipe, calls, kill_at, sleep_s=6.0 if recipe.name in sleepy else 0.0)

    return factory


# -- configured versus executed ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mismatch_run(tmp_path_factory, tiny_random_runtime):
    root = tmp_path_factory.mktemp("mismatch")
    prompts = write_prompts(root / "p.jsonl", {"a": "a cat"})
    four = write_recipe(root, name="four", steps=4)
    sage = write_recipe(root, name="asks-math", attention={"backend": "_native_math"})
    calls: list = []
    result = run_ab_command(baseline=str(write_recipe(root)), candidates=[str(four), str(sage)], prompts=prompts,
                            out=root / "run", warmup=0, speed_rounds=1, trajectory=True, model="tiny-random",
                            runtime_factory=view_factory(tiny_random_runtime, calls))
    return root / "run", result, calls


def test_mismatch_fails_the_run_and_gives_no_speed_number(mismatch_run):
    out, result, calls = mismatch_run
    assert result.manifest.status == "failed"
    assert result.executed_mismatches["four"] == ["steps: recipe asks for 4 DiT forward passes, 2 ran"]
    assert result.executed_mismatches["asks-math"] == [
        "attention.backend: recipe asks for '_native_math', the dispatcher ran ['native']"]
    speed = json.loads((out / "speed.json").read_text())
    for name in ("four", "asks-math"):
        for section in ("mixed", "quality_clips"):
            assert speed["protocols"][section][name]["status"] == "refused"
            assert "generation_side_latency_s" not in speed["protocols"][section][name]
        assert not list(out.rglob(f"{name}/*.mp4")) and not list(out.rglob(f"{name}/r000-a-s0.json"))
        error = json.loads((out / "speed" / "mixed" / name / "r000-a-s0.error.json").read_text())
        assert "configured-versus-executed mismatch" in error["error"]
    # Each mismatching recipe ran once, then was stopped: 2 baseline clips + 1 per candidate.
    assert len(calls) == 4
    assert speed["protocols"]["mixed"]["fast"]["status"] == "ok"
    # Latent trajectories are recorded for the quality clips (the trajectory gate's input), not for timing requests.
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.traj.npz")) == ["clips/fast/a-s0.traj.npz"]


def test_check_executed_field_by_field(mismatch_run):
    out, _, _ = mismatch_run
    record = RunStore(out).read_record("fast", "a", 0)
    fast = recipe_from_dict(FAST_RECIPE)
    assert check_executed(fast, record) == []
    assert check_executed(recipe_from_dict({**FAST_RECIPE, "dtype": "bfloat16"}), record) == [
        "dtype: recipe asks for bfloat16, the transformer ran in float32"]
    assert check_executed(recipe_from_dict({**FAST_RECIPE, "vae": {"tiling": False}}), record) == [
        "vae.tiling: recipe asks for False, executed True"]
    assert check_executed(recipe_from_dict({**FAST_RECIPE, "vae": {"tile_height": 128}}), record) == [
        "vae tile: recipe asks for [128, 256], executed [256, 256]"]
    # A runtime told to run the transformer in another dtype (the parallel check's floor twin) says so in the record;
    # the dtype is then checked against that, both ways.
    told = record.model_copy(deep=True)
    told.extra["transformer_dtype"] = "float64"
    assert check_executed(fast, told) == [
        "dtype: recipe asks for float32 (the runtime for float64), the transformer ran in float32"]
    told.executed.torch_dtype = "float64"
    assert check_executed(fast, told) == []
    assert check_executed(fast, record.model_copy(update={"executed": told.executed})) == [
        "dtype: recipe asks for float32, the transformer ran in float64"]


def test_lever_sections_must_report_applied(mismatch_run):
    """Each lever's own config checks its telemetry: on must report applied, off must not (h3/levers/base.py)."""
    out, _, _ = mismatch_run
    record = RunStore(out).read_record("fast", "a", 0)
    recipe = recipe_from_dict({**FAST_RECIPE, "quant": {"mode": "int8_weight_only"}})
    applied = record.model_copy(deep=True)
    del applied.executed.levers["quant"]
    problems = check_executed(recipe, applied)
    assert problems == ["quant: is enabled in the recipe but reported no telemetry (did it run?)"]
    applied.executed.levers["quant"] = {"applied": True, "modules": 12}
    assert check_executed(recipe, applied) == [  # applied is not enough: the telemetry must show the configuration
        "quant: recipe asks for mode 'int8_weight_only', the quantized modules ran None",
        "quant: reported no integer quantized_modules (None)"]
    forwards = applied.executed.forward_passes
    quant = {"applied": True, "mode": "int8_weight_only", "quantized_modules": 12, "quantized_modules_called": 12,
             "quantized_linear_calls": 12 * forwards}
    applied.executed.levers["quant"] = quant
    assert check_executed(recipe, applied) == []
    applied.executed.levers["quant"] = {**quant, "quantized_modules_called": 11}
    assert check_executed(recipe, applied) == [f"quant: 11 of the 12 quantized modules ran in {forwards} DiT forwards "
                                               "(a quantized module that never runs was bypassed)"]
    applied.executed.levers["quant"] = dict(quant)
    applied.executed.levers["quant"]["applied"] = False
    assert check_executed(recipe, applied)[0].startswith("quant: is enabled in the recipe but reported applied=False")
    applied.executed.levers.update(quant=dict(quant), cache={"applied": True, "hits": 3})
    assert check_executed(recipe, applied) == [
        "cache: is off in the recipe but reported that it applied: {'applied': True, 'hits': 3}"]
    applied.executed.levers.update(cache={"applied": False}, compile={"applied": True})
    assert check_executed(recipe, applied) == ["compile: is off in the recipe but reported that it applied: "
                                               "{'applied': True}"]
    applied.executed.levers.update(compile={"applied": False}, mystery_lever={"applied": True})
    assert "mystery_lever: the runtime reported lever telemetry the recipe does not configure" in check_executed(
        recipe, applied)[0]
    assert [recipe_from_dict({**FAST_RECIPE, **section}).__getattribute__(name).is_on() for name, section in (
        ("bucketing", {"bucketing": {"enabled": False, "multiple": 8}}),
        ("attention", {"attention": {"backend": "sage"}}),
        ("quant", {"quant": {"mode": "none"}}), ("cache", {"cache": {"kind": "none", "threshold": 0.1}}),
        ("cache", {"cache": {"kind": "fbc"}}))] == [False, True, False, False, True]


# -- off-identity ----------------------------------------------------------------------------------------------------
def test_off_identity_catches_a_one_pixel_difference(tmp_path):
    def frames(recipe, pid, seed):
        f = moving_square_frames(24, 64, seed)
        if recipe == "identity" and pid == "b":
            f = f.copy()
            f[5, 10, 10, 0] ^= 1  # one least-significant bit of one pixel
        return f

    store = make_synthetic_run(tmp_path / "run", baseline="baseline", candidates=["identity"], prompt_ids=["a", "b"],
                               seeds=[0, 1], frames_fn=frames)
    check = off_identity(store, "baseline", "identity", ["a", "b"], [0, 1])
    assert check["identical"] == 2 and not check["passed"] and check["missing"] == []
    assert [d["pair"] for d in check["differing"]] == ["b-s0", "b-s1"]
    assert all(d["frames_equal"] is False and d["pcm_equal"] is True for d in check["differing"])


# -- speed math ------------------------------------------------------------------------------------------------------
def _record(tmp_path, latency, seq, name, session="s1", seq_no=0, warmup=False):
    mp4 = tmp_path / "x.mp4"
    if not mp4.exists():
        from h3.media import encode_mp4

        encode_mp4(mp4, moving_square_frames(24, 32), tone_pcm(1.0))
    record = synthetic_record("r", "a", 0, moving_square_frames(24, 32), tone_pcm(1.0), mp4, latency_s=latency)
    record.timings.generation_side_latency_s = latency
    record.shape.sequence_length, record.shape.num_text_tokens = seq, seq // 10
    record.extra = {"session": session, "seq": seq_no, "request_name": name, "warmup": warmup}
    return record


def test_detect_recompiles_against_a_hand_worked_case(tmp_path):
    # Warm-up at shape 100; then 100 (steady), 200 first (slow), 100, 200 (steady), 300 first (slightly slow).
    recs = [_record(tmp_path, 9.0, 100, "w0", seq_no=0, warmup=True),
            _record(tmp_path, 2.0, 100, "r0", seq_no=1), _record(tmp_path, 5.0, 200, "r1", seq_no=2),
            _record(tmp_path, 2.2, 100, "r2", seq_no=3), _record(tmp_path, 2.1, 200, "r3", seq_no=4),
            _record(tmp_path, 2.4, 300, "r4", seq_no=5)]
    result = speedmod.detect_recompiles(recs)
    # steady = median(2.0, 2.2, 2.1) = 2.1; threshold = max(2.1 * 1.25, 2.1 + 0.5) = 2.625
    assert result["steady_state_s"] == pytest.approx(2.1) and result["threshold_s"] == pytest.approx(2.625)
    assert [s["shape"] for s in result["shapes"]] == ["seq200-txt20"] and result["shapes"][0]["request"] == "r1"
    # A new process (session) pays again for a shape the old one had seen.
    again = speedmod.detect_recompiles(recs + [_record(tmp_path, 6.0, 100, "r5", session="s2", seq_no=1)])
    assert [s["request"] for s in again["shapes"]] == ["r1", "r5"]


def test_speedup_is_the_statistics_modules():
    """speed.json's speedup is h3eval.stats.speedup (the verdict's and the dashboard's): the same paired BCa
    bootstrap, which is scipy's with the same draws."""
    base = [10.0, 11.0, 9.5, 10.5, 12.0, 9.0]
    cand = [5.0, 5.2, 5.1, 4.8, 6.5, 4.4]
    got = speedmod.speedup(base, cand, n_resamples=500, seed=7)
    ref = scipy.stats.bootstrap((np.array(base), np.array(cand)), lambda b, c, axis=-1: np.mean(b, axis=axis)
                                / np.mean(c, axis=axis), paired=True, vectorized=True, n_resamples=500, method="BCa",
                                rng=np.random.default_rng(7))
    assert got["speedup"] == pytest.approx(sum(base) / sum(cand))
    assert got["ci_low"] == pytest.approx(ref.confidence_interval.low, rel=1e-12)
    assert got["ci_high"] == pytest.approx(ref.confidence_interval.high, rel=1e-12)
    assert got["bootstrap"] == {"method": "BCa", "B": 500, "seed": 7}
    assert got["ci_low"] < got["speedup"] < got["ci_high"]
    one = speedmod.speedup([10.0], [5.0])
    assert one["speedup"] == 2.0 and one["ci_low"] is None and "not informative" in one["warning"]


# -- the full run: interleaving, warm-up, recompile flag, kill and resume --------------------------------------------
@pytest.mark.slow
def test_ab_run_killed_and_resumed(tmp_path, tiny_random_runtime):
    prompts = write_prompts(tmp_path / "p.jsonl", {"a": "a cat", "b": LONG_PROMPT})
    sleepy = write_recipe(tmp_path, name="sleepy", description="same levers as fast; first call per shape sleeps")
    calls: list = []
    kwargs = dict(baseline=str(write_recipe(tmp_path)), candidates=[str(sleepy)], prompts=prompts,
                  out=tmp_path / "run", warmup=1, speed_rounds=2, gpu_hourly_rate=13.16, model="tiny-random")
    with pytest.raises(KeyboardInterrupt):
        run_ab_command(**kwargs, runtime_factory=view_factory(tiny_random_runtime, calls, kill_at=5, sleepy={"sleepy"}))
    assert [p.parent.name + "/" + p.stem for p in calls[2:]] == ["fast/r000-a-s0", "sleepy/r000-a-s0",
                                                                  "fast/r001-b-s0"]  # interleaved per request
    result = run_ab_command(**kwargs, runtime_factory=view_factory(tiny_random_runtime, calls, sleepy={"sleepy"}))
    out = tmp_path / "run"
    assert result.manifest.status == "complete", result.manifest.errors
    timed = [p for p in calls if "warmup" not in p.parts]
    expected = ({out / "speed" / "mixed" / r / f"r{i:03d}-{'ab'[i % 2]}-s0.mp4" for r in ("fast", "sleepy")
                 for i in range(4)} | {out / "clips" / r / f"{p}-s0.mp4" for r in ("fast", "sleepy") for p in "ab"})
    assert len(timed) == len(set(timed)) and set(timed) == expected  # nothing generated twice, nothing lost
    assert all(read_finished_record(p) is not None for p in expected)
    assert not list(out.rglob("*.tmp")) and not list(out.rglob("*.error.json"))
    warm = sorted((out / "warmup" / "sleepy").glob("*.mp4"))
    assert len(warm) == 2 and all(read_finished_record(p).extra["warmup"] for p in warm)  # one per process

    speed = json.loads((out / "speed.json").read_text())
    b_record = read_finished_record(out / "speed" / "mixed" / "sleepy" / "r001-b-s0.mp4")
    rc = speed["recompiles"]["sleepy"]
    assert rc["flagged"] and [s["shape"] for s in rc["shapes"]] == [speedmod.shape_key(b_record)]
    assert rc["shapes"][0]["request"] == "r001-b-s0" and rc["shapes"][0]["excess_s"] > 4.0
    assert speed["protocols"]["mixed"]["sleepy"]["recompiles"]["flagged"]
    assert not speed["protocols"]["quality_clips"]["sleepy"]["recompiles"]["flagged"]

    fast = speed["protocols"]["mixed"]["fast"]
    recs = [read_finished_record(out / "speed" / "mixed" / "fast" / f"r{i:03d}-{'ab'[i % 2]}-s0.mp4") for i in range(4)]
    gen = [r.timings.generation_side_latency_s for r in recs]
    r2f = [r.timings.request_to_file_latency_s for r in recs]
    assert fast["n"] == 4  # warm-ups excluded
    assert fast["generation_side_latency_s"]["p50"] == pytest.approx(statistics.median(gen))
    assert fast["generation_side_latency_s"]["p90"] == pytest.approx(
        statistics.quantiles(gen, n=10, method="inclusive")[8])
    assert fast["real_time_factor_p50"] == pytest.approx(statistics.median(g / r.shape.duration_s
                                                                           for g, r in zip(gen, recs)))
    assert fast["usd_per_clip"] == pytest.approx(statistics.median(r2f) * 13.16 / 3600)
    assert fast["stage_anatomy_median_s"]["text_encode"] == pytest.approx(
        statistics.median(r.timings.stage_anatomy.text_encode for r in recs))
    assert fast["stage_anatomy_median_s"]["denoise_step_first"] == pytest.approx(
        statistics.median(r.timings.stage_anatomy.denoise_steps[0] for r in recs))
    assert fast["stage_anatomy_median_s"]["denoise_step_last"] == pytest.approx(
        statistics.median(r.timings.stage_anatomy.denoise_steps[-1] for r in recs))
    sleepy_recs = [read_finished_record(out / "speed" / "mixed" / "sleepy" / f"r{i:03d}-{'ab'[i % 2]}-s0.mp4")
                   for i in range(4)]
    sp = speed["protocols"]["mixed"]["sleepy"]["speedup"]
    assert sp["n_pairs"] == 4 and sp["speedup"] == pytest.approx(
        sum(gen) / sum(r.timings.generation_side_latency_s for r in sleepy_recs))
    assert result.off_identity["sleepy"]["passed"] and result.off_identity["sleepy"]["identical"] == 2
    assert "| sleepy |" in (out / "speed.md").read_text()


def test_warmup_recipe_warms_only_the_named_recipe_and_baseline_last_orders_the_pair(tmp_path, tiny_random_runtime):
    """``--warmup-recipe sleepy``: the compiled candidate's one-time cost is paid by its warm-up request, the
    baseline gets none (at full size its warm-up would cost minutes); ``--baseline-last``: the pair's candidate
    runs before its baseline; the quality clips are the same set."""
    prompts = write_prompts(tmp_path / "p.jsonl", {"a": "a cat"})
    sleepy = write_recipe(tmp_path, name="sleepy", description="same levers as fast; first call per shape sleeps")
    calls: list = []
    result = run_ab_command(baseline=str(write_recipe(tmp_path)), candidates=[str(sleepy)], prompts=prompts,
                            out=tmp_path / "run", warmup=1, warmup_recipes=["sleepy"], speed_rounds=0,
                            baseline_last=True,
                            model="tiny-random",
                            runtime_factory=view_factory(tiny_random_runtime, calls, sleepy={"sleepy"}))
    out = tmp_path / "run"
    assert result.manifest.status == "complete", result.manifest.errors
    assert [p.relative_to(out).parts[:2] for p in calls] == [("warmup", "sleepy"), ("clips", "sleepy"),
                                                              ("clips", "fast")]
    assert not (out / "warmup" / "fast").exists() and len(list((out / "warmup" / "sleepy").glob("*.mp4"))) == 1
    cold = read_finished_record(next((out / "warmup" / "sleepy").glob("*.mp4")))
    warm = read_finished_record(out / "clips" / "sleepy" / "a-s0.mp4")
    assert cold.timings.generation_side_latency_s > warm.timings.generation_side_latency_s + 5.0  # the planted 6 s
    # No speed round: speed.json has the quality clips' section only, no empty protocol table.
    assert list(json.loads((out / "speed.json").read_text())["protocols"]) == ["quality_clips"]
    assert not (out / "speed").exists()


# -- the command -----------------------------------------------------------------------------------------------------
def test_command_refuses_bad_input_with_exit_3(tmp_path, fast_recipe_file):
    import typer

    app = typer.Typer()
    register(app)

    @app.command("noop")
    def _noop() -> None:  # a second command so typer keeps the command name
        pass

    prompts = write_prompts(tmp_path / "p.jsonl", {"a": "a cat"})
    base = ["ab", "--baseline", str(fast_recipe_file), "--prompts", str(prompts), "--out", str(tmp_path / "run")]
    for extra, message in [(["--candidate", str(fast_recipe_file)], "recipe names must be distinct"),
                           (["--candidate", "nope"], "unknown recipe"),
                           (["--candidate", str(write_recipe(tmp_path, name="c")), "--speed-protocol", "fast"],
                            "--speed-protocol must be"),
                           (["--candidate", str(write_recipe(tmp_path, name="c")), "--backend", "http"],
                            "needs at least one --url"),
                           (["--candidate", str(write_recipe(tmp_path, name="c")), "--gpu-hourly-rate", "-1"],
                            "must be positive"),
                           (["--candidate", str(write_recipe(tmp_path, name="c")), "--url", "http://x:1"],
                            "--url is for --backend http"),
                           (["--candidate", str(write_recipe(tmp_path, name="c")), "--warmup-recipe", "d"],
                            "--warmup-recipe names no recipe of the run: d")]:
        result = CliRunner().invoke(app, base + extra)
        assert result.exit_code == 3, (extra, result.output)
        assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "run").exists()


def test_ab_over_http_with_our_server(tmp_path, tiny_random_runtime, fast_recipe_file):
    """One h3 server runs the baseline's levers; the off-identity candidate goes through it too, byte for byte."""
    from h3.server import create_app
    from tests._serving import serving

    prompts = write_prompts(tmp_path / "p.jsonl", {"a": "a cat"})
    with serving(create_app(tiny_random_runtime, tmp_path / "srv")) as url:
        result = run_ab_command(baseline=str(fast_recipe_file), candidates=[], off_identity=True, prompts=prompts,
                                out=tmp_path / "run", backend="http", urls=[url], warmup=0, speed_rounds=1,
                                model="tiny-random")
    assert result.manifest.status == "complete", result.manifest.errors
    store = RunStore(tmp_path / "run")
    base, ident = store.read_record("fast", "a", 0), store.read_record("fast-identity", "a", 0)
    assert base.extra["hash_source"] == ident.extra["hash_source"] == "raw"
    assert ident.extra["server_recipe_name"] == "fast" and ident.recipe_name == "fast-identity"
    check = result.off_identity["fast-identity"]
    assert {k: check[k] for k in ("candidate", "pairs", "identical", "differing", "missing", "not_comparable",
                                  "passed")} == {"candidate": "fast-identity", "pairs": 1, "identical": 1,
                                                 "differing": [], "missing": [], "not_comparable": [], "passed": True}
    # Both sides ran on this machine, through the server: the check names the one platform it compared on.
    assert check["platforms"]["fast"] == check["platforms"]["fast-identity"] == base.hardware["numerics"]
    assert base.timings.generation_side_latency_s == base.extra["inference_time_s"]
    assert result.speed["protocols"]["mixed"]["fast-identity"]["executed_verified"] is True


@pytest.mark.slow
def test_sigkill_at_any_point_then_rerun_completes(tmp_path, tiny_random_runtime, fast_recipe_file):
    """A real `kill -9` of a process running an ab run, then a rerun: nothing lost, twice, or half-written.

    One prompt keeps it short (four tiny requests in all: two clips, one speed round of two); the kill lands inside
    the second request, after the first clip's record is written."""
    import os
    import signal
    import subprocess
    import sys

    prompts = write_prompts(tmp_path / "p.jsonl", {"a": "a cat"})
    kwargs = dict(baseline=str(fast_recipe_file), candidates=[], off_identity=True, prompts=str(prompts),
                  out=str(tmp_path / "run"), warmup=0, speed_rounds=1, model="tiny-random")
    script = tmp_path / "run_ab.py"
    script.write_text(f"from h3eval.commands.ab import run_ab_command\nrun_ab_command(**{kwargs!r}, device='cpu')\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stderr=subprocess.DEVNULL)
    out = tmp_path / "run"
    deadline = time.time() + 300
    while not list(out.glob("clips/*/a-s0.json")) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)  # inside the next request (its generation or its MP4 write)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL  # killed, not finished
    finished = {p: p.read_bytes() for p in out.rglob("*.mp4") if read_finished_record(p) is not None}
    assert 1 <= len(finished) < 4, "the kill landed before the first clip or after the last"
    calls: list = []
    result = run_ab_command(**{**kwargs, "prompts": prompts}, runtime_factory=view_factory(tiny_random_runtime, calls))
    assert result.manifest.status == "complete", result.manifest.errors
    expected = {out / "speed" / "mixed" / r / "r000-a-s0.mp4" for r in ("fast", "fast-identity")} | {
        out / "clips" / r / "a-s0.mp4" for r in ("fast", "fast-identity")}
    assert all(read_finished_record(p) is not None for p in expected)
    assert not set(calls) & set(finished) and set(calls) | set(finished) == expected
    assert all(p.read_bytes() == data for p, data in finished.items())
    assert not list(out.rglob("*.tmp"))
    # The killed process and this one made the same bytes: off-identity holds across processes.
    assert result.off_identity["fast-identity"]["passed"]
    # The killed session stays recorded (issue 26): noticed by the next one, with what it finished.
    killed, rerun = result.manifest.extra["ab"]["sessions"]
    assert killed["outcome"] == "killed" and killed["pid"] == proc.pid and killed["noticed_by"] == rerun["id"]
    assert killed["finished_requests"] == len(finished) and rerun["outcome"] == "complete"
    assert not (out / ".h3eval.lock").exists()  # the lock file the kill left was taken over and released


def _planted_backend(monkeypatch, before):
    """The real in-process backend (one shared tiny model), with ``before(recipe_name)`` called ahead of each
    request: the tests plant a clock or an interrupt there."""
    from h3eval.backends.inprocess import InProcessBackend

    real = InProcessBackend.generate
    calls: list[str] = []

    def generate(self, recipe, request, out, extra=None, **kwargs):
        before(recipe.name, calls)
        calls.append(f"{recipe.name}/{Path(out).stem}")
        return real(self, recipe, request, out, extra, **kwargs)

    monkeypatch.setattr(InProcessBackend, "generate", generate)
    return calls


def _two_recipe_args(tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", {"a": "a cat", "b": "a dog"})
    one = write_recipe(tmp_path, name="one-step", steps=1)  # other levers than fast: not an off-identity candidate
    return dict(baseline=str(write_recipe(tmp_path)), candidates=[str(one)], prompts=prompts, out=tmp_path / "run",
                warmup=0, speed_rounds=0, model="tiny-random", device="cpu")


def test_time_box_runs_what_fits_keeps_it_and_a_rerun_resumes(tmp_path, monkeypatch):
    """--time-box: no request starts past the box, nor one its recipe's previous request says would end past it. A
    planted clock (each request of ``fast`` takes 5 s, of ``one-step`` 1 s; box 7.5 s): fast/a (0-5), one-step/a
    (5-6), fast/b would end at 11 (not run), one-step/b ends at 7 (runs). What ran keeps its records and speed.json;
    the run is partial; a rerun without the box makes fast/b alone."""
    import h3eval.ab as abmod
    from h3eval.backends.inprocess import InProcessBackend

    now = [0.0]
    monkeypatch.setattr(abmod, "_clock", lambda: now[0])
    real_load = InProcessBackend.runtime

    def runtime(self, recipe):
        result = real_load(self, recipe)
        # The load takes no time on the planted clock: the backend's own (real) measure of it, subtracted from the
        # estimate, made fast/b fit the box where loading took over 3.5 s (a busy 2-core machine).
        self.last_load_s = 0.0
        return result

    monkeypatch.setattr(InProcessBackend, "runtime", runtime)

    def tick(name, calls):
        now[0] += 5.0 if name == "fast" else 1.0

    calls = _planted_backend(monkeypatch, tick)
    kwargs = _two_recipe_args(tmp_path)
    result = run_ab_command(**kwargs, time_box_s=7.5)
    out = tmp_path / "run"
    assert calls == ["fast/a-s0", "one-step/a-s0", "one-step/b-s0"]
    assert result.manifest.status == "partial"
    assert [(e.recipe, e.prompt_id) for e in result.manifest.errors] == [("fast", "b")]
    assert "not run: the time box (7.5 s)" in result.manifest.errors[0].error
    speed = json.loads((out / "speed.json").read_text())["protocols"]["quality_clips"]
    assert speed["fast"]["n"] == 1 and speed["one-step"]["n"] == 2
    calls.clear()
    result = run_ab_command(**kwargs)
    assert calls == ["fast/b-s0"]
    assert result.manifest.status == "complete" and not list(out.rglob("*.error.json"))


def test_time_box_estimate_leaves_out_the_model_load(tmp_path, monkeypatch):
    """The shared model loads inside the first request (2 min at full size, 2026-12-01 H200 call: the FP8 candidate's
    quality requests were boxed out because its warm-up's estimate held the load). Planted clock: the load takes 50 s,
    every request 5 s, box 80 s. The estimate for fast/b is 5 s (the load left out), so it starts at 60 and every
    request runs; with the load in the estimate (55 s) fast/b would be boxed out at 60 + 55 > 80."""
    import h3eval.ab as abmod
    from h3eval.backends.inprocess import InProcessBackend

    now = [0.0]
    monkeypatch.setattr(abmod, "_clock", lambda: now[0])
    real_load = InProcessBackend.runtime

    def runtime(self, recipe):
        loading = self._shared is None
        result = real_load(self, recipe)
        if loading:
            now[0] += 50.0
            self.last_load_s = 50.0  # the planted clock's load time
        return result

    monkeypatch.setattr(InProcessBackend, "runtime", runtime)
    calls = _planted_backend(monkeypatch, lambda name, calls: now.__setitem__(0, now[0] + 5.0))
    kwargs = _two_recipe_args(tmp_path)
    result = run_ab_command(**kwargs, time_box_s=80.0)
    # fast/a 0-55 (load 50 + 5), one-step/a 55-60, fast/b 60-65, one-step/b 65-70: all fit in 80 s
    assert calls == ["fast/a-s0", "one-step/a-s0", "fast/b-s0", "one-step/b-s0"]
    assert result.manifest.status == "complete", result.manifest.errors


def test_interrupted_ab_keeps_speed_and_a_partial_manifest(tmp_path, monkeypatch):
    """A SIGINT (a driver's time limit, or Ctrl-C) before the fourth request: the three finished clips get speed.json
    and a manifest marked partial before the interrupt goes on; the rerun makes the fourth alone and completes."""
    stop = [True]

    def interrupt(name, calls):
        if stop[0] and len(calls) == 3:
            raise KeyboardInterrupt

    calls = _planted_backend(monkeypatch, interrupt)
    kwargs = _two_recipe_args(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        run_ab_command(**kwargs)
    out = tmp_path / "run"
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["status"] == "partial" and manifest["extra"]["ab"]["interrupted"]
    speed = json.loads((out / "speed.json").read_text())["protocols"]["quality_clips"]
    assert speed["fast"]["n"] == 2 and speed["one-step"]["n"] == 1
    stop[0] = False
    calls.clear()
    result = run_ab_command(**kwargs)
    assert calls == ["one-step/b-s0"]
    assert result.manifest.status == "complete" and result.manifest.extra["ab"]["interrupted"] is None


@pytest.mark.parametrize("name", ["baseline", "identity", "fewer-steps", "fbc-cache", "turbo4-tinydemo"])
def test_shipped_cpu_recipes_run_as_configured(name, tmp_path):
    """Every shipped recipe that runs on the CPU passes the configured-versus-executed check (shortened to 3 steps)."""
    from h3.recipe import load_recipe, recipe_from_dict
    from h3.runtime import GenerateRequest, H3Runtime
    from h3eval.ab import check_executed

    data = load_recipe(name).resolved()
    data.update(steps=3, dtype="float32")
    recipe = recipe_from_dict(data)
    record = H3Runtime.load("tiny-random", recipe, "cpu").generate(GenerateRequest(prompt="a cat", seed=0),
                                                                   tmp_path / "c.mp4")
    assert check_executed(recipe, record) == []


# -- planted executed faults through `h3eval ab` --------------------------------------------------------------------
def half_renamed_lora(path: Path, transformer) -> Path:
    """The tiny demo LoRA with every second module renamed as seed 001's adapter was (``layers.N.attention.*``): it
    loads, and matches 7 of its 14 modules."""
    from safetensors.torch import save_file

    from h3.train.seeded_lora import TINY_LORA_ALPHA, tiny_lora_state_dict

    state = tiny_lora_state_dict(transformer)
    modules = sorted({k.removeprefix("transformer.").split(".lora_")[0] for k in state})
    renamed = set(modules[::2])
    out = {}
    for key, value in state.items():
        module = key.removeprefix("transformer.").split(".lora_")[0]
        if module in renamed:
            key = key.replace("transformer_blocks.", "layers.").replace("attn.", "attention.")
        out[key] = value
    save_file(out, str(path), metadata={"format": "pt", "alpha": str(TINY_LORA_ALPHA)})
    return path


def test_ab_fails_a_lora_that_matched_too_few_modules_and_a_sparse_lever_that_ran_dense(tmp_path, tiny_random_runtime,
                                                                                        monkeypatch):
    """Done-when of issue 19: on the tiny preset, a LoRA file with half its modules renamed and a block-sparse lever
    whose routing is forced to keep every block both FAIL `h3eval ab`'s executed check (exit 1, clip removed, recipe
    stopped), while the same LoRA with its real names passes."""
    import typer

    import h3.levers.sparse_attention as sparse

    original = sparse.route_blocks

    def route_dense(query, key, block_size, sparsity, valid_len=None):  # the planted fault: every block kept
        return original(query, key, block_size, 0.0, valid_len)

    monkeypatch.setattr(sparse, "route_blocks", route_dense)

    from h3.train.seeded_lora import write_tiny_lora

    transformer = tiny_random_runtime.pipe.transformer
    good = write_tiny_lora(tmp_path / "good.safetensors", transformer)
    bad = half_renamed_lora(tmp_path / "half.safetensors", transformer)
    prompts = write_prompts(tmp_path / "p.jsonl", {"a": "a cat"})
    recipes = [write_recipe(tmp_path, name="lora-good", lora={"enabled": True, "path": str(good)}),
               write_recipe(tmp_path, name="lora-half", lora={"enabled": True, "path": str(bad)}),
               write_recipe(tmp_path, name="sparse-dense", sparse_attention={
                   "enabled": True, "block_size": 16, "sparsity": 0.5, "dense_steps": 1})]
    app = typer.Typer()
    register(app)

    @app.command("noop")
    def _noop() -> None:  # a second command so typer keeps the command name
        pass

    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["ab", "--baseline", str(write_recipe(tmp_path)), "--prompts", str(prompts),
                                      "--out", str(out), "--warmup", "0", "--speed-rounds", "1",
                                      "--model", "tiny-random",
                                      *[a for r in recipes for a in ("--candidate", str(r))]])
    assert result.exit_code == 1, result.output
    speed = json.loads((out / "speed.json").read_text())["protocols"]["mixed"]
    assert speed["lora-good"]["status"] == "ok"
    assert speed["lora-half"]["status"] == speed["sparse-dense"]["status"] == "refused"
    assert ("lora: matched 7 of the 14 modules the adapter file targets (7 unmatched): the adapter did not load as "
            "trained") in speed["lora-half"]["reason"]
    assert "sparse_attention: realized sparsity 0.0000, recipe asks for 0.5" in speed["sparse-dense"]["reason"]
    assert "lora-half: configured-versus-executed mismatch" in result.output
    assert not list(out.rglob("lora-half/*.mp4")) and not list(out.rglob("sparse-dense/*.mp4"))
    assert RunStore(out).read_record("lora-good", "a", 0).executed.levers["lora"]["matched_modules"] == 14
