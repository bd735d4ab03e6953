"""Verdict and reports over a run of realistic size: the statistics must not be what a CI step waits on.

    python bench/verdict_report/verdict_report.py [--candidates 3] [--pairs 64] [--repeats 3]

Builds a run of records and gate results (no video; strips are then skipped), then times ``compute_verdict``
(BCa bootstraps of 9999 resamples for every metric of every candidate) and ``write_reports`` separately, and
writes bench/verdict_report/results/verdict_report_cpu.{json,md}. Target: at most TARGET_S seconds for the verdict of 3
candidates x 64 pairs x 4 gate metrics on the 2-core CPU (an engineering budget, not a number from the field).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

TARGET_S = 10.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--candidates", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from bench.lib import results as _results
    from h3eval.policy import load_policy
    from h3eval.report import write_reports
    from h3eval.verdict import compute_verdict
    from verdict_fixtures import TEST_POLICY, make_run, write_clean_results, write_text

    candidates = [f"c{i}" for i in range(args.candidates)]
    with tempfile.TemporaryDirectory() as tmp:
        store = make_run(Path(tmp) / "run", candidates=candidates, n_prompts=args.pairs)
        for i, c in enumerate(candidates):
            write_clean_results(store, c, seed=i, consistency_shift=-0.02 * (i % 2))
        # Production resample count (the test policy uses 2000 to keep tests fast).
        policy = load_policy(write_text(Path(tmp) / "p.toml", TEST_POLICY.replace("n_resamples = 2000",
                                                                                    "n_resamples = 9999")))
        verdict_s, report_s = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            verdict = compute_verdict(store.root, policy)
            verdict_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            write_reports(verdict, store.root)
            report_s.append(time.perf_counter() - t0)
    n_metrics = sum(len(g.metrics) for g in verdict.candidates[0].gates)
    payload = {
        "candidates": args.candidates,
        "pairs": args.pairs,
        "metrics_per_candidate": n_metrics,
        "n_resamples": 9999,
        "verdict_s": verdict_s,
        "report_s": report_s,
        "verdict_median_s": statistics.median(verdict_s),
        "report_median_s": statistics.median(report_s),
        "target_s": TARGET_S,
        "meets_target": statistics.median(verdict_s) <= TARGET_S,
        "outcome": verdict.outcome,
    }
    table = (
        "| candidates | pairs | metrics/candidate | verdict median (s) | reports median (s) | target (s) | met |\n"
        "|---|---|---|---|---|---|---|\n"
        f"| {args.candidates} | {args.pairs} | {n_metrics} | {payload['verdict_median_s']:.2f} | "
        f"{payload['report_median_s']:.2f} | {TARGET_S} | {payload['meets_target']} |\n"
    )
    json_path, md_path = _results.write("verdict_report_cpu", payload, table)
    sys.stdout.write(table + f"\nwrote {json_path} and {md_path}\n")


if __name__ == "__main__":
    main()
