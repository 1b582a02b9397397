"""onepool dashboard: where the GPUs and the money went, and what is happening now.

Run with `onepool dashboard` (Streamlit on 127.0.0.1). The broker home comes from
`-- --home DIR` or $ONEPOOL_HOME. Every number comes from query functions (dashboard.queries,
broker.state.costs through the SDK, broker.state.inventory through the SDK); there is no SQL
here. The page re-runs itself every `refresh` seconds (sidebar), so "now" stays now.
"""

from __future__ import annotations

import argparse
import os
import sys

import streamlit as st

from broker.client.sdk import Client
from broker.errors import NotConfigured
from broker.state.ledger import spend_by_job
from dashboard import queries, sections
from dashboard.tabs import TABS

JOB_PAGE_FINISHED = 200  # the job page offers every unfinished job and this many finished ones


def _home() -> str | None:
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--home")
    args, _ = ap.parse_known_args(sys.argv[1:])
    return args.home or os.environ.get("ONEPOOL_HOME")


@st.cache_resource
def _client(home: str | None) -> Client:
    return Client(home)


def main() -> None:
    st.set_page_config(page_title="onepool", layout="wide", initial_sidebar_state="expanded")
    c = _client(_home())
    st.title("onepool: GPUs and money")
    refresh = st.sidebar.number_input("refresh every (s)", min_value=2, max_value=600, value=10)
    hours = st.sidebar.number_input("charts: at most the last (hours)", min_value=1, max_value=24 * 90,
                                    value=24)
    st.sidebar.caption(f"broker home: {c.store.home}")

    @st.fragment(run_every=float(refresh))
    def body() -> None:
        now = c.clock.now()
        try:
            c.config()
        except NotConfigured as e:
            st.warning(str(e))
            return
        tabs = st.tabs(TABS)
        pools = c.pools()
        jobs = c.list(finished_limit=JOB_PAGE_FINISHED)
        with c.store.session() as s:
            lo, hi = queries.time_range(s, now, hours * 3600.0)
            with tabs[0]:
                sections.overview(queries.now_overview(s, now), queries.gpus_in_use(s, lo, hi),
                                  queries.queue_length(s, lo, hi), sum(p.free_gpus for p in pools), now)
            with tabs[1]:
                sections.experiments(c.costs("experiment"), lambda e: queries.experiment_jobs(s, e),
                                     lambda j: queries.job_attempts(s, j))
            with tabs[2]:
                sections.job_page(jobs, c.get, lambda j: queries.job_attempts(s, j),
                                  lambda j: queries.job_events(s, j),
                                  lambda j: spend_by_job(s, [j]).get(j, 0.0),
                                  lambda a: queries.log_tail(c.store.home, a),
                                  lambda j: next(iter(c.estimates([j])), None))  # issue 29
            with tabs[3]:
                sections.preemptions(queries.interruptions(s))
            with tabs[4]:
                sections.nodes_and_pools(pools)
            with tabs[5]:
                rows = queries.budget_overview(s, now)
                sections.budgets(rows, {r["team"]: queries.burndown(s, r["team"], now) for r in rows
                                        if r["budget_usd"] is not None})
            with tabs[6]:
                sections.rebalancing(queries.rebalance_moves(s))

    body()


main()
