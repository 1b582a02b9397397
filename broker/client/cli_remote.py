"""`onepool server`, `onepool agent`, `onepool token ...`, `onepool node ...`: running onepool
across machines (issue 9). Registered on the main app like the money commands."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from rich.console import Console


def join_token_of(token: str | None, token_file: Path | None) -> str | None:
    """The join token `onepool agent` joins with: from --join-token-file /
    $ONEPOOL_JOIN_TOKEN_FILE (its first line; the form that keeps it out of `ps`), or from
    $ONEPOOL_JOIN_TOKEN or --join-token (the flag is in the agent's command line, which every
    user of the host can read in `ps`). None: neither (a joined agent needs none). Raises
    SpecError for both at once, or a file that cannot be read or is empty."""
    from broker.errors import SpecError

    if token_file is None:
        return token
    if token is not None:
        raise SpecError("agent", ["give the join token once: --join-token-file or "
                                  "--join-token / ONEPOOL_JOIN_TOKEN, not both"])
    try:
        lines = token_file.read_text().strip().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError("agent", [f"--join-token-file: cannot read {token_file}: {e}"]) from None
    if not lines or not lines[0].strip():
        raise SpecError("agent", [f"--join-token-file: {token_file} is empty (put the token from "
                                  "`onepool node join-token NODE` in it)"])
    return lines[0].strip()


LogFormat = Annotated[str, typer.Option("--log-format", envvar="ONEPOOL_LOG_FORMAT", metavar="FORMAT",
                                        help="text | json (one object a line, with job, attempt "
                                        "and node where they apply)")]


def register(app: typer.Typer, client: Callable[[], Any], embedded: Callable[[], Any],
             console: Callable[[], Console], print_json: Callable[[Any], None]) -> None:
    token_app = typer.Typer(no_args_is_help=True, help="API tokens: who may act, for which team.")
    node_app = typer.Typer(no_args_is_help=True, help="Nodes and the agents that serve them.")
    app.add_typer(token_app, name="token")
    app.add_typer(node_app, name="node")

    @app.command()
    def server(
        host: Annotated[str, typer.Option(metavar="HOST", help="address to listen on")] = "127.0.0.1",
        port: Annotated[int, typer.Option(metavar="PORT", help="port to listen on (1-65535)", min=1,
                                             max=65535)] = 8421,
        config: Annotated[Path | None, typer.Option("-c", "--config", metavar="FILE",
                                                    help="apply this onepool.yaml first")] = None,
        no_broker: Annotated[bool, typer.Option("--no-broker", help="serve the API only (another "
                                                "process runs the broker loop)")] = False,
        log_format: LogFormat = "text",
    ) -> None:
        """Serve the HTTP API (/v1, tokens) and run the broker loop beside it. Its local pools'
        ranks run as ONEPOOL_RUN_AS and get ONEPOOL_PASS_ENV (see providers.isolation)."""
        from broker.api.server import serve
        from broker.observe.logs import setup
        from providers.isolation import Isolation

        Isolation.for_host("server settings (ONEPOOL_RUN_AS, ONEPOOL_PASS_ENV)")

        setup(log_format)
        c = embedded()
        if config is not None:
            c.apply(config)
        console().print(f"onepool server: http://{host}:{port}/v1 (OpenAPI at /docs), home {c.store.home}",
                  markup=False)
        serve(c.store, host, port, broker=not no_broker)

    @app.command()
    def agent(
        server: Annotated[str, typer.Option("--server", envvar="ONEPOOL_SERVER", metavar="URL[,URL]",
                                            help="the server's URL (or URL1,URL2: standbys)")],
        join_token_file: Annotated[Path | None, typer.Option(
            "--join-token-file", envvar="ONEPOOL_JOIN_TOKEN_FILE", metavar="FILE",
            help="a file holding the one-time token from `onepool node join-token NODE` (not "
                 "needed once joined); or set ONEPOOL_JOIN_TOKEN")] = None,
        join_token: Annotated[str | None, typer.Option(
            "--join-token", envvar="ONEPOOL_JOIN_TOKEN", metavar="TOKEN",
            help="the one-time token itself: visible to every user of this host in `ps` until "
                 "it is used; prefer --join-token-file or ONEPOOL_JOIN_TOKEN")] = None,
        gpus: Annotated[int | None, typer.Option(
            metavar="N", help="GPUs to offer (default: nvidia-smi's count)", min=1, max=64)] = None,
        gpu_type: Annotated[str | None, typer.Option("--gpu-type", metavar="TYPE", help="GPU type to report "
                                                     "(default: nvidia-smi's name)")] = None,
        state_dir: Annotated[Path, typer.Option("--state-dir", envvar="ONEPOOL_AGENT_HOME", metavar="DIR",
                                                help="where the agent keeps its credential and "
                                                "its ranks' folders")] = Path.home() / ".onepool-agent",
        metadata: Annotated[str, typer.Option(metavar="SERVICE", help="cloud metadata service to watch for "
                                              "interruption notices: aws|gcp|none")] = "none",
        metadata_url: Annotated[str | None, typer.Option(
            "--metadata-url", envvar="ONEPOOL_METADATA_URL", metavar="URL",
            help="the metadata service's base URL (default: the cloud's)")] = None,
        run_as: Annotated[str | None, typer.Option(
            "--run-as", envvar="ONEPOOL_RUN_AS", metavar="USER",
            help="user of ranks when root (default nobody), or TEAM=USER,...,*=USER")] = None,
        pass_env: Annotated[str, typer.Option(
            "--pass-env", envvar="ONEPOOL_PASS_ENV", metavar="NAMES",
            help="this host's environment variables every rank also gets, comma-separated (e.g. "
            "a store's endpoint); ranks get nothing else of it")] = "",
        jobs_dir: Annotated[Path | None, typer.Option(
            "--jobs-dir", envvar="ONEPOOL_JOBS_DIR", metavar="DIR",
            help="the folders of ranks that run as another user (default: /var/lib/onepool-jobs)")] = None,
        metrics_port: Annotated[int | None, typer.Option(
            "--metrics-port", metavar="PORT", min=1, max=65535,
            help="serve this node's Prometheus metrics at http://HOST:PORT/metrics (default: off)")] = None,
        metrics_host: Annotated[str, typer.Option(
            "--metrics-host", metavar="HOST", help="address of the metrics listener")] = "127.0.0.1",
        log_format: LogFormat = "text",
    ) -> None:
        """Run the node agent: join the server, then run the ranks placed on this node."""
        from broker.agent.agent import main as agent_main
        from broker.agent.hardware import detect
        from broker.agent.metadata import watcher
        from broker.errors import SpecError
        from broker.failover import split_urls
        from broker.observe.logs import setup

        setup(log_format)
        logging.getLogger("httpx").setLevel(logging.WARNING)
        token = join_token_of(join_token, join_token_file)
        from broker.spec_types import parse_pass_env
        from providers.isolation import Isolation

        try:
            found = detect(gpus, gpu_type)
            w = watcher(metadata, metadata_url)
            names = parse_pass_env(pass_env)
            split_urls(server)
        except ValueError as e:
            raise SpecError("agent", [str(e)]) from None
        iso = Isolation.for_host("agent", run_as=run_as, pass_env=names, jobs_dir=jobs_dir)
        metrics = (metrics_host, metrics_port) if metrics_port is not None else None
        sys.exit(agent_main(server, token, state_dir, found, w, iso, metrics))

    @token_app.command("create")
    def token_create(
        team: Annotated[str, typer.Option(help="the team the token acts for")],
        role: Annotated[str, typer.Option(help="member (its team; changes its own jobs) | lead (its "
                                          "team's jobs) | admin (everything) | metrics (GET "
                                          "/metrics only)")] = "member",
        note: Annotated[str, typer.Option(help="what the token is for")] = "",
        user: Annotated[str | None, typer.Option(help="the person it belongs to (none: the whole "
                                                 "team)")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    ) -> None:
        """Create a token and print it (shown this once; it is stored hashed)."""
        info = client().create_token(team, role, note, user)
        if as_json:
            print_json({"token": info.token, "id": info.id, "team": info.team, "role": info.role,
                        "user": info.user})
        else:
            whose = f"{info.user}, " if info.user else ""
            console().print(f"token {info.id} ({whose}{info.role} of team {info.team}); keep it secret, "
                      f"it is not shown again:\n{info.token}", markup=False)

    @token_app.command("revoke")
    def token_revoke(token_id: Annotated[str, typer.Argument(help="the token's id")],
                     as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False) -> None:
        """Revoke a token: every later request with it is refused."""
        info = client().revoke_token(token_id)
        if as_json:
            print_json(info.model_dump())
        else:
            console().print(f"token {info.id} of team {info.team} revoked", markup=False)

    @token_app.command("list")
    def token_list(as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False) -> None:
        """Every token (never their secrets)."""
        rows = client().tokens()
        if as_json:
            print_json([r.model_dump() for r in rows])
            return
        t = Table(title="tokens")
        for col in ("id", "team", "user", "role", "note", "created by", "revoked"):
            t.add_column(col)
        for r in rows:
            t.add_row(r.id, r.team, escape(r.user or ""), r.role, escape(r.note), escape(r.created_by),
                      "yes" if r.revoked_at else "")
        console().print(t)

    @node_app.command("join-token")
    def node_join_token(
        node: Annotated[str, typer.Argument(help="a node of a pool with provider: agent")],
        ttl_s: Annotated[float, typer.Option("--ttl-s", help="seconds it stays valid")] = 3600.0,
        as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    ) -> None:
        """A one-time token for `onepool agent --join-token-file` on that node's host."""
        info = client().join_token(node, ttl_s)
        if as_json:
            print_json(info.model_dump())
        else:
            server = os.environ.get("ONEPOOL_URL", "http://SERVER:8421")
            console().print(f"on the host of node {info.node} (pool {info.pool}), within {ttl_s:g}s, put "
                            f"this token in a file only the agent's user reads:\n{info.join_token}\n"
                            f"then: onepool agent --server {server} --join-token-file FILE",
                            markup=False)

    @node_app.command("list")
    def node_list(pool: Annotated[str | None, typer.Option(help="only this pool")] = None,
                  as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False) -> None:
        """Nodes, their free GPUs and their agents."""
        rows = client().nodes(pool)
        if as_json:
            print_json([r.model_dump() for r in rows])
            return
        t = Table(title="nodes")
        for col in ("node", "pool", "GPU", "market", "state", "GPUs", "free", "runs on",
                    "agent seen s ago", "host"):
            t.add_column(col)
        for r in rows:
            seen = "" if r.agent_seen_s_ago is None else f"{r.agent_seen_s_ago:.0f}"
            t.add_row(r.id, r.pool, r.gpu_type, r.market, r.state, str(r.gpus), str(r.free_gpus),
                      r.executor, seen, escape(str(r.agent.get("hostname", ""))))
        console().print(t)
