"""Speed summary of an A/B run: latency quantiles, stage anatomy, memory, real-time factor, cost, speedup, recompiles.

Definitions (every number in ``speed.json`` uses exactly these):

- **Quantiles** (p50, p90): numpy's ``quantile(method="linear")``, Hyndman & Fan type 7 (linear interpolation
  between order statistics ``(n - 1) * q``), over the non-warm-up requests of one recipe.
- **generation-side latency**: seed 000's definition (text encode, DiT, both decodes, frame prep and D2H; no MP4
  mux/save, no network). For a foreign server: its ``inference_time_s``.
- **request-to-file latency**: seed 002's definition, request in to finished file on disk (for ``http``: the
  client's wall time from submit to file, queueing and transfer included).
- **RTF** (real-time factor): generation-side latency / clip duration (seed 000: "generation-side latency divided
  by the actual video duration"); below 1 is faster than playback. Reported as the p50 over requests.
- **$/clip**: :func:`h3eval.stats.usd_per_clip`, p50 request-to-file seconds × hourly rate / 3600 (seed 001 prices
  GPU time per clip at the pod's hourly rate). Only when ``--gpu-hourly-rate`` is given.
- **speedup vs baseline**: :func:`h3eval.stats.speedup`, the ratio of mean generation-side latencies over pairs (same
  request index: same prompt and seed), baseline / candidate, i.e. the time saved over the whole paired workload,
  with the statistics module's paired BCa bootstrap CI (95 %, its default resamples and seed): the number the
  verdict and the dashboard report for the same pairs.
- **recompile flag**: see :func:`detect_recompiles`.
"""

from __future__ import annotations

import logging
import statistics
from typing import Any, Iterable, Sequence

import numpy as np

from h3.record import ClipRecord
from h3eval import stats
from h3eval.stats import QUANTILE_METHOD, quantile  # noqa: F401 - the speed table's quantile is the statistics module's

logger = logging.getLogger(__name__)

CI_LEVEL = stats.DEFAULT_CONFIDENCE
BOOTSTRAP_B = stats.DEFAULT_RESAMPLES
BOOTSTRAP_SEED = stats.DEFAULT_SEED
# Recompile margin. Seed 001: a per-shape JIT compile cost 12-14 s on requests of ~28 s steady state, i.e. a first
# request about 1.43-1.5x the steady state; a 1.5x ratio would miss that very case, so the ratio is 1.25x. The
# absolute floor (+0.5 s) keeps scheduler jitter on sub-second tiny-preset requests from being flagged.
RECOMPILE_RATIO = 1.25
RECOMPILE_MARGIN_S = 0.5
ANATOMY_STAGES = ("text_encode", "denoise", "video_decode", "audio_decode", "frame_prep_d2h", "mux_save", "other")


def _unreported(record: ClipRecord, field: str) -> bool:
    return field in (record.extra or {}).get("unreported", [])


def summarize(records: Sequence[ClipRecord], gpu_hourly_rate: float | None = None) -> dict[str, Any]:
    """Per-recipe summary over non-warm-up requests."""
    records = [r for r in records if not (r.extra or {}).get("warmup")]
    if not records:
        return {"n": 0}
    gen = [r.timings.generation_side_latency_s for r in records]
    rtf_s = [r.timings.request_to_file_latency_s for r in records]
    out: dict[str, Any] = {"n": len(records)}
    gen_known = [g for g, r in zip(gen, records) if not _unreported(r, "timings.generation_side_latency_s")]
    if gen_known:
        out["generation_side_latency_s"] = {"p50": quantile(gen_known, 0.5), "p90": quantile(gen_known, 0.9),
                                            "mean": float(np.mean(gen_known)), "n": len(gen_known)}
        rtf = [r.timings.generation_side_latency_s / r.shape.duration_s for r in records
               if not _unreported(r, "timings.generation_side_latency_s") and r.shape.duration_s > 0]
        out["real_time_factor_p50"] = quantile(rtf, 0.5) if rtf else None
    else:
        out["generation_side_latency_s"] = None
        out["real_time_factor_p50"] = None
    out["request_to_file_latency_s"] = {"p50": quantile(rtf_s, 0.5), "p90": quantile(rtf_s, 0.9),
                                        "mean": float(np.mean(rtf_s))}
    anatomy_records = [r for r in records if not _unreported(r, "stage_anatomy")]
    if anatomy_records:
        anatomy = {stage: statistics.median(getattr(r.timings.stage_anatomy, stage) for r in anatomy_records)
                   for stage in ANATOMY_STAGES}
        steps = [s for r in anatomy_records for s in r.timings.stage_anatomy.denoise_steps]
        anatomy["denoise_step"] = statistics.median(steps) if steps else None
        anatomy.update(step_ends([r.timings.stage_anatomy.denoise_steps for r in anatomy_records]))
        out["stage_anatomy_median_s"] = anatomy
    else:
        out["stage_anatomy_median_s"] = None
    peaks = [r.peak_memory_bytes for r in records if r.peak_memory_bytes is not None]
    out["peak_memory_bytes"] = max(peaks) if peaks else None
    out["usd_per_clip"] = stats.usd_per_clip(rtf_s, gpu_hourly_rate)
    return out


