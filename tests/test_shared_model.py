"""One model shared by every recipe of an A/B (issue 20): the same clips as separate runtimes, the model exactly as
loaded after a recipe is removed, one model held, and the recipes a shared model refuses.

Every shipped recipe that runs on the CPU takes part, at 2 steps and float32 as the lever tests run them; the turbo
recipes read a seeded random LoRA of the published turbo LoRA's format (``h3.train.seeded_lora.write_random_turbo_lora``),
the file the H200 rehearsal writes too.
"""

from __future__ import annotations

import json
import os
import re

import pytest
import torch

from h3.levers.lora import TURBO_LORA_FILE
from h3.recipe import RECIPES_DIR, load_recipe, recipe_from_dict
from h3.runtime import GenerateRequest, H3Runtime, SharedModelError
from h3.train.seeded_lora import write_random_turbo_lora
from h3eval.commands.ab import run_ab_command
from h3eval.runner import RunError
from h3eval.store import RunStore
from tests._model_state import pipeline_state, state_differences
from tests.conftest import FAST_RECIPE, toml_dumps

# Every shipped recipe that runs on the CPU (the others are refused there: FP8, Sage, streamed offload; see
# tests/test_levers.py::test_every_shipped_recipe_runs_or_refuses_clearly_on_the_cpu).
CPU_RECIPES = ["baseline", "turbo4", "turbo4-int8", "turbo4-sparse", "fbc-cache", "turbo4-tinydemo", "identity",
               "fewer-steps"]
PROMPT = "a red kite flying over a green hill"


def cpu_recipe(name: str):
    data = load_recipe(name).model_dump()
    data.update(steps=2, dtype="float32")
    return recipe_from_dict(data, source=name)


def levers_key(recipe) -> str:
    """The recipe's computation (its signoff kind says how it is judged, not what it computes)."""
    data = recipe.resolved()
    data.pop("name"), data.pop("description"), data.pop("signoff", None)
    return json.dumps(data, sort_keys=True)


@pytest.fixture(scope="module")
def lora_dir(tmp_path_factory, tiny_random_runtime):
    directory = tmp_path_factory.mktemp("lora")
    write_random_turbo_lora(directory / TURBO_LORA_FILE, tiny_random_runtime.pipe.transformer)
    old = os.environ.get("H3_LORA_DIR")
    os.environ["H3_LORA_DIR"] = str(directory)
    yield directory
    if old is None:
        os.environ.pop("H3_LORA_DIR", None)
    else:
        os.environ["H3_LORA_DIR"] = old


@pytest.fixture(scope="module")
def shared_ab(tmp_path_factory, lora_dir):
    """``h3eval ab`` through the real in-process backend (one shared model): baseline against every other CPU recipe,
    interleaved in one process, one prompt, one seed."""
    root = tmp_path_factory.mktemp("shared-ab")
    recipes = []
    for name in CPU_RECIPES:
        # The shipped file as it is, with the lever tests' steps and dtype.
        text = (RECIPES_DIR / f"{name}.toml").read_text()
        text = re.sub(r"(?m)^steps = \d+", "steps = 2", text)
        text = re.sub(r'(?m)^dtype = "\w+"', 'dtype = "float32"', text)
        path = root / f"{name}.toml"
        path.write_text(text)
        assert load_recipe(path).resolved() == cpu_recipe(name).resolved()
        recipes.append(path)
    prompts = root / "p.jsonl"
    prompts.write_text(json.dumps({"id": "kite", "prompt": PROMPT}) + "\n")
    result = run_ab_command(baseline=str(recipes[0]), candidates=[str(p) for p in recipes[1:]], prompts=prompts,
                            out=root / "run", warmup=0, speed_rounds=0, model="tiny-random")
    return root / "run", result


