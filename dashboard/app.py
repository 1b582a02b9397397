"""onepool dashboard: where the GPUs and the money went, and what is happening now.

Run with `onepool dashboard` (Streamlit). Two modes:

- over the API (ONEPOOL_URL set, or `-- --url URL`): every number comes from the server's
  /v1/dashboard routes (dashboard.remote) as the token's principal: a member sees its own
  team's jobs, logs and money, an admin everything. The token comes from ONEPOOL_TOKEN, or is
  pasted on the login page and kept only in this browser session's memory (never on disk,
  never in the URL). Runs on any machine that reaches the server.
- embedded (no URL; the home from `-- --home DIR` or $ONEPOOL_HOME): reads the database
  directly (dashboard.data). On a loopback address it shows everything to its single local
  user; listening on any other address it asks for a token as well, checked against the
  home's tokens, and shows what that token may see.

There is no SQL here. The page re-runs itself every `refresh` seconds (sidebar), so "now"
stays now. The open tab and job are query parameters (dashboard.tabs.link).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import streamlit as st

from broker.errors import NotConfigured, NotFound, OnepoolError, Unauthorized, Unavailable
from dashboard import sections, sections_replay
from dashboard.tabs import JOB_KEY, LOOPBACK, TAB_KEY, TABS, wanted_job

TOKEN = "onepool_token"  # the session-state key of a pasted token (this session's memory only)
CONNECTION = "onepool_connection"  # ((url, token), HttpClient, who) of this session


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--home")
    ap.add_argument("--url")
    args, _ = ap.parse_known_args(sys.argv[1:])
    args.home = args.home or os.environ.get("ONEPOOL_HOME")
    args.url = args.url or os.environ.get("ONEPOOL_URL")
    return args


def _shared_only() -> bool:
    """Whether this dashboard listens beyond this machine (Streamlit's default address, unset,
    is every interface): then even the embedded mode shows nothing without a token."""
    return (st.get_option("server.address") or "") not in LOOPBACK


def _token(args: argparse.Namespace) -> str | None:
    """The pasted token, else ONEPOOL_TOKEN (over the API, or an embedded dashboard off
    loopback); None: the embedded local user."""
    env = os.environ.get("ONEPOOL_TOKEN") if args.url or _shared_only() else None
    return st.session_state.get(TOKEN) or env or None


def _logout() -> None:
    st.session_state.pop(TOKEN, None)
    kept = st.session_state.pop(CONNECTION, None)
    if kept is not None:
        kept[1].close()


def _connect(args: argparse.Namespace, token: str | None) -> tuple[Any, Any, str, str]:
    """(sdk, data, where, who) for `token` (None: the embedded local user). Raises Unauthorized."""
    if args.url:
        from broker.client.http import HttpClient
        from dashboard.remote import RemoteData

        kept = st.session_state.get(CONNECTION)
        if kept is None or kept[0] != (args.url, token):  # one HTTP client per session and token
            http = HttpClient(args.url, token)
            who = http.read("/v1/whoami")  # checks the token now, not at the first chart
            kept = ((args.url, token), http, f"{who['kind']} of team {who['team']}")
            st.session_state[CONNECTION] = kept
        _, http, who_ = kept
        return http, RemoteData(http), args.url, who_
    from broker.client.sdk import Client
    from broker.state.tokens import Verifier
    from dashboard.data import LocalData, viewer

    local = _embedded(args.home)
    if token is None:
        return local, LocalData(local), str(local.store.home), viewer(local)
    with local.store.session() as s:
        p = Verifier(local.clock).api_principal(s, token)
        s.commit()
    c = Client(store=local.store, clock=local.clock, principal=p)
    return c, LocalData(c), str(local.store.home), viewer(c)


@st.cache_resource
def _embedded(home: str | None) -> Any:
    from broker.client.sdk import Client

    return Client(home)


def _login(error: str | None = None) -> None:
    """The login page: a token pasted here is kept in this session only."""
    st.title("onepool: GPUs and money")
    st.subheader("log in")
    st.caption("Paste your API token (`onepool token create --team TEAM`, from an admin). A member "
               "token shows its team's jobs and money; an admin token shows every team. The token "
               "stays in this browser session's memory only.")
    with st.form("login"):
        token = st.text_input("API token", type="password", key="login_token")
        if st.form_submit_button("log in") and token:
            st.session_state[TOKEN] = token.strip()
            st.rerun()
    if error:
        st.error(error)


def main() -> None:
    st.set_page_config(page_title="onepool", layout="wide", initial_sidebar_state="expanded")
    args = _args()
    token = _token(args)
    if token is None and (args.url or _shared_only()):
        _login()
        return
    try:
        sdk, data, where, who = _connect(args, token)
    except Unauthorized as e:
        _logout()
        _login(f"that token was refused: {e}")
        return
    except Unavailable as e:  # nothing to show yet: a reload tries again
        st.title("onepool: GPUs and money")
        st.error(f"{e}; reload this page to try again")
        return
    st.title("onepool: GPUs and money")
    refresh = st.sidebar.number_input("refresh every (s)", min_value=2, max_value=600, value=10)
    hours = st.sidebar.number_input("charts: at most the last (hours)", min_value=1, max_value=24 * 90,
                                    value=24)
    st.sidebar.caption(f"{'server' if args.url else 'broker home'}: {where}")
    mine = "" if who.startswith(("admin", "local")) else " (its jobs and money)"
    st.sidebar.caption(f"you see: {who}{mine}")
    if st.session_state.get(TOKEN) and st.sidebar.button("log out"):
        _logout()
        st.rerun()

    @st.fragment(run_every=float(refresh))
    def body() -> None:
        try:
            snap = data.snapshot(float(hours))
        except NotConfigured as e:
            st.warning(str(e))
            return
        except Unavailable as e:  # the server is down or restarting: the next refresh tries again
            st.error(f"{e} (trying again every {refresh} s)")
            return
        except Unauthorized:  # revoked while we looked
            _logout()
            st.rerun()
        tabs = st.tabs(TABS, key=TAB_KEY, bind="query-params")
        with tabs[0]:
            sections.overview(snap.overview, snap.usage, snap.queue, snap.overview["free_gpus"], snap.now,
                              snap.team)
        with tabs[1]:
            sections.experiments(snap.costs, data.experiment_jobs, lambda j: data.job(j).attempts)
            sections.people(snap.costs_by_user)
        with tabs[2]:
            jobs = sections.by_user(list(snap.jobs))
            asked = wanted_job(dict(st.query_params))
            if asked is not None and asked not in {j.id for j in jobs}:
                try:  # a link to an older finished job than the page lists
                    jobs.append(sdk.get(asked))
                except NotFound:
                    st.warning(f"no job with id {asked} (that you may see)")
            pending = [j.id for j in jobs if j.status == "PENDING"][:sections.MAX_ESTIMATED]
            try:
                estimates = {e.job_id: e for e in sdk.estimates(pending)}
            except OnepoolError as e:  # an estimate is a help, not the page: say why it is missing
                st.caption(f"no estimates: {e}")
                estimates = {}
            sections.waiting(jobs, estimates)
            sections.job_page(jobs, sdk.get, data.job, lambda j, n: data.log_tail(j, n).text,
                              estimates.get, key=JOB_KEY)
        with tabs[3]:
            sections.preemptions(snap.interruptions)
        with tabs[4]:
            sections.nodes_and_pools(snap.pools)
        with tabs[5]:
            sections.budgets(snap.budgets, snap.burndowns)
        with tabs[6]:
            sections.rebalancing(snap.rebalancing)
            try:
                sections_replay.realized(sdk.rebalance_history())
            except OnepoolError as e:
                st.caption(f"no history of finished moves: {e}")
        with tabs[7]:
            sections_replay.replay(lambda sets: sdk.replay(sets), snap.team is None)

    body()


main()
