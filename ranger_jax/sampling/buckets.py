"""Static shape buckets: every size a compiled sampler function sees is rounded up to a power of two.

Batch, appended tokens per row, KV-cache slots, vision patches, images per call, new tokens per call, stop ids
per row and the rows a call works on each round up to `max(minimum, 2**ceil(log2(n)))`, so steady-state decoding
reuses a handful of compiled programs instead of compiling for every new length. Image patches round to a multiple
of `spatial_merge_size**2` times a power of two, and the padding patches become one extra dummy image so the vision
tower never mixes them into a real image. The decoder's append sees the image features and grids fitted to the call's
rows x tokens (`fit_grids`, `steps.fit_image_features`; up to `fit_images_up_to` of them), so only the vision tower's
programs depend on the images.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np


def round_up(n: int, minimum: int) -> int:
    """The smallest power of two >= max(n, minimum) (minimum itself is rounded up to a power of two)."""
    n = max(int(n), int(minimum), 1)
    return 1 << (n - 1).bit_length()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Buckets:
    """Smallest bucket of each padded dimension (each is rounded up to a power of two)."""

    min_batch: int = 1  # rows of a session (B)
    min_length: int = 16  # tokens appended to a row in one call (T)
    min_cache: int = 128  # KV-cache slots per row (S); the cache grows by doubling
    min_patches: int = 64  # vision patch rows of one append call (P), in units of spatial_merge_size**2
    min_images: int = 2  # images of one append call, including the dummy padding image
    min_new_tokens: int = 16  # length of the output buffer of one generate call
    min_stop_ids: int = 4  # stop token ids per row
    # rows of one append or generate call: a call on fewer rows than the session's batch runs on those rows alone,
    # gathered into a sub-batch of at least this many rows (a power of two); the others are untouched. Measured on
    # sim-tiny's evaluation (32 rows, 2 CPU cores): ~1/3 less compute than whole-batch calls, more compiled shapes
    min_active_rows: int = 8
    # rows of one append call (sub-batches of appends are separate from decoding's `min_active_rows`): appends come
    # one or two rows at a time (an episode's new observation) and each row costs its whole padded length, so small
    # sub-batches pay. An append also splits into calls by length (`append_groups`)
    min_append_rows: int = 1
    group_appends: bool = True  # False: every append is one call, its rows padded to the longest
    # an append call of at most this many rows x tokens sees its image features and grids fitted to rows x tokens
    # (`fit_grids`, `steps.fit_image_features`; exact), so its programs do not multiply by image counts and sizes;
    # a larger call keeps the features' own buckets (fitted, its features would take rows x tokens x hidden x (1 +
    # DeepStack layers) values: 512 MB at 16k for Qwen3-VL-8B in bf16). 0: never (benchmarks/fit_images.py compares)
    fit_images_up_to: int = 16384

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "fit_images_up_to":
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ValueError(f"Buckets.fit_images_up_to must be an int >= 0, got {value!r}")
            elif field.name == "group_appends":
                if not isinstance(value, bool):
                    raise ValueError(f"Buckets.group_appends must be a bool, got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Buckets.{field.name} must be a positive int, got {value!r}")

    def fits_images(self, rows: int, length: int) -> bool:
        """Whether an append of `rows` x `length` tokens gets its image features fitted to rows x length."""
        return rows * length <= self.fit_images_up_to

    def batch(self, n: int) -> int:
        """Padded batch size (rows B) for `n` rows."""
        return round_up(n, self.min_batch)

    def length(self, n: int) -> int:
        """Padded append length (T) for `n` tokens."""
        return round_up(n, self.min_length)

    def cache(self, n: int) -> int:
        """Padded KV-cache size (slots S) for `n` tokens."""
        return round_up(n, self.min_cache)

    def active_rows(self, n: int) -> int:
        """Padded sub-batch of a call on `n` rows (a session's batch or more: the call runs on the whole batch)."""
        return round_up(n, self.min_active_rows)

    def append_rows(self, n: int) -> int:
        """Padded sub-batch of an append call on `n` rows (a session's batch or more: the whole batch)."""
        return round_up(n, self.min_append_rows)

    def append_groups(self, lengths: Sequence[int], *, batch: int, slots: int) -> list[list[int]]:
        """The rows of one append split into calls (lists of indices into `lengths`, ascending length): a call pads
        every row to its longest, so a 3-token generation prompt appended beside a 400-token search result costs
        400 tokens; a call of its own costs a launch and, below the session's `batch` rows, the copy of each row's
        cache out and back (`Sampler` sub-batches). Rows of one length bucket always share a call; which adjacent
        buckets share one is chosen to minimise (in token positions) rows x length + a copy of `slots` / 32 per row
        of a sub-batch + 32 per call. Measured with the sim-tiny policy at 2,048 slots on 2 CPU cores: ~27 us a
        padded token, ~2 ms per row copied, ~0.5 ms a launch (benchmarks/group_savings.py measures a GRPO round)."""
        if not self.group_appends:
            return [list(range(len(lengths)))]
        by_bucket: dict[int, list[int]] = {}
        for index, n in enumerate(lengths):
            by_bucket.setdefault(self.length(n), []).append(index)
        buckets = sorted(by_bucket)

        def cost(first: int, last: int) -> int:  # one call for buckets[first..last]
            rows = self.append_rows(sum(len(by_bucket[b]) for b in buckets[first:last + 1]))
            copies = rows * (slots // 32) if rows < batch else 0
            return min(rows, batch) * buckets[last] + copies + 32

        best = [(0, -1)] * (len(buckets) + 1)  # best[j]: (cost of buckets[:j], start of its last call)
        for j in range(1, len(buckets) + 1):
            best[j] = min((best[i][0] + cost(i, j - 1), i) for i in range(j))
        calls, end = [], len(buckets)
        while end > 0:
            start = best[end][1]
            calls.append([index for b in buckets[start:end] for index in by_bucket[b]])
            end = start
        return calls[::-1]

    def new_tokens(self, n: int) -> int:
        """Padded output buffer length for `n` new tokens."""
        return round_up(n, self.min_new_tokens)

    def stop_ids(self, n: int) -> int:
        """Padded count of stop ids per row for `n` ids."""
        return round_up(n, self.min_stop_ids)

    def patches(self, n: int, merge: int) -> int:
        """Padded patch rows: merge**2 times a power of two, >= n."""
        unit = merge * merge
        return unit * round_up(-(-n // unit), max(1, self.min_patches // unit))

    def images(self, n: int) -> int:
        """Padded image count for `n` images (the dummy padding image included)."""
        return round_up(n, self.min_images)


def pad_images(pixel_values: np.ndarray, grid_thw: np.ndarray, *, num_patches: int, num_images: int,
               merge: int) -> tuple[np.ndarray, np.ndarray]:
    """Pads the patch rows and grid list of one call to bucket sizes without changing the real images' features.

    The padding rows form one dummy image of grid (1, merge, pad / merge) right after the real images (attention
    in the tower stays inside an image, so real features are untouched), and the grid list is filled with
    (1, merge, merge) entries that own no patch rows and no placeholder tokens.

    Args:
        pixel_values: [P, I] float32 real patch rows.
        grid_thw: [n, 3] int real grids.
        num_patches: bucket size >= P, a multiple of merge**2.
        num_images: bucket size >= n + 1.
        merge: spatial_merge_size.

    Returns:
        pixel_values [num_patches, I] and grid_thw [num_images, 3] int32.
    """
    real, features = pixel_values.shape
    count = grid_thw.shape[0]
    assert num_patches >= real and (num_patches - real) % (merge * merge) == 0 and num_images > count
    padded = np.zeros((num_patches, features), np.float32)
    padded[:real] = pixel_values
    grid = np.tile(np.asarray([[1, merge, merge]], np.int32), (num_images, 1))
    grid[:count] = grid_thw
    spare = num_patches - real
    if spare:
        grid[count] = (1, merge, spare // merge)
    return padded, grid


def fit_grids(grid_thw: np.ndarray, rows: int, *, merge: int) -> np.ndarray:
    """A padded grid list with exactly `rows` entries: (1, merge, merge) entries appended, or trailing ones cut.

    MRoPE positions take a call's grids in order, one per run of placeholders, so only the first (real) entries
    are read; a call of B·T tokens has at most B·T / 3 images (each is at least a vision start, one placeholder
    and a vision end), so `rows = B·T` keeps them all and the append program's shape no longer depends on the
    image count.

    Args:
        grid_thw: [n, 3] int grids, the real ones first.
        rows: entries wanted, at least the real count.
        merge: spatial_merge_size.
    """
    grid_thw = np.asarray(grid_thw, np.int32).reshape(-1, 3)
    if len(grid_thw) >= rows:
        return grid_thw[:rows]
    extra = np.tile(np.asarray([[1, merge, merge]], np.int32), (rows - len(grid_thw), 1))
    return np.concatenate([grid_thw, extra])
