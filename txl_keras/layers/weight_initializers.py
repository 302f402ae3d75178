"""Initializers for one weight each: independent draws, large tables without extra copies.

Keras's random initializers repeat their values at every call (an unseeded one fixes a
seed when it is made), so one instance shared by several weights starts them equal: a
model whose layers all received its config's initializer would begin with every layer
identical, and two weights of one shape in a layer (the r_w/r_r biases) equal. Each
weight here gets its own copy, as Keras's MultiHeadAttention does for its sublayers.
"""

import math

import keras
from keras import ops

from txl_keras import tf_backend

# Values drawn at a time for a large weight: 64 MB in float32, above glibc's largest mmap
# threshold (32 MB), so that each block's buffers go back to the system when freed (smaller
# ones come from the heap, which keeps them).
BLOCK_VALUES = 1 << 24
SHAPE_FREE = (keras.initializers.RandomNormal, keras.initializers.RandomUniform, keras.initializers.TruncatedNormal)
_WHOLE_DRAW = [None]


def set_whole_draw(draw):
    """Install `draw(initializer, shape, dtype) -> values`, the backend's way to draw a
    large weight at once taking its size only once (`txl_keras.tf_backend.install` gives
    TensorFlow's); None removes it."""
    tf_backend.install()  # first, so that it does not replace this choice later
    _WHOLE_DRAW[0] = draw


def copy_initializer(initializer, seed_offset=0):
    """A copy of `initializer` (anything `keras.initializers.get` takes) that draws its
    own values: unseeded ones get a new seed (from Python's `random`, which
    `keras.utils.set_random_seed` fixes); an integer seed is kept, plus `seed_offset`, as
    the user asked for those values. One seeded by a `SeedGenerator` is returned as is
    (it already advances at every call), and so is one that its `get_config` does not
    rebuild (a user's class without one)."""
    initializer = keras.initializers.get(initializer)
    if not isinstance(initializer, keras.initializers.Initializer):
        return initializer  # a plain callable
    config = initializer.get_config()
    seed = config.get("seed")
    if seed is not None and not isinstance(seed, int):
        return initializer
    if isinstance(seed, int):
        config["seed"] = (seed + seed_offset) % 2**31
    try:
        return initializer.__class__.from_config(config)
    except (TypeError, ValueError):  # a user's initializer that its config does not rebuild
        return initializer


def weight_initializer(initializer):
    """The initializer to give `add_weight` for one weight: `copy_initializer`, and for
    random normal or uniform values whose distribution does not depend on the shape, a
    large weight (over `BLOCK_VALUES` values) drawn without extra full-size copies. A
    random op's scale and shift each make a new full-size buffer when run eagerly, so
    drawing wt103's (267,735, 410) table at once briefly takes three times its size.
    With a backend's whole draw (`set_whole_draw`; TensorFlow's: one graph whose scale
    and shift write over the random values in place) it takes its size once.
    Otherwise it is drawn `BLOCK_VALUES` at a time along the first axis, each block with
    its own seed, then concatenated: twice its size."""
    initializer = copy_initializer(initializer)
    if not isinstance(initializer, SHAPE_FREE):
        return initializer

    def initialize(shape, dtype=None):
        shape = tuple(shape)
        rows, per_row = (shape[0], math.prod(shape[1:])) if shape else (1, 1)
        block = max(1, BLOCK_VALUES // max(per_row, 1))
        if rows <= block:
            return initializer(shape, dtype=dtype)
        tf_backend.install()
        if _WHOLE_DRAW[0] is not None:
            return _WHOLE_DRAW[0](initializer, shape, dtype)
        parts = [
            copy_initializer(initializer, seed_offset=k)((min(block, rows - start),) + shape[1:], dtype=dtype)
            for k, start in enumerate(range(0, rows, block))
        ]
        return ops.concatenate(parts, axis=0)

    return initialize

