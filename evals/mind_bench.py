"""Mind-Bench (Mind-Brush): the share of items whose every checklist entry the judge confirms.

    python evals/mind_bench.py --help

Every option, the run folder and its reports: `ranger_jax.evals.cli` and `ranger_jax.evals.mind_bench`.
"""

from ranger_jax.evals import cli

if __name__ == "__main__":
    cli.main("mind_bench")
