"""The strategy-agnostic training and evaluation loop shared by train_gpu.py and train_tpu.py.

One replica step reads that replica's memory, runs forward and backward (optionally
XLA-compiled; in `batch_chunk` chunks one after another, each in `concurrent_parts` parts
side by side), stores the new memory, and returns
gradients summed over replicas and clipped by their global norm. A `tf.function` runs
`iterations` such steps per call (the TPU host-loop pattern). The memory lives in
per-replica variables, so it persists across steps and host-loop calls, and it is saved
in checkpoints with everything else needed to resume bit for bit.
"""

import contextlib
import dataclasses
import json
import math
import os
import sys
import time

import keras
import numpy as np
import tensorflow as tf

from tf_records import distributed_dataset_fn, load_record_info, verify_records
from txl_io import files
from tf_records.build import VOCAB_FILE
from txl_keras import run_folder
from txl_keras.layers.memory_cache import MemoryCache
from txl_keras.models.flops import model_flops_per_token
from txl_keras.models.transformer_xl_lm import TransformerXLLM
from txl_keras.training.evaluation import Evaluation
from txl_keras.training.interrupts import Interrupted, StopRequest
from txl_keras.training.optimizer import Adam
from txl_keras.schedules import learning_rate

LN2 = math.log(2.0)
CALL_SECONDS = 2.0  # a compiled call of steps runs about this long: a stop request waits no longer
PROGRESS_SECONDS = 60.0  # a long stretch between log lines still prints a line this often


class NonFiniteLossError(RuntimeError):
    pass


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
    if per_replica % chunks:
        raise ValueError(f"`batch_chunk`={chunks} must divide each replica's batch of {per_replica} streams.")
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


def _progress(total, title, log):
    """A progress bar on a terminal, a line every 10% otherwise (logs stay readable)."""
    if log is None:
        return lambda done, loss: None
    if sys.stdout.isatty():
        bar = keras.utils.Progbar(total, stateful_metrics=["loss"])
        return lambda done, loss: bar.update(done, [("loss", loss)])
    marks = {max(1, round(total * k / 10)) for k in range(1, 11)}
    return lambda done, loss: log(f"{title}: {done}/{total} batches, loss {loss:.4f}") if done in marks else None


def _summary(name, value, plugin="scalars"):
    """A TensorBoard scalar (or text), written without needing the tensorboard package."""
    from tensorflow.core.framework import summary_pb2

    metadata = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=plugin))
    tensor = tf.constant(value, tf.string if plugin == "text" else tf.float32)
    tf.summary.write(name, tensor, metadata=metadata)


@contextlib.contextmanager
def _naming_damaged_records(info):
    """A read error deep inside the input pipeline becomes an error naming the damaged file."""
    try:
        yield
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError):
        verify_records(info)  # raises a ValueError that names the file, if one is damaged
        raise


def records_level(records_dir):
    """The token level ("byte", "char" or "word") of the records' vocabulary, or None."""
    path = files.join(records_dir, VOCAB_FILE)
    try:
        return json.loads(files.read_text(path)).get("level") if files.exists(path) else None
    except (ValueError, AttributeError):
        return None


