"""A job on an agent printing far past broker.output_cap_bytes: the node keeps at most the
cap (its rank's supervisor caps it), what the agent ships is capped on the server too, and
the server keeps the tail intact. Real server, real agent process, real rank."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.output_log import extent
from tests.agents.harness import Site, agents_cleanup, make_site, spawn_agent, wait_for
from tests.conftest import drive, kill_leftovers
from tests.test_output_log import on_disk, read_all

pytestmark = pytest.mark.e2e
CAP = 64 * 1024
POOL = {"name": "onprem", "provider": "agent", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 1}
LINES = 4096  # of 1 KiB: 4 MiB, 64 times the cap
CHATTY = [sys.executable, "-c",
          f"import sys\nfor i in range({LINES}):\n    sys.stdout.write(f'{{i:07d}} ' + 'x' * 1015 + '\\n')\n"
          "print('the last line', flush=True)"]


@pytest.fixture
def site(tmp_path: Path, clock) -> Iterator[Site]:  # type: ignore[no-untyped-def]
    s = make_site(tmp_path / "home", clock, pools=[POOL], agent_heartbeat_s=1, output_cap_bytes=CAP)
    yield s
    s.close()
    kill_leftovers(tmp_path / "home" / "runs")


def test_a_chatty_job_on_an_agent_leaves_at_most_the_cap_on_node_and_server(site: Site, tmp_path: Path):
    c = site.client
    with agents_cleanup() as agents:
        token = c.join_token("onprem-0").join_token
        agents.append(spawn_agent(site.url, tmp_path / "agent", join_token=token))
        wait_for("joined", lambda: any(n.state == "up" for n in c.nodes()))
        j = c.submit(name="chatty", team="research", command=CHATTY).id
        drive(site.engine, lambda: c.get(j).status == "SUCCEEDED", timeout=60)
        [att] = c.get(j).attempt_list
        total = LINES * 1024 + len("the last line\n")
        server = site.home / "runs" / f"attempt-{att.id}" / "rank-0"
        wait_for("the tail shipped", lambda: extent(server).end == total)
        node = agents[0].state_dir / "runs" / f"attempt-{att.id}" / "rank-0"
        assert on_disk(node) <= CAP and extent(node).end == total
        assert on_disk(server) <= CAP
        start, tail = read_all(server)
        assert tail.endswith(b"\nthe last line\n") and len(tail) >= CAP // 2
        lines = tail.split(b"\n")[1:-2]  # the first may start mid-line
        assert [int(x[:7]) for x in lines] == list(range(LINES - len(lines), LINES))
        chunk = c.logs(j)
        assert chunk.offset == start and chunk.dropped == total - len(tail)
