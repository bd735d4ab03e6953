"""The audio gate's STFT distance with the log-magnitude clamp at 1e-7 alone (before c4b134d) and at 80 dB under the
pair's loudest bin (gates.audio.STFT_TOP_DB), on a run's same-seed candidate pairs and its baseline's new-seed pairs.

    python bench/audio_stft_clamp/audio_stft_clamp.py RUN --candidate NAME [--name audio_stft_clamp]

RUN is a run directory holding clips of ``baseline`` and NAME at the same prompts and seeds (bench/signoff_false_fail's
near pool, for example). New-seed pairs: each baseline clip against the same prompt's next seed (cyclically).
Writes bench/<study>/results/NAME.{json,md}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def distance(a_path: Path, b_path: Path, top_db: float) -> float:
    import gates.audio as audio
    from gates.media_cache import load_audio

    a, b = load_audio(a_path)[0], load_audio(b_path)[0]
    n = min(a.shape[1], b.shape[1])
    with mock.patch.object(audio, "STFT_TOP_DB", top_db):
        return audio.stft_distance(a[:, :n], b[:, :n])


def main() -> None:
    from bench.lib import results as _results
    from h3eval.store import RunStore

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run")
    parser.add_argument("--candidate", required=True)
    parser.add_argument("--name", default="audio_stft_clamp")
    args = parser.parse_args()
    root = Path(args.run)
    manifest = RunStore(root).read_manifest()
    clips = root / "clips"
    seeds = manifest.seeds
    same = [(clips / "baseline" / f"{p}-s{s}.mp4", clips / args.candidate / f"{p}-s{s}.mp4")
            for p in manifest.prompts.ids for s in seeds]
    newseed = [(clips / "baseline" / f"{p}-s{s}.mp4", clips / "baseline" / f"{p}-s{seeds[(i + 1) % len(seeds)]}.mp4")
               for p in manifest.prompts.ids for i, s in enumerate(seeds)] if len(seeds) > 1 else []
    rows = []
    for label, top_db in (("1e-7 only (before c4b134d)", 1e9), ("80 dB under the loudest bin", 80.0)):
        cand = [distance(a, b, top_db) for a, b in same]
        seed = [distance(a, b, top_db) for a, b in newseed]
        rows.append({"clamp": label, "candidate_mean": float(np.mean(cand)), "candidate_min": float(np.min(cand)),
                     "candidate_max": float(np.max(cand)), "pairs": len(cand),
                     "newseed_mean": float(np.mean(seed)) if seed else None, "newseed_pairs": len(seed)})
    table = ["| clamp | candidate pairs | candidate mean [min, max] | new-seed mean | candidate / new-seed |",
             "|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['candidate_mean'] / r['newseed_mean']:.3f}" if r["newseed_mean"] else "-"
        newseed_text = f"{r['newseed_mean']:.4f} ({r['newseed_pairs']})" if r["newseed_mean"] else "-"
        table.append(f"| {r['clamp']} | {r['pairs']} | {r['candidate_mean']:.4f} [{r['candidate_min']:.4f}, "
                     f"{r['candidate_max']:.4f}] | {newseed_text} | {ratio} |")
    note = f"\n\nRun `{root}`, candidate `{args.candidate}` against `baseline` at the same prompts and seeds {seeds}."
    print("\n".join(table))
    print("wrote", *_results.write(args.name, {"run": str(root), "candidate": args.candidate, "rows": rows},
                                   "\n".join(table) + note))


if __name__ == "__main__":
    main()
