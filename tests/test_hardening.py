"""The suite (h3eval) against issue 26's bad inputs: configuration must not fool the signoff, a resumed run must not
mix two experiments, one process writes into a run at a time, killed sessions stay recorded, import manifests are
strict, and every bad input is one line and exit 3, never a traceback. (The server and `h3` cases are in
tests/test_server_hardening.py; the schemas' fuzz in tests/test_schema_fuzz.py.)

Each test here failed on the code before the fix (main at 2eff3ef): a NaN limit passed, a reshaped rerun said
"complete", a second process ran, sessions vanished, ``"seed": true`` was imported, or a traceback came out.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from h3.media import encode_mp4
from h3.recipe import RecipeError, recipe_from_dict
from h3eval.cli import app
from h3eval.commands.ab import run_ab_command
from h3eval.policy import PolicyError, load_policy
from h3eval.store import RunStore, StoreError, read_finished_record
from h3eval.synth import moving_square_frames, tone_pcm
from h3eval.verdict import compute_verdict
from tests.conftest import FAST_RECIPE, tree_digest
from tests.test_ab import view_factory, write_prompts, write_recipe
from verdict_fixtures import make_run, pairs_of, write_result, write_text

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


def invoke(*args: str):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"traceback: {type(result.exception).__name__}: {result.exception}\n{result.output}")
    return result


def refused(result, *needles: str) -> str:
    """Exit 3 with one ``error:`` line (a pydantic dump or a traceback is not an answer), naming each needle."""
    assert result.exit_code == 3, result.output
    assert "Traceback" not in result.output and "errors.pydantic.dev" not in result.output, result.output
    for needle in needles:
        assert needle in result.output, (needle, result.output)
    return result.output


# -- a signoff must not be fooled by its own configuration ----------------------------------------------------------
WORST_POLICY = """
version = 1
name = "worst"
min_pairs = 8
n_resamples = 2000

[gates.fidelity.metrics.lpips_worst]
direction = "lower_is_better"
pair_limit = {limit}
"""


@pytest.fixture(scope="module")
def drifting_run(tmp_path_factory):
    """16 pairs whose worst-frame LPIPS is 0.2 on every pair: a real limit of 0.1 FAILs all 16."""
    store = make_run(tmp_path_factory.mktemp("worst") / "run")
    for pid, seed in pairs_of(store):
        write_result(store, "fidelity", "fast", pid, seed, {"lpips_worst": (0.2, False)})
    return store


def test_a_nan_pair_limit_is_refused_at_load_and_never_passes(drifting_run, tmp_path):
    real = write_text(tmp_path / "real.toml", WORST_POLICY.format(limit="0.1"))
    verdict = compute_verdict(drifting_run.root, load_policy(real))
    gate = next(g for g in verdict.candidates[0].gates if g.gate == "fidelity")
    assert gate.outcome == "FAIL" and "16 of 16" in " ".join(gate.metrics[0].reasons)

    nan = write_text(tmp_path / "nan.toml", WORST_POLICY.format(limit="nan"))
    with pytest.raises(PolicyError, match=r"gates\.fidelity\.metrics\.lpips_worst\.pair_limit: .*finite"):
        load_policy(nan)
    before = tree_digest(drifting_run.root)
    out = refused(invoke("verdict", drifting_run.root, "--policy", nan, "--write"),
                  "gates.fidelity.metrics.lpips_worst.pair_limit", "finite number")
    assert "PASS" not in out and tree_digest(drifting_run.root) == before


@pytest.mark.parametrize("line,key", [
    ("pair_limit = inf", "pair_limit"),
    ("pair_limit = -inf", "pair_limit"),
    ("pair_limit = { fraction_of_floor = inf }", "pair_limit.fraction_of_floor"),
    ("pair_limit = { fraction_of_floor = nan }", "pair_limit.fraction_of_floor"),
    ("pair_limit = true", "pair_limit"),
    ('pair_limit = "0.1"', "pair_limit"),
    ("pair_limit = 0.1\nidentical_value = nan", "identical_value"),
])
def test_metric_thresholds_must_be_finite_numbers(tmp_path, line, key):
    text = WORST_POLICY.replace("pair_limit = {limit}", line)
    with pytest.raises(PolicyError, match=rf"gates\.fidelity\.metrics\.lpips_worst\.{key}: "):
        load_policy(write_text(tmp_path / "p.toml", text))


@pytest.mark.parametrize("old,new,key", [
    ("min_pairs = 8", "min_pairs = 8\n[gates.integrity]\nmax_flagged = true", "gates.integrity.max_flagged"),  # not 1
    ("min_pairs = 8", 'min_pairs = "8"', "min_pairs"),            # nor is a string 8
    ("min_pairs = 8", "min_pairs = 8\nseed = -1", "seed"),        # numpy refuses a negative seed mid-verdict
    ("n_resamples = 2000", "n_resamples = 1000000000000", "n_resamples"),  # a bootstrap that fills the memory
    ("min_pairs = 8", "min_pairs = 8\nconfidence = nan", "confidence"),
    ("min_pairs = 8", "min_pairs = 8\n[speed]\nmin_speedup = inf", "speed.min_speedup"),
])
def test_policy_settings_are_strict_and_in_range(tmp_path, old, new, key):
    text = WORST_POLICY.format(limit="0.1").replace(old, new)
    with pytest.raises(PolicyError, match=rf"\n  {key}: "):
        load_policy(write_text(tmp_path / "p.toml", text))


def test_sides_margin_must_be_finite(tmp_path):
    text = """
