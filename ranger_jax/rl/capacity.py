"""What a GRPO run costs on paper: memory per chip, FLOPs and time per step, the rollout rate that keeps the learner
busy, weight-sync traffic and trajectory storage, from the model config, the learner settings and the mesh.

    plan = capacity.estimate(capacity.Setup.for_preset(presets.PRESETS["savanna-8b-tpu"], chips=32, chip="v5p"))
    print(capacity.report(plan))

Memory per chip. Parameters and AdamW moments are counted exactly: the model is built abstractly
(`nnx.eval_shape`), each parameter gets its PartitionSpec from the partition rules on the mesh, and the bytes of
its shard are summed (the moments follow the trained parameters, in their dtype; a frozen vision tower has none).
Gradients are float32 shards of the trained parameters (the train step accumulates in float32); the step also holds
a float32 update tree and, when the compute dtype differs, a compute-dtype copy of the parameters. Activations are a
formula (below) for rows r = rows per microbatch / (data · fsdp) of T tokens, a = compute dtype bytes, decoder
width D, MLP width F, query / kv widths Q = N·H and KV = K·H, L layers:

    remat "full":  saved   = L · r·T·D · a                               (each layer's input)
                   working = 2 · r·T·(2·D + (Q + 2·KV + 3·F)/t) · a      (one layer recomputed, and gradients)
    remat "none":  saved   = L · r·T·(2·D + (Q + 2·KV + 3·F)/t) · a      (every layer's intermediates)
    head:          2 · c·V · 4                                           (a chunk of c rows of float32 logits)

where t is the tensor-parallel size (heads and MLP width are split over it).

The estimate is cross-checked against XLA (`lowered_step`): the compiled step's argument bytes per device equal the
exact parameter + optimizer figure, and its temporary bytes are compared with gradients + temporaries +
activations. XLA's FLOP count of the lowered step counts a loop body once, so the chunked LM head (a `lax.scan`)
appears as one chunk there.

FLOPs per step are `flops.text_flops` (3 × forward, the MFU convention) plus the vision tower's forward over the
step's images (3 × when it trains); full remat adds one more decoder forward of hardware work. Step time is model
FLOPs / (chips · peak · MFU) at a stated MFU.

Rollouts. A trajectory is `prompt + turns · (generated + observation)` tokens, each observation carrying
`images_per_turn` images of `image_tokens` tokens. Keeping the learner busy means producing one step's
trajectories per step time: generated tokens/s = rows · turns · generated / step time (decode), prefill tokens/s =
rows · (prompt + turns · observation) / step time (the prefix cache holds the rest); rollout GPUs = generated
tokens/s over a stated decode rate per GPU.

Weight sync per version: every parameter in the published dtype, written once to shared storage and read by each
server, at a stated bandwidth. Trajectory storage: 9 bytes per token (int32 id, int8 mask, float32 log-prob) plus
the PNG of every image, for the trajectories of a day of steps.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from ranger_jax.models.qwen3_vl import config as config_lib
from ranger_jax.models.qwen3_vl import flops as flops_lib
from ranger_jax.models.qwen3_vl import loss as loss_lib
from ranger_jax.models.qwen3_vl import model as model_lib
from ranger_jax.parallel import mesh as mesh_lib
from ranger_jax.parallel import rules as rules_lib
from ranger_jax.rl import learner_config, train_step

GB = 1e9
SECONDS_PER_DAY = 86_400


@dataclasses.dataclass(frozen=True)
class Chip:
    """One accelerator: memory and dense bf16 peak (vendor figures)."""

    name: str
    hbm_bytes: float
    peak_flops: float  # bf16 dense FLOP/s


CHIPS: Mapping[str, Chip] = {
    "v5p": Chip("TPU v5p", 95e9, 459e12),
    "v5e": Chip("TPU v5e", 16e9, 197e12),
    "v6e": Chip("TPU v6e", 32e9, 918e12),
    "h100": Chip("NVIDIA H100 SXM", 80e9, 989e12),
    "h200": Chip("NVIDIA H200", 141e9, 989e12),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Workload:
    """What an average trajectory looks like (assumptions: state them with the figures)."""

    prompt_tokens: int = 1200  # system prompt with the tool schemas, and the request
    turns: int = 8  # assistant turns per episode
    generated_tokens_per_turn: int = 300  # sampled tokens per turn (reasoning, a tool call)
    observation_tokens_per_turn: int = 250  # tool response text per turn
    images_per_turn: float = 1.0  # images in a tool response
    image_tokens: int = 156  # tokens per image at max_pixels 160,000 (Gen-Searcher)
    image_png_bytes: int = 120_000  # one stored image (PNG at <= 160k pixels)

    @property
    def observation_tokens(self) -> float:
        """Tokens appended by one tool response, its images included."""
        return self.observation_tokens_per_turn + self.images_per_turn * self.image_tokens

    @property
    def trajectory_tokens(self) -> float:
        """Tokens of one whole trajectory."""
        return self.prompt_tokens + self.turns * (self.generated_tokens_per_turn + self.observation_tokens)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Setup:
    """A run to size: model, learner settings, mesh, batch and the stated rates."""

    model: config_lib.Qwen3VLConfig
    learner: learner_config.LearnerConfig
    mesh: tuple[int, int, int]  # (data, fsdp, tensor), no -1
    chip: Chip
    rows_per_step: int  # trajectories per update (prompts · G)
    seq_len: int  # T the learner pads rows to (a length bucket)
    workload: Workload = Workload()
    mfu: float = 0.35  # stated model FLOPs utilisation of the learner step
    sync_bandwidth: float = 1e9  # bytes/s to and from shared storage (one stream)
    decode_tokens_per_s: float = 3000.0  # stated generated tokens/s of one rollout GPU (SGLang, 8B bf16, many episodes)

    def __post_init__(self):
        if any(s < 1 for s in self.mesh):
            raise ValueError(f"Setup.mesh needs concrete sizes >= 1, got {self.mesh}")
        if self.rows_per_step % self.learner.grad_accum_steps:
            raise ValueError(f"{self.rows_per_step} rows do not split into grad_accum_steps="
                             f"{self.learner.grad_accum_steps} microbatches")
        if not 0 < self.mfu <= 1:
            raise ValueError(f"Setup.mfu must be in (0, 1], got {self.mfu}")

    @property
    def chips(self) -> int:
        """Chips of the learner's mesh."""
        return math.prod(self.mesh)

    @classmethod
    def for_preset(cls, preset: Any, *, chips: int, chip: str, seq_len: int = 8192, **overrides: Any) -> Setup:
        """A setup from an `rl.presets.ScalePreset` on `chips` chips of kind `chip` (a key of CHIPS)."""
        if chip not in CHIPS:
            raise ValueError(f"unknown chip {chip!r}; known chips: {sorted(CHIPS)}")
        known = math.prod(s for s in preset.mesh if s > 0)
        if chips % known:
            raise ValueError(f"{chips} chips do not fill mesh {preset.mesh} (a multiple of {known} is needed)")
        mesh = tuple(s if s > 0 else chips // known for s in preset.mesh)
        lc = preset.learner
        model = config_lib.Qwen3VLConfig.qwen3_vl_8b(dtype=lc.dtype or "float32", param_dtype=lc.param_dtype or
                                                     "float32", remat=lc.remat or "none")
        return cls(model=model, learner=lc, mesh=mesh, chip=CHIPS[chip],
                   rows_per_step=preset.prompts_per_step * preset.group_size, seq_len=seq_len, **overrides)


def _shard_elements(shape: tuple[int, ...], spec: PartitionSpec, sizes: Mapping[str, int]) -> int:
    count = 1
    for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
        count *= -(-dim // math.prod(sizes[a] for a in axes))
    return count


def sharded_bytes(config: config_lib.Qwen3VLConfig, mesh: tuple[int, int, int], learner: learner_config.LearnerConfig
                  ) -> dict[str, float]:
    """Exact bytes per chip and totals of parameters and optimizer moments under the partition rules (see module)."""
    abstract = nnx.eval_shape(lambda: model_lib.Qwen3VL(config, rngs=nnx.Rngs(0)))
    params = nnx.state(abstract, nnx.Param)
    trained, _ = train_step.split_trainable(params, learner)
    sizes = dict(zip(mesh_lib.AXES, mesh))
    abstract_mesh = jax.sharding.AbstractMesh(mesh, mesh_lib.AXES)

    def per_chip(state) -> tuple[float, float, int]:
        specs = rules_lib.param_specs(state, config.sharding_rules, abstract_mesh)
        leaves = jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, nnx.Variable))
        spec_leaves = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
        chip = sum(_shard_elements(tuple(v.shape), s, sizes) * jnp.dtype(v.dtype).itemsize
                   for v, s in zip(leaves, spec_leaves))
        total = sum(math.prod(v.shape) * jnp.dtype(v.dtype).itemsize for v in leaves)
        return float(chip), float(total), sum(math.prod(v.shape) for v in leaves)

    param_chip, param_total, num_params = per_chip(params)
    trained_chip, trained_total, num_trained = per_chip(trained)
    moments = 2  # AdamW's mu and nu, in the trained parameters' dtype
    float32 = 4 / jnp.dtype(config.param_dtype).itemsize
    compute = jnp.dtype(config.dtype).itemsize / jnp.dtype(config.param_dtype).itemsize
    return {"num_params": num_params, "num_trained": num_trained, "params_chip": param_chip,
            "params_total": param_total, "optimizer_chip": moments * trained_chip,
            "gradients_chip": float32 * trained_chip,
            # step temporaries: the float32 update tree, and parameters cast to the compute dtype
            "temporaries_chip": float32 * trained_chip + (compute * param_chip if compute != 1 else 0.0)}


