"""torch_renaissance's configuration: keyword arguments of :func:`install` and
the environment variable ``TORCH_RENAISSANCE_CONF``.

The keys, their units, defaults and ranges are ONE table, kept in C++
(``csrc/core/config.h``, read here through ``_C.config_keys()``): the same
table validates the arena's ``ArenaConfig`` in C++, drives this parser, and
generates the README's table (``tools/config_table.py``). A value outside a
key's range is an error in every layer, never clamped.

``TORCH_RENAISSANCE_CONF`` is in PyTorch's ``PYTORCH_CUDA_ALLOC_CONF`` style:
``key:value,key:value`` (e.g. ``TORCH_RENAISSANCE_CONF=max_reserved_mb:4096,stream_policy:wait``).
Keyword arguments win over the environment. Integers are plain ASCII integers
(decimal, or ``0x`` hexadecimal; no underscores, signs or other scripts' digits);
a float key (``plan_budget_seconds``) also takes ASCII decimals (``0.5``). A
key may be given once per source, and a key and its alias (``max_reserved_mb``
and ``max_reserved_bytes``; ``plan_budget_seconds`` and ``plan_budget_ms``)
are one key in two units.

Keys: see :func:`keys` or the README's "Configuration" table.
"""
from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Union

from torch_renaissance.extension import extension

ENV_VAR = "TORCH_RENAISSANCE_CONF"

#: The words a boolean may be written as, in a config string or an environment
#: variable (also ``TORCH_RENAISSANCE``; :mod:`torch_renaissance.auto`).
BOOL_WORDS = {"1": True, "true": True, "yes": True, "on": True,
              "0": False, "false": False, "no": False, "off": False}


@dataclass(frozen=True)
class Config:
    """Parsed configuration of one installed arena (see the module docstring).

    One field per key of the table that is not an alias; the defaults are the
    table's (a test compares them).
    """

    max_reserved_bytes: int = 0
    expandable_segments: bool = True
    stream_policy: str = "defer"
    planning: bool = True
    max_variants: int = 8
    plan_budget_ms: Union[int, float] = 250  # a float only when given as plan_budget_seconds
    plan_deterministic: bool = False
    plan_threads: int = 2
    range_bytes: int = 0
    small_segment: int = 2 << 20
    large_segment: int = 20 << 20

    def arena_kwargs(self) -> dict:
        """Keyword arguments for ``torch_renaissance._C.Arena`` / ``install_cpu``
        (the same table's keys)."""
        return {
            "max_reserved_bytes": self.max_reserved_bytes,
            "expandable_segments": self.expandable_segments,
            "stream_policy": self.stream_policy,
            "planning": self.planning,
            "max_variants": self.max_variants,
            "plan_budget_seconds": self.plan_budget_ms / 1000.0,
            "plan_deterministic": self.plan_deterministic,
            "plan_threads": self.plan_threads,
            "range_bytes": self.range_bytes,
            "small_segment": self.small_segment,
            "large_segment": self.large_segment,
        }


@functools.lru_cache(maxsize=None)
def _table() -> tuple:
    return tuple(extension().config_keys())


def keys() -> List[Dict[str, Any]]:
    """The configuration keys, in order, from the C++ table (``csrc/core/config.h``).

    Returns:
        list of dicts: ``name``, ``type`` (``"bool"``, ``"int"``, ``"float"``,
        ``"choice"``), ``unit``, ``default`` (as text), ``min`` and ``max``
        (inclusive, for numbers), ``choices`` (``"a|b"`` or None), ``alias_of``
        (None, or the key this one is another unit of), ``factor`` (alias value
        times factor is the key's value) and ``doc``.
    """
    return [dict(k) for k in _table()]


# What a number may look like in a config string: ASCII digits, or 0x and hex digits.
# int(text, 0) alone would also take "1_000", Unicode digits ("٣" is 3) and signs.
_INT_RE = re.compile(r"[0-9]+|0[xX][0-9a-fA-F]+", re.ASCII)
_FLOAT_RE = re.compile(r"[0-9]+(\.[0-9]*)?|\.[0-9]+", re.ASCII)
_ASCII_SPACE = " \t\n\r\f\v"


def _int_parser(low: int, high: int) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ValueError  # a float byte count is a mistake, not something to round
        if isinstance(value, str):
            text = value.strip(_ASCII_SPACE)
            if not _INT_RE.fullmatch(text):
                raise ValueError
            number = int(text, 0)  # refuses leading zeros ("010": octal or decimal?)
        else:
            number = value
        if not low <= number <= high:
            raise ValueError
        return number
    return parse


