"""onepool dashboard: where the money and the GPUs went.

Run with `onepool dashboard` (Streamlit on 127.0.0.1). The broker home comes from
`-- --home DIR` or $ONEPOOL_HOME. Every number comes from query functions
(broker.state.costs via the SDK, dashboard.queries, broker.checkpoint.telemetry); there is
no SQL here. The page re-runs itself every `refresh` seconds (sidebar).
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import UTC, datetime

import pandas as pd
import streamlit as st

from broker.checkpoint import telemetry
from broker.client.sdk import Client
from broker.errors import NotConfigured
from dashboard import queries as insights
from dashboard import sections


def _home() -> str | None:
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--home")
    args, _ = ap.parse_known_args(sys.argv[1:])
    return args.home or os.environ.get("ONEPOOL_HOME")


@st.cache_resource
def _client(home: str | None) -> Client:
    return Client(home)


def main() -> None:
    st.set_page_config(page_title="onepool", layout="wide")
    c = _client(_home())
    st.title("onepool: GPUs and money")
    refresh = st.sidebar.number_input("refresh every (s)", min_value=2, max_value=600, value=10)
    st.sidebar.caption(f"broker home: {c.store.home}")

    @st.fragment(run_every=float(refresh))
    def body() -> None:
        now = c.clock.now()
        try:
            c.config()
        except NotConfigured as e:
            st.warning(str(e))
            return
        st.caption("as of " + datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d %H:%M:%S UTC"))
        tabs = st.tabs(["Overview", "Cost per experiment", "Budgets", "Preemptions", "Pools & prices"])
        with c.store.session() as s:
            lo, hi = insights.time_range(s, now)
            with tabs[0]:
                sections.overview(c, insights.gpus_in_use(s, lo, hi), insights.queue_length(s, lo, hi),
                                  now)
            with tabs[1]:
                sections.experiments(c, lambda e: insights.experiment_jobs(s, e),
                                     lambda j: insights.job_attempts(s, j))
            with tabs[2]:
                rows = insights.budget_overview(s, now)
                sections.budgets(rows, {r["team"]: insights.burndown(s, r["team"], now) for r in rows
                                        if r["budget_usd"] is not None})
            with tabs[3]:
                sections.preemptions(pd.DataFrame([r.model_dump() for r in telemetry.lost_work(s, "cause")]),
                                     pd.DataFrame([r.model_dump() for r in telemetry.lost_work(s, "team")]),
                                     insights.lost_timeline(s))
            with tabs[4]:
                sections.pools(insights.pool_prices(s, now))

    body()


main()
