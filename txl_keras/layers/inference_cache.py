"""`InferenceCache`: a stream's memory for frozen weights (evaluation, generation), and
`CacheStore`, which keeps one in variables between compiled calls."""

import math
from typing import NamedTuple

import keras
from keras import ops
from keras.src.utils import tracking

from txl_keras import kernels
from txl_keras.kernels.ring_buffer import append_rows, append_rows_reference, own, ring_rows, write_row_in_place
from txl_keras.layers import arguments
from txl_keras.layers.memory_cache import state_variable

MAX_WRITES = 8  # in-place writes per ring and segment in a `CacheStore`, at most


def head_major(rows, groups):
    """`(B, L, G * W)` -> `(G, B, L, W)`: the row layout of a ring (for keys and values,
    the keys' heads then the values' heads, the layout the attention multiplies)."""
    shape = ops.shape(rows)
    split = ops.reshape(rows, (shape[0], shape[1], groups, shape[2] // groups))
    return ops.transpose(split, (2, 0, 1, 3))


def time_major(rows):
    """The inverse of `head_major`: `(G, B, L, W)` -> `(B, L, G * W)`."""
    shape = ops.shape(rows)
    return ops.reshape(ops.transpose(rows, (1, 2, 0, 3)), (shape[1], shape[2], shape[0] * shape[3]))


class InferenceCache(NamedTuple):
    """What the next segment of a stream needs of its memory, while the weights are frozen.

    With relative positions (attn_type 0 and 1) a memory row's keys and values do not
    change from one segment to the next, so each layer keeps them instead of the hidden
    states: a segment then projects only its own rows. With absolute positions (attn_type 2
    and 3) the keys change every segment, and each layer keeps its hidden states. Either
    way the rows sit in a ring buffer per layer, which a segment writes without moving the
    rest. `TransformerXL.init_cache` makes one, `call_with_cache` reads and advances it.

    Fields:
        rings: one per layer, `(G, batch_size, capacity, W)`: `(2 * n_head, ..., d_head)`
            keys then values, or `(1, ..., d_model)` hidden states.
        offset: int32 scalar, the slot of the oldest row.
        valid: int32 scalar, how many of the newest rows hold real positions, or one
            count per stream `(batch_size,)` (`per_row`).
        position_keys: one per layer `(n_head, d_head, P)`, the projected encoding of
            distances `P - 1, ..., 0` (attn_type 0, projected once), or `()`.
        written: int32 scalar, how many of the newest slots were written since `init_cache`
            (at most the capacity); every older slot still holds the initial memory's row.
            `None`: unknown (a memory given from outside).

    Example:
    >>> cache = InferenceCache(rings=(ops.zeros((2, 1, 3, 1)),), offset=ops.array(0, "int32"),
    ...                        valid=ops.array(0, "int32"))
    >>> cache = cache.append([ops.ones((1, 2, 2))], 2)
    >>> ops.convert_to_numpy(cache.rows(0, 3))[0, 0, :, 0].tolist(), int(cache.valid)
    ([0.0, 1.0, 1.0], 2)
    """

    rings: tuple
    offset: object
    valid: object
    position_keys: tuple = ()
    written: object = None

    def rows(self, layer, length):
        """Layer `layer`'s last `length` rows in time order, `(G, batch_size, length, W)`."""
        return ring_rows(self.rings[layer], self.offset, length)

    @property
    def capacity(self):
        """Slots per ring."""
        return self.rings[0].shape[2] if self.rings else 0

    def turned(self, offset):
        """The same memory with its oldest row at slot `offset` (int32 scalar). Turned to the
        count of written rows, those lie in slots `[0, written)`, where a one-token step
        reads them alone until the ring fills (`kernels.ring_relative_attention`)."""
        if not self.capacity:
            return self
        rings = tuple(ops.roll(ring, offset - self.offset, axis=2) for ring in self.rings)
        return self._replace(rings=rings, offset=ops.cast(offset, "int32") % self.capacity)

    def per_row(self, offset=None):
        """The same memory with a count of real rows per stream, `valid` `(batch_size,)`,
        its oldest row at slot `offset` (default: where it is). Caches of streams at
        different places in their text, turned to one offset, join on the batch axis (the
        attention masks each row's empty slots)."""
        batch_size = ops.shape(self.rings[0])[1]
        cache = self if offset is None else self.turned(offset)
        return cache._replace(valid=ops.broadcast_to(ops.cast(self.valid, "int32"), (batch_size,)))

    def owned(self):
        """The same memory in rings of its own, which `append(..., write_after=...)` may
        write where they lie (a token loop's cache: nothing else reads it)."""
        return self._replace(rings=tuple(own(ring) for ring in self.rings))

    def map_rings(self, function):
        """The same memory with each ring passed through `function` (a ring of the same
        layout back; e.g. a backend's shape assertion)."""
        return self._replace(rings=tuple(function(ring) for ring in self.rings))

    def repeated(self, times):
        """Each stream's memory `times` times in a row (the beams of one prompt):
        `batch_size * times` streams."""
        return self._of_streams(lambda x, axis: ops.repeat(x, times, axis=axis))

    def reordered(self, streams):
        """The memories of `streams` (int32 `(new_batch_size,)`, indices of this cache's
        streams) in that order (beam search keeping its best beams)."""
        return self._of_streams(lambda x, axis: ops.take(x, streams, axis=axis))

    def _of_streams(self, select):
        """The cache with `select(x, axis)` applied to its streams' axis (the rings', and a
        per-stream `valid`'s)."""
        per_stream = len(ops.shape(self.valid)) == 1
        return self.map_rings(lambda ring: select(ring, 1))._replace(
            valid=select(self.valid, 0) if per_stream else self.valid)

    def layers(self, start, end):
        """The memory of layers `[start, end)` alone (a program that runs those blocks)."""
        return self._replace(rings=self.rings[start:end], position_keys=self.position_keys[start:end])

    def with_position_keys(self, position_keys):
        """The same memory with `position_keys` (one per layer) for its attention."""
        return self._replace(position_keys=tuple(position_keys))

    @staticmethod
    def joined(caches):
        """One memory of the streams of `caches`, in order, on the batch axis; each cache
        from `per_row` turned to one offset (its real rows counted per stream)."""
        if len(caches) == 1:
            return caches[0]
        return caches[-1]._replace(
            rings=tuple(ops.concatenate(rings, axis=1) for rings in zip(*(c.rings for c in caches))),
            valid=ops.concatenate([c.valid for c in caches]))

    def append(self, rows, valid, write_after=None):
        """The cache with `rows` (one per layer, `(batch_size, T, G * W)`) as its newest
        rows and `valid` real ones (a single row is written in place with the fast
        kernels; more rows shift the memory, `kernels.ring_buffer`).

        `write_after`: for a cache from `owned()` that nothing reads after this, tensors
        computed from every read of its rings: a single row is then written into the
        rings' own buffers once they exist (`kernels.ring_buffer.write_row_in_place`), no
        copy of the memory."""
        valid = ops.cast(valid, "int32")
        if not self.rings or self.rings[0].shape[2] == 0:
            return self._replace(valid=valid)
        written = self.written
        if written is not None:
            written = ops.minimum(ops.cast(written, "int32") + ops.shape(rows[0])[1], self.capacity)
        in_place = kernels.fast_kernels_enabled() and rows[0].shape[1] == 1
        rings, offset = [], self.offset
        for ring, new in zip(self.rings, rows):
            new = head_major(new, ring.shape[0])
            if in_place and write_after is not None:
                ring, offset = write_row_in_place(ring, self.offset, new, write_after)
            elif in_place:
                ring, offset = append_rows(ring, self.offset, new, 1)
            else:
                ring, offset = append_rows_reference(ring, self.offset, new)
            rings.append(ring)
        return self._replace(rings=tuple(rings), offset=offset, valid=valid, written=written)


def store_geometry(mem_len, segment_length):
    """`(capacity, piece)` of a `CacheStore`'s rings: a segment is written in pieces of
    `gcd(mem_len, segment_length)` rows, none wrapping around the ring's end (every offset
    is a multiple of it), unless that takes more than `MAX_WRITES` writes; then the ring
    holds whole segments, `ceil(mem_len / segment_length)` of them, written at once."""
    piece = math.gcd(mem_len, segment_length)
    if segment_length // piece <= MAX_WRITES:
        return mem_len, piece
    return -(-mem_len // segment_length) * segment_length, segment_length


@keras.saving.register_keras_serializable(package="txl_keras")
class CacheStore(keras.layers.Layer):
    """An `InferenceCache` kept in variables between compiled calls (evaluation), one value
    per replica under `tf.distribute` (`synchronization="on_read"`), each segment written
    in place: `append` compiled by itself updates `segment_length` rows of every ring
    where shifting the memory would move all of it (`store_geometry`).

    Args:
        mem_len: int >= 0, rows visible to the model.
        num_layers: int, one ring per layer.
        groups: int, `G` (`2 * n_head` for keys and values, 1 for hidden states).
        width: int, `W` (`d_head`, or `d_model`).
        batch_size: int, the per-replica batch size.
        segment_length: int > 0, rows added by every `append`.
        **kwargs: base layer arguments (`name`, `dtype`).

    Methods:
        read(position_keys=()): the stored `InferenceCache`.
        append(rows, valid): store `num_layers` rows `(batch_size, segment_length, G * W)`
            as the newest, and the new count of real rows.
        reset(rows=None, valid=0): start again from `rows` (`num_layers` tensors
            `(batch_size, 1 or mem_len, G * W)`, broadcast to every slot; zeros if None).

    Example:
    >>> store = CacheStore(mem_len=3, num_layers=1, groups=2, width=1, batch_size=1, segment_length=2)
    >>> store.append([ops.ones((1, 2, 2))], 2)
    >>> ops.convert_to_numpy(store.read().rows(0, 3))[0, 0, :, 0].tolist()
    [0.0, 1.0, 1.0]
    """

    def __init__(self, mem_len, num_layers, groups, width, batch_size, segment_length, **kwargs):
        super().__init__(**kwargs)
        arguments.non_negative_int(type(self).__name__, "mem_len", mem_len)
        for name, value in (("num_layers", num_layers), ("groups", groups), ("width", width),
                            ("batch_size", batch_size), ("segment_length", segment_length)):
            arguments.positive_int(type(self).__name__, name, value)
        self.mem_len = mem_len
        self.num_layers = num_layers
        self.groups = groups
        self.width = width
        self.batch_size = batch_size
        self.segment_length = segment_length
        self.capacity, self.piece = store_geometry(mem_len, segment_length)
        self._create_state_variables()
        self.built = True

    @tracking.no_automatic_dependency_tracking
    def _create_state_variables(self):
        shape = (self.groups, self.batch_size, self.capacity, self.width)
        self.rings = [state_variable("zeros", shape, self.compute_dtype, f"ring_{i}")
                      for i in range(self.num_layers)]
        self.offset = state_variable(0, (), "int32", "offset")
        self.valid = state_variable(0, (), "int32", "valid")

    @property
    def variables(self):
        return super().variables + self.rings + [self.offset, self.valid]

    def read(self, position_keys=()):
        return InferenceCache(tuple(ring.value for ring in self.rings), self.offset.value, self.valid.value,
                              tuple(position_keys))

    def append(self, rows, valid):
        expected = (self.segment_length, self.groups * self.width)
        offset, after = self.offset.value, self.offset.value
        for ring, new in zip(self.rings if self.capacity else (), rows):
            if tuple(new.shape[1:]) != expected or new.shape[0] not in (None, self.batch_size):
                raise ValueError(f"Expected segment rows of shape (batch_size={self.batch_size}, {expected[0]}, "
                                 f"{expected[1]}). Received shape {tuple(new.shape)}")
            new = head_major(new, self.groups)
            if kernels.fast_kernels_enabled():
                value, after = append_rows(ring.value, offset, new, self.piece)
            else:
                value, after = append_rows_reference(ring.value, offset, new)
            ring.assign(value)
        self.offset.assign(after)
        self.valid.assign(ops.cast(valid, "int32"))

    def reset(self, rows=None, valid=0):
        # The given rows fill the last mem_len slots, in time order from slot 0 on.
        start = self.capacity - self.mem_len
        for i, ring in enumerate(self.rings if self.capacity else ()):
            if rows is None:
                ring.assign(ops.zeros(ring.shape, ring.dtype))
                continue
            # (laid out before broadcasting: one row for every slot stays one row)
            given = head_major(ops.cast(rows[i], ring.dtype), self.groups)
            value = ops.broadcast_to(given, tuple(ring.shape[:2]) + (self.mem_len, ring.shape[3]))
            if start:
                value = ops.concatenate([ops.zeros(tuple(ring.shape[:2]) + (start, ring.shape[3]), ring.dtype),
                                         value], axis=2)
            ring.assign(value)
        self.offset.assign(0)
        self.valid.assign(ops.cast(valid, "int32"))

    def get_config(self):
        config = super().get_config()
        config.update({"mem_len": self.mem_len, "num_layers": self.num_layers, "groups": self.groups,
                       "width": self.width, "batch_size": self.batch_size, "segment_length": self.segment_length})
        return config
