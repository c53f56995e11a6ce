"""WISE: WiScore per category and overall, as the published scorer computes it.

    python evals/wise.py --help

Every option, the run folder and its reports: `ranger_jax.evals.cli` and `ranger_jax.evals.wise`.
"""

from ranger_jax.evals import cli

if __name__ == "__main__":
    cli.main("wise")
