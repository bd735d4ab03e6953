"""The levers on the tiny preset on the CPU: each switchable from a recipe, each exact or within a stated tolerance,
each reporting what it ran. GPU-only paths are marked ``gpu``.

Transformer-level tests call the tiny transformer with the keyword arguments the pipeline really passed (captured
from one generated clip), so they cost a forward (~0.2 s) instead of a clip (~12 s on 2 shared cores).
"""

from __future__ import annotations

import copy
import math
import tomllib
from types import SimpleNamespace

import pytest
import torch

from h3.levers import LEVERS, LeverError
from h3.recipe import RECIPES_DIR, known_recipes, load_recipe, recipe_from_dict
from h3.record import Executed
from h3.runtime import GenerateRequest, H3Runtime

from conftest import FAST_RECIPE

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (this machine has none)")


def assert_close(actual: torch.Tensor, expected: torch.Tensor, rtol: float, what: str) -> float:
    """Relative max error of ``actual`` against ``expected``; the message names the worst index."""
    actual, expected = actual.detach().double(), expected.detach().double()
    diff = (actual - expected).abs()
    rel = float(diff.max() / expected.abs().max().clamp(min=1e-30))
    worst = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))
    assert rel <= rtol, f"{what}: relative max error {rel:.3e} > {rtol:.1e} (worst at {worst})"
    return rel


# -- shared fixtures -------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A runtime with every lever off, one clip, and the transformer calls of that clip."""
    runtime = H3Runtime.load("tiny-random", recipe_from_dict(FAST_RECIPE), "cpu")
    calls = []

    def capture(_m, _a, kwargs):
        calls.append({k: (v.clone() if torch.is_tensor(v) else v) for k, v in kwargs.items()})

    hook = runtime.pipe.transformer.register_forward_pre_hook(capture, with_kwargs=True)
    out = tmp_path_factory.mktemp("base") / "clip.mp4"
    record = runtime.generate(GenerateRequest(prompt="A person is squat", seed=3), out)
    hook.remove()
    with torch.no_grad():
        outputs = [runtime.pipe.transformer(**c) for c in calls]
    return SimpleNamespace(runtime=runtime, record=record, calls=calls, outputs=outputs)


def fresh_transformer(base):
    return copy.deepcopy(base.runtime.pipe.transformer)


@torch.no_grad()
def forward_all(transformer, calls):
    return [transformer(**c) for c in calls]


def assert_counters_hold_under_compile(handle, transformer, calls, outputs) -> None:
    """With the blocks compiled (regionally, eager backend) a lever's per-call telemetry and its outputs are the
    eager run's: its counters sit outside the compiled graphs."""
    from h3.levers.compile import CompileConfig, apply_compile

    telemetry = handle.telemetry()
    compiled = apply_compile(transformer, CompileConfig(backend="eager"))
    handle.begin_request()
    try:
        compiled_outputs = forward_all(transformer, calls)
    finally:
        compiled.remove()
        torch._dynamo.reset()
    assert handle.telemetry() == telemetry
    for (v, _), (ve, _) in zip(compiled_outputs, outputs):
        torch.testing.assert_close(v, ve, rtol=1e-5, atol=1e-6)


# -- recipes -------------------------------------------------------------------------------------------------------

REQUIRED = ["baseline", "turbo4", "turbo4-int8", "turbo4-fp8", "turbo4-fp8-sage", "turbo4-sparse", "fbc-cache",
            "offload-int8-adaln", "identity"]


def test_shipped_recipes_validate():
    assert set(REQUIRED) <= set(known_recipes())
    for name in known_recipes():
        assert load_recipe(name).name == name


def test_identity_names_every_lever_off_and_matches_baseline():
    raw = tomllib.loads((RECIPES_DIR / "identity.toml").read_text())
    sections = {"lora", "adaln", "quant", "sparse_attention", "bucketing", "cache", "compile", "offload", "attention",
                "vae"}
    assert sections <= set(raw), f"identity.toml does not name {sections - set(raw)}"
    identity, baseline = load_recipe("identity").resolved(), load_recipe("baseline").resolved()
    for key in ("name", "description"):
        identity.pop(key), baseline.pop(key)
    assert identity == baseline


def test_identity_clip_is_byte_identical_to_baseline(base, tmp_path):
    identity = load_recipe("identity").model_dump()
    identity.update(steps=FAST_RECIPE["steps"], dtype=FAST_RECIPE["dtype"])
    runtime = H3Runtime.load("tiny-random", recipe_from_dict(identity), "cpu")
    record = runtime.generate(GenerateRequest(prompt="A person is squat", seed=3), tmp_path / "clip.mp4")
    assert record.frames_sha256 == base.record.frames_sha256
    assert record.pcm_sha256 == base.record.pcm_sha256
    assert record.mp4_sha256 == base.record.mp4_sha256
    assert set(record.executed.levers) == set(LEVERS)
    assert [n for n, t in record.executed.levers.items() if t["applied"]] == []


SHIPPED_ON_CPU = {
    "baseline": None, "identity": None, "fbc-cache": None, "turbo4-tinydemo": None,
    "turbo4": "environment variable that is not set", "turbo4-int8": "environment variable that is not set",
    "turbo4-sparse": "environment variable that is not set",
    "turbo4-fp8": "fp8_w8a8' needs a GPU", "turbo4-fp8-sage": "'sage' needs a CUDA GPU",
    "turbo4-fp8-sage-compile": "'sage' needs a CUDA GPU",
    "offload-int8-adaln": "use_stream .* needs a CUDA GPU",
    # The trained tiny preset's LoRA (it ships in h3/assets/tiny): refused for the random tiny preset before any weight
    # loads; tests/test_train.py loads it into the trained one.
    "turbo4-tiny": r"lora.path '@turbo4-tiny' is a LoRA of the trained tiny preset \(--model tiny\); it cannot "
                   r"load into another model",
    "turbo4-tiny-int8": r"lora.path '@turbo4-tiny' is a LoRA of the trained tiny preset \(--model tiny\); it "
                        r"cannot load into another model",
    "turbo4-tiny-sparse85": r"lora.path '@turbo4-tiny-run13' is a LoRA of the trained tiny preset \(--model tiny\); "
                            r"it cannot load into another model",
}


@pytest.mark.parametrize("name", sorted(SHIPPED_ON_CPU))
def test_every_shipped_recipe_runs_or_refuses_clearly_on_the_cpu(name, monkeypatch):
    """On the tiny preset (2 steps, float32) each shipped recipe either loads with its levers applied, or is refused
    before any weight loads with the reason named."""
    monkeypatch.delenv("H3_LORA_DIR", raising=False)
    data = load_recipe(name).model_dump()
    data.update(steps=2, dtype="float32")
    data["vae"]["tiles"] = {}
    recipe = recipe_from_dict(data)
    if SHIPPED_ON_CPU[name] is None:
        runtime = H3Runtime.load("tiny-random", recipe, "cpu")
        applied = {n for n, h in runtime.levers.items() if h.telemetry()["applied"]}
        expected = {"lora": recipe.lora.enabled, "adaln": recipe.adaln.precompute, "quant": recipe.quant.mode != "none",
                    "cache": recipe.cache.kind != "none", "sparse_attention": recipe.sparse_attention.enabled,
                    "bucketing": recipe.bucketing.enabled}
        assert applied == {n for n, on in expected.items() if on}
    else:
        with pytest.raises(LeverError, match=SHIPPED_ON_CPU[name]):
            H3Runtime.load("tiny-random", recipe, "cpu")


# -- step distillation (LoRA) -----------------------------------------------------------------------------------------

def lora_runtime(**lora):
    return H3Runtime.load("tiny-random", recipe_from_dict({**FAST_RECIPE, "lora": {"enabled": True, **lora}}), "cpu")


@pytest.fixture(scope="module")
def tiny_lora_file(base, tmp_path_factory):
    from h3.train.seeded_lora import write_tiny_lora

    return write_tiny_lora(tmp_path_factory.mktemp("lora") / "tiny.safetensors", base.runtime.pipe.transformer)


@pytest.mark.parametrize("scale, expected_scaling", [(None, 0.5), (3.0, 1.5)])
def test_lora_honours_metadata_alpha_and_scale(base, tiny_lora_file, scale, expected_scaling):
    """The file records alpha 2 at rank 4 (scale 0.5); seed 001's loader applied a scale 16x too strong."""
    from safetensors.torch import load_file

    runtime = lora_runtime(path=str(tiny_lora_file), scale=scale)
    telemetry = runtime.levers["lora"].telemetry()
    assert telemetry["matched_modules"] == telemetry["file_modules"] == 14  # 7 Linears x 2 blocks
    assert telemetry["scaling"] == [expected_scaling]
    state = load_file(str(tiny_lora_file))
    name = "transformer_blocks.1.ff.net.2"
    base_linear = base.runtime.pipe.transformer.get_submodule(name)
    a, b = state[f"transformer.{name}.lora_A.weight"].double(), state[f"transformer.{name}.lora_B.weight"].double()
    x = torch.randn(7, base_linear.in_features, generator=torch.Generator().manual_seed(0))
    expected = x.double() @ (base_linear.weight.double() + expected_scaling * (b @ a)).T
    with torch.no_grad():
        actual = runtime.pipe.transformer.get_submodule(name)(x)
    assert_close(actual, expected, 1e-6, "LoRA linear vs float64 W + scale * B @ A")


def test_lora_fused_matches_unfused(base):
    unfused, fused = lora_runtime(path="@tiny"), lora_runtime(path="@tiny", fuse=True)
    assert fused.levers["lora"].telemetry()["fused"] is True
    out_u = forward_all(unfused.pipe.transformer, base.calls)
    out_f = forward_all(fused.pipe.transformer, base.calls)
    for (vu, au), (vf, af), (vb, _) in zip(out_u, out_f, base.outputs):
        # Fusing reorders float32 sums: W x + s B (A x) vs (W + s B A) x. Stated tolerance 1e-5 relative.
        assert_close(vf, vu, 1e-5, "fused vs unfused video velocity")
        assert_close(af, au, 1e-5, "fused vs unfused audio velocity")
        assert (vu - vb).abs().max() > 1e-3, "the LoRA changed nothing"
    # 14 LoRA layers ran per forward unfused; fused, the factors are gone from the model.
    assert unfused.levers["lora"].telemetry()["lora_layer_calls"] == 14 * len(base.calls)
    assert fused.levers["lora"].telemetry()["lora_layer_calls"] == 0
    assert not any("lora_" in n for n, _ in fused.pipe.transformer.named_parameters())


def test_lora_matching_no_module_is_refused(base, tmp_path):
    from h3.train.seeded_lora import write_tiny_lora

    bad = write_tiny_lora(tmp_path / "misnamed.safetensors", base.runtime.pipe.transformer, misnamed=True)
    with pytest.raises(LeverError, match=r"matches 0 of its 14 modules"):
        lora_runtime(path=str(bad))


def test_missing_lora_file_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("H3_LORA_DIR", str(tmp_path))
    recipe = load_recipe("turbo4").model_dump()
    recipe.update(dtype="float32", steps=2, vae={**recipe["vae"], "tiles": {}})
    with pytest.raises(LeverError, match=r"minimax-h3-turbo-4step\.safetensors.*does not exist"):
        H3Runtime.load("tiny-random", recipe_from_dict(recipe), "cpu")
    monkeypatch.delenv("H3_LORA_DIR")
    with pytest.raises(LeverError, match=r"environment variable that is not set"):
        H3Runtime.load("tiny-random", recipe_from_dict(recipe), "cpu")


