"""Settings errors said in one line, named by their environment variable, never echoing a
value that may be a secret."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

# Settings whose values may be secrets: an error about them never repeats the value.
SECRET_FIELDS = frozenset(
    {
        "redis_url",
        "broker_url",
        "llm_api_key",
        "flower_password",
        "serve_api_keys",
        "serve_session_secret",
    }
)

# Pydantic's wording of the common type errors, said the short way.
SHORT_MESSAGES = {
    "float_parsing": "not a number",
    "float_type": "not a number",
    "int_parsing": "not a whole number",
    "int_from_float": "not a whole number",
    "int_type": "not a whole number",
    "bool_parsing": "not true or false",
    "bool_type": "not true or false",
}


def describe_setting_error(error: Mapping[str, Any], fields: Collection[str]) -> str:
    """One problem, named by its environment variable: ``MEMQ_DEBOUNCE_SECONDS: not a number:
    'abc'``. The value is repeated only for settings that can never hold a secret."""
    loc = [str(part) for part in error.get("loc", ())]
    field = loc[0] if loc else ""
    name = f"MEMQ_{field.upper()}" if field in fields else (".".join(loc) or "settings")
    message = str(error.get("msg", "invalid"))
    message = message.removeprefix("Value error, ")
    short = SHORT_MESSAGES.get(str(error.get("type", "")))
    if short is not None:
        message = short
        value = error.get("input")
        if field not in SECRET_FIELDS and isinstance(value, str | int | float | bool):
            message = f"{message}: {str(value)[:80]!r}"
    return f"{name}: {message}"
