"""The goals of the card a call ran on (bench/card_goals/card_goals.py over `h200_goals.py --stock`): each entry's
ratio is stock's seconds over the measured ones of the same process, met against the issue's target, a goal not
measured carries no number, and a file that is not a measurement (NaN, a CPU smoke run) is refused with exit 3."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench.lib import goals as g

ROOT = Path(__file__).resolve().parent.parent
CARD = "NVIDIA H100 80GB HBM3"


def _raw() -> dict:
    return {"device": CARD, "date": "2026-12-07T19:00:00Z", "torch": "2.11", "cuda": "12.8", "diffusers": "0.42.1",
            "weights": "seeded random", "sageattention": "2.2.0",
            "stock": {"dense768": {"measured": True, "shape": "5s-768x1344", "measured_s": 8.0,
                                   "forward_s_all": [8.1, 8.0, 7.9, 8.2]}},
            "dense_extra": {"turbo4-fp8-sage-compile+graphs": {"measured": True, "measured_s": 4.0,
                                                               "first_call_s": 60.0}},
            "rows": {"dense768": {"measured": True, "shape": "5s-768x1344", "measured_s": 5.0,
                                  "forward_s_all": [5.0, 5.1, 4.9, 5.0], "variant": "turbo4-fp8-sage-compile"},
                     "sparse768": {"measured": False, "reason": "failed", "error": "RuntimeError: planted"},
                     "decode15": {"measured": True, "shape": "15s-768x1344", "measured_s": 16.0,
                                  "per_tile": {"256x256": {"measured": True, "decode_s": 20.0},
                                               "304x320": {"measured": True, "decode_s": 16.0}},
                                  "lever_tiles": {"304x320": {"measured": True, "stock_s": 16.0, "levers": {
                                      "compile": {"measured": True, "first_s": 40.0, "decode_s": 5.0,
                                                  "decode_repeats": 2}}}}}}}


def _entry(entries: dict, prefix: str) -> dict:
    (name,) = [n for n in entries if n.startswith(prefix)]
    assert name.endswith(f"({CARD})")
    return entries[name]


def test_entries_are_the_ratio_to_stock_of_the_same_process():
    entries = g.card_goal_entries(_raw(), "r.json")
    dense = _entry(entries, "dense DiT forward")
    assert dense["measured"] == 5.0 and dense["met"] is False and dense["target"] == 3.3
    assert dense["ratio_to_stock"] == pytest.approx(8.0 / 5.0)
    assert dense["measured_as"].startswith("median of 4 forwards")
    decode = _entry(entries, "video decode")
    assert decode["measured"] == 5.0 and decode["met"] is True  # 5.0 <= 6 s
    assert decode["ratio_to_stock"] == pytest.approx(20.0 / 5.0)  # against the eager 256x256 decode, not 304x320
    sparse = _entry(entries, "85% sparse forward")
    assert sparse["measured"] is None and sparse["met"] is None and "ratio_to_stock" not in sparse
    assert sparse["not_measured"] == "RuntimeError: planted"


def test_no_stock_gives_no_ratio_and_says_so():
    raw = _raw()
    raw["stock"]["dense768"] = {"measured": False, "error": "OutOfMemoryError: planted"}
    dense = _entry(g.card_goal_entries(raw, "r.json"), "dense DiT forward")
    assert dense["measured"] == 5.0 and dense["ratio_to_stock"] is None
    assert "OutOfMemoryError" in dense["stock"]


@pytest.mark.parametrize("where, value", [("dense", math.nan), ("dense", -1.0), ("stock", math.inf),
                                          ("decode", "5")])
def test_a_value_that_is_not_seconds_is_refused(where, value):
    raw = _raw()
    target = {"dense": raw["rows"]["dense768"], "stock": raw["stock"]["dense768"],
              "decode": raw["rows"]["decode15"]["lever_tiles"]["304x320"]["levers"]["compile"]}[where]
    target["decode_s" if where == "decode" else "measured_s"] = value
    with pytest.raises(g.BadInput, match="not a finite positive number of seconds"):
        g.card_goal_entries(raw, "r.json")


def test_cli_writes_the_record_and_the_goals_and_refuses_a_cpu_run(tmp_path: Path):
    src, results, goals = tmp_path / "call", tmp_path / "results", tmp_path / "goals.json"
    src.mkdir()
    goals.write_text(json.dumps({"kept": {"measured": 1.0}}))
    (src / "h200_goals_raw.json").write_text(json.dumps(_raw()))
    args = ["--from", str(src), "--name", "t", "--command", "c", "--goals", str(goals), "--results", str(results)]
    assert g.card_goals_main(args) == 0
    table = json.loads(goals.read_text())
    assert table["kept"] == {"measured": 1.0} and len(table) == 4
    md = (results / "t.md").read_text()
    assert "| turbo4-fp8-sage-compile+graphs | 4.000 | 60.0 | 2.00x |" in md
    # a CPU smoke run of the driver itself (the tiny configs) is no card's figure: exit 3, nothing written
    smoke = tmp_path / "smoke"
    proc = subprocess.run([sys.executable, "bench/full_size_speed/h200_goals.py", "--out",
                           str(smoke / "h200_goals_raw.json"), "--smoke", "--stock", "--rows", "dense768",
                           "--repeats", "1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-800:]
    raw = json.loads((smoke / "h200_goals_raw.json").read_text())
    assert raw["stock"]["dense768"]["measured"] is True and raw["build_text_s"] is None
    assert g.card_goals_main(["--from", str(smoke), "--name", "s", "--command", "c", "--goals", str(goals),
                              "--results", str(results)]) == 3
    assert not (results / "s.json").exists() and len(json.loads(goals.read_text())) == 4