def step_ends(per_request: Sequence[Sequence[float]]) -> dict[str, float | None]:
    """A few-step recipe's median step mixes its compile steps with its warm ones: its first step (compile, a dense
    first step) and its last (warm) apart, each the median over the requests' own step lists."""
    steps = [s for s in per_request if s]
    return {"denoise_step_first": statistics.median(s[0] for s in steps) if steps else None,
            "denoise_step_last": statistics.median(s[-1] for s in steps) if steps else None}


def speedup(baseline: Sequence[float], candidate: Sequence[float], n_resamples: int = BOOTSTRAP_B,
            seed: int = BOOTSTRAP_SEED, level: float = CI_LEVEL) -> dict[str, Any]:
    """:func:`h3eval.stats.speedup` over paired latencies, as speed.json reports it (no CI below two pairs)."""
    base = np.asarray(baseline, dtype=np.float64)
    cand = np.asarray(candidate, dtype=np.float64)
    if base.shape != cand.shape or base.ndim != 1:
        raise ValueError(f"speedup needs paired latencies of equal length, got {base.shape} and {cand.shape}")
    n = base.size
    if n == 0:
        return {"n_pairs": 0, "speedup": None, "ci_low": None, "ci_high": None}
    warning = "fewer than 5 pairs: the CI is not informative" if n < 5 else None
    if n < 2:
        return {"n_pairs": 1, "speedup": float(base.mean() / cand.mean()), "ci_low": None, "ci_high": None,
                "ci_level": level, "bootstrap": None, "warning": warning}
    res = stats.speedup(base, cand, confidence=level, n_resamples=n_resamples, seed=seed)
    return {"n_pairs": int(n), "speedup": res.ci.estimate, "ci_low": res.ci.low, "ci_high": res.ci.high,
            "ci_level": level, "bootstrap": {"method": res.ci.method, "B": res.ci.n_resamples, "seed": seed},
            "warning": warning}


def shape_key(record: ClipRecord) -> str:
    """The sequence shape a shape-keyed kernel cache would see: packed DiT rows and text tokens."""
    return f"seq{record.shape.sequence_length}-txt{record.shape.num_text_tokens}"


def detect_recompiles(records: Iterable[ClipRecord], ratio: float = RECOMPILE_RATIO,
                      margin_s: float = RECOMPILE_MARGIN_S) -> dict[str, Any]:
    """Flag sequence shapes whose first request in a process was slower than the recipe's steady state.

    Requests are replayed in the order one process ran them (``extra["session"]``, ``extra["seq"]``): a shape is
    *new* at its first request in a session (warm-up requests count as having seen their shape; a resumed run is a
    new process and pays again). The steady state is the median generation-side latency of every non-warm-up request
    that was not first at its shape. A first request is flagged when it exceeds the steady state by more than both
    ``ratio`` (×) and ``margin_s`` (s).
    """
    records = list(records)
    if any(_unreported(r, "shape.sequence_length") for r in records):
        return {"available": False, "reason": "the server does not report sequence shapes"}
    by_session: dict[str, list[ClipRecord]] = {}
    for r in records:
        by_session.setdefault(str((r.extra or {}).get("session", "")), []).append(r)
    firsts, steady = [], []
    for session, items in by_session.items():
        seen: set[str] = set()
        for r in sorted(items, key=lambda x: (x.extra or {}).get("seq", 0)):
            key = shape_key(r)
            warm = bool((r.extra or {}).get("warmup"))
            if not warm:
                (firsts if key not in seen else steady).append((key, r))
            seen.add(key)
    return flag_first_at_shape(
        [(key, r.timings.generation_side_latency_s,
          {"request": (r.extra or {}).get("request_name"), "session": (r.extra or {}).get("session")})
         for key, r in firsts],
        [r.timings.generation_side_latency_s for _, r in steady], ratio, margin_s)


