"""The learner's update as one pure function: `train_step(state, batch) -> (state, metrics)`, jitted.

`TrainState` holds every `nnx.Param` of the model, the Optax state of the trained ones and the update count; the
model's graph and the `LearnerConfig` ride along as static fields, so `train_step` needs nothing else and two
learners with the same model and settings share one compiled program per batch shape.

One call makes one optimizer update from a batch (the learner's batch contract, rows right-padded to T), in the
stages of `Qwen3VL.hidden_states`:

1. Embed the whole batch: the vision tower on all of its images, token embeddings with the image features and
   DeepStack rows merged in (`jax.vjp`, so this stage's backward pass runs once, after all microbatches).
2. Decode and score microbatches: the rows are split into `grad_accum_steps` microbatches (strided: microbatch
   i holds rows i, i + A, i + 2A, … so each keeps rows on every data shard) and `lax.scan` runs the decoder and
   the objective (`rl.objectives`) on each, summing parameter gradients and collecting the gradients of its
   embedding rows. Each microbatch returns its share of the batch loss, so the sums are exactly the whole
   batch's loss and gradient. Images may sit in any row: they were encoded once in stage 1.
3. The embedding rows' gradients run back through stage 1; then global-norm clipping, AdamW (`rl.optim`), and
   the new state pinned to the sharding the model's partition rules give.

A shared-prefix batch (`data.shared_prefix`: G prefix rows, each continued by its suffix rows) runs the same
stages on its two parts: stage 1 embeds the prefixes (with every image) and the text-only suffixes; stage 2 runs
the prefixes once into a KV cache and the suffix rows on from their prefix's cache (`decode_shared`), as one
microbatch. The objective sees only the suffix rows, which hold every trained token, so loss, metrics and gradient
are those of the full rows (tests compare them).

With `freeze_vision` the vision tower (`model.visual`, mergers included) is split off before differentiation: it
gets no gradient (its backward pass is never built) and no optimiser state; `frozen` does the same for every
parameter whose path holds one of its names.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct
from jax.sharding import NamedSharding, PartitionSpec

from ranger_jax.models.qwen3_vl import attention, rope, text
from ranger_jax.models.qwen3_vl import model as model_lib
from ranger_jax.parallel import rules as rules_lib
from ranger_jax.rl import learner_config, objectives, optim

VISION_TOWER = "visual"  # the attribute holding the vision tower and its mergers (HF `model.visual`)
ROW_KEYS = ("input_ids", "attention_mask", "loss_mask", "sampler_logp", "advantages", "token_advantages", "row_valid",
            "ref_logp")
IMAGE_KEYS = ("pixel_values", "image_grid_thw")
BATCH_AXES = ("data", "fsdp")  # mesh axes the rows of a batch are split over


class TrainState(struct.PyTreeNode):
    """Parameters, optimiser state and update count; `graphdef` and `config` are static (hashed into the jit)."""

    step: jax.Array  # [] int32, optimizer updates applied so far
    params: nnx.State  # every nnx.Param of the model, by HF path
    opt_state: optax.OptState  # Optax state of the trained parameters only
    graphdef: nnx.GraphDef = struct.field(pytree_node=False)
    config: learner_config.LearnerConfig = struct.field(pytree_node=False)

    def model(self) -> model_lib.Qwen3VL:
        """A `Qwen3VL` viewing this state's parameter arrays (no copy)."""
        return nnx.merge(self.graphdef, self.params)


def split_trainable(params: nnx.State, config: learner_config.LearnerConfig) -> tuple[nnx.State, nnx.State]:
    """(trained, frozen) parameters: the vision tower under `freeze_vision` and every parameter whose path holds a
    name of `config.frozen` are frozen; the rest is trained.

    Raises:
        ValueError: a name of `config.frozen` in no parameter's path, or nothing left to train.
    """
    names = (VISION_TOWER,) * config.freeze_vision + config.frozen
    if not names:
        return params, nnx.State({})
    paths = [tuple(str(getattr(k, "key", k)) for k in path) for path, _ in jax.tree_util.tree_leaves_with_path(
        params, is_leaf=_is_variable)]
    unmatched = [name for name in config.frozen if not any(name in path for path in paths)]
    if unmatched:
        raise ValueError(f"LearnerConfig.frozen names {unmatched} are in no parameter's path (e.g. "
                         f"{'.'.join(paths[0]) if paths else 'none'})")
    trained, frozen = nnx.split_state(params, nnx.Not(nnx.Any(*(nnx.PathContains(n) for n in names))), ...)
    if not jax.tree.leaves(trained):
        raise ValueError(f"freezing {list(names)} leaves no parameter to train")
    return trained, frozen


