"""The TensorFlow trainer: the shared loop (`loop.TrainingLoop`) under a `tf.distribute` strategy.

One replica step (the trainers' step, `txl_keras.training.step`) reads that replica's
memory, runs forward and backward (optionally XLA-compiled; in `batch_chunk` chunks one
after another, each in `concurrent_parts` parts side by side), stores the new memory, and
returns gradients summed over replicas, made ready by `checked_gradients`. A `tf.function` runs
`iterations` such steps per call (the TPU host-loop pattern). The memory lives in
per-replica variables, so it persists across steps and host-loop calls, and it is saved
in checkpoints with everything else needed to resume bit for bit.
"""

import os

import keras
import numpy as np
import tensorflow as tf

from tf_records import distributed_dataset_fn
from txl_io import files
from txl_keras.layers.memory_cache import MemoryCache
from txl_keras.models.transformer_xl_lm import TransformerXLLM
from txl_keras.training.evaluation import Evaluation
from txl_keras.training.loop import TrainingLoop, check_batch_chunk
from txl_keras.training.optimizer import Adam
from txl_keras.training.step import added, checked_gradients, halts, learning_rate_at, piece_loss


def is_compiled(strategy, train_config):
    """Whether the steps are XLA-compiled: always under TPUStrategy, else with --xla."""
    return isinstance(strategy, tf.distribute.TPUStrategy) or bool(train_config.xla)


