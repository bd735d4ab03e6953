"""A batch of requests on N ranks: one model load, then every request of a job file in order (rank 0 writes the clips
and their records; the other ranks follow). The suite's parallel-versus-single check runs its parallel side this way
(one launch for all its clips instead of one per clip).

Job file (JSON): ``{"model", "recipe" (a resolved recipe), "device", "requests": [{"prompt", "seed", "prompt_id",
"num_frames", "seconds", "height", "width", "out", "trajectory", "extra"}], "result"}``. Rank 0 writes ``result``:
``{"done": [out, ...], "errors": [{"out", "error"}]}``; a request that fails is reported there and the batch goes
on (it fails the same way on every rank: the ranks run the same code on the same inputs).

    python -m torch.distributed.run --nproc-per-node N -m h3.parallel.batch JOB.json
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    from h3.atomic import atomic_write_json
    from h3.recipe import recipe_from_dict
    from h3.runtime import GenerateRequest, H3Runtime
    from h3.parallel.world import destroy_world, init_world, launched_world_size, prepare_model

    recipe = recipe_from_dict(job["recipe"], source=str(job.get("source", "<job>")))
    prepare_model(job["model"])
    world = init_world(job.get("device")) if launched_world_size() else None
    result: dict[str, Any] = {"done": [], "errors": []}
    finished = False
    try:
        runtime = H3Runtime.load(job["model"], recipe, str(world.device) if world else job.get("device"))
        for item in job["requests"]:
            request = GenerateRequest(
                prompt=item["prompt"], seed=int(item["seed"]), prompt_id=item.get("prompt_id"),
                num_frames=item.get("num_frames"), seconds=item.get("seconds"), height=item.get("height"),
                width=item.get("width"))
            out = Path(item["out"])
            if world is None or world.is_writer:
                out.parent.mkdir(parents=True, exist_ok=True)
            try:
                runtime.generate(request, out, extra=item.get("extra"), trajectory=bool(item.get("trajectory")))
                result["done"].append(str(out))
            except (RuntimeError, ValueError, OSError) as exc:
                logger.error("%s failed: %s: %s", out, type(exc).__name__, exc)
                result["errors"].append({"out": str(out), "error": f"{type(exc).__name__}: {exc}"})
        if (world is None or world.is_writer) and job.get("result"):
            atomic_write_json(Path(job["result"]), result)
        finished = True
    finally:
        if world is not None:
            destroy_world(barrier=finished)  # a rank that failed leaves at once (torchrun stops the others)
    return result


def main(argv: list[str] | None = None) -> int:
    import h3  # noqa: F401  (MKL reproducibility before any torch work)

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m h3.parallel.batch JOB.json", file=sys.stderr)
        return 3
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    job = json.loads(Path(argv[0]).read_text())
    result = run_job(job)
    return 1 if result["errors"] else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
