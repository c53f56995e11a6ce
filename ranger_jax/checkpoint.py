"""Training checkpoints with Orbax: async saves, keep-N, the data iterator's position, and HF export.

    manager = CheckpointManager("/ckpt/run1", max_to_keep=3)          # or a bucket URL such as gs://...
    manager.save(step, {"params": params, "optimizer": opt}, data_state=iterator_state, model_config=config)
    state, data_state = manager.restore({"params": abstract_params, "optimizer": abstract_opt})  # latest step
    manager.export_hf(step, "/export/step_100", tokenizer_dir="/models/Qwen3-VL-8B-Instruct")

Each step is one Orbax directory `<directory>/<step>` with one item per array tree (`StandardSave`, written by
tensorstore; each process writes its own shards) plus two JSON items: "data_state" (the data iterator's state,
any JSON-able dict; with several processes every process's own, gathered by process index) and "model_config"
(the model's `config.json` and runtime fields, so a step can be exported without the code that trained it).
Saves are asynchronous: `save` returns once the arrays are copied off the devices, so the caller may donate or
overwrite them; Orbax writes to a temporary directory and renames it when
complete, so a process killed mid-save leaves the previous step as the latest. Restoring takes abstract targets
(`jax.ShapeDtypeStruct` with shardings, see `abstract_like`) and places each array straight into its sharding.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from flax import nnx

from ranger_jax import storage
from ranger_jax.models import qwen3_vl
from ranger_jax.models.qwen3_vl import config as config_lib
from ranger_jax.models.qwen3_vl import model as model_lib
from ranger_jax.parallel import host_data
from ranger_jax.parallel import rules as rules_lib
from ranger_jax.processing import tokenizer as tokenizer_lib

log = logging.getLogger(__name__)

DATA_STATE = "data_state"
PER_PROCESS = "per_process"  # with several processes the data_state item holds {PER_PROCESS: [state of each process]}
MODEL_CONFIG = "model_config"
DEFAULT_ITEMS = ("params", "optimizer")
TOKENIZER_FILES = tokenizer_lib.TOKENIZER_FILES
_RUNTIME_FIELDS = ("dtype", "param_dtype", "remat", "attention", "sharding_rules")


def abstract_like(tree: Any, shardings: Any = None) -> Any:
    """`tree`'s arrays as `jax.ShapeDtypeStruct`s (with `shardings`, a matching tree, else each array's own)."""
    if shardings is None:
        return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def _flat(tree: Any) -> dict[str, Any]:
    return ocp.tree.to_flat_dict(tree, sep=".")


def abstract_placement(config: config_lib.Qwen3VLConfig, mesh: jax.sharding.Mesh | None
                       ) -> tuple[nnx.GraphDef, nnx.State, Any]:
    """(graphdef, abstract params, shardings) of a `Qwen3VL` built for `config`: parameters placed by the config's
    partition rules on `mesh`, or all on the first device without one. Nothing is allocated."""
    abstract = nnx.eval_shape(lambda: model_lib.Qwen3VL(config, rngs=nnx.Rngs(0)))
    graphdef, params = nnx.split(abstract, nnx.Param)
    if mesh is None:
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        return graphdef, params, jax.tree.map(lambda _: device, params)
    specs = rules_lib.param_shardings(params, mesh, config.sharding_rules)
    shardings = jax.tree.map(lambda v, s: v.replace(s), params, specs, is_leaf=lambda x: isinstance(x, nnx.Variable))
    return graphdef, params, shardings


class CheckpointManager:
    """An Orbax `CheckpointManager` for training states (see the module docstring).

    Args:
        directory: where steps live: a local path or a URL tensorstore and etils understand (gs://...).
        items: names of the array trees saved at each step.
        max_to_keep: newest steps kept; older ones are deleted after a newer save completes. None keeps all.
        save_interval_steps: `save` skips steps not divisible by this (unless forced).
        async_save: write in a background thread (`save` returns after the device-to-host copy).
    """

    def __init__(self, directory: str | os.PathLike, *, items: Sequence[str] = DEFAULT_ITEMS,
                 max_to_keep: int | None = 3, save_interval_steps: int = 1, async_save: bool = True):
        self.items = tuple(items)
        reserved = sorted({DATA_STATE, MODEL_CONFIG} & set(self.items))
        if reserved or len(set(self.items)) != len(self.items) or not self.items:
            raise ValueError(f"checkpoint items {self.items} must be distinct, non-empty and avoid the reserved names "
                             f"{DATA_STATE!r} and {MODEL_CONFIG!r}")
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1 or None, got {max_to_keep}")
        self.directory = storage.epath(directory)
        handlers = {name: ocp.StandardCheckpointHandler() for name in self.items}
        handlers[DATA_STATE] = ocp.JsonCheckpointHandler()
        handlers[MODEL_CONFIG] = ocp.JsonCheckpointHandler()
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, save_interval_steps=save_interval_steps,
                                               enable_async_checkpointing=async_save, create=False)
        self._manager = ocp.CheckpointManager(self.directory, item_handlers=handlers, options=options)

    # ----- saving ----------------------------------------------------------------------------------------------------

    def save(self, step: int, state: Mapping[str, Any], *, data_state: Mapping[str, Any] | None = None,
             model_config: config_lib.Qwen3VLConfig | None = None, force: bool = False) -> bool:
        """Starts saving `state` (one tree per item) as `step`; returns whether a save was started.

        Args:
            step: the step number (the directory name).
            state: {item name: pytree of arrays}, exactly the manager's `items`.
            data_state: this process's data iterator state, a JSON-able dict (e.g. a Grain iterator's `get_state()`);
                with several processes every process passes its own and all are kept.
            model_config: the model's config, stored so that `export_hf` can rebuild the model.
            force: save even when `step` is off `save_interval_steps`.

        Raises:
            ValueError: `state` names other items than the manager's.
        """
        if set(state) != set(self.items):
            raise ValueError(f"checkpoint state items {sorted(state)} != the manager's items {sorted(self.items)}")
        args = {name: ocp.args.StandardSave(state[name]) for name in self.items}
        data = dict(data_state) if data_state is not None else None
        if jax.process_count() > 1:  # Orbax writes JSON items from process 0 only: gather every process's state
            data = {PER_PROCESS: host_data.gather_json(data)}
        args[DATA_STATE] = ocp.args.JsonSave(data)
        args[MODEL_CONFIG] = ocp.args.JsonSave(_config_json(model_config) if model_config is not None else None)
        saved = self._manager.save(int(step), args=ocp.args.Composite(**args), force=force)
        if saved:
            log.info("checkpoint: saving step %d to %s", step, self.directory)
        return saved

    def wait(self) -> None:
        """Blocks until every started save is on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Waits for pending saves and releases the manager's threads."""
        self._manager.close()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ----- reading ---------------------------------------------------------------------------------------------------

    def all_steps(self) -> list[int]:
        """Completed steps, oldest first."""
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        """The newest completed step, or None when there is none."""
        return self._manager.latest_step()

    def _resolve_step(self, step: int | None) -> int:
        if not self.directory.exists():
            raise FileNotFoundError(f"checkpoint directory {self.directory} does not exist")
        steps = self.all_steps()
        if not steps:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        if step is None:
            return steps[-1]
        if int(step) not in steps:
            raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory}; steps there: {steps}")
        return int(step)

    def _check_tree(self, step: int, name: str, target: Any) -> None:
        """Raises ValueError naming the first keys, shapes or dtypes where `target` and the saved tree differ."""
        saved = _flat(self._manager.item_metadata(step)[name].tree)
        wanted = _flat(target)
        where = f"checkpoint {self.directory} step {step} item {name!r}"
        missing, unexpected = sorted(set(wanted) - set(saved)), sorted(set(saved) - set(wanted))
        if missing or unexpected:
            raise ValueError(f"{where} does not match the target tree: {len(missing)} keys missing from the "
                             f"checkpoint (e.g. {missing[:3]}), {len(unexpected)} keys the target lacks "
                             f"(e.g. {unexpected[:3]})")
        for key, meta in saved.items():
            shape, dtype = tuple(wanted[key].shape), jax.numpy.dtype(wanted[key].dtype)
            if tuple(meta.shape) != shape or jax.numpy.dtype(meta.dtype) != dtype:
                raise ValueError(f"{where}: key {key} is saved as {tuple(meta.shape)} {jax.numpy.dtype(meta.dtype)}, "
                                 f"the target wants {shape} {dtype}")

    def restore(self, target: Mapping[str, Any], *, step: int | None = None) -> tuple[dict[str, Any], dict | None]:
        """Restores the named items of `step` (default: the latest) onto the targets' shardings.

        Args:
            target: {item name: abstract tree} for the items to read (`abstract_like(state, shardings)`); a subset
                of the manager's items is allowed.
            step: the step to read; None = the latest.

        Returns:
            ({item name: restored tree}, the saved data_state or None).

        Raises:
            FileNotFoundError: the directory does not exist, holds no checkpoint, or lacks `step`.
            ValueError: an unknown item, or a target tree whose keys, shapes or dtypes differ from the saved ones
                (the message names the key).
        """
        step = self._resolve_step(step)
        unknown = sorted(set(target) - set(self.items))
        if unknown:
            raise ValueError(f"items {unknown} are not among the checkpoint items {list(self.items)}")
        for name, tree in target.items():
            self._check_tree(step, name, tree)
        args = {name: ocp.args.StandardRestore(tree) for name, tree in target.items()}
        args[DATA_STATE] = ocp.args.JsonRestore()
        restored = self._manager.restore(step, args=ocp.args.Composite(**args))
        log.info("checkpoint: restored step %d from %s", step, self.directory)
        return {name: restored[name] for name in target}, self._own_data_state(restored[DATA_STATE], step)

    def _own_data_state(self, saved: Any, step: int) -> dict | None:
        """This process's data iterator state from the saved item (see `save`)."""
        count = jax.process_count()
        per_process = saved.get(PER_PROCESS) if isinstance(saved, dict) else None
        saved_count = len(per_process) if per_process is not None else 1
        if saved is not None and saved_count != count:
            raise ValueError(f"checkpoint {self.directory} step {step} holds the data state of {saved_count} "
                             f"process(es) but this run has {count}; resume with {saved_count} process(es), or "
                             "restore without the data state and restart the data pipeline")
        return per_process[jax.process_index()] if per_process is not None else saved

    def model_config(self, step: int | None = None) -> config_lib.Qwen3VLConfig:
        """The model config saved with `step` (default: the latest).

        Raises:
            FileNotFoundError: no such checkpoint, or it was saved without a model_config.
        """
        step = self._resolve_step(step)
        saved = self._manager.restore(step, args=ocp.args.Composite(**{MODEL_CONFIG: ocp.args.JsonRestore()}))
        if not saved[MODEL_CONFIG]:
            raise FileNotFoundError(f"checkpoint {self.directory} step {step} was saved without a model_config")
        stored = saved[MODEL_CONFIG]
        return config_lib.Qwen3VLConfig.from_hf(stored["config"], **stored["runtime"])

    def export_hf(self, step: int | None, out_dir: str | os.PathLike, tokenizer_dir: str | os.PathLike | None = None,
                  *, mesh: jax.sharding.Mesh | None = None, item: str = "params") -> Path:
        """Writes `step`'s parameters as an HF checkpoint folder (`qwen3_vl.save`) plus the tokenizer files.

        `qwen3_vl.load(out_dir)` and transformers' `from_pretrained(out_dir)` read the result.

        Args:
            step: the step to export; None = the latest.
            out_dir: a local folder (created).
            tokenizer_dir: a folder whose tokenizer and processor files (`TOKENIZER_FILES`) are copied; None = none.
            mesh: where to place the parameters while writing (None: the default device); each tensor is gathered
                to the host one at a time.
            item: the item holding the model's `nnx.Param` tree.

        Raises:
            FileNotFoundError: no such checkpoint, no saved model_config, or a tokenizer_dir without tokenizer.json
                or tokenizer_config.json.
        """
        step = self._resolve_step(step)
        config = self.model_config(step)
        if tokenizer_dir is not None:
            tokenizer_dir = Path(tokenizer_dir)
            if not any((tokenizer_dir / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
                raise FileNotFoundError(f"tokenizer_dir {tokenizer_dir} holds neither tokenizer.json nor "
                                        "tokenizer_config.json")
        graphdef, params, shardings = abstract_placement(config, mesh)
        restored, _ = self.restore({item: abstract_like(params, shardings)}, step=step)
        model = nnx.merge(graphdef, restored[item])
        out_dir = Path(out_dir)
        qwen3_vl.save(model, out_dir)
        if tokenizer_dir is not None and jax.process_index() == 0:
            tokenizer_lib.copy_tokenizer_files(tokenizer_dir, out_dir)
        log.info("checkpoint: exported step %d to %s", step, out_dir)
        return out_dir


def _config_json(config: config_lib.Qwen3VLConfig) -> dict[str, Any]:
    return {"config": config.to_hf(), "runtime": {name: getattr(config, name) for name in _RUNTIME_FIELDS}}
