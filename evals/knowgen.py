"""KnowGen-Bench (Gen-Searcher) with the K-Score of KnowGen_Eval: a policy (or none) + a generator + a judge.

    python evals/knowgen.py --help

Every option, the run folder and its reports: `ranger_jax.evals.cli` and `ranger_jax.evals.knowgen`.
"""

from ranger_jax.evals import cli

if __name__ == "__main__":
    cli.main("knowgen")
