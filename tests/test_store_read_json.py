"""``h3eval.store.read_json_file``: the one reader of JSON files given by the user or kept in a run (the run manifest,
an import's timing files and SGLang perf dumps). Each way a file can be bad is one line of the caller's error class
naming what the file is and where it lies; a run manifest's own problems still say the directory is not a run."""

from __future__ import annotations

import json

import pytest

from h3eval.backends.folder import read_sglang_perf_dump, read_timing_file
from h3eval.runner import RunError
from h3eval.store import RunStore, StoreError, read_json_file


def _refuse_repeats(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("a key appears twice")
    return dict(pairs)


def test_each_bad_file_is_one_line_of_the_callers_error(tmp_path):
    good = tmp_path / "good.json"
    good.write_text('{"a": [1, 2.5, null], "b": NaN}')
    data = read_json_file(good, "thing", RunError)
    assert data["a"] == [1, 2.5, None] and data["b"] != data["b"]  # NaN kept: the caller decides

    with pytest.raises(RunError) as exc:
        read_json_file(tmp_path, "thing", RunError)
    assert str(exc.value) == f"thing {tmp_path} is a directory, not a JSON file"

    missing = tmp_path / "missing.json"
    with pytest.raises(StoreError) as exc:  # the default class
        read_json_file(missing, "thing")
    assert str(exc.value) == f"cannot read thing {missing}: No such file or directory"

    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"caf\xe9": 1}')
    with pytest.raises(RunError, match=r"^cannot read thing .*latin\.json: 'utf-8' codec can't decode"):
        read_json_file(latin, "thing", RunError)

    broken = tmp_path / "broken.json"
    broken.write_text('{"a": ')
    with pytest.raises(RunError) as exc:
        read_json_file(broken, "thing", RunError)
    assert str(exc.value).startswith(f"thing {broken} is not valid JSON (Expecting value: line 1 column 7")
    assert "\n" not in str(exc.value)

    twice = tmp_path / "twice.json"
    twice.write_text('{"a": 1, "a": 2}')
    assert read_json_file(twice, "thing", RunError) == {"a": 2}  # json's own rule without a hook
    with pytest.raises(RunError, match=r"^thing .*twice\.json is not valid JSON \(a key appears twice\)$"):
        read_json_file(twice, "thing", RunError, _refuse_repeats)


def test_the_folder_backend_reads_timing_files_and_perf_dumps_through_it(tmp_path):
    timing = tmp_path / "t.json"
    timing.write_text(json.dumps({"p1-s0": 2.5, "p2-s1.mp4": {"request_to_file_latency_s": 3.0}}))
    assert read_timing_file(timing) == {("p1", 0): {"generation_side_latency_s": 2.5},
                                        ("p2", 1): {"request_to_file_latency_s": 3.0}}
    timing.write_text('{"p1-s0": 2.5, "p1-s0": 3.5}')
    with pytest.raises(RunError, match=r"^timing file .*t\.json is not valid JSON \(key 'p1-s0' appears twice\)$"):
        read_timing_file(timing)
    dump = tmp_path / "perf.json"
    dump.write_text(json.dumps({"total_duration_ms": 1234.5, "steps": []}))
    assert read_sglang_perf_dump(dump) == pytest.approx(1.2345, rel=1e-15)
    with pytest.raises(RunError, match=r"^SGLang perf dump .* is a directory, not a JSON file$"):
        read_sglang_perf_dump(tmp_path)


def test_a_bad_run_manifest_still_says_the_directory_is_not_a_run(tmp_path):
    store = RunStore(tmp_path / "run")
    with pytest.raises(StoreError, match=r"is not a run directory: .*run\.json is missing$"):
        store.read_manifest()
    store.manifest_path.mkdir(parents=True)
    with pytest.raises(StoreError, match=r"is not a run directory: .*run\.json is a directory, not a file$"):
        store.read_manifest()
    store.manifest_path.rmdir()
    store.manifest_path.write_text("{")
    with pytest.raises(StoreError, match=r"^run manifest .*run\.json is not valid JSON \(Expecting"):
        store.read_manifest()
    store.manifest_path.write_text('{"version": 1, "seeds": [NaN]}')
    with pytest.raises(StoreError, match=r"key 'seeds\.0': not a finite number"):
        store.read_manifest()
