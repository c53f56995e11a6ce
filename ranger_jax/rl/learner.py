"""The learner: a thin stateful shell around the pure `train_step` that owns the mesh, the state and checkpoints.

    model = qwen3_vl.load(path, mesh=mesh)                  # or qwen3_vl.init(config, mesh=mesh)
    learner = Learner(model, LearnerConfig(objective="sft", learning_rate=1e-5), mesh=mesh, checkpoint_dir=ckpt)
    metrics = learner.step(batch)                           # one optimizer update; {"loss": ..., "grad_norm": ...}
    learner.save(data_state=iterator.get_state())           # async
    sampler.update_weights(learner.params_model(sampler.config, mesh=sampler.mesh))

The learner copies the model's parameters into its own `TrainState` (cast to the configured parameter dtype, each
placed in the sharding the model's partition rules give on `mesh`) and donates that state to every step, so the
model handed in is never invalidated. A batch (the learner batch contract: rows right-padded to T) is checked on the
host before it is placed or compiled for: sizes that do not fit the mesh or `grad_accum_steps` are ValueErrors that
name the field and the numbers. Rows go to the ("data", "fsdp") mesh axes; `jax.jit` compiles once per batch shape.
A shared-prefix batch (`data.shared_prefix`) is taken the same way: its prefix rows and its suffix rows are each
split over those axes (each process's `prefix_index` is offset to its own prefix rows of the global batch).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ranger_jax import checkpoint as checkpoint_lib
from ranger_jax.models.qwen3_vl import config as model_config_lib
from ranger_jax.models.qwen3_vl import loss as loss_lib
from ranger_jax.models.qwen3_vl import model as model_lib
from ranger_jax.parallel import host_data
from ranger_jax.parallel import mesh as mesh_lib
from ranger_jax.rl import objectives
from ranger_jax.rl import train_step as train_step_lib
from ranger_jax.rl.learner_config import LearnerConfig

__all__ = ["Learner", "LearnerConfig", "check_batch", "place_model"]

log = logging.getLogger(__name__)

_ROW_DTYPES = {"input_ids": np.int32, "attention_mask": np.int32, "loss_mask": np.float32, "sampler_logp": np.float32,
               "advantages": np.float32, "token_advantages": np.float32, "row_valid": np.float32}
_IMAGE_DTYPES = {"pixel_values": np.float32, "image_grid_thw": np.int32}
_REQUIRED = {"sft": ("input_ids", "attention_mask", "loss_mask"),
             "grpo": ("input_ids", "attention_mask", "loss_mask", "sampler_logp", "advantages")}
_HOST_ONLY = ("policy_version",)  # in the batch contract, used upstream (staleness) and not by the update
# shared-prefix batches (`data.shared_prefix`): prefix rows [G, P] / [G], and each row's prefix [B]
_PREFIX_DTYPES = {"prefix_input_ids": np.int32, "prefix_attention_mask": np.int32, "prefix_length": np.int32}
_PREFIX_INDEX = "prefix_index"


def _same_architecture(a: model_config_lib.Qwen3VLConfig, b: model_config_lib.Qwen3VLConfig) -> bool:
    runtime = dict(dtype="float32", param_dtype="float32", remat="none", attention="blocked", sharding_rules="train")
    return dataclasses.replace(a, **runtime) == dataclasses.replace(b, **runtime)


def place_model(model: model_lib.Qwen3VL, config: model_config_lib.Qwen3VLConfig,
                mesh: jax.sharding.Mesh | None) -> model_lib.Qwen3VL:
    """A copy of `model`'s parameters as a model built for `config` (same architecture, its own runtime fields:
    dtypes, remat, attention kernel, partition rules), each parameter cast and placed on `mesh` by the rules.

    The copy owns fresh buffers, so donating it never invalidates `model`.

    Raises:
        ValueError: another architecture, or a parameter that does not fit the rules on `mesh` (naming it).
    """
    if not _same_architecture(model.config, config):
        raise ValueError("place_model needs a config of the same architecture as the model (text_config, "
                         "vision_config, token ids, tie_word_embeddings); only runtime fields may differ")
    if mesh is not None:
        mesh_lib.check_mesh(mesh)
    graphdef, abstract_params, shardings = checkpoint_lib.abstract_placement(config, mesh)
    values = jax.device_put(nnx.state(model, nnx.Param), shardings)
    cast = jax.jit(lambda tree: jax.tree.map(lambda x, a: x.astype(a.dtype), tree, abstract_params),
                   out_shardings=shardings)
    return nnx.merge(graphdef, cast(values))


def _batch_shards(mesh: jax.sharding.Mesh | None) -> tuple[int, str]:
    if mesh is None:
        return 1, "1"
    sizes = [mesh.shape[a] for a in train_step_lib.BATCH_AXES]
    return math.prod(sizes), " × ".join(str(s) for s in sizes)


# keys of a step's metrics that are not the objective's token means
_UPDATE_METRICS = frozenset({"loss", "grad_norm", "learning_rate", "tokens"})


def zero_advantage_batch(batch: Mapping[str, Any]) -> bool:
    """Whether every advantage of a GRPO batch is zero (`advantages`, and `token_advantages` when it has them): its
    policy loss and gradient are zero whatever the log-probabilities, unless a KL term is added."""
    if "advantages" not in batch:
        return False
    if np.any(np.asarray(batch["advantages"]) != 0):
        return False
    return "token_advantages" not in batch or not np.any(np.asarray(batch["token_advantages"]) != 0)


def check_batch(batch: Mapping[str, Any], config: LearnerConfig, model_config: model_config_lib.Qwen3VLConfig,
                mesh: jax.sharding.Mesh | None = None) -> None:
    """Checks a learner batch on the host, before anything is placed or compiled.

    Raises:
        ValueError: missing or unknown keys, shapes that disagree (naming the key and both shapes), the model's
            input checks (`model.check_inputs`), batch rows not divisible by `grad_accum_steps`, or microbatch
            rows not divisible by the mesh's data × fsdp.
    """
    required = _REQUIRED[config.objective]
    missing = [k for k in required if k not in batch]
    if missing:
        raise ValueError(f"the batch lacks {missing}; objective {config.objective!r} needs {list(required)}")
    known = set(_ROW_DTYPES) | set(_IMAGE_DTYPES) | set(_HOST_ONLY) | set(_PREFIX_DTYPES) | {_PREFIX_INDEX}
    unknown = sorted(set(batch) - known)
    if unknown:
        raise ValueError(f"the batch holds unknown keys {unknown}; known keys: {sorted(known)}")
    ids = np.asarray(batch["input_ids"])
    if ids.ndim != 2:
        raise ValueError(f"batch input_ids must be [B, T], got shape {ids.shape}")
    rows = ids.shape[0]
    for key in ("attention_mask", "loss_mask", "sampler_logp", "token_advantages"):
        if key in batch and np.shape(batch[key]) != ids.shape:
            raise ValueError(f"batch {key} has shape {np.shape(batch[key])}, input_ids has {ids.shape}")
    for key in ("advantages", "row_valid", "policy_version"):
        if key in batch and np.shape(batch[key]) != (rows,):
            raise ValueError(f"batch {key} has shape {np.shape(batch[key])}, expected ({rows},) (one per row)")
    if "token_advantages" in batch and config.objective != "grpo":
        raise ValueError(f"batch token_advantages is a GRPO key; objective is {config.objective!r}")
    if train_step_lib.is_shared_prefix(batch):
        _check_shared(batch, config, model_config, mesh)
        return
    model_lib.check_inputs(model_config, ids, batch["attention_mask"], batch.get("pixel_values"),
                           batch.get("image_grid_thw"))
    _check_rows(rows, config.grad_accum_steps, mesh)


def _check_shared(batch: Mapping[str, Any], config: LearnerConfig, model_config: model_config_lib.Qwen3VLConfig,
                  mesh: jax.sharding.Mesh | None) -> None:
    """`check_batch` for a shared-prefix batch: prefix keys, suffix rows, images in the prefixes only."""
    missing = [k for k in (*_PREFIX_DTYPES, _PREFIX_INDEX) if k not in batch]
    if missing:
        raise ValueError(f"the shared-prefix batch lacks {missing}")
    if config.grad_accum_steps != 1:
        raise ValueError(f"a shared-prefix batch runs as one microbatch; LearnerConfig.grad_accum_steps is "
                         f"{config.grad_accum_steps} (set it to 1, or give the learner plain rows)")
    prefix_ids = np.asarray(batch["prefix_input_ids"])
    if prefix_ids.ndim != 2:
        raise ValueError(f"batch prefix_input_ids must be [G, P], got shape {prefix_ids.shape}")
    groups, length = prefix_ids.shape
    if np.shape(batch["prefix_attention_mask"]) != prefix_ids.shape:
        raise ValueError(f"batch prefix_attention_mask has shape {np.shape(batch['prefix_attention_mask'])}, "
                         f"prefix_input_ids has {prefix_ids.shape}")
    prefix_length = np.asarray(batch["prefix_length"])
    if prefix_length.shape != (groups,) or np.any(prefix_length < 0) or np.any(prefix_length > length):
        raise ValueError(f"batch prefix_length must be [{groups}] ints in [0, {length}]; got {prefix_length.tolist()}")
    ids = np.asarray(batch["input_ids"])
    index = np.asarray(batch[_PREFIX_INDEX])
    if index.shape != (ids.shape[0],) or np.any(index < 0) or np.any(index >= groups):
        raise ValueError(f"batch prefix_index must be [{ids.shape[0]}] ints in [0, {groups}) (one prefix row per "
                         f"suffix row); got {index.tolist()}")
    model_lib.check_inputs(model_config, prefix_ids, batch["prefix_attention_mask"], batch.get("pixel_values"),
                           batch.get("image_grid_thw"))
    image_rows = np.flatnonzero(np.any(ids == model_config.image_token_id, axis=1))
    if len(image_rows):
        raise ValueError(f"suffix rows {image_rows.tolist()} of a shared-prefix batch hold image placeholders; "
                         "images belong to the prefix rows")
    model_lib.check_inputs(model_config, ids, batch["attention_mask"])
    _check_rows(ids.shape[0], 1, mesh)
    _check_rows(groups, 1, mesh)


def _check_rows(rows: int, accum: int, mesh: jax.sharding.Mesh | None) -> None:
    """Checks the global batch's rows (this process's `rows` times the process count) against accum and mesh."""
    local, rows = rows, host_data.global_rows(rows)
    where = f" ({jax.process_count()} processes × {local} rows)" if rows != local else ""
    if rows % accum:
        raise ValueError(f"LearnerConfig.grad_accum_steps={accum} does not divide the batch's {rows} rows{where}")
    shards, product = _batch_shards(mesh)
    if (rows // accum) % shards:
        raise ValueError(f"batch rows per microbatch ({rows} rows{where} / grad_accum_steps {accum} = "
                         f"{rows // accum}) are not divisible by the mesh's data × fsdp = {product} = {shards}; pad "
                         f"the batch with row_valid = 0 rows to a multiple of {accum * shards}")


class Learner:
    """Owns a sharded `TrainState` and steps it with the compiled `train_step` (see the module docstring).

    Args:
        model: the policy to train (its parameters are copied).
        config: the learner settings.
        mesh: a ("data", "fsdp", "tensor") mesh (`parallel.mesh.make_mesh`); None = one device.
        ref_model: GRPO's reference policy for the KL term (kl_coef > 0); None = a frozen copy of `model`.
        checkpoint_dir: where `save` / `restore` keep checkpoints (local path or bucket URL); None = no checkpoints.
        max_to_keep: checkpoints kept.
        async_save: write checkpoints in the background.

    Raises:
        ValueError: a parameter that does not fit the mesh (naming it and the sizes), or a ref_model where no KL term
            is computed.
    """

    def __init__(self, model: model_lib.Qwen3VL, config: LearnerConfig, *, mesh: jax.sharding.Mesh | None = None,
                 ref_model: model_lib.Qwen3VL | None = None, checkpoint_dir: str | os.PathLike | None = None,
                 max_to_keep: int | None = 3, async_save: bool = True):
        self.config = config
        self.mesh = mesh
        current = model.config
        self.model_config = dataclasses.replace(current, dtype=config.dtype or current.dtype,
                                                param_dtype=config.param_dtype or current.param_dtype,
                                                remat=config.remat or current.remat)
        uses_ref = config.objective == "grpo" and config.kl_coef > 0
        if ref_model is not None and not uses_ref:
            raise ValueError("ref_model is only read by objective='grpo' with kl_coef > 0; got objective="
                             f"{config.objective!r}, kl_coef={config.kl_coef}")
        placed = place_model(model, self.model_config, mesh)
        with self._mesh_context():
            state = train_step_lib.init_state(placed, config)
        # every array committed to its final sharding, so the first step compiles the same program as the rest
        if mesh is None:
            device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
            self.state = jax.device_put(state, jax.tree.map(lambda _: device, state))
        else:
            self.state = jax.device_put(state, train_step_lib.state_shardings(state, mesh,
                                                                              self.model_config.sharding_rules))
        self._ref_params = None
        if uses_ref:
            self._ref_params = nnx.state(place_model(ref_model or model, self.model_config, mesh), nnx.Param)
        self.checkpoints = None
        if checkpoint_dir is not None:
            self.checkpoints = checkpoint_lib.CheckpointManager(checkpoint_dir, max_to_keep=max_to_keep,
                                                                async_save=async_save)
        self._shapes: set[tuple] = set()
        # the GRPO objective's log-probabilities are of logits / temperature; SFT's are the model's own
        self._temperature = config.temperature if config.objective == "grpo" else 1.0

    def _mesh_context(self):
        return jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext()

    @property
    def step_count(self) -> int:
        """Optimizer updates applied so far."""
        return int(self.state.step)

    # ----- steps -----------------------------------------------------------------------------------------------------

    def _place_batch(self, batch: Mapping[str, Any]) -> dict[str, jax.Array]:
        arrays = {k: np.asarray(batch[k], dtype) for k, dtype in _ROW_DTYPES.items() if k in batch}
        arrays.setdefault("row_valid", np.ones(arrays["input_ids"].shape[0], np.float32))
        images = {k: np.asarray(batch[k], dtype) for k, dtype in _IMAGE_DTYPES.items() if batch.get(k) is not None}
        shared = train_step_lib.is_shared_prefix(batch)
        if shared:
            arrays[_PREFIX_INDEX] = np.asarray(batch[_PREFIX_INDEX], np.int32)
            prefixes = {k: np.asarray(batch[k], dtype) for k, dtype in _PREFIX_DTYPES.items()}
        if self.mesh is None:
            out = {k: jnp.asarray(v) for k, v in {**arrays, **images}.items()}
            return {**out, **{k: jnp.asarray(v) for k, v in prefixes.items()}} if shared else out
        vision = self.model_config.vision_config
        features = vision.in_channels * vision.temporal_patch_size * vision.patch_size ** 2
        if not shared:
            # this process's rows; with several processes the global batch is every process's rows (host_data)
            return host_data.global_batch(arrays, images, self.mesh, train_step_lib.BATCH_AXES,
                                          image_features=features)
        # prefix rows are global rows too: each process's suffix rows point at its own, offset by its position
        arrays[_PREFIX_INDEX] = arrays[_PREFIX_INDEX] + jax.process_index() * prefixes["prefix_input_ids"].shape[0]
        placed = host_data.global_batch(arrays, {}, self.mesh, train_step_lib.BATCH_AXES, image_features=features)
        rows = {"input_ids": prefixes["prefix_input_ids"], "attention_mask": prefixes["prefix_attention_mask"],
                "prefix_length": prefixes["prefix_length"]}
        prefix = host_data.global_batch(rows, images, self.mesh, train_step_lib.BATCH_AXES, image_features=features)
        placed["prefix_input_ids"] = prefix.pop("input_ids")
        placed["prefix_attention_mask"] = prefix.pop("attention_mask")
        placed.update(prefix)
        return placed

    def _train_arrays(self, batch: Mapping[str, Any]) -> dict[str, jax.Array]:
        """The checked, placed batch of a train step, with the reference log-probs its KL term reads."""
        check_batch(batch, self.config, self.model_config, self.mesh)
        arrays = self._place_batch(batch)
        if self._ref_params is not None:
            with self._mesh_context():
                arrays["ref_logp"] = _jit_logprobs(self.state.graphdef, self._ref_params, arrays, self._temperature)
        return arrays

    def step(self, batch: Mapping[str, Any]) -> dict[str, float]:
        """One optimizer update from `batch` (host arrays, the learner batch contract).

        Returns:
            The step's metrics as Python floats: loss, grad_norm, learning_rate, tokens, and the objective's own.

        Raises:
            ValueError: from `check_batch`.
        """
        arrays = self._train_arrays(batch)
        shapes = _shape_key(arrays)
        if shapes not in self._shapes:
            self._shapes.add(shapes)
            log.info("learner: compiling the train step for batch shapes %s", dict(shapes))
        with self._mesh_context():
            self.state, metrics = train_step_lib.jit_train_step(self.state, arrays)
        return {k: float(v) for k, v in jax.device_get(metrics).items()}

    def precompile(self, batch: Mapping[str, Any]) -> bool:
        """Compiles the train step for `batch`'s shapes without running it: nothing is updated.

        The program goes to JAX's persistent compilation cache, where a later `step` on a batch of these shapes, by
        this learner or another one of the same configuration and model shapes, loads it instead of compiling it
        again (e.g. the sim-tiny recipe compiles its SFT batches' shapes in a thread while the stages before SFT
        train). Returns False when this learner has compiled or run these shapes already. The batch is checked and
        placed as for a step (a learner with a KL term also computes its reference log-probs, which the program
        takes).

        Raises:
            ValueError: no persistent compilation cache is configured (`jax_compilation_cache_dir`; the program
                would be thrown away), or from `check_batch`.
        """
        if not jax.config.jax_compilation_cache_dir:
            raise ValueError("Learner.precompile needs JAX's persistent compilation cache (jax_compilation_cache_dir, "
                             "e.g. `ranger_jax.compilation_cache.enabled`): without one the program is thrown away")
        arrays = self._train_arrays(batch)
        shapes = _shape_key(arrays)
        if shapes in self._shapes:
            return False
        self._shapes.add(shapes)
        log.info("learner: compiling the train step ahead for batch shapes %s", dict(shapes))
        with self._mesh_context():
            train_step_lib.jit_train_step.lower(_abstract(self.state), _abstract(arrays)).compile()
        return True

    def accumulated_step(self, batches: Sequence[Mapping[str, Any]], *, skip_zero_advantage: bool = False
                         ) -> dict[str, float]:
        """One optimizer update from several batches, as `step` would make it from their rows in one batch (the
        normalisers are the whole update's; only float rounding differs): a batch then bounds what the learner
        holds at once, not how much data an update takes. The batches are placed one at a time; batches of one
        shape share one compiled program. One batch is `step(batch)`.

        `skip_zero_advantage` (GRPO with `kl_coef` 0): a batch whose advantages are all zero adds nothing to the
        loss or the gradient, only its rows and tokens to the normalisers, so its forward and backward are not
        run (`zero_advantage_batch`; GRPO groups whose rewards are all equal, often most of a round, packed into
        batches of their own by the data pipeline). The update is the same; the objective's token means (clip
        fractions, KL, ratios) are then over the batches run, and `skipped_batches` / `skipped_tokens` count the
        rest. If every batch has zero advantages, the first is run (the optimizer still steps).

        Returns:
            The update's metrics, as `step` returns them (with `skipped_batches` and `skipped_tokens` when
            `skip_zero_advantage`).

        Raises:
            ValueError: no batches, or what `check_batch` finds in one (named by its index).
        """
        if not batches:
            raise ValueError("Learner.accumulated_step needs at least one batch; got none")
        if len(batches) == 1:  # nothing to skip: a lone batch is always run
            metrics = self.step(batches[0])
            return {**metrics, "skipped_batches": 0.0, "skipped_tokens": 0.0} if skip_zero_advantage else metrics
        checked = []
        for index, batch in enumerate(batches):
            try:
                check_batch(batch, self.config, self.model_config, self.mesh)
            except ValueError as err:
                raise ValueError(f"batch {index} of {len(batches)}: {err}") from None
            checked.append(batch)
        skip = self._skippable(checked) if skip_zero_advantage else [False] * len(checked)
        with self._mesh_context():
            totals, parts = None, []
            for batch in checked:  # the update's normalisers first: each share is its part of the whole
                part = train_step_lib.jit_batch_totals(self._place_batch(batch))
                parts.append(part)
                totals = part if totals is None else jax.tree.map(jnp.add, totals, part)
            shares = None
            for batch, skipped in zip(checked, skip):
                if skipped:
                    continue
                share = train_step_lib.jit_batch_share(self.state, self._train_arrays(batch), totals)
                shares = share if shares is None else train_step_lib.jit_add_shares(shares, share)
            self.state, metrics = train_step_lib.jit_apply_shares(self.state, shares, totals)
        out = {k: float(v) for k, v in jax.device_get(metrics).items()}
        if skip_zero_advantage:
            skipped_tokens = sum(float(p["tokens"]) for p, s in zip(parts, skip) if s)
            run_share = 1.0 - skipped_tokens / max(out["tokens"], 1.0)
            if 0.0 < run_share < 1.0:  # token means over the batches run, not diluted by the skipped tokens
                for key in out:
                    if key not in _UPDATE_METRICS and key not in objectives.METRIC_REDUCTIONS:
                        out[key] /= run_share
            out["skipped_batches"], out["skipped_tokens"] = float(sum(skip)), skipped_tokens
        return out

    def _skippable(self, batches: Sequence[Mapping[str, Any]]) -> list[bool]:
        """Per batch, whether `accumulated_step` may leave out its forward and backward: a GRPO objective without a
        KL term and every process's share of the batch of zero advantages; never all of them."""
        if self.config.objective != "grpo" or self.config.kl_coef != 0.0:
            return [False] * len(batches)
        skip = [zero_advantage_batch(batch) for batch in batches]
        if jax.process_count() > 1:  # every process must run the same programs: skip only what all can skip
            skip = [all(column) for column in zip(*host_data.gather_json(skip))]
        if all(skip):
            skip[0] = False
        return skip

    def gradient(self, batch: Mapping[str, Any]) -> np.ndarray:
        """The gradient `step(batch)` would apply (before clipping), as one float32 vector over the trained
        parameters; nothing is updated (`rl.diagnostics` measures how consistent these are across batches).

        Raises:
            ValueError: from `check_batch`.
        """
        arrays = self._train_arrays(batch)
        with self._mesh_context():
            gradient = train_step_lib.jit_batch_gradient(self.state, arrays)
        if not gradient.is_fully_addressable:  # several processes: every one gets the whole vector
            from jax.experimental import multihost_utils
            gradient = multihost_utils.process_allgather(gradient, tiled=True)
        return np.asarray(jax.device_get(gradient), np.float32)

    def logprobs(self, batch: Mapping[str, Any]) -> np.ndarray:
        """[B, T] float32 log-probabilities of the batch's tokens under the current parameters (0 at position 0), of
        logits / `config.temperature` for a GRPO learner; with several processes, of this process's rows."""
        if train_step_lib.is_shared_prefix(batch):
            raise ValueError("Learner.logprobs takes plain rows (batching.collate), not a shared-prefix batch")
        ids = np.asarray(batch["input_ids"])
        model_lib.check_inputs(self.model_config, ids, batch["attention_mask"], batch.get("pixel_values"),
                               batch.get("image_grid_thw"))
        _check_rows(ids.shape[0], 1, self.mesh)
        keys = ("input_ids", "attention_mask", "pixel_values", "image_grid_thw")
        arrays = self._place_batch({k: batch[k] for k in keys if batch.get(k) is not None})
        with self._mesh_context():
            logp = _jit_logprobs(self.state.graphdef, self.state.params, arrays, self._temperature)
        if self.mesh is None:
            return np.asarray(jax.device_get(logp))
        # this process's rows, at its own length (other processes may have made the global batch longer)
        return host_data.local_rows(logp, self.mesh, train_step_lib.BATCH_AXES)[:, :ids.shape[1]]

    # ----- weights out -----------------------------------------------------------------------------------------------

    def params_model(self, config: model_config_lib.Qwen3VLConfig | None = None, *,
                     mesh: jax.sharding.Mesh | None = None) -> model_lib.Qwen3VL:
        """A `Qwen3VL` holding a copy of the current parameters (safe to keep across later steps).

        Args:
            config: the runtime the model should have, e.g. a sampler's config (`sharding_rules="sample"`, no
                remat); None = the learner's model config. Its architecture must match.
            mesh: where to place it; None = the learner's mesh.
        """
        return place_model(self.state.model(), config or self.model_config, self.mesh if mesh is None else mesh)

    # ----- checkpoints -----------------------------------------------------------------------------------------------

    def _manager(self) -> checkpoint_lib.CheckpointManager:
        if self.checkpoints is None:
            raise ValueError("this Learner has no checkpoint_dir; pass checkpoint_dir= to save or restore")
        return self.checkpoints

    def _items(self) -> dict[str, Any]:
        return {"params": self.state.params,
                "optimizer": {"step": self.state.step, "opt_state": self.state.opt_state}}

    def save(self, *, data_state: Mapping[str, Any] | None = None, force: bool = False) -> bool:
        """Starts an async checkpoint of the current state as step `step_count`, with the data iterator's state.

        Returns:
            Whether a save was started (the manager's save interval may skip a step unless `force`).
        """
        return self._manager().save(self.step_count, self._items(), data_state=data_state,
                                    model_config=self.model_config, force=force)

    def restore(self, step: int | None = None) -> dict | None:
        """Loads checkpoint `step` (default: the latest) into the state, each array in its current sharding.

        Returns:
            The data iterator's state saved with it (None when none was saved).

        Raises:
            FileNotFoundError: no checkpoint directory, no checkpoint, or no such step (naming the path).
            ValueError: a checkpoint of another model or optimiser layout (naming the key).
        """
        target = {name: checkpoint_lib.abstract_like(tree) for name, tree in self._items().items()}
        restored, data_state = self._manager().restore(target, step=step)
        optimizer = restored["optimizer"]
        self.state = self.state.replace(step=optimizer["step"], params=restored["params"],
                                        opt_state=optimizer["opt_state"])
        return data_state

    def close(self) -> None:
        """Waits for pending checkpoint writes."""
        if self.checkpoints is not None:
            self.checkpoints.close()


