"""Errors as JSON: every error the SDK raises becomes a 4xx whose body names its type, so the
HTTP client raises the very same exception with the very same message.

Body: {"error": {"type": "SpecError", "message": "...", "source": "job", "problems": [...]}}
(`source` and `problems` for SpecError only). No input ever gets a 500: a 500 is a bug, and
says so.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from broker.errors import (
    BudgetError,
    CheckpointError,
    Forbidden,
    InvalidState,
    NotConfigured,
    NotFound,
    OnepoolError,
    SpecError,
    TooLarge,
    TooManyRequests,
    Unauthorized,
)

log = logging.getLogger("onepool.api")

STATUS: list[tuple[type[Exception], int]] = [
    (Unauthorized, 401), (Forbidden, 403), (TooManyRequests, 429), (TooLarge, 413),
    (NotFound, 404), (SpecError, 422),
    (BudgetError, 422), (InvalidState, 409), (NotConfigured, 409), (CheckpointError, 409),
    (OnepoolError, 400),
]


def status_of(e: Exception) -> int:
    return next((code for cls, code in STATUS if isinstance(e, cls)), 422)


def body(e: Exception) -> dict:
    err: dict = {"type": type(e).__name__, "message": str(e)}
    if isinstance(e, SpecError):
        err["source"], err["problems"] = e.source, e.problems
    return {"error": err}


def _where(loc: tuple) -> str:
    parts = [str(x) for x in loc if x not in ("body", "query", "path", "header")]
    return ".".join(parts) or str(loc[0] if loc else "(request)")


def install(app: FastAPI) -> None:
    """Register the handlers that turn errors into JSON answers."""

    @app.exception_handler(OnepoolError)
    async def _onepool(_: Request, e: OnepoolError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if isinstance(e, Unauthorized) else None
        if isinstance(e, TooManyRequests):
            headers = {"Retry-After": str(e.retry_after_s)}
        return JSONResponse(body(e), status_code=status_of(e), headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        problems = []
        for x in e.errors():
            msg = str(x.get("msg", "invalid")).removeprefix("Value error, ")
            problems.append(f"{_where(tuple(x.get('loc', ())))}: {msg}")
        return JSONResponse(body(SpecError("request", problems)), status_code=422)

    @app.exception_handler(ValueError)
    async def _value(_: Request, e: ValueError) -> JSONResponse:
        return JSONResponse(body(SpecError("request", [str(e)])), status_code=422)

    @app.exception_handler(Exception)
    async def _bug(_: Request, e: Exception) -> JSONResponse:
        log.exception("bug: unhandled %s", type(e).__name__)
        return JSONResponse({"error": {"type": "InternalError",
                                       "message": f"onepool bug: {type(e).__name__}: {e}"}},
                            status_code=500)
