"""The `h3` command line: the runtime on its own (generate one clip; serve the videos API)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import List, Optional

import typer
from typer.core import TyperGroup

try:  # typer 0.29 carries its own copy of click; its usage errors are that copy's classes
    from typer._click.exceptions import NoArgsIsHelpError, UsageError
except ImportError:  # pragma: no cover - older typer on the click package
    from click.exceptions import NoArgsIsHelpError, UsageError

EXIT_BAD_INPUT = 3


def bad_input(message: str) -> typer.Exit:
    """One line on stderr and exit 3: the documented answer to bad input."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(EXIT_BAD_INPUT)


class OneLineUsageErrors(TyperGroup):
    """Click answers a bad option value (``--seed abc``) with a boxed usage message and exit 2; here it is one line
    and exit 3, like every other bad input (the `h3eval` app uses it too)."""

    def _convert(self, exc: UsageError) -> typer.Exit:
        if isinstance(exc, NoArgsIsHelpError):  # `h3` alone: the help text, as before
            raise exc
        return bad_input(" ".join(exc.format_message().split()))

    def make_context(self, *args, **kwargs):
        try:
            return super().make_context(*args, **kwargs)
        except UsageError as exc:
            raise self._convert(exc) from None

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except UsageError as exc:
            raise self._convert(exc) from None


app = typer.Typer(name="h3", help="The optimized MiniMax-H3 runtime.", no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False, cls=OneLineUsageErrors)


@app.callback()
def _root() -> None:
    """The optimized MiniMax-H3 runtime (diffusers' MiniMax-H3 classes)."""


