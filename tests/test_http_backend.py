"""The http backend against a foreign server of the videos API that misbehaves on purpose.

The foreign server is a small FastAPI app on real uvicorn: it stands in for a server we do not run here (SGLang),
serving a real MP4; each fault is one mode of it.
"""

from __future__ import annotations

import hashlib
import threading
import time

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.responses import Response, StreamingResponse

from h3.media import decode_audio, decode_video, encode_mp4
from h3.recipe import recipe_from_dict
from h3.runtime import GenerateRequest, TINY_DEFAULT_SIZE
from h3eval.backends import BackendError
from h3eval.backends.http import HttpBackend, ServerPool, parse_urls
from h3eval.synth import moving_square_frames, tone_pcm
from tests._serving import free_port, serving

RECIPE = recipe_from_dict({"name": "fast", "steps": 2, "dtype": "float32"})
REQUEST = GenerateRequest(prompt="a cat", seed=0, prompt_id="a")


@pytest.fixture(scope="module")
def clip_bytes(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("foreign") / "clip.mp4"
    encode_mp4(path, moving_square_frames(124, 64), tone_pcm(124 / 24))
    return path.read_bytes()


def foreign_app(mode: str, clip: bytes, seen: list) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": "foreign", "object": "model"}]}

    @app.post("/v1/videos")
    async def create(body: dict):
        seen.append(body)
        return {"id": "vid1", "status": "queued"}

    @app.get("/v1/videos/{vid}")
    def job(vid: str):
        if mode == "failed":
            return {"id": vid, "status": "failed", "error": {"message": "CUDA out of memory"}}
        if mode == "never":
            return {"id": vid, "status": "in_progress"}
        return {"id": vid, "status": "completed", "inference_time_s": 12.5, "peak_memory_mb": 2048.0}

    @app.get("/v1/videos/{vid}/content")
    def content(vid: str):
        if mode == "cut":
            async def half():
                yield clip[: len(clip) // 2]
            return StreamingResponse(half(), media_type="video/mp4", headers={"content-length": str(len(clip))})
        if mode == "corrupt":
            return Response(clip[: len(clip) // 3], media_type="video/mp4")
        return Response(clip, media_type="video/mp4")

    return app


def test_foreign_server_clip_is_recorded_with_decoded_hashes(clip_bytes, tmp_path):
    seen = []
    with serving(foreign_app("ok", clip_bytes, seen)) as url:
        backend = HttpBackend([url], TINY_DEFAULT_SIZE, poll_interval_s=0.01, extra_fields={"negative_prompt": "blur"})
        record = backend.generate(RECIPE, REQUEST, tmp_path / "a-s0.mp4", {"warmup": False})
    height, width = TINY_DEFAULT_SIZE
    assert seen == [{"prompt": "a cat", "seed": 0, "size": f"{width}x{height}", "num_frames": 124, "fps": 24,
                     "num_inference_steps": 2, "negative_prompt": "blur"}]
    assert (tmp_path / "a-s0.mp4").read_bytes() == clip_bytes
    frames, _ = decode_video(tmp_path / "a-s0.mp4")
    audio, _ = decode_audio(tmp_path / "a-s0.mp4")
    pcm = np.ascontiguousarray(np.rint(np.clip(audio, -1, 1) * 32767).astype(np.int16).T)
    assert record.frames_sha256 == hashlib.sha256(frames.tobytes()).hexdigest()
    assert record.pcm_sha256 == hashlib.sha256(pcm.tobytes()).hexdigest()
    assert record.extra["hash_source"] == "decoded" and "executed" in record.extra["unreported"]
    assert record.timings.generation_side_latency_s == 12.5  # the server's inference_time_s
    assert record.peak_memory_bytes == 2048 * 2**20
    assert record.timings.request_to_file_latency_s == record.extra["client_wall_s"] > 0


@pytest.mark.parametrize("mode,message", [
    ("failed", "failed on the server: CUDA out of memory"),
    ("never", "did not complete within"),
    ("cut", "download cut short"),
    ("corrupt", "does not decode"),
])
def test_faults_leave_nothing_behind(mode, message, clip_bytes, tmp_path):
    with serving(foreign_app(mode, clip_bytes, [])) as url:
        backend = HttpBackend([url], TINY_DEFAULT_SIZE, poll_interval_s=0.01, timeout_s=1.0)
        with pytest.raises(BackendError, match=message):
            backend.generate(RECIPE, REQUEST, tmp_path / "a-s0.mp4")
    assert list(tmp_path.iterdir()) == []


def test_unreachable_server(tmp_path):
    backend = HttpBackend([f"http://127.0.0.1:{free_port()}"], TINY_DEFAULT_SIZE, connect_timeout_s=1.0)
    with pytest.raises(BackendError, match="unreachable|ConnectError"):
        backend.generate(RECIPE, REQUEST, tmp_path / "a-s0.mp4")
    assert list(tmp_path.iterdir()) == []


def test_url_routing():
    shared, per = parse_urls(["http://a:1", "fast=http://b:2/", "fast=http://c:3"])
    assert shared == ["http://a:1"] and per == {"fast": ["http://b:2", "http://c:3"]}
    backend = HttpBackend(["fast=http://b:2"], TINY_DEFAULT_SIZE)
    assert backend.concurrency == 1
    with pytest.raises(BackendError, match="no --url serves recipe 'other'"):
        backend.servers_for("other")
    with pytest.raises(ValueError, match="--url must be"):
        parse_urls(["localhost:30000"])


def test_a_server_goes_to_the_request_that_waited_for_it_first():
    """Two recipes on one server: a request that asks for the server just as it comes back must not overtake one that
    has waited for it (queue.Queue let it: the A/B run's interleaving broke on a shared multi-recipe server)."""
    pool = ServerPool(("http://a:1",))
    held = pool.get()
    got: list[str] = []

    def waiter():
        url = pool.get()
        got.append("waited")
        time.sleep(0.05)
        pool.put(url)

    thread = threading.Thread(target=waiter)
    thread.start()
    deadline = time.monotonic() + 10
    while not pool._waiting and time.monotonic() < deadline:  # the waiter is in line
        time.sleep(0.001)
    pool.put(held)
    url = pool.get()  # asks at once: served after the waiter, not before
    got.append("asked late")
    pool.put(url)
    thread.join(10)
    assert got == ["waited", "asked late"]
    # Two servers: both handed out at once.
    pool = ServerPool(("http://a:1", "http://b:2"))
    assert {pool.get(), pool.get()} == {"http://a:1", "http://b:2"}


def test_ab_fans_out_over_several_servers(clip_bytes, tmp_path):
    from h3eval.commands.ab import run_ab_command
    from tests.conftest import FAST_RECIPE, toml_dumps

    (tmp_path / "p.jsonl").write_text('{"id": "a", "prompt": "a cat"}\n{"id": "b", "prompt": "a dog"}\n')
    recipes = []
    for name in ("base", "cand"):
        path = tmp_path / f"{name}.toml"
        path.write_text(toml_dumps({**FAST_RECIPE, "name": name, "steps": 2 if name == "base" else 4}))
        recipes.append(str(path))
    seen_a, seen_b = [], []
    with serving(foreign_app("ok", clip_bytes, seen_a)) as url_a, serving(foreign_app("ok", clip_bytes, seen_b)) as url_b:
        result = run_ab_command(baseline=recipes[0], candidates=[recipes[1]], prompts=tmp_path / "p.jsonl",
                                out=tmp_path / "run", backend="http", urls=[url_a, url_b], warmup=1, speed_rounds=1)
    # 2 recipes x (1 warm-up + 2 timing + 2 quality) requests, spread over both servers.
    assert len(seen_a) + len(seen_b) == 10 and seen_a and seen_b
    assert sorted(b["num_inference_steps"] for b in seen_a + seen_b) == [2] * 5 + [4] * 5
    assert result.manifest.status == "complete" and result.manifest.backend == "http"
    speed = result.speed["protocols"]["mixed"]
    # A foreign server does not report what ran: numbers are given, marked unverified.
    assert speed["cand"]["executed_verified"] is False
    assert speed["cand"]["generation_side_latency_s"]["p50"] == 12.5
    assert speed["cand"]["speedup"]["speedup"] == pytest.approx(1.0)
    assert speed["cand"]["stage_anatomy_median_s"] is None
    assert result.speed["recompiles"]["cand"] == {"available": False,
                                                  "reason": "the server does not report sequence shapes"}


def test_both_protocols_side_by_side(clip_bytes, tmp_path):
    from h3eval.commands.ab import run_ab_command
    from tests.conftest import FAST_RECIPE, toml_dumps

    (tmp_path / "p.jsonl").write_text('{"id": "a", "prompt": "a cat"}\n{"id": "b", "prompt": "a dog on a log"}\n')
    (tmp_path / "fast.toml").write_text(toml_dumps(FAST_RECIPE))
    seen = []
    with serving(foreign_app("ok", clip_bytes, seen)) as url:
        result = run_ab_command(baseline=str(tmp_path / "fast.toml"), candidates=[], off_identity=True,
                                prompts=tmp_path / "p.jsonl", out=tmp_path / "run", backend="http", urls=[url],
                                warmup=1, speed_protocol="both", speed_rounds=2)
    prompts = [b["prompt"] for b in seen]
    # warm-up (x2 recipes), repeated (4 x2, always the first prompt), mixed (4 x2, cycling), quality (2 x2)
    assert prompts[:2] == ["a cat"] * 2 and prompts[2:10] == ["a cat"] * 8
    assert prompts[10:18] == ["a cat"] * 2 + ["a dog on a log"] * 2 + ["a cat"] * 2 + ["a dog on a log"] * 2
    assert len(prompts) == 22
    assert set(result.speed["protocols"]) == {"repeated", "mixed", "quality_clips"}
    assert result.speed["repeated_vs_mixed"]["fast"] == {"mixed_p50_s": 12.5, "repeated_p50_s": 12.5, "ratio": 1.0}
    assert "repeated vs mixed" in (tmp_path / "run" / "speed.md").read_text()


def test_server_faults_land_in_the_run_record_and_the_rest_continues(clip_bytes, tmp_path):
    from h3eval.commands.ab import run_ab_command
    from h3eval.store import RunStore
    from tests.conftest import FAST_RECIPE, toml_dumps

    (tmp_path / "p.jsonl").write_text('{"id": "a", "prompt": "a cat"}\n')
    for name, steps in (("base", 2), ("cand", 3)):  # different levers: not an off-identity candidate
        (tmp_path / f"{name}.toml").write_text(toml_dumps({**FAST_RECIPE, "name": name, "steps": steps}))
    with serving(foreign_app("ok", clip_bytes, [])) as ok, serving(foreign_app("failed", clip_bytes, [])) as bad:
        result = run_ab_command(baseline=str(tmp_path / "base.toml"), candidates=[str(tmp_path / "cand.toml")],
                                prompts=tmp_path / "p.jsonl", out=tmp_path / "run", backend="http",
                                urls=[f"base={ok}", f"cand={bad}"], warmup=0, speed_rounds=1)
    manifest = RunStore(tmp_path / "run").read_manifest()
    assert manifest.status == "partial" and result.manifest.status == "partial"
    assert sorted(e.error.split(":")[0] for e in manifest.errors) == ["quality/cand/a-s0", "speed/mixed/cand/r000-a-s0"]
    assert all("failed on the server: CUDA out of memory" in e.error for e in manifest.errors)
    assert RunStore(tmp_path / "run").read_record("base", "a", 0) is not None
    assert not list((tmp_path / "run").rglob("cand/*.mp4")) and not list((tmp_path / "run").rglob("*.tmp"))
    assert result.speed["protocols"]["mixed"]["cand"] == {"status": "empty", "reason": "no finished request"}
