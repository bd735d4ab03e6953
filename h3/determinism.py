"""CPU reproducibility: the same request gives the same bytes, wherever its tensors sit in memory.

Why this exists (issue 16). PyTorch's CPU matrix products are Intel MKL's (statically linked in libtorch_cpu). Without
MKL's *conditional numerical reproducibility* (CNR), MKL picks its kernel by CPU vendor and by the memory alignment of
the operands, and those kernels round differently. Weights loaded from a safetensors file sit at the file's own
offsets (often not 64-byte aligned); a ``copy.deepcopy`` of the same module sits at fresh, aligned addresses. On an
AMD EPYC the two gave outputs one ulp apart, so "byte-identical" held on the machine a test was written on and failed
on another. With CNR on, MKL runs the same code path whatever the alignment, and the results are bit-identical
run to run on one machine (same thread count).

What the product promises, and where: byte identity of a clip (``identity`` against ``baseline``, the A/B
off-identity check, the floor's determinism check) holds on one platform: same CPU model and vector capability, same
MKL mode, same thread count, same library versions. :func:`numerics_platform` is that platform, recorded in every clip
record (``hardware.numerics``), so a byte check can say what it compared and tell a recipe's difference from the
platform's.

MKL reads ``MKL_CBWR`` once, when it first runs, and refuses a change afterwards (``mkl_cbwr_set`` returns
``MKL_CBWR_ERR_MODE_CHANGE_FAILURE``). So :func:`enable_cpu_reproducibility` runs when the ``h3`` package is imported,
before any model code, in every entry point (the ``h3`` and ``h3eval`` CLIs, the server, the dashboard, subprocesses:
they inherit the environment variable). A user's own ``MKL_CBWR`` is kept; ``H3_CPU_REPRODUCIBLE=0`` leaves MKL
alone (faster on some CPUs, not reproducible; the record says so). The speed cost on the tiny preset is measured by
``bench/cpu_reproducibility/cpu_reproducibility.py`` (``bench/cpu_reproducibility/results/cpu_reproducibility.md``).
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
from pathlib import Path
from typing import Any

# AUTO: MKL's reproducible mode on the code path it picks for this CPU, so results do not depend on operand alignment
# (0 of the float32 elements differ after re-homing the weights, on an AMD EPYC and on an Intel Xeon) and MKL keeps its
# fast kernels for the CPU. Until session 21 it was COMPATIBLE (one code path on every x86-64 CPU), which buys nothing
# the product promises (byte identity holds on one platform: oneDNN's kernels differ by CPU anyway) and was the slowest
# reproducible mode on both: a trained-tiny clip 1.318 s (2.345 CPU-s) against AUTO's 1.274 s (2.232) on the Intel
# Xeon (cpu_reproducibility_s21_intel.md), a random-tiny clip 1.399 s against 1.196 s on the AMD EPYC
# (cpu_reproducibility.md). Every record names the mode (hardware.numerics.mkl_cbwr), so a clip made under one is
# reported as made on another platform than one made under the other, never compared byte for byte.
DEFAULT_MKL_CBWR = "AUTO"
_SWITCH = "H3_CPU_REPRODUCIBLE"
# mkl_cbwr_get's answer when CNR is off (MKL_CBWR_BRANCH_OFF in mkl_service.h).
_MKL_CBWR_BRANCH_OFF = 1
_MKL_CBWR_BRANCH = 1


def enable_cpu_reproducibility() -> str | None:
    """Ask MKL for conditional numerical reproducibility before it first runs; returns the mode asked for (None when
    ``H3_CPU_REPRODUCIBLE=0`` switched it off). Idempotent; never overrides a user's ``MKL_CBWR``."""
    if os.environ.get(_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    return os.environ.setdefault("MKL_CBWR", DEFAULT_MKL_CBWR)


def _torch_cpu_library() -> ctypes.CDLL | None:
    try:
        import torch
    except ImportError:
        return None
    path = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        return ctypes.CDLL(str(path)) if path.is_file() else None
    except OSError:
        return None


def mkl_cbwr_active() -> bool | None:
    """Whether MKL runs with CNR on (True/False), or None when this torch has no MKL to ask (non-x86 builds).

    Reads MKL's own state (``mkl_serv_cbwr_get``, the service function behind ``mkl_cbwr_get``), not the variable,
    so a process whose MKL started before ``MKL_CBWR`` was set reports False.
    """
    lib = _torch_cpu_library()
    get = getattr(lib, "mkl_serv_cbwr_get", None) if lib is not None else None
    if get is None:
        return None
    get.restype, get.argtypes = ctypes.c_int, [ctypes.c_int]
    return int(get(_MKL_CBWR_BRANCH)) != _MKL_CBWR_BRANCH_OFF


@functools.lru_cache(maxsize=1)
def _cpu_model() -> dict[str, str]:
    info = {"vendor": "", "model": platform.processor() or platform.machine()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "vendor_id" and not info["vendor"]:
                info["vendor"] = value.strip()
            elif key == "model name":
                info["model"] = value.strip()
                break
    except OSError:
        pass
    return info


def numerics_platform(device: Any = "cpu") -> dict[str, Any]:
    """What decides a clip's bytes besides the recipe and the request: the platform a byte-identity check must hold
    fixed. Recorded in every clip record as ``hardware.numerics``."""
    import torch

    out: dict[str, Any] = {"device_type": torch.device(device).type, "torch": torch.__version__}
    if out["device_type"] == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.device(device))
        out.update(gpu=props.name, cuda=torch.version.cuda)
        return out
    cpu = _cpu_model()
    out.update(
        cpu_vendor=cpu["vendor"],
        cpu_model=cpu["model"],
        aten_cpu_capability=torch.backends.cpu.get_cpu_capability(),
        torch_threads=torch.get_num_threads(),
        mkl_cbwr=os.environ.get("MKL_CBWR"),
        mkl_cbwr_active=mkl_cbwr_active(),
    )
    return out


def byte_identity_promised(numerics: dict[str, Any] | None) -> bool:
    """Whether a clip made on this platform carries the byte-identity promise: on the CPU only with MKL's CNR on."""
    if not numerics:
        return True  # records from before the platform was recorded: judged as they always were
    if numerics.get("device_type") != "cpu":
        return True
    return numerics.get("mkl_cbwr_active") is not False


def platform_difference(a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[str]:
    """The keys on which two clips' platforms differ (empty when the same, or when either is unrecorded)."""
    if not a or not b:
        return []
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
