"""Public-API edges a careless user meets: a decorator that cannot mark the
step it is put on, output paths that cannot be written (checked before any
work is done), devices that are not devices."""
from __future__ import annotations

import pytest

import torch_renaissance as tr


def test_planned_refuses_a_generator_function():
    # Its call returns a generator at once; the body would run later,
    # outside the step (it used to record nothing, silently).
    def gen():
        yield 1

    with pytest.raises(TypeError, match=r"gen is a generator function.*outside the step"):
        tr.planned(gen)


def test_planned_refuses_a_coroutine_function():
    async def coro():
        return 1

    with pytest.raises(TypeError, match=r"coro is a coroutine function"):
        tr.planned(key="k")(coro)


def test_planned_keeps_a_plain_function():
    def f(x):
        return x + 1

    g = tr.planned(f)
    assert g.__name__ == "f" and g.__wrapped__ is f
