"""Reports of a verdict: ``verdict.json``, ``report.md``, a self-contained ``report.html`` and ``junit.xml``.

* ``report.md``: the signoff table (candidate x gate), each non-passing item's reasons, each metric's statistics.
* ``report.html``: the same, with its images embedded as base64 PNGs so the one file can be mailed or attached to a
  CI run: speed versus quality per candidate, the stage anatomy of each recipe (from the clip records), and
  side-by-side strips of the worst pairs (the gate's own artifact PNGs where it wrote some, else baseline /
  candidate / amplified-difference frames decoded from the MP4s). Links to the evidence are relative to the run.
* ``junit.xml``: one ``testsuite`` per candidate and one ``testcase`` per (candidate, gate), plus one for speed, so
  any CI system shows the signoff. FAIL is a ``<failure>``, INCONCLUSIVE an ``<error type="INCONCLUSIVE">`` (not a
  pass, not a regression either); an advisory gate that does not pass is ``<skipped>`` with its outcome.

Charts need matplotlib; without it the HTML says that the charts are left out (and logs it), never fails silently.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import json
import logging
import math
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Iterable

from h3.atomic import atomic_write_text
from h3eval.report_media import (DIFF_GAIN, STRIP_FRAMES, STRIP_HEIGHT, decoded_strip,  # noqa: F401 (re-exported)
                                 speed_quality_chart, stage_anatomy_chart)
from h3eval.store import RecordError, RunStore, read_clip_record
from h3eval.verdict import (CandidateVerdict, GateVerdict, MetricVerdict, SpeedVerdict, Verdict, VerdictInputError,
                            read_verdict, run_verdict, write_verdict)

logger = logging.getLogger(__name__)

MAX_STRIPS = 6


def _fmt(x: float | None, digits: int = 4) -> str:
    return "n/a" if x is None else f"{x:.{digits}g}"


def _iter_items(c: CandidateVerdict) -> Iterable[GateVerdict | SpeedVerdict]:
    yield from c.gates
    if c.speed is not None:
        yield c.speed


def _positive(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def speed_json_estimate(run_dir: str | Path | None, candidate: str) -> str | None:
    """``<section>: 3.31x [2.83, 4.48] (n 12)`` from the run's speed.json for ``candidate``: its first speed protocol
    with a speedup (the mixed and repeated protocols before the quality clips), or None. Numbers that are not finite
    and positive are ignored, never shown."""
    if run_dir is None:
        return None
    try:
        speed = json.loads((Path(run_dir) / "speed.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    sections = speed.get("protocols") if isinstance(speed, dict) else None
    if not isinstance(sections, dict):
        return None
    for name in sorted(sections, key=lambda n: n == "quality_clips"):
        entry = sections[name].get(candidate) if isinstance(sections[name], dict) else None
        sp = entry.get("speedup") if isinstance(entry, dict) else None
        if not isinstance(sp, dict) or not _positive(sp.get("speedup")):
            continue
        ci = (f" [{sp['ci_low']:.2f}, {sp['ci_high']:.2f}]" if _positive(sp.get("ci_low"))
              and _positive(sp.get("ci_high")) else " (no CI)")
        n = sp.get("n_pairs")
        return f"{name}: {sp['speedup']:.2f}x{ci}" + (f" (n {n})" if isinstance(n, int) else "")
    return None


def speed_cell(sp: SpeedVerdict, run_dir: str | Path | None = None) -> str:
    """The signoff table's speed cell: the outcome with the speedup and its CI the verdict judged; when the verdict
    has no estimate (too few timed pairs, timings missing), the run's speed.json estimate, named as such."""
    if sp.speedup is not None and math.isfinite(sp.speedup):
        ci = (f" [{sp.ci_low:.2f}, {sp.ci_high:.2f}]" if sp.ci_low is not None and sp.ci_high is not None
              else " (no CI)")
        return f"{sp.outcome} {sp.speedup:.2f}x{ci}"
    other = speed_json_estimate(run_dir, sp.candidate)
    if other is not None:
        return f"{sp.outcome} (no estimate in the verdict; speed.json {other})"
    return f"{sp.outcome} (no estimate: " + ("no timed pairs)" if not sp.n_pairs else f"{sp.n_pairs} timed pair(s))")


