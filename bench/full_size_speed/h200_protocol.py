"""The A/B speed protocol on the GPU: mixed versus repeated prompts for the compiled and the block-sparse recipes.

    python bench/full_size_speed/h200_protocol.py --out $OUT/protocol.json [--shape 5s-544x960] [--requests 6]
        [--variants turbo4+compile,turbo4-sparse+compile]

A prompt's length changes the packed sequence (its text rows), so a server that compiles per exact shape pays a
compile at every new prompt length (seed 001: 12-14 s per new length). Per variant, on the full-size DiT with seeded
random weights (bench/full_size_speed/h200_recipes_speed.py applies the recipe through the runtime's own lever code): one warm-up
request (excluded), then ``--requests`` requests of the same prompt (*repeated*) and ``--requests`` requests of
different prompts (*mixed*: the first prompts of the shipped ``vbench-dev16`` suite, whose token counts under the
tiny preset's byte-level BPE tokenizer give the text rows; the real Qwen tokenizer is not here). A request is the
recipe's ``steps`` DiT forwards, timed with CUDA events; p50/p90 as in the CPU protocol (h3eval.speed.quantile), the
recompile flag per new sequence shape with h3eval.speed's rule (1.25x the steady state and 0.5 s), and the compile
lever's own counters per request. Target (speed issue): mixed-prompt p50 within 3% of repeated.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.speed import begin_request, levers_applied, variant_recipe  # noqa: E402
from h3.atomic import atomic_write_json  # noqa: E402
from bench.lib.speed import SHAPES, build_transformer, dit_inputs, latent_geometry, run_record  # noqa: E402


def prompt_text_rows(n: int) -> list[int]:
    from tokenizers import Tokenizer

    from h3eval.prompts import load_prompts

    tokenizer = Tokenizer.from_file(str(Path(__file__).resolve().parents[2] / "h3" / "assets" /
                                        "tiny_tokenizer.json"))
    prompts = [p.prompt for p in load_prompts("vbench-dev16").prompts][:n]
    return [len(tokenizer.encode(p).ids) for p in prompts]


def run_request(model, inputs: dict, handles: dict, steps: int, device: str) -> dict:
    compile_handle = handles.get("compile")
    begin_request(handles)  # the step counters, and the compile lever's per-request counters
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    t0 = time.perf_counter()
    for _ in range(steps):
        model(**inputs)
    if device == "cuda":
        end.record()
        torch.cuda.synchronize()
        latency = start.elapsed_time(end) / 1000.0
    else:
        latency = time.perf_counter() - t0
    row = {"latency_s": latency}
    if compile_handle is not None:
        tel = compile_handle.telemetry()
        row.update(graphs_compiled=tel["graphs_compiled_this_request"], recompiles=tel["recompiles_this_request"])
    if "sparse_attention" in handles:  # the block-sparse kernel is compiled on its own: its graphs count too
        row["flex_graphs_compiled"] = handles["sparse_attention"].telemetry()["flex_graphs_compiled_this_request"]
    return row


def measure(model, variant: str, shape: str, lengths: list[int], requests: int, device: str, dtype) -> dict:
    from h3.levers import lever_telemetry
    from h3eval.speed import flag_first_at_shape, quantile

    recipe, set_aside = variant_recipe(variant)
    geo0 = latent_geometry(*SHAPES[shape])

    def inputs_for(text_rows: int) -> dict:
        return dit_inputs({**geo0, "text_rows": text_rows}, model.config, device=device, dtype=dtype)

    out: dict = {"recipe": recipe.name, "steps": recipe.steps, "set_aside": set_aside, "text_rows": lengths}
    with levers_applied(model, recipe, device) as handles:
        with torch.no_grad():
            out["warmup"] = run_request(model, inputs_for(lengths[0]), handles, recipe.steps, device)
            seen = {lengths[0]}
            repeated = [run_request(model, inputs_for(lengths[0]), handles, recipe.steps, device)
                        for _ in range(requests)]
            mixed = []
            for rows in lengths[1:requests + 1]:
                row = run_request(model, inputs_for(rows), handles, recipe.steps, device)
                row.update(text_rows=rows, sequence_length=rows + geo0["audio_rows"] + geo0["video_rows"],
                           first_at_shape=rows not in seen)
                seen.add(rows)
                mixed.append(row)
        rep = [r["latency_s"] for r in repeated]
        mix = [r["latency_s"] for r in mixed]
        out.update(repeated=repeated, mixed=mixed,
                   repeated_p50_s=quantile(rep, 0.5), repeated_p90_s=quantile(rep, 0.9),
                   mixed_p50_s=quantile(mix, 0.5), mixed_p90_s=quantile(mix, 0.9))
        out["mixed_over_repeated_p50"] = out["mixed_p50_s"] / out["repeated_p50_s"]
        out["recompile_flag"] = flag_first_at_shape(
            [(f"seq{r['sequence_length']}", r["latency_s"], {}) for r in mixed if r["first_at_shape"]],
            rep + [r["latency_s"] for r in mixed if not r["first_at_shape"]])
        out["telemetry"] = {k: v for k, v in lever_telemetry(handles).items() if v.get("applied")}
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--shape", default="5s-544x960")
    parser.add_argument("--requests", type=int, default=6)
    parser.add_argument("--variants", default="turbo4+compile,turbo4-sparse+compile")
    parser.add_argument("--smoke", action="store_true", help="smoke run on the CPU with the tiny preset's DiT config")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    device = "cpu" if args.smoke else "cuda"
    dtype = torch.float32 if args.smoke else torch.bfloat16
    result = {**run_record(device), "shape": args.shape, "variants": {}}
    lengths = prompt_text_rows(args.requests + 1)
    model, _ = build_transformer(dtype=dtype, tiny=args.smoke, device=device)
    out = Path(args.out)
    for variant in [v for v in args.variants.split(",") if v]:
        try:
            row = measure(model, variant, args.shape, lengths, args.requests, device, dtype)
        except Exception as exc:  # report, keep the other variants
            row = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2500:]}
        result["variants"][variant] = row
        print(json.dumps({variant: {k: row.get(k) for k in ("repeated_p50_s", "mixed_p50_s", "mixed_over_repeated_p50",
                                                            "error")}}), flush=True)
        atomic_write_json(out, result)
    print("wrote", out)


if __name__ == "__main__":
    main()
