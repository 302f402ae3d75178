"""`Evaluation`: score a split with frozen weights, the memory in an `InferenceCache` that
each replica keeps in place between segments."""

import functools
import math

import tensorflow as tf

from txl_keras.layers.inference_cache import CacheStore
from txl_keras.layers.memory_cache import state_variable
from txl_keras.layers.relative_attention import distinct_distances
from txl_keras.training.block_program import SharedBlockProgram

# An adaptive softmax outside XLA scores the segments of a small batch together, at least
# this many tokens per call: a tail cluster's logits cost a read of its whole table whatever
# the token count, so scoring several segments at once reads each table once for all.
SCORE_TOKENS = 1024
# The position keys are projected once per pass when they take at most this share of what
# evaluation holds anyway, the weights and the memory's keys and values (else in each
# segment's blocks, in less memory): projected in each segment, `clamp_len + 1` keys per layer
# cost as many products as that many tokens' projections, 20-30% of a batch-1 segment.
POSITION_KEYS_SHARE = 1 / 8


class Evaluation:
    """The evaluation of one model at one memory setting, as named steps.

    Per replica (inside `strategy.run`): `start()` builds the memory (an empty cache: zero
    rows that count with `mem_init="zeros"`, and the position keys projected once);
    `run_segment(inputs)` runs the backbone against the cache; `score(hidden, targets)`
    gives the NLL of each target; `store(rows, valid)` writes the segment into the cache
    in place. `replica_eval(inputs, targets)` is the three in a row, returning the sums of
    the NLL and of the scored tokens (targets < 0 are padding). From the host:
    `start_pass()`, then `step(inputs, targets, index, last)` for each batch of a pass.

    With `xla` the backbone is XLA-compiled: as one program with the softmax where every
    step is (`compiled`: TPUs, --xla), else with relative positions in groups of blocks
    that share one program (`SharedBlockProgram`), and a static softmax compiled by
    itself; an adaptive softmax's gathered tails stay outside XLA, and then
    `segments_per_score` segments are held and scored together.

    Args:
        model: the `TransformerXLLM`.
        strategy: its `tf.distribute.Strategy`.
        settings: the model's config with the evaluation memory settings.
        tgt_len: int, the segment length.
        batch: int, streams per replica.
        compiled: bool, every step XLA-compiled (static shapes).
        xla: bool, XLA-compile the backbone (and a static softmax).
    """

    def __init__(self, model, strategy, settings, tgt_len, batch, compiled, xla=True):
        self.model, self.strategy, self.settings = model, strategy, settings
        self.tgt_len, self.batch, self.compiled, self.xla = tgt_len, batch, compiled, xla
        backbone = model.backbone
        groups, width = backbone.cache_layout
        # The position keys of every segment, projected once per pass where they are small
        # beside the weights and the memory's keys and values.
        rows = distinct_distances(settings.mem_len + tgt_len, settings.clamp_len) if settings.attn_type == 0 else 0
        with strategy.scope():
            self.cache = CacheStore(settings.mem_len, settings.n_layer, groups, width, batch, tgt_len - settings.ext_len,
                                    dtype=model.dtype_policy)
            keys_bytes = settings.n_layer * settings.n_head * settings.d_head * rows * \
                tf.as_dtype(model.compute_dtype).size
            keep = settings.attn_type == 0 and keys_bytes <= POSITION_KEYS_SHARE * self._held_bytes()
            self.position_keys = [state_variable("zeros", (settings.n_head, settings.d_head, rows),
                                                 model.compute_dtype, f"position_keys_{i}")
                                  for i in range(settings.n_layer)] if keep else []
        self.group = segments_per_score(settings, batch, tgt_len, self.softmax_in_xla)
        if self.group:
            with strategy.scope():
                self.held_hidden = state_variable("zeros", (self.group, batch, tgt_len, settings.d_model),
                                                  model.compute_dtype, "held_hidden")
                self.held_targets = state_variable("zeros", (self.group, batch, tgt_len), "int32", "held_targets")
        self.program = SharedBlockProgram(backbone) if xla and not compiled and backbone.can_cache_kv else None
        self._compile(whole_backbone=xla and not compiled and not backbone.can_cache_kv)

    def _held_bytes(self):
        """Bytes of the weights and of the memory's keys and values (the cache's rings)."""
        return sum(tf.as_dtype(v.dtype).size * math.prod(v.shape) for v in [*self.model.weights, *self.cache.rings])

    @property
    def softmax_in_xla(self):
        """Whether the softmax's shapes are static (no cutoffs, or every step compiled)."""
        return self.xla and (self.compiled or not self.settings.cutoffs)

    def _compile(self, whole_backbone):
        jit = self.xla
        # Every function is traced without AutoGraph: its control flow is Python over
        # static shapes, and converting the model's code would only lengthen the trace.
        graph = functools.partial(tf.function, autograph=False)
        to_xla = functools.partial(graph, jit_compile=True)
        self._backbone = to_xla(self._cached_forward) if whole_backbone else self._cached_forward
        self._softmax = self.model.softmax
        if jit and self.compiled:  # one program: backbone and softmax
            self._forward = to_xla(self._scored_segment)
        else:
            if self.softmax_in_xla:
                self._softmax = to_xla(self.model.softmax)
            self._forward = self._scored_segment
        self._store = to_xla(self.cache.append) if jit else self.cache.append
        # Where every step is compiled the reset and the position keys are XLA programs of
        # their own; else they run op by op (as a program the reset costs compiler memory).
        self._reset = to_xla(self._reset_memory) if self.compiled else self._reset_memory
        self._project = to_xla(self._project_positions) if self.compiled else self._project_positions
        self._one_step = graph(lambda inputs, targets: self.strategy.run(self.replica_eval, args=(inputs, targets)))
        if self.group:
            self._hold_step = graph(lambda inputs, targets, slot: self.strategy.run(
                self._hold, args=(inputs, targets, slot)))
            self._score_step = graph(lambda last: self.strategy.run(self._score_held, args=(last,)))
        self._start_pass = graph(lambda: self.strategy.run(self.start)) if self.compiled \
            else (lambda: self.strategy.run(self.start))

    # -- the named steps, per replica ---------------------------------------------------------

    def start(self):
        """Build the memory: empty the cache and project the position keys."""
        # (an argument made in the replica's context places the call on its device)
        self._reset(tf.constant(self.settings.mem_len if self.settings.mem_init == "zeros" else 0, tf.int32))
        if self.position_keys:
            self._project()

    def run_segment(self, inputs):
        """The backbone against the cache: `(hidden, the segment's memory rows, valid)`."""
        backbone, settings = self.model.backbone, self.settings
        cache = self.cache.read([p.value for p in self.position_keys])
        if self.program is None:
            return self._backbone(inputs, cache)
        hidden, layer_args = backbone.cached_inputs(inputs, cache, settings)
        hidden, rows = self.program(hidden, cache, layer_args)
        valid = backbone.next_valid(cache.valid, inputs.shape[1], settings)
        return hidden, backbone.segment_rows(rows, settings), valid

    def score(self, hidden, targets):
        """The NLL of each target `(batch, tgt_len)` (targets < 0 scored as 0)."""
        return self._softmax(hidden, tf.maximum(targets, 0), training=False)

    def store(self, rows, valid):
        """Write a segment's memory rows into the cache, in place."""
        self._store(rows, valid)

    def replica_eval(self, inputs, targets):
        """Score a segment and advance the memory: the replicas' summed `(NLL, tokens)`."""
        nll, rows, valid = self._forward(inputs, targets)
        self.store(rows, valid)
        return self._summed(nll, targets >= 0)

    def _cached_forward(self, inputs, cache):
        settings = self.settings
        return self.model.backbone.forward_with_cache(inputs, cache, settings.mem_len, settings.clamp_len,
                                                      settings.same_length)

    def _scored_segment(self, inputs, targets):
        hidden, rows, valid = self.run_segment(inputs)
        return self.score(hidden, targets), rows, valid

    def _reset_memory(self, valid):
        zero_rows = None
        if self.settings.mem_init == "zeros":  # every zero row has the same keys and values: one row, broadcast
            zero = tf.zeros((self.batch, 1, self.settings.d_model), self.model.compute_dtype)
            zero_rows = self.model.backbone.memory_rows([zero] * self.settings.n_layer)
        self.cache.reset(zero_rows, valid)

    def _project_positions(self):
        keys = self.model.backbone.project_positions(self.settings.mem_len + self.tgt_len, self.settings.clamp_len)
        for variable, value in zip(self.position_keys, keys):
            variable.assign(value)

    def _summed(self, nll, mask):
        # float32 sums per batch, int32 counts (TPUs have no float64); the host adds the
        # batches up in Python floats.
        context = tf.distribute.get_replica_context()
        return (context.all_reduce(tf.distribute.ReduceOp.SUM, tf.reduce_sum(tf.where(mask, nll, 0.0))),
                context.all_reduce(tf.distribute.ReduceOp.SUM, tf.reduce_sum(tf.cast(mask, tf.int32))))

    # -- segments held and scored together (an adaptive softmax outside XLA) ---------------

    def _hold(self, inputs, targets, slot):
        hidden, rows, valid = self.run_segment(inputs)
        self.store(rows, valid)
        self.held_hidden.assign(tf.tensor_scatter_nd_update(self.held_hidden.value, [[slot]], hidden[None]))
        self.held_targets.assign(tf.tensor_scatter_nd_update(self.held_targets.value, [[slot]], targets[None]))

    def _score_held(self, last):
        """The summed NLL of the held slots `0..last`."""
        group, batch, d_model = self.group, self.batch, self.settings.d_model
        targets = tf.reshape(self.held_targets.value, (group * batch, self.tgt_len))
        hidden = tf.reshape(self.held_hidden.value, (group * batch, self.tgt_len, d_model))
        nll = self.score(hidden, targets)
        slots = tf.repeat(tf.range(group), batch)[:, None]
        return self._summed(nll, tf.logical_and(targets >= 0, slots <= last))

    # -- the host side ---------------------------------------------------------------------------

    def start_pass(self):
        """Empty every replica's memory before a pass."""
        self._start_pass()

    def step(self, inputs, targets, index, last):
        """Advance every replica's memory by segment `index` of the pass; the summed `(NLL,
        tokens)` of the segments scored in this call: this one, or, where segments are held
        (`group`), the held slots once segment `index` fills the last one or is the pass's
        `last`."""
        if not self.group:
            nll, count = self._one_step(inputs, targets)
        else:
            slot = index % self.group
            self._hold_step(inputs, targets, tf.constant(slot))
            if slot < self.group - 1 and not last:
                return 0.0, 0
            nll, count = self._score_step(tf.constant(slot))
        local = self.strategy.experimental_local_results
        return local(nll)[0], local(count)[0]


def segments_per_score(settings, batch, tgt_len, softmax_in_xla):
    """Segments whose NLL evaluation computes together (`SCORE_TOKENS`), after their
    backbone, when an adaptive softmax runs outside XLA; else None (each segment in its
    own step)."""
    if not settings.cutoffs or softmax_in_xla:
        return None
    return max(1, SCORE_TOKENS // (batch * tgt_len))
