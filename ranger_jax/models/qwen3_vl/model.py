"""Qwen3-VL end to end: image features merged at placeholder tokens, DeepStack, the decoder and the LM head.

`Qwen3VL` mirrors `Qwen3VLForConditionalGeneration` (attribute tree `model.visual`, `model.language_model`,
`lm_head`, so parameter paths are HF keys). Its pieces are separate jittable calls, so a sampler can run them
apart and a compile keyed on `pixel_values` shapes does not recompile the decoder:

1. `encode_images(pixel_values, image_grid_thw) -> (image_embeds [M, D], deepstack [L_ds, M, D])`
2. `embed(input_ids, image_embeds, deepstack) -> (inputs_embeds [B, T, D], deepstack_embeds [L_ds, B, T, D])`
3. `decode(inputs_embeds, positions, mask_info, deepstack_embeds, caches) -> (hidden [B, T, D], caches)`
4. `compute_logits(hidden) -> logits [B, T, V] float32`

`__call__` validates the inputs on the host (when they are concrete) and chains the four with
`rope.get_rope_index` positions and an `attention.causal_mask_info` mask.
"""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ranger_jax.models.qwen3_vl import attention, layers, rope, text, vision
from ranger_jax.models.qwen3_vl import config as config_lib
from ranger_jax.parallel import placement
from ranger_jax.parallel import rules
from ranger_jax.parallel.rules import constrain


def _is_concrete(*arrays) -> bool:
    return not any(isinstance(a, jax.core.Tracer) for a in arrays if a is not None)


def check_inputs(config: config_lib.Qwen3VLConfig, input_ids, attention_mask=None, pixel_values=None,
                 image_grid_thw=None) -> None:
    """Checks a `Qwen3VL.__call__` input batch on the host; every message names the counts that disagree.

    Raises:
        ValueError: bad shapes, ids outside the vocabulary, pixel_values without image_grid_thw (or the reverse), a grid not divisible by the
            merge size, patch rows != the grid's patches, image tokens != merged patches, image tokens that are
            padded or split, or video tokens (video input is not implemented).
    """
    ids = np.asarray(input_ids)
    if ids.ndim != 2:
        raise ValueError(f"input_ids must be [B, T], got shape {ids.shape}")
    vocab = config.text_config.vocab_size
    outside = ids[(ids < 0) | (ids >= vocab)]
    if outside.size:
        raise ValueError(f"input_ids hold {outside.size} ids outside the vocabulary [0, {vocab}), e.g. "
                         f"{int(outside[0])} (pads need a real id too)")
    if attention_mask is not None and np.shape(attention_mask) != ids.shape:
        raise ValueError(f"attention_mask shape {np.shape(attention_mask)} != input_ids shape {ids.shape}")
    mask = np.ones(ids.shape, bool) if attention_mask is None else np.asarray(attention_mask).astype(bool)
    n_video = int(np.sum(ids == config.video_token_id))
    if n_video:
        raise ValueError(f"input_ids hold {n_video} video tokens (id {config.video_token_id}); video input is not "
                         "supported")
    is_image = ids == config.image_token_id
    n_tok = int(is_image.sum())
    if (pixel_values is None) != (image_grid_thw is None):
        raise ValueError("pixel_values and image_grid_thw must be given together, got "
                         f"pixel_values={'None' if pixel_values is None else np.shape(pixel_values)} and "
                         f"image_grid_thw={'None' if image_grid_thw is None else np.shape(image_grid_thw)}")
    if pixel_values is None:
        if n_tok:
            raise ValueError(f"image tokens ({n_tok}) != merged patches (0): input_ids hold image placeholders but "
                             "no pixel_values were given")
        return
    v = config.vision_config
    grid = np.asarray(image_grid_thw)
    if grid.ndim != 2 or grid.shape[1] != 3:
        raise ValueError(f"image_grid_thw must be [num_images, 3], got shape {grid.shape}")
    if np.any(grid <= 0) or np.any(grid[:, 1:] % v.spatial_merge_size):
        raise ValueError(f"image_grid_thw={grid.tolist()} must be positive with h and w divisible by "
                         f"spatial_merge_size={v.spatial_merge_size}")
    if np.shape(pixel_values) != (int(grid.prod(-1).sum()), v.patch_features):
        raise ValueError(f"pixel_values shape {np.shape(pixel_values)} != (patches of image_grid_thw "
                         f"{int(grid.prod(-1).sum())}, {v.patch_features}) for grid_thw={grid.tolist()}")
    per_image = grid.prod(-1) // v.spatial_merge_size**2
    n_feat = int(per_image.sum())
    if n_tok != n_feat:
        raise ValueError(f"image tokens ({n_tok}) != merged patches ({n_feat}) for grid_thw={grid.tolist()}")
    if np.any(is_image & ~mask):
        raise ValueError(f"{int(np.sum(is_image & ~mask))} image tokens sit at padded positions (attention_mask 0)")
    flat = np.flatnonzero(is_image.reshape(-1))  # image tokens in batch order, consumed image by image
    for image, (start, count) in enumerate(zip(np.cumsum(per_image) - per_image, per_image)):
        span = flat[start:start + count]
        if span[-1] - span[0] != count - 1 or span[0] // ids.shape[1] != span[-1] // ids.shape[1]:
            raise ValueError(f"the {count} placeholder tokens of image {image} (grid {grid[image].tolist()}) are not "
                             "contiguous in one sequence")


