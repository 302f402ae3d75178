"""Every replica of a data-parallel run draws its own dropout masks, deterministically
(two logical CPU devices under MirroredStrategy)."""

import keras
import numpy as np
import tensorflow as tf

from txl_keras import TransformerXLConfig
from txl_keras.layers import ReplicaDropout
from txl_keras.models.transformer_xl_lm import TransformerXLLM


def replica_masks(strategy, layer, shape=(64, 128)):
    out = tf.function(lambda: strategy.run(lambda: layer(tf.ones(shape), training=True)))()
    return [v.numpy() == 0 for v in strategy.experimental_local_results(out)]


def within(fraction, p, n, sigmas=5):
    return abs(fraction - p) < sigmas * np.sqrt(p * (1 - p) / n)


def test_replicas_draw_independent_masks_at_the_rate(mirrored):
    p = 0.3
    with mirrored.scope():
        layer = ReplicaDropout(p, seed=11)
    first = replica_masks(mirrored, layer)
    n = first[0].size
    for mask in first:
        assert within(mask.mean(), p, n)  # each replica drops units at the rate
    assert not np.array_equal(first[0], first[1])
    assert within((first[0] & first[1]).mean(), p * p, n)  # independent: both dropped at p^2
    second = replica_masks(mirrored, layer)
    assert within((first[0] & second[0]).mean(), p * p, n)  # the next step draws new masks
    with mirrored.scope():
        again = ReplicaDropout(p, seed=11)
    for a, b in zip(first, replica_masks(mirrored, again)):  # a function of seed, step and replica
        np.testing.assert_array_equal(a, b)


def test_stateful_fit_under_a_users_strategy_drops_per_replica(mirrored):
    """model.fit with the user's MirroredStrategy: both replicas get the same rows; the
    memory they keep (hidden states after the embedding dropout) differs only if their
    masks do."""
    def replica_memories(dropout):
        keras.utils.set_random_seed(1)
        cfg = TransformerXLConfig.from_preset("tiny", n_token=16, dropout=dropout)
        with mirrored.scope():
            model = TransformerXLLM(cfg, stateful=True, batch_size=2)
            model.compile(optimizer=keras.optimizers.Adam(3e-3))
        rows = np.tile(np.arange(8)[None], (4, 1))
        model.fit(rows, rows, batch_size=4, epochs=1, shuffle=False, verbose=0)
        memory = model.backbone.memory.memory_variables[0]
        return [v.numpy() for v in mirrored.experimental_local_results(memory.value)]

    same = replica_memories(0.0)
    np.testing.assert_allclose(same[0], same[1], rtol=1e-6, atol=1e-6)  # the control
    dropped = replica_memories(0.3)
    assert np.abs(dropped[0] - dropped[1]).max() > 0.05
