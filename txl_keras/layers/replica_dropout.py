"""Dropout whose masks differ between the replicas of a data-parallel run.

Keras `Dropout` draws from one seed generator whose state every replica of a
`tf.distribute` strategy shares, so every replica drops the same units at the same
positions. The original trainer built one tower per device and each drew its own masks:
data parallelism over N replicas was the same regularisation as one device with the
global batch. `ReplicaSeedGenerator` restores that: its seed folds in the replica id, so
the mask is a function of the layer's seed (from `keras.utils.set_random_seed`), the
number of draws so far (advanced once per call, saved and restored with the generator's
state) and the replica id. Resume stays bit-identical, and a run is reproducible.

With one replica (no strategy, or `keras.distribution`, whose SPMD programs draw one mask
of the global batch's shape and shard it, so every device already gets its own part)
there is no salt.

Each unit's keep decision takes 16 random bits (`KEEP_BITS`), read as an integer in
`[0, 65536)`: the unit is kept when they are at least `round(rate * 65536)`, and a kept
unit is scaled by `65536 / (65536 - that threshold)`, so the expected output is the input
exactly. The rate is thus rounded to a multiple of 1/65536, whatever the dtype (Keras
`Dropout` compares a uniform draw of the input's dtype with the rate: in bfloat16, 8 bits,
so a rate of 0.1 drops 10.2% of the units). The bits come from `keras.random.randint`
(the reference) unless the backend installs a faster source and the fast kernels are on
(`set_random_bits_source`; TensorFlow's takes two units' bits from each 32-bit Philox
output, `txl_keras.tf_backend.random_bits`).
"""

import keras
from keras import ops

from txl_keras import kernels, tf_backend
from txl_keras.layers import arguments

# An odd constant (golden ratio, 32 bits): replica r adds r * _SALT to the seed.
_SALT = 0x9E3779B1


_REPLICA_ID_SOURCE = [None]
_RANDOM_BITS_SOURCE = [None]
KEEP_BITS = 16


def set_random_bits_source(source):
    """Install `source(inputs, seed_generator) -> integers of `inputs`' shape, uniform in
    [0, 2**KEEP_BITS)` (any integer dtype holding them), which draws once from the
    generator (`seed_generator.next()`); None restores `keras.random.randint`."""
    tf_backend.install()  # first, so that it does not replace this choice later
    _RANDOM_BITS_SOURCE[0] = source


def random_bits(inputs, seed_generator):
    """`KEEP_BITS` uniform random bits per unit of `inputs`, as integers of its shape."""
    tf_backend.install()
    source = _RANDOM_BITS_SOURCE[0] if kernels.fast_kernels_enabled() else None
    if source is None:
        return keras.random.randint(ops.shape(inputs), 0, 1 << KEEP_BITS, dtype="int32", seed=seed_generator)
    return source(inputs, seed_generator)


def keep_threshold(rate):
    """The bits' value from which a unit is kept: `rate * 2**KEEP_BITS` rounded (at most
    `2**KEEP_BITS - 1`, so some unit may be kept)."""
    return min(round(rate * (1 << KEEP_BITS)), (1 << KEEP_BITS) - 1)


def set_replica_id_source(source):
    """Install `source() -> replica id or None`, the backend's way to tell which replica of
    a data-parallel step is running (`txl_keras.tf_backend.install`, run on first use, gives TensorFlow's
    `tf.distribute` one); None removes it."""
    tf_backend.install()
    _REPLICA_ID_SOURCE[0] = source


def replica_id():
    """The id of the running replica when there is more than one (an int32 scalar tensor
    or a Python int), else None (one replica, or no source for this backend)."""
    tf_backend.install()
    source = _REPLICA_ID_SOURCE[0]
    return None if source is None else source()


class ReplicaSeedGenerator(keras.random.SeedGenerator):
    """A `keras.random.SeedGenerator` whose draws differ per replica (same state)."""

    def next(self, ordered=True):
        seed = super().next(ordered=ordered)
        replica = replica_id()
        if replica is None:
            return seed
        salt = ops.cast(replica, seed.dtype) * ops.cast(_SALT, seed.dtype)
        return seed + ops.stack([salt, ops.zeros_like(salt)])


@keras.saving.register_keras_serializable(package="txl_keras")
class ReplicaDropout(keras.layers.Layer):
    """Dropout with an independent mask on every replica (see the module's docstring).

    Args:
        rate: float in [0, 1), the fraction of units dropped.
        seed: optional int; by default one drawn from Keras's global seed
            (`keras.utils.set_random_seed`).
        **kwargs: base layer arguments (`name`, `dtype`).

    Call arguments:
        inputs: a tensor of any shape.
        training: bool, enables dropout.

    Returns:
        A tensor of the input's shape: kept units scaled by `1 / (1 - rate)`, the others 0
        (`rate` rounded to a multiple of 2**-16).

    Example:
    >>> x = keras.ops.ones((2, 4))
    >>> bool(keras.ops.all(ReplicaDropout(0.5)(x) == x))
    True
    """

    def __init__(self, rate, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.rate = arguments.rate(type(self).__name__, "rate", rate)
        self.seed = seed
        self.seed_generator = ReplicaSeedGenerator(seed) if rate > 0 else None
        self.supports_masking = True
        self.built = True

    def call(self, inputs, training=False):
        if not training or self.rate == 0:
            return inputs
        threshold = keep_threshold(self.rate)
        bits = random_bits(inputs, self.seed_generator)
        keep = ops.greater_equal(bits, ops.cast(threshold, bits.dtype))
        scale = (1 << KEEP_BITS) / ((1 << KEEP_BITS) - threshold)
        return ops.where(keep, inputs * ops.cast(scale, inputs.dtype), ops.cast(0, inputs.dtype))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "rate": self.rate, "seed": self.seed}