# -- markdown ------------------------------------------------------------------------------------------------------
def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _waiver_text(item: Any) -> str:
    w = getattr(item, "waiver", None)
    if w is None:
        return ""
    return f" (waived {w.raw_outcome}: {w.owner}, until {w.expires.isoformat()}: {w.reason})"


def _estimate(m: MetricVerdict) -> str:
    """The metric's estimate: a flag metric's candidate-flagged pairs, else the mean with its CI."""
    if m.compare == "flag":
        s = m.stats or {}
        return (f"{s.get('candidate_flagged', 'n/a')} flagged (baseline only {s.get('baseline_flagged', 'n/a')}, "
                f"both {s.get('both_flagged', 'n/a')})")
    kind = "mean value" if m.compare == "pair" else "mean delta"
    return f"{kind} {_fmt(m.mean_value)} [{_fmt(m.ci_low)}, {_fmt(m.ci_high)}]"


def _limit(m: MetricVerdict) -> str:
    """What the estimate is held against: the threshold or margin, a pair limit, or a flag rule's pair count."""
    if m.compare == "flag":
        s = m.stats or {}
        return f"{s.get('rule', '')}, at most {s.get('max_flagged_pairs', 'n/a')} pair(s)"
    return _fmt(m.threshold if m.threshold is not None else m.pair_limit)


def _metric_row(m: MetricVerdict) -> str:
    s = m.stats or {}
    signs = s.get("signs", {}).get("describe", "")
    wil = s.get("wilcoxon", {}).get("pvalue")
    tost = s.get("noninferiority", {}).get("tost_p") if m.compare != "pair" else None
    mcn = (s.get("mcnemar") or {}).get("pvalue")
    return (
        f"| {m.gate}.{m.metric}{'' if m.required else ' (advisory)'} | {m.outcome}{_waiver_text(m)} | {m.compare} | "
        f"{_estimate(m)} | {_limit(m)} | {m.n_pairs}/"
        f"{m.n_expected} | {signs} | {_fmt(wil, 3)} | {_fmt(m.p_holm if m.p_holm is not None else m.p_value, 3)} | "
        f"{_fmt(tost, 3)} | {_fmt(mcn, 3)} | {_fmt(s.get('mde'), 3)} |"
    )


def conditioning_summary(run_dir: str | Path | None) -> list[str]:
    """One line per workflow of the run's clips (issue 25): how many clips, and the image inputs they were
    conditioned on (sha256, kept under ``inputs/``). Empty for a run of text-only clips or without a directory."""
    if run_dir is None:
        return []
    store = RunStore(run_dir)
    clips: dict[str, int] = {}
    images: dict[str, set[tuple[str, str]]] = {}
    for recipe in store.clip_recipes():
        for path in store.clip_record_paths(recipe):
            try:
                record = read_clip_record(path)
            except RecordError:
                continue  # an unreadable record is the verdict's finding, not this summary's
            workflow = record.request.workflow
            clips[workflow] = clips.get(workflow, 0) + 1
            images.setdefault(workflow, set()).update((c.role, c.sha256) for c in record.request.conditioning)
    if set(clips) <= {"t2va"}:
        return []
    lines = []
    for workflow in sorted(clips):
        kept = sorted(images[workflow])
        missing = [sha for _, sha in kept if not store.input_path(sha).is_file()]
        roles = ", ".join(f"{role} `{sha[:12]}`" for role, sha in kept[:6]) + (" ..." if len(kept) > 6 else "")
        line = f"workflow {workflow}: {clips[workflow]} clips" + (f"; images {roles}" if kept else "")
        if missing:
            line += f"; {len(missing)} image(s) missing from inputs/"
        lines.append(line)
    return lines


