"""Full-size speed on one GPU: the DiT/VAE timing kit, the kernel profile, the shipped recipes' variants and the speed table (issue 52: code that studies and tests share; each study's CLI is bench/<study>/).

Parts, in order: ``h200_speed`` (bench/full_size_speed/), ``kernel_profile`` (bench/kernel_profile/), ``h200_recipes_speed`` (bench/full_size_speed/), ``h200_recipes_table`` (bench/full_size_speed/).
"""

from __future__ import annotations


# ---- h200_speed (the CLI: bench/full_size_speed/h200_speed.py) -------------------------------------------------------


import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SHAPES = {
    # name: (num_frames, height, width); 362 frames is seed 000's "15 s" workload (15.083 s at 24 fps).
    "5s-544x960": (124, 544, 960),
    "5s-768x1344": (124, 768, 1344),
    "15s-768x1344": (362, 768, 1344),
    # Smoke runs of the scripts on a CPU with the tiny preset's config (not a production shape).
    "smoke-64x64": (22, 64, 64),
}
TEXT_TOKENS = 256
STEPS = {"baseline": 29, "turbo4": 4}


def run_record(device: str = "cuda") -> dict:
    """What the recipe, protocol and offload benches' results start with: the command, the UTC date, the device,
    torch, CUDA and diffusers versions, and that the weights are seeded random."""
    import diffusers

    return {"command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "device": torch.cuda.get_device_name() if device == "cuda" else "cpu (smoke run)",
            "torch": torch.__version__, "cuda": torch.version.cuda, "diffusers": diffusers.__version__,
            "weights": "seeded random (speed does not depend on weight values)"}


def cuda_time(fn, repeats: int, warmup: int = 1) -> list[float]:
    if not torch.cuda.is_available():  # smoke runs on a CPU: wall clock
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return times
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1000.0)
    return times


def ceilings(repeats: int) -> dict:
    out = {}
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    t = statistics.median(cuda_time(lambda: a @ b, 10, 3))
    out["bf16_matmul_tflops"] = 2 * n**3 / t / 1e12
    try:
        a8 = a.to(torch.float8_e4m3fn)
        b8 = b.t().contiguous().to(torch.float8_e4m3fn).t()
        one = torch.ones((), device="cuda")
        t = statistics.median(cuda_time(lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16), 10, 3))
        out["fp8_matmul_tflops"] = 2 * n**3 / t / 1e12
    except Exception as exc:  # report, never fake a number
        out["fp8_matmul_error"] = f"{type(exc).__name__}: {exc}"
    src = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = statistics.median(cuda_time(lambda: dst.copy_(src), 10, 2))
    out["d2d_copy_GBps_read_plus_write"] = 2 * src.numel() / t / 1e9
    host = torch.empty(2 * 1024**3, dtype=torch.uint8).pin_memory()
    t = statistics.median(cuda_time(lambda: dst.copy_(host, non_blocking=True), 5, 1))
    out["pinned_h2d_GBps"] = host.numel() / t / 1e9
    t = statistics.median(cuda_time(lambda: host.copy_(dst, non_blocking=True), 5, 1))
    out["pinned_d2h_GBps"] = host.numel() / t / 1e9
    del a, b, src, dst, host
    return out


