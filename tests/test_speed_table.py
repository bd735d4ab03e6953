"""The H200 speed table (bench/h200_recipes_table.py): every target met or missed from the measured figures.

The figures are planted in a results folder, each one just inside or just outside its target, and the projected
request is checked against the anatomy summed here from the stock run's own numbers.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.h200_recipes_speed import NOT_A_FORWARD, SAME_FORWARD, expand_variants, shipped_variants
from bench.h200_recipes_table import RESULTS, not_as_configured, render
from h3.recipe import known_recipes

ROOT = Path(__file__).resolve().parent.parent


def _row(forward: float, dense: float | None = None, sparsity: float | None = None) -> dict:
    """A run that ran as configured: native attention, no quantization, no compile; block-sparse with its dense first
    step and 128-row buckets when a sparsity is given."""
    telemetry = {} if sparsity is None else {
        "sparse_attention": {"applied": True, "target_sparsity": sparsity, "realized_sparsity": sparsity - 0.004,
                             "dense_calls": 50, "sparse_calls": 150},
        "bucketing": {"applied": True, "multiple": 128}}
    return {"forward_s": forward, "dense_forward_s": dense or forward, "first_call_s": 9.0, "peak_memory_GiB": 40.0,
            "dense_equivalent_tflops": 500.0, "dispatched": ["native"], "telemetry": telemetry,
            "configured": {"quant": "none", "attention": "native", "sparse_attention": sparsity,
                           "dense_steps": None if sparsity is None else 1,
                           "bucketing": None if sparsity is None else 128, "compile": False},
            "set_aside": {"lora": True}}


def _shipped_row(forward: float, recipe: str) -> dict:
    """A run of a shipped recipe as it is configured now, that ran as configured (FP8, Sage, compile, buckets)."""
    from bench.h200_recipes_speed import configured_of, variant_recipe

    conf = configured_of(variant_recipe(recipe)[0])
    assert conf["quant"] == "fp8_w8a8" and conf["compile"] and conf["sparse_attention"] is None
    telemetry = {"quant": {"applied": True, "mode": "fp8_w8a8", "quantized_modules": 363},
                 "compile": {"applied": True, "compiled_regions": 50, "graphs_compiled_total": 4,
                             "recompiles_total": 0},
                 "bucketing": {"applied": True, "multiple": conf["bucketing"]}}
    return {**_row(forward), "configured": conf, "dispatched": [conf["attention"]], "telemetry": telemetry}


def _target(md: str, starts: str) -> str:
    hits = [line for line in md.splitlines() if line.startswith("| " + starts)]
    assert len(hits) == 1, (starts, hits)
    return hits[0]


@pytest.fixture()
def planted(tmp_path: Path) -> Path:
    shutil.copy(RESULTS / "h200_speed_stock.json", tmp_path)
    head = {"command": "planted", "date": "2026-11-30", "device": "planted", "torch": "x", "cuda": "x",
            "diffusers": "0.42.1"}
    (tmp_path / "h200_recipes_768.json").write_text(json.dumps({**head, "shapes": {"5s-768x1344": {"variants": {
        "stock": _row(6.0),
        "turbo4-fp8-sage-compile": _shipped_row(3.29, "turbo4-fp8-sage-compile"),  # dense target 3.3 s: met
        "turbo4-sparse+sparse85+fp8+compile": _row(1.61, 5.0, 0.85),  # sparse target 1.6 s: missed
        # fastest of all, but Sage was configured and native SDPA ran: shown, flagged, counted for no target
        "turbo4-fp8-sage+compile": {**_row(2.0), "configured": {**_row(2.0)["configured"], "attention": "sage"}},
    }}}}))
    sparse15 = {**_row(10.0, 30.0, 0.85), "set_aside": {"lora": True, "vae_tiles": {"768x1344": [304, 320]}}}
    (tmp_path / "h200_recipes_15s.json").write_text(json.dumps({**head, "shapes": {"15s-768x1344": {"variants": {
        "turbo4-sparse+sparse85+fp8+compile": sparse15}}}}))
    # a file and variant named like a superseded row of the record: in another folder it counts
    sparse544 = {**_row(2.0, 2.2, 0.5), "configured": {**_row(2.0, 2.2, 0.5)["configured"], "compile": True},
                 "telemetry": {**_row(2.0, 2.2, 0.5)["telemetry"], "compile": {
                     "compiled_regions": 50, "graphs_compiled_total": 4, "recompiles_total": 0}}}
    (tmp_path / "h200_recipes_544.json").write_text(json.dumps({**head, "shapes": {"5s-544x960": {"variants": {
        "turbo4-fp8-sage-compile": _shipped_row(0.3, "turbo4-fp8-sage-compile"),
        "turbo4-sparse+compile": sparse544}}}}))
    variants = {"fast": {"repeated_p50_s": 6.0, "mixed_p50_s": 6.17, "mixed_over_repeated_p50": 6.17 / 6.0,
                         "mixed": [{"graphs_compiled": 0, "flex_graphs_compiled": 0}]},
                "slow": {"repeated_p50_s": 6.0, "mixed_p50_s": 6.2, "mixed_over_repeated_p50": 6.2 / 6.0,
                         "mixed": [{"graphs_compiled": 4}]}}
    (tmp_path / "h200_protocol.json").write_text(json.dumps({**head, "shape": "5s-544x960", "variants": variants}))
    (tmp_path / "h200_offload.json").write_text(json.dumps({
        **head, "recipe": "offload-int8-adaln", "shape": "5s-544x960", "pinned_h2d_GBps": 50.0,
        "achieved_stream_GBps": 44.5, "fraction_of_pinned_ceiling": 0.89, "production": {"hidden_fraction": 0.5}}))
    return tmp_path


def test_speed_table_reports_each_target_met_or_missed_from_planted_figures(planted: Path):
    md = render(planted)
    assert "ran as configured" in md and "**6 of 7**" in md
    assert "| **no**: attention ran native, configured sage |" in _target(md, "5s-768x1344 | turbo4-fp8-sage+compile |")
    assert _target(md, "dense optimized forward").endswith("| 3.29 s (`turbo4-fp8-sage-compile`) | **met** |")
    assert "1.61 s" in _target(md, "85 % block-sparse") and _target(md, "85 % block-sparse").endswith("**missed** |")
    assert "(+2.8 %)" in _target(md, "mixed-prompt p50 within 3 % of repeated (`fast`")
    assert _target(md, "mixed-prompt p50 within 3 % of repeated (`fast`").endswith("**met** |")
    fast = _target(md, "mixed-prompt p50 within 3 % of repeated (`fast`")
    assert "graphs compiled per mixed request [0], flex-kernel graphs [0] |" in fast
    assert "(+3.3 %)" in _target(md, "mixed-prompt p50 within 3 % of repeated (`slow`")
    assert "flex-kernel" not in _target(md, "mixed-prompt p50 within 3 % of repeated (`slow`")
    assert _target(md, "mixed-prompt p50 within 3 % of repeated (`slow`").endswith("**missed** |")
    assert "(89 %)" in _target(md, "offload streaming") and _target(md, "offload streaming").endswith("**missed** |")

    # A request: text + its forwards (block-sparse: the dense first step, then sparse ones) + video decode with the
    # recipe's tiles + audio decode + the frames' download at the pinned rate.
    stock = json.loads((planted / "h200_speed_stock.json").read_text())

    def request(shape: str, denoise: float, tiles: str) -> float:
        vae = stock["vae"]["shapes"][shape]
        return (stock["text"]["text_encode_s"] + denoise + vae[f"video_decode_{tiles}_s"] + vae["audio_decode_s"]
                + vae["frames_bytes"] / (stock["ceilings"]["pinned_d2h_GBps"] * 1e9))

    r544 = request("5s-544x960", 4 * 0.3, "256x256")
    line = _target(md, "5 s 544×960 request")
    assert f"| {r544:.1f} s (`turbo4-fp8-sage-compile`" in line
    assert line.endswith("**met** |" if r544 <= 5.2 else "**missed** |")
    r15 = request("15s-768x1344", 30.0 + 3 * 10.0, "304x320")
    line = _target(md, "15 s 768×1344 `turbo4-sparse` request")
    assert f"| {r15:.1f} s (`turbo4-sparse+sparse85+fp8+compile`, projected: denoise 60.0 s" in line
    assert line.endswith("**missed** |")

    # Coverage: measured as shipped, only in a modified form, or not at all, per shape.
    cover = _target(md, "`turbo4-fp8-sage-compile` |")
    assert cover.split(" | ")[1:] == ["as shipped", "as shipped", "**not measured** |"]
    modified = "**not as shipped**; measured as `turbo4-sparse+sparse85+fp8+compile`"
    assert _target(md, "`turbo4-sparse` |").split(" | ")[1:] == [
        "**not as shipped**; measured as `turbo4-sparse+compile`", modified, modified + " |"]
    assert "Superseded" not in md
    assert _target(md, "`turbo4-int8` |").count("**not measured**") == 3
    # A planted folder is not the recorded one: no session notes about figures it does not hold.
    assert "What these runs found" not in md


def test_speed_table_refuses_a_folder_without_the_stock_run(tmp_path: Path):
    (tmp_path / "h200_recipes_768.json").write_text("{}")
    proc = subprocess.run([sys.executable, "bench/h200_recipes_table.py", "--results", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode != 0 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"h200_recipes_table: {tmp_path / 'h200_speed_stock.json'} is missing: the ceilings, VAE decode and text "
        "encoding come from `python bench/h200_speed.py --out` that file"]


def test_shipped_variants_are_every_recipe_with_a_forward_of_its_own():
    recipes = set(known_recipes())
    # The exceptions name real recipes (a renamed recipe would silently leave the table otherwise).
    assert set(SAME_FORWARD) <= recipes and set(NOT_A_FORWARD) <= recipes
    shipped = shipped_variants()
    assert shipped[0] == "stock"
    assert set(shipped[1:]) | set(SAME_FORWARD) | set(NOT_A_FORWARD) == recipes
    assert not set(shipped[1:]) & (set(SAME_FORWARD) | set(NOT_A_FORWARD))
    # "shipped" expands in place; a variant named twice runs once, at its first place.
    assert expand_variants("turbo4+compile,shipped,stock,,turbo4+compile") == ["turbo4+compile", *shipped]


_SAGE_FP8_COMPILED = {
    "dispatched": ["sage"],
    "configured": {"quant": "fp8_w8a8", "attention": "sage", "sparse_attention": None, "dense_steps": None,
                   "bucketing": 128, "compile": True},
    "telemetry": {"quant": {"applied": True, "mode": "fp8_w8a8", "quantized_modules": 363},
                  "compile": {"compiled_regions": 50}, "bucketing": {"multiple": 128}}}


@pytest.mark.parametrize("change, expected", [
    ({}, []),
    ({"dispatched": ["sage", "native"]}, ["attention ran sage, native, configured sage"]),
    ({"telemetry.quant": {"applied": True, "mode": "int8_w8a8", "quantized_modules": 363}},
     ["quant int8_w8a8 on 363 modules, configured fp8_w8a8"]),
    ({"telemetry.quant": {"applied": True, "mode": "fp8_w8a8", "quantized_modules": 0}},
     ["quant fp8_w8a8 on 0 modules, configured fp8_w8a8"]),
    ({"telemetry.compile": {"compiled_regions": 0}}, ["0 compiled regions, compile configured on"]),
    ({"telemetry.bucketing": {}}, ["buckets of None rows, configured 128"]),
    ({"telemetry.sparse_attention": {"applied": True, "target_sparsity": 0.5, "realized_sparsity": 0.5}},
     ["block-sparse attention applied, configured off"]),
])
def test_a_run_is_checked_against_its_recipe(change: dict, expected: list[str]):
    row = json.loads(json.dumps(_SAGE_FP8_COMPILED))
    for key, value in change.items():
        *path, last = key.split(".")
        target = row
        for part in path:
            target = target[part]
        target[last] = value
    assert not_as_configured(row) == expected


def test_a_sparse_run_is_checked_for_its_realized_sparsity_and_dense_step():
    row = _row(2.5, 5.0, 0.85)
    assert not_as_configured(row) == []
    row["telemetry"]["sparse_attention"].update(realized_sparsity=0.80, dense_calls=0)
    assert not_as_configured(row) == ["sparsity 0.8 realized, configured 0.85", "no dense step, configured 1"]


def test_coverage_does_not_count_a_recipes_earlier_form_as_shipped():
    """Issue 23 switched compile on in turbo4-int8: its eager run (recorded with compile off) is no longer the recipe
    as shipped, and the coverage says what changed; a run recording what the recipe configures now still counts."""
    from bench.h200_recipes_speed import configured_of, variant_recipe
    from bench.h200_recipes_table import coverage

    now = configured_of(variant_recipe("turbo4-int8")[0])
    assert now["compile"] and now["quant"] == "int8_w8a8"
    eager = {**_row(3.43), "configured": {**now, "compile": False, "bucketing": None}}
    results = [("a.json", {"shapes": {"5s-544x960": {"variants": {"turbo4-int8": eager}},
                                      "5s-768x1344": {"variants": {"turbo4-int8": {**_row(5.6), "configured": now}}}}})]
    cells = next(line for line in coverage(results) if line.startswith("| `turbo4-int8` |")).split(" | ")[1:]
    assert cells == ["**not as shipped**; measured as `turbo4-int8` (before the recipe changed: bucketing None then, "
                     "128 now; compile False then, True now)", "as shipped", "**not measured** |"]