def _is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def state_shardings(tree: Any, mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh,
                    rules: str | Mapping[str, rules_lib.AxisRule]) -> Any:
    """A tree like `tree` with a NamedSharding per array: parameters and their optimiser moments (variables that
    carry logical axis names) follow `rules`; everything else (counts, the step) is replicated.

    Raises:
        ValueError: a parameter size not divisible by its mesh axes (names the parameter, the sizes and a fix).
    """
    table = rules_lib.get_rules(rules)

    def one(path, leaf):
        if isinstance(leaf, nnx.Variable):
            what = f"parameter {jax.tree_util.keystr(path, simple=True, separator='.')}"
            spec = rules_lib.logical_to_spec(leaf.get_metadata()["out_sharding"], table, what=what,
                                             shape=leaf.shape, mesh=mesh)
            return leaf.replace(NamedSharding(mesh, spec))
        return NamedSharding(mesh, PartitionSpec())

    return jax.tree_util.tree_map_with_path(one, tree, is_leaf=_is_variable)


def _pin(tree: Any, rules: str) -> Any:
    """Constrains `tree` (traced) to `state_shardings` on the current mesh; a no-op without one."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return tree
    return jax.lax.with_sharding_constraint(tree, state_shardings(tree, mesh, rules))


@functools.partial(jax.jit, static_argnames=("config", "rules"))
def _init_opt_state(trained: nnx.State, *, config: learner_config.LearnerConfig, rules: str) -> optax.OptState:
    return _pin(optim.make_optimizer(config).init(trained), rules)


def init_state(model: model_lib.Qwen3VL, config: learner_config.LearnerConfig) -> TrainState:
    """A fresh TrainState (step 0, zero moments) viewing `model`'s parameters; jit it to place the moments.

    Raises:
        ValueError: the model holds variables other than `nnx.Param` (the learner only trains parameters).
    """
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    if len(jax.tree.leaves(rest)):
        paths = [jax.tree_util.keystr(p, simple=True, separator=".")
                 for p, _ in jax.tree_util.tree_flatten_with_path(rest, is_leaf=_is_variable)[0]]
        raise ValueError(f"the model holds {len(paths)} non-parameter variables (e.g. {paths[:3]}); the learner "
                         "trains nnx.Param only")
    trained, _ = split_trainable(params, config)
    opt_state = _init_opt_state(trained, config=config, rules=model.config.sharding_rules)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=opt_state, graphdef=graphdef,
                      config=config)


# ----- stages ------------------------------------------------------------------------------------------------------


def split_rows(x: jax.Array, num: int, axis: int = 0) -> jax.Array:
    """Rows on `axis` (size B) -> [num, ..., B / num, ...]; microbatch i holds rows i, i + num, i + 2·num, …"""
    x = jnp.moveaxis(x, axis, 0)
    x = x.reshape(x.shape[0] // num, num, *x.shape[1:]).swapaxes(0, 1)
    return jnp.moveaxis(x, 1, axis + 1)


def merge_rows(x: jax.Array, axis: int = 0) -> jax.Array:
    """The inverse of `split_rows`: [num, ..., B / num, ...] -> rows on `axis` in their original order."""
    x = jnp.moveaxis(x, axis + 1, 1).swapaxes(0, 1)
    return jnp.moveaxis(x.reshape(-1, *x.shape[2:]), 0, axis)


def embed_batch(model: model_lib.Qwen3VL, batch: Mapping[str, jax.Array]):
    """Stage 1: (inputs_embeds [B, T, D], DeepStack rows [L_ds, B, T, D] or None) of the whole batch."""
    image_embeds = deepstack = None
    if batch.get("pixel_values") is not None:
        image_embeds, deepstack = model.encode_images(batch["pixel_values"], batch["image_grid_thw"])
    return model.embed(batch["input_ids"], image_embeds, deepstack)


def batch_positions(model: model_lib.Qwen3VL, batch: Mapping[str, jax.Array]) -> jax.Array:
    """[3, B, T] int32 MRoPE positions of the whole batch (images are consumed in the batch's row-major order)."""
    return rope.get_rope_index(batch["input_ids"], batch.get("image_grid_thw"), batch["attention_mask"],
                               image_token_id=model.config.image_token_id,
                               spatial_merge_size=model.config.vision_config.spatial_merge_size)[0]


def decode_rows(model: model_lib.Qwen3VL, embeds: jax.Array, deepstack: jax.Array | None, positions: jax.Array,
                attention_mask: jax.Array) -> jax.Array:
    """Stage 2: final-norm hidden states [b, T, D] of some rows from their embeddings and positions."""
    mask_info = attention.causal_mask_info(attention_mask, *attention_mask.shape)
    return model.decode(embeds, positions, mask_info, deepstack)[0]


# ----- shared-prefix batches (data.shared_prefix) -----------------------------------------------------------------


def is_shared_prefix(batch: Mapping[str, Any]) -> bool:
    """Whether `batch` is a shared-prefix batch (prefix rows continued by suffix rows through the KV cache)."""
    return "prefix_input_ids" in batch


def embed_shared(model: model_lib.Qwen3VL, batch: Mapping[str, jax.Array]):
    """Stage 1 of a shared-prefix batch: ((prefix embeds [G, P, D], suffix embeds [B, S, D]), the prefixes'
    DeepStack rows or None). The images belong to the prefixes; suffix rows are text only."""
    image_embeds = deepstack = None
    if batch.get("pixel_values") is not None:
        image_embeds, deepstack = model.encode_images(batch["pixel_values"], batch["image_grid_thw"])
    prefix, prefix_deepstack = model.embed(batch["prefix_input_ids"], image_embeds, deepstack)
    suffix, _ = model.embed(batch["input_ids"])
    return (prefix, suffix), prefix_deepstack


def shared_positions(model: model_lib.Qwen3VL, batch: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """([3, G, P] MRoPE positions of the prefixes, [3, B, S] of the suffix rows).

    A suffix row's text continues its prefix: token j sits at (the largest position of the prefix's real tokens)
    + 1 + j on all three rows, where the full row would put it (`rope.get_rope_index`'s rule for text after text
    or images). The image padding's placeholders after a prefix are not real tokens and do not count.
    """
    prefix = rope.get_rope_index(batch["prefix_input_ids"], batch.get("image_grid_thw"),
                                 batch["prefix_attention_mask"], image_token_id=model.config.image_token_id,
                                 spatial_merge_size=model.config.vision_config.spatial_merge_size)[0]
    length = batch["prefix_length"]
    real = jnp.arange(prefix.shape[2])[None, :] < length[:, None]  # [G, P]
    start = jnp.where(length > 0, jnp.max(jnp.where(real[None], prefix, -1), axis=(0, 2)) + 1, 0)  # [G]
    ids = batch["input_ids"]
    suffix = start[batch["prefix_index"]][:, None] + jnp.arange(ids.shape[1], dtype=jnp.int32)[None, :]
    return prefix, jnp.broadcast_to(suffix.astype(jnp.int32), (3, *ids.shape))


def decode_shared(model: model_lib.Qwen3VL, embeds: tuple[jax.Array, jax.Array], deepstack: jax.Array | None,
                  positions: tuple[jax.Array, jax.Array], batch: Mapping[str, jax.Array]) -> jax.Array:
    """Stage 2 of a shared-prefix batch: final-norm hidden states [B, S, D] of the suffix rows.

    The prefixes run once and leave their keys and values in a cache of P + S slots per layer; each suffix row
    takes its prefix's cache (`prefix_index`) and runs in slots P.. P + S - 1, attending to the prefix's real
    tokens (`prefix_length`) and, causally, to its own. Gradients reach the prefix through the cached keys and
    values, so loss and gradient equal those of the full rows.
    """
    prefix_embeds, suffix_embeds = embeds
    prefix_positions, suffix_positions = positions
    prefix_ids, ids = batch["prefix_input_ids"], batch["input_ids"]
    (groups, prefix_len), (rows, suffix_len) = prefix_ids.shape, ids.shape
    text_config, dtype = model.config.text_config, model.config.compute_dtype
    slots = prefix_len + suffix_len
    shape = (groups, text_config.num_key_value_heads, slots, text_config.head_dim)
    caches = tuple(text.KVCache(key=jnp.zeros(shape, dtype), value=jnp.zeros(shape, dtype))
                   for _ in range(text_config.num_hidden_layers))
    prefix_mask = attention.MaskInfo(
        query_slots=jnp.broadcast_to(jnp.arange(prefix_len, dtype=jnp.int32), (groups, prefix_len)),
        kv_valid=jnp.concatenate([batch["prefix_attention_mask"].astype(bool),
                                  jnp.zeros((groups, suffix_len), bool)], axis=1))
    _, caches = model.decode(prefix_embeds, prefix_positions, prefix_mask, deepstack, caches)
    index = batch["prefix_index"]
    caches = tuple(text.KVCache(key=c.key[index], value=c.value[index]) for c in caches)
    visible = jnp.arange(prefix_len)[None, :] < batch["prefix_length"][index][:, None]
    suffix_mask = attention.MaskInfo(
        query_slots=jnp.broadcast_to(prefix_len + jnp.arange(suffix_len, dtype=jnp.int32), (rows, suffix_len)),
        kv_valid=jnp.concatenate([visible, batch["attention_mask"].astype(bool)], axis=1))
    return model.decode(suffix_embeds, suffix_positions, suffix_mask, None, caches)[0]


# ----- the step ----------------------------------------------------------------------------------------------------


def _gradients(state: TrainState, trained: nnx.State, frozen: nnx.State, batch: Mapping[str, jax.Array], rules: str,
               totals: Mapping[str, jax.Array] | None = None):
    """(loss, metrics, totals, gradients of `trained` in float32) of the whole batch, microbatched as configured.
    `totals`: the normalisers of an update this batch is one part of (`batch_share`); default: the batch's own."""
    config = state.config
    objective = objectives.get_objective(config.objective)
    totals = objectives.batch_totals(batch) if totals is None else totals

    def model_of(params):
        return nnx.merge(state.graphdef, nnx.merge_state(params, frozen))

    shared = is_shared_prefix(batch)
    if shared:  # one microbatch: `learner.check_batch` refuses shared-prefix batches with grad_accum_steps > 1
        positions = shared_positions(model_of(trained), batch)
        (embeds, deepstack), embed_vjp = jax.vjp(lambda params: embed_shared(model_of(params), batch), trained)
    else:
        positions = batch_positions(model_of(trained), batch)
        (embeds, deepstack), embed_vjp = jax.vjp(lambda params: embed_batch(model_of(params), batch), trained)

    def micro_loss(params, embeds, deepstack, positions, microbatch):
        model = model_of(params)
        if shared:
            hidden = decode_shared(model, embeds, deepstack, positions, batch)
        else:
            hidden = decode_rows(model, embeds, deepstack, positions, microbatch["attention_mask"])
        return objective(model, hidden, microbatch, totals, config)

    grad_fn = jax.value_and_grad(micro_loss, argnums=(0, 1, 2), has_aux=True)
    rows = {k: v for k, v in batch.items() if k in ROW_KEYS}
    num = config.grad_accum_steps
    if num == 1 or shared:
        (loss, metrics), (grads, d_embeds, d_deepstack) = grad_fn(trained, embeds, deepstack, positions, rows)
        grads = jax.tree.map(lambda g: g.astype(jnp.float32), grads)
    else:
        micro = ({k: split_rows(v, num) for k, v in rows.items()}, split_rows(embeds, num),
                 None if deepstack is None else split_rows(deepstack, num, axis=1), split_rows(positions, num, axis=1))

        def body(grad_sum, inputs):
            microbatch, embeds, deepstack, positions = inputs
            (loss, metrics), (grads, d_embeds, d_deepstack) = grad_fn(trained, embeds, deepstack, positions,
                                                                      microbatch)
            grad_sum = _pin(jax.tree.map(lambda a, g: a + g.astype(jnp.float32), grad_sum, grads), rules)
            return grad_sum, (loss, metrics, d_embeds, d_deepstack)

        zeros = _pin(jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), trained), rules)
        grads, (losses, metrics, d_embeds, d_deepstack) = jax.lax.scan(body, zeros, micro)
        loss = jnp.sum(losses)
        metrics = {k: objectives.METRIC_REDUCTIONS.get(k, jnp.sum)(v, axis=0) for k, v in metrics.items()}
        d_embeds = merge_rows(d_embeds)
        d_deepstack = None if d_deepstack is None else merge_rows(d_deepstack, axis=1)
    (embed_grads,) = embed_vjp((d_embeds, d_deepstack))
    grads = jax.tree.map(lambda g, e: g + e.astype(jnp.float32), grads, embed_grads)
    return loss, metrics, totals, grads