version = 1
name = "m"
[gates.vbench.metrics.overall_consistency]
compare = "sides"
direction = "higher_is_better"
margin = nan
"""
    with pytest.raises(PolicyError, match=r"gates\.vbench\.metrics\.overall_consistency\.margin: .*finite"):
        load_policy(write_text(tmp_path / "p.toml", text))


@pytest.mark.parametrize("section,key", [
    ({"cache": {"kind": "fbc", "threshold": float("inf")}}, "cache.threshold"),
    ({"cache": {"kind": "mag", "mag_ratios": [1.0, float("nan"), 1.0]}}, "cache.mag_ratios.1"),
    ({"lora": {"scale": float("nan")}}, "lora.scale"),
    ({"lora": {"scale": float("-inf")}}, "lora.scale"),
    ({"sparse_attention": {"sparsity": float("nan")}}, "sparse_attention.sparsity"),
    ({"steps": True}, "steps"),
])
def test_recipe_numbers_must_be_finite(section, key):
    with pytest.raises(RecipeError, match=rf"key '{key}': "):
        recipe_from_dict({**FAST_RECIPE, **section})


def test_a_nan_in_a_recipe_file_is_exit_3_naming_the_key(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('name = "bad"\nsteps = 2\n[cache]\nkind = "fbc"\nthreshold = nan\n')
    prompts = write_prompts(tmp_path / "p.jsonl", {"a": "a cat"})
    refused(invoke("generate", "--recipe", path, "--prompts", prompts, "--out", tmp_path / "run"),
            "key 'cache.threshold'", "finite")
    assert not (tmp_path / "run").exists()


# -- resume compares every parameter --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ab_run(tmp_path_factory, tiny_random_runtime):
    root = tmp_path_factory.mktemp("resume")
    prompts = write_prompts(root / "p.jsonl", {"a": "a cat"})
    base, cand = write_recipe(root), write_recipe(root, name="cand")
    result = run_ab_command(baseline=str(base), candidates=[str(cand)], prompts=prompts, out=root / "run",
                            warmup=0, speed_rounds=0, model="tiny-random",
                            runtime_factory=view_factory(tiny_random_runtime, []))
    assert result.manifest.status == "complete", result.manifest.errors
    return root, ["ab", "--baseline", base, "--candidate", cand, "--prompts", prompts, "--out", root / "run",
                  "--warmup", "0", "--model", "tiny-random"]


@pytest.fixture()
def nothing_runs(monkeypatch):
    def no_runtime(*args, **kwargs):
        raise AssertionError("nothing may be generated here")

    monkeypatch.setattr("h3eval.backends.inprocess.default_runtime_factory", no_runtime)


@pytest.mark.parametrize("extra,difference", [
    (["--height", "256", "--width", "256"], "height 128 -> 256"),
    (["--height", "128", "--width", "256"], "width 128 -> 256"),
    (["--seconds", "10"], "num_frames 124 -> 243"),
    (["--num-frames", "200"], "num_frames 124 -> 209"),
    (["--seeds", "0,1"], "seeds [0] -> [0, 1]"),
    (["--speed-rounds", "2"], "speed_rounds 0 -> 2"),
    (["--speed-protocol", "repeated"], "speed_protocol 'mixed' -> 'repeated'"),
    (["--trajectory"], "trajectory False -> True"),
    (["--backend", "http", "--url", "http://127.0.0.1:9"], "backend 'inprocess' -> 'http'"),
])
def test_a_rerun_with_other_parameters_is_refused_naming_them(ab_run, nothing_runs, extra, difference):
    root, args = ab_run
    args = args + (["--speed-rounds", "0"] if "--speed-rounds" not in extra else [])
    before = tree_digest(root / "run")
    refused(invoke(*args, *extra), "already holds a different run", difference)
    assert tree_digest(root / "run") == before


def test_a_rerun_on_other_weights_under_the_same_model_name_is_refused(ab_run, nothing_runs, monkeypatch):
    """The run stores its in-process model's identity, the value its clip records carry as ``model_sha256`` (what the
    loaded runtime computed); a rerun whose model resolves to other weights (a retrained ``tiny-trained`` checkpoint
    under the same name) is refused naming ``model_identity``, and the run is left as it was."""
    import h3.runtime

    root, args = ab_run
    store = RunStore(root / "run")
    identity = store.read_manifest().plan["model_identity"]
    assert identity == store.load_record("cand", "a", 0).model_sha256
    assert h3.runtime.model_identity("h3-random") is None
    from h3.tiny_trained import TRAINED_DIR, trained_identity

    assert h3.runtime.model_identity("tiny-trained") == trained_identity(TRAINED_DIR)
    assert h3.runtime.model_identity("tiny") == trained_identity(TRAINED_DIR)  # ``tiny`` is the trained preset
    assert h3.runtime.model_identity("tiny-random") == h3.runtime.tiny_identity() != trained_identity(TRAINED_DIR)
    before = tree_digest(root / "run")
    monkeypatch.setattr(h3.runtime, "model_identity", lambda model: "0" * 64)
    refused(invoke(*args, "--speed-rounds", "0"), "already holds a different run", "model_identity")
    assert tree_digest(root / "run") == before


def test_a_rerun_with_the_same_clips_resumes(ab_run, nothing_runs):
    """``--seconds 5`` and ``--num-frames 124`` ask for the default clip: the same run, nothing generated."""
    root, args = ab_run
    args = args + ["--speed-rounds", "0"]
    before = tree_digest(root / "run" / "clips")
    for extra in ([], ["--seconds", "5"], ["--num-frames", "124"], ["--height", "128", "--width", "128"]):
        result = invoke(*args, *extra)
        assert result.exit_code == 0 and "complete" in result.output, result.output
    assert tree_digest(root / "run" / "clips") == before


def test_changed_prompts_and_recipes_are_named(ab_run, nothing_runs, tmp_path):
    root, args = ab_run
    args = args + ["--speed-rounds", "0"]
    other = write_prompts(tmp_path / "p.jsonl", {"a": "a dog"})
    refused(invoke(*[other if str(a).endswith("p.jsonl") else a for a in args]), "prompts (the suite's content")
    slower = write_recipe(tmp_path, name="cand", steps=3)
    refused(invoke(*[slower if str(a).endswith("cand.toml") else a for a in args]), "recipe cand (its settings")


# -- one process writes into a run at a time -------------------------------------------------------------------------
HOLDER = """
import sys
from h3eval.store import RunStore
with RunStore(sys.argv[1]).lock("h3eval ab"):
    print("held", flush=True)
    sys.stdin.read()
