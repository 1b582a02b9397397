"""The dashboard's sections. Each takes rows from broker query functions and draws them."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pandas as pd
import streamlit as st

COST_COLUMNS = ["key", "usd", "gpu_hours", "lost_gpu_hours", "lost_usd", "jobs"]


def _when(t: float | None) -> str:
    return "" if t is None else datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M")


def _times(df: pd.DataFrame, col: str = "t") -> pd.DataFrame:
    if not df.empty:
        df = df.assign(**{col: pd.to_datetime(df[col], unit="s", utc=True)})
    return df


def overview(c: Any, usage: list[dict[str, Any]], queue: list[dict[str, Any]], now: float) -> None:
    """Totals, GPUs in use by pool and class over time, queue length by class, burn rate."""
    pools = c.costs("pool")
    cols = st.columns(4)
    cols[0].metric("total spent (USD)", f"{sum(r.usd for r in pools):.2f}")
    with c.store.session() as s:
        from broker.state.costs import burn_rate

        cols[1].metric("burn rate (USD/h, last hour)", f"{burn_rate(s, now):.2f}")
    last_t = max((r["t"] for r in usage), default=None)
    cols[2].metric("GPUs in use", str(sum(r["gpus"] for r in usage if r["t"] == last_t)))
    last_q = max((r["t"] for r in queue), default=None)
    cols[3].metric("jobs waiting", str(sum(r["pending"] for r in queue if r["t"] == last_q)))
    st.subheader("GPUs in use by pool and class")
    df = _times(pd.DataFrame(usage, columns=["t", "pool", "priority", "gpus"]))
    if df.empty:
        st.info("no GPU use recorded yet")
    else:
        df["series"] = df["pool"] + "/" + df["priority"]
        st.area_chart(df.pivot_table(index="t", columns="series", values="gpus", aggfunc="sum").fillna(0))
    st.subheader("queue length by class")
    q = _times(pd.DataFrame(queue, columns=["t", "priority", "pending"]))
    if q.empty:
        st.info("nothing has waited")
    else:
        st.line_chart(q.pivot_table(index="t", columns="priority", values="pending", aggfunc="sum").fillna(0))


def experiments(c: Any, jobs_of: Callable[[str], list[dict[str, Any]]],
                attempts_of: Callable[[int], list[dict[str, Any]]]) -> None:
    """The cost table per experiment, a bar chart, and a drill-down into jobs and attempts."""
    rows = [r.model_dump() for r in c.costs("experiment")]
    st.subheader("cost per experiment")
    df = pd.DataFrame(rows, columns=COST_COLUMNS).rename(columns={"key": "experiment"})
    st.table(df.round(4))
    if df.empty:
        st.info("nothing has been charged yet")
        return
    st.bar_chart(df.set_index("experiment")["usd"])
    exp = st.selectbox("experiment", list(df["experiment"]), key="experiment")
    jobs = pd.DataFrame(jobs_of(exp))
    st.dataframe(jobs, hide_index=True)
    if not jobs.empty:
        job = st.selectbox("job", list(jobs["job"]), key="job")
        st.dataframe(pd.DataFrame(attempts_of(int(job))), hide_index=True)


def budgets(rows: list[dict[str, Any]], burndowns: dict[str, list[dict[str, Any]]]) -> None:
    """Per team: budget, spent, burn rate, projected end; burn-down charts."""
    st.subheader("team budgets")
    df = pd.DataFrame(rows)
    if not df.empty:
        df["projected_end"] = df["projected_end"].map(_when)
    st.dataframe(df, hide_index=True)
    for team, series in burndowns.items():
        st.caption(f"{team}: budget left over its window")
        b = _times(pd.DataFrame(series, columns=["t", "left_usd"]))
        if not b.empty:
            st.line_chart(b.set_index("t")["left_usd"])


def preemptions(by_cause: pd.DataFrame, by_team: pd.DataFrame, timeline: list[dict[str, Any]]) -> None:
    """Lost GPU-hours by cause and by who caused them, and a timeline."""
    left, right = st.columns(2)
    left.subheader("lost GPU-hours by cause")
    if not by_cause.empty:
        left.bar_chart(by_cause.set_index("key")["lost_gpu_hours"])
    right.subheader("lost GPU-hours by who preempted")
    if not by_team.empty:
        right.bar_chart(by_team.set_index("key")["lost_gpu_hours"])
    st.subheader("timeline")
    tl = pd.DataFrame(timeline)
    if tl.empty:
        st.info("no work lost")
        return
    tl["when"] = tl["t"].map(_when)
    st.scatter_chart(_times(tl), x="t", y="lost_gpu_hours", color="cause")
    st.dataframe(tl.drop(columns=["t"]), hide_index=True)


def pools(rows: list[dict[str, Any]]) -> None:
    """Current offers: market (on-prem / on-demand / spot), node and GPU prices."""
    st.subheader("pools and prices")
    df = pd.DataFrame(rows)
    st.dataframe(df, hide_index=True)
    if not df.empty:
        st.bar_chart(df.set_index("pool")["usd_per_gpu_hour"])
        st.caption("on-prem GPU-hours are charged at their amortized price but are free for placement")
