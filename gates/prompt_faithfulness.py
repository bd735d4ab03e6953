"""The prompt-faithfulness gate: does each clip show and sound what its prompt names? For suites with ground truth.

A recipe that breaks text conditioning (embeddings zeroed, a wrong encoder, a LoRA that overrides the prompt) can
make clean, sharp, smooth frames of the wrong content: every reference-free score passes it. The trained tiny preset
is trained on a procedural world whose captions are their own ground truth (``h3.world.scene``: colours, shapes,
directions, tones, bounces, appearances), and ``h3.world.detect`` reads a clip without knowing the model. This gate
runs that detector on both clips of a pair and scores each against its caption (:func:`h3.world.detect.score_clip`).

Per clip, the aspects checked are colour, shape, direction, pitch, bounces and, when the caption names an event,
audio-visual sync; ``faithfulness`` is the share of them right (0..1, higher is better), written for the candidate as
``faithfulness`` and the baseline as ``faithfulness.baseline`` (the policy compares the sides). The aspects themselves
are in ``info``.

A prompt that is not a caption of the world has no ground truth here: the pair is ``not_applicable`` (never a pass),
so a policy that requires this gate on a suite without ground truth is INCONCLUSIVE, and the release policy only asks
for it where the suite carries ground truth.
"""

from __future__ import annotations

import logging
from typing import Any

from gates.base import Gate, GateOptions, GateResult, MetricSpec, PairContext, register_gate
from gates.common import metric, new_result

logger = logging.getLogger(__name__)

GATE_NAME = "prompt_faithfulness"
ASPECTS = ("colour", "shape", "direction", "pitch", "bounces", "sync")


class PromptFaithfulnessOptions(GateOptions):
    sync_tolerance_frames: int = 2
    """An onset and a video event match within this many frames (the world detector's default)."""


def clip_faithfulness(frames, audio, sample_rate: int, caption: str,
                      tolerance_frames: int = 2) -> tuple[float, dict[str, Any]]:
    """(share of aspects right, details) of one decoded clip against its world caption; ValueError when the caption
    is not one of the world's."""
    from h3.world.detect import describe_clip, parse_caption, score_clip

    expected = parse_caption(caption)
    score = score_clip(describe_clip(frames, audio, sample_rate), expected, tolerance_frames=tolerance_frames)
    aspects = {a: getattr(score, a) for a in ASPECTS if getattr(score, a) is not None}
    share = sum(bool(v) for v in aspects.values()) / len(aspects)
    return share, {"aspects": {a: bool(v) for a, v in aspects.items()}, "details": score.details}


@register_gate
class PromptFaithfulnessGate(Gate):
    name = GATE_NAME
    needs = ("video", "audio")
    description = "Content against the prompt's ground truth (the procedural world's detector), both sides."
    Options = PromptFaithfulnessOptions
    metrics = {"faithfulness": MetricSpec(higher_is_better=True),
               "faithfulness.baseline": MetricSpec(higher_is_better=True)}

    def evaluate(self, ctx: PairContext) -> GateResult:
        return self._score(ctx, identical=False)

    def identical_result(self, ctx: PairContext) -> GateResult:
        """A bit-identical pair (same raw frames and PCM): the baseline's clip is scored, and the candidate's score is
        the same (a difference after decoding would be codec noise)."""
        result = self._score(ctx, identical=True)
        result.identical = True
        return result

    def _score(self, ctx: PairContext, identical: bool) -> GateResult:
        from gates.media_cache import load_audio, load_video
        from h3.world.detect import parse_caption

        options = self.parse_options(ctx.options)
        result = new_result(self.name, ctx)
        captions = {side: (getattr(ctx, side).record.get("request") or {}).get("prompt") or ""
                    for side in ("baseline", "candidate")}
        if captions["baseline"] != captions["candidate"]:
            result.status, result.error = "error", "the two clips of the pair were made from different prompts"
            result.info["prompts"] = captions
            return result
        try:
            parse_caption(captions["candidate"])
        except ValueError as exc:
            result.status = "not_applicable"
            result.info["reason"] = ("the prompt is not a caption of the procedural world, so it has no ground "
                                     f"truth ({exc})")
            return result
        shares = {}
        for side in ("baseline",) if identical else ("baseline", "candidate"):
            clip = getattr(ctx, side)
            frames, _ = load_video(clip.mp4)
            audio, rate = load_audio(clip.mp4)
            shares[side], result.info[side] = clip_faithfulness(frames, audio, int(rate), captions[side],
                                                               options.sync_tolerance_frames)
        if identical:
            shares["candidate"], result.info["candidate"] = shares["baseline"], result.info["baseline"]
            result.info["short_circuit"] = "frames_sha256 and pcm_sha256 equal: the baseline's clip scored for both"
        result.metrics = {"faithfulness": metric(shares["candidate"], True),
                          "faithfulness.baseline": metric(shares["baseline"], True)}
        wrong = [a for a, ok in result.info["candidate"]["aspects"].items() if not ok]
        if wrong:
            result.flags.append("candidate does not match its prompt on: " + ", ".join(wrong))
        result.flagged = bool(result.flags)
        result.info["caption"] = captions["candidate"]
        return result