def activation_bytes(config: config_lib.Qwen3VLConfig, *, rows_per_chip: float, seq_len: int,
                     tensor: int = 1) -> dict[str, float]:
    """Activation bytes per chip of one microbatch under the config's remat policy (formula in the module; the
    head- and MLP-wide activations Q, KV and F are split over the `tensor` axis)."""
    t = config.text_config
    a = jnp.dtype(config.dtype).itemsize
    d, f = t.hidden_size, t.intermediate_size
    q, kv = t.num_attention_heads * t.head_dim, t.num_key_value_heads * t.head_dim
    tokens = rows_per_chip * seq_len
    layer = tokens * (2 * d + (q + 2 * kv + 3 * f) / tensor) * a
    if config.remat == "full":
        saved, working = t.num_hidden_layers * tokens * d * a, 2 * layer
    else:  # "none" (the dots_* policies keep less; this is the upper bound)
        saved, working = t.num_hidden_layers * layer, layer
    head = 2 * min(loss_lib.chunk_rows(t.vocab_size), tokens) * t.vocab_size * 4
    return {"saved": saved, "working": working, "head": float(head), "total": saved + working + head}


def vision_flops(vision: config_lib.VisionConfig, *, patches: float, images: float) -> float:
    """Forward FLOPs of the vision tower over `patches` patches in `images` images (weights, attention within each
    image, the final and DeepStack mergers)."""
    c, i, depth = vision.hidden_size, vision.intermediate_size, vision.depth
    features = vision.in_channels * vision.temporal_patch_size * vision.patch_size ** 2
    merged = c * vision.spatial_merge_size ** 2
    per_patch = features * c + depth * (4 * c * c + 2 * c * i)  # patch embed; qkv + proj, MLP per block
    mergers = (1 + len(vision.deepstack_visual_indexes)) * (merged * merged + merged * vision.out_hidden_size)
    attention = depth * 4 * c * (patches / max(images, 1.0)) * patches  # full attention within each image
    return 2 * patches * per_patch + 2 * (patches / vision.spatial_merge_size ** 2) * mergers + attention


