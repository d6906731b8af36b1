"""Tasks with verifiable rewards, their answer extraction, the code sandbox and the hack detectors.

Importing the package registers the code of every task and detector declared in
``config/builtin_options.py`` (each module registers its own at import), so whatever builds a task or a
detector finds it. Config validation needs none of it.
"""

from prorl_bench.tasks import base, code_task, detectors, hack_task, math_jsonl_task, reasoning_gym_task  # noqa: F401
