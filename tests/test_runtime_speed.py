"""Issue 54's CPU side of the runtime: a wrong --device is one line and exit 3; a full-size request fits one 80 GB
card (the text encoder built in host memory when it streams, quantization that frees each float layer before the
next, a memory plan that counts the load's peak); several requests in one process (--prompts-file), each marked warm
or not; the seeded turbo LoRA written by a documented command."""

from __future__ import annotations

import json
import weakref

import pytest
import torch
from typer.testing import CliRunner

from h3 import random_model
from h3.cli import app
from h3.memory import GIB, H100_CAPACITY_GIB, HEADROOM_GIB, QUANT_WORKING_BYTES_PER_PARAM, full_size_plan
from h3.recipe import load_recipe

runner = CliRunner()


def _one_error_line(result) -> str:
    lines = [line for line in (result.stderr or result.output).splitlines() if line.strip()]
    assert result.exit_code == 3, result.output
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output, result.output
    return lines[0]


@pytest.mark.parametrize("device", ["tpu9", "cuda:x", "mps"])
def test_a_device_h3_cannot_name_is_one_line_exit_3(tmp_path, device):
    line = _one_error_line(runner.invoke(app, ["generate", "--prompt", "a cat", "--out", str(tmp_path / "c.mp4"),
                                               "--model", "tiny-random", "--device", device]))
    assert repr(device) in line and "'cpu' or 'cuda'" in line
    assert not (tmp_path / "c.mp4").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a GPU")
@pytest.mark.parametrize("command", ["generate", "prompts-file"])
def test_cuda_without_a_gpu_is_one_line_exit_3(tmp_path, command):
    prompts = tmp_path / "p.txt"
    prompts.write_text("a cat\n")
    args = (["--prompt", "a cat", "--out", str(tmp_path / "c.mp4")] if command == "generate" else
            ["--prompts-file", str(prompts), "--out", str(tmp_path / "out")])
    line = _one_error_line(runner.invoke(app, ["generate", *args, "--model", "tiny-random", "--device", "cuda"]))
    assert "no CUDA GPU is visible" in line and torch.__version__ in line


def test_check_device_names_what_there_is():
    from h3.runtime import DeviceError, check_device

    assert check_device("cpu") == "cpu" and check_device(None) in ("cpu", "cuda")
    with pytest.raises(DeviceError, match="has 0 CUDA|no CUDA GPU") if not torch.cuda.is_available() else \
            pytest.raises(DeviceError, match="CUDA GPU"):
        check_device(f"cuda:{torch.cuda.device_count() + 3}")
    with pytest.raises(DeviceError, match="not 'meta'"):
        check_device("meta")


# -- quantization: one layer at a time --------------------------------------------------------------------------------

def _live_bytes(refs) -> int:
    total = 0
    for ref in refs:
        tensor = ref()
        if tensor is not None and tensor.device.type != "meta":
            total += tensor.untyped_storage().nbytes()
    return total