"""


@pytest.fixture()
def held_run(tmp_path):
    """A run (clips, gate results) whose lock another process holds, as a running `h3eval ab` would."""
    store = make_run(tmp_path / "run", n_prompts=8)
    for pid, seed in pairs_of(store):
        write_result(store, "fidelity", "fast", pid, seed, {"lpips_worst": (0.01, False)})
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(store.root)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env)
    assert holder.stdout.readline().strip() == "held"
    yield store, holder.pid
    holder.stdin.close()
    assert holder.wait(timeout=60) == 0


def test_a_second_process_is_refused_by_every_writing_command(held_run, tmp_path, fast_recipe_file):
    store, pid = held_run
    policy = write_text(tmp_path / "p.toml", WORST_POLICY.format(limit="0.1"))
    prompts = write_prompts(tmp_path / "p.jsonl", {"p00": "a cat"})
    clips = tmp_path / "clips"
    encode_mp4(clips / "p00-s0.mp4", moving_square_frames(24, 32), tone_pcm(1.0))
    before = tree_digest(store.root)
    holder = f"in use by pid {pid} on host {socket.gethostname()} since "
    commands = {
        "ab": ["ab", "--baseline", fast_recipe_file, "--candidate", write_recipe(tmp_path, name="c"),
               "--prompts", prompts, "--out", store.root],
        "generate": ["generate", "--recipe", fast_recipe_file, "--prompts", prompts, "--out", store.root],
        "floor": ["floor", "--recipe", fast_recipe_file, "--prompts", prompts, "--out", store.root],
        "gate": ["gate", store.root, "--gates", "integrity", "--no-progress"],
        "import": ["import", "--baseline-dir", f"baseline={clips}", "--candidate-dir", f"fast={clips}",
                   "--out", store.root],
        "verdict --write": ["verdict", store.root, "--policy", policy, "--write"],
        "report": ["report", store.root, "--policy", policy],
    }
    for name, args in commands.items():
        out = refused(invoke(*args), holder, "(h3eval ab)")
        assert len([line for line in out.splitlines() if line.strip()]) == 1, (name, out)
    assert tree_digest(store.root) == before
    # Reading is not writing: a verdict without --write still answers (PASS here).
    assert invoke("verdict", store.root, "--policy", policy).exit_code == 0


def test_a_stale_lock_of_a_dead_process_is_taken_over_and_said(tmp_path, caplog):
    store = make_run(tmp_path / "run", n_prompts=8)
    for pid, seed in pairs_of(store):
        write_result(store, "fidelity", "fast", pid, seed, {"lpips_worst": (0.01, False)})
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = {"pid": dead.pid, "host": socket.gethostname(), "since": "2026-11-30T00:00:00+00:00",
             "command": "h3eval ab"}
    store.lock_path.write_text(json.dumps(stale))  # what a kill -9 leaves behind
    policy = write_text(tmp_path / "p.toml", WORST_POLICY.format(limit="0.1"))
    with caplog.at_level(logging.WARNING, logger="h3eval.store"):
        result = invoke("verdict", store.root, "--policy", policy, "--write")
    assert result.exit_code == 0, result.output
    assert f"took over the stale lock of pid {dead.pid} on host {socket.gethostname()}" in caplog.text
    assert "its process is gone" in caplog.text
    assert store.verdict_path.is_file() and not store.lock_path.exists()


def test_the_lock_is_reentrant_in_one_process_and_leaves_nothing(tmp_path):
    store = RunStore(tmp_path / "new" / "run")
    with store.lock("outer") as outer:
        assert json.loads(store.lock_path.read_text())["pid"] == os.getpid() == outer["pid"]
        with store.lock("inner") as inner:  # h3eval floor: generate, then gate, then write the floor
            assert inner is outer
        assert store.lock_path.exists()
    assert not store.root.exists()  # created for the lock, nothing written: removed again
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("x")
    with pytest.raises(StoreError, match="not an h3eval run directory"):
        with RunStore(tmp_path / "mine").lock("h3eval ab"):
            pass
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"]


# -- sessions ------------------------------------------------------------------------------------------------------
def test_every_session_is_recorded_and_orphaned_warmups_are_removed(tmp_path, tiny_random_runtime):
    prompts = write_prompts(tmp_path / "p.jsonl", {"a": "a cat"})
    out = tmp_path / "run"
    kwargs = dict(baseline=str(write_recipe(tmp_path)), candidates=[str(write_recipe(tmp_path, name="cand"))],
                  prompts=prompts, out=out, warmup=1, speed_rounds=0, model="tiny-random")
    # Three sessions stopped after their warm-ups (both recipes warmed, no timed request finished).
    for _ in range(3):
        with pytest.raises(KeyboardInterrupt):
            run_ab_command(**kwargs, runtime_factory=view_factory(tiny_random_runtime, [], kill_at=2))
    manifest = json.loads((out / "run.json").read_text())
    sessions = manifest["extra"]["ab"]["sessions"]
    assert [s["outcome"] for s in sessions] == ["interrupted"] * 3
    assert [s.get("warmups_removed", 0) for s in sessions] == [2, 2, 0]  # each later session swept the one before
    # A kill -9 cannot write: the entry stays as written at the start. Leave the last one so.
    sessions[-1].update(outcome="running")
    sessions[-1].pop("ended_at")
    (out / "run.json").write_text(json.dumps(manifest))
    result = run_ab_command(**kwargs, runtime_factory=view_factory(tiny_random_runtime, []))
    assert result.manifest.status == "complete", result.manifest.errors
    sessions = result.manifest.extra["ab"]["sessions"]
    assert [s["outcome"] for s in sessions] == ["interrupted", "interrupted", "killed", "complete"]
    assert sessions[2]["noticed_by"] == sessions[3]["id"] and sessions[2]["finished_requests"] == 0
    assert sessions[2]["warmups_removed"] == 2 and len({s["id"] for s in sessions}) == 4
    assert all(s["pid"] == os.getpid() and s["host"] == socket.gethostname() for s in sessions)
    for recipe in ("fast", "cand"):
        warm = sorted((out / "warmup" / recipe).iterdir())
        assert [p.name for p in warm] == [f"{sessions[3]['id']}-w0.json", f"{sessions[3]['id']}-w0.mp4"]
        assert read_finished_record(warm[1]).extra["warmup"] is True
    # A session that finished timed requests keeps its warm-ups: they are its clips' context.
    again = run_ab_command(**kwargs, runtime_factory=view_factory(tiny_random_runtime, []))
    assert [s["outcome"] for s in again.manifest.extra["ab"]["sessions"]][-1] == "complete"
    assert len(list((out / "warmup" / "fast").glob("*.mp4"))) == 1


# -- import manifests ------------------------------------------------------------------------------------------------
@pytest.fixture()
def comfy(tmp_path):
    for name in ("out_1.mp4", "out_2.mp4"):
        encode_mp4(tmp_path / "comfy" / name, moving_square_frames(24, 32), tone_pcm(1.0))
    return tmp_path


def write_manifest(path: Path, *lines) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


GOOD = {"side": "baseline", "file": "comfy/out_1.mp4", "prompt_id": "p1", "seed": 3}
PARTNER = {"side": "turbo", "file": "comfy/out_2.mp4", "prompt_id": "p1", "seed": 3}


def import_args(root: Path, manifest: Path) -> list:
    return ["import", "--baseline-dir", f"base={root / 'comfy'}", "--candidate-dir", f"turbo={root / 'comfy'}",
            "--manifest", manifest, "--out", root / "run"]


@pytest.mark.parametrize("change,needle", [
    ({"seed": True}, "key 'seed': Input should be a valid integer (got True)"),
    ({"seed": 3.0}, "key 'seed'"),
    ({"seed": "3"}, "key 'seed'"),
    ({"seed": -1}, "key 'seed'"),
    ({"seed": 2**64}, "key 'seed'"),
    ({"file": 5}, "key 'file'"),
    ({"file": ""}, "key 'file'"),
    ({"prompt_id": "../p1"}, "key 'prompt_id'"),
    ({"generation_side_latency_s": -1.0}, "key 'generation_side_latency_s'"),
    ({"generation_side_latency_s": 0}, "key 'generation_side_latency_s'"),
    ({"generation_side_latency_s": float("nan")}, "key 'generation_side_latency_s': Input should be a finite"),
    ({"request_to_file_latency_s": float("inf")}, "key 'request_to_file_latency_s'"),
    ({"peak_memory_mb": 1e308}, "key 'peak_memory_mb'"),
    ({"generation_latency_s": 2.0}, "unknown key 'generation_latency_s'"),
    ({"side": "nobody"}, "key 'side'"),
])
def test_import_manifest_values_are_refused_naming_line_and_key(comfy, change, needle):
    manifest = write_manifest(comfy / "m.jsonl", PARTNER, {**GOOD, **change})
    refused(invoke(*import_args(comfy, manifest)), f"{manifest}:2: ", needle)
    assert not (comfy / "run").exists()


@pytest.mark.parametrize("line,needle", [
    ('{"side": "baseline", "file": "comfy/out_1.mp4", "prompt_id": "p1", "seed": 3, "seed": 4}',
     "'seed' appears twice"),
    ('{"side": "baseline", "file": "comfy/out_1.mp4", "prompt_id": "p1", "seed": 1e400}', "key 'seed'"),
    ('{"side": "baseline", "file": "comfy/out_1.mp4", "prompt_id": "p1", "seed": 3, '
     '"generation_side_latency_s": Infinity}', "finite"),
    ('[1, 2]', "valid dictionary"),
    ('{"side": "baseline"}', "missing key 'file'"),
])
def test_import_manifest_raw_json_is_refused(comfy, line, needle):
    manifest = write_manifest(comfy / "m.jsonl", PARTNER, line)
    refused(invoke(*import_args(comfy, manifest)), f"{manifest}:2: ", needle)


def test_a_boolean_seed_is_not_imported_as_seed_1(comfy):
    """Before: written as p1-sTrue.mp4 while run.json said seed 1, "complete", and every gate then errored."""
    manifest = write_manifest(comfy / "m.jsonl", {**GOOD, "seed": True}, {**PARTNER, "seed": True})
    refused(invoke(*import_args(comfy, manifest)), "key 'seed'")
    manifest = write_manifest(comfy / "m.jsonl", GOOD, PARTNER)
    assert invoke(*import_args(comfy, manifest)).exit_code == 0
    assert sorted(p.name for p in (comfy / "run" / "clips" / "turbo").iterdir()) == ["p1-s3.json", "p1-s3.mp4"]


def test_import_errors_name_the_source_clip_not_the_temporary_copy(comfy):
    (comfy / "comfy" / "out_2.mp4").write_bytes(os.urandom(3000))  # not a video
    manifest = write_manifest(comfy / "m.jsonl", GOOD, PARTNER)
    result = invoke(*import_args(comfy, manifest))
    assert result.exit_code == 1 and "Traceback" not in result.output
    run = json.loads((comfy / "run" / "run.json").read_text())
    assert run["status"] == "partial" and len(run["errors"]) == 1
    error = run["errors"][0]["error"]
    assert str(comfy / "comfy" / "out_2.mp4") in error and ".tmp" not in error, error
    assert not list((comfy / "run").rglob("*.tmp"))


# -- one line and exit 3, not a traceback ---------------------------------------------------------------------------
@pytest.mark.parametrize("seeds,needle", [
    ("0-1000000000000", "a run takes at most 1000"),                 # MemoryError before
    ("0,18446744073709551616", "seed 18446744073709551616 is too large"),  # failed after the first seed ran
    ("0,٣", "ASCII digits"),                                           # int() reads Arabic-Indic digits
    ("5-2", "is empty"),
])
def test_bad_seeds_are_refused_before_anything_runs(tmp_path, fast_recipe_file, nothing_runs, seeds, needle):
    prompts = write_prompts(tmp_path / "p.jsonl", {"a": "a cat"})
    refused(invoke("ab", "--baseline", fast_recipe_file, "--candidate", write_recipe(tmp_path, name="c"),
                   "--prompts", prompts, "--out", tmp_path / "run", "--seeds", seeds), needle)
    assert not (tmp_path / "run").exists()


def test_out_that_is_a_file_is_refused(tmp_path, fast_recipe_file, nothing_runs):
    prompts = write_prompts(tmp_path / "p.jsonl", {"a": "a cat"})
    target = tmp_path / "FILE"
    target.write_text("mine")
    for args in (["ab", "--baseline", fast_recipe_file, "--candidate", write_recipe(tmp_path, name="c")],
                 ["generate", "--recipe", fast_recipe_file]):
        refused(invoke(*args, "--prompts", prompts, "--out", target), f"{target} is a file, not a run directory")
    assert target.read_text() == "mine"


def test_run_json_that_is_a_directory_is_refused_by_every_reader(tmp_path):
    (tmp_path / "run" / "run.json").mkdir(parents=True)
    policy = write_text(tmp_path / "p.toml", WORST_POLICY.format(limit="0.1"))
    for args in (["gate", tmp_path / "run", "--gates", "integrity"], ["verdict", tmp_path / "run", "--policy", policy],
                 ["report", tmp_path / "run", "--policy", policy]):
        refused(invoke(*args), "run.json is a directory")


def test_an_invalid_run_json_is_one_line_per_key(tmp_path):
    store = make_run(tmp_path / "run", n_prompts=2)
    data = json.loads(store.manifest_path.read_text())
    data.update(seeds=[True, -1], bogus=1, status="done")
    store.manifest_path.write_text(json.dumps(data))
    out = refused(invoke("gate", store.root, "--gates", "integrity"), "is not a valid run manifest")
    lines = [line.strip() for line in out.splitlines()]
    assert "key 'seeds.0': Input should be a valid integer (got True)" in lines
    assert any(line.startswith("key 'seeds.1': Input should be greater than or equal to 0") for line in lines)
    assert any(line.startswith("key 'status':") for line in lines) and "unknown key 'bogus'" in lines
    assert len(lines) == 5


def test_an_unknown_lpips_trunk_fails_before_the_run(tmp_path):
    store = make_run(tmp_path / "run", n_prompts=2)
    refused(invoke("gate", store.root, "--gates", "fidelity", "-o", "fidelity.lpips_trunk=bogus"),
            "lpips_trunk='bogus'", "'alexnet' or 'rand'")
    assert not (store.root / "gates").exists()


@pytest.mark.parametrize("args,needle", [
    (["ab", "--baseline", "baseline", "--prompts", "smoke", "--out", "x", "--warmup", "abc"], "'--warmup'"),
    (["generate", "--recipe", "baseline", "--prompts", "smoke", "--out", "x", "--height", "1e3"], "'--height'"),
    (["ab", "--prompts", "smoke", "--out", "x"], "Missing option '--baseline'"),
    (["gate"], "Missing argument"),
])
def test_usage_errors_are_one_line_and_exit_3(tmp_path, monkeypatch, args, needle):
    """Click's own usage errors (a value that is not a number, a missing option) exit 3 like every bad input."""
    monkeypatch.chdir(tmp_path)
    out = refused(invoke(*args), needle)
    assert [line for line in out.splitlines() if line.strip()] == [out.strip()] and out.startswith("error: ")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("extra,needle", [
    (["--gpu-hourly-rate", "inf"], "--gpu-hourly-rate must be positive and finite, got inf"),  # $/clip = inf before
    (["--backend", "http", "--url", "http://127.0.0.1:9", "--timeout", "nan"], "--timeout must be a positive finite"),
])
def test_ab_numbers_must_be_finite(tmp_path, fast_recipe_file, nothing_runs, extra, needle):
    prompts = write_prompts(tmp_path / "p.jsonl", {"a": "a cat"})
    refused(invoke("ab", "--baseline", fast_recipe_file, "--candidate", write_recipe(tmp_path, name="c"),
                   "--prompts", prompts, "--out", tmp_path / "run", *extra), needle)
    assert not (tmp_path / "run").exists()


