"""Offload on the GPU: the ``offload-int8-adaln`` recipe with the full-size DiT forced off the device.

    python bench/full_size_speed/h200_offload.py --out $OUT/offload.json [--shape 5s-544x960] [--repeats 2]

The full-size ``MiniMaxH3Transformer3DModel`` (seeded random weights) gets the recipe's levers through the runtime's
own code — AdaLN precompute for the recipe's 4-step schedule (the ``adaln_proj`` weights leave), INT8 weight-only
quantization, then diffusers' block-level group offloading with a prefetch stream and pinned host memory — and is
timed against the same quantized model kept resident, in one process:

* the pinned host-to-device ceiling (a 2 GiB pinned copy, as bench/full_size_speed/h200_speed.py measures it);
* the bytes that stream per forward (every parameter and buffer of the offloaded transformer);
* a transfer-bound forward (a short sequence: 256 text rows, 1 s of audio, one latent frame of video): its time
  bounds the transfer time from above, so ``bytes / time`` is the *achieved* streaming bandwidth (a lower bound);
* a request at the production shape offloaded and resident: the exposed transfer is the difference, and the hidden
  fraction is ``1 - exposed / (bytes / achieved bandwidth)`` per forward.

The LoRA of the recipe is set aside (no LoRA file here; fused, it changes no shape), as in bench/full_size_speed/h200_recipes_speed.py.
Target (speed issue): streaming at >= 90% of the pinned ceiling.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import traceback
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from h3.atomic import atomic_write_json  # noqa: E402
from bench.lib.speed import (  # noqa: E402
    SHAPES, build_transformer, cuda_time, dit_inputs, latent_geometry, run_record)


def pinned_h2d_GBps(nbytes: int = 2 * 1024**3) -> float:
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    t = statistics.median(cuda_time(lambda: dev.copy_(host, non_blocking=True), 5, 1))
    del host, dev
    return nbytes / t / 1e9


def module_bytes(module: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in list(module.parameters()) + list(module.buffers()))


def profile_copies(run) -> dict:
    """CUDA time per memcpy kind and in compute kernels over one call of ``run`` (torch.profiler, CUDA activity).

    A copy from pageable host memory shows as ``Memcpy HtoD (Pageable -> Device)`` and runs at a fraction of the pinned
    rate; copies that do not overlap kernels leave the GPU idle. This is what to read when streaming is slow."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        run()
        torch.cuda.synchronize()
    kinds: dict[str, dict] = {}
    kernels_us = 0.0
    for evt in prof.key_averages():
        device_us = getattr(evt, "device_time_total", None) or getattr(evt, "cuda_time_total", 0.0)
        if evt.key.startswith("Memcpy") or evt.key.startswith("Memset"):
            kinds[evt.key] = {"count": evt.count, "device_ms": device_us / 1000.0}
        elif getattr(evt, "device_type", None) is not None and "CUDA" in str(evt.device_type):
            kernels_us += device_us
    return {"copies": kinds, "kernels_device_ms": kernels_us / 1000.0,
            "top_cpu": prof.key_averages().table(sort_by="cpu_time_total", row_limit=15)}


