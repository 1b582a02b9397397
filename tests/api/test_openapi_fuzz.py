"""The OpenAPI document is complete and valid, and a property-based run over it
(schemathesis strategies, driven by hypothesis) finds no input that gets a 500 on any route,
the agents' protocol included; every error is the documented JSON shape."""

from __future__ import annotations

from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from openapi_spec_validator import validate

from tests.api.conftest import Api


def refs_in(node: Any) -> set[str]:
    """Every `$ref` value anywhere in `node`."""
    if isinstance(node, dict):
        own = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        return own.union(*(refs_in(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(refs_in(v) for v in node))
    return set()


def test_the_openapi_document_is_valid_and_every_ref_resolves(api: Api) -> None:
    doc = api.http.get("/openapi.json").json()
    validate(doc)
    defined = {f"#/components/schemas/{name}" for name in doc["components"]["schemas"]}
    refs = refs_in(doc)
    assert refs and refs <= defined, sorted(refs - defined)
    body = doc["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["properties"]["priority"]["enum"] == ["urgent", "high", "normal", "low"]
    assert body["properties"]["spot"]["enum"] == ["never", "allowed", "only"]


def test_no_input_gets_a_500(api: Api) -> None:
    join = api.local.join_token("onprem-0").join_token
    credential = api.http.post("/v1/agent/join", json={"join_token": join}).json()["credential"]
    schema = schemathesis.openapi.from_asgi("/openapi.json", api.app)
    ops = [r.ok() for r in schema.get_all_operations()]
    assert len(ops) >= 20
    assert sum(op.path.startswith("/v1/agent/") for op in ops) == 4
    tried: dict[str, int] = {}
    for op in ops:
        label = op.label
        # an agent route is fuzzed with the node's credential (and an API token, refused);
        # every other route with an admin's and a member's token
        tokens = (credential, api.research) if op.path.startswith("/v1/agent/") else (api.admin, api.research)

        @given(case=op.as_strategy())
        @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck),
                  database=None)
        def check(case) -> None:  # type: ignore[no-untyped-def]
            if isinstance(case.body, dict) and "wait_s" in case.body:
                case.body["wait_s"] = 0  # a long poll holds the answer: keep the run short
            for token in tokens:  # noqa: B023  (run before the next loop)
                r = case.call(headers={"Authorization": f"Bearer {token}"})
                assert r.status_code < 500, (case.method, case.formatted_path, r.text)
                if r.status_code >= 400:
                    err = r.json()["error"]
                    assert err["type"] and err["message"]
                tried[label] = tried.get(label, 0) + 1  # noqa: B023

        check()
    assert len(tried) == len(ops)
