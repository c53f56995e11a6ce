"""Savanna (Ranger): search and generation scores by domain in Table 1's layout (unofficial judges).

    python evals/savanna.py --help

Every option, the run folder and its reports: `ranger_jax.evals.cli` and `ranger_jax.evals.savanna`.
"""

from ranger_jax.evals import cli

if __name__ == "__main__":
    cli.main("savanna")