def main() -> None:
    from h3.levers import apply_recipe_levers, lever_telemetry
    from h3.levers.adaln import schedule_timesteps
    from h3.recipe import load_recipe
    from h3.tiny import schedulers

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--shape", default="5s-544x960")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--recipe", default="offload-int8-adaln")
    parser.add_argument("--profile", action="store_true",
                        help="profile one transfer-bound offloaded request: host-to-device copies by kind "
                             "(pinned or pageable source), their time, and the compute kernels' time")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    result: dict = {**run_record(), "shape": args.shape, "recipe": args.recipe}
    out = Path(args.out)

    try:
        result["pinned_h2d_GBps"] = pinned_h2d_GBps()
        recipe = load_recipe(args.recipe)
        result["set_aside"] = {"lora": recipe.lora.enabled}
        recipe = recipe.model_copy(update={"lora": recipe.lora.model_copy(update={"enabled": False})})
        model, _ = build_transformer()
        # The pipeline's own schedulers, as the tiny preset builds them (MiniMax-H3's shifts).
        pipe = SimpleNamespace(transformer=model, text_encoder=None, vae=None, audio_vae=None, **schedulers(),
                               keyframe_noise_aug=0.999)
        timesteps = schedule_timesteps(pipe, recipe.num_inference_steps, torch.device("cuda"))[: recipe.steps]
        resident_recipe = recipe.model_copy(update={"offload": recipe.offload.model_copy(update={"enabled": False})})
        handles = apply_recipe_levers(pipe, resident_recipe, device="cuda", model_sha256="seeded-random",
                                      is_tiny=False)
        result["resident_telemetry"] = {k: v for k, v in lever_telemetry(handles).items() if v.get("applied")}
        result["bytes_per_forward"] = module_bytes(model)

        def inputs_for(geo):
            base = dit_inputs(geo, model.config)
            # The pipeline's own per-step timesteps: one value when video and audio share it (the first step), so
            # every row then indexes entry 0.
            return [{**base, "timestep": t.to(base["timestep"].dtype),
                     "timestep_indices": base["timestep_indices"] if t.numel() > 1
                     else torch.zeros_like(base["timestep_indices"])} for t in timesteps]

        short_geo = {**latent_geometry(*SHAPES[args.shape]), "audio_rows": 80, "latent_frames": 1}
        short_geo["video_rows"] = (SHAPES[args.shape][1] // 32) * (SHAPES[args.shape][2] // 32)
        geos = {"transfer_bound": short_geo, args.shape: latent_geometry(*SHAPES[args.shape])}

        def request(calls):
            for c in calls:
                model(**c)

        timings: dict = {}
        with torch.no_grad():
            for label, geo in geos.items():
                calls = inputs_for(geo)
                request(calls)  # warm-up
                timings.setdefault(label, {})["resident_request_s"] = statistics.median(
                    cuda_time(lambda: request(calls), args.repeats, 0))
                timings[label]["sequence_length"] = geo["text_rows"] + geo["audio_rows"] + geo["video_rows"]
        torch.cuda.synchronize()
        model.to("cpu")  # forced off the device: the offload lever streams it back block by block
        gc.collect()
        torch.cuda.empty_cache()
        result["device_memory_after_move_GiB"] = torch.cuda.memory_allocated() / 2**30
        from h3.levers.offload import apply_offload

        o = recipe.offload
        handles["offload"] = apply_offload(pipe, o.model_copy(update={"enabled": True, "text_encoder": False}),
                                           onload_device="cuda")
        with torch.no_grad():
            for label, geo in geos.items():
                calls = inputs_for(geo)
                request(calls)  # warm-up (pins and fills the prefetch pipeline)
                torch.cuda.reset_peak_memory_stats()
                timings[label]["offloaded_request_s"] = statistics.median(
                    cuda_time(lambda: request(calls), args.repeats, 0))
                timings[label]["offloaded_peak_GiB"] = torch.cuda.max_memory_allocated() / 2**30
        result["offload_telemetry"] = handles["offload"].telemetry()
        if args.profile:
            result["profile"] = profile_copies(lambda: request(inputs_for(geos["transfer_bound"])))
        steps = len(timesteps)
        tb = timings["transfer_bound"]
        achieved = result["bytes_per_forward"] * steps / tb["offloaded_request_s"] / 1e9
        result["achieved_stream_GBps"] = achieved
        result["fraction_of_pinned_ceiling"] = achieved / result["pinned_h2d_GBps"]
        prod = timings[args.shape]
        transfer_per_request = result["bytes_per_forward"] * steps / (achieved * 1e9)
        exposed = max(0.0, prod["offloaded_request_s"] - prod["resident_request_s"])
        result["production"] = {"transfer_s_per_request": transfer_per_request, "exposed_s": exposed,
                                "hidden_fraction": 1 - min(1.0, exposed / transfer_per_request)}
        result["timings"] = timings
        result["steps"] = steps
    except Exception as exc:  # report what failed with what was measured before it
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()[-2500:]
    atomic_write_json(out, result)
    print(json.dumps({k: result.get(k) for k in ("pinned_h2d_GBps", "achieved_stream_GBps", "fraction_of_pinned_ceiling",
                                                   "production", "error")}), flush=True)


if __name__ == "__main__":
    main()
