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
    prompt: str = typer.Option(..., "--prompt", help="Prompt text."),
    out: Path = typer.Option(..., "--out", help="Output .mp4 (the record goes to the same name with .json)."),
    seed: int = typer.Option(0, "--seed"),
    model: str = typer.Option("tiny", "--model", envvar="H3_MODEL",
                              help="'tiny' (the trained tiny preset; also 'tiny-trained'), 'tiny-random' (the tiny "
                                   "preset with random weights), 'h3-random' (released size, random weights), "
                                   "'h3-random-small' or a checkpoint directory."),
    recipe: str = typer.Option("baseline", "--recipe", envvar="H3_RECIPE", help="Recipe name or TOML path."),
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
    """Generate one clip (MP4, 24 fps, 32 kHz stereo) and its JSON record.

    With --first-frame and/or --last-frame the fl2va workflow runs, with --reference ref2va; the record keeps each
    image's sha256."""
    from h3.conditioning import ConditioningError, image_from_file
    from h3.levers import LeverError
    from h3.media import MediaError
    from h3.parallel import entry
    from h3.parallel.world import ParallelError
    from h3.recipe import RecipeError, load_recipe
    from h3.runtime import CheckpointError, GenerateRequest, H3Runtime, RequestError, resolve_request
    from h3.runtime import model_default_size

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        if out.suffix.lower() != ".mp4":
            raise RequestError(f"--out must name an .mp4 file, got {out}")
        images = {role: image_from_file(path, f"--{role.replace('_', '-')}") for role, path in
                  (("first_frame", first_frame), ("last_frame", last_frame), ("reference", reference))
                  if path is not None}
        request = GenerateRequest(prompt=prompt, seed=seed, num_frames=num_frames, seconds=seconds, height=height,
                                  width=width, **images)
        resolve_request(request, model_default_size(model))
        recipe_obj = entry.with_nproc(load_recipe(recipe), nproc)
        launched = None
        if entry.must_launch(recipe_obj):
            entry.check_before_launch(recipe_obj, model, device)
            launched = entry.launch_ranks(recipe_obj, entry.child_argv("generate", {
                "--prompt": prompt, "--out": out.resolve(), "--seed": seed, "--model": model,
                "--recipe": entry.recipe_arg(recipe), "--seconds": seconds, "--num-frames": num_frames,
                "--height": height, "--width": width, "--device": device,
                **{f"--{role.replace('_', '-')}": path.resolve() for role, path in
                   (("first_frame", first_frame), ("last_frame", last_frame), ("reference", reference))
                   if path is not None}}))
        else:
            device = entry.join_ranks(recipe_obj, model, device)
            runtime = H3Runtime.load(model, recipe_obj, device)
            record = runtime.generate(request, out)
    except (RecipeError, CheckpointError, RequestError, ConditioningError, LeverError, MediaError, ParallelError,
            OSError) as exc:
        raise bad_input(str(exc)) from None
    if launched is not None:
        raise typer.Exit(launched)  # rank 0 printed the clip's line
    if record is None:
        return  # a follower rank: rank 0 wrote the clip and reports it
    typer.echo(
        f"{out}: {record.shape.num_frames} frames {record.shape.width}x{record.shape.height} @ {record.shape.fps} fps, "
        f"audio {record.shape.audio_sample_rate} Hz x{record.shape.audio_channels}; {record.request.workflow}; "
        f"generation-side {record.timings.generation_side_latency_s:.2f} s"
    )


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
             "an H200 at full size; costs the copy, measured in the text_encode stage)."),
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


def main() -> None:  # pragma: no cover
    app()

if __name__ == "__main__":  # pragma: no cover
    app()
