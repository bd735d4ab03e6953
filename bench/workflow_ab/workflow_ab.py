"""`h3eval ab` on a keyframe (fl2va) or reference (ref2va) suite, end to end through the verdict (issue 25).

    python bench/workflow_ab/workflow_ab.py --out DIR [--model tiny-trained] [--baseline baseline] [--candidate turbo4-tiny]
        [--suite world-fl2va] [--seeds 0,1] [--policy gates/policies/fl2va.toml] [--name workflow_ab_fl2va]

Runs the commands a user runs, as subprocesses of this interpreter (``python -m h3eval.cli``):

    h3eval ab --model M --baseline B --candidate C --prompts SUITE --seeds S --out DIR/run --speed-rounds 1
    h3eval gate DIR/run --gates integrity,keyframe [-o keyframe.lpips_trunk=rand without the AlexNet weights]
    h3eval report DIR/run --policy POLICY --exit-zero

and records each command with its exit code, then the verdict per candidate and per keyframe metric (estimate, CI,
pairs, outcome, reasons) in results/<name>.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--baseline", default="baseline")
    parser.add_argument("--candidate", action="append", default=[])
    parser.add_argument("--suite", default="world-fl2va")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--policy", default=str(ROOT / "gates" / "policies" / "fl2va.toml"))
    parser.add_argument("--name", default="workflow_ab_fl2va")
    args = parser.parse_args()

    from bench.lib import results as _results
    from gates.fidelity import alexnet_weights_path

    # LPIPS is the real metric only with the AlexNet trunk's weights in the torch hub cache; without them (this
    # machine is offline) the lpips package's random trunk, named as such in the results. PSNR and SSIM are unaffected.
    trunk = "alexnet" if alexnet_weights_path().is_file() else "rand"
    run = args.out / "run"
    h3eval = [sys.executable, "-m", "h3eval.cli"]
    commands = [
        ["ab", "--model", args.model, "--baseline", args.baseline,
         *[x for c in args.candidate for x in ("--candidate", c)], "--prompts", args.suite, "--seeds", args.seeds,
         "--out", str(run), "--speed-rounds", "1"],
        ["gate", str(run), "--gates", "integrity,keyframe", "-o", f"keyframe.lpips_trunk={trunk}"],
        ["report", str(run), "--policy", args.policy, "--exit-zero"],
    ]
    steps = []
    for command in commands:
        t0 = time.perf_counter()
        done = subprocess.run(h3eval + command, cwd=ROOT, capture_output=True, text=True)
        steps.append({"command": "h3eval " + shlex.join(command), "exit_code": done.returncode,
                      "wall_s": time.perf_counter() - t0, "stdout_tail": done.stdout[-2000:],
                      "stderr_tail": done.stderr[-2000:]})
        print(f"h3eval {shlex.join(command)}: exit {done.returncode} ({steps[-1]['wall_s']:.0f} s)", flush=True)
    verdict_path = run / "verdict.json"
    verdict = json.loads(verdict_path.read_text()) if verdict_path.is_file() else None
    rows, summary = [], {}
    for cand in (verdict or {}).get("candidates", []):
        summary[cand["candidate"]] = cand["outcome"]
        for gate in cand["gates"]:
            for m in gate.get("metrics", []):
                rows.append({"candidate": cand["candidate"], "gate": gate["gate"], "metric": m["metric"],
                             "outcome": m["outcome"], "estimate": m.get("mean_value"),
                             "ci": [m.get("ci_low"), m.get("ci_high")], "pairs": m.get("n_pairs"),
                             "reasons": m.get("reasons", [])})
            if not gate.get("metrics"):
                rows.append({"candidate": cand["candidate"], "gate": gate["gate"], "metric": "(gate checks)",
                             "outcome": gate["outcome"], "estimate": None, "ci": [None, None], "pairs": None,
                             "reasons": gate.get("reasons", [])})
    payload = {"model": args.model, "lpips_trunk": trunk, "suite": args.suite, "seeds": args.seeds, "policy": args.policy,
               "steps": steps, "overall": verdict and verdict["outcome"], "candidates": summary, "metrics": rows}

    def fmt(x):
        return "n/a" if x is None else f"{x:.4f}"

    md = [f"LPIPS trunk: {trunk}" + ("" if trunk == "alexnet" else " (the AlexNet weights are not in the torch hub "
                                                                   "cache here: the package's random trunk)"), "",
          "Commands (run from the repository root):", ""]
    md += [f"- `{s['command']}` → exit {s['exit_code']} ({s['wall_s']:.0f} s)" for s in steps]
    md += ["", f"Verdict: **{payload['overall']}** "
           + ", ".join(f"{k}: {v}" for k, v in summary.items()), "",
           "| candidate | gate | metric | outcome | mean oriented delta | 95% CI | pairs | reasons |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['candidate']} | {r['gate']} | {r['metric']} | {r['outcome']} | {fmt(r['estimate'])} | "
                  f"[{fmt(r['ci'][0])}, {fmt(r['ci'][1])}] | {r['pairs']} | {'; '.join(r['reasons'])[:300]} |")
    _results.write(args.name, payload, "\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
