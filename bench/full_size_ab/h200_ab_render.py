"""Render the production-scale A/B chain's work folder (bench/h200_ab.py) into the recorded results:

    python bench/h200_ab.py render --work W --out-dir bench/results

writes, per shape, ``h200_ab_<shape>.json`` and ``.md`` (request-to-file and generation-side latency p50/p90 with the
stage anatomy, peak device memory, gate time per pair against the candidate's generation time, configured versus
executed, the recompile flag and off-identity as ``h3eval ab`` reported them, and the measured request against the
benchmark's projection with the stage that makes the difference), and the summary ``h200_ab.json``:
``{"<recipe>": {"<shape>": {"request_to_file_p50_s", "generation_side_p50_s", "peak_memory_gb",
"gate_time_fraction", "pairs", "partial"}}}``. A shape whose chain did not finish is marked partial, in both.
``--merge`` keeps the other shapes of an existing summary (one work folder per shape, as one-shape device calls
leave them).

The gate time per pair counts the pairs the gates scored: a pair whose every gate errored (a clip the time box left
unmade fails each gate in milliseconds) is left out, and gates that errored on a scored pair are named beside it
(their time is not in the figure).

The projection is the one bench/results/h200_recipes_speed.md states (bench/h200_recipes_table.project): text
encoding (0.06 s, the conditioner resident) + the recipe's DiT forwards (timed alone) + video decode with the recipe's
tiles + audio decode + the frames' download; the baseline's is 29 stock forwards with the stock tiles.
"""

from __future__ import annotations

import json
import shlex
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
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


def projection(shape: str, recipe: str, results: Path = RESULTS) -> dict[str, Any] | None:
    """The benchmark's projected generation-side request of ``recipe`` at ``shape`` (None where not benchmarked)."""
    sys.path.insert(0, str(ROOT))
    from bench.h200_recipes_table import DURATION_S, project

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
        proj = project(shape, variants[recipe], stock, tiles_304=shape.endswith("768x1344"))
    else:
        return None
    return {**proj, "text_encode_s": text, "audio_decode_s": vae["audio_decode_s"], "frame_prep_d2h_s": d2h,
            "source": f"bench/results/{source} ({recipe}) + h200_speed_stock.json"}


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
                  "measured around each pair (bench/h200_ab.py gates)."]
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
    lines += ["", "Why they differ, stage by stage (the projection's own parts: bench/results/h200_recipes_speed.md):",
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
               "chain_command": f"python bench/h200_ab.py chain {chain_command}",
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
    import socket

    if port is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
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
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
    return 0


def from_returned(returned: Path, out_dir: Path, work: Path, screenshot: bool = True) -> int:
    """What a device call returned (bench/device/h200_ab.sh's OUTDIR: state.tgz[.part-NN], clips.tgz when it was
    small) into the recorded results: the work folder restored into ``work``, the clips unpacked beside it, the
    figures rendered into ``out_dir`` (with the benchmark's projection, which the device's snapshot does not carry),
    and the dashboard screenshots taken here with headless Chromium."""
    import subprocess
    import tarfile

    me = [sys.executable, str(ROOT / "bench" / "h200_ab.py")]
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


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="A returned h200_ab device call into bench/results: "
                                                 "python bench/h200_ab_render.py RETURNED_DIR")
    parser.add_argument("returned", type=Path, help="the call's OUTDIR as it came back (state.tgz, clips.tgz)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--work", type=Path, default=Path("/tmp/h200_ab_returned"))
    parser.add_argument("--no-screenshot", action="store_true")
    ns = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    sys.exit(from_returned(ns.returned, ns.out_dir, ns.work, not ns.no_screenshot))