def ladder_table(verdict: Verdict) -> list[str]:
    """Seed 000's stage table: each rung against the rung below it, with its judge, the levers it adds, its speedup
    over the rung below and its quality gates."""
    out = ["## Ladder", "",
           "Each rung against the rung below it (same prompts and seeds), judged by the levers it changes.", "",
           "| rung | against | judge | levers changed | speedup vs the rung below [CI] | quality | outcome |",
           "|---|---|---|---|---|---|---|"]
    for r in verdict.ladder:
        ci = f" [{_fmt(r.speedup_ci[0], 3)}, {_fmt(r.speedup_ci[1], 3)}]" if r.speedup_ci else ""
        speed = f"{_fmt(r.speedup, 3)}x{ci}" if r.speedup is not None else "n/a"
        out.append(f"| {r.candidate} | {r.below} | {r.judge or 'none'} | {', '.join(r.levers) or '-'} | {speed} | "
                   f"{_md_escape(r.quality)} | **{r.outcome}** |")
    return out + [""]


def _candidate_section(c: CandidateVerdict, conf: int, heading: str, level: str = "###") -> list[str]:
    """One candidate's judge, reasons, gates, metrics and speed (the ladder top's judgement against the baseline
    renders the same way, one heading level down)."""
    out = [heading, ""]
    if c.judge is not None:
        against = f" against `{c.judged_against}`" if c.judged_against else ""
        out += [f"Judged as **{c.judge}**{against}: {_md_escape(c.judge_reason or '')}", ""]
    if c.lever_differences:
        out += ["| lever changed | implies | why |", "|---|---|---|"]
        out += [f"| {d['lever']} | {d['kind']} | {_md_escape(d['why'])} |" for d in c.lever_differences] + [""]
    if c.detectable:
        shown = [d for d in c.detectable if d["compare"] != "pair"] or c.detectable
        n = max(d["n_pairs"] for d in shown)
        out += [f"Smallest regression this run could detect at its size ({n} pairs; MDE at the policy's power, "
                "one-sided): " + "; ".join(f"{d['metric']} {_fmt(d['mde'], 3)} against margin {_fmt(d['margin'], 3)}"
                                          + ("" if d["resolves"] else " (not resolved)") for d in shown), ""]
    out += [f"- {_md_escape(r)}" for r in c.reasons] + ([""] if c.reasons else [])
    out += [f"- warning: {_md_escape(w)}" for w in c.warnings] + ([""] if c.warnings else [])
    out += [f"- configured versus executed: {_md_escape(f)}" for f in c.executed_flags] + (
        [""] if c.executed_flags else [])
    for item in _iter_items(c):
        if isinstance(item, SpeedVerdict):
            against = f" (against `{item.reference}`, the rung below)" if item.reference else ""
            out += [f"{level} speed{against}: {item.outcome}{_waiver_text(item)}", ""]
            out += [f"- {_md_escape(r)}" for r in item.reasons]
            out += [f"- warning: {_md_escape(w)}" for w in item.warnings]
            if item.speedup is not None:
                out.append(f"- {item.latency}: geometric mean of per-request ratios "
                           f"{_fmt(item.geometric_mean_ratio)}x, "
                           f"median {_fmt(item.median_ratio)}x; {item.n_pairs} pairs, {item.excluded_warmup} "
                           "warm-up pair(s) excluded")
            out.append("")
            continue
        g = item
        out += [f"{level} {g.gate}{'' if g.required else ' (advisory)'}: {g.outcome}{_waiver_text(g)}", ""]
        out.append(f"- results: {g.n_usable} usable of {g.n_expected} expected pairs ({g.n_results} files); "
                   f"evidence: [{g.evidence[0]}]({g.evidence[0]})")
        out += [f"- {_md_escape(r)}" for r in g.reasons]
        out += [f"- warning: {_md_escape(w)}" for w in g.warnings]
        if g.flagged:
            out += [f"- flagged: {_md_escape(f)}" for f in g.flagged[:10]]
        if g.metrics:
            out += [
                "",
                f"| metric | outcome | compare | estimate [{conf}% CI] | threshold | pairs | signs | Wilcoxon p | "
                "decisive p (Holm) | TOST p | McNemar p | MDE |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|",
            ]
            out += [_metric_row(m) for m in g.metrics]
            out.append("")
            for m in g.metrics:
                for line in m.reasons:
                    out.append(f"- {m.metric}: {_md_escape(line)}")
                for line in m.warnings:
                    out.append(f"- {m.metric}: warning: {_md_escape(line)}")
                if m.worst:
                    links = ", ".join(f"[{p.prompt_id}-s{p.seed}]({p.file})" for p in m.worst)
                    out.append(f"- {m.metric}: worst pairs: {links}")
        out.append("")
    return out


