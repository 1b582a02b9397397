"""The demo's SIMULATED AWS: moto's server on 127.0.0.1, inside the demo process: an S3
bucket, and EC2 (+ SQS) for the demo's spot pool.

Nothing leaves this machine. The broker and the jobs reach it through the real S3 and EC2
protocols (s3fs/boto3), pointed at it by the standard AWS environment variables, which this
sets for the processes the demo starts: AWS_ENDPOINT_URL_S3 / _EC2 / _SQS and throwaway
credentials.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

from broker.errors import OnepoolError

BUCKET = "onepool-demo"
ENV = {"AWS_ACCESS_KEY_ID": "simulated", "AWS_SECRET_ACCESS_KEY": "simulated",
       "AWS_DEFAULT_REGION": "us-east-1"}


def host_settings() -> dict[str, str]:
    """The demo's jobs get a clean environment (providers.isolation): the simulated S3's
    endpoint and credentials, and this checkout's code, are passed to them by name. The demo
    is a one-person lab: run as root, its jobs run as root too (named explicitly), since they
    use the demo's home and this Python, which another user may not reach."""
    names = [n for n in os.environ.get("ONEPOOL_PASS_ENV", "").split(",") if n]
    out = {"ONEPOOL_PASS_ENV": ",".join(dict.fromkeys([*names, *ENV, "AWS_ENDPOINT_URL_S3", "PYTHONPATH"]))}
    if os.geteuid() == 0 and not os.environ.get("ONEPOOL_RUN_AS"):
        out["ONEPOOL_RUN_AS"] = "root"
    return out


@contextmanager
def simulated_s3() -> Iterator[str]:
    """Start the server, create the bucket, set the environment; yields the endpoint URL.
    Raises OnepoolError if moto is not installed."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError:
        raise OnepoolError("the demo's simulated S3 needs moto: pip install -e '.[dev]' "
                           "(make demo does this)") from None
    import fsspec

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    os.environ.setdefault("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")  # the demo's AMI id is made up
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    endpoints = {f"AWS_ENDPOINT_URL_{svc}": endpoint for svc in ("S3", "EC2", "SQS")}
    host = host_settings()
    saved = {k: os.environ.get(k) for k in [*ENV, *endpoints, *host]}
    os.environ.update({**ENV, **endpoints, **host})
    try:
        fs, _ = fsspec.core.url_to_fs(f"s3://{BUCKET}")
        fs.mkdir(BUCKET)
        yield endpoint
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()
