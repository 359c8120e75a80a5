"""One config vocabulary: the key table of csrc/core/config.h drives the C++
ArenaConfig validation (``_C.Arena(...)`` keyword arguments), the Python parser
(``install()`` keywords, ``TORCH_RENAISSANCE_CONF``) and the README's table. Every
bad-input case is an error naming the key in every layer, never a clamp."""
from __future__ import annotations

import math
import os

import pytest
from hypothesis import given, settings, strategies as st

from torch_renaissance import config as trc
from torch_renaissance.config import Config, make_config, parse_conf

MiB = 1 << 20

# The table as written down by hand (name: type, unit, default, min, max, alias_of);
# a change to csrc/core/config.h must change this on purpose.
EXPECTED = {
    "max_reserved_mb": ("int", "MiB", "0", 0, 2**43, "max_reserved_bytes"),
    "max_reserved_bytes": ("int", "bytes", "0", 0, 2**63, None),
    "expandable_segments": ("bool", "", "True", None, None, None),
    "stream_policy": ("choice", "", "defer", None, None, None),
    "planning": ("bool", "", "True", None, None, None),
    "max_variants": ("int", "count", "8", 1, 2**20, None),
    "plan_budget_ms": ("int", "ms", "250", 0, 3_600_000, None),
    "plan_budget_seconds": ("float", "s", "0.25", 0.0, 3600.0, "plan_budget_ms"),
    "plan_deterministic": ("bool", "", "False", None, None, None),
    "plan_threads": ("int", "count", "2", 1, 2, None),
    "range_bytes": ("int", "bytes", "0", 0, 2**48, None),
    "small_segment": ("int", "bytes", "2097152", 1 * MiB, 2**40, None),
    "large_segment": ("int", "bytes", "20971520", 10 * MiB, 2**40, None),
}
INT_KEYS = [k for k, v in EXPECTED.items() if v[0] == "int"]


def test_the_table_is_the_one_written_here():
    got = {k["name"]: (k["type"], k["unit"], k["default"],
                       None if k["type"] in ("bool", "choice") else k["min"],
                       None if k["type"] in ("bool", "choice") else k["max"], k["alias_of"])
           for k in trc.keys()}
    assert got == EXPECTED
    assert [k["name"] for k in trc.keys()] == list(EXPECTED)  # the order messages list them in
    assert next(k for k in trc.keys() if k["name"] == "stream_policy")["choices"] == "defer|wait"


def test_defaults_agree_in_every_layer(C):
    fields = {k: v[2] for k, v in EXPECTED.items() if v[5] is None}
    # C++: ArenaConfig{}'s fields, written as text.
    assert C.default_arena_config() == fields
    # Python: Config()'s fields are the table's keys that are not aliases, with its defaults.
    cfg = Config()
    assert set(vars(cfg)) == set(fields)
    assert {k: str(v) for k, v in vars(cfg).items()} == fields
    assert make_config() == cfg
    # Python -> C++: what install() passes is ArenaConfig{}.
    assert C.arena_config_of(**cfg.arena_kwargs()) == fields


@pytest.mark.parametrize("key", INT_KEYS)
def test_integer_bounds_are_errors_in_every_layer(C, key, monkeypatch):
    lo, hi = EXPECTED[key][3], EXPECTED[key][4]
    bad = [hi + 1, -1] + ([lo - 1] if lo > 0 else [])
    for value in bad:
        with pytest.raises(ValueError, match=key):
            C.arena_config_of(**{key: value})
        with pytest.raises(ValueError, match=key):
            C.Arena(C.HostDevice(), **{key: value})
        with pytest.raises(ValueError, match=f"bad value {value!r} for config key '{key}'"):
            make_config(**{key: value})
        if value >= 0:
            with pytest.raises(ValueError, match=f"config key '{key}'"):
                parse_conf(f"{key}:{value}")
            monkeypatch.setenv("TORCH_RENAISSANCE_CONF", f"{key}:{value}")
            with pytest.raises(ValueError, match=f"config key '{key}'"):
                make_config()
            monkeypatch.delenv("TORCH_RENAISSANCE_CONF")
    for value in (lo, hi):  # the bounds themselves are accepted (by the parsers)
        C.arena_config_of(**{key: value})
        assert parse_conf(f"{key}:{value}") == {key: value}
        make_config(**{key: value})


@pytest.mark.parametrize("value", [-0.001, 3600.001, math.nan, math.inf, True])
def test_float_key_bounds_are_errors_in_every_layer(C, value):
    with pytest.raises(ValueError, match="plan_budget_seconds"):
        C.arena_config_of(plan_budget_seconds=value)
    with pytest.raises(ValueError, match="plan_budget_seconds"):
        make_config(plan_budget_seconds=value)


@pytest.mark.parametrize("text", ["nan", "inf", "-1", "1e3", "3600.5", "1.2.3", "٣"])
def test_float_key_text_is_plain_ascii_decimal(text):
    with pytest.raises(ValueError, match="config key 'plan_budget_seconds'"):
        parse_conf(f"plan_budget_seconds:{text}")


def test_max_variants_zero_is_an_error_not_a_clamp(C):
    # Before the table, C++ took max_variants=0 and kept one variant.
    with pytest.raises(ValueError, match="max_variants"):
        C.Arena(C.HostDevice(), max_variants=0)
    with pytest.raises(ValueError, match="bad value 0 for config key 'max_variants'"):
        make_config(max_variants=0)
    C.Arena(C.HostDevice(), max_variants=1)