def train_step(state: TrainState, batch: Mapping[str, jax.Array]) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimizer update from `batch`; pure (jit it, donating `state`). See the module docstring.

    Args:
        state: the current TrainState.
        batch: the learner batch ("input_ids", "attention_mask", "loss_mask" [B, T]; "row_valid" [B]; GRPO adds
            "sampler_logp" [B, T], "advantages" [B] (or "token_advantages" [B, T], used instead), and with kl_coef > 0
            "ref_logp" [B, T]; optional "pixel_values" and "image_grid_thw"), already checked by the caller
            (`learner.check_batch`).

    Returns:
        (new state, metrics): float32 scalars "loss", "grad_norm" (before clipping), "learning_rate" (of this
        update), "tokens" (trained tokens) and the objective's own metrics.
    """
    rules = state.model().config.sharding_rules
    trained, frozen = split_trainable(state.params, state.config)
    loss, metrics, totals, grads = _gradients(state, trained, frozen, batch, rules)
    return _update(state, trained, frozen, loss, metrics, totals, grads, rules)


def _update(state: TrainState, trained: nnx.State, frozen: nnx.State, loss: jax.Array, metrics: dict[str, jax.Array],
            totals: Mapping[str, jax.Array], grads: nnx.State, rules: str) -> tuple[TrainState, dict[str, jax.Array]]:
    """The optimizer update from an update's summed loss, metrics and float32 gradients, and its metrics."""
    config = state.config
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, trained)
    grad_norm = optax.global_norm(grads)
    updates, opt_state = optim.make_optimizer(config).update(grads, state.opt_state, trained)
    trained = optax.apply_updates(trained, updates)
    new_state = state.replace(step=state.step + 1, params=_pin(nnx.merge_state(trained, frozen), rules),
                              opt_state=_pin(opt_state, rules))
    metrics = {
        "loss": loss.astype(jnp.float32),
        "grad_norm": grad_norm.astype(jnp.float32),
        "learning_rate": jnp.asarray(optim.learning_rate_schedule(config)(state.step), jnp.float32),
        "tokens": totals["tokens"],
        # a batch without trained tokens has no ratio extremes: 0, as policy_loss reports them
        **{k: jnp.where(jnp.isfinite(v), v, 0.0).astype(jnp.float32) for k, v in metrics.items()},
    }
    return new_state, metrics


