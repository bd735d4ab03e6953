"""Recipe text says what the recipe sets: every number a shipped recipe's description states is its setting.

Recipe descriptions once contradicted their settings (``turbo4-sparse`` said 64-row buckets and set 128). The rule
checked here: a number stated with a setting's own words must equal that setting (``N-row buckets``: the bucket
multiple; ``N-token blocks``: the sparse block size; ``N% of key blocks``: the kept fraction; ``N steps``: the step
count; ``threshold N``: the cache threshold; ``HxW``: the VAE tile, or a configured resolution and its tile); any
other number must equal some setting of the recipe. Digits inside a word (``turbo4``, ``FP8``, ``bf16``) are names,
not numbers. Measured figures (seconds, speedups) are no setting, so they cannot be stated there.
"""

from __future__ import annotations

import re

import pytest

from h3.recipe import known_recipes, load_recipe, recipe_from_dict

NUM = r"(?<![\w.])(\d+(?:\.\d+)?)"
PHRASES = [
    (re.compile(NUM + r"-row buckets?"), lambda r: {r.bucketing.multiple}),
    (re.compile(NUM + r"-token blocks?"), lambda r: {r.sparse_attention.block_size}),
    (re.compile(NUM + r"% of key blocks"), lambda r: {round(100 * (1 - r.sparse_attention.sparsity), 9)}),
    (re.compile(NUM + r"[- ]steps?\b"), lambda r: {r.steps}),
    (re.compile(r"threshold " + NUM), lambda r: {r.cache.threshold}),
]
PAIR = re.compile(NUM + r"x(\d+)(?![\w.])")
NUMBER = re.compile(NUM + r"(%?)(?![\w.]*\d)")


def stated_numbers(text: str) -> list[tuple[float, bool]]:
    """(value, is_percent) of each number the text states, in order; ``NxM`` gives both."""
    found = [(m.start(1), float(m[1]), m[2] == "%") for m in NUMBER.finditer(text)]
    for m in PAIR.finditer(text):
        found += [(m.start(1), float(m[1]), False), (m.start(2), float(m[2]), False)]
    return [(value, percent) for _, value, percent in sorted(found)]


def setting_values(node) -> set[float]:
    """Every number in the recipe's settings (nested sections, lists, and ``HxW`` keys such as a VAE tile's)."""
    values: set[float] = set()
    if isinstance(node, bool) or node is None:
        return values
    if isinstance(node, (int, float)):
        return {float(node)}
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(key, str) and re.fullmatch(r"\d+x\d+", key):
                values |= {float(v) for v in key.split("x")}
            values |= setting_values(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            values |= setting_values(value)
    return values


def contradictions(recipe) -> list[str]:
    """The numbers ``recipe.description`` states that its settings contradict (see the module docstring)."""
    text = recipe.description
    bad, claimed = [], set()
    for pattern, allowed in PHRASES:
        for m in pattern.finditer(text):
            claimed.add(m.start(1))
            if float(m[1]) not in {float(v) for v in allowed(recipe)}:
                bad.append(m[0])
    pairs = {(recipe.vae.tile_height, recipe.vae.tile_width)}
    for key, tile in recipe.vae.tiles.items():
        pairs |= {tuple(int(v) for v in key.split("x")), tuple(tile)}
    for m in PAIR.finditer(text):
        claimed |= {m.start(1), m.start(2)}
        if (int(float(m[1])), int(m[2])) not in pairs:
            bad.append(m[0])
    values = setting_values(recipe.model_dump(exclude={"name", "description"}))
    for m in NUMBER.finditer(text):
        if m.start(1) in claimed:
            continue
        value, percent = float(m[1]), m[2] == "%"
        if not (any(abs(value / 100 - v) < 1e-9 for v in values) if percent else value in values):
            bad.append(m[0])
    return bad


def test_stated_numbers_are_read_as_a_reader_reads_them():
    assert stated_numbers("turbo4 + FP8 e4m3 W8A8, bf16") == []
    assert stated_numbers("128-token blocks, 50% of key blocks, 304x320 tiles, threshold 0.05") == [
        (128.0, False), (50.0, True), (304.0, False), (320.0, False), (0.05, False)]


@pytest.mark.parametrize("name", sorted(known_recipes()))
def test_shipped_recipe_descriptions_state_only_their_settings(name):
    assert contradictions(load_recipe(name)) == []


def test_a_description_that_contradicts_its_settings_is_caught():
    """The description turbo4-sparse shipped with, against its settings: 64-row buckets where it sets 128."""
    recipe = load_recipe("turbo4-sparse").model_dump()
    recipe["description"] = ("turbo4 + block-sparse attention (128-token blocks, 50% of key blocks, dense first step), "
                             "64-row buckets")
    assert contradictions(recipe_from_dict(recipe)) == ["64-row buckets"]
    recipe["description"] = "turbo4 + block-sparse attention, 4.27 s per forward (1.52x faster), 8 steps"
    assert contradictions(recipe_from_dict(recipe)) == ["8 steps", "4.27", "1.52"]
    recipe["description"] = "turbo4 + block-sparse attention, 304x320 tiles at 768x1344, 25% of key blocks"
    assert contradictions(recipe_from_dict(recipe)) == ["25% of key blocks"]
    recipe["description"] = "turbo4 + block-sparse attention, 256x320 tiles"
    assert contradictions(recipe_from_dict(recipe)) == ["256x320"]
