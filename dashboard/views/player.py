"""The clip viewer's synchronized pair player: baseline and candidate <video> elements driven by one controller.

One HTML/JS page in ``st.iframe``: the baseline is the leader, the candidate follows it. One
play/pause, one seek bar (in frames), frame stepping (+-1 frame at the clip's fps), playback rate, and three views:
side by side, an A/B wipe (the candidate over the baseline, cut at a movable line) and an A/B flicker (the two
alternate in place). The follower is kept within one frame of the leader: re-synced on play, pause, seek and rate
change, and on every animation frame whose drift exceeds half a frame. The clips travel inside the page (base64,
turned into Blob URLs in the browser), so nothing but the Streamlit server is needed; clips over
:data:`MAX_EMBED_BYTES` together are not embedded (the caller falls back to plain players).
"""

from __future__ import annotations

import base64
import html
import json
import re
from pathlib import Path

import streamlit as st

MAX_EMBED_BYTES = 48 * 2**20
"""Baseline plus candidate MP4 bytes above which the pair is not embedded (the page would get slow)."""
VIDEO_MAX_HEIGHT = 360
"""CSS pixels of each player's height at most; the component's iframe is sized from it."""
CONTROLS_HEIGHT = 132


def fits(base_mp4: str | Path, cand_mp4: str | Path) -> bool:
    return Path(base_mp4).stat().st_size + Path(cand_mp4).stat().st_size <= MAX_EMBED_BYTES


def component_height() -> int:
    return VIDEO_MAX_HEIGHT + CONTROLS_HEIGHT


_HTML = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><style>
body { margin: 0; font: 13px sans-serif; color: #31333f; }
#stage { display: flex; gap: 8px; justify-content: center; position: relative; }
.side { display: flex; flex-direction: column; align-items: center; }
.side video { height: __MAXH__px; background: #000; display: block; }
.label { font-weight: 600; margin: 2px 0; }
#stage.overlay { display: block; width: fit-content; margin: 0 auto; }
#stage.overlay .side { position: relative; }
#stage.overlay #sideB { position: absolute; left: 0; top: 0; }
#stage.overlay .label { display: none; }
#wipeLine { position: absolute; top: 0; bottom: 0; width: 2px; background: #ff4b4b; display: none;
            pointer-events: none; }
#overlayLabel { position: absolute; left: 4px; top: 4px; background: rgba(0,0,0,.6); color: #fff; padding: 1px 6px;
                display: none; }
#controls { display: flex; flex-wrap: wrap; gap: 6px; align-items: center; margin-top: 6px; }
#controls button { font: inherit; padding: 2px 8px; }
#seek { flex: 1 1 300px; }
#status { font-variant-numeric: tabular-nums; min-width: 16em; }
</style></head><body>
<div id="h3sync" data-fps="__FPS__" data-frames="__FRAMES__">
  <div id="stage">
    <div class="side" id="sideA"><div class="label">A: baseline · __LABEL_A__</div>
      <video id="videoA" preload="auto" playsinline></video></div>
    <div class="side" id="sideB"><div class="label">B: candidate · __LABEL_B__</div>
      <video id="videoB" preload="auto" playsinline muted></video></div>
    <div id="wipeLine"></div><div id="overlayLabel"></div>
  </div>
  <div id="controls">
    <button id="play" title="play / pause both (space)">play</button>
    <button id="back" title="one frame back (left arrow)">-1 frame</button>
    <button id="fwd" title="one frame forward (right arrow)">+1 frame</button>
    <input id="seek" type="range" min="0" max="__LAST__" step="1" value="0" title="frame">
    <span id="status">frame 0 / __LAST__</span>
  </div>
  <div id="controls2" style="display:flex; gap:10px; align-items:center; margin-top:4px; flex-wrap: wrap;">
    <label>view <select id="mode">
      <option value="side">side by side</option><option value="wipe">A/B wipe</option>
      <option value="flicker">A/B flicker</option></select></label>
    <label id="wipeBox" style="display:none">wipe at <input id="wipe" type="range" min="0" max="100" value="50"></label>
    <label id="flickerBox" style="display:none">flicker every <select id="flickerMs">
      <option>250</option><option selected>500</option><option>1000</option></select> ms</label>
    <label>speed <select id="rate"><option>0.25</option><option>0.5</option><option selected>1</option>
      <option>2</option></select>x</label>
    <label><input type="checkbox" id="loop"> loop</label>
    <label>sound from <select id="sound"><option value="A">A (baseline)</option><option value="B">B (candidate)</option>
      <option value="none">neither</option></select></label>
    <span id="drift" title="|candidate - baseline| currentTime, in frames"></span>
  </div>
