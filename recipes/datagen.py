"""Builds training and benchmark data: news-driven and category-driven prompts, teacher trajectories with rejection,
ground-truth images with quality filtering, and RL / benchmark / SFT splits — live or in the offline world.

    python recipes/datagen.py --out runs/d1 --world worlds/w7 --tokenizer tok            # offline, all stages
    python recipes/datagen.py --out runs/d2 --services services.toml --dry-run            # the plan, no calls
    python recipes/datagen.py synthesize --out runs/d2 --services services.toml --days 1  # live prompts

Options and stages: `python recipes/datagen.py --help` (ranger_jax.datagen.cli).
"""

import sys

from ranger_jax.datagen import cli

if __name__ == "__main__":
    sys.exit(cli.main())
