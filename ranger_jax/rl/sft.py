"""Supervised fine-tuning: a `Learner` with objective "sft" stepped over a Grain batch stream.

    dataset = pipeline.trajectory_dataset(shards.TrajectorySource(folder), spec=spec, grpo_groups=False, ...)
    result = sft.train(learner, dataset, num_steps=300, metrics=metrics.MetricsWriter(out), checkpoint_every=100)

The data iterator's state is saved with every checkpoint, so a run killed mid-way and started again with
`resume=True` continues from the same batch with the same parameters and optimiser state (its next loss equals
the uninterrupted run's).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import tqdm

from ranger_jax.rl import learner as learner_lib
from ranger_jax.rl import metrics as metrics_lib


REHEARSAL_KEY = "rehearsal"  # where a checkpoint's data state keeps the rehearsal stream's position
RECENT_KEY = "recent_losses"  # where it keeps the losses of the last steps (`SftResult.recent_losses`)
RECENT_STEPS = 50  # steps `SftResult.recent_losses` keeps


@dataclasses.dataclass(frozen=True)
class SftResult:
    """What an SFT run did: steps taken (in total, resumed ones included), the last metrics, its wall time, and the
    losses of its last `RECENT_STEPS` steps (`recent_loss`: their mean), those before a resume included: they are
    saved with each checkpoint."""

    num_steps: int
    last: dict[str, float]
    wall_s: float
    tokens_per_s: float
    recent_losses: tuple[float, ...] = ()

    @property
    def recent_loss(self) -> float | None:
        """The mean loss of the last steps (None when none are known: no step taken, or a checkpoint saved
        without them): a training run's level, where the last step's loss is one noisy batch."""
        return sum(self.recent_losses) / len(self.recent_losses) if self.recent_losses else None


def train(learner: learner_lib.Learner, dataset: Iterable[dict[str, Any]], *, num_steps: int,
          metrics: metrics_lib.MetricsWriter | None = None, checkpoint_every: int | None = None,
          resume: bool = False, progress: bool = True, log_prefix: str = "sft",
          rehearsal: Iterator[dict[str, Any]] | None = None, stop_below: float | None = None) -> SftResult:
    """Runs `learner` (objective "sft") until it has taken `num_steps` SFT updates in total.

    Args:
        learner: the learner; with `checkpoint_every` or `resume` it needs a checkpoint_dir.
        dataset: a batch stream (e.g. `pipeline.trajectory_dataset`); a Grain dataset's iterator state is saved
            with each checkpoint and restored on resume.
        num_steps: total updates (a resumed run counts the steps already taken).
        metrics: where per-step metrics go (`<log_prefix>/loss`, …).
        checkpoint_every: save every this many steps and at the end; None = no checkpoints.
        resume: restore the latest checkpoint (parameters, optimiser, data position) first, if there is one.
        progress: show a progress bar.
        rehearsal: an endless batch stream (e.g. `copy_warmup.RepeatedRandomTokens`) of which one batch is trained
            on after every SFT update, so a skill taught before SFT is not trained away by it (measured: the tiny
            policy's copying, learned in the copy warm-up, is gone after 600 plain SFT steps). Its loss is logged
            as `<log_prefix>/rehearsal_loss`; the learner then takes two updates per SFT step (the learning-rate
            schedule should count both).
        stop_below: stop before `num_steps` once the mean loss of the last `RECENT_STEPS` steps (a full window) is
            at or below this (None: never); the stop is saved as a checkpoint when `checkpoint_every` is set.

    Raises:
        ValueError: a learner whose objective is not "sft", or a dataset that runs out before `num_steps`.
    """
    if learner.config.objective != "sft":
        raise ValueError(f"sft.train needs a learner with objective 'sft'; got {learner.config.objective!r}")
    iterator = iter(dataset)
    per_step = 2 if rehearsal is not None else 1  # learner updates per SFT step
    recent = collections.deque(maxlen=RECENT_STEPS)
    if resume and learner.checkpoints is not None and learner.checkpoints.latest_step() is not None:
        data_state = learner.restore()
        if isinstance(data_state, dict) and (REHEARSAL_KEY in data_state or RECENT_KEY in data_state):
            if REHEARSAL_KEY in data_state and rehearsal is not None and hasattr(rehearsal, "set_state"):
                rehearsal.set_state(data_state[REHEARSAL_KEY])
            recent.extend(float(loss) for loss in data_state.get(RECENT_KEY, ()))
            data_state = data_state["data"]
        if data_state is not None and hasattr(iterator, "set_state"):
            iterator.set_state(data_state)
    start, started = learner.step_count // per_step, time.monotonic()
    if metrics is not None:  # an earlier attempt's rows past the restored step are about to be written again
        metrics.discard(log_prefix, after_step=start)
    tokens, last = 0.0, {}
    bar = tqdm.tqdm(total=num_steps, initial=start, desc=log_prefix, unit="step", disable=not progress)
    with bar:
        while learner.step_count // per_step < num_steps:
            try:
                batch = next(iterator)
            except StopIteration as err:
                raise ValueError(f"the SFT data ran out after {learner.step_count} of {num_steps} steps; "
                                 "use more epochs (num_epochs) or fewer steps") from err
            last = learner.step(batch)
            tokens += last.get("tokens", 0.0)
            recent.append(float(last["loss"]))
            if rehearsal is not None:
                last["rehearsal_loss"] = learner.step(next(rehearsal))["loss"]
            step = learner.step_count // per_step
            bar.update(1)
            bar.set_postfix(loss=f"{last['loss']:.4f}")
            if metrics is not None:
                metrics.write(step, {f"{log_prefix}/{k}": v for k, v in last.items()})
            stop = (stop_below is not None and len(recent) == RECENT_STEPS
                    and sum(recent) / RECENT_STEPS <= stop_below)
            if checkpoint_every and (step % checkpoint_every == 0 or step == num_steps or stop):
                state = {"data": iterator.get_state() if hasattr(iterator, "get_state") else None,
                         RECENT_KEY: list(recent)}
                if rehearsal is not None and hasattr(rehearsal, "get_state"):
                    state[REHEARSAL_KEY] = rehearsal.get_state()
                learner.save(data_state=state, force=True)
            if stop:
                break
    wall = time.monotonic() - started
    done = learner.step_count // per_step
    return SftResult(num_steps=done, last=last, wall_s=wall,
                     tokens_per_s=tokens / wall if wall > 0 and done > start else 0.0, recent_losses=tuple(recent))


def dataset_for(data: str | os.PathLike, *, tokenizer: Any, batch_size: int, length_buckets: tuple[int, ...],
                vision: Any, dataset_name: str | None = None, seed: int = 0) -> Any:
    """The SFT batch stream of `data`: a folder of trajectory shards, a Gen-Searcher SFT file (JSON array or JSON
    lines of ShareGPT rows), or a LLaMA-Factory `dataset_info.json` with `dataset_name`.

    Raises:
        FileNotFoundError: `data` does not exist.
        ValueError: a dataset_info.json without `dataset_name`.
    """
    from ranger_jax.data import batching, pipeline, sft_file, shards
    from ranger_jax.processing import chat

    path = Path(data)
    if not path.exists():
        raise FileNotFoundError(f"SFT data {path} does not exist")
    spec = batching.BatchSpec.for_tokenizer(tokenizer, batch_size=batch_size, length_buckets=length_buckets,
                                            vision=vision)
    if path.is_dir():
        return pipeline.trajectory_dataset(shards.TrajectorySource(path), spec=spec, vision=vision,
                                           grpo_groups=False, seed=seed)
    if path.name == "dataset_info.json":
        if not dataset_name:
            raise ValueError(f"{path} lists several datasets; name one (e.g. gen_sft)")
        source = sft_file.SftFile(sft_file.SftColumns.from_dataset_info(path, dataset_name))
    else:
        source = sft_file.SftFile(path)
    renderer = chat.ChatRenderer(tokenizer, merge_size=vision.merge_size)
    return pipeline.sft_dataset(source, renderer=renderer, spec=spec, vision=vision, seed=seed)
