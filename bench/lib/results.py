"""Benchmark records: JSON + Markdown in the running study's ``results/`` folder (``bench/<study>/results/``), with
date, machine, versions and the command."""

from __future__ import annotations

import json
import re
import platform
import shlex
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[1]

RESULTS: Path | None = None
"""Where :func:`write` puts records; None: the ``results/`` folder beside the running script, which is
``bench/<study>/results/`` for ``python bench/<study>/SCRIPT.py``."""


def results_dir() -> Path:
    """The folder :func:`write` puts records in (:data:`RESULTS`, else the running study's ``results/``)."""
    if RESULTS is not None:
        return RESULTS
    script = Path(sys.argv[0]).resolve()
    if script.parent.parent != BENCH or script.parent.name == "lib":
        raise RuntimeError(f"{sys.argv[0]} is not a study script (bench/<study>/SCRIPT.py): its records have no "
                           "results/ folder to go to")
    return script.parent / "results"


def study_results(study: str, bench: Path | None = None) -> Path:
    """``bench/<study>/results`` for a study that runs another study's script and keeps its records (e.g.
    tiny_wider_dit running bench/content_check): the study must exist (its README.md); ValueError names what is
    wrong."""
    bench = bench or BENCH
    if not re.fullmatch(r"[A-Za-z0-9_]+", study or ""):
        raise ValueError(f"--study {study!r}: a study is a folder name of bench/ (letters, digits, _)")
    if not (bench / study / "README.md").is_file():
        raise ValueError(f"--study {study}: {bench / study / 'README.md'} does not exist (no such study)")
    return bench / study / "results"


def context() -> dict[str, Any]:
    from h3 import provenance

    return {
        "date": provenance.utc_now(),
        "command": " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv]),
        "machine": {"platform": platform.platform(), **provenance.hardware()},
        "versions": provenance.versions(),
        "git": provenance.git_state(Path(__file__).parent),
    }


def write(name: str, payload: dict[str, Any], table_md: str) -> tuple[Path, Path]:
    from h3.atomic import atomic_write_json, atomic_write_text

    results = results_dir()
    results.mkdir(parents=True, exist_ok=True)
    data = {**context(), **payload}
    json_path, md_path = results / f"{name}.json", results / f"{name}.md"
    atomic_write_json(json_path, data)
    numerics = data["machine"].get("numerics") or {}
    cpu = ", ".join(str(numerics[k]) for k in ("cpu_model", "aten_cpu_capability") if numerics.get(k))
    header = (f"# {name}\n\n- date: {data['date']}\n- command: `{data['command']}`\n"
              f"- machine: {data['machine']['platform']}, {data['machine']['cpu_count']} cpus"
              + (f" ({cpu})" if cpu else "") + "\n"
              f"- versions: " + ", ".join(f"{k} {v}" for k, v in data["versions"].items()) + "\n\n")
    atomic_write_text(md_path, header + table_md.rstrip() + "\n")
    return json_path, md_path


# ---- the index: bench/INDEX.md from every study's README and its current record --------------------------------------

INDEX = BENCH / "INDEX.md"
FIELDS = ("question", "answer", "record", "command")
"""A README paragraph opening with ``Question``, ``Answer`` / ``Current answer``, ``Record`` or ``Command(s)`` (bold or
not, any punctuation or note after the word) gives that field."""
RECORD_MENTION = re.compile(r"results/[A-Za-z0-9_./-]+\.(?:md|json)")


def readme_fields(readme: Path) -> dict[str, str]:
    """A study README's title, question, answer, record and command (each '' when the README lacks it)."""
    text = readme.read_text(encoding="utf-8")
    fields = {"title": "", "question": "", "answer": "", "record": "", "command": ""}
    for line in text.splitlines():
        if line.startswith("# "):
            fields["title"] = line[2:].strip()
            break
    current = None
    for line in text.splitlines():
        opening = re.match(r"\*{0,2}(question|current answer|answer|record|commands?)\b", line.strip(), re.IGNORECASE)
        if opening:
            word = opening.group(1).lower()
            field = {"current answer": "answer", "commands": "command"}.get(word, word)
            current = field if not fields[field] else None
            if current:
                fields[current] = line.strip()
        elif not line.strip() or line.startswith("#"):
            current = None
        elif current:
            fields[current] += " " + line.strip()
    if fields["record"]:  # named: it must be there (render_index says so)
        mention = RECORD_MENTION.search(fields["record"])
        fields["record"] = mention.group(0) if mention else ""
    else:  # not named: the first record the answer (else the README) cites that is in the folder
        cited = RECORD_MENTION.findall(fields["answer"]) + RECORD_MENTION.findall(text)
        fields["record"] = next((c for c in cited if (readme.parent / c).is_file()), "")
    return fields


