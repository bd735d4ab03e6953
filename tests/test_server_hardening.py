"""`h3 serve` and the `h3` CLI against the bad inputs of issue 26: non-finite numbers, booleans for integers,
non-ASCII digits, oversized prompts and canvases, jobs that run too long, and a seeded fuzz of the request schema.

Accepting servers here run with a per-job timeout of a millisecond where the clip itself does not matter: an
accepted job then ends at its first module call, so these tests exercise the real server without generating.
"""

from __future__ import annotations

import json
import random
import re
import time

import httpx
import pytest
from typer.testing import CliRunner

from h3.cli import app as h3_app
from h3.runtime import GenerateRequest
from h3.server import create_app, levers_sha256
from tests._serving import serving

PROMPT = "a red kite flying over a green hill"


def post(client: httpx.Client, url: str, body: bytes | str | dict, content_type: str = "application/json"):
    if isinstance(body, dict):
        return client.post(f"{url}/v1/videos", json=body)
    return client.post(f"{url}/v1/videos", content=body, headers={"content-type": content_type})


def refused(response: httpx.Response, field: str, status: int = 422) -> str:
    """The response is ``status``, JSON, and names ``field`` both in FastAPI's detail and OpenAI's error object."""
    assert response.status_code == status, (field, response.status_code, response.text[:300])
    body = response.json()
    assert any(field in d["loc"] for d in body["detail"]), (field, body)
    assert body["error"]["param"] == field and field in body["error"]["message"]
    return body["error"]["message"]


def wait_status(client: httpx.Client, url: str, job_id: str, statuses=("completed", "failed"), timeout=300.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        job = client.get(f"{url}/v1/videos/{job_id}").json()
        if job["status"] in statuses:
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} never reached {statuses}")


@pytest.fixture()
def quick(tiny_random_runtime, tmp_path):
    """A server whose accepted jobs end at once (job timeout 1 ms) and whose queue does not fill."""
    with serving(create_app(tiny_random_runtime, tmp_path / "quick", job_timeout_s=0.001, max_queue=10_000)) as url, \
            httpx.Client(timeout=30) as client:
        yield url, client


# -- the 500s --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("raw", ['"inf"', '"Infinity"', '"nan"', "1e308", "-1e308", "Infinity", "-Infinity", "NaN",
                                 "1e400"])
def test_non_finite_or_huge_seconds_are_a_422_naming_seconds(quick, raw):
    url, client = quick
    response = post(client, url, f'{{"prompt": "x", "seconds": {raw}}}')  # raw JSON, as a hostile client sends it
    refused(response, "seconds")
    response = post(client, url, f"prompt=x&seconds={raw.strip(chr(34))}", "application/x-www-form-urlencoded")
    refused(response, "seconds")
    assert client.get(f"{url}/health").json()["status"] == "ok"  # the connection and the server are fine


@pytest.mark.parametrize("field,body", [
    ("seed", {"prompt": "x", "seed": True}),
    ("seed", {"prompt": "x", "seed": False}),
    ("seed", {"prompt": "x", "seed": 1.0}),
    ("seed", {"prompt": "x", "seed": "١"}),
    ("num_frames", {"prompt": "x", "num_frames": True}),
    ("num_inference_steps", {"prompt": "x", "num_inference_steps": True}),
    ("size", {"prompt": "x", "size": "١٢٨x١٢٨"}),  # Arabic-Indic digits: int() reads them as 128
    ("size", {"prompt": "x", "size": "١٢٨x128"}),
    ("size", {"prompt": "x", "size": "１２８x128"}),  # fullwidth digits
    ("seconds", {"prompt": "x", "seconds": "٥"}),
])
def test_booleans_and_non_ascii_digits_are_refused(quick, field, body):
    url, client = quick
    refused(post(client, url, body), field)


def test_form_booleans_are_not_integers_either(quick):
    url, client = quick
    refused(client.post(f"{url}/v1/videos", files={"prompt": (None, "x"), "seed": (None, "true")}), "seed")
    refused(client.post(f"{url}/v1/videos", data={"prompt": "x", "seed": "True"}), "seed")
    accepted = client.post(f"{url}/v1/videos", files={"prompt": (None, "x"), "seed": (None, "7")})
    assert accepted.status_code == 200 and accepted.json()["seed"] == 7