def estimate(setup: Setup) -> dict[str, Any]:
    """Every figure of the module docstring for `setup`, as a flat dict (bytes, FLOPs, seconds, tokens/s)."""
    model, lc, work = setup.model, setup.learner, setup.workload
    data, fsdp, _ = setup.mesh
    out: dict[str, Any] = {"chips": setup.chips, "chip": setup.chip.name, "mesh": setup.mesh,
                           "rows_per_step": setup.rows_per_step, "seq_len": setup.seq_len, "mfu": setup.mfu}
    out.update(sharded_bytes(model, setup.mesh, lc))
    rows_per_chip = setup.rows_per_step / lc.grad_accum_steps / (data * fsdp)
    act = activation_bytes(model, rows_per_chip=rows_per_chip, seq_len=setup.seq_len, tensor=setup.mesh[2])
    out.update(rows_per_chip=rows_per_chip, activations_chip=act["total"], activations_saved_chip=act["saved"])
    out["memory_chip"] = (out["params_chip"] + out["optimizer_chip"] + out["gradients_chip"]
                          + out["temporaries_chip"] + act["total"])
    out["memory_fraction"] = out["memory_chip"] / setup.chip.hbm_bytes
    text = flops_lib.text_flops(model.text_config, batch=setup.rows_per_step, length=setup.seq_len)
    images = setup.rows_per_step * work.turns * work.images_per_turn
    patches = images * work.image_tokens * model.vision_config.spatial_merge_size ** 2
    vision = vision_flops(model.vision_config, patches=patches, images=images) * (1 if lc.freeze_vision else 3)
    recompute = (flops_lib.text_flops(model.text_config, batch=setup.rows_per_step, length=setup.seq_len,
                                      backward=False) if model.remat == "full" else 0.0)
    out.update(model_flops=text + vision, hardware_flops=text + vision + recompute)
    out["step_s"] = out["model_flops"] / (setup.chips * setup.chip.peak_flops * setup.mfu)
    generated = setup.rows_per_step * work.turns * work.generated_tokens_per_turn
    prefill = setup.rows_per_step * (work.prompt_tokens + work.turns * work.observation_tokens)
    out.update(trajectory_tokens=work.trajectory_tokens, episodes_per_s=setup.rows_per_step / out["step_s"],
               generated_tokens_per_s=generated / out["step_s"], prefill_tokens_per_s=prefill / out["step_s"])
    out.update(decode_tokens_per_s=setup.decode_tokens_per_s,
               rollout_gpus=math.ceil(out["generated_tokens_per_s"] / setup.decode_tokens_per_s))
    publish_bytes = out["num_params"] * jnp.dtype(model.param_dtype).itemsize
    out.update(sync_bytes=float(publish_bytes), sync_s=2 * publish_bytes / setup.sync_bandwidth)
    per_trajectory = 9 * work.trajectory_tokens + work.turns * work.images_per_turn * work.image_png_bytes
    steps_per_day = SECONDS_PER_DAY / out["step_s"]
    out.update(trajectory_bytes=per_trajectory, steps_per_day=steps_per_day,
               storage_per_day=per_trajectory * setup.rows_per_step * steps_per_day)
    return out


