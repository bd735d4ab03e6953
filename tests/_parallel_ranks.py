"""Rank script of tests/test_parallel.py: run by torchrun as 2 gloo ranks on the CPU, on the tiny preset.

    python -m torch.distributed.run --nproc-per-node 2 tests/_parallel_ranks.py OUTDIR   (h3.parallel.launch.launch)

One launch (two Python start-ups) serves every multi-rank check of the test module; rank 0 writes the clips, their
records and trajectories, and ``results.json`` (the in-rank measurements) into OUTDIR:

1-2. the tests' fast recipe at degree 2 (the default kind, ``ulysses_anything``) with the ``a2a_permutation`` planted
   bug (h3.parallel.plants), with the latent trajectory (the same request without a plant, and with ``rope_offset``,
   is the parallel check's, run by tests/test_parallel.py through h3.parallel.batch);
3. the video VAE's tile-parallel decode against diffusers' single-process tiled decode of the same latent, 3x3
   spatial tiles x the temporal chunks, on every rank;
4. attention under context parallelism (h3.parallel.replay.cp_attention) on a bucketed sequence, through the fixed
   per-shard padding cut and through the old call, for ``ulysses`` and ``ulysses_anything``;
5. the fast recipe with group offload, and with torch.compile (dynamo, eager backend), at degree 2;
6. the shipped ``turbo4-tinydemo`` recipe at degree 2, plain ``ulysses`` (LoRA, AdaLN precompute, INT8 W8A8,
   bucketing, block-sparse attention), with the latent trajectory;
7. ``h3 serve --nproc N``'s stop points: rank 0 stops a job (as its server does on shutdown or timeout) and the
   follower stops at the same DiT step, both ranks still in step afterwards.
"""

from __future__ import annotations

import h3  # noqa: F401  (MKL reproducibility first)

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from h3.levers.parallel import at_degree

sys.path.insert(0, str(Path(__file__).parent))

PROMPT = "a red circle bounces"
SEED = 3
NUM_FRAMES = 121
# A bucketed sequence for the attention check: 90 rows, of which the last 20 are padding (so the last shard is
# partly padding), 2 heads of 16 channels; and an odd length for ulysses_anything.
ATTN_ROWS, ATTN_VALID, ATTN_ODD_ROWS, ATTN_ODD_VALID = 90, 70, 91, 75


