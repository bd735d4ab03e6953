"""bench/distill_gap/distill_gap.py's measure: the final x0 gap between a teacher's and a student's trajectory, per modality,
against a float64 reference on planted trajectories; mismatched or non-finite trajectories are refused."""

from __future__ import annotations

import numpy as np
import pytest

from bench.lib.tiny import final_x0_gap, summarize


def _traj(rng, steps: int, stride: int = 1) -> dict[str, np.ndarray]:
    return {"video_x0": rng.standard_normal((steps, 12, 96)).astype(np.float32),
            "audio_x0": rng.standard_normal((steps, 7, 32)).astype(np.float32),
            "video_row_stride": np.array(stride)}


def test_the_gap_is_the_mean_squared_difference_of_the_last_x0_per_modality():
    rng = np.random.default_rng(0)
    teacher, student = _traj(rng, 29), _traj(rng, 4)  # different step counts: only the last step counts
    student["video_x0"][-1] = teacher["video_x0"][-1] + np.float32(0.25)  # a planted offset of known size
    gap = final_x0_gap(teacher, student)
    assert gap["video"] == pytest.approx(0.0625, rel=1e-6)
    ref = np.mean((teacher["audio_x0"][-1].astype(np.float64) - student["audio_x0"][-1].astype(np.float64)) ** 2)
    assert gap["audio"] == pytest.approx(ref, rel=1e-12) and gap["audio"] > 1.0  # independent draws: about 2
    assert final_x0_gap(teacher, teacher) == {"video": 0.0, "audio": 0.0}


def test_mismatched_or_non_finite_trajectories_are_refused():
    rng = np.random.default_rng(1)
    teacher = _traj(rng, 29)
    with pytest.raises(ValueError, match="row_stride differs"):
        final_x0_gap(teacher, _traj(rng, 4, stride=2))
    short = _traj(rng, 4)
    short["video_x0"] = short["video_x0"][:, :6]
    with pytest.raises(ValueError, match="shapes differ"):
        final_x0_gap(teacher, short)
    bad = _traj(rng, 4)
    bad["audio_x0"][-1, 0, 0] = np.nan
    with pytest.raises(ValueError, match="not finite"):
        final_x0_gap(teacher, bad)
    del bad["audio_x0"]
    with pytest.raises(ValueError, match="audio_x0 missing"):
        final_x0_gap(teacher, bad)


def test_summary_reads_median_mean_and_max():
    assert summarize([0.1, 0.4, 0.2]) == {"n": 3, "median": 0.2, "mean": pytest.approx(0.7 / 3), "max": 0.4}


def test_a_recorded_run_gives_each_students_gap_per_clip_and_refuses_missing_clips(tmp_path, monkeypatch):
    """``--from-run``: each student's recorded trajectories against the teacher's of the same clip name (planted
    offsets of known size per clip), the summary over them; a student missing a clip is refused."""
    import json

    import bench.lib.results as results
    from bench.lib.tiny import from_run

    written = {}
    monkeypatch.setattr(results, "write", lambda name, payload, md: written.update(name=name, payload=payload) or [])
    rng = np.random.default_rng(3)
    clips = tmp_path / "run" / "clips"
    offsets = {"a": [0.1, 0.2, 0.3], "b": [0.5, 0.5, 0.5]}
    for i in range(3):
        teacher = _traj(rng, 29)
        (clips / "baseline").mkdir(parents=True, exist_ok=True)
        np.savez(clips / "baseline" / f"demo-0{i}-s0.traj.npz", **teacher)
        for student, offs in offsets.items():
            moved = {k: v.copy() for k, v in teacher.items()}
            moved["video_x0"][-1] += np.float32(offs[i])
            (clips / student).mkdir(exist_ok=True)
            np.savez(clips / student / f"demo-0{i}-s0.traj.npz", **moved)
    from_run(tmp_path / "run", "baseline", ["a", "b"], "gap_test", "")
    summary = written["payload"]["summary"]
    assert summary["a"]["video"]["median"] == pytest.approx(0.04, rel=1e-5)  # 0.2 ** 2
    assert summary["a"]["video"]["max"] == pytest.approx(0.09, rel=1e-5)
    assert summary["b"]["video"]["mean"] == pytest.approx(0.25, rel=1e-5)
    assert summary["a"]["audio"]["max"] == 0.0
    json.dumps(written["payload"])  # plain data
    (clips / "b" / "demo-02-s0.traj.npz").unlink()
    with pytest.raises(SystemExit, match="do not have the same clips"):
        from_run(tmp_path / "run", "baseline", ["b"], "gap_test", "")
