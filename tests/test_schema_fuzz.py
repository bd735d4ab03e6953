"""A seeded fuzz of the schemas read from files: recipes, policies, import manifests and run manifests.

Valid documents (the shipped recipes and policies, a good manifest line, a real run.json) are mutated the way a
hostile or careless user would: wrong types, booleans for integers, NaN, infinities, huge and negative numbers,
non-ASCII digits, unknown keys, missing keys, wrong nesting. For every mutant:

- the loader answers with the product's own error (RecipeError, PolicyError, RunError, StoreError), or accepts;
  anything else (a TypeError, a ValidationError dump, an OverflowError) is a traceback and fails the test;
- an accepted document holds no non-finite number and no boolean where a number belongs;
- an accepted document round-trips: loading what it dumps gives it back.

The server's request schema has its own fuzz (tests/test_server_hardening.py). Seeded, so a failure reproduces; a
few thousand mutants take about a second.
"""

from __future__ import annotations

import copy
import json
import math
import random
import tomllib
from pathlib import Path
from typing import Any, Callable

import pytest
from pydantic import BaseModel

from h3.recipe import RECIPES_DIR, Recipe, RecipeError, recipe_from_dict
from h3eval.backends.folder import ManifestLine, read_manifest
from h3eval.policy import Policy, PolicyError, parse_policy
from h3eval.runner import RunError
from h3eval.store import RunManifest, RunStore, StoreError
from tests.conftest import FAST_RECIPE

POLICIES = Path(__file__).resolve().parents[1] / "gates" / "policies"
MUTANTS = 600

HOSTILE: list[Any] = [
    float("nan"), float("inf"), float("-inf"), 1e308, -1e308, 1e-308, -1, 0, 1, 0.5, 2**63, 2**64, 2**200, -2**63,
    True, False, "", "x", "١٢٨", "１２", "nan", "inf", "1e400", "0x10", " 3 ", "(", "a" * 5000, "\u0000", "é",
    [], [float("nan")], [1, "x"], {}, {"nested": float("inf")}, {"fraction_of_floor": float("nan")}, None,
]


NON_FINITE = [float("nan"), float("inf"), float("-inf")]


def hostile(rng: random.Random) -> Any:
    """A hostile value; a non-finite number a third of the time (what the schemas must never accept)."""
    return copy.deepcopy(rng.choice(NON_FINITE if rng.random() < 1 / 3 else HOSTILE))


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value (tables, lists and leaves) of a nested document."""
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for key, value in doc.items():
            out += _paths(value, prefix + (key,))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            out += _paths(value, prefix + (i,))
    return out


def _get(doc: Any, path: tuple) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def _tables(doc: Any) -> list[tuple]:
    return [()] + [p for p in _paths(doc) if isinstance(_get(doc, p), dict)]


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    stack, found = [annotation], []
    while stack:
        t = stack.pop()
        if isinstance(t, type) and issubclass(t, BaseModel):
            found.append(t)
        stack += list(getattr(t, "__args__", ()))
    return found


def schema_paths(model: type[BaseModel], doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every field path of ``model`` for ``doc``: a field absent from the document is a path too (a mutant may set
    it), and a ``dict[str, Model]`` field contributes its document's keys."""
    paths = []
    for name, field in model.model_fields.items():
        path = prefix + (name,)
        paths.append(path)
        value = doc.get(name) if isinstance(doc, dict) else None
        origin_args = getattr(field.annotation, "__args__", ())
        if getattr(field.annotation, "__origin__", None) is dict and isinstance(value, dict):
            for sub in _models_in(origin_args[1]):
                for key, item in value.items():
                    paths += schema_paths(sub, item, path + (key,))
        else:
            for sub in _models_in(field.annotation):
                paths += schema_paths(sub, value if isinstance(value, dict) else {}, path)
    return paths


def _set(doc: dict, path: tuple, value: Any) -> None:
    for part in path[:-1]:
        if not isinstance(doc.get(part), dict):
            doc[part] = {}
        doc = doc[part]
    doc[path[-1]] = value