def test_keys_once_only_cpp_has_are_accepted_by_python(C, monkeypatch):
    monkeypatch.setenv("TORCH_RENAISSANCE_CONF",
                       "range_bytes:0x40000000,small_segment:4194304,plan_budget_seconds:0.5")
    cfg = make_config(large_segment=32 * MiB)
    assert (cfg.range_bytes, cfg.small_segment, cfg.large_segment) == (1 << 30, 4 * MiB, 32 * MiB)
    assert cfg.plan_budget_ms == 500
    got = C.arena_config_of(**cfg.arena_kwargs())
    assert got["range_bytes"] == str(1 << 30) and got["small_segment"] == str(4 * MiB)
    assert got["large_segment"] == str(32 * MiB) and got["plan_budget_ms"] == "500"
    # ...and reach the arena: a fixed small segment of 4 MiB holds one small block.
    a = C.Arena(C.HostDevice(), **{**cfg.arena_kwargs(), "expandable_segments": False})
    p = a.allocate(512)
    assert [s["total_size"] for s in a.snapshot()] == [4 * MiB]
    a.deallocate(p)
    assert a.stats()["allocated_bytes"]["all"]["current"] == 0


def test_plan_budget_in_two_units_is_one_key(C, monkeypatch):
    assert make_config(plan_budget_seconds=1.5).plan_budget_ms == 1500
    assert make_config(plan_budget_seconds=0.0005).plan_budget_ms == 0.5
    assert C.arena_config_of(plan_budget_seconds=1.5) == C.arena_config_of(plan_budget_ms=1500)
    with pytest.raises(ValueError, match="same limit in two units"):
        make_config(plan_budget_ms=10, plan_budget_seconds=0.01)
    with pytest.raises(ValueError, match="same limit in two units"):
        parse_conf("plan_budget_ms:10,plan_budget_seconds:0.01")
    with pytest.raises(ValueError, match="same limit in two units"):
        C.arena_config_of(plan_budget_ms=10, plan_budget_seconds=0.01)
    with pytest.raises(ValueError, match="same limit in two units"):
        C.Arena(C.HostDevice(), max_reserved_mb=1, max_reserved_bytes=MiB)
    # A keyword in one unit replaces the environment's value in the other.
    monkeypatch.setenv("TORCH_RENAISSANCE_CONF", "plan_budget_seconds:2")
    assert make_config().plan_budget_ms == 2000
    assert make_config(plan_budget_ms=7).plan_budget_ms == 7


@pytest.mark.parametrize("key, value", [
    ("expandable_segments", 1), ("planning", "no"), ("stream_policy", "Eager"),
    ("stream_policy", 0), ("max_variants", 2.0), ("small_segment", "2097152"),
    ("no_such_key", 1),
])
def test_wrong_types_and_unknown_keys_in_cpp_name_the_key(C, key, value):
    with pytest.raises(ValueError, match=key):
        C.arena_config_of(**{key: value})


@settings(max_examples=60, deadline=None)
@given(key=st.sampled_from(INT_KEYS), offset=st.integers(-3, 3), at_max=st.booleans())
def test_python_and_cpp_accept_the_same_integers(key, offset, at_max):
    from torch_renaissance import _C as C

    lo, hi = EXPECTED[key][3], EXPECTED[key][4]
    value = (hi if at_max else lo) + offset
    try:
        C.arena_config_of(**{key: value})
        cpp_ok = True
    except ValueError:
        cpp_ok = False
    try:
        make_config(**{key: value})
        py_ok = True
    except ValueError:
        py_ok = False
    assert cpp_ok == py_ok == (lo <= value <= hi)


def test_readme_table_is_generated_from_the_table():
    import importlib.util

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location("config_table",
                                                  os.path.join(root, "tools", "config_table.py"))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    assert tool.readme_with_table(readme, trc.keys()) == readme, \
        "README's config table is stale: run python tools/config_table.py --write"
    for name in EXPECTED:
        assert f"| `{name}` |" in readme


def test_unknown_keyword_and_huge_numbers_are_value_errors(C):
    # install(foo=1) raised KeyError (the unit check ran before the key check);
    # 10**400 raised OverflowError in Python and pybind's cast RuntimeError in C++.
    with pytest.raises(ValueError, match="unknown config key 'foo'"):
        make_config(foo=1)
    with pytest.raises(ValueError, match="unknown config key 'foo'"):
        make_config(foo=1, max_reserved_mb=1)
    for key in ("plan_budget_seconds", "plan_budget_ms", "max_reserved_mb"):
        with pytest.raises(ValueError, match=f"bad value 1000.*characters.*'{key}'") as e:
            make_config(**{key: 10**400})
        assert len(str(e.value)) < 250  # the 401 digits are cut
    for key in ("plan_budget_seconds", "max_reserved_bytes"):
        with pytest.raises(ValueError, match=f"'{key}'.*out of range"):
            C.Arena(C.HostDevice(), **{key: 10**400})


def test_keywords_take_the_environments_spellings_and_refuse_other_types(monkeypatch):
    # README: a keyword value is a Python value or the string the environment would give;
    # any other type (a float or a bool for an integer key, bytes) is a ValueError.
    monkeypatch.delenv("TORCH_RENAISSANCE_CONF", raising=False)
    assert make_config(max_variants="8").max_variants == 8 == make_config(max_variants=8).max_variants
    assert make_config(expandable_segments="no").expandable_segments is False
    assert make_config(expandable_segments="on").expandable_segments is True
    for bad in (True, 1.0, "8.0", b"8", [8]):
        with pytest.raises(ValueError, match="bad value .* for config key 'max_variants'"):
            make_config(max_variants=bad)
    with pytest.raises(ValueError, match="config key 'expandable_segments'"):
        make_config(expandable_segments="maybe")
