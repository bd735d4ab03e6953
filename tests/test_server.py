"""`h3 serve` on real uvicorn over loopback, driven by the http backend and raw HTTP."""

from __future__ import annotations

import http.client
import json
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx
import numpy as np
import pytest

from h3.media import decode_audio, decode_video
from h3.runtime import GenerateRequest, TINY_DEFAULT_SIZE
from h3.server import create_app
from h3eval.backends.http import HttpBackend
from tests._serving import serving

PROMPT = "a red kite flying over a green hill"


def wait_status(client: httpx.Client, url: str, job_id: str, statuses=("completed", "failed"), timeout=180.0) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        job = client.get(f"{url}/v1/videos/{job_id}").json()
        if job["status"] in statuses:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} never reached {statuses}")


def test_http_and_inprocess_give_the_same_bytes(tiny_random_runtime, fast_recipe, tmp_path):
    with serving(create_app(tiny_random_runtime, tmp_path / "srv")) as url:
        backend = HttpBackend([url], TINY_DEFAULT_SIZE, poll_interval_s=0.05)
        via_http = backend.generate(fast_recipe, GenerateRequest(prompt=PROMPT, seed=3, prompt_id="k"),
                                    tmp_path / "http.mp4", {"note": "test"})
        backend.close()
    direct = tiny_random_runtime.generate(GenerateRequest(prompt=PROMPT, seed=3, prompt_id="k"),
                                          tmp_path / "direct.mp4")
    assert (tmp_path / "http.mp4").read_bytes() == (tmp_path / "direct.mp4").read_bytes()
    assert via_http.frames_sha256 == direct.frames_sha256 and via_http.pcm_sha256 == direct.pcm_sha256
    # Reference: decode both files independently of the records.
    fa, _ = decode_video(tmp_path / "http.mp4")
    fb, _ = decode_video(tmp_path / "direct.mp4")
    assert np.array_equal(fa, fb) and np.array_equal(decode_audio(tmp_path / "http.mp4")[0],
                                                     decode_audio(tmp_path / "direct.mp4")[0])
    extra = via_http.extra
    assert extra["hash_source"] == "raw" and extra["note"] == "test"
    assert extra["inference_time_s"] == pytest.approx(via_http.timings.generation_side_latency_s)
    # Client wall time covers the server's own request-to-file time plus polling and download.
    assert via_http.timings.request_to_file_latency_s >= extra["server_request_to_file_latency_s"]
    saved = json.loads((tmp_path / "http.json").read_text())
    assert saved["frames_sha256"] == direct.frames_sha256


def test_validation_errors_are_422_naming_the_field(tiny_random_runtime, tmp_path):
    cases = {
        "prompt": {"seed": 1},
        "seed": {"prompt": "x", "seed": -1},
        "size": {"prompt": "x", "size": "64by64"},
        "fps": {"prompt": "x", "fps": 30},
        "num_inference_steps": {"prompt": "x", "num_inference_steps": 50},
        "seconds": {"prompt": "x", "seconds": 20},
        "turbo": {"prompt": "x", "turbo": True},
        "h3_levers_sha256": {"prompt": "x", "h3_levers_sha256": "0" * 64},
        "model": {"prompt": "x", "model": "sora-2"},
        "guidance_scale": {"prompt": "x", "guidance_scale": 5.0},
        "negative_prompt": {"prompt": "x", "negative_prompt": "blurry"},
        "input_reference": {"prompt": "x", "input_reference": "https://example.com/first.png"},
        "num_frames": {"prompt": "x", "seconds": 5, "num_frames": 124},
    }
    with serving(create_app(tiny_random_runtime, tmp_path / "srv")) as url, httpx.Client() as client:
        for field, body in cases.items():
            for encoding in ("json", "multipart"):
                if encoding == "json":
                    response = client.post(f"{url}/v1/videos", json=body)
                else:  # what the openai SDK sends: every value as a form field
                    response = client.post(f"{url}/v1/videos", files={k: (None, v if isinstance(v, str) else
                                                                               json.dumps(v)) for k, v in body.items()})
                assert response.status_code == 422, (field, encoding, response.text)
                locs = [d["loc"] for d in response.json()["detail"]]
                assert any(field in loc for loc in locs), (field, encoding, locs)
                assert field in response.json()["error"]["message"]
        assert client.get(f"{url}/v1/videos").json()["data"] == []  # nothing was queued
    assert list((tmp_path / "srv" / "jobs").iterdir()) == []


