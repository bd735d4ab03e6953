"""The gate runner and `h3eval gate`: result files, identical pairs, resume, per-pair errors and exit codes."""

from __future__ import annotations

import json
import time

import pytest
import typer
from _gate_clips import NUM_FRAMES, SIZE, make_run, moving_square_frames, noise_pcm, rewrite_clip
from typer.testing import CliRunner

from gates.base import GateResult, get_gate
from gates.common import GateInputError
from gates.fidelity import PSNR_CAP_DB
from h3eval.commands import gate as gate_command
from h3eval.gaterun import GateRunError, options_for, parse_options, result_path, run_gates

GATES = ["integrity", "fidelity", "audio"]
RAND = {"lpips_trunk": "rand"}


def _frames(recipe, pid, seed):
    # "same" reproduces the baseline bit for bit; "drift" changes the content.
    return moving_square_frames(NUM_FRAMES, SIZE, seed + (7 if recipe == "drift" else 0))


def _audio(recipe, pid, seed):
    return noise_pcm(seed=seed + (3 if recipe == "drift" else 0))


@pytest.fixture
def run(tmp_path):
    return make_run(tmp_path / "run", candidates=("same", "drift"), prompt_ids=("p0", "p1"), frames_fn=_frames,
                    audio_fn=_audio)


def _read(store, gate, cand, pid, seed=0) -> GateResult:
    return GateResult.model_validate_json(result_path(store, gate, cand, pid, seed).read_text())


def test_results_for_every_gate_and_pair(run):
    began = time.perf_counter()
    summary = run_gates(run.root, GATES, options=RAND, progress=False)
    wall = time.perf_counter() - began
    assert not summary.failed and summary.pairs == 4
    assert summary.scored == {"integrity": 4, "fidelity": 4, "audio": 4}
    # Each computed result carries its gate's wall seconds; the summary lists the same figures, in pair order, and
    # no gate took longer than the whole run.
    for gate in GATES:
        timed = [_read(run, gate, cand, pid).info["gate_s"] for cand in ("same", "drift") for pid in ("p0", "p1")]
        assert summary.seconds[gate] == timed and all(0 <= t <= wall for t in timed)
        assert all(t > 0 for t in timed[2:])  # the drift pairs were decoded and scored
    for gate in GATES:
        for cand in ("same", "drift"):
            for pid in ("p0", "p1"):
                result = _read(run, gate, cand, pid)
                assert result.gate == gate and result.pair.candidate == cand and result.pair.prompt_id == pid
                assert result.pair.baseline == "baseline" and result.error is None
                assert result.identical is (cand == "same")
    # Identical pairs: exactly zero difference, without decoding.
    same_fid = _read(run, "fidelity", "same", "p0")
    assert {k: v.value for k, v in same_fid.metrics.items()} == {
        "lpips_mean": 0.0, "lpips_p95": 0.0, "lpips_worst": 0.0, "ssim_mean": 1.0, "ssim_worst": 1.0,
        "psnr_mean": PSNR_CAP_DB, "psnr_worst": PSNR_CAP_DB}
    same_audio = _read(run, "audio", "same", "p1")
    assert {k: v.value for k, v in same_audio.metrics.items()} == {
        "stft_distance": 0.0, "logmel_distance": 0.0, "lufs_delta": 0.0, "offset_ms": 0.0, "offset_excess_ms": 0.0}
    # The integrity gate still looks at both clips of an identical pair.
    assert _read(run, "integrity", "same", "p0").info["candidate"]["num_frames"] == NUM_FRAMES
    # A different pair scores a difference, with its artifact stored relative to the run.
    drift = _read(run, "fidelity", "drift", "p0")
    assert drift.metrics["lpips_mean"].value > 0 and drift.metrics["psnr_mean"].value < PSNR_CAP_DB
    [png] = drift.artifacts
    assert not png.startswith("/") and (run.root / png).is_file()
    assert png.startswith("gates/fidelity/drift/")


