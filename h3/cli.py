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
    model: str = typer.Option("tiny", "--model", envvar="H3_MODEL", help="'tiny' or a checkpoint directory."),
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
    from h3.runtime import FULL_DEFAULT_SIZE, TINY_DEFAULT_SIZE

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        if out.suffix.lower() != ".mp4":
            raise RequestError(f"--out must name an .mp4 file, got {out}")
        request = GenerateRequest(prompt=prompt, seed=seed, num_frames=num_frames, seconds=seconds, height=height,
                                  width=width)
        resolve_request(request, TINY_DEFAULT_SIZE if model == "tiny" else FULL_DEFAULT_SIZE)
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


def main() -> None:  # pragma: no cover
    app()

if __name__ == "__main__":  # pragma: no cover
    app()
