"""How a translation says no (pure): a field of the client's request that has no faithful
counterpart in the API the deployment speaks is a 400 naming it (``param``, in the
client's API's terms), never dropped; a field the translation reads whose value is of
the wrong type is a 400 naming it too. An upstream answer that cannot be translated back
is ``Untranslatable`` (the exchange answers it as an unusable upstream answer).
"""

from __future__ import annotations

from typing import Any, NoReturn

import orjson

from proxy.errors import InvalidRequest

__all__ = [
    "UNTRANSLATABLE",
    "Untranslatable",
    "content_list",
    "listing",
    "mapping",
    "only",
    "refuse",
    "text",
    "wrong",
]

UNTRANSLATABLE = "untranslatable_field"


class Untranslatable(ValueError):
    """An upstream answer the translation cannot pass on in the client's API's shape."""


def refuse(param: str, why: str, upstream: str) -> NoReturn:
    """400: ``param`` has no counterpart in ``upstream`` (the deployment's API)."""
    raise InvalidRequest(
        f"'{param}' cannot be translated to the {upstream} API this model's deployment"
        f" speaks: {why}. Remove it, or use a model whose deployments speak your API.",
        code=UNTRANSLATABLE,
        param=param,
    )


def wrong(param: str, shape: str) -> NoReturn:
    """400: ``param`` is not of the shape the translation reads."""
    raise InvalidRequest(f"'{param}' must be {shape}.", code="invalid_type", param=param)


def mapping(value: Any, param: str) -> dict[str, Any]:
    """``value``, an object (else a 400 naming ``param``)."""
    if not isinstance(value, dict):
        wrong(param, "an object")
    return value


def listing(value: Any, param: str) -> list[Any]:
    """``value``, an array (else a 400 naming ``param``)."""
    if not isinstance(value, list):
        wrong(param, "an array")
    return value


def content_list(value: Any, param: str) -> list[Any]:
    """Message content that is not a string: an array (else a 400 naming ``param``)."""
    if not isinstance(value, list):
        wrong(param, "a string or an array of content")
    return value


def text(value: Any, param: str) -> str:
    """``value``, a string (else a 400 naming ``param``)."""
    if not isinstance(value, str):
        wrong(param, "a string")
    return value


def only(
    value: dict[str, Any], allowed: frozenset[str], param: str, why: str, upstream: str
) -> None:
    """Refuse the first key of ``value`` (not null) outside ``allowed``."""
    for key, item in value.items():
        if key not in allowed and item is not None:
            refuse(f"{param}.{key}" if param else key, why, upstream)


def function_call(
    call: Any, where: str, why: str, upstream: str
) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """A chat ``tool_calls`` entry read for ``upstream``: the call, its ``function`` and
    its arguments parsed (None: not JSON; the caller says what they must be). Only
    function calls, with ``id``, ``type`` and ``function`` (others refused: ``why``)."""
    call = mapping(call, where)
    if call.get("type", "function") != "function":
        refuse(f"{where}.type", "only function calls have a counterpart", upstream)
    only(call, frozenset({"id", "type", "function"}), where, why, upstream)
    function = mapping(call.get("function"), f"{where}.function")
    arguments = text(function.get("arguments", ""), f"{where}.function.arguments")
    try:
        given = orjson.loads(arguments) if arguments.strip() else {}
    except orjson.JSONDecodeError:
        given = None
    return call, function, given
