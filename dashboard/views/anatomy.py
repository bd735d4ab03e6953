"""Anatomy: where a request's time goes, stage by stage, per recipe (warm requests only)."""

from __future__ import annotations

import altair as alt
import streamlit as st

from dashboard import data, state


def render(ctx: state.Context) -> None:
    table = data.stage_anatomy(ctx.runs)
    for run in ctx.runs:
        if len(data.warm_clips(run)) and not len(data.timed_clips(run, "anatomy_timed")):
            st.info(f"{run.label}: no timing data for this run: its clip records report no stage anatomy "
                    "(clips made by another stack and imported).")
    if not len(table):
        if not any(len(data.warm_clips(run)) for run in ctx.runs):
            st.info("No finished warm clips in these runs yet.")
        return
    table["label"] = table["run"] + " / " + table["recipe"]
    st.caption("Mean seconds per stage over warm requests (requests marked `extra.warmup` are excluded). "
               "prep = frame preparation + device-to-host copy; other = pipeline glue not attributed to a stage.")
    chart = alt.Chart(table).mark_bar().encode(
        y=alt.Y("label:N", title=None),
        x=alt.X("seconds:Q", title="seconds per request", stack="zero"),
        color=alt.Color("stage:N", sort=list(data.STAGES)),
        order=alt.Order("stage_order:Q"),
        tooltip=["run", "recipe", "stage", alt.Tooltip("seconds:Q", format=".3f"), "n"],
    ).transform_calculate(stage_order=f"indexof({list(data.STAGES)!r}, datum.stage)")
    st.altair_chart(chart, width="stretch")
    wide = table.pivot_table(index=["run", "recipe", "n"], columns="stage", values="seconds").reset_index()
    wide = wide[["run", "recipe", "n", *data.STAGES]]
    wide["total"] = wide[list(data.STAGES)].sum(axis=1)
    wide["denoise_share"] = wide["denoise"] / wide["total"]
    st.dataframe(wide, hide_index=True, key="anatomy_table",
                 column_config={"denoise_share": st.column_config.NumberColumn("denoise share", format="percent")})