@pytest.mark.parametrize("keep_originals", [False, True])
def test_quantization_never_holds_both_copies_of_the_model(monkeypatch, keep_originals):
    """The float weight of each layer is freed (or, reversible, parked on the host) before the next layer is
    quantized: on the compute device the model never holds its float weights and their quantized copies whole; the
    peak is the float model plus one layer's copy. Counted from the tensors themselves, at every layer."""
    from h3 import tiny
    from h3.levers import quantization as q
    from diffusers import MiniMaxH3Transformer3DModel

    torch.manual_seed(0)
    model = MiniMaxH3Transformer3DModel(**tiny.TRANSFORMER_CONFIG).to(torch.bfloat16).eval()
    config = q.QuantizationConfig(mode="int8_weight_only")
    chosen, _, _ = q.select_linears(model, config)
    refs = [weakref.ref(c.weight) for c in chosen.values()]
    float_total = sum(c.weight.numel() * c.weight.element_size() for c in chosen.values())
    largest_q = max(c.weight.numel() + 4 * c.out_features + (2 * c.out_features if c.bias is not None else 0)
                    for c in chosen.values())
    del chosen
    made: list[int] = []
    peaks: list[int] = []
    original_init = q.QuantizedLinear.__init__

    def counting_init(self, linear, mode):
        original_init(self, linear, mode)
        made.append(sum(b.numel() * b.element_size() for b in self.buffers()))
        # Float weights still in place (not freed, not moved to the host keep_on), plus every copy made so far.
        peaks.append(_live_bytes(refs) + sum(made))

    monkeypatch.setattr(q.QuantizedLinear, "__init__", counting_init)
    # keep_on "meta" stands for the host a reversible GPU runtime parks the float layers on (here the compute device is
    # the CPU, so only a place other than it shows the float layer left the device in its turn).
    handle = q.apply_quantization(model, config, keep_originals=keep_originals, keep_on="meta")
    assert len(made) == len(refs) > 10
    assert max(peaks) <= float_total + largest_q, (max(peaks), float_total, largest_q)
    # The old way (every float layer referenced until the lever returned) would have peaked at both copies whole:
    assert float_total + sum(made) > float_total + largest_q
    assert _live_bytes(refs) == 0  # no float weight of a quantized layer is left on the device
    assert len(handle.originals) == (len(refs) if keep_originals else 0)


def test_quantized_layers_compute_what_they_did_before_the_change():
    """Freeing the float layers changes nothing the quantized ones compute: each quantized layer's output equals a
    QuantizedLinear made from a copy of the same float layer."""
    from h3.levers import quantization as q

    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.GELU(), torch.nn.Linear(48, 32))
    copies = {name: torch.nn.Linear(m.in_features, m.out_features) for name, m in model.named_children()
              if isinstance(m, torch.nn.Linear)}
    for name, copy in copies.items():
        copy.load_state_dict(getattr(model, name).state_dict())
    x = torch.randn(5, 64)
    q.apply_quantization(model, q.QuantizationConfig(mode="int8_weight_only", exclude=[]), keep_originals=False)
    reference = {name: q.QuantizedLinear(copy, "int8_weight_only") for name, copy in copies.items()}
    expected = reference["2"](torch.nn.functional.gelu(reference["0"](x)))
    assert torch.equal(model(x), expected)


# -- the memory plan counts the load ----------------------------------------------------------------------------------

def test_memory_plan_counts_the_quantization_load_peak_and_fits_one_h100():
    """One FP8 recipe on its own runtime, the text encoder streamed: settled at ~37 GiB, but the load holds the bf16
    DiT whole until each layer's turn, so its peak is the built model plus the largest layer's working copies, not
    bf16 plus FP8 whole (the ~99 GiB the lever held before it freed layers as it went). That fits one 80 GB H100; the
    text encoder resident does not."""
    from h3.levers.quantization import quantized_bytes, select_linears

    fp8 = load_recipe("turbo4-fp8")
    plan = full_size_plan([fp8], text_encoder="offload", shared=False, shape="5s-544x960",
                          capacity_gib=H100_CAPACITY_GIB)
    sizes = plan["components_gib"]
    base = sizes["transformer"] + sizes["vae"] + sizes["audio_vae"] + plan["text_encoder_on_device_gib"]
    meta = random_model.build_components(random_model.released(), "meta", torch.bfloat16)
    chosen, _, _ = select_linears(meta["transformer"], fp8.quant)
    largest = max(c.weight.numel() for c in chosen.values())
    load = plan["load_peak_gib"]["turbo4-fp8"]
    assert load == pytest.approx(base + largest * QUANT_WORKING_BYTES_PER_PARAM / GIB, rel=1e-9)
    assert load < base + 2  # one layer's copies: under 2 GiB over the built model
    assert plan["per_process_gib"]["turbo4-fp8"] < load  # the request, after the float weights went, is smaller
    assert plan["peak_gib"]["turbo4-fp8"] == load
    assert plan["fits_one_gpu_each"] and load + HEADROOM_GIB <= H100_CAPACITY_GIB
    both_whole = base + quantized_bytes(meta["transformer"], fp8.quant)["quantized_bytes"] / GIB
    assert both_whole > H100_CAPACITY_GIB  # what the load needed while it held both copies whole
    resident = full_size_plan([fp8], text_encoder="resident", shared=False, shape="5s-544x960",
                              capacity_gib=H100_CAPACITY_GIB)
    assert not resident["fits_one_gpu_each"]
    # A shared model keeps every float layer to switch back: its load and its request both hold the FP8 copies.
    shared = full_size_plan([load_recipe("turbo4"), fp8], text_encoder="offload", shared=True,
                            shape="5s-544x960", capacity_gib=H100_CAPACITY_GIB)
    assert shared["load_peak_gib"]["shared"] == pytest.approx(base + shared["lever_extra_gib"]["turbo4-fp8"])
    assert not shared["fits_one_gpu_each"]


