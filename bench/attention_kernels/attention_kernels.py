"""Benchmark (not a test): attention kernels at MiniMax-H3's shape on one GPU (issue 23), one call of each.

The shape of one DiT attention at 5 s 768x1344: batch 1, 56 heads of 128, 37,966 rows (text + audio + video).
Kernels, each where installed: PyTorch SDPA on cuDNN and on its flash kernel (bf16), FlashAttention-3 (``flash_attn_3``
built from Dao-AILab/flash-attention's ``hopper/``) in bf16 and in FP8 e4m3 (q, k and v cast plainly with descale 1,
and scaled per head: each head's absolute maximum mapped to 448 and its descale passed to the kernel), and
SageAttention 2.2's sm90 kernel (``sageattn``: INT8 q/k, FP8 p/v).

Time: CUDA events around each call, warm-up then the median of --repeats calls; the FP8 rows are timed twice, the
kernel alone on quantized inputs and with the quantization of q, k and v included (what a lever pays per call), in
eager ops and compiled (the lever's two ``quantize`` settings).
Error: every output against a float32 reference computed on --check-rows query rows sampled over the sequence (all
heads, all keys): relative L2 error and the largest absolute error. Inputs: Gaussian q, k, v (seed 0) with an
outlier channel per head (a few times the bulk, as real q/k carry), in bf16.

    python bench/attention_kernels/attention_kernels.py --out DIR       # DIR/attention_kernels.json
    python bench/attention_kernels/attention_kernels.py --render DIR/attention_kernels.json --name attention_kernels_h200
                                                      # bench/<study>/results/NAME.{json,md} (notes by hand after)
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.speed import cuda_time  # noqa: E402
from h3.levers.fp8_attention import compiled_quantize_qkv, per_head_e4m3  # noqa: E402  (the lever's own quantization)



def reference(q, k, v, rows: torch.Tensor, scale: float) -> torch.Tensor:
    """float32 attention of the sampled query rows: (B, len(rows), H, D)."""
    outs = []
    for h in range(q.shape[2]):
        qh = q[:, rows, h].float()
        kh, vh = k[:, :, h].float(), v[:, :, h].float()
        p = torch.softmax(qh @ kh.transpose(-1, -2) * scale, dim=-1)
        outs.append(p @ vh)
    return torch.stack(outs, dim=2)


def markdown(r: dict) -> str:
    sh = r["shape"]
    lines = [f"# Attention kernels at MiniMax-H3's shape ({r['device']})", "",
             f"- date: {r['date']}; torch {r['torch']} (CUDA {r['cuda']}), python {r['python']}; "
             + ", ".join(f"{k} {v}" for k, v in r.get("versions", {}).items()),
             f"- command: `{r['command']}`",
             f"- shape: batch {sh['batch']}, {sh['heads']} heads of {sh['head_dim']}, {sh['seq']} rows (one DiT attention "
             f"at 5 s 768x1344); {r['flops'] / 1e12:.1f} TFLOP a call (4 B H S^2 D)",
             f"- error: against float32 attention on {r['check_rows']} query rows sampled over the sequence (all heads, "
             "all keys); inputs Gaussian (seed 0) in bf16 with one outlier channel (x4) per head in q and k", "",
             "| kernel | time (ms) | TFLOP/s | relative L2 error | max abs error | note |", "|---|---|---|---|---|---|"]
    for name, row in r["rows"].items():
        if "error" in row:
            lines.append(f"| {name} | not run: {row['error']} | | | | |")
            continue
        lines.append(f"| {name} | {row['seconds'] * 1e3:.1f} | {row['tflops']:.0f} | {row['rel_l2']:.4f} | "
                     f"{row['max_abs']:.4f} | {row.get('note', '')} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--render", type=Path, help="a result JSON to write into results/ as --name (.json, .md)")
    parser.add_argument("--name", default="attention_kernels")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--seq", type=int, default=37966)
    parser.add_argument("--heads", type=int, default=56)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--check-rows", type=int, default=512)
    args = parser.parse_args()
    if args.render:
        result = json.loads(args.render.read_text())
        results = Path(__file__).resolve().parent / "results"
        (results / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
        (results / f"{args.name}.md").write_text(markdown(result))
        print(markdown(result), end="")
        return 0
    if args.out is None:
        parser.error("--out is required (or --render)")
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
            times = cuda_time(fn, args.repeats, warmup=3)
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
        (qs, dq), (ks, dk), (vs, dv) = (per_head_e4m3(x) for x in (q, k, v))
        record("fa3_fp8_per_head", lambda: fa3(qs, ks, vs, q_descale=dq, k_descale=dk, v_descale=dv),
               lambda: out0(fa3(qs, ks, vs, q_descale=dq, k_descale=dk, v_descale=dv)),
               "kernel alone on per-head scaled e4m3 inputs")

        def quantize_and_run():
            (a, da), (bb, db), (c, dc) = (per_head_e4m3(x) for x in (q, k, v))
            return out0(fa3(a, bb, c, q_descale=da, k_descale=db, v_descale=dc))
        record("fa3_fp8_per_head_with_quant", quantize_and_run, quantize_and_run,
               "per-head amax, scale and cast of q, k, v (PyTorch ops, eager) plus the kernel")

        def compiled_quantize_and_run():
            (a, da), (bb, db), (c, dc) = compiled_quantize_qkv(q, k, v)
            return out0(fa3(a, bb, c, q_descale=da, k_descale=db, v_descale=dc))
        record("fa3_fp8_per_head_with_compiled_quant", compiled_quantize_and_run, compiled_quantize_and_run,
               "the same quantization as one inductor graph (the lever's quantize = 'compiled') plus the kernel")
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