def test_documented_maximum_of_15_seconds_is_accepted_as_14_375(quick):
    url, client = quick
    for value in (15, 15.0, "15", "15.0", 14.5):
        job = post(client, url, {"prompt": "x", "seconds": value})
        assert job.status_code == 200, (value, job.text)
        # 15 s = 360 frames snaps up to 362 (15.083 s), past diffusers' maximum: the longest clip, 345 = 17*20+5.
        assert (job.json()["num_frames"], job.json()["seconds"]) == (345, "14.375"), value
    assert "5 to 15 s" in refused(post(client, url, {"prompt": "x", "seconds": 15.01}), "seconds")
    assert "5 to 15 s" in refused(post(client, url, {"prompt": "x", "num_frames": 360}), "num_frames")


# -- limits ----------------------------------------------------------------------------------------------------------
def test_default_limits_follow_the_model_and_device_and_are_enforced(tiny_random_runtime, tmp_path):
    with serving(create_app(tiny_random_runtime, tmp_path / "srv")) as url, httpx.Client(timeout=60) as client:
        limits = client.get(f"{url}/v1/models").json()["data"][0]["h3_limits"]
        # CPU: 4x the tiny preset's 128x128 default canvas; 1024 prompt tokens (below the tiny text encoder's 4096
        # positions); the tiny preset's 300 s job timeout; 16 MiB bodies (room for image uploads, issue 25).
        assert (limits["max_pixels"], limits["max_prompt_tokens"], limits["job_timeout_s"],
                limits["max_body_bytes"]) == (4 * 128 * 128, 1024, 300.0, 16 * 2**20)
        assert limits["basis"]["max_pixels"].startswith("CPU")
        # The cases: a 1 MB prompt (413 before it is parsed), an 8 KB prompt (the tiny preset's tokenizer
        # is one token per character), a 99968x99968 canvas, the 1792x1024 job that blocked the CPU worker.
        big = post(client, url, json.dumps({"prompt": "a" * (17 * 2**20)}))
        assert big.status_code == 413 and f"{16 * 2**20} bytes" in big.json()["error"]["message"]
        # 1 MB is inside the body limit: refused by length before it is tokenized
        assert "1000000 characters" in refused(post(client, url, {"prompt": "a" * 1_000_000}), "prompt")
        assert "8000 tokens" in refused(post(client, url, {"prompt": "a" * 8000}), "prompt")
        assert "--max-prompt-tokens" in refused(post(client, url, {"prompt": "b" * 1025}), "prompt")
        assert "--max-pixels" in refused(post(client, url, {"prompt": "x", "size": "99968x99968"}), "size")
        assert "1835008 pixels" in refused(post(client, url, {"prompt": "x", "size": "1792x1024"}), "size")
        assert "73728 pixels" in refused(post(client, url, {"prompt": "x", "size": "288x256"}), "size")
        assert client.get(f"{url}/v1/videos").json()["data"] == []  # nothing was queued
    assert list((tmp_path / "srv" / "jobs").iterdir()) == []


def test_limits_are_configurable_reported_and_the_edges_accepted(tiny_random_runtime, tmp_path):
    app = create_app(tiny_random_runtime, tmp_path / "srv", max_prompt_tokens=20, max_pixels=160 * 128,
                     job_timeout_s=0.001, max_body_bytes=2000)
    with serving(app) as url, httpx.Client(timeout=60) as client:
        limits = client.get(f"{url}/v1/models").json()["data"][0]["h3_limits"]
        assert (limits["max_prompt_tokens"], limits["max_pixels"], limits["job_timeout_s"],
                limits["max_body_bytes"]) == (20, 20480, 0.001, 2000)
        assert limits["basis"]["max_pixels"] == "set by the operator"
        assert post(client, url, {"prompt": "a" * 20}).status_code == 200
        refused(post(client, url, {"prompt": "a" * 21}), "prompt")
        assert post(client, url, {"prompt": "x", "size": "160x128"}).json()["size"] == "160x128"
        assert post(client, url, {"prompt": "x", "size": "150x120"}).json()["size"] == "160x128"  # snapped
        assert "24576 pixels" in refused(post(client, url, {"prompt": "x", "size": "192x128"}), "size")
        assert post(client, url, json.dumps({"prompt": "x" * 1990})).status_code == 413
        refused(post(client, url, {"prompt": "x" * 1900}), "prompt")  # under the byte limit, over the tokens


