"""Dropout's random bits on TensorFlow: two units' 16 bits from each 32-bit output of the
stateless Philox generator, half the draws of one number per unit. The 32-bit words are
viewed as pairs of 16-bit integers (a bitcast, no copy; XLA compiles it too). Its
reference is `keras.random.randint` (`replica_dropout.random_bits` with no source)."""

import tensorflow as tf

from txl_keras.layers.replica_dropout import KEEP_BITS

assert KEEP_BITS == 16  # the bitcast below splits each 32-bit word in two


def philox_bits16(inputs, seed_generator):
    """uint16 `inputs.shape`: the halves of `ceil(size / 2)` stateless 32-bit draws."""
    seed = seed_generator.next()
    if seed.dtype != tf.int32:  # stateless ops under XLA take int32 seeds (as Keras's own draws)
        seed = tf.cast(tf.math.floormod(seed, tf.int32.max - 1), tf.int32)
    size = inputs.shape.num_elements()
    if size is None:
        size = tf.size(inputs)
    words = tf.random.stateless_uniform([(size + 1) // 2], seed, minval=None, maxval=None, dtype=tf.uint32)
    halves = tf.reshape(tf.bitcast(words, tf.uint16), [-1])
    if not isinstance(size, int) or size % 2:
        halves = halves[:size]
    return tf.reshape(halves, tf.shape(inputs))