def main(out: Path) -> None:
    from conftest import FAST_RECIPE

    from h3.ops import attention_reference
    from h3.parallel.plants import PLANTS, install_plant
    from h3.parallel.replay import cp_attention, make_parallel_config
    from h3.parallel.world import destroy_world, init_world
    from h3.recipe import load_recipe, recipe_from_dict
    from h3.runtime import GenerateRequest, H3Runtime

    world = init_world("cpu")
    results: dict = {"world_size": world.world_size}
    request = GenerateRequest(prompt=PROMPT, seed=SEED, num_frames=NUM_FRAMES)

    # 1-2. The fast recipe's SP2 clip comes from the parallel check's launch (tests/test_parallel.py: the same
    # request), and so does the rope_offset plant's (the planted check); here the other planted bug.
    runtime = H3Runtime.load("tiny-random", at_degree(recipe_from_dict(FAST_RECIPE), 2), "cpu")
    for plant in [p for p in PLANTS if p != "rope_offset"]:
        remove = install_plant(plant, runtime.pipe.transformer, world.world_size, world.rank)
        try:
            runtime.generate(request, out / f"plant-{plant}.mp4", trajectory=True)
        finally:
            remove()

    # 3. VAE tiles: 128x128 frames in 64-px tiles with 32-px overlap are 3x3 spatial tiles per temporal chunk.
    vae = runtime.pipe.vae
    vae.enable_tiling(tile_sample_min_height=64, tile_sample_min_width=64, tile_sample_min_overlap_height=32,
                      tile_sample_min_overlap_width=32)
    z = torch.randn((1, 24, 9, 8, 8), generator=torch.Generator().manual_seed(0))
    decode = runtime.levers["parallel"].vae_decode
    with torch.no_grad():
        single = decode.original(z)  # diffusers' own tiled decode, in this process
        parallel = vae._decode(z)
    mine = {"rank": world.rank, "equal": bool(torch.equal(single, parallel)), "shape": list(parallel.shape),
            "max_abs": float((single - parallel).abs().max()), **decode.last}
    vae_ranks = [None] * world.world_size
    dist.all_gather_object(vae_ranks, mine)
    results["vae"] = vae_ranks

    # 4. Attention under CP with padding, against float64 over the real rows.
    attention = {}
    for kind, rows, valid in (("ulysses", ATTN_ROWS, ATTN_VALID), ("ulysses_anything", ATTN_ODD_ROWS, ATTN_ODD_VALID)):
        config = runtime.pipe.transformer._parallel_config if kind == "ulysses" else \
            make_parallel_config(world.world_size, kind, torch.device("cpu"))
        gen = torch.Generator().manual_seed(rows)
        q, k, v = (torch.randn((1, rows, 2, 16), generator=gen) for _ in range(3))
        ref = attention_reference(q[:, :valid], k[:, :valid], v[:, :valid])
        entry = {}
        for label, cut in (("fixed", True), ("unsliced", False)):
            with torch.no_grad():
                got = cp_attention(q, k, v, config, None, valid_len=valid, slice_padding=cut)[:, :valid].double()
            entry[label] = float((got - ref).norm() / ref.norm())
        attention[kind] = entry
    results["attention"] = attention

    # 5. Group offload and torch.compile (dynamo, eager backend) composed with SP2: both exact, so bit-identical to 1.
    for handle in reversed(list(runtime.levers.values())):
        handle.remove()
    del runtime
    for label, change in (("offload", {"offload": {"enabled": True, "use_stream": False}}),
                          ("compile", {"compile": {"enabled": True, "backend": "eager"}})):
        composed = H3Runtime.load("tiny-random", at_degree(recipe_from_dict({**FAST_RECIPE, **change}), 2), "cpu")
        composed.generate(request, out / f"fast-sp2-{label}.mp4")
        for handle in reversed(list(composed.levers.values())):
            try:
                handle.remove()
            except Exception:  # noqa: BLE001 - offload cannot be removed in place; its runtime is dropped
                pass
        del composed

    # 6. A shipped recipe with every CPU lever on, at degree 2.
    shipped = load_recipe("turbo4-tinydemo")
    # Plain Ulysses (equal shards): the recipe's 64-row buckets make every packed length divide by 2.
    demo_recipe = shipped.model_copy(update={"parallel": shipped.parallel.model_copy(
        update={"degree": world.world_size, "kind": "ulysses"})})
    demo = H3Runtime.load("tiny-random", demo_recipe, "cpu")
    demo.generate(request, out / "tinydemo-sp2.mp4", trajectory=True)

    # 7. h3 serve --nproc N stops a job on every rank at once: rank 0's server stops it (here: at once, as on
    # shutdown) and the follower stops at the same DiT step; the follower then receives rank 0's "stop" as the next
    # message, and the gather below completes: both ranks stayed in step.
    from h3.parallel.serving import Leader, follow
    from h3.server import JobInterrupts, JobTimeout

    if world.is_writer:
        leader = Leader(demo, heartbeat_s=3600)
        interrupts = JobInterrupts(leader)
        interrupts.start(3600)
        interrupts.stop_now("test: the server stopped")
        try:
            leader.generate(request, out / "stopped.mp4")
            results["stopped"] = {"rank0": "ran to the end"}
        except JobTimeout as exc:
            results["stopped"] = {"rank0": str(exc), "steps": interrupts.steps}
        interrupts.finish()
        interrupts.remove()
        leader.stop()
    else:
        results["follower_ran"] = follow(demo)
    followed = [None] * world.world_size
    dist.all_gather_object(followed, results.get("follower_ran"))
    results["follower_ran"] = followed

    if world.is_writer:
        (out / "results.json").write_text(json.dumps(results, indent=2))
    destroy_world()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
