"""What a wider tiny DiT would cost on the CPU, and whether it fits the shipped-weights budget (issue 17: "widen the
tiny configs as far as quality needs, but a clip must stay at <= 10 s on the 2-core CPU"; the demo's 3 minutes).

    python bench/dit_width_cpu/dit_width_cpu.py [--shapes shipped,l8,h192l6,...] [--clips 3] [--rounds 2] [--name dit_width_cpu]

For each DiT shape (``python -m h3.train --set dit_*``): a copy of the shipped checkpoint whose transformer is a
seeded random one of that shape (speed does not depend on the weights' values), loaded through the runtime with the
shipped ``baseline`` recipe (29 steps, bf16, 128x128, 5 s); one warm-up clip, then ``--clips`` timed clips per round,
the shapes interleaved round by round so the machine's load hits them alike. Reports request-to-file and denoise
medians against the shipped shape's, the DiT's parameters, its file at float32 and bfloat16, the rank-16 LoRA's file
(h3.train.distill.DistillLora, as the distillation trains it) and the checkpoint's total with the DiT at float32 and
as ``--set export_dit_dtype=bfloat16`` ships it, against the 30 MB budget (16 MB a file).
Writes results/<name>.{json,md}.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SHAPES = {
    "shipped": {},
    "l8": {"dit_num_layers": 8},
    "h192l6": {"dit_hidden_size": 192, "dit_num_attention_heads": 8, "dit_ffn_dim": 512, "dit_num_layers": 6},
    "h256l6": {"dit_hidden_size": 256, "dit_num_attention_heads": 8, "dit_ffn_dim": 768, "dit_num_layers": 6},
    "h192l8": {"dit_hidden_size": 192, "dit_num_attention_heads": 8, "dit_ffn_dim": 512, "dit_num_layers": 8},
}
BUDGET_BYTES, FILE_BYTES = 30_000_000, 16_000_000
PROMPT = "a red circle moves left to right while a low tone hums; it bounces twice; the background is plain"


def checkpoint_with(shape: dict, folder: Path) -> dict:
    """The shipped checkpoint copied to ``folder`` with a seeded random DiT of ``shape``; its sizes."""
    import torch
    from diffusers import MiniMaxH3Transformer3DModel

    from h3.tiny_trained import TRAINED_DIR
    from h3.train.common import TrainConfig
    from h3.train.distill import DistillLora
    from h3.train.export import DIT_FILE, store_dit_in

    cfg = TrainConfig(**shape)
    shutil.copytree(TRAINED_DIR, folder)
    if shape:
        torch.manual_seed(0)
        dit = MiniMaxH3Transformer3DModel(**cfg.transformer_config())
        shutil.rmtree(folder / "transformer")
        dit.save_pretrained(folder / "transformer")
    else:
        dit = MiniMaxH3Transformer3DModel.from_pretrained(folder / "transformer")
    params = sum(p.numel() for p in dit.parameters())
    lora = DistillLora(dit, cfg.lora_rank, cfg.lora_adaln_rank)
    lora_params = sum(p.numel() for p in lora.parameters())
    dit_file = (folder / "transformer" / "diffusion_pytorch_model.safetensors").stat().st_size
    shipped_loras = sorted((folder / "lora").glob("*.safetensors"))
    lora_file = 4 * lora_params  # float32, as DistillLora.save writes them
    total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and p.parent.name != "lora") \
        + lora_file * len(shipped_loras)
    store_dit_in(folder, "bfloat16")  # as --set export_dit_dtype=bfloat16 ships it (the runtime runs it in bf16)
    bf16_file = (folder / DIT_FILE).stat().st_size
    total_bf16 = total - dit_file + bf16_file
    return {"config": cfg.transformer_config(), "params": params, "dit_fp32_bytes": dit_file,
            "dit_bf16_bytes": bf16_file, "lora_params": lora_params, "lora_bytes": lora_file,
            "loras": len(shipped_loras), "checkpoint_bytes": total, "checkpoint_bf16_bytes": total_bf16,
            "fits": total <= BUDGET_BYTES and dit_file <= FILE_BYTES,
            "fits_bf16": total_bf16 <= BUDGET_BYTES and bf16_file <= FILE_BYTES}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"of {', '.join(SHAPES)}")
    parser.add_argument("--clips", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--name", default="dit_width_cpu")
    args = parser.parse_args()
    names = [n for n in args.shapes.split(",") if n]
    if unknown := [n for n in names if n not in SHAPES]:
        raise SystemExit(f"unknown shape(s) {', '.join(unknown)}; known: {', '.join(SHAPES)}")
    if "shipped" not in names:
        raise SystemExit("--shapes must include 'shipped' (the reference the cost is measured against)")
    if args.clips < 1 or args.rounds < 1:
        raise SystemExit("--clips and --rounds must be >= 1")

    from bench.lib import results as _results
    from h3.recipe import load_recipe
    from h3.runtime import TINY_DEFAULT_SIZE, GenerateRequest, H3Runtime

    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        runtimes = {}
        for name in names:
            results[name] = {**checkpoint_with(SHAPES[name], Path(tmp) / name), "shape": SHAPES[name],
                             "request_s": [], "denoise_s": []}
            runtimes[name] = H3Runtime.from_pretrained(Path(tmp) / name, load_recipe("baseline"), "cpu",
                                                       _default_size=TINY_DEFAULT_SIZE)
            runtimes[name].generate(GenerateRequest(prompt=PROMPT, seed=99), Path(tmp) / f"{name}-warm.mp4")
        for r in range(args.rounds):
            for name in names:
                for i in range(args.clips):
                    rec = runtimes[name].generate(GenerateRequest(prompt=PROMPT, seed=i),
                                                  Path(tmp) / f"{name}-{r}-{i}.mp4")
                    results[name]["request_s"].append(rec.timings.request_to_file_latency_s)
                    results[name]["denoise_s"].append(rec.timings.stage_anatomy.denoise)
                print(f"round {r} {name}: request {statistics.median(results[name]['request_s']):.2f} s", flush=True)
    ref = results["shipped"]
    for res in results.values():
        res["request_median_s"] = statistics.median(res["request_s"])
        res["denoise_median_s"] = statistics.median(res["denoise_s"])
        res["request_ratio"] = res["request_median_s"] / statistics.median(ref["request_s"])
    table = ("| shape | DiT settings | parameters | DiT file fp32 / bf16 (MB) | LoRA file (MB) x shipped LoRAs | "
             "checkpoint, DiT at fp32 / bf16 (MB) | fits 30 MB, 16 MB a file: fp32 / bf16 | request-to-file (s) | "
             "vs shipped | denoise (s) |\n|---|---|---|---|---|---|---|---|---|---|\n")
    for name, res in results.items():
        settings = " ".join(f"{k}={v}" for k, v in res["shape"].items()) or "(shipped)"
        table += (f"| {name} | {settings} | {res['params'] / 1e6:.2f} M | {res['dit_fp32_bytes'] / 1e6:.1f} / "
                  f"{res['dit_bf16_bytes'] / 1e6:.1f} | {res['lora_bytes'] / 1e6:.2f} x {res['loras']} | "
                  f"{res['checkpoint_bytes'] / 1e6:.1f} / {res['checkpoint_bf16_bytes'] / 1e6:.1f} | "
                  f"{'yes' if res['fits'] else '**no**'} / {'yes' if res['fits_bf16'] else '**no**'} | "
                  f"{res['request_median_s']:.2f} (n={len(res['request_s'])}) | {res['request_ratio']:.2f}x | "
                  f"{res['denoise_median_s']:.2f} |\n")
    table += (f"\nSeeded random DiTs of each shape in a copy of the shipped checkpoint (speed does not depend on the "
              f"weights), `baseline` recipe (29 steps, bf16, 128x128, 5 s), {args.rounds} interleaved rounds x "
              f"{args.clips} clips after one warm-up each. Targets: a clip <= 10 s on the 2-core CPU; the demo "
              f"(48 clips and their gates) <= 180 s.\n")
    _results.write(args.name, {"shapes": results, "rounds": args.rounds, "clips": args.clips}, table)
    print(table)


if __name__ == "__main__":
    main()
