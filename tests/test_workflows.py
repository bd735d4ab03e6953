"""fl2va / ref2va through the suite (issue 25): prompt suites that carry images, `h3 generate` with image files, the
run keeping the images, `h3eval import --prompts`, and `h3eval ab` on an fl2va suite through the verdict and report."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from h3.cli import app as h3_app
from h3.conditioning import image_from_file
from h3.media import encode_mp4
from h3eval.commands.import_ import run_import
from h3eval.prompts import PromptSuiteError, image_entry, load_prompts
from h3eval.store import RunStore, read_clip_record
from h3eval.synth import moving_square_frames, tone_pcm


def png(path: Path, colour, size=(128, 128)) -> Path:
    pixels = np.full((size[0], size[1], 3), 40, np.uint8)
    pixels[32:64, 40:72] = colour
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)
    return path


def write_suite(folder: Path, lines: list[dict]) -> Path:
    path = folder / "suite.jsonl"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.fixture()
def fl2va_suite(tmp_path) -> Path:
    folder = tmp_path / "prompts"
    first, last = png(folder / "kf" / "a-first.png", (230, 30, 30)), png(folder / "kf" / "a-last.png", (30, 30, 230))
    return write_suite(folder, [{"id": "a", "prompt": "a red square turns blue", "source": "test",
                                 "first_frame": image_entry(folder, first), "last_frame": image_entry(folder, last)}])


def test_suites_check_their_images(tmp_path, fl2va_suite):
    suite = load_prompts(fl2va_suite)
    (prompt,) = suite.prompts
    assert prompt.workflow == "fl2va" and list(prompt.images) == ["first_frame", "last_frame"]
    assert prompt.images["first_frame"].sha256 == hashlib.sha256((fl2va_suite.parent / "kf/a-first.png")
                                                                 .read_bytes()).hexdigest()
    assert "first_frame" not in prompt.meta
    # The world suites' spelling (h3.world.suites): keyframes {first, last} and references [path], no hashes; the
    # suite's hash then folds in each image's.
    world = write_suite(tmp_path / "world", [{"id": "w", "prompt": "p", "keyframes": {"first": "kf/a-first.png",
                                                                                    "last": "kf/a-last.png"}},
                                             {"id": "r", "prompt": "q", "references": ["kf/a-last.png"]}])
    shutil.copytree(fl2va_suite.parent / "kf", world.parent / "kf")
    loaded = load_prompts(world)
    assert [p.workflow for p in loaded.prompts] == ["fl2va", "ref2va"]
    assert loaded.prompts[0].images["last_frame"].sha256 == prompt.images["last_frame"].sha256
    expected = hashlib.sha256(world.read_bytes() + "".join(
        i.sha256 for p in loaded.prompts for i in p.images.values()).encode()).hexdigest()
    assert loaded.sha256 == expected
    png(world.parent / "kf" / "a-last.png", (1, 2, 3))  # the image changes: another suite
    assert load_prompts(world).sha256 != expected
    folder = fl2va_suite.parent
    good = image_entry(folder, folder / "kf" / "a-first.png")
    cases = {
        "does not match the sha256": {"first_frame": {**good, "sha256": "0" * 64}},
        "outside the suite's folder": {"reference": {"path": "../x.png", "sha256": "0" * 64}},
        "cannot read": {"last_frame": {"path": "kf/none.png", "sha256": "0" * 64}},
        "not both": {"first_frame": good, "reference": good},
        "must be a path": {"first_frame": 5},
        "one reference image per request": {"references": ["kf/a-first.png", "kf/a-last.png"]},
    }
    for i, (message, fields) in enumerate(cases.items()):
        path = write_suite(tmp_path / f"case{i}", [{"id": "x", "prompt": "p", **fields}])
        shutil.copytree(folder / "kf", path.parent / "kf")
        with pytest.raises(PromptSuiteError, match=message):
            load_prompts(path)


def test_h3_generate_with_keyframe_files_and_bad_images_exit_3(tmp_path):
    first = png(tmp_path / "first.png", (230, 30, 30))
    runner = CliRunner()
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n")
    for args, message in ((["--first-frame", str(bad)], "not a readable image"),
                          (["--last-frame", str(tmp_path / "none.png")], "cannot read"),
                          (["--first-frame", str(first), "--reference", str(first)], "not both")):
        result = runner.invoke(h3_app, ["generate", "--prompt", "x", "--out", str(tmp_path / "x.mp4"), *args])
        assert result.exit_code == 3 and message in result.output, result.output
        assert not (tmp_path / "x.mp4").exists()


def test_import_with_a_prompt_suite_records_the_workflow_and_keeps_the_images(tmp_path, fl2va_suite):
    base, cand = tmp_path / "base", tmp_path / "cand"
    for folder, seed in ((base, 1), (cand, 2)):
        folder.mkdir()
        encode_mp4(folder / "a-s0.mp4", moving_square_frames(24, 64, seed), tone_pcm(1.0))
    run = run_import(baseline_dir=str(base), candidate_dirs=[str(cand)], out=tmp_path / "run", prompts=fl2va_suite)
    assert run.status == "complete"
    store = RunStore(tmp_path / "run")
    suite = load_prompts(fl2va_suite)
    images = suite.prompts[0].images
    for side in ("base", "cand"):
        record = read_clip_record(store.record_path(side, "a", 0))
        assert record.request.workflow == "fl2va" and record.request.prompt == "a red square turns blue"
        assert [(c.role, c.sha256) for c in record.request.conditioning] == [
            ("first_frame", images["first_frame"].sha256), ("last_frame", images["last_frame"].sha256)]
    for image in images.values():
        assert store.input_path(image.sha256).read_bytes() == image.data
    # A clip whose prompt id is not in the suite is not imported (a clear error, the rest continues).
    encode_mp4(base / "zz-s0.mp4", moving_square_frames(24, 64, 3), tone_pcm(1.0))
    encode_mp4(cand / "zz-s0.mp4", moving_square_frames(24, 64, 4), tone_pcm(1.0))
    run = run_import(baseline_dir=str(base), candidate_dirs=[str(cand)], out=tmp_path / "run2", prompts=fl2va_suite)
    assert run.status == "partial" and any("not in the prompt suite" in e.error for e in run.errors)


def test_ab_on_an_fl2va_suite_through_the_verdict_and_report(tmp_path, fl2va_suite, fast_recipe_file):
    from h3eval.commands.ab import run_ab_command
    from h3eval.gaterun import run_gates
    from h3eval.report import run_report

    one_step = tmp_path / "one-step.toml"
    one_step.write_text(fast_recipe_file.read_text().replace('name = "fast"', 'name = "one-step"')
                        .replace("steps = 2", "steps = 1"))
    out = tmp_path / "run"
    result = run_ab_command(baseline=str(fast_recipe_file), candidates=[str(one_step)], prompts=str(fl2va_suite),
                            out=out, warmup=0, speed_rounds=1, model="tiny-random")
    assert result.manifest.status == "complete"
    store = RunStore(out)
    suite = load_prompts(fl2va_suite)
    for recipe in ("fast", "one-step"):
        record = read_clip_record(store.record_path(recipe, "a", 0))
        assert record.request.workflow == "fl2va"
        assert {c.sha256 for c in record.request.conditioning} == {i.sha256 for i in suite.prompts[0].images.values()}
        # the speed protocol's requests are the suite's requests, images included
        speed = sorted((out / "speed").rglob(f"{recipe}/*.json"))
        assert speed and read_clip_record(speed[0]).request.workflow == "fl2va"
    assert sorted(p.name for p in (out / "inputs").iterdir()) == sorted(
        f"{i.sha256}.png" for i in suite.prompts[0].images.values())
    summary = run_gates(out, ["integrity", "keyframe"], options={"lpips_trunk": "rand"}, progress=False)
    assert not summary.errors, summary.errors
    gate = json.loads(store.gate_result_path("keyframe", "one-step", "a", 0).read_text())
    assert gate["status"] == "ok" and set(gate["info"]["anchors"]) == {"first", "last"}
    verdict, paths = run_report(out, Path(__file__).resolve().parents[1] / "gates" / "policies" / "fl2va.toml")
    (candidate,) = verdict.candidates
    keyframe = next(g for g in candidate.gates if g.gate == "keyframe")
    psnr = next(m for m in keyframe.metrics if m.metric == "keyframe_psnr")
    # One pair, below the policy's 16 (seed 002): the verdict reads the keyframe gate and cannot pass it.
    assert psnr.n_pairs == 1 and psnr.outcome == "INCONCLUSIVE" and verdict.outcome == "INCONCLUSIVE"
    assert "only 1 usable pair(s); the policy needs at least 16" in psnr.reasons[0]
    report = paths["markdown"].read_text()
    assert "workflow fl2va: 2 clips; images first_frame" in report