def render_markdown(verdict: Verdict, run_dir: str | Path | None = None) -> str:
    conf = int(verdict.settings.confidence * 100)
    out = [
        f"# h3eval signoff: {verdict.outcome}",
        "",
        *[f"> **{_md_escape(notice)}**\n" for notice in verdict.notices],
        f"- policy: `{verdict.policy_name}` ({verdict.inputs.policy.path}, "
        f"sha256 `{verdict.inputs.policy.sha256[:12]}`)",
        f"- run: `{verdict.run_dir}`; baseline `{verdict.baseline}`",
        f"- {conf}% paired BCa CIs; one-sided tests at {verdict.settings.alpha_one_sided:g}; Holm "
        f"{'on' if verdict.settings.holm else 'off'}; waivers checked on {verdict.settings.today.isoformat()}",
        f"- exit code {verdict.exit_code} (0 PASS, 1 FAIL, 2 INCONCLUSIVE)",
        "",
        "## Signoff",
        "",
    ]
    gates = list(dict.fromkeys(g.gate for c in verdict.candidates for g in c.gates))
    has_speed = any(c.speed is not None for c in verdict.candidates)
    header = ["candidate", "overall", *gates, *(["speed"] if has_speed else [])]
    out.append("| " + " | ".join(header) + " |")
    out.append("|" + "---|" * len(header))
    for c in verdict.candidates:
        cells = [c.candidate, f"**{c.outcome}**"]
        by_gate = {g.gate: g for g in c.gates}
        for gate in gates:
            g = by_gate.get(gate)
            cells.append("" if g is None else g.outcome + ("" if g.required else " (adv.)") + ("*" if g.waiver else ""))
        if has_speed:
            sp = c.speed
            cells.append("" if sp is None else _md_escape(speed_cell(sp, run_dir)) + ("*" if sp.waiver else ""))
        out.append("| " + " | ".join(cells) + " |")
    out += ["", "`*` waived; `(adv.)` advisory.", ""]
    if verdict.warnings:
        out += ["## Warnings", ""] + [f"- {_md_escape(w)}" for w in verdict.warnings] + [""]

    if verdict.ladder:
        out += ladder_table(verdict)
    for c in verdict.candidates:
        out += _candidate_section(c, conf, f"## {c.candidate}: {c.outcome}")
        if c.against_baseline is not None:
            top = c.against_baseline
            out += _candidate_section(top, conf, f"### {c.candidate} against the baseline `{verdict.baseline}` (the "
                                                 f"top of the ladder): {top.outcome}", level="####")
    out += ["## Inputs", "", f"- run.json sha256 `{verdict.inputs.run_manifest.sha256}`"]
    if verdict.inputs.prompts:
        out.append(f"- prompts `{verdict.inputs.prompts.path}` sha256 `{verdict.inputs.prompts.sha256}`")
    out += [f"- recipe `{k}` sha256 `{v}`" for k, v in verdict.inputs.recipes.items()]
    out.append(f"- {len(verdict.inputs.clips)} clip records and {len(verdict.inputs.gate_results)} gate results "
               "hashed in verdict.json")
    if verdict.inputs.floor:
        out.append(f"- noise floor `{verdict.inputs.floor.path}` sha256 `{verdict.inputs.floor.sha256}`")
    out += [f"- {line}" for line in conditioning_summary(run_dir)]
    return "\n".join(out) + "\n"