def report(plan: Mapping[str, Any]) -> str:
    """The figures of `estimate` as a readable table."""
    rows = [
        ("chips", f"{plan['chips']} × {plan['chip']}, mesh (data, fsdp, tensor) = {plan['mesh']}"),
        ("parameters", f"{plan['num_params'] / 1e9:.2f} B ({plan['num_trained'] / 1e9:.2f} B trained)"),
        ("params / chip", f"{plan['params_chip'] / GB:.2f} GB"),
        ("AdamW moments / chip", f"{plan['optimizer_chip'] / GB:.2f} GB"),
        ("gradients / chip", f"{plan['gradients_chip'] / GB:.2f} GB (float32)"),
        ("step temporaries / chip", f"{plan['temporaries_chip'] / GB:.2f} GB (float32 updates, compute-dtype "
                                    "parameter copies)"),
        ("activations / chip", f"{plan['activations_chip'] / GB:.2f} GB ({plan['rows_per_chip']:g} rows × "
                               f"{plan['seq_len']} tokens; layer inputs {plan['activations_saved_chip'] / GB:.2f} GB)"),
        ("total / chip", f"{plan['memory_chip'] / GB:.2f} GB = {100 * plan['memory_fraction']:.0f}% of HBM"),
        ("FLOPs / step", f"{plan['model_flops']:.3e} model, {plan['hardware_flops']:.3e} with recompute"),
        ("step time", f"{plan['step_s']:.1f} s at {100 * plan['mfu']:.0f}% MFU ({plan['rows_per_step']} rows)"),
        ("trajectory", f"{plan['trajectory_tokens']:.0f} tokens"),
        ("rollouts needed", f"{plan['episodes_per_s']:.2f} episodes/s, {plan['generated_tokens_per_s']:,.0f} "
                            f"generated tokens/s, {plan['prefill_tokens_per_s']:,.0f} prefill tokens/s"),
        ("rollout GPUs", f"{plan['rollout_gpus']} at {plan['decode_tokens_per_s']:,.0f} generated tokens/s each"),
        ("weight sync / version", f"{plan['sync_bytes'] / GB:.1f} GB, {plan['sync_s']:.0f} s (write + read)"),
        ("trajectory storage", f"{plan['trajectory_bytes'] / 1e6:.2f} MB each, "
                               f"{plan['storage_per_day'] / GB:.1f} GB/day ({plan['steps_per_day']:.0f} steps)"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def lowered_step(setup: Setup, *, rows: int | None = None, compile_memory: bool = False,
                 devices: list[jax.Device] | None = None) -> dict[str, float]:
    """XLA's view of the real train step for `setup` (abstract state and batch on a mesh of `setup.mesh` over
    `devices`, default this process's, e.g. fake CPU devices): FLOPs of the lowered program, and with
    `compile_memory` the compiled program's argument and temporary bytes per device. Nothing is allocated.

    Args:
        rows: batch rows to lower with (default `setup.rows_per_step`).
    """
    data, fsdp, tensor = setup.mesh
    devices = list(jax.devices() if devices is None else devices)[:setup.chips]
    mesh = mesh_lib.make_mesh(data=data, fsdp=fsdp, tensor=tensor, devices=devices)
    abstract = nnx.eval_shape(lambda: model_lib.Qwen3VL(setup.model, rngs=nnx.Rngs(0)))
    state = jax.eval_shape(lambda m: train_step.init_state(m, setup.learner), abstract)
    shardings = train_step.state_shardings(state, mesh, setup.model.sharding_rules)
    state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings)
    rows = rows or setup.rows_per_step
    by_row = NamedSharding(mesh, PartitionSpec(train_step.BATCH_AXES))
    by_token = NamedSharding(mesh, PartitionSpec(train_step.BATCH_AXES, None))
    batch = {k: jax.ShapeDtypeStruct((rows, setup.seq_len), d, sharding=by_token) for k, d in (
        ("input_ids", jnp.int32), ("attention_mask", jnp.int32), ("loss_mask", jnp.float32))}
    batch["row_valid"] = jax.ShapeDtypeStruct((rows,), jnp.float32, sharding=by_row)
    if setup.learner.objective == "grpo":
        batch["sampler_logp"] = jax.ShapeDtypeStruct((rows, setup.seq_len), jnp.float32, sharding=by_token)
        batch["advantages"] = jax.ShapeDtypeStruct((rows,), jnp.float32, sharding=by_row)
    with jax.set_mesh(mesh):
        lowered = train_step.jit_train_step.lower(state, batch)
    out = {"flops": float((lowered.cost_analysis() or {}).get("flops", np.nan))}
    if compile_memory:
        stats = lowered.compile().memory_analysis()
        out.update(argument_bytes=float(stats.argument_size_in_bytes), temp_bytes=float(stats.temp_size_in_bytes))
    return out