@app.command("generate")
def generate(
    prompt: Optional[str] = typer.Option(None, "--prompt", help="Prompt text (or --prompts-file)."),
    out: Path = typer.Option(..., "--out", help="Output .mp4 (the record goes to the same name with .json); with "
                                                "--prompts-file, a folder."),
    seed: int = typer.Option(0, "--seed", help="Seed (with --prompts-file: of the first prompt without its own seed; "
                                               "the next gets seed+1, ...)."),
    prompts_file: Optional[Path] = typer.Option(
        None, "--prompts-file",
        help="Run every prompt of this file (JSON Lines with \"prompt\" and optional \"id\", \"seed\"; or one "
             "prompt a line) in this one process: the model loads once, every request after a recipe's first is warm; "
             "clips, records and requests.json (each request's anatomy, each recipe's warm figures) go into --out."),
    repeat: int = typer.Option(1, "--repeat", help="With --prompts-file: run the file's prompts this many times over."),
    text_encoder: str = typer.Option(
        "resident", "--text-encoder", envvar="H3_TEXT_ENCODER",
        help="'resident' on the device, or 'offload': kept in host memory and streamed through the device while it "
             "encodes (a full-size model on one 80 GB GPU needs it; the copy is measured in the text_encode stage), "
             "or 'fit': streamed, keeping on the device the layers that fit beside each request's measured peak."),
    model: str = typer.Option("tiny", "--model", envvar="H3_MODEL",
                              help="'tiny' (the trained tiny preset; also 'tiny-trained'), 'tiny-random' (the tiny "
                                   "preset with random weights), 'h3-random' (released size, random weights), "
                                   "'h3-random-small' or a checkpoint directory."),
    recipe: List[str] = typer.Option(
        ["baseline"], "--recipe", envvar="H3_RECIPE",
        help="Recipe name or TOML path. With --prompts-file it may be repeated: the prompts run under each recipe in "
             "turn on one shared model, the last recipe applied for good."),
    seconds: Optional[float] = typer.Option(None, "--seconds"),
    num_frames: Optional[int] = typer.Option(None, "--num-frames"),
    height: Optional[int] = typer.Option(None, "--height"),
    width: Optional[int] = typer.Option(None, "--width"),
    device: Optional[str] = typer.Option(None, "--device", envvar="H3_DEVICE"),
    nproc: Optional[int] = typer.Option(None, "--nproc", envvar="H3_NPROC",
                                        help="Ranks (GPUs) of the request; starts them with torchrun. Default: the "
                                             "recipe's parallel.degree (1)."),
    first_frame: Optional[Path] = typer.Option(None, "--first-frame",
                                               help="Image the clip starts from (fl2va; diffusers' `image`)."),
    last_frame: Optional[Path] = typer.Option(None, "--last-frame",
                                              help="Image the clip ends on (fl2va; diffusers' `last_image`)."),
    reference: Optional[Path] = typer.Option(None, "--reference",
                                             help="Reference image whose subject the clip keeps (ref2va)."),
) -> None:
    """Generate one clip (MP4, 24 fps, 32 kHz stereo) and its JSON record; with --prompts-file, one per prompt.

    With --first-frame and/or --last-frame the fl2va workflow runs, with --reference ref2va; the record keeps each
    image's sha256."""
    from h3.conditioning import ConditioningError
    from h3.levers import LeverError
    from h3.media import MediaError
    from h3.parallel.world import ParallelError
    from h3.recipe import RecipeError
    from h3.residency import TEXT_ENCODER_RESIDENCY
    from h3.runtime import CheckpointError, RequestError, SharedModelError

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if text_encoder not in TEXT_ENCODER_RESIDENCY:
        raise bad_input(f"--text-encoder must be one of {', '.join(TEXT_ENCODER_RESIDENCY)}, got {text_encoder!r}")
    if (prompt is None) == (prompts_file is None):
        raise bad_input("give --prompt or --prompts-file (one of them)")
    if prompts_file is None and (len(recipe) > 1 or repeat != 1):
        raise bad_input("several --recipe and --repeat need --prompts-file (one process, several requests)")
    if repeat < 1:
        raise bad_input(f"--repeat must be a positive integer, got {repeat}")
    shape = dict(num_frames=num_frames, seconds=seconds, height=height, width=width)
    if prompts_file is not None:
        try:
            if first_frame or last_frame or reference:
                raise RequestError("--prompts-file runs t2va requests; --first-frame, --last-frame and --reference "
                                   "go with --prompt")
            if out.suffix.lower() == ".mp4":
                raise RequestError(f"with --prompts-file, --out names a folder, got {out}")
            _run_prompts_file(prompts_file, out, seed, model, recipe, shape, device, text_encoder, repeat, nproc)
        except (RecipeError, CheckpointError, RequestError, ConditioningError, LeverError, MediaError, ParallelError,
                SharedModelError, OSError) as exc:
            raise bad_input(str(exc)) from None
        return
    launched, record = _generate_one(prompt, out, seed, model, recipe[0], shape, device, text_encoder, nproc,
                                     {"first_frame": first_frame, "last_frame": last_frame, "reference": reference})
    if launched is not None:
        raise typer.Exit(launched)  # rank 0 printed the clip's line
    if record is None:
        return  # a follower rank: rank 0 wrote the clip and reports it
    typer.echo(
        f"{out}: {record.shape.num_frames} frames {record.shape.width}x{record.shape.height} @ {record.shape.fps} fps, "
        f"audio {record.shape.audio_sample_rate} Hz x{record.shape.audio_channels}; {record.request.workflow}; "
        f"generation-side {record.timings.generation_side_latency_s:.2f} s"
    )


