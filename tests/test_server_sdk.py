"""The official ``openai`` SDK, unmodified, against `h3 serve` on real uvicorn over loopback (issue 25).

The reference for every clip is the same request generated in process by the same runtime; previews are checked
against frames decoded independently from the MP4 (h3.media, PyAV).
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import openai
import pytest
from PIL import Image

from h3.atomic import sha256_bytes
from h3.media import decode_video
from h3.runtime import GenerateRequest
from h3.server import create_app
from tests._serving import serving

PROMPT = "a red kite flying over a green hill"
KEY = "sk-test-key"

# The SDK marks its video methods deprecated (the hosted Sora API's shutdown); the calls are what clients make.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def reference(tiny_random_runtime, tmp_path_factory):
    """PROMPT, seed 0, the server's default shape, generated in process: the clip any path must reproduce."""
    out = tmp_path_factory.mktemp("reference") / "ref.mp4"
    record = tiny_random_runtime.generate(GenerateRequest(prompt=PROMPT, seed=0), out)
    return out.read_bytes(), record


def sdk(url: str, key: str = KEY) -> openai.OpenAI:
    """The client exactly as a user builds it: a base URL and a key, no extra headers."""
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def test_sdk_create_poll_retrieve_list_download_delete(tiny_random_runtime, reference, tmp_path):
    ref_bytes, ref_record = reference
    root = tmp_path / "srv"
    with serving(create_app(tiny_random_runtime, root, api_key=KEY)) as url:
        client = sdk(url)
        ids = {m.id for m in client.models.list()}
        assert ids == {"h3-tiny-random", "fast"}  # the model id and the recipe name, both usable as `model`

        # multipart (the SDK's only encoding), OpenAI's own seconds value, SGLang's seed through extra_body
        first = client.videos.create(prompt=PROMPT, model="fast", seconds="4", extra_body={"seed": 5})
        assert first.status in ("queued", "in_progress") and first.model == "h3-tiny-random"
        # 4 s is below MiniMax-H3's 5 s: the shortest clip it makes, 124 frames (17*7+5) = 5.167 s, is reported.
        assert (first.seconds, first.size) == ("5.167", "128x128")
        assert first.model_extra["num_frames"] == 124 and first.model_extra["seed"] == 5
        assert first.model_extra["h3_requested"] == {"seconds": "4"}

        second = client.videos.create_and_poll(prompt=PROMPT, model="h3-tiny-random", poll_interval_ms=100)
        assert second.status == "completed", second.error
        assert client.videos.retrieve(first.id).status == "completed"  # it ran before the second

        # The clip through the SDK is the in-process clip, byte for byte; seed 5 was honoured (another clip).
        content = client.videos.download_content(second.id).read()
        assert content == ref_bytes
        first_record = client.videos.retrieve(first.id).model_extra["h3_record"]
        assert first_record["request"]["seed"] == 5 and first_record["frames_sha256"] != ref_record.frames_sha256
        assert sha256_bytes(client.videos.download_content(first.id).read()) == first_record["mp4_sha256"]

        # list: newest first, limit/after pages, and the SDK's own auto-pagination walks both pages
        page = client.videos.list(limit=1)
        assert [v.id for v in page.data] == [second.id] and page.has_more is True
        assert [v.id for v in client.videos.list(limit=1, after=second.id).data] == [first.id]
        assert [v.id for v in client.videos.list(limit=1)] == [second.id, first.id]
        assert [v.id for v in client.videos.list(order="asc")] == [first.id, second.id]

        deleted = client.videos.delete(first.id)
        assert deleted.deleted is True and deleted.id == first.id and deleted.object == "video.deleted"
        with pytest.raises(openai.NotFoundError):
            client.videos.retrieve(first.id)
        assert [v.id for v in client.videos.list()] == [second.id]
        assert not list((root / "videos").glob(f"{first.id}*")) and not (root / "jobs" / f"{first.id}.json").exists()
        with pytest.raises(openai.NotFoundError):
            client.videos.delete(first.id)
    # Without the key the SDK's requests are refused (the key travels as its bearer token).
    with serving(create_app(tiny_random_runtime, root, api_key=KEY)) as url:
        with pytest.raises(openai.AuthenticationError):
            sdk(url, "wrong").videos.list()
        assert [v.id for v in sdk(url).videos.list()] == [second.id]  # kept across the restart


