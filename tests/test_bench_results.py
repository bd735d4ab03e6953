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
