"""Agents join honestly (issue 25, part 7): the node's GPUs follow what its agent reports (up to
the pool's size, both ways); a GPU type other than the pool's takes no work, with an event; a
second agent cannot take over a node whose agent is alive; a new --join-token wins over a
saved credential. Real HTTP to a real API (injected clock), the agent's own join code."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.agent.agent import Agent
from broker.agent.hardware import Gpus
from broker.clock import FakeClock
from tests.agents.harness import Site, make_site

LOST_AFTER_S = 30
POOL = {"name": "box", "provider": "agent", "gpu_type": "A100", "gpus_per_node": 8, "nodes": 8}


@pytest.fixture
def site(tmp_path: Path, clock: FakeClock) -> Iterator[Site]:
    s = make_site(tmp_path / "home", clock, pools=[POOL], node_lost_after_s=LOST_AFTER_S)
    yield s
    s.close()


def join(site: Site, node: str, gpus: int = 8, gpu_type: str = "A100", token: str | None = None,
         previous: str | None = None) -> httpx.Response:
    """POST /v1/agent/join as an agent would (a fresh join token unless one is given)."""
    token = token or site.client.join_token(node).join_token
    return httpx.post(f"{site.url}/v1/agent/join", timeout=10, json={
        "join_token": token, "info": {"hostname": f"host-of-{node}", "gpus": gpus, "gpu_type": gpu_type},
        "previous_credential": previous})


def node(site: Site, name: str) -> Any:
    return next(n for n in site.client.nodes() if n.id == name)


@pytest.mark.parametrize("gpus, gpu_type, want_gpus, want_state, event", [
    (8, "A100", 8, "up", None),
    (4, "A100", 4, "up", None),                        # fewer than the pool's: what it has
    (16, "A100", 8, "up", None),                       # more: capped at the pool's size
    (8, "NVIDIA A100-SXM4-80GB", 8, "up", None),       # nvidia-smi's name names the type
    (8, "GPU", 8, "up", None),                         # the agent was not told a type
    (8, "H100", 8, "waiting", "agent_gpu_type"),       # another type: no work, and why
    (8, "NVIDIA H100 80GB HBM3", 8, "waiting", "agent_gpu_type"),
])
def test_a_join_sets_the_node_from_what_its_agent_reports(site: Site, gpus: int, gpu_type: str,
                                                          want_gpus: int, want_state: str,
                                                          event: str | None) -> None:
    r = join(site, "box-0", gpus, gpu_type)
    assert r.status_code == 200, r.text
    n = node(site, "box-0")
    assert (n.gpus, n.state) == (want_gpus, want_state)
    kinds = [e for e in site.client.events() if e.kind == "agent_gpu_type"]
    if event is None:
        assert kinds == []
    else:
        [e] = kinds
        assert gpu_type in e.message and "A100" in e.message and "box-0" in e.message
        assert "takes no work" in e.message


def test_the_gpu_count_follows_the_agent_both_ways_and_a_right_type_brings_the_node_up(
        site: Site) -> None:
    first = join(site, "box-1", gpus=4).json()["credential"]
    assert node(site, "box-1").gpus == 4
    again = join(site, "box-1", gpus=8, previous=first).json()["credential"]  # the same agent, restarted
    assert node(site, "box-1").gpus == 8
    wrong = join(site, "box-1", gpus=8, gpu_type="H100", previous=again).json()["credential"]
    assert node(site, "box-1").state == "waiting"
    assert join(site, "box-1", gpus=8, gpu_type="A100").status_code == 409  # its agent is alive
    assert join(site, "box-1", gpus=6, gpu_type="A100", previous=wrong).status_code == 200
    assert (node(site, "box-1").state, node(site, "box-1").gpus) == ("up", 6)


def test_a_second_agent_cannot_take_over_a_node_whose_agent_is_alive(site: Site, clock: FakeClock) -> None:
    r = join(site, "box-2")
    assert r.status_code == 200
    mine = r.json()["credential"]
    token = site.client.join_token("box-2").join_token
    taken = join(site, "box-2", gpus=4, gpu_type="A100", token=token)
    assert taken.status_code == 409, taken.text
    msg = taken.json()["error"]["message"]
    assert "live agent" in msg and "host-of-box-2" in msg and f"{LOST_AFTER_S}s" in msg
    assert node(site, "box-2").gpus == 8 and node(site, "box-2").agent["gpus"] == 8  # untouched
    assert join(site, "box-2", token=token, previous="opn_notthisone.x").status_code == 409
    clock.advance(LOST_AFTER_S + 1)  # the first agent has gone quiet: the same token now works
    assert join(site, "box-2", gpus=4, token=token).status_code == 200
    assert node(site, "box-2").gpus == 4
    token = site.client.join_token("box-2").join_token  # and its holder, restarted, may re-join
    fresh = join(site, "box-2", token=token, previous=mine)
    assert fresh.status_code == 409  # `mine` is no longer the node's credential


def agent(site: Site, state: Path, token: str | None) -> Agent:
    return Agent(server=site.url, state_dir=state, gpus=Gpus(8, "A100"), join_token=token,
                 http=httpx.Client(base_url=site.url, timeout=10))


def test_a_new_join_token_wins_over_a_saved_credential(site: Site, tmp_path: Path) -> None:
    state = tmp_path / "agent"
    t0 = site.client.join_token("box-3").join_token
    a = agent(site, state, t0)
    a.join()
    assert a.node == "box-3"
    saved = a.credential
    b = agent(site, state, t0)  # restarted with the same (now used) token: the saved credential
    b.join()
    assert (b.node, b.credential) == ("box-3", saved)
    t1 = site.client.join_token("box-4").join_token  # an admin's new token: it wins
    c = agent(site, state, t1)
    c.join()
    assert c.node == "box-4" and c.credential != saved
    d = agent(site, state, None)  # and is what the next start without a token uses
    d.join()
    assert (d.node, d.credential) == ("box-4", c.credential)


def test_a_used_token_beside_a_saved_credential_falls_back_to_the_credential(site: Site, tmp_path: Path,
                                                                             ) -> None:
    """A credential saved before join tokens were remembered, and a unit file still naming
    the used first token: no restart loop."""
    state = tmp_path / "agent"
    t0 = site.client.join_token("box-5").join_token
    a = agent(site, state, t0)
    a.join()
    data = (state / "agent.json").read_text().replace('"join_token_sha256"', '"old_field"')
    (state / "agent.json").write_text(data)
    b = agent(site, state, t0)
    b.join()
    assert (b.node, b.credential) == ("box-5", a.credential)


def test_applying_the_config_again_keeps_what_the_agent_reported(site: Site) -> None:
    join(site, "box-6", gpus=3)
    site.client.apply(site.client.config())
    assert node(site, "box-6").gpus == 3
    assert node(site, "box-7").gpus == 8  # no agent yet: the pool's size


def test_a_sync_reports_what_the_node_holds_and_the_policy_sees_it(site: Site) -> None:
    """What an agent holds (its code cache, its runtime's images) is kept per node and makes the
    node warm for a job needing them (broker.policy.warm); a sync that does not tell keeps it."""
    from broker.control.snapshots import code_held

    cred = join(site, "box-3").json()["credential"]
    held = {"code_held": ["c" * 64], "images_held": ["ghcr.io/lab/train:3"]}
    for body in (held, {}):
        r = httpx.post(f"{site.url}/v1/agent/sync", timeout=10, headers={"Authorization": f"Bearer {cred}"},
                       json={"wait_s": 0, **body})
        assert r.status_code == 200, r.text
        with site.client.store.session() as s:
            assert code_held(s)["box-3"] == {"c" * 64, "ghcr.io/lab/train:3"}
    bad = httpx.post(f"{site.url}/v1/agent/sync", timeout=10, headers={"Authorization": f"Bearer {cred}"},
                     json={"wait_s": 0, "images_held": [""]})
    assert bad.status_code == 422