# -- the text encoder built where it lives ----------------------------------------------------------------------------

def test_host_built_text_encoder_is_the_device_built_one():
    """Drawn on the device one tensor at a time and copied to host memory: the same parameters and buffers, dtype and
    bits, as the build on the device (here both the CPU), and none of it left on the device."""
    configs = random_model.small()
    built = random_model.build_components(configs, "cpu", torch.bfloat16)
    hosted = random_model.build_components(configs, "cpu", torch.bfloat16, on_host=("text_encoder",))
    ours, theirs = built["text_encoder"], hosted["text_encoder"]
    mine = {**dict(ours.named_parameters()), **dict(ours.named_buffers())}
    other = {**dict(theirs.named_parameters()), **dict(theirs.named_buffers())}
    assert mine.keys() == other.keys() and len(mine) > 20
    for key, tensor in mine.items():
        assert tensor.dtype == other[key].dtype and torch.equal(tensor, other[key]), key
        assert other[key].device.type == "cpu"


# -- several requests in one process ----------------------------------------------------------------------------------

def test_prompts_file_errors_name_the_line(tmp_path):
    from h3.batch import read_prompts_file
    from h3.runtime import RequestError

    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a cat", "id": "c"}\n\n{"prompt": 3}\n')
    with pytest.raises(RequestError, match=r"line 3: needs a non-empty string"):
        read_prompts_file(path)
    path.write_text('{"prompt": "a cat", "seed": -1}\n')
    with pytest.raises(RequestError, match=r"line 1: \"seed\" must be"):
        read_prompts_file(path)
    path.write_text("# only a comment\n\n")
    with pytest.raises(RequestError, match="no prompt"):
        read_prompts_file(path)
    text = tmp_path / "p.txt"
    text.write_text("a cat\n# skipped\na dog on a hill\n")
    assert [p.prompt for p in read_prompts_file(text)] == ["a cat", "a dog on a hill"]
    line = _one_error_line(runner.invoke(app, ["generate", "--prompts-file", str(tmp_path / "missing.txt"), "--out",
                                               str(tmp_path / "o"), "--model", "tiny-random", "--device", "cpu"]))
    assert "missing.txt" in line