def _float_parser(low: float, high: float) -> Callable[[Any], float]:
    def parse(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError
        if isinstance(value, str):
            text = value.strip(_ASCII_SPACE)
            if not _FLOAT_RE.fullmatch(text):
                raise ValueError  # no "nan", "inf", signs or exponents
            number = float(text)
        else:
            number = float(value)
        if not low <= number <= high:  # also refuses NaN
            raise ValueError
        return number
    return parse


def _flag(value: Any) -> bool:
    # ASCII whitespace only, as for numbers and keys: "\xa0false" is refused like "\xa0planning".
    return value if isinstance(value, bool) else BOOL_WORDS[str(value).strip(_ASCII_SPACE).lower()]


def _choice_parser(choices: str) -> Callable[[Any], str]:
    allowed = choices.split("|")

    def parse(value: Any) -> str:
        text = str(value).strip(_ASCII_SPACE).lower()
        if text not in allowed:
            raise ValueError
        return text
    return parse


@functools.lru_cache(maxsize=None)
def _parsers() -> Dict[str, Callable[[Any], Any]]:
    out: Dict[str, Callable[[Any], Any]] = {}
    for k in _table():
        if k["type"] == "int":
            out[k["name"]] = _int_parser(int(k["min"]), int(k["max"]))
        elif k["type"] == "float":
            out[k["name"]] = _float_parser(k["min"], k["max"])
        elif k["type"] == "bool":
            out[k["name"]] = _flag
        else:
            out[k["name"]] = _choice_parser(k["choices"])
    return out


@functools.lru_cache(maxsize=None)
def _units() -> Dict[str, str]:
    """Each key -> every key that sets the same field (itself and its aliases)."""
    return {k["name"]: k["alias_of"] or k["name"] for k in _table()}


def _range_text(name: str) -> str:
    k = next(k for k in _table() if k["name"] == name)
    if k["type"] == "int":
        return f" (an integer in [{int(k['min'])}, {int(k['max'])}]{' ' + k['unit'] if k['unit'] else ''})"
    if k["type"] == "float":
        return f" (a number in [{k['min']:g}, {k['max']:g}] {k['unit']})"
    if k["type"] == "choice":
        return " (one of " + ", ".join(k["choices"].split("|")) + ")"
    return " (a bool: True/False, 1/0, yes/no, on/off)"


def _short_repr(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut in the middle past ``limit`` characters (a 400-digit number)."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a value whose repr fails is still named by type
        return f"<{type(value).__name__}>"
    if len(text) <= limit:
        return text
    return f"{text[:limit // 2]}...{text[-10:]} ({len(text)} characters)"


def _convert(key: str, value: Any) -> Any:
    """Converts one config value, raising ValueError naming the key."""
    parse = _parsers().get(key)
    if parse is None:
        raise ValueError(f"torch_renaissance: unknown config key {key!r}; known keys: "
                         + ", ".join(_parsers()))
    try:
        return parse(value)
    except (ValueError, KeyError, TypeError, OverflowError):
        raise ValueError(f"torch_renaissance: bad value {_short_repr(value)} for config key '{key}'"
                         + _range_text(key)) from None


def _check_one_unit(values: dict, where: str) -> None:
    seen: Dict[str, str] = {}
    for key in values:
        field = _units()[key]
        if field in seen:
            raise ValueError(f"torch_renaissance: config keys '{seen[field]}' and '{key}' are "
                             f"the same limit in two units ({where}); give one")
        seen[field] = key


def parse_conf(text: str) -> dict:
    """Parses ``key:value,key:value`` (PyTorch's allocator-config style).

    Args:
        text: the string, e.g. ``"max_reserved_mb:4096,planning:False"``.

    Returns:
        dict of converted values, keyed by config key.

    Raises:
        ValueError: an entry without ``:``, an unknown key, a bad value (numbers are
            ASCII decimal or ``0x`` hexadecimal; out of the key's range), or a key
            given twice (also a key with its alias, e.g. ``max_reserved_mb`` with
            ``max_reserved_bytes``).
    """
    out: dict = {}
    for part in text.split(","):
        part = part.strip(_ASCII_SPACE)
        if not part:
            continue
        if ":" not in part:
            raise ValueError(f"torch_renaissance: config entry '{part}' is not key:value "
                             f"(in {ENV_VAR}={text!r})")
        key, value = (s.strip(_ASCII_SPACE) for s in part.split(":", 1))
        if key in out:
            raise ValueError(f"torch_renaissance: config key '{key}' is given twice "
                             f"(in {ENV_VAR}={text!r}); give it once")
        out[key] = _convert(key, value)
    _check_one_unit(out, f"in {ENV_VAR}={text!r}")
    return out


def _in_field_unit(key: str, value: Any) -> Any:
    """An alias's value in its key's unit (MiB -> bytes, s -> ms)."""
    k = next(k for k in _table() if k["name"] == key)
    if not k["alias_of"]:
        return value
    if k["type"] == "int":
        return value * int(k["factor"])
    scaled = value * k["factor"]
    return int(scaled) if float(scaled).is_integer() else scaled


def make_config(**overrides: Any) -> Config:
    """Builds a :class:`Config` from ``TORCH_RENAISSANCE_CONF`` and keyword overrides.

    Raises:
        ValueError: unknown key, bad value (out of the key's range), a key given
            twice in the environment, or a key with its alias in one source (the
            message names it).
    """
    env = parse_conf(os.environ.get(ENV_VAR, ""))
    given = {key: _convert(key, value) for key, value in overrides.items()}  # unknown keys first
    _check_one_unit(overrides, "as keyword arguments")
    fields: Dict[str, Any] = {}
    # The environment first; a keyword replaces the environment's value in any unit.
    for source in (env, given):
        for key, value in source.items():
            fields[_units()[key]] = _in_field_unit(key, value)
    return Config(**fields)
