"""The README's workflow "On your GPU, through the h3 runtime", read from README.md and run on the CPU.

Shared by tests/test_readme_workflow.py (each command's exit code, a verdict of PASS or FAIL) and
tests/test_signoff_chain.py (issue 50's chain on the trained tiny: turbo4-tiny PASS, the 16x LoRA FAIL, the 8-step
recipe FAIL): both read the one run this module generates, once per test process, so CI pays for its clips once.

The commands are the README's, word for word, run by the installed CLI (``python -m h3eval.cli``) in a scratch
folder (so ``runs/r1`` and ``runs/floor`` are the README's own relative paths). Only the values that name this
machine and its budget are replaced (:data:`SUBSTITUTIONS`), each for a stated reason; an option the README drops or
renames breaks the substitution and fails the test, naming the word.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from h3.determinism import portable_numerics_env

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SECTION = "### On your GPU, through the h3 runtime"
LORA_16X = ROOT / "bench" / "recipe_bugs" / "recipes" / "lora-16x.toml"
STEPS = ("ab", "gate", "floor", "verdict")
"""The workflow's steps this module runs (report and dashboard follow them in the README; the report is run too)."""

SUBSTITUTIONS: dict[tuple[str, str], list[str]] = {
    # (the option, the README's value): the words that replace the value
    ("--model", "CKPT"): ["tiny"],  # the trained tiny preset (h3/assets/tiny): the same chain on a CPU
    ("--device", "cuda"): ["cpu"],  # CI has no GPU
    ("--candidate", "turbo4"): ["turbo4-tiny"],  # turbo4's LoRA is the full-size model's; the tiny's own distilled one
    # "my-recipe.toml": the recipe-bug corpus's LoRA at 16x (seed 001), and the 8-step recipe without a LoRA: the two
    # recipes issue 50's chain must FAIL, generated in the same run as turbo4-tiny (one baseline for all three)
    ("--candidate", "my-recipe.toml"): [str(LORA_16X), "--candidate", "fewer-steps"],
    # the trained tiny's own captions (each with its ground truth, for the content check) at 4 seeds: 16 pairs, the
    # policy's min_pairs
    ("--prompts", "vbench-dev16"): ["world-demo"],
    ("--seeds", "0,1"): ["0,1,2,3"],
    # CI has no VBench environment (`h3eval vbench setup` builds it in minutes, and scoring on 2 CPU cores is slow):
    # the demo policy is the release policy without VBench (gates/policies/demo.toml, generated from release.toml)
    ("--policy", "release"): ["demo"],
}
EXTRA = {"ab": ["--speed-rounds", "0"]}
"""Added words, for the budget only: no separate speed round (the verdict's speed check pairs the 64 quality requests,
each pair's recipes back to back, as `h3eval demo` does); the README's default is two cycles of the suite per recipe."""


def readme_commands(text: str | None = None) -> dict[str, list[str]]:
    """The ``h3eval`` commands of the README's GPU workflow block, by subcommand, as shell words (continuation lines
    joined, ``#`` comments dropped)."""
    text = README.read_text(encoding="utf-8") if text is None else text
    start = text.index(SECTION)
    block = re.search(r"```bash\n(.*?)```", text[start:], re.S)
    assert block, f"README.md: no ```bash block under {SECTION!r}"
    joined = re.sub(r"\\\n", " ", block.group(1))
    out: dict[str, list[str]] = {}
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            assert words[0] == "h3eval", f"README.md's workflow line does not start with h3eval: {line!r}"
            out[words[1]] = words
    return out


def substitute(words: list[str]) -> list[str]:
    """The README's words with :data:`SUBSTITUTIONS` applied (an option followed by the README's value)."""
    out: list[str] = []
    for i, word in enumerate(words):
        previous = words[i - 1] if i else ""
        out += SUBSTITUTIONS.get((previous, word), [word])
    return out + EXTRA.get(words[1], [])


@dataclass
class Step:
    words: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float


@dataclass
class Workflow:
    folder: Path
    steps: dict[str, Step] = field(default_factory=dict)

    @property
    def run_dir(self) -> Path:
        return self.folder / "runs" / "r1"


_CACHE: dict[str, Workflow] = {}


def run_step(folder: Path, words: list[str]) -> Step:
    # Portable numerics (h3/determinism.py): the clips' and the gates' floats are the same on any x86-64 CPU with AVX2
    # (CI's, whichever it is), so the chain's exact outcomes hold there as they do here (bench/portable_numerics).
    env = {**os.environ, **portable_numerics_env(), "PYTHONUNBUFFERED": "1"}
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "h3eval.cli", *words[1:]], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=3600)
    return Step(words, proc.returncode, proc.stdout, proc.stderr, time.perf_counter() - started)


def readme_workflow(tmp_path_factory) -> Workflow:
    """The README's ab -> gate -> floor -> verdict -> report, run once per test process (later callers get the same
    run). Stops at the first step that exits other than its documented codes (ab/gate/floor 0; verdict 0, 1 or 2)."""
    if "run" in _CACHE:
        return _CACHE["run"]
    folder = tmp_path_factory.mktemp("readme-workflow")
    flow = Workflow(folder)
    commands = readme_commands()
    for name in (*STEPS, "report"):
        step = run_step(folder, substitute(commands[name]))
        flow.steps[name] = step
        if step.returncode not in ((0, 1, 2) if name in ("verdict", "report") else (0,)):
            break
    _CACHE["run"] = flow
    return flow
