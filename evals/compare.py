"""Eval runs of one benchmark side by side: a markdown table, a grouped bar chart and a per-item image page.

    python evals/compare.py runs/knowgen-sft runs/knowgen-grpo --out runs/compare

Details: `ranger_jax.evals.compare`.
"""

import argparse

from ranger_jax.evals import compare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("runs", nargs="+", help="run folders (each with its summary.json)")
    parser.add_argument("--out", help="folder for compare.md, compare.png and compare.html")
    parser.add_argument("--labels", nargs="+", help="names of the runs, in order")
    args = parser.parse_args()
    try:
        print(compare.compare_runs(args.runs, out_dir=args.out, labels=args.labels))
    except (ValueError, FileNotFoundError) as err:
        parser.error(str(err))


if __name__ == "__main__":
    main()
