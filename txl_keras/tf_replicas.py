"""The `tf.distribute` replica id for `ReplicaDropout` on the TensorFlow backend (the
layers use keras.ops only; this, `tf_whole_draw` and `tf_random_bits` are the
TensorFlow-specific pieces they are given)."""

import tensorflow as tf

from txl_keras.layers.replica_dropout import set_replica_id_source


def tf_replica_id():
    """`replica_id_in_sync_group` in a replica context with more than one replica, else None."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return None
    return context.replica_id_in_sync_group


set_replica_id_source(tf_replica_id)
