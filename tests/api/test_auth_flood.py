"""Authentication that costs nothing to abuse (issue 24, part 3) and the body limit (part 6):
every failed token costs one fast hash at most (never argon2), an address that keeps failing
gets 429 before its body is read or its token checked, a body over the limit gets 413 before
the token check, old argon2 tokens still work (once slowly, then upgraded), and agent routes
are served while the user routes' threads are all taken.

The guard's tests drive the real app through raw ASGI calls, so they see exactly how much of
a body the server pulled and which client address it saw."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread
import pytest
from fastapi import FastAPI
from sqlmodel import select

from broker.api import context
from broker.api.app import create_app
from broker.api.context import ApiContext
from broker.api.guard import FailureLimiter
from broker.client.http import HttpClient
from broker.clock import FakeClock
from broker.errors import SpecError, TooLarge, TooManyRequests, Unauthorized
from broker.spec import parse_config
from broker.spec_broker import ApiSettings
from broker.state.model_access import ApiToken, NodeAgent
from broker.state.token_hash import Hasher, check_argon2, check_fast
from tests.agents.harness import serve
from tests.api.conftest import AGENT_POOL, Api, argon2_hash, store_argon2_hash
from tests.conftest import config

JOB = {"name": "j", "command": ["true"], "gpus_per_node": 1}
POOLS = [{"name": "a100", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 1}, AGENT_POOL]
LIMITS = {"auth_failure_burst": 2, "auth_failures_per_s": 0.5, "max_body_bytes": 65536,
          "max_log_upload_bytes": 1024 * 1024}


@dataclass
class Calls:
    fast: list[str] = field(default_factory=list)
    slow: list[str] = field(default_factory=list)


def count_hashes(app: FastAPI) -> Calls:
    """Count the server's hash checks through the Hasher's seams (the real checks still run)."""
    calls, verifier = Calls(), app.state.ctx.verifier

    def fast(stored: str, token: str) -> bool:
        calls.fast.append(token)
        return check_fast(stored, token)

    def slow(stored: str, token: str) -> bool:
        calls.slow.append(token)
        return check_argon2(stored, token)

    verifier.hasher = Hasher(verifier.hasher.budget, fast=fast, slow=slow)
    return calls


def tid(token: str) -> str:
    return token.split("_")[1]


# -- every failure costs the same: one primary-key read and at most one fast hash ------------------
def _revoked(api: Api) -> str:
    api.local.revoke_token(tid(api.prod))
    return api.prod


# (case, the token sent, status, words of the answer, fast hash checks)
OUTCOMES: list[tuple[str, Callable[[Api], str | None], int, str, int]] = [
    ("unknown id", lambda a: "op_000000000000_" + "x" * 43, 401, "not known", 0),
    ("known id, wrong secret", lambda a: f"op_{tid(a.research)}_" + "x" * 43, 401, "not known", 1),
    ("revoked", _revoked, 401, "was revoked", 1),
    ("malformed", lambda a: "op_zz_short", 401, "not an API token", 0),
    ("missing", lambda a: None, 401, "needs a token", 0),
    ("valid", lambda a: a.research, 200, "jobs", 1),
]


@pytest.mark.parametrize(("case", "token", "status", "words", "fast"), OUTCOMES, ids=[o[0] for o in OUTCOMES])
def test_no_outcome_runs_argon2_and_each_costs_at_most_one_fast_hash(
        api: Api, case: str, token: Callable[[Api], str | None], status: int, words: str, fast: int):
    sent = token(api)
    calls = count_hashes(api.app)
    r = api.http.get("/v1/jobs", headers=api.as_(sent))
    assert r.status_code == status and words in r.text, (case, r.text)
    assert calls.slow == [] and len(calls.fast) == fast, case


def test_an_old_argon2_token_is_accepted_once_slowly_then_upgraded(api: Api):
    store_argon2_hash(api, api.research)
    calls = count_hashes(api.app)
    for _ in range(3):
        assert api.http.get("/v1/jobs", headers=api.as_(api.research)).status_code == 200
    assert len(calls.slow) == 1 and len(calls.fast) == 2  # argon2 once; the fast hash after
    with api.local.store.session() as s:
        row = s.get(ApiToken, tid(api.research))
        assert row is not None and row.hash.startswith("hmac-sha256$")


def test_wrong_secrets_against_an_old_hash_run_argon2_a_bounded_number_of_times(api: Api):
    """Until its first use, a row written before the fast hash costs argon2 per check: a
    process-wide budget (8 at once, 4 a second) bounds what a flood against its id costs."""
    store_argon2_hash(api, api.research)
    calls = count_hashes(api.app)
    bad = f"op_{tid(api.research)}_" + "y" * 43
    answers = [api.http.get("/v1/jobs", headers=api.as_(bad)) for _ in range(11)]
    assert [r.status_code for r in answers] == [401] * 8 + [429] * 3
    assert answers[-1].headers["retry-after"] == "1" and "retry in 1 s" in answers[-1].text
    assert len(calls.slow) == 8
    api.clock.advance(1.0)
    assert api.http.get("/v1/jobs", headers=api.as_(api.research)).status_code == 200


def test_an_old_argon2_node_credential_is_upgraded_on_its_first_sync(api: Api):
    credential = join_agent(api)
    with api.local.store.session() as s:
        row = s.exec(select(NodeAgent).where(NodeAgent.credential_id == tid(credential))).one()
        row.credential_hash = argon2_hash(credential)
        s.add(row)
    calls = count_hashes(api.app)
    for _ in range(2):
        r = api.http.post("/v1/agent/sync", json={}, headers=api.as_(credential))
        assert r.status_code == 200, r.text
    assert len(calls.slow) == 1
    with api.local.store.session() as s:
        row = s.exec(select(NodeAgent).where(NodeAgent.credential_id == tid(credential))).one()
        assert (row.credential_hash or "").startswith("hmac-sha256$")


def join_agent(api: Api, node: str = "onprem-0") -> str:
    """Join the agent pool's node over the API; its node credential."""
    join = api.local.join_token(node).join_token
    r = api.http.post("/v1/agent/join", json={"join_token": join, "info": {}})
    assert r.status_code == 200, r.text
    return str(r.json()["credential"])


