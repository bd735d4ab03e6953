"""Speed at production shapes on one GPU: the chip's ceilings, then stock diffusers MiniMax-H3 at the seeds' shapes.

    python bench/h200_speed.py --out $OUT/h200_speed.json [--shapes 5s-544x960,5s-768x1344,15s-768x1344]
                               [--parts ceilings,dit,vae,text] [--repeats 3]

No MiniMax-H3 weights are available here: the full-size models are built from diffusers' / transformers' default
configs with seeded random weights. Speed does not depend on weight values (dense kernels do the same work on any
numbers), so the figures stand for the real checkpoint; quality does not, and nothing here measures it.

What is timed (CUDA events around each call, warm-up excluded, median of ``--repeats``):
* ceilings: bf16 and fp8 (e4m3, torch._scaled_mm) 8192³ matmuls, device-to-device copy, pinned host-to-device copy;
* one DiT forward of ``MiniMaxH3Transformer3DModel`` (default config: 50 blocks, 5376 wide, 56×128 heads) on the
  packed sequence of each shape (256 text tokens, stereo audio rows at 40/s, video rows of the (1,2,2)-patched
  latents), stock: bf16 with the checkpoint's float32 modules kept float32, eager, native SDPA. FLOPs are counted
  from the shapes each nn.Linear and each attention call actually saw (2·m·n·k; attention 4·N²·inner);
* the video VAE decode (``AutoencoderKLMiniMaxH3`` default config) at each shape, stock 256×256 tiles and the
  304×320 tiles of seed 000; the audio VAE decode; the Qwen3-VL text encoding (a 5120-wide, 64-layer text model,
  the conditioner MiniMax-H3's ``text_dim`` implies) of a 256-token prompt;
* a projection of the per-request generation-side latency from that anatomy (text + steps × forward + decodes).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

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


def main() -> None:
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


if __name__ == "__main__":
    main()
