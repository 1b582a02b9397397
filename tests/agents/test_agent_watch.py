"""The engine's watch over agents (broker.control.agents.watch), on an injected clock: when a
node whose agent stopped calling in is declared lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.client.sdk import Client
from broker.clock import FakeClock
from broker.control.engine import Engine
from broker.spec import parse_config
from broker.state.model import Node, NodeState
from broker.state.model_access import NodeAgent
from tests.conftest import config

LOST_AFTER = 30.0
POOL = {"name": "onprem", "provider": "agent", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 1}


def agent_seen(c: Client, node: str, seen_at: float) -> None:
    """`node` is up, its agent joined and last called in at `seen_at`."""
    with c.store.session() as s:
        n = s.get(Node, node)
        assert n is not None
        n.state = NodeState.UP
        s.add(n)
        s.add(NodeAgent(node=node, joined_at=seen_at - 60, seen_at=seen_at))


def state(c: Client, node: str) -> str:
    with c.store.session() as s:
        n = s.get(Node, node)
        assert n is not None
        return n.state


@pytest.mark.parametrize(("silent_before_term", "into_term", "lost"), [
    (0, LOST_AFTER - 1, False),  # a live agent's normal gap
    (0, LOST_AFTER + 1, True),  # silent too long in this term
    (3600, 0, False),  # silent through an outage of the broker: it gets a full timeout to call in
    (3600, LOST_AFTER - 1, False),
    (3600, LOST_AFTER + 1, True),
])
def test_silence_counts_from_the_later_of_the_last_call_and_the_start_of_the_term(
        tmp_path: Path, clock: FakeClock, silent_before_term: float, into_term: float, lost: bool) -> None:
    c = Client(tmp_path / "home", clock=clock)
    c.apply(parse_config(config(pools=[POOL], node_lost_after_s=LOST_AFTER)))
    agent_seen(c, "onprem-0", clock.now() - silent_before_term)
    eng = Engine(c.store, clock)  # a new term begins now
    try:
        eng.cycle()
        clock.advance(into_term)
        eng.cycle()
        assert state(c, "onprem-0") == ("lost" if lost else "up")
    finally:
        eng.close()
