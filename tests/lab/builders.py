"""What the lab's hosts are given: the thin client's virtualenv on the laptop (onepool's wheel,
built from this checkout, and only the distributions its core dependencies need), the
server-side install on the server and the boxes, and the README's "Across machines" blocks."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.lab.harness import BASE_PATH, Host

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent  # the server parts: this test's own virtualenv
SOURCES = ("broker", "providers", "pricing", "dashboard", "pyproject.toml", "README.md")


def thin_requirements() -> list[Requirement]:
    """onepool's core dependencies (what `pip install onepool` installs), from pyproject.toml."""
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return [Requirement(r) for r in data["project"]["dependencies"]]


def closure(reqs: list[Requirement]) -> dict[str, metadata.Distribution]:
    """The installed distributions that `reqs` need, transitively (markers evaluated for this
    interpreter, no extras), by canonical name. Raises LookupError naming one not installed."""
    seen: dict[str, metadata.Distribution] = {}
    todo = list(reqs)
    while todo:
        r = todo.pop()
        if r.marker is not None and not r.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(r.name)
        if name in seen:
            continue
        try:
            dist = metadata.distribution(r.name)
        except metadata.PackageNotFoundError:
            raise LookupError(f"{r.name} (needed by the thin client) is not installed in "
                              f"{sys.prefix}") from None
        seen[name] = dist
        todo += [Requirement(x) for x in dist.requires or []]
    return seen


def site_tar(dists: dict[str, metadata.Distribution]) -> bytes:
    """A tar of the distributions' files inside site-packages (their RECORD), as they are
    installed here: what pip would unpack from their wheels."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for dist in dists.values():
            base = Path(str(dist.locate_file("")))
            for f in dist.files or []:
                if str(f).startswith("..") or "__pycache__" in f.parts:
                    continue  # scripts outside site-packages; byte code is made again there
                src = base / f
                if src.is_file():
                    tar.add(src, arcname=str(f))
    return buf.getvalue()


def build_wheel(out: Path) -> Path:
    """onepool's wheel, built from a copy of this checkout's sources (nothing is written into
    the checkout). About 3 s."""
    src = out / "src"
    src.mkdir(parents=True)
    for name in SOURCES:
        p = REPO / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(p, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "-q", "-w", str(out), str(src)], check=True, capture_output=True)
    return next(out.glob("onepool-*.whl"))


@dataclass(frozen=True)
class ThinVenv:
    """The laptop's virtualenv: `bin` goes first on its PATH."""

    path: str
    distributions: tuple[str, ...]

    @property
    def bin(self) -> str:
        return f"{self.path}/bin"

    @property
    def python(self) -> str:
        return f"{self.bin}/python"


def install_thin_client(host: Host, wheel: Path, venv: str) -> ThinVenv:
    """A fresh virtualenv at `venv` on `host` (from the base interpreter, without pip), the
    thin dependencies unpacked into it, then onepool's wheel installed by pip with --no-deps
    (which writes the `onepool` command): the laptop of a researcher after `pip install onepool`."""
    host.run([sys._base_executable, "-m", "venv", "--without-pip", venv])  # type: ignore[attr-defined]
    dists = closure(thin_requirements())
    site = host.run([f"{venv}/bin/python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]
                    ).stdout.strip()
    host.run(["tar", "-x", "-C", site], input=site_tar(dists))
    remote = f"{venv}/../dl/{wheel.name}"
    host.write(remote, wheel.read_bytes())
    host.run([sys.executable, "-m", "pip", "--python", f"{venv}/bin/python", "install", "--no-deps",
              "--no-index", "--no-cache-dir", "--disable-pip-version-check", "-q", remote],
             env={"HOME": "/tmp"}, timeout=120)
    return ThinVenv(venv, tuple(sorted(dists)))


def pipx_style(host: Host, home: str) -> dict[str, str]:
    """`onepool` of the server install on `host` as pipx puts it: a link in ~/.local/bin to the
    command inside its virtualenv, whose bin folder is NOT on PATH (so a job's `python` is not
    found by accident). Returns the environment of a login shell there."""
    host.run(["mkdir", "-p", f"{home}/.local/bin"])
    host.run(["ln", "-s", str(VENV_BIN / "onepool"), f"{home}/.local/bin/onepool"])
    return {"HOME": home, "PATH": f"{home}/.local/bin:{BASE_PATH}", "PYTHONPATH": str(REPO)}


# -- the README's "Across machines" section -------------------------------------------------------
SECTION = "## Across machines"


def readme_blocks() -> tuple[str, str]:
    """(the shell block, the YAML config block) of the README's "Across machines" section."""
    text = (REPO / "README.md").read_text()
    start = text.index(SECTION)
    section = text[start:text.index("\n## ", start + 1)]
    shell = re.search(r"```\n(.*?)```", section, re.S)
    yaml_block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert shell and yaml_block, "the README's Across machines section lost its shell or yaml block"
    return shell.group(1), yaml_block.group(1)


def shell_parts(block: str) -> dict[str, list[str]]:
    """The shell block's commands by the comment that opens each part ("the server machine",
    "an admin, anywhere", "each GPU box", "researchers, from their laptops"): one command per
    entry (`a; b` split), trailing comments dropped."""
    parts: dict[str, list[str]] = {}
    current = ""
    for raw in block.splitlines():
        line = raw.strip()
        if line.startswith("#"):
            current = line.lstrip("# ").split(" (")[0]
            parts[current] = []
        elif line:
            code = line.split("  #")[0].strip()
            parts[current] += [c.strip() for c in code.split(";") if c.strip()]
    return parts


def exports(line: str) -> dict[str, str]:
    """`export A=1 B=2` as a dict."""
    assert line.startswith("export "), line
    return dict(w.split("=", 1) for w in line.split()[1:])
