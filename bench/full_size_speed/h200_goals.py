"""The speed goals of issue 23 on one H200, measured as whole requests (no projections), most valuable row first.

    python bench/full_size_speed/h200_goals.py --out $OUT/h200_goals_raw.json [--budget-s 270]
        [--rows request544,decode15,dense768,sparse768,request15,request15all] [--decode-tiles 304x320,384x448]
        [--decode-levers compile,compile+fp8]
    python bench/full_size_speed/h200_goals.py --out /tmp/goals_smoke.json --smoke      # the same code on the CPU, tiny configs

One process, one GPU, seeded random full-size weights (speed does not depend on weight values): the DiT
(``MiniMaxH3Transformer3DModel``, default config), the text encoder (Qwen3-VL at MiniMax-H3's 33 B text size, as
bench/full_size_speed/h200_speed.py), the video and audio VAEs. The DiT's levers are applied by the runtime's own
:func:`h3.levers.apply_recipe_levers` (``bench/full_size_speed/h200_recipes_speed.py``'s variants: ``turbo4-fp8-sage-compile`` where
SageAttention is installed, else ``turbo4-fp8+compile``), irreversibly as the runtime does (the float weights are
dropped, which is what lets the 33 B text encoder stay resident next to the FP8 DiT).

A *request* is timed on the wall clock from its first stage to the MP4 on disk, the stages one after the other as the
runtime runs them: text encoding (256 prompt tokens through the text encoder, all hidden states), ``steps`` DiT
forwards with an Euler update of the latents between them, the video decode (tiled), the audio decode, the frames
to uint8 on the GPU and down to pinned host memory, the PCM to int16, and the mux (``h3.media.encode_mp4``: libx264
and AAC through PyAV, as the runtime writes every clip). Each stage's time is recorded too (synchronized). The first
request of a configuration pays compilation and is reported apart; the timed ones follow it.

Rows (the issue's goals table), each run only if the time left in ``--budget-s`` covers its estimate, else recorded
as not measured with the reason:

* ``request544``: a 5 s 544x960 turbo4 request (goal <= 5.2 s, faster than real time);
* ``decode15``: the video decode of a 15 s 768x1344 clip per tile in ``--decode-tiles`` (goal <= 6 s);
* ``dense768``: one dense DiT forward at 5 s 768x1344 with the request's recipe (goal <= 3.3 s);
* ``sparse768``: one 85 % block-sparse forward at 5 s 768x1344 (FP8, compile, 128-token blocks; goal <= 1.6 s), and
  its dense first step;
* ``request15``: a 15 s 768x1344 turbo4-sparse request (85 % sparse, dense first step; goal <= 30 s);
* ``request15all``: the same request with every step sparse (``dense_steps = 0``: the issue's "sparse attention on
  every step, without a dense first step"; not a goal row of its own). It reuses request15's compiled graphs (the
  sparse calls run outside them), so it runs after request15 in the same process.

The raw result is written after every row (a run cut short keeps what it measured); ``bench/full_size_speed/h200_goals_table.py``
turns it into ``bench/full_size_speed/results/h200_goals.json`` (the issue's form) and the markdown table.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.goals import h200_goals_main  # noqa: E402

if __name__ == "__main__":
    h200_goals_main()
