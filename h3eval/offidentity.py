"""The off-identity check of ``h3eval ab``: a candidate whose computation is the baseline's (every lever as the
baseline's, :func:`levers_of`) must reproduce the baseline's frames and PCM byte for byte (:func:`off_identity`);
``--off-identity`` adds such a candidate (:func:`identity_recipe`)."""

from __future__ import annotations

from typing import Any

from h3.recipe import NOT_COMPUTATION, Recipe, recipe_from_dict
from h3eval.store import RunStore


def levers_of(recipe: Recipe) -> dict[str, Any]:
    """What the recipe computes: everything but its name, description and how it is signed off
    (:data:`h3.recipe.NOT_COMPUTATION`), so that a candidate with the baseline's computation gets the off-identity
    check whatever signoff kind it declares."""
    return {k: v for k, v in recipe.resolved().items() if k not in ("name", "description", *NOT_COMPUTATION)}


def identity_recipe(baseline: Recipe) -> Recipe:
    """The baseline with every lever as it is (none added): must reproduce the baseline byte for byte."""
    data = baseline.resolved()
    data.update(name=f"{baseline.name}-identity", description=f"off-identity check of {baseline.name}")
    return recipe_from_dict(data, source="off-identity")


def off_identity(store: RunStore, baseline: str, candidate: str, prompt_ids: list[str],
                 seeds: list[int]) -> dict[str, Any]:
    """Compare frames and PCM hashes of every quality pair; pass only when every pair exists and matches.

    Byte identity is promised on one platform (h3/determinism.py): a pair whose two clips were made on different
    platforms (CPU model, vector capability, MKL reproducibility mode, threads, torch or GPU), or on a CPU whose MKL
    ran without reproducibility, cannot fail the check by differing; it is listed under ``not_comparable`` with the
    platform keys that differ, and counted in neither ``identical`` nor ``differing``.
    """
    from h3.determinism import byte_identity_promised, platform_difference

    identical, differing, missing, not_comparable = 0, [], [], []
    platforms: dict[str, Any] = {}
    for pid in prompt_ids:
        for seed in seeds:
            a, b = store.read_record(baseline, pid, seed), store.read_record(candidate, pid, seed)
            if a is None or b is None:
                missing.append(f"{pid}-s{seed}")
                continue
            na, nb = (a.hardware or {}).get("numerics"), (b.hardware or {}).get("numerics")
            platforms.setdefault(baseline, na)
            platforms.setdefault(candidate, nb)
            same_bytes = a.frames_sha256 == b.frames_sha256 and a.pcm_sha256 == b.pcm_sha256
            if (a.extra or {}).get("hash_source", "raw") != (b.extra or {}).get("hash_source", "raw"):
                differing.append({"pair": f"{pid}-s{seed}", "why": "hashes of different sources (raw vs decoded)"})
            elif same_bytes:
                identical += 1
            elif platform_difference(na, nb) or not (byte_identity_promised(na) and byte_identity_promised(nb)):
                keys = platform_difference(na, nb)
                not_comparable.append({
                    "pair": f"{pid}-s{seed}",
                    "why": (f"made on different platforms (differ in {', '.join(keys)})" if keys
                            else "made on a CPU whose MKL ran without reproducibility (MKL_CBWR)"),
                })
            else:
                differing.append({"pair": f"{pid}-s{seed}", "frames_equal": a.frames_sha256 == b.frames_sha256,
                                  "pcm_equal": a.pcm_sha256 == b.pcm_sha256})
    return {"candidate": candidate, "pairs": len(prompt_ids) * len(seeds), "identical": identical,
            "differing": differing, "missing": missing, "not_comparable": not_comparable,
            "compared": "sha256 of the raw frames (uint8) and PCM (int16) of every quality pair",
            "platforms": platforms, "passed": not differing and not missing}
