"""bench/compiled.py: a failed mypyc build raises and leaves nothing a later run would use; the
build key follows the source."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "compiled.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_compiled", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def fake_repo(root: Path, policy_src: str) -> Path:
    """The files the build copies and compiles, each trivial except broker/policy."""
    for pkg in ("broker", "providers", "pricing"):
        (root / pkg).mkdir(parents=True)
        (root / pkg / "__init__.py").write_text("")
    (root / "broker" / "policy").mkdir()
    (root / "broker" / "policy" / "__init__.py").write_text(policy_src)
    (root / "broker" / "sim").mkdir()
    (root / "broker" / "sim" / "__init__.py").write_text("")
    for m in ("simulator", "world", "state", "metrics", "setup", "rebalance"):
        (root / "broker" / "sim" / f"{m}.py").write_text("X: int = 1\n")
    (root / "pyproject.toml").write_text("[tool.mypy]\nstrict = true\n")
    return root


def test_a_failed_build_raises_names_its_log_and_leaves_no_build(tmp_path: Path) -> None:
    compiled = load()
    repo = fake_repo(tmp_path / "repo", 'X: int = "not an int"\n')
    with pytest.raises(compiled.CompileError, match=r"mypyc failed .*\.log.*without --compiled"):
        compiled.build(repo)
    built = repo / "build" / "mypyc"
    left = sorted(p.name for p in built.iterdir())
    assert left == [f"{compiled.source_key(repo)}.log"]  # the log only: no copy, no temp dir
    assert "Incompatible types in assignment" in (built / left[0]).read_text()


def test_the_build_key_changes_with_any_source_file(tmp_path: Path) -> None:
    compiled = load()
    repo = fake_repo(tmp_path / "repo", "X: int = 1\n")
    before = compiled.source_key(repo)
    assert compiled.source_key(repo) == before
    (repo / "pricing" / "__init__.py").write_text("Y = 2\n")
    assert compiled.source_key(repo) != before