@pytest.mark.parametrize("fuse", [True, False])
def test_compensation_lora_sits_on_the_fused_distillation_lora_and_refuses_other_routing(base, tiny_lora_file,
                                                                                          tmp_path, fuse):
    """The second adapter (seed 000's SLA compensation LoRA) adds its own scale * B @ A on top of the fused
    distillation LoRA (float64 reference), passes the matched-module check, and a recipe that runs another routing or
    another distillation LoRA than the file states is refused before any weight loads."""
    from h3.levers.compensation_lora import COMPENSATES_KEY, ROUTING_KEYS, lora_tensors_sha256
    from h3.levers.lora import save_lora_file
    from h3.train.seeded_lora import tiny_lora_state_dict, write_tiny_lora
    from safetensors.torch import load_file

    transformer = base.runtime.pipe.transformer
    meta = {"format": "pt", "alpha": "2.0", ROUTING_KEYS["block_size"]: "32", ROUTING_KEYS["sparsity"]: "0.85",
            ROUTING_KEYS["dense_steps"]: "0", COMPENSATES_KEY: lora_tensors_sha256(tiny_lora_file)}
    comp = save_lora_file(tmp_path / "comp.safetensors", tiny_lora_state_dict(transformer, seed=77), meta)
    data = {**FAST_RECIPE, "lora": {"enabled": True, "path": str(tiny_lora_file), "fuse": True},
            "compensation_lora": {"enabled": True, "path": str(comp), "fuse": fuse},
            "sparse_attention": {"enabled": True, "block_size": 32, "sparsity": 0.85, "dense_steps": 0}}
    runtime = H3Runtime.load("tiny-random", recipe_from_dict(data), "cpu")
    telemetry = runtime.levers["compensation_lora"].telemetry()
    assert telemetry["matched_modules"] == telemetry["file_modules"] == 14 and telemetry["scaling"] == [0.5]
    name = "transformer_blocks.0.attn.to_v"
    weight = transformer.get_submodule(name).weight.double()
    for file in (tiny_lora_file, comp):
        state = load_file(str(file))
        a, b = (state[f"transformer.{name}.lora_{x}.weight"].double() for x in "AB")
        weight = weight + 0.5 * (b @ a)
    x = torch.randn(5, weight.shape[1], generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        actual = runtime.pipe.transformer.get_submodule(name)(x)
    assert_close(actual, x.double() @ weight.T, 1e-6, "distillation + compensation LoRA vs float64 W + both deltas")
    executed = Executed(forward_passes=0, attention_backends=[], torch_dtype="float32", vae_tiling=True)
    assert recipe_from_dict(data).compensation_lora.check_telemetry(telemetry, executed) == []
    assert "matched 13 of the 14" in " ".join(recipe_from_dict(data).compensation_lora.check_telemetry(
        {**telemetry, "matched_modules": 13}, executed))

    # The distillation LoRA is named by its metadata and tensors, not by its file's bytes: the same adapter with its
    # metadata written in another order is the same LoRA; one changed value is another (reference: the hash of the
    # sorted metadata and the tensors' bytes, computed here).
    import hashlib
    import json

    from safetensors.torch import save_file

    tensors = load_file(str(tiny_lora_file))
    save_file(tensors, str(tmp_path / "same.safetensors"), metadata={"format": "pt", "alpha": "2.0"})
    save_file(tensors, str(tmp_path / "same2.safetensors"), metadata={"alpha": "2.0", "format": "pt"})
    assert lora_tensors_sha256(tmp_path / "same.safetensors") == meta[COMPENSATES_KEY]
    assert lora_tensors_sha256(tmp_path / "same2.safetensors") == meta[COMPENSATES_KEY]
    digest = hashlib.sha256(json.dumps([["alpha", "2.0"], ["format", "pt"]]).encode())
    for key in sorted(tensors):
        digest.update(f"{key}|{tensors[key].dtype}|{list(tensors[key].shape)}|".encode())
        digest.update(tensors[key].numpy().tobytes())
    assert digest.hexdigest() == meta[COMPENSATES_KEY]
    tensors[next(iter(sorted(tensors)))][0, 0] += 1e-3
    save_file(tensors, str(tmp_path / "changed.safetensors"), metadata={"format": "pt", "alpha": "2.0"})
    assert lora_tensors_sha256(tmp_path / "changed.safetensors") != meta[COMPENSATES_KEY]
    other = write_tiny_lora(tmp_path / "other.safetensors", transformer, alpha=4.0)  # same tensors, another alpha
    refusals = [
        ({"sparse_attention": {**data["sparse_attention"], "sparsity": 0.5}},
         r"trained for sparse_attention.sparsity = 0.85, the recipe runs 0.5"),
        ({"sparse_attention": {**data["sparse_attention"], "dense_steps": 1}},
         r"trained for sparse_attention.dense_steps = 0, the recipe runs 1"),
        ({"sparse_attention": {"enabled": False}}, r"compensation_lora needs sparse_attention on"),
        ({"lora": {**data["lora"], "fuse": False}}, r"compensation_lora needs lora.fuse = true"),
        ({"lora": {**data["lora"], "path": str(other)}},
         r"was trained on the LoRA with sha256 " + meta[COMPENSATES_KEY][:16]),
    ]
    for change, match in refusals:
        with pytest.raises(LeverError, match=match):
            H3Runtime.load("tiny-random", recipe_from_dict({**data, **change}), "cpu")
    garbled = save_lora_file(tmp_path / "garbled.safetensors", tiny_lora_state_dict(transformer, seed=77),
                             {**meta, ROUTING_KEYS["sparsity"]: "eighty-five"})
    with pytest.raises(LeverError, match=r"states h3_sparse_sparsity = 'eighty-five', not a number"):
        H3Runtime.load("tiny-random", recipe_from_dict(
            {**data, "compensation_lora": {**data["compensation_lora"], "path": str(garbled)}}), "cpu")


# -- AdaLN precompute -----------------------------------------------------------------------------------------------

def adaln_pipe(base, transformer):
    pipe = base.runtime.pipe
    return SimpleNamespace(transformer=transformer, scheduler=pipe.scheduler, audio_scheduler=pipe.audio_scheduler,
                           keyframe_noise_aug=pipe.keyframe_noise_aug)


def test_adaln_precompute_is_bit_identical_and_cached(base, tmp_path):
    from h3.levers.adaln import AdalnConfig, apply_adaln_precompute

    transformer = fresh_transformer(base)
    expected_params = sum(p.numel() for b in transformer.transformer_blocks for p in b.adaln_proj.parameters())
    config = AdalnConfig(precompute=True)
    plan = dict(num_inference_steps=FAST_RECIPE["steps"] + 1, model_sha256="t" * 64, cache_dir=tmp_path)
    handle = apply_adaln_precompute(adaln_pipe(base, transformer), config, **plan)
    assert not any("adaln_proj.linear" in n for n, _ in transformer.named_parameters())
    for (v, a), (vb, ab) in zip(forward_all(transformer, base.calls), base.outputs):
        assert torch.equal(v, vb) and torch.equal(a, ab)
    telemetry = handle.telemetry()
    assert telemetry["params_dropped"] == expected_params
    assert telemetry["table_lookups"] == len(base.calls) == telemetry["schedule_steps"]
    assert telemetry["disk_cache"] == "miss"
    with pytest.raises(LeverError, match="already applied"):
        apply_adaln_precompute(adaln_pipe(base, transformer), config, **plan)
    handle.remove()
    again = apply_adaln_precompute(adaln_pipe(base, transformer), config, **plan)
    assert again.telemetry()["disk_cache"] == "hit"
    for (v, _), (vb, _) in zip(forward_all(transformer, base.calls), base.outputs):
        assert torch.equal(v, vb)
    off_schedule = dict(base.calls[1], timestep=base.calls[1]["timestep"] * 0.5)
    with pytest.raises(LeverError, match="not in the precomputed schedule"):
        transformer(**off_schedule)


# -- quantization ---------------------------------------------------------------------------------------------------

def _reference(linear, x, mode):
    """float64 simulation of the same quantization scheme, and the unquantized float64 result."""
    from h3.levers.quantization import FP8, FP8_MAX, INT8_MAX, quantize_per_channel, quantize_per_token

    w, x64 = linear.weight.double(), x.double()
    exact = x64 @ w.T + linear.bias.double()
    qdtype, qmax = (FP8, FP8_MAX) if mode == "fp8_w8a8" else (torch.int8, INT8_MAX)
    q, s = quantize_per_channel(linear.weight, qmax, qdtype)
    wq = q.double() * s.double()[:, None]
    if mode == "int8_weight_only":
        xq = x64
    else:
        qx, sx = quantize_per_token(x, qmax, qdtype)
        xq = qx.double() * sx.double()
    return xq @ wq.T + linear.bias.double(), exact


# Stated tolerances (relative max error vs float64 with unquantized weights); measured on this layer 6.6e-3 (INT8
# weight-only), 6.6e-3 (INT8 W8A8), 3.6e-2 (FP8 W8A8): bench/levers_cpu_tolerances/results/levers_cpu_tolerances.md.
QUANT_TOLERANCE = {"int8_weight_only": 0.01, "int8_w8a8": 0.02, "fp8_w8a8": 0.06}


@pytest.mark.parametrize("mode", ["int8_weight_only", "int8_w8a8", "fp8_w8a8"])
def test_quantized_linear_error(mode):
    from h3.levers.quantization import QuantizedLinear

    gen = torch.Generator().manual_seed(1)
    linear = torch.nn.Linear(64, 48)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(48, 64, generator=gen) / 8)
        linear.bias.copy_(torch.randn(48, generator=gen) / 8)
    x = torch.randn(3, 37, 64, generator=gen)
    with torch.no_grad():
        actual = QuantizedLinear(linear, mode)(x).reshape(-1, 48)
    simulated, exact = _reference(linear, x.reshape(-1, 64), mode)
    # The kernel computes exactly the quantized product (float32 accumulation / scaling rounding only).
    assert_close(actual, simulated, 2e-6, f"{mode} kernel vs float64 simulation of the same quantization")
    rel = assert_close(actual, exact, QUANT_TOLERANCE[mode], f"{mode} vs float64 unquantized")
    assert rel > 1e-5, "quantization had no effect at all"


def test_quantization_on_transformer_reports_what_ran(base):
    from h3.levers.quantization import QuantizationConfig, QuantizedLinear, apply_quantization

    transformer = fresh_transformer(base)
    linears = {n for n, m in transformer.named_modules() if isinstance(m, torch.nn.Linear)}
    handle = apply_quantization(transformer, QuantizationConfig(mode="int8_w8a8", exclude=load_recipe(
        "turbo4-int8").quant.exclude))
    quantized = {n for n, m in transformer.named_modules() if isinstance(m, QuantizedLinear)}
    excluded = {"proj_in", "audio_proj_in", "proj_out", "audio_proj_out", "norm_out.linear",
                "time_embedder.linear_1", "time_embedder.linear_2"}
    assert quantized == linears - excluded
    handle.begin_request()
    outputs = forward_all(transformer, base.calls)
    telemetry = handle.telemetry()
    assert telemetry["quantized_modules"] == len(quantized) and telemetry["excluded_modules"] == len(excluded)
    assert telemetry["quantized_linear_calls"] == len(quantized) * len(base.calls)
    for (v, _), (vb, _) in zip(outputs, base.outputs):
        assert_close(v, vb, 0.05, "int8 W8A8 transformer vs float32")
    with pytest.raises(LeverError, match="already applied"):
        apply_quantization(transformer, QuantizationConfig(mode="int8_w8a8", exclude=[]))