def latent_geometry(num_frames: int, height: int, width: int) -> dict:
    latent_frames = (num_frames - 5) // 17 * 5 + 2
    rows_per_frame = (height // 16 // 2) * (width // 16 // 2)
    audio_latents = round(num_frames / 24 * 40)
    return {"latent_frames": latent_frames, "video_rows": latent_frames * rows_per_frame,
            "audio_rows": 2 * audio_latents, "text_rows": TEXT_TOKENS,
            "latent_hw": (height // 16, width // 16), "audio_latents": audio_latents}


def dit_inputs(geo: dict, config, device="cuda", dtype=torch.bfloat16) -> dict:
    text, audio, video = geo["text_rows"], geo["audio_rows"], geo["video_rows"]
    seq = text + audio + video
    g = torch.Generator(device="cpu").manual_seed(0)
    tags = torch.cat([torch.full((text,), 1), torch.full((audio,), 2), torch.full((video,), 0)]).long()
    # Two noise levels (video and audio schedules differ); text rides on the video one.
    tindex = torch.cat([torch.zeros(text), torch.ones(audio), torch.zeros(video)]).long()
    pos = torch.randint(0, 64, (seq, 3), generator=g)
    return dict(
        hidden_states=torch.randn(1, video, config.in_channels * 4, generator=g).to(device),
        audio_hidden_states=torch.randn(1, audio, config.audio_in_channels, generator=g).to(device),
        encoder_hidden_states=torch.randn(1, text, config.text_dim, generator=g).to(device, dtype),
        timestep=torch.tensor([0.3, 0.5], device=device),
        timestep_indices=tindex.to(device), token_tags=tags.to(device), position_ids=pos.to(device),
        video_indices=torch.arange(text + audio, seq, device=device),
        audio_indices=torch.arange(text, text + audio, device=device),
        text_indices=torch.arange(0, text, device=device),
        return_dict=False,
    )


def count_flops(model: torch.nn.Module, run) -> dict:
    """FLOPs of one call from the shapes each Linear and each attention call saw."""
    from diffusers.models.transformers.transformer_minimax_h3 import MiniMaxH3Attention

    counts = {"linear": 0, "attention": 0}
    handles = []

    def linear_hook(module, args, output):
        x = args[0]
        counts["linear"] += 2 * x.numel() // x.shape[-1] * module.in_features * module.out_features

    def attn_hook(module, args, output):
        hidden = args[0]
        n = hidden.shape[-2]
        counts["attention"] += 4 * n * n * module.inner_dim * hidden.shape[0]

    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            handles.append(m.register_forward_hook(linear_hook))
        elif isinstance(m, MiniMaxH3Attention):
            handles.append(m.register_forward_hook(attn_hook))
    try:
        with torch.no_grad():
            run()
    finally:
        for h in handles:
            h.remove()
    counts["total"] = counts["linear"] + counts["attention"]
    return counts


def build_transformer(dtype=torch.bfloat16, num_layers: int | None = None, tiny: bool = False, device: str = "cuda"):
    """The full-size MiniMax-H3 DiT (diffusers' default config) with seeded random weights; ``num_layers`` and
    ``tiny`` (the tiny preset's config) are for smoke runs of the scripts only."""
    from diffusers import MiniMaxH3Transformer3DModel

    config = {}
    if tiny:
        from h3.tiny import TRANSFORMER_CONFIG

        config.update(TRANSFORMER_CONFIG)
    if num_layers is not None:
        config["num_layers"] = num_layers
    torch.manual_seed(0)
    with torch.device(device):
        model = MiniMaxH3Transformer3DModel(**config)
    model = model.to(dtype).eval()
    keep = getattr(model, "_keep_in_fp32_modules", None) or []
    for name, module in model.named_modules():
        if any(name == k or name.endswith("." + k) for k in keep):
            module.float()
    return model, keep


def bench_dit(shapes: list[str], repeats: int, ceil: dict) -> dict:
    model, keep = build_transformer()
    params = sum(p.numel() for p in model.parameters())
    out = {"params": params, "fp32_modules": keep, "shapes": {}}
    for name in shapes:
        geo = latent_geometry(*SHAPES[name])
        inputs = dit_inputs(geo, model.config)
        run = lambda: model(**inputs)  # noqa: E731
        with torch.no_grad():
            flops = count_flops(model, run)
            torch.cuda.reset_peak_memory_stats()
            times = cuda_time(run, repeats, warmup=1)
        t = statistics.median(times)
        tflops = flops["total"] / t / 1e12
        out["shapes"][name] = {
            "geometry": {k: v for k, v in geo.items()}, "sequence_length": geo["text_rows"] + geo["audio_rows"]
            + geo["video_rows"], "forward_s": t, "forward_s_all": times, "flops": flops, "tflops": tflops,
            "fraction_of_bf16_ceiling": tflops / ceil["bf16_matmul_tflops"] if "bf16_matmul_tflops" in ceil else None,
            "peak_memory_GiB": torch.cuda.max_memory_allocated() / 2**30,
        }
        print(json.dumps({name: out["shapes"][name]["forward_s"], "tflops": tflops}), flush=True)
        del inputs
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return out


def bench_vae(shapes: list[str], repeats: int) -> dict:
    from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio

    torch.manual_seed(0)
    with torch.device("cuda"):
        vae = AutoencoderKLMiniMaxH3().to(torch.bfloat16).eval()
        audio_vae = AutoencoderKLMiniMaxH3Audio(latents_mean=[0.0] * 32, latents_std=[1.0] * 32).to(torch.bfloat16).eval()
    out = {"params": sum(p.numel() for p in vae.parameters()), "shapes": {}}
    for name in shapes:
        geo = latent_geometry(*SHAPES[name])
        lh, lw = geo["latent_hw"]
        latents = torch.randn(1, 24, geo["latent_frames"], lh, lw, device="cuda", dtype=torch.bfloat16)
        row = {}
        for tiles in ((256, 256), (304, 320)):
            vae.enable_tiling(tile_sample_min_height=tiles[0], tile_sample_min_width=tiles[1])
            with torch.no_grad():
                torch.cuda.reset_peak_memory_stats()
                times = cuda_time(lambda: vae.decode(latents, return_dict=False), max(1, repeats - 1), warmup=1)
            row[f"video_decode_{tiles[0]}x{tiles[1]}_s"] = statistics.median(times)
            row[f"video_decode_{tiles[0]}x{tiles[1]}_peak_GiB"] = torch.cuda.max_memory_allocated() / 2**30
        alat = torch.randn(2, 32, geo["audio_latents"], device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            row["audio_decode_s"] = statistics.median(cuda_time(lambda: audio_vae.decode(alat), repeats, 1))
        num_frames, height, width = SHAPES[name]
        # Frame prep + D2H: uint8 frames of the whole clip over PCIe (measured pinned D2H rate).
        row["frames_bytes"] = num_frames * height * width * 3
        out["shapes"][name] = row
        print(json.dumps({name: row}), flush=True)
        del latents
    del vae, audio_vae
    gc.collect()
    torch.cuda.empty_cache()
    return out


def bench_text(repeats: int) -> dict:
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    config = Qwen3VLConfig(text_config=dict(hidden_size=5120, intermediate_size=25600, num_hidden_layers=64,
                                            num_attention_heads=64, num_key_value_heads=8, head_dim=128,
                                            vocab_size=151936, rope_parameters={"rope_type": "default",
                                                                                "rope_theta": 5e6,
                                                                                "mrope_section": [24, 20, 20]}))
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen3VLForConditionalGeneration(config).to(torch.bfloat16).eval()
    ids = torch.randint(0, 150000, (1, TEXT_TOKENS), device="cuda")
    with torch.no_grad():
        run = lambda: model.model(input_ids=ids, output_hidden_states=True)  # noqa: E731
        times = cuda_time(run, repeats, warmup=1)
    out = {"params": sum(p.numel() for p in model.parameters()), "tokens": TEXT_TOKENS,
           "text_encode_s": statistics.median(times)}
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return out


def project(result: dict) -> dict:
    proj = {}
    d2h = result.get("ceilings", {}).get("pinned_d2h_GBps")
    text = result.get("text", {}).get("text_encode_s")
    for name in result.get("dit", {}).get("shapes", {}) if "error" not in result.get("vae", {}) else []:
        fwd = result["dit"]["shapes"][name]["forward_s"]
        vae = result.get("vae", {}).get("shapes", {}).get(name, {})
        for recipe, steps in STEPS.items():
            parts = {"text_encode": text, "denoise": steps * fwd,
                     "video_decode": vae.get("video_decode_256x256_s"), "audio_decode": vae.get("audio_decode_s"),
                     "frame_prep_d2h": vae["frames_bytes"] / (d2h * 1e9) if d2h and vae else None}
            total = sum(v for v in parts.values() if v is not None) if all(v is not None for v in parts.values()) else None
            proj[f"{name}/{recipe}-stock-dense"] = {"stages": parts, "generation_side_s": total,
                                                    "rtf": total / (SHAPES[name][0] / 24) if total else None}
    return proj


def h200_speed_main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--parts", default="ceilings,dit,vae,text")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    shapes = [s for s in args.shapes.split(",") if s]
    parts = set(args.parts.split(","))
    torch.backends.cuda.matmul.allow_tf32 = False
    result = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
              "weights": "seeded random (no MiniMax-H3 weights here; speed does not depend on weight values)"}
    try:
        import diffusers
        import transformers

        result["diffusers"], result["transformers"] = diffusers.__version__, transformers.__version__
    except ImportError:
        pass
    t0 = time.time()
    if "ceilings" in parts:
        result["ceilings"] = ceilings(args.repeats)
        print(json.dumps(result["ceilings"]), flush=True)
    for part, fn in (("dit", lambda: bench_dit(shapes, args.repeats, result.get("ceilings", {}))),
                     ("vae", lambda: bench_vae(shapes, args.repeats)), ("text", lambda: bench_text(args.repeats))):
        if part not in parts:
            continue
        try:
            result[part] = fn()
        except Exception as exc:  # one failing part must not lose the others' figures; the error is reported
            import traceback

            result[part] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
            gc.collect()
            torch.cuda.empty_cache()
        print(json.dumps({part: "done"}), flush=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    result["projection"] = project(result)
    result["wall_s"] = time.time() - t0
    Path(args.out).write_text(json.dumps(result, indent=2))
    print("wrote", args.out)


# ---- kernel_profile (the CLI: bench/kernel_profile/kernel_profile.py) ----------------------------------------------------


import re
from typing import Callable

FAMILIES = ("gemm", "attention", "triton_fused", "elementwise", "reduction", "copy", "other")
"""Kernel families, in the order a name is tested against them (the first match wins)."""

_PATTERNS: tuple[tuple[str, re.Pattern], ...] = (
    ("attention", re.compile(r"flash|fmha|attention|attn|sage|sdpa|softmax_warp", re.I)),
    # inductor's fused kernels before the GEMMs: "triton_red_fused__scaled_mm_..." is the fused quantization prologue
    # of a scaled_mm (its name lists the graph's ops), not the GEMM, which is cuBLASLt's own kernel
    ("triton_fused", re.compile(r"^triton_(poi|per|red)_", re.I)),
    ("gemm", re.compile(r"gemm|xmma|cutlass|matmul|_mm_|\bmm_|scaled_mm|cublas|nvjet|sm90_.*(e4m3|bf16|f16)|triton_tem",
                        re.I)),
    ("copy", re.compile(r"^Memcpy|^Memset|copy_kernel|CatArrayBatchedCopy|direct_copy", re.I)),
    ("reduction", re.compile(r"reduce_kernel|reduction|welford|norm_kernel|amax", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled_elementwise|pointwise", re.I)),
)


def family(kernel_name: str) -> str:
    """The family of a kernel, read from its name (:data:`FAMILIES`)."""
    for name, pattern in _PATTERNS:
        if pattern.search(kernel_name):
            return name
    return "other"


def summarize(kernels: list[tuple[str, int, float]], top: int = 12) -> dict:
    """``kernels``: (name, calls, device microseconds) per kernel name. Returns the total, each family's time and share,
    and the ``top`` longest kernels (time in milliseconds)."""
    total_us = sum(us for _, _, us in kernels)
    families = {f: {"ms": 0.0, "calls": 0, "share": 0.0} for f in FAMILIES}
    for name, calls, us in kernels:
        entry = families[family(name)]
        entry["ms"] += us / 1000.0
        entry["calls"] += calls
    for entry in families.values():
        entry["share"] = entry["ms"] * 1000.0 / total_us if total_us > 0 else 0.0
    longest = sorted(kernels, key=lambda k: -k[2])[:top]
    return {"device_ms": total_us / 1000.0, "families": families,
            "top": [{"kernel": name[:160], "family": family(name), "calls": calls, "ms": us / 1000.0}
                    for name, calls, us in longest]}


def kernel_breakdown(run: Callable[[], object], top: int = 12) -> dict:
    """Profile one call of ``run`` on the GPU and :func:`summarize` its kernels (CUDA device time)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    kernels = []
    for evt in prof.key_averages():
        if "cuda" not in str(getattr(evt, "device_type", "")).lower():
            continue
        us = float(getattr(evt, "self_device_time_total", 0.0) or getattr(evt, "device_time_total", 0.0) or 0.0)
        if us > 0:
            kernels.append((evt.key, int(evt.count), us))
    return summarize(kernels, top)


# ---- h200_recipes_speed (the CLI: bench/full_size_speed/h200_recipes_speed.py) -----------------------------------------------


import argparse
import contextlib
import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from h3.atomic import atomic_write_json  # noqa: E402
from bench.lib.speed import (  # noqa: E402
    SHAPES, build_transformer, count_flops, cuda_time, dit_inputs, latent_geometry, run_record)

DEFAULT_VARIANTS = ("stock,turbo4+compile,turbo4-int8,turbo4-int8+compile,turbo4-fp8,turbo4-fp8+compile,"
                    "turbo4-fp8+cudnn+compile,turbo4-sparse,turbo4-sparse+compile,turbo4-sparse+sparse85+fp8+compile")

# Shipped recipes whose DiT forward is another variant's: the fused LoRA changes no shape or FLOP, so turbo4's forward
# is stock's. Recipes that change only how many forwards run (a step cache, fewer steps), offload (its own bench) and
# the tiny-only demo have no forward of their own to time; the speed table covers each with a sentence.
SAME_FORWARD = {"baseline": "stock", "turbo4": "stock"}
NOT_A_FORWARD = {
    "identity": "every lever off: baseline's forward (`stock`)",
    "fbc-cache": "stock's forward, fewer of them computed (the cache skips steps): not a forward-speed question",
    "fewer-steps": "stock's forward, 8 of them instead of 29",
    "offload-int8-adaln": "`bench/full_size_speed/h200_offload.py` at 5 s 544×960 (target row below)",
    "turbo4-tinydemo": "tiny preset only (its LoRA is the seeded '@tiny' one); not a full-size recipe",
    "turbo4-tiny": "trained tiny preset only (its LoRA is the distilled '@turbo4-tiny'); not a full-size recipe",
    "turbo4-tiny-int8": "trained tiny preset only (its LoRA is the distilled '@turbo4-tiny'); not a full-size recipe",
    "turbo4-tiny-sparse": "trained tiny preset only (its LoRA is the distilled '@turbo4-tiny'); not a full-size recipe",
    "fp8-attention-emulated": "a measurement recipe: FP8 attention's rounding emulated through SDPA (slower than stock "
                              "by design); the speed lever is the `fa3fp8` modifier (fp8_attention kernel fa3)",
}


def shipped_variants() -> list[str]:
    """``stock`` and every shipped recipe with a DiT forward of its own, as shipped (no modifier)."""
    from h3.recipe import known_recipes

    return ["stock"] + sorted(n for n in known_recipes() if n not in SAME_FORWARD and n not in NOT_A_FORWARD)


def expand_variants(spec: str) -> list[str]:
    """The comma-separated variant list, with ``shipped`` standing for :func:`shipped_variants`; first use kept."""
    out: list[str] = []
    for item in (v.strip() for v in spec.split(",")):
        for v in (shipped_variants() if item == "shipped" else [item] if item else []):
            if v not in out:
                out.append(v)
    return out


COMPILE_MODES = {"graphs": "reduce-overhead", "autotune": "max-autotune-no-cudagraphs"}
"""Variant modifiers that compile the DiT blocks with one of inductor's mode option sets (h3.levers.compile's
``mode``): ``graphs`` captures each compiled block in CUDA graphs (issue 23: "capture the step in CUDA graphs where
shapes are bucketed"; pair it with ``bucket`` or a bucketing recipe), ``autotune`` autotunes the matmul and fused
kernels without graphs."""


def variant_recipe(variant: str):
    """The Recipe a variant names, with the sections that do not touch the DiT forward set aside (returned)."""
    from h3.recipe import load_recipe

    base, *mods = variant.split("+")
    recipe = load_recipe("baseline" if base == "stock" else base)
    if base == "stock":
        recipe = recipe.model_copy(update={"name": "stock"})
    update: dict = {}
    for mod in mods:
        if mod == "compile":
            update["compile"] = update.get("compile", recipe.compile).model_copy(update={"enabled": True})
        elif mod == "dynamic":  # compile with dynamic shapes: one graph for every prompt length
            update["compile"] = update.get("compile", recipe.compile).model_copy(update={"enabled": True,
                                                                                          "dynamic": True})
        elif mod in COMPILE_MODES:  # inductor's option sets: CUDA graphs of each compiled block, or autotuning
            update["compile"] = update.get("compile", recipe.compile).model_copy(update={"enabled": True,
                                                                                          "mode": COMPILE_MODES[mod]})
        elif mod in ("fp8", "int8"):
            update["quant"] = recipe.quant.model_copy(update={"mode": f"{mod}_w8a8"})
        elif mod in ("sage", "cudnn", "fa3"):
            update["attention"] = recipe.attention.model_copy(
                update={"backend": {"sage": "sage", "cudnn": "_native_cudnn", "fa3": "_flash_3"}[mod]})
        elif mod in ("fa3fp8", "fa3fp8eager"):  # FlashAttention-3's FP8 forward, per-head scales (fp8_attention)
            update["fp8_attention"] = recipe.fp8_attention.model_copy(update={
                "enabled": True, "kernel": "fa3", "quantize": "eager" if mod == "fa3fp8eager" else "compiled"})
        elif mod == "bucket":
            update["bucketing"] = recipe.bucketing.model_copy(update={"enabled": True, "multiple": 128})
        elif mod.startswith("sparse") and mod[len("sparse"):].isdigit():
            update["sparse_attention"] = recipe.sparse_attention.model_copy(update={
                "enabled": True, "block_size": 128, "sparsity": int(mod[len("sparse"):]) / 100.0, "dense_steps": 1})
            update["bucketing"] = recipe.bucketing.model_copy(update={"enabled": True, "multiple": 128})
        else:
            raise ValueError(f"unknown modifier {mod!r} in variant {variant!r}")
    set_aside = {"lora": recipe.lora.enabled, "vae_tiles": dict(recipe.vae.tiles), "offload": recipe.offload.enabled,
                 "adaln_precompute": recipe.adaln.precompute, "cache": recipe.cache.kind,
                 "vae_decoder": recipe.vae_decoder.model_dump(exclude_defaults=True)}
    from h3.levers.vae import VaeConfig
    from h3.levers.vae_decoder import VaeDecoderConfig

    # the video VAE's levers (tiles, the compiled decoder) are the decode's: timed by the decode rows, not here
    update.update(lora=recipe.lora.model_copy(update={"enabled": False}), vae=VaeConfig(), vae_decoder=VaeDecoderConfig(),
                  offload=recipe.offload.model_copy(update={"enabled": False}),
                  adaln=recipe.adaln.model_copy(update={"precompute": False}))
    return recipe.model_copy(update=update), set_aside


def configured_of(recipe) -> dict:
    """What a variant configures of the DiT forward, as each result row records it (``configured``)."""
    return {"quant": recipe.quant.mode, "attention": recipe.attention.backend,
            "sparse_attention": recipe.sparse_attention.sparsity if recipe.sparse_attention.enabled else None,
            "dense_steps": recipe.sparse_attention.dense_steps if recipe.sparse_attention.enabled else None,
            "bucketing": recipe.bucketing.multiple if recipe.bucketing.enabled else None,
            "compile": recipe.compile.enabled,
            **({"fp8_attention": recipe.fp8_attention.kernel} if recipe.fp8_attention.enabled else {}),
            **({"compile_mode": recipe.compile.mode} if recipe.compile.enabled and recipe.compile.mode else {})}


def begin_request(handles: dict) -> None:
    for handle in handles.values():
        if hasattr(handle, "begin_request"):
            handle.begin_request()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@contextlib.contextmanager
def levers_applied(model, recipe, device: str):
    """``recipe``'s levers on ``model`` through the runtime's own ``apply_recipe_levers`` (reversible: the float
    weights are kept); on exit every lever is removed again and dynamo's caches reset, so the next variant starts
    from the stock model."""
    from h3.levers import apply_recipe_levers

    pipe = SimpleNamespace(transformer=model, text_encoder=None, vae=None, audio_vae=None)
    handles = apply_recipe_levers(pipe, recipe, device=device, model_sha256="seeded-random", is_tiny=False,
                                  reversible=True)
    try:
        yield handles
    finally:
        for handle in reversed(list(handles.values())):
            handle.remove()
        torch._dynamo.reset()


def measure_variant(model, inputs: dict, variant: str, repeats: int, device: str = "cuda",
                    count: bool = False, profile: bool = False) -> dict:
    """``count``: count the FLOPs of the first call (only for a variant whose modules are stock nn.Linear).
    ``profile``: after the timed forwards, one more (the sparse kind for a sparse recipe) under torch.profiler, its
    device time by kernel family (bench/lib/speed.py) in ``row["kernels"]``."""
    from h3.anatomy import observe_attention_dispatch
    from h3.levers import lever_configs, lever_telemetry

    recipe, set_aside = variant_recipe(variant)
    row: dict = {"recipe": recipe.name, "set_aside": set_aside, "steps": recipe.steps,
                 "configured": configured_of(recipe),
                 # The lever sections as run, for the product's own executed checks (h200_recipes_table.py).
                 "levers": {config.name: config.model_dump(mode="json") for config in lever_configs(recipe)}}
    dispatched: list[str] = []
    with levers_applied(model, recipe, device) as handles:
        probe = observe_attention_dispatch(lambda name, kw: dispatched.append(name))
        try:
            sparse = "sparse_attention" in handles
            with torch.no_grad():
                begin_request(handles)
                _sync(device)
                t0 = time.perf_counter()
                if count:
                    row["flops"] = count_flops(model, lambda: model(**inputs))
                else:
                    model(**inputs)  # the dense first step of a sparse recipe, the only step kind of the others
                if sparse:
                    model(**inputs)  # and the first sparse step: both paths compiled before timing
                _sync(device)
                row["first_call_s"] = time.perf_counter() - t0
                row["dispatched_first_call"] = sorted(set(dispatched))
                if device.startswith("cuda"):
                    torch.cuda.reset_peak_memory_stats()
                if sparse:
                    state = handles["sparse_attention"]

                    def dense_forward():
                        begin_request(handles)  # step 0: dense
                        model(**inputs)

                    def sparse_forward():
                        state.step, state.dense_step = 1, False
                        model(**inputs)

                    times = cuda_time(dense_forward, repeats, warmup=0)
                    row["dense_forward_s"], row["dense_forward_s_all"] = statistics.median(times), times
                    times = cuda_time(sparse_forward, repeats, warmup=0)
                    row["forward_s"], row["forward_s_all"] = statistics.median(times), times
                else:
                    times = cuda_time(lambda: model(**inputs), repeats, warmup=0)
                    row["forward_s"], row["forward_s_all"] = statistics.median(times), times
                    row["dense_forward_s"] = row["forward_s"]
                if device.startswith("cuda"):
                    row["peak_memory_GiB"] = torch.cuda.max_memory_allocated() / 2**30
                if profile and device.startswith("cuda"):
                    from bench.lib.speed import kernel_breakdown

                    row["kernels"] = kernel_breakdown(sparse_forward if sparse else (lambda: model(**inputs)))
                row["dispatched"] = sorted(set(dispatched))
                row["telemetry"] = {k: v for k, v in lever_telemetry(handles).items() if v.get("applied")}
        finally:
            probe.remove()
    return row


def h200_recipes_speed_main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--shapes", default="5s-768x1344")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--variants", default=DEFAULT_VARIANTS)
    parser.add_argument("--shape-variants", action="append", default=[], metavar="SHAPE=V1,V2",
                        help="the variants for one shape instead of --variants (repeatable)")
    parser.add_argument("--shape-repeats", action="append", default=[], metavar="SHAPE=N",
                        help="--repeats for one shape (repeatable)")
    parser.add_argument("--profile", action="store_true",
                        help="one more forward per variant under torch.profiler: device time by kernel family")
    parser.add_argument("--smoke", action="store_true",
                        help="a smoke run of this script on the CPU: the tiny preset's DiT config, float32")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    device = "cpu" if args.smoke else "cuda"
    result = {**run_record(device), "shapes": {}}
    try:
        import sageattention  # noqa: F401
        from importlib.metadata import version

        result["sageattention"] = version("sageattention")
    except ImportError:
        result["sageattention"] = None
    out = Path(args.out)
    model, _ = build_transformer(dtype=torch.float32 if args.smoke else torch.bfloat16, tiny=args.smoke, device=device)
    result["params"] = sum(p.numel() for p in model.parameters())
    result["num_layers"] = model.config.num_layers
    shape_variants = dict(item.split("=", 1) for item in args.shape_variants)
    shape_repeats = {k: int(v) for k, v in (item.split("=", 1) for item in args.shape_repeats)}
    for shape in [s for s in args.shapes.split(",") if s]:
        variants = expand_variants(shape_variants.get(shape, args.variants))
        repeats = shape_repeats.get(shape, args.repeats)
        geo = latent_geometry(*SHAPES[shape])
        inputs = dit_inputs(geo, model.config, device=device,
                            dtype=torch.float32 if args.smoke else torch.bfloat16)
        entry = result["shapes"].setdefault(shape, {"variants": {}})
        entry["sequence_length"] = geo["text_rows"] + geo["audio_rows"] + geo["video_rows"]
        if variants[0] != "stock":  # otherwise stock's first call counts them
            with torch.no_grad():
                entry["flops_dense"] = count_flops(model, lambda: model(**inputs))
        for i, name in enumerate(variants):
            try:
                row = measure_variant(model, inputs, name, repeats, device, count=(i == 0 and name == "stock"),
                                      profile=args.profile)
                if "flops" in row:
                    entry["flops_dense"] = row.pop("flops")
                row["dense_equivalent_tflops"] = entry["flops_dense"]["total"] / row["forward_s"] / 1e12
            except Exception as exc:  # report the failing variant, keep measuring the others
                row = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2500:]}
                torch._dynamo.reset()
            entry["variants"][name] = row
            print(json.dumps({shape: {name: {k: row.get(k) for k in ("forward_s", "dense_forward_s", "first_call_s",
                                                                      "dispatched", "error")}}}), flush=True)
            stock = entry["variants"].get("stock", {}).get("forward_s")
            for r in entry["variants"].values():
                if stock and r.get("forward_s"):
                    r["speedup_vs_stock"] = stock / r["forward_s"]
            atomic_write_json(out, result)
        del inputs
        if device == "cuda":
            torch.cuda.empty_cache()
    print("wrote", out)


# ---- h200_recipes_table (the CLI: bench/full_size_speed/h200_recipes_table.py) -----------------------------------------------


import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

RESULTS = Path(__file__).resolve().parents[1] / "full_size_speed" / "results"
DURATION_S = {"5s-544x960": 124 / 24, "5s-768x1344": 124 / 24, "15s-768x1344": 362 / 24}
TURBO_STEPS = 4


def load(results: Path, name: str) -> dict | None:
    path = results / name
    return json.loads(path.read_text()) if path.is_file() else None


# Rows measured before a fix that changes them, kept in their files as the record and listed apart, never counted.
SUPERSEDED = {
    ("h200_recipes_544.json", "turbo4-sparse+sparse85+fp8+compile"):
        "dense step with a key-padding mask (SDPA off flash); re-measured in `h200_recipes_sparse_c3.json`",
    ("h200_recipes_544.json", "turbo4-sparse+compile"):
        "failed: quantization's remove() left float weights on the CPU (fixed); re-measured in "
        "`h200_recipes_sparse_c3.json`",
    ("h200_recipes_768_sparse.json", "turbo4-sparse+sparse85+fp8+compile"):
        "dense step with a key-padding mask (SDPA off flash); re-measured in `h200_recipes_sparse_c3.json`",
    ("h200_recipes_sparse_c2.json", "turbo4-sparse+sparse85+fp8+compile"):
        "routing pooled through a float32 copy of Q and K (fixed); re-measured in `h200_recipes_sparse_c3.json`",
    ("h200_recipes_sparse_c2.json", "turbo4-sparse+compile"):
        "routing pooled through a float32 copy of Q and K (fixed); re-measured in `h200_recipes_768_shipped.json` "
        "and `h200_recipes_15s_sparse.json`",
}


def rows(results: list[tuple[str, dict]], superseded: bool = False, retired: dict = SUPERSEDED):
    """(shape, variant, row, file) of every measured variant (or of the superseded ones: those in ``retired``)."""
    for fname, d in results:
        for shape, entry in d.get("shapes", {}).items():
            for variant, row in entry.get("variants", {}).items():
                if ((fname, variant) in retired) == superseded:
                    yield shape, variant, row, fname, entry


def project_row(shape: str, row: dict, stock: dict, tiles_304: bool) -> dict | None:
    vae = stock["vae"]["shapes"].get(shape, {})
    if "forward_s" not in row or not vae:
        return None
    dense_steps = 1 if row.get("configured", {}).get("sparse_attention") is not None else TURBO_STEPS
    denoise = dense_steps * row["dense_forward_s"] + (TURBO_STEPS - dense_steps) * row["forward_s"]
    decode = vae["video_decode_304x320_s" if tiles_304 else "video_decode_256x256_s"]
    d2h = vae["frames_bytes"] / (stock["ceilings"]["pinned_d2h_GBps"] * 1e9)
    total = stock["text"]["text_encode_s"] + denoise + decode + vae["audio_decode_s"] + d2h
    return {"denoise_s": denoise, "video_decode_s": decode, "total_s": total, "rtf": total / DURATION_S[shape]}


def _ratio(row: dict) -> str:
    r = row.get("speedup_vs_stock")
    return f"{r:.2f}×" if r else "— (no stock in this run)"


def verdict(value: float | None, target: float, lower_is_better: bool = True) -> str:
    if value is None:
        return "**not measured**"
    ok = value <= target if lower_is_better else value >= target
    return "**met**" if ok else "**missed**"


SHAPE_ORDER = ("5s-544x960", "5s-768x1344", "15s-768x1344")

def recipe_changed(variant: str, row: dict) -> str:
    """How the variant's recipe configures the forward now, where that differs from what the row recorded (a recipe
    changed after it was measured; issue 23 switched compile on in turbo4-fp8 and turbo4-int8); empty if it does not
    differ or the row recorded nothing."""
    from bench.lib.speed import configured_of, variant_recipe

    was = row.get("configured")
    if not was:
        return ""
    try:
        now = configured_of(variant_recipe(variant)[0])
    except (FileNotFoundError, ValueError):  # a recipe retired since: nothing to compare with
        return ""
    diff = [f"{k} {was.get(k)} then, {now[k]} now" for k in now if was.get(k) != now[k]]
    return "before the recipe changed: " + "; ".join(diff) if diff else ""


def _form(measured: str) -> str:
    variant, _, changed = measured.partition("\0")
    return f"`{variant}`" + (f" ({changed})" if changed else "")


def coverage(results: list[tuple[str, dict]], retired: dict = SUPERSEDED) -> list[str]:
    """Per shipped recipe and shape: measured as shipped, or only in modified forms (which), or not at all."""
    from bench.lib.speed import NOT_A_FORWARD, SAME_FORWARD
    from h3.recipe import known_recipes

    measured: dict[str, set[str]] = {}
    for shape, variant, row, *_ in rows(results, retired=retired):
        if "forward_s" in row:
            # A recipe's own name measured with what it configured then, if it configures something else now.
            changed = recipe_changed(variant, row) if "+" not in variant else ""
            measured.setdefault(shape, set()).add(f"{variant}\0{changed}" if changed else variant)
    lines = ["", "## Coverage: every shipped recipe at every shape", "",
             "| recipe | " + " | ".join(SHAPE_ORDER) + " |", "|---|" + "---|" * len(SHAPE_ORDER)]
    for name in sorted(known_recipes()):
        if name in NOT_A_FORWARD:
            lines.append(f"| `{name}` | {NOT_A_FORWARD[name]} |" + " |" * (len(SHAPE_ORDER) - 1))
            continue
        shipped = SAME_FORWARD.get(name, name)
        cells = []
        for shape in SHAPE_ORDER:
            have = measured.get(shape, set())
            forms = sorted(v for v in have if v != shipped and v.split("+")[0].split("\0")[0] == name)
            if shipped in have:
                cells.append("as shipped" + (f" (`{shipped}`)" if shipped != name else "")
                             + (f"; also {', '.join(map(_form, forms))}" if forms else ""))
            elif forms:
                cells.append("**not as shipped**; measured as " + ", ".join(map(_form, forms)))
            else:
                cells.append("**not measured**")
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return lines


def _copy_profile(offload: dict) -> str:
    """Device time of the transfer-bound request's copies by kind (bench/full_size_speed/h200_offload.py --profile)."""
    copies = offload.get("profile", {}).get("copies", {})
    kinds = [(k.replace("Memcpy ", ""), v["device_ms"] / 1000) for k, v in copies.items() if k.startswith("Memcpy")
             and v["device_ms"] >= 10]
    if not kinds:
        return ""
    total = offload["timings"]["transfer_bound"]["offloaded_request_s"]
    return (f"; profile of the transfer-bound request ({total:.2f} s): "
            + ", ".join(f"{k} {t:.2f} s" for k, t in sorted(kinds, key=lambda x: -x[1])))


CHECKED_LEVERS = ("quant", "attention", "bucketing", "sparse_attention", "compile")
"""The levers a speed row runs; the others (LoRA, AdaLN, offload, VAE) are set aside by bench/full_size_speed/h200_recipes_speed.py."""


def row_lever_configs(row: dict) -> list:
    """The lever configs a row ran: the recipe's own lever sections where the row records them (``levers``, written
    by bench/full_size_speed/h200_recipes_speed.py since issue 19), else rebuilt from the compact ``configured`` of older rows, whose
    sparse variants all ran 128-token blocks (the lever's default) and whose unrecorded settings were the defaults."""
    from h3.levers import REGISTRY

    by_name = {config.name: config for config in REGISTRY}
    if "levers" in row:
        return [by_name[name].model_validate(section, strict=False) for name, section in row["levers"].items()
                if name in CHECKED_LEVERS]
    conf = row.get("configured", {})
    sparse = conf.get("sparse_attention")
    sections = {
        "quant": {"mode": conf.get("quant", "none")},
        "attention": {"backend": conf.get("attention", "native")},
        "bucketing": {"enabled": conf.get("bucketing") is not None, "multiple": conf.get("bucketing") or 64},
        "sparse_attention": {"enabled": sparse is not None, "sparsity": sparse if sparse is not None else 0.5,
                             "dense_steps": conf.get("dense_steps") or 0},
        "compile": {"enabled": bool(conf.get("compile"))},
    }
    return [by_name[name].model_validate(section, strict=False) for name, section in sections.items()]


def not_as_configured(row: dict) -> list[str]:
    """How a run differs from its recipe: the product's own configured-versus-executed checks (each lever's
    ``check_executed``, h3/levers/) on the row's lever telemetry and the attention backends the dispatcher called in
    the timed forwards (empty: it ran as configured). A speed row times bare forwards, not a request, so the checks
    get ``forward_passes = 0`` and skip per-request counts; what they check is the configuration the telemetry shows
    (mode and modules, realized sparsity and dense steps, buckets, compiled regions, the dispatched backend)."""
    from h3.record import Executed

    telemetry = row.get("telemetry", {})
    executed = Executed(forward_passes=0, attention_backends=row.get("dispatched", []), torch_dtype="bfloat16",
                        vae_tiling=True, levers=telemetry)
    off = []
    for config in row_lever_configs(row):
        off += config.check_executed(telemetry.get(config.name), executed)
    return off


def _telemetry_notes(tel: dict) -> str:
    notes = []
    if "quant" in tel:
        notes.append(f"quant {tel['quant']['mode']} ×{tel['quant']['quantized_modules']}")
    if "compile" in tel:
        c = tel["compile"]
        notes.append(f"compile {c['compiled_regions']} regions{' (dynamic)' if c.get('dynamic') else ''}, "
                     f"{c['graphs_compiled_total']} graphs, {c['recompiles_total']} recompiles")
    if "sparse_attention" in tel:
        sa = tel["sparse_attention"]
        realized = sa.get("realized_sparsity")
        notes.append(f"sparse {sa['target_sparsity']:.2f}"
                     + (f" (realized {realized:.3f}, {sa['dense_calls']} dense + {sa['sparse_calls']} sparse calls)"
                        if realized is not None else "")
                     + (f", flex kernel {sa['flex_graphs_compiled_total']} graphs" if "flex_graphs_compiled_total" in sa
                        else ""))
    if "bucketing" in tel:
        notes.append(f"buckets {tel['bucketing'].get('buckets')}")
    return "; ".join(notes)


def render(results_dir: Path = RESULTS) -> str:
    """The table from the JSONs in ``results_dir``; the committed results (the default) also get the record of the
    device calls that made them and the notes explaining them."""
    recorded = Path(results_dir).resolve() == RESULTS
    retired = SUPERSEDED if recorded else {}  # the record's superseded rows; another folder's files may share names
    stock = load(results_dir, "h200_speed_stock.json")
    if stock is None:
        raise FileNotFoundError(f"{results_dir / 'h200_speed_stock.json'} is missing: the ceilings, VAE decode and "
                                "text encoding come from `python bench/full_size_speed/h200_speed.py --out` that file")
    results = [(p.name, json.loads(p.read_text())) for p in sorted(results_dir.glob("h200_recipes_*.json"))]
    protocols = [(p.name, json.loads(p.read_text())) for p in sorted(results_dir.glob("h200_protocol*.json"))]
    offload = load(results_dir, "h200_offload.json")
    first = results[0][1] if results else {}
    lines = ["# Speed at production shapes on one H200: stock diffusers versus the optimized recipes", "",
             f"- device: {first.get('device')}; torch {first.get('torch')} (CUDA {first.get('cuda')}), diffusers "
             f"{first.get('diffusers')}, SageAttention {first.get('sageattention') or 'not installed'} "
             "(built for sm_90 by bench/device/build_sageattention.sh)",
             "- weights: seeded random, full-size configs (no MiniMax-H3 weights here; speed does not depend on weight "
             "values)",
             ("- device calls (each GPU of a 2-GPU H200 machine runs its own process with its own full-size model): "
              "`bash bench/device/h200_speed_table.sh $OUT`, `bash bench/device/h200_last.sh $OUT` (session 2), "
              "`bash bench/device/h200_session3.sh c1|c2|c3 $OUT` (session 3), `bash bench/device/h200_session4.sh "
              "a|b|c|d $OUT` (session 4; both in git history, removed by issue 52), each a slice of `bash bench/device/h200_full.sh OUTDIR` cut to the lending "
              "machine's 10-minute calls; the JSONs they write are copied here, then "
              "`python bench/full_size_speed/h200_recipes_table.py > bench/full_size_speed/results/h200_recipes_speed.md`" if recorded else
              f"- results: `{results_dir}` (`bash bench/device/h200_full.sh OUTDIR`)"), ""]
    for fname, d in results + protocols + ([("h200_offload.json", offload)] if offload else []):
        lines.append(f"- `{fname}`: `{d['command']}` ({d['date']}, {d['device']})")
    lines += ["", "Each variant is a shipped recipe applied by the runtime's own `apply_recipe_levers` to the full-size "
              "DiT; `+compile` switches its `[compile]` section on (`+dynamic`: with dynamic shapes), `+bucket` "
              "switches 128-row shape buckets on, `+sparse85` sets block-sparse attention to 85 % (128-token blocks, "
              "dense first step, 128-row buckets), `+sage`/`+cudnn`/`+fp8` override the attention backend / "
              "quantization. The LoRA is set aside in every turbo variant (fused, it changes no shape or FLOP). Ratios "
              "are against `stock` measured in the same process (same file). A turbo4 request is projected from the "
              "anatomy: text encoding + 4 DiT forwards (a block-sparse recipe: its dense first step, then 3 sparse "
              "ones) + video decode with the recipe's tiles + audio decode + frame download.", "",
              "## One DiT forward", "",
              "| shape | variant | s / forward | dense step (s) | vs stock | dense-equiv. TFLOP/s | of bf16 ceiling "
              "| peak GiB | first call (s) | attention ran | telemetry | as configured | turbo4 request (s) | RTF | file |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    ceiling = stock["ceilings"]["bf16_matmul_tflops"]
    best: dict[str, tuple[float, str]] = {}
    requests: dict[tuple[str, str], dict] = {}
    counted: list[tuple[str, str, dict]] = []
    configured_ok = 0
    ordered = sorted(rows(results, retired=retired), key=lambda r: (SHAPE_ORDER.index(r[0]) if r[0] in SHAPE_ORDER else 9, r[3]))
    for shape, variant, row, fname, entry in ordered:
        if "error" in row:
            lines.append(f"| {shape} | {variant} | error: {row['error'][:120]} |" + " |" * 12 + f" `{fname}` |")
            continue
        off = not_as_configured(row)
        configured_ok += not off
        # the tile the recipe had for this resolution when it was measured (set aside from the forward's timing)
        tiles = (row.get("set_aside", {}).get("vae_tiles") or {}).get(shape.split("-", 1)[1]) == [304, 320]
        proj = project_row(shape, row, stock, tiles)
        tflops = row.get("dense_equivalent_tflops")
        lines.append(
            f"| {shape} | {variant} | {row['forward_s']:.2f} | {row['dense_forward_s']:.2f} "
            f"| {_ratio(row)} | {tflops:.0f} | {100 * tflops / ceiling:.0f}% "
            f"| {row.get('peak_memory_GiB', 0):.1f} | {row['first_call_s']:.1f} | {', '.join(row.get('dispatched', []))} "
            f"| {_telemetry_notes(row.get('telemetry', {}))} | {'yes' if not off else '**no**: ' + '; '.join(off)} "
            f"| {proj['total_s']:.1f} | {proj['rtf']:.2f} | `{fname}` |" if proj else
            f"| {shape} | {variant} | {row['forward_s']:.2f} |" + " |" * 12 + f" `{fname}` |")
        if off:  # a figure from a run that did not run as its recipe says counts for no target
            continue
        requests[(shape, variant)] = proj or {}
        counted.append((shape, variant, row))
        dense_only = row.get("configured", {}).get("sparse_attention") is None
        if dense_only and (shape not in best or row["forward_s"] < best[shape][0]):
            best[shape] = (row["forward_s"], variant)
    old = list(rows(results, superseded=True, retired=retired))
    if old:
        lines += ["", "Superseded measurements (kept in their files, not counted above or below):", "",
                  "| shape | variant | s / forward | dense step (s) | as configured | file | why |",
                  "|---|---|---|---|---|---|---|"]
        for shape, variant, row, fname, _ in old:
            fwd = f"{row['forward_s']:.2f}" if "forward_s" in row else "error"
            dense = f"{row['dense_forward_s']:.2f}" if "dense_forward_s" in row else ""
            off = not_as_configured(row) if "forward_s" in row else []
            checked = "" if "forward_s" not in row else "yes" if not off else "**no**: " + "; ".join(off)
            lines.append(f"| {shape} | {variant} | {fwd} | {dense} | {checked} | `{fname}` | "
                         f"{retired[(fname, variant)]} |")

    lines += coverage(results, retired)
    measured = sum(1 for *_, row, _f, _e in ordered if "forward_s" in row)
    lines += ["", "## Targets", "",
              f"Runs that ran as configured (the runtime's telemetry and the dispatched attention backends against "
              f"the recipe; a run that did not counts for no target): **{configured_ok} of {measured}**.", "",
              "| target | measured | verdict |", "|---|---|---|"]
    dense768 = best.get("5s-768x1344")
    lines.append(f"| dense optimized forward ≤ 3.3 s at 5 s 768×1344 | "
                 + (f"{dense768[0]:.2f} s (`{dense768[1]}`)" if dense768 else "—")
                 + f" | {verdict(dense768[0] if dense768 else None, 3.3)} |")
    sparse = [(row["forward_s"], v) for shape, v, row in counted
              if shape == "5s-768x1344" and row.get("configured", {}).get("sparse_attention") == 0.85]
    sp = min(sparse) if sparse else None
    lines.append(f"| 85 % block-sparse forward ≤ 1.6 s at 5 s 768×1344 | "
                 + (f"{sp[0]:.2f} s (`{sp[1]}`, sparse step)" if sp else "—") + f" | {verdict(sp[0] if sp else None, 1.6)} |")
    r15 = sorted((p["total_s"], v, p) for (shape, v), p in requests.items()
                 if shape == "15s-768x1344" and p and v.startswith("turbo4-sparse"))
    if r15:
        total, v, p = r15[0]
        lines.append(f"| 15 s 768×1344 `turbo4-sparse` request ≤ 25 s generation-side | {total:.1f} s (`{v}`, "
                     f"projected: denoise {p['denoise_s']:.1f} s + video decode {p['video_decode_s']:.1f} s with "
                     f"304×320 tiles + text, audio, frames) | {verdict(total, 25.0)} |")
    else:
        lines.append("| 15 s 768×1344 `turbo4-sparse` request ≤ 25 s generation-side | not measured | **not measured** |")
    r544 = sorted((p["total_s"], v, p) for (shape, v), p in requests.items() if shape == "5s-544x960" and p)
    if r544:
        total, v, p = r544[0]
        lines.append(f"| 5 s 544×960 request faster than real time (≤ 5.2 s) | {total:.1f} s (`{v}`, projected: "
                     f"denoise {p['denoise_s']:.1f} s + video decode {p['video_decode_s']:.1f} s + text, audio, "
                     f"frames) | {verdict(total, 5.2)} |")
    for fname, protocol in protocols:
        for variant, p in protocol.get("variants", {}).items():
            if "mixed_over_repeated_p50" in p:
                flag = p.get("recompile_flag", {})
                flex = [m.get("flex_graphs_compiled") for m in p.get("mixed", [])]
                lines.append(
                    f"| mixed-prompt p50 within 3 % of repeated (`{variant}`, {protocol['shape']}, `{fname}`) | "
                    f"repeated {p['repeated_p50_s']:.2f} s, mixed {p['mixed_p50_s']:.2f} s "
                    f"({100 * (p['mixed_over_repeated_p50'] - 1):+.1f} %); recompile flag: "
                    f"{len(flag.get('shapes', []))} of {flag.get('first_at_shape')} new sequence lengths; graphs "
                    f"compiled per mixed request {[m.get('graphs_compiled') for m in p.get('mixed', [])]}"
                    + (f", flex-kernel graphs {flex}" if any(g is not None for g in flex) else "")
                    + f" | {verdict(p['mixed_over_repeated_p50'], 1.03)} |")
            else:
                lines.append(f"| mixed-prompt p50 within 3 % of repeated (`{variant}`, `{fname}`) | "
                             f"{p.get('error', 'not finished in the device time')} | **not measured** |")
    if offload and "fraction_of_pinned_ceiling" in offload:
        lines.append(f"| offload streaming ≥ 90 % of the pinned ceiling (`{offload['recipe']}`) | "
                     f"{offload['achieved_stream_GBps']:.1f} GB/s of {offload['pinned_h2d_GBps']:.1f} GB/s "
                     f"({100 * offload['fraction_of_pinned_ceiling']:.0f} %); hidden behind compute at "
                     f"{offload['shape']}: {100 * offload['production']['hidden_fraction']:.0f} %"
                     + _copy_profile(offload)
                     + f" | {verdict(offload['fraction_of_pinned_ceiling'], 0.9, lower_is_better=False)} |")
    if recorded:
        lines += ["", "## What these runs found", ""] + [f"- {n}" for n in NOTES]
    return "\n".join(lines) + "\n"


NOTES = [
    # session 4
    "**Every shipped recipe as shipped (session 4).** Side by side with stock in one process: at 544×960 (stock "
    "2.46 s) `turbo4-fp8-sage-compile` 1.55 s (1.58×), `turbo4-int8` + compile 2.02 s (1.21×), eager `turbo4-fp8-sage` "
    "2.28 s (1.08×), eager `turbo4-sparse` 2.34 s (1.05×; dense step 2.51 s), eager `turbo4-fp8` 2.50 s (0.98×), eager "
    "`turbo4-int8` 3.43 s (0.72×); at 768×1344 (stock 6.59 s) `turbo4-fp8-sage-compile` 4.26 s (1.55×), "
    "`turbo4-sparse` + compile 5.25 s (1.26×; dense step 6.02 s), eager `turbo4-sparse` 5.89 s (1.12×), eager "
    "`turbo4-int8` 8.43 s (0.78×). At 15 s 768×1344 (no stock in those runs; session 3 measured it at 39.0 s): "
    "`turbo4-fp8-sage-compile` 26.0 s, `turbo4-sparse` + compile 28.8 s (dense step 37.2 s), eager `turbo4-fp8-sage` "
    "30.2 s, eager `turbo4-sparse` 30.6 s (dense step 39.0 s), `turbo4-int8` + compile 36.2 s, eager `turbo4-fp8` "
    "39.1 s, eager `turbo4-int8` 44.1 s.",
    "**Eager INT8 W8A8 is slower than stock bf16** (0.72× at 544×960, 0.78× at 768×1344): eager, each linear runs "
    "the activation's quantization and the int8 matmul's rescale as separate kernels; compiled, they fuse (1.21× at "
    "544×960). The shipped `turbo4-int8`, `turbo4-fp8`, `turbo4-fp8-sage` and `turbo4-sparse` recipes are eager; "
    "`turbo4-fp8-sage-compile` is the one shipped with compile on. Since issue 23, `turbo4-fp8` and `turbo4-int8` ship "
    "with compile on and 128-row buckets: compiled, both measured faster than stock at every shape (FP8 1.41×, 1.26×, "
    "1.11×; INT8 1.21×, 1.16×, 1.08× at 544×960, 768×1344, 15 s); their eager rows above are their earlier form (the "
    "coverage table says so).",
    "**85 % block-sparse at 15 s (session 4).** With 85 % sparsity, FP8 and compile the sparse step is 11.9 s against "
    "its dense first step's 34.9 s (2.9×; at 5 s 768×1344 it is 2.57 against 5.25 s, 2.0×: the longer the sequence, "
    "the larger attention's share). The projected 15 s request is 89.3 s: the dense step (FP8, no Sage) and the video "
    "decode (18.5 s) alone are 53 s of the 25 s target.",
    "**Offload re-measured after the resident top-level group (session 4).** Streaming now runs at 54.4 of 55.4 GB/s "
    "(98 % of the pinned ceiling; session 3: 20 %, kept in `h200_offload_s3.json`), and 90 % of the transfer is "
    "hidden behind compute at 544×960: the offloaded request takes 10.56 s against 10.42 s with the model resident "
    "(+1.4 %), with a 4.9 GiB peak. The profile of the transfer-bound request shows only the pinned block copies "
    "(1.42 s of 1.49 s); the pageable copies that took 5.9 s are gone (0.2 ms).",
    "**Mixed prompts on the shipped recipes (session 4).** `turbo4-fp8-sage-compile` as shipped: +0.3 %; "
    "`turbo4-sparse` + compile: +0.4 % (session 3, before the routing-pooling fix: +2.4 %). The flex kernel's graph "
    "counter ran on the H200 for the first time: 1 graph at warm-up, then 1 more only for the prompt that landed in a "
    "new bucket (with the blocks' 4), none for the prompts within a bucket.",
    # session 3
    "**Bucketing without a mask (session 3).** Bucketing and block-sparse attention now run attention outside the "
    "compiled graphs on the real rows only (`h3.levers.bucketing.attend_valid_rows`: slice to the request's length, "
    "attend with the recipe's backend and no mask, pad the output with zero rows). The padded dense step no longer "
    "drops SDPA off flash: the block-sparse recipe's dense step went from 6.59 to 5.25 s at 768×1344 and from 2.17 to "
    "1.78 s at 544×960, level with the unbucketed FP8 + compile forward (5.16 / 1.77 s). Sage, which takes no mask, "
    "can now be bucketed: `turbo4-fp8-sage+compile+bucket` 4.27 s at 768×1344 (4.21 s unbucketed in session 2) and "
    "1.55 s at 544×960 (1.56 s).",
    "**Mixed prompts (session 3).** With 128-row buckets the compiled recipes keep one set of graphs for every prompt "
    "length in a bucket: mixed-prompt p50 is within 0.2 % of repeated for FP8 + Sage + compile and +2.4 % for the "
    "block-sparse recipe (session 2, static shapes: +105 %). A prompt that lands in a new bucket still compiles (4 "
    "graphs, +9.8 s on its first request, flagged by the recompile rule); a server compiles its buckets at start-up. "
    "`compile.dynamic = true` also meets the p50 target (-0.1 %) but its warm-up took 76 s against 20 s, its forward "
    "is 1.7 % slower (4.28 vs 4.21 s at 768×1344), and it still compiled 6 graphs at the 59-row prompt. Three causes "
    "of per-length recompiles were removed on the way, all caught on the CPU by "
    "`test_bucketed_sparse_recipe_compiles_once_per_bucket`: the sparse processor read the request's real length "
    "inside the compiled blocks; the separately compiled flex kernel's mask closed over that length as an int (its "
    "graphs are now counted in the lever's telemetry, `flex_graphs_compiled_*`); and the token refiner's two blocks, "
    "which see the prompt's text rows alone, were compiled (the compile lever now takes "
    "the 50 DiT blocks only: '50 regions' in the rows of session 3, '52' before).",
    "**Block-sparse telemetry under compile (session 3).** The attention call runs outside the compiled graphs, so "
    "the lever's per-call counters hold under torch.compile: realized sparsity 0.848 at 85 % and 0.498 at 50 % "
    "(768×1344), 1 dense + N sparse forwards per request as configured.",
    "**Block-sparse routing cost.** Eager routing first pooled each block through a float32 copy of Q and K: the "
    "85 % sparse step measured 2.79 s (c2, superseded); pooling with a float32 accumulator instead of a copy brought "
    "it back to 2.57 s (c3; 2.58 s in session 2 with the routing inside the compiled graph). `turbo4-sparse+compile` "
    "at 768×1344 and 15 s (`h200_recipes_sparse_c2.json`) was measured before that fix; its sparse steps are a little "
    "slow for it (about 0.2 s per forward at 768×1344).",
    "**Offload (session 3, after the buffer fix).** The offloaded forward's peak fell from 20 GiB to 2.7 GiB "
    "(transfer-bound) and 5.6 GiB (544×960): the INT8 weights no longer stay on the GPU. Streaming still reached only "
    "11.0 of 54.0 GB/s (20 %). The profile (`--profile`, in `h200_offload.json`) says why: the pinned host-to-device "
    "copies of the 50 blocks took 1.45 s of the 7.35 s transfer-bound request (81 GB at about 56 GB/s, the pinned "
    "ceiling), while diffusers' top-level group (token refiner, embedders, output norm: 0.84 B parameters), which it "
    "never streams, went back to pageable memory and returned at every forward: 4.98 s device-to-pageable and 0.96 s "
    "pageable-to-device. Fixed after the run: the offload lever keeps that group on the device "
    "(`offload.resident_top_level`, default on; CPU test `test_offload_keeps_the_top_level_group_resident`, GPU test "
    "extended). Re-measured in session 4 (above): 98 %.",
    "**Eager FP8 gains nothing** (6.53 s vs 6.50 s stock at 768×1344): the activation quantization runs as separate "
    "kernels; compiled, it fuses (5.16 s). Eager Sage on FP8 is 5.58 s; INT8 W8A8 + compile 5.62 s (FP8 is faster on "
    "Hopper). At 15 s 768×1344 FP8 + Sage + compile is 26.2 s per forward against 39.0 s stock (1.49×).",
    "**Why the targets are out of reach on one H200.** At 768×1344 FP8 + Sage + compile already runs at 839 dense-"
    "equivalent TFLOP/s (108 % of the bf16 matmul ceiling); 3.3 s needs 1,070, i.e. attention (58 % of the FLOPs at "
    "this length) and linears both near the FP8 ceiling. A 544×960 request cannot be real time while its video decode "
    "alone takes 3.7 s (256×256 tiles; 2.8 s at 304×320), nor a 15 s 768×1344 request be 25 s while its decode takes "
    "18.5 s and a dense step 26 s.",
    # session 2
    "The first run of session 2 measured every compiled variant *slower* than eager: the runtime's attention-dispatch "
    "probe (`h3.anatomy.observe_attention_dispatch`) was traced into the compiled blocks, dynamo guarded on its "
    "growing list and recompiled at every forward. The probe is now `torch.compiler.disable`d; every figure above is "
    "after the fix (0 recompiles in every compiled variant). Test: "
    "`test_compiled_blocks_do_not_recompile_under_the_dispatch_probe`.",
    "`+cudnn` (diffusers' `_native_cudnn`) is no faster than the default SDPA kernel here (5.25 vs 5.16 s).",
    "Sage (INT8 Q/K, FP8 P/V) is the largest single gain: 5.16 → 4.21 s at 768×1344 on top of FP8 + compile; its "
    "accuracy is gated separately (seed 002: it 'dropped overall consistency on every eligible clip').",
]


def h200_recipes_table_main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="folder of the JSONs (default: the committed bench/full_size_speed/results)")
    args = parser.parse_args()
    try:
        sys.stdout.write(render(args.results))
    except (FileNotFoundError, json.JSONDecodeError) as exc:
        sys.exit(f"h200_recipes_table: {exc}")
