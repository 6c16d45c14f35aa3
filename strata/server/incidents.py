"""Incident ids: how a 500 is reported without showing the client any exception text.

`incident_id(exc)` gives `exc` an id (`err-` + 12 hex digits) the first time it is asked,
and logs the exception (message and traceback) under that id at that moment; later calls
return the same id without logging again. So one failure shared by several requests (a
failed engine step ends every request it carried) is one log entry, and every client
that saw it holds the id that finds it.
"""

from __future__ import annotations

import logging

from strata.errors import new_error_id

log = logging.getLogger("strata.server")
_ATTRIBUTE = "strata_incident_id"


def incident_id(exc: BaseException, where: str | None = None) -> str:
    existing = getattr(exc, _ATTRIBUTE, None) or getattr(exc, "error_id", None)
    if isinstance(existing, str):
        return existing  # logged already (a StepFailed's id is logged by the engine)
    error_id = new_error_id()
    try:
        setattr(exc, _ATTRIBUTE, error_id)
    except AttributeError:
        pass  # an exception type without attributes: each report gets its own id
    log.error(
        "incident %s%s: %s: %s",
        error_id,
        f" in {where}" if where else "",
        type(exc).__name__,
        exc,
        exc_info=(type(exc), exc, exc.__traceback__),
    )
    return error_id
