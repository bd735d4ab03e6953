"""Training the tiny MiniMax-H3 on the procedural world (h3.world): ``python -m h3.train all --out DIR``.

Stages (h3.train.run): the video VAE and the audio VAE (h3.train.vaes), the latent pool (h3.train.pool), the DiT by
flow matching (h3.train.dit, through the real forward with per-request timesteps: h3.train.packing), the 4-step LoRA
distilled against the 29-step teacher (h3.train.distill, h3.train.lora), and the export of the checkpoint that ships as
h3/assets/tiny with its training record (h3.train.export). The text encoder is frozen (h3.tiny_trained says why).
Between device calls the stages' states travel as a pack (h3.train.travel: ``python -m h3.train pack`` / ``unpack``).
"""
