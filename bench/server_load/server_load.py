"""Load on `h3 serve`: N concurrent submissions on loopback with the tiny preset; nothing crashes, nothing is lost.

    python bench/server_load/server_load.py [--submissions 100] [--max-queue 6] [--recipe PATH]

Starts the real server (`python -m h3.cli serve`, uvicorn) in a subprocess, fires all submissions at once
(asyncio + httpx), expects 429 for those beyond the queue, polls every accepted job to a terminal status, downloads
each completed clip and checks its sha256 against the record the server returned. Writes
bench/server_load/results/server_load.{json,md}: completed / rejected (429) / errors, and whether anything was lost.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.lib.ab import ServerNotUp, h3_serve  # noqa: E402
from h3.atomic import sha256_bytes  # noqa: E402

FAST = 'name = "fast"\ndescription = "bench: 2 steps, float32"\nsteps = 2\ndtype = "float32"\n'


async def run_load(url: str, submissions: int, timeout_s: float) -> dict:
    import httpx

    async with httpx.AsyncClient(timeout=60.0) as client:
        prompts = [f"a paper boat number {i} drifting on a pond" for i in range(submissions)]
        t0 = time.perf_counter()
        responses = await asyncio.gather(
            *[client.post(f"{url}/v1/videos", json={"prompt": p, "seed": i}) for i, p in enumerate(prompts)],
            return_exceptions=True)
        submit_s = time.perf_counter() - t0
        accepted, rejected, errors = [], 0, []
        for r in responses:
            if isinstance(r, Exception):
                errors.append(f"submit: {type(r).__name__}: {r}")
            elif r.status_code == 429:
                rejected += 1
            elif r.status_code == 200:
                accepted.append(r.json()["id"])
            else:
                errors.append(f"submit: HTTP {r.status_code}: {r.text[:200]}")
        final: dict[str, dict] = {}
        deadline = time.perf_counter() + timeout_s
        while len(final) < len(accepted) and time.perf_counter() < deadline:
            for job_id in accepted:
                if job_id in final:
                    continue
                job = (await client.get(f"{url}/v1/videos/{job_id}")).json()
                if job["status"] in ("completed", "failed"):
                    final[job_id] = job
            await asyncio.sleep(0.5)
        completed = lost = 0
        for job_id in accepted:
            job = final.get(job_id)
            if job is None:
                lost += 1
                errors.append(f"{job_id}: no terminal status within {timeout_s:g} s")
            elif job["status"] == "failed":
                errors.append(f"{job_id}: failed: {job.get('error')}")
            else:
                content = (await client.get(f"{url}/v1/videos/{job_id}/content")).content
                if sha256_bytes(content) != job["h3_record"]["mp4_sha256"]:
                    errors.append(f"{job_id}: downloaded clip differs from its record")
                else:
                    completed += 1
        listed = {j["id"] for j in (await client.get(f"{url}/v1/videos")).json()["data"]}
        health = (await client.get(f"{url}/health")).json()
        return {"submissions": submissions, "accepted": len(accepted), "completed": completed, "rejected_429": rejected,
                "errors": errors, "lost": lost + len(set(accepted) - listed), "submit_wall_s": submit_s,
                "drain_wall_s": time.perf_counter() - t0, "health_after": health,
                "accounted": completed + rejected + len(errors) == submissions}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--submissions", type=int, default=100)
    parser.add_argument("--max-queue", type=int, default=6)
    parser.add_argument("--recipe", default=None, help="Recipe TOML (default: 2-step float32 tiny recipe).")
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()

    from bench.lib import results as _results

    with tempfile.TemporaryDirectory() as tmp:
        recipe = args.recipe or str(Path(tmp) / "fast.toml")
        if args.recipe is None:
            Path(recipe).write_text(FAST)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        serve_args = ["--model", "tiny-random", "--recipe", recipe, "--max-queue", args.max_queue,
                      "--output-dir", Path(tmp) / "srv", "--device", "cpu"]
        try:
            with h3_serve(serve_args, Path(tmp) / "server.log", env=env) as (url, server):
                result = asyncio.run(run_load(url, args.submissions, args.timeout))
                result["server_alive"] = server.poll() is None
        except ServerNotUp as exc:
            raise SystemExit(str(exc)) from None
    result["max_queue"] = args.max_queue
    ok = result["server_alive"] and result["lost"] == 0 and not result["errors"] and result["accounted"]
    result["passed"] = ok
    table = ("| submissions | max queue | accepted | completed | rejected (429) | errors | lost | server alive | "
             "drain (s) |\n|---|---|---|---|---|---|---|---|---|\n"
             f"| {result['submissions']} | {args.max_queue} | {result['accepted']} | {result['completed']} | "
             f"{result['rejected_429']} | {len(result['errors'])} | {result['lost']} | {result['server_alive']} | "
             f"{result['drain_wall_s']:.1f} |\n")
    json_path, md_path = _results.write("server_load", result, table)
    print(table)
    print(f"wrote {json_path} and {md_path}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
