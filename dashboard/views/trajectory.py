"""Trajectory: divergence of the candidate's latent trajectory from the baseline's, step by step.

Steps are matched by noise level (the gate's rule). A candidate that ran another schedule (8 steps against 29)
shares only a few noise levels with the baseline, often just the start, where same-seed trajectories agree by
construction: its per-step curve would be flat zeros. The page says so, leaves it out of the step chart, and shows
what the gate compared for it: the common noise levels and the final x0 (what decodes into the clip).
"""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import data, pairview, state


def _schedule_text(rows: pd.DataFrame) -> str:
    pairs = rows[["baseline_steps", "candidate_steps"]].drop_duplicates()
    return "; ".join(f"{b} vs {c} steps" for b, c in pairs.itertuples(index=False))


def _levels_text(rows: pd.DataFrame) -> str:
    levels = sorted({round(t, 4) for ts in rows["common_t"] for t in ts}, reverse=True)
    shown = ", ".join(f"{t:g}" for t in levels[:6]) + (", ..." if len(levels) > 6 else "")
    return f"{len(levels)} noise level(s) both schedules visit (t = {shown})" if levels else "no common noise level"


def _final_text(values: pd.Series) -> str:
    v = values.dropna()
    if not len(v):
        return "no final x0 value"
    spread = f" (pairs: {v.min():.3g} to {v.max():.3g})" if len(v) > 1 else ""
    return f"{v.median():.3g} median over {len(v)} pair(s){spread}"


def render(ctx: state.Context) -> None:
    run = ctx.run
    table = pairview.trajectory_table(run)
    if not len(table):
        st.info(f"No trajectory in this run ({run.label} has no `{data.TRAJECTORY_GATE}` gate results).")
        return
    series = sorted(table["series"].unique())
    name = st.selectbox("Series", series, key="trajectory_series")
    modality = name.split("_", 1)[0]
    schedules = pairview.trajectory_schedules(run)
    schedules = schedules[schedules["modality"] == modality]
    differ = sorted(set(schedules.loc[schedules["differ"], "candidate"]))
    for cand in differ:
        rows = schedules[(schedules["candidate"] == cand) & schedules["differ"]]
        n = int((schedules["candidate"] == cand).sum())
        st.warning(
            f"**{cand}: schedules differ** ({_schedule_text(rows)}) on {len(rows)} of {n} pair(s). The gate "
            f"compared x_t and x0 only at the {_levels_text(rows)}, where same-seed trajectories start alike, so its "
            f"per-step {modality} series are not drawn as curves. What it compared as well, the final x0 of each side "
            f"(what decodes into the clip): relative L2 {_final_text(rows['final_x0_rel_l2'])} "
            f"(gate metric `{modality}_x0_rel_l2_final`).")

    mine = table[table["series"] == name].dropna(subset=["value"])
    same = mine[~mine["candidate"].isin(differ)]
    if len(same):
        st.caption("One line per pair (thin), median over pairs per candidate (thick); candidates on the baseline's "
                   "schedule.")
        pairs = alt.Chart(same).mark_line(opacity=0.3, strokeWidth=1).encode(
            x=alt.X("step:Q", title="denoising step"), y=alt.Y("value:Q", title=name), color="candidate:N",
            detail="pair:N")
        median = alt.Chart(same).mark_line(strokeWidth=3).encode(
            x="step:Q", y="median(value):Q", color="candidate:N")
        st.altair_chart(pairs + median, width="stretch")
    else:
        st.info("No candidate ran the baseline's schedule: no per-step curves to draw (see the final x0 below).")

    summary = same.groupby(["candidate", "step"])["value"].median().reset_index()
    last = summary.sort_values("step").groupby("candidate").tail(1).rename(
        columns={"value": f"median {name} at last step", "step": "last step"})
    last = pd.DataFrame({"candidate": sorted(mine["candidate"].unique())}).merge(last, on="candidate", how="left")
    by_cand = schedules.groupby("candidate")
    last["schedules"] = [
        ("differ: " if c in differ else "same: ") + _schedule_text(by_cand.get_group(c)) if c in by_cand.groups
        else "not reported" for c in last["candidate"]]
    last[f"median final {modality} x0 rel-L2"] = [
        by_cand.get_group(c)["final_x0_rel_l2"].median() if c in by_cand.groups else None for c in last["candidate"]]
    st.dataframe(last, hide_index=True, key="trajectory_table")

    finals = schedules.dropna(subset=["final_x0_rel_l2"])
    if len(finals):
        st.caption(f"Final {modality} x0 relative L2 per pair (the gate's `{modality}_x0_rel_l2_final`: each side's "
                   "last prediction, which decodes into the clip), compared whatever the schedules.")
        chart = alt.Chart(finals.assign(pair=finals["prompt_id"] + "-s" + finals["seed"].astype(str))).mark_point(
            size=60, filled=True).encode(
            x=alt.X("final_x0_rel_l2:Q", title=f"final {modality} x0 relative L2"),
            y=alt.Y("candidate:N", title=None), color="candidate:N", tooltip=["pair", "final_x0_rel_l2"])
        st.altair_chart(chart.properties(height=60 + 30 * finals["candidate"].nunique()), width="stretch")

    st.subheader("Per pair")
    sched = {(r.candidate, r.prompt_id, r.seed): r for r in schedules.itertuples()}
    rows = []
    for (gate, cand, pid, seed), result in sorted(run.gate_results.items()):
        if gate != data.TRAJECTORY_GATE:
            continue
        values = (result.get("series") or {}).get(name) or []
        info = result.get("info") or {}
        s = sched.get((cand, pid, seed))
        rows.append({
            "candidate": cand, "prompt_id": pid, "seed": seed, "status": result.get("status"),
            "flagged": result.get("flagged"),
            "steps (baseline vs candidate)": f"{s.baseline_steps} vs {s.candidate_steps}" if s else None,
            "common noise levels": s.common_levels if s else None,
            f"{name} at last step": values[-1] if values else None,
            f"final {modality} x0 rel-L2": s.final_x0_rel_l2 if s else None,
            "first divergent step": info.get(f"{modality}_first_divergent_step"),
            "flags": "; ".join(result.get("flags") or []), "error": result.get("error"),
            "view": data.viewer_link(ctx.run_index, cand, pid, seed),
        })
    st.dataframe(pd.DataFrame(rows), hide_index=True, key="trajectory_pairs",
                 column_config={"view": st.column_config.LinkColumn("viewer", display_text="open")})
