"""`python -m gemma_workloads train|merge --config FILE`: what the workload pods run (runner.py)."""

import sys

from gemma_workloads.runner import cli

sys.exit(cli())
