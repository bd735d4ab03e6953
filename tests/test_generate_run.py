"""`h3eval generate`: filling a run, resuming after a kill, and refusing bad input without touching a run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from h3.media import encode_mp4
from h3eval.cli import app
from h3eval.commands.generate import run_generate
from h3eval.prompts import PromptSuiteError, load_prompts, parse_seeds
from h3eval.runner import RequestShape, RunPlan, default_runtime_factory, fill_run
from h3eval.store import RunStore
from tests.conftest import tree_digest

runner = CliRunner()


def write_prompts(path: Path, ids=("a", "b")) -> Path:
    path.write_text("".join(json.dumps({"id": i, "prompt": f"prompt {i}", "source": "test"}) + "\n" for i in ids))
    return path


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, fast_recipe_file):
    root = tmp_path_factory.mktemp("runs")
    prompts = write_prompts(root / "p.jsonl")
    out = root / "run"
    result = runner.invoke(app, ["generate", "--recipe", str(fast_recipe_file), "--prompts", str(prompts),
                                 "--seeds", "0,1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out, prompts


def test_generate_fills_the_run_layout(finished_run):
    out, _ = finished_run
    store = RunStore(out)
    manifest = store.read_manifest()
    assert manifest.status == "complete" and manifest.errors == []
    assert manifest.prompts.ids == ["a", "b"] and manifest.seeds == [0, 1]
    assert set(manifest.recipes) == {"fast"} and manifest.recipes["fast"]["steps"] == 2
    # The default model is the trained tiny preset, named as the preset that ran; the arguments keep it as passed.
    assert manifest.model == "tiny-trained" and manifest.args["model"] == "tiny"
    for pid in ("a", "b"):
        for seed in (0, 1):
            record = store.read_record("fast", pid, seed)
            assert record is not None, (pid, seed)
            assert record.request.prompt == f"prompt {pid}" and record.request.seed == seed
            assert record.model == "tiny-trained"
    assert sorted(p.name for p in (out / "clips" / "fast").iterdir()) == sorted(
        f"{pid}-s{seed}.{ext}" for pid in "ab" for seed in (0, 1) for ext in ("mp4", "json"))


def test_rerun_after_kill_generates_only_the_rest(tmp_path, fast_recipe, fast_recipe_file):
    prompts = write_prompts(tmp_path / "p.jsonl", ids=("a", "b", "c"))
    calls = []

    def killing_factory(model, recipe, device):
        runtime = default_runtime_factory(model, recipe, device)
        original = runtime.generate

        def generate(request, out, extra=None):
            if len(calls) == 2:
                raise KeyboardInterrupt  # the user's Ctrl-C, mid-run
            calls.append((request.prompt_id, request.seed))
            return original(request, out, extra)

        runtime.generate = generate
        return runtime

    plan = RunPlan(out=tmp_path / "run", model="tiny-random", recipes=[fast_recipe], prompts=load_prompts(prompts),
                   seeds=[0], shape=RequestShape())
    with pytest.raises(KeyboardInterrupt):
        fill_run(plan, runtime_factory=killing_factory, progress=False)
    store = RunStore(tmp_path / "run")
    assert store.read_manifest().status == "running"
    done = {p.name: p.read_bytes() for p in (tmp_path / "run" / "clips" / "fast").glob("*")}
    assert sorted(done) == ["a-s0.json", "a-s0.mp4", "b-s0.json", "b-s0.mp4"]
    # A half-written clip from a kill mid-write must be regenerated, not trusted: truncate b's MP4.
    (tmp_path / "run" / "clips" / "fast" / "b-s0.mp4").write_bytes(done["b-s0.mp4"][:100])

    generated = []
    manifest = run_generate(recipe=str(fast_recipe_file), prompts=prompts, out=tmp_path / "run", seeds="0",
                            model="tiny-random", progress=False)
    assert manifest.status == "complete"
    for pid in "abc":
        generated.append(store.read_record("fast", pid, 0))
    assert all(r is not None for r in generated)
    # a was kept as it was (same bytes), b was regenerated to the same bytes (determinism), c is new.
    assert (tmp_path / "run" / "clips" / "fast" / "a-s0.mp4").read_bytes() == done["a-s0.mp4"]
    assert (tmp_path / "run" / "clips" / "fast" / "b-s0.mp4").read_bytes() == done["b-s0.mp4"]
    assert not list((tmp_path / "run").rglob("*.tmp"))


def test_rerun_of_finished_run_generates_nothing(finished_run, fast_recipe_file, monkeypatch):
    out, prompts = finished_run
    before = tree_digest(out / "clips")

    def no_runtime(*args, **kwargs):
        raise AssertionError("nothing should be generated")

    monkeypatch.setattr("h3eval.runner.default_runtime_factory", no_runtime)
    result = runner.invoke(app, ["generate", "--recipe", str(fast_recipe_file), "--prompts", str(prompts),
                                 "--seeds", "0,1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert tree_digest(out / "clips") == before


def _bad_recipe(tmp_path, text):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    return str(path)


BAD_CASES = {
    "unknown recipe key": (lambda t, r, p: ["--recipe", _bad_recipe(t, 'name="x"\nsteps=2\nturbo=true\n'), "--prompts", p],
                           "unknown key 'turbo'"),
    "unknown nested key": (lambda t, r, p: ["--recipe", _bad_recipe(t, 'name="x"\nsteps=2\n[vae]\ntile=3\n'),
                                            "--prompts", p], "unknown key 'vae.tile'"),
    "wrong type": (lambda t, r, p: ["--recipe", _bad_recipe(t, 'name="x"\nsteps="four"\n'), "--prompts", p],
                   "key 'steps'"),
    "unknown recipe name": (lambda t, r, p: ["--recipe", "no-such-recipe", "--prompts", p], "unknown recipe"),
    "negative seed": (lambda t, r, p: ["--recipe", r, "--prompts", p, "--seeds", "-1"], "non-negative"),
    "too few frames": (lambda t, r, p: ["--recipe", r, "--prompts", p, "--num-frames", "30"], "5 to 15 s"),
    "too long": (lambda t, r, p: ["--recipe", r, "--prompts", p, "--seconds", "20"], "5 to 15 s"),
    "size not multiple of 32": (lambda t, r, p: ["--recipe", r, "--prompts", p, "--height", "80", "--width", "64"],
                                "multiple of 32"),
    "unreadable prompt file": (lambda t, r, p: ["--recipe", r, "--prompts", str(t / "missing.jsonl")],
                               "cannot read prompt file"),
    "duplicate prompt ids": (lambda t, r, p: ["--recipe", r, "--prompts", str(write_prompts(t / "d.jsonl", ("a", "a")))],
                             "duplicate prompt id 'a'"),
    "prompt id escaping the run": (lambda t, r, p: ["--recipe", r, "--prompts",
                                                    str(write_prompts(t / "e.jsonl", ("../../etc",)))],
                                   "not a safe file name"),
    "missing checkpoint": (lambda t, r, p: ["--recipe", r, "--prompts", p, "--model", str(t / "no-ckpt")],
                           "does not exist"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_input_is_one_clear_error_and_leaves_the_run_untouched(case, finished_run, fast_recipe_file, tmp_path):
    out, prompts = finished_run
    before = tree_digest(out)
    make_args, message = BAD_CASES[case]
    args = ["generate", *make_args(tmp_path, str(fast_recipe_file), str(prompts)), "--out", str(out)]
    if "--seeds" not in args:
        args += ["--seeds", "0,1"]
    result = runner.invoke(app, args)
    assert result.exit_code == 3, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert tree_digest(out) == before


def test_a_different_run_in_the_same_directory_is_refused(finished_run, fast_recipe_file):
    out, prompts = finished_run
    before = tree_digest(out)
    result = runner.invoke(app, ["generate", "--recipe", str(fast_recipe_file), "--prompts", str(prompts),
                                 "--seeds", "0,1,2", "--out", str(out)])
    assert result.exit_code == 3 and "already holds a different run" in result.output
    # The random preset is another model; its alias-free name is how a run made as `--model tiny` before the trained
    # preset became the default (the random one) is told apart.
    result = runner.invoke(app, ["generate", "--recipe", str(fast_recipe_file), "--prompts", str(prompts),
                                 "--seeds", "0,1", "--out", str(out), "--model", "tiny-random"])
    assert result.exit_code == 3 and "tiny-trained" in result.output and "tiny-random" in result.output
    assert tree_digest(out) == before


def test_non_run_directory_is_refused(tmp_path, fast_recipe_file):
    (tmp_path / "stuff.txt").write_text("mine")
    prompts = write_prompts(tmp_path / "p.jsonl")
    result = runner.invoke(app, ["generate", "--recipe", str(fast_recipe_file), "--prompts", str(prompts),
                                 "--out", str(tmp_path)])
    assert result.exit_code == 3 and "not an h3eval run directory" in result.output
    assert (tmp_path / "stuff.txt").read_text() == "mine" and not (tmp_path / "run.json").exists()


@pytest.mark.parametrize("text,expected", [("0,1", [0, 1]), ("0-3", [0, 1, 2, 3]), ("2,2,1", [2, 1])])
def test_parse_seeds(text, expected):
    assert parse_seeds(text) == expected


def test_shipped_prompt_suites():
    smoke = load_prompts("smoke")
    assert len(smoke.prompts) == 4
    dev16 = load_prompts("vbench-dev16")
    assert len(dev16.prompts) == 16 and len(set(dev16.ids)) == 16
    squat = [p for p in dev16.prompts if p.prompt == "A person is squat"]
    assert len(squat) == 1 and squat[0].meta["vbench_index"] == 195
    assert all("vbench_dimensions" in p.meta and "source" in p.meta for p in dev16.prompts)
    from h3.tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    lengths = [len(tokenizer(p.prompt, add_special_tokens=False)["input_ids"]) for p in load_prompts("mixed-length").prompts]
    assert len(set(lengths)) == len(lengths) and max(lengths) > 20 * min(lengths)


def test_prompt_file_errors_name_the_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "a", "prompt": "x"}\nnot json\n')
    with pytest.raises(PromptSuiteError, match=r"p\.jsonl:2"):
        load_prompts(path)
    path.write_text('{"id": "a"}\n')
    with pytest.raises(PromptSuiteError, match="'prompt'"):
        load_prompts(path)


def test_generate_checks_configured_versus_executed(tmp_path, fast_recipe, tiny_random_runtime):
    """generate fills runs through a backend, so each clip gets the configured-versus-executed check: a clip that
    ran something else than its recipe is removed, the recipe stops, and the run is failed."""
    prompts = write_prompts(tmp_path / "p.jsonl", ids=("a", "b"))
    four = fast_recipe.model_copy(update={"name": "four", "steps": 4})

    class AsksFourRunsTwo:  # the loaded runtime (2 steps) reporting under the recipe that asks for 4
        def generate(self, request, out, extra=None, **kwargs):
            loaded = tiny_random_runtime.recipe
            tiny_random_runtime.recipe = loaded.model_copy(update={"name": "four"})
            try:
                return tiny_random_runtime.generate(request, out, extra, **kwargs)
            finally:
                tiny_random_runtime.recipe = loaded

    plan = RunPlan(out=tmp_path / "run", model="tiny-random", recipes=[four], prompts=load_prompts(prompts),
                   seeds=[0], shape=RequestShape())
    manifest = fill_run(plan, runtime_factory=lambda *args: AsksFourRunsTwo(), progress=False)
    assert manifest.status == "failed" and len(manifest.errors) == 1
    assert manifest.errors[0].error == ("configured-versus-executed mismatch (clip removed, recipe stopped): "
                                        "steps: recipe asks for 4 DiT forward passes, 2 ran")
    store = RunStore(tmp_path / "run")
    assert not store.clip_path("four", "a", 0).exists() and not store.record_path("four", "a", 0).exists()
    assert store.error_path("four", "a", 0).exists() and not store.error_path("four", "b", 0).exists()


def test_a_bug_is_not_reported_as_bad_input(finished_run, fast_recipe_file, monkeypatch):
    """Only the product's own input errors exit 3; a bare ValueError from inside is a bug and keeps its traceback."""
    out, prompts = finished_run

    def broken(*args, **kwargs):
        raise ValueError("a bug, not bad input")

    monkeypatch.setattr("h3eval.runner.fill_run", broken)
    result = runner.invoke(app, ["generate", "--recipe", str(fast_recipe_file), "--prompts", str(prompts),
                                 "--seeds", "0,1", "--out", str(out)])
    assert result.exit_code != 3 and isinstance(result.exception, ValueError), result.output