def test_fp8_and_sage_are_refused_on_the_cpu():
    for name, pattern in [("turbo4-fp8", "fp8_w8a8' needs a GPU"), ("turbo4-fp8-sage", "'sage' needs a CUDA GPU")]:
        recipe = load_recipe(name)
        with pytest.raises(LeverError, match=pattern):
            H3Runtime.load("tiny-random", recipe, "cpu")
    offload = load_recipe("offload-int8-adaln")
    with pytest.raises(LeverError, match="use_stream.*needs a CUDA GPU"):
        H3Runtime.load("tiny-random", offload, "cpu")


# -- attention: block-sparse and bucketing -------------------------------------------------------------------------

def _qkv(seq=150, heads=2, dim=16, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, seq, heads, dim, generator=gen, dtype=dtype) for _ in range(3)]


def _dense(q, k, v, mask=None):
    out = torch.nn.functional.scaled_dot_product_attention(*(x.permute(0, 2, 1, 3) for x in (q, k, v)),
                                                           attn_mask=mask)
    return out.permute(0, 2, 1, 3)


def test_block_sparse_at_sparsity_zero_is_dense():
    from h3.levers.sparse_attention import block_sparse_attention, route_blocks

    q, k, v = _qkv()
    kv_num, kv_idx = route_blocks(q, k, 32, 0.0)
    assert int(kv_num.min()) == kv_idx.shape[-1] == 5
    assert_close(block_sparse_attention(q, k, v, kv_num, kv_idx, 32), _dense(q, k, v), 1e-12, "sparsity 0 vs dense")


def test_block_sparse_routing_and_values_match_a_reference():
    from h3.levers.sparse_attention import block_sparse_attention, kept_block_mask, route_blocks

    q, k, v = _qkv(seq=150)
    block, sparsity, valid = 32, 0.5, 140
    kv_num, kv_idx = route_blocks(q, k, block, sparsity, valid_len=valid)
    kept = kept_block_mask(kv_num, kv_idx)[0]  # (H, nQ, nK)
    # Slow reference routing: mean-pool the valid rows of each block, keep the ceil(0.5 * 5) = 3 best key blocks.
    n = 5
    for h in range(2):
        pooled = lambda x: torch.stack([x[0, i * block:min((i + 1) * block, valid), h].mean(0) for i in range(n)])
        scores = pooled(q) @ pooled(k).T
        for i in range(n):
            best = set(torch.topk(scores[i], 3).indices.tolist())
            assert {j for j in range(n) if kept[h, i, j]} == best
    token_mask = kept.repeat_interleave(block, 1).repeat_interleave(block, 2)[:, :150, :150]
    token_mask = token_mask & (torch.arange(150) < valid)
    expected = _dense(q, k, v, token_mask[None])
    actual = block_sparse_attention(q, k, v, kv_num, kv_idx, block, valid_len=valid)
    assert_close(actual, expected, 1e-12, "block-sparse vs dense attention under the same block mask")


