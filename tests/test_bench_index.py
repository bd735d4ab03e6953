"""bench/ by study (issue 52): the generated index is current, the layout holds, and the device runner records its call.

- bench/INDEX.md is what ``bench/lib/results.py --index`` writes from the study READMEs and their records' metadata; a
  README or record changed without regenerating it fails here (the checker is tested on a planted tree too);
- the layout: no script at the top of bench/ but ``__init__.py``, tests and bench import only ``bench.lib`` (at most 8
  modules), no folder of bench/ holds more than 40 files, no numbered session script or weight file is tracked there;
- ``bench/device/call.sh STUDY COMMAND`` runs the command and writes call.json (date, card, command, commit, dirty
  flag, exit status) beside its results; a bad study is one error and exit 2.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.lib import results

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"


def test_the_committed_index_is_current():
    assert results.INDEX.read_text(encoding="utf-8") == results.render_index(), (
        "bench/INDEX.md is stale: run python bench/lib/results.py --index")


def test_the_check_command_says_current_and_exits_0():
    proc = subprocess.run([sys.executable, "bench/lib/results.py", "--check"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "bench/INDEX.md is current"


def _planted(tmp_path: Path) -> Path:
    bench = tmp_path / "bench"
    study = bench / "speedy" / "results"
    study.mkdir(parents=True)
    (bench / "lib").mkdir()  # no README: not a study
    (bench / "speedy" / "README.md").write_text(
        "# speedy: how fast?\n\n**Question.** How fast is it on one card? More words here.\n\n"
        "**Answer.** 2.5 s a request, met. Details follow.\n**Record.** results/run_b.md\n\n**Command.** `x`\n")
    (study / "run_b.md").write_text("# run_b\n\n- date: 2026-12-05T10:00:00+00:00\n- machine: Linux, 16 cpus\n")
    (study / "run_b.json").write_text(json.dumps({"date": "2026-12-04T09:00:00+00:00",
                                                  "machine": {"gpu": "NVIDIA H100 80GB HBM3", "cpu_count": 16}}))
    return bench


def test_an_index_row_holds_question_answer_record_date_and_card(tmp_path):
    bench = _planted(tmp_path)
    row = results.render_index(bench).splitlines()[-1]
    assert row == ("| [speedy](speedy/README.md) | How fast is it on one card? | 2.5 s a request, met. | "
                   "[results/run_b.md](speedy/results/run_b.md) | 2026-12-04 | NVIDIA H100 80GB HBM3 |")


def test_the_index_goes_stale_when_a_readme_or_a_record_changes(tmp_path):
    bench = _planted(tmp_path)
    results.write_index(bench)
    assert (bench / "INDEX.md").read_text() == results.render_index(bench)
    readme = bench / "speedy" / "README.md"
    readme.write_text(readme.read_text().replace("2.5 s a request, met.", "3.1 s a request, missed."))
    assert (bench / "INDEX.md").read_text() != results.render_index(bench)
    results.write_index(bench)
    (bench / "speedy" / "results" / "run_b.json").write_text(json.dumps({"date": "2026-12-06", "card": "NVIDIA H200"}))
    assert "| 2026-12-06 | NVIDIA H200 |" in results.render_index(bench)
    assert (bench / "INDEX.md").read_text() != results.render_index(bench)


def test_a_record_without_json_takes_date_and_machine_from_its_header(tmp_path):
    bench = _planted(tmp_path)
    (bench / "speedy" / "results" / "run_b.json").unlink()
    assert results.render_index(bench).splitlines()[-1].endswith("| 2026-12-05 | Linux, 16 cpus |")


def test_a_readme_without_an_answer_or_naming_a_missing_record_is_one_clear_error(tmp_path):
    bench = _planted(tmp_path)
    readme = bench / "speedy" / "README.md"
    text = readme.read_text()
    readme.write_text(text.replace("**Record.** results/run_b.md", "**Record.** results/gone.md"))
    with pytest.raises(ValueError, match=r"names record results/gone.md, which is not in"):
        results.render_index(bench)
    readme.write_text(text.replace("**Answer.** 2.5 s a request, met. Details follow.\n", ""))
    with pytest.raises(ValueError, match=r"has no answer paragraph"):
        results.render_index(bench)


def test_a_record_written_outside_a_study_script_is_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(results, "RESULTS", None)
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "elsewhere.py")])
    with pytest.raises(RuntimeError, match="is not a study script"):
        results.results_dir()
    monkeypatch.setattr(sys, "argv", [str(BENCH / "gates_speed" / "gates_speed.py")])
    assert results.results_dir() == BENCH / "gates_speed" / "results"


def _tracked(prefix: str) -> list[str]:
    return subprocess.run(["git", "ls-files", prefix], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.split()


def test_the_bench_layout_is_by_study():
    tracked = _tracked("bench")
    top = sorted(p for p in tracked if re.fullmatch(r"bench/[^/]+\.py", p))
    assert top == ["bench/__init__.py"]
    lib = [p for p in tracked if re.fullmatch(r"bench/lib/[^/]+\.py", p) and not p.endswith("__init__.py")]
    assert 1 <= len(lib) <= 8, lib
    per_folder: dict[str, int] = {}
    for path in tracked:
        per_folder[str(Path(path).parent)] = per_folder.get(str(Path(path).parent), 0) + 1
    crowded = {folder: n for folder, n in per_folder.items() if n > 40}
    assert crowded == {}, f"folders of bench/ holding more than 40 tracked files: {crowded}"


def test_tests_and_bench_import_only_bench_lib():
    imports = set()
    for path in [*(REPO / "tests").glob("*.py"), *BENCH.rglob("*.py")]:
        imports |= set(re.findall(r"from (bench\.[a-z0-9_]+)", path.read_text(encoding="utf-8")))
    assert imports <= {"bench.lib"}, sorted(imports)


def test_no_numbered_session_file_or_weights_under_bench():
    assert [p for p in _tracked("bench") if re.search(r"session[0-9]|\.safetensors$", p)] == []


def test_call_sh_records_the_call_beside_its_results(tmp_path):
    out = tmp_path / "ret"
    proc = subprocess.run(["bash", "bench/device/call.sh", "gates_speed", "sh", "-c", "echo made > {out}/r.txt; exit 3"],
                          cwd=REPO, capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin",
                                                                                   "CALL_OUT": str(out)})
    assert proc.returncode == 3, proc.stderr
    assert (out / "r.txt").read_text() == "made\n"
    call = json.loads((out / "call.json").read_text())
    assert set(call) == {"study", "date", "finished", "wall_s", "card", "command", "commit", "dirty", "exit"}
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    assert call["study"] == "bench/gates_speed" and call["exit"] == 3 and call["commit"] == head.strip()
    assert call["command"] == f"sh -c 'echo made > {out}/r.txt; exit 3'"
    assert isinstance(call["dirty"], bool) and call["card"] and re.fullmatch(r"\d{4}-\d\d-\d\dT.*Z", call["date"])


def test_call_sh_refuses_a_study_that_is_not_there():
    proc = subprocess.run(["bash", "bench/device/call.sh", "no_such_study", "true"], cwd=REPO, capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "call.sh: no study bench/no_such_study/ (run from the repository root; STUDY is a folder of bench/)"]
