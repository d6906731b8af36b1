"""``python -m prorl_bench.sample`` = ``prorl-bench-sample`` (see prorl_bench.export.sample_main)."""

import sys

from prorl_bench.export import sample_main

if __name__ == "__main__":
    sys.exit(sample_main())
