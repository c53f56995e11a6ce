"""Benchmark evaluations: KnowGen-Bench, Savanna, Mind-Bench and WISE, scored as each benchmark publishes its score.

    python evals/knowgen.py --bench KnowGen-Bench.json --out runs/kg --generator-url URL --judge-url URL/v1

Modules: `items` (the `Item` every reader produces), `knowgen` / `savanna` / `mind_bench` / `wise` (each benchmark's
reader, judging and published scoring), `base` (what an adapter provides), `agent` (a policy's episode per item, its
chosen references kept), `runner` (the resumable, concurrent loop: episode, generation, judge, one record per item),
`store` (the run folder), `report` (summary, markdown table, bar charts), `gallery` (HTML cards per item), `compare`
(runs side by side) and `cli` (the command line of the scripts in `evals/`). The offline world's exact evaluation
is `rollout.evaluate` (`evals/savanna_sim.py`).
"""

__all__ = ["agent", "base", "cli", "compare", "gallery", "items", "knowgen", "mind_bench", "report", "runner",
           "savanna", "store", "wise"]
