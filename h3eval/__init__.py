import h3  # noqa: F401  (first: MKL reproducibility is set before any model code runs; h3/determinism.py)