</div>
<script id="clipA" type="application/octet-stream">__DATA_A__</script>
<script id="clipB" type="application/octet-stream">__DATA_B__</script>
<script>
(function () {
  const root = document.getElementById("h3sync");
  const fps = Number(root.dataset.fps), frames = Number(root.dataset.frames), last = Math.max(0, frames - 1);
  const A = document.getElementById("videoA"), B = document.getElementById("videoB");
  const seek = document.getElementById("seek"), status = document.getElementById("status");
  const playBtn = document.getElementById("play"), drift = document.getElementById("drift");
  const stage = document.getElementById("stage"), sideB = document.getElementById("sideB");
  const wipeLine = document.getElementById("wipeLine"), overlayLabel = document.getElementById("overlayLabel");
  function blobUrl(id) {
    const raw = atob(document.getElementById(id).textContent.trim());
    const bytes = new Uint8Array(raw.length);
    for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
    return URL.createObjectURL(new Blob([bytes], {type: "video/mp4"}));
  }
  A.src = blobUrl("clipA"); B.src = blobUrl("clipB");
  function size() {  // both players the same size: as tall as allowed, two side by side within the page width
    if (!A.videoWidth || !A.videoHeight) return;
    const aspect = A.videoWidth / A.videoHeight, room = (document.body.clientWidth - 16) / 2;
    const h = Math.max(32, Math.floor(Math.min(__MAXH__, room / aspect)));
    for (const v of [A, B]) {
      v.style.height = h + "px"; v.style.width = Math.round(h * aspect) + "px";
      v.style.imageRendering = v.videoHeight * 2 <= h ? "pixelated" : "auto";  // small clips: pixels stay sharp
    }
  }
  A.addEventListener("loadedmetadata", size); B.addEventListener("loadedmetadata", size);
  window.addEventListener("resize", size);
  const frameOf = (t) => Math.min(last, Math.max(0, Math.floor(t * fps + 1e-6)));
  const timeOf = (f) => (f + 0.5) / fps;  // the middle of frame f: lands in f whatever the rounding
  // The follower takes the leader's time, rate and play state. Stopped: the same time. Playing: its rate is
  // steered toward the leader's time (up to 20% faster or slower); a follower more than FAR frames off (a stall of
  // one decoder on a busy machine) jumps to the leader. It starts once the leader's clock moves (an audio output
  // opening holds the leader back), from the leader's time, and is steered once its own clock moves.
  const FAR = 3;
  let startedAt = 0;  // the leader's time when it was last started or sought
  let startFrom = null;  // where the follower was started, until its clock moves
  function follow() {
    if (A.paused || A.ended) {
      if (!B.paused) B.pause();
      if (B.currentTime !== A.currentTime) B.currentTime = A.currentTime;
      B.playbackRate = A.playbackRate;
      startFrom = null;
      return;
    }
    if (A.currentTime <= startedAt + 0.25 / fps) return;  // the leader's clock has not started moving yet
    if (B.paused) {
      B.playbackRate = A.playbackRate;
      B.currentTime = startFrom = A.currentTime;
      B.play().catch(() => {});
      return;
    }
    if (startFrom !== null) {
      if (B.currentTime <= startFrom) return;  // not moving yet
      startFrom = null;
    }
    const d = A.currentTime - B.currentTime;  // > 0: the follower is behind
    if (Math.abs(d) > FAR / fps && !B.seeking) { B.currentTime = A.currentTime; return; }
    const rate = A.playbackRate * (1 + Math.max(-0.2, Math.min(0.2, 0.4 * d * fps)));
    if (Math.abs(rate - B.playbackRate) > 0.01) B.playbackRate = rate;
  }
  function show() {
    const f = frameOf(A.currentTime);
    seek.value = f;
    status.textContent = "frame " + f + " / " + last + " · " + A.currentTime.toFixed(3) + " s";
    playBtn.textContent = A.paused ? "play" : "pause";
    drift.textContent = "drift " + (Math.abs(B.currentTime - A.currentTime) * fps).toFixed(2) + " frame";
  }
  function tick() {
    if (!A.seeking && !B.seeking) follow();
    show();
    requestAnimationFrame(tick);
  }
  function toFrame(f) {
    A.pause();
    A.currentTime = timeOf(Math.min(last, Math.max(0, f)));
    B.currentTime = A.currentTime;
  }
  function toggle() {
    if (A.paused) {
      if (A.ended || frameOf(A.currentTime) >= last) { A.currentTime = 0; B.currentTime = 0; }
      B.currentTime = startedAt = A.currentTime;
      A.play().catch(() => {});  // the follower starts when the leader's clock moves (follow)
    } else { A.pause(); B.pause(); B.currentTime = A.currentTime; }
  }
  ["pause", "seeked", "seeking", "ended", "waiting"].forEach((e) => A.addEventListener(e, () => {
    if (e === "waiting" || e === "ended") B.pause();
    B.currentTime = startedAt = A.currentTime; follow(); show();
  }));
  ["play", "playing", "ratechange", "timeupdate"].forEach((e) => A.addEventListener(e, () => { follow(); show(); }));
  playBtn.onclick = toggle;
  document.getElementById("back").onclick = () => toFrame(frameOf(A.currentTime) - 1);
  document.getElementById("fwd").onclick = () => toFrame(frameOf(A.currentTime) + 1);
  seek.oninput = () => toFrame(Number(seek.value));
  document.getElementById("rate").onchange = (ev) => { A.playbackRate = Number(ev.target.value); follow(); };
  const loop = document.getElementById("loop");
  loop.onchange = () => { A.loop = B.loop = loop.checked; };
  const sound = document.getElementById("sound");
  function applySound() { A.muted = sound.value !== "A"; B.muted = sound.value !== "B"; }
  sound.onchange = applySound; applySound();
  document.addEventListener("keydown", (ev) => {
    if (ev.key === " ") { toggle(); ev.preventDefault(); }
    else if (ev.key === "ArrowLeft") { toFrame(frameOf(A.currentTime) - 1); ev.preventDefault(); }
    else if (ev.key === "ArrowRight") { toFrame(frameOf(A.currentTime) + 1); ev.preventDefault(); }
  });
  // Views: side by side; wipe (B clipped to the right of the line); flicker (B shown, then hidden, in turn).
  const mode = document.getElementById("mode"), wipe = document.getElementById("wipe");
  let flickerTimer = null, showingB = true;
  function applyWipe() {
    const pct = Number(wipe.value);
    sideB.style.clipPath = "inset(0 0 0 " + pct + "%)";
    wipeLine.style.left = "calc(" + pct + "% - 1px)";
    overlayLabel.textContent = "A (baseline) | B (candidate)";
  }
  function applyMode() {
    clearInterval(flickerTimer); flickerTimer = null;
    sideB.style.clipPath = ""; sideB.style.visibility = "visible";
    const m = mode.value;
    stage.classList.toggle("overlay", m !== "side");
    wipeLine.style.display = m === "wipe" ? "block" : "none";
    overlayLabel.style.display = m === "side" ? "none" : "block";
    document.getElementById("wipeBox").style.display = m === "wipe" ? "" : "none";
    document.getElementById("flickerBox").style.display = m === "flicker" ? "" : "none";
    if (m === "wipe") applyWipe();
    if (m === "flicker") {
      const flip = () => {
        showingB = !showingB;
        sideB.style.visibility = showingB ? "visible" : "hidden";
        overlayLabel.textContent = showingB ? "B: candidate" : "A: baseline";
      };
      showingB = false; flip();
      flickerTimer = setInterval(flip, Number(document.getElementById("flickerMs").value));
    }
  }
  mode.onchange = applyMode; wipe.oninput = applyWipe;
  document.getElementById("flickerMs").onchange = applyMode;
  window.h3sync = {A: A, B: B, fps: fps, frames: frames, toFrame: toFrame, toggle: toggle, frameOf: frameOf};
  requestAnimationFrame(tick);
})();
</script></body></html>
"""


def player_html(base: bytes, cand: bytes, fps: float, num_frames: int, label_a: str, label_b: str) -> str:
    """The component's page for one pair: the two MP4s' bytes, the clip's fps and frame count, the two labels."""
    if not fps > 0:
        raise ValueError(f"fps must be positive, got {fps}")
    values = {
        "__MAXH__": str(VIDEO_MAX_HEIGHT),
        "__FPS__": json.dumps(float(fps)),
        "__FRAMES__": str(int(num_frames)),
        "__LAST__": str(max(0, int(num_frames) - 1)),
        "__LABEL_A__": html.escape(label_a),
        "__LABEL_B__": html.escape(label_b),
        "__DATA_A__": base64.b64encode(base).decode("ascii"),
        "__DATA_B__": base64.b64encode(cand).decode("ascii"),
    }
    # One pass: a value (a label) that happens to look like a placeholder is not substituted again.
    return re.sub("|".join(values), lambda m: values[m.group(0)], _HTML)


@st.cache_data(show_spinner=False, max_entries=4)
def _cached_page(base_mp4: str, base_mtime: int, cand_mp4: str, cand_mtime: int, fps: float, num_frames: int,
                 label_a: str, label_b: str) -> str:
    del base_mtime, cand_mtime  # only part of the cache key: a rewritten clip is read again
    return player_html(Path(base_mp4).read_bytes(), Path(cand_mp4).read_bytes(), fps, num_frames, label_a, label_b)


def render(base_mp4: str | Path, cand_mp4: str | Path, fps: float, num_frames: int, label_a: str,
           label_b: str) -> None:
    page = _cached_page(str(base_mp4), Path(base_mp4).stat().st_mtime_ns, str(cand_mp4),
                        Path(cand_mp4).stat().st_mtime_ns, float(fps), int(num_frames), label_a, label_b)
    st.iframe(page, height=component_height())  # our own page (labels escaped): runs with the app's origin
