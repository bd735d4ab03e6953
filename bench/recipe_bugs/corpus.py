"""The corpus of recipe bugs from the field (issue 50), planted on the trained tiny: which plants change what the clip
shows, read by the world's ground-truth detector (h3.world.detect), and what the executed check says of each.

    python bench/recipe_bugs/corpus.py [--model tiny] [--prompts world-heldout] [--n-prompts 4] [--seeds 0,1,2,3]
                                       [--plants lora-16x,steps-8,...] [--name recipe_bugs]

Each plant (bench/recipe_bugs/recipes/*.toml) names its correct recipe as ``parent``; the plant and its parent make
the same (prompt, seed) clips, each decoded from its MP4 and read by the detector (colour, shape, direction, pitch,
bounces, sync against the caption). Per plant and aspect: the share right for the plant and the parent (Wilson 95%)
and the paired difference with Newcombe's 95% interval for paired proportions; the pairs whose clip is
byte-identical to the parent's; the pairs whose reading differs. A plant "changes what the clip shows" when an
aspect's paired difference excludes 0; one whose clips are the parent's (or read the same) changes nothing, which
the record says instead of expecting a FAIL. The configured-versus-executed check (h3eval.executed.check_executed)
and its flags (executed_flags) are recorded per plant. A plant refused at load (the lever's own error) is recorded
as refused.

Clip readings are kept in ``--work`` (default /tmp/recipe_bugs) as they finish, so a stopped run resumes; the record
goes to bench/recipe_bugs/results/<name>.{json,md}, marked partial when a plant or parent lacks clips.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

ASPECTS = ("colour", "shape", "direction", "pitch", "bounces", "sync")
READING = ("colours_seen", "shapes_seen", "directions_seen", "bounces_seen", "appear_seen", "pitches_seen", "onsets")


def wilson(k: int, n: int) -> list[float] | None:
    from scipy.stats import binomtest

    if n == 0:
        return None
    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    return [float(ci.low), float(ci.high)]


def paired_difference(plant: list[bool], parent: list[bool]) -> dict:
    """Share right (plant - parent) over paired clips, with Newcombe's 95% interval for a difference of paired
    proportions (method 10: Wilson score limits of each share, combined with the pairs' phi correlation; Newcombe,
    Stat Med 1998) and the exact McNemar test on the discordant pairs (two-sided binomial)."""
    import math

    from scipy.stats import binomtest

    n = len(plant)
    if n == 0:
        return {"n": 0, "difference": None, "ci95": None, "discordant": 0}
    both = sum(1 for x, y in zip(plant, parent) if x and y)
    better = sum(1 for x, y in zip(plant, parent) if x and not y)
    worse = sum(1 for x, y in zip(plant, parent) if y and not x)
    neither = n - both - better - worse
    p1, p2 = (both + better) / n, (both + worse) / n
    (l1, u1), (l2, u2) = wilson(both + better, n), wilson(both + worse, n)
    denominator = (both + better) * (worse + neither) * (both + worse) * (better + neither)
    phi = (both * neither - better * worse) / math.sqrt(denominator) if denominator else 0.0
    delta = p1 - p2
    low = delta - math.sqrt(max((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2, 0.0))
    high = delta + math.sqrt(max((u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2, 0.0))
    mcnemar = binomtest(better, better + worse).pvalue if better + worse else 1.0
    return {"n": n, "difference": delta, "ci95": [max(low, -1.0), min(high, 1.0)], "worse": worse,
            "better": better, "discordant": better + worse, "mcnemar_p": float(mcnemar)}


def generate(recipe_path: str, model: str, prompts, seeds, work: Path, record_only: bool = False) -> dict:
    """Every (prompt, seed) clip of one recipe, read by the detector; resumes from ``work``. A recipe refused at load
    gives ``{"refused": message}``. ``record_only``: generate nothing, return the clips ``work`` holds."""
    from h3.levers import LeverError
    from h3.media import decode_audio, decode_video
    from h3.recipe import RecipeError, load_recipe
    from h3.runtime import GenerateRequest, H3Runtime
    from h3.world.detect import describe_clip, parse_caption, score_clip
    from h3eval.executed import check_executed, executed_flags

    recipe = load_recipe(recipe_path)
    cache = work / f"{recipe.name}.json"
    done = json.loads(cache.read_text()) if cache.is_file() else {}
    if done.get("sha256") != recipe.sha256():
        done = {"sha256": recipe.sha256(), "clips": {}}
    todo = [(p, s) for p in prompts for s in seeds if f"{p.id}-s{s}" not in done["clips"]]
    if record_only and done.get("refused"):
        return {"recipe": recipe.name, "refused": done["refused"]}
    if todo and not record_only:
        try:
            runtime = H3Runtime.load(model, recipe, "cpu")
        except (LeverError, RecipeError) as exc:
            cache.write_text(json.dumps({**done, "refused": f"{type(exc).__name__}: {exc}"}))
            return {"recipe": recipe.name, "refused": f"{type(exc).__name__}: {exc}"}
        for prompt, seed in todo:
            out = work / f"{recipe.name}-{prompt.id}-s{seed}.mp4"
            started = time.perf_counter()
            record = runtime.generate(GenerateRequest(prompt=prompt.prompt, seed=seed, prompt_id=prompt.id), out)
            seconds = time.perf_counter() - started
            frames, _ = decode_video(out)
            audio, rate = decode_audio(out)
            score = score_clip(describe_clip(frames, audio, rate), parse_caption(prompt.prompt))
            out.unlink()
            cache_lever = record.executed.levers.get("cache") or {}
            done["clips"][f"{prompt.id}-s{seed}"] = {
                "prompt_id": prompt.id, "seed": seed, "seconds": seconds,
                "frames_sha256": record.frames_sha256, "pcm_sha256": record.pcm_sha256,
                **{a: getattr(score, a) for a in ASPECTS}, "reading": {k: score.details[k] for k in READING},
                "executed_problems": check_executed(recipe, record), "executed_flags": executed_flags(recipe, record),
                "cached_steps": cache_lever.get("cached_steps"),
            }
            cache.write_text(json.dumps(done))
            print(f"  {recipe.name} {prompt.id} s{seed}: {seconds:.1f} s", flush=True)
    return {"recipe": recipe.name, "clips": done["clips"]}


def compare(plant: dict, parent: dict, keys: list[str]) -> dict:
    """The plant against its parent on the pairs both have."""
    pairs = [k for k in keys if k in plant["clips"] and k in parent["clips"]]
    p, q = [plant["clips"][k] for k in pairs], [parent["clips"][k] for k in pairs]
    aspects = {}
    for aspect in ASPECTS:
        both = [(x[aspect], y[aspect]) for x, y in zip(p, q) if x[aspect] is not None and y[aspect] is not None]
        right_p, right_q = sum(x for x, _ in both), sum(y for _, y in both)
        aspects[aspect] = {"plant": [right_p, len(both)], "parent": [right_q, len(both)],
                           "plant_wilson95": wilson(right_p, len(both)), "parent_wilson95": wilson(right_q, len(both)),
                           "paired": paired_difference([x for x, _ in both], [y for _, y in both])}
    identical = sum(x["frames_sha256"] == y["frames_sha256"] and x["pcm_sha256"] == y["pcm_sha256"]
                    for x, y in zip(p, q))
    read_differently = sum(x["reading"] != y["reading"] for x, y in zip(p, q))
    shifted = [a for a, s in aspects.items() if s["paired"]["ci95"] and (s["paired"]["ci95"][0] > 0
                                                                       or s["paired"]["ci95"][1] < 0)]
    flipped = [a for a, s in aspects.items() if s["paired"]["discordant"]]
    if not pairs:
        verdict = "not run: no pair of clips (see the record's partial note)"
    elif identical == len(pairs):
        verdict = "changes nothing: every clip is the parent's, byte for byte"
    elif shifted:
        verdict = "changes what the clip shows: " + ", ".join(
            f"{a} {'worse' if aspects[a]['paired']['difference'] < 0 else 'better'}" for a in shifted)
    elif flipped:
        verdict = ("changes some readings (" + ", ".join(flipped) + "), no aspect's share beyond the pairs' noise")
    elif read_differently:
        verdict = "changes the pixels and some readings, no aspect's right/wrong"
    else:
        verdict = "changes the pixels, nothing the world's detector reads"
    return {"pairs": len(pairs), "identical_clips": identical, "readings_differ": read_differently,
            "aspects": aspects, "changes_what_the_clip_shows": bool(shifted), "verdict": verdict}


def executed_summary(result: dict) -> dict:
    clips = list(result.get("clips", {}).values())
    flags, problems = {}, {}
    for clip in clips:
        for f in clip["executed_flags"]:
            flags[f] = flags.get(f, 0) + 1
        for p in clip["executed_problems"]:
            problems[p] = problems.get(p, 0) + 1
    return {"clips": len(clips), "flags": flags, "problems": problems,
            "cached_steps": sum(c["cached_steps"] or 0 for c in clips) if clips else None}


def lscpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")),
                "unknown")


def pct(k: int, n: int) -> str:
    return f"{100 * k / n:.0f}% ({k}/{n})" if n else "n/a"


def table(plants: dict, parents: dict, expected: int) -> str:
    lines = ["| plant | parent | pairs | identical | " + " | ".join(ASPECTS) + " | verdict | executed check |",
             "|---|---|---|---|" + "---|" * len(ASPECTS) + "---|---|"]
    for name, row in plants.items():
        flags = row["executed"]["flags"] if "executed" in row else {}
        problems = row["executed"]["problems"] if "executed" in row else {}
        said = "; ".join([f"FLAG {f} ({n} clips)" for f, n in flags.items()]
                         + [f"MISMATCH {p} ({n} clips)" for p, n in problems.items()]) or "nothing"
        if "refused" in row:
            lines.append(f"| `{name}` | `{row['parent']}` | 0 | - | " + " | ".join("-" for _ in ASPECTS)
                         + f" | refused at load | {row['refused'][:200]} |")
            continue
        cmp_ = row["comparison"]
        cells = []
        for aspect in ASPECTS:
            s = cmp_["aspects"][aspect]
            d = s["paired"]
            if not d["n"]:
                cells.append("n/a")
                continue
            cells.append(f"{pct(*s['plant'])} vs {pct(*s['parent'])}; Δ {100 * d['difference']:+.0f} "
                         f"[{100 * d['ci95'][0]:+.0f}, {100 * d['ci95'][1]:+.0f}]")
        partial = "" if cmp_["pairs"] == expected else f" (partial: {cmp_['pairs']} of {expected})"
        lines.append(f"| `{name}` | `{row['parent']}` | {cmp_['pairs']}{partial} | {cmp_['identical_clips']} | "
                     + " | ".join(cells) + f" | {cmp_['verdict']} | {said} |")
    parent_lines = ["", "| parent | clips | " + " | ".join(ASPECTS) + " | s/clip | executed check |",
                    "|---|---|" + "---|" * len(ASPECTS) + "---|---|"]
    for name, res in parents.items():
        clips = list(res.get("clips", {}).values())
        cells = []
        for aspect in ASPECTS:
            vals = [c[aspect] for c in clips if c[aspect] is not None]
            cells.append(pct(sum(vals), len(vals)))
        secs = sorted(c["seconds"] for c in clips)
        said = executed_summary(res)
        text = "; ".join([f"FLAG {f} ({n})" for f, n in said["flags"].items()]
                         + [f"MISMATCH {p} ({n})" for p, n in said["problems"].items()]) or "nothing"
        parent_lines.append(f"| `{name}` | {len(clips)} | " + " | ".join(cells)
                            + f" | {secs[len(secs) // 2] if secs else float('nan'):.1f} | {text} |")
    return "\n".join(lines + parent_lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--prompts", default="world-heldout")
    parser.add_argument("--n-prompts", type=int, default=4)
    parser.add_argument("--seeds", default="0,1,2,3")
    parser.add_argument("--plants", default="", help="comma-separated plant files (stems); default every one")
    parser.add_argument("--name", default="recipe_bugs")
    parser.add_argument("--work", type=Path, default=Path("/tmp/recipe_bugs"))
    parser.add_argument("--note", default="")
    parser.add_argument("--record-only", action="store_true",
                        help="generate nothing: write the record from the clips --work holds (a stopped run's)")
    args = parser.parse_args()

    from bench.lib import results as _results
    from h3.recipe import load_recipe
    from h3eval.prompts import load_prompts, parse_seeds

    started = time.perf_counter()
    suite = load_prompts(args.prompts)
    prompts = suite.prompts[: args.n_prompts]
    seeds = parse_seeds(args.seeds)
    keys = [f"{p.id}-s{s}" for p in prompts for s in seeds]
    args.work.mkdir(parents=True, exist_ok=True)
    # Sparse plants last: on the CPU their eager flex attention makes a clip ~10x slower than the others'.
    stems = [s for s in args.plants.split(",") if s] or sorted(
        (p.stem for p in (HERE / "recipes").glob("*.toml")), key=lambda stem: ("sparse" in stem, stem))
    paths = {stem: str(HERE / "recipes" / f"{stem}.toml") for stem in stems}
    parents, plants = {}, {}
    for stem, path in paths.items():
        recipe = load_recipe(path)
        if recipe.parent is None:
            raise SystemExit(f"plant {path} names no parent")
        if recipe.parent not in parents:
            print(f"parent {recipe.parent}", flush=True)
            parents[recipe.parent] = generate(recipe.parent, args.model, prompts, seeds, args.work,
                                               args.record_only)
        print(f"plant {stem} ({recipe.name})", flush=True)
        result = generate(path, args.model, prompts, seeds, args.work, args.record_only)
        row = {"file": f"bench/recipe_bugs/recipes/{stem}.toml", "recipe": recipe.name, "parent": recipe.parent}
        if "refused" in result:
            row["refused"] = result["refused"]
        elif "refused" in parents[recipe.parent]:
            row["refused"] = f"its parent was refused: {parents[recipe.parent]['refused']}"
        else:
            row["comparison"] = compare(result, parents[recipe.parent], keys)
            row["executed"] = executed_summary(result)
            row["clips"] = result["clips"]
        plants[stem] = row
    wall = time.perf_counter() - started
    expected = len(keys)
    missing = [s for s, r in plants.items() if "comparison" in r and r["comparison"]["pairs"] < expected]
    md = table(plants, parents, expected)
    md += (f"\nPrompts: the first {len(prompts)} of `{args.prompts}` (sha256 {suite.sha256[:12]}), seeds {seeds}: "
           f"{expected} pairs per plant. Δ: the plant's share right minus the parent's over the same pairs, with a "
           f"Newcombe 95% interval for paired proportions; a plant changes what the clip shows when an aspect's "
           f"interval excludes 0. Wall time {wall:.0f} s on the CPU ({lscpu_model()}).\n")
    if missing:
        md += f"\n**Partial**: fewer than {expected} pairs for {', '.join(missing)}.\n"
    if args.note:
        md = args.note.rstrip() + "\n\n" + md
    payload = {**_results.context(), "lscpu_model": lscpu_model(), "model": args.model, "prompts": args.prompts,
               "prompts_sha256": suite.sha256, "prompt_ids": [p.id for p in prompts], "seeds": seeds,
               "wall_seconds": wall, "partial": bool(missing), "missing": missing,
               "parents": {name: {**res, "executed": executed_summary(res)} if "clips" in res else res
                           for name, res in parents.items()},
               "plants": plants, "note": args.note}
    results = HERE / "results"
    results.mkdir(exist_ok=True)
    from h3.atomic import atomic_write_json, atomic_write_text

    atomic_write_json(results / f"{args.name}.json", payload)
    header = (f"# {args.name}\n\n- date: {payload['date']}\n- command: `{payload['command']}`\n"
              f"- machine: {payload['machine']['platform']}, {payload['machine']['cpu_count']} cpus, "
              f"{payload['lscpu_model']}\n- versions: "
              + ", ".join(f"{k} {v}" for k, v in payload["versions"].items()) + "\n\n")
    atomic_write_text(results / f"{args.name}.md", header + md)
    print(header + md)


if __name__ == "__main__":
    main()