# -- the guard, driven through raw ASGI calls ------------------------------------------------------
@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    pulled: int  # body messages the server asked for


def call(app: FastAPI, method: str, path: str, *, token: str | None = None, client: str = "10.0.0.9",
         length: int | None = None, parts: list[bytes] | None = None, chunked: bool = False) -> Answer:
    """One request to `app` from `client`: a body of `parts` (sent as the server asks for
    them), declared as `length` bytes (Content-Length) or chunked."""
    headers = [(b"host", b"onepool.test")]
    if token:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    if length is not None:
        headers += [(b"content-length", str(length).encode()), (b"content-type", b"application/json")]
    if chunked:
        headers += [(b"transfer-encoding", b"chunked"), (b"content-type", b"application/json")]
    body, pulled, sent = list(parts or []), 0, []

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        if pulled < max(1, len(body)):
            pulled += 1
            chunk = body[pulled - 1] if body else b""
            return {"type": "http.request", "body": chunk, "more_body": pulled < len(body)}
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": headers, "client": (client, 40000),
             "server": ("onepool.test", 80)}
    asyncio.run(app(scope, receive, send))  # type: ignore[arg-type]
    start = next(m for m in sent if m["type"] == "http.response.start")
    return Answer(start["status"], {k.decode(): v.decode() for k, v in start["headers"]},
                  b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"),
                  pulled if body else 0)


@pytest.fixture
def guarded(api: Api) -> Iterator[FastAPI]:
    """An app over `api`'s home with small limits (LIMITS) in its applied config."""
    api.local.apply(parse_config(config(pools=POOLS, api=LIMITS)))
    yield create_app(api.local.store, api.clock)


MiB = 1024 * 1024
JOB_BODY = b'{"name": "j", "command": ["true"], "gpus_per_node": 1}'
LOG_PIECE = b'{"assignment_id": 1, "offset": 0, "data_b64": "' + b"A" * 200_000 + b'"}'


def test_an_address_that_keeps_failing_gets_429_before_its_body_is_read(api: Api, guarded: FastAPI):
    bad = "op_000000000000_" + "x" * 43
    assert [call(guarded, "GET", "/v1/jobs", token=bad).status for _ in range(2)] == [401, 401]
    huge = call(guarded, "POST", "/v1/jobs", token=api.research, length=50 * MiB, parts=[b" " * MiB] * 50)
    assert huge.status == 429 and huge.pulled == 0
    assert huge.headers["retry-after"] == "2" and huge.headers["connection"] == "close"
    assert b"auth_failure_burst" in huge.body and b"TooManyRequests" in huge.body
    # Its good token is refused too (the address is throttled, not the token)...
    assert call(guarded, "GET", "/v1/jobs", token=api.research).status == 429
    # ... while other addresses are served, and their failures are their own.
    assert call(guarded, "GET", "/v1/jobs", token=api.research, client="10.0.0.10").status == 200
    assert call(guarded, "GET", "/v1/jobs", token=bad, client="10.0.0.10").status == 401
    api.clock.advance(2.0)  # one failure refilled: served again
    assert call(guarded, "GET", "/v1/jobs", token=api.research).status == 200


