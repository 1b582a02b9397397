"""Why a rank could not start: one vocabulary for every pool (local processes, agents, Slurm).

A start failure ends its attempt with the cause `start_failed:<kind>`. Each kind says whether
the node may be at fault (its working directory or interpreter may exist on another node: the
job is tried again elsewhere, up to `broker.max_start_failures`) or only the job can be
(an exec format error of its own script, arguments too large: retrying cannot help, the job
fails at once). This module uses the standard library only: the rank's supervisor
(providers.local_runner) imports it before it starts the job.
"""

from __future__ import annotations

import errno as errnos
import os
import re
import shutil

PREFIX = "start_failed"
PATTERN = r"^start_failed:[a-z0-9_]{1,48}$"  # what a cause may look like on the wire

# kind -> (what the user reads, whether another node may succeed)
KINDS: dict[str, tuple[str, bool]] = {
    "workdir_missing": ("its working directory does not exist on this node", True),
    "workdir_not_a_directory": ("its working directory is not a directory on this node", True),
    "workdir_denied": ("its working directory cannot be entered (permission denied)", True),
    "command_not_found": ("its command was not found on this node", True),
    "bad_interpreter": ("the interpreter named on its script's #! line was not found on this node", True),
    "permission_denied": ("its command cannot be executed (permission denied: not executable, "
                          "or on a noexec filesystem)", True),
    "exec_format_error": ("its command is not a program this node can run (exec format error: "
                          "a script without a #! line, or a binary for another architecture)", False),
    "too_large": ("its arguments or environment are too large to start a process "
                  "(E2BIG: one argument above 128 KiB, or all of them above the system limit)", False),
    "invalid_command": ("its command or environment holds a NUL byte", False),
    "supervisor_failed": ("its supervisor could not start on this node", True),
    # A job with an image (providers.container, providers.image_pull):
    "image_not_found": ("its image was not found in its registry (check `image:`, its name and tag)", False),
    "image_pull_failed": ("its image could not be pulled on this node (the registry unreachable, or "
                          "the node lacks its credentials)", True),
    "no_container_runtime": ("this node cannot run containers (no podman or docker, or a bad "
                             "container setting of the node)", True),
    "container_failed": ("its container runtime could not run it (status 125: see the rank's log)", True),
    # code snapshots (issue 26: providers.code_cache)
    "code_unavailable": ("its code snapshot could not be fetched from the object store", True),
    "code_unverified": ("its code snapshot did not match its sha256 twice (a damaged stored copy: "
                        "submit again to upload it anew)", True),
    "code_unsupported": ("it ships code, setup or data, which a Slurm pool does not unpack yet (give it a "
                         "`workdir` on the cluster's shared filesystem, or run it on another pool)", True),
    "data_unavailable": ("a URI of its `data` could not be read on this node", True),
    "code_bad_archive": ("its code archive does not unpack safely (a path outside its folder, a "
                         "device, a link escaping, or not a tar)", False),
}


def cause(kind: str) -> str:
    """The attempt's cause for a start failure of this kind: `start_failed:<kind>`."""
    return f"{PREFIX}:{kind}"


def kind_of(cause_: str | None) -> str | None:
    """The kind of a start-failure cause (None for any other cause, or for none)."""
    if cause_ is None or not cause_.startswith(PREFIX + ":"):
        return None
    return cause_[len(PREFIX) + 1:]


def is_start_failure(cause_: str | None) -> bool:
    return kind_of(cause_) is not None


def well_formed(cause_: str | None) -> bool:
    """Whether a cause read from a rank's folder (which the job could have written) is one
    this vocabulary can produce: the agent reports no other."""
    return cause_ is not None and re.fullmatch(PATTERN, cause_) is not None


def job_at_fault(cause_: str | None) -> bool:
    """Whether only the job can be at fault (another node would fail the same way). Unknown
    kinds (any other errno) may be the node's."""
    kind = kind_of(cause_)
    return kind is not None and not KINDS.get(kind, ("", True))[1]


def describe(cause_: str) -> str:
    """A sentence for the user: what went wrong."""
    kind = kind_of(cause_) or cause_
    if kind in KINDS:
        return KINDS[kind][0]
    return f"it could not be started ({kind.upper()})"


def workdir_kind(cwd: str) -> str | None:
    """Why `cwd` cannot be a rank's working directory (a kind), or None if it can."""
    try:
        st = os.stat(cwd)
    except FileNotFoundError:
        return "workdir_missing"
    except NotADirectoryError:  # a path component is a file
        return "workdir_not_a_directory"
    except PermissionError:
        return "workdir_denied"
    except OSError as e:
        return errnos.errorcode.get(e.errno or 0, "oserror").lower()
    if not os.path.isdir(cwd) or (st.st_mode & 0o170000) != 0o040000:
        return "workdir_not_a_directory"
    if not os.access(cwd, os.X_OK):
        return "workdir_denied"
    return None


def classify(err: BaseException, argv0: str) -> str:
    """The kind of a failure to exec `argv0` (an OSError from exec, or the ValueError that a
    NUL byte raises). Any other errno is named by its symbol (`enomem`)."""
    if isinstance(err, ValueError):
        return "invalid_command"
    if not isinstance(err, OSError):
        return type(err).__name__.lower()[:40]
    code = err.errno
    if code == errnos.ENOENT:
        found = argv0 if os.sep in argv0 else shutil.which(argv0)
        return "bad_interpreter" if found and os.path.exists(found) else "command_not_found"
    named = {errnos.ENOEXEC: "exec_format_error", errnos.E2BIG: "too_large",
             errnos.EACCES: "permission_denied", errnos.EPERM: "permission_denied",
             errnos.ENOTDIR: "command_not_found"}
    if code in named:
        return named[code]
    return errnos.errorcode.get(code or 0, "oserror").lower()


def exit_code(kind: str) -> int:
    """The exit status a shell would give: 127 when nothing was found to run, else 126."""
    return 127 if kind in ("command_not_found", "bad_interpreter", "workdir_missing") else 126


def record(kind: str, err: BaseException | None, detail: str) -> dict[str, object]:
    """The `start_error` entry of a rank's exit.json."""
    code = getattr(err, "errno", None)
    return {"cause": cause(kind), "errno": errnos.errorcode.get(code, None) if code else None,
            "message": detail[:500]}