# -- damaged files inside a run (found by bench/bad_input_campaign/bad_input_campaign.py) ----------------------------------------------
@pytest.mark.parametrize("value,shown", [('"0.2"', "'0.2'"), ("true", "True"), ('[0.2]', "[0.2]")])
def test_a_gate_result_value_that_is_not_a_number_never_passes(tmp_path, value, shown):
    """A hand-edited result with ``"value": "0.2"`` was read as 0.2 and PASSed (``true`` as 1): it is unreadable."""
    store = make_run(tmp_path / "run", n_prompts=8)
    paths = [write_result(store, "fidelity", "fast", pid, seed, {"lpips_worst": (0.2, False)})
             for pid, seed in pairs_of(store)]
    policy = write_text(tmp_path / "p.toml", WORST_POLICY.format(limit="0.3"))
    assert "fast: PASS" in invoke("verdict", store.root, "--policy", policy).output  # the control
    paths[0].write_text(paths[0].read_text().replace('"value": 0.2', f'"value": {value}'))
    out = invoke("verdict", store.root, "--policy", policy)
    assert out.exit_code == 2 and "fast: INCONCLUSIVE" in out.output, out.output
    assert f"key 'metrics.lpips_worst.value': a number or null, got {shown}" in out.output
    paths[0].unlink()
    paths[0].mkdir()  # a directory where the result should be: unreadable too, not a traceback or an errno
    out = invoke("verdict", store.root, "--policy", policy)
    assert out.exit_code == 2 and "is not a valid gate result: it is a directory" in out.output, out.output


def test_a_floor_file_that_is_a_directory_says_so(drifting_run, tmp_path):
    policy = write_text(tmp_path / "p.toml", WORST_POLICY.format(limit="0.3"))
    refused(invoke("verdict", drifting_run.root, "--policy", policy, "--floor", tmp_path),
            f"noise-floor file {tmp_path} is a directory")


def test_a_nan_in_verdict_json_is_refused_by_the_report(drifting_run, tmp_path):
    """verdict.json never holds a NaN (the writer stores null): one put in by hand was rendered under its PASS."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(drifting_run.root, run)
    policy = write_text(tmp_path / "p.toml", WORST_POLICY.format(limit="0.3"))
    assert invoke("verdict", run, "--policy", policy, "--write").exit_code == 0
    assert invoke("report", run).exit_code == 0  # the control: the written verdict reads back
    verdict = run / "verdict.json"
    verdict.write_text(verdict.read_text().replace('"mean_value": 0.2', '"mean_value": NaN', 1))
    refused(invoke("report", run), "verdict.json is not a readable verdict", "mean_value': not a finite number")
