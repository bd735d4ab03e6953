"""Speed at production shapes on one GPU: the chip's ceilings, then stock diffusers MiniMax-H3 at the seeds' shapes.

    python bench/full_size_speed/h200_speed.py --out $OUT/h200_speed.json [--shapes 5s-544x960,5s-768x1344,15s-768x1344]
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

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.speed import h200_speed_main  # noqa: E402

if __name__ == "__main__":
    h200_speed_main()