def test_a_job_past_its_timeout_fails_with_that_reason_and_the_worker_moves_on(tiny_random_runtime, tmp_path):
    root = tmp_path / "srv"
    with serving(create_app(tiny_random_runtime, root, job_timeout_s=0.5)) as url, httpx.Client(timeout=60) as client:
        # the largest job this CPU server takes (15 s at 256x256): several seconds on any machine, against 0.5 s
        jobs = [post(client, url, {"prompt": PROMPT, "seconds": 15, "size": "256x256", "seed": s}).json()
                for s in (0, 1)]
        for job in jobs:
            done = wait_status(client, url, job["id"])
            assert done["status"] == "failed" and done["error"]["code"] == "timeout", done
            message = done["error"]["message"]
            assert "per-job timeout of 0.5 s" in message and "--job-timeout" in message
            assert done["progress"] < 100 and "h3_record" not in done
        assert list((root / "videos").iterdir()) == []  # no clip, record or temporary file left behind
        assert client.get(f"{url}/health").json() == {"status": "ok", "queued": 0, "in_progress": 0, "max_queue": 8}
    # The interrupted runtime still makes the clip it made before, through the server and in process.
    with serving(create_app(tiny_random_runtime, root)) as url, httpx.Client(timeout=60) as client:
        job = wait_status(client, url, post(client, url, {"prompt": PROMPT, "seed": 4}).json()["id"])
        assert job["status"] == "completed", job
        served = client.get(f"{url}/v1/videos/{job['id']}/content").content
    direct = tiny_random_runtime.generate(GenerateRequest(prompt=PROMPT, seed=4), tmp_path / "direct.mp4")
    assert served == (tmp_path / "direct.mp4").read_bytes()
    assert job["h3_record"]["frames_sha256"] == direct.frames_sha256


# -- malformed bodies ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("body,content_type,status", [
    (b"{not json", "application/json", 422),
    (b"[1, 2]", "application/json", 422),
    (b'"a string"', "application/json", 422),
    (b"\xff\xfe{}", "application/json", 422),
    (b"[" * 20000 + b"]" * 20000, "application/json", 422),
    (b'{"prompt": "x", "seed": ' + b"9" * 5000 + b"}", "application/json", 422),  # past Python's int() digit limit
    (b'{"prompt": "x", "prompt": "y"}', "application/json", 422),
    (b'{"prompt": "\\ud800"}', "application/json", 422),  # a lone surrogate
    (b"prompt=x", "text/plain", 415),
    (b"", "application/json", 422),
])
def test_malformed_bodies_are_4xx_json(quick, body, content_type, status):
    url, client = quick
    response = post(client, url, body, content_type)
    assert response.status_code == status, response.text[:300]
    assert response.json()["error"]["message"]


def test_query_parameters_of_list_are_checked(quick):
    url, client = quick
    for query, name in (("limit=0", "limit"), ("limit=101", "limit"), ("limit=abc", "limit"), ("order=up", "order"),
                        ("after=video_" + "0" * 32, "after")):
        response = client.get(f"{url}/v1/videos?{query}")
        assert response.status_code == 422 and response.json()["error"]["param"] == name, (query, response.text)


# -- fuzz ------------------------------------------------------------------------------------------------------------
class Raw:
    """A JSON literal written as is (NaN, Infinity, 1e400, a lone surrogate escape)."""

    def __init__(self, text: str):
        self.text = text


