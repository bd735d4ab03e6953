"""``python -m h3.train STAGE --out DIR``: train the tiny MiniMax-H3 on the procedural world (see h3.train.run).

    python -m h3.train all --out runs/tiny-train                 # everything, on the first CUDA device
    python -m h3.train all --out /tmp/t --smoke --device cpu     # a few steps of everything (a dry run)
    python -m h3.train dit --out runs/tiny-train --max-seconds 500   # one resumable slice of one stage
    python -m h3.train plot --out runs/tiny-train               # the loss plot of an exported record
    python -m h3.train pack --out runs/tiny-train --to state.pack    # the state for the next device call
    python -m h3.train unpack --out /tmp/run --from state.pack --continue video-vae   # ... and its resume
    python -m h3.train unpack --out /tmp/run --from h3/assets/tiny --continue dit    # continue the shipped checkpoint
    python -m h3.train unpack --out /tmp/run --from h3/assets/tiny --continue dit:30000 --grow-dit num_layers=8
                                    # ... its DiT grown to 8 blocks that compute its function (then --set dit_num_layers=8)

pack / unpack (h3.train.travel): the stage states in a file small enough to travel with a device call, optimizer
moments in bfloat16 by default; ``--continue STAGE[:STEPS]`` re-opens a stage that a budget ended and removes what
depends on it. A bad pack or folder exits 3.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shlex
import sys
from pathlib import Path


def _parse_set(values: list[str], cfg):
    fields = {f.name: f for f in dataclasses.fields(cfg)}
    for item in values:
        key, _, raw = item.partition("=")
        if key not in fields:
            raise SystemExit(f"--set {item}: unknown key {key!r}; known: {', '.join(sorted(fields))}")
        current = getattr(cfg, key)
        value = json.loads(raw) if not isinstance(current, str) else raw
        if isinstance(current, tuple):
            value = tuple(value)
        setattr(cfg, key, value)
    return cfg


def _travel(args) -> int:
    from h3.train.travel import PackError, pack_state, seed_from_checkpoint, unpack_state

    try:
        if args.stage == "pack":
            if args.to is None:
                raise PackError("pack needs --to FILE")
            manifest = pack_state(args.out / "state", args.to, args.moments)
        else:
            if args.source is None:
                raise PackError("unpack needs --from FILE")
            stages = list(filter(None, args.continue_stages.split(",")))
            if args.source.is_dir():  # an exported checkpoint (h3/assets/tiny): weights and step counts, no moments
                manifest = seed_from_checkpoint(args.source, args.out / "state", stages,
                                                list(filter(None, args.fresh.split(","))), args.grow_dit)
            else:
                if args.fresh or args.grow_dit:
                    raise PackError(f"{'--fresh' if args.fresh else '--grow-dit'} needs --from CHECKPOINT_DIR (a "
                                    "state pack holds what it holds)")
                manifest = unpack_state(args.source, args.out / "state", stages)
    except PackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    if "checkpoint" in manifest:
        for stage, info in manifest["stages"].items():
            print(f"{stage}: step {info['step']}/{info['total_steps']} (planned {info['planned_steps']}), seeded from "
                  f"{manifest['checkpoint']} (no optimizer moments)")
        if "grown" in manifest:
            grown = manifest["grown"]
            print(f"dit: grown {grown['from']['num_layers']} -> {grown['to']['num_layers']} blocks (new "
                  f"{', '.join(map(str, grown['new_blocks']))}, init {grown['init']}, {' and '.join(grown['zeroed'])} "
                  f"zero: the checkpoint's function); train it with --set dit_num_layers={grown['to']['num_layers']}")
        if manifest["dropped"]:
            print("dropped (they depend on a continued stage): " + ", ".join(manifest["dropped"]))
        return 0
    for stage, info in manifest["stages"].items():
        print(f"{stage}: step {info['step']}/{info['total_steps']} (planned {info['planned_steps']}), moments "
              f"{info['moments']}, {info['bytes'] / 1e6:.2f} MB packed ({info['raw_bytes'] / 1e6:.2f} MB state.pt)")
    if args.stage == "pack":
        print(f"{args.to}: {args.to.stat().st_size / 1e6:.2f} MB")
    elif manifest["dropped"]:
        print("dropped (they depend on a continued stage): " + ", ".join(manifest["dropped"]))
    return 0


def main(argv: list[str] | None = None) -> int:
    from h3.train.common import TrainConfig
    from h3.train.run import STAGES, run

    parser = argparse.ArgumentParser(prog="python -m h3.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=("all", "plot", "pack", "unpack") + STAGES)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--device")
    parser.add_argument("--smoke", action="store_true", help="a few steps of everything at tiny batch sizes")
    parser.add_argument("--config", type=Path, help="a config.json written by an earlier slice")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a TrainConfig field")
    parser.add_argument("--max-seconds", type=float)
    parser.add_argument("--deadline", type=float, help="end at this time.time() value (what torchrun ranks get)")
    parser.add_argument("--stage-seconds", default="", help="per-stage budgets, e.g. dit=300,distill=90")
    parser.add_argument("--stop-after", type=int, help="end each training stage's slice after N steps")
    parser.add_argument("--finish-on-budget", action="store_true")
    parser.add_argument("--beside", action="store_true", help=argparse.SUPPRESS)  # a stage an `all` run started
    parser.add_argument("--code-commit", default="")
    parser.add_argument("--to", type=Path, help="pack: the pack file to write")
    parser.add_argument("--from", dest="source", type=Path,
                        help="unpack: the pack file to read, or an exported checkpoint folder (h3/assets/tiny) to seed "
                             "the video VAE, video decoder, audio VAE and DiT states from")
    parser.add_argument("--moments", default="bf16", help="pack: bf16 (default), fp32 or drop (finished stages), then any STAGE=MODE, e.g. "
                             "bf16,video_vae=drop")
    parser.add_argument("--fresh", default="", metavar="dit",
                        help="unpack --from CHECKPOINT_DIR: leave the DiT unseeded, so that the next run trains one "
                             "from its initial weights on the checkpoint's VAEs (e.g. wider: "
                             "--set dit_hidden_size=...)")
    parser.add_argument("--grow-dit", default="", metavar="num_layers=N[,init=copy|fresh]",
                        help="unpack --from CHECKPOINT_DIR --continue dit[:STEPS]: seed the DiT as the checkpoint's "
                             "grown to N blocks, the new ones zero in their output projections, so that it computes "
                             "the checkpoint's function at the start (h3.train.grow); train it with "
                             "--set dit_num_layers=N")
    parser.add_argument("--continue", dest="continue_stages", default="", metavar="STAGE[:STEPS],...",
                        help="unpack: re-open these budget-ended stages (video-vae, audio-vae, video-decoder, "
                             "audio-decoder, dit, distill)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout)

    if args.stage in ("pack", "unpack"):
        return _travel(args)

    if args.stage == "plot":
        from h3.train.export import PLOT_NAME, RECORD_NAME, plot_record

        root = args.out / "tiny" if (args.out / "tiny").is_dir() else args.out
        record = json.loads((root / RECORD_NAME).read_text())
        plot_record(record, root / PLOT_NAME)
        print(root / PLOT_NAME)
        return 0
    if args.config:
        saved = json.loads(args.config.read_text())
        cfg = TrainConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in saved["config"].items()})
        command, commit = saved.get("command", ""), saved.get("code_commit", "")
    else:
        cfg = TrainConfig.smoke() if args.smoke else TrainConfig()
        command, commit = "python -m h3.train " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])), \
            args.code_commit
    if args.seed is not None:
        cfg.seed = args.seed
    if args.device:
        cfg.device = args.device
    cfg = _parse_set(args.set, cfg)
    if cfg.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device here: pass --device cpu (with --smoke for a dry run)")
    stage_seconds = {}
    for item in filter(None, args.stage_seconds.split(",")):
        key, _, value = item.partition("=")
        stage_seconds[key] = float(value)
    return run(args.stage, cfg, args.out, max_seconds=args.max_seconds, stage_seconds=stage_seconds,
               stop_after=args.stop_after, finish_on_budget=args.finish_on_budget, command=command,
               code_commit=commit or args.code_commit, deadline=args.deadline, beside=args.beside)


if __name__ == "__main__":
    sys.exit(main())