def _generate_one(prompt: str, out: Path, seed: int, model: str, recipe: str, shape: dict, device: Optional[str],
                  text_encoder: str, nproc: Optional[int], image_paths: dict) -> tuple:
    """``h3 generate --prompt``: (the exit code of the ranks it launched, None) for a parallel recipe started here with
    torchrun, else (None, the clip's record; None on a follower rank). Bad input: one clear error
    (:func:`bad_input`)."""
    from h3.conditioning import ConditioningError, image_from_file
    from h3.levers import LeverError
    from h3.media import MediaError
    from h3.parallel import entry
    from h3.parallel.world import ParallelError
    from h3.recipe import RecipeError, load_recipe
    from h3.runtime import CheckpointError, GenerateRequest, H3Runtime, RequestError
    from h3.runtime import check_device, model_default_size, resolve_request

    try:
        if out.suffix.lower() != ".mp4":
            raise RequestError(f"--out must name an .mp4 file, got {out}")
        images = {role: image_from_file(path, f"--{role.replace('_', '-')}") for role, path in image_paths.items()
                  if path is not None}
        request = GenerateRequest(prompt=prompt, seed=seed, **shape, **images)
        resolve_request(request, model_default_size(model))
        recipe_obj = entry.with_nproc(load_recipe(recipe), nproc)
        launched = None
        if entry.must_launch(recipe_obj):
            entry.check_before_launch(recipe_obj, model, device)
            launched = entry.launch_ranks(recipe_obj, entry.child_argv("generate", {
                "--prompt": prompt, "--out": out.resolve(), "--seed": seed, "--model": model,
                "--recipe": entry.recipe_arg(recipe), "--seconds": shape["seconds"],
                "--num-frames": shape["num_frames"], "--height": shape["height"], "--width": shape["width"],
                "--device": device, "--text-encoder": text_encoder,
                **{f"--{role.replace('_', '-')}": path.resolve() for role, path in image_paths.items()
                   if path is not None}}))
        else:
            if not recipe_obj.parallel.is_on():
                device = check_device(device)
                from h3.memory import card_load_problem

                problem = card_load_problem(model, [recipe_obj], device, text_encoder=text_encoder)
                if problem:  # before minutes of loading
                    raise RecipeError(problem)
            device = entry.join_ranks(recipe_obj, model, device)
            finished = False
            try:
                runtime = H3Runtime.load(model, recipe_obj, device, text_encoder=text_encoder)
                record = runtime.generate(request, out)
                finished = True
            finally:
                if recipe_obj.parallel.is_on():  # a rank leaves its groups before the interpreter's teardown
                    from h3.parallel.world import destroy_world

                    destroy_world(barrier=finished)
            return None, record
    except (RecipeError, CheckpointError, RequestError, ConditioningError, LeverError, MediaError, ParallelError,
            OSError) as exc:
        raise bad_input(str(exc)) from None
    return launched, None


def _run_prompts_file(prompts_file: Path, out: Path, seed: int, model: str, recipes: List[str], shape: dict,
                      device: Optional[str], text_encoder: str, repeat: int, nproc: Optional[int]) -> None:
    """``h3 generate --prompts-file``: every prompt under each recipe in this one process (h3.batch)."""
    from h3.batch import SUMMARY, read_prompts_file, run_requests
    from h3.parallel import entry
    from h3.recipe import RecipeError, load_recipe
    from h3.runtime import GenerateRequest, H3Runtime, check_device, model_default_size, resolve_request
    from h3.runtime import shared_recipes_problems

    prompts = read_prompts_file(prompts_file)
    for item in prompts:  # every request checked before the model loads
        resolve_request(GenerateRequest(prompt=item.prompt, seed=item.seed or seed, **shape),
                        model_default_size(model))
    loaded = [entry.with_nproc(load_recipe(r), nproc) for r in recipes]
    if any(r.parallel.is_on() for r in loaded):
        raise RecipeError("--prompts-file runs in one process; a parallel recipe (parallel.degree > 1 or --nproc) "
                          "runs one request at a time through --prompt")
    problems = shared_recipes_problems(loaded) if len(loaded) > 1 else []
    if problems:
        raise RecipeError("these recipes cannot take turns on one model: " + "; ".join(problems))
    device = check_device(device)
    from h3.memory import card_load_problem

    problem = card_load_problem(model, loaded, device, text_encoder=text_encoder)  # before minutes of loading
    if problem:
        raise RecipeError(problem)
    runtime = H3Runtime.load(model, loaded[0], device, shared=len(loaded) > 1, text_encoder=text_encoder)

    def report(clip: Path, record, row: dict) -> None:
        typer.echo(f"{out / clip.name}: {row['recipe']} #{row['index']} {'warm' if row['warm'] else 'first'}; "
                   f"generation-side {row['generation_side_latency_s']:.2f} s, request-to-file "
                   f"{row['request_to_file_latency_s']:.2f} s")

    summary = run_requests(runtime, loaded, prompts, out, seed=seed, shape=shape, repeat=repeat, on_clip=report)
    for name, figures in summary.get("by_recipe", {}).items():
        warm = figures["warm"]["generation_side_latency_s"]
        if warm:
            typer.echo(f"{name}: {figures['warm_requests']} warm requests, generation-side p50 {warm['p50']:.2f} s, "
                       f"request-to-file p50 {figures['warm']['request_to_file_latency_s']['p50']:.2f} s")
    typer.echo(f"{out / SUMMARY}")


