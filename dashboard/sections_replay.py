"""The dashboard's Replay tab (issue 31), and the Rebalancing tab's expected-against-realized
summary: what `onepool replay` and `onepool rebalance --history` show, through the same SDK
calls (embedded, or over the API as the page's token)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd
import streamlit as st

from broker.errors import OnepoolError
from broker.sim.compare import table

RESULT = "onepool_replay_result"  # session-state key: the last replay's result (or its error)


def replay(run: Callable[[list[str]], dict[str, Any]], admin: bool) -> None:
    """A form of settings to change (PATH=VALUE a line, as `onepool replay --set`); on
    "replay", the history is replayed under the applied config and the changed one, and the
    comparison is shown beside what was recorded (kept until the next replay)."""
    st.subheader("replay the history under other settings")
    if not admin:
        st.info("replaying reads every team's jobs: an admin's token can (`onepool replay`)")
        return
    st.caption("The simulator replays every job submitted so far with the same plan() as the "
               "broker, under the applied onepool.yaml and under it with these changes.")
    text = st.text_area("settings to change, one PATH=VALUE a line (e.g. broker.grace_s=120, "
                        "teams.nlp.weight=2)", key="replay_sets")
    if st.button("replay", key="replay_go"):
        sets = [line.strip() for line in (text or "").splitlines() if line.strip()]
        try:
            st.session_state[RESULT] = run(sets)
        except OnepoolError as e:
            st.session_state[RESULT] = {"error": str(e)}
    out = st.session_state.get(RESULT)
    if out is None:
        return
    if "error" in out:
        st.error(out["error"])
        return
    st.caption(f"{out['jobs']} jobs replayed")
    st.dataframe(pd.DataFrame(table(out)), hide_index=True, key="replay_table")


def realized(history: dict[str, Any]) -> None:
    """Per kind of move: expected and realized saving of finished moves, and the share of a
    move's expected saving the next decisions count (broker.control.rebalance_history)."""
    if not history.get("totals"):
        return
    st.subheader("what finished moves expected and realized")
    rows = [{"kind": k, **v} for k, v in history["totals"].items()]
    st.dataframe(pd.DataFrame(rows), hide_index=True, key="rebalance_realized")
