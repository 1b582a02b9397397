"""A node agent's Prometheus metrics (`onepool agent --metrics-port PORT`): what this node's
agent knows that the server may not (its server may be unreachable: that is when these matter).

- onepool_agent_info{node, version, gpu_type}: 1 once joined.
- onepool_agent_gpus: GPUs it offers.
- onepool_agent_ranks{state}: ranks it runs or has not reported yet (running, exited, lost).
- onepool_agent_last_sync_age_seconds: since its last successful sync with the server (the
  lease file's age); onepool_agent_fence_seconds: the age at which its ranks stop themselves.
- onepool_agent_syncs_total{result}: syncs with the server, ok or error (since this process
  started).

The listener binds 127.0.0.1 by default (a node exporter's scrape runs on the node, or
`--metrics-host` opens it); it needs no token: no job name is exposed, only counts.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from broker import __version__
from broker.clock import Clock, SystemClock

if TYPE_CHECKING:
    from broker.agent.agent import Agent

RANK_STATES = ("running", "exited", "lost")


class AgentCollector(Collector):
    def __init__(self, agent: Agent, clock: Clock | None = None) -> None:
        self.agent = agent
        self.clock = clock or SystemClock()

    def collect(self) -> Iterator[Metric]:
        a = self.agent
        info = GaugeMetricFamily("onepool_agent_info", "1 once the agent joined as `node`.",
                                 labels=["node", "version", "gpu_type"])
        if a.node:
            info.add_metric([a.node, __version__, a.gpus.gpu_type], 1.0)
        yield info
        gpus = GaugeMetricFamily("onepool_agent_gpus", "GPUs this agent offers.")
        gpus.add_metric([], a.gpus.count)
        yield gpus
        with a.lock:
            handles = [r.handle for r in a.ranks.values()]
        states = Counter(str(a.procs.status(h).state) for h in handles)
        ranks = GaugeMetricFamily("onepool_agent_ranks", "Ranks this agent runs or still has to "
                                  "report, by state.", labels=["state"])
        for st in RANK_STATES:
            ranks.add_metric([st], states.get(st, 0) + (states.get("orphaned", 0) if st == "running" else 0))
        yield ranks
        age = GaugeMetricFamily("onepool_agent_last_sync_age_seconds", "Seconds since the last "
                                "successful sync with the server (absent before the first).")
        with contextlib.suppress(FileNotFoundError):
            age.add_metric([], max(0.0, self.clock.now() - a.lease.stat().st_mtime))
        yield age
        fence = GaugeMetricFamily("onepool_agent_fence_seconds", "Silence after which this node's "
                                  "ranks stop themselves (the server's fence time).")
        fence.add_metric([], a.fence_s)
        yield fence
        syncs = CounterMetricFamily("onepool_agent_syncs", "Syncs with the server since this agent "
                                    "started, by result (ok, error).", labels=["result"])
        for result in ("ok", "error"):
            syncs.add_metric([result], a.syncs[result])
        yield syncs


def serve(agent: Agent, host: str, port: int) -> tuple[object, int]:
    """Serve the agent's metrics at http://host:port/metrics in a daemon thread; returns (the
    server, its port). Call `.shutdown()` on the server to stop it."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(AgentCollector(agent))
    server, _ = start_http_server(port, addr=host, registry=reg)
    return server, int(server.server_address[1])
