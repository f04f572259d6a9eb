"""The options of tidewater's Spark data sources, read one way for all of them.

Spark hands a data source its options as strings under the names the caller spelled (a reader's
``.option("maxFilesPerTrigger", 5)`` arrives as ``{"maxFilesPerTrigger": "5"}``; SQL may lowercase
them), so each is looked up case-insensitively. A numeric option that is not a whole number within
its range is one :class:`~tidewater.errors.ConfigError` line naming the source, the option and the
value: a ``0`` or ``-1`` that a bare ``int()`` accepts would otherwise switch a bound off or stall a
stream quietly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, overload

from tidewater.errors import ConfigError

__all__ = ["flag", "option", "whole_number"]


def option(options: Mapping[str, Any], name: str, default: str | None = None) -> str | None:
    """The option called ``name`` in any case, as a string; ``default`` when it is not given."""
    lowered = {str(k).lower(): str(v) for k, v in dict(options).items()}
    return lowered.get(name.lower(), default)


def flag(options: Mapping[str, Any], name: str) -> bool:
    """A true/false option, false unless given as true."""
    return (option(options, name, "false") or "").lower() == "true"


@overload
def whole_number(options: Mapping[str, Any], name: str, *, source: str, minimum: int = 1, default: int) -> int: ...


@overload
def whole_number(
    options: Mapping[str, Any], name: str, *, source: str, minimum: int = 1, default: None = None
) -> int | None: ...


def whole_number(
    options: Mapping[str, Any], name: str, *, source: str, minimum: int = 1, default: int | None = None
) -> int | None:
    """A whole-number option of at least ``minimum``; ``default`` when it is not given (or empty)."""
    value = option(options, name)
    if value is None or value.strip() == "":
        return default
    try:
        number = int(value)
    except ValueError:
        number = None
    if number is None or number < minimum:
        raise ConfigError(f"{source} option {name}={value!r} must be a whole number of at least {minimum}")
    return number
