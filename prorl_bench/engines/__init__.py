"""The engines: trainers a job runs on, registered as options of the ``engine`` axis
(``registry.ENGINES``; the protocol is ``engines/base.py``). Importing the package registers the
built-in ones; neither imports torch or TRL until a job runs."""

import prorl_bench.engines.native  # noqa: F401  (registers engine=native)
import prorl_bench.engines.trl.engine  # noqa: F401  (registers engine=trl)
