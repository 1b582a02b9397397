"""The dashboard's tabs. Each takes rows from query functions (dashboard.queries through
dashboard.data or the API, the SDK) and draws them; times are shown in this machine's local time
zone, on a 24-hour clock; job ids link to the job (dashboard.tabs.job_link)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from dashboard.tabs import job_link, link, wanted_job

COST_COLUMNS = ["key", "usd", "gpu_hours", "idle_usd", "lost_gpu_hours", "lost_usd", "jobs"]
MAX_ESTIMATED = 20  # waiting jobs estimated per refresh at most (each estimate replays the queue)
DAY_S = 86400.0


def axis_format(span_s: float) -> str:
    """The time axis' label format (d3 time format) for a chart spanning `span_s` seconds: a
    24-hour clock always (17:26, never 05:26), with the day once the span passes a day."""
    return "%H:%M" if span_s <= DAY_S else "%d %b %H:%M"


def _time_x(df: pd.DataFrame, col: str = "t") -> alt.X:
    """The x channel of a chart over local times in `df[col]`."""
    span = (df[col].max() - df[col].min()).total_seconds() if len(df) else 0.0
    return alt.X(f"{col}:T", title=f"time ({tz_name()})", axis=alt.Axis(format=axis_format(span)))


def _linked(df: pd.DataFrame, *cols: str) -> tuple[pd.DataFrame, dict[str, Any]]:
    """`df` with job-id columns as links to the job (`?tab=Jobs&job=ID`), and their column config."""
    cols = tuple(c for c in cols if c in df)
    out = df.assign(**{c: df[c].map(lambda j: None if j is None or pd.isna(j) else job_link(int(j)))
                       for c in cols})
    return out, {c: st.column_config.LinkColumn(c, display_text=r"job=(\d+)") for c in cols}


def tz_name() -> str:
    return datetime.now().astimezone().strftime("%Z") or "local"


def when(t: float | None) -> str:
    """A broker time as a local date and time."""
    return "" if t is None or pd.isna(t) else datetime.fromtimestamp(t).astimezone().strftime(
        "%Y-%m-%d %H:%M:%S")


def _local(df: pd.DataFrame, *cols: str) -> pd.DataFrame:
    """Epoch-second columns as local (naive) datetimes for charts."""
    tz = datetime.now().astimezone().tzinfo
    return df.assign(**{c: pd.to_datetime(df[c], unit="s", utc=True).dt.tz_convert(tz).dt.tz_localize(None)
                        for c in cols})


def _readable(df: pd.DataFrame, *cols: str) -> pd.DataFrame:
    """Epoch-second columns as local date-time strings for tables; missing numbers blank."""
    df = df.assign(**{c: df[c].map(when) for c in cols if c in df})
    return df.astype({c: "Int64" for c in df.columns if c.endswith("_step") or c.endswith("_job")})


def step_chart(rows: list[dict[str, Any]], value: str, title: str, stacked: bool = True) -> None:
    """A step chart of `value` per series over time (rows from dashboard.queries.steps)."""
    df = pd.DataFrame(rows, columns=["t", "series", value])
    if df.empty:
        st.info(f"no {title} recorded yet")
        return
    df = _local(df, "t")
    mark = (alt.Chart(df).mark_area(interpolate="step-after", opacity=0.8) if stacked
            else alt.Chart(df).mark_line(interpolate="step-after"))
    chart = mark.encode(x=_time_x(df),
                        y=alt.Y(f"{value}:Q", title=title, stack=stacked or None,
                                axis=alt.Axis(tickMinStep=1, format="d")),
                        color=alt.Color("series:N", title=None),
                        tooltip=[alt.Tooltip("t:T", title="from", format="%H:%M:%S"), "series:N",
                                 f"{value}:Q"])
    st.altair_chart(chart, width="stretch")


def overview(now_: dict[str, Any], usage: list[dict[str, Any]], queue: list[dict[str, Any]],
             free_gpus: int, now: float, team: str | None = None) -> None:
    """Numbers as of now, GPUs in use by pool and class, the queue by class (of `team` when
    given; free GPUs are the cluster's)."""
    cols = st.columns(6)
    cols[0].metric("GPUs in use now", str(now_["gpus_in_use"]))
    cols[1].metric("GPUs free now", str(free_gpus))
    cols[2].metric("jobs running now", str(now_["jobs_running"]))
    cols[3].metric("jobs waiting now", str(now_["jobs_waiting"]))
    cols[4].metric("total spent (USD)", f"{now_['total_usd']:.2f}")
    cols[5].metric("burn rate (USD/h)", f"{now_['spent_last_hour_usd']:.2f}",
                   help="USD charged over the last hour")
    metered = now_["metered_until"]
    st.caption(f"as of {when(now)} {tz_name()}" + ("" if team is None else f"; team {team}'s jobs and money")
               + f"; [the waiting jobs]({link('Jobs')}); burn rate: USD charged over the last hour; "
               "the ledger has charged up to "
               + (when(metered) if metered is not None else "nothing yet")
               + (" (the broker is not running: nothing is metered after that)"
                  if metered is not None and now - metered > 120 else ""))
    st.subheader("GPUs in use by pool and class")
    step_chart(usage, "gpus", "GPUs in use")
    st.subheader("jobs waiting by class")
    step_chart(queue, "waiting", "jobs waiting", stacked=False)


def people(costs_by_user: list[Any]) -> None:
    """The cost per person (`team/user`; `team/(team token)`: jobs of tokens without a user)."""
    rows = [r.model_dump() for r in costs_by_user if r.jobs]
    if rows:
        st.subheader("cost per user")
        st.table(pd.DataFrame(rows, columns=COST_COLUMNS).rename(columns={"key": "user"}).round(4),
                 hide_index=True)


def by_user(jobs: list[Any]) -> list[Any]:
    """`jobs`, or only those of the user picked in a select box (when more than one submitted)."""
    users = sorted({j.user or "(team token)" for j in jobs})
    if len(users) < 2:
        return jobs
    pick = st.selectbox("user", ["everyone", *users], key="jobs_user")
    return jobs if pick == "everyone" else [j for j in jobs if (j.user or "(team token)") == pick]


def experiments(costs: list[Any], jobs_of: Callable[[str], list[dict[str, Any]]],
                attempts_of: Callable[[int], list[dict[str, Any]]]) -> None:
    """The cost table per experiment (unused GPU time in its own rows), a bar chart, and a
    drill-down into jobs and attempts."""
    st.subheader("cost per experiment")
    df = pd.DataFrame([r.model_dump() for r in costs], columns=COST_COLUMNS).rename(
        columns={"key": "experiment"})
    st.table(df.round(4), hide_index=True)
    if df.empty:
        st.info("nothing has been charged yet")
        return
    st.caption(f"total {df['usd'].sum():.4f} USD, the same in every view (`onepool cost --by ...`); "
               "idle on-prem, idle rented and boot/drain: GPUs paid for that no job used")
    st.bar_chart(df.set_index("experiment")["usd"], horizontal=True)
    real = [e for e in df["experiment"] if " " not in e]
    if not real:
        return
    exp = st.selectbox("experiment", real, key="experiment")
    jobs = pd.DataFrame(jobs_of(exp))
    shown, links = _linked(jobs.assign(open=jobs.get("job")) if not jobs.empty else jobs, "open")
    st.dataframe(shown, hide_index=True, key="experiment_jobs", column_config=links)
    if not jobs.empty:
        job = st.selectbox("job", list(jobs["job"]), key="experiment_job")
        att = pd.DataFrame(attempts_of(int(job)))
        st.dataframe(_readable(att.drop(columns=["id"], errors="ignore"), "started_at", "ended_at"),
                     hide_index=True, key="experiment_attempts")


def waiting(jobs: list[Any], estimates: dict[int | None, Any]) -> None:
    """Every waiting job with its own reason (Job.waiting_reason, as the broker last saw it)
    and, for the first MAX_ESTIMATED, when it would start at the earliest (p10) and likely
    (p50) (broker.client.sdk_estimate)."""
    st.subheader("waiting")
    rows = [{"job": job_link(j.id), "name": j.name, "team": j.team, "user": j.user or "",
             "priority": j.priority,
             "GPUs": f"{j.nodes}x{j.gpus_per_node}",
             "waiting because": j.waiting_reason or "not looked at yet",
             "earliest start": _start(estimates.get(j.id), "start_p10"),
             "likely start": _start(estimates.get(j.id), "start_p50")}
            for j in jobs if j.status == "PENDING"]
    if not rows:
        st.caption("no job is waiting")
        return
    st.dataframe(pd.DataFrame(rows), hide_index=True, key="waiting",
                 column_config={"job": st.column_config.LinkColumn("job", display_text=r"job=(\d+)")})


def _start(e: Any, field: str) -> str:
    if e is None:
        return "-"
    t = getattr(e, field)
    return "not within 14 days" if t is None else when(t)


def job_page(jobs: list[Any], get: Callable[[int], Any], detail_of: Callable[[int], Any],
             tail: Callable[[int, int], str | None], estimate_of: Callable[[int], Any] | None = None,
             key: str = "job_page") -> None:
    """One job: status, progress, money; its array; while it waits, why and when it would start
    and what it would cost (issue 29); its attempts (where each ran, why each ended, steps); the
    tail of an attempt's log; its events. `detail_of(job)` gives its attempts, events and spend
    (dashboard.wire.JobDetail); `tail(job, attempt number)` its output's end. The selected job
    is the query parameter `key` (a link opens it)."""
    st.subheader("job")
    if not jobs:
        st.info("no jobs yet")
        return
    newest_running = next((j.id for j in reversed(jobs) if j.status == "RUNNING"), jobs[-1].id)
    ids = [j.id for j in jobs]
    label = {j.id: f"{j.id}: {j.name} ({j.status.lower()})" for j in jobs}
    asked = wanted_job(dict(st.query_params), key)
    jid = st.selectbox("job", ids, index=ids.index(asked if asked in ids else newest_running),
                       format_func=label.get, key=key)
    if asked != jid:  # the page's address names the job shown: a link to pass on
        st.query_params[key] = str(jid)
    j = get(jid)
    detail = detail_of(jid)
    cols = st.columns(5)
    cols[0].metric("status", j.status)
    cols[1].metric("spent (USD)", f"{detail.spent_usd:.4f}",
                   help=None if j.budget_usd is None else f"budget {j.budget_usd:.2f} USD")
    cols[2].metric("attempts", str(j.attempts), help=f"preempted {j.preemptions} times")
    step = max((x for x in (j.progress_step, j.last_step) if x is not None), default=None)
    cols[3].metric("step", "-" if step is None else f"{step}" + (f" of {j.progress_total}" if j.progress_total
                                                                  else ""),
                   help="the newest step it reported or checkpointed")
    cols[4].metric("ETA", "-" if j.eta is None else when(j.eta)[11:])
    st.caption(f"{j.name}: team {j.team}" + (f", by {j.user}" if j.user else "")
               + f", experiment {j.experiment}, {j.priority}, "
               f"{j.nodes}x{j.gpus_per_node} GPUs; submitted {when(j.submit_time)}"
               + (f", ended {when(j.end_time)}" if j.end_time else "")
               + ("" if j.array_id is None else f"; element {j.array_index} of array {j.array_id}")
               + (f"; waiting: {j.waiting_reason}" if j.waiting_reason else "")
               + (f"; GPU utilization {j.gpu_util_pct:.0f}%" if j.gpu_util_pct is not None else ""))
    if j.held_idle:
        st.warning("held but idle: its GPUs have been below 5% utilization for 10 minutes or more")
    from broker.client.cli_intervals import calibration_lines  # issue 31: deadline, checkpoint interval

    for line in calibration_lines(j):
        st.caption(line)
    est = estimate_of(jid) if estimate_of is not None and j.status == "PENDING" else None
    if est is not None:
        from broker.client.cli_estimate import summary

        st.caption(summary(est, when))
    att = pd.DataFrame(detail.attempts)
    st.markdown("**attempts**")
    if att.empty:
        st.info("not started yet")
    else:
        st.dataframe(_readable(att.drop(columns=["id"]), "started_at", "ended_at"), hide_index=True,
                     key="job_attempts")
        number = st.selectbox("log of attempt", list(att["attempt"])[::-1], key="job_log_attempt")
        text = tail(jid, int(number))
        st.code(text if text else "(no output)", language=None)
    st.markdown("**events**")
    ev = pd.DataFrame(detail.events)
    if ev.empty:
        st.caption("no events recorded")
    else:
        st.dataframe(_readable(ev, "t").rename(columns={"t": "time"}), hide_index=True, key="job_events")


def preemptions(rows: list[dict[str, Any]]) -> None:
    """Every interruption (zero-loss ones too), who caused it, the work lost."""
    st.subheader("preemptions and interruptions")
    df = pd.DataFrame(rows)
    if df.empty:
        st.info("no job has been preempted or interrupted")
        return
    cols = st.columns(3)
    cols[0].metric("interruptions", str(len(df)))
    cols[1].metric("with no work lost", str(int((df["lost_gpu_hours"] == 0).sum())),
                   help="the job checkpointed on the signal")
    cols[2].metric("GPU-hours lost", f"{df['lost_gpu_hours'].sum():.4f}")
    shown, links = _linked(_readable(df, "t").rename(columns={"t": "when"}), "job", "caused_by_job")
    st.dataframe(shown, hide_index=True, key="preemptions", column_config=links)
    left, right = st.columns(2)
    left.markdown("**lost GPU-hours by cause**")
    left.bar_chart(df.groupby("cause")["lost_gpu_hours"].sum())
    right.markdown("**lost GPU-hours by who caused it**")
    who = df.assign(by=df["caused_by_team"].fillna(df["cause"]))
    right.bar_chart(who.groupby("by")["lost_gpu_hours"].sum())


def nodes_and_pools(pools: list[Any]) -> None:
    """Pools (market, price, capacity, free GPUs) and their live nodes (state, free GPUs, who
    holds the rest, age)."""
    st.subheader("pools")
    df = pd.DataFrame([{"pool": p.name, "provider": p.provider, "market": p.market, "gpu_type": p.gpu_type,
                        "nodes": len(p.nodes), "max_nodes": p.max_nodes, "gpus": p.gpus,
                        "free_gpus": p.free_gpus, "usd_per_node_hour": p.usd_per_node_hour,
                        "usd_per_gpu_hour": p.usd_per_gpu_hour, "unpriced": p.unpriced or ""} for p in pools])
    st.dataframe(df, hide_index=True, key="pools")
    st.caption("on-prem GPU-hours are charged at their amortized price but are free for placement")
    st.subheader("nodes")
    nodes = pd.DataFrame([{"node": n.id, "pool": n.pool, "state": n.state, "gpus": n.gpus,
                           "free_gpus": n.free_gpus, "jobs": ", ".join(map(str, n.jobs)),
                           "since": n.since, "age_min": None if n.age_s is None else round(n.age_s / 60, 1),
                           "instance": n.instance_id or "", "zone": n.zone or ""}
                          for p in pools for n in p.nodes])
    if nodes.empty:
        st.info("no live nodes")
    else:
        st.dataframe(_readable(nodes, "since"), hide_index=True, key="nodes")


def budgets(rows: list[dict[str, Any]], burndowns: dict[str, list[dict[str, Any]]]) -> None:
    """Per team: budget, spent, burn rate, projected end; burn-down charts."""
    st.subheader("team budgets")
    df = pd.DataFrame(rows)
    if not df.empty:
        df["projected_end"] = df["projected_end"].map(when)
    st.dataframe(df, hide_index=True, key="budgets")
    if not burndowns:
        st.caption("no team has a budget: set budget_usd in onepool.yaml, or `onepool budget set "
                   "--team TEAM AMOUNT`; spent and burn rate are shown all the same")
    for team, series in burndowns.items():
        st.caption(f"{team}: budget and what is left of it over its window (an override counts from "
                   "when it was set)")
        b = pd.DataFrame(series, columns=["t", "budget_usd", "left_usd"])
        if b.empty:
            continue
        b = _local(b, "t")
        long = b.melt(id_vars=["t"], value_vars=["budget_usd", "left_usd"], var_name="series",
                      value_name="usd").dropna()
        chart = alt.Chart(long).mark_line(interpolate="step-after").encode(
            x=_time_x(b), y=alt.Y("usd:Q", title="USD"), color=alt.Color("series:N", title=None),
            tooltip=[alt.Tooltip("t:T", format="%Y-%m-%d %H:%M:%S"), "series:N",
                     alt.Tooltip("usd:Q", format=".2f")])
        st.altair_chart(chart, width="stretch")


def rebalancing(rows: list[dict[str, Any]]) -> None:
    """Every move to cheaper capacity (or for a waiting gang job): expected and realized saving."""
    st.subheader("rebalancing moves")
    df = pd.DataFrame(rows)
    if df.empty:
        st.info("no job has been moved: no move has paid for itself yet "
                "(`onepool rebalance --dry-run` shows what would move now)")
        return
    done = df[df["state"] == "done"]
    cols = st.columns(3)
    cols[0].metric("moves", str(len(df)))
    cols[1].metric("expected net saving ($)", f"{(df['expected_saving_usd'] - df['cost_usd']).sum():.2f}")
    cols[2].metric("realized saving ($)", f"{done['realized_saving_usd'].sum():.2f}" if len(done) else "-",
                   help="moves whose attempt in the new pool has ended")
    shown, links = _linked(_readable(df, "t").rename(columns={"t": "decided"}), "job")
    st.dataframe(shown, hide_index=True, key="rebalancing", column_config=links)
