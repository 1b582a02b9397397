"""Property-based run over the OpenAPI schema (schemathesis strategies, driven by hypothesis):
whatever the input, no route answers 500, and every error is the documented JSON shape."""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.api.conftest import Api


def test_no_input_gets_a_500(api: Api) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", api.app)
    ops = [r.ok() for r in schema.get_all_operations()]
    assert len(ops) >= 20
    tried: dict[str, int] = {}
    for op in ops:
        label = op.label

        @given(case=op.as_strategy())
        @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck),
                  database=None)
        def check(case) -> None:  # type: ignore[no-untyped-def]
            for token in (api.admin, api.research):
                r = case.call(headers={"Authorization": f"Bearer {token}"})
                assert r.status_code < 500, (case.method, case.formatted_path, r.text)
                if r.status_code >= 400:
                    err = r.json()["error"]
                    assert err["type"] and err["message"]
                tried[label] = tried.get(label, 0) + 1  # noqa: B023  (run before the next loop)

        check()
    assert len(tried) == len(ops)
