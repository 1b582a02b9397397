"""The thin client (`pip install onepool`) without namespaces: in a fresh interpreter where the
server parts cannot be imported (each one blocked in sys.modules, as if not installed), the SDK
and the CLI over HTTP load, and a command that needs a home says to install onepool[server].
tests/lab does the same on a laptop whose virtualenv really lacks them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVER = ("sqlalchemy", "sqlmodel", "alembic", "fastapi", "uvicorn", "numpy", "psutil", "fsspec", "argon2",
          "apscheduler")
BLOCK = f"import sys\nfor m in {SERVER!r}:\n    sys.modules[m] = None  # as if not installed\n"


def python(code: str, *args: str, url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEPOOL_")}
    env["PYTHONPATH"] = str(ROOT)
    if url:
        env["ONEPOOL_URL"] = url
    return subprocess.run([sys.executable, "-c", BLOCK + textwrap.dedent(code), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def test_the_sdk_and_cli_over_http_import_no_server_part() -> None:
    r = python("""
        import broker.sdk, broker.client.cli, broker.wire
        c = broker.sdk.Client(server="http://127.0.0.1:9")
        print(type(c).__name__)
        server = ("broker.state", "broker.control", "broker.api")
        loaded = sorted(m for m in sys.modules if m.startswith(server))
        print("server modules:", loaded)
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["HttpClient", "server modules: []"]


@pytest.mark.parametrize("argv", [["status"], ["broker", "--once"], ["apply", "-c", "examples/onepool.yaml"]])
def test_a_command_needing_a_home_says_to_install_the_server_parts(tmp_path: Path, argv: list[str]) -> None:
    r = python("""
        from broker.client.cli import main
        sys.argv = ["onepool", *sys.argv[1:]]
        main()
    """, "--home", str(tmp_path / "home"), *argv)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "pip install 'onepool[server]'" in r.stderr and "Traceback" not in r.stderr, r.stderr
