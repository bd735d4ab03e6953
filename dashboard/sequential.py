"""The Sequential page's data (issue 53): a run's ``sequential.json`` read, checked and laid out, with no Streamlit.

``h3eval ab --sequential`` (:mod:`h3eval.sequential`) rewrites the record after every look. The page shows, per
candidate and metric, the z statistic of each look beside the design's boundary (the non-inferiority test's, and the
regression test's where the policy has one), where the candidate stopped and with which outcome, and the requests
the run saved against the fixed design.

The record is read, never trusted. A missing file, one that is not a sequential record, and one that is still being
written (``status = "running"``) each come back as a message for the page. Every number is checked before it is
shown: finite (a z of -inf only where its p is 1, as :func:`h3eval.sequential.z_of` defines it), in range (a p in
[0, 1], a look the design has, a boundary the design computed for that look) and consistent (a z is the one its p
gives; the requests saved add up). A value that fails marks its row damaged: the row shows no number and no outcome,
so a NaN is never shown as a PASS.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from h3eval.sequential import DESIGNS, STATE_NAME, STATE_SCHEMA, z_of

OUTCOMES = ("PASS", "FAIL", "INCONCLUSIVE")
DAMAGED = "damaged record"
"""What the outcome columns show for a row whose values failed a check."""
STILL_RUNNING = "running"
"""The outcome column of a candidate that has not stopped in a record still being written."""

LOOK_COLUMNS = ["candidate", "metric", "look", "n_pairs", "z", "bound", "crosses", "z_worse", "bound_worse",
                "crosses_worse", "p", "p_worse", "mean", "ci_low", "ci_high", "metric_outcome", "outcome", "decision",
                "problem"]
"""One row per (candidate, metric, look the candidate was judged at).

- ``z``, ``bound``: the non-inferiority test's (Holm-adjusted) one-sided p as a z, and the design's boundary at this
  look; ``crosses``: ``z >= bound`` (the test rejects "worse than the margin" at the look's nominal level).
- ``z_worse``, ``bound_worse``: the same for the regression test ("consistently worse"), where the policy has one;
  ``crosses_worse``: ``z_worse >= bound_worse``.
- ``mean``, ``ci_low``, ``ci_high``: the metric's effect and its CI at the look's level (repeated confidence
  intervals); ``metric_outcome``: the metric's outcome, ``outcome``: the candidate's, ``decision``: why it stopped
  or went on.
- ``problem``: why the row is damaged (its numbers and outcomes are then empty), else None."""

CANDIDATE_COLUMNS = ["candidate", "outcome", "stopped_at_look", "n_looks", "pairs_used", "requests_saved", "why",
                     "problem"]
"""One row per candidate: its outcome at the look it stopped (``STILL_RUNNING`` while it has not), that look (1-based)
and the pairs it had, the requests of it that the run saved against the fixed design (from the record's savings;
None until the run completes) and why it stopped."""

SAVINGS_COLUMNS = ["recipe", "role", "pairs_used", "requests_saved", "mean_latency_s", "seconds_saved"]


class _Damaged(ValueError):
    """A value of the record that fails its check; the message says which and why."""


@dataclass
class SequentialRecord:
    """What the Sequential page shows about one run folder."""

    path: str
    status: str
    """``absent``, ``unreadable`` (nothing of it is shown), ``running`` or ``complete``."""
    message: str | None = None
    """What the page says on top: why there is nothing to show, or that the run is still going."""
    design: str | None = None
    spending: str | None = None
    looks: list[int] = field(default_factory=list)
    """The design's looks, in pairs."""
    baseline: str | None = None
    candidates: list[str] = field(default_factory=list)
    looks_table: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=LOOK_COLUMNS))
    candidate_table: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=CANDIDATE_COLUMNS))
    savings: dict[str, Any] | None = None
    """fixed_requests, requests, requests_saved, share_of_fixed, device_seconds_saved: checked, or None (running,
    or damaged: see ``problems``)."""
    savings_table: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=SAVINGS_COLUMNS))
    problems: list[str] = field(default_factory=list)
    """Every value that failed its check, with where it is in the file."""


def sequential_path(root: str | Path) -> Path:
    return Path(root) / STATE_NAME


