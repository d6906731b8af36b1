"""Command-line entry points: the training app, the sweep wrapper, export, sampling, help and preflight checks."""
