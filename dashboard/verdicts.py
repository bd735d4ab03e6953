"""The verdict as the review dashboard shows it: the run's and each candidate's outcome read from verdict.json, and
which judge (exact, near, resample) the signoff policy applies to each candidate. Pure functions, no Streamlit
(tests/test_dashboard_data.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd
from pydantic import ValidationError

from h3eval.store import RunManifest

if TYPE_CHECKING:
    from dashboard.data import RunData


_STATUS_KEYS = ("status", "outcome")
# Parts of verdict.json that hold evidence, not statuses: not walked (they can be long: one entry per pair).
_VERDICT_SKIP = {"pairs", "worst", "inputs", "settings", "stats", "evidence", "versions", "waiver"}


def overall_verdict(verdict: dict[str, Any] | None) -> str | None:
    """The run's overall result: ``outcome`` (h3eval.verdict's field), or ``overall`` / ``status``."""
    if not verdict:
        return None
    for key in ("outcome", "overall", "status"):
        if isinstance(verdict.get(key), str):
            return verdict[key]
    return None


def verdict_rows(verdict: dict[str, Any] | None) -> pd.DataFrame:
    """Every node of verdict.json that carries a status, as (scope, depth, status, reasons, warnings) rows.

    The verdict file is written by h3eval.verdict (``outcome`` per run, candidate, gate, metric and speed check);
    the dashboard reads it defensively: any object with ``outcome`` or ``status`` is a row, its ``reasons`` and
    ``warnings`` lists are joined, its path in the file is the scope ("candidate-a / lpips / lpips_mean"). Objects in
    lists are named by their ``metric``, ``gate``, ``candidate`` or ``name`` field, in that order.
    """
    rows: list[dict[str, Any]] = []

    def joined(node: dict[str, Any], key: str) -> str:
        value = node.get(key)
        if isinstance(value, list):
            return "\n".join(str(r) for r in value)
        return "" if value is None else str(value)

    def walk(node: Any, scope: list[str]) -> None:
        if isinstance(node, dict):
            status = next((node[k] for k in _STATUS_KEYS if isinstance(node.get(k), str)), None)
            if not scope:
                status = overall_verdict(node)
            if isinstance(status, str):
                rows.append({"scope": " / ".join(scope) or "overall", "depth": len(scope), "status": status,
                             "reasons": joined(node, "reasons"), "warnings": joined(node, "warnings")})
            for key, value in node.items():
                if key in ("reasons", "warnings") or key in _VERDICT_SKIP:
                    continue
                if isinstance(value, (dict, list)):
                    walk(value, scope + [str(key)])
        elif isinstance(node, list):
            for i, item in enumerate(node):
                if isinstance(item, dict):
                    name = next((item[k] for k in ("metric", "gate", "candidate", "name")
                                 if isinstance(item.get(k), str)), None)
                    walk(item, scope + [name if name else str(i)])

    if verdict:
        walk(verdict, [])
    frame = pd.DataFrame(rows, columns=["scope", "depth", "status", "reasons", "warnings"])
    # "candidates / cand-a / gates / lpips" reads better as "cand-a / lpips": drop keys that only group children.
    frame["scope"] = frame["scope"].str.replace(r"^(candidates|gates|results)\s/\s", "", regex=True)
    frame["scope"] = frame["scope"].str.replace(r"\s/\s(gates|results|metrics)\s/\s", " / ", regex=True)
    return frame


def candidate_verdict(verdict: dict[str, Any] | None, candidate: str) -> str | None:
    """The candidate's own status in verdict.json (the least nested row naming it), or None when absent."""
    if not verdict:
        return None
    rows = verdict_rows(verdict)
    rows = rows[rows["scope"].str.split(" / ").str[0] == candidate]
    if not len(rows):
        return None
    return str(rows.sort_values("depth").iloc[0]["status"])


DEFAULT_POLICY = "release"
"""The policy whose judges the Gates page reads when a run has no verdict.json yet (``h3eval gate``'s default)."""


@dataclass
class JudgeUse:
    """Which gates decide a candidate's verdict: its judge's and the policy's shared gates."""

    kind: str | None
    """The judge (signoff kind: exact, near, resample), None when the candidate has none."""
    gates: dict[str, bool] | None
    """Gate -> required (False: advisory) of every gate the verdict uses; None when not known."""
    source: str
    """Where this was read: verdict.json, or the policy (no verdict yet)."""
    problem: str | None = None
    """Why the candidate has no judge, or why its gates could not be read."""

    def describe(self, gate: str) -> str:
        """One cell: whether ``gate`` counts in this candidate's verdict, and if not, why."""
        if self.gates is None:
            return f"unknown ({self.problem})" if self.problem else "unknown"
        if gate in self.gates:
            return ("used by the judge" if self.kind else "used") + ("" if self.gates[gate] else " (advisory)")
        if self.kind:
            return f"not used by this candidate's judge ({self.kind})"
        return "not used" + (f": no judge ({self.problem})" if self.problem else "")


def judge_use(run: RunData, policy: str = DEFAULT_POLICY) -> dict[str, JudgeUse]:
    """Per candidate, the gates its verdict uses: from verdict.json when the run has one (its judge and its gate
    list), else from ``policy`` (a shipped name or a path) through h3eval's own judge choice."""
    if run.verdict is not None:
        name = run.verdict.get("policy_name") or "?"
        out = {}
        for entry in run.verdict.get("candidates") or []:
            if not isinstance(entry, dict) or not isinstance(entry.get("candidate"), str):
                continue
            gates = {g["gate"]: bool(g.get("required", True)) for g in entry.get("gates") or []
                     if isinstance(g, dict) and isinstance(g.get("gate"), str)}
            kind = entry.get("judge") if isinstance(entry.get("judge"), str) else None
            why = None if kind else next((r for r in entry.get("reasons") or []
                                          if isinstance(r, str) and "[signoff] kind" in r), None)
            out[entry["candidate"]] = JudgeUse(kind, gates, f"verdict.json (policy {name})", why)
        for cand in run.candidates:
            out.setdefault(cand, JudgeUse(None, None, f"verdict.json (policy {name})",
                                          "verdict.json does not judge this candidate"))
        return out
    from h3eval.demo import policy_path
    from h3eval.policy import PolicyError, load_policy
    from h3eval.verdict import choose_judge

    source = f"policy {policy} (no verdict.json yet)"
    try:
        loaded = load_policy(policy_path(policy))
        manifest = RunManifest.model_validate(run.manifest or {})
    except (PolicyError, ValidationError, OSError) as exc:
        return {c: JudgeUse(None, None, source, f"cannot read: {exc}".splitlines()[0]) for c in run.candidates}
    out = {}
    for cand in run.candidates:
        kind, _why, problems = choose_judge(loaded.policy, manifest, cand)
        gates = {g: gp.required for g, gp in loaded.policy.gates_for(kind).items()}
        out[cand] = JudgeUse(kind, gates, source, "; ".join(problems) or None)
    return out
