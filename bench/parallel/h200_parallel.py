"""Several GPUs, measured (issue 21): whole requests at degree 1 and 2, and the parallel check on the GPUs.

    python bench/parallel/h200_parallel.py request --degree 1 --shapes 15s-768x1344 --out sp1.json     (one GPU)
    torchrun --nproc-per-node 2 bench/parallel/h200_parallel.py request --degree 2 --shapes ... --out sp2.json
    python bench/parallel/h200_parallel.py check --out DIR [--plant a2a_permutation]                     (both GPUs)
    python bench/parallel/h200_parallel.py merge --out OUTDIR sp1*.json sp2.json [DIR/parallel_check.json ...]

``request``: a whole request through the product (``H3Runtime.generate``: text encode, the recipe's DiT steps, the
video and audio VAE decode, frame preparation, MP4 mux on rank 0; the mux is skipped, and the file says so, where
PyAV is missing) at each shape (15 s is h3.runtime.MAX_FRAMES = 345 frames, the longest request diffusers takes), on a full-size pipeline with seeded
random weights (speed does not depend on weight values; bench/full_size_speed/h200_speed.py): diffusers' default
``MiniMaxH3Transformer3DModel`` (33 B) and video/audio VAEs, and a Qwen3-VL conditioner at MiniMax-H3's width (5120)
and depth (51 layers: the pipeline reads ``hidden_states[50]``) with a narrow MLP (1024) so that it fits beside the
bf16 DiT; the full 64-layer conditioner encodes 256 tokens in 0.062 s on one H200
(bench/full_size_speed/results/h200_speed_stock.json), so the stand-in can under-report a request by at most that. The recipe is
``turbo4-sparse`` as shipped (4 steps: one dense, three block-sparse; 128-row buckets; 304x320 VAE tiles at
768x1344) with its LoRA set aside (a fused LoRA changes no shape or FLOP; no LoRA file exists here); at degree 2
``parallel.kind = "ulysses"`` (the buckets divide by 2) and the VAE decodes tile-parallel. Before the timed request
the block-sparse flex kernel is compiled at the request's exact shapes (one call on random inputs), so the request
pays no compilation; nothing else is warmed. Each DiT forward is written to ``--out`` as it ends, so that a request
stopped by its time box leaves its forwards marked partial (never a figure). Rank 0's clip record gives every figure:

- ``dit_step_s``: the mean DiT forward of the request (its stage anatomy's ``denoise_steps``: 1 dense + 3 sparse);
  ``efficiency`` = dit_step_s(1) / (N x dit_step_s(N));
- ``vae_decode_s``: the video decode stage (1 GPU: diffusers' tiled decode; N GPUs: the tiles scattered, decoded,
  gathered and stitched);
- ``request_s``: the generation-side latency (seed 000's definition: text encode through frame preparation and
  device-to-host copy, MP4 mux excluded); the request-to-file latency is in the details.

The SP2 process also decodes one fixed latent both ways on each GPU and reports whether the tile-parallel decode is
the single-GPU decode bit for bit. ``check`` runs ``h3eval parallel-check`` on the tiny preset in bf16 over
``--pairs`` prompts (the floor twins in float32 and math SDPA) and, with ``--plant``, a planted bug the check must
fail; ``--ring`` checks ring attention instead; ``--nproc`` sets the degree. ``merge`` writes
``h200_parallel.json`` (``{"<shape>": {"<degree>": {"dit_step_s", "vae_decode_s", "request_s", "efficiency"}}}``),
``h200_parallel_details.json`` (every record's anatomy, communication per step, per-rank devices and times, the
checks) and the Markdown table (bench/parallel/h200_parallel_table.py).

``--smoke`` runs the same code on the CPU with the tiny preset (gloo ranks): the test that every path works before
it meets the GPUs.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.parallel import h200_parallel_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(h200_parallel_main())
