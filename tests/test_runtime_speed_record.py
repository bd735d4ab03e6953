"""bench/runtime_speed/record.py: a call's (or several calls') returned files into the study's table, with each
recipe's ratio to stock4 worked out by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

RECORD = Path(__file__).resolve().parents[1] / "bench" / "runtime_speed" / "record.py"


def _record(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(RECORD), *args], capture_output=True, text=True, timeout=120)


def _call(folder: Path, card: str, recipes: dict[str, tuple[float, float]]) -> Path:
    """A returned call: requests.json with each recipe's warm p50 (generation-side, request-to-file), call_env.json."""
    folder.mkdir(parents=True)
    by = {}
    for name, (gen, rtf) in recipes.items():
        warm = {"generation_side_latency_s": {"n": 8, "p50": gen, "p90": gen * 1.01},
                "request_to_file_latency_s": {"n": 8, "p50": rtf, "p90": rtf * 1.01},
                "stages_s": {"denoise": {"p50": gen * 0.6}}}
        by[name] = {"requests": [], "warm_requests": 8, "first_request": None, "warm": warm}
    (folder / "requests.json").write_text(json.dumps({"by_recipe": by, "model_load_s": 40.0}))
    (folder / "call_env.json").write_text(json.dumps({"card": card}))
    return folder


def test_two_processes_on_one_card_merge_into_one_table_with_ratios_to_stock(tmp_path):
    a = _call(tmp_path / "a", "H100", {"stock4": (15.0, 15.3)})
    b = _call(tmp_path / "b", "H100", {"turbo4-fp8": (11.4, 11.7)})
    goals = tmp_path / "goals.json"
    goals.write_text("{}")
    proc = _record("--from", str(a), "--from", str(b), "--name", "t", "--command", "cmd", "--commit", "abc",
                   "--results", str(tmp_path / "res"), "--goals", str(goals))
    assert proc.returncode == 0, proc.stderr
    rows = {r["recipe"]: r for r in json.loads((tmp_path / "res" / "t.json").read_text())["rows"]}
    assert rows["turbo4-fp8"]["generation_side_latency_s"]["ratio_to_stock"] == pytest.approx(15.0 / 11.4, rel=1e-12)
    assert rows["turbo4-fp8"]["request_to_file_latency_s"]["ratio_to_stock"] == pytest.approx(15.3 / 11.7, rel=1e-12)
    call = json.loads((tmp_path / "res" / "t.call.json").read_text())
    assert call["processes"] == 2 and call["card"] == "H100" and "1.32x" in (tmp_path / "res" / "t.md").read_text()
    entry = [v for k, v in json.loads(goals.read_text()).items() if "turbo4-fp8" in k]
    assert entry and entry[0]["ratio_to_stock"] == round(15.3 / 11.7, 3) and entry[0]["met"] is False


def test_calls_on_different_cards_or_measuring_a_recipe_twice_are_refused(tmp_path):
    a = _call(tmp_path / "a", "H100", {"stock4": (15.0, 15.3)})
    b = _call(tmp_path / "b", "H200", {"turbo4-fp8": (9.0, 9.2)})
    c = _call(tmp_path / "c", "H100", {"stock4": (15.1, 15.4)})
    goals = tmp_path / "goals.json"
    goals.write_text("{}")
    for other, message in ((b, "different cards"), (c, "measured by an earlier --from")):
        proc = _record("--from", str(a), "--from", str(other), "--name", "t", "--command", "cmd", "--commit", "abc",
                       "--results", str(tmp_path / "res"), "--goals", str(goals))
        assert proc.returncode != 0 and message in proc.stderr
    assert not (tmp_path / "res").exists() and goals.read_text() == "{}"  # nothing written


def _with_clips(folder: Path, recipe: str, shas: list[str], kept: list[int], prompts: list[str]) -> None:
    """Add the clip records of ``recipe``'s requests (runtime_speed.tgz's run/*.json) and its request list."""
    import io
    import tarfile

    summary = json.loads((folder / "requests.json").read_text())
    tgz = folder / "runtime_speed.tgz"
    with tarfile.open(tgz, "w:gz") as tar:
        for i, (sha, k, prompt) in enumerate(zip(shas, kept, prompts)):
            stem = f"{recipe}-{i:02d}"
            summary.setdefault("requests", []).append({"recipe": recipe, "index": i, "warm": i > 0, "seed": 0,
                                                       "prompt_id": f"p{i}", "clip": f"{stem}.mp4"})
            record = {"request": {"prompt": prompt}, "frames_sha256": sha,
                      "extra": {"text_encoder": {"residency": "fit", "kept_layers": k, "streamed_layers": 64 - k,
                                                 "kept_gib": k * 0.908}}}
            data = json.dumps(record).encode()
            info = tarfile.TarInfo(f"run/{stem}.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (folder / "requests.json").write_text(json.dumps(summary))


@pytest.mark.parametrize("same", [True, False])
def test_the_text_encoder_residency_and_repeated_prompts_are_recorded(tmp_path, same):
    a = _call(tmp_path / "a", "H100", {"stock4": (15.0, 15.3), "fast": (9.9, 10.2)})
    # the first request streams every layer, the warm ones keep 29; the last repeats the first prompt and seed
    _with_clips(a, "fast", ["s0", "s1", "s2", "s0" if same else "sX"], [0, 29, 29, 29], ["a", "b", "c", "a"])
    goals = tmp_path / "goals.json"
    goals.write_text("{}")
    proc = _record("--from", str(a), "--name", "t", "--command", "cmd", "--commit", "abc",
                   "--results", str(tmp_path / "res"), "--goals", str(goals))
    assert proc.returncode == 0, proc.stderr
    md = (tmp_path / "res" / "t.md").read_text()
    assert "`fast`: text encoder fit: 29 of 64 decoder layers kept on the device (26.3 GiB)" in md
    verdict = "identical to the bit" if same else "DIFFER"
    assert f"`fast` fast-00 and fast-03 (same prompt, seed 0): frames {verdict}" in md
    entry = json.loads(goals.read_text())["5 s 544×960 `fast` request, warm through `h3 generate` (H100)"]
    assert entry["text_encoder"].startswith("fit: 29 of 64")
    repeats = json.loads((tmp_path / "res" / "t.json").read_text())["repeated_clips"]
    assert repeats == [{"recipe": "fast", "clips": ["fast-00", "fast-03"], "seed": 0, "identical": same}]
