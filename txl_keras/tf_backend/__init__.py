"""The TensorFlow-specific pieces of txl_keras, installed by one call.

The layers use `keras.ops` only. `install()`, which the layers call on first use, gives
them what TensorFlow offers beyond `keras.ops` when it is the Keras backend:

- `replicas`: the `tf.distribute` replica id, so that each replica draws its own dropout
  masks (`ReplicaDropout`);
- `random_bits`: dropout's random bits, two units per 32-bit Philox word (a fast kernel;
  `keras.random.randint` is its reference);
- `whole_draw`: large random tables drawn as one graph, taking their size once.

(TensorFlow's BFC CPU allocator is a process setting: `txl_io.cpu_allocator`, chosen by the
programs and by `txl_keras.prefer_bfc_cpu_allocator()`.)
"""

_INSTALLED = []


def install():
    """On the TensorFlow backend, give the layers TensorFlow's replica id, random bits and
    whole draws; calling it again does nothing."""
    if _INSTALLED:
        return
    _INSTALLED.append(True)
    import keras

    if keras.config.backend() == "tensorflow":
        from txl_keras.layers import replica_dropout, weight_initializers
        from txl_keras.tf_backend.random_bits import philox_bits16
        from txl_keras.tf_backend.replicas import tf_replica_id
        from txl_keras.tf_backend.whole_draw import draw_as_one_graph

        replica_dropout.set_replica_id_source(tf_replica_id)
        replica_dropout.set_random_bits_source(philox_bits16)
        weight_initializers.set_whole_draw(draw_as_one_graph)
