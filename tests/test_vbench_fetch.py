"""``h3eval vbench setup --fetch-checkpoints`` against a real HTTP server on loopback serving stand-in files: pinned on
first download, kept when present, a wrong hash refused, a cut download resumed (or restarted when the server
ignores Range), archives unpacked, and nothing half-written where VBench reads."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import threading
import zipfile
from pathlib import Path

import pytest

from gates.vbench.fetch import FetchError, HashMismatchError, OFFICIAL_SOURCES, Source, fetch_checkpoints
from gates.vbench.dimensions import DIMENSIONS
from gates.vbench.pins import load_json_file, verify_checkpoints

AMT = bytes(range(256)) * 700  # 179 kB stand-in for amt-s.pth


def _zip(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return buf.getvalue()


RAFT_ZIP = _zip({"models/raft-things.pth": b"raft" * 5000, "models/raft-small.pth": b"small"})
DINO_ZIP = _zip({"dino-main/hubconf.py": b"dependencies = ['torch']\n", "dino-main/vision_transformer.py": b"# vit\n"})
DINO_PTH = b"dino weights" * 1000


class Server:
    """Loopback server: ``files`` by path; ``cut`` paths send half their body once then drop the connection;
    ``ranges`` False ignores Range requests (answers 200 with the whole file)."""

    def __init__(self, files: dict[str, bytes]):
        self.files, self.cut, self.ranges, self.requests = dict(files), set(), True, []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                server.requests.append((self.path, self.headers.get("Range")))
                data = server.files.get(self.path)
                if data is None:
                    self.send_error(404)
                    return
                start = 0
                rng = self.headers.get("Range")
                if rng and server.ranges:
                    start = int(rng.removeprefix("bytes=").split("-")[0])
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                body = data[start:]
                if self.path in server.cut:
                    server.cut.discard(self.path)
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = Server({"/amt-s.pth": AMT, "/models.zip": RAFT_ZIP, "/dino.pth": DINO_PTH, "/dino-main.zip": DINO_ZIP})
    yield s
    s.close()


def _sources(base: str) -> dict[str, Source]:
    return {
        "amt_model/amt-s.pth": Source("amt_model/amt-s.pth", f"{base}/amt-s.pth"),
        "raft_model/models/raft-things.pth": Source("raft_model/models/raft-things.pth", f"{base}/models.zip", "zip",
                                                    "models/raft-things.pth"),
        "dino_model/dino_vitbase16_pretrain.pth": Source("dino_model/dino_vitbase16_pretrain.pth", f"{base}/dino.pth"),
        "dino_model/facebookresearch_dino_main/": Source("dino_model/facebookresearch_dino_main/",
                                                         f"{base}/dino-main.zip", "zip", "dino-main/"),
    }


DIMS = ["motion_smoothness", "dynamic_degree", "subject_consistency"]


def test_every_checkpoint_of_every_dimension_has_an_official_source():
    assert {c for d in DIMENSIONS.values() for c in d.checkpoints} == set(OFFICIAL_SOURCES)
    assert all(s.url.startswith("https://") for s in OFFICIAL_SOURCES.values())


def test_first_download_pins_then_verifies_and_keeps(server, tmp_path):
    cache, pins = tmp_path / "cache", tmp_path / "pins.json"
    report = fetch_checkpoints(DIMS, cache, pins, sources=_sources(server.base))
    assert sorted(report.pinned_now) == sorted(report.downloaded) and len(report.downloaded) == 4
    assert (cache / "amt_model/amt-s.pth").read_bytes() == AMT
    assert (cache / "raft_model/models/raft-things.pth").read_bytes() == b"raft" * 5000
    assert not (cache / "raft_model/models/raft-small.pth").exists()  # only what VBench loads
    assert (cache / "dino_model/facebookresearch_dino_main/hubconf.py").is_file()
    pinned = {e["path"]: e["sha256"] for e in load_json_file(pins, "pins")["checkpoints"]}
    assert pinned["amt_model/amt-s.pth"] == hashlib.sha256(AMT).hexdigest()
    # The product's own verification accepts what was fetched.
    assert verify_checkpoints(cache, load_json_file(pins, "pins"), DIMS) == []
    assert not list((cache / ".fetch").glob("*"))  # nothing left behind
    before = len(server.requests)
    again = fetch_checkpoints(DIMS, cache, pins, sources=_sources(server.base))
    assert len(again.kept) == 4 and not again.downloaded and len(server.requests) == before


def test_a_wrong_hash_is_refused_and_nothing_is_put_in_place(server, tmp_path):
    cache, pins = tmp_path / "cache", tmp_path / "pins.json"
    pins.write_text(json.dumps({"version": 1, "checkpoints": [
        {"path": "amt_model/amt-s.pth", "sha256": "0" * 64, "bytes": len(AMT)}]}))
    with pytest.raises(HashMismatchError, match="refused amt_model/amt-s.pth"):
        fetch_checkpoints(["motion_smoothness"], cache, pins, sources=_sources(server.base))
    assert not (cache / "amt_model/amt-s.pth").exists()
    assert not list((cache / ".fetch").glob("*"))
    assert json.loads(pins.read_text())["checkpoints"][0]["sha256"] == "0" * 64  # the pin is not rewritten


def test_a_cut_download_is_resumed_with_range_and_never_half_written(server, tmp_path):
    cache, pins = tmp_path / "cache", tmp_path / "pins.json"
    server.cut.add("/amt-s.pth")
    with pytest.raises(FetchError, match="cut"):
        fetch_checkpoints(["motion_smoothness"], cache, pins, sources=_sources(server.base))
    assert not (cache / "amt_model/amt-s.pth").exists()
    parts = list((cache / ".fetch").glob("*.part"))
    assert len(parts) == 1 and 0 < parts[0].stat().st_size < len(AMT)
    report = fetch_checkpoints(["motion_smoothness"], cache, pins, sources=_sources(server.base))
    assert report.resumed == ["amt_model/amt-s.pth"]
    assert server.requests[-1] == ("/amt-s.pth", f"bytes={len(AMT) // 2}-")
    assert (cache / "amt_model/amt-s.pth").read_bytes() == AMT


def test_a_server_that_ignores_range_restarts_from_zero(server, tmp_path):
    cache, pins = tmp_path / "cache", tmp_path / "pins.json"
    server.cut.add("/models.zip")
    with pytest.raises(FetchError):
        fetch_checkpoints(["dynamic_degree"], cache, pins, sources=_sources(server.base))
    server.ranges = False
    report = fetch_checkpoints(["dynamic_degree"], cache, pins, sources=_sources(server.base))
    assert report.resumed == [] and (cache / "raft_model/models/raft-things.pth").read_bytes() == b"raft" * 5000


def test_the_cli_fetches_and_a_missing_file_is_an_error(server, tmp_path, monkeypatch):
    from gates.vbench import fetch

    cache, pins = tmp_path / "cache", tmp_path / "pins.json"
    broken = dict(_sources(server.base))
    broken["amt_model/amt-s.pth"] = Source("amt_model/amt-s.pth", f"{server.base}/nope.pth")
    with pytest.raises(FetchError, match="HTTP 404"):
        fetch_checkpoints(["motion_smoothness"], cache, pins, sources=broken)
    from h3eval.commands.vbench import run_fetch

    monkeypatch.setattr(fetch, "OFFICIAL_SOURCES", _sources(server.base))
    result = run_fetch(["motion_smoothness"], cache, pins, show_progress=False)
    assert result["pinned_now"] == ["amt_model/amt-s.pth"]
