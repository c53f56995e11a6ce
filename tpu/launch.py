"""Cloud TPU slices for the learner: create, setup, run on every worker, logs, stop, delete (`--dry-run` prints).

    python tpu/launch.py create --name ranger-a --accelerator v5p-64 --zone us-east5-a --project my-proj --dry-run

See tpu/README.md and `ranger_jax.launch.tpu`.
"""

import sys

from ranger_jax.launch import tpu

if __name__ == "__main__":
    sys.exit(tpu.main())
