"""The `tf.distribute` replica id, for `ReplicaDropout` (each replica draws its own masks)."""

import tensorflow as tf


def tf_replica_id():
    """`replica_id_in_sync_group` in a replica context with more than one replica, else None."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return None
    return context.replica_id_in_sync_group