jit_train_step = jax.jit(train_step, donate_argnums=0)


# ----- one update from several batches ----------------------------------------------------------------------------
#
# A batch bounds what the learner holds at once; an update may span several (e.g. a GRPO round of thousands of
# episodes, in batches of a few groups). Each batch's `objectives.batch_totals` are summed first; each batch then
# gives its share of the update's loss, metrics and gradient (`batch_share`, normalised by those totals, so the
# shares add up to the whole), `add_shares` sums them, and `apply_shares` makes the one optimizer update. Between
# batches the learner holds the parameters, the optimizer state and one gradient's worth of sums.


def batch_share(state: TrainState, batch: Mapping[str, jax.Array], totals: Mapping[str, jax.Array]
                ) -> dict[str, Any]:
    """`batch`'s share of the update whose normalisers are `totals`: {"loss", "metrics", "grads" (float32)}."""
    rules = state.model().config.sharding_rules
    trained, frozen = split_trainable(state.params, state.config)
    loss, metrics, _, grads = _gradients(state, trained, frozen, batch, rules, totals=totals)
    return {"loss": loss, "metrics": metrics, "grads": grads}


def add_shares(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two shares of one update summed (metrics reduced as microbatches' are: `objectives.METRIC_REDUCTIONS`)."""
    return {"loss": a["loss"] + b["loss"],
            "metrics": {k: objectives.METRIC_REDUCTIONS.get(k, jnp.sum)(jnp.stack([v, b["metrics"][k]]), axis=0)
                        for k, v in a["metrics"].items()},
            "grads": jax.tree.map(jnp.add, a["grads"], b["grads"])}


def apply_shares(state: TrainState, shares: dict[str, Any], totals: Mapping[str, jax.Array]
                 ) -> tuple[TrainState, dict[str, jax.Array]]:
    """The one optimizer update of the summed `shares` of an update, and its metrics (`train_step`'s); pure."""
    rules = state.model().config.sharding_rules
    trained, frozen = split_trainable(state.params, state.config)
    return _update(state, trained, frozen, shares["loss"], shares["metrics"], totals, shares["grads"], rules)


jit_batch_totals = jax.jit(objectives.batch_totals)
jit_batch_share = jax.jit(batch_share)
jit_add_shares = jax.jit(add_shares, donate_argnums=0)
jit_apply_shares = jax.jit(apply_shares, donate_argnums=0)


def batch_gradient(state: TrainState, batch: Mapping[str, jax.Array]) -> jax.Array:
    """The gradient of `batch` at the current parameters, nothing updated: the trained parameters' gradient as one
    float32 vector (leaves in tree order, before clipping), as `train_step` would apply it."""
    trained, frozen = split_trainable(state.params, state.config)
    _, _, _, grads = _gradients(state, trained, frozen, batch, state.model().config.sharding_rules)
    return jnp.concatenate([g.reshape(-1) for g in jax.tree.leaves(grads)])


jit_batch_gradient = jax.jit(batch_gradient)
