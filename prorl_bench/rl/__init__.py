"""The RL mathematics: advantages, KL estimators and control, losses, references, resets, optimizer state, growth.

Importing the package registers the code of every advantage estimator, KL estimator, reference
strategy and reset trigger declared in ``config/builtin_options.py`` (each module registers its own at
import), so whatever builds one finds it. Config validation needs none of it.
"""

from prorl_bench.rl import advantages, kl, opt_state, reference, resets  # noqa: F401