def test_json_multipart_and_sglang_extra_body_resolve_alike(tiny_random_runtime, tmp_path):
    body = {"prompt": "a cat", "seed": 11, "size": "100x60", "seconds": 6, "fps": 24, "num_inference_steps": 2,
            "guidance_scale": 1, "negative_prompt": "", "model": "fast"}
    shape = ("seed", "size", "seconds", "num_frames", "fps", "num_inference_steps", "model", "prompt")
    # a per-job timeout of 1 ms: accepted jobs end at their first module call, nothing is generated
    with serving(create_app(tiny_random_runtime, tmp_path / "srv", job_timeout_s=0.001)) as url, \
            httpx.Client() as client:
        as_json = client.post(f"{url}/v1/videos", json=body).json()
        as_form = client.post(f"{url}/v1/videos", files={k: (None, str(v)) for k, v in body.items()}).json()
        wrapped = client.post(f"{url}/v1/videos", json={"prompt": "a cat", "extra_body": {
            k: v for k, v in body.items() if k != "prompt"}}).json()
        form_wrapped = client.post(f"{url}/v1/videos", data={"prompt": "a cat", "extra_body": json.dumps(
            {k: v for k, v in body.items() if k != "prompt"})}).json()
        # 100x60 snaps to the nearest multiples of 32 (96x64); 6 s = 144 frames snaps up to 17*9+5 = 158.
        expected = {"seed": 11, "size": "96x64", "seconds": "6.583", "num_frames": 158, "fps": 24,
                    "num_inference_steps": 2, "model": "h3-tiny-random", "prompt": "a cat"}
        for job in (as_json, as_form, wrapped, form_wrapped):
            assert {k: job[k] for k in shape} == expected, job
        clash = client.post(f"{url}/v1/videos", json={"prompt": "a cat", "seed": 1, "extra_body": {"seed": 2}})
        assert clash.status_code == 422 and clash.json()["error"]["param"] == "seed"


def test_delete_a_queued_job_before_it_runs_but_not_the_running_one(tiny_random_runtime, tmp_path):
    root = tmp_path / "srv"
    with serving(create_app(tiny_random_runtime, root, job_timeout_s=3.0)) as url, httpx.Client() as client:
        # the largest job this CPU server takes: it is still running when the deletes below come in
        running = client.post(f"{url}/v1/videos", json={"prompt": PROMPT, "seconds": 15, "size": "256x256"}).json()
        waiting = client.post(f"{url}/v1/videos", json={"prompt": "a cat", "seed": 1}).json()
        wait_status(client, url, running["id"], ("in_progress",))
        busy = client.delete(f"{url}/v1/videos/{running['id']}")
        assert busy.status_code == 409 and "being generated" in busy.json()["error"]["message"]
        gone = client.delete(f"{url}/v1/videos/{waiting['id']}")
        assert gone.status_code == 200 and gone.json() == {"id": waiting["id"], "object": "video.deleted",
                                                           "deleted": True}
        assert client.get(f"{url}/v1/videos/{waiting['id']}").status_code == 404
        assert wait_status(client, url, running["id"])["status"] in ("completed", "failed")  # failed: its timeout
        health = client.get(f"{url}/health").json()
        assert (health["queued"], health["in_progress"]) == (0, 0)  # the deleted job was never taken
        assert client.delete(f"{url}/v1/videos/{running['id']}").status_code == 200
        assert client.get(f"{url}/v1/videos").json()["data"] == []
    assert list((root / "jobs").iterdir()) == [] and list((root / "videos").iterdir()) == []


