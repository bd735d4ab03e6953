"""Issue 23's goals table (bench/full_size_speed/h200_goals_table.py): the issue's JSON form from the measured rows, each goal met,
missed or not measured (never a number for a row not measured), achieved TFLOP/s from the counted FLOPs, and bad
input refused with exit 3."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.lib.goals import EXTRA, GOALS, RESULTS, BadInput, goals

ROOT = Path(__file__).resolve().parent.parent


def _request(total: float) -> dict:
    stages = {"text_encode": 0.05, "denoise": total - 3.1, "video_decode": 2.8, "audio_decode": 0.05,
              "frames_pcm_to_host": 0.05, "mux": 0.15}
    return {"total_s": total, "stages": stages}


def _raw() -> dict:
    return {"command": "planted", "date": "2026-11-30", "device": "planted", "torch": "x", "cuda": "x",
            "diffusers": "0.42.1", "weights": "seeded random", "budget_s": 250, "dense_variant": "turbo4-fp8+compile",
            "rows": {
                # just inside its target: met
                "request544": {"measured": True, "shape": "5s-544x960", "measured_s": 5.19,
                               "variant": "turbo4-fp8+compile", "first_request": _request(30.0),
                               "requests": [_request(5.19)], "mux_smooth_frames_s": 0.9},
                # just outside: missed
                "dense768": {"measured": True, "shape": "5s-768x1344", "measured_s": 3.31,
                             "forward_s_all": [3.31, 3.32], "first_call_s": 20.0, "variant": "turbo4-fp8+compile"},
                "decode15": {"measured": True, "shape": "15s-768x1344", "measured_s": 12.0, "best_tile": "304x320",
                             "per_tile": {"304x320": {"measured": True, "decode_s": 12.0},
                                          "384x448": {"measured": False, "reason": "out of the time box: 10 s left"}}},
                "sparse768": {"measured": False, "reason": "failed", "error": "RuntimeError: planted"},
                "request15": {"measured": False, "reason": "out of the time box: 20 s left, the row needs about 200 s"},
            }}


@pytest.fixture()
def planted(tmp_path: Path) -> Path:
    shutil.copy(RESULTS / "h200_speed_stock.json", tmp_path)
    (tmp_path / "h200_goals_raw.json").write_text(json.dumps(_raw()))
    (tmp_path / "h200_recipes_768.json").write_text(json.dumps(
        {"shapes": {"5s-768x1344": {"flops_dense": {"total": 2.78e15}}}}))
    (tmp_path / "vae_decode_flops.json").write_text(json.dumps(
        {"shapes": {"15s-768x1344": {"tiles": {"304x320": {"flops": 4.8e15}}}}}))
    return tmp_path


def test_goals_json_has_the_issues_form_one_entry_per_row(planted: Path):
    card_row = {"measured": 9.9, "target": 5.2, "card": "planted card", "source": "elsewhere"}
    (planted / "h200_goals.json").write_text(json.dumps({"a card's row": card_row}))  # another study's entry
    proc = subprocess.run([sys.executable, "bench/full_size_speed/h200_goals_table.py", "--results", str(planted)], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    table = json.loads((planted / "h200_goals.json").read_text())
    assert list(table) == [goal for _, goal, _ in GOALS] + ["a card's row"]  # the goals, then what others wrote
    assert table["a card's row"] == card_row
    assert table["5 s 544×960 `turbo4` request, faster than real time"] == {
        "measured": 5.19, "target": 5.2, "unit": "s", "met": True, "source": "bench/full_size_speed/results/h200_goals_raw.json"}
    assert table["dense DiT forward at 5 s 768×1344"]["met"] is False
    assert table["video decode at 15 s 768×1344"] == {
        "measured": 12.0, "target": 6.0, "unit": "s", "met": False, "source": "bench/full_size_speed/results/h200_goals_raw.json"}
    sparse, req15 = table["85% sparse forward"], table["15 s 768×1344 `turbo4-sparse` request"]
    assert sparse["measured"] is None and sparse["met"] is None and sparse["not_measured"] == "RuntimeError: planted"
    assert req15["measured"] is None and req15["not_measured"].startswith("out of the time box")
    md = (planted / "h200_goals.md").read_text()
    assert md == proc.stdout
    # Achieved rates against the chip's ceilings, from the counted FLOPs: 2.78 PFLOP in 3.31 s, 4.8 PFLOP in 12 s.
    ceil = json.loads((RESULTS / "h200_speed_stock.json").read_text())["ceilings"]
    dense = next(line for line in md.splitlines() if line.startswith("| dense DiT forward"))
    assert f"| 3.31 s | **missed** | {2.78e15 / 3.31 / 1e12:.0f} TFLOP/s " in dense
    assert f"{2.78e15 / 3.31 / 1e12 / ceil['bf16_matmul_tflops']:.0%} of bf16" in dense
    decode = next(line for line in md.splitlines() if line.startswith("| video decode"))
    assert f"| 12.00 s | **missed** | {4.8e15 / 12 / 1e12:.0f} TFLOP/s " in decode
    assert "| 384x448 | not measured: out of the time box: 10 s left | — |" in md
    assert "**not measured**: RuntimeError: planted" in md


def test_goals_refuse_a_measured_row_without_a_finite_time():
    raw = _raw()
    for bad in (math.nan, math.inf, -1.0, 0.0, "5", None, True):
        raw["rows"]["request544"]["measured_s"] = bad
        with pytest.raises(BadInput, match=r"rows\.request544\.measured_s: .* is not a finite positive number"):
            goals(raw)


def test_goals_table_exits_3_on_bad_input(planted: Path):
    raw = _raw()
    raw["rows"]["dense768"]["measured_s"] = math.nan
    (planted / "h200_goals_raw.json").write_text(json.dumps(raw))  # json writes NaN, Python reads it back
    proc = subprocess.run([sys.executable, "bench/full_size_speed/h200_goals_table.py", "--results", str(planted)], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 3 and proc.stdout == ""
    assert "rows.dense768.measured_s: nan is not a finite positive number of seconds" in proc.stderr
    assert not (planted / "h200_goals.json").exists()
    (planted / "h200_goals_raw.json").unlink()
    proc = subprocess.run([sys.executable, "bench/full_size_speed/h200_goals_table.py", "--results", str(planted)], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 3
    assert proc.stderr.strip() == f"h200_goals_table: {planted / 'h200_goals_raw.json'} is missing"
    with pytest.raises(BadInput, match="no 'rows' object"):
        goals({"command": "x"})
    raw = _raw()  # a smoke run of bench/full_size_speed/h200_goals.py on the CPU: its rows are at the tiny shape
    raw["rows"]["decode15"]["shape"] = "smoke-64x64"
    with pytest.raises(BadInput, match="rows.decode15 was measured at 'smoke-64x64'; the goal is at 15s-768x1344"):
        goals(raw)


def test_every_row_of_the_bench_is_a_goal_of_the_table():
    from bench.lib.goals import ESTIMATE_S, ROWS

    assert [key for key, _, _ in GOALS] == ["request15", "request544", "dense768", "sparse768", "decode15"]
    assert set(ROWS) == {key for key, _, _ in GOALS} | set(EXTRA) == set(ESTIMATE_S)
    assert EXTRA == ("request15all",)


def test_goals_combine_calls_each_row_from_the_newest_file_that_measured_it(planted: Path):
    """Calls measure different rows: the table takes each from the last raw file given (rising precedence) that
    measured it, names that file as the goal's source, and a later file that did not reach a row keeps the earlier
    figure. The decoder lever's variants are shown beside the stock decode of their own process."""
    later = _raw()
    later["command"] = "the later call"
    later["rows"] = {
        "request15": {"measured": True, "shape": "15s-768x1344", "measured_s": 106.2, "variant": "turbo4-sparse",
                      "first_request": _request(117.0), "requests": [_request(106.2)], "mux_smooth_frames_s": 4.8},
        "request15all": {"measured": True, "shape": "15s-768x1344", "measured_s": 60.5, "variant": "every step sparse",
                         "first_request": _request(70.0), "requests": [_request(60.5)], "mux_smooth_frames_s": 4.8},
        "request544": {"measured": False, "reason": "not asked for (--rows)"},  # keeps the earlier 5.19 s
        "decode15": {"measured": True, "shape": "15s-768x1344", "measured_s": 14.3, "best_tile": "304x320",
                     "per_tile": {"304x320": {"measured": True, "decode_s": 14.3}},
                     "levers": {"fp8": {"measured": True, "decode_s": 9.5, "first_s": 11.0},
                                "compile": {"measured": False, "error": "RuntimeError: planted"}}},
    }
    (planted / "h200_goals_raw_later.json").write_text(json.dumps(later))
    proc = subprocess.run([sys.executable, "bench/full_size_speed/h200_goals_table.py", "--results", str(planted), "--raw",
                           "h200_goals_raw.json", "--raw", "h200_goals_raw_later.json"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    table = json.loads((planted / "h200_goals.json").read_text())
    assert list(table) == [goal for _, goal, _ in GOALS]  # request15all is no goal of its own
    assert table["15 s 768×1344 `turbo4-sparse` request"] == {
        "measured": 106.2, "target": 30.0, "unit": "s", "met": False,
        "source": "bench/full_size_speed/results/h200_goals_raw_later.json"}
    assert table["5 s 544×960 `turbo4` request, faster than real time"]["measured"] == 5.19
    assert table["5 s 544×960 `turbo4` request, faster than real time"]["source"] == \
        "bench/full_size_speed/results/h200_goals_raw.json"
    assert table["video decode at 15 s 768×1344"]["measured"] == 14.3
    md = proc.stdout
    assert "| `request15all` | `every step sparse` |" in md
    assert "| stock (eager, unquantized) | 14.30 | 1.00x | — |" in md
    assert "| fp8 | 9.50 | 1.51x | 11.0 |" in md and "| compile | not measured: RuntimeError: planted | | | |" in md
    assert "--raw h200_goals_raw.json --raw h200_goals_raw_later.json" in md
    later["rows"]["decode15"]["levers"]["fp8"]["decode_s"] = math.nan
    (planted / "h200_goals_raw_later.json").write_text(json.dumps(later))
    proc = subprocess.run([sys.executable, "bench/full_size_speed/h200_goals_table.py", "--results", str(planted), "--raw",
                           "h200_goals_raw.json", "--raw", "h200_goals_raw_later.json"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 3 and "rows.decode15.levers.fp8.decode_s: nan is not a finite positive" in proc.stderr


def test_goals_models_take_the_runtimes_float32_rule():
    """The goals script builds its models directly in bfloat16 and then pins what diffusers' from_pretrained keeps in
    float32; every state-dict entry must end in the dtype the runtime's seeded build gives it (h3.random_model, the
    loading rule applied per tensor). The 2026-12-01 call pinned per module and left the VAE decoder's ``scale1`` /
    ``scale2`` parameters in bfloat16: the decode then failed in the float32 ``norm_out``."""
    import torch

    from bench.lib.goals import build
    from h3.random_model import build_components, small

    goals = build(True, "cpu", torch.bfloat16)
    runtime = build_components(small(), "cpu", torch.bfloat16)
    for name in ("transformer", "vae", "audio_vae"):
        ours = {k: v.dtype for k, v in getattr(goals, name).state_dict().items()}
        theirs = {k: v.dtype for k, v in runtime[name].state_dict().items()}
        assert ours.keys() == theirs.keys(), name
        assert ours == theirs, (name, {k: (ours[k], theirs[k]) for k in ours if ours[k] != theirs[k]})
    assert goals.vae.decoder.transformer_blocks[0].scale1.dtype == torch.float32
    assert goals.vae.decoder.transformer_blocks[0].norm1.weight.dtype == torch.float32
    assert goals.vae.decoder.proj_out.weight.dtype == torch.bfloat16


def test_goals_refuse_an_unknown_decoder_variant_before_building_anything():
    """A --decode-levers variant that is not compile / fp8 / int8 joined by '+' (one quantization at most) is refused
    at once with exit 2, instead of timing the stock decode under the misspelt name."""
    for bad in ("compil", "compile+fp16", "fp8+int8"):
        proc = subprocess.run([sys.executable, "bench/full_size_speed/h200_goals.py", "--out", "/nonexistent/x.json", "--smoke",
                               "--rows", "decode15", "--decode-levers", f"compile,{bad}"], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, (bad, proc.stderr[-500:])
        assert f"--decode-levers {bad!r}: a variant is compile, fp8 or int8" in proc.stderr


def test_every_committed_goal_names_a_record_that_exists():
    """Each entry of the committed h200_goals.json points at its record (``source`` or ``record``), and the file is
    there: an entry whose record moved or was never committed is a figure without its command."""
    table = json.loads((RESULTS / "h200_goals.json").read_text())
    missing = {name: e.get("source") or e.get("record") for name, e in table.items()
               if not (ROOT / (e.get("source") or e.get("record") or "nowhere")).is_file()}
    assert not missing, missing
