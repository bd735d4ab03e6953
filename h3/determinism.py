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

Portable numerics (issue 50): ``H3_PORTABLE_NUMERICS=1`` makes the bytes the same on any x86-64 CPU with AVX2 and FMA
(an AMD Zen 1 and an Intel Xeon with AVX-512 and AMX alike), not only on one platform. Each library that picks its
kernels by the CPU is pinned to one code path both have (:func:`portable_numerics_env`): MKL's COMPATIBLE mode, ATen's
AVX2 kernels, oneDNN off (``torch.backends.mkldnn``: torch sends bf16 matmuls and convolutions to oneDNN only on CPUs
with AVX-512, and ``ONEDNN_MAX_CPU_ISA`` does not change that choice), numpy's and OpenCV's dispatch capped below
AVX-512, OpenCV's IPP off, OpenBLAS's Haswell kernels, and two threads (the clips' floats depend on the thread count).
Measured in bench/portable_numerics: a trained-tiny clip's bytes under the mode do not change when this Intel VM's
oneDNN and MKL are capped at AVX2 (a Zen 1's ISA), where the default mode's do; it costs about 1.4x CPU time. The
variables must be in the environment when the libraries load, so the switch is read at ``h3`` import (this module
sets the variables and turns oneDNN off); a launcher that starts a child process passes
``portable_numerics_env()`` to it.
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


PORTABLE_SWITCH = "H3_PORTABLE_NUMERICS"
PORTABLE_THREADS = 2
"""The thread count of portable numerics: ATen splits reductions by thread count, so two CPUs give the same bytes only
with the same count; 2 is CI's core count and the count the chain test's outcomes were set at."""
_OFF_WORDS = ("0", "false", "no", "off", "")


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def portable_numerics_env(cpu_flags: set[str] | None = None) -> dict[str, str]:
    """The environment of portable numerics, for a child process (:data:`PORTABLE_SWITCH` included): every library
    that picks kernels by the CPU pinned to a code path any x86-64 CPU with AVX2 and FMA runs alike.

    The AVX-512 caps of numpy and OpenCV are named only on a CPU that has AVX-512 (``cpu_flags``: /proc/cpuinfo's),
    so a CPU without it loads them as it always does, without a warning about a feature it lacks."""
    flags = _cpu_flags() if cpu_flags is None else cpu_flags
    env = {
        PORTABLE_SWITCH: "1",
        "MKL_CBWR": "COMPATIBLE",  # MKL's one code path on every x86-64 CPU (AUTO picks one per CPU vendor and ISA)
        "ATEN_CPU_CAPABILITY": "avx2",  # ATen's vectorized kernels (softmax, norms, reductions, the bf16 gemm)
        "OPENBLAS_CORETYPE": "Haswell",  # numpy's OpenBLAS: a Zen runs Haswell kernels with other blocking
        "OPENCV_IPP": "disabled",  # Intel IPP dispatches by CPU vendor as well as ISA
        "OMP_NUM_THREADS": str(PORTABLE_THREADS),
    }
    if "avx512f" in flags:
        env["NPY_DISABLE_CPU_FEATURES"] = "X86_V4 AVX512_ICL AVX512_SPR"  # numpy 2.x's AVX-512 dispatch targets
        env["OPENCV_CPU_DISABLE"] = "AVX512F,AVX512-COMMON,AVX512-SKX"  # OpenCV's AVX-512 dispatch (the gates' flow)
    return env


def portable_numerics_requested() -> bool:
    """Whether :data:`PORTABLE_SWITCH` asks for portable numerics in this process."""
    return os.environ.get(PORTABLE_SWITCH, "0").strip().lower() not in _OFF_WORDS


def enable_portable_numerics() -> dict[str, str]:
    """Set :func:`portable_numerics_env` in this process (overriding a user's values of the same variables: the mode is
    one platform, or it is nothing) and turn oneDNN off; returns what it set. Effective only before torch, MKL, numpy
    and OpenCV first run, which is why ``h3``'s import calls it."""
    env = portable_numerics_env()
    os.environ.update(env)
    import torch

    # On a CPU with AVX-512, torch hands bf16 matmuls and convolutions to oneDNN (AMX or AVX-512 BF16 kernels); on a
    # Zen 1 it runs them in ATen. Off, both run ATen's (AVX2) kernels, and float32 convolutions run ATen's im2col +
    # MKL (COMPATIBLE) instead of oneDNN's per-ISA, per-cache-size kernels.
    torch.backends.mkldnn.enabled = False
    return env


def enable_cpu_reproducibility() -> str | None:
    """Ask MKL for conditional numerical reproducibility before it first runs; returns the mode asked for (None when
    ``H3_CPU_REPRODUCIBLE=0`` switched it off). Idempotent; never overrides a user's ``MKL_CBWR``, except under
    ``H3_PORTABLE_NUMERICS=1`` (:func:`enable_portable_numerics`), whose MKL mode is COMPATIBLE."""
    if portable_numerics_requested():
        return enable_portable_numerics()["MKL_CBWR"]
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
    if portable_numerics_requested():  # named only when on: records of the default mode keep their keys
        out.update(portable_numerics=True, onednn_enabled=bool(torch.backends.mkldnn.enabled))
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
