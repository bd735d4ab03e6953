"""Overview: one row per recipe (speed, cost, verdict) and the speed-versus-quality chart with its Pareto front."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import data, state


def _ci_text(low, high) -> str:
    if low is None or high is None or pd.isna(low) or pd.isna(high):
        return "n/a (fewer than 2 pairs)"
    return f"[{low:.2f}, {high:.2f}]"


def render(ctx: state.Context) -> None:
    tables = [state.cached_speed_table(run, ctx.rate_for(run)) for run in ctx.runs]
    speed = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame(columns=data.SPEED_COLUMNS)
    if not len(speed):
        st.info("No recipes with finished clips in these runs yet.")
        return
    for run in ctx.runs:
        if not data.has_timing(run):
            st.info(f"{run.label}: {data.NO_TIMING}. Speed, real-time factor and $/clip are left empty.")
    shown = speed.copy()
    shown["speedup_95ci"] = [
        ("no timing data" if not n else _ci_text(lo, hi)) if role == "candidate"
        else ("baseline" if role == "baseline" else "no baseline in run")
        for lo, hi, role, n in zip(shown["speedup_ci_low"], shown["speedup_ci_high"], shown["role"], shown["n"])
    ]
    shown["verdict"] = [
        v if isinstance(v, str) else ("no verdict yet" if role == "candidate" else "—")
        for v, role in zip(shown["verdict"], shown["role"])
    ]
    st.subheader("Recipes")
    st.caption(
        "Speedup = mean baseline / mean candidate generation-side latency over the same (prompt, seed) pairs, "
        "95% paired bootstrap CI; warm-up requests excluded. RTF = median latency / clip duration. "
        "$/clip = mean generation-side latency x machine $/hour (seed 001's costing)."
    )
    st.dataframe(
        shown[["run", "recipe", "role", "n", "speedup", "speedup_95ci", "p50_latency_s", "p50_request_to_file_s",
               "real_time_factor", "dollars_per_clip", "verdict"]],
        hide_index=True,
        column_config={
            "speedup": st.column_config.NumberColumn("speedup", format="%.2fx"),
            "p50_latency_s": st.column_config.NumberColumn("p50 latency (s)", format="%.2f"),
            "p50_request_to_file_s": st.column_config.NumberColumn("p50 request-to-file (s)", format="%.2f"),
            "real_time_factor": st.column_config.NumberColumn("RTF", format="%.2f"),
            "dollars_per_clip": st.column_config.NumberColumn("$/clip", format="$%.4f"),
        },
        key="overview_speed",
    )
    if speed["dollars_per_clip"].isna().all():
        st.caption("$/clip: no machine rate (set `gpu_hourly_rate` in the run or type one in the sidebar).")

    st.subheader("Speed versus quality")
    metrics = data.quality_metrics(ctx.runs)
    if not metrics:
        st.info("No gate results in these runs yet: quality cannot be plotted.")
        return
    labels = [f"{g} · {m}" for g, m in metrics]
    default = next((i for i, (g, m) in enumerate(metrics) if m in ("lpips_mean", "lpips")), 0)
    choice = st.selectbox("Quality metric", labels, index=default, key="overview_metric")
    gate, metric = metrics[labels.index(choice)]
    higher = bool(data.metric_direction(ctx.runs, gate, metric))
    quality = pd.concat([state.cached_quality_table(run, gate, metric) for run in ctx.runs], ignore_index=True)
    table = data.speed_quality(speed, quality, higher)
    plotted = table.dropna(subset=["speedup", "quality"])
    st.caption(f"{metric}: {'higher' if higher else 'lower'} is better. Bars: 95% bootstrap CI. "
               "Filled diamonds: Pareto front (no other recipe is both faster and better).")
    if len(plotted):
        base = alt.Chart(plotted)
        points = base.mark_point(size=120, filled=True).encode(
            x=alt.X("speedup:Q", title="speedup (x)"),
            y=alt.Y("quality:Q", title=metric, scale=alt.Scale(zero=False, reverse=not higher)),
            color=alt.Color("label:N", title="run / recipe"),
            shape=alt.Shape("pareto:N", title="Pareto front", scale=alt.Scale(domain=[True, False],
                                                                               range=["diamond", "circle"])),
            tooltip=["run", "recipe", "speedup", "quality", "n_scored", "pareto"],
        )
        xbars = base.mark_rule().encode(x="speedup_ci_low:Q", x2="speedup_ci_high:Q", y="quality:Q",
                                        color="label:N")
        ybars = base.mark_rule().encode(y="quality_ci_low:Q", y2="quality_ci_high:Q", x="speedup:Q",
                                        color="label:N")
        front = base.transform_filter(alt.datum.pareto).mark_line(strokeDash=[4, 4], color="gray").encode(
            x="speedup:Q", y="quality:Q", order="speedup:Q")
        st.altair_chart(xbars + ybars + front + points, width="stretch")
    else:
        st.info(f"No candidate has both a speedup and a scored {metric} yet.")
    st.dataframe(
        table[["run", "recipe", "speedup", "quality", "quality_ci_low", "quality_ci_high", "n_scored", "n_missing",
               "pareto"]],
        hide_index=True,
        key="overview_quality",
    )
