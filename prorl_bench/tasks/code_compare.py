"""The comparison of a sandboxed call's result with a test's expected value: total and strict.

Total: every pair of (returned, expected) values gets an answer, ``True`` or ``False``, never an exception
(overflowing, non-finite or unparsable results are simply wrong). Strict: the JSON types must match exactly
— an ``int`` test wants an ``int`` (not a float near it, not ``True``/``False``), a ``bool`` test a ``bool``,
a ``float`` test a ``float``; lists (a returned tuple is a JSON array too) and objects (string keys) compare
element by element. The one tolerance: a float in the expected value matches a finite returned float within
``FLOAT_REL_TOL`` relative or ``FLOAT_ABS_TOL`` absolute (``math.isclose``).

Cost is bounded by the expected value, not by what a sample returns: the runner encodes results with sorted
keys exactly as ``canonical`` does, so an expected value without floats matches only its canonical bytes
(no parsing at all); one with floats is parsed only if the result is at most ``FLOAT_SLACK`` bytes per float
longer than the canonical expected bytes.
"""

from __future__ import annotations

import json
import math
from typing import Any

FLOAT_REL_TOL = 1e-6
FLOAT_ABS_TOL = 1e-9
FLOAT_SLACK = 32  # bytes per expected float: the longest repr of a float is 24 characters


def canonical(value: Any) -> bytes:
    """The bytes the runner sends for a call that returned ``value`` (sorted keys, no NaN/Infinity);
    raises ValueError for a value with no such encoding (a non-finite float)."""
    return json.dumps({"value": value}, sort_keys=True, allow_nan=False).encode()


def count_floats(value: Any) -> int:
    if type(value) is float:
        return 1
    if isinstance(value, list):
        return sum(count_floats(v) for v in value)
    if isinstance(value, dict):
        return sum(count_floats(v) for v in value.values())
    return 0


def same(got: Any, expected: Any) -> bool:
    """Strict, total equality of two JSON values (the documented float tolerance only where expected)."""
    if type(got) is not type(expected):
        return False
    if type(expected) is float:
        return math.isfinite(got) and math.isclose(got, expected, rel_tol=FLOAT_REL_TOL, abs_tol=FLOAT_ABS_TOL)
    if type(expected) is list:
        return len(got) == len(expected) and all(same(g, e) for g, e in zip(got, expected))
    if type(expected) is dict:
        return got.keys() == expected.keys() and all(same(got[k], expected[k]) for k in expected)
    return got == expected


class Expected:
    """One test's expected value, ready to judge raw result payloads (``{"value": ...}`` bytes)."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.canon = canonical(value)
        self.floats = count_floats(value)

    def matches(self, payload: bytes) -> bool:
        if payload == self.canon:
            return True
        if not self.floats or len(payload) > len(self.canon) + FLOAT_SLACK * self.floats:
            return False
        try:
            got = json.loads(payload)
        except (ValueError, RecursionError):  # malformed, too deep, an int past the digit limit
            return False
        return isinstance(got, dict) and got.keys() == {"value"} and same(got["value"], self.value)
