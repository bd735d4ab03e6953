"""``speed.json`` of an ``h3eval ab`` run, built from the records on disk (:func:`build_speed`): per speed protocol
and for the quality clips, each recipe's latency summary, paired speedup against the baseline and recompile flags;
the speed math itself is :mod:`h3eval.speed`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from h3.record import ClipRecord
from h3eval import speed as speedmod
from h3eval.store import RunStore

if TYPE_CHECKING:
    from h3eval.ab import AbPlan


def build_speed(plan: AbPlan, store: RunStore, refused: dict[str, list[str]]) -> dict[str, Any]:
    """speed.json's content, from the records on disk (so a resumed run counts every finished request)."""
    baseline = plan.run.baseline
    names = [r.name for r in plan.run.recipes]
    per_recipe_all: dict[str, list[ClipRecord]] = {}
    for name in names:
        recs = store.finished_records(store.warmup_dir(name))
        for protocol in plan.protocols:
            recs += store.finished_records(store.speed_dir(protocol, name))
        recs += store.finished_records(store.clip_dir(name))
        per_recipe_all[name] = recs
    recompiles = {name: speedmod.detect_recompiles(per_recipe_all[name], plan.recompile_ratio,
                                                   plan.recompile_margin_s) for name in names}
    sections: dict[str, dict[str, Any]] = {}
    for section in [*plan.protocols, "quality_clips"]:
        directory = (lambda n: store.clip_dir(n)) if section == "quality_clips" else (
            lambda n, s=section: store.speed_dir(s, n))
        records = {n: store.finished_records(directory(n)) for n in names}
        base_by_name = {(r.extra or {}).get("request_name") or f"{r.request.prompt_id}-s{r.request.seed}": r
                        for r in records[baseline]}
        out: dict[str, Any] = {}
        for name in names:
            if name in refused:
                out[name] = {"status": "refused", "reason": "configured-versus-executed mismatch: "
                             + "; ".join(refused[name])}
                continue
            recs = records[name]
            if not recs:
                out[name] = {"status": "empty", "reason": "no finished request"}
                continue
            summary = {"status": "ok", **speedmod.summarize(recs, plan.gpu_hourly_rate)}
            summary["executed_verified"] = not any("executed" in (r.extra or {}).get("unreported", []) for r in recs)
            if name != baseline and baseline not in refused:
                pairs = []
                for r in recs:
                    key = (r.extra or {}).get("request_name") or f"{r.request.prompt_id}-s{r.request.seed}"
                    if key in base_by_name:
                        pairs.append((base_by_name[key].timings.generation_side_latency_s,
                                      r.timings.generation_side_latency_s))
                summary["speedup"] = speedmod.speedup([p[0] for p in pairs], [p[1] for p in pairs])
            rc = recompiles[name]
            if rc.get("available"):
                mine = {(r.extra or {}).get("request_name") for r in recs}
                shapes = [s for s in rc["shapes"] if s["request"] in mine]
                summary["recompiles"] = {**{k: v for k, v in rc.items() if k != "shapes"}, "shapes": shapes,
                                         "flagged": bool(shapes)}
            else:
                summary["recompiles"] = dict(rc)  # not available: neither flagged nor cleared
            out[name] = summary
        sections[section] = out
    speed: dict[str, Any] = {
        "run": str(store.root), "baseline": baseline, "notices": store.weights_notices(), "protocols": sections,
        "recompiles": recompiles,
        "definitions": {
            "quantile": "numpy quantile method='linear' (Hyndman & Fan type 7)",
            "generation_side_latency": "seed 000: text encode + DiT + decodes + frame prep/D2H; no mux, no network",
            "request_to_file_latency": "seed 002: request in to file on disk (http: client submit to file)",
            "real_time_factor": "generation-side latency / clip duration (seed 000), p50",
            "usd_per_clip": "p50 request-to-file s x gpu_hourly_rate / 3600",
            "speedup": (f"mean(baseline)/mean(candidate) generation-side latency over paired requests; "
                        f"{int(speedmod.CI_LEVEL * 100)}% paired BCa bootstrap (h3eval.stats), "
                        f"B={speedmod.BOOTSTRAP_B}, "
                        f"seed {speedmod.BOOTSTRAP_SEED}"),
            "recompile": f"first request at a sequence shape > max({plan.recompile_ratio}x, "
                         f"+{plan.recompile_margin_s} s) of the recipe's steady-state median",
            "warmup": "warm-up requests are recorded under warmup/ and excluded from every number",
        },
        "gpu_hourly_rate": plan.gpu_hourly_rate,
    }
    if plan.protocols == ["repeated", "mixed"]:
        ratios = {}
        for name in names:
            m, r = sections["mixed"].get(name, {}), sections["repeated"].get(name, {})
            if m.get("status") == "ok" and r.get("status") == "ok" and m.get("generation_side_latency_s") and \
                    r.get("generation_side_latency_s"):
                mp, rp = m["generation_side_latency_s"]["p50"], r["generation_side_latency_s"]["p50"]
                ratios[name] = {"mixed_p50_s": mp, "repeated_p50_s": rp, "ratio": mp / rp}
        speed["repeated_vs_mixed"] = ratios
    return speed

