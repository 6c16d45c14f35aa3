"""Pydantic's validation errors as one clear 400: the first failing field, named as the
client spells it (`messages[0].role`), with every reason a union field failed for."""

from __future__ import annotations

from strata.errors import RequestError


def shorten(text: str, limit: int = 80) -> str:
    """Client-supplied text quoted in a message, cut to `limit` characters."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _param_path(loc: tuple) -> str:
    """('messages', 0, 'role') -> 'messages[0].role'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


# Pydantic tags each member of a failed union in the error location ('str', 'list[str]',
# 'function-after[...]', a model's class name); field names are lower-case identifiers.
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _is_union_tag(part: object) -> bool:
    return isinstance(part, str) and (
        part in _TYPE_TAGS or not part.isidentifier() or part[:1].isupper()
    )


def _field_loc(loc: tuple) -> tuple:
    """The error location without 'body', cut at the first union member tag."""
    out = []
    for part in loc:
        if part == "body" and not out:
            continue
        if _is_union_tag(part):
            break
        out.append(part)
    return tuple(out)


def validation_message(errors: list[dict]) -> RequestError:
    """One clear RequestError for the first failing field of a pydantic error list.

    A union field (e.g. `stop: str | list[str]`) fails once per member; the message lists
    each member's reason.
    """
    first = errors[0]
    loc = _field_loc(tuple(first["loc"]))
    if first["type"] == "json_invalid":
        detail = first.get("ctx", {}).get("error", "")
        return RequestError(f"the request body is not valid JSON: {detail}", code="invalid_json")
    if not loc and first["type"] == "missing":
        return RequestError("the request body is empty: send a JSON object", code="invalid_json")
    if not loc:
        return RequestError(
            "the request body must be a JSON object (send it with Content-Type: application/json)",
            code="invalid_json",
        )
    param = _param_path(loc)
    if first["type"] == "extra_forbidden":
        return RequestError(
            f"unknown field {param!r}: strata does not accept it (/docs lists the accepted fields)",
            code="unknown_field",
            param=param,
        )
    if first["type"] == "missing":
        return RequestError(f"{param} is required", code="missing_field", param=param)
    reasons: list[str] = []
    for e in errors:
        if _field_loc(tuple(e["loc"])) == loc and e["msg"] not in reasons:
            reasons.append(e["msg"])
    shown = shorten(repr(first.get("input")))
    return RequestError(f"{param}: {'; or '.join(reasons)} (got {shown})", param=param)
