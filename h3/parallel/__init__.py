"""Several GPUs for one request (issue 21): the process group (``world``), torchrun launching (``launch``,
``entry``), attention under context parallelism where the levers change the call (``attention``), the tile-parallel
video VAE decode (``vae_tiles``), communication timing (``comm``), the server's followers (``serving``), batches
(``batch``) and the planted bugs the suite's parallel check must catch (``plants``). The lever that puts a pipeline
on N ranks is h3/levers/parallel.py; the engine underneath is diffusers' context parallelism, not a home-made one.
"""
