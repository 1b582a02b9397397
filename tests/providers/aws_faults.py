"""EC2 errors at the HTTP layer, under botocore's retry handler: `Ec2Faults` answers the next
calls of an operation with EC2's own error responses (before they are sent), so botocore
parses them and decides to retry exactly as it would for the real service. A faulted request
reaches no one else (moto does not act on it).

`instant_backoff` makes botocore's backoff sleeps (and the adaptive rate limiter's waits)
return at once and records the delays it asked for, so tests of many retries stay fast."""

from __future__ import annotations

import types
from typing import Any

import pytest

ERROR_XML = ('<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>{code}</Code>'
             '<Message>simulated {code}</Message></Error></Errors><RequestID>fake</RequestID></Response>')


class _Raw:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, **_: Any) -> Any:
        yield self.body

    def read(self, *_: Any) -> bytes:
        return self.body


class Ec2Faults:
    """Queued (code, HTTP status) answers for `operation` on one client; counts every HTTP
    attempt of it (answered by the fault or sent on)."""

    def __init__(self, client: Any, operation: str = "RunInstances") -> None:
        self.queue: list[tuple[str, int]] = []
        self.attempts = 0
        self.action = f"Action={operation}".encode()
        # first among the "before-send" handlers: ahead of moto's, which answers every request
        client.meta.events.register_first("before-send", self._send)

    def add(self, code: str, status: int, times: int) -> None:
        self.queue.extend([(code, status)] * times)

    def _send(self, request: Any, **_: Any) -> Any:
        from botocore.awsrequest import AWSResponse

        body = request.body if isinstance(request.body, bytes) else str(request.body or "").encode()
        if self.action not in body:
            return None
        self.attempts += 1
        if not self.queue:
            return None
        code, status = self.queue.pop(0)
        # botocore calls every before-send handler: send the others (moto) nowhere they answer
        request.url = "https://fault.invalid/"
        return AWSResponse(request.url, status, {}, _Raw(ERROR_XML.format(code=code).encode()))


def instant_backoff(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """botocore's retry sleeps return at once; the delays it asked for are returned (live)."""
    import time

    import botocore.endpoint
    import botocore.retries.bucket

    slept: list[float] = []
    monkeypatch.setattr(botocore.endpoint, "time", types.SimpleNamespace(sleep=slept.append, time=time.time))
    monkeypatch.setattr(botocore.retries.bucket.TokenBucket, "_sleep_amount", lambda self, amount: 0)
    return slept