POOL = [0, 1, 2, -1, 5, 7, 24, 108, 124, 345, 346, 2**63 - 1, 2**63, 10**30, True, False, None, 0.0, -0.0, 1.0,
        2.0, 4.5, 15.0, 15.0001, 24.0, 1e-300, 1e308, -1e308, "", " ", "0", "4", "7", "15", "15.0", "24", "-3",
        "+4", "4e0", "0x10", "inf", "-inf", "Infinity", "NaN", "nan", "1e308", "١٢٨", "１２８", "٥", "true", "null",
        "128x128", "128X128", "720x1280", "150x90", "99968x99968", "0x0", "0x128", "128x", "x128", "128 x 128",
        "١٢٨x128", "32x256", "288x256", "256x256", "sora-2", "h3-tiny-random", "fast", "a red kite", "a" * 1025,
        "\x00",
        [], {}, [1], {"a": 1}, Raw("NaN"), Raw("Infinity"), Raw("-Infinity"), Raw("1e400"), Raw("-1e400"),
        Raw('"\\ud800"')]
KNOWN = ("prompt", "seed", "seconds", "size", "num_frames", "fps", "num_inference_steps", "guidance_scale",
         "negative_prompt", "model", "h3_levers_sha256", "input_reference", "reference_url")
NAMES = ["prompt", "seed", "seconds", "size", "num_frames", "fps", "num_inference_steps", "guidance_scale",
         "negative_prompt", "model", "h3_levers_sha256", "input_reference", "reference_url", "turbo", "n", "quality",
         "guidance_scale_2", "Seed", "seed "]


