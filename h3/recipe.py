"""Recipes: TOML files that name every lever of a configuration explicitly.

A recipe is a strict schema: an unknown key, a wrong type (a boolean for a number) or a number that is not finite
(``nan``, ``inf``) is an error that names the key. Shipped recipes live
in ``h3/recipes/<name>.toml``; any path to a ``.toml`` file works too.

The sections of a recipe are the levers' own configs (``h3/levers/<lever>.py``), composed from the registry in
:mod:`h3.levers`; this module holds only what is not a lever (name, steps, dtype).

Step semantics: ``steps`` is the number of DiT forward passes (denoising steps) of a request, the number the field
reports count ("29 to 4 DiT executions", seed 000). diffusers' ``num_inference_steps`` counts sigma grid points
including the terminal zero, so the runtime passes ``steps + 1``.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path
from typing import Any, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator

from h3.levers import REGISTRY, LeverConfig
from h3.names import is_safe_name
from h3.schema import FINITE_NUMBERS, validation_problems

RECIPES_DIR = Path(__file__).parent / "recipes"


class RecipeError(ValueError):
    """A recipe could not be found, parsed or validated."""


SignoffKind = Literal["exact", "near", "resample"]

NOT_COMPUTATION = ("signoff", "parent")
"""Recipe keys that say how a recipe is judged, not what it computes: left out of :meth:`Recipe.sha256` (a clip's
recipe hash names its computation, so declaring a signoff kind or a parent never invalidates finished clips)."""

KIND_ORDER: dict[str, int] = {"exact": 0, "near": 1, "resample": 2}
"""Signoff kinds from the least to the most change: the judge of several changes is the strictest one's."""

SETTING_KINDS: dict[str, tuple[str, str]] = {
    "steps": ("resample", "another step count draws another sample of the prompt (seed 000: 29 -> 4 DiT executions)"),
    "dtype": ("near", "another compute dtype: the same sample with other rounding"),
}
"""The signoff kind a change of each recipe setting that is not a lever implies (a lever's is its config's
``signoff_kind``); name, description, signoff and parent say nothing about the computation."""


class SignoffConfig(BaseModel):
    """How a recipe is signed off against the baseline (``[signoff]``); the release policy picks its judge by kind."""

    model_config = ConfigDict(extra="forbid", strict=True, **FINITE_NUMBERS)

    kind: SignoffKind
    """``exact``: the same computation (the output should be bit-identical: AdaLN precompute, offload, identity);
    ``near``: a small numerical difference, same sample (compile, FP8/INT8 with small error, attention kernels);
    ``resample``: a legitimately different sample of the same prompt (fewer steps, a distillation LoRA, sparse
    attention with its LoRA, step caches), judged reference-free against the baseline, not by same-seed fidelity."""
    reason: str = ""
    """Why this kind (shown in the verdict's report)."""


class _RecipeBase(BaseModel):
    """The settings that are not levers; :class:`Recipe` adds one section per lever of :data:`h3.levers.REGISTRY`."""

    model_config = ConfigDict(extra="forbid", strict=True, **FINITE_NUMBERS)

    name: str
    """Short name; also the clip folder name inside a run."""
    description: str = ""
    steps: int = Field(ge=1, le=200)
    """DiT forward passes per request (diffusers' num_inference_steps = steps + 1)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    """Compute dtype of the transformer, the VAEs and the text encoder (modules the checkpoint keeps in float32 stay
    float32)."""

    signoff: SignoffConfig | None = None
    """How the recipe is signed off (``[signoff] kind = ...``); None: undeclared, which a policy that judges by kind
    refuses to guess (INCONCLUSIVE)."""
    parent: str | None = None
    """The recipe this one is judged against (``parent = "turbo4-tiny"``): its judge follows the levers that differ
    between the two (:func:`lever_differences`), not its whole recipe, and ``h3eval ab`` generates the parent in the
    same run (a ladder). None: judged against the run's baseline by its declared ``[signoff] kind``."""

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        if not is_safe_name(value):
            raise ValueError(f"recipe name {value!r} must be letters, digits, '.', '_' or '-' (it names a folder)")
        return value

    @field_validator("parent")
    @classmethod
    def _safe_parent(cls, value: str | None) -> str | None:
        if value is not None and not is_safe_name(value):
            raise ValueError(f"parent {value!r} must be a recipe name (letters, digits, '.', '_' or '-')")
        return value

    def resolved(self) -> dict[str, Any]:
        """Every lever explicit, as plain data; a lever that is ``omitted_when_default`` (added after recipes were
        hashed) is left out while it is at its defaults, so that those recipes keep their hash."""
        data = self.model_dump(mode="json")
        for field, info in type(self).model_fields.items():
            config = getattr(self, field)
            default = info.default_factory
            if isinstance(config, LeverConfig) and config.omitted_when_default and config == default():
                del data[field]
        if data.get("parent") is None:  # added after runs were recorded: a recipe without one resolves as before
            data.pop("parent", None)
        return data

    def sha256(self) -> str:
        """Hash of the computation: the resolved recipe without :data:`NOT_COMPUTATION` keys."""
        data = {k: v for k, v in self.resolved().items() if k not in NOT_COMPUTATION}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()

    @property
    def num_inference_steps(self) -> int:
        return self.steps + 1