def mutate(doc: dict, rng: random.Random, schema: type[BaseModel] | None = None) -> dict:
    """One to three random mutations of a deep copy of ``doc`` (one, half of the time: a single bad value in an
    otherwise valid document is the case a loader most easily lets through)."""
    doc = copy.deepcopy(doc)
    for _ in range(1 if rng.random() < 0.5 else rng.randint(2, 3)):
        paths = _paths(doc)
        op = rng.choice(["value", "value", "field", "field", "delete", "unknown", "wrap", "list", "move", "table"])
        if op == "field" and schema is not None:  # any field of the schema, present in the document or not
            _set(doc, rng.choice(schema_paths(schema, doc)), hostile(rng))
            continue
        if not paths or op == "field":
            op = "unknown"
        if op == "unknown":
            table = _get(doc, rng.choice(_tables(doc)))
            table[rng.choice(["bogus", "Name", "steps ", "max_", "fraction_of_floor", "seed", "١"])] = hostile(rng)
            continue
        path = rng.choice(paths)
        parent, key = _get(doc, path[:-1]), path[-1]
        if op == "value":
            parent[key] = hostile(rng)
        elif op == "delete":
            del parent[key]
        elif op == "wrap":
            parent[key] = {"value": parent[key]}
        elif op == "list":
            parent[key] = [parent[key]]
        elif op == "move":  # wrong nesting: the key one table up, or into a sibling table
            value = parent.pop(key) if isinstance(parent, dict) else parent[key]
            target = _get(doc, rng.choice(_tables(doc)))
            target[str(key)] = value
        elif op == "table" and isinstance(parent, dict):
            parent[key] = rng.choice([1, "table", True, float("nan")])
    return doc


