"""Full-size DiT forward for stock diffusers and each optimized recipe, side by side, in one process on one GPU.

    python bench/full_size_speed/h200_recipes_speed.py --out $OUT/recipes.json --shapes 5s-544x960,5s-768x1344 [--repeats 2]
        [--variants stock,turbo4+compile,turbo4-int8,turbo4-int8+compile,turbo4-fp8,turbo4-sparse,turbo4-sparse+sparse85+fp8]

``--variants shipped`` (or ``shipped,<more>``) stands for ``stock`` and every shipped recipe with a DiT forward of its
own, as shipped (see ``shipped_variants``).

A variant is a shipped recipe (``h3/recipes/<name>.toml``) or ``stock`` (bf16, eager, native SDPA: what diffusers does
out of the box), optionally followed by modifiers joined with ``+``:

* ``compile``  — the recipe's ``[compile]`` section switched on (regional: one region per DiT block, inductor);
* ``dynamic``  — the same with ``compile.dynamic = true`` (shape-generic graphs: no recompile per prompt length);
* ``fp8`` / ``int8`` — ``quant.mode`` set to FP8 / INT8 W8A8;
* ``sage`` / ``cudnn`` / ``fa3`` — ``attention.backend`` set to ``sage`` / ``_native_cudnn`` / ``_flash_3`` (FlashAttention-3, bench/device/build_fa3.sh);
* ``fa3fp8`` — FP8 attention through FlashAttention-3 with per-head scales (``[fp8_attention] kernel = "fa3"``), q, k
  and v quantized by one compiled graph; ``fa3fp8eager`` the same with the quantization in eager ops (``quantize =
  "eager"``, the session-9 path);
* ``sparseNN`` — block-sparse attention at NN % sparsity (128-token blocks, dense first step, 128-row buckets);
* ``bucket`` — shape bucketing switched on (128-row buckets: one set of compiled graphs for every prompt length in a
  bucket, attention on the real rows only).

The recipe's levers are applied by the runtime's own :func:`h3.levers.apply_recipe_levers` to a full-size
``MiniMaxH3Transformer3DModel`` (default config, seeded random weights: speed does not depend on weight values), so
what is timed is the code that generates clips. Sections that do not touch the DiT forward are set aside and said so
in the result: the LoRA (a fused LoRA leaves the weights' shapes and the forward's work unchanged; no LoRA file exists
here), the VAE tiles (timed by bench/full_size_speed/h200_speed.py), offload (bench/full_size_speed/h200_offload.py).

Per variant and shape: the first call (which pays compilation) is excluded and reported; then the median of
``--repeats`` forwards. A recipe with a dense first step (block-sparse) is timed on both kinds of forward: the dense
one and the sparse one, so a request of ``steps`` forwards is ``dense_steps`` dense ones and the rest sparse. The
levers' telemetry and the attention backends the dispatcher actually called are recorded per variant (the
configured-versus-executed evidence). Every variant is removed again before the next (compile caches reset), and
partial results are written after every variant, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.speed import h200_recipes_speed_main  # noqa: E402

if __name__ == "__main__":
    h200_recipes_speed_main()
