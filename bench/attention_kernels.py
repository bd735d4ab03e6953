"""Benchmark (not a test): attention kernels at MiniMax-H3's shape on one GPU (issue 23), one call of each.

The shape of one DiT attention at 5 s 768x1344: batch 1, 56 heads of 128, 37,966 rows (text + audio + video).
Kernels, each where installed: PyTorch SDPA on cuDNN and on its flash kernel (bf16), FlashAttention-3 (``flash_attn_3``
built from Dao-AILab/flash-attention's ``hopper/``) in bf16 and in FP8 e4m3 (q, k and v cast plainly with descale 1,
and scaled per head: each head's absolute maximum mapped to 448 and its descale passed to the kernel), and
SageAttention 2.2's sm90 kernel (``sageattn``: INT8 q/k, FP8 p/v).

Time: CUDA events around each call, warm-up then the median of --repeats calls; the FP8 rows are timed twice, the
kernel alone on quantized inputs and with the quantization of q, k and v included (what a lever pays per call).
Error: every output against a float32 reference computed on --check-rows query rows sampled over the sequence (all
heads, all keys): relative L2 error and the largest absolute error. Inputs: Gaussian q, k, v (seed 0) with an
outlier channel per head (a few times the bulk, as real q/k carry), in bf16.

    python bench/attention_kernels.py --out DIR       # DIR/attention_kernels.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

FP8_MAX = 448.0


def timed(fn, repeats: int, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1000.0)
    return out


def per_head_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, S, H, D) bf16 -> e4m3 with each (batch, head)'s absolute maximum at 448, and the descale (B, H) float32."""
    amax = x.abs().amax(dim=(1, 3)).float().clamp_min(1e-6)
    scale = FP8_MAX / amax
    q = (x.float() * scale[:, None, :, None]).to(torch.float8_e4m3fn)
    return q, (1.0 / scale).contiguous()


def reference(q, k, v, rows: torch.Tensor, scale: float) -> torch.Tensor:
    """float32 attention of the sampled query rows: (B, len(rows), H, D)."""
    outs = []
    for h in range(q.shape[2]):
        qh = q[:, rows, h].float()
        kh, vh = k[:, :, h].float(), v[:, :, h].float()
        p = torch.softmax(qh @ kh.transpose(-1, -2) * scale, dim=-1)
        outs.append(p @ vh)
    return torch.stack(outs, dim=2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seq", type=int, default=37966)
    parser.add_argument("--heads", type=int, default=56)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--check-rows", type=int, default=512)
    args = parser.parse_args()
    dev = "cuda"
    b, s, h, d = args.batch, args.seq, args.heads, args.head_dim
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(b, s, h, d, device=dev, generator=g, dtype=torch.bfloat16) for _ in range(3))
    for t in (q, k):  # one outlier channel per head, as real q/k have
        t[..., 7] *= 4.0
    scale = 1.0 / math.sqrt(d)
    rows = torch.linspace(0, s - 1, args.check_rows, device=dev).round().long()
    ref = reference(q, k, v, rows, scale)
    flops = 4.0 * b * h * s * s * d
    result = {"benchmark": "attention_kernels", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join(["python", *sys.argv]), "device": torch.cuda.get_device_name(0),
              "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
              "shape": {"batch": b, "seq": s, "heads": h, "head_dim": d}, "flops": flops,
              "check_rows": args.check_rows, "rows": {}}
    try:
        from importlib.metadata import version

        result["versions"] = {}
        for name in ("flash_attn_3", "sageattention"):
            try:
                result["versions"][name] = version(name)
            except Exception as exc:  # recorded: the row says why it did not run
                result["versions"][name] = f"missing ({type(exc).__name__})"
    except ImportError:
        pass

    def record(name: str, fn, out_fn, note: str = "") -> None:
        row: dict = {"note": note}
        try:
            times = timed(fn, args.repeats)
            out = out_fn()
            err = out[:, rows].float() - ref
            row.update(seconds=statistics.median(times), seconds_all=times,
                       tflops=flops / statistics.median(times) / 1e12,
                       rel_l2=float(err.norm() / ref.norm()), max_abs=float(err.abs().max()))
        except Exception as exc:  # keep the other kernels' rows
            row["error"] = f"{type(exc).__name__}: {exc}"[:500]
        result["rows"][name] = row
        print(name, {k2: v2 for k2, v2 in row.items() if k2 != "seconds_all"}, flush=True)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "attention_kernels.json").write_text(json.dumps(result, indent=1))

    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # SDPA's (B, H, S, D)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for label, backend in (("sdpa_cudnn_bf16", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash_bf16", SDPBackend.FLASH_ATTENTION)):
        def run(backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kt, vt)
        record(label, run, lambda run=run: run().transpose(1, 2))

    try:
        from flash_attn_interface import flash_attn_func as fa3
    except ImportError as exc:
        result["rows"]["fa3"] = {"error": f"flash_attn_interface not importable: {exc}"}
        fa3 = None
    if fa3 is not None:
        def out0(x):
            return x[0] if isinstance(x, tuple) else x

        record("fa3_bf16", lambda: fa3(q, k, v), lambda: out0(fa3(q, k, v)))
        q8, k8, v8 = (x.to(torch.float8_e4m3fn) for x in (q, k, v))
        record("fa3_fp8_plain", lambda: fa3(q8, k8, v8), lambda: out0(fa3(q8, k8, v8)),
               "q, k, v cast to e4m3 as they are, descale 1 (the issue's probe)")
        (qs, dq), (ks, dk), (vs, dv) = (per_head_fp8(x) for x in (q, k, v))
        record("fa3_fp8_per_head", lambda: fa3(qs, ks, vs, q_descale=dq, k_descale=dk, v_descale=dv),
               lambda: out0(fa3(qs, ks, vs, q_descale=dq, k_descale=dk, v_descale=dv)),
               "kernel alone on per-head scaled e4m3 inputs")

        def quantize_and_run():
            (a, da), (bb, db), (c, dc) = (per_head_fp8(x) for x in (q, k, v))
            return out0(fa3(a, bb, c, q_descale=da, k_descale=db, v_descale=dc))
        record("fa3_fp8_per_head_with_quant", quantize_and_run, quantize_and_run,
               "per-head amax, scale and cast of q, k, v (PyTorch ops, eager) plus the kernel")
    try:
        from sageattention import sageattn
    except ImportError as exc:
        result["rows"]["sage"] = {"error": f"sageattention not importable: {exc}"}
        sageattn = None
    if sageattn is not None:
        record("sage2_sm90", lambda: sageattn(q, k, v, tensor_layout="NHD"),
               lambda: sageattn(q, k, v, tensor_layout="NHD"), "INT8 q/k, FP8 p/v (quantization inside)")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "attention_kernels.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
