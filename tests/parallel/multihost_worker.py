"""One process of the multi-process learner test (started by `test_multihost.py` through
`distributed.run_local`): GRPO steps on a mesh spanning both processes, a checkpoint, published weights, and a
resume from the checkpoint. Writes `<out>/process-<i>.json` with the losses and a digest of the parameters.

    python tests/parallel/multihost_worker.py FIXTURE_FOLDER OUT_FOLDER
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from absl import flags

from ranger_jax.parallel import distributed

# before anything touches jax devices: the cluster (explicit, from the launcher's variables) and the CPU devices
INFO = distributed.initialize()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from support import multihost  # noqa: E402

from ranger_jax.models.qwen3_vl import load  # noqa: E402
from ranger_jax.parallel import mesh as mesh_lib  # noqa: E402
from ranger_jax.rl import weights  # noqa: E402
from ranger_jax.rl.learner import Learner  # noqa: E402


def params_digest(learner: Learner) -> str:
    """sha256 of every parameter's full value as this process gathers it (shards of other processes included)."""
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(learner.state.params.to_pure_dict()):
        digest.update(np.asarray(multihost_utils.process_allgather(leaf, tiled=True)).tobytes())
    return digest.hexdigest()


def main(folder: Path, out: Path) -> None:
    flags.FLAGS.mark_as_parsed()  # Grain reads absl flags
    mesh = mesh_lib.make_mesh(**multihost.MESH)
    model = load(folder / "model", mesh=mesh)
    result = {"process_index": INFO.process_index, "process_count": INFO.process_count,
              "devices": INFO.device_count}

    learner = Learner(model, multihost.GRPO, mesh=mesh, checkpoint_dir=out / "checkpoints", async_save=False)
    iterator = iter(multihost.batches(folder))
    result["losses"] = [learner.step(next(iterator))["loss"] for _ in range(multihost.STEPS_BEFORE_SAVE)]
    learner.save(data_state=iterator.get_state(), force=True)
    learner.checkpoints.wait()
    result["losses"] += [learner.step(next(iterator))["loss"]
                         for _ in range(multihost.STEPS - multihost.STEPS_BEFORE_SAVE)]
    weights.publish(learner.params_model(), out / "weights", learner.step_count)
    result["params_digest"] = params_digest(learner)

    resumed = Learner(model, multihost.GRPO, mesh=mesh, checkpoint_dir=out / "checkpoints", async_save=False)
    again = iter(multihost.batches(folder))
    again.set_state(resumed.restore())
    result["resumed_step"] = resumed.step_count
    result["resumed_loss"] = resumed.step(next(again))["loss"]
    learner.close()
    resumed.close()
    (out / f"process-{INFO.process_index}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
