"""Trajectory: divergence of the candidate's latent trajectory from the baseline's, step by step."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import data, state


def render(ctx: state.Context) -> None:
    run = ctx.run
    table = data.trajectory_table(run)
    if not len(table):
        st.info(f"No trajectory in this run ({run.label} has no `{data.TRAJECTORY_GATE}` gate results).")
        return
    series = sorted(table["series"].unique())
    name = st.selectbox("Series", series, key="trajectory_series")
    mine = table[table["series"] == name].dropna(subset=["value"])
    st.caption("One line per pair (thin), median over pairs per candidate (thick).")
    pairs = alt.Chart(mine).mark_line(opacity=0.3, strokeWidth=1).encode(
        x=alt.X("step:Q", title="denoising step"), y=alt.Y("value:Q", title=name), color="candidate:N",
        detail="pair:N")
    median = alt.Chart(mine).mark_line(strokeWidth=3).encode(
        x="step:Q", y="median(value):Q", color="candidate:N")
    st.altair_chart(pairs + median, width="stretch")
    summary = mine.groupby(["candidate", "step"])["value"].median().reset_index()
    last = summary.sort_values("step").groupby("candidate").tail(1).rename(
        columns={"value": f"median {name} at last step", "step": "last step"})
    st.dataframe(last, hide_index=True, key="trajectory_table")

    st.subheader("Per pair")
    rows = []
    for (gate, cand, pid, seed), result in sorted(run.gate_results.items()):
        if gate != data.TRAJECTORY_GATE:
            continue
        values = (result.get("series") or {}).get(name) or []
        info = result.get("info") or {}
        rows.append({
            "candidate": cand, "prompt_id": pid, "seed": seed, "status": result.get("status"),
            "flagged": result.get("flagged"), f"{name} at last step": values[-1] if values else None,
            "first divergent step": info.get("video_first_divergent_step"),
            "flags": "; ".join(result.get("flags") or []), "error": result.get("error"),
            "view": data.viewer_link(ctx.run_index, cand, pid, seed),
        })
    st.dataframe(pd.DataFrame(rows), hide_index=True, key="trajectory_pairs",
                 column_config={"view": st.column_config.LinkColumn("viewer", display_text="open")})
