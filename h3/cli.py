"""The `h3` command line: the runtime on its own (generate one clip; serve the videos API)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(name="h3", help="The optimized MiniMax-H3 runtime.", no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False)


@app.callback()
def _root() -> None:
    """The optimized MiniMax-H3 runtime (diffusers' MiniMax-H3 classes)."""


@app.command("generate")
def generate(
    prompt: str = typer.Option(..., "--prompt", help="Prompt text."),
    out: Path = typer.Option(..., "--out", help="Output .mp4 (the record goes to the same name with .json)."),
    seed: int = typer.Option(0, "--seed"),
    model: str = typer.Option("tiny", "--model", envvar="H3_MODEL", help="'tiny', 'tiny-random', 'tiny-trained' or a checkpoint directory."),
    recipe: str = typer.Option("baseline", "--recipe", envvar="H3_RECIPE", help="Recipe name or TOML path."),
    seconds: Optional[float] = typer.Option(None, "--seconds"),
    num_frames: Optional[int] = typer.Option(None, "--num-frames"),
    height: Optional[int] = typer.Option(None, "--height"),
    width: Optional[int] = typer.Option(None, "--width"),
    device: Optional[str] = typer.Option(None, "--device", envvar="H3_DEVICE"),
) -> None:
    """Generate one clip (MP4, 24 fps, 32 kHz stereo) and its JSON record."""
    from h3.recipe import RecipeError, load_recipe
    from h3.runtime import CheckpointError, GenerateRequest, H3Runtime, RequestError, resolve_request
    from h3.runtime import FULL_DEFAULT_SIZE, TINY_DEFAULT_SIZE, TINY_MODELS

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        if out.suffix.lower() != ".mp4":
            raise RequestError(f"--out must name an .mp4 file, got {out}")
        request = GenerateRequest(prompt=prompt, seed=seed, num_frames=num_frames, seconds=seconds, height=height,
                                  width=width)
        resolve_request(request, TINY_DEFAULT_SIZE if model in TINY_MODELS else FULL_DEFAULT_SIZE)
        runtime = H3Runtime.load(model, load_recipe(recipe), device)
        record = runtime.generate(request, out)
    except (RecipeError, CheckpointError, RequestError, RuntimeError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(3)
    typer.echo(
        f"{out}: {record.shape.num_frames} frames {record.shape.width}x{record.shape.height} @ {record.shape.fps} fps, "
        f"audio {record.shape.audio_sample_rate} Hz x{record.shape.audio_channels}; "
        f"generation-side {record.timings.generation_side_latency_s:.2f} s"
    )


@app.command("serve")
def serve(
    model: str = typer.Option("tiny", "--model", envvar="H3_MODEL", help="'tiny', 'tiny-random', 'tiny-trained' or a checkpoint directory."),
    recipe: str = typer.Option("baseline", "--recipe", envvar="H3_RECIPE", help="Recipe name or TOML path."),
    host: str = typer.Option("127.0.0.1", "--host", envvar="H3_HOST"),
    port: int = typer.Option(30000, "--port", envvar="H3_PORT"),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="H3_API_KEY", help="Require this bearer key."),
    max_queue: int = typer.Option(8, "--max-queue", envvar="H3_MAX_QUEUE", help="Jobs that may wait (429 beyond)."),
    output_dir: Path = typer.Option(Path("h3-serve"), "--output-dir", envvar="H3_OUTPUT_DIR",
                                    help="Where clips and job files live (kept across restarts)."),
    device: Optional[str] = typer.Option(None, "--device", envvar="H3_DEVICE"),
) -> None:
    """Serve the OpenAI-style videos API (SGLang's field names) over one recipe."""
    from h3.recipe import RecipeError
    from h3.runtime import CheckpointError
    from h3.server import serve as run_server

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if max_queue < 0:
        typer.echo(f"error: --max-queue must be >= 0, got {max_queue}", err=True)
        raise typer.Exit(3)
    try:
        run_server(model, recipe, host=host, port=port, api_key=api_key, max_queue=max_queue,
                   output_dir=output_dir, device=device)
    except (RecipeError, CheckpointError, RuntimeError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(3)


def main() -> None:  # pragma: no cover
    app()

if __name__ == "__main__":  # pragma: no cover
    app()
