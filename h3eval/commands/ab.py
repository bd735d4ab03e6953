"""`h3eval ab`: baseline versus candidates over prompts × seeds, with speed summary and the executed checks."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from h3eval.ab import run_ab_from_args as run_ab_command
from h3eval.commands._common import fail, handle_errors, setup_logging


def register(app: typer.Typer) -> None:
    @app.command("ab")
    @handle_errors
    def ab(
        baseline: str = typer.Option(..., "--baseline", envvar="H3EVAL_BASELINE", help="Baseline recipe."),
        candidate: List[str] = typer.Option([], "--candidate", help="Candidate recipe (repeatable)."),
        prompts: str = typer.Option(..., "--prompts", envvar="H3EVAL_PROMPTS", help="Prompt suite name or JSONL."),
        out: Path = typer.Option(..., "--out", envvar="H3EVAL_OUT", help="Run directory (created or resumed)."),
        model: str = typer.Option(
            "tiny", "--model", envvar="H3EVAL_MODEL",
            help="'tiny' (the trained tiny preset; also 'tiny-trained'), 'tiny-random' (the tiny preset with random "
                 "weights), 'h3-random' (released size, random weights), 'h3-random-small' or a checkpoint dir."),
        seeds: str = typer.Option("0", "--seeds", envvar="H3EVAL_SEEDS", help="Seeds, e.g. 0,1 or 0-3."),
        backend: str = typer.Option("inprocess", "--backend", envvar="H3EVAL_BACKEND", help="inprocess or http."),
        url: List[str] = typer.Option([], "--url", help="Server URL, or RECIPE=URL (repeatable; http backend)."),
        api_key: Optional[str] = typer.Option(None, "--api-key", envvar="H3EVAL_API_KEY"),
        warmup: int = typer.Option(1, "--warmup", envvar="H3EVAL_WARMUP", help="Warm-up requests per recipe."),
        warmup_recipe: List[str] = typer.Option(
            [], "--warmup-recipe",
            help="Warm up only this recipe (repeatable; default every recipe): e.g. the compiled candidate, when "
                 "the baseline's warm-up would cost minutes at full size and warm nothing."),
        baseline_last: bool = typer.Option(
            False, "--baseline-last",
            help="Within each (prompt, seed) run the candidates first and the baseline last (a time-boxed call "
                 "whose baseline request takes minutes)."),
        by_recipe: bool = typer.Option(
            False, "--by-recipe",
            help="Every request of a recipe before the next recipe's, the last applied for good (inprocess): lets "
                 "an FP8 candidate follow a bf16 baseline of the 33 B model on an 80 GB card."),
        speed_protocol: str = typer.Option("mixed", "--speed-protocol", help="mixed, repeated or both."),
        speed_rounds: int = typer.Option(2, "--speed-rounds", help="Cycles of the prompt suite per protocol."),
        gpu_hourly_rate: Optional[float] = typer.Option(None, "--gpu-hourly-rate", help="USD per GPU-hour."),
        off_identity: bool = typer.Option(False, "--off-identity", help="Add <baseline>-identity as a candidate."),
        trajectory: bool = typer.Option(False, "--trajectory", help="Record quality clips' latent trajectories."),
        seconds: Optional[float] = typer.Option(None, "--seconds"),
        num_frames: Optional[int] = typer.Option(None, "--num-frames"),
        height: Optional[int] = typer.Option(None, "--height"),
        width: Optional[int] = typer.Option(None, "--width"),
        timeout_s: float = typer.Option(1800.0, "--timeout", help="Per-request timeout of the http backend (s)."),
        device: Optional[str] = typer.Option(None, "--device", envvar="H3EVAL_DEVICE"),
        share_model: bool = typer.Option(
            True, "--share-model/--no-share-model",
            help="inprocess: every recipe takes turns on one loaded model (levers applied and removed between "
                 "requests); --no-share-model loads one runtime per recipe."),
        text_encoder: str = typer.Option(
            "resident", "--text-encoder", envvar="H3EVAL_TEXT_ENCODER",
            help="inprocess: 'resident' on the device, 'offload' (streamed from host memory while it encodes) or "
                 "'fit' (streamed, keeping on the device the layers that fit beside each request's peak)."),
        time_box: Optional[float] = typer.Option(
            None, "--time-box",
            help="Seconds after which no request starts (nor one its recipe's last request says would end later); "
                 "the rest are recorded as not run, the run is partial, a rerun resumes it."),
        sequential: bool = typer.Option(
            False, "--sequential",
            help="Generate in rounds (looks of 4, 8, 16, 32 pairs up to --max-pairs), gate and judge after each, and "
                 "stop each candidate whose verdict is decided (h3eval/sequential.py); exits with the verdict's code."),
        max_pairs: int = typer.Option(32, "--max-pairs", help="--sequential: pairs of the last look."),
        design: str = typer.Option("obrien-fleming", "--design", help="--sequential: obrien-fleming or pocock."),
        policy: str = typer.Option("release", "--policy", help="--sequential: the policy each look is judged by."),
        floor: Optional[Path] = typer.Option(None, "--floor", help="--sequential: the noise-floor file."),
        verbose: bool = typer.Option(False, "--verbose", "-v"),
    ) -> None:
        """Generate every (recipe, prompt, seed) clip into one run and write speed.json; a rerun resumes."""
        setup_logging(verbose)
        args = dict(
            baseline=baseline, candidates=candidate, prompts=prompts, out=out, model=model, seeds=seeds,
            backend=backend, urls=url, api_key=api_key, warmup=warmup, warmup_recipes=warmup_recipe or None,
            baseline_last=baseline_last, by_recipe=by_recipe, speed_protocol=speed_protocol, speed_rounds=speed_rounds,
            gpu_hourly_rate=gpu_hourly_rate, off_identity=off_identity, trajectory=trajectory, seconds=seconds,
            num_frames=num_frames, height=height, width=width, timeout_s=timeout_s, device=device,
            share_model=share_model, text_encoder=text_encoder, time_box_s=time_box)
        if sequential:  # issue 53
            raise typer.Exit(_sequential(args, max_pairs=max_pairs, design=design, policy=policy, floor=floor))
        _summary(out, run_ab_command(**args))


def _sequential(args: dict, **design) -> int:
    """``--sequential``: rounds judged after each look (h3eval.sequential); bad input is one line and exit 3."""
    from h3eval.sequential import SequentialError, sequential_command

    try:
        return sequential_command(echo=typer.echo, **design, **args)
    except SequentialError as exc:
        raise fail(str(exc)) from None


def _summary(out: Path, result) -> None:
    """The closing lines: status, configured-versus-executed, off-identity, errors, the next command."""
    from h3eval.executed import executed_summary_line
    from h3eval.store import RunStore

    manifest = result.manifest
    typer.echo(f"{out}: {manifest.status}; speed summary in {out / 'speed.md'}")
    for name, problems in result.executed_mismatches.items():
        typer.echo(f"  {name}: configured-versus-executed mismatch: {'; '.join(problems)}", err=True)
    for name, check in result.off_identity.items():
        if not check["passed"]:
            typer.echo(f"  {name}: off-identity FAILED ({len(check['differing'])} differing, "
                       f"{len(check['missing'])} missing of {check['pairs']}; {check['compared']})", err=True)
        else:
            typer.echo(f"  {name}: off-identity: {check['identical']} of {check['pairs']} pairs byte-identical "
                       f"({check['compared']})")
        if check["not_comparable"]:
            typer.echo(f"  {name}: {len(check['not_comparable'])} pair(s) not comparable byte for byte: "
                       f"{check['not_comparable'][0]['why']}", err=True)
    for err in manifest.errors:
        typer.echo(f"  {err.error}", err=True)
    typer.echo(f"  {executed_summary_line(RunStore(out), manifest)}")
    typer.echo(f"next: h3eval gate {out} --policy release" if manifest.status == "complete" else
               f"next: rerun this command to resume {out}, then h3eval gate {out} --policy release")
    if manifest.status != "complete":
        raise typer.Exit(1)