def test_shared_model_gives_the_clips_of_separate_runtimes(shared_ab):
    """Each recipe's clip from the shared model is byte for byte the clip of a runtime loaded for that recipe alone
    (one runtime per distinct configuration: identity and fewer-steps at 2 steps are baseline's levers)."""
    run, result = shared_ab
    assert result.manifest.status == "complete", result.manifest.errors
    store = RunStore(run)
    separate: dict[str, tuple[str, str]] = {}
    for name in CPU_RECIPES:
        recipe = cpu_recipe(name)
        key = levers_key(recipe)
        if key not in separate:
            runtime = H3Runtime.load("tiny-random", recipe, "cpu")
            record = runtime.generate(GenerateRequest(prompt=PROMPT, seed=0, prompt_id="kite"),
                                      run.parent / f"separate-{name}.mp4")
            separate[key] = (record.frames_sha256, record.pcm_sha256)
            del runtime
        shared = store.read_record(name, "kite", 0)
        assert shared is not None, name
        assert (shared.frames_sha256, shared.pcm_sha256) == separate[key], f"{name}: shared-model clip differs"
        assert shared.extra["shared_model"]["switches"] >= 0
    assert len(separate) == 6  # six configurations
    # Five different clips: at 2 steps the first-block cache computes both steps (a step cache needs redundant steps,
    # seed 001), so fbc-cache's clip is baseline's.
    assert len(set(separate.values())) == 5
    fbc = store.read_record("fbc-cache", "kite", 0).executed.levers["cache"]
    assert fbc["applied"] and fbc["cached_steps"] == 0
    assert separate[levers_key(cpu_recipe("fbc-cache"))] == separate[levers_key(cpu_recipe("baseline"))]


def test_shared_model_holds_one_model_and_says_so(shared_ab):
    run, result = shared_ab
    store = RunStore(run)
    records = {name: store.read_record(name, "kite", 0) for name in CPU_RECIPES}
    memory = {name: r.extra["shared_model"]["memory"] for name, r in records.items()}
    base = memory["baseline"]
    # The text encoder and the VAEs are the same tensors for every recipe; the DiT too for recipes that replace none
    # of its modules.
    for name, m in memory.items():
        assert {k: v for k, v in m["components"].items() if k != "transformer"} == \
            {k: v for k, v in base["components"].items() if k != "transformer"}, name
    for name in ("turbo4", "turbo4-sparse", "fbc-cache", "identity", "fewer-steps"):
        assert memory[name]["total"] == base["total"] and memory[name]["levers_held"] == {}, name
    # One model's worth of bytes: the loaded parameters and buffers, not one set per recipe.
    loaded = H3Runtime.load("tiny-random", cpu_recipe("baseline"), "cpu").pipe
    one_model = sum(t.numel() * t.element_size() for name in ("transformer", "text_encoder", "vae", "audio_vae")
                    for t in [*getattr(loaded, name).parameters(), *getattr(loaded, name).buffers()])
    assert base["total"] == {"cpu": one_model}
    # A quantized candidate adds exactly its quantized copies (the float weights it replaced stay, held by its
    # handle, to switch back): what the full-size memory plan counts for it.
    from h3.levers.quantization import quantized_bytes

    recipe = cpu_recipe("turbo4-int8")
    planned = quantized_bytes(loaded.transformer, recipe.quant)
    assert memory["turbo4-int8"]["total"]["cpu"] - one_model == planned["quantized_bytes"]
    assert memory["turbo4-int8"]["levers_held"]["quant"]["cpu"] == planned["replaced_float_bytes"]
    # What the recipes switched: the turbo recipes kept their fused LoRA between each other.
    switches = {r.recipe_name: r.extra["shared_model"]["last_switch"] for r in records.values()}
    assert switches["turbo4-int8"]["kept"] == ["lora"] and switches["turbo4-int8"]["from"] == "turbo4"
    assert switches["turbo4-sparse"]["kept"] == ["lora"] and "quant" in switches["turbo4-sparse"]["removed"]
    assert "lora" in switches["fbc-cache"]["removed"]
    assert all(r.weights == "random" for r in records.values())  # the random tiny preset's weights are seeded


def test_shared_ab_reports_executed_and_off_identity(shared_ab):
    """The configured-versus-executed check ran on every clip (none refused) and the two candidates with baseline's
    levers passed the off-identity check after the model had carried five other recipes."""
    run, result = shared_ab
    assert result.executed_mismatches == {}
    assert set(result.off_identity) == {"identity", "fewer-steps"}
    assert all(check["passed"] and check["identical"] == 1 for check in result.off_identity.values())
    speed = json.loads((run / "speed.json").read_text())
    for name in CPU_RECIPES:
        assert speed["protocols"]["quality_clips"][name]["status"] == "ok"
        assert "recompiles" in speed["protocols"]["quality_clips"][name]


