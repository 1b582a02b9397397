"""How `onepool server`, `onepool broker` and `onepool agent` log: `--log-format text` (a line
of time, logger and message) or `json` (one JSON object a line, for Loki, Elasticsearch or
`jq`): `time` (ISO 8601, UTC), `level`, `logger`, `message`, and `job`, `attempt`, `node`
where the log call names them (`log.info(..., extra=context(job=7, attempt=12))`), plus
`exception` (the traceback) when there is one."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from broker.errors import SpecError

FORMATS = ("text", "json")
CONTEXT = ("job", "attempt", "node")
TEXT = "%(asctime)s %(name)s %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module's doc)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage()}
        for k in CONTEXT:
            v = getattr(record, f"onepool_{k}", None)
            if v is not None:
                out[k] = v
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def context(job: int | None = None, attempt: int | None = None, node: str | None = None) -> dict[str, Any]:
    """`extra=` for a log call about a job, an attempt or a node (JSON logs show them as
    fields; text logs ignore them)."""
    return {f"onepool_{k}": v for k, v in (("job", job), ("attempt", attempt), ("node", node))
            if v is not None}


def setup(fmt: str, level: int = logging.INFO) -> None:
    """Configure the root logger for `fmt`. Raises SpecError naming --log-format and the
    allowed values."""
    if fmt not in FORMATS:
        raise SpecError("command line", [f"--log-format: must be one of {', '.join(FORMATS)} (got {fmt!r})"])
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT))
    logging.basicConfig(level=level, handlers=[handler], force=True)
