"""Verdict: the policy's result for the run, with its reasons (read from verdict.json)."""

from __future__ import annotations

import streamlit as st

from dashboard import data, state


def render(ctx: state.Context) -> None:
    run = ctx.run
    if run.verdict is None:
        st.info(f"No verdict yet for {run.label} (no verdict.json; run `h3eval gate`).")
        return
    overall = run.verdict.get("overall")
    st.metric("Overall", overall if isinstance(overall, str) else "not stated")
    rows = data.verdict_rows(run.verdict)
    rows = rows[rows["scope"] != "overall"]
    if len(rows):
        st.dataframe(rows[["scope", "status", "reasons"]], hide_index=True, key="verdict_table")
    else:
        st.caption("verdict.json has no per-candidate or per-gate statuses.")
    with st.expander("verdict.json"):
        st.json(run.verdict)