class Trainer:
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
        self.strategy = strategy
        self.config = model_config
        self.tc = train_config
        self.num_hosts = num_hosts
        self.is_chief = is_chief
        self.log = log if is_chief else (lambda *a, **k: None)
        if train_config.model_dir is None or train_config.records_dir is None:
            raise ValueError("TrainConfig needs `model_dir` (the run folder) and `records_dir` (the records).")
        self.compiled = is_compiled(strategy, train_config) if compiled is None else bool(compiled)
        self.replicas = strategy.num_replicas_in_sync
        self.cores = self.replicas // num_hosts
        for name in ("train_batch_size", "eval_batch_size"):
            if getattr(train_config, name) % self.cores:
                raise ValueError(
                    f"{name}={getattr(train_config, name)} (per host) is not divisible by the "
                    f"{self.cores} replicas of each host."
                )
        self.per_replica = train_config.train_batch_size // self.cores
        self.word_level = records_level(train_config.records_dir) == "word"  # perplexity, not bits per character
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
        self.flops_per_token = model_flops_per_token(model_config)
        self._train_fn = None
        self._steps_per_call = 1  # grows to about CALL_SECONDS of steps once one call is timed
        self._iterator = None  # [step it is positioned at, distributed iterator]
        self._started = False
        self._evaluations = {}  # (evaluation settings, tgt_len) -> Evaluation
        self._writers = {}  # TensorBoard run name -> summary writer (chief only)
        self.last_eval = None  # (step, results) of the latest evaluation
        self.damaged = set()  # checkpoints found damaged when resuming
        self._forward_backward = tf.function(self._forward_backward_impl, jit_compile=True, autograph=False) \
            if train_config.xla else self._forward_backward_impl

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

    def write_summaries(self, run, step, scalars=None, texts=None):
        """TensorBoard scalars (and texts) at `step` in `model_dir/<run>` (the chief's)."""
        if not self.is_chief:
            return
        folder = files.join(self.tc.model_dir, run)
        with files.reporting(folder):
            if run not in self._writers:
                self._writers[run] = tf.summary.create_file_writer(folder)
            with self._writers[run].as_default(step=step):
                for name, value in (scalars or {}).items():
                    _summary(name, value)
                for name, value in (texts or {}).items():
                    _summary(name, value, plugin="text")
            self._writers[run].flush()

    # -- training ------------------------------------------------------------------------

    def _forward_backward_impl(self, inputs, targets, mems, valid, scale, global_tokens):
        with tf.GradientTape() as tape:
            out = self.model(inputs, targets=targets, mems=mems, memory_valid=valid, training=True)
            nll_sum = tf.reduce_sum(out["nll"])
            loss = nll_sum / global_tokens * scale
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
                grads = part_grads if grads is None else [a + b for a, b in zip(grads, part_grads)]
                new_mems_parts.append(part_new)
        new_mems = [tf.concat([p[i] for p in new_mems_parts], 0) for i in range(self.config.n_layer)]
        grads = context.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        nll_total = context.all_reduce(tf.distribute.ReduceOp.SUM, nll_total)
        # A forward pass that overflowed must not leave inf/NaN in the memory: only a
        # finite one writes it (a branch, where selecting between the new and the old
        # memory copied every layer's memory every step).
        forward_ok = tf.math.is_finite(nll_total)
        tf.cond(forward_ok, lambda: self.memory.write(new_mems, new_valid), lambda: None)
        # Unscaling (float16's loss scale) and clipping to the global norm are one
        # multiplication of each gradient, and none where neither applies.
        gnorm = tf.linalg.global_norm(grads)
        factor = None
        if self.scales_loss:
            gnorm = gnorm / loss_scale
            factor = 1.0 / loss_scale
        finite = tf.math.is_finite(gnorm) & forward_ok
        if self.tc.clip > 0:
            clip = self.tc.clip / tf.maximum(gnorm, self.tc.clip)
            factor = clip if factor is None else factor * clip
        if factor is not None:
            grads = [g * factor for g in grads]
        return grads, nll_total / global_tokens, gnorm, finite

    def _train_step(self, iterator, loss_sum, gnorm_sum, done, bad):
        """One step on the next batch, applied if finite; a non-finite step that is neither
        skipped nor rescaled sets `bad` and is not counted (the run resumes before it)."""
        tc = self.tc
        inputs, targets = next(iterator)
        grads, loss, gnorm, finite = self.strategy.run(self._replica_step, args=(inputs, targets))
        loss, gnorm, finite = self._local(loss)[0], self._local(gnorm)[0], self._local(finite)[0]
        lr = learning_rate(self.step, tc.learning_rate, tc.train_steps, tc.warmup_steps,
                           tc.min_lr_ratio, tc.lr_schedule)

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
            return loss_sum, gnorm_sum, done, tf.constant(not (self.scales_loss or tc.skip_nonfinite))

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

    def train_records(self):
        """The record info of the training split, checked against this run's layout."""
        return load_record_info(self.tc.records_dir, "train", self.tc.train_batch_size, self.config.tgt_len,
                                self.num_hosts)

    def train(self):
        tc = self.tc
        info = self.train_records()
        if not self._started:
            self.restore_or_warm_start()
        step = int(self.step.numpy())
        if tc.eval_steps and step and step % tc.eval_steps == 0 and \
                run_folder.evaluated_step(tc.model_dir) != step:
            self.log(f"evaluating step {step}, which was saved but not evaluated (an interrupted evaluation)")
            self.evaluate_and_keep_best(step)  # owed: the saved step's evaluation never finished
        if step >= tc.train_steps:  # a finished run, started again
            self.log(f"nothing to train: the run is at step {step} (--train_steps={tc.train_steps})")
            return step
        if self._iterator is None or self._iterator[0] != step:
            # A new iterator (and a new trace) only when the data position moved otherwise.
            self._iterator = [step, self._train_iterator(info)]
        iterator = self._iterator[1]
        if self._train_fn is None:
            self.optimizer  # its variables exist before the step is traced
            self._train_fn = self._build_train_fn()
        tokens_per_step = tc.train_batch_size * self.num_hosts * self.config.tgt_len
        stop = StopRequest(self.log)
        # Installed before the line that says training started, which comes just before the
        # first call of steps: a signal from then on (during the first trace too) stops the
        # run at the next step boundary with a checkpoint.
        with stop.installed(enabled=self.num_hosts == 1):
            self.write_summaries("train", step, texts={
                "config": "    " + self.config.to_json().replace("\n", "\n    "),
                "train_config": "    " + json.dumps(dataclasses.asdict(tc), indent=2).replace("\n", "\n    ")})
            self.log(f"training from step {step} to {tc.train_steps}: {self.replicas} replicas, "
                     f"{self.per_replica} streams x {self.config.tgt_len} tokens each per step")
            while step < tc.train_steps:
                boundary = min(tc.train_steps, (step // tc.iterations + 1) * tc.iterations)
                for every in (tc.save_steps, tc.eval_steps):
                    if every:
                        boundary = min(boundary, (step // every + 1) * every)
                first = step
                start = time.time()
                loss_sum, gnorm_sum, done, bad, step = self._run_steps(iterator, info, step, boundary, stop)
                elapsed = time.time() - start
                if bad:
                    self._iterator = None  # it is one batch ahead of the step now
                    raise NonFiniteLossError(
                        f"Non-finite loss or gradient at step {step + 1}; training stopped. The last good "
                        f"checkpoint is kept in {tc.model_dir}. Lower the learning rate, or pass "
                        "--skip_nonfinite to skip such steps."
                    )
                if step > first:
                    self._log_steps(step, loss_sum, gnorm_sum, done, tokens_per_step * (step - first) / max(elapsed, 1e-9))
                if stop.signum is not None:
                    path = self.save()
                    raise Interrupted(f"{stop.name}: stopped at step {step}, saved {path}; the same command "
                                      "resumes from there", stop.signum)
                if step >= tc.train_steps or (tc.save_steps and step % tc.save_steps == 0):  # always at the end
                    self.save()
                if tc.eval_steps and step % tc.eval_steps == 0:
                    self.evaluate_and_keep_best(step)
        return step

    def _run_steps(self, iterator, info, step, boundary, stop):
        """Steps up to `boundary` in calls of about `CALL_SECONDS` each (the first call of one
        step, while it is traced), so that a stop request is seen within seconds and a
        progress line comes at least every `PROGRESS_SECONDS`. Returns the sums over the
        steps, whether one was non-finite, and the new step."""
        loss_sum = gnorm_sum = 0.0
        done, last_line = 0, time.time()
        while step < boundary and stop.signum is None:
            count = min(boundary - step, self._steps_per_call)
            start = time.time()
            with _naming_damaged_records(info):
                losses, gnorms, finished, bad = self._train_fn(iterator, tf.constant(count, tf.int64))
            loss_sum, gnorm_sum, done = loss_sum + float(losses), gnorm_sum + float(gnorms), done + int(finished)
            step = int(self.step.numpy())
            self._iterator[0] = step
            if bool(bad):
                return loss_sum, gnorm_sum, done, True, step
            per_step = (time.time() - start) / count
            self._steps_per_call = max(1, int(CALL_SECONDS / max(per_step, 1e-6)))
            if time.time() - last_line >= PROGRESS_SECONDS and step < boundary:
                last_line = time.time()
                self.log(f"step {step:>7d} | {per_step:.3f} s per step, next log line at step {boundary}")
        return loss_sum, gnorm_sum, done, False, step

    def _log_steps(self, step, loss_sum, gnorm_sum, done, tokens_per_s):
        """The log line and summaries of the steps since the last one."""
        tc = self.tc
        done = max(done, 1)
        loss, gnorm = loss_sum / done, gnorm_sum / done
        lr = float(learning_rate(step, tc.learning_rate, tc.train_steps, tc.warmup_steps,
                                 tc.min_lr_ratio, tc.lr_schedule))
        bpc = "" if self.word_level else f"bpc {loss / LN2:.4f} | "
        self.log(f"step {step:>7d} | lr {lr:.3e} | loss {loss:.4f} | ppl {math.exp(min(loss, 50)):9.3f} | "
                 f"{bpc}gnorm {gnorm:.3f} | tok/s {tokens_per_s:,.0f} | "
                 f"model GFLOP/s {tokens_per_s * self.flops_per_token / 1e9:,.1f}")
        self.write_summaries("train", step, {
            "loss": loss, "lr": lr, "gnorm": gnorm, "bpc": loss / LN2, "tokens_per_s": tokens_per_s,
            "model_flops_per_s": tokens_per_s * self.flops_per_token})

    def evaluate_and_keep_best(self, step):
        """Evaluate now (summaries at `step`); keep the weights if the loss is the best so far."""
        result = self.evaluate(progress=False)
        best = run_folder.read_best(self.tc.model_dir)
        if best is None or result["loss"] < best["loss"]:
            if self.is_chief:
                path = run_folder.save_best(self.tc.model_dir, self.model, step, result)
                self.log(f"best validation loss so far ({result['loss']:.4f}): saved {path}")
        if self.is_chief:
            run_folder.record_evaluated(self.tc.model_dir, step)
        return result

    # -- checkpoints -----------------------------------------------------------------------

    def _state(self):
        state = {"step": np.array(int(self.step.numpy())),
                 "loss_scale": np.array(float(self.loss_scale.numpy())),
                 "good_steps": np.array(int(self.good_steps.numpy()))}
        for i, v in enumerate(self.optimizer.state):
            state[f"optimizer_{i}"] = v.numpy()
        for i, v in enumerate(self.seed_states):
            state[f"seed_{i}"] = np.asarray(keras.ops.convert_to_numpy(v.value))
        for i, v in enumerate(self.memory.memory_variables + [self.memory.valid_variable]):
            for r, value in enumerate(self._local(v.value)):
                state[f"memory_{i}_replica_{r}"] = value.numpy()
        return state

    def worker_dir(self):
        """The folder this worker writes: the run folder (the chief), else `worker-N` in it."""
        if self.is_chief:
            return self.tc.model_dir
        worker = self.strategy.cluster_resolver.task_id
        return files.join(self.tc.model_dir, f"worker-{worker}")

    def save(self):
        step = int(self.step.numpy())
        damaged = files.join(self.worker_dir(), run_folder.checkpoint_name(step))
        if damaged in self.damaged and files.exists(damaged):
            self.log(f"moved the damaged {damaged} to {run_folder.set_aside(damaged)}")
        path = run_folder.save_checkpoint(self.worker_dir(), int(self.step.numpy()), self.model,
                                           self._state(), self.tc.keep_checkpoint_max)
        self.log(f"saved {path}")
        return path

    def restore(self, path):
        """Restore weights, optimizer, step, randomness and every replica's memory."""
        self._started = True
        state = run_folder.load_state(path)
        self._check_state(state, path)
        run_folder.load_weights(self.model, path)
        self.step.assign(int(state["step"]))
        self.loss_scale.assign(float(state["loss_scale"]))
        self.good_steps.assign(int(state["good_steps"]))
        for i, v in enumerate(self.optimizer.state):
            v.assign(state[f"optimizer_{i}"])
        for i, v in enumerate(self.seed_states):
            v.assign(state[f"seed_{i}"])
        memory_vars = self.memory.memory_variables + [self.memory.valid_variable]
        for i, v in enumerate(memory_vars):
            values = [state[f"memory_{i}_replica_{r}"] for r in range(self.replicas)]
            per_replica = self.strategy.experimental_distribute_values_from_function(
                lambda ctx, values=values: tf.constant(values[ctx.replica_id_in_sync_group]))
            self.strategy.run(lambda x, v=v: v.assign(x), args=(per_replica,))

    def _check_state(self, state, path):
        """A RunFolderError naming `path` unless its state fits this run's variables."""
        saved_replicas = sum(1 for k in state if k.startswith("memory_0_replica_"))
        if saved_replicas != self.replicas:
            raise ValueError(
                f"The checkpoint {path} holds the memory of {saved_replicas} replicas but this run "
                f"has {self.replicas}; resume with the same replica layout, or use "
                "--warm_start_path to start from its weights only."
            )
        expected = {"step": (), "loss_scale": (), "good_steps": ()}
        expected.update({f"optimizer_{i}": tuple(v.shape) for i, v in enumerate(self.optimizer.state)})
        expected.update({f"seed_{i}": tuple(v.shape) for i, v in enumerate(self.seed_states)})
        memory_vars = self.memory.memory_variables + [self.memory.valid_variable]
        expected.update({f"memory_{i}_replica_{r}": tuple(v.shape) for i, v in enumerate(memory_vars)
                         for r in range(self.replicas)})
        for name, shape in expected.items():
            if name not in state or tuple(state[name].shape) != shape:
                found = "missing" if name not in state else f"of shape {tuple(state[name].shape)}"
                raise run_folder.RunFolderError(
                    f"{path} holds the training state of another model or run ({name} is {found}, this run's "
                    f"has shape {shape})")
        extra = sorted(set(state) - set(expected))
        if extra:
            raise run_folder.RunFolderError(f"{path} holds the training state of another model or run "
                                            f"({extra[0]} has no place in this one)")

    def load_weights(self, path):
        """Only the model weights of a checkpoint folder or a .weights.h5 (evaluation, or
        a converted model whose checkpoint has no training state)."""
        run_folder.load_weights(self.model, path)

    def restore_or_warm_start(self):
        """Resume from the newest complete checkpoint of this worker, else warm-start if
        asked. A damaged checkpoint (truncated weights, empty state, another model's
        state) is reported by name and left in place; the one before it is used. A
        checkpoint that another process rotates away while it is read is looked up again.
        Returns whether weights were loaded."""
        self._started = True
        for _ in range(run_folder.READ_TRIES):
            found = run_folder.list_checkpoints(self.worker_dir())
            resumed = self._resume_from(found)
            if resumed is not None:
                return resumed
        raise run_folder.RunFolderError(f"The checkpoints of {self.worker_dir()} kept disappearing while they were "
                                        "read; is another process rotating them?")

    def _resume_from(self, found):
        """True once one of `found` is restored; None if one vanished (look again)."""
        for step, path in reversed(found):
            try:
                self.restore(path)
            except run_folder.RunFolderError as e:
                if not files.exists(path):
                    return None
                self.damaged.add(path)
                run_folder.warn(f"the checkpoint {path} is damaged ({e}); it is left in place and the "
                                "checkpoint before it is used.")
                continue
            self.log(f"resumed from {path} (step {step})")
            return True
        if found:
            raise run_folder.RunFolderError(
                f"Every checkpoint in {self.worker_dir()} is damaged (see the warnings above); move them "
                "away to start afresh.")
        if self.tc.warm_start_path:
            self.load_weights(self.tc.warm_start_path)
            self.log(f"warm start from {self.tc.warm_start_path}")
            return True
        return False

    # -- evaluation ------------------------------------------------------------------------

    def eval_settings(self):
        """The model config with the evaluation memory settings, and the eval tgt_len."""
        tc = self.tc
        settings = self.config.with_memory(tc.eval_mem_len, tc.eval_clamp_len, tc.eval_same_length)
        return settings, tc.eval_tgt_len or self.config.tgt_len

    def evaluation(self, settings, tgt_len):
        """The `Evaluation` of these memory settings and segment length, built once."""
        key = (settings.to_json(), tgt_len)
        if key not in self._evaluations:
            self._evaluations[key] = Evaluation(self.model, self.strategy, settings, tgt_len,
                                                self.tc.eval_batch_size // self.cores, self.compiled,
                                                xla=self.tc.eval_xla or self.compiled)
        return self._evaluations[key]

    def evaluate(self, split=None, progress=True, summaries=True):
        """Score every target of a split exactly once with the evaluation settings.

        Returns `{"loss", "ppl", "bpc", "tokens", "expected_tokens", "split"}`; `tokens`
        equals the split's `num_targets` unless `max_eval_batch` cut the pass short. With
        `summaries` they are written to TensorBoard's `eval` run at the current step.
        """
        tc = self.tc
        split = split or tc.eval_split
        settings, tgt_len = self.eval_settings()
        info = load_record_info(tc.records_dir, split, tc.eval_batch_size, tgt_len, self.num_hosts)
        evaluation = self.evaluation(settings, tgt_len)
        evaluation.start_pass()

        fn = distributed_dataset_fn(info, self.cores, repeat=False, vocab_size=settings.n_token)
        dataset = self.strategy.distribute_datasets_from_function(fn)
        batches = info["num_batch"] if tc.max_eval_batch <= 0 else min(tc.max_eval_batch, info["num_batch"])
        report = _progress(batches, f"eval {split}", self.log if progress else None)
        total, count = 0.0, 0
        with _naming_damaged_records(info):
            for i, (inputs, targets) in enumerate(dataset):
                if i >= batches:
                    break
                nll, n = evaluation.step(inputs, targets, i, i + 1 == batches)
                total, count = total + float(nll), count + int(n)
                if count:  # (a held segment is scored with its group)
                    report(i + 1, total / count)
        loss = total / max(count, 1)
        result = {"loss": loss, "ppl": math.exp(min(loss, 50)), "bpc": loss / LN2, "tokens": count,
                  "expected_tokens": info["num_targets"], "split": split}
        partial = f" (partial: max_eval_batch={tc.max_eval_batch})" if batches < info["num_batch"] else ""
        bpc = "" if self.word_level else f"bpc {result['bpc']:.4f} | "
        self.log(f"eval {split}: loss {loss:.4f} | ppl {result['ppl']:.3f} | {bpc}"
                 f"tokens {count} of {info['num_targets']}{partial}")
        step = int(self.step.numpy())
        self.last_eval = (step, result)
        if summaries:
            self.write_summaries("eval", step, {name: result[name] for name in ("loss", "ppl", "bpc", "tokens")})
        return result
