"""h3.train.grow: the shipped DiT grown to more blocks computes the shipped function exactly (float64, against the
shipped model itself), its new blocks still learn (gradients reach them), ``unpack --grow-dit`` seeds a state that
the run and the export accept at the grown shape and h3's loader reads back, and bad input is one clear error."""

from __future__ import annotations

import json

import pytest
import torch

from h3.tiny_trained import TRAINED_DIR
from h3.train.grow import grow_dit, layer_plan
from h3.train.packing import t2va_layout

BLOCK = "transformer_blocks."


def shipped_weights() -> tuple[dict, dict]:
    from safetensors.torch import load_file

    from h3.tiny_trained import shipped_transformer_config

    return (load_file(str(TRAINED_DIR / "transformer" / "diffusion_pytorch_model.safetensors")),
            shipped_transformer_config(TRAINED_DIR))


def model_of(weights: dict, config: dict, dtype=torch.float64):
    from diffusers import MiniMaxH3Transformer3DModel

    model = MiniMaxH3Transformer3DModel(**config)
    model.load_state_dict(weights, strict=True)
    return model.to(dtype).eval()


def inputs(dtype=torch.float64, batch=2, seed=0):
    """A t2va layout at the tiny canvas (9 text rows, 4 of them a vision block) and seeded latents, text and
    per-request timesteps."""
    tags = torch.ones(9, dtype=torch.long)
    tags[2:6] = 0
    layout = t2va_layout(tags)
    gen = torch.Generator().manual_seed(seed)
    video = torch.randn(batch, len(layout.video_indices), 96, generator=gen, dtype=dtype)
    audio = torch.randn(batch, len(layout.audio_indices), 32, generator=gen, dtype=dtype)
    text = torch.randn(batch, 9, 32, generator=gen, dtype=dtype)
    return layout, video, audio, text, torch.rand(batch, generator=gen), torch.rand(batch, generator=gen)


def velocity(model, layout, video, audio, text, tv, ta) -> torch.Tensor:
    from h3.train.packing import packed_forward

    pv, pa = packed_forward(model, layout, video, audio, text, tv, ta)
    return torch.cat([pv.reshape(-1), pa.reshape(-1)])


def test_layer_plan_spreads_the_new_blocks_over_the_stack():
    assert layer_plan(4, 8) == [(0, False), (0, True), (1, False), (1, True), (2, False), (2, True), (3, False),
                                (3, True)]
    assert [i for i, (_, new) in enumerate(layer_plan(4, 6)) if new] == [2, 5]  # after old blocks 1 and 3
    assert [s for s, new in layer_plan(4, 12) if new] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [s for s, new in layer_plan(4, 5) if not new] == [0, 1, 2, 3]


@pytest.mark.parametrize("layers,init", [(8, "copy"), (6, "fresh")])
def test_the_grown_shipped_dit_computes_the_shipped_function(layers, init):
    """Float64, random latents / timesteps / text through the training's packed forward: the grown model's velocity is
    the shipped model's (max abs difference <= 1e-12; the zeroed projections make it exactly 0 here). A planted
    defect, one new block's feed-forward output left as copied, moves the output by far more: the check can fail."""
    weights, config = shipped_weights()
    grown, grown_config, info = grow_dit(weights, config, layers, init)
    assert grown_config == {**config, "num_layers": layers} and info["from"] == {"num_layers": config["num_layers"]}
    new = info["new_blocks"]
    assert len(new) == layers - config["num_layers"] and info["init"] == init
    assert sorted(info["zeroed"]) == ["attn.to_out.0.weight", "ff.net.2.weight"]
    shipped, bigger = model_of(weights, config), model_of(grown, grown_config)
    args = inputs()
    with torch.no_grad():
        want, got = velocity(shipped, *args), velocity(bigger, *args)
    assert float(want.abs().max()) > 0.1  # a trained DiT's velocity, not zeros
    assert float((got - want).abs().max()) <= 1e-12
    # the old blocks are the shipped ones, in order; the new ones are not zero apart from the two projections
    old = [i for i in range(layers) if i not in new]
    for i, position in enumerate(old):
        assert all(torch.equal(grown[f"{BLOCK}{position}.{s}"], v) for k, v in weights.items()
                   if k.startswith(f"{BLOCK}{i}.") for s in [k[len(f"{BLOCK}{i}."):]])
    for position in new:
        for key, value in grown.items():
            if key.startswith(f"{BLOCK}{position}."):
                zero = key.endswith(("attn.to_out.0.weight", "ff.net.2.weight"))
                assert bool((value == 0).all()) == zero, key
    if init == "copy":
        source = info["copied_from"][0]
        assert torch.equal(grown[f"{BLOCK}{new[0]}.attn.to_q.weight"], weights[f"{BLOCK}{source}.attn.to_q.weight"])

    planted = dict(grown)
    planted[f"{BLOCK}{new[0]}.ff.net.2.weight"] = weights["transformer_blocks.0.ff.net.2.weight"].clone()
    with torch.no_grad():
        off = velocity(model_of(planted, grown_config), *args)
    assert float((off - want).abs().max()) > 1e-4


