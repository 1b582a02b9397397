"""Code snapshots (issue 26): what a pack holds (git-aware, .onepoolignore), that it is
deterministic, its size limit's message, hostile archives refused, the spec's `code` values."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from broker.codepack import BadArchive, EmptySnapshot, SnapshotTooLarge, file_list, pack, unpack
from broker.errors import SpecError
from broker.spec import parse_job
from broker.spec_code import parse_code

HEX = "a" * 64


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def _git(root: Path, *tracked: str) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run(["git", "init", "-q", str(root)], check=True, env=env)
    subprocess.run(["git", "-C", str(root), "add", *tracked], check=True, env=env)
    subprocess.run(["git", "-C", str(root), "commit", "-qm", "x"], check=True, env=env)


FILES = {"train.py": "print(1)\n", "lib/model.py": "M = 1\n", "data/big.bin": "x" * 100,
         "notes.txt": "n\n", "out/run.log": "log\n", "scratch.tmp": "t\n"}


@pytest.mark.parametrize("git, gitignore, onepoolignore, expected", [
    (False, "", "", sorted(FILES)),
    (False, "", "data/\n*.tmp\n", ["lib/model.py", "notes.txt", "out/run.log", "train.py"]),
    (True, "out/\n", "", ["data/big.bin", "lib/model.py", "notes.txt", "scratch.tmp", "train.py"]),
    (True, "out/\n", "data/\n!notes.txt\nnotes.txt\n", ["lib/model.py", "scratch.tmp", "train.py"]),
    (True, "*.tmp\nout/\n", "*.txt\n", ["data/big.bin", "lib/model.py", "train.py"]),
], ids=["plain", "plain+onepoolignore", "git: untracked kept, ignored out", "git+onepoolignore",
        "git: ignore both ways"])
def test_what_a_pack_holds(tmp_path: Path, git: bool, gitignore: str, onepoolignore: str,
                           expected: list[str]) -> None:
    root = _tree(tmp_path / "proj", FILES)
    if gitignore:
        (root / ".gitignore").write_text(gitignore)
    if onepoolignore:
        (root / ".onepoolignore").write_text(onepoolignore)
    if git:
        _git(root, "train.py", "lib/model.py")  # the rest untracked
    got = [n for n in file_list(root) if n not in (".gitignore", ".onepoolignore")]
    assert got == expected
    assert not any(n.startswith(".git/") for n in file_list(root))


def test_links_inside_are_kept_and_links_out_are_left_out(tmp_path: Path) -> None:
    root = _tree(tmp_path / "proj", {"a/x.py": "x"})
    (root / "inside.py").symlink_to("a/x.py")
    (root / "outside").symlink_to("/etc/passwd")
    (root / "up").symlink_to("../proj2")
    assert file_list(root) == ["a/x.py", "inside.py"]
    dest = tmp_path / "out"
    dest.mkdir()
    unpack(pack(root).data, dest)
    assert (dest / "inside.py").is_symlink() and (dest / "inside.py").read_text() == "x"


def test_a_pack_is_deterministic_across_times_modes_and_machines(tmp_path: Path) -> None:
    a = _tree(tmp_path / "a", FILES)
    first = pack(a)
    b = _tree(tmp_path / "b", dict(reversed(FILES.items())))  # written in another order, later
    for p in b.rglob("*"):
        os.utime(p, (1e9, 1e9))
    os.chmod(b / "notes.txt", 0o600)  # not executable either way: same mode packed
    assert pack(b).sha256 == first.sha256 == pack(a).sha256
    (b / "train.py").chmod(0o755)  # the executable bit is content
    assert pack(b).sha256 != first.sha256
    with tarfile.open(fileobj=io.BytesIO(first.data)) as t:
        ms = t.getmembers()
    assert [m.name for m in ms] == sorted(m.name for m in ms if m.isdir()) + sorted(
        m.name for m in ms if not m.isdir())
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in ms} == {(0, 0, 0, "", "")}
    assert first.ref == f"sha256:{first.sha256}" and first.files == len(FILES)


def test_a_folder_git_ignores_is_packed_whole_when_named(tmp_path: Path) -> None:
    """A project folder under an ignored one (the demo's `.onepool/project` in a checkout) is
    asked for by name: its files are packed, not git's empty list of it."""
    repo = _tree(tmp_path / "repo", {".gitignore": "build/\n", "src/a.py": "a\n",
                                     "build/project/train.py": "t\n", "build/project/lib/m.py": "m\n"})
    _git(repo, ".gitignore", "src/a.py")
    assert file_list(repo / "build" / "project") == ["lib/m.py", "train.py"]
    assert file_list(repo / "src") == ["a.py"]  # a folder git does not ignore stays git-aware


@pytest.mark.parametrize("files", [{}, {".onepoolignore": "*\n", "train.py": "t\n"}],
                         ids=["no file", "all excluded"])
def test_a_folder_with_nothing_to_pack_is_refused_naming_it(tmp_path: Path, files: dict[str, str]) -> None:
    root = tmp_path / "proj"
    root.mkdir()
    _tree(root, files)
    with pytest.raises(EmptySnapshot, match=r"code: the folder .*proj holds no file to pack"):
        pack(root)


def test_over_the_limit_names_the_largest_files_and_how_to_exclude_them(tmp_path: Path) -> None:
    root = _tree(tmp_path / "proj", {"small.py": "x", "ckpt/model.pt": "m" * 3000, "data.csv": "d" * 2000})
    with pytest.raises(SnapshotTooLarge) as e:
        pack(root, limit=1000)
    msg = str(e.value)
    assert msg.index("ckpt/model.pt") < msg.index("data.csv") < msg.index("small.py")
    assert ".onepoolignore" in msg and "--code none" in msg and str(root) in msg


def _tar(*entries: tarfile.TarInfo, data: bytes = b"x") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as t:
        for ti in entries:
            if ti.isreg():
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))
            else:
                t.addfile(ti)
    return out.getvalue()