def test_removing_a_recipe_leaves_the_model_as_loaded(lora_dir):
    """After each recipe's levers are applied, run and removed, every parameter and buffer is bit-identical to the
    loaded model and no hook, processor or attribute of it is left."""
    runtime = H3Runtime.load("tiny-random", cpu_recipe("baseline"), "cpu", shared=True)
    calls = []
    capture = runtime.pipe.transformer.register_forward_pre_hook(
        lambda _m, _a, kwargs: calls.append(dict(kwargs)), with_kwargs=True)
    # One request first: transformers installs its output-recording hooks at the text encoder's first call.
    runtime.generate(GenerateRequest(prompt=PROMPT, seed=0), lora_dir / "warm.mp4")
    capture.remove()
    runtime.remove_levers()
    loaded = pipeline_state(runtime.pipe)
    for name in [*CPU_RECIPES, "turbo4-sparse", "baseline"]:
        recipe = cpu_recipe(name)
        runtime.switch_recipe(recipe)
        for handle in runtime.levers.values():
            handle.begin_request()
        with torch.no_grad():
            for kwargs in calls:  # every lever's forward path runs (lazily installed state included)
                runtime.pipe.transformer(**kwargs)
        runtime.remove_levers()
        assert state_differences(loaded, pipeline_state(runtime.pipe)) == [], name


def test_stage_timers_survive_a_switch_whatever_recipe_loaded_first(lora_dir):
    """A shared model loaded with turbo4 first (its VAE lever wraps ``vae.decode`` before the stage timer does): after
    switching to the baseline and back, every request still times its video decode (the 2026-12-01 H200 call loaded
    the FP8 candidate first and then counted every decode as denoising: video_decode 0.0). A float64 reference: the
    decode's share of the request is the same order with either recipe first."""
    runtime = H3Runtime.load("tiny-random", cpu_recipe("turbo4"), "cpu", shared=True)
    request = GenerateRequest(prompt=PROMPT, seed=0)
    for i, name in enumerate(["turbo4", "baseline", "turbo4"]):
        if i:
            runtime.switch_recipe(cpu_recipe(name))
        anatomy = runtime.generate(request, lora_dir / f"timers-{i}.mp4").timings.stage_anatomy
        assert anatomy.video_decode > 0.0 and anatomy.denoise > 0.0, (name, anatomy)


def test_compiled_recipe_keeps_its_graphs_across_switches(lora_dir):
    """Switching away from a compiled recipe and back finds its graphs: no compile at the next request."""
    torch._dynamo.reset()
    compiled = recipe_from_dict({**FAST_RECIPE, "name": "compiled", "compile": {"enabled": True, "backend": "eager"}})
    plain = recipe_from_dict(FAST_RECIPE)
    runtime = H3Runtime.load("tiny-random", compiled, "cpu", shared=True)
    request = GenerateRequest(prompt=PROMPT, seed=0)
    first = runtime.generate(request, lora_dir / "c1.mp4").executed.levers["compile"]
    assert first["graphs_compiled_this_request"] >= 1
    runtime.switch_recipe(plain)
    runtime.generate(request, lora_dir / "p.mp4")
    runtime.switch_recipe(compiled)
    again = runtime.generate(request, lora_dir / "c2.mp4")
    assert again.executed.levers["compile"]["graphs_compiled_this_request"] == 0
    assert again.executed.levers["compile"]["recompiles_this_request"] == 0
    torch._dynamo.reset()


def test_shared_model_refuses_what_it_cannot_share(tmp_path, lora_dir):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": "a cat"}) + "\n")
    base = tmp_path / "fast.toml"
    base.write_text(toml_dumps(FAST_RECIPE))
    other = tmp_path / "bf16.toml"
    other.write_text(toml_dumps({**FAST_RECIPE, "name": "bf16", "dtype": "bfloat16"}))
    offload = tmp_path / "off.toml"
    offload.write_text(toml_dumps({**FAST_RECIPE, "name": "off", "offload": {"enabled": True, "use_stream": False}}))
    with pytest.raises(RunError, match=r"bf16: its dtype is bfloat16.*off: offload: diffusers' group offloading "
                                       r"cannot be removed in place.*h3 serve"):
        run_ab_command(baseline=str(base), candidates=[str(other), str(offload)], prompts=prompts,
                       out=tmp_path / "run", warmup=0, speed_rounds=0)
    assert not (tmp_path / "run").exists()  # refused before anything was written
    runtime = H3Runtime.load("tiny-random", recipe_from_dict(FAST_RECIPE), "cpu", shared=True)
    with pytest.raises(SharedModelError, match="dtype is bfloat16"):
        runtime.switch_recipe(recipe_from_dict({**FAST_RECIPE, "name": "bf16", "dtype": "bfloat16"}))


