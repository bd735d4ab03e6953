"""Gates: per-pair results of each gate, worst pairs first, with their distribution and links into the viewer; for
each candidate, whether the gate counts in its verdict (its judge's gates, from verdict.json or the policy)."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import data, state, verdicts


def render(ctx: state.Context) -> None:
    run = ctx.run
    if not len(run.gates):
        st.info(f"No gate results in {run.label} yet (run `h3eval gate`).")
        return
    names = sorted(run.gates["gate"].unique())
    gate = st.selectbox("Gate", names, key="gates_gate")
    frame = run.gates[run.gates["gate"] == gate].copy()

    counts = frame.groupby(["candidate", "status"]).size().unstack(fill_value=0).reset_index()
    counts["total"] = frame.groupby("candidate").size().reindex(counts["candidate"]).to_numpy()
    counts["flagged"] = frame.groupby("candidate")["flagged"].sum().reindex(counts["candidate"]).to_numpy()
    use = verdicts.judge_use(run)
    counts["in the verdict"] = [use[c].describe(gate) if c in use else "unknown (not a candidate of the run)"
                                for c in counts["candidate"]]
    st.dataframe(counts, hide_index=True, key="gates_counts")
    sources = sorted({u.source for u in use.values()})
    if sources:
        st.caption(f"In the verdict: whether {gate} counts in each candidate's verdict, from {', '.join(sources)}.")
    for row in counts.itertuples():
        u = use.get(row.candidate)
        if u is not None and u.gates is not None and gate not in u.gates and row.flagged:
            st.info(f"{row.candidate}: {gate} flagged {int(row.flagged)} of {int(row.total)} pairs, but "
                    f"{u.describe(gate)}: these flags are shown for review and do not decide its verdict.")
    bad = frame[frame["status"] != "ok"]
    if len(bad):
        st.warning(f"{len(bad)} pair(s) not scored by {gate}: " + ", ".join(
            f"{r.candidate}/{r.prompt_id}-s{r.seed} ({r.status}: {r.error or 'no reason given'})"
            for r in bad.itertuples()))

    metrics = sorted(data.quality_metrics([run]))
    metric_names = [m for g, m in metrics if g == gate]
    if not metric_names:
        st.info(f"{gate} reported no metrics.")
        shown = frame
        metric = None
    else:
        metric = st.selectbox("Sort and plot by", metric_names, key="gates_metric")
        higher = run.metric_directions[gate][metric]
        st.caption(f"{metric}: {'higher' if higher else 'lower'} is better; worst pairs first "
                   "(pairs without a value first of all).")
        shown = data.worst_first(frame, metric, higher)
    k = st.number_input("Show worst k pairs", min_value=1, max_value=max(1, len(shown)), value=min(20, len(shown)),
                        key="gates_k")
    shown = shown.head(int(k)).copy()
    shown["view"] = [data.viewer_link(ctx.run_index, r.candidate, r.prompt_id, r.seed) for r in shown.itertuples()]
    # Only this gate's metrics (the frame holds every gate's columns, empty for the others).
    metric_cols = [c for c in shown.columns if c.startswith("metric:") and c[len("metric:"):] in metric_names]
    st.dataframe(
        shown[["candidate", "prompt_id", "seed", "status", "flagged", *metric_cols, "flags", "error", "view"]],
        hide_index=True,
        column_config={"view": st.column_config.LinkColumn("viewer", display_text="open")},
        key="gates_table",
    )
    if metric is not None:
        values = frame.assign(value=pd.to_numeric(frame[f"metric:{metric}"], errors="coerce")).dropna(
            subset=["value"])
        if len(values):
            hist = alt.Chart(values).mark_bar(opacity=0.6).encode(
                x=alt.X("value:Q", bin=alt.Bin(maxbins=30), title=metric),
                y=alt.Y("count():Q", stack=None),
                color="candidate:N",
            )
            st.altair_chart(hist, width="stretch")
