"""Fast tests of the VBench gate's pins, environment checks and result mapping (no scoring environment needed).

The end-to-end tests that build the environment and score real clips are in test_vbench_env.py (slow).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from gates.base import PairRef, get_gate, known_gates
from gates.vbench import ClipInput, clip_scores, evaluate_run, pair_result
from h3eval.gaterun import run_context
from gates.vbench import dimensions as dimmod
from gates.vbench.dimensions import DIMENSIONS, UnknownDimensionError, resolve_dimensions
from gates.vbench.env import LOCK_FILES, MARKER_NAME, VBenchEnvError, check_env, read_lock
from gates.vbench.pins import (
    SOURCE_PINS_PATH,
    MissingCheckpointError,
    VBenchPinError,
    make_source_pins,
    missing_checkpoints,
    pin_checkpoints,
    verify,
    verify_checkpoints,
    verify_sources,
)

REPO = Path(__file__).resolve().parent.parent


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fake_site_packages(root: Path) -> Path:
    """A site-packages tree with every file the pins name (content: the path itself)."""
    names = list(json.loads(SOURCE_PINS_PATH.read_text())["files"])
    for rel in names:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"# {rel}\n".encode() * 50)
    return root


# -- source pins -----------------------------------------------------------------------------------------------------


def test_committed_source_pins_cover_the_seed_dimensions_utils_and_full_info():
    pins = json.loads(SOURCE_PINS_PATH.read_text())
    assert pins["vbench_version"] == "0.1.5"
    for name in ["subject_consistency", "background_consistency", "motion_smoothness", "dynamic_degree",
                 "aesthetic_quality", "imaging_quality", "overall_consistency", "temporal_flickering"]:
        assert f"vbench/{name}.py" in pins["files"]
    assert "vbench/utils.py" in pins["files"] and "vbench/VBench_full_info.json" in pins["files"]
    assert all(len(h) == 64 and int(h, 16) >= 0 for h in pins["files"].values())


def test_verify_sources_detects_one_changed_byte_in_a_copied_pinned_file(tmp_path):
    site = _fake_site_packages(tmp_path / "site")
    pins = make_source_pins(site)
    assert verify_sources(site, pins) == []
    target = site / "vbench" / "temporal_flickering.py"
    data = bytearray(target.read_bytes())
    data[17] ^= 0x01  # one bit of one byte
    target.write_bytes(bytes(data))
    problems = verify_sources(site, pins)
    assert len(problems) == 1
    assert str(target) in problems[0]
    assert _sha(bytes(data)) in problems[0] and pins["files"]["vbench/temporal_flickering.py"] in problems[0]


def test_verify_sources_names_a_missing_pinned_file(tmp_path):
    site = _fake_site_packages(tmp_path / "site")
    pins = make_source_pins(site)
    (site / "vbench" / "VBench_full_info.json").unlink()
    assert verify_sources(site, pins) == [f"pinned VBench file missing: {site / 'vbench' / 'VBench_full_info.json'}"]


# -- checkpoints -----------------------------------------------------------------------------------------------------


def test_missing_checkpoint_error_names_the_file_and_the_path_it_must_be_at(tmp_path):
    cache = tmp_path / "cache"
    messages = missing_checkpoints(cache, ["imaging_quality"])
    expected_path = cache / "pyiqa_model" / "musiq_spaq_ckpt-358bb6af.pth"
    assert len(messages) == 1
    assert "imaging_quality" in messages[0] and "pyiqa_model/musiq_spaq_ckpt-358bb6af.pth" in messages[0]
    assert str(expected_path) in messages[0]
    with pytest.raises(MissingCheckpointError, match=str(expected_path).replace(".", r"\.")):
        pin_checkpoints(cache, ["imaging_quality"], out=tmp_path / "pins.json")
    assert not (tmp_path / "pins.json").exists()


@pytest.mark.parametrize("dimension", [d for d in DIMENSIONS if DIMENSIONS[d].checkpoints])
def test_every_model_dimension_stops_at_a_missing_checkpoint(tmp_path, dimension):
    cache = tmp_path / "cache"
    pins = {"version": 1, "checkpoints": []}
    problems = verify_checkpoints(cache, pins, [dimension])
    assert len(problems) == len(DIMENSIONS[dimension].checkpoints)
    for rel, problem in zip(DIMENSIONS[dimension].checkpoints, problems):
        assert str(cache / rel) in problem and dimension in problem


def _write_checkpoints(cache: Path) -> dict[str, bytes]:
    contents = {}
    for rel in ["clip_model/ViT-B-32.pt", "dino_model/dino_vitbase16_pretrain.pth",
                "dino_model/facebookresearch_dino_main/hubconf.py",
                "dino_model/facebookresearch_dino_main/vision_transformer.py"]:
        data = os.urandom(256)
        (cache / rel).parent.mkdir(parents=True, exist_ok=True)
        (cache / rel).write_bytes(data)
        contents[rel] = data
    return contents


def test_pin_then_verify_checkpoints_detects_a_changed_byte_and_an_unpinned_file(tmp_path):
    cache = tmp_path / "cache"
    contents = _write_checkpoints(cache)
    out = tmp_path / "vbench-checkpoints.json"
    data = pin_checkpoints(cache, ["background_consistency", "subject_consistency"], out=out)
    assert {e["path"]: e["sha256"] for e in data["checkpoints"]} == {k: _sha(v) for k, v in contents.items()}
    pins = json.loads(out.read_text())
    dims = ["background_consistency", "subject_consistency"]
    assert verify_checkpoints(cache, pins, dims) == []

    target = cache / "clip_model/ViT-B-32.pt"
    changed = bytearray(contents["clip_model/ViT-B-32.pt"])
    changed[100] ^= 0xFF
    target.write_bytes(bytes(changed))
    (cache / "dino_model/facebookresearch_dino_main/evil.py").write_text("import os\n")
    problems = verify_checkpoints(cache, pins, dims)
    assert any(str(target) in p and _sha(bytes(changed)) in p for p in problems)
    assert any("evil.py" in p and "unpinned" in p for p in problems)
    assert len(problems) == 2


def test_a_present_but_unpinned_checkpoint_is_refused(tmp_path):
    cache = tmp_path / "cache"
    _write_checkpoints(cache)
    problems = verify_checkpoints(cache, {"version": 1, "checkpoints": []}, ["background_consistency"])
    assert problems == [
        "checkpoint clip_model/ViT-B-32.pt for background_consistency is not pinned in vbench-checkpoints.json; "
        "run `h3eval vbench pin` on a trusted machine and commit the file"
    ]


# -- environment -----------------------------------------------------------------------------------------------------


def test_committed_locks_are_exact_hashed_pins_that_install_together():
    core = read_lock(LOCK_FILES["core"])
    models = read_lock(LOCK_FILES["models"])
    assert core["vbench"] == "0.1.5"
    assert core["numpy"].startswith("1.")  # vbench 0.1.5 declares numpy<2
    assert models["transformers"] == "4.33.2"  # vbench 0.1.5 declares transformers==4.33.2
    assert not set(core) & set(models)  # each distribution pinned once
    assert "opencv-python" not in models  # headless cv2 from the core lock instead


def test_read_lock_rejects_a_line_without_a_hash(tmp_path):
    lock = tmp_path / "x.lock"
    lock.write_text("numpy==1.26.4\n")
    with pytest.raises(VBenchEnvError, match="x.lock:1"):
        read_lock(lock)


def test_check_env_names_a_missing_environment(tmp_path):
    with pytest.raises(VBenchEnvError, match="no VBench environment at .*vbench setup"):
        check_env(tmp_path / "nowhere", ["temporal_flickering"])


def test_check_env_calls_an_unfinished_build_broken(tmp_path):
    env = tmp_path / "env"
    (env / "bin").mkdir(parents=True)
    os.symlink(sys.executable, env / "bin" / "python")
    with pytest.raises(VBenchEnvError, match=f"{MARKER_NAME} is missing"):
        check_env(env, ["temporal_flickering"])


def test_check_env_finds_versions_that_differ_from_the_lock(tmp_path):
    """An environment whose installed packages are not the locked ones (here: the product's own venv)."""
    env = tmp_path / "env"
    (env / "bin").mkdir(parents=True)
    os.symlink(sys.executable, env / "bin" / "python")
    from h3.atomic import sha256_file

    (env / MARKER_NAME).write_text(json.dumps({"groups": ["core"], "lock_sha256": {"core": sha256_file(LOCK_FILES["core"])}}))
    import numpy

    with pytest.raises(VBenchEnvError, match=f"numpy is {numpy.__version__}, the lock says 1.26.4"):
        check_env(env, ["temporal_flickering"])


# -- dimensions and mapping -------------------------------------------------------------------------------------------


def test_unknown_dimension_lists_the_supported_ones():
    with pytest.raises(UnknownDimensionError, match="temporal_flickering"):
        resolve_dimensions(["color"])
    assert resolve_dimensions(["temporal_flickering,imaging_quality", "temporal_flickering"]) == [
        "temporal_flickering", "imaging_quality"]


def test_a_dimension_string_is_one_comma_separated_list_not_its_characters(tmp_path):
    """Issue 18: `-o vbench.dimensions=temporal_flickering` failed with "unknown VBench dimension 't'"."""
    from h3eval.commands.gate import gate_command
    from h3eval.synth import make_synthetic_run
    from gates.vbench import VBenchGate

    assert resolve_dimensions("temporal_flickering") == ["temporal_flickering"]
    assert resolve_dimensions("temporal_flickering, imaging_quality") == ["temporal_flickering", "imaging_quality"]
    assert VBenchGate.parse_options({"dimensions": "temporal_flickering"}).dimensions == ["temporal_flickering"]
    make_synthetic_run(tmp_path, candidates=["c"], prompt_ids=["p0"], seeds=[0],
                       frames_fn=lambda r, p, s: np.full((4, 16, 16, 3), 90, np.uint8),
                       audio_fn=lambda r, p, s: np.zeros((4000, 2), np.int16))
    missing_env = tmp_path / "no-env"
    # Through the CLI's own parsing: the dimension is accepted; scoring then stops on the missing environment.
    assert gate_command(tmp_path, "vbench", options=["vbench.dimensions=temporal_flickering",
                                                     f"vbench.env={missing_env}"], progress=False) == 1
    result = json.loads((tmp_path / "gates" / "vbench" / "c" / "p0-s0.json").read_text())
    assert "no VBench environment" in result["error"] and "unknown VBench dimension" not in result["error"]
    # An unknown name is still refused, before anything runs (exit 3), with the supported ones listed.
    assert gate_command(tmp_path, "vbench", options=["vbench.dimensions=temporal_flicker"], progress=False) == 3


def test_normalization_matches_the_leaderboard_formula():
    # VBench scripts/cal_final_score.py: (raw - Min) / (Max - Min) with NORMALIZE_DIC.
    tf = DIMENSIONS["temporal_flickering"]
    assert tf.normalize(0.6293) == pytest.approx(0.0) and tf.normalize(1.0) == pytest.approx(1.0)
    assert tf.normalize(0.9) == pytest.approx((0.9 - 0.6293) / (1.0 - 0.6293), abs=1e-15)
    assert DIMENSIONS["overall_consistency"].normalize(0.182) == pytest.approx(0.5)


def test_runner_checkpoint_table_agrees_with_the_dimension_table():
    spec = importlib.util.spec_from_file_location("vbench_runner", REPO / "gates" / "vbench" / "runner.py")
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    for name, dim in DIMENSIONS.items():
        assert [c.rstrip("/") for c in dim.checkpoints] == runner.CHECKPOINTS[name]


def test_result_mapping_never_zero_fills():
    dims = ["temporal_flickering", "imaging_quality"]
    result = {"dimensions": {
        "temporal_flickering": {"clips": {"b/p0-s0": {"value": 0.98, "error": None},
                                          "c/p0-s0": {"value": None, "error": "VBench cannot decode x.mp4"}}},
        "imaging_quality": {"clips": {"b/p0-s0": {"value": 0.61, "error": None}}},  # candidate absent
    }}
    base = clip_scores(result, "b/p0-s0", dims)
    cand = clip_scores(result, "c/p0-s0", dims)
    assert base["temporal_flickering"]["raw"] == 0.98
    assert base["temporal_flickering"]["normalized"] == pytest.approx((0.98 - 0.6293) / (1 - 0.6293))
    assert cand["temporal_flickering"] == {"raw": None, "normalized": None, "error": "VBench cannot decode x.mp4"}
    assert cand["imaging_quality"]["raw"] is None and "reported nothing" in cand["imaging_quality"]["error"]
    res = pair_result(PairRef(baseline="b", candidate="c", prompt_id="p0", seed=0), base, cand, dims, {})
    assert res.status == "error" and "partial" in res.flags[0]
    for key in ["temporal_flickering", "temporal_flickering_delta", "imaging_quality", "imaging_quality_delta"]:
        assert res.metrics[key].value is None
    assert "VBench cannot decode x.mp4" in res.error
    assert res.info["scores"]["temporal_flickering"]["baseline"]["raw"] == 0.98


def test_pair_result_delta_is_candidate_minus_baseline():
    dims = ["temporal_flickering"]
    result = {"dimensions": {"temporal_flickering": {"clips": {"b/p-s1": {"value": 0.97, "error": None},
                                                               "c/p-s1": {"value": 0.91, "error": None}}}}}
    res = pair_result(PairRef(baseline="b", candidate="c", prompt_id="p", seed=1),
                      clip_scores(result, "b/p-s1", dims), clip_scores(result, "c/p-s1", dims), dims, {})
    assert res.status == "ok" and res.error is None
    assert res.metrics["temporal_flickering"].value == 0.91
    assert res.metrics["temporal_flickering_delta"].value == pytest.approx(0.91 - 0.97, abs=1e-15)
    assert res.metrics["temporal_flickering"].higher_is_better is True


def test_gate_is_registered():
    assert "vbench" in known_gates()
    gate = get_gate("vbench")
    assert gate.name == "vbench" and callable(gate.evaluate_run)


# -- refusal before scoring ------------------------------------------------------------------------------------------


def _tiny_run(root: Path):
    from h3eval.synth import make_synthetic_run

    def frames(recipe, pid, seed):
        return np.full((6, 32, 32, 3), 100, dtype=np.uint8)

    def audio(recipe, pid, seed):
        return np.zeros((8000, 2), dtype=np.int16)

    return make_synthetic_run(root, candidates=["cand"], prompt_ids=["p0"], seeds=[0], frames_fn=frames, audio_fn=audio)


def test_scoring_refuses_to_start_without_a_valid_environment_and_writes_nothing(tmp_path):
    store = _tiny_run(tmp_path / "run")
    with pytest.raises(VBenchPinError, match=r"scoring will not start:\n  - no VBench environment at"):
        evaluate_run(run_context(store.root, "vbench"), ["temporal_flickering"], env=tmp_path / "no-env")
    assert not (store.root / "gates" / "vbench").exists()


def test_verify_cli_exits_nonzero_and_names_each_problem(tmp_path):
    from h3eval.commands.vbench import register

    app = typer.Typer()
    register(app)

    @app.callback()
    def _root() -> None:
        pass

    out = CliRunner().invoke(app, ["vbench", "verify", "--env", str(tmp_path / "no-env"), "-d", "imaging_quality",
                                   "--cache-dir", str(tmp_path / "cache")])
    assert out.exit_code == 1
    assert f"no VBench environment at {tmp_path / 'no-env'}" in out.output
    assert str(tmp_path / "cache" / "pyiqa_model" / "musiq_spaq_ckpt-358bb6af.pth") in out.output
    # Bad input is exit 3 (issue 26), a failed check exit 1: an unknown dimension, nothing to pin.
    out = CliRunner().invoke(app, ["vbench", "verify", "-d", "bogus"])
    assert out.exit_code == 3 and "unknown VBench dimension 'bogus'" in out.output
    out = CliRunner().invoke(app, ["vbench", "pin", "--cache-dir", str(tmp_path / "cache"), "-d", "imaging_quality",
                                   "--out", str(tmp_path / "pins.json")])
    assert out.exit_code == 3 and "cannot pin" in out.output and not (tmp_path / "pins.json").exists()


@pytest.mark.parametrize("attempt", [
    "import socket; socket.create_connection(('127.0.0.1', 9))",
    "import socket; s = socket.socket(); s.connect(('127.0.0.1', 9))",
    "import subprocess; subprocess.run(['wget', 'https://example.invalid/x.pth', '-P', '/tmp'])",
    "import os; os.system('wget https://example.invalid/x.pth')",
    "import urllib.request; urllib.request.urlretrieve('http://127.0.0.1:9/x.pth', '/tmp/x.pth')",
])
def test_the_runner_blocks_every_download_path_vbench_uses(attempt):
    """VBench fetches missing models with urlretrieve, torch.hub and `wget`; inside the runner all of them fail
    with one clear error (run here in a child of the product's python: the guard is plain standard library)."""
    code = (f"import importlib.util, sys; spec = importlib.util.spec_from_file_location('r', {str(REPO / 'gates' / 'vbench' / 'runner.py')!r}); "
            "r = importlib.util.module_from_spec(spec); spec.loader.exec_module(r); r.block_network(); " + attempt)
    import subprocess

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "NetworkBlocked: VBench scoring tried to reach the network" in proc.stderr
