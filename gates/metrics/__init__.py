"""The gates' metric library: one metric per module, functional first (torchmetrics' layout).

Each module holds one stateless function of a clip (or a pair) and declares ``higher_is_better`` (None for a helper
that is no quality metric). The artifact detectors return a :class:`gates.metrics.detection.Detection`: a per-clip
statistic, the threshold it is compared with (calibrated on data of known defects:
bench/artifact_detectors/results/) and the flag. Gate modules (gates/reference_free.py, gates/audio.py) are thin
adapters that declare which of these they write and with which options.

| module | what | flagged when |
|---|---|---|
| global_motion | camera similarity transform between two frames (helper) | - |
| echo | a faint lagged copy (1-4 frames) of the moving subject inside one clip | ``echo_score`` > threshold |
| tail_flicker | brightness flicker concentrated in the last frames | ``tail_flicker`` > threshold |
| frozen_frames | frames that repeat the previous one while the clip moves | ``frozen_frames`` >= 1 |
| sharpness_drop | a sudden loss of sharpness (blur), never read as a ghost | ``sharpness_drop`` > threshold |
| blocking | an 8x8 block grid (compression blocking) | ``blocking`` > threshold |
| audio_offset | audio/video offset against ITU-R BT.1359's detectability window | outside +45 / -125 ms |
| audio_dropout | a gap inside the soundtrack | ``dropout_ms`` >= threshold |
| audio_clicks | impulsive clicks (sample-level discontinuities) | ``click_score`` > threshold |

The paired ghost estimator (the ghosting gate's, gates/ghosting.py: candidate against baseline, same seed) is split the
same way: ``ghost`` (pooled fit of a displaced copy, per window and per frame), ``ghost_fit`` (least squares, FFT
search, block statistics), ``ghost_pvalue`` (window and pair p-values against the benign null), ``ghost_heatmap`` (the
strip), ``ghost_backend`` (numpy / torch) and ``ghost_config`` (calibrated settings, result types); ``ghost_run``
pools the pairs' in-place stale-copy evidence over a run (seed 001's faint ghost, which no single pair shows).
"""