def _logprobs(graphdef: nnx.GraphDef, params: nnx.State, batch: Mapping[str, jax.Array],
              temperature: float) -> jax.Array:
    model = nnx.merge(graphdef, params)
    if train_step_lib.is_shared_prefix(batch):  # the suffix rows' log-probs, their prefixes run once
        positions = train_step_lib.shared_positions(model, batch)
        embeds, deepstack = train_step_lib.embed_shared(model, batch)
        hidden = train_step_lib.decode_shared(model, embeds, deepstack, positions, batch)
        return objectives.token_logprobs(model, hidden, batch, temperature=temperature)
    return loss_lib.sequence_logprobs(model, batch["input_ids"], attention_mask=batch["attention_mask"],
                                      pixel_values=batch.get("pixel_values"),
                                      image_grid_thw=batch.get("image_grid_thw"), temperature=temperature)


def _shape_key(arrays: Mapping[str, jax.Array]) -> tuple:
    return tuple(sorted((k, v.shape) for k, v in arrays.items()))


def _abstract(tree: Any) -> Any:
    """`tree`'s arrays as shapes, dtypes and, where committed, shardings: what `jit` keys a program on (an
    uncommitted array lowers without a sharding, so its abstract twin must carry none)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                       sharding=x.sharding if x.committed else None), tree)


_jit_logprobs = jax.jit(_logprobs, static_argnums=(0, 3))
