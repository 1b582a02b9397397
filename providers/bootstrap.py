"""The user data a rented node boots with: a shell script that starts `onepool agent`, which
joins the broker with a one-time join token and from then on runs the ranks placed there.

The script installs onepool first when the image has no `onepool` command (from
`broker.agent_package`, a pip requirement such as a wheel URL in your bucket); an image with
onepool baked in starts at once. Everything the agent needs is in the script: the server's
URL, the join token (one use, expiring), the node's identity and its expected GPUs.
Environment variables already set when the script runs win over the script's defaults
(ONEPOOL_AGENT_HOME: the agent's state folder; ONEPOOL_METADATA_URL: the metadata service).

A pool's `prepull_images` are pulled while the node boots, in the background beside the
agent's start (the agent joins at once; a job placed meanwhile waits for its image the usual
way, and finds it pulled or half-pulled): with the pool's `container_runtime`, else podman,
else docker, whichever the image has. Each pull's outcome goes to
`$ONEPOOL_AGENT_HOME/prepull.log`; a failed pull is left to the job's own pull (its cause is
reported there).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass


@dataclass(frozen=True)
class Boot:
    """What a node needs to join. `metadata` is the cloud whose metadata service the agent
    watches for interruption notices (aws | gcp | none)."""

    server_url: str
    join_token: str
    node_id: str
    pool: str
    provider: str
    gpus: int
    gpu_type: str
    metadata: str = "none"
    agent_package: str | None = None
    prepull_images: tuple[str, ...] = ()  # pulled in the background while the agent starts
    container_runtime: str | None = None  # podman | docker (None: whichever the image has)


def prepull(images: tuple[str, ...], runtime: str | None) -> str:
    """The script lines that pull `images` in the background (nothing without any)."""
    if not images:
        return ""
    q = shlex.quote
    tools = [runtime] if runtime else ["podman", "docker"]
    find = " ".join(tools)
    pulls = "; ".join(f'if "$rt" pull {i} >/dev/null; then echo "pulled {i}"; '
                      f'else echo "could not pull {i}"; fi' for i in (q(x) for x in images))
    return (f"# pre-pull the pool's images while the agent starts (prepull_images)\n"
            f"rt=\"\"\nfor c in {find}; do\n"
            f"  if command -v \"$c\" >/dev/null 2>&1; then rt=$c; break; fi\ndone\n"
            f"if [ -n \"$rt\" ]; then\n"
            f"  ( {pulls} ) >>\"$ONEPOOL_AGENT_HOME/prepull.log\" 2>&1 &\n"
            f"else\n"
            f"  echo \"onepool: no container runtime ({find}) to pre-pull images with\" >&2\n"
            f"fi\n")


def user_data(b: Boot) -> str:
    """A cloud-init shell script that installs (if needed) and execs the agent."""
    q = shlex.quote
    pkg = b.agent_package or ""
    pre = prepull(b.prepull_images, b.container_runtime)
    return f"""#!/bin/bash
# onepool node bootstrap: start the onepool agent, which joins the broker as node {b.node_id}.
set -euo pipefail
export ONEPOOL_NODE_ID={q(b.node_id)} ONEPOOL_POOL={q(b.pool)} ONEPOOL_PROVIDER={q(b.provider)}
export ONEPOOL_AGENT_HOME="${{ONEPOOL_AGENT_HOME:-/var/lib/onepool-agent}}"
export ONEPOOL_BOOTED_FROM_USER_DATA=1
if ! command -v onepool >/dev/null 2>&1; then
  if [ -z {q(pkg)} ]; then
    echo "onepool: this image has no onepool command and broker.agent_package is not set" >&2
    exit 1
  fi
  python3 -m venv /opt/onepool
  /opt/onepool/bin/pip install --quiet {q(pkg) if pkg else "''"}
  export PATH=/opt/onepool/bin:$PATH
fi
mkdir -p "$ONEPOOL_AGENT_HOME"
{pre}# the join token goes in the environment, not the command line (which `ps` shows everyone)
export ONEPOOL_JOIN_TOKEN={q(b.join_token)}
exec onepool agent --server {q(b.server_url)} \\
  --state-dir "$ONEPOOL_AGENT_HOME" --gpus {b.gpus} --gpu-type {q(b.gpu_type)} \\
  --metadata {q(b.metadata)}
"""
