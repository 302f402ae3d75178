"""`hold_memory`: the stateful memory a task's `fit`, `evaluate` and `predict` carry from one
batch to the next, one `MemoryCache` of the batch's streams."""

import keras

from txl_keras.layers import MemoryCache


def hold_memory(task, attribute, config, batch_size, mem_len=None, per_row=False):
    """`task.<attribute>`: a stateful `MemoryCache` of `batch_size` streams for the backbone
    of `config` (`mem_len` slots, default the config's; `per_row`: one count of valid slots
    per stream), kept while the batch size holds. A new batch size gets a new memory, made
    first and then swapped in whole (a failure leaves the task as it was), and the task's
    compiled steps are dropped, to be traced with it."""
    memory = getattr(task, attribute, None)
    if memory is not None and memory.batch_size == batch_size:
        return memory
    _check_one_replica(task)
    fresh = MemoryCache(config.mem_len if mem_len is None else mem_len, config.n_layer, config.d_model,
                        ext_len=config.ext_len, stateful=True, batch_size=batch_size,
                        zero_init=config.mem_init == "zeros", per_row=per_row, dtype=task.backbone.dtype_policy,
                        name=attribute)
    # The task is built by its first fit or evaluate, which locks its state; the memory is
    # state of the streams, not a weight, and is replaced whole for a new batch size.
    locked = task._tracker.locked
    task._tracker.unlock()
    try:
        if memory is not None:
            delattr(task, attribute)
        setattr(task, attribute, fresh)
    finally:
        if locked:
            task._tracker.lock()
    task.train_function = task.test_function = task.predict_function = None
    return fresh


def _check_one_replica(task):
    """A clear error where `fit` would run under a `tf.distribute` strategy of several
    replicas: the streams' memory of a Keras step is one replica's (the trainers keep one per
    replica), and Keras would feed the model float ids in its first trace."""
    if keras.config.backend() != "tensorflow":
        return
    import tensorflow as tf

    strategy = tf.distribute.get_strategy() if tf.distribute.has_strategy() else task.distribute_strategy
    if strategy.num_replicas_in_sync > 1:
        name = type(task).__name__
        raise ValueError(f"{name}.fit, evaluate and predict do not run under a tf.distribute strategy of "
                         f"{strategy.num_replicas_in_sync} replicas (the memory they carry between batches is one "
                         f"replica's). Train on several devices with train_gpu.py (MirroredStrategy, "
                         f"MultiWorkerMirroredStrategy) or train_tpu.py, or call fit on the JAX backend under "
                         f"keras.distribution (DataParallel, ModelParallel).")
