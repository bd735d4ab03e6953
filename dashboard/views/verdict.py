"""Verdict: the policy's result for the run, with its reasons (read from verdict.json)."""

from __future__ import annotations

import streamlit as st

from dashboard import state, verdicts


def render(ctx: state.Context) -> None:
    run = ctx.run
    if run.verdict is None:
        st.info(f"No verdict yet for {run.label} (no verdict.json; run `h3eval gate`).")
        return
    overall = verdicts.overall_verdict(run.verdict)
    policy = run.verdict.get("policy_name") or run.verdict.get("policy")
    st.metric("Overall", overall or "not stated", help=f"policy: {policy}" if policy else None)
    rows = verdicts.verdict_rows(run.verdict)
    top = rows[rows["scope"] == "overall"]
    if len(top) and top.iloc[0]["reasons"]:
        st.markdown("**Reasons**\n\n" + "\n".join(f"- {r}" for r in top.iloc[0]["reasons"].split("\n")))
    if len(top) and top.iloc[0]["warnings"]:
        st.warning("\n".join(f"- {w}" for w in top.iloc[0]["warnings"].split("\n")))
    rows = rows[rows["scope"] != "overall"]
    if len(rows):
        st.dataframe(rows[["scope", "status", "reasons", "warnings"]], hide_index=True, key="verdict_table")
    else:
        st.caption("verdict.json has no per-candidate or per-gate statuses.")
    with st.expander("verdict.json"):
        st.json(run.verdict)
