"""A real Prometheus (Debian's package, installed by infra/test/install-prometheus.sh) in a
temporary folder on 127.0.0.1, scraping the targets a test gives it every second, and its
HTTP query API."""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.agents.harness import wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Target:
    job: str
    address: str  # host:port
    token: str | None = None  # sent as a bearer token (from a credentials file)


@dataclass
class Prometheus:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector of `promql` now (a list of {metric, value})."""
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10)
        r.raise_for_status()
        body = r.json()
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def value(self, promql: str) -> float | None:
        """The one value of `promql` now (None: empty). Fails on more than one series."""
        res = self.query(promql)
        assert len(res) <= 1, f"{promql}: {len(res)} series: {res}"
        return float(res[0]["value"][1]) if res else None

    def wait_value(self, promql: str, expected: float, timeout: float = 30.0) -> None:
        """Until `promql` equals `expected` (a scrape has no event to await: poll)."""
        got: list[float | None] = [None]

        def ok() -> bool:
            got[0] = self.value(promql)
            return got[0] is not None and abs(got[0] - expected) < 1e-6

        wait_for(f"{promql} == {expected} (last: {got[0]}; log {self.log})", ok, timeout=timeout, step=0.25)

    def rules(self) -> list[dict[str, Any]]:
        r = httpx.get(f"{self.url}/api/v1/rules", timeout=10)
        r.raise_for_status()
        return [rule for g in r.json()["data"]["groups"] for rule in g["rules"]]


@contextmanager
def prometheus(tmp: Path, targets: list[Target], rule_files: list[Path]) -> Iterator[Prometheus]:
    """A Prometheus scraping `targets` every second and evaluating `rule_files`; stopped and
    waited for at the end. Skips the test when Debian's prometheus is not installed."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus is missing: infra/test/install-prometheus.sh installs Debian's package")
    tmp.mkdir(parents=True, exist_ok=True)
    jobs = []
    for t in targets:
        job: dict[str, Any] = {"job_name": t.job, "static_configs": [{"targets": [t.address]}]}
        if t.token:
            cred = tmp / f"{t.job}.token"
            cred.write_text(t.token)
            cred.chmod(0o600)
            job["authorization"] = {"credentials_file": str(cred)}
        jobs.append(job)
    cfg = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
           "rule_files": [str(p) for p in rule_files], "scrape_configs": jobs}
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    port = free_port()
    log = tmp / "prometheus.log"
    with open(log, "ab") as f:
        proc = subprocess.Popen([binary, f"--config.file={tmp / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    p = Prometheus(proc, f"http://127.0.0.1:{port}", log)
    try:
        def ready() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"prometheus exited {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                return httpx.get(f"{p.url}/-/ready", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for("prometheus ready", ready, timeout=30, step=0.1)
        yield p
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