def test_gradients_reach_the_new_blocks():
    """One backward of a flow-matching-like loss reaches the new blocks' output projections (the only parameters of
    theirs the zero outputs let through at step 0, exactly as the identity argument says), and after one AdamW step
    every parameter of every new block gets a non-zero gradient."""
    weights, config = shipped_weights()
    grown, grown_config, info = grow_dit(weights, config, 8)
    model = model_of(grown, grown_config).train()
    layout, video, audio, text, tv, ta = inputs(batch=1, seed=3)
    target = torch.randn(velocity(model, layout, video, audio, text, tv, ta).shape,
                         generator=torch.Generator().manual_seed(4), dtype=torch.float64)

    def step_grads():
        model.zero_grad(set_to_none=True)
        (velocity(model, layout, video, audio, text, tv, ta) - target).pow(2).mean().backward()
        return {n: (p.grad.abs().max() if p.grad is not None else torch.tensor(0.0)) for n, p in
                model.named_parameters() if n.startswith(tuple(f"{BLOCK}{i}." for i in info["new_blocks"]))}

    first = step_grads()
    reached = sorted({n.split(".", 2)[2] for n, g in first.items() if g > 0})
    assert reached == ["attn.to_out.0.weight", "ff.net.2.weight"]
    assert all(first[f"{BLOCK}{i}.{s}"] > 1e-8 for i in info["new_blocks"] for s in reached)
    torch.optim.AdamW(model.parameters(), lr=1e-3).step()
    second = step_grads()
    assert len(second) == 12 * len(info["new_blocks"]) and all(g > 0 for g in second.values()), \
        sorted(n for n, g in second.items() if not g > 0)


