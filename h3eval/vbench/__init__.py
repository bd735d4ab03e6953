"""VBench scoring in its own pinned environment.

VBench 0.1.5 pins ``transformers==4.33.2`` and ``numpy<2``, which cannot live beside the runtime's own packages, so
it runs in a separate virtual environment (:mod:`h3eval.vbench.env`), from a lock file committed under ``gates/``.
Every scorer file and checkpoint is hash-verified before scoring (:mod:`h3eval.vbench.pins`); the dimensions, their
direction, their checkpoints and the leaderboard's normalization live in :mod:`h3eval.vbench.dimensions`.
"""
