"""Clip-by-clip comparison of two content-check records on the same captions and seeds (issue 55): for each content
property, how many clips only the model gets right, how many only the reference, and the exact McNemar p-value on
those discordant clips (h3eval.stats.mcnemar_exact); Holm-adjusted over every (model, property) compared.

    python bench/tiny_wider_dit/paired.py --ref results/s33_shipped_heldout24.json \
        --model results/s33_g8s32_heldout24.json --model results/s33_g8s33_heldout24.json --name s33_paired

Records: the JSON content_check.py writes (row ``baseline`` unless --row). Clips are matched on (prompt_id, seed);
a property a clip has no value for (sync on a caption without an event) is left out of that property. The records
must hold the same clips (else exit 3). Writes results/NAME.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

PROPERTIES = ("colour", "shape", "direction", "pitch", "bounces", "sync")


def clips(path: Path, row: str) -> dict[tuple[str, int], dict]:
    data = json.loads(path.read_text())
    try:
        found = data["rows"][row]["clips"]
    except (KeyError, TypeError):
        raise ValueError(f"{path}: no row {row!r} with clips") from None
    return {(c["prompt_id"], int(c["seed"])): c for c in found}


def compare(ref: dict, model: dict) -> dict[str, dict]:
    """Per property: the model's and the reference's right counts over the clips both score, and McNemar."""
    from h3eval import stats as S

    if set(ref) != set(model):
        raise ValueError(f"the records hold other clips ({len(set(ref) ^ set(model))} differ)")
    out = {}
    for prop in PROPERTIES:
        keys = sorted(k for k in ref if ref[k].get(prop) is not None and model[k].get(prop) is not None)
        deltas = [int(bool(model[k][prop])) - int(bool(ref[k][prop])) for k in keys]
        m = S.mcnemar_exact(deltas) if keys else None
        out[prop] = {"clips": len(keys), "model_right": sum(bool(model[k][prop]) for k in keys),
                     "ref_right": sum(bool(ref[k][prop]) for k in keys),
                     "model_only": m.improved if m else 0, "ref_only": m.regressed if m else 0,
                     "p": m.pvalue if m else 1.0}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", type=Path, required=True)
    ap.add_argument("--model", type=Path, action="append", required=True)
    ap.add_argument("--row", default="baseline")
    ap.add_argument("--name", required=True)
    args = ap.parse_args(argv)
    from bench.lib import results as _results
    from h3eval.stats import holm

    try:
        ref = clips(args.ref, args.row)
        table = {str(p): compare(ref, clips(p, args.row)) for p in args.model}
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    flat = [(m, prop) for m in table for prop in PROPERTIES]
    adjusted = holm([table[m][prop]["p"] for m, prop in flat])
    for (m, prop), q in zip(flat, adjusted):
        table[m][prop]["p_holm"] = q
    lines = [f"Reference `{args.ref.name}`, row `{args.row}`; exact McNemar on the clips only one side gets right, "
             f"Holm over the {len(flat)} comparisons.\n", "| model | property | clips | model right | reference right "
             "| only the model | only the reference | p | p (Holm) |", "|---|---|---|---|---|---|---|---|---|"]
    for m, props in table.items():
        for prop, r in props.items():
            lines.append(f"| `{Path(m).name}` | {prop} | {r['clips']} | {r['model_right']} | {r['ref_right']} | "
                         f"{r['model_only']} | {r['ref_only']} | {r['p']:.3g} | {r['p_holm']:.3g} |")
    paths = _results.write(args.name, {"ref": str(args.ref), "row": args.row, "models": table}, "\n".join(lines))
    print("\n".join(lines))
    print("wrote", *paths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
