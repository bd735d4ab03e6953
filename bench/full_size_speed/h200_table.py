"""Render a bench/full_size_speed/h200_speed.py JSON result as the Markdown table the README quotes.

    python bench/full_size_speed/h200_table.py bench/full_size_speed/results/h200_speed_stock.json > bench/full_size_speed/results/h200_speed_stock.md
"""

from __future__ import annotations

import json
import sys


def render(d: dict) -> str:
    c = d.get("ceilings", {})
    lines = [
        f"# MiniMax-H3 speed on {d['device']} ({d['date']})", "",
        f"- command: `{d['command']}`",
        f"- torch {d['torch']} (CUDA {d['cuda']}), diffusers {d.get('diffusers')}, transformers {d.get('transformers')}",
        f"- weights: {d['weights']}", "",
        "## Ceilings (measured in the same process)", "",
        "| bf16 matmul | fp8 matmul | device copy (read+write) | pinned H2D | pinned D2H |", "|---|---|---|---|---|",
        f"| {c.get('bf16_matmul_tflops', 0):.0f} TFLOP/s | {c.get('fp8_matmul_tflops', 0):.0f} TFLOP/s "
        f"| {c.get('d2d_copy_GBps_read_plus_write', 0):.0f} GB/s | {c.get('pinned_h2d_GBps', 0):.1f} GB/s "
        f"| {c.get('pinned_d2h_GBps', 0):.1f} GB/s |", "",
        "## One DiT forward, stock diffusers (bf16, eager, native SDPA)", "",
        "| shape | tokens | s / forward | PFLOP | TFLOP/s | of bf16 ceiling | peak GiB |", "|---|---|---|---|---|---|---|",
    ]
    for name, s in d.get("dit", {}).get("shapes", {}).items():
        lines.append(f"| {name} | {s['sequence_length']:,} | {s['forward_s']:.2f} | {s['flops']['total'] / 1e15:.2f} "
                     f"| {s['tflops']:.0f} | {100 * (s['fraction_of_bf16_ceiling'] or 0):.0f}% "
                     f"| {s['peak_memory_GiB']:.1f} |")
    lines += ["", "## Decode and text encoding (full-size configs, bf16)", "",
              "| shape | video decode 256×256 tiles (s) | 304×320 tiles (s) | audio decode (s) |", "|---|---|---|---|"]
    for name, s in d.get("vae", {}).get("shapes", {}).items():
        lines.append(f"| {name} | {s['video_decode_256x256_s']:.2f} | {s['video_decode_304x320_s']:.2f} "
                     f"| {s['audio_decode_s']:.3f} |")
    t = d.get("text", {})
    if "text_encode_s" in t:
        lines += ["", f"Qwen3-VL text encoding ({t['params'] / 1e9:.1f} B params, {t['tokens']} tokens): "
                      f"{t['text_encode_s']:.3f} s"]
    lines += ["", "## Projected generation-side latency (stock, dense, from the anatomy above)", "",
              "| shape / recipe | text | denoise | video decode | audio decode | frame prep+D2H | total (s) | RTF |",
              "|---|---|---|---|---|---|---|---|"]
    for name, p in d.get("projection", {}).items():
        st = p["stages"]
        lines.append(f"| {name} | {st['text_encode']:.2f} | {st['denoise']:.1f} | {st['video_decode']:.2f} "
                     f"| {st['audio_decode']:.3f} | {st['frame_prep_d2h']:.3f} | {p['generation_side_s']:.1f} "
                     f"| {p['rtf']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(json.load(open(sys.argv[1]))), end="")