@app.command("serve")
def serve(
    model: str = typer.Option("tiny", "--model", envvar="H3_MODEL",
                              help="'tiny' (the trained tiny preset; also 'tiny-trained'), 'tiny-random' (the tiny "
                                   "preset with random weights), 'h3-random' (released size, random weights), "
                                   "'h3-random-small' or a checkpoint directory."),
    recipe: List[str] = typer.Option(
        ["baseline"], "--recipe", envvar="H3_RECIPE",
        help="Recipe name or TOML path; repeat it to serve several recipes on one shared model (a job names its recipe "
             "by `model` or h3_levers_sha256)."),
    host: str = typer.Option("127.0.0.1", "--host", envvar="H3_HOST"),
    port: int = typer.Option(30000, "--port", envvar="H3_PORT", help="TCP port, 1 to 65535."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="H3_API_KEY", help="Require this bearer key."),
    max_queue: int = typer.Option(8, "--max-queue", envvar="H3_MAX_QUEUE", help="Jobs that may wait (429 beyond)."),
    output_dir: Path = typer.Option(Path("h3-serve"), "--output-dir", envvar="H3_OUTPUT_DIR",
                                    help="Where clips and job files live (kept across restarts)."),
    device: Optional[str] = typer.Option(None, "--device", envvar="H3_DEVICE"),
    max_prompt_tokens: Optional[int] = typer.Option(
        None, "--max-prompt-tokens", envvar="H3_MAX_PROMPT_TOKENS",
        help="Longest prompt, in the model's tokens (422 beyond). Default: 1024, or the text encoder's positions."),
    max_pixels: Optional[int] = typer.Option(
        None, "--max-pixels", envvar="H3_MAX_PIXELS",
        help="Largest canvas, width x height (422 beyond). Default: the model's canvas budget (768x1344) on a GPU, "
             "4x the default canvas on a CPU."),
    job_timeout: Optional[float] = typer.Option(
        None, "--job-timeout", envvar="H3_JOB_TIMEOUT",
        help="Seconds one job may generate; past it the job fails and the worker moves on. Default: 3600 for a "
             "checkpoint, 300 for the tiny preset."),
    max_body_bytes: Optional[int] = typer.Option(
        None, "--max-body-bytes", envvar="H3_MAX_BODY_BYTES", help="Largest request body (413 beyond). Default 65536."),
    text_encoder: str = typer.Option(
        "resident", "--text-encoder", envvar="H3_TEXT_ENCODER",
        help="'resident' on the device, or 'offload': streamed from host memory while it encodes (frees ~58 GiB of "
             "an H200 at full size; costs the copy, measured in the text_encode stage), or 'fit': streamed, keeping "
             "on the device the layers that fit beside each request's measured peak."),
    nproc: Optional[int] = typer.Option(None, "--nproc", envvar="H3_NPROC",
                                        help="Ranks (GPUs) per request; starts them with torchrun, rank 0 serves "
                                             "HTTP. Default: the recipe's parallel.degree (1)."),
) -> None:
    """Serve the OpenAI videos API (the openai SDK's calls, SGLang's fields) over one recipe (or several sharing one
    model)."""
    import math

    from h3.levers import LeverError
    from h3.parallel import entry
    from h3.parallel.world import ParallelError
    from h3.recipe import RecipeError, load_recipe
    from h3.runtime import CheckpointError, SharedModelError
    from h3.server import serve as run_server

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if max_queue < 0:
        raise bad_input(f"--max-queue must be >= 0, got {max_queue}")
    if not 1 <= port <= 65535:
        raise bad_input(f"--port must be 1 to 65535, got {port}")
    for flag, value in (("--max-prompt-tokens", max_prompt_tokens), ("--max-pixels", max_pixels),
                        ("--max-body-bytes", max_body_bytes)):
        if value is not None and value < 1:
            raise bad_input(f"{flag} must be a positive integer, got {value}")
    if job_timeout is not None and not (math.isfinite(job_timeout) and job_timeout > 0):
        raise bad_input(f"--job-timeout must be a positive finite number of seconds, got {job_timeout}")
    from h3.residency import TEXT_ENCODER_RESIDENCY

    if text_encoder not in TEXT_ENCODER_RESIDENCY:
        raise bad_input(f"--text-encoder must be one of {', '.join(TEXT_ENCODER_RESIDENCY)}, got {text_encoder!r}")
    try:
        limits = dict(max_prompt_tokens=max_prompt_tokens, max_pixels=max_pixels, job_timeout_s=job_timeout,
                      max_body_bytes=max_body_bytes)
        launched = None
        recipe_obj = entry.with_nproc(load_recipe(recipe[0]), nproc) if len(recipe) == 1 else None
        if recipe_obj is None:
            # Several recipes take turns on one shared model in this process (a parallel recipe is refused there,
            # h3.levers.parallel.ParallelConfig.shared_problems).
            if nproc is not None and nproc > 1:
                raise RecipeError(f"--nproc {nproc} serves one recipe on its ranks; several --recipe share one model "
                                  "in one process (serve a parallel recipe on its own)")
            run_server(model, recipe, host=host, port=port, api_key=api_key, max_queue=max_queue,
                       output_dir=output_dir, device=device, text_encoder=text_encoder, **limits)
        elif entry.must_launch(recipe_obj):
            entry.check_before_launch(recipe_obj, model, device)
            # The key travels in the environment (H3_API_KEY), never on a command line other users can list.
            launched = entry.launch_ranks(recipe_obj, entry.child_argv("serve", {
                "--model": model, "--recipe": entry.recipe_arg(recipe[0]), "--host": host, "--port": port,
                "--max-queue": max_queue, "--output-dir": output_dir.resolve(), "--device": device,
                "--max-prompt-tokens": max_prompt_tokens, "--max-pixels": max_pixels, "--job-timeout": job_timeout,
                "--max-body-bytes": max_body_bytes, "--text-encoder": text_encoder}),
                env={"H3_API_KEY": api_key} if api_key else None)
        elif recipe_obj.parallel.is_on():
            from h3.parallel.serving import serve_ranks

            serve_ranks(model, recipe_obj, host=host, port=port, api_key=api_key, max_queue=max_queue,
                        output_dir=output_dir, device=device, text_encoder=text_encoder, **limits)
        else:
            run_server(model, recipe, host=host, port=port, api_key=api_key, max_queue=max_queue,
                       output_dir=output_dir, device=device, text_encoder=text_encoder, **limits)
    except (RecipeError, CheckpointError, LeverError, SharedModelError, ParallelError, OSError, ValueError) as exc:
        raise bad_input(str(exc)) from None
    if launched:
        raise typer.Exit(launched)


