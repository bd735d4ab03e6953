"""The H3 runtime. Importing it switches MKL's conditional numerical reproducibility on before MKL first runs, so that
a request gives the same bytes wherever its tensors sit in memory (h3/determinism.py)."""

from h3.determinism import enable_cpu_reproducibility as _enable_cpu_reproducibility

_enable_cpu_reproducibility()