def test_sparse_lever_on_transformer(base):
    from h3.levers.sparse_attention import SparseAttentionConfig, apply_sparse_attention

    transformer = fresh_transformer(base)
    handle = apply_sparse_attention(transformer, SparseAttentionConfig(block_size=64, sparsity=0.0, dense_steps=1))
    outputs = forward_all(transformer, base.calls)
    telemetry = handle.telemetry()
    assert telemetry["dense_calls"] == 2 and telemetry["sparse_calls"] == 2  # 2 blocks x (1 dense + 1 sparse step)
    assert (telemetry["dense_forwards"], telemetry["sparse_forwards"]) == (1, 1)
    assert telemetry["realized_sparsity"] == 0.0
    # The attention call runs outside the compiled graphs, so the per-call counters hold under torch.compile too.
    assert_counters_hold_under_compile(handle, transformer, base.calls, outputs)
    assert torch.equal(outputs[0][0], base.outputs[0][0])  # the dense first step is the baseline's computation
    assert_close(outputs[1][0], base.outputs[1][0], 1e-5, "sparsity-0 flex vs SDPA, whole transformer")
    handle.remove()
    handle = apply_sparse_attention(transformer, SparseAttentionConfig(block_size=64, sparsity=0.7, dense_steps=0))
    forward_all(transformer, base.calls[:1])
    blocks = -(-base.calls[0]["position_ids"].shape[0] // 64)
    assert handle.telemetry()["realized_sparsity"] == pytest.approx(1 - math.ceil(round(0.3 * blocks, 9)) / blocks)


def test_padding_contributes_exactly_zero(base):
    from h3.levers.bucketing import BucketingConfig, apply_bucketing

    results = {}
    for pad in (0, 7):
        transformer = fresh_transformer(base)
        handle = apply_bucketing(transformer, BucketingConfig(multiple=64), pad_position=pad, pad_tag=pad % 3)
        results[pad] = forward_all(transformer, base.calls)
        telemetry = handle.telemetry()
        seq = base.calls[0]["position_ids"].shape[0]
        bucket = -(-seq // 64) * 64
        assert bucket > seq, "the test needs a prompt whose sequence is not already a multiple of 64"
        assert telemetry["buckets"] == [bucket] and telemetry["valid_lengths"] == [seq]
        assert telemetry["padded_rows"] == (bucket - seq) * len(base.calls)
    for (v0, a0), (v7, a7), (vb, ab) in zip(results[0], results[7], base.outputs):
        # Different padding content, same bucket: bit-identical outputs, so the padding contributes exactly zero.
        assert torch.equal(v0, v7) and torch.equal(a0, a7)
        assert_close(v0, vb, 1e-5, "bucketed vs unpadded (more rows change SDPA's summation blocking)")


def test_attend_valid_rows_leaves_the_padding_out():
    from h3.levers.bucketing import PaddingState, attend_valid_rows

    q, k, v = _qkv(seq=64)
    state = PaddingState(valid_len=50, padded_len=64)
    out = attend_valid_rows(q, k, v, state)
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    q2[:, 50:], k2[:, 50:], v2[:, 50:] = 1e4, 1e4, -1e4
    assert torch.equal(attend_valid_rows(q2, k2, v2, state), out)  # padding content never reaches a real row
    assert out.shape == q.shape and not out[:, 50:].any()  # padding rows of the output are zero
    assert_close(out[:, :50], _dense(q[:, :50], k[:, :50], v[:, :50]), 1e-12, "real rows vs truncated")
    key_mask = (torch.arange(64) < 50).view(1, 1, 1, 64)
    assert_close(out[:, :50], _dense(q, k, v, key_mask)[:, :50], 1e-12, "real rows vs key-padding mask")
    # No padding (no state, or a sequence that is not the bucketed one): plain attention over every row.
    assert_close(attend_valid_rows(q, k, v, None), _dense(q, k, v), 1e-12, "no padding")
    assert_close(attend_valid_rows(q, k, v, PaddingState(50, 96)), _dense(q, k, v), 1e-12, "another length")


def test_bucketing_hands_any_backend_the_real_rows_and_no_mask(base):
    """Bucketing no longer needs a masking backend (a key-padding mask keeps SDPA off flash; Sage takes none): the
    dispatcher gets the real rows only and no mask, through whichever backend the recipe set."""
    from h3.anatomy import observe_attention_dispatch
    from h3.levers import preflight
    from h3.levers.attention_backend import AttentionBackendConfig, apply_attention_backend
    from h3.levers.bucketing import BucketingConfig, apply_bucketing

    preflight(recipe_from_dict({**FAST_RECIPE, "attention": {"backend": "sage"}, "bucketing": {"enabled": True}}),
              "cuda")  # accepted
    transformer = fresh_transformer(base)
    backend = apply_attention_backend(transformer, AttentionBackendConfig(backend="_native_math"))
    apply_bucketing(transformer, BucketingConfig(multiple=64))
    seen = []
    probe = observe_attention_dispatch(lambda name, kw: seen.append((name, kw["query"].shape[1], kw.get("attn_mask"))))
    try:
        outputs = forward_all(transformer, base.calls[:1])
    finally:
        probe.remove()
    seq = base.calls[0]["position_ids"].shape[0]
    assert seq % 64, "the test needs a prompt whose sequence is not already a multiple of 64"
    bucket = -(-seq // 64) * 64
    # Every DiT block hands over the real rows, unmasked (the text refiner's own short calls are not bucketed).
    assert seen.count(("_native_math", seq, None)) == len(transformer.transformer_blocks)
    assert all(name == "_native_math" and mask is None and rows != bucket for name, rows, mask in seen), seen
    assert_close(outputs[0][0], base.outputs[0][0], 1e-5, "bucketed _native_math vs unpadded native")
    backend.remove()


# -- step caches ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("threshold, cached", [(0.0, 0), (1e9, 1)])
def test_first_block_cache(base, threshold, cached):
    from h3.levers.step_cache import StepCacheConfig, apply_step_cache

    transformer = fresh_transformer(base)
    handle = apply_step_cache(transformer, StepCacheConfig(kind="fbc", threshold=threshold))
    handle.begin_request()
    outputs = forward_all(transformer, base.calls)
    telemetry = handle.telemetry()
    assert (telemetry["forwards"], telemetry["cached_steps"]) == (2, cached)
    assert torch.equal(outputs[0][0], base.outputs[0][0])  # the first step always computes
    assert torch.equal(outputs[1][0], base.outputs[1][0]) == (cached == 0)
    handle.begin_request()  # a new request resets the cache: its first step computes again
    forward_all(transformer, base.calls[:1])
    assert handle.telemetry()["cached_steps"] == 0


def test_taylorseer_and_magcache(base):
    from h3.levers.step_cache import StepCacheConfig, apply_step_cache

    transformer = fresh_transformer(base)
    calls = base.calls + [base.calls[1]] * 2  # four steps
    handle = apply_step_cache(transformer, StepCacheConfig(kind="taylorseer", cache_interval=2,
                                                           disable_cache_before_step=1, max_order=1))
    handle.begin_request()
    forward_all(transformer, calls)
    # diffusers' rule: a step computes in the warm-up or when (step - disable_cache_before_step - 1) % interval == 0.
    computed = sum(1 for s in range(4) if s < 1 or (s - 1 - 1) % 2 == 0)
    t = handle.telemetry()
    assert (t["forwards"], t["computed_steps"], t["cached_steps"]) == (4, computed, 4 - computed) == (4, 2, 2)
    with pytest.raises(LeverError, match="mag_ratios"):
        apply_step_cache(fresh_transformer(base), StepCacheConfig(kind="mag"))
    transformer = fresh_transformer(base)
    handle = apply_step_cache(transformer, StepCacheConfig(kind="mag", calibrate=True), num_inference_steps=2)
    handle.begin_request()
    outputs = forward_all(transformer, base.calls)
    assert handle.telemetry()["cached_steps"] == 0  # calibration never skips
    assert all(torch.equal(o[0], b[0]) for o, b in zip(outputs, base.outputs))


def _magcache_reference(ratios, threshold, max_skip, retention_ratio):
    """The documented MagCache rule (diffusers.hooks.mag_cache), replayed step by step in plain Python: a step at or
    after the retention steps is skipped while the accumulated error of the magnitude ratios stays under the
    threshold and at most ``max_skip`` steps in a row are skipped."""
    n = len(ratios)
    retention = int(retention_ratio * n + 0.5)
    computed, acc_ratio, acc_err, acc_steps = [], 1.0, 0.0, 0
    for step, ratio in enumerate(ratios):
        compute = True
        if step >= retention:
            acc_ratio *= ratio
            acc_steps += 1
            acc_err += abs(1.0 - acc_ratio)
            if step > 0 and acc_err <= threshold and acc_steps <= max_skip:
                compute = False
            else:
                acc_ratio, acc_err, acc_steps = 1.0, 0.0, 0
        computed.append(compute)
    return computed


def test_magcache_skips_steps_by_its_rule(base):
    """MagCache with a checkpoint's ratios (not calibration): the steps it skips are the ones its rule picks, a
    skipped step reuses the previous residual (so its output differs from computing it), and telemetry counts both."""
    from h3.levers.step_cache import StepCacheConfig, apply_step_cache

    ratios = [1.0, 1.0, 0.99, 1.0, 0.97, 1.0]
    calls = [base.calls[0]] + [base.calls[1]] * 5
    expected = _magcache_reference(ratios, threshold=0.05, max_skip=2, retention_ratio=0.2)
    assert expected == [True, False, False, True, False, True]  # the rule, worked by hand for these ratios
    transformer = fresh_transformer(base)
    plain = forward_all(fresh_transformer(base), calls)
    handle = apply_step_cache(transformer, StepCacheConfig(kind="mag", mag_ratios=ratios, threshold=0.05,
                                                           max_skip_steps=2, retention_ratio=0.2),
                              num_inference_steps=len(ratios))
    handle.begin_request()
    outputs = forward_all(transformer, calls)
    t = handle.telemetry()
    assert (t["forwards"], t["computed_steps"], t["cached_steps"]) == (6, sum(expected), 6 - sum(expected))
    assert torch.equal(outputs[0][0], plain[0][0])  # step 0 always computes
    assert not torch.equal(outputs[1][0], plain[1][0])  # step 1 was skipped: previous residual, not a new forward


# -- compile, offload, VAE ---------------------------------------------------------------------------------------------

def test_compile_dit_blocks_counts_graphs(base):
    from h3.levers.compile import CompileConfig, apply_compile

    torch._dynamo.reset()
    transformer = fresh_transformer(base)
    handle = apply_compile(transformer, CompileConfig(backend="eager"))
    # The 2 DiT blocks; not the token refiner's block, which sees the prompt's text rows alone.
    assert handle.telemetry()["compiled_regions"] == len(transformer.transformer_blocks) == 2
    refiner = transformer.token_refiner.refiner_blocks[0]
    assert getattr(refiner, "_compiled_call_impl", None) is None
    assert all(b._compiled_call_impl is not None for b in transformer.transformer_blocks)
    handle.begin_request()
    outputs = forward_all(transformer, base.calls)
    first = handle.telemetry()
    assert first["graphs_compiled_this_request"] >= 1
    for (v, _), (vb, _) in zip(outputs, base.outputs):
        assert_close(v, vb, 1e-6, "compiled (eager backend) vs eager")
    handle.begin_request()
    forward_all(transformer, base.calls)
    assert handle.telemetry()["graphs_compiled_this_request"] == 0  # same shapes: no new graph
    torch._dynamo.reset()


def test_offload_without_streams_on_cpu(base):
    from h3.levers.offload import OffloadConfig, apply_offload

    transformer = fresh_transformer(base)
    pipe = SimpleNamespace(transformer=transformer, text_encoder=None)
    with pytest.raises(LeverError, match="needs a CUDA GPU"):
        apply_offload(pipe, OffloadConfig(use_stream=True), onload_device="cpu")
    handle = apply_offload(pipe, OffloadConfig(use_stream=False), onload_device="cpu")
    outputs = forward_all(transformer, base.calls)
    telemetry = handle.telemetry()
    assert telemetry["groups"]["transformer"] >= len(transformer.transformer_blocks)
    assert telemetry["group_onloads"] >= telemetry["groups"]["transformer"] * len(base.calls)
    for (v, _), (vb, _) in zip(outputs, base.outputs):
        assert torch.equal(v, vb)


def test_vae_tile_per_resolution(base):
    from h3.levers.vae import VaeConfig, apply_vae

    vae = base.runtime.pipe.vae
    z = torch.randn(1, 24, 5, 6, 6, generator=torch.Generator().manual_seed(0))  # 17 frames of 96x96
    pipe = SimpleNamespace(vae=copy.deepcopy(vae), audio_vae=None)
    vae_ref = copy.deepcopy(vae)
    vae_ref.enable_tiling(tile_sample_min_height=80, tile_sample_min_width=80)
    handle = apply_vae(pipe, VaeConfig(tiles={"96x96": [80, 80]}))
    with torch.no_grad():
        out = pipe.vae.decode(z).sample
        ref = vae_ref.decode(z).sample
        default = vae.decode(z).sample
    assert handle.telemetry()["tiles_used"] == [[80, 80]]
    assert torch.equal(out, ref)
    # After the decode the VAE is back at the default tile, so that the record's vae_tile (read from the VAE after
    # the request) is what the recipe configures and the configured-versus-executed check passes.
    default_tile = [vae.tile_sample_min_height, vae.tile_sample_min_width]
    assert [pipe.vae.tile_sample_min_height, pipe.vae.tile_sample_min_width] == default_tile != [80, 80]
    config = VaeConfig(tiles={"96x96": [80, 80]}, tile_height=default_tile[0], tile_width=default_tile[1])
    executed = Executed(forward_passes=1, attention_backends=[], torch_dtype="float32", vae_tiling=True,
                        vae_tile=[pipe.vae.tile_sample_min_height, pipe.vae.tile_sample_min_width])
    assert config.check_executed(handle.telemetry(), executed) == []
    executed.vae_tile = [80, 80]  # what the record said before the tile was restored: still refused
    assert config.check_executed(handle.telemetry(), executed) == [
        f"vae tile: recipe asks for {default_tile}, executed [80, 80]"]
    assert_close(out, default, 1e-4, "80 px tiles vs one 256 px tile (the tiny decoder is local: tiling is near-exact)")
    with torch.no_grad():
        pipe.vae.decode(z[..., :4, :4])  # 64x64: not configured, so the recipe's default tile
    assert handle.telemetry()["tiles_used"][-1] == [vae.tile_sample_min_height, vae.tile_sample_min_width]


def test_vae_decoder_quantized_and_compiled_counts_every_call_and_restores():
    """``[vae_decoder]`` on the trained tiny's video VAE (the random preset's decoder blocks are zero-scaled: they add
    nothing to quantize): the ViT decoder's block linears INT8 W8A8 and its blocks compiled (dynamo's eager backend
    here; inductor on the GPU). The decode stays within INT8's reach of the float decoder (relative max error under
    0.05, above 1e-4: it did quantize), each quantized linear runs once per decoder call (a tile), every block is a
    compiled region, the executed check passes and refuses a bypassed module; removing the lever restores the float
    decode bit for bit."""
    from diffusers import AutoencoderKLMiniMaxH3

    from h3.levers.vae_decoder import VaeDecoderConfig, apply_vae_decoder, decoder_blocks
    from h3.tiny_trained import TRAINED_DIR

    vae = AutoencoderKLMiniMaxH3.from_pretrained(TRAINED_DIR / "vae").eval()
    vae.enable_tiling(tile_sample_min_height=64, tile_sample_min_width=64, tile_sample_min_overlap_height=32,
                      tile_sample_min_overlap_width=32)
    z = torch.randn(1, vae.config.latent_channels, 5, 6, 6, generator=torch.Generator().manual_seed(0))  # 96x96
    with torch.no_grad():
        ref = vae.decode(z).sample
    config = VaeDecoderConfig(compile=True, backend="eager", quant="int8_w8a8")
    handle = apply_vae_decoder(vae, config)
    try:
        handle.begin_request()
        with torch.no_grad():
            out = vae.decode(z).sample
        telemetry = handle.telemetry()
    finally:
        torch._dynamo.reset()
    blocks = len(decoder_blocks(vae.decoder))
    rel = assert_close(out, ref, 0.05, "INT8 W8A8 decoder vs float")
    assert rel > 1e-4
    reference = AutoencoderKLMiniMaxH3.from_pretrained(TRAINED_DIR / "vae")
    linears = sum(isinstance(m, torch.nn.Linear) for b in decoder_blocks(reference.decoder) for m in b.modules())
    assert telemetry["decoder_calls"] >= 2  # 96x96 in 64 px tiles
    assert telemetry["compiled_regions"] == telemetry["decoder_blocks"] == blocks >= 1
    assert telemetry["quantized_modules"] == linears
    assert telemetry["quantized_linear_calls"] == linears * telemetry["decoder_calls"]
    executed = Executed(forward_passes=1, attention_backends=[], torch_dtype="float32", vae_tiling=True,
                        vae_tile=[64, 64])
    assert config.check_executed(telemetry, executed) == []
    bypassed = {**telemetry, "quantized_linear_calls": telemetry["quantized_linear_calls"] - 1}
    assert any("quantized-linear calls" in p for p in config.check_executed(bypassed, executed))
    assert any("blocks compiled" in p for p in config.check_executed({**telemetry, "compiled_regions": 0}, executed))
    assert any("decoded no video" in p for p in config.check_executed(
        {**telemetry, "decoder_calls": 0, "quantized_linear_calls": 0}, executed))
    handle.remove()
    with torch.no_grad():
        assert torch.equal(vae.decode(z).sample, ref)
    assert not any(isinstance(m, torch.nn.Module) and type(m).__name__ == "QuantizedLinear" for m in vae.modules())


def test_vae_decoder_off_keeps_recipe_hashes_and_refuses_fp8_on_the_cpu():
    """An off ``[vae_decoder]`` section is omitted from the recipe (every shipped recipe's hash is what it was), an on
    one is part of it; FP8 in the decoder is refused on the CPU before anything loads, and an exclude pattern that is
    not a regular expression when the recipe loads."""
    from h3.levers.vae_decoder import VaeDecoderConfig

    recipe = load_recipe("baseline")
    on = recipe_from_dict({**recipe.model_dump(), "vae_decoder": {"compile": True}})
    assert "vae_decoder" not in recipe.resolved() and on.resolved()["vae_decoder"]["compile"] is True
    assert recipe.sha256() != on.sha256()
    assert recipe_from_dict(recipe.model_dump()).sha256() == recipe.sha256()
    assert VaeDecoderConfig(quant="fp8_w8a8").device_problems("cpu")
    assert VaeDecoderConfig(quant="int8_w8a8").device_problems("cpu") == []
    with pytest.raises(ValueError, match="'\\(' is not a regular expression"):
        VaeDecoderConfig(exclude=["("])


# -- end to end: telemetry in the clip record ---------------------------------------------------------------------------

def test_tinydemo_recipe_reports_what_ran(tmp_path):
    recipe = load_recipe("turbo4-tinydemo").model_dump()
    recipe["steps"] = 2
    runtime = H3Runtime.load("tiny-random", recipe_from_dict(recipe), "cpu")
    record = runtime.generate(GenerateRequest(prompt="A person is squat", seed=3), tmp_path / "clip.mp4")
    levers = record.executed.levers
    assert [n for n in LEVERS if levers[n]["applied"]] == ["lora", "adaln", "quant", "bucketing", "sparse_attention"]
    assert levers["lora"]["matched_modules"] == 14 and levers["lora"]["scaling"] == [0.5]
    # adaln_proj's LoRA is baked into the tables: 12 LoRA layers x 2 steps ran.
    assert levers["lora"]["lora_layer_calls"] == 12 * 2
    assert levers["adaln"]["table_lookups"] == 2 == record.executed.forward_passes
    assert levers["bucketing"]["bucketed_forwards"] == 2
    assert levers["bucketing"]["buckets"] == [-(-record.shape.sequence_length // 64) * 64]
    assert (levers["sparse_attention"]["dense_calls"], levers["sparse_attention"]["sparse_calls"]) == (2, 2)
    assert levers["quant"]["quantized_linear_calls"] == levers["quant"]["quantized_modules"] * 2
    assert levers["attention"]["dispatched"] == ["native"]
    # Every lever's telemetry shows its configuration (h3eval.executed): the deep checks pass on a correct run.
    from h3eval.executed import check_executed

    assert check_executed(recipe_from_dict(recipe), record) == []


# -- GPU ------------------------------------------------------------------------------------------------------------

def _rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).norm() / b.norm())


def check_bf16_quantized_layer(mode: str, device: str, make_layer=None) -> None:
    """A QuantizedLinear in bfloat16 on ``device`` against float64: within the stated tolerance of the unquantized
    result, and nearer to the float64 simulation of the *quantized* math (the same codes, from the bf16-rounded
    inputs) than to the unquantized result, so a layer that silently computes in floating point (quantization that
    had no effect) fails. Measured on the CPU in bf16: 0.3 % vs 0.76 % (INT8 weight-only), 0.23 % vs 1.0 % (INT8
    W8A8), 0.24 % vs 3.7 % (FP8); a float linear: 0.72 % vs 0.17 %."""
    from h3.levers.quantization import QuantizedLinear

    gen = torch.Generator().manual_seed(1)
    linear = torch.nn.Linear(256, 512)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(512, 256, generator=gen) / 16)
    x = torch.randn(300, 256, generator=gen)
    bf16 = linear.bfloat16()
    rounded = torch.nn.Linear(256, 512)
    rounded.load_state_dict({k: v.float() for k, v in bf16.state_dict().items()})
    simulated, exact = _reference(rounded, x.bfloat16().float(), mode)
    layer = (make_layer or QuantizedLinear)(bf16.to(device), mode)
    with torch.no_grad():
        actual = layer(x.to(device).bfloat16()).float().cpu()
    assert_close(actual, exact, QUANT_TOLERANCE[mode] + 0.02, f"{mode} on {device} (bf16) vs float64 unquantized")
    to_quantized, to_float = _rel_l2(actual, simulated), _rel_l2(actual, exact)
    assert to_quantized < to_float, (
        f"{mode} on {device}: output is nearer the unquantized math ({to_float:.2e}) than the quantized one "
        f"({to_quantized:.2e}): the quantization had no effect")


@pytest.mark.parametrize("mode", ["int8_weight_only", "int8_w8a8", "fp8_w8a8"])
def test_bf16_quantized_layer_follows_the_quantized_math(mode):
    """The GPU test's check on the CPU (same kernels' CPU versions), and its "no effect" guard catching a planted
    no-op: a layer that keeps the float weights and computes the plain linear."""
    check_bf16_quantized_layer(mode, "cpu")

    class NoOp(torch.nn.Module):
        def __init__(self, linear, mode):
            super().__init__()
            self.linear = linear

        def forward(self, x):
            return self.linear(x)

    with pytest.raises(AssertionError, match="the quantization had no effect"):
        check_bf16_quantized_layer(mode, "cpu", make_layer=NoOp)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("mode", ["int8_weight_only", "int8_w8a8", "fp8_w8a8"])
def test_quantized_linear_error_on_gpu(mode):
    if mode == "fp8_w8a8" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 needs compute capability 8.9+")
    check_bf16_quantized_layer(mode, "cuda")


@pytest.mark.gpu
@cuda
def test_offload_with_streams_on_gpu(base):
    from h3.levers.offload import OffloadConfig, apply_offload

    transformer = fresh_transformer(base)
    handle = apply_offload(SimpleNamespace(transformer=transformer, text_encoder=None),
                           OffloadConfig(use_stream=True), onload_device="cuda")
    calls = [{k: (v.cuda() if torch.is_tensor(v) else v) for k, v in c.items()} for c in base.calls]
    outputs = forward_all(transformer, calls)
    assert handle.telemetry()["pinned_memory"] is True
    for (v, _), (vb, _) in zip(outputs, base.outputs):
        assert_close(v.cpu(), vb, 1e-4, "offloaded GPU vs CPU")


def _dit_calls(model, rows: int) -> list[dict]:
    """Two DiT calls (two noise levels) on a packed sequence of ``rows`` rows: text, stereo audio, video."""
    from bench.lib.speed import dit_inputs

    geo = {"text_rows": 64, "audio_rows": 64, "video_rows": rows - 128}
    first = dit_inputs(geo, model.config, device="cpu", dtype=torch.float32)
    second = {**first, "timestep": torch.tensor([0.9, 0.7])}
    return [first, second]


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("backend,rel_l2_max", [("_native_cudnn", 0.01), ("sage", 0.05)])
def test_attention_backend_lever_runs_and_reports_on_gpu(backend, rel_l2_max):
    """A MiniMax-H3 DiT with 128-wide heads (the full model's; Sage's kernels take 64 or 128) on the GPU in bf16: the
    lever's backend is the one the dispatcher called, and the output is within the backend's error of the float64
    forward (Sage quantizes Q/K to INT8 and P/V to FP8, so its bound is looser; it must not be bit-identical to native
    SDPA either, which would mean it never ran)."""
    from diffusers import MiniMaxH3Transformer3DModel

    from h3.anatomy import observe_attention_dispatch
    from h3.levers.attention_backend import AttentionBackendConfig, apply_attention_backend
    from h3.tiny import TRANSFORMER_CONFIG

    if backend == "sage":
        pytest.importorskip("sageattention", reason="needs the sageattention package built for this GPU")
    torch.manual_seed(0)
    config = {**TRANSFORMER_CONFIG, "num_attention_heads": 2, "attention_head_dim": 128, "hidden_size": 256,
              "ffn_dim": 512}
    model = MiniMaxH3Transformer3DModel(**config).eval()
    calls = [{k: (v.cuda() if torch.is_tensor(v) else v) for k, v in c.items()} for c in _dit_calls(model, rows=640)]
    exact = forward_all(copy.deepcopy(model).double().cuda(), [
        {k: (v.double() if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in c.items()} for c in calls])
    model = model.cuda().bfloat16()
    native = forward_all(model, calls)
    handle = apply_attention_backend(model, AttentionBackendConfig(backend=backend))
    seen = []
    probe = observe_attention_dispatch(lambda name, kw: seen.append(name))
    try:
        outputs = forward_all(model, calls)
    finally:
        probe.remove()
    assert set(seen) == {backend} and handle.telemetry() == {"applied": True, "backend": backend}
    for (v, _), (vn, _), (ve, _) in zip(outputs, native, exact):
        err = ((v.double() - ve).norm() / ve.norm()).item()
        assert err <= rel_l2_max, f"{backend}: rel L2 {err:.3g} vs float64"
        if backend == "sage":
            assert not torch.equal(v, vn)
    handle.remove()
    seen.clear()
    probe = observe_attention_dispatch(lambda name, kw: seen.append(name))
    try:
        forward_all(model, calls[:1])
    finally:
        probe.remove()
    assert set(seen) == {"native"}


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_compiled_blocks_do_not_recompile_under_the_dispatch_probe(base, backend):
    """The runtime observes every attention call (executed.attention_backends). Inside a compiled block the probe
    must not be traced: dynamo would guard on the observer's growing list and recompile at every forward (on the H200
    this pushed compiled recipes past the recompile limit, back to eager). Four forwards: graphs only at the first,
    no recompiles, every call still observed, outputs equal to the uncompiled ones."""
    from h3.anatomy import observe_attention_dispatch
    from h3.levers.compile import CompileConfig, apply_compile

    transformer = fresh_transformer(base)
    call = base.calls[0]
    with torch.no_grad():
        expected = transformer(**call)
    handle = apply_compile(transformer, CompileConfig(backend=backend))
    seen: list[str] = []
    probe = observe_attention_dispatch(lambda name, kw: seen.append(name))
    graphs = []
    try:
        with torch.no_grad():
            for _ in range(4):
                out = transformer(**call)
                graphs.append(handle.telemetry()["graphs_compiled_total"])
    finally:
        probe.remove()
    telemetry = handle.telemetry()
    handle.remove()
    torch._dynamo.reset()
    layers = len(transformer.transformer_blocks) + len(getattr(transformer, "refiner_blocks", None) or [])
    assert graphs[0] > 0 and graphs == [graphs[0]] * 4, graphs
    assert telemetry["recompiles_total"] == 0
    assert seen == ["native"] * (4 * (len(seen) // 4)) and len(seen) >= 4 * len(transformer.transformer_blocks)
    torch.testing.assert_close(out[0], expected[0], rtol=1e-4, atol=1e-5)


def test_attention_backend_stays_on_its_transformer(base):
    """diffusers' set_attention_backend also switches the process-wide default backend, and its reset does not switch
    it back: the baseline runtime beside a candidate in one A/B process would silently run the candidate's attention.
    The lever keeps the backend on its own transformer, and removing it leaves nothing behind."""
    from h3.anatomy import observe_attention_dispatch
    from h3.levers.attention_backend import AttentionBackendConfig, apply_attention_backend

    candidate, baseline = fresh_transformer(base), fresh_transformer(base)
    handle = apply_attention_backend(candidate, AttentionBackendConfig(backend="_native_math"))
    seen: list[str] = []
    probe = observe_attention_dispatch(lambda name, kw: seen.append(name))
    try:
        forward_all(candidate, base.calls[:1])
        on_candidate, seen[:] = set(seen), []
        forward_all(baseline, base.calls[:1])
        on_baseline, seen[:] = set(seen), []
        handle.remove()
        forward_all(candidate, base.calls[:1])
        after_remove = set(seen)
    finally:
        probe.remove()
    assert (on_candidate, on_baseline, after_remove) == ({"_native_math"}, {"native"}, {"native"})


def test_quantization_remove_restores_float_weights_on_their_device(base):
    from h3.levers.quantization import QuantizationConfig, apply_quantization

    transformer = fresh_transformer(base)
    before = {n: (p.device, p.dtype, p.clone()) for n, p in transformer.named_parameters()}
    handle = apply_quantization(transformer, QuantizationConfig(mode="int8_weight_only", exclude=[]),
                                keep_originals=True)
    handle.remove()
    after = dict(transformer.named_parameters())
    assert set(after) == set(before)
    for name, (device, dtype, value) in before.items():
        assert (after[name].device, after[name].dtype) == (device, dtype) and torch.equal(after[name], value), name


def test_compile_dynamic_shares_one_graph_across_prompt_lengths(base):
    """Seed 001: a kernel compiled per exact token count cost 12-14 s at every new prompt length (the H200 protocol
    measured mixed-prompt p50 at 2x repeated with static shapes). With ``dynamic=True`` the blocks compile once for
    every length: graphs only at the first length, no recompile after, outputs equal to eager at each length."""
    from bench.lib.speed import dit_inputs
    from h3.levers.compile import CompileConfig, apply_compile

    transformer = fresh_transformer(base)
    calls = [dit_inputs({"text_rows": text, "audio_rows": 64, "video_rows": 256}, transformer.config, device="cpu",
                        dtype=torch.float32) for text in (17, 29, 59)]
    expected = forward_all(transformer, calls)
    torch._dynamo.reset()
    handle = apply_compile(transformer, CompileConfig(backend="eager", dynamic=True))
    graphs = []
    try:
        with torch.no_grad():
            outputs = []
            for call in calls:
                handle.begin_request()
                outputs.append(transformer(**call))
                graphs.append(handle.telemetry()["graphs_compiled_this_request"])
        telemetry = handle.telemetry()
    finally:
        handle.remove()
        torch._dynamo.reset()
    assert graphs[0] > 0 and graphs[1:] == [0, 0], graphs
    assert telemetry["recompiles_total"] == 0
    for (v, a), (ve, ae) in zip(outputs, expected):
        torch.testing.assert_close(v, ve, rtol=1e-5, atol=1e-6)


def test_bucketed_sparse_recipe_compiles_once_per_bucket(base, monkeypatch):
    """The block-sparse recipe under static-shape compile, three prompt lengths in one 128-row bucket, two forwards
    each (the dense first step, then a sparse one): the blocks compile at the first length only, and so does the
    separately compiled flex kernel (here compiled with dynamo's eager backend on the CPU, as inductor compiles it on
    CUDA). Before, the blocks read the real length and the kernel's mask closed over it: one new graph per length.
    Outputs equal the uncompiled levers' at every length."""
    from bench.lib.speed import dit_inputs
    from h3.levers import sparse_attention as sparse
    from h3.levers.bucketing import BucketingConfig, apply_bucketing
    from h3.levers.compile import CompileConfig, apply_compile

    # The flex kernel compiled on the CPU too, with dynamo's eager backend; its graphs counted as on CUDA.
    monkeypatch.setattr(sparse, "FLEX_COMPILED_ON", ("cuda", "cpu"))
    monkeypatch.setattr(sparse, "FLEX_BACKEND", "eager")
    monkeypatch.setattr(sparse, "_FLEX", None)
    transformer = fresh_transformer(base)
    calls = [dit_inputs({"text_rows": text, "audio_rows": 64, "video_rows": 256}, transformer.config, device="cpu",
                        dtype=torch.float32) for text in (17, 29, 59)]  # 337, 349 and 379 rows: one 384-row bucket
    bucketing = apply_bucketing(transformer, BucketingConfig(multiple=128))
    handle = sparse.apply_sparse_attention(transformer, sparse.SparseAttentionConfig(block_size=128, sparsity=0.5,
                                                                                     dense_steps=1))
    expected = []
    for call in calls:
        handle.begin_request()
        expected.append(forward_all(transformer, [call, call]))
    torch._dynamo.reset()
    monkeypatch.setattr(sparse, "_FLEX", None)
    compiled = apply_compile(transformer, CompileConfig(backend="eager"))
    graphs, flex = [], []
    try:
        outputs = []
        for call in calls:
            handle.begin_request()
            compiled.begin_request()
            outputs.append(forward_all(transformer, [call, call]))
            graphs.append(compiled.telemetry()["graphs_compiled_this_request"])
            flex.append(handle.telemetry()["flex_graphs_compiled_this_request"])
        telemetry = compiled.telemetry()
    finally:
        compiled.remove()
        torch._dynamo.reset()
    assert bucketing.telemetry()["buckets"] == [384]
    assert graphs[0] > 0 and graphs[1:] == [0, 0], graphs
    assert flex == [1, 0, 0] and handle.telemetry()["flex_graphs_compiled_total"] == 1, flex
    assert telemetry["recompiles_total"] == 0
    assert (handle.telemetry()["dense_calls"], handle.telemetry()["sparse_calls"]) == (2, 2)
    for got, want in zip(outputs, expected):
        for (v, a), (ve, ae) in zip(got, want):
            torch.testing.assert_close(v, ve, rtol=1e-5, atol=1e-6)


def test_offload_releases_buffers_diffusers_keeps_on_the_device():
    """diffusers' stream offload swaps parameters back to their pinned copies but not module buffers, where the
    quantization lever keeps its weights: the lever puts them back (here the 'device copy' is a second CPU tensor,
    what matters is which storage the buffer points at afterwards)."""
    from h3.levers.offload import release_module_buffers
    from h3.levers.quantization import QuantizedLinear

    layer = QuantizedLinear(torch.nn.Linear(32, 16), "int8_weight_only")
    pinned = {b: b.detach().clone() for b in layer.buffers()}
    onloaded = {b: b.detach().clone() for b in layer.buffers()}
    for b in layer.buffers():
        b.data = onloaded[b]
    group = SimpleNamespace(modules=[layer], cpu_param_dict=pinned)
    holding = [b for b in layer.buffers() if b.numel()]  # qweight, weight_scale, bias (the empty dtype anchor holds
    assert release_module_buffers(group) == len(holding) == 3  # no memory and shares the null pointer)
    assert all(b.data_ptr() == pinned[b].data_ptr() for b in holding)
    assert release_module_buffers(group) == 0


@pytest.mark.gpu
@cuda
def test_offload_with_streams_leaves_no_quantized_weight_on_the_gpu(base):
    """After an offloaded forward (prefetch stream, pinned memory) every block's INT8 weights are back on the CPU:
    the H200 run before the fix kept the whole INT8 model resident (20 GiB peak)."""
    from h3.levers.offload import OffloadConfig, apply_offload
    from h3.levers.quantization import QuantizationConfig, QuantizedLinear, apply_quantization

    transformer = fresh_transformer(base)
    apply_quantization(transformer, QuantizationConfig(mode="int8_weight_only", exclude=[]), keep_originals=False)
    handle = apply_offload(SimpleNamespace(transformer=transformer, text_encoder=None),
                           OffloadConfig(use_stream=True), onload_device="cuda")
    calls = [{k: (v.cuda() if torch.is_tensor(v) else v) for k, v in c.items()} for c in base.calls]
    forward_all(transformer, calls)
    torch.cuda.synchronize()
    blocks = [m for m in transformer.transformer_blocks.modules() if isinstance(m, QuantizedLinear)]
    assert blocks and all(m.qweight.device.type == "cpu" for m in blocks)
    assert handle.telemetry()["buffers_released"] > 0
    # The modules outside the blocks stay on the GPU (resident_top_level): only the blocks stream.
    outside = [t for m in (transformer.token_refiner, transformer.proj_out, transformer.context_embedder)
               for t in list(m.parameters()) + list(m.buffers()) if t.numel()]
    assert outside and all(t.device.type == "cuda" for t in outside)
    assert handle.telemetry()["resident_groups"] == 1


def test_offload_keeps_the_top_level_group_resident(base, monkeypatch):
    """diffusers moves the transformer's top-level group (token refiner, embedders, output norm) synchronously through
    pageable memory at every forward; on the H200 that was 5.9 s of a 7.3 s transfer-bound request. With
    resident_top_level (the default) that group is onloaded and never offloaded, the blocks still are, and the output
    is unchanged; off, diffusers' behaviour is back."""
    from diffusers.hooks.group_offloading import ModuleGroup

    from h3.levers.offload import OffloadConfig, apply_offload, is_top_level_group

    offloaded = []
    original = ModuleGroup.offload_

    def spy(self):
        offloaded.append(is_top_level_group(self, transformer))
        return original(self)

    monkeypatch.setattr(ModuleGroup, "offload_", spy)
    for resident in (True, False):
        transformer = fresh_transformer(base)
        handle = apply_offload(SimpleNamespace(transformer=transformer, text_encoder=None),
                               OffloadConfig(use_stream=False, resident_top_level=resident), onload_device="cpu")
        offloaded.clear()
        outputs = forward_all(transformer, base.calls)
        outside = sum(p.numel() for p in transformer.parameters()) - sum(
            p.numel() for p in transformer.transformer_blocks.parameters())
        telemetry = handle.telemetry()
        assert (telemetry["resident_groups"], telemetry["resident_params"]) == ((1, outside) if resident else (0, 0))
        assert offloaded.count(False) == len(base.calls) * len(transformer.transformer_blocks)
        assert offloaded.count(True) == (0 if resident else len(base.calls))
        for (v, a), (vb, ab) in zip(outputs, base.outputs):
            assert torch.equal(v, vb) and torch.equal(a, ab)


def test_call_counters_hold_under_compile(tmp_path):
    """The quantization and LoRA call counters count inside compiled blocks (h3.levers.base.new_counter) without
    recompiling, and the compiled clip passes the configured-versus-executed check. aot_eager functionalizes the
    counters' in-place adds as inductor does (inductor itself: bench/levers_gpu/results/levers_gpu_h200.md runs it)."""
    from h3eval.executed import check_executed

    torch._dynamo.reset()
    recipe = recipe_from_dict({**FAST_RECIPE, "quant": {"mode": "int8_w8a8"},
                               "lora": {"enabled": True, "path": "@tiny", "fuse": False},
                               "compile": {"enabled": True, "backend": "aot_eager"}})
    runtime = H3Runtime.load("tiny-random", recipe, "cpu")
    try:
        record = runtime.generate(GenerateRequest(prompt="A person is squat", seed=3), tmp_path / "clip.mp4")
        levers = record.executed.levers
        assert levers["compile"]["compiled_regions"] == 2  # the DiT blocks
        assert levers["compile"]["graphs_compiled_this_request"] >= 1 and levers["compile"]["recompiles_total"] == 0
        forwards = record.executed.forward_passes
        assert levers["quant"]["quantized_linear_calls"] == levers["quant"]["quantized_modules"] * forwards
        assert levers["quant"]["quantized_modules_called"] == levers["quant"]["quantized_modules"]
        assert levers["lora"]["lora_layer_calls"] == 14 * forwards
        assert check_executed(recipe, record) == []
        # A second request: counters reset, same counts, no new graph.
        record = runtime.generate(GenerateRequest(prompt="A person is squat", seed=4), tmp_path / "clip2.mp4")
        assert record.executed.levers["lora"]["lora_layer_calls"] == 14 * forwards
        assert record.executed.levers["compile"]["graphs_compiled_this_request"] == 0
    finally:
        torch._dynamo.reset()


def test_exact_levers_keep_the_clip_byte_identical(base, tmp_path):
    """AdaLN precompute, offload without streams (transformer and text encoder), parked VAEs and a per-resolution tile
    equal to the default change where the work happens, not its arithmetic: the clip must be baseline's, bit for bit."""
    recipe = recipe_from_dict({
        **FAST_RECIPE,
        "adaln": {"precompute": True, "disk_cache": False},
        "offload": {"enabled": True, "use_stream": False, "text_encoder": True},
        "vae": {**FAST_RECIPE["vae"], "tiles": {"64x64": [256, 256]}, "resident": False},
    })
    runtime = H3Runtime.load("tiny-random", recipe, "cpu")
    record = runtime.generate(GenerateRequest(prompt="A person is squat", seed=3), tmp_path / "clip.mp4")
    assert (record.frames_sha256, record.pcm_sha256) == (base.record.frames_sha256, base.record.pcm_sha256)
    levers = record.executed.levers
    assert [n for n in LEVERS if levers[n]["applied"]] == ["adaln", "offload", "vae"]
    assert levers["adaln"]["table_lookups"] == 2 and levers["adaln"]["disk_cache"] == "off"
    assert levers["offload"]["modules"] == ["text_encoder", "transformer"]
    assert levers["offload"]["group_onloads"] > 0 and levers["offload"]["streamed_groups"] == 0
    assert levers["vae"]["tiles_used"] == [[256, 256]]
    assert levers["vae"]["vae_moves"] == 4  # video VAE and audio VAE: onto the device and back, once each
    # The levers' executed checks pass on this record, and each rejects a planted departure from the recipe.
    from h3eval.executed import check_executed

    assert check_executed(recipe, record) == []
    for lever, change, problem in [
        ("adaln", {"table_lookups": 1}, "adaln: 1 table lookups in 2 forwards"),
        ("adaln", {"disk_cache": "hit"}, "adaln: recipe asks for disk_cache=False, the lever reported 'hit'"),
        ("offload", {"modules": ["transformer"]},
         "offload: recipe offloads ['text_encoder', 'transformer'], the lever offloaded ['transformer']"),
        ("offload", {"group_onloads": 0}, "offload: no group was onloaded in 2 forwards"),
        ("offload", {"streamed_groups": 3}, "offload: 3 groups streamed, recipe asks for use_stream=False"),
        ("vae", {"tiles_used": [[128, 128]]}, "vae: decoded 128x128 with tile [128, 128], recipe asks for [256, 256]"),
        ("vae", {"resident": True}, "vae: recipe asks for resident=False, the lever reported True"),
    ]:
        planted = record.model_copy(deep=True)
        planted.executed.levers[lever].update(change)
        assert check_executed(recipe, planted) == [problem], (lever, change)


def _executed(forwards: int, **levers):
    from h3.record import Executed

    return Executed(forward_passes=forwards, attention_backends=["native"], torch_dtype="float32", vae_tiling=True,
                    vae_tile=[256, 256], levers=levers)


def test_cache_bucketing_and_compile_checks_against_real_telemetry(base):
    """Each lever's check on the telemetry its handle really reported: empty, then one problem per planted fault."""
    from h3.levers.bucketing import BucketingConfig, apply_bucketing
    from h3.levers.compile import CompileConfig, apply_compile
    from h3.levers.step_cache import StepCacheConfig, apply_step_cache

    transformer = fresh_transformer(base)
    cache_config = StepCacheConfig(kind="fbc", threshold=1e9)
    cache = apply_step_cache(transformer, cache_config)
    bucket_config = BucketingConfig(enabled=True, multiple=64)
    bucketing = apply_bucketing(transformer, bucket_config)
    torch._dynamo.reset()
    compile_config = CompileConfig(enabled=True, backend="eager")
    compiled = apply_compile(transformer, compile_config)
    try:
        for handle in (cache, bucketing, compiled):
            handle.begin_request()
        forward_all(transformer, base.calls)
        seen = {"cache": cache.telemetry(), "bucketing": bucketing.telemetry(), "compile": compiled.telemetry()}
    finally:
        compiled.remove()
        torch._dynamo.reset()
    ex = _executed(len(base.calls), **seen)
    configs = {"cache": cache_config, "bucketing": bucket_config, "compile": compile_config}
    assert {name: c.check_executed(seen[name], ex) for name, c in configs.items()} == {n: [] for n in configs}
    assert seen["cache"]["cached_steps"] == 1  # threshold 1e9: the second step reused the first
    for config, change, forwards, problem in [
        (cache_config, {"computed_steps": 0, "cached_steps": 2}, 2,
         "cache: 0 computed + 2 cached steps in 2 forwards (the first step always computes)"),
        (StepCacheConfig(kind="taylorseer"), {}, 2, "cache: recipe asks for cache kind 'taylorseer', the lever ran 'fbc'"),
        (cache_config, {}, 3, "cache: counted 2 forwards, the request ran 3"),
        (BucketingConfig(enabled=True, multiple=128), {}, 2,
         "bucketing: recipe asks for 128-row buckets, the lever padded to multiples of 64"),
        (bucket_config, {"buckets": [1100]}, 2, "bucketing: buckets [1100] are not multiples of 64 rows"),
        (bucket_config, {}, 3, "bucketing: 2 of the request's 3 forwards were bucketed"),
        (compile_config, {"compiled_regions": 0}, 2, "compile: no region was compiled"),
        (CompileConfig(enabled=True), {}, 2, "compile: recipe asks for backend 'inductor', the lever compiled with 'eager'"),
    ]:
        telemetry = {**seen[config.name], **change}
        assert config.check_executed(telemetry, _executed(forwards)) == [problem], (config, change)
    # A lever left off must not report that it ran; one switched on must report that it did.
    assert StepCacheConfig().check_executed(seen["cache"], ex) == [
        f"cache: is off in the recipe but reported that it applied: {seen['cache']}"]


def test_fused_lora_saved_offline_loads_as_plain_weights(base, tmp_path):
    from h3.levers.lora import save_fused_checkpoint

    fused = lora_runtime(path="@tiny", fuse=True)
    save_fused_checkpoint(fused, tmp_path / "fused")
    plain = H3Runtime.load(str(tmp_path / "fused"), recipe_from_dict(FAST_RECIPE), "cpu")
    assert plain.levers == {}
    for (v, a), (vf, af) in zip(forward_all(plain.pipe.transformer, base.calls),
                                forward_all(fused.pipe.transformer, base.calls)):
        assert torch.equal(v, vf) and torch.equal(a, af)
    with pytest.raises(LeverError, match="fuses a LoRA"):
        save_fused_checkpoint(lora_runtime(path="@tiny"), tmp_path / "unfused")


@pytest.mark.parametrize("mode", ["int8_weight_only", "int8_w8a8", "fp8_w8a8"])
def test_quantized_linear_reports_its_compute_dtype(mode):
    """diffusers casts an AdaLN projection's input to get_parameter_dtype(linear): it must be the compute dtype,
    not float8 read off an FP8 weight (found on the H200: the cast crashed _scaled_mm at full size)."""
    from diffusers.models.modeling_utils import get_parameter_dtype

    from h3.levers.quantization import QuantizedLinear

    linear = torch.nn.Linear(32, 48).to(torch.bfloat16)
    assert get_parameter_dtype(QuantizedLinear(linear, mode)) == torch.bfloat16


# -- FP8 attention (issue 23) ----------------------------------------------------------------------------------------

def test_per_head_e4m3_rounds_like_a_float64_reference_and_maps_each_head_amax_to_448():
    """Each (batch item, head) is scaled so its absolute maximum is 448, cast to e4m3 and described by its descale;
    round-tripped, every value is within e4m3's half-ulp (3 mantissa bits: relative 2^-4) of the original, and the
    maximum is exact. An all-zero head keeps descale 1."""
    from h3.levers.fp8_attention import E4M3_MAX, fake_e4m3, per_head_e4m3

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 50, 3, 16, generator=gen, dtype=torch.float64) * torch.tensor([1.0, 10.0, 0.01])[:, None]
    x[1, :, 2] = 0.0
    q, descale = per_head_e4m3(x)
    assert q.dtype == torch.float8_e4m3fn and descale.shape == (2, 3) and descale.dtype == torch.float32
    amax = x.abs().amax(dim=(1, 3))
    expected = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    torch.testing.assert_close(descale.double(), expected, rtol=1e-6, atol=0)
    assert float(q.float().abs().amax(dim=(1, 3))[0, 0]) == E4M3_MAX
    back = fake_e4m3(x)
    err = (back - x).abs()
    normal = x.abs() * 448 / amax[:, None, :, None].clamp(min=1e-30) >= 2.0 ** -6  # e4m3's normal range
    assert bool((err[normal] <= x.abs()[normal] * 2.0 ** -4 + 1e-12).all())
    assert float(back[1, :, 2].abs().max()) == 0.0


def test_compiled_quantization_of_qkv_is_the_eager_one_bit_for_bit_with_one_graph_for_every_length():
    """``quantize = 'compiled'`` (the fa3 kernel's default): q, k and v quantized by one inductor graph give the eager
    :func:`per_head_e4m3`'s e4m3 bytes and descales exactly, at two sequence lengths (bf16 heads of very different
    sizes, one all zero), and the second length reuses the first's graph (dynamic shapes: no compile per bucket)."""
    import torch._dynamo.utils

    from h3.levers.fp8_attention import compiled_quantize_qkv, quantize_qkv

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    gen = torch.Generator().manual_seed(0)
    sizes = torch.tensor([0.1, 3.0, 50.0])[None, None, :, None]
    for seq in (37, 53):
        qkv = [(torch.randn(1, seq, 3, 24, generator=gen) * sizes).to(torch.bfloat16) for _ in range(3)]
        qkv[2][:, :, 1] = 0.0
        for (got, got_descale), (want, want_descale) in zip(compiled_quantize_qkv(*qkv), quantize_qkv(*qkv)):
            assert got.dtype == torch.float8_e4m3fn
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)) and torch.equal(got_descale, want_descale)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    torch._dynamo.reset()


def test_fp8_attention_emulated_on_the_transformer_counts_every_call_and_stays_near_sdpa(base):
    """``kernel = 'emulate'``: every attention call of every block goes through the e4m3 path (counted outside the
    compiled graphs: equal under torch.compile), and the whole transformer's velocity stays within the rounding's
    reach of the SDPA baseline (relative max error under 0.1, above 1e-4: it did round). Removing the lever restores
    the baseline's computation bit for bit."""
    from h3.levers.fp8_attention import Fp8AttentionConfig, apply_fp8_attention

    transformer = fresh_transformer(base)
    handle = apply_fp8_attention(transformer, Fp8AttentionConfig(enabled=True, kernel="emulate"))
    outputs = forward_all(transformer, base.calls)
    telemetry = handle.telemetry()
    layers = len(transformer.transformer_blocks)
    assert telemetry == {"applied": True, "kernel": "emulate", "scaling": "per_head", "quantize": "eager",
                         "fp8_calls": layers * len(base.calls), "forwards": len(base.calls), "layers": layers}
    rel = assert_close(outputs[-1][0], base.outputs[-1][0], 0.1, "emulated FP8 attention vs SDPA")
    assert rel > 1e-4
    assert_counters_hold_under_compile(handle, transformer, base.calls, outputs)
    handle.remove()
    assert all(torch.equal(a[0], b[0]) for a, b in zip(forward_all(transformer, base.calls), base.outputs))


def test_fp8_attention_refusals_and_executed_check():
    """FA3's kernel needs a Hopper GPU and the carried build's head dimension (the tiny presets' 24 is not 128); the
    lever owns the attention call, so it refuses a non-native backend and block-sparse attention; its executed check
    fails a request in which some attention ran another way or another kernel ran."""
    from h3.levers.fp8_attention import Fp8AttentionConfig, apply_fp8_attention
    from h3.record import Executed

    fa3 = Fp8AttentionConfig(enabled=True, kernel="fa3")
    assert "needs a Hopper GPU" in fa3.device_problems("cpu")[0]
    assert Fp8AttentionConfig(enabled=True, kernel="emulate").device_problems("cpu") == []
    assert any("sparse_attention" in p for p in fa3.composition_problems(load_recipe("turbo4-sparse")))
    assert any("backend native, not 'sage'" in p for p in fa3.composition_problems(load_recipe("turbo4-fp8-sage")))
    assert fa3.composition_problems(load_recipe("turbo4-fp8")) == []
    from diffusers import MiniMaxH3Transformer3DModel

    from h3.tiny_trained import TRANSFORMER_CONFIG

    with pytest.raises(LeverError, match="head dimension"):
        apply_fp8_attention(MiniMaxH3Transformer3DModel(**TRANSFORMER_CONFIG), fa3)
    emulate = Fp8AttentionConfig(enabled=True, kernel="emulate")
    executed = Executed(forward_passes=4, attention_backends=[], torch_dtype="float32", vae_tiling=False)
    good = {"applied": True, "kernel": "emulate", "scaling": "per_head", "fp8_calls": 8, "forwards": 4, "layers": 2}
    assert emulate.check_executed(good, executed) == []
    assert any("some attention ran another way" in p for p in
               emulate.check_executed({**good, "fp8_calls": 7}, executed))
    assert any("kernel" in p for p in emulate.check_executed({**good, "kernel": "fa3"}, executed))
    assert any("integer fp8_calls" in p for p in emulate.check_executed({**good, "fp8_calls": None}, executed))


def test_attention_backend_check_lets_fp8_attention_own_the_blocks_calls():
    """With FP8 attention applied (every block's call counted), the dispatcher may have run the recipe's backend for
    attention outside the blocks (the refiner's) or nothing; any other backend is a mismatch, as without it."""
    from h3.levers.attention_backend import AttentionBackendConfig

    native = AttentionBackendConfig()
    fp8 = {"applied": True, "kernel": "emulate", "fp8_calls": 8, "forwards": 4, "layers": 2}
    for dispatched, ok in (([], True), (["native"], True), (["sage"], False)):
        executed = Executed(forward_passes=4, attention_backends=dispatched, torch_dtype="float32", vae_tiling=False,
                            levers={"fp8_attention": fp8})
        assert (native.check_executed({"applied": False}, executed) == []) is ok, dispatched
    plain = Executed(forward_passes=4, attention_backends=[], torch_dtype="float32", vae_tiling=False)
    assert native.check_executed({"applied": False}, plain) != []


def test_attention_backend_check_lets_all_sparse_blocks_leave_the_dispatcher():
    """Block-sparse attention on every step and layer owns the blocks' calls: the dispatcher ran the recipe's backend
    for the refiner or nothing. A dense step (dense_calls > 0) puts the blocks back on the dispatcher."""
    from h3.levers.attention_backend import AttentionBackendConfig

    native = AttentionBackendConfig()
    all_sparse = {"applied": True, "dense_calls": 0, "sparse_calls": 8}
    one_dense = {"applied": True, "dense_calls": 2, "sparse_calls": 6}
    for sparse, dispatched, ok in ((all_sparse, [], True), (all_sparse, ["native"], True),
                                   (all_sparse, ["sage"], False), (one_dense, [], False),
                                   (one_dense, ["native"], True)):
        executed = Executed(forward_passes=4, attention_backends=dispatched, torch_dtype="float32", vae_tiling=False,
                            levers={"sparse_attention": sparse})
        assert (native.check_executed({"applied": False}, executed) == []) is ok, (sparse, dispatched)


def test_sparse_on_every_step_request_passes_the_executed_check(tmp_path):
    """A whole request with block-sparse attention on every step (no dense first step): every block call ran sparse,
    the refiner's attention went through the dispatcher, and the product's configured-versus-executed check finds
    nothing amiss (it refused this request before: 'asks for native, the dispatcher ran [native]')."""
    from h3eval.executed import check_executed

    recipe = recipe_from_dict({**FAST_RECIPE, "name": "fast-sparse-all", "sparse_attention": {
        "enabled": True, "block_size": 16, "sparsity": 0.5, "dense_steps": 0}})
    runtime = H3Runtime.load("tiny-random", recipe, "cpu")
    record = runtime.generate(GenerateRequest(prompt="A person is squat", seed=3), tmp_path / "clip.mp4")
    sparse = record.executed.levers["sparse_attention"]
    assert sparse["dense_calls"] == 0 and sparse["sparse_calls"] > 0
    assert record.executed.attention_backends == ["native"]
    assert check_executed(recipe, record) == []


def test_fp8_attention_emulated_request_passes_the_executed_check(tmp_path):
    """A whole request with FP8 attention emulated: the clip record counts every block's attention call of every DiT
    forward, and the product's configured-versus-executed check (h3eval.executed) finds nothing amiss."""
    from h3eval.executed import check_executed

    recipe = recipe_from_dict({**FAST_RECIPE, "name": "fast-fp8attn", "fp8_attention": {"enabled": True,
                                                                                         "kernel": "emulate"}})
    runtime = H3Runtime.load("tiny-random", recipe, "cpu")
    record = runtime.generate(GenerateRequest(prompt="A person is squat", seed=3), tmp_path / "clip.mp4")
    fp8 = record.executed.levers["fp8_attention"]
    assert fp8["forwards"] == record.executed.forward_passes == 2
    assert fp8["fp8_calls"] == fp8["layers"] * 2 and fp8["kernel"] == "emulate"
    assert check_executed(recipe, record) == []


def test_lever_quality_recipes_are_the_baseline_with_one_lever_on():
    """bench/lever_quality/lever_quality.py's measurement recipes (bench/recipes, 'bench only: the baseline + ...') measure one
    lever's quality cost: each must be the baseline with exactly that one lever section changed, and that lever on."""
    from pathlib import Path

    base = load_recipe("baseline").model_dump()
    found = 0
    for path in sorted((Path(__file__).resolve().parent.parent / "bench" / "recipes").glob("*.toml")):
        recipe = load_recipe(path)
        if not recipe.description.startswith("bench only: the baseline + "):
            continue
        found += 1
        data = recipe.model_dump()
        changed = sorted(k for k in set(base) | set(data) if base.get(k) != data.get(k))
        levers = [k for k in changed if k not in ("name", "description", "signoff")]
        assert len(levers) == 1, (path.name, changed)
        config = getattr(recipe, levers[0])
        assert config.is_on(), (path.name, levers[0])
        assert recipe.signoff.kind == "near", path.name
    assert found >= 3


@pytest.mark.parametrize("compensated, sparsity", [("turbo4-tiny-sparse85", 0.85), ("turbo4-tiny-sparse50", 0.5)])
def test_the_uncompensated_sparse_recipe_differs_from_the_compensated_one_only_by_its_compensation_lora(
        compensated, sparsity):
    """bench/recipes/turbo4-tiny-sparse{85,50}-nocomp is what a compensation LoRA is measured against: the compensated
    recipe (the shipped turbo4-tiny-sparse85, the bench's turbo4-tiny-sparse50) with that one section off; and both
    are turbo4-tiny plus the sparse routing at the sparsity the LoRA file states it was trained for, over the
    distillation LoRA it states it was trained over (run 13's, ``@turbo4-tiny-run13``, since turbo4-tiny moved on)."""
    from pathlib import Path

    from h3.levers.compensation_lora import ROUTING_KEYS, file_metadata

    root = Path(__file__).resolve().parent.parent
    bench = root / "bench" / "recipes"
    recipe = load_recipe(bench / f"{compensated}.toml" if (bench / f"{compensated}.toml").exists() else compensated)
    shipped = recipe.model_dump()
    nocomp = load_recipe(bench / f"{compensated}-nocomp.toml").model_dump()
    assert shipped["sparse_attention"]["sparsity"] == nocomp["sparse_attention"]["sparsity"] == sparsity
    path = recipe.compensation_lora.path
    stated = file_metadata(path if path.startswith("@") else str(root / path))
    assert stated is not None and float(stated[ROUTING_KEYS["sparsity"]]) == sparsity
    turbo = load_recipe("turbo4-tiny").model_dump()
    # `parent` names the rung a recipe is judged against (issue 50's lineage), not a setting of what it computes.
    differs = lambda a, b: sorted(k for k in (set(a) | set(b)) - {"parent"} if a.get(k) != b.get(k))  # noqa: E731
    assert differs(shipped, nocomp) == ["compensation_lora", "description", "name", "signoff"]
    assert differs(nocomp, turbo) == ["description", "lora", "name", "signoff", "sparse_attention"]
    assert shipped["lora"]["path"] == nocomp["lora"]["path"] == "@turbo4-tiny-run13"
    assert {**nocomp["lora"], "path": turbo["lora"]["path"]} == turbo["lora"]
    if "h3_compensates_tensors_sha256" in stated:
        from h3.levers.compensation_lora import lora_tensors_sha256
        from h3.tiny_trained import TURBO4_RUN13_LORA_FILE

        assert stated["h3_compensates_tensors_sha256"] == lora_tensors_sha256(TURBO4_RUN13_LORA_FILE)
    assert shipped["signoff"]["kind"] == nocomp["signoff"]["kind"] == turbo["signoff"]["kind"] == "resample"
    assert shipped["compensation_lora"]["enabled"] and shipped["sparse_attention"]["dense_steps"] == 0


def test_the_shipped_compensation_lora_loads_over_the_shipped_turbo4_tiny():
    """turbo4-tiny-sparse85 on the trained tiny: the compensation LoRA states the routing the recipe runs and the
    distillation LoRA it was trained over (by tensors: run 13's, which the recipe loads; not the turbo4-tiny shipped
    since, which it refuses), and every module it targets matches; with its routing changed the recipe is refused."""
    from h3.levers.compensation_lora import COMPENSATES_KEY, file_metadata, lora_tensors_sha256
    from h3.tiny_trained import TURBO4_LORA_FILE, TURBO4_RUN13_LORA_FILE

    recipe = load_recipe("turbo4-tiny-sparse85")
    stated = file_metadata("@sparse85-tiny")
    assert stated[COMPENSATES_KEY] == lora_tensors_sha256(TURBO4_RUN13_LORA_FILE)
    assert stated[COMPENSATES_KEY] != lora_tensors_sha256(TURBO4_LORA_FILE)
    over_new = recipe.model_dump()
    over_new["lora"]["path"] = "@turbo4-tiny"
    with pytest.raises(LeverError, match=r"was trained on the LoRA with sha256"):
        H3Runtime.load("tiny", recipe_from_dict(over_new), "cpu")
    runtime = H3Runtime.load("tiny", recipe, "cpu")
    telemetry = runtime.levers["compensation_lora"].telemetry()
    assert telemetry["matched_modules"] == telemetry["file_modules"] == runtime.levers["lora"].telemetry()[
        "file_modules"] > 0
    data = recipe.model_dump()
    data["sparse_attention"]["block_size"] = 64
    with pytest.raises(LeverError, match=r"trained for sparse_attention.block_size = 32, the recipe runs 64"):
        H3Runtime.load("tiny", recipe_from_dict(data), "cpu")


def test_with_lora_file_replaces_only_the_lora_path(tmp_path):
    """bench's probes (content_check, signoff_proof, distill_gap) put another LoRA file in a recipe: only
    ``lora.path`` changes, and the result is validated again (its hash follows the path)."""
    from h3.recipe import load_recipe, with_lora_file

    recipe = load_recipe("turbo4-tiny")
    other = with_lora_file(recipe, tmp_path / "probe.safetensors")
    assert other.lora.path == str(tmp_path / "probe.safetensors")
    before, after = recipe.model_dump(), other.model_dump()
    before["lora"].pop("path"), after["lora"].pop("path")
    assert before == after and other.sha256() != recipe.sha256()
