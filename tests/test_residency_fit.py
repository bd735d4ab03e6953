"""The ``fit`` residency of the text encoder (h3.residency.LayerResidency): the conditioner streamed as ``offload``
streams it, with the decoder layers that fit beside a request's measured peak kept on the device.

The small random preset runs on the CPU, where there is no device memory to measure: the tests give the residency a
planted memory (a card of a chosen size, a request of a chosen peak) and check which layers it keeps, when it gives
them back, and that the clip is the resident text encoder's to the bit whatever is kept.
"""

from __future__ import annotations

import numpy as np
import pytest

from h3.memory import full_size_plan
from h3.recipe import load_recipe, recipe_from_dict
from h3.residency import FIT_MARGIN_GIB, GIB, LayerResidency
from h3.runtime import GenerateRequest, H3Runtime
from tests.conftest import FAST_RECIPE

STATIC = 10 * GIB  # what the rest of the model holds on the planted card
NEED = 3 * GIB  # the planted peak of a request above its start


class PlantedCard:
    """A card of ``usable`` bytes holding STATIC bytes plus the layers ``fit`` keeps; a request peaks NEED above."""

    def __init__(self, fit: LayerResidency, usable: int):
        self.fit, self.usable = fit, usable

    def __call__(self) -> tuple[int, int, int]:
        allocated = STATIC + sum(self.fit._group_bytes(g) for g in self.fit.kept)
        return self.usable, allocated, allocated + NEED


def _load(residency: str) -> H3Runtime:
    return H3Runtime.load("h3-random-small", recipe_from_dict(FAST_RECIPE), "cpu", text_encoder=residency)


def _expected_kept(sizes: list[int], room: int) -> int:
    """The most layers, counted from the last, whose bytes sum to at most ``room`` (numpy's cumulative sum)."""
    if room < 0:
        return 0
    return int(np.searchsorted(np.cumsum(sizes[::-1]), room, side="right"))


def test_fit_keeps_the_last_layers_that_fit_and_the_clip_stays_the_resident_one(tmp_path):
    resident = _load("resident").generate(GenerateRequest(prompt="a cat", seed=1), tmp_path / "resident.mp4")
    runtime = _load("fit")
    fit = runtime._text_encoder_fit()
    groups = fit._layer_groups()
    sizes = [fit._group_bytes(g) for g in groups]
    assert len(groups) >= 2 and min(sizes) > 0
    # Room for the last two layers and half of the third: two are kept.
    margin = int(FIT_MARGIN_GIB * GIB)
    usable = STATIC + NEED + margin + sizes[-1] + sizes[-2] + sizes[-3 if len(sizes) > 2 else -1] // 2
    fit.memory = PlantedCard(fit, usable)
    first = runtime.generate(GenerateRequest(prompt="a cat", seed=1), tmp_path / "first.mp4")
    assert first.extra["text_encoder"]["residency"] == "fit"
    assert first.extra["text_encoder"]["kept_layers"] == 0  # a (recipe, shape) never measured streams every layer
    key = ("fast", *runtime.resolve(GenerateRequest(prompt="a cat", seed=1)))
    assert fit.needs == {key: NEED}
    assert [getattr(g, "_h3_fit_kept", False) for g in groups] == [False] * (len(groups) - 2) + [True, True]
    assert fit.moves[-1]["from"] == 0 and fit.moves[-1]["to"] == 2
    second = runtime.generate(GenerateRequest(prompt="a cat", seed=1), tmp_path / "second.mp4")
    assert second.extra["text_encoder"]["kept_layers"] == 2
    assert second.extra["text_encoder"]["kept_gib"] == pytest.approx((sizes[-1] + sizes[-2]) / GIB, abs=1e-3)
    # The same weights, moved or not: the clip is the resident text encoder's, bit for bit.
    assert first.frames_sha256 == second.frames_sha256 == resident.frames_sha256
    # Another shape was never measured: the kept layers go back before it runs, and come back after it.
    other = runtime.generate(GenerateRequest(prompt="a cat", seed=1, height=64, width=96), tmp_path / "other.mp4")
    assert other.extra["text_encoder"]["kept_layers"] == 0
    assert [m["to"] for m in fit.moves[-2:]] == [0, 2]
    assert len(fit.needs) == 2


def test_fit_target_is_the_most_layers_from_the_end_within_the_room():
    runtime = _load("fit")
    fit = runtime._text_encoder_fit()
    sizes = [fit._group_bytes(g) for g in fit._layer_groups()]
    margin = int(FIT_MARGIN_GIB * GIB)
    for extra in (-1, 0, sizes[-1] - 1, sizes[-1], sum(sizes) - 1, sum(sizes), sum(sizes) + GIB):
        fit.memory = PlantedCard(fit, STATIC + NEED + margin + extra)
        expected = _expected_kept(sizes, extra)
        assert fit.target(NEED) == expected, extra
        # What is kept counts as room: the answer does not move once the layers are on the device.
        fit.settle(expected, "test")
        assert len(fit.kept) == expected and fit.target(NEED) == expected
        fit.settle(0, "test")
    assert fit.target(None) == 0  # a request never measured
    fit.memory = None  # no device memory to measure (the CPU): nothing is kept
    assert fit.target(NEED) == 0


def test_giving_a_layer_back_restores_its_streaming():
    runtime = _load("fit")
    fit = runtime._text_encoder_fit()
    group = fit._layer_groups()[-1]
    onload, offload = group.onload_, group.offload_
    fit.settle(1, "test")
    assert group._h3_fit_kept and group.onload_ is not onload and group.offload_ is not offload
    fit.settle(0, "test")
    assert not group._h3_fit_kept and group.onload_ == onload and group.offload_ == offload
    assert fit.kept == [] and fit.info()["streamed_layers"] == len(fit._layer_groups())


def test_fit_settles_as_offload_in_the_memory_plan():
    """``fit`` keeps only what is left over: the plan (what must fit) is the streamed one."""
    recipes = [load_recipe(n) for n in ("baseline", "turbo4-fp8-sage-compile")]
    fit = full_size_plan(recipes, text_encoder="fit", shared=True)
    offload = full_size_plan(recipes, text_encoder="offload", shared=True)
    assert fit["peak_gib"] == offload["peak_gib"]
    assert fit["text_encoder_on_device_gib"] == pytest.approx(offload["text_encoder_on_device_gib"])
    resident = full_size_plan(recipes, text_encoder="resident", shared=True)
    assert resident["text_encoder_on_device_gib"] - fit["text_encoder_on_device_gib"] == pytest.approx(
        fit["text_encoder_streamed_gib"])