def test_gates_can_run_on_some_candidates_only(run):
    summary = run_gates(run.root, ["audio"], progress=False, candidates=["drift"])
    assert summary.pairs == 2 and summary.scored == {"audio": 2}
    assert not (run.root / "gates" / "audio" / "same").exists()
    with pytest.raises(GateRunError, match="not candidates"):
        run_gates(run.root, ["audio"], progress=False, candidates=["nope"])


def test_resume_keeps_valid_results_and_redoes_missing_or_broken(run):
    run_gates(run.root, ["audio"], progress=False)
    kept = result_path(run, "audio", "drift", "p0", 0)
    before = kept.read_bytes()
    missing = result_path(run, "audio", "drift", "p1", 0)
    missing.unlink()
    broken = result_path(run, "audio", "same", "p0", 0)
    broken.write_text("{ half a file")
    summary = run_gates(run.root, ["audio"], progress=False)
    assert summary.scored == {"audio": 2} and summary.resumed == {"audio": 2}
    assert kept.read_bytes() == before
    assert GateResult.model_validate_json(missing.read_text()).error is None
    assert GateResult.model_validate_json(broken.read_text()).identical is True
    forced = run_gates(run.root, ["audio"], progress=False, force=True)
    assert forced.scored == {"audio": 4} and forced.resumed == {"audio": 0}
    # Other options, other results: recomputed; options of another gate do not matter.
    assert run_gates(run.root, ["audio"], options={"fidelity.lpips_stride": "2"}, progress=False).resumed == {"audio": 4}
    changed = run_gates(run.root, ["audio"], options={"max_offset_ms": "100"}, progress=False)
    assert changed.scored == {"audio": 4}
    assert _read(run, "audio", "drift", "p0").info["inputs"]["options"] == {"max_offset_ms": "100"}


def test_truncated_clip_errors_one_pair_and_the_rest_is_scored(run):
    mp4 = run.clip_path("drift", "p1", 0)
    mp4.write_bytes(mp4.read_bytes()[:1000])
    summary = run_gates(run.root, GATES, options=RAND, progress=False)
    assert summary.failed
    assert sorted((e["gate"], e["candidate"], e["prompt_id"]) for e in summary.errors) == [
        (g, "drift", "p1") for g in sorted(GATES)]
    err = _read(run, "fidelity", "drift", "p1")
    assert err.status == "error" and err.metrics == {}
    assert str(mp4) in err.error and "does not match the mp4_sha256" in err.error
    assert _read(run, "fidelity", "drift", "p0").error is None
    # The errored pair is tried again on resume (and still fails); the good ones are kept.
    again = run_gates(run.root, GATES, options=RAND, progress=False)
    assert again.scored == dict.fromkeys(GATES, 1) and len(again.errors) == 3


def test_corrupt_clip_with_matching_hash_gives_decode_errors(run):
    # An imported clip whose record was written over an already-corrupt file: the gates see it and say so.
    rewrite_clip(run, "drift", "p0", 0, moving_square_frames(NUM_FRAMES, SIZE, 1), noise_pcm())
    mp4 = run.clip_path("drift", "p0", 0)
    mp4.write_bytes(mp4.read_bytes()[:300])
    record_path = run.record_path("drift", "p0", 0)
    record = json.loads(record_path.read_text())
    from h3.atomic import sha256_file

    record["mp4_sha256"] = sha256_file(mp4)
    record_path.write_text(json.dumps(record))
    summary = run_gates(run.root, GATES, options=RAND, progress=False)
    assert {e["gate"] for e in summary.errors} == set(GATES)
    for gate in GATES:
        assert str(mp4) in _read(run, gate, "drift", "p0").error


def test_missing_clip_and_mismatched_resolution(run):
    run.record_path("drift", "p1", 0).unlink()
    rewrite_clip(run, "drift", "p0", 0, moving_square_frames(NUM_FRAMES, SIZE + 32, 0), noise_pcm())
    summary = run_gates(run.root, ["fidelity", "integrity"], options=RAND, progress=False)
    missing = _read(run, "fidelity", "drift", "p1")
    assert "candidate clip drift/p1-s0 is not finished" in missing.error
    mismatch = _read(run, "fidelity", "drift", "p0")
    assert "resolution 64x64 vs 96x96" in mismatch.error
    assert "pair: width differs (baseline 64, candidate 96)" in _read(run, "integrity", "drift", "p0").flags
    assert summary.failed