def test_api_key_is_required_when_set(tiny_random_runtime, tmp_path):
    with serving(create_app(tiny_random_runtime, tmp_path / "srv", api_key="s3cret")) as url, httpx.Client() as client:
        assert client.get(f"{url}/health").status_code == 200
        assert client.get(f"{url}/v1/models").status_code == 401
        assert client.get(f"{url}/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.post(f"{url}/v1/videos", json={"prompt": "x"}).status_code == 401
        ok = client.get(f"{url}/v1/models", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and ok.json()["data"][0]["h3_recipe"]["name"] == "fast"
        assert client.get(f"{url}/v1/videos").status_code == 401


def raw_get(url: str, path: str) -> tuple[int, bytes]:
    """A GET with the path sent exactly as written (http.client does not normalize '..')."""
    parsed = urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)
    conn.request("GET", path)
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response.status, body


def test_content_is_served_only_from_the_output_folder(tiny_random_runtime, tmp_path):
    root = tmp_path / "srv"
    with serving(create_app(tiny_random_runtime, root)) as url:
        (root / "secret.mp4").write_bytes(b"outside the videos folder")
        (root / "videos" / "planted.mp4").write_bytes(b"not a job")
        for path in ["/v1/videos/../../etc/passwd", "/v1/videos/../../../etc/passwd/content",
                     "/v1/videos/..%2F..%2Fetc%2Fpasswd/content", "/v1/videos/%2e%2e%2fsecret/content",
                     "/v1/videos/..%2Fsecret/content", "/v1/videos/planted/content",
                     "/v1/videos/video_" + "0" * 32 + "/content", "/v1/videos/video_" + "0" * 32,
                     "/v1/videos/video_..%2F..%2Fsecret/content"]:
            status, body = raw_get(url, path)
            assert status == 404, (path, status, body[:200])
            assert b"root:" not in body and b"outside the videos folder" not in body and b"not a job" not in body


def test_full_queue_is_429_and_restart_keeps_finished_jobs(tiny_random_runtime, tmp_path):
    root = tmp_path / "srv"
    with serving(create_app(tiny_random_runtime, root, max_queue=1)) as url, httpx.Client() as client:
        first = client.post(f"{url}/v1/videos", json={"prompt": PROMPT, "seed": 0}).json()
        wait_status(client, url, first["id"], ("in_progress", "completed"))
        second = client.post(f"{url}/v1/videos", json={"prompt": "a cat", "seed": 1})
        assert second.status_code == 200 and second.json()["status"] == "queued"
        third = client.post(f"{url}/v1/videos", json={"prompt": "a dog", "seed": 2})
        assert third.status_code == 429 and "queue full" in third.json()["detail"]
        assert client.get(f"{url}/health").json()["queued"] <= 1
        done = [wait_status(client, url, j) for j in (first["id"], second.json()["id"])]
        assert [j["status"] for j in done] == ["completed", "completed"]
        content = client.get(f"{url}/v1/videos/{first['id']}/content").content
        listed = {j["id"] for j in client.get(f"{url}/v1/videos").json()["data"]}
        assert listed == {first["id"], second.json()["id"]}  # the rejected one left no job behind
    # A job a killed server left in progress, as it would be on disk.
    stale = dict(done[1], id="video_" + "f" * 32, status="in_progress")
    stale.pop("h3_record", None)
    (root / "jobs" / f"{stale['id']}.json").write_text(json.dumps(stale))
    with serving(create_app(tiny_random_runtime, root, max_queue=1)) as url, httpx.Client() as client:
        job = client.get(f"{url}/v1/videos/{first['id']}").json()
        assert job["status"] == "completed" and job["h3_record"]["mp4_sha256"] == done[0]["h3_record"]["mp4_sha256"]
        assert client.get(f"{url}/v1/videos/{first['id']}/content").content == content
        stale_now = client.get(f"{url}/v1/videos/{stale['id']}").json()
        assert stale_now["status"] == "failed" and "resubmit" in stale_now["error"]["message"]


def test_serve_command_refuses_bad_input():
    from typer.testing import CliRunner

    from h3.cli import app

    result = CliRunner().invoke(app, ["serve", "--max-queue", "-1"])
    assert result.exit_code == 3 and "--max-queue must be >= 0" in result.output
    result = CliRunner().invoke(app, ["serve", "--recipe", "no-such-recipe"])
    assert result.exit_code == 3 and "unknown recipe" in result.output


def test_max_queue_zero_takes_one_job_when_idle(tiny_random_runtime, tmp_path):
    with serving(create_app(tiny_random_runtime, tmp_path / "srv", max_queue=0)) as url, httpx.Client() as client:
        first = client.post(f"{url}/v1/videos", json={"prompt": "a cat", "seed": 0})
        assert first.status_code == 200
        second = client.post(f"{url}/v1/videos", json={"prompt": "a cat", "seed": 1})
        assert second.status_code == 429
        assert wait_status(client, url, first.json()["id"])["status"] == "completed"
