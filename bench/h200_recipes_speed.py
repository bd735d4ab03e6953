"""Full-size DiT forward with the runtime's levers, side by side with stock diffusers, in one process on one GPU.

    python bench/h200_recipes_speed.py --out $OUT/h200_recipes.json [--shape 5s-768x1344] [--repeats 2]
                                       [--variants stock,compile,fp8+compile,sparse85+fp8+compile]

Seeded random weights (no MiniMax-H3 weights here; speed does not depend on weight values). Each variant applies the
levers of h3/levers to the same full-size transformer (default config), times one DiT forward on the packed sequence
of the shape (warm-up, which pays compilation, excluded and reported separately), then removes them again, so the
variants are measured side by side. Partial results are written after every variant.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.h200_speed import SHAPES, build_transformer, count_flops, cuda_time, dit_inputs, latent_geometry  # noqa: E402


def apply_variant(model, name: str) -> list:
    """Apply the levers of a variant; returns handles to remove (last applied first)."""
    from h3.levers.compile import CompileConfig, apply_compile
    from h3.levers.quantization import QuantizationConfig, apply_quantization
    from h3.levers.sparse_attention import SparseAttentionConfig, apply_sparse_attention

    handles = []
    parts = name.split("+")
    for part in parts:
        if part == "stock":
            continue
        if part.startswith("sparse"):
            sparsity = int(part[len("sparse"):]) / 100.0
            handles.append(apply_sparse_attention(model, SparseAttentionConfig(block_size=128, sparsity=sparsity,
                                                                              dense_steps=0)))
        elif part in ("fp8", "int8"):
            mode = "fp8_w8a8" if part == "fp8" else "int8_w8a8"
            # The float32 projections, time embedder and norms stay in floating point (the lever's defaults).
            from h3.recipe import QuantConfig

            handles.append(apply_quantization(model, QuantizationConfig(mode=mode, exclude=list(QuantConfig().exclude),
                                                                        keep_originals=True)))
        elif part == "compile":
            handles.append(apply_compile(model, CompileConfig()))
        else:
            raise ValueError(f"unknown variant part {part!r}")
    return handles


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--shape", default="5s-768x1344")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--variants", default="stock,compile,fp8+compile,sparse85+fp8+compile")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    result = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "device": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": args.shape,
              "weights": "seeded random (speed does not depend on weight values)", "variants": {}}
    model, _ = build_transformer()
    geo = latent_geometry(*SHAPES[args.shape])
    inputs = dit_inputs(geo, model.config)
    result["sequence_length"] = geo["text_rows"] + geo["audio_rows"] + geo["video_rows"]
    with torch.no_grad():
        result["flops_dense"] = count_flops(model, lambda: model(**inputs))
    for name in [v for v in args.variants.split(",") if v]:
        row: dict = {}
        handles = []
        try:
            handles = apply_variant(model, name)
            with torch.no_grad():
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                model(**inputs)
                torch.cuda.synchronize()
                row["first_call_s"] = time.perf_counter() - t0  # pays compilation, excluded from the timing
                torch.cuda.reset_peak_memory_stats()
                times = cuda_time(lambda: model(**inputs), args.repeats, warmup=1)
            row.update(forward_s=statistics.median(times), forward_s_all=times,
                       peak_memory_GiB=torch.cuda.max_memory_allocated() / 2**30,
                       telemetry={type(h).__name__: (h.telemetry() if hasattr(h, "telemetry") else None)
                                  for h in handles})
            row["dense_equivalent_tflops"] = result["flops_dense"]["total"] / row["forward_s"] / 1e12
        except Exception as exc:  # report the failing variant, keep measuring the others
            row["error"] = f"{type(exc).__name__}: {exc}"
            row["traceback"] = traceback.format_exc()[-1500:]
        finally:
            for handle in reversed(handles):
                try:
                    handle.remove()
                except Exception as exc:  # a handle that cannot be removed leaves the model unusable: stop
                    row["remove_error"] = f"{type(exc).__name__}: {exc}"
            torch._dynamo.reset()
        result["variants"][name] = row
        print(json.dumps({name: {k: v for k, v in row.items() if k in ("forward_s", "first_call_s", "error")}}),
              flush=True)
        Path(args.out).write_text(json.dumps(result, indent=2, default=str))
        if "remove_error" in row:
            break
    stock = result["variants"].get("stock", {}).get("forward_s")
    for name, row in result["variants"].items():
        if stock and row.get("forward_s"):
            row["speedup_vs_stock"] = stock / row["forward_s"]
    Path(args.out).write_text(json.dumps(result, indent=2, default=str))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