def merge_image_features(inputs_embeds: jax.Array, input_ids: jax.Array, image_token_id: int,
                         features: jax.Array) -> jax.Array:
    """Places feature row j at the j-th image token of the batch (row-major), with static shapes.

    Args:
        inputs_embeds: [B, T, D] token embeddings (or zeros, for DeepStack).
        input_ids: [B, T] int.
        image_token_id: the placeholder id.
        features: [M, D], M = number of image tokens (checked by `check_inputs`).

    Returns:
        [B, T, D]: `features` at image tokens, `inputs_embeds` elsewhere (a cumsum-index gather instead of
        transformers' boolean masked_scatter).
    """
    is_image = input_ids == image_token_id
    index = jnp.clip(jnp.cumsum(is_image.reshape(-1)) - 1, 0, features.shape[0] - 1).reshape(input_ids.shape)
    return jnp.where(is_image[..., None], features[index].astype(inputs_embeds.dtype), inputs_embeds)


class Model(nnx.Module):
    """`Qwen3VLModel`: the vision tower and the language model."""

    def __init__(self, config: config_lib.Qwen3VLConfig, *, rngs: nnx.Rngs):
        self.visual = vision.VisionModel(config, rngs=rngs)
        self.language_model = text.TextModel(config, rngs=rngs)


