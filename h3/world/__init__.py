"""The procedural world the tiny MiniMax-H3 is trained on, and a detector that checks clips against it.

- h3.world.scene: scenes of one or two shapes with synchronized tones and clicks, drawn from (seed, index); the
  caption grammar; ground truth; the held-out colour-shape pairs.
- h3.world.render: torch renderer of frames and stereo audio (any device).
- h3.world.detect: the model-independent detector (colour segmentation, centroid tracking, pitch by FFT, onset
  times) and the scoring of a clip against a caption: the functional core the content check and a gate share.
- h3.world.suites: the prompt suites in prompts/world-*.jsonl.
"""
