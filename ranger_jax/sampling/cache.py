"""A `Session`: a batch of conversations held in one KV cache, each row grown turn by turn.

Row b stores its tokens contiguously in cache slots `0 .. lengths[b] - 1` (no padding inside a row), so a row's slot
count is also its number of attended tokens, and its MRoPE rope delta (how far the next text position is ahead of
the slot count) is `next_positions[b] - lengths[b]`, where `next_positions[b]` is one past the largest position the
row holds. The session also keeps the logits that follow each row's last token, so every token of a row is in the
cache and the next turn only appends.

The cache arrays are partitioned by the SAMPLE rules (`parallel.rules.SAMPLE`): the batch over ("data", "fsdp")
and key/value heads over "tensor", each where the size divides.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from ranger_jax.models.qwen3_vl import config as config_lib
from ranger_jax.models.qwen3_vl import text
from ranger_jax.parallel import rules

CACHE_AXES = ("batch", "kv_heads", "kv_seq", "head_dim")  # [B, K, S, H] (text.KVCache)
ROW_AXES = ("batch",)  # [B]
LOGITS_AXES = ("batch", "vocab")  # [B, V]


def sharding(mesh: jax.sharding.Mesh | None, names: tuple[str, ...], shape: tuple[int, ...]):
    """NamedSharding of an array with logical `names` under the SAMPLE rules, or None without a mesh."""
    if mesh is None:
        return None
    spec = rules.logical_to_spec(names, rules.SAMPLE, what="sampler state", shape=shape, mesh=mesh, strict=False)
    return NamedSharding(mesh, spec)


def place(value, mesh, names):
    """`value` on `mesh` with the SAMPLE-rules sharding of logical `names` (a plain device array without a mesh)."""
    target = sharding(mesh, names, value.shape)
    return jax.device_put(value, target) if target is not None else jnp.asarray(value)


@dataclasses.dataclass(eq=False)
class Session:
    """Per-sequence state of a batch of conversations; the `Sampler` updates it in place.

    Device state (donated to the sampler's compiled calls; never hold on to these arrays across calls):
        caches: one `text.KVCache` per decoder layer, key/value [B, K, S, H].
        lengths: [B] int32 cache slots used by each row (= tokens so far).
        next_positions: [B] int32 one past the largest MRoPE position of each row.
        last_logits: [B, V] float32 logits of the token after each row's last token.

    Host state:
        num_rows: the rows asked for; rows from `num_rows` to B - 1 pad the batch bucket and stay empty.
        token_ids: per row, every token id in the cache, in order.
        image_grid_thw: per row, the (t, h, w) grid of every image consumed, in order.
    """

    caches: tuple[text.KVCache, ...]
    lengths: jax.Array
    next_positions: jax.Array
    last_logits: jax.Array
    num_rows: int
    token_ids: list[list[int]]
    image_grid_thw: list[list[tuple[int, int, int]]]
    mesh: jax.sharding.Mesh | None = None

    @property
    def batch_size(self) -> int:
        """B, the padded batch of the cache."""
        return int(self.lengths.shape[0])

    @property
    def capacity(self) -> int:
        """S, cache slots per row."""
        return int(self.caches[0].key.shape[2])

    def num_tokens(self, row: int) -> int:
        """Tokens (= cache slots) held by `row`."""
        return len(self.token_ids[row])

    def num_images(self, row: int) -> int:
        """Images consumed by `row`."""
        return len(self.image_grid_thw[row])

    @property
    def rope_deltas(self) -> np.ndarray:
        """[num_rows] int: position of the next token minus its slot, per row (transformers' `rope_deltas`)."""
        return (np.asarray(self.next_positions) - np.asarray(self.lengths))[:self.num_rows]

    def reset_rows(self, rows) -> None:
        """Empties `rows` (an int or a sequence) so they can hold new conversations; other rows are untouched."""
        rows = [rows] if isinstance(rows, int) else list(rows)
        for row in rows:
            if not 0 <= row < self.num_rows:
                raise ValueError(f"row {row} is outside the session's rows [0, {self.num_rows})")
            self.token_ids[row] = []
            self.image_grid_thw[row] = []
        index = np.asarray(rows, np.int32)
        self.lengths = place(self.lengths.at[index].set(0), self.mesh, ROW_AXES)
        self.next_positions = place(self.next_positions.at[index].set(0), self.mesh, ROW_AXES)


def new_session(config: config_lib.Qwen3VLConfig, num_rows: int, *, batch_size: int, capacity: int,
                mesh: jax.sharding.Mesh | None = None) -> Session:
    """An empty session of `batch_size` rows (>= num_rows) with `capacity` slots per row, placed on `mesh`."""
    t = config.text_config
    shape = (batch_size, t.num_key_value_heads, capacity, t.head_dim)
    target = sharding(mesh, CACHE_AXES, shape)

    def zeros():
        return jax.device_put(jnp.zeros(shape, config.compute_dtype), target)

    caches = tuple(text.KVCache(key=zeros(), value=zeros()) for _ in range(t.num_hidden_layers))
    return Session(
        caches=caches,
        lengths=place(np.zeros(batch_size, np.int32), mesh, ROW_AXES),
        next_positions=place(np.zeros(batch_size, np.int32), mesh, ROW_AXES),
        last_logits=place(np.zeros((batch_size, t.vocab_size), np.float32), mesh, LOGITS_AXES),
        num_rows=num_rows,
        token_ids=[[] for _ in range(num_rows)],
        image_grid_thw=[[] for _ in range(num_rows)],
        mesh=mesh,
    )


def grow(session: Session, capacity: int) -> None:
    """Enlarges every row of `session` to `capacity` slots (new slots are empty); no-op when already as large."""
    extra = capacity - session.capacity
    if extra <= 0:
        return
    batch, heads, _, head_dim = session.caches[0].key.shape
    target = sharding(session.mesh, CACHE_AXES, (batch, heads, capacity, head_dim))

    def widen(x):
        wider = jnp.pad(x, ((0, 0), (0, 0), (0, extra), (0, 0)))
        return jax.device_put(wider, target) if target is not None else wider

    session.caches = tuple(text.KVCache(key=widen(c.key), value=widen(c.value)) for c in session.caches)