class Qwen3VL(nnx.Module):
    """Qwen3-VL for conditional generation (`Qwen3VLForConditionalGeneration`)."""

    def __init__(self, config: config_lib.Qwen3VLConfig, *, rngs: nnx.Rngs):
        t = config.text_config
        self.config = config
        self.model = Model(config, rngs=rngs)
        if config.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = layers.Linear((t.hidden_size,), (t.vocab_size,), ("embed",), ("vocab",), use_bias=False,
                                         std=t.initializer_range, dtype=config.compute_dtype,
                                         param_dtype=config.parameter_dtype, rngs=rngs)

    def encode_images(self, pixel_values: jax.Array, image_grid_thw: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(a) Vision tower: `([P, I], [num_images, 3]) -> (image_embeds [M, D], deepstack [L_ds, M, D])`."""
        return self.model.visual(pixel_values, image_grid_thw)

    def embed(self, input_ids: jax.Array, image_embeds: jax.Array | None = None,
              deepstack: jax.Array | None = None) -> tuple[jax.Array, jax.Array | None]:
        """(b) Token embeddings with image features merged at the placeholders.

        Args:
            input_ids: [B, T] int.
            image_embeds: [M, D] from `encode_images`, or None for text only.
            deepstack: [L_ds, M, D] from `encode_images`, or None.

        Returns:
            inputs_embeds: [B, T, D] in the compute dtype.
            deepstack_embeds: [L_ds, B, T, D], the DeepStack rows at image tokens and zeros elsewhere; None without
                images.
        """
        image_token_id = self.config.image_token_id
        with rules.use_rules(self.config.sharding_rules):
            embeds = self.model.language_model.embed_tokens(input_ids)
            if image_embeds is None:
                return constrain(embeds, "batch", "seq", "embed"), None
            embeds = merge_image_features(embeds, input_ids, image_token_id, image_embeds)
            deepstack_embeds = None
            if deepstack is not None and deepstack.shape[0]:
                zeros = jnp.zeros_like(embeds)
                deepstack_embeds = jnp.stack([merge_image_features(zeros, input_ids, image_token_id, layer)
                                              for layer in deepstack])
            return constrain(embeds, "batch", "seq", "embed"), deepstack_embeds

    def decode(self, inputs_embeds: jax.Array, positions: jax.Array, mask_info: attention.MaskInfo,
               deepstack_embeds: jax.Array | None = None,
               caches: tuple[text.KVCache, ...] | None = None) -> tuple[jax.Array, tuple[text.KVCache, ...] | None]:
        """(c) The decoder stack with explicit positions and mask; see `text.TextModel.__call__`."""
        return self.model.language_model(inputs_embeds, positions, mask_info, deepstack_embeds, caches)

    def head_weight(self) -> jax.Array:
        """The LM head as [D, V] in the compute dtype (tied head: `embed_tokens.weight` transposed)."""
        dtype = self.config.compute_dtype
        if self.lm_head is None:
            return self.model.language_model.embed_tokens.weight[...].astype(dtype).T
        return self.lm_head.weight[...].astype(dtype)

    def compute_logits(self, hidden: jax.Array) -> jax.Array:
        """(d) hidden: [B, T, D] -> logits [B, T, V] float32."""
        with rules.use_rules(self.config.sharding_rules), jax.named_scope("lm_head"):
            rows = hidden.astype(self.config.compute_dtype).reshape(-1, hidden.shape[-1])  # [B*T, D]: see Linear
            logits = jnp.einsum("TD,DV->TV", rows, self.head_weight(), preferred_element_type=jnp.float32)
            return constrain(logits.reshape(*hidden.shape[:-1], -1), "batch", "seq", "vocab")

    def __call__(self, input_ids: jax.Array, *, attention_mask: jax.Array | None = None,
                 pixel_values: jax.Array | None = None, image_grid_thw: jax.Array | None = None) -> jax.Array:
        """Logits of a padded batch, with transformers' input conventions.

        Concrete inputs are checked on the host and run through one cached `nnx.jit` of `forward`; traced inputs
        (a caller's own jit) run `forward` directly.

        Args:
            input_ids: [B, T] int, each image expanded to vision_start + M_i image tokens + vision_end.
            attention_mask: [B, T], 0 at pads (left or right); None = no pads.
            pixel_values: [P, I] patch rows of all images of the batch, in order of appearance.
            image_grid_thw: [num_images, 3] int, (t, h, w) in patches per image.

        Returns:
            logits: [B, T, V] float32. Rows at pads are finite but meaningless.

        Raises:
            ValueError: from `check_inputs`, when the inputs are concrete.
        """
        if _is_concrete(input_ids, attention_mask, pixel_values, image_grid_thw):
            check_inputs(self.config, input_ids, attention_mask, pixel_values, image_grid_thw)
            return _jitted_forward(self, input_ids, attention_mask, pixel_values, image_grid_thw)
        return self.forward(input_ids, attention_mask, pixel_values, image_grid_thw)

    def forward(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
                pixel_values: jax.Array | None = None, image_grid_thw: jax.Array | None = None) -> jax.Array:
        """The traceable body of `__call__` (no host checks): `compute_logits(hidden_states(...))`."""
        return self.compute_logits(self.hidden_states(input_ids, attention_mask, pixel_values, image_grid_thw))

    def hidden_states(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
                      pixel_values: jax.Array | None = None, image_grid_thw: jax.Array | None = None) -> jax.Array:
        """Final-norm hidden states [B, T, D] of a padded batch (positions, images, merge, decoder; no head).

        Same inputs as `__call__`, unchecked; a loss that fuses the head (`loss.causal_lm_loss`) starts here.
        """
        input_ids = jnp.asarray(input_ids)
        batch, length = input_ids.shape
        image_embeds = deepstack = None
        if pixel_values is not None:
            image_grid_thw = jnp.asarray(image_grid_thw)
            image_embeds, deepstack = self.encode_images(jnp.asarray(pixel_values), image_grid_thw)
        positions, _ = rope.get_rope_index(input_ids, image_grid_thw, attention_mask,
                                           image_token_id=self.config.image_token_id,
                                           spatial_merge_size=self.config.vision_config.spatial_merge_size)
        embeds, deepstack_embeds = self.embed(input_ids, image_embeds, deepstack)
        mask_info = attention.causal_mask_info(attention_mask, batch, length)
        hidden, _ = self.decode(embeds, positions, mask_info, deepstack_embeds)
        return hidden


_jitted_forward = nnx.jit(Qwen3VL.forward)


def init(config: config_lib.Qwen3VLConfig, *, seed: int = 0, mesh: jax.sharding.Mesh | None = None) -> Qwen3VL:
    """A randomly initialised model, each parameter drawn on the host and placed straight into its sharding.

    Every parameter follows its `layers.Init` (normal with `initializer_range`, ones, zeros) from a numpy
    generator seeded by `(seed, crc32(parameter path))`, so values do not depend on the mesh and creation compiles
    nothing (XLA:CPU needs ~0.5 s per random op to compile). `Qwen3VL(config, rngs=...)` draws with jax.random
    instead.

    Raises:
        ValueError: a parameter whose logical names or sizes do not fit `config.sharding_rules` on `mesh`.
    """
    abstract = nnx.eval_shape(lambda: Qwen3VL(config, rngs=nnx.Rngs(seed)))

    def draw(key: str, variable: nnx.Variable) -> np.ndarray:
        rng = np.random.default_rng([seed, zlib.crc32(key.encode("utf-8"))])
        return variable.get_metadata()["initializer"].draw_host(rng, tuple(variable.shape), variable.dtype)

    return placement.materialize(abstract, draw, mesh=mesh, rules=config.sharding_rules)
