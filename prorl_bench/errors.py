"""Errors that every layer may raise (the models' samplers as well as the run's guards), kept at the
top of the package so that models/ and rl/ need not import the run to raise them."""

from __future__ import annotations


class NonFiniteError(FloatingPointError):
    """A NaN/inf appeared; the message names the step, stage and tensor."""