def test_credentials_that_passed_are_still_served_from_a_throttled_address(api: Api, guarded: FastAPI):
    """A NAT, a proxy or a hostile job on an agent's node shares its address with the flood:
    the credentials seen passing keep being served; others from there wait."""
    credential = join_agent(api)
    assert call(guarded, "GET", "/v1/jobs", token=api.research).status == 200
    posted = call(guarded, "POST", "/v1/jobs", token=api.prod, length=len(JOB_BODY), parts=[JOB_BODY])
    assert posted.status == 201
    assert call(guarded, "POST", "/v1/agent/sync", token=credential, length=2, parts=[b"{}"]).status == 200
    bad = "op_000000000000_" + "x" * 43
    assert [call(guarded, "GET", "/v1/jobs", token=bad).status for _ in range(3)] == [401, 401, 429]
    assert call(guarded, "GET", "/v1/jobs", token=api.research).status == 200
    assert call(guarded, "GET", "/v1/jobs", token=api.prod).status == 200
    assert call(guarded, "POST", "/v1/agent/sync", token=credential, length=2, parts=[b"{}"]).status == 200
    assert call(guarded, "GET", "/v1/jobs", token=api.admin).status == 429  # never seen passing
    api.local.revoke_token(tid(api.research))  # still checked in full: revoked, then forgotten
    assert [call(guarded, "GET", "/v1/jobs", token=api.research).status for _ in range(2)] == [401, 429]


def test_a_throttled_address_costs_no_token_check(api: Api, guarded: FastAPI):
    calls = count_hashes(guarded)
    bad = f"op_{tid(api.research)}_" + "x" * 43
    statuses = [call(guarded, "GET", "/v1/jobs", token=bad).status for _ in range(10)]
    assert statuses == [401, 401] + [429] * 8 and len(calls.fast) == 2 and calls.slow == []


# (case, path, Content-Length, body parts (chunked when no length), status, setting named, parts pulled)
BODIES: list[tuple[str, str, int | None, list[bytes], int, str, int]] = [
    ("declared too large", "/v1/jobs", 50 * MiB, [b" " * MiB] * 50, 413, "max_body_bytes", 0),
    ("chunked, too large", "/v1/jobs", None, [b" " * 40_000] * 3, 413, "max_body_bytes", 2),
    ("chunked, fits: reaches the token check", "/v1/jobs", None, [b'{"name": ', b'"j"}'], 401, "", 2),
    ("a log upload has its own limit", "/v1/agent/logs", len(LOG_PIECE), [LOG_PIECE], 401, "", 1),
    ("a log upload over it", "/v1/agent/logs", 2 * MiB, [b" " * MiB] * 2, 413, "max_log_upload_bytes", 0),
]


@pytest.mark.parametrize(("case", "path", "length", "parts", "status", "setting", "pulled"), BODIES,
                         ids=[b[0] for b in BODIES])
def test_a_body_over_the_limit_is_413_before_authentication(
        guarded: FastAPI, case: str, path: str, length: int | None, parts: list[bytes], status: int,
        setting: str, pulled: int):
    got = call(guarded, "POST", path, length=length, parts=parts, chunked=length is None)
    assert got.status == status, (case, got.body)
    assert got.pulled == pulled, case
    if status == 413:
        limit = LIMITS[setting]
        assert f"larger than {limit} bytes".encode() in got.body
        assert f"broker.api.{setting}".encode() in got.body


def test_a_chunked_submit_under_the_limit_is_served(api: Api, guarded: FastAPI):
    got = call(guarded, "POST", "/v1/jobs", token=api.research, chunked=True,
               parts=[b'{"name": "j", "command": ["true"], ', b'"gpus_per_node": 1}'])
    assert got.status == 201, got.body


def test_413_and_429_answers_do_not_count_as_failures(api: Api, guarded: FastAPI):
    for _ in range(5):
        assert call(guarded, "POST", "/v1/jobs", length=50 * MiB).status == 413
    assert call(guarded, "GET", "/v1/jobs", token=api.research).status == 200


def test_limits_applied_later_are_read_without_a_restart(api: Api, guarded: FastAPI, monkeypatch):
    monkeypatch.setattr(context, "SETTINGS_TTL_S", 0.0)  # stale at once: every look starts a read
    api.local.apply(parse_config(config(pools=POOLS, api={**LIMITS, "max_body_bytes": 8192,
                                                          "agent_threads": 3})))
    c: ApiContext = guarded.state.ctx

    async def look_twice() -> ApiSettings:
        c.limits()  # starts a read in a worker thread
        assert c.refreshed is not None
        await c.refreshed
        return c.limits()

    assert asyncio.run(look_twice()).max_body_bytes == 8192
    assert c.agent_limiter.total_tokens == 3
    got = call(guarded, "POST", "/v1/jobs", length=10_000, parts=[b" " * 10_000])
    assert got.status == 413 and b"larger than 8192 bytes" in got.body