def concurrent_parts(train_config, per_replica, compiled):
    """How many parts of each chunk of a replica's batch run side by side.

    The parts' forward and backward passes are independent branches of the step's graph,
    which TensorFlow's executor runs on its inter-op threads at once: on a CPU, one part's
    small and memory-bound operations fill the cores while the other's wait. Under XLA,
    and on GPUs, one part per chunk. `train_config.concurrent_parts` 0 chooses: 2 on CPUs when the
    steps are not compiled, TensorFlow has more than one inter-op thread (as configured, else
    `TF_NUM_INTEROP_THREADS`, else one per core) and each chunk's rows divide in two, else 1."""
    chunks = train_config.batch_chunk
    check_batch_chunk(chunks, per_replica)
    parts = train_config.concurrent_parts
    if parts == 0:
        on_cpu = not compiled and not tf.config.list_logical_devices("GPU")
        threads = tf.config.threading.get_inter_op_parallelism_threads() or _environment_threads()  # 0: per core
        side_by_side = threads > 1 or (threads == 0 and (os.cpu_count() or 1) > 1)
        return 2 if on_cpu and side_by_side and (per_replica // chunks) % 2 == 0 else 1
    if (per_replica // chunks) % parts:
        raise ValueError(f"`concurrent_parts`={parts} must divide each chunk of {per_replica // chunks} streams "
                         f"(batch_chunk={chunks}, {per_replica} streams per replica).")
    return parts


def _environment_threads():
    """TensorFlow's inter-op thread count from `TF_NUM_INTEROP_THREADS` (0 where unset or not
    a count, as TensorFlow reads it)."""
    value = os.environ.get("TF_NUM_INTEROP_THREADS", "")
    return int(value) if value.isdigit() else 0



class Trainer(TrainingLoop):
    """Train and evaluate a `TransformerXLLM` under a `tf.distribute` strategy.

    Args:
        strategy: any `tf.distribute.Strategy` (default, Mirrored, MultiWorkerMirrored, TPU).
        model_config: `TransformerXLConfig`.
        train_config: `TrainConfig`.
        num_hosts: input pipelines (workers / TPU hosts); the records must match.
        is_chief: whether this worker writes logs and summaries.
        log: a print-like function.
        compiled: whether every step is XLA-compiled (default: under TPUStrategy, or with
            `train_config.xla`); it selects the static-shape paths (the adaptive
            softmax's dense tail).
    """

    def __init__(self, strategy, model_config, train_config, num_hosts=1, is_chief=True, log=print,
                 compiled=None):
        super().__init__(model_config, train_config, strategy.num_replicas_in_sync, num_hosts, is_chief, log)
        self.strategy = strategy
        self.compiled = is_compiled(strategy, train_config) if compiled is None else bool(compiled)
        self.parts = concurrent_parts(train_config, self.per_replica, self.compiled)
        self.piece = self.per_replica // (train_config.batch_chunk * self.parts)
        if train_config.deterministic:
            tf.config.experimental.enable_op_determinism()
        keras.utils.set_random_seed(train_config.seed)
        # Only float16 scales the loss (dynamically); a loss scale restored from another
        # run is not used otherwise.
        self.scales_loss = train_config.precision == "mixed_float16"
        with strategy.scope():
            self.model = TransformerXLLM(
                model_config, tail_mode="dense" if self.compiled else "auto",
                dtype=train_config.precision, name="transformer_xl_lm",
            )
            # Each replica's training memory, carried across steps and saved in checkpoints.
            self.memory = MemoryCache(model_config.mem_len, model_config.n_layer, model_config.d_model,
                                      ext_len=model_config.ext_len, stateful=True, batch_size=self.per_replica,
                                      zero_init=model_config.mem_init == "zeros", dtype=train_config.precision)
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
            self.loss_scale = tf.Variable(2.0**15 if self.scales_loss else 1.0,
                                          trainable=False, name="loss_scale")
            self.good_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="good_steps")
        self.seed_states = [v for v in self.model.variables if "seed_generator_state" in v.path]
        self._optimizer = None  # created when training or restoring: evaluation needs no moments
        self._train_fn = None
        self._iterator = None  # [step it is positioned at, distributed iterator]
        self._evaluations = {}  # (evaluation settings, tgt_len) -> Evaluation
        self._forward_backward = tf.function(self._forward_backward_impl, jit_compile=True, autograph=False) \
            if train_config.xla else self._forward_backward_impl

    @property
    def current_step(self):
        return int(self.step.numpy())

    @property
    def optimizer(self):
        """Adam over the model's trainable variables (two moments per weight), made on
        first use, outside any tf.function."""
        if self._optimizer is None:
            with self.strategy.scope():
                self._optimizer = Adam(self.model.trainable_variables)
        return self._optimizer

    def _local(self, values):
        """The values of this worker's replicas, in replica order."""
        return self.strategy.experimental_local_results(values)

    # -- training ------------------------------------------------------------------------

    def _forward_backward_impl(self, inputs, targets, mems, valid, scale, global_tokens):
        with tf.GradientTape() as tape:
            out = self.model(inputs, targets=targets, mems=mems, memory_valid=valid, training=True)
            loss, nll_sum = piece_loss(out["nll"], global_tokens)
            loss = loss * scale
        grads = tape.gradient(loss, self.model.trainable_variables)
        grads = [tf.convert_to_tensor(g) for g in grads]
        return nll_sum, grads, out["mems"], out["memory_valid"]

    def _replica_step(self, inputs, targets):
        context = tf.distribute.get_replica_context()
        global_tokens = tf.cast(tf.size(targets) * self.replicas, tf.float32)
        mems, valid = self.memory.read()
        loss_scale = self.loss_scale if self.scales_loss else tf.constant(1.0)
        grads, nll_total, new_mems_parts, new_valid = None, 0.0, [], valid
        for k in range(self.tc.batch_chunk):
            # A chunk starts once the chunks before it have their gradients, so that one
            # chunk's activations are live at a time; the parts of a chunk run side by side.
            with tf.control_dependencies(grads or []):
                chunk_inputs, chunk_targets = tf.identity(inputs), tf.identity(targets)
                chunk_mems = [tf.identity(m) for m in mems]
            for p in range(self.parts):
                start = (k * self.parts + p) * self.piece
                rows = slice(start, start + self.piece)
                nll_sum, part_grads, part_new, new_valid = self._forward_backward(
                    chunk_inputs[rows], chunk_targets[rows], [m[rows] for m in chunk_mems], valid, loss_scale,
                    global_tokens)
                nll_total += nll_sum
                grads = added(grads, part_grads)
                new_mems_parts.append(part_new)
        new_mems = [tf.concat([p[i] for p in new_mems_parts], 0) for i in range(self.config.n_layer)]
        grads = context.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        nll_total = context.all_reduce(tf.distribute.ReduceOp.SUM, nll_total)
        grads, gnorm, forward_ok, finite = checked_gradients(
            grads, nll_total, self.tc.clip, loss_scale if self.scales_loss else None)
        # A forward pass that overflowed must not leave inf/NaN in the memory: only a
        # finite one writes it (a branch, where selecting between the new and the old
        # memory copied every layer's memory every step).
        tf.cond(forward_ok, lambda: self.memory.write(new_mems, new_valid), lambda: None)
        return grads, nll_total / global_tokens, gnorm, finite

    def _train_step(self, iterator, loss_sum, gnorm_sum, done, bad):
        """One step on the next batch, applied if finite; a non-finite step that is neither
        skipped nor rescaled sets `bad` and is not counted (the run resumes before it)."""
        tc = self.tc
        inputs, targets = next(iterator)
        grads, loss, gnorm, finite = self.strategy.run(self._replica_step, args=(inputs, targets))
        loss, gnorm, finite = self._local(loss)[0], self._local(gnorm)[0], self._local(finite)[0]
        lr = learning_rate_at(self.step, tc)

        def apply():
            self.optimizer.apply(grads, lr)
            good = self.good_steps.assign_add(1)
            if self.scales_loss:  # float16: double the loss scale after 2000 good steps
                tf.cond(good % 2000 == 0, lambda: self.loss_scale.assign(self.loss_scale * 2.0),
                        lambda: self.loss_scale.read_value())
            return loss_sum + loss, gnorm_sum + gnorm, done + 1, bad

        def reject():
            if self.scales_loss:  # float16: halve the loss scale and go on
                self.loss_scale.assign(tf.maximum(self.loss_scale / 2.0, 1.0))
                self.good_steps.assign(0)
            return loss_sum, gnorm_sum, done, halts(finite, tc, rescales=self.scales_loss)

        loss_sum, gnorm_sum, done, bad = tf.cond(finite, apply, reject)
        self.step.assign_add(tf.cast(tf.logical_not(bad), tf.int64))
        return loss_sum, gnorm_sum, done, bad

    def _build_train_fn(self):
        """`train_steps(iterator, num_steps)`: up to `num_steps` steps in one graph, ending
        early at a bad step. Traced without AutoGraph (the loop is written out): a process's
        first trace no longer pays for converting the model's code."""

        @tf.function(autograph=False)
        def train_steps(iterator, num_steps):
            def body(i, *sums):
                return (i + 1,) + self._train_step(iterator, *sums)

            _, loss_sum, gnorm_sum, done, bad = tf.while_loop(
                lambda i, *sums: (i < num_steps) & tf.logical_not(sums[-1]), body,
                (tf.constant(0, tf.int64), tf.constant(0.0), tf.constant(0.0), tf.constant(0, tf.int64),
                 tf.constant(False)))
            return loss_sum, gnorm_sum, done, bad

        return train_steps

    def _train_iterator(self, info):
        start = int(self.step.numpy())
        fn = distributed_dataset_fn(info, self.cores, repeat=True, vocab_size=self.config.n_token,
                                    skip=start)
        return iter(self.strategy.distribute_datasets_from_function(fn))

    def _steps_runner(self, info, step):
        """`run(count)` for the loop: up to `count` steps in one call of the compiled steps."""
        if self._iterator is None or self._iterator[0] != step:
            # A new iterator (and a new trace) only when the data position moved otherwise.
            self._iterator = [step, self._train_iterator(info)]
        if self._train_fn is None:
            self.optimizer  # its variables exist before the step is traced
            self._train_fn = self._build_train_fn()

        def run(count):
            losses, gnorms, finished, bad = self._train_fn(self._iterator[1], tf.constant(count, tf.int64))
            step = self.current_step
            self._iterator[0] = step
            if bool(bad):
                self._iterator = None  # it is one batch ahead of the step now
            return float(losses), float(gnorms), int(finished), bool(bad), step

        return run

    # -- checkpoints -----------------------------------------------------------------------

    def _memory_variables(self):
        return self.memory.memory_variables + [self.memory.valid_variable]

    def _state(self):
        names = self._state_names(len(self.optimizer.state), len(self.seed_states))
        values = [np.array(int(self.step.numpy())), np.array(float(self.loss_scale.numpy())),
                  np.array(int(self.good_steps.numpy()))]
        values += [v.numpy() for v in self.optimizer.state]
        values += [np.asarray(keras.ops.convert_to_numpy(v.value)) for v in self.seed_states]
        state = dict(zip(names, values))
        for i, v in enumerate(self._memory_variables()):
            for r, value in enumerate(self._local(v.value)):
                state[f"memory_{i}_replica_{r}"] = value.numpy()
        return state

    def _state_shapes(self):
        names = self._state_names(len(self.optimizer.state), len(self.seed_states))
        shapes = [(), (), ()] + [tuple(v.shape) for v in self.optimizer.state + self.seed_states]
        return {**dict(zip(names, shapes)), **self._memory_shapes()}

    def worker_dir(self):
        """The folder this worker writes: the run folder (the chief), else `worker-N` in it."""
        if self.is_chief:
            return self.tc.model_dir
        worker = self.strategy.cluster_resolver.task_id
        return files.join(self.tc.model_dir, f"worker-{worker}")

    def _assign_state(self, state):
        self.step.assign(int(state["step"]))
        self.loss_scale.assign(float(state["loss_scale"]))
        self.good_steps.assign(int(state["good_steps"]))
        for i, v in enumerate(self.optimizer.state):
            v.assign(state[f"optimizer_{i}"])
        for i, v in enumerate(self.seed_states):
            v.assign(state[f"seed_{i}"])
        for i, v in enumerate(self._memory_variables()):
            values = [state[f"memory_{i}_replica_{r}"] for r in range(self.replicas)]
            per_replica = self.strategy.experimental_distribute_values_from_function(
                lambda ctx, values=values: tf.constant(values[ctx.replica_id_in_sync_group]))
            self.strategy.run(lambda x, v=v: v.assign(x), args=(per_replica,))

    # -- evaluation ------------------------------------------------------------------------

    def evaluation(self, settings, tgt_len):
        """The `Evaluation` of these memory settings and segment length, built once."""
        key = (settings.to_json(), tgt_len)
        if key not in self._evaluations:
            self._evaluations[key] = Evaluation(self.model, self.strategy, settings, tgt_len,
                                                self.tc.eval_batch_size // self.cores, self.compiled,
                                                xla=self.tc.eval_xla or self.compiled)
        return self._evaluations[key]

    def _eval_pass(self, info, settings, tgt_len, batches, report):
        """The summed NLL and count of the targets of the pass's first `batches` batches."""
        evaluation = self.evaluation(settings, tgt_len)
        evaluation.start_pass()
        fn = distributed_dataset_fn(info, self.cores, repeat=False, vocab_size=settings.n_token)
        dataset = self.strategy.distribute_datasets_from_function(fn)
        total, count = 0.0, 0
        for i, (inputs, targets) in enumerate(dataset):
            if i >= batches:
                break
            nll, n = evaluation.step(inputs, targets, i, i + 1 == batches)
            total, count = total + float(nll), count + int(n)
            if count:  # (a held segment is scored with its group)
                report(i + 1, total / count)
        return total, count