def test_a_failure_half_way_through_a_recipe_leaves_the_model_as_loaded(lora_dir, monkeypatch):
    """A planted out-of-memory in the quantization of the 5th layer, after the LoRA was fused (turbo4-int8 applies
    lora then quant): every lever applied so far comes off and every parameter is bit-identical to the loaded model,
    and the next switch applies the same recipe cleanly. The 2026-12-06 H100 call of gate_fraction.sh ran out of memory
    in FP8's quantization and every later request of the run was refused: "lever 'lora' is already applied"."""
    from h3.levers import quantization

    runtime = H3Runtime.load("tiny-random", cpu_recipe("baseline"), "cpu", shared=True)
    loaded = pipeline_state(runtime.pipe)
    made = []
    real_init = quantization.QuantizedLinear.__init__

    def failing_init(self, linear, mode):
        made.append(mode)
        if len(made) == 5:
            raise torch.OutOfMemoryError("planted: CUDA out of memory")
        real_init(self, linear, mode)

    monkeypatch.setattr(quantization.QuantizedLinear, "__init__", failing_init)
    with pytest.raises(torch.OutOfMemoryError, match="planted"):
        runtime.switch_recipe(cpu_recipe("turbo4-int8"))
    assert len(made) == 5
    assert runtime.levers == {} and not runtime.levers_applied
    assert state_differences(loaded, pipeline_state(runtime.pipe)) == []
    monkeypatch.setattr(quantization.QuantizedLinear, "__init__", real_init)
    reference = H3Runtime.load("tiny-random", cpu_recipe("turbo4-int8"), "cpu")
    request = GenerateRequest(prompt=PROMPT, seed=0)
    runtime.switch_recipe(cpu_recipe("turbo4-int8"))
    again = runtime.generate(request, lora_dir / "after-oom.mp4")
    alone = reference.generate(request, lora_dir / "int8-alone.mp4")
    assert (again.frames_sha256, again.pcm_sha256) == (alone.frames_sha256, alone.pcm_sha256)


def test_ab_by_recipe_runs_each_recipe_together_and_applies_the_last_for_good(tmp_path, shared_ab):
    """``--by-recipe``: the baseline's requests all come before the candidate's, the candidate's levers apply for
    good (its switch is final: the quantization keeps no float copy), and the clips are byte for byte the interleaved
    run's (the shared_ab fixture's, same recipe files)."""
    run, _ = shared_ab
    root = run.parent
    prompts = root / "p.jsonl"
    result = run_ab_command(baseline=str(root / "baseline.toml"), candidates=[str(root / "turbo4-int8.toml")],
                            prompts=prompts, out=tmp_path / "run", warmup=1, speed_rounds=1, model="tiny-random",
                            by_recipe=True)
    assert result.manifest.status == "complete", result.manifest.errors
    store, interleaved = RunStore(tmp_path / "run"), RunStore(run)
    records = [json.loads(p.read_text()) for p in sorted((tmp_path / "run").rglob("*.json"))
               if p.with_suffix(".mp4").exists()]
    order = [r["recipe_name"] for r in sorted(records, key=lambda r: r["extra"]["seq"])]
    assert order == ["baseline"] * 3 + ["turbo4-int8"] * 3  # warm-up, speed, quality each
    for name in ("baseline", "turbo4-int8"):
        mine, theirs = store.read_record(name, "kite", 0), interleaved.read_record(name, "kite", 0)
        assert (mine.frames_sha256, mine.pcm_sha256) == (theirs.frames_sha256, theirs.pcm_sha256), name
    last = store.read_record("turbo4-int8", "kite", 0).extra["shared_model"]
    assert last["last_switch"]["final"] is True and last["switches"] == 1
    assert last["memory"]["levers_held"] == {}
    assert json.loads((tmp_path / "run" / "run.json").read_text())["plan"]["order"] == "by_recipe"


def test_by_recipe_and_baseline_last_together_are_one_clear_error(tmp_path):
    """Two orders at once: refused before anything is written, naming both options."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": "a cat"}) + "\n")
    base = tmp_path / "fast.toml"
    base.write_text(toml_dumps(FAST_RECIPE))
    other = tmp_path / "other.toml"
    other.write_text(toml_dumps({**FAST_RECIPE, "name": "other"}))
    with pytest.raises(RunError, match=r"--by-recipe .*--baseline-last .*choose one"):
        run_ab_command(baseline=str(base), candidates=[str(other)], prompts=prompts, out=tmp_path / "run",
                       warmup=0, speed_rounds=0, by_recipe=True, baseline_last=True)
    assert not (tmp_path / "run").exists()
