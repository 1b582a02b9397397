"""`onepool dashboard`: over ONEPOOL_URL it opens no home (it failed with "no attribute
'store'") and points the app at the server; off loopback it keeps its own ONEPOOL_TOKEN from
the page (every viewer logs in) unless --share-token. Streamlit itself is not started here:
the command's child is captured (tests/dashboard/test_browser_e2e.py starts it for real)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from broker.client import cli_money
from broker.client.cli import app

URL = "http://onepool.lab:8080"


@pytest.mark.parametrize(("url", "address", "share", "token_seen"), [
    (URL, "127.0.0.1", False, "tok"),  # the user's own machine: their token
    (URL, "0.0.0.0", False, None),  # a page others reach: each viewer logs in
    (URL, "0.0.0.0", True, "tok"),  # ... unless the token is shared on purpose
    (None, "127.0.0.1", False, "tok"),  # embedded: the app ignores it on loopback (local user)
    (None, "0.0.0.0", False, None),
])
def test_the_dashboard_command_points_the_app_at_its_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          url: str | None, address: str, share: bool,
                                                          token_seen: str | None) -> None:
    ran: list[tuple[list[str], dict[str, str]]] = []

    def fake_run(cmd: list[str], env: dict[str, str], grace_s: float = 0.0) -> int:
        ran.append((cmd, env))
        return 0

    monkeypatch.setattr(cli_money, "run_forwarding_signals", fake_run)
    monkeypatch.setenv("ONEPOOL_TOKEN", "tok")
    if url:
        monkeypatch.setenv("ONEPOOL_URL", url)
    else:
        monkeypatch.delenv("ONEPOOL_URL", raising=False)
    home = tmp_path / "home"
    args: list[Any] = ["--home", str(home), "dashboard", "--address", address]
    args += ["--share-token"] if share else []
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    [(cmd, env)] = ran
    source = cmd[cmd.index("--") + 1:]
    assert source == (["--url", URL] if url else ["--home", str(home.absolute())])
    assert cmd[cmd.index("--server.address") + 1] == address
    assert env.get("ONEPOOL_TOKEN") == token_seen
    assert not (url and home.exists())  # over the API, no home is opened or made
    assert (f"the server {URL}" if url else str(home.absolute())) in r.output