def encode_json(value) -> str:
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {encode_json(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(encode_json(v) for v in value) + "]"
    return json.dumps(value)


def as_form_text(value) -> str:
    if isinstance(value, Raw):
        return value.text.strip('"')
    if isinstance(value, str):
        return value
    return encode_json(value)


ASCII_INT = re.compile(r"-?[0-9]+", re.ASCII)
ASCII_DECIMAL = re.compile(r"-?[0-9]+(\.[0-9]+)?", re.ASCII)


def oracle_int(v):
    """An integer by this API's rule (written independently of the server), or None."""
    if isinstance(v, bool) or isinstance(v, Raw):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str) and ASCII_INT.fullmatch(v.strip()) and len(v.strip().lstrip("-")) <= 30:
        return int(v.strip())
    return None


def oracle_number(v):
    if isinstance(v, bool) or isinstance(v, Raw):
        return None
    if isinstance(v, int) and abs(v) <= 10**18:
        return float(v)
    if isinstance(v, float):
        return v
    if isinstance(v, str) and ASCII_DECIMAL.fullmatch(v.strip()):
        return float(v.strip())
    return None


def oracle_valid(body: dict, levers: str) -> bool:
    """Whether the server must accept ``body``: every field valid for the tiny CPU server's defaults."""
    def text(v):
        return isinstance(v, str) and not isinstance(v, Raw)

    body = {k: v for k, v in body.items() if not (v is None and k in KNOWN)}  # JSON null: not given
    for name, v in body.items():
        if name == "prompt":
            ok = text(v) and bool(v.strip()) and len(v) <= 1024
        elif name in ("seed", "num_frames", "num_inference_steps"):
            i = oracle_int(v)
            ok = i is not None and {"seed": 0 <= i < 2**63, "num_frames": 108 <= i <= 345,
                                    "num_inference_steps": i == 2}[name]
        elif name in ("seconds", "fps", "guidance_scale"):
            x = oracle_number(v)
            ok = x is not None and {"seconds": 0 < x <= 15, "fps": x == 24, "guidance_scale": x == 1}[name]
        elif name == "size":
            m = re.fullmatch(r"([0-9]{1,6})[xX]([0-9]{1,6})", v.strip(), re.ASCII) if text(v) else None
            ok = False
            if m and int(m[1]) > 0 and int(m[2]) > 0:
                w, h = (max(32, (int(g) + 16) // 32 * 32) for g in (m[1], m[2]))
                ok = 0.25 <= w / h <= 4 and w * h <= 4 * 128 * 128
        elif name == "negative_prompt":
            ok = text(v) and not v.strip()
        elif name == "model":
            ok = text(v) and v in ("h3-tiny-random", "fast")
        elif name == "h3_levers_sha256":
            ok = v == levers
        else:
            ok = False
        if not ok:
            return False
    return "prompt" in body and not ("seconds" in body and "num_frames" in body)


def test_fuzz_request_schema(quick, fast_recipe):
    """Seeded random bodies, JSON and form: never a 500 or a traceback, every answer JSON, a job accepted exactly
    when an independent oracle says the request is valid, and never with a non-finite or out-of-range value."""
    url, client = quick
    rng = random.Random(20261130)
    levers = levers_sha256(fast_recipe)
    pool = POOL + [levers, "0" * 64]
    counts = {"accepted": 0, "refused": 0}
    for case in range(400):
        body = {}
        if rng.random() < 0.85:
            body["prompt"] = rng.choice(["a red kite", "a red kite", PROMPT, rng.choice(pool)])
        for name in rng.sample(NAMES, rng.randint(0, 4)):
            body[name] = rng.choice(pool)
        mode = rng.choice(["json", "json", "multipart", "urlencoded"])
        if mode == "json":
            response = post(client, url, "{" + ", ".join(f"{json.dumps(k)}: {encode_json(v)}"
                                                         for k, v in body.items()) + "}")
            sent = body
        else:
            sent = {k: as_form_text(v) for k, v in body.items()}
            if mode == "multipart":
                response = client.post(f"{url}/v1/videos", files={k: (None, v) for k, v in sent.items()})
            else:
                response = client.post(f"{url}/v1/videos", data=sent)
        assert response.status_code in (200, 400, 413, 415, 422), (case, mode, body, response.text[:300])
        answer = response.json()
        expected = oracle_valid(sent, levers)
        assert (response.status_code == 200) == expected, (case, mode, sent, response.status_code, answer)
        if response.status_code == 200:
            counts["accepted"] += 1
            seconds = float(answer["seconds"])
            width, height = map(int, answer["size"].split("x"))
            assert 5 < seconds <= 14.375 and answer["num_frames"] % 17 == 5 and 124 <= answer["num_frames"] <= 345
            assert width % 32 == 0 and height % 32 == 0 and width * height <= 4 * 128 * 128
            assert isinstance(answer["seed"], int) and 0 <= answer["seed"] < 2**63
        else:
            counts["refused"] += 1
            assert answer["error"]["message"] and "Traceback" not in response.text
    # Both sides were exercised, and the server still answers.
    assert counts["accepted"] >= 20 and counts["refused"] >= 200, counts
    assert client.get(f"{url}/health").json()["status"] == "ok"


# -- the h3 CLI ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args,env,message", [
    (["generate", "--prompt", "x", "--out", "x.mp4", "--seconds", "inf"], {}, "seconds must be a finite number"),
    (["generate", "--prompt", "x", "--out", "x.mp4", "--seconds", "nan"], {}, "seconds must be a finite number"),
    (["generate", "--prompt", "x", "--out", "x.mp4", "--seconds", "1e308"], {}, "5 to 15 s"),
    (["generate", "--prompt", "x", "--out", "x.mp4", "--seed", "abc"], {}, "Invalid value for '--seed'"),
    (["generate", "--prompt", "x", "--out", "x.mp4", "--seed", "-1"], {}, "non-negative"),
    (["serve", "--port", "70000"], {}, "--port must be 1 to 65535, got 70000"),
    (["serve", "--port", "0"], {}, "--port must be 1 to 65535, got 0"),
    (["serve"], {"H3_PORT": "70000"}, "--port must be 1 to 65535, got 70000"),
    (["serve", "--port", "abc"], {}, "Invalid value for '--port'"),
    (["serve", "--max-pixels", "0"], {}, "--max-pixels must be a positive integer"),
    (["serve"], {"H3_MAX_PROMPT_TOKENS": "-5"}, "--max-prompt-tokens must be a positive integer"),
    (["serve", "--job-timeout", "inf"], {}, "--job-timeout must be a positive finite number"),
    (["serve"], {"H3_JOB_TIMEOUT": "nan"}, "--job-timeout must be a positive finite number"),
    (["serve", "--max-body-bytes", "abc"], {}, "Invalid value for '--max-body-bytes'"),
])
def test_cli_bad_input_is_one_line_and_exit_3(args, env, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(h3_app, args, env=env)
    assert result.exit_code == 3, (args, result.exit_code, result.output)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    assert not list(tmp_path.iterdir())  # nothing written
