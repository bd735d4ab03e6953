"""Image inputs on ``h3 serve`` (issue 25): the openai SDK's ``input_reference`` upload is the fl2va first keyframe,
``last_frame`` / ``reference_image`` uploads and ``data:`` URLs are honoured or refused by name, and the job reports
the workflow and each image's sha256."""

from __future__ import annotations

import base64
import hashlib
import io

import httpx
import numpy as np
import openai
import pytest
from PIL import Image

from h3.conditioning import image_from_bytes
from h3.runtime import GenerateRequest
from h3.server import create_app
from tests._serving import serving

PROMPT = "a red square slides to the right"
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def png(colour: tuple[int, int, int], size: tuple[int, int] = (96, 128)) -> bytes:
    pixels = np.full((size[0], size[1], 3), 40, np.uint8)
    pixels[size[0] // 4: size[0] // 2, size[1] // 4: size[1] // 2] = colour
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def test_sdk_input_reference_is_the_first_keyframe_and_reproduces_the_inprocess_clip(tiny_random_runtime, tmp_path):
    first = png((230, 30, 30))
    # The reference: the same request in process, the image given as the first keyframe.
    out = tmp_path / "inprocess.mp4"
    expected = tiny_random_runtime.generate(GenerateRequest(prompt=PROMPT, seed=3, first_frame=image_from_bytes(first)),
                                            out)
    assert expected.request.workflow == "fl2va"
    with serving(create_app(tiny_random_runtime, tmp_path / "srv")) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        video = client.videos.create_and_poll(prompt=PROMPT, input_reference=("first.png", first, "image/png"),
                                              extra_body={"seed": 3}, poll_interval_ms=100)
        assert video.status == "completed", video.error
        assert video.model_extra["h3_workflow"] == "fl2va"
        record = video.model_extra["h3_record"]
        assert record["request"]["conditioning"] == [{"role": "first_frame", "sha256": hashlib.sha256(first).hexdigest(),
                                                      "width": 128, "height": 96, "media_type": "image/png"}]
        # Through the SDK, the clip is the in-process fl2va clip byte for byte (and not the text-only clip).
        assert client.videos.download_content(video.id).read() == out.read_bytes()
        assert record["frames_sha256"] == expected.frames_sha256


def test_image_fields_are_honoured_or_refused_by_name(tiny_random_runtime, tmp_path):
    red, blue = png((230, 30, 30)), png((30, 30, 230), size=(128, 128))
    data_url = "data:image/png;base64," + base64.b64encode(blue).decode()
    # A millisecond job timeout: accepted jobs end at their first module call; acceptance is what is checked here.
    with serving(create_app(tiny_random_runtime, tmp_path / "srv", job_timeout_s=0.001, max_queue=20)) as url, \
            httpx.Client(timeout=60) as client:
        def post(**kw):
            return client.post(f"{url}/v1/videos", **kw)

        accepted = post(data={"prompt": PROMPT}, files={"first_frame": ("a.png", red, "image/png"),
                                                        "last_frame": ("b.png", blue, "image/png")})
        assert accepted.status_code == 200, accepted.text
        job = accepted.json()
        assert job["h3_workflow"] == "fl2va"
        assert [(c["role"], c["sha256"]) for c in job["h3_conditioning"]] == [
            ("first_frame", hashlib.sha256(red).hexdigest()), ("last_frame", hashlib.sha256(blue).hexdigest())]
        ref = post(json={"prompt": PROMPT, "reference_image": data_url})
        assert ref.status_code == 200 and ref.json()["h3_workflow"] == "ref2va", ref.text
        assert ref.json()["h3_conditioning"][0]["sha256"] == hashlib.sha256(blue).hexdigest()
        sdk_object = post(json={"prompt": PROMPT, "input_reference": {"image_url": data_url}})
        assert sdk_object.status_code == 200 and sdk_object.json()["h3_conditioning"][0]["role"] == "first_frame"

        refused = {
            "reference_image": dict(json={"prompt": PROMPT, "first_frame": data_url, "reference_image": data_url}),
            "input_reference": dict(json={"prompt": PROMPT, "input_reference": "https://example.com/a.png"}),
            "first_frame": dict(json={"prompt": PROMPT, "input_reference": data_url, "first_frame": data_url}),
            "last_frame": dict(data={"prompt": PROMPT}, files={"last_frame": ("x.png", b"not an image", "image/png")}),
        }
        for name, kw in refused.items():
            response = post(**kw)
            assert response.status_code == 422 and response.json()["error"]["param"] == name, (name, response.text)
        too_wide = png((1, 2, 3), size=(16, 128))  # 8:1
        response = post(data={"prompt": PROMPT}, files={"input_reference": ("w.png", too_wide, "image/png")})
        assert response.status_code == 422 and "outside 1:4 to 4:1" in response.json()["error"]["message"]
