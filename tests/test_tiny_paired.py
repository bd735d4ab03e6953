"""bench/tiny_wider_dit/paired.py: clip-by-clip content comparison, against hand counts and scipy's binomial test on
planted records; records of other clips exit 3 and write nothing."""

from __future__ import annotations

import json

from scipy import stats

from bench.lib import results as _results
from bench.lib import tiny as paired


def _record(path, right: dict[str, list[bool | None]]):
    n = len(next(iter(right.values())))
    found = [{"prompt_id": f"p{i // 2}", "seed": i % 2, **{k: v[i] for k, v in right.items()}} for i in range(n)]
    path.write_text(json.dumps({"rows": {"baseline": {"clips": found}}}))
    return path


def test_counts_and_pvalues_against_hand_counts_and_scipy(tmp_path, monkeypatch):
    monkeypatch.setattr(_results, "RESULTS", tmp_path / "out")
    # colour: the model alone right on 6 clips, the reference alone on 1; sync: one clip has no event (None).
    ref = {"colour": [False] * 6 + [True] * 3 + [False], "sync": [True, False, None, True] + [False] * 6}
    mod = {"colour": [True] * 6 + [True, True, False, False], "sync": [True, True, None, False] + [False] * 6}
    props = {p: [True] * 10 for p in paired.CONTENT_PROPERTIES}
    r = _record(tmp_path / "ref.json", {**props, **ref})
    m = _record(tmp_path / "m.json", {**props, **mod})
    assert paired.paired_main(["--ref", str(r), "--model", str(m), "--name", "t"]) == 0
    got = json.loads((tmp_path / "out" / "t.json").read_text())["models"][str(m)]
    assert (got["colour"]["model_only"], got["colour"]["ref_only"], got["colour"]["clips"]) == (6, 1, 10)
    assert got["colour"]["p"] == stats.binomtest(6, 7, 0.5).pvalue
    assert (got["sync"]["clips"], got["sync"]["model_only"], got["sync"]["ref_only"]) == (9, 1, 1)
    assert got["pitch"]["p"] == 1.0 and got["pitch"]["model_only"] == 0
    # Holm over the 6 properties: the smallest p times 6, capped at 1
    assert got["colour"]["p_holm"] == min(1.0, 6 * got["colour"]["p"])


def test_records_of_other_clips_exit_3(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(_results, "RESULTS", tmp_path / "out")
    props = {p: [True] * 4 for p in paired.CONTENT_PROPERTIES}
    r = _record(tmp_path / "ref.json", props)
    m = _record(tmp_path / "m.json", {p: [True] * 6 for p in paired.CONTENT_PROPERTIES})
    assert paired.paired_main(["--ref", str(r), "--model", str(m), "--name", "t"]) == 3
    assert "other clips" in capsys.readouterr().err and not (tmp_path / "out").exists()