# -- junit ---------------------------------------------------------------------------------------------------------
def render_junit(verdict: Verdict) -> str:
    root = ET.Element("testsuites", name=f"h3eval {verdict.policy_name}")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for c in verdict.candidates:
        suite = ET.SubElement(root, "testsuite", name=f"h3eval.{verdict.policy_name}.{c.candidate}",
                              timestamp=verdict.created_at.replace("+00:00", ""))
        props = ET.SubElement(suite, "properties")
        for name, value in (("outcome", c.outcome), ("baseline", verdict.baseline), ("candidate", c.candidate),
                            ("policy", verdict.policy_name), ("policy_sha256", verdict.inputs.policy.sha256)):
            ET.SubElement(props, "property", name=name, value=value)
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        for item in _iter_items(c):
            name = "speed" if isinstance(item, SpeedVerdict) else item.gate
            case = ET.SubElement(suite, "testcase", name=name, classname=f"h3eval.{c.candidate}", time="0")
            counts["tests"] += 1
            details = "\n".join([*item.reasons, *(f"warning: {w}" for w in item.warnings),
                                 *(f"evidence: {e}" for e in item.evidence[:10])])
            message = f"{item.outcome}: {item.reasons[0] if item.reasons else ''}"[:500]
            if not item.required and item.outcome != "PASS":
                ET.SubElement(case, "skipped", message=f"advisory {message}")
                counts["skipped"] += 1
            elif item.outcome == "FAIL":
                ET.SubElement(case, "failure", message=message, type="FAIL").text = details
                counts["failures"] += 1
            elif item.outcome == "INCONCLUSIVE":
                ET.SubElement(case, "error", message=message, type="INCONCLUSIVE").text = details
                counts["errors"] += 1
            ET.SubElement(case, "system-out").text = details + _waiver_text(item)
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
    for key, value in totals.items():
        root.set(key, str(value))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


# -- images --------------------------------------------------------------------------------------------------------
def _worst_pairs(verdict: Verdict) -> list[tuple[CandidateVerdict, MetricVerdict, Any]]:
    """Worst pair of each metric, non-passing metrics first."""
    items = []
    for c in verdict.candidates:
        for g in c.gates:
            for m in g.metrics:
                if m.worst:
                    items.append((c, m, m.worst[0]))
    items.sort(key=lambda t: {"FAIL": 0, "INCONCLUSIVE": 1, "PASS": 2}[t[1].outcome])
    seen: set[tuple[str, str, int]] = set()
    out = []
    for c, m, p in items:
        key = (c.candidate, p.prompt_id, p.seed)
        if key in seen:
            continue
        seen.add(key)
        out.append((c, m, p))
    return out[:MAX_STRIPS]