def non_finite_or_bool_numbers(value: Any, where: str = "") -> list[str]:
    """Every NaN or infinite float in ``value`` (a dumped model)."""
    found = []
    if isinstance(value, float) and not math.isfinite(value):
        found.append(where or "(top)")
    elif isinstance(value, dict):
        for k, v in value.items():
            found += non_finite_or_bool_numbers(v, f"{where}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found += non_finite_or_bool_numbers(v, f"{where}.{i}")
    return found


def fuzz(seed: int, bases: list[dict], load: Callable[[dict], Any], known: tuple[type[Exception], ...],
         check: Callable[[Any, dict], None], schema: type[BaseModel] | None = None,
         mutants: int = MUTANTS) -> dict[str, int]:
    """Load ``mutants`` mutants of ``bases``; an exception outside ``known`` fails the test with the mutant."""
    rng = random.Random(seed)
    counts = {"accepted": 0, "refused": 0}
    for i in range(mutants):
        doc = mutate(rng.choice(bases), rng, schema)
        try:
            loaded = load(doc)
        except known as exc:
            assert str(exc).strip(), f"mutant {i}: an empty error message"
            assert "errors.pydantic.dev" not in str(exc), f"mutant {i}: a raw pydantic dump: {exc}"
            counts["refused"] += 1
            continue
        except Exception as exc:  # noqa: BLE001 - what the test exists to find
            pytest.fail(f"mutant {i} raised {type(exc).__name__}: {exc}\n{doc!r:.2000}")
        counts["accepted"] += 1
        check(loaded, doc)
    return counts


def _model_has_finite_numbers(model: type[BaseModel], seen: set | None = None) -> list[str]:
    """Models reachable from ``model`` whose config lets nan/inf through (every future field must refuse them)."""
    seen = set() if seen is None else seen
    if model in seen:
        return []
    seen.add(model)
    bad = [] if model.model_config.get("allow_inf_nan") is False else [model.__name__]
    for field in model.model_fields.values():
        stack = [field.annotation]
        while stack:
            t = stack.pop()
            if isinstance(t, type) and issubclass(t, BaseModel):
                bad += _model_has_finite_numbers(t, seen)
            stack += list(getattr(t, "__args__", ()))
    return bad


@pytest.mark.parametrize("schema", [Recipe, Policy, ManifestLine, RunManifest])
def test_every_model_read_from_a_file_refuses_nan_and_inf(schema):
    """The setting is on each base class, so a field added tomorrow gets it; this walks every model reachable."""
    assert _model_has_finite_numbers(schema) == []


# -- recipes --------------------------------------------------------------------------------------------------------
def test_recipe_fuzz():
    bases = [FAST_RECIPE] + [tomllib.loads(p.read_text()) for p in sorted(RECIPES_DIR.glob("*.toml"))]

    def check(recipe, doc):
        dumped = recipe.resolved()
        assert non_finite_or_bool_numbers(dumped) == [], (doc, dumped)
        assert recipe_from_dict(dumped) == recipe  # round trip
        assert recipe.sha256() == recipe_from_dict(json.loads(json.dumps(dumped))).sha256()

    counts = fuzz(26, bases, lambda doc: recipe_from_dict(doc, source="fuzz"), (RecipeError,), check, Recipe,
                  mutants=4 * MUTANTS)  # loading a recipe is cheap; it has few float fields to hit
    assert counts["refused"] > MUTANTS // 2 and counts["accepted"] > 10, counts


# -- policies -------------------------------------------------------------------------------------------------------
def test_policy_fuzz():
    bases = [tomllib.loads(p.read_text()) for p in sorted(POLICIES.glob("*.toml"))]

    def check(policy, doc):
        dumped = policy.model_dump()
        assert non_finite_or_bool_numbers(dumped) == [], (doc, dumped)
        assert parse_policy(dumped) == policy

    counts = fuzz(19, bases, lambda doc: parse_policy(doc, "fuzz.toml"), (PolicyError,), check, Policy,
                  mutants=4 * MUTANTS)
    assert counts["refused"] > MUTANTS // 2 and counts["accepted"] > 10, counts


# -- import manifests -----------------------------------------------------------------------------------------------
def test_import_manifest_fuzz(tmp_path):
    good = {"side": "baseline", "file": "clips/a.mp4", "prompt_id": "p1", "seed": 3, "prompt": "a cat",
            "generation_side_latency_s": 80.5, "request_to_file_latency_s": 81.0, "peak_memory_mb": 1024}
    path = tmp_path / "m.jsonl"

    def load(doc):
        # JSON as another stack writes it: NaN and Infinity are tokens json.dumps emits and json.loads reads.
        path.write_text(json.dumps(doc) + "\n")
        clips, _declarations = read_manifest(path, {"baseline", "turbo"})  # a clip line declares nothing
        return clips

    def check(clips, doc):
        (clip,) = clips
        assert type(clip.seed) is int and 0 <= clip.seed < 2**63, doc
        assert all(type(v) in (int, float) and math.isfinite(v) and v > 0 for v in clip.timings.values()), doc
        line = ManifestLine.model_validate(doc)
        assert ManifestLine.model_validate(line.model_dump()) == line

    counts = fuzz(2026, [good, {k: good[k] for k in ("side", "file", "prompt_id", "seed")}], load, (RunError,),
                  check, ManifestLine)
    assert counts["refused"] > MUTANTS // 2 and counts["accepted"] > 10, counts


# -- run manifests (run.json) ---------------------------------------------------------------------------------------
def test_run_manifest_fuzz(tmp_path):
    from h3eval.synth import make_synthetic_run

    store = make_synthetic_run(tmp_path / "run", candidates=["fast"], prompt_ids=["a", "b"], seeds=[0, 1])
    base = json.loads(store.manifest_path.read_text())
    base["errors"] = [{"recipe": "fast", "prompt_id": "a", "seed": 0, "error": "x", "at": "now"}]
    probe = RunStore(tmp_path / "probe")
    probe.root.mkdir()

    def load(doc):
        probe.manifest_path.write_text(json.dumps(doc))
        return probe.read_manifest()

    def check(manifest, doc):
        dumped = manifest.model_dump(mode="json")
        assert non_finite_or_bool_numbers({k: v for k, v in dumped.items() if k not in ("extra", "args")}) == []
        assert all(type(s) is int for s in manifest.seeds)
        assert RunManifest.model_validate(dumped) == manifest

    counts = fuzz(63, [base], load, (StoreError,), check, RunManifest)
    assert counts["refused"] > MUTANTS // 3 and counts["accepted"] > 10, counts
