"""The comparison of task=code results (prorl_bench/tasks/code_compare.py): strict, total, and bounded by the
expected value's size. Pure functions: no sandbox needed."""

from __future__ import annotations

import json

import pytest

import prorl_bench.tasks.code_compare as cc
from prorl_bench.tasks.code_compare import Expected, canonical, same


def payload(value) -> bytes:
    """What the runner sends for a call that returned ``value`` (its encoder: sorted keys, NaN allowed)."""
    return json.dumps({"value": value}, sort_keys=True).encode()


@pytest.mark.parametrize(
    "got,expected,want",
    [
        (3628800, 3628800, True),
        (3628800.0, 3628800, False),
        (3628803.3, 3628800, False),
        (False, 0, False),
        (0, False, False),
        (True, True, True),
        (2, 2.0, False),
        (2.0 + 1e-12, 2.0, True),
        (0.0, 1e-10, True),  # the absolute tolerance near zero
        (1.0, 1.0 + 2e-6, False),
        ([1, [2.0, {"a": None}]], [1, [2.0, {"a": None}]], True),
        ([1, 2], [1, 2, 3], False),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}, True),
        ({"a": 1}, {"a": 1, "b": 2}, False),
        ("x", "x", True),
        (None, 0, False),
        (float("nan"), 1.0, False),
        (float("inf"), 1e308, False),
        (10**400, 1.5, False),  # math.isclose(10**400, 1.5) would raise OverflowError
    ],
)
def test_same_is_strict_and_total(got, expected, want):
    assert same(got, expected) is want
    assert Expected(expected).matches(payload(got)) is want


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\xff\xfe",
        b'{"value": ' + b"9" * 5000 + b"}",  # past int<->str's digit limit
        b'{"value": ' + b"[" * 100000 + b"]" * 100000 + b"}",
        b'{"value": NaN}',
        b'{"value": -Infinity}',
        b'{"value": 1e999}',
        b'{"error": "ValueError"}',
        b'{"value": 2.0, "extra": 1}',
        b"[2.0]",
    ],
)
def test_no_payload_raises(raw):
    for expected in (2.0, [2.0], 2, {"a": [1.5]}):
        assert Expected(expected).matches(raw) is False


def test_results_longer_than_the_expected_value_are_never_parsed(monkeypatch):
    """The scorer's cost is bounded by the expected value: a long result is rejected on its length alone."""
    exp = Expected([1.5, 2.5])
    long_but_close = payload([1.5, 2.5] + [0] * 100)
    monkeypatch.setattr(cc.json, "loads", lambda *_: pytest.fail("parsed a result longer than the bound"))
    assert exp.matches(long_but_close) is False
    assert Expected([1, 2]).matches(payload([1, 2.0])) is False  # no float expected: bytes only, never parsed


def test_canonical_refuses_non_finite_expectations():
    with pytest.raises(ValueError):
        canonical(float("nan"))
    assert canonical({"b": 1, "a": [2.5]}) == b'{"value": {"a": [2.5], "b": 1}}'
