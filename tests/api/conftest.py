"""An API over a fresh home: two teams, tokens for each role, the app served in-process."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from argon2 import PasswordHasher
from fastapi import FastAPI
from fastapi.testclient import TestClient

from broker.api.app import create_app
from broker.client.sdk import Client
from broker.clock import FakeClock
from broker.spec import parse_config
from broker.state.model_access import ApiToken
from tests.conftest import config

AGENT_POOL = {"name": "onprem", "provider": "agent", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 1}


@dataclass
class Api:
    app: FastAPI
    http: TestClient
    local: Client  # the embedded client of the same home (the server's owner)
    admin: str
    research: str  # a member of team research
    prod: str  # a member of team prod
    clock: FakeClock

    def as_(self, token: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"} if token else {}


@pytest.fixture
def api(tmp_path: Path, clock: FakeClock) -> Iterator[Api]:
    local = Client(tmp_path / "home", clock=clock)
    local.apply(parse_config(config(pools=[
        {"name": "a100", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 1}, AGENT_POOL])))
    admin = local.create_token("research", "admin").token
    research = local.create_token("research").token
    prod = local.create_token("prod").token
    assert admin and research and prod
    app = create_app(local.store, clock)
    with TestClient(app) as http:
        yield Api(app, http, local, admin, research, prod, clock)


def argon2_hash(secret: str) -> str:
    """The hash servers before the fast one stored (their parameters)."""
    return PasswordHasher(time_cost=2, memory_cost=19 * 1024, parallelism=1).hash(secret)


def store_argon2_hash(api: Api, token: str) -> None:
    """Make `token`'s row hold an argon2 hash, as servers before the fast hash wrote it."""
    with api.local.store.session() as s:
        row = s.get(ApiToken, token.split("_")[1])
        assert row is not None
        row.hash = argon2_hash(token)
        s.add(row)
