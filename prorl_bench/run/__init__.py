"""One run: the trainer's phases, lifecycle, guards, evaluation, accounting, records and outputs."""
