"""The corpus of recipe bugs (bench/recipe_bugs/recipes, issue 50): every plant is a real recipe that names its correct
recipe as ``parent`` and differs from it only in the settings its bug is about, so that what the corpus measures is
that bug and nothing else. Reads the TOML files only (no model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from h3.recipe import load_recipe

PLANTS = Path(__file__).resolve().parent.parent / "bench" / "recipe_bugs" / "recipes"
NOT_COMPUTATION = {"name", "description", "signoff", "parent"}
EXPECTED = {
    # plant file: {setting: value in the plant} (everything else equals the parent's)
    "lora-16x": {("lora", "scale"): 16.0},
    "lora-weak16": {("lora", "scale"): 1 / 16},
    "lora-nomatch": {("lora", "include"): ["^blocks\\.\\d+\\."]},
    "lora-half": {("lora", "include"): ["^transformer_blocks\\.[01]\\."]},
    "steps-8": {("steps",): 8},
    "steps-2": {("steps",): 2},
    "cache-turbo4": {("cache", "kind"): "fbc"},  # at the default threshold, 0.05: the shipped fbc-cache's
    "cache-turbo4-reuse": {("cache", "kind"): "fbc", ("cache", "threshold"): 0.5},
    "sparse95-nocomp": {("sparse_attention", "sparsity"): 0.95, ("compensation_lora", "enabled"): False,
                        ("compensation_lora", "path"): None, ("compensation_lora", "fuse"): False},
    "sparse-audio": {("sparse_attention", "streams"): ["video", "audio"]},
    "sparse-all-streams": {("sparse_attention", "streams"): ["video", "audio", "text"]},
    "int8-excluded": {("quant", "exclude"): [r"(^|\.)proj_in$", r"(^|\.)audio_proj_in$", r"(^|\.)proj_out$",
                                             r"(^|\.)audio_proj_out$", "time_embedder", "norm", "transformer_blocks"]},
    "fp8-excluded": {("quant", "mode"): "fp8_w8a8",
                     ("quant", "exclude"): [r"(^|\.)proj_in$", r"(^|\.)audio_proj_in$", r"(^|\.)proj_out$",
                                            r"(^|\.)audio_proj_out$", "time_embedder", "norm", "transformer_blocks"]},
}


def _flat(data: dict, prefix: tuple = ()) -> dict:
    out = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flat(value, (*prefix, key)))
        else:
            out[(*prefix, key)] = value
    return out


def test_the_corpus_holds_every_plant_of_issue_50():
    assert sorted(p.stem for p in PLANTS.glob("*.toml")) == sorted(EXPECTED)


@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_each_plant_differs_from_its_parent_only_by_its_bug(stem):
    path = PLANTS / f"{stem}.toml"
    assert "#" in path.read_text().splitlines()[0], "a plant opens with the comment citing its field report"
    plant = load_recipe(path)
    assert plant.parent and plant.signoff is not None and plant.name.startswith("bug-")
    parent = load_recipe(plant.parent)
    a = {k: v for k, v in _flat(plant.model_dump(mode="json")).items() if k[0] not in NOT_COMPUTATION}
    b = {k: v for k, v in _flat(parent.model_dump(mode="json")).items() if k[0] not in NOT_COMPUTATION}
    differs = {k: a.get(k) for k in set(a) | set(b) if a.get(k) != b.get(k)}
    assert differs == EXPECTED[stem], (stem, differs)