def test_missing_lpips_weights_errors_per_pair_and_other_gates_still_score(run, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty-torch-home"))
    monkeypatch.delenv("H3EVAL_LPIPS_TRUNK", raising=False)
    summary = run_gates(run.root, ["fidelity", "audio"], progress=False)
    fid_errors = [e for e in summary.errors if e["gate"] == "fidelity"]
    # Identical pairs need no model; both "drift" pairs do.
    assert sorted(e["prompt_id"] for e in fid_errors) == ["p0", "p1"] and {e["candidate"] for e in fid_errors} == {"drift"}
    assert "alexnet-owt-7be5be79.pth" in fid_errors[0]["error"]
    assert not [e for e in summary.errors if e["gate"] == "audio"]


def test_options_are_scoped_and_validated(run):
    options = parse_options(["lpips_trunk=rand", "fidelity.lpips_stride=2", "audio.max_offset_ms=100"])
    fidelity, audio = get_gate("fidelity"), get_gate("audio")
    assert options_for("fidelity", options, fidelity.option_names) == {"lpips_trunk": "rand", "lpips_stride": "2"}
    assert options_for("audio", options, audio.option_names) == {"max_offset_ms": "100"}
    assert options_for("other", options) == {"lpips_trunk": "rand"}  # a gate that does not declare its options
    with pytest.raises(GateRunError, match="not KEY=VALUE"):
        parse_options(["stride"])
    # A typo fails before anything runs, with the known names.
    with pytest.raises(GateRunError, match=r"option 'lpips_strid' is not an option of the chosen gates.*lpips_stride"):
        run_gates(run.root, ["fidelity", "audio"], options={"lpips_strid": "2"}, progress=False)
    with pytest.raises(GateRunError, match=r"gate audio has no option 'lpips_trunk'"):
        run_gates(run.root, ["audio"], options={"audio.lpips_trunk": "rand"}, progress=False)
    assert not (run.root / "gates").exists()
    # Options scoped to a gate that is not chosen are ignored; an unscoped one goes only to the gates that know it.
    summary = run_gates(run.root, ["audio"], options={"fidelity.lpips_trunk": "rand"}, progress=False)
    assert not summary.failed


def test_every_gate_refuses_unknown_or_malformed_options_before_the_run(run):
    # The trajectory gate and VBench used to read their options with dict.get: a typo silently ran the defaults.
    with pytest.raises(GateRunError, match=r"option 'growth_rat' is not an option of the chosen gates.*growth_rate"):
        run_gates(run.root, ["trajectory"], options={"growth_rat": "3"}, progress=False)
    with pytest.raises(GateRunError, match=r"gate vbench has no option 'dimension'"):
        run_gates(run.root, ["audio", "vbench"], options={"vbench.dimension": "temporal_flickering"}, progress=False)
    with pytest.raises(GateRunError, match=r"trajectory: option growth_rate='fast'"):
        run_gates(run.root, ["trajectory"], options={"growth_rate": "fast"}, progress=False)
    with pytest.raises(GateRunError, match=r"ghosting: option pool_frames='0'.*greater than or equal to 1"):
        run_gates(run.root, ["ghosting"], options={"ghosting.pool_frames": "0"}, progress=False)
    assert not (run.root / "gates").exists()  # nothing ran
    for name in ("integrity", "fidelity", "audio", "ghosting", "trajectory", "opcheck", "vbench"):
        gate = get_gate(name)
        assert gate.option_names == frozenset(gate.Options.model_fields), name
        assert gate.metrics, f"{name} declares no metrics"


def test_a_result_that_breaks_the_declared_metrics_is_an_error(run, monkeypatch):
    import gates.base as gates_base
    from gates.base import Gate, Metric, MetricSpec

    class Sloppy(Gate):
        name = "sloppy"
        metrics = {"distance": MetricSpec(higher_is_better=False)}

        def evaluate(self, ctx):
            # p0: the direction contradicts the declaration; drift: a metric that is not declared at all.
            return GateResult(gate=self.name, pair=ctx.pair, metrics={
                "distance": Metric(value=0.5, higher_is_better=ctx.pair.prompt_id == "p0"),
                **({"surprise": Metric(value=1.0, higher_is_better=False)} if ctx.pair.candidate == "drift" else {})})

    monkeypatch.setitem(gates_base._REGISTRY, "sloppy", Sloppy)
    summary = run_gates(run.root, ["sloppy"], progress=False)
    errors = {(e["candidate"], e["prompt_id"]): e["error"] for e in summary.errors}
    assert sorted(errors) == [("drift", "p0"), ("drift", "p1"), ("same", "p0")]
    assert "metric 'distance' is written with higher_is_better=True, unit=None but declared with " \
           "higher_is_better=False" in errors[("same", "p0")]
    assert "metric 'surprise' is not declared (declared: distance)" in errors[("drift", "p1")]
    assert _read(run, "sloppy", "same", "p1").status == "ok"


def test_gate_rejects_unknown_options_itself(run):
    from _gate_clips import pair_context

    ctx = pair_context(run, candidate="drift", gate="audio", options={"max_ofset_ms": "3"})
    known = r"known: \['lag_ms', 'lead_ms', 'max_offset_ms'\]"
    with pytest.raises(GateInputError, match=r"unknown audio option\(s\) \['max_ofset_ms'\]; " + known):
        get_gate("audio").evaluate(ctx)


def test_bad_run_dir_and_unknown_gate(tmp_path, run):
    with pytest.raises(GateRunError, match="run.json is missing"):
        run_gates(tmp_path / "nowhere", ["audio"], progress=False)
    with pytest.raises(KeyError, match="unknown gate 'nope'; known gates: .*audio.*fidelity.*integrity"):
        run_gates(run.root, ["audio", "nope"], progress=False)
    assert not (run.root / "gates").exists()  # nothing ran


def _app():
    app = typer.Typer()
    gate_command.register(app)
    return app


def test_command_exit_codes(run):
    runner = CliRunner()
    ok = runner.invoke(_app(), [str(run.root), "--gates", "audio,integrity", "--no-progress"])
    assert ok.exit_code == 0, ok.output
    assert "audio: 4 pairs, 4 computed, 0 resumed, 2 identical" in ok.output
    # The seconds line sums each gate's recorded info.gate_s over the pairs it computed.
    summed = {g: sum(_read(run, g, c, p).info["gate_s"] for c in ("same", "drift") for p in ("p0", "p1"))
              for g in ("audio", "integrity")}
    assert (f"gate seconds (computed results, summed over pairs): audio {summed['audio']:.2f}, "
            f"integrity {summed['integrity']:.2f}") in ok.output.splitlines()
    unknown = runner.invoke(_app(), [str(run.root), "--gates", "audio,ghostly", "--no-progress"])
    assert unknown.exit_code == 3 and "known gates:" in unknown.output
    mp4 = run.clip_path("drift", "p0", 0)
    mp4.write_bytes(mp4.read_bytes()[:500])
    failed = runner.invoke(_app(), [str(run.root), "--gates", "audio", "-o", "max_offset_ms=200", "--no-progress"])
    assert failed.exit_code == 1 and "error: audio drift/p0-s0:" in failed.output
    bad_device = runner.invoke(_app(), [str(run.root), "--gates", "audio", "--device", "tpu", "--no-progress"])
    assert bad_device.exit_code == 3 and "use cpu or cuda" in bad_device.output


def _results(store, gates) -> dict:
    out = {}
    for path in sorted((store.root / "gates").rglob("*.json")):
        data = json.loads(path.read_text().replace(str(store.root), "RUN"))  # paths inside the two runs
        data.get("info", {}).pop("inputs", None)  # the stamp names the run's own paths' hashes: equal anyway
        data.get("info", {}).pop("gate_s", None)  # the wall time differs from run to run
        out[str(path.relative_to(store.root))] = data
    return out


def _assert_same(x, y, where: str) -> None:
    if isinstance(x, dict):
        assert isinstance(y, dict) and x.keys() == y.keys(), where
        for k in x:
            _assert_same(x[k], y[k], f"{where}.{k}")
    elif isinstance(x, list):
        assert isinstance(y, list) and len(x) == len(y), where
        for i, (u, v) in enumerate(zip(x, y)):
            _assert_same(u, v, f"{where}[{i}]")
    elif isinstance(x, float) and isinstance(y, float):
        assert x == pytest.approx(y, rel=1e-12, abs=1e-15, nan_ok=True), where
    else:
        assert x == y, where


def test_gates_side_by_side_give_the_results_of_one_after_another(tmp_path, monkeypatch):
    """``$H3EVAL_GATE_THREADS``: the gates of a pair run in threads after both clips are decoded at once (one per
    core by default on a host of 2+ cores); every result file equals the one-after-another run's, value for value
    (floats to 1e-12), drift pairs included."""
    import shutil

    from gates import media_cache

    gates = ["integrity", "fidelity", "audio", "ghosting", "reference_free"]
    one = make_run(tmp_path / "one", candidates=("same", "drift"), prompt_ids=("p0", "p1"), frames_fn=_frames,
                   audio_fn=_audio)
    shutil.copytree(one.root, tmp_path / "many")
    monkeypatch.setenv("H3EVAL_GATE_THREADS", "1")
    assert not run_gates(one.root, gates, options=RAND, progress=False).failed
    media_cache.clear()
    calls = []
    original = media_cache.prefetch
    monkeypatch.setattr(media_cache, "prefetch", lambda paths, needs: (calls.append(needs), original(paths, needs)))
    monkeypatch.setenv("H3EVAL_GATE_THREADS", "5")
    from h3eval import gaterun
    from h3eval.store import RunStore

    monkeypatch.setattr(gaterun, "_warm", set())  # as in a fresh process: each gate's first pair one after another

    many = RunStore(tmp_path / "many")
    summary = run_gates(many.root, gates, options=RAND, progress=False)
    assert not summary.failed and summary.scored == dict.fromkeys(gates, 4)
    # The first drift pair ran one gate after another (each gate's lazy imports and model loads, in one thread: a
    # first extension import racing threadpoolctl's library walk deadlocked), the second side by side; identical
    # pairs always one after another.
    assert calls == [{"video", "audio"}] and gaterun._warm == set(gates)
    a, b = _results(one, gates), _results(many, gates)
    assert len(a) == 20 and a.keys() == b.keys()
    for key in a:  # equal, floats to 1e-12 (numpy's SIMD sums can differ in the last bit with buffer alignment)
        _assert_same(a[key], b[key], key)
    assert any(a[k]["metrics"]["lpips_mean"]["value"] > 0 for k in a if "fidelity/drift" in k)


def test_gates_side_by_side_run_with_one_blas_thread_and_the_run_restores_it(tmp_path, monkeypatch):
    """While a pair's gates run side by side the BLAS libraries have the threads ``$H3EVAL_GATE_BLAS_THREADS`` names
    (read inside each gate from the libraries themselves; the default, 1 on a GPU, is set here for the CPU run); a
    gate's first pair, one after another, runs with the process's setting (3 where a library takes it), which the run
    leaves as it found it; 0, the CPU's default, leaves the BLAS as it is. (The ghosting gate sets its own BLAS limit
    while it runs on the CPU, so two gates without it are observed.)"""
    import threading

    from threadpoolctl import threadpool_limits

    from gates.common import blas_controller
    from h3eval import gaterun

    blas = blas_controller().select(user_api="blas")
    threads = lambda: tuple(lib.num_threads for lib in blas.lib_controllers)  # noqa: E731
    seen = []
    original = gaterun.evaluate_pair

    def spy(gate, ctx, identical):
        seen.append((threading.current_thread().name.startswith("gate"), threads()))
        return original(gate, ctx, identical)

    monkeypatch.setattr(gaterun, "evaluate_pair", spy)
    monkeypatch.setattr(gaterun, "_warm", set())
    monkeypatch.setenv("H3EVAL_GATE_THREADS", "2")
    monkeypatch.setenv("H3EVAL_GATE_BLAS_THREADS", str(gaterun.SIDE_BY_SIDE_BLAS_THREADS))
    run = make_run(tmp_path / "r", candidates=("drift",), prompt_ids=("p0", "p1", "p2"), frames_fn=_frames,
                   audio_fn=_audio)
    gates = ["fidelity", "audio"]
    with threadpool_limits(limits=3, user_api="blas"):
        before = threads()
        assert 3 in before, f"no BLAS library took 3 threads ({before}): nothing to observe"
        assert not run_gates(run.root, gates, options=RAND, progress=False).failed
        after = threads()
    assert [s for s, _ in seen] == [False] * 2 + [True] * 4
    assert all(t == before for s, t in seen if not s)
    assert all(set(t) == {gaterun.SIDE_BY_SIDE_BLAS_THREADS} for s, t in seen if s)
    assert after == before

    # unset on the CPU device, or 0, the BLAS is left as it is (the before-and-after of the speed records)
    monkeypatch.delenv("H3EVAL_GATE_BLAS_THREADS")
    assert (gaterun.side_by_side_blas_threads("cpu"), gaterun.side_by_side_blas_threads("cuda:1")) == (0, 1)
    seen.clear()
    with threadpool_limits(limits=3, user_api="blas"):
        before = threads()
        assert not run_gates(run.root, gates, options=RAND, progress=False, force=True).failed
    assert [s for s, _ in seen] == [True] * 6 and all(t == before for _, t in seen)


def test_a_bad_gate_thread_count_is_refused_before_anything_runs(run, monkeypatch):
    for bad in ("0", "two"):
        monkeypatch.setenv("H3EVAL_GATE_THREADS", bad)
        with pytest.raises(GateRunError, match="H3EVAL_GATE_THREADS"):
            run_gates(run.root, GATES, options=RAND, progress=False)
        assert not (run.root / "gates").exists()
    monkeypatch.delenv("H3EVAL_GATE_THREADS")
    for bad in ("-1", "1.5"):
        monkeypatch.setenv("H3EVAL_GATE_BLAS_THREADS", bad)
        with pytest.raises(GateRunError, match="H3EVAL_GATE_BLAS_THREADS"):
            run_gates(run.root, GATES, options=RAND, progress=False)
        assert not (run.root / "gates").exists()


def test_a_clip_asked_for_by_two_threads_at_once_is_decoded_once(run, monkeypatch):
    """The clip cache's in-flight decode: a second gate asking for a clip being decoded waits for that decode
    instead of starting its own; both get the same frames."""
    import threading
    import time

    import h3.media
    from gates import media_cache

    media_cache.clear()
    decodes = []
    original = h3.media.decode_video

    def slow(path, **kw):
        decodes.append(path)
        time.sleep(0.3)
        return original(path, **kw)

    monkeypatch.setattr(h3.media, "decode_video", slow)
    path = run.clip_path("drift", "p0", 0)
    got = []
    threads = [threading.Thread(target=lambda: got.append(media_cache.load_video(path))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(decodes) == 1 and len(got) == 3 and got[0][0] is got[1][0] is got[2][0]
    assert got[0][0].shape[0] == NUM_FRAMES
    media_cache.clear()


def test_clip_decoded_ahead_is_evicted_after_the_clips_already_read(tmp_path, monkeypatch):
    """The cache bound drops read clips first: a clip decoded ahead for a later pair survives reads of the current
    pair's clips and new decodes (plain LRU evicted it, so it was decoded twice: the decode-ahead test's flake), and
    is a clip like any other once a gate has read it."""
    from gates import media_cache

    media_cache.clear()
    monkeypatch.setattr(media_cache, "_MAX_PER_KIND", 3)
    paths = {}
    for name in "abcde":
        paths[name] = tmp_path / f"{name}.mp4"
        paths[name].write_bytes(name.encode())
    loads = []

    def get(name, ahead=False):
        return media_cache._cached("video", paths[name], lambda: loads.append(name) or name, ahead)

    get("a")
    get("b", ahead=True)  # the next pair's clip, decoded while "a"'s gates run
    get("a")  # read again: under plain LRU "b" is now the oldest
    get("c")
    get("d")  # over the bound of 3: drops "a" (read longest ago), keeps "b"
    assert get("b") == "b" and loads == ["a", "b", "c", "d"]
    get("e")  # "b" has been read: plain LRU from now on, so "c" (read before "d" and "b") goes
    assert get("b") == "b" and get("c") == "c" and loads == ["a", "b", "c", "d", "e", "c"]
    media_cache.clear()


def test_gate_threads_default_to_one_per_core_from_two_cores_and_one_below(monkeypatch):
    import os

    from h3eval.gaterun import gate_workers

    monkeypatch.delenv("H3EVAL_GATE_THREADS", raising=False)
    for cores, gates, want in ((1, 7, 1), (2, 7, 2), (4, 3, 3), (8, 7, 7), (16, 7, 7), (16, 1, 1), (None, 3, 1)):
        monkeypatch.setattr(os, "cpu_count", lambda: cores)
        assert gate_workers(gates) == want, (cores, gates)
    monkeypatch.setenv("H3EVAL_GATE_THREADS", "3")
    assert gate_workers(7) == 3 and gate_workers(2) == 2


def _record_decodes(monkeypatch) -> tuple[list, list]:
    """Wrap the clip cache's prefetch and video loading: ``calls`` gets (thread name, the clips' stems) per prefetch,
    ``decoded`` (thread name, recipe folder, stem) per clip decoded afresh (not found in the cache nor in flight)."""
    import threading
    from pathlib import Path

    from gates import media_cache

    calls, decoded = [], []
    original_prefetch, original_video = media_cache.prefetch, media_cache.load_video

    def prefetch(paths, needs):
        calls.append((threading.current_thread().name, [Path(p).stem for p in paths]))
        return original_prefetch(paths, needs)

    def load_video(path, ahead=False):
        key = media_cache._key("video", path)
        with media_cache._lock:
            fresh = key not in media_cache._cache and key not in media_cache._loading
        if fresh:
            decoded.append((threading.current_thread().name, Path(path).parent.name, Path(path).stem))
        return original_video(path, ahead)

    monkeypatch.setattr(media_cache, "prefetch", prefetch)
    monkeypatch.setattr(media_cache, "load_video", load_video)
    return calls, decoded


def test_the_next_pairs_clips_are_decoded_while_this_pairs_gates_run(tmp_path, monkeypatch):
    """Where the gates run side by side and all of them are warm, the runner decodes the next pair's two clips in a
    background thread while the current pair's gates run (at most one pair ahead); every result equals the one-after-
    another run's. Pair 0 warms the gates (one after another, nothing ahead); from pair 1 on, the clips of pair i+1
    are decoded ahead, so the side-by-side prefetch of pair i+1 finds them decoded."""
    import shutil

    from gates import media_cache
    from h3eval import gaterun
    from h3eval.store import RunStore

    gates = ["integrity", "fidelity", "audio", "ghosting"]
    one = make_run(tmp_path / "one", candidates=("drift",), prompt_ids=("p0", "p1", "p2", "p3"), frames_fn=_frames,
                   audio_fn=_audio)
    shutil.copytree(one.root, tmp_path / "many")
    monkeypatch.setenv("H3EVAL_GATE_THREADS", "1")
    assert not gaterun.decode_ahead([get_gate(g) for g in gates])
    assert not run_gates(one.root, gates, options=RAND, progress=False).failed
    media_cache.clear()
    calls, decoded = _record_decodes(monkeypatch)
    monkeypatch.setenv("H3EVAL_GATE_THREADS", "4")
    monkeypatch.setattr(gaterun, "_warm", set())
    many = RunStore(tmp_path / "many")
    assert not run_gates(many.root, gates, options=RAND, progress=False).failed
    ahead = [stems for name, stems in calls if name == "decode-ahead"]
    assert ahead == [["p2-s0", "p2-s0"], ["p3-s0", "p3-s0"]]  # pair 0 warmed the gates; pair 3 is the last
    # each clip decoded once; those of pairs 2 and 3 by the decode-ahead thread
    assert sorted((d, s) for _, d, s in decoded) == sorted((d, f"p{i}-s0") for i in range(4) for d in ("baseline", "drift"))
    assert {(d, s) for name, d, s in decoded if name.startswith("decode")} >= {
        (d, s) for d in ("baseline", "drift") for s in ("p2-s0", "p3-s0")}
    a, b = _results(one, gates), _results(many, gates)
    assert len(a) == 16 and a.keys() == b.keys()
    for key in a:
        _assert_same(a[key], b[key], key)


def test_two_pairs_decode_ahead_each_clip_once_and_give_the_same_results(tmp_path, monkeypatch):
    """With $H3EVAL_DECODE_AHEAD=2 the runner keeps two pairs' clips decoding ahead: the pairs after a warm pair's
    own clips are decoded start then (pairs 2 and 3 from pair 1, pair 4 from pair 2), every clip is decoded once,
    and every result equals the one-after-another run's."""
    import shutil

    from gates import media_cache
    from h3eval import gaterun
    from h3eval.store import RunStore

    gates = ["integrity", "fidelity", "audio", "ghosting"]
    prompts = tuple(f"p{i}" for i in range(5))
    one = make_run(tmp_path / "one", candidates=("drift",), prompt_ids=prompts, frames_fn=_frames, audio_fn=_audio)
    shutil.copytree(one.root, tmp_path / "many")
    monkeypatch.setenv("H3EVAL_GATE_THREADS", "1")
    assert not run_gates(one.root, gates, options=RAND, progress=False).failed
    media_cache.clear()
    calls, decoded = _record_decodes(monkeypatch)
    monkeypatch.setenv("H3EVAL_GATE_THREADS", "4")
    monkeypatch.setenv("H3EVAL_DECODE_AHEAD", "2")
    monkeypatch.setattr(gaterun, "_warm", set())
    many = RunStore(tmp_path / "many")
    assert not run_gates(many.root, gates, options=RAND, progress=False).failed
    ahead = sorted(stems for name, stems in calls if name == "decode-ahead")
    assert ahead == [[f"p{i}-s0", f"p{i}-s0"] for i in (2, 3, 4)]
    assert sorted((d, s) for _, d, s in decoded) == sorted(
        (d, f"p{i}-s0") for i in range(5) for d in ("baseline", "drift"))
    a, b = _results(one, gates), _results(many, gates)
    assert len(a) == 20 and a.keys() == b.keys()
    for key in a:
        _assert_same(a[key], b[key], key)


def test_decode_ahead_depth_defaults_to_one_pair_and_refuses_bad_values(monkeypatch, tmp_path):
    from gates.media_cache import MAX_DECODE_AHEAD, _MAX_PER_KIND
    from h3eval.gaterun import decode_ahead_pairs

    monkeypatch.delenv("H3EVAL_DECODE_AHEAD", raising=False)
    assert decode_ahead_pairs() == 1
    monkeypatch.setenv("H3EVAL_DECODE_AHEAD", "2")
    assert decode_ahead_pairs() == 2
    # the clip cache holds the current pair, the pairs ahead and a spare, per kind
    assert _MAX_PER_KIND >= 2 * (1 + MAX_DECODE_AHEAD) + 1
    monkeypatch.setenv("H3EVAL_DECODE_AHEAD", "0")
    assert decode_ahead_pairs() == 0
    store = make_run(tmp_path / "run", candidates=("drift",), frames_fn=_frames, audio_fn=_audio)
    for bad in ("3", "-1", "two"):
        monkeypatch.setenv("H3EVAL_DECODE_AHEAD", bad)
        with pytest.raises(GateRunError, match="H3EVAL_DECODE_AHEAD"):
            run_gates(store.root, ["integrity"], progress=False)
    assert not (store.root / "gates").exists()  # refused before anything was written