def _entry(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type, ti.linkname = kind, link
    return ti


@pytest.mark.parametrize("archive, why", [
    (_tar(_entry("/etc/cron.d/x")), "outside its folder"),
    (_tar(_entry("a/../../x")), "outside its folder"),
    (_tar(_entry("l", tarfile.SYMTYPE, "/etc/passwd")), "link leaving"),
    (_tar(_entry("a/l", tarfile.SYMTYPE, "../../x")), "link leaving"),
    (_tar(_entry("h", tarfile.LNKTYPE, "/etc/passwd")), "not a file, folder or link"),
    (_tar(_entry("dev", tarfile.CHRTYPE)), "not a file, folder or link"),
    (_tar(_entry("f", tarfile.FIFOTYPE)), "not a file, folder or link"),
    (b"not a tar at all" * 40, "cannot be unpacked"),
], ids=["absolute", "dotdot", "abs link", "escaping link", "hard link", "device", "fifo", "garbage"])
def test_hostile_archives_are_refused_before_anything_is_written(tmp_path: Path, archive: bytes,
                                                                 why: str) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(BadArchive, match=why):
        unpack(archive, dest)
    assert list(dest.iterdir()) == []


def test_a_link_inside_the_archive_unpacks(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    unpack(_tar(_entry("a/f"), _entry("a/l", tarfile.SYMTYPE, "f")), dest)
    assert (dest / "a/l").read_text() == "x"


@pytest.mark.parametrize("code, error", [
    ("sha256:abc", "64 lowercase hex digits"),
    ("sha256:" + "A" * 64, "64 lowercase hex digits"),
    ("s3://bucket/code.tar.gz", "#sha256="),
    (f"ftp://h/x.tgz#sha256={HEX}", "scheme must be one of"),
    ("", "must be none, a folder"),
])
def test_bad_code_values_name_the_field_and_the_allowed_forms(code: str, error: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_job({"name": "j", "team": "t", "command": ["x"], "code": code})
    assert "code:" in str(e.value) and error in str(e.value)


def test_code_and_workdir_exclude_each_other() -> None:
    with pytest.raises(SpecError, match="code and workdir: give one"):
        parse_job({"name": "j", "team": "t", "command": ["x"], "code": ".", "workdir": "/srv"})
    assert parse_job({"name": "j", "team": "t", "command": ["x"], "code": "none", "workdir": "/srv"})


@pytest.mark.parametrize("code, kind, sha, uri", [
    ("none", "none", None, None),
    (".", "folder", None, None),
    (f"sha256:{HEX}", "snapshot", HEX, None),
    (f"s3://b/c.tar.gz#sha256={HEX}", "archive", HEX, "s3://b/c.tar.gz"),
])
def test_good_code_values(code: str, kind: str, sha: str | None, uri: str | None) -> None:
    ref = parse_code(code)
    assert (ref.kind, ref.sha256, ref.uri) == (kind, sha, uri)


@pytest.mark.parametrize("setup, error", [
    (["true"] * 33, "at most 32 commands"),
    (["x" * 70_000], "at most 65536 bytes"),
    ([""], "non-empty text"),
    (5, "valid list"),
])
def test_bad_setup_values_name_the_field_and_the_limit(setup: object, error: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_job({"name": "j", "team": "t", "command": ["x"], "setup": setup})
    assert "setup" in str(e.value) and error in str(e.value)


def test_a_setup_string_is_one_command() -> None:
    assert parse_job({"name": "j", "team": "t", "command": ["x"], "setup": "pip install -e ."}).setup == [
        "pip install -e ."]


@pytest.mark.parametrize("data, error", [
    ({"/abs/x": "s3://b/x"}, "must be relative"),
    ({"a/../../x": "s3://b/x"}, "must be relative"),
    ({"a//x": "s3://b/x"}, "must be relative"),
    ({"x": "/local/path"}, "must start with one of"),
    ({"x": "ftp://h/x"}, "must start with one of"),
    ({f"d{i}": "s3://b/x" for i in range(65)}, "at most 64 entries"),
])
def test_bad_data_values_name_the_entry_and_the_rule(data: dict[str, str], error: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_job({"name": "j", "team": "t", "command": ["x"], "data": data})
    assert "data" in str(e.value) and error in str(e.value)
    with pytest.raises(SpecError, match="data and workdir: give one"):
        parse_job({"name": "j", "team": "t", "command": ["x"], "data": {"x": "s3://b/x"}, "workdir": "/w"})


@pytest.mark.parametrize("env", [{"ONEPOOL_CODE_SHA256": "a" * 64}, {"ONEPOOL_SETUP": '["x"]'},
                                 {"ONEPOOL_DATA": '{"d": "s3://b/d"}'}])
def test_a_slurm_pool_refuses_to_start_what_it_cannot_unpack(env: dict[str, str]) -> None:
    from broker.control.slurm_exec import SlurmExecutor
    from providers.base import StartFailed

    with pytest.raises(StartFailed) as e:
        SlurmExecutor(pools=None).start(1, 0, ["true"], env)  # type: ignore[arg-type]
    assert e.value.cause == "start_failed:code_unsupported" and "workdir" in str(e.value)


@pytest.mark.parametrize("code, resolved", [
    (".", "{yaml}"),
    ("src", "{yaml}/src"),
    ("../other", "{parent}/other"),
    ("/abs/folder", "/abs/folder"),  # absolute: as written
    ("~/proj", "~/proj"),  # (the home folder: expanded where it is packed)
    ("none", "none"),
    ("sha256:" + "a" * 64, "sha256:" + "a" * 64),
    ("s3://b/x.tar.gz#sha256=" + "b" * 64, "s3://b/x.tar.gz#sha256=" + "b" * 64),
    ("s3://b/x.tar.gz", "s3://b/x.tar.gz"),  # not a code form: left for validation to refuse
    (7, 7),
])
def test_a_yaml_code_folder_is_relative_to_the_yaml_file(tmp_path: Path, code: object,
                                                         resolved: object) -> None:
    from broker.spec_code import relative_to_file

    spec = tmp_path / "proj" / "job.yaml"
    want = resolved.format(yaml=spec.parent, parent=tmp_path) if isinstance(resolved, str) else resolved
    assert relative_to_file(code, spec) == want


def test_submit_f_packs_the_folder_of_the_yaml_not_the_current_one(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from broker.client.cli import app
    from tests.test_cli import CONFIG

    proj = _tree(tmp_path / "proj", {"train.py": "print('proj')\n"})
    (proj / "job.yaml").write_text("name: j\nteam: research\ncode: .\ncommand: [python, train.py]\n")
    elsewhere = _tree(tmp_path / "elsewhere", {"other.py": "x\n"})
    monkeypatch.chdir(elsewhere)
    home = tmp_path / "home"
    (tmp_path / "c.yaml").write_text(json.dumps(CONFIG))
    run = CliRunner().invoke
    assert run(app, ["--home", str(home), "apply", "-c", str(tmp_path / "c.yaml")]).exit_code == 0
    res = run(app, ["--home", str(home), "submit", "--json", "-f", str(proj / "job.yaml")])
    assert res.exit_code == 0, res.output
    from broker.client.sdk import Client
    from broker.state.model import Job

    with Client(home).store.session() as s:
        job = s.get(Job, json.loads(res.stdout)["id"])
        assert job is not None and job.code_sha256 == pack(proj).sha256
