"""The user-data bootstrap a rented node boots with: it starts the job runner with its env.

In this environment jobs placed on a rented node still run as LOCAL processes (the
Executor is providers.local.LocalProcesses; there is no remote host): the cloud instance is
the capacity and billing object. On a real node this script is what would start the
runner, with the same ONEPOOL_* env contract the local executor passes (see broker.control.engine).
The node agent it execs (`onepool node-agent`) is not part of this build: no remote host
exists here, so the script is carried (and tested for its contents) but never executed.
"""

from __future__ import annotations

import shlex

RUNNER = "onepool node-agent"


def user_data(broker_id: str, pool: str, node_id: str, broker_url: str = "") -> str:
    """A cloud-init shell script: export the node's identity, start the runner agent."""
    env = {"ONEPOOL_BROKER_ID": broker_id, "ONEPOOL_POOL": pool, "ONEPOOL_NODE_ID": node_id,
           "ONEPOOL_BROKER_URL": broker_url}
    lines = ["#!/bin/bash", "set -euo pipefail"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    lines += [f"exec {RUNNER}"]
    return "\n".join(lines) + "\n"
