"""bench/lib/results.py: every benchmark record names the CPU its numbers (and clips) came from."""

import json

from bench.lib import results as _results
from h3.determinism import numerics_platform


def test_a_record_names_the_cpu_model_and_vector_capability(tmp_path, monkeypatch):
    monkeypatch.setattr(_results, "RESULTS", tmp_path)
    json_path, md_path = _results.write("probe", {"rows": [1, 2]}, "| a |\n|---|\n| 1 |")
    numerics = numerics_platform("cpu")
    data = json.loads(json_path.read_text())
    assert data["rows"] == [1, 2] and data["machine"]["numerics"]["cpu_model"] == numerics["cpu_model"]
    machine = next(line for line in md_path.read_text().splitlines() if line.startswith("- machine: "))
    named = [str(v) for v in (numerics["cpu_model"], numerics["aten_cpu_capability"]) if v]
    assert machine.endswith(f"cpus ({', '.join(named)})" if named else "cpus")
    assert md_path.read_text().rstrip().endswith("| 1 |")


def test_another_study_keeps_the_records_of_a_check_it_runs(tmp_path, monkeypatch):
    """``--study NAME`` (bench/content_check): the records go to bench/NAME/results when that study exists; a name
    that is no study, or not a folder name, is refused before anything runs, and the content check exits 3."""
    import subprocess
    import sys
    from pathlib import Path

    import pytest

    (tmp_path / "tiny_wider_dit").mkdir()
    (tmp_path / "tiny_wider_dit" / "README.md").write_text("# tiny_wider_dit\n")
    assert _results.study_results("tiny_wider_dit", tmp_path) == tmp_path / "tiny_wider_dit" / "results"
    for bad in ("no_such_study", "../tiny_wider_dit", ""):
        with pytest.raises(ValueError, match="--study"):
            _results.study_results(bad, tmp_path)
    repo = Path(__file__).resolve().parents[1]
    before = sorted(p.name for p in (repo / "bench").iterdir())
    proc = subprocess.run([sys.executable, "bench/content_check/content_check.py", "--study", "no_such_study",
                           "--rows", "random", "--limit", "1", "--seeds", "0"], cwd=repo, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 3 and "no such study" in proc.stderr, proc.stderr[-500:]
    assert sorted(p.name for p in (repo / "bench").iterdir()) == before