def test_thumbnail_and_spritesheet_are_images_of_the_clip(tiny_random_runtime, reference, tmp_path):
    ref_bytes, _ = reference
    (tmp_path / "ref.mp4").write_bytes(ref_bytes)
    frames, _ = decode_video(tmp_path / "ref.mp4")
    with serving(create_app(tiny_random_runtime, tmp_path / "srv")) as url:
        client = sdk(url)
        video = client.videos.create_and_poll(prompt=PROMPT, poll_interval_ms=100)
        thumb = client.videos.with_raw_response.download_content(video.id, variant="thumbnail")
        assert thumb.headers["content-type"] == "image/webp"
        image = Image.open(io.BytesIO(thumb.content))
        assert image.format == "WEBP" and np.array_equal(np.asarray(image.convert("RGB")), frames[0])  # lossless

        sheet = client.videos.with_raw_response.download_content(video.id, variant="spritesheet")
        assert sheet.headers["content-type"] == "image/jpeg"
        indices = [int(i) for i in sheet.headers["x-h3-frames"].split(",")]
        assert indices == [int(round(i)) for i in np.linspace(0, len(frames) - 1, 16)]
        grid = Image.open(io.BytesIO(sheet.content))
        assert grid.format == "JPEG" and grid.size == (4 * 128, 4 * 128) and sheet.headers["x-h3-grid"] == "4x4"
        tiles = np.asarray(grid.convert("RGB"))
        for slot, index in enumerate(indices):
            tile = tiles[(slot // 4) * 128:(slot // 4 + 1) * 128, (slot % 4) * 128:(slot % 4 + 1) * 128]
            # JPEG works on aligned 8x8 blocks: inside a 2-pixel margin (chroma upsampling reads across the seam)
            # the tile is exactly PIL's own JPEG (q95) of the independently decoded frame.
            alone = io.BytesIO()
            Image.fromarray(frames[index]).save(alone, format="JPEG", quality=95)
            expected = np.asarray(Image.open(alone).convert("RGB"))
            assert np.array_equal(tile[2:-2, 2:-2], expected[2:-2, 2:-2]), slot
            assert not np.array_equal(tile[2:-2, 2:-2], tiles[2:126, 2:126]) or slot == 0

        # An unknown variant is named in a 422; a preview of an unfinished job is a 409 like the video.
        with pytest.raises(openai.UnprocessableEntityError, match="variant"):
            client.videos.download_content(video.id, variant="poster")  # type: ignore[arg-type]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            again = client.videos.download_content(video.id, variant="thumbnail").read()
        assert again == thumb.content  # served from the cache beside the clip, the same bytes


def test_sdk_values_map_onto_the_grid_and_what_cannot_be_done_is_named(tiny_random_runtime, tmp_path):
    # The SDK's own sizes exceed the CPU limit of this tiny server; a server allowed 736x1280 shows the mapping.
    # Its per-job timeout is a millisecond, so accepted jobs end at their first module call (nothing is generated).
    with serving(create_app(tiny_random_runtime, tmp_path / "srv", max_pixels=736 * 1280, job_timeout_s=0.001,
                            max_queue=50)) as url:
        client = sdk(url)
        for size, seconds, want_size, want_seconds in [("720x1280", "4", "736x1280", "5.167"),
                                                       ("1280x720", "8", "1280x736", "8.000"),
                                                       ("720x1280", "12", "736x1280", "12.250")]:
            video = client.videos.create(prompt=PROMPT, size=size, seconds=seconds)  # type: ignore[arg-type]
            # 720 is not a multiple of 32: the nearest is 736 (ties go up); 8 s is 192 = 17*11+5 frames exactly;
            # 12 s (288 frames) snaps up to 294 = 12.25 s.
            assert (video.size, video.seconds) == (want_size, want_seconds)
            assert video.model_extra["h3_requested"] == {"size": size, "seconds": seconds}
        refused = {
            "size": dict(size="1792x1024"),  # 1,835,008 pixels over this server's limit
            "model": dict(model="sora-2"),
            "input_reference": dict(input_reference=("first.png", b"\x89PNG\r\n\x1a\n", "image/png")),  # truncated
            "negative_prompt": dict(extra_body={"negative_prompt": "blurry"}),
            "guidance_scale": dict(extra_body={"guidance_scale": 7.5}),
            "num_inference_steps": dict(extra_body={"num_inference_steps": 50}),
            "fps": dict(extra_body={"fps": 30}),
            "seconds": dict(seconds="20"),
            "quality": dict(extra_body={"quality": "high"}),  # not a field of this API: never silently ignored
        }
        messages = {}
        for name, kwargs in refused.items():
            with pytest.raises(openai.UnprocessableEntityError) as excinfo:
                client.videos.create(prompt=PROMPT, **kwargs)
            body = excinfo.value.body
            assert body["param"] == name and name in str(excinfo.value), (name, body)
            messages[name] = body["message"]
        assert "1792x1024 is 1835008 pixels" in messages["size"] and "--max-pixels" in messages["size"]
        assert "not a readable image" in messages["input_reference"] and "guidance-distilled" in messages["guidance_scale"]
        # honoured, not refused: SGLang's fields at the values this model runs
        ok = client.videos.create(prompt=PROMPT, extra_body={"guidance_scale": 1, "negative_prompt": "",
                                                             "num_inference_steps": 2, "fps": 24, "seed": 9})
        assert ok.model_extra["seed"] == 9 and ok.model_extra["num_inference_steps"] == 2
