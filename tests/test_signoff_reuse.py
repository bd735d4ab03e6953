"""bench/signoff_proof/signoff_proof.py --reuse-from: a LoRA probe keeps an earlier proof's clips and gate results of every recipe
that does not load the LoRA, and drops those of the two that do."""

from __future__ import annotations

import pytest

from bench.lib.tiny import reuse_clips

RECIPES = ["baseline", "identity", "turbo4-tiny", "turbo4-tiny-lora03", "fewer-steps", "cond-fault"]


def proof(root):
    run = root / "proof"
    for name in RECIPES:
        (run / "clips" / name).mkdir(parents=True)
        (run / "clips" / name / "demo-00-s0.mp4").write_bytes(name.encode() * 3)
        for gate in ("reference_free", "prompt_faithfulness", "vbench"):
            (run / "gates" / gate / name).mkdir(parents=True)
            (run / "gates" / gate / name / "demo-00-s0.json").write_text(f'{{"{gate}": "{name}"}}')
        (run / "gates" / "vbench" / "clips" / name).mkdir(parents=True)
    (run / "gates" / "vbench" / "summary.json").write_text("{}")
    for name in ("run.json", "verdict.json", "report.md", "report.html", "junit.xml"):
        (run / name).write_text(name)
    return root


def test_reuse_drops_the_lora_recipes_and_keeps_the_rest_byte_for_byte(tmp_path):
    source = proof(tmp_path / "old")
    kept = reuse_clips(source, tmp_path / "new", ["turbo4-tiny", "turbo4-tiny-lora03"])
    new = tmp_path / "new" / "proof"
    assert kept == sorted(set(RECIPES) - {"turbo4-tiny", "turbo4-tiny-lora03"})
    for name in kept:
        assert (new / "clips" / name / "demo-00-s0.mp4").read_bytes() == name.encode() * 3
        for gate in ("reference_free", "prompt_faithfulness", "vbench"):
            assert (new / "gates" / gate / name / "demo-00-s0.json").read_text() == f'{{"{gate}": "{name}"}}'
    for name in ("turbo4-tiny", "turbo4-tiny-lora03"):
        assert not (new / "clips" / name).exists()
        assert not list(new.glob(f"gates/*/{name}")) and not (new / "gates" / "vbench" / "clips" / name).exists()
    assert (new / "run.json").read_text() == "run.json"  # the resume check reads it
    assert not any((new / n).exists() for n in ("verdict.json", "report.md", "report.html", "junit.xml"))
    assert (source / "proof" / "clips" / "turbo4-tiny" / "demo-00-s0.mp4").exists()  # the source is left alone


def test_reuse_refuses_a_folder_without_a_proof_or_an_existing_target(tmp_path):
    with pytest.raises(SystemExit, match="no proof run there"):
        reuse_clips(tmp_path / "nothing", tmp_path / "new", ["turbo4-tiny"])
    source = proof(tmp_path / "old")
    (tmp_path / "new" / "proof").mkdir(parents=True)
    with pytest.raises(SystemExit, match="exists; choose a new --out"):
        reuse_clips(source, tmp_path / "new", ["turbo4-tiny"])
    assert not any((tmp_path / "new" / "proof").iterdir())