def flag_first_at_shape(firsts: Sequence[tuple[str, float, dict]], steady: Sequence[float],
                        ratio: float = RECOMPILE_RATIO, margin_s: float = RECOMPILE_MARGIN_S) -> dict[str, Any]:
    """The recompile rule on latencies: ``firsts`` are (shape, latency, info) of each shape's first request in a
    process, ``steady`` the latencies of requests that were not first at their shape."""
    if not steady:
        return {"available": False, "reason": "no steady-state request (every timed request was first at its shape)"}
    steady_s = statistics.median(steady)
    threshold = max(steady_s * ratio, steady_s + margin_s)
    flagged = [{"shape": key, "latency_s": latency, "excess_s": latency - steady_s, **info}
               for key, latency, info in firsts if latency > threshold]
    return {"available": True, "steady_state_s": steady_s, "threshold_s": threshold, "ratio": ratio,
            "margin_s": margin_s, "first_at_shape": len(firsts), "steady_requests": len(steady),
            "flagged": bool(flagged), "shapes": flagged}


def render_markdown(speed: dict[str, Any]) -> str:
    lines = [f"# Speed summary: {speed.get('run', '')}", ""]
    lines += [f"> **{notice}**\n" for notice in speed.get("notices", [])]
    lines.append(f"Baseline: `{speed['baseline']}`. Quantiles: {speed['definitions']['quantile']}. "
                 f"Speedup: {speed['definitions']['speedup']}.")
    for section, per_recipe in speed["protocols"].items():
        lines += ["", f"## {section}", "",
                  "| recipe | n | gen p50 (s) | gen p90 (s) | r2f p50 (s) | r2f p90 (s) | RTF p50 | peak MiB | $/clip | "
                  "speedup [95% CI] | recompiles |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, s in per_recipe.items():
            if s.get("status") != "ok":
                lines.append(f"| {name} | - | {s.get('status')}: {s.get('reason', '')} |||||||||")
                continue
            g, f = s.get("generation_side_latency_s") or {}, s["request_to_file_latency_s"]
            sp = s.get("speedup") or {}
            sp_text = ("-" if not sp.get("speedup") else f"{sp['speedup']:.2f}×" if sp.get("ci_low") is None
                       else f"{sp['speedup']:.2f}× [{sp['ci_low']:.2f}, {sp['ci_high']:.2f}]")
            if sp.get("warning"):
                sp_text += f" (n={sp['n_pairs']}: CI not informative)"
            rc = s.get("recompiles") or {}
            rc_text = ("n/a" if not rc.get("available") else
                       ", ".join(x["shape"] for x in rc["shapes"]) if rc["flagged"] else "none")
            peak = f"{s['peak_memory_bytes'] / 2**20:.0f}" if s.get("peak_memory_bytes") else "-"
            usd = f"{s['usd_per_clip']:.4f}" if s.get("usd_per_clip") is not None else "-"
            rtf = f"{s['real_time_factor_p50']:.3f}" if s.get("real_time_factor_p50") is not None else "-"
            lines.append(f"| {name} | {s['n']} | {g.get('p50', float('nan')):.3f} | {g.get('p90', float('nan')):.3f} | "
                         f"{f['p50']:.3f} | {f['p90']:.3f} | {rtf} | {peak} | {usd} | {sp_text} | {rc_text} |")
    if "repeated_vs_mixed" in speed:
        lines += ["", "## repeated vs mixed (p50 generation-side, mixed / repeated)", ""]
        for name, v in speed["repeated_vs_mixed"].items():
            lines.append(f"- {name}: {v['mixed_p50_s']:.3f} s / {v['repeated_p50_s']:.3f} s = {v['ratio']:.3f}")
    return "\n".join(lines) + "\n"