def compose_recipe(levers: Sequence[type[LeverConfig]] = REGISTRY) -> type[_RecipeBase]:
    """The recipe schema for ``levers``: the base settings and one section per lever, named by the config's
    ``name``, in the order the levers apply (every section defaults to the lever's own defaults: off)."""
    return create_model(
        "Recipe",
        __base__=_RecipeBase,
        __doc__="One configuration of the runtime: the base settings and one section per lever "
                "(``h3.levers.REGISTRY``, in the order the levers apply).",
        __module__=__name__,
        **{config.name: (config, Field(default_factory=config)) for config in levers},
    )


Recipe = compose_recipe()


def _format_validation_error(source: str, exc: ValidationError, data: Any = None) -> str:
    return f"invalid recipe {source}: " + "; ".join(validation_problems(exc, data))


def known_recipes() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.toml"))


def recipe_from_dict(data: dict[str, Any], source: str = "<dict>") -> Recipe:
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(_format_validation_error(source, exc, data)) from None


def with_lora_file(recipe: Recipe, path: str | Path) -> Recipe:
    """``recipe`` with its LoRA read from the file ``path`` (a training probe's, or a checkpoint folder's in place of
    '@turbo4-tiny'), validated again; nothing else changes."""
    data = recipe.model_dump()
    data["lora"]["path"] = str(path)
    return recipe_from_dict(data)


def load_recipe(name_or_path: str | Path) -> Recipe:
    """A shipped recipe by name, or a recipe file by path."""
    text = str(name_or_path)
    path = Path(text)
    if not (text.endswith(".toml") or "/" in text or path.exists()):
        path = RECIPES_DIR / f"{text}.toml"
        if not path.exists():
            raise RecipeError(f"unknown recipe {text!r}; shipped recipes: {', '.join(known_recipes())} (or give a path)")
    if path.is_dir():
        raise RecipeError(f"recipe file {path} is a directory, not a TOML file")
    if not path.is_file():
        raise RecipeError(f"recipe file {path} does not exist")
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise RecipeError(f"recipe file {path} is not valid TOML: {exc}") from None
    return recipe_from_dict(data, source=str(path))


class LeverDifference(BaseModel):
    """One lever (or setting) that differs between a recipe and its parent, and the judge that change implies."""

    model_config = ConfigDict(extra="forbid")
    lever: str
    kind: SignoffKind
    why: str
    parent: Any = None
    """The parent's section (or setting), as resolved."""
    candidate: Any = None


def _section(config: type[LeverConfig], data: Any) -> tuple[Any, bool | None]:
    """A lever section as compared (its config's full dump, defaults filled in) and whether it is on; the raw section
    and None when it does not validate (an imported recipe's: compared as written)."""
    try:
        parsed = config.model_validate(data if data is not None else {})
    except ValidationError:
        return data, None
    return parsed.model_dump(mode="json"), parsed.is_on()


def lever_differences(parent: dict[str, Any], candidate: dict[str, Any]) -> list[LeverDifference]:
    """What differs between two resolved recipes (``Recipe.resolved()``, or a run's ``run.json`` copy of it), each
    with the signoff kind its lever declares (``LeverConfig.signoff_kind``; :data:`SETTING_KINDS` for steps and
    dtype). A lever off on both sides does not differ, whatever its other fields say, unless it makes a setting while
    off (``prepare``: the VAE's tiling). Empty: the same computation."""
    out: list[LeverDifference] = []
    for key, (kind, why) in SETTING_KINDS.items():
        if parent.get(key) != candidate.get(key):
            out.append(LeverDifference(lever=key, kind=kind, why=why, parent=parent.get(key),
                                       candidate=candidate.get(key)))
    for config in REGISTRY:
        a, on_a = _section(config, parent.get(config.name))
        b, on_b = _section(config, candidate.get(config.name))
        if a == b:
            continue
        if on_a is False and on_b is False and config.prepare is LeverConfig.prepare:
            continue
        out.append(LeverDifference(lever=config.name, kind=config.signoff_kind or "resample",
                                   why=config.signoff_why or "a lever that declares no signoff kind: the strictest",
                                   parent=a, candidate=b))
    return out


def lineage_kind(differences: Sequence[LeverDifference]) -> SignoffKind:
    """The strictest kind among ``differences`` (exact < near < resample); no difference is ``exact``."""
    kinds = [d.kind for d in differences] or ["exact"]
    return max(kinds, key=KIND_ORDER.__getitem__)  # type: ignore[return-value]
