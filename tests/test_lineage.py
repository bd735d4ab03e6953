"""Judging by lineage (issue 50): a recipe names its parent, each lever declares the judge a change of it implies, and
the judge of a candidate follows the levers that differ between it and its parent."""

from __future__ import annotations

import pytest

from h3.levers import REGISTRY
from h3.recipe import (KIND_ORDER, SETTING_KINDS, RecipeError, known_recipes, lever_differences, lineage_kind,
                       load_recipe, recipe_from_dict)


def _resolved(name: str) -> dict:
    return load_recipe(name).resolved()


def test_every_lever_declares_the_kind_a_change_of_it_implies():
    for config in REGISTRY:
        assert config.signoff_kind in KIND_ORDER, config.name
        assert config.signoff_why.strip(), config.name
    assert {k for k, _ in SETTING_KINDS.values()} <= set(KIND_ORDER)


def test_the_issues_levers_map_to_the_issues_kinds():
    kinds = {c.name: c.signoff_kind for c in REGISTRY}
    for lever in ("sparse_attention", "quant", "compile", "attention", "fp8_attention", "cache", "bucketing"):
        assert kinds[lever] == "near", lever
    for lever in ("offload", "adaln"):
        assert kinds[lever] == "exact", lever
    for lever in ("lora", "compensation_lora"):
        assert kinds[lever] == "resample", lever
    assert SETTING_KINDS["steps"][0] == "resample"


def test_parent_is_not_part_of_the_hash_and_a_recipe_without_one_resolves_as_before():
    data = _resolved("turbo4-tiny-int8")
    assert data["parent"] == "turbo4-tiny"
    without = {k: v for k, v in data.items() if k != "parent"}
    assert recipe_from_dict(without).sha256() == recipe_from_dict(data).sha256()
    assert "parent" not in _resolved("baseline")  # the resolved dict of a run recorded before parents is unchanged


def test_a_parent_must_be_a_recipe_name():
    data = {**_resolved("turbo4-tiny"), "parent": "../x"}
    with pytest.raises(RecipeError, match="parent"):
        recipe_from_dict(data)


def test_identity_differs_from_the_baseline_in_nothing_it_computes():
    # identity names fields of levers that are off (lora.fuse, adaln.disk_cache): an off lever does not differ.
    assert lever_differences(_resolved("baseline"), _resolved("identity")) == []
    assert lineage_kind([]) == "exact"


@pytest.mark.parametrize("parent,candidate,levers,kind", [
    ("baseline", "turbo4-tiny", {"steps", "lora"}, "resample"),
    ("baseline", "fewer-steps", {"steps"}, "resample"),
    ("baseline", "fp8-attention-emulated", {"fp8_attention"}, "near"),
    ("baseline", "fbc-cache", {"cache"}, "near"),
    ("turbo4-tiny", "turbo4-tiny-int8", {"quant"}, "near"),
    ("turbo4", "turbo4-sparse", {"bucketing", "sparse_attention", "compile", "vae_decoder"}, "near"),
    # turbo4-tiny-sparse85 loads run 13's LoRA, not turbo4-tiny's: the judge sees it (and the compensation LoRA).
    ("turbo4-tiny", "turbo4-tiny-sparse85", {"lora", "compensation_lora", "sparse_attention"}, "resample"),
])
def test_the_judge_is_the_strictest_kind_among_the_levers_that_differ(parent, candidate, levers, kind):
    diffs = lever_differences(_resolved(parent), _resolved(candidate))
    assert {d.lever for d in diffs} == levers
    assert lineage_kind(diffs) == kind
    lora = [d for d in diffs if d.lever == "lora"]
    if candidate == "turbo4-tiny-sparse85":
        assert (lora[0].parent["path"], lora[0].candidate["path"]) == ("@turbo4-tiny", "@turbo4-tiny-run13")


def test_an_exact_lever_alone_is_judged_exact_and_with_a_near_one_near():
    base = _resolved("turbo4-tiny")
    offload = {**base, "offload": {**base["offload"], "enabled": True}}
    assert lineage_kind(lever_differences(base, offload)) == "exact"
    both = {**offload, "quant": {**base["quant"], "mode": "int8_w8a8"}}
    assert {(d.lever, d.kind) for d in lever_differences(base, both)} == {("quant", "near"), ("offload", "exact")}
    assert lineage_kind(lever_differences(base, both)) == "near"


def test_every_shipped_parent_is_a_shipped_recipe():
    for name in known_recipes():
        parent = load_recipe(name).parent
        assert parent is None or parent in known_recipes(), (name, parent)
