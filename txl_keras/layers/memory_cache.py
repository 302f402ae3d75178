"""The segment-level recurrence memory of Transformer-XL."""

import keras
import numpy as np
from keras import ops
from keras.src.utils import tracking

from txl_keras.layers import arguments


def state_variable(initial, shape, dtype, name):
    """A non-trainable variable of state kept between calls, one value per replica
    under `tf.distribute`."""
    return keras.Variable(
        initial,
        shape=shape,
        dtype=dtype,
        trainable=False,
        synchronization="on_read",
        aggregation="only_first_replica",
        name=name,
    )


@keras.saving.register_keras_serializable(package="txl_keras")
class MemoryCache(keras.layers.Layer):
    """Keeps, for every layer, the last `mem_len` hidden states that entered it.

    New memory of layer `l` = the last `mem_len` positions of
    `concat([memory_l, input_l[:, :T - ext_len]])` along time, with no gradient into it.
    Memory of length zero (`mem_len=0`) means no recurrence.

    Functionally, `cache(layer_inputs, memories)` returns the new memories; a stream
    starts with `memories=None` (no memory: nothing to attend to, not zeros).

    With `stateful=True` the memories live in non-trainable variables of shape
    `(batch_size, mem_len, hidden_dim)`, plus a count `valid` of how many of the most
    recent slots hold real positions (the rest are masked by the model). Under
    `tf.distribute` each replica keeps its own value (`synchronization="on_read"`);
    under JAX they are tracked non-trainable variables, so they survive `jit`.
    `read()` returns `(memories, valid)`, `write(memories, valid)` stores them,
    `reset()` empties them. These variables are state, not weights: they are listed in
    `variables` (not `weights`), so weight files of stateful and stateless models are
    interchangeable.

    Args:
        mem_len: int >= 0.
        num_layers: int, how many memories (one per layer).
        hidden_dim: int, the width of each memory.
        ext_len: int >= 0, trailing positions of a segment not cached (PyTorch `ext_len`).
        stateful: bool, keep the memories in variables.
        batch_size: int, the per-replica batch size; required when `stateful`.
        zero_init: bool, a reset memory is `mem_len` zeros that count as valid (the
            original TF code's behaviour, needed to reproduce its numbers) instead of
            empty.
        per_row: bool, `valid` is one count per row `(batch_size,)` (rows whose streams
            start at different times, as documents do) instead of one int32 scalar.
        **kwargs: base layer arguments (`name`, `dtype`).

    Call arguments:
        layer_inputs: list of `num_layers` tensors `(batch_size, T, hidden_dim)`.
        memories: `None` or list of `num_layers` tensors `(batch_size, M, hidden_dim)`.
        mem_len: optional int overriding `mem_len` for this call (evaluation with a
            longer memory than training).

    Returns:
        List of `num_layers` tensors `(batch_size, min(mem_len, M + T - ext_len),
        hidden_dim)`.

    Example:
    >>> cache = MemoryCache(mem_len=4, num_layers=1, hidden_dim=8)
    >>> mems = cache([keras.random.normal((2, 3, 8))])
    >>> mems = cache([keras.random.normal((2, 3, 8))], mems)
    >>> tuple(mems[0].shape)
    (2, 4, 8)
    """

    def __init__(
        self,
        mem_len,
        num_layers,
        hidden_dim,
        ext_len=0,
        stateful=False,
        batch_size=None,
        zero_init=False,
        per_row=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        layer = type(self).__name__
        if stateful:
            arguments.int_at_least(layer, "batch_size", batch_size, 1,
                                   "a positive integer (a stateful MemoryCache needs the per-replica batch size)")
        self.mem_len = arguments.non_negative_int(layer, "mem_len", mem_len)
        self.num_layers = arguments.positive_int(layer, "num_layers", num_layers)
        self.hidden_dim = arguments.positive_int(layer, "hidden_dim", hidden_dim)
        self.ext_len = arguments.non_negative_int(layer, "ext_len", ext_len)
        self.stateful = stateful
        self.batch_size = batch_size
        self.zero_init = zero_init
        self.per_row = arguments.boolean(layer, "per_row", per_row)
        self.memory_variables, self.valid_variable = [], None
        if stateful:
            self._create_state_variables()
        self.built = True

    @tracking.no_automatic_dependency_tracking
    def _create_state_variables(self):
        # Like keras.layers.RNN's states: not weights (so weight files of stateful and
        # stateless models are interchangeable) but listed in `variables`, which JAX's
        # stateless calls thread through jit.
        shape = (self.batch_size, self.mem_len, self.hidden_dim)
        self.memory_variables = [
            state_variable("zeros", shape, self.compute_dtype, f"memory_{i}") for i in range(self.num_layers)
        ]
        valid = np.int32(self.mem_len if self.zero_init else 0)
        self.valid_variable = state_variable(np.full((self.batch_size,), valid) if self.per_row else valid,
                                             (self.batch_size,) if self.per_row else (), "int32", "memory_valid")

    @property
    def variables(self):
        state = self.memory_variables + ([self.valid_variable] if self.stateful else [])
        return super().variables + state

    def initial_memories(self, batch_size):
        """The memories a stream starts with: `None` (empty), or zeros if `zero_init`."""
        if not self.zero_init or self.mem_len == 0:
            return None
        zeros = ops.zeros((batch_size, self.mem_len, self.hidden_dim), self.compute_dtype)
        return [zeros] * self.num_layers

    def call(self, layer_inputs, memories=None, mem_len=None):
        mem_len = self.mem_len if mem_len is None else mem_len
        if mem_len == 0:
            return memories if memories is not None else self._empty(layer_inputs[0])
        new_memories = []
        for i, layer_input in enumerate(layer_inputs):
            layer_input = ops.cast(layer_input, self.compute_dtype)
            if self.ext_len:
                layer_input = layer_input[:, : ops.shape(layer_input)[1] - self.ext_len]
            if memories is not None:
                joined = ops.concatenate([ops.cast(memories[i], self.compute_dtype), layer_input], 1)
            else:
                joined = layer_input
            length = ops.shape(joined)[1]
            if isinstance(length, int):
                start = max(0, length - mem_len)
            else:
                start = ops.maximum(0, length - mem_len)
            new_memories.append(ops.stop_gradient(joined[:, start:]))
        return new_memories

    def _empty(self, reference):
        shape = ops.shape(reference)
        empty = ops.zeros((shape[0], 0, shape[-1]), self.compute_dtype)
        return [empty] * self.num_layers

    def read(self):
        """The stored `(memories, valid)`: list of `(batch_size, mem_len, hidden_dim)`
        tensors and an int32 scalar (`(batch_size,)` with `per_row`). The memories are snapshots: on PyTorch a variable's
        value is its storage, which `write` updates in place while the step's backward
        pass may still need the memory it read (the attention's key and value product
        keeps it for the kernel's gradient); TensorFlow's reads are snapshots already."""
        self._check_stateful("read")
        return [ops.copy(v.value) for v in self.memory_variables], self.valid_variable.value

    def write(self, memories, valid):
        """Store memories of shape `(batch_size, mem_len, hidden_dim)` and the count of
        valid slots."""
        self._check_stateful("write")
        for variable, memory in zip(self.memory_variables, memories):
            variable.assign(ops.cast(memory, variable.dtype))
        self.valid_variable.assign(ops.cast(valid, "int32"))

    def reset(self):
        """Empty the stored memories (zeros that count as valid if `zero_init`)."""
        self._check_stateful("reset")
        for variable in self.memory_variables:
            variable.assign(ops.zeros(variable.shape, variable.dtype))
        self.valid_variable.assign(ops.full(self.valid_variable.shape, self.mem_len if self.zero_init else 0, "int32"))

    def _check_stateful(self, what):
        if not self.stateful:
            raise ValueError(
                f"Cannot {what} the memory of a MemoryCache built with stateful=False; "
                "pass memories in and out of the call instead, or build it with "
                "stateful=True and a batch_size."
            )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "mem_len": self.mem_len,
                "num_layers": self.num_layers,
                "hidden_dim": self.hidden_dim,
                "ext_len": self.ext_len,
                "stateful": self.stateful,
                "batch_size": self.batch_size,
                "zero_init": self.zero_init,
                "per_row": self.per_row,
            }
        )
        return config
