"""Keys and values of the memory, kept in place between segments (frozen weights)."""

import math

import keras
from keras import ops
from keras.src.utils import tracking

from txl_keras.layers.memory_cache import state_variable

MAX_WRITES = 8  # in-place writes per ring and segment, at most (see KeyValueMemory)


def head_major(kv, num_heads):
    """Keys and values `(batch_size, L, 2 * H * Dh)` (keys first) -> `(2 * H, batch_size,
    L, Dh)`: the keys' heads, then the values', the layout the attention multiplies."""
    shape = ops.shape(kv)
    split = ops.reshape(kv, (shape[0], shape[1], 2 * num_heads, shape[2] // (2 * num_heads)))
    return ops.transpose(split, (2, 0, 1, 3))


def time_major(kv):
    """The inverse of `head_major`: `(2 * H, batch_size, L, Dh)` -> `(batch_size, L,
    2 * H * Dh)`."""
    shape = ops.shape(kv)
    return ops.reshape(ops.transpose(kv, (1, 2, 0, 3)), (shape[1], shape[2], shape[0] * shape[3]))


def ring_rows(ring, offset, mem_len):
    """The last `mem_len` rows of a head-major ring buffer `(2 * H, batch_size,
    capacity, Dh)` whose oldest row is at slot `offset`, in time order: `(2 * H,
    batch_size, mem_len, Dh)`."""
    capacity = ring.shape[2]
    return ops.roll(ring, -offset, axis=2)[:, :, capacity - mem_len:]


@keras.saving.register_keras_serializable(package="txl_keras")
class KeyValueMemory(keras.layers.Layer):
    """For every layer, the keys and values of the last `mem_len` positions, in ring
    buffers that each segment writes in place.

    With relative positions a memory row's keys and values never change while the
    weights do not (evaluation, scoring), so the model needs only them, not the hidden
    states (`TransformerXL(..., memory_kv=...)` without `mems`). Shifting a memory of
    1,600 rows every segment moves the whole memory; here a segment overwrites only the
    slots of the oldest rows: `append` is an in-place update of `segment_length` rows
    when compiled by itself (XLA aliases the variables), and `read` returns the rows in
    time order (a rotation that XLA fuses into the attention's use of them). The rings
    are head-major, `(2 * num_heads, batch_size, capacity, head_dim)`, the layout the
    attention multiplies (`head_major`): read as they are stored, they are not
    transposed every segment (a copy of the whole memory per layer: 45 MB at wt103's
    evaluation at batch 8).

    Each ring holds `capacity = mem_len` rows: a segment is written in pieces of `g =
    gcd(mem_len, segment_length)` rows, one in-place write each, and as every slot
    offset is a multiple of `g`, no piece wraps around the ring's end (wt103's mem_len
    1,600 and segments of 128: two writes of 64 rows). Where that would take more than
    `MAX_WRITES` writes, the ring holds `ceil(mem_len / segment_length) *
    segment_length` rows instead, written at once. The state is the rings, the slot
    `offset` of the oldest row and the count `valid` of slots holding real positions.
    Under `tf.distribute` each replica keeps its own (`synchronization="on_read"`).

    Args:
        mem_len: int > 0, rows visible to the model.
        num_layers: int, one ring per layer.
        width: int, `2 * n_head * d_head` (keys then values).
        batch_size: int, the per-replica batch size.
        segment_length: int > 0, rows added by every `append`.
        num_heads: int > 0, `n_head` (dividing `width / 2`): the rings' layout.
        **kwargs: base layer arguments (`name`, `dtype`).

    Methods:
        read(): `(kvs, valid)`, `num_layers` tensors `(batch_size, mem_len, width)`, oldest
            row first, and the int32 count of valid (most recent) rows.
        read_rings(): `(rings, offset, valid)`, the rings `(2 * num_heads,
            batch_size, capacity, head_dim)` as stored and the slot of their oldest row
            (`ring_rows` orders one), for a model that reads each layer's ring only when
            it runs that layer.
        append(segment_kv, valid): store `num_layers` tensors `(batch_size,
            segment_length, width)` as the newest rows, and the new count.
        reset(kvs=None, valid=0): start again from `kvs` (`num_layers` tensors
            `(batch_size, mem_len, width)`, or rows broadcast to it such as
            `(batch_size, 1, width)`, one row for every slot; zeros if None).

    Example:
    >>> memory = KeyValueMemory(mem_len=3, num_layers=1, width=2, batch_size=1, segment_length=2)
    >>> memory.append([ops.ones((1, 2, 2))], 2)
    >>> kvs, valid = memory.read()
    >>> ops.convert_to_numpy(kvs[0][0, :, 0]).tolist(), int(valid)
    ([0.0, 1.0, 1.0], 2)
    """

    def __init__(self, mem_len, num_layers, width, batch_size, segment_length, num_heads=1, **kwargs):
        super().__init__(**kwargs)
        for name, value in (("mem_len", mem_len), ("num_layers", num_layers), ("width", width),
                            ("batch_size", batch_size), ("segment_length", segment_length),
                            ("num_heads", num_heads)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"Expected `{name}` to be a positive integer. Received: {name}={value!r}")
        if width % (2 * num_heads):
            raise ValueError(f"Expected `width` (keys and values, 2 * num_heads * head_dim) to be a multiple "
                             f"of 2 * num_heads = {2 * num_heads}. Received: width={width}")
        self.num_heads = num_heads
        self.mem_len = mem_len
        self.num_layers = num_layers
        self.width = width
        self.batch_size = batch_size
        self.segment_length = segment_length
        self.piece = math.gcd(mem_len, segment_length)
        if segment_length // self.piece <= MAX_WRITES:
            self.capacity = mem_len
        else:
            self.piece = segment_length
            self.capacity = -(-mem_len // segment_length) * segment_length
        self._create_state_variables()
        self.built = True

    @tracking.no_automatic_dependency_tracking
    def _create_state_variables(self):
        shape = (2 * self.num_heads, self.batch_size, self.capacity, self.width // (2 * self.num_heads))
        self.rings = [state_variable("zeros", shape, self.compute_dtype, f"ring_{i}")
                      for i in range(self.num_layers)]
        self.offset = state_variable(0, (), "int32", "offset")
        self.valid = state_variable(0, (), "int32", "valid")

    @property
    def variables(self):
        return super().variables + self.rings + [self.offset, self.valid]

    def read(self):
        offset = self.offset.value
        return [time_major(ring_rows(ring.value, offset, self.mem_len)) for ring in self.rings], self.valid.value

    def read_rings(self):
        return [ring.value for ring in self.rings], self.offset.value, self.valid.value

    def append(self, segment_kv, valid):
        offset = self.offset.value
        for ring, rows in zip(self.rings, segment_kv):
            if tuple(rows.shape[1:]) != (self.segment_length, self.width):
                raise ValueError(
                    f"Expected segment keys and values of shape (batch_size, {self.segment_length}, "
                    f"{self.width}). Received shape {tuple(rows.shape)}"
                )
            value, rows = ring.value, head_major(ops.cast(rows, ring.dtype), self.num_heads)
            for start in range(0, self.segment_length, self.piece):  # in time order: later rows win
                slot = (offset + start) % self.capacity
                value = ops.slice_update(value, [0, 0, slot, 0], rows[:, :, start:start + self.piece])
            ring.assign(value)
        self.offset.assign((offset + self.segment_length) % self.capacity)
        self.valid.assign(ops.cast(valid, "int32"))

    def reset(self, kvs=None, valid=0):
        # The given rows fill the last mem_len slots; the next append overwrites slot 0.
        start = self.capacity - self.mem_len
        for i, ring in enumerate(self.rings):
            if kvs is None:
                ring.assign(ops.zeros(ring.shape, ring.dtype))
                continue
            # (laid out before broadcasting: one row for every slot stays one row)
            given = head_major(ops.cast(kvs[i], ring.dtype), self.num_heads)
            rows = ops.broadcast_to(given, tuple(ring.shape[:2]) + (self.mem_len, ring.shape[3]))
            if start:
                rows = ops.concatenate([ops.zeros(tuple(ring.shape[:2]) + (start, ring.shape[3]), ring.dtype), rows],
                                       axis=2)
            ring.assign(rows)
        self.offset.assign(0)
        self.valid.assign(ops.cast(valid, "int32"))

    def get_config(self):
        config = super().get_config()
        config.update({
            "mem_len": self.mem_len,
            "num_layers": self.num_layers,
            "width": self.width,
            "batch_size": self.batch_size,
            "segment_length": self.segment_length,
            "num_heads": self.num_heads,
        })
        return config