def test_prompts_file_runs_every_request_in_one_process_and_marks_warm_ones(tmp_path, fast_recipe_file):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a cat", "id": "cat"}\n{"prompt": "a red kite over a hill", "id": "kite", '
                       '"seed": 7}\n')
    out = tmp_path / "out"
    result = runner.invoke(app, ["generate", "--prompts-file", str(prompts), "--out", str(out), "--model",
                                 "tiny-random", "--recipe", str(fast_recipe_file), "--repeat", "2", "--seed", "3",
                                 "--device", "cpu"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "requests.json").read_text())
    rows = summary["requests"]
    assert [(r["index"], r["warm"], r["prompt_id"], r["seed"]) for r in rows] == [
        (0, False, "cat", 3), (1, True, "kite", 7), (2, True, "cat", 3), (3, True, "kite", 7)]
    for row in rows:
        record = json.loads((out / row["clip"]).with_suffix(".json").read_text())
        assert record["extra"]["batch"] == {"index": row["index"], "warm": row["warm"], "recipe": "fast"}
        assert record["timings"]["generation_side_latency_s"] == row["generation_side_latency_s"]
        assert row["stage_anatomy"]["denoise"] > 0 and len(row["stage_anatomy"]["denoise_steps"]) == 2
    # The same prompt and seed in one process give the same clip, warm or not.
    clips = {r["index"]: json.loads((out / r["clip"]).with_suffix(".json").read_text())["frames_sha256"]
             for r in rows}
    assert clips[0] == clips[2] and clips[1] == clips[3] and clips[0] != clips[1]
    warm = summary["by_recipe"]["fast"]
    assert warm["warm_requests"] == 3 and warm["warm"]["generation_side_latency_s"]["n"] == 3
    values = sorted(r["generation_side_latency_s"] for r in rows[1:])
    assert warm["warm"]["generation_side_latency_s"]["p50"] == pytest.approx(values[1])
    assert warm["first_request"]["generation_side_latency_s"] == rows[0]["generation_side_latency_s"]


def test_several_recipes_need_a_prompts_file(tmp_path):
    line = _one_error_line(runner.invoke(app, ["generate", "--prompt", "a cat", "--out", str(tmp_path / "c.mp4"),
                                               "--recipe", "baseline", "--recipe", "turbo4"]))
    assert "--prompts-file" in line


# -- the seeded turbo LoRA --------------------------------------------------------------------------------------------

def test_seeded_lora_command_writes_the_turbo_recipes_file(tmp_path):
    from safetensors.torch import load_file

    from h3.levers.lora import TURBO_LORA_FILE
    from h3.train.seeded_lora import random_turbo_lora_state_dict

    result = runner.invoke(app, ["seeded-lora", "--out", str(tmp_path / "lora"), "--model", "h3-random-small"])
    assert result.exit_code == 0, result.output
    assert f"export H3_LORA_DIR={(tmp_path / 'lora').resolve()}" in result.output
    written = load_file(str(tmp_path / "lora" / TURBO_LORA_FILE))
    pipe, _ = random_model.random_pipeline(random_model.small(), "meta", torch.bfloat16)
    expected = random_turbo_lora_state_dict(pipe.transformer)
    assert written.keys() == expected.keys()
    assert all(torch.equal(written[k], expected[k]) for k in expected)
    line = _one_error_line(runner.invoke(app, ["seeded-lora", "--out", str(tmp_path / "x"), "--model", "tiny"]))
    assert "h3-random" in line


def test_generate_refuses_before_loading_what_ran_out_of_memory_on_the_h100():
    """The plan against the two H100 calls that ran these recipe lists on one shared model (2026-12-06, the card's
    79.18 GiB total): stock4 then turbo4-fp8 ran (session 26, peak 75.0 GiB), stock4, turbo4-fp8-sage then
    turbo4-fp8-sage-compile ran out of memory applying the middle FP8 recipe (session 27). The plan fits the first
    and refuses the second, naming the recipe that holds both copies; the last recipe is counted as applied for good
    (so stock4 then turbo4-fp8-sage-compile, which ran in session 27, fits too); one recipe or another model: no plan."""
    from h3.memory import shared_load_problem

    from pathlib import Path

    stock4 = load_recipe(Path(__file__).resolve().parents[1] / "bench" / "runtime_speed" / "recipes" / "stock4.toml")
    card = 79.1787109375
    ran = [[stock4, load_recipe("turbo4"), load_recipe("turbo4-fp8")], [stock4, load_recipe("turbo4-fp8-sage-compile")]]
    for recipes in ran:
        assert shared_load_problem("h3-random", recipes, text_encoder="offload", capacity_gib=card) is None
    oom = [stock4, load_recipe("turbo4-fp8-sage"), load_recipe("turbo4-fp8-sage-compile")]
    problem = shared_load_problem("h3-random", oom, text_encoder="offload", capacity_gib=card)
    assert problem is not None and "turbo4-fp8-sage keeps its float layers" in problem
    plan = full_size_plan(oom, text_encoder="offload", shared=True, capacity_gib=card, last_for_good=True)
    assert plan["load_peak_gib"]["shared"] + HEADROOM_GIB > card
    assert plan["lever_extra_gib"]["turbo4-fp8-sage-compile"] < 0 < plan["lever_extra_gib"]["turbo4-fp8-sage"]
    assert shared_load_problem("h3-random", oom[:1] + oom[2:], text_encoder="offload", capacity_gib=card) is None
    assert shared_load_problem("h3-random", oom[1:2], text_encoder="offload", capacity_gib=card) is None
    assert shared_load_problem("tiny", oom, text_encoder="offload", capacity_gib=card) is None


