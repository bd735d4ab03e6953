"""Sequential: a sequential signoff's looks (``h3eval ab --sequential``, issue 53), read from the run's
sequential.json: each candidate's statistics against the design's boundaries look by look, where it stopped and with
which outcome, and the requests saved against the fixed design. What the record lacks or holds damaged is said on
the page (:mod:`dashboard.sequential`), never raised."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import state
from dashboard.sequential import DAMAGED, SERIES, STILL_RUNNING, SequentialRecord, boundary_chart

MAX_PROBLEMS_SHOWN = 12


def _outcome_text(row) -> str:
    if row.outcome == DAMAGED:
        return f"{row.candidate}: outcome not shown (damaged record)"
    if row.outcome == STILL_RUNNING:
        return f"{row.candidate}: still running after {int(row.pairs_used)} pairs"
    return (f"{row.candidate}: {row.outcome} at look {int(row.stopped_at_look)} of {int(row.n_looks)} "
            f"({int(row.pairs_used)} pairs)")


def _chart(rec: SequentialRecord, candidate: str, metric: str, stop: pd.Series | None) -> alt.LayerChart | None:
    frame, scale = boundary_chart(rec.looks_table, candidate, metric)
    if not len(frame):
        return None
    colors = alt.Scale(domain=list(SERIES.values()), range=["#1f77b4", "#1f77b4", "#d62728", "#d62728"])
    x = alt.X("n_pairs:Q", title="pairs at the look", scale=alt.Scale(domain=[0, rec.looks[-1]]),
              axis=alt.Axis(values=rec.looks, format="d"))
    y = alt.Y("drawn:Q", title="z", scale=alt.Scale(domain=[-scale, scale]))
    legend = alt.Legend(orient="bottom", columns=2, labelLimit=420)
    tips = ["look:Q", "n_pairs:Q", "series:N", alt.Tooltip("value:Q", format=".4g"), "off_scale:N"]
    stats = frame[~frame["series"].str.contains("boundary")]
    bounds = frame[frame["series"].str.contains("boundary")]
    layers = [
        alt.Chart(bounds).mark_line(strokeDash=[6, 4], point=True).encode(
            x=x, y=y, color=alt.Color("series:N", scale=colors, title=None, legend=legend), tooltip=tips),
        alt.Chart(stats).mark_line(point=alt.OverlayMarkDef(size=70, filled=True)).encode(
            x=x, y=y, color=alt.Color("series:N", scale=colors, title=None, legend=legend), tooltip=tips),
        alt.Chart(pd.DataFrame({"y": [0.0]})).mark_rule(color="#999", strokeWidth=0.5).encode(y="y:Q"),
    ]
    off = frame[frame["off_scale"]]
    if len(off):
        layers.append(alt.Chart(off).mark_point(shape="triangle", size=140, filled=True, color="black").encode(
            x=x, y=y, tooltip=tips))
    if stop is not None and stop.get("stopped_at_look") is not None and not pd.isna(stop["stopped_at_look"]):
        mark = pd.DataFrame({"n_pairs": [stop["pairs_used"]], "label": [f"stopped: {stop['outcome']}"]})
        layers.append(alt.Chart(mark).mark_rule(color="#555", strokeWidth=2).encode(x="n_pairs:Q"))
        layers.append(alt.Chart(mark).mark_text(align="left", dx=4, dy=-8, color="#333").encode(
            x="n_pairs:Q", y=alt.value(10), text="label:N"))
    return alt.layer(*layers).properties(height=440, title=f"{candidate} · {metric}")


def render(ctx: state.Context) -> None:
    run = ctx.run
    rec = state.cached_sequential(run.root, run.label)
    if rec.status == "absent":
        st.info(rec.message)
        return
    if rec.status == "unreadable":
        st.error(rec.message)
        return
    if rec.status == "running":
        st.warning(rec.message)
    if rec.problems:
        shown = rec.problems[:MAX_PROBLEMS_SHOWN]
        more = len(rec.problems) - len(shown)
        st.error(f"{len(rec.problems)} value(s) of {rec.path} failed their check; their rows show no number and no "
                 "outcome:\n" + "\n".join(f"- {p}" for p in shown) + (f"\n- ... and {more} more" if more else ""))

    st.caption(f"Baseline **{rec.baseline}**; design **{rec.design}** ({rec.spending or 'spending not stated'}); "
               f"looks at {', '.join(str(n) for n in rec.looks)} pairs; record {rec.status}.")
    if rec.savings is not None:
        sv = rec.savings
        cols = st.columns(3)
        cols[0].metric("Requests", f"{sv['requests']} of {sv['fixed_requests']}",
                       help="quality requests generated, against the fixed design's (every recipe at the last look)")
        cols[1].metric("Requests saved", f"{sv['requests_saved']}", help=f"{1 - sv['share_of_fixed']:.0%} of the "
                       "fixed design's")
        cols[2].metric("Device-seconds saved", f"{sv['device_seconds_saved']:.1f}",
                       help="requests saved x each recipe's mean generation-side latency in this run")

    st.subheader("Candidates")
    for row in rec.candidate_table.itertuples():
        st.markdown(f"- {_outcome_text(row)}" + (f": {row.why}" if row.why and row.outcome != DAMAGED else ""))
    st.dataframe(rec.candidate_table, hide_index=True, key="sequential_candidates", column_config={
        "stopped_at_look": st.column_config.NumberColumn("stopped at look"),
        "pairs_used": st.column_config.NumberColumn("pairs used"),
        "requests_saved": st.column_config.NumberColumn("requests saved"),
    })
    if len(rec.savings_table):
        st.caption("Requests per recipe against the fixed design (each recipe at the last look's pairs).")
        st.dataframe(rec.savings_table, hide_index=True, key="sequential_savings", column_config={
            "mean_latency_s": st.column_config.NumberColumn("mean latency (s)", format="%.3f"),
            "seconds_saved": st.column_config.NumberColumn("seconds saved", format="%.1f"),
        })

    st.subheader("Statistics against the boundaries")
    table = rec.looks_table
    if not len(table):
        st.info("No look recorded yet.")
        return
    st.caption("Per look: each required metric's one-sided test as a z (z = Phi^-1(1 - p), the Holm-adjusted p), "
               "against the design's boundary at that look. Non-inferiority: at or above its boundary the candidate "
               "is within the margin. Regression (where the policy has one), negated: at or below its negated "
               "boundary the candidate is consistently worse. The outcome is the verdict's at the look's nominal "
               "levels; a FAIL can also come from the CI beyond the margin. Triangles: off the scale (value in the "
               "tooltip).")
    stops = rec.candidate_table.set_index("candidate")
    candidates = [c for c in rec.candidates if c in set(table["candidate"])]
    cand = st.selectbox("Candidate", candidates, key="sequential_candidate") if len(candidates) > 1 else (
        candidates[0] if candidates else None)
    if cand is not None:
        stop = stops.loc[cand] if cand in stops.index else None
        for metric in sorted(set(table.loc[table["candidate"] == cand, "metric"])):
            chart = _chart(rec, cand, metric, stop)
            if chart is None:
                st.caption(f"{cand} · {metric}: no statistic to draw (damaged, or the metric has no test)")
            else:
                st.altair_chart(chart, width="stretch")
    st.dataframe(table, hide_index=True, key="sequential_looks", column_config={
        "z": st.column_config.NumberColumn("z", format="%.3f"),
        "bound": st.column_config.NumberColumn("boundary", format="%.3f"),
        "z_worse": st.column_config.NumberColumn("regression z", format="%.3f"),
        "bound_worse": st.column_config.NumberColumn("regression boundary", format="%.3f"),
        "mean": st.column_config.NumberColumn("mean delta", format="%.4g"),
    })
