"""Small synthetic run directories for the verdict and report tests: a manifest, clip records, gate results.

Records are valid :class:`h3.record.ClipRecord` (built by ``h3eval.synth.synthetic_record``) next to a stand-in MP4
file; the verdict reads records, not video. Tests that need real video use ``h3eval.synth.make_synthetic_run``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from gates.base import GateResult, Metric, PairRef
from h3.atomic import atomic_write_json, atomic_write_text
from h3eval.store import PromptSuiteRef, RunManifest, RunStore, utc_now
from h3eval.synth import synthetic_record

BASELINE = "baseline"


def make_run(
    root: Path,
    candidates: Iterable[str] = ("fast",),
    n_prompts: int = 16,
    seeds: Iterable[int] = (0,),
    latency: Callable[[str, str, int], float] | None = None,
    warmup: set[tuple[str, str, int]] | None = None,
) -> RunStore:
    store = RunStore(root)
    candidates = list(candidates)
    prompt_ids = [f"p{i:02d}" for i in range(n_prompts)]
    seeds = list(seeds)
    recipes = [BASELINE, *candidates]
    now = utc_now()
    manifest = RunManifest(
        kind="ab", created_at=now, updated_at=now, model="synthetic", backend="folder", baseline=BASELINE,
        candidates=candidates, recipes={r: {"name": r} for r in recipes},
        recipe_sha256={r: hashlib.sha256(r.encode()).hexdigest() for r in recipes},
        prompts=PromptSuiteRef(path="prompts/test.jsonl", sha256="ab" * 32, ids=prompt_ids), seeds=seeds,
        status="complete",
    )
    store.write_manifest(manifest)
    rng = np.random.default_rng(0)
    frames = np.zeros((2, 8, 8, 3), dtype=np.uint8)
    pcm = np.zeros((64, 2), dtype=np.int16)
    for pid in prompt_ids:
        for seed in seeds:
            jitter = float(rng.uniform(0.95, 1.05))
            for recipe in recipes:
                mp4 = store.clip_path(recipe, pid, seed)
                mp4.parent.mkdir(parents=True, exist_ok=True)
                mp4.write_bytes(f"stand-in for {recipe}/{pid}-s{seed}".encode())
                lat = latency(recipe, pid, seed) if latency else (2.0 if recipe == BASELINE else 1.0) * jitter
                rec = synthetic_record(recipe, pid, seed, frames, pcm, mp4, latency_s=lat)
                if warmup and (recipe, pid, seed) in warmup:
                    rec.extra["warmup"] = True
                atomic_write_json(store.record_path(recipe, pid, seed), rec.model_dump(mode="json"))
    return store


def pairs_of(store: RunStore) -> list[tuple[str, int]]:
    m = store.read_manifest()
    return [(p, s) for p in m.prompts.ids for s in m.seeds]


def write_result(
    store: RunStore,
    gate: str,
    candidate: str,
    prompt_id: str,
    seed: int,
    metrics: dict[str, tuple[float | None, bool]] | None = None,
    **fields,
) -> Path:
    """Write one GateResult; ``metrics`` maps name -> (value, higher_is_better)."""
    result = GateResult(
        gate=gate,
        pair=PairRef(baseline=BASELINE, candidate=candidate, prompt_id=prompt_id, seed=seed),
        metrics={k: Metric(value=v, higher_is_better=h) for k, (v, h) in (metrics or {}).items()},
        **fields,
    )
    path = store.gate_dir(gate) / candidate / f"{prompt_id}-s{seed}.json"
    atomic_write_json(path, result.model_dump(mode="json"))
    return path


def write_text(path: Path, text: str) -> Path:
    atomic_write_text(path, text)
    return path


TEST_POLICY = """
version = 1
name = "test"
min_pairs = 8
n_resamples = 2000

[speed]
min_speedup = 1.2

[gates.integrity]
max_flagged = 0

[gates.fidelity.metrics.lpips_mean]
direction = "lower_is_better"
max = 0.05

[gates.vbench.metrics.overall_consistency]
compare = "sides"
direction = "higher_is_better"
margin = 0.01

[gates.vbench.metrics.dynamic_degree]
compare = "sides"
direction = "higher_is_better"
binary = true
margin = 0.0625
"""


def write_clean_results(
    store: RunStore,
    candidate: str,
    *,
    seed: int = 1,
    lpips_shift: float = 0.0,
    consistency_shift: float = 0.0,
    dynamic_flips: int = 0,
    skip_gates: tuple[str, ...] = (),
) -> dict[str, np.ndarray]:
    """Gate results of a faithful candidate, with optional planted regressions; returns the values written."""
    rng = np.random.default_rng(seed)
    pairs = pairs_of(store)
    n = len(pairs)
    lpips = np.abs(rng.normal(0.01, 0.003, n)) + lpips_shift
    base_oc = rng.uniform(0.2, 0.3, n)
    cand_oc = base_oc + rng.normal(0.0, 0.002, n) + consistency_shift
    base_dd = (np.arange(n) % 2).astype(float)
    cand_dd = base_dd.copy()
    flipped = np.flatnonzero(base_dd == 1)[:dynamic_flips]
    cand_dd[flipped] = 0.0
    for i, (pid, s) in enumerate(pairs):
        if "integrity" not in skip_gates:
            write_result(store, "integrity", candidate, pid, s)
        if "fidelity" not in skip_gates:
            write_result(store, "fidelity", candidate, pid, s, {"lpips_mean": (float(lpips[i]), False)})
        if "vbench" not in skip_gates:
            write_result(store, "vbench", candidate, pid, s, {
                "overall_consistency": (float(cand_oc[i]), True),
                "overall_consistency.baseline": (float(base_oc[i]), True),
                "dynamic_degree": (float(cand_dd[i]), True),
                "dynamic_degree.baseline": (float(base_dd[i]), True),
            })
    return {"lpips": lpips, "base_oc": base_oc, "cand_oc": cand_oc, "base_dd": base_dd, "cand_dd": cand_dd}
