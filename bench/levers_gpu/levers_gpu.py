"""GPU checks and kernel timings of the levers' numerics on one CUDA device (not a test: CI has no GPU).

- quantized linears (INT8 weight-only, INT8 W8A8 via ``torch._int_mm``, FP8 W8A8 via ``torch._scaled_mm``) at
  MiniMax-H3's width (hidden 5376, FFN 14336): relative error against float64 with unquantized weights, and time
  against the bf16 ``F.linear``;
- block-sparse attention (compiled flex_attention, ``BlockMask.from_kv_blocks``) at a long packed sequence: sparsity 0
  vs SDPA, sparsity 0.5 vs SDPA under the same token mask, time vs dense SDPA;
- padding: a bucketed SDPA call with garbage in the padding rows gives the same real rows bit for bit;
- group offloading with stream prefetch (pinned memory) on the tiny transformer, when diffusers is importable.

Run: ``python bench/levers_gpu/levers_gpu.py [OUT_DIR]``; writes levers_gpu_h200.json/.md into bench/levers_gpu/results (or OUT_DIR).
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.speed import cuda_time  # noqa: E402

from h3.levers.quantization import QuantizedLinear  # noqa: E402
from h3.levers.sparse_attention import block_sparse_attention, kept_block_mask, route_blocks  # noqa: E402


def timed(fn, warmup=3, reps=10) -> float:
    """Median milliseconds (upper middle) of ``reps`` CUDA-event-timed calls after ``warmup``."""
    times = cuda_time(fn, reps, warmup)
    return sorted(times)[len(times) // 2] * 1000.0


def rel(actual, expected) -> dict[str, float]:
    a, e = actual.double(), expected.double()
    return {"rel_max": float((a - e).abs().max() / e.abs().max()), "rel_l2": float((a - e).norm() / e.norm())}


@torch.no_grad()
def quant_rows():
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for k, n in ((5376, 5376), (5376, 14336)):
        linear = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
        linear.weight.copy_(torch.randn(n, k, device="cuda", generator=gen) / math.sqrt(k))
        x = torch.randn(4096, k, device="cuda", generator=gen).bfloat16()
        exact = x.double() @ linear.weight.double().T
        dense_ms = timed(lambda: torch.nn.functional.linear(x, linear.weight))
        rows.append({"op": f"bf16 linear {k}->{n}, 4096 tokens", "ms": dense_ms, **rel(linear(x), exact)})
        for mode in ("int8_weight_only", "int8_w8a8", "fp8_w8a8"):
            q = QuantizedLinear(linear, mode)
            rows.append({"op": f"{mode} {k}->{n}, 4096 tokens", "ms": timed(lambda: q(x)), **rel(q(x), exact)})
            # Under the compile lever the activation quantization fuses with its neighbours.
            qc = torch.compile(q)
            rows.append({"op": f"{mode} {k}->{n}, 4096 tokens, torch.compile", "ms": timed(lambda: qc(x)),
                         **rel(qc(x), exact)})
    return rows


@torch.no_grad()
def sparse_rows(seq=16384, heads=8, dim=128, block=128):
    gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(1, seq, heads, dim, device="cuda", generator=gen).bfloat16() for _ in range(3))
    sdpa = lambda mask=None: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
        *(t.permute(0, 2, 1, 3) for t in (q, k, v)), attn_mask=mask).permute(0, 2, 1, 3)
    dense = sdpa()
    dense_ms = timed(sdpa)
    rows = [{"op": f"dense SDPA S={seq} H={heads} D={dim}", "ms": dense_ms}]
    for sparsity, valid in ((0.0, None), (0.5, None), (0.75, None), (0.5, seq - 37)):
        kv_num, kv_idx = route_blocks(q, k, block, sparsity, valid_len=valid)
        out = block_sparse_attention(q, k, v, kv_num, kv_idx, block, valid_len=valid)
        if sparsity == 0.0:
            err = rel(out, dense)
        else:
            kept = kept_block_mask(kv_num, kv_idx)[0]
            token = kept.repeat_interleave(block, 1).repeat_interleave(block, 2)[:, :seq, :seq]
            if valid is not None:
                token = token & (torch.arange(seq, device="cuda") < valid)
            err = rel(out[:, :valid], sdpa(token[None])[:, :valid])
            del token
        ms = timed(lambda: block_sparse_attention(q, k, v, kv_num, kv_idx, block, valid_len=valid))
        route_ms = timed(lambda: route_blocks(q, k, block, sparsity, valid_len=valid))
        label = f"block-sparse flex sparsity {sparsity} (block {block})" + (f", {seq - valid} padding rows" if valid else "")
        rows.append({"op": label, "ms": ms, "route_ms": route_ms, **err})
    return rows


@torch.no_grad()
def padding_row():
    gen = torch.Generator(device="cuda").manual_seed(2)
    seq, valid = 1024, 1000
    q, k, v = (torch.randn(1, 8, seq, 128, device="cuda", generator=gen).bfloat16() for _ in range(3))
    mask = (torch.arange(seq, device="cuda") < valid).view(1, 1, 1, seq)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, valid:], v2[:, :, valid:] = 30.0, -30.0
    a = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    b = torch.nn.functional.scaled_dot_product_attention(q, k2, v2, attn_mask=mask)
    return {"op": "SDPA bool key mask, garbage padding", "bit_identical": bool(torch.equal(a, b))}


def _wide_model_and_inputs(n_text=32):
    from diffusers import MiniMaxH3Transformer3DModel

    cfg = dict(num_attention_heads=4, attention_head_dim=128, hidden_size=512, num_layers=8, num_refiner_layers=1,
               ffn_dim=1024, text_dim=64, freq_dim=64, time_embed_hidden_dim=128, time_embed_dim=64, rope_freq_dim=16)
    torch.manual_seed(0)
    model = MiniMaxH3Transformer3DModel(**cfg).eval()

    def inputs(n_text):
        n_video, n_audio = 1024, 200
        seq = n_video + n_audio + n_text
        g = torch.Generator().manual_seed(n_text)
        kw = dict(
            hidden_states=torch.randn(1, n_video, 96, generator=g), audio_hidden_states=torch.randn(1, n_audio, 32, generator=g),
            encoder_hidden_states=torch.randn(1, n_text, 64, generator=g), timestep=torch.tensor([0.3, 0.6]),
            timestep_indices=torch.randint(0, 2, (seq,), generator=g),
            token_tags=torch.cat([torch.ones(n_text), torch.zeros(n_video), 2 * torch.ones(n_audio)]).long(),
            position_ids=torch.randint(0, 16, (seq, 3), generator=g), text_indices=torch.arange(n_text),
            video_indices=torch.arange(n_text, n_text + n_video), audio_indices=torch.arange(n_text + n_video, seq),
            return_dict=False,
        )
        return {k: (v.cuda() if torch.is_tensor(v) else v) for k, v in kw.items()}

    return cfg, model, inputs


@torch.no_grad()
def compile_rows():
    try:
        cfg, model, inputs = _wide_model_and_inputs()
    except Exception as exc:  # noqa: BLE001
        return [{"op": "compile", "skipped": f"{type(exc).__name__}: {exc}"}]
    import copy

    from h3.levers.bucketing import BucketingConfig, apply_bucketing
    from h3.levers.compile import CompileConfig, apply_compile

    rows = []
    model = model.cuda()
    lengths = (32, 35, 40, 47)
    for bucketed in (False, True):
        torch._dynamo.reset()
        m = copy.deepcopy(model)
        if bucketed:
            apply_bucketing(m, BucketingConfig(multiple=64))
        handle = apply_compile(m, CompileConfig(backend="inductor"))
        per_len = []
        for n in lengths:
            handle.begin_request()
            t0 = time.perf_counter()
            out = m(**inputs(n))[0]
            torch.cuda.synchronize()
            first_s = time.perf_counter() - t0
            ref = model(**inputs(n))[0]
            per_len.append({"text_tokens": n, "first_call_s": round(first_s, 3),
                            "graphs_this_request": handle.telemetry()["graphs_compiled_this_request"],
                            **rel(out, ref)})
        rows.append({"op": f"compile_repeated_blocks inductor, {'64-row buckets' if bucketed else 'exact lengths'}",
                     "per_length": per_len, **handle.telemetry()})
    torch._dynamo.reset()
    return rows


def offload_row():
    try:
        from diffusers import MiniMaxH3Transformer3DModel
    except Exception as exc:  # noqa: BLE001 - report why the check did not run
        return {"op": "group offload", "skipped": f"{type(exc).__name__}: {exc}"}
    from types import SimpleNamespace

    from h3.levers.offload import OffloadConfig, apply_offload

    cfg = dict(num_attention_heads=4, attention_head_dim=128, hidden_size=512, num_layers=8, num_refiner_layers=1,
               ffn_dim=1024, text_dim=64, freq_dim=64, time_embed_hidden_dim=128, time_embed_dim=64, rope_freq_dim=16)
    torch.manual_seed(0)
    model = MiniMaxH3Transformer3DModel(**cfg).eval()
    reference = MiniMaxH3Transformer3DModel(**cfg).eval()
    reference.load_state_dict(model.state_dict())
    reference.cuda()
    n_video, n_audio, n_text = 1024, 200, 32
    seq = n_video + n_audio + n_text
    kwargs = dict(
        hidden_states=torch.randn(1, n_video, 96), audio_hidden_states=torch.randn(1, n_audio, 32),
        encoder_hidden_states=torch.randn(1, n_text, 64), timestep=torch.tensor([0.3, 0.6]),
        timestep_indices=torch.randint(0, 2, (seq,)), token_tags=torch.cat([torch.ones(n_text), torch.zeros(n_video),
                                                                          2 * torch.ones(n_audio)]).long(),
        position_ids=torch.randint(0, 16, (seq, 3)), text_indices=torch.arange(n_text),
        video_indices=torch.arange(n_text, n_text + n_video), audio_indices=torch.arange(n_text + n_video, seq),
        return_dict=False,
    )
    kwargs = {k: (v.cuda() if torch.is_tensor(v) else v) for k, v in kwargs.items()}
    handle = apply_offload(SimpleNamespace(transformer=model, text_encoder=None),
                           OffloadConfig(use_stream=True), onload_device="cuda")
    with torch.no_grad():
        ref = reference(**kwargs)[0]
        torch.cuda.reset_peak_memory_stats()
        out = model(**kwargs)[0]
        peak = torch.cuda.max_memory_allocated()
        ms = timed(lambda: model(**kwargs), warmup=1, reps=5)
        ref_ms = timed(lambda: reference(**kwargs), warmup=1, reps=5)
    return {"op": "group offload (block level, stream prefetch) tiny-wide transformer", "ms": ms,
            "resident_ms": ref_ms, "bit_identical": bool(torch.equal(out, ref)), "peak_bytes": peak,
            **handle.telemetry()}


def main():
    out_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    data = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(["python", *sys.argv]),
        "machine": {"platform": platform.platform(), "gpu": torch.cuda.get_device_name(),
                    "capability": list(torch.cuda.get_device_capability())},
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda},
        "quantization": quant_rows(),
        "sparse_attention": sparse_rows(),
        "padding": padding_row(),
        "offload": offload_row(),
        "compile": compile_rows(),
    }
    (out_dir / "levers_gpu_h200.json").write_text(json.dumps(data, indent=2) + "\n")
    lines = [f"# levers_gpu_h200\n\n- date: {data['date']}\n- command: `{data['command']}`\n"
             f"- machine: {data['machine']}\n- versions: {data['versions']}\n",
             "| op | ms | rel max err | rel L2 err |", "|---|---|---|---|"]
    for row in data["quantization"] + data["sparse_attention"]:
        lines.append(f"| {row['op']} | {row['ms']:.3f} | {row.get('rel_max', float('nan')):.2e} | "
                     f"{row.get('rel_l2', float('nan')):.2e} |")
    lines += ["", f"padding: {data['padding']}", "", f"offload: {data['offload']}", ""]
    lines += [f"compile: {row}" for row in data["compile"]]
    (out_dir / "levers_gpu_h200.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