# -- checks --------------------------------------------------------------------------------------------------------
def _int(value: Any, what: str, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Damaged(f"{what} is {value!r}, not an integer")
    if value < lo or (hi is not None and value > hi):
        raise _Damaged(f"{what} is {value}, outside [{lo}, {hi if hi is not None else 'inf'}]")
    return value


def _num(value: Any, what: str, lo: float = -math.inf, hi: float = math.inf, *, infinite: tuple[float, ...] = ()
         ) -> float:
    """A finite number in [lo, hi]; an infinity only when listed in ``infinite``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Damaged(f"{what} is {value!r}, not a number")
    x = float(value)
    if math.isnan(x):
        raise _Damaged(f"{what} is NaN")
    if math.isinf(x):
        if x in infinite:
            return x
        raise _Damaged(f"{what} is {x}, not finite")
    if not lo <= x <= hi:
        raise _Damaged(f"{what} is {x!r}, outside [{lo}, {hi}]")
    return x


def _opt_num(value: Any, what: str) -> float | None:
    return None if value is None else _num(value, what)


def _text(value: Any, what: str, choices: tuple[str, ...] | None = None) -> str:
    if not isinstance(value, str) or (choices is not None and value not in choices):
        want = f"one of {', '.join(choices)}" if choices else "a text"
        raise _Damaged(f"{what} is {value!r}, not {want}")
    return value


def _close(a: float, b: float, rel: float = 1e-9, abs_: float = 1e-9) -> bool:
    return a == b or math.isclose(a, b, rel_tol=rel, abs_tol=abs_)


def _z(p_value: Any, z_value: Any, p_where: str, z_where: str) -> tuple[float, float]:
    """A one-sided p in [0, 1] and the z the record gives for it, which must be :func:`z_of`'s (-inf where p is 1)."""
    p = _num(p_value, p_where, 0.0, 1.0)
    z = _num(z_value, z_where, infinite=(-math.inf,))
    want = z_of(p)
    if want is None or not (z == want or (math.isfinite(z) and math.isfinite(want) and _close(z, want, 1e-6, 1e-6))):
        raise _Damaged(f"{z_where} is {z!r}, but its p {p!r} gives z = {want!r}")
    return p, z


def _bound(value: Any, where: str, allowed: list[float]) -> float:
    """A boundary of this look: one the design computed for it (+inf where the design spends nothing there)."""
    b = _num(value, where, infinite=(math.inf,))
    if allowed and not any(_close(b, a) for a in allowed):
        raise _Damaged(f"{where} is {b!r}, not one of the design's boundaries at this look "
                       f"({', '.join(f'{a:.6g}' for a in allowed)})")
    return b


# -- reading -------------------------------------------------------------------------------------------------------
def load_sequential(root: str | Path, label: str | None = None) -> SequentialRecord:
    """Read and check ``root``'s sequential.json. Never raises: a problem comes back as ``status`` and ``message``
    (the whole file) or in ``problems`` with the row marked damaged (one value)."""
    path = sequential_path(root)
    name = label or Path(root).name
    rec = SequentialRecord(path=str(path), status="absent")
    if not path.is_file():
        rec.message = (f"{name} is not a sequential run: it has no {STATE_NAME} (`h3eval ab --sequential` writes one "
                       "after every look).")
        return rec
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        _read(raw, rec)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        _unreadable(rec, f"not readable JSON ({exc})")
    except _Damaged as exc:
        _unreadable(rec, str(exc))
    except RecursionError:
        _unreadable(rec, "nested too deeply")
    return rec


def _unreadable(rec: SequentialRecord, why: str) -> None:
    fresh = SequentialRecord(path=rec.path, status="unreadable")
    rec.__dict__.update(fresh.__dict__)
    rec.message = f"{rec.path} cannot be shown: {why}. Nothing from it is on this page."


def _read(raw: Any, rec: SequentialRecord) -> None:
    if not isinstance(raw, dict):
        raise _Damaged(f"the file holds a JSON {type(raw).__name__}, not a sequential record")
    if raw.get("schema") != STATE_SCHEMA:
        raise _Damaged(f"its schema is {raw.get('schema')!r}, not {STATE_SCHEMA!r}")
    status = _text(raw.get("status"), "status", ("running", "complete"))
    design = raw.get("design")
    if not isinstance(design, dict):
        raise _Damaged("it has no design")
    rec.design = _text(design.get("design"), "design.design", DESIGNS)
    rec.spending = design.get("spending") if isinstance(design.get("spending"), str) else None
    looks = design.get("looks")
    if not isinstance(looks, list) or not looks:
        raise _Damaged("design.looks is not a list of pair counts")
    looks = [_int(n, f"design.looks[{i}]", 2) for i, n in enumerate(looks)]
    if any(b <= a for a, b in zip(looks, looks[1:])):
        raise _Damaged(f"design.looks {looks} do not increase")
    if raw.get("looks") != looks:
        raise _Damaged(f"looks {raw.get('looks')!r} differ from the design's {looks}")
    max_pairs = _int(raw.get("max_pairs"), "max_pairs", looks[-1], looks[-1])
    bounds = design.get("bounds")
    if not isinstance(bounds, dict) or not bounds:
        raise _Damaged("design.bounds is missing")
    per_look: list[list[float]] = [[] for _ in looks]
    for alpha, values in bounds.items():
        if not isinstance(values, list) or len(values) != len(looks):
            raise _Damaged(f"design.bounds[{alpha}] does not hold one boundary per look")
        for k, v in enumerate(values):
            per_look[k].append(_num(v, f"design.bounds[{alpha}][{k}]", infinite=(math.inf,)))
    rec.looks = looks
    rec.baseline = _text(raw.get("baseline"), "baseline")
    candidates = raw.get("candidates")
    if not isinstance(candidates, list) or not candidates:
        raise _Damaged("candidates is not a list of recipe names")
    rec.candidates = [_text(c, f"candidates[{i}]") for i, c in enumerate(candidates)]
    rounds = raw.get("rounds")
    if not isinstance(rounds, list) or len(rounds) > len(looks):
        raise _Damaged(f"rounds is not a list of at most {len(looks)} looks")
    stopped = raw.get("stopped")
    if not isinstance(stopped, dict):
        raise _Damaged("stopped is not a table of candidates")
    rec.status = status

    rows, damaged = _look_rows(rounds, looks, per_look, rec)
    rec.looks_table = pd.DataFrame(rows, columns=LOOK_COLUMNS)
    rec.candidate_table = _with_counts(pd.DataFrame(_candidate_rows(stopped, rounds, looks, damaged, status, rec),
                                                    columns=CANDIDATE_COLUMNS))
    if status == "complete":
        _read_savings(raw.get("savings"), rec, max_pairs)
    else:
        done = len(rounds)
        going = [c for c in rec.candidates if c not in stopped]
        rec.message = (f"This sequential run is still running: {done} of {len(looks)} looks recorded"
                       + (f"; {', '.join(going)} still generating" if going else "")
                       + ". The page shows the looks so far; the requests saved are counted when the run completes.")


COUNT_COLUMNS = ("stopped_at_look", "n_looks", "pairs_used", "requests_saved")


def _with_counts(frame: pd.DataFrame) -> pd.DataFrame:
    """Counts as integers with missing values (pandas' Int64), not floats: a look is 2, not 2.0."""
    for col in COUNT_COLUMNS:
        frame[col] = frame[col].astype("Int64")
    return frame


def _look_rows(rounds: list[Any], looks: list[int], per_look: list[list[float]], rec: SequentialRecord
               ) -> tuple[list[dict[str, Any]], set[tuple[str, int]]]:
    """The look table's rows, and the (candidate, look) whose values are damaged."""
    rows: list[dict[str, Any]] = []
    damaged: set[tuple[str, int]] = set()
    for k, rnd in enumerate(rounds):
        where = f"rounds[{k}]"
        try:
            if not isinstance(rnd, dict):
                raise _Damaged(f"{where} is not a look")
            _int(rnd.get("look"), f"{where}.look", k + 1, k + 1)
            _int(rnd.get("n_pairs"), f"{where}.n_pairs", looks[k], looks[k])
            cands = rnd.get("candidates")
            if not isinstance(cands, dict):
                raise _Damaged(f"{where}.candidates is not a table of candidates")
        except _Damaged as exc:
            rec.problems.append(str(exc))
            damaged.update((c, k + 1) for c in rec.candidates)
            continue
        for cand, entry in cands.items():
            cwhere = f"{where}.candidates[{cand}]"
            base = {"candidate": cand, "look": k + 1, "n_pairs": looks[k]}
            try:
                if cand not in rec.candidates:
                    raise _Damaged(f"{cwhere} is not one of the run's candidates")
                if not isinstance(entry, dict):
                    raise _Damaged(f"{cwhere} is not a candidate's look")
                outcome = _text(entry.get("outcome"), f"{cwhere}.outcome", OUTCOMES)
                if not isinstance(entry.get("stopped"), bool):
                    raise _Damaged(f"{cwhere}.stopped is {entry.get('stopped')!r}, not true or false")
                why = _text(entry.get("why"), f"{cwhere}.why")
                metrics = entry.get("metrics")
                if not isinstance(metrics, list):
                    raise _Damaged(f"{cwhere}.metrics is not a list")
            except _Damaged as exc:
                rec.problems.append(str(exc))
                damaged.add((cand, k + 1))
                rows.append(_damaged_row(base, "(all)", str(exc)))
                continue
            mine = []
            for i, m in enumerate(metrics):
                mwhere = f"{cwhere}.metrics[{i}]"
                name = m.get("metric") if isinstance(m, dict) and isinstance(m.get("metric"), str) else f"#{i}"
                try:
                    mine.append({**base, **_metric_values(m, mwhere, looks[k], per_look[k]),
                                 "outcome": outcome, "decision": why, "problem": None})
                except _Damaged as exc:
                    rec.problems.append(str(exc))
                    damaged.add((cand, k + 1))
                    mine.append(_damaged_row({**base, "metric": name}, name, str(exc)))
            if (cand, k + 1) in damaged:  # one damaged statistic: the candidate's outcome at this look is not shown
                for row in mine:
                    if row["problem"] is None:
                        row.update(outcome=DAMAGED, problem="another statistic of this look is damaged")
            rows.extend(mine)
    return rows, damaged


def _damaged_row(base: dict[str, Any], metric: str, why: str) -> dict[str, Any]:
    return {**{c: None for c in LOOK_COLUMNS}, **base, "metric": metric, "metric_outcome": DAMAGED,
            "outcome": DAMAGED, "problem": why}


def _metric_values(m: Any, where: str, n_pairs: int, bounds: list[float]) -> dict[str, Any]:
    if not isinstance(m, dict):
        raise _Damaged(f"{where} is not a metric's row")
    out: dict[str, Any] = {"metric": _text(m.get("metric"), f"{where}.metric"),
                           "metric_outcome": _text(m.get("outcome"), f"{where}.outcome", OUTCOMES)}
    _int(m.get("n_pairs"), f"{where}.n_pairs", 0, n_pairs)
    out["mean"] = _opt_num(m.get("mean"), f"{where}.mean")
    ci = m.get("ci")
    if ci is None:
        ci = [None, None]
    if not isinstance(ci, list) or len(ci) != 2:
        raise _Damaged(f"{where}.ci is {ci!r}, not [low, high]")
    lo, hi = _opt_num(ci[0], f"{where}.ci low"), _opt_num(ci[1], f"{where}.ci high")
    if lo is not None and hi is not None and lo > hi:
        raise _Damaged(f"{where}.ci [{lo}, {hi}] has its low end above its high end")
    out.update(ci_low=lo, ci_high=hi)
    for side, p_key, z_key, b_key in (("", "p", "z", "bound"), ("_worse", "p_worse", "z_worse", "bound_worse")):
        if m.get(p_key) is None and m.get(z_key) is None:
            out.update({f"p{side}": None, f"z{side}": None, f"bound{side}": None, f"crosses{side}": None})
            continue
        p, z = _z(m.get(p_key), m.get(z_key), f"{where}.{p_key}", f"{where}.{z_key}")
        b = None if m.get(b_key) is None else _bound(m.get(b_key), f"{where}.{b_key}", bounds)
        if side:
            if m.get("alpha_worse") is not None:
                _num(m.get("alpha_worse"), f"{where}.alpha_worse", 0.0, 0.5)
        out.update({f"p{side}": p, f"z{side}": z, f"bound{side}": b,
                    f"crosses{side}": None if b is None else bool(z >= b)})
    return out


def _candidate_rows(stopped: dict[str, Any], rounds: list[Any], looks: list[int], damaged: set[tuple[str, int]],
                    status: str, rec: SequentialRecord) -> list[dict[str, Any]]:
    rows = []
    for cand in rec.candidates:
        row: dict[str, Any] = {c: None for c in CANDIDATE_COLUMNS} | {"candidate": cand, "n_looks": len(looks)}
        s = stopped.get(cand)
        try:
            if s is None:
                if status == "complete":
                    raise _Damaged(f"stopped[{cand}] is missing in a complete run")
                judged = [k + 1 for k, r in enumerate(rounds)
                          if isinstance(r, dict) and isinstance(r.get("candidates"), dict) and cand in r["candidates"]]
                row.update(outcome=STILL_RUNNING, pairs_used=looks[judged[-1] - 1] if judged else 0,
                           why="not stopped yet")
                rows.append(row)
                continue
            if not isinstance(s, dict):
                raise _Damaged(f"stopped[{cand}] is not a stop")
            look = _int(s.get("look"), f"stopped[{cand}].look", 1, len(rounds))
            _int(s.get("n_pairs"), f"stopped[{cand}].n_pairs", looks[look - 1], looks[look - 1])
            outcome = _text(s.get("outcome"), f"stopped[{cand}].outcome", OUTCOMES)
            why = _text(s.get("why"), f"stopped[{cand}].why")
            judged = rounds[look - 1].get("candidates") if isinstance(rounds[look - 1], dict) else None
            at = judged.get(cand) if isinstance(judged, dict) else None
            if not isinstance(at, dict) or at.get("stopped") is not True or at.get("outcome") != outcome:
                raise _Damaged(f"stopped[{cand}] ({outcome} at look {look}) is not what look {look} recorded")
            if (cand, look) in damaged:
                raise _Damaged(f"stopped[{cand}]: the record says {outcome} at look {look}, but a statistic of that "
                               "look is damaged")
            row.update(outcome=outcome, stopped_at_look=look, pairs_used=looks[look - 1], why=why)
        except _Damaged as exc:
            rec.problems.append(str(exc))
            row.update(outcome=DAMAGED, problem=str(exc))
        rows.append(row)
    return rows


def _read_savings(raw: Any, rec: SequentialRecord, max_pairs: int) -> None:
    """The record's savings, checked against its own stops: the fixed design is every recipe (baseline and
    candidates) at ``max_pairs``; a recipe saves ``max_pairs`` minus the pairs it used."""
    try:
        if not isinstance(raw, dict):
            raise _Damaged("savings is missing in a complete run")
        n_recipes = 1 + len(rec.candidates)
        fixed = _int(raw.get("fixed_requests"), "savings.fixed_requests", max_pairs * n_recipes,
                     max_pairs * n_recipes)
        requests = _int(raw.get("requests"), "savings.requests", 0, fixed)
        saved = _int(raw.get("requests_saved"), "savings.requests_saved", fixed - requests, fixed - requests)
        share = _num(raw.get("share_of_fixed"), "savings.share_of_fixed", 0.0, 1.0)
        if not _close(share, requests / fixed):
            raise _Damaged(f"savings.share_of_fixed {share!r} is not requests / fixed_requests = {requests / fixed!r}")
        seconds = _num(raw.get("device_seconds_saved"), "savings.device_seconds_saved", 0.0)
        recipes = raw.get("recipes")
        if not isinstance(recipes, dict):
            raise _Damaged("savings.recipes is missing")
        stops = {r.candidate: r for r in rec.candidate_table.itertuples()}
        rows = []
        for name in [rec.baseline, *rec.candidates]:
            r = recipes.get(name)
            where = f"savings.recipes[{name}]"
            if not isinstance(r, dict):
                raise _Damaged(f"{where} is missing")
            used = _int(r.get("pairs_used"), f"{where}.pairs_used", 0, max_pairs)
            _int(r.get("requests_saved"), f"{where}.requests_saved", max_pairs - used, max_pairs - used)
            stop_pairs = stops[name].pairs_used if name in stops else None
            if stop_pairs is not None and not pd.isna(stop_pairs) and int(stop_pairs) != used:
                raise _Damaged(f"{where}.pairs_used {used} differs from its stop's {stops[name].pairs_used} pairs")
            lat = _opt_num(r.get("mean_latency_s"), f"{where}.mean_latency_s")
            sec = _opt_num(r.get("seconds_saved"), f"{where}.seconds_saved")
            if lat is not None and lat < 0 or sec is not None and sec < 0:
                raise _Damaged(f"{where}: a negative latency or saving")
            if sec is not None and lat is not None and not _close(sec, (max_pairs - used) * lat, 1e-6):
                raise _Damaged(f"{where}.seconds_saved {sec!r} is not requests saved x mean latency")
            rows.append({"recipe": name, "role": "baseline" if name == rec.baseline else "candidate",
                         "pairs_used": used, "requests_saved": max_pairs - used, "mean_latency_s": lat,
                         "seconds_saved": sec})
        if sum(r["pairs_used"] for r in rows) != requests:
            raise _Damaged(f"savings.requests {requests} is not the recipes' pairs used "
                           f"({sum(r['pairs_used'] for r in rows)})")
        if not _close(seconds, sum(r["seconds_saved"] or 0.0 for r in rows), 1e-6):
            raise _Damaged(f"savings.device_seconds_saved {seconds!r} is not the recipes' sum")
    except _Damaged as exc:
        rec.problems.append(str(exc))
        return
    rec.savings = {"fixed_requests": fixed, "requests": requests, "requests_saved": saved, "share_of_fixed": share,
                   "device_seconds_saved": seconds}
    rec.savings_table = pd.DataFrame(rows, columns=SAVINGS_COLUMNS)
    by_recipe = {r["recipe"]: r["requests_saved"] for r in rows}
    rec.candidate_table["requests_saved"] = pd.array(
        [by_recipe.get(c) if o != DAMAGED else None
         for c, o in zip(rec.candidate_table["candidate"], rec.candidate_table["outcome"])], dtype="Int64")


# -- the chart -----------------------------------------------------------------------------------------------------
Z_SCALE_MIN = 5.0
"""The chart's z axis reaches at least this far either side of 0 (and 1.5 boundaries): a z beyond it (an identical
candidate's 37, a p of 1's -inf) is drawn at the edge, marked off scale, with its value in the tooltip."""

SERIES = {
    "z": "non-inferiority z",
    "bound": "non-inferiority boundary (at or above: within the margin)",
    "z_worse": "regression z, negated",
    "bound_worse": "regression boundary, negated (at or below: consistently worse)",
}


def boundary_chart(looks_table: pd.DataFrame, candidate: str, metric: str) -> tuple[pd.DataFrame, float]:
    """Long table of the chart of one candidate's metric across looks: ``n_pairs``, ``series`` (a label of
    :data:`SERIES`), ``value`` as recorded, ``drawn`` (the value on the chart: the regression series negated, so its
    boundary is the lower one, and clipped to the scale) and ``off_scale``; and the scale. Damaged rows are left out."""
    rows = looks_table[(looks_table["candidate"] == candidate) & (looks_table["metric"] == metric)
                       & looks_table["problem"].isna()]
    finite = [abs(float(v)) * (1.5 if col.startswith("bound") else 1.0)
              for col in SERIES for v in rows[col] if v is not None and not pd.isna(v) and math.isfinite(v)]
    scale = max([Z_SCALE_MIN, *[min(v, 12.0) for v in finite]])
    out = []
    for r in rows.itertuples():
        for col, label in SERIES.items():
            v = getattr(r, col)
            if v is None or pd.isna(v):
                continue
            v = float(v)
            sign = -1.0 if col.endswith("_worse") else 1.0
            drawn = min(max(sign * v, -scale), scale)
            out.append({"look": r.look, "n_pairs": r.n_pairs, "series": label, "value": v, "drawn": drawn,
                        "off_scale": drawn != sign * v})
    return pd.DataFrame(out, columns=["look", "n_pairs", "series", "value", "drawn", "off_scale"]), scale
