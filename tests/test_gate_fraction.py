"""bench/gates_speed/gate_fraction.py: the warm gating time per pair and its fraction of generation, read from a
call's tarball, against the float computation of planted figures; bad input exits 3 and writes nothing."""

from __future__ import annotations

import io
import json
import statistics
import tarfile
from pathlib import Path

from bench.lib import goals as gf


def _tgz(path: Path, logs: dict[int, list[float]], p50: float, cand: str = "turbo4-fp8",
         gate_s: dict[str, list[float]] | None = None, serial: dict[str, list[float]] | None = None) -> None:
    files = {"card.txt": "NVIDIA H100 80GB HBM3, 81559 MiB, 580.1",
             "gate_times.json": json.dumps({"gates": "integrity,fidelity", "device": "cuda", "candidate": cand,
                                            "shape": "5 768 1344", "walls_s": [{"run": 1, "exit": 0, "wall_s": 9.0}]}),
             "run/speed.json": json.dumps({"protocols": {"mixed": {cand: {
                 "status": "ok", "n": 4, "generation_side_latency_s": {"p50": p50}}}}})}
    for gate, secs in (gate_s or {}).items():
        for k, s in enumerate(secs):
            files[f"run/gates/{gate}/{cand}/rs-0{k + 1}-s0.json"] = json.dumps({"gate": gate, "info": {"gate_s": s}})
    for gate, secs in (serial or {}).items():
        for k, s in enumerate(secs):
            files[f"run_serial/gates/{gate}/{cand}/rs-0{k + 1}-s0.json"] = json.dumps({"gate": gate,
                                                                                     "info": {"gate_s": s}})
    for i, secs in logs.items():
        files[f"gate_{i}.log"] = "gates: 4 pairs to go\n" + "".join(
            f"gates: {k + 1}/{len(secs)} pairs, {cand}/rs-0{k + 1}-s0 ({s} s); elapsed 0:01\n" for k, s in enumerate(secs))
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_fraction_is_the_warm_median_over_generation(tmp_path, monkeypatch):
    logs = {1: [5.0, 4.0, 4.5, 4.2], 2: [0.31, 0.29, 0.40, 0.33], 3: [0.30, 0.28, 0.35, 0.32]}
    per_gate = {"fidelity": [2.5, 0.12], "integrity": [1.0, 0.08]}
    serial = {"fidelity": [1.5, 0.05], "integrity": [0.9, 0.03]}
    _tgz(tmp_path / "gate_fraction.tgz", logs, p50=11.62, gate_s=per_gate, serial=serial)
    goals = tmp_path / "goals.json"
    goals.write_text("{}")
    monkeypatch.setattr(gf, "GATE_FRACTION_RESULTS", tmp_path / "results")
    assert gf.gate_fraction_main(["--from", str(tmp_path), "--name", "t", "--command", "c", "--goals", str(goals)]) == 0
    data = json.loads((tmp_path / "results" / "t.json").read_text())
    # The first run, and each run's first pair (the process's lazy imports and model loads), are left out.
    warm = statistics.median(logs[2][1:] + logs[3][1:])
    assert abs(data["gate_s_per_pair_warm_median"] - warm) < 1e-12 and abs(warm - 0.325) < 1e-12
    assert data["per_gate_s_last_run"] == per_gate and data["per_gate_s_serial"] == serial
    assert "| fidelity | 2.50 / 0.12 | 1.50 / 0.05 |" in (tmp_path / "results" / "t.md").read_text()
    assert abs(data["fraction"] - warm / 11.62) < 1e-12
    assert data["met"] is False and data["card"] == "NVIDIA H100 80GB HBM3" and data["shape"] == "5 s 768x1344"
    (entry,) = json.loads(goals.read_text()).values()
    assert entry["measured"] == round(warm / 11.62, 4) and entry["met"] is False


def test_bad_input_exits_3_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gf, "GATE_FRACTION_RESULTS", tmp_path / "results")
    goals = tmp_path / "goals.json"
    goals.write_text("{}")
    args = ["--from", str(tmp_path), "--name", "t", "--command", "c", "--goals", str(goals)]
    assert gf.gate_fraction_main(args) == 3                                   # no tarball
    _tgz(tmp_path / "gate_fraction.tgz", {1: [5.0], 2: [0.3]}, p50=float("nan"))
    assert gf.gate_fraction_main(args) == 3                                   # a NaN generation time is no measurement
    _tgz(tmp_path / "gate_fraction.tgz", {1: [5.0]}, p50=10.0)
    assert gf.gate_fraction_main(args) == 3                                   # no warm run
    _tgz(tmp_path / "gate_fraction.tgz", {1: [5.0, 0.3], 2: [4.0]}, p50=10.0)
    assert gf.gate_fraction_main(args) == 3                                   # a later run with its cold pair only
    _tgz(tmp_path / "gate_fraction.tgz", {1: [5.0, 0.3], 2: [4.0, 0.3]}, p50=10.0,
         gate_s={"fidelity": [float("nan"), 0.1]})
    assert gf.gate_fraction_main(args) == 3                                   # a NaN gate time
    assert "no warm gate run" in capsys.readouterr().err
    assert not (tmp_path / "results").exists() and json.loads(goals.read_text()) == {}
