"""GET/PUT /v1/code/{sha256} (issue 26): a thin client's code snapshots reach the broker's
store through the server: team-scoped, digest checked, size bounded; a sweep from one folder
uploads once; embedded and HTTP submits give the job the same digest and fetch URI."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client.http import HttpClient
from broker.codepack import pack
from broker.errors import SpecError
from broker.spec import parse_config
from broker.state.model import Job
from tests.agents.harness import serve
from tests.api.conftest import Api
from tests.conftest import config

BODY = b"an archive, as far as the route cares"
SHA = hashlib.sha256(BODY).hexdigest()


@pytest.mark.parametrize("who, method, sha, body, params, status", [
    (None, "PUT", SHA, BODY, {}, 401),
    ("research", "PUT", SHA, BODY, {"team": "prod"}, 403),
    ("research", "PUT", SHA, BODY + b"!", {}, 422),  # does not hash to its name
    ("research", "PUT", "A" * 64, BODY, {}, 422),
    ("admin", "PUT", SHA, BODY, {"team": "Bad Team"}, 422),
    ("research", "GET", SHA, b"", {}, 200),
    ("research", "PUT", SHA, BODY, {}, 201),
], ids=["no token", "other team", "digest mismatch", "not a digest", "bad team", "asked", "stored"])
def test_upload_rules(api: Api, who: str | None, method: str, sha: str, body: bytes,
                      params: dict[str, str], status: int) -> None:
    token = {"research": api.research, "admin": api.admin, None: None}[who]
    r = api.http.request(method, f"/v1/code/{sha}", content=body or None, params=params,
                         headers=api.as_(token))
    assert r.status_code == status, r.text
    if status == 422 and body != BODY:
        assert "send it again" in r.text
    stored = api.http.get(f"/v1/code/{SHA}", headers=api.as_(api.research)).json()
    assert stored == {"sha256": SHA, "stored": status == 201}


def test_a_snapshot_is_stored_once_and_is_the_teams_own(api: Api) -> None:
    put = [api.http.put(f"/v1/code/{SHA}", content=BODY, headers=api.as_(api.research)).status_code
           for _ in range(2)]
    assert put == [201, 200]
    assert not api.http.get(f"/v1/code/{SHA}", headers=api.as_(api.prod)).json()["stored"]
    assert api.http.get(f"/v1/code/{SHA}", params={"team": "research"},
                        headers=api.as_(api.admin)).json()["stored"]


def test_the_upload_limit_is_its_own_setting(api: Api) -> None:
    """max_code_upload_bytes, not max_body_bytes (1 MiB), bounds a snapshot's upload."""
    MiB = 1024 * 1024
    api.local.apply(parse_config(config(pools=[{"name": "a100", "gpu_type": "A100", "gpus_per_node": 2,
                                                "nodes": 1}], api={"max_code_upload_bytes": 3 * MiB})))
    api.app.state.ctx.forget_settings()  # re-read the applied limits now
    api.app.state.ctx._read()
    for size, status in ((2 * MiB, 201), (4 * MiB, 413)):
        body = b"x" * size
        r = api.http.put(f"/v1/code/{hashlib.sha256(body).hexdigest()}", content=body,
                         headers=api.as_(api.research))
        assert r.status_code == status, r.text
    assert "max_code_upload_bytes" in r.text
    # chunked (no Content-Length): buffered before the token check, so the small body limit
    chunks = iter([b"x" * MiB, b"x" * MiB])
    r = api.http.put(f"/v1/code/{'c' * 64}", content=chunks, headers=api.as_(api.research))
    assert r.status_code == 413 and "max_body_bytes" in r.text


@pytest.fixture
def server_url(api: Api) -> Iterator[str]:
    srv = serve(api.app)
    yield srv.url
    srv.stop()


def test_a_sweep_from_one_folder_uploads_once_and_both_modes_agree(api: Api, server_url: str,
                                                                   tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text("print('hi')\n")
    c = HttpClient(server_url, api.research)
    jobs = [c.submit({"name": f"s{i}", "command": ["python", "train.py"], "code": str(proj)})
            for i in range(3)]
    assert c.code_uploads == 1
    embedded = api.local.submit({"name": "e", "team": "research", "command": ["true"], "code": str(proj)})
    with api.local.store.session() as s:
        rows = [s.get(Job, j.id) for j in [*jobs, embedded]]
    sha = pack(proj).sha256
    assert {(r.code_sha256, r.code_uri, r.workdir) for r in rows if r} == {
        (sha, f"file://{api.local.store.home}/checkpoints/code/research/{sha}.tar.gz", None)}
    with pytest.raises(SpecError, match="has no snapshot"):
        c.submit({"name": "x", "command": ["true"], "code": "sha256:" + "b" * 64})
    with pytest.raises(SpecError, match="is a folder of the submitter's machine"):
        api.local.__class__(store=api.local.store, principal=_member(api)).submit(
            {"name": "x", "team": "research", "command": ["true"], "code": "."})


def _member(api: Api):  # type: ignore[no-untyped-def]
    from broker.state.tokens import Principal

    return Principal("member", "research", "t1")