def _first_sentence(para: str, limit: int = 240) -> str:
    """The paragraph less its bold opening, cut after its first sentence (at most ``limit`` characters)."""
    text = re.sub(r"^(\*\*[^*]*\*\*|[A-Za-z ]+(?=[.:(]))\s*(\([^)]*\))?[.:]?\s*", "", para).replace("|", "\\|").strip()
    cut = re.search(r"(?<=[A-Za-z0-9)%`])[.?!](?=\s)", text[:limit + 1])
    if cut:
        return text[:cut.end()]
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " …"


def card_of(data: dict[str, Any]) -> str:
    """The card (GPU) or CPU a record's numbers came from, as its metadata names it ('' when it does not)."""
    machine = data.get("machine") if isinstance(data.get("machine"), dict) else {}
    hardware = data.get("hardware") if isinstance(data.get("hardware"), dict) else {}
    numerics = machine.get("numerics") if isinstance(machine.get("numerics"), dict) else {}
    for value in (data.get("card"), machine.get("gpu"), hardware.get("gpu"), numerics.get("gpu")):
        if value:
            return str(value)
    device = data.get("device")
    if isinstance(device, str) and device not in ("cpu", "cuda", "auto"):
        return device
    cpu = numerics.get("cpu_model") or machine.get("cpu")
    if cpu:
        count = machine.get("cpu_count")
        return f"{cpu}" + (f", {count} cpus" if count else "")
    return ""


def record_meta(record: Path) -> dict[str, str]:
    """A record's date (YYYY-MM-DD) and card: from its JSON (the record or its .json twin), its call.json, or the
    Markdown header's ``- date:`` and ``- machine:`` lines; '' where none says."""
    meta = {"date": "", "card": ""}
    sources = []
    for candidate in (record.with_suffix(".json"), record.parent / "call.json"):
        if candidate.is_file():
            try:
                data = json.loads(candidate.read_text(encoding="utf-8"))
            except ValueError:
                continue
            if isinstance(data, dict):
                sources.append(data)
    for data in sources:
        if not meta["date"] and isinstance(data.get("date"), str):
            meta["date"] = data["date"][:10]
        if not meta["card"]:
            meta["card"] = card_of(data)
    if record.suffix == ".md" and record.is_file():
        for line in record.read_text(encoding="utf-8").splitlines()[:20]:
            if not meta["date"] and line.startswith("- date:"):
                meta["date"] = line.split(":", 1)[1].strip()[:10]
            if not meta["card"] and line.startswith("- machine:"):
                meta["card"] = line.split(":", 1)[1].strip()
    return meta


def studies(bench: Path = BENCH) -> list[Path]:
    """The study folders: every folder of ``bench`` with a README.md (bench/lib and bench/device hold none)."""
    return sorted(p for p in bench.iterdir() if p.is_dir() and (p / "README.md").is_file())


def render_index(bench: Path = BENCH) -> str:
    """bench/INDEX.md: one row per study (question, current answer, record, date, card), from the study READMEs and
    their records' metadata. A study whose README names no question or answer is a ValueError naming it."""
    lines = ["# Benchmark index", "",
             "Generated from each study's README (question, answer, record) and its record's metadata (date, card) by",
             "`python bench/lib/results.py --index`; tests/test_bench_index.py fails when it is stale. History:",
             "[HISTORY.md](HISTORY.md).", "",
             "| study | question | current answer | record | date | card |", "|---|---|---|---|---|---|"]
    for study in studies(bench):
        fields = readme_fields(study / "README.md")
        missing = [f for f in ("question", "answer") if not fields[f]]
        if missing:
            raise ValueError(f"{study / 'README.md'} has no {' or '.join(missing)} paragraph (**Question.** ..., "
                             "**Answer.** ...)")
        record = fields["record"]
        meta = record_meta(study / record) if record else {"date": "", "card": ""}
        if record and not (study / record).is_file():
            raise ValueError(f"{study / 'README.md'} names record {record}, which is not in {study}")
        link = f"[{record}]({study.name}/{record})" if record else "—"
        lines.append(f"| [{study.name}]({study.name}/README.md) | {_first_sentence(fields['question'])} | "
                     f"{_first_sentence(fields['answer'])} | {link} | {meta['date'] or '—'} | "
                     f"{(meta['card'] or '—').replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def write_index(bench: Path = BENCH) -> Path:
    from h3.atomic import atomic_write_text

    atomic_write_text(bench / "INDEX.md", render_index(bench))
    return bench / "INDEX.md"


if __name__ == "__main__":
    import argparse

    sys.path.insert(0, str(BENCH.parent))
    parser = argparse.ArgumentParser(description="bench/INDEX.md from the study READMEs and their records")
    parser.add_argument("--index", action="store_true", help="write bench/INDEX.md")
    parser.add_argument("--check", action="store_true", help="exit 1 when bench/INDEX.md is stale")
    args = parser.parse_args()
    try:
        if args.check:
            stale = not INDEX.is_file() or INDEX.read_text(encoding="utf-8") != render_index()
            print("bench/INDEX.md is stale: run python bench/lib/results.py --index" if stale else "bench/INDEX.md is current")
            sys.exit(1 if stale else 0)
        if args.index:
            print("wrote", write_index())
        else:
            parser.error("say --index or --check")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
