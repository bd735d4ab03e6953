"""Probe (issue 50, session 31; decides nothing): why the near judge's LPIPS bound FAILs the correct INT8 rung on a
fresh pool, and whether any bound on the run's mean can separate it from the recipes that must FAIL near.

Per pool of a recipe_signoff work folder: each near-judged recipe's same-seed LPIPS against its parent
(``run/gates/fidelity/<recipe>/vs-<parent>/*.json``, ``lpips_mean``) in units of the parent's new-seed floor
(``run/floors/<parent>/floor.json``; turbo4-tiny's stands in where the parent has none in the run, as tune_near.py
does), the pairs at a new seed's distance (>= 0.5 floor: the recipe drew another sample for that seed), and over
``--runs`` simulated 16-pair runs (4 of each prompt's 8 seeds, without replacement, as recipe_signoff draws them) the
95th and 5th percentiles of the run mean and of its upper one-sided 95 % t-bound, and the share of runs whose mean
passes the release policy's bound (0.053 floor). Writes results/<name>.{json,md}.

    PYTHONPATH=. python bench/recipe_signoff/near_lpips_probe.py --work /tmp/s31W/work --pools 15,16,17
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.lib.results import write  # noqa: E402

NEAR = {"turbo4-tiny-int8": "turbo4-tiny", "turbo4-tiny-sparse": "turbo4-tiny", "bug-cache-turbo4": "turbo4-tiny",
        "bug-cache-turbo4-reuse": "turbo4-tiny", "bug-int8-excluded": "turbo4-tiny-int8",
        "bug-sparse-audio": "turbo4-tiny-sparse85", "bug-sparse-all-streams": "turbo4-tiny-sparse85"}
"""Recipe -> the parent the near judge reads it against (recipe_signoff's lineage)."""
BOUND = 0.053
"""release.toml's near lpips_mean bound, in floors."""
DEPARTED = 0.5
"""A pair at or beyond this many floors is counted as another sample."""


def pair_values(work: Path, pool: int, recipe: str, parent: str) -> dict[str, float] | None:
    folder = work / f"pool{pool}" / "run" / "gates" / "fidelity" / recipe / f"vs-{parent}"
    files = sorted(folder.glob("*.json"))
    if not files:
        return None
    floors = work / f"pool{pool}" / "run" / "floors"
    floor_file = floors / parent / "floor.json"
    if not floor_file.exists():
        floor_file = floors / "turbo4-tiny" / "floor.json"
    floor = json.loads(floor_file.read_text())["metrics"]["fidelity.lpips_mean"]
    if not (np.isfinite(floor) and floor > 0):
        raise SystemExit(f"{floor_file}: lpips_mean floor {floor!r} is not a positive number")
    out = {}
    for f in files:
        v = json.loads(f.read_text())["metrics"]["lpips_mean"]["value"]
        if v is None or not np.isfinite(v) or v < 0:
            raise SystemExit(f"{f}: lpips_mean {v!r} is not a finite non-negative number")
        out[f.stem] = v / floor
    return out


def simulate(values: dict[str, float], runs: int, rng: np.random.Generator) -> dict:
    prompts = sorted({name.rsplit("-s", 1)[0] for name in values})
    by_prompt = {p: [v for n, v in values.items() if n.rsplit("-s", 1)[0] == p] for p in prompts}
    take = max(1, 16 // len(prompts))
    means, uppers = [], []
    for _ in range(runs):
        run = np.concatenate([rng.choice(v, min(take, len(v)), replace=False) for v in by_prompt.values()])
        m, se = run.mean(), run.std(ddof=1) / np.sqrt(run.size)
        means.append(m)
        uppers.append(m + stats.t.ppf(0.95, run.size - 1) * se)
    means, uppers = np.array(means), np.array(uppers)
    return {"mean_p5": float(np.percentile(means, 5)), "mean_p95": float(np.percentile(means, 95)),
            "upper_p95": float(np.percentile(uppers, 95)), "mean_within_bound": float(np.mean(means <= BOUND))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--pools", default="15,16,17")
    parser.add_argument("--runs", type=int, default=4000)
    parser.add_argument("--rng", type=int, default=20261207)
    parser.add_argument("--name", default="near_lpips_probe")
    args = parser.parse_args()
    rng = np.random.default_rng(args.rng)
    rows = []
    for pool in (int(p) for p in args.pools.split(",") if p):
        for recipe, parent in NEAR.items():
            values = pair_values(args.work, pool, recipe, parent)
            if values is None:
                continue
            v = np.array(sorted(values.values()))
            departed = {n: round(x, 3) for n, x in values.items() if x >= DEPARTED}
            rows.append({"pool": pool, "recipe": recipe, "parent": parent, "pairs": len(v),
                         "median": float(np.median(v)), "largest": [round(float(x), 3) for x in v[-3:]],
                         "departed": departed, **simulate(values, args.runs, rng)})
    lines = ["| pool | recipe (vs parent) | pairs | median | largest 3 | pairs >= 0.5 floor | run mean p5 .. p95 | "
             "upper t-bound p95 | runs with mean <= 0.053 |", "|---:|---|---:|---:|---|---|---|---:|---:|"]
    for r in rows:
        dep = ", ".join(f"{n} {x}" for n, x in sorted(r["departed"].items())) or "-"
        lines.append(f"| {r['pool']} | {r['recipe']} ({r['parent']}) | {r['pairs']} | {r['median']:.3f} | "
                     f"{', '.join(str(x) for x in r['largest'])} | {dep} | {r['mean_p5']:.3f} .. {r['mean_p95']:.3f} | "
                     f"{r['upper_p95']:.3f} | {r['mean_within_bound']:.1%} |")
    write(args.name, {"rows": rows, "bound": BOUND, "departed": DEPARTED, "runs": args.runs},
          "\n".join(["Near LPIPS probe (issue 50; decides nothing): bench/recipe_signoff/near_lpips_probe.py's docstring "
                     "says what is measured. Same-seed LPIPS against the parent, in the parent's new-seed floors.", "",
                     *lines]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
