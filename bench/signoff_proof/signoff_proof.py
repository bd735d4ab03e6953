"""End-to-end proof of per-recipe signoff on the trained tiny preset (issue 18), under the shipped release policy.

    python bench/signoff_proof/signoff_proof.py [--model tiny] [--out /tmp/signoff18] [--prompts world-demo] [--seeds 0,1,2,3]
                                  [--vbench-env PATH] [--turbo turbo4-tiny]

One run of 16 pairs (the world-demo captions x 4 seeds, each with ground truth in its caption) with the baseline and
five candidates:

- ``identity`` (exact): every lever off, must PASS;
- ``turbo4-tiny`` (resample): the distilled 4-step LoRA, must PASS;
- ``turbo4-tiny-lora03`` (resample, bench/recipes): the same LoRA at scale 0.3, must FAIL naming dimensions;
- ``fewer-steps`` (resample): 8 steps without the LoRA, must FAIL naming dimensions;
- ``cond-fault`` (resample, bench/recipes): the baseline with its text embeddings zeroed at the DiT's input by a
  forward pre-hook this script plants (a test-only fault, not a lever), must FAIL on prompt faithfulness.

The new-seed noise floor the policy states its thresholds against comes from the run's own baseline clips
(``h3eval.floor.newseed_floor_from_run``: each clip against the same prompt's next seed, 16 pairs);
bench/signoff_false_fail/signoff_false_fail.py resamples benign pairs from the same clips.

Gates, each on the candidates whose judge reads it (``run_gates(..., candidates=...)``): integrity, reference_free and
prompt_faithfulness on all; fidelity (LPIPS; the AlexNet trunk when its weights are in the torch cache, else the
package's ``rand`` trunk, recorded) and audio on the exact ``identity``; VBench's temporal_flickering in its pinned
environment (``--vbench-env``; one scoring subprocess per run through ``gates.vbench.evaluate_run``). The verdict is
``compute_verdict`` under gates/policies/release.toml; results go to bench/signoff_proof/results/signoff_proof.{json,md} and the
run's own report.md.

A probe of another LoRA on the same checkpoint (``--reuse-from`` an earlier proof's --out) generates only the two
recipes that load it and reuses every other clip and gate result: 2 of the 6 recipes' clips are made. Session 18
checked it: run 22d's LoRA probed that way gave the same turbo4-tiny clips (sha256) and the same verdict, dimension
for dimension, as its full probe (signoff_proof_run22d_probe.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.tiny import signoff_proof_main  # noqa: E402

if __name__ == "__main__":
    signoff_proof_main()
