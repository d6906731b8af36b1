"""``python -m prorl_bench.cli.sample`` = ``prorl-bench-sample`` (see prorl_bench.cli.export.sample_main)."""

import sys

from prorl_bench.cli.export import sample_main

if __name__ == "__main__":
    sys.exit(sample_main())
