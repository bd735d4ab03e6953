"""The VBench dimensions the product scores: direction, the checkpoints each one needs, leaderboard normalization.

Only dimensions that work in VBench's ``custom_input`` mode (a prompt given per clip, no VBench prompt-suite
metadata) are here: the seven of seed 002 plus temporal_flickering, the one that needs no downloaded model.
"""

from __future__ import annotations

from dataclasses import dataclass

VBENCH_VERSION = "0.1.5"
VBENCH_MODE = "custom_input"
"""VBench's evaluation mode the product uses: clips and prompts passed explicitly, never looked up by file name."""

LONG_VIDEO_SECONDS = 5.0
"""VBench calls clips of 5 s and longer long videos and offers VBench-Long (``vbench2_beta_long``), which cuts them
into short clips first. The product does NOT: it scores every clip whole in standard VBench, flags
``long_video: true`` per clip, and records ``long_video_handling = "whole_clip"``. Paired comparisons stay like for
like (both sides have the same length), but absolute scores of long clips are not comparable with the VBench-Long
leaderboard."""

LONG_VIDEO_HANDLING = "whole_clip"


@dataclass(frozen=True)
class Dimension:
    name: str
    higher_is_better: bool
    """Every VBench dimension is a score where higher is better (VBench paper, Sec. 3)."""
    checkpoints: tuple[str, ...]
    """Files (relative to the VBench cache folder) the dimension loads; a trailing ``/`` is a directory pinned whole."""
    requirement_groups: tuple[str, ...]
    """Lock files (``core``, ``models``) the dimension's code needs in the scoring environment."""
    leaderboard_min: float
    leaderboard_max: float
    """VBench's per-dimension normalization, ``NORMALIZE_DIC`` in VBench's scripts/constant.py (Vchitect/VBench at
    commit d63e77f): normalized = (raw - min) / (max - min), as scripts/cal_final_score.py computes it."""

    def normalize(self, raw: float) -> float:
        return (raw - self.leaderboard_min) / (self.leaderboard_max - self.leaderboard_min)


_CORE = ("core",)
_MODELS = ("core", "models")

DIMENSIONS: dict[str, Dimension] = {
    d.name: d
    for d in [
        # Checkpoint paths are the ones VBench 0.1.5's utils.init_submodules uses in its local mode.
        Dimension("subject_consistency", True,
                  ("dino_model/dino_vitbase16_pretrain.pth", "dino_model/facebookresearch_dino_main/"),
                  _MODELS, 0.1462, 1.0),
        Dimension("background_consistency", True, ("clip_model/ViT-B-32.pt",), _MODELS, 0.2615, 1.0),
        Dimension("temporal_flickering", True, (), _CORE, 0.6293, 1.0),
        Dimension("motion_smoothness", True, ("amt_model/amt-s.pth",), _MODELS, 0.706, 0.9975),
        Dimension("dynamic_degree", True, ("raft_model/models/raft-things.pth",), _MODELS, 0.0, 1.0),
        Dimension("aesthetic_quality", True,
                  ("clip_model/ViT-L-14.pt", "aesthetic_model/emb_reader/sa_0_4_vit_l_14_linear.pth"),
                  _MODELS, 0.0, 1.0),
        Dimension("imaging_quality", True, ("pyiqa_model/musiq_spaq_ckpt-358bb6af.pth",), _MODELS, 0.0, 1.0),
        Dimension("overall_consistency", True,
                  ("ViCLIP/ViClip-InternVid-10M-FLT.pth", "ViCLIP/bpe_simple_vocab_16e6.txt.gz"),
                  _MODELS, 0.0, 0.364),
    ]
}

DEFAULT_DIMENSIONS: tuple[str, ...] = tuple(DIMENSIONS)


class UnknownDimensionError(ValueError):
    pass


def resolve_dimensions(names: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """Validated, de-duplicated dimension names in the given order (all of them when ``names`` is empty/None).

    ``names`` is a list of names or comma-separated lists, or one such string: a string is never iterated character by
    character (``-o vbench.dimensions=temporal_flickering`` once failed with "unknown VBench dimension 't'")."""
    if isinstance(names, str):
        names = [names]
    if not names:
        return list(DEFAULT_DIMENSIONS)
    out: list[str] = []
    for raw in names:
        for name in str(raw).split(","):
            name = name.strip()
            if not name:
                continue
            if name not in DIMENSIONS:
                raise UnknownDimensionError(
                    f"unknown VBench dimension {name!r}; supported in custom-input mode: {', '.join(DIMENSIONS)}"
                )
            if name not in out:
                out.append(name)
    return out


def requirement_groups(dimensions: list[str]) -> list[str]:
    groups: list[str] = []
    for name in dimensions:
        for group in DIMENSIONS[name].requirement_groups:
            if group not in groups:
                groups.append(group)
    return groups