# -- html ----------------------------------------------------------------------------------------------------------
_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:.5em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}
.PASS{background:#d9f2d9}.FAIL{background:#f8d0d0}.INCONCLUSIVE{background:#fbe8c0}
code{font-size:12px}img{max-width:100%;border:1px solid #ddd}.warn{color:#8a5a00}
"""


def _cell(outcome: str, text: str | None = None) -> str:
    return f'<td class="{outcome}">{html.escape(text or outcome)}</td>'


def _html_candidate(c: CandidateVerdict) -> list[str]:
    """One candidate's section of report.html: its configured-versus-executed flags, each gate's and the speed
    check's outcome, reasons and evidence, and each gate's metric table."""
    e = html.escape
    parts: list[str] = []
    parts.append(f"<h2>{e(c.candidate)}: <span class='{c.outcome}'>{c.outcome}</span></h2>")
    parts += [f"<p class='warn'>configured versus executed: {e(f)}</p>" for f in c.executed_flags]
    for item in _iter_items(c):
        name = "speed" if isinstance(item, SpeedVerdict) else item.gate
        parts.append(f"<h3>{e(name)}{'' if item.required else ' (advisory)'}: "
                     f"<span class='{item.outcome}'>{item.outcome}</span>{e(_waiver_text(item))}</h3><ul>")
        parts += [f"<li>{e(r)}</li>" for r in item.reasons]
        parts += [f"<li class='warn'>warning: {e(w)}</li>" for w in item.warnings]
        parts += [f"<li>evidence: <a href='{e(x)}'>{e(x)}</a></li>" for x in item.evidence[:5]]
        parts.append("</ul>")
        if isinstance(item, GateVerdict) and item.metrics:
            parts.append("<table><tr><th>metric</th><th>outcome</th><th>estimate</th><th>CI</th><th>threshold</th>"
                         "<th>pairs</th><th>signs</th><th>Wilcoxon p</th><th>decisive p (Holm)</th><th>MDE</th>"
                         "<th>reasons</th></tr>")
            for m in item.metrics:
                s = m.stats or {}
                parts.append(
                    f"<tr><td>{e(m.metric)}{'' if m.required else ' (adv.)'}</td>{_cell(m.outcome)}"
                    f"<td>{e(_estimate(m)) if m.compare == 'flag' else _fmt(m.mean_value)}</td>"
                    f"<td>[{_fmt(m.ci_low)}, {_fmt(m.ci_high)}]</td>"
                    f"<td>{e(_limit(m))}</td>"
                    f"<td>{m.n_pairs}/{m.n_expected}</td><td>{e(s.get('signs', {}).get('describe', ''))}</td>"
                    f"<td>{_fmt(s.get('wilcoxon', {}).get('pvalue'), 3)}</td>"
                    f"<td>{_fmt(m.p_holm if m.p_holm is not None else m.p_value, 3)}</td>"
                    f"<td>{_fmt(s.get('mde'), 3)}</td><td>{e('; '.join(m.reasons + m.warnings))}</td></tr>"
                )
            parts.append("</table>")
    return parts


def render_html(verdict: Verdict, run_dir: str | Path) -> str:
    run_dir = Path(run_dir)
    e = html.escape
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>h3eval signoff {e(verdict.outcome)}: {e(verdict.policy_name)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>h3eval signoff: <span class='{e(verdict.outcome)}'>{e(verdict.outcome)}</span></h1>",
        *[f"<p class='warn'><strong>{e(notice)}</strong></p>" for notice in verdict.notices],
        f"<p>policy <code>{e(verdict.policy_name)}</code> &middot; "
        f"baseline <code>{e(verdict.baseline)}</code> &middot; "
        f"run <code>{e(verdict.run_dir)}</code> &middot; {int(verdict.settings.confidence * 100)}% paired BCa CIs, "
        f"Holm {'on' if verdict.settings.holm else 'off'} &middot; exit code {verdict.exit_code}</p>",
    ]
    gates = list(dict.fromkeys(g.gate for c in verdict.candidates for g in c.gates))
    parts.append("<h2>Signoff</h2><table><tr><th>candidate</th><th>overall</th>"
                 + "".join(f"<th>{e(g)}</th>" for g in gates) + "<th>speed</th></tr>")
    for c in verdict.candidates:
        by_gate = {g.gate: g for g in c.gates}
        row = f"<tr><td>{e(c.candidate)}</td>{_cell(c.outcome)}"
        for gate in gates:
            g = by_gate.get(gate)
            row += "<td></td>" if g is None else _cell(g.outcome, g.outcome + ("" if g.required else " (adv.)")
                                                       + (" *waived" if g.waiver else ""))
        sp = c.speed
        row += "<td></td>" if sp is None else _cell(sp.outcome, speed_cell(sp, run_dir))
        parts.append(row + "</tr>")
    parts.append("</table>")
    for w in verdict.warnings:
        parts.append(f"<p class='warn'>warning: {e(w)}</p>")

    charts = [("Speed versus quality", speed_quality_chart(verdict)),
              ("Stage anatomy", stage_anatomy_chart(verdict, run_dir))]
    for title, data in charts:
        parts.append(f"<h2>{e(title)}</h2>")
        if data:
            parts.append(f"<img alt='{e(title)}' src='data:image/png;base64,{data}'>")
        else:
            parts.append("<p class='warn'>not available (matplotlib missing, or no data for it in this run)</p>")

    parts.append("<h2>Worst pairs</h2>")
    worst = _worst_pairs(verdict)
    if not worst:
        parts.append("<p>no per-pair metric values in this verdict</p>")
    for c, m, p in worst:
        caption = (f"{c.candidate} &middot; {e(m.gate)}.{e(m.metric)} {e(m.outcome)} &middot; "
                   f"{e(p.prompt_id)}-s{p.seed}: value {_fmt(p.value)}, delta {_fmt(p.delta)} &middot; "
                   f"<a href='{e(p.file)}'>{e(p.file)}</a>")
        images = []
        for art in p.artifacts:
            art_path = run_dir / art
            if art_path.suffix.lower() == ".png" and art_path.is_file():
                images.append(base64.b64encode(art_path.read_bytes()).decode("ascii"))
        if not images:
            strip = decoded_strip(run_dir, verdict.baseline, c.candidate, p.prompt_id, p.seed)
            if strip:
                images.append(strip)
                caption += " &middot; rows: baseline, candidate, |difference| x" + f"{DIFF_GAIN:g}"
        parts.append(f"<p>{caption}</p>")
        parts += [f"<img alt='strip' src='data:image/png;base64,{img}'>" for img in images]
        if not images:
            parts.append("<p class='warn'>no strip: neither artifacts nor decodable clips for this pair</p>")

    for c in verdict.candidates:
        parts += _html_candidate(c)
    parts.append("<h2>Inputs</h2><ul>")
    parts.append(f"<li>run.json sha256 <code>{e(verdict.inputs.run_manifest.sha256)}</code></li>")
    parts.append(f"<li>policy {e(verdict.inputs.policy.path)} "
                 f"sha256 <code>{e(verdict.inputs.policy.sha256)}</code></li>")
    parts.append(f"<li>{len(verdict.inputs.clips)} clip records, {len(verdict.inputs.gate_results)} gate results: "
                 "hashes in <a href='verdict.json'>verdict.json</a></li>")
    parts += [f"<li>{e(line.replace('`', ''))}</li>" for line in conditioning_summary(run_dir)]
    parts.append("</ul>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


# -- all of them ---------------------------------------------------------------------------------------------------
def write_reports(verdict: Verdict, run_dir: str | Path) -> dict[str, Path]:
    """Write verdict.json, report.md, report.html and junit.xml into ``run_dir`` (each atomically), holding the run's
    lock."""
    run_dir = Path(run_dir)
    store = RunStore(run_dir)
    texts = (("markdown", render_markdown(verdict, run_dir)), ("html", render_html(verdict, run_dir)),
             ("junit", render_junit(verdict)))
    with store.lock("h3eval report"):  # one process writes into a run at a time
        paths = {"verdict": write_verdict(verdict, run_dir)}
        for key, text in texts:
            atomic_write_text(store.report_path(key), text)
            paths[key] = store.report_path(key)
    return paths


def run_report(
    run_dir: str | Path,
    policy: str | Path | None = None,
    *,
    floor: str | Path | None = None,
    today: dt.date | None = None,
) -> tuple[Verdict, dict[str, Path]]:
    """Compute (or read) the verdict of ``run_dir`` and write every report file; returns both."""
    run_dir = Path(run_dir)
    if policy is not None:
        verdict = run_verdict(run_dir, policy, floor=floor, today=today)
    else:
        path = RunStore(run_dir).verdict_path
        if not path.exists():
            raise VerdictInputError(f"{path} does not exist: pass --policy to compute the verdict")
        verdict = read_verdict(path)
    return verdict, write_reports(verdict, run_dir)