@app.command("seeded-lora")
def seeded_lora(
    out: Path = typer.Option(..., "--out", help="Folder to write minimax-h3-turbo-4step.safetensors into (then "
                                                "export H3_LORA_DIR=that folder)."),
    model: str = typer.Option("h3-random", "--model", help="The random preset whose DiT shapes the LoRA fits: "
                                                          "'h3-random' (about 0.7 GB) or 'h3-random-small'."),
) -> None:
    """Write the seeded random turbo LoRA that the turbo recipes read on a random preset (the same file on every
    machine: drawn on the CPU from a fixed seed; the DiT's shapes come from its config on the meta device, no
    weights). Random weights: speed and memory are real, quality is not."""
    import time

    import torch

    from h3 import random_model
    from h3.levers.lora import TURBO_LORA_FILE
    from h3.train.seeded_lora import write_random_turbo_lora

    if not random_model.is_random_preset(model):
        raise bad_input(f"--model must be one of {', '.join(random_model.PRESETS)} (a checkpoint's turbo LoRA is the "
                        f"model owner's file), got {model!r}")
    if out.exists() and not out.is_dir():
        raise bad_input(f"--out {out} exists and is not a folder")
    path = out / TURBO_LORA_FILE
    t0 = time.perf_counter()
    from accelerate import init_empty_weights
    from diffusers import MiniMaxH3Transformer3DModel

    with init_empty_weights():  # shapes only: the released DiT's 62 GiB are never allocated
        transformer = MiniMaxH3Transformer3DModel(**random_model.preset(model).transformer)
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_random_turbo_lora(path, transformer)
    except OSError as exc:
        raise bad_input(f"cannot write {path}: {exc.strerror or exc}") from None
    typer.echo(f"{path}: {path.stat().st_size / 2**20:.0f} MiB in {time.perf_counter() - t0:.1f} s; "
               f"export H3_LORA_DIR={out.resolve()}")


def main() -> None:  # pragma: no cover
    app()

if __name__ == "__main__":  # pragma: no cover
    app()
