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
the draws are those of Keras `Dropout`.
"""

import keras
from keras import ops

# An odd constant (golden ratio, 32 bits): replica r adds r * _SALT to the seed.
_SALT = 0x9E3779B1


_REPLICA_ID_SOURCE = [None]


def set_replica_id_source(source):
    """Install `source() -> replica id or None`, the backend's way to tell which replica of
    a data-parallel step is running (`txl_keras.tf_replicas` installs TensorFlow's
    `tf.distribute` one when the package is imported on that backend); None removes it."""
    _REPLICA_ID_SOURCE[0] = source


def replica_id():
    """The id of the running replica when there is more than one (an int32 scalar tensor
    or a Python int), else None (one replica, or no source for this backend)."""
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
    """`keras.layers.Dropout` with an independent mask on every replica.

    Args:
        rate: float in [0, 1), the fraction of units dropped.
        seed: optional int; by default one drawn from Keras's global seed
            (`keras.utils.set_random_seed`).
        **kwargs: base layer arguments (`name`, `dtype`).

    Call arguments:
        inputs: a tensor of any shape.
        training: bool, enables dropout.

    Returns:
        A tensor of the input's shape: kept units scaled by `1 / (1 - rate)`, the others 0.

    Example:
    >>> x = keras.ops.ones((2, 4))
    >>> bool(keras.ops.all(ReplicaDropout(0.5)(x) == x))
    True
    """

    def __init__(self, rate, seed=None, **kwargs):
        super().__init__(**kwargs)
        if not 0 <= rate < 1:
            raise ValueError(f"rate must be in [0, 1), got {rate}.")
        self.rate = rate
        self.seed = seed
        self.seed_generator = ReplicaSeedGenerator(seed) if rate > 0 else None
        self.supports_masking = True
        self.built = True

    def call(self, inputs, training=False):
        if training and self.rate > 0:
            return keras.random.dropout(inputs, self.rate, seed=self.seed_generator)
        return inputs

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "rate": self.rate, "seed": self.seed}
