"""The h3eval review dashboard (Streamlit): speed versus quality per configuration, and the clips behind it.

Launched by ``h3eval dashboard RUNDIR [RUNDIR ...]``, which runs ``streamlit run dashboard/app.py -- RUNDIR...``.
Run directories come from ``H3EVAL_DASHBOARD_RUNS`` (os.pathsep-separated; how the AppTest tests pass them) when
it is set, else from the script arguments. Pages are chosen with a sidebar radio; ``?page=viewer&...`` in the
URL opens a page directly (the gate tables link into the clip viewer that way).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

# Streamlit runs this file as a script: make the repository importable as packages (dashboard, h3, h3eval, gates).
_REPO = str(Path(__file__).resolve().parent.parent)
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

import streamlit as st  # noqa: E402

from dashboard import state  # noqa: E402
from dashboard.views import anatomy, gates, overview, sequential, trajectory, verdict, viewer  # noqa: E402

PAGES = {
    "overview": ("Overview", overview.render),
    "anatomy": ("Anatomy", anatomy.render),
    "viewer": ("Clip viewer", viewer.render),
    "gates": ("Gates", gates.render),
    "trajectory": ("Trajectory", trajectory.render),
    "verdict": ("Verdict", verdict.render),
    "sequential": ("Sequential", sequential.render),
}


def run_dirs_from_args() -> list[str]:
    # The environment wins: under AppTest the script shares the test runner's own sys.argv.
    if os.environ.get("H3EVAL_DASHBOARD_RUNS"):
        return [a for a in os.environ["H3EVAL_DASHBOARD_RUNS"].split(os.pathsep) if a]
    return [a for a in sys.argv[1:] if a]


def main() -> None:
    started = time.perf_counter()
    st.set_page_config(page_title="h3eval review", layout="wide")
    roots = run_dirs_from_args()
    if not roots:
        st.title("h3eval review")
        st.info("No run directory given. Start with `h3eval dashboard RUNDIR [RUNDIR ...]`.")
        return

    keys = list(PAGES)
    wanted = st.query_params.get("page", "overview")
    if "page" not in st.session_state:
        st.session_state["page"] = wanted if wanted in PAGES else "overview"
    page = st.sidebar.radio("Page", keys, key="page", format_func=lambda k: PAGES[k][0])
    if st.query_params.get("page") != page:
        st.query_params["page"] = page  # the address bar names the page shown: a reload or a shared link keeps it

    runs = state.load_runs(roots)
    ctx = state.Context(runs=runs)
    ctx.hourly_rate_override = state.sidebar_rate(runs)
    ctx.run_index = state.sidebar_run(runs)
    state.show_problems(runs)

    title, render = PAGES[page]
    st.title(title)
    state.show_notices(runs)
    render(ctx)
    # Last element of every page: the server-side render time, and a marker that the page is complete (the browser
    # test and the benchmark wait for it).
    st.caption(f"{title} page rendered in {time.perf_counter() - started:.2f} s", help="server-side script time")


main()
