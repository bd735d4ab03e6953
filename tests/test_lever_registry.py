"""The lever registry: one config class per lever, defined once; the recipe, the apply loop, the telemetry and the
configured-versus-executed check all come from it. Adding a lever is one new file plus one registry entry: shown
here with a toy lever written as a file of its own."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from types import SimpleNamespace

import pytest
import torch

import h3.levers as levers
from h3.levers import REGISTRY, LeverConfig, apply_recipe_levers, lever_configs, lever_telemetry
from h3.recipe import Recipe, RecipeError, compose_recipe, load_recipe
from h3.record import Executed

TOY_LEVER = '''
"""Toy: scales the transformer's output by ``strength`` (a lever as a file of its own)."""

from h3.levers.base import ApplyContext, LeverConfig, LeverHandle, mark_applied, unmark_applied


class ToyConfig(LeverConfig):
    """Recipe section ``[toy]``."""

    name = "toy"

    enabled: bool = False
    strength: float = 1.0

    def is_on(self) -> bool:
        return self.enabled

    def apply(self, pipe, ctx: ApplyContext) -> "ToyHandle":
        return apply_toy(pipe.transformer, self)


class ToyHandle(LeverHandle):
    name = "toy"

    def __init__(self, module, config):
        super().__init__()
        self.module, self.config, self.calls = module, config, 0
        self._hook = module.register_forward_hook(self._scale)

    def _scale(self, _module, _args, output):
        self.calls += 1
        return output * self.config.strength

    def telemetry(self):
        return {"applied": not self.removed, "strength": self.config.strength, "calls": self.calls}

    def _remove(self):
        self._hook.remove()
        unmark_applied(self.module, "toy")


def apply_toy(module, config: ToyConfig) -> ToyHandle:
    mark_applied(module, "toy")
    return ToyHandle(module, config)
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    path = tmp_path / "toy.py"  # the one new file
    path.write_text(TOY_LEVER)
    spec = importlib.util.spec_from_file_location("h3_toy_lever", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "h3_toy_lever", module)
    spec.loader.exec_module(module)
    return module


def test_each_lever_config_is_defined_once():
    """One config class per lever, living in the lever's own file; no other module defines a class of that name."""
    assert [c.name for c in REGISTRY] == list(levers.LEVERS)
    assert len(set(levers.LEVERS)) == len(levers.LEVERS)
    assert list(Recipe.model_fields)[6:] == list(levers.LEVERS)  # 6 settings, then the levers
    for config in REGISTRY:
        assert config.__module__.startswith("h3.levers."), config
        assert Recipe.model_fields[config.name].annotation is config
    import h3.ops
    import h3.recipe
    import h3eval.ab
    import h3eval.executed

    for module in (h3.recipe, h3.ops, h3eval.ab, h3eval.executed):
        source = inspect.getsource(module)
        for config in REGISTRY:
            assert f"class {config.__name__}" not in source, (module.__name__, config.__name__)


def test_every_shipped_recipe_has_every_lever_and_asks_each_whether_it_is_on():
    for config in lever_configs(load_recipe("turbo4-tinydemo")):
        assert isinstance(config, LeverConfig)
    demo = {c.name: c.is_on() for c in lever_configs(load_recipe("turbo4-tinydemo"))}
    assert {n for n, on in demo.items() if on} == {"lora", "adaln", "quant", "bucketing", "sparse_attention"}
    assert not any(c.is_on() for c in lever_configs(load_recipe("identity")))


def test_a_new_lever_is_one_file_and_one_registry_entry(toy):
    recipe_type = compose_recipe((*REGISTRY, toy.ToyConfig))  # the one registry entry
    recipe = recipe_type.model_validate({"name": "toyish", "steps": 2, "dtype": "float32",
                                         "toy": {"enabled": True, "strength": 2.0}})
    assert recipe.toy.is_on() and recipe.resolved()["toy"] == {"enabled": True, "strength": 2.0}
    assert recipe_type.model_validate({"name": "plain", "steps": 2}).toy.is_on() is False  # defaults: off
    with pytest.raises(ValueError, match="toy.strenght"):
        recipe_type.model_validate({"name": "typo", "steps": 2, "toy": {"strenght": 3}})
    with pytest.raises(RecipeError):  # the shipped schema does not know the toy
        from h3.recipe import recipe_from_dict

        recipe_from_dict({"name": "toyish", "steps": 2, "toy": {"enabled": True}})

    # The apply loop, the telemetry and the executed check pick it up with nothing else changed.
    transformer = torch.nn.Linear(3, 3)
    pipe = SimpleNamespace(transformer=transformer, vae=None)
    handles = apply_recipe_levers(pipe, recipe, device="cpu", model_sha256="t" * 64, is_tiny=True)
    assert list(handles) == ["toy"]
    x = torch.ones(1, 3)
    with torch.no_grad():
        assert torch.equal(transformer(x), 2.0 * torch.nn.functional.linear(x, transformer.weight, transformer.bias))
    executed = Executed(forward_passes=2, attention_backends=["native"], torch_dtype="float32", vae_tiling=True,
                        vae_tile=[256, 256])
    executed.levers = lever_telemetry(handles, recipe, executed)
    assert executed.levers["toy"] == {"applied": True, "strength": 2.0, "calls": 1}
    assert executed.levers["quant"] == {"applied": False}
    assert [p for c in lever_configs(recipe) for p in c.check_executed(executed.levers.get(c.name), executed)] == []
    off = recipe.model_copy(update={"toy": toy.ToyConfig()})
    assert [p for c in lever_configs(off) for p in c.check_executed(executed.levers.get(c.name), executed)] == [
        "toy: is off in the recipe but reported that it applied: {'applied': True, 'strength': 2.0, 'calls': 1}"]
    handles["toy"].remove()
    with torch.no_grad():
        assert torch.equal(transformer(x), torch.nn.functional.linear(x, transformer.weight, transformer.bias))