@pytest.mark.parametrize(("api_settings", "problem"), [
    ({"max_body_bytes": 10}, "api.max_body_bytes"),
    ({"auth_failures_per_s": 0}, "api.auth_failures_per_s"),
    ({"agent_threads": 0}, "api.agent_threads"),
    ({"bogus": 1}, "api.bogus"),
])
def test_bad_api_settings_name_the_field(api_settings: dict, problem: str):
    with pytest.raises(SpecError) as e:
        parse_config(config(api=api_settings))
    assert any(problem in p for p in e.value.problems), e.value.problems


# -- agents keep their own threads --------------------------------------------------------------
def test_agent_routes_are_served_while_every_user_thread_is_taken(api: Api):
    """All of the user routes' threads are held (as a flood of slow user requests would hold
    them): a user request waits, an agent's sync is answered."""
    credential = join_agent(api)
    portal = api.http.portal
    assert portal is not None
    holders: list[object] = []

    async def take_all() -> None:
        limiter = anyio.to_thread.current_default_thread_limiter()
        while limiter.available_tokens:
            holders.append(object())
            await limiter.acquire_on_behalf_of(holders[-1])

    async def give_back() -> None:
        limiter = anyio.to_thread.current_default_thread_limiter()
        for h in holders:
            limiter.release_on_behalf_of(h)

    def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
        out: list[Any] = []
        t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
        t.start()
        return t, out

    portal.call(take_all)
    try:
        user, _ = in_thread(lambda: api.http.get("/v1/jobs", headers=api.as_(api.research)))
        agent, got = in_thread(lambda: api.http.post("/v1/agent/sync", json={},
                                                     headers=api.as_(credential)))
        agent.join(timeout=20)
        assert got and got[0].status_code == 200, "the agent's sync waited for a user thread"
        assert user.is_alive(), "the user routes' threads were not all taken: the test proves nothing"
    finally:
        portal.call(give_back)
    user.join(timeout=20)
    assert not user.is_alive()


# (case, failures counted at once, seconds later, retry-after then: None = served)
BUCKETS: list[tuple[str, int, float, int | None]] = [
    ("within the burst", 1, 0.0, None),
    ("the burst spent", 2, 0.0, 2),
    ("refilled by time", 2, 2.0, None),
    ("in-flight failures are owed", 4, 0.0, 6),  # level -2: 3 failures' worth at 0.5/s
    ("the debt is capped at one burst", 40, 0.0, 6),
    ("the debt is paid back by time", 4, 5.0, 1),
]


@pytest.mark.parametrize(("case", "failures", "later", "wait"), BUCKETS, ids=[b[0] for b in BUCKETS])
def test_the_failure_bucket_of_an_address(case: str, failures: int, later: float, wait: int | None):
    clock, limits = FakeClock(), ApiSettings(**LIMITS)
    limiter = FailureLimiter(clock)
    for _ in range(failures):
        limiter.failed("10.0.0.9", limits)
    clock.advance(later)
    assert limiter.retry_after("10.0.0.9", limits) == wait, case
    assert limiter.retry_after("10.0.0.10", limits) is None


def test_the_least_recently_failed_address_is_forgotten_first():
    clock, limits = FakeClock(), ApiSettings(**LIMITS)
    limiter = FailureLimiter(clock, max_sources=2)
    for source in ("10.0.0.1", "10.0.0.2", "10.0.0.3"):
        for _ in range(2):
            limiter.failed(source, limits)
    assert [limiter.retry_after(s, limits) for s in ("10.0.0.1", "10.0.0.2", "10.0.0.3")] == [None, 2, 2]


# -- over real HTTP, through the SDK ---------------------------------------------------------------
def test_the_sdk_over_http_raises_too_large_and_too_many_requests(api: Api, guarded: FastAPI):
    srv = serve(guarded)
    try:
        with HttpClient(srv.url, api.research) as sdk:
            with pytest.raises(TooLarge, match=r"larger than 65536 bytes.*broker\.api\.max_body_bytes"):
                sdk.submit({**JOB, "team": "research", "command": ["echo", "x" * 100_000]})
            assert sdk.submit({**JOB, "team": "research"}).status == "PENDING"  # a new connection
        with HttpClient(srv.url, f"op_{tid(api.research)}_" + "x" * 43) as bad:
            for _ in range(2):
                with pytest.raises(Unauthorized):
                    bad.list()
            with pytest.raises(TooManyRequests, match="too many failed authentications") as e:
                bad.list()
            assert e.value.retry_after_s == 2
    finally:
        srv.stop()
