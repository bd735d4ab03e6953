"""bench/mux_speed: the PSNR against scikit-image's, and the mux goal's entry read from a record (met, missed,
refused on a non-finite time); bench/post_decode's entry of the same goal (the streamed request's mux stage)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench" / "mux_speed"))

import mux_speed  # noqa: E402

sys.path.insert(0, str(ROOT / "bench" / "post_decode"))
import post_decode  # noqa: E402

RECORD = ROOT / "bench" / "mux_speed" / "results" / "mux_speed_h100_s24.json"


def test_psnr_is_scikit_images_mean_over_frames():
    from skimage.metrics import peak_signal_noise_ratio

    rng = np.random.default_rng(4)
    a = rng.integers(0, 256, (3, 16, 24, 3), dtype=np.uint8)
    b = np.clip(a.astype(int) + rng.integers(-9, 10, a.shape), 0, 255).astype(np.uint8)
    expected = np.mean([peak_signal_noise_ratio(x, y, data_range=255) for x, y in zip(a, b)])
    assert mux_speed.psnr_db(a, b) == pytest.approx(expected, rel=1e-12)


def test_synthetic_clip_is_seeded_and_moving():
    a, b = mux_speed.synthetic_clip(0.5, 64, 96), mux_speed.synthetic_clip(0.5, 64, 96)
    assert a.shape == (13, 64, 96, 3) and a.dtype == np.uint8 and np.array_equal(a, b)
    assert np.abs(a[1:].astype(int) - a[:-1]).mean() > 1.0  # frames differ: motion and grain


def test_goal_entry_reads_the_record_and_its_reference_row():
    record = json.loads(RECORD.read_text())
    name, entry = mux_speed.goal_entry(record, "r.json")
    rows = {(r["shape"], r["preset"], r["threads"]): r["mux_s"] for r in record["rows"]}
    assert entry["measured"] == rows[("15x768x1344", "veryfast", 8)]
    assert entry["ratio_to_stock"] == round(rows[("15x768x1344", "medium", 8)] / entry["measured"], 3)
    assert entry["met"] is (entry["measured"] <= 2.0) and record["card"] in name and entry["card"] == record["card"]
    assert "not measured on the card" in entry["measured_as"]


def test_goal_entry_met_from_a_shipped_row_and_refuses_nan():
    rows = [{"shape": "15x768x1344", "preset": "veryfast", "threads": 8, "convert_threads": 8, "shipped": True,
             "mux_s": 1.5},
            {"shape": "15x768x1344", "preset": "medium", "threads": 8, "convert_threads": 1, "shipped": False,
             "mux_s": 6.0}]
    _, entry = mux_speed.goal_entry({"rows": rows, "card": "X"}, "p.json")
    assert entry["met"] is True and entry["measured_as"].startswith("the shipped setting")
    assert entry["ratio_to_stock"] == 4.0
    rows[0]["mux_s"] = math.nan
    with pytest.raises(ValueError, match="not a time"):
        mux_speed.goal_entry({"rows": rows, "card": "X"}, "p.json")


def test_post_decode_goal_entry_is_the_streamed_mux_stage_against_the_serial_path():
    record = json.loads((ROOT / "bench/post_decode/results/post_decode_cuda_15x768x1344_h100-s25.json").read_text())
    name, entry = post_decode.goal_entry(record, "r.json")
    on = sorted(r["mux_save_s"] for r in record["requests"] if r["warm"] and r["stream"])
    off = sorted(r["mux_save_s"] for r in record["requests"] if r["warm"] and not r["stream"])
    assert entry["measured"] == round(float(np.median(on)), 3)
    assert entry["ratio_to_stock"] == round(float(np.median(off)) / float(np.median(on)), 3)
    assert entry["met"] is (entry["measured"] <= 2.0) and record["card"] in name
    assert f"over {len(on)} warm streamed requests" in entry["measured_as"]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0, 0.0])
def test_post_decode_goal_entry_refuses_a_time_that_is_not_one(bad):
    record = json.loads((ROOT / "bench/post_decode/results/post_decode_cuda_15x768x1344_h100-s25.json").read_text())
    record["summary"]["on"]["mux_save_s_p50"] = bad
    with pytest.raises(ValueError, match="not a time"):
        post_decode.goal_entry(record, "r.json")
    record["summary"]["on"]["mux_save_s_p50"] = 0.4
    record["shape"] = "5x544x960"
    with pytest.raises(ValueError, match="not a 15x768x1344 record"):
        post_decode.goal_entry(record, "r.json")


def test_write_goal_entry_puts_the_entry_in_and_keeps_the_others(tmp_path):
    from bench.lib.goals import write_goal_entry

    goals = tmp_path / "goals.json"
    goals.write_text(json.dumps({"other goal": {"measured": 1.0}}))
    path = ROOT / "bench/post_decode/results/post_decode_cuda_15x768x1344_h100-s25.json"
    line = write_goal_entry(str(ROOT / "bench/post_decode/post_decode.py"), path, post_decode.goal_entry, goals)
    name, entry = post_decode.goal_entry(json.loads(path.read_text()),
                                         "bench/post_decode/results/post_decode_cuda_15x768x1344_h100-s25.json")
    assert json.loads(goals.read_text()) == {"other goal": {"measured": 1.0}, name: entry}
    assert line.startswith(name)