def test_unpack_grows_the_dit_and_its_export_loads_at_the_grown_shape(tmp_path, capsys):
    """``unpack --from h3/assets/tiny --continue dit:N --grow-dit num_layers=8``: the DiT state is the grown shipped
    one (weights = EMA), re-opened with AdamW restarted, normalized with the checkpoint's latent statistics, and its
    ``seeded_from`` says 4 -> 8; a run of the grown shape accepts it and the shipped shape is refused; the export
    stage writes it as an 8-block transformer that h3's loader reads (``shipped_transformer_config``, the runtime)
    and that computes the shipped function (float64, <= 1e-12)."""
    from diffusers import MiniMaxH3Transformer3DModel

    from h3.recipe import load_recipe, recipe_from_dict
    from h3.runtime import H3Runtime
    from h3.tiny_trained import shipped_transformer_config
    from h3.train.__main__ import main
    from h3.train.common import TrainConfig, load_state
    from h3.train.distill import DistillLora
    from h3.train.run import _export_stage, check_dit_shape, components
    from h3.train.travel import _checkpoint_latent_stats

    weights, config = shipped_weights()
    steps = json.loads((TRAINED_DIR / "training_record.json").read_text())["stages"]["dit"]["steps"]
    out = tmp_path / "run"
    assert main(["unpack", "--out", str(out), "--from", str(TRAINED_DIR), "--continue", f"dit:{steps + 100}",
                 "--grow-dit", "num_layers=8"]) == 0
    assert "dit: grown 4 -> 8 blocks (new 1, 3, 5, 7, init copy" in capsys.readouterr().out
    dit = load_state(out / "state" / "dit" / "state.pt")
    grown, grown_config, info = grow_dit(weights, config, 8)
    assert dit["model"].keys() == grown.keys() == dit["ema"].keys()
    assert all(torch.equal(dit["model"][k], v) and torch.equal(dit["ema"][k], v) for k, v in grown.items())
    assert (dit["step"], dit["total_steps"], dit["warm_from"]) == (steps, steps + 100, steps) and "opt" not in dit
    assert dit["latent_stats"] == _checkpoint_latent_stats(TRAINED_DIR)
    assert dit["seeded_from"]["grown"] == info and info["to"] == {"num_layers": 8}
    cfg = TrainConfig.smoke(dit_num_layers=8)
    check_dit_shape(MiniMaxH3Transformer3DModel(**cfg.transformer_config()), out / "state")
    with pytest.raises(ValueError, match="another shape than this run's"):
        check_dit_shape(MiniMaxH3Transformer3DModel(**TrainConfig.smoke().transformer_config()), out / "state")

    # the export stage as run() calls it, with the pool's statistics and a LoRA standing in for those stages
    class Stats:
        video_stats, audio_stats = dit["latent_stats"]["video"], dit["latent_stats"]["audio"]

    comps = components(cfg)
    _export_stage(comps, cfg, out, Stats(), DistillLora(comps["transformer"], 4, 2), None, "test", "")
    exported = out / "tiny"
    assert shipped_transformer_config(exported) == grown_config
    record = json.loads((exported / "training_record.json").read_text())
    assert record["seeded_from_checkpoint"]["dit"]["grown"] == info
    recipe = recipe_from_dict({**load_recipe("baseline").model_dump(), "dtype": "float32"})
    runtime = H3Runtime.load(str(exported), recipe, "cpu", transformer_dtype="float64")
    loaded = runtime.pipe.transformer
    assert len(loaded.transformer_blocks) == 8 and next(loaded.parameters()).dtype == torch.float64
    args = inputs(seed=7)
    with torch.no_grad():
        diff = velocity(loaded, *args) - velocity(model_of(weights, config), *args)
    assert float(diff.abs().max()) <= 1e-12


BAD = [
    (["--continue", "dit", "--grow-dit", "num_layers=3"], "the checkpoint's DiT has 4 blocks; growing needs more"),
    (["--continue", "dit", "--grow-dit", "num_layers=4"], "the checkpoint's DiT has 4 blocks; growing needs more"),
    (["--continue", "dit", "--grow-dit", "num_layers=8.5"], "num_layers must be a whole number, got '8.5'"),
    (["--continue", "dit", "--grow-dit", "num_layers=eight"], "num_layers must be a whole number, got 'eight'"),
    (["--continue", "dit", "--grow-dit", "8"], "give KEY=VALUE items"),
    (["--continue", "dit", "--grow-dit", "num_layers=8,init=zero"], "init must be one of copy, fresh"),
    (["--continue", "dit", "--grow-dit", "hidden_size=192"], "only depth grows function-preservingly"),
    (["--continue", "dit", "--grow-dit", "layers=8"], "unknown key 'layers'"),
    (["--grow-dit", "num_layers=8"], "--grow-dit needs --continue dit"),
    (["--fresh", "dit", "--grow-dit", "num_layers=8"], "--grow-dit with --fresh dit"),
]


@pytest.mark.parametrize("extra,message", BAD)
def test_bad_grow_input_is_one_clear_error(tmp_path, capsys, extra, message):
    from h3.train.__main__ import main

    capsys.readouterr()
    assert main(["unpack", "--out", str(tmp_path / "bad"), "--from", str(TRAINED_DIR), *extra]) == 3
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "bad" / "state").exists() or not any((tmp_path / "bad" / "state").iterdir())


def test_a_pack_cannot_be_grown(tmp_path, capsys):
    from h3.train.__main__ import main

    (tmp_path / "x.pack").write_bytes(b"")
    assert main(["unpack", "--out", str(tmp_path / "bad"), "--from", str(tmp_path / "x.pack"),
                 "--grow-dit", "num_layers=8"]) == 3
    assert "--grow-dit needs --from CHECKPOINT_DIR" in capsys.readouterr().err