def test_ab_interleaved_counts_every_quantized_recipe_as_holding_both_copies():
    """``h3eval ab`` interleaved switches back after every request, so even its last FP8 candidate keeps its float
    layers: stock4 then turbo4-fp8 is refused for an 80 GB H100 (the session-27 gate-fraction call ran out of memory
    at that switch) and accepted with --by-recipe (the last applied for good, as session 26's generate call ran)."""
    from pathlib import Path

    from h3.memory import shared_load_problem

    stock4 = load_recipe(Path(__file__).resolve().parents[1] / "bench" / "runtime_speed" / "recipes" / "stock4.toml")
    pair = [stock4, load_recipe("turbo4-fp8")]
    problem = shared_load_problem("h3-random", pair, text_encoder="offload", capacity_gib=79.1787109375,
                                  last_for_good=False)
    assert problem is not None and "turbo4-fp8 keeps its float layers" in problem and "--by-recipe" in problem
    assert shared_load_problem("h3-random", pair, text_encoder="offload", capacity_gib=79.1787109375) is None


def test_a_resident_text_encoder_at_full_size_is_refused_on_an_h100_before_loading():
    """The conditioner (62.1 GiB) and the bf16 DiT (61.7 GiB) are built whole before any lever: resident, they do not
    load on an 80 GB H100 (79.18 GiB), whichever recipe; they do on an H200 (140.4 GiB); streamed, the plan is
    shared_load_problem's (None for one recipe); another model: no plan."""
    from h3.memory import H200_CAPACITY_GIB, resident_load_problem

    h100 = 79.1787109375
    for name in ("baseline", "turbo4-fp8-sage-compile"):
        recipes = [load_recipe(name)]
        problem = resident_load_problem("h3-random", recipes, text_encoder="resident", capacity_gib=h100)
        plan = full_size_plan(recipes, text_encoder="resident", shared=False, capacity_gib=h100)
        peak = max(plan["load_peak_gib"].values())
        built = sum(plan["components_gib"].values())  # the whole model as built, the conditioner on the card
        assert built > h100 and plan["components_gib"]["text_encoder"] == pytest.approx(62.1, abs=0.05)
        # baseline: the build is the peak; FP8: plus one layer's quantization working copies (1.2 GiB)
        assert (peak == pytest.approx(built)) if name == "baseline" else (built < peak < built + 2.0)
        assert problem is not None and f"needs {peak:.1f} GiB" in problem and "--text-encoder fit" in problem
        assert resident_load_problem("h3-random", recipes, text_encoder="resident",
                                     capacity_gib=H200_CAPACITY_GIB) is None
        for streamed in ("fit", "offload"):
            assert resident_load_problem("h3-random", recipes, text_encoder=streamed, capacity_gib=h100) is None
        assert resident_load_problem("tiny", recipes, text_encoder="resident", capacity_gib=h100) is None
