"""The step-distillation LoRA: trained as forward hooks on the DiT's block Linears, shipped in the MiniMax-H3 LoRA
format that diffusers' ``MiniMaxH3LoraLoaderMixin`` converts (the format the published turbo LoRAs come in).

Targets per transformer block, as the published H3 LoRAs: the fused ``attn.qkv_proj`` (one shared down projection,
the up projection's rows split into q, k, v), ``attn.out_proj``, ``mlp.fc1`` / ``mlp.fc2`` and the AdaLN
``adaln_proj.linear``; mixed rank (``rank`` on attention and FFN, ``adaln_rank`` on AdaLN, as the published files use
64 / 16) with the network alpha in the file's ``__metadata__`` (honoured by the loader as ``alpha / rank`` per module;
the AdaLN factors carry ``adaln_rank / rank`` so every module's delta is exactly the trained ``B @ A``).

In the original module names ``mlp.fc1``'s output is ``[gate; value]`` where diffusers' SwiGLU ``ff.net.0.proj`` is
``[value; gate]``: the export swaps the halves of ``lora_B`` back (the loader swaps them on conversion).
"""

from __future__ import annotations

import torch

KEY_PREFIX = "diffusion_model.blocks"


class DistillLora(torch.nn.Module):
    def __init__(self, transformer, rank: int, adaln_rank: int, seed: int = 0):
        super().__init__()
        self.rank, self.adaln_rank = rank, adaln_rank
        gen = torch.Generator().manual_seed(seed)
        self.factors = torch.nn.ParameterDict()
        for i, block in enumerate(transformer.transformer_blocks):
            attn, ff = block.attn, block.ff
            shapes = {
                "qkv": (attn.to_q.in_features, 3 * attn.to_q.out_features, rank),
                "out": (attn.to_out[0].in_features, attn.to_out[0].out_features, rank),
                "fc1": (ff.net[0].proj.in_features, ff.net[0].proj.out_features, rank),
                "fc2": (ff.net[2].in_features, ff.net[2].out_features, rank),
                "adaln": (block.adaln_proj.linear.in_features, block.adaln_proj.linear.out_features, adaln_rank),
            }
            for name, (fan_in, fan_out, r) in shapes.items():
                self.factors[f"{i}_{name}_A"] = torch.nn.Parameter(torch.randn(r, fan_in, generator=gen) / fan_in ** 0.5)
                self.factors[f"{i}_{name}_B"] = torch.nn.Parameter(torch.zeros(fan_out, r))
        self._hooks = []

    def modules_of(self, transformer):
        """(diffusers module name, factor name, row slice of B) for every hooked Linear."""
        out = []
        for i, block in enumerate(transformer.transformer_blocks):
            inner = block.attn.to_q.out_features
            for j, proj in enumerate(("to_q", "to_k", "to_v")):
                out.append((f"transformer_blocks.{i}.attn.{proj}", f"{i}_qkv", slice(j * inner, (j + 1) * inner)))
            out.append((f"transformer_blocks.{i}.attn.to_out.0", f"{i}_out", slice(None)))
            out.append((f"transformer_blocks.{i}.ff.net.0.proj", f"{i}_fc1", slice(None)))
            out.append((f"transformer_blocks.{i}.ff.net.2", f"{i}_fc2", slice(None)))
            out.append((f"transformer_blocks.{i}.adaln_proj.linear", f"{i}_adaln", slice(None)))
        return out

    def attach(self, transformer) -> None:
        self.detach()
        for module_name, factor, rows in self.modules_of(transformer):
            module = transformer.get_submodule(module_name)
            a, b = self.factors[f"{factor}_A"], self.factors[f"{factor}_B"]

            def hook(_m, inputs, output, a=a, b=b, rows=rows):
                x = inputs[0]
                return output + (x @ a.t().to(x.dtype)) @ b[rows].t().to(x.dtype)

            self._hooks.append(module.register_forward_hook(hook))

    def detach(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def deltas(self, transformer) -> dict[str, torch.Tensor]:
        """The weight change of every hooked Linear (diffusers names), B @ A."""
        return {name: (self.factors[f"{f}_B"][rows] @ self.factors[f"{f}_A"]).detach()
                for name, f, rows in self.modules_of(transformer)}

    def export(self) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """(state dict in the original MiniMax-H3 names, on the CPU wherever the factors are, safetensors metadata with
        the network alpha)."""
        alpha = float(self.rank)
        state: dict[str, torch.Tensor] = {}
        layers = sorted({int(k.split("_")[0]) for k in self.factors})
        for i in layers:
            f = lambda n: tuple(self.factors[f"{i}_{n}_{p}"].detach().float().cpu() for p in "AB")  # noqa: E731
            for name, source in (("attn.qkv_proj", "qkv"), ("attn.out_proj", "out"), ("mlp.fc2", "fc2")):
                a, b = f(source)
                state[f"{KEY_PREFIX}.{i}.{name}.lora_A.weight"] = a.contiguous()
                state[f"{KEY_PREFIX}.{i}.{name}.lora_B.weight"] = b.contiguous()
            a, b = f("fc1")
            value, gate = b.chunk(2, dim=0)
            state[f"{KEY_PREFIX}.{i}.mlp.fc1.lora_A.weight"] = a.contiguous()
            state[f"{KEY_PREFIX}.{i}.mlp.fc1.lora_B.weight"] = torch.cat([gate, value]).contiguous()
            a, b = f("adaln")
            state[f"{KEY_PREFIX}.{i}.adaln_proj.linear.lora_A.weight"] = a.contiguous()
            state[f"{KEY_PREFIX}.{i}.adaln_proj.linear.lora_B.weight"] = (b * (self.adaln_rank / alpha)).contiguous()
        return state, {"format": "pt", "alpha": str(alpha)}

    def load_exported(self, path) -> str:
        """Set the factors from a file :meth:`save` wrote (the inverse of :meth:`export`: ``mlp.fc1``'s halves swapped
        back, the AdaLN factor's ``adaln_rank / rank`` undone); returns the file's sha256. A file of lower rank (or
        AdaLN rank) is embedded: its factors fill the first rows of each ``A`` and the first columns of each ``B``, the
        other rows of ``A`` keep their random init and the other columns of ``B`` are zero, so every module's delta
        ``B @ A`` is the file's exactly and training adds capacity from there (a rank-16 LoRA continued at rank 64). A
        file of higher rank, another layer count or another format is refused with a ValueError naming it."""
        import hashlib
        from pathlib import Path

        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise ValueError(f"{path}: no such LoRA file")
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            state = {k: handle.get_tensor(k) for k in handle.keys()}
        blocks = len({k.split("_")[0] for k in self.factors})
        expected, _ = self.export()
        misfit = ValueError(f"{path}: its tensors do not fit this LoRA (rank {self.rank}, AdaLN rank "
                            f"{self.adaln_rank}, {blocks} blocks)")
        if set(state) != set(expected):
            raise misfit
        rank = state[f"{KEY_PREFIX}.0.attn.qkv_proj.lora_A.weight"].shape[0]
        adaln_rank = state[f"{KEY_PREFIX}.0.adaln_proj.linear.lora_A.weight"].shape[0]
        if metadata.get("alpha") != str(float(rank)):
            raise ValueError(f"{path}: network alpha {metadata.get('alpha')!r} for its rank {rank} (a distillation "
                             f"LoRA's is its rank, {float(rank)}); not a distillation LoRA")
        if rank > self.rank or adaln_rank > self.adaln_rank:
            raise misfit
        for k, v in expected.items():
            r = adaln_rank if ".adaln_proj." in k else rank
            want = (r, v.shape[1]) if k.endswith("lora_A.weight") else (v.shape[0], r)
            if tuple(state[k].shape) != want:
                raise misfit
        with torch.no_grad():
            for i in sorted({int(k.split("_")[0]) for k in self.factors}):
                get = lambda name: state[f"{KEY_PREFIX}.{i}.{name}.weight"].float()  # noqa: E731
                for name, target in (("attn.qkv_proj", "qkv"), ("attn.out_proj", "out"), ("mlp.fc2", "fc2"),
                                     ("mlp.fc1", "fc1"), ("adaln_proj.linear", "adaln")):
                    a, b = get(f"{name}.lora_A"), get(f"{name}.lora_B")
                    if target == "fc1":
                        gate, value = b.chunk(2, dim=0)
                        b = torch.cat([value, gate])
                    elif target == "adaln":
                        b = b * (float(rank) / adaln_rank)
                    r = a.shape[0]
                    self.factors[f"{i}_{target}_A"][:r].copy_(a)
                    self.factors[f"{i}_{target}_B"][:, :r].copy_(b)
                    self.factors[f"{i}_{target}_B"][:, r:].zero_()
        return hashlib.sha256(path.read_bytes()).hexdigest()

    def save(self, path, metadata: dict[str, str] | None = None) -> None:
        """Write :meth:`export`'s file atomically, byte for byte the same for the same factors (h3.levers.lora
        .save_lora_file); ``metadata``: more ``__metadata__`` entries beside the alpha."""
        from h3.levers.lora import save_lora_file

        state, alpha = self.export()
        save_lora_file(path, state, {**(metadata or {}), **alpha})


def loaded_deltas(path) -> dict[str, torch.Tensor]:
    """What diffusers' loader makes of a LoRA file: per diffusers module, scaling * B @ A (the loader's conversion and
    its metadata-alpha rule, as the lever applies them)."""
    from diffusers.loaders.lora_pipeline import MiniMaxH3LoraLoaderMixin

    state, metadata = MiniMaxH3LoraLoaderMixin.lora_state_dict(str(path), return_lora_metadata=True)
    alpha = None
    if metadata:
        alpha = metadata.get("transformer.lora_alpha")
    out = {}
    for key in state:
        if key.endswith(".lora_A.weight"):
            module = key.removeprefix("transformer.").removesuffix(".lora_A.weight")
            a, b = state[key].float(), state[key.replace("lora_A", "lora_B")].float()
            rank = b.shape[1]
            out[module] = (alpha / rank if alpha is not None else 1.0) * (b @ a)
    return out
