"""`TrainingLoop`: what the TensorFlow and the JAX trainers share.

The loop itself (steps up to each log, save and evaluation boundary, stop requests,
non-finite steps), the log lines and TensorBoard summaries, the checkpoints (one format on
both backends: the weights, and a state of named arrays: step, optimizer, randomness and
each replica's memory), resuming, warm starts, the best checkpoint and the evaluation pass's
bookkeeping. A backend supplies the model, the compiled steps and the state's arrays
(`trainer.Trainer` under `tf.distribute`, `jax_trainer.JaxTrainer` under `keras.distribution`).
"""

import contextlib
import dataclasses
import json
import math
import sys
import time

import keras
import tensorflow as tf

from tf_records import load_record_info, verify_records
from tf_records.build import VOCAB_FILE
from txl_io import files
from txl_keras import run_folder
from txl_keras.models.flops import model_flops_per_token
from txl_keras.training.interrupts import Interrupted, StopRequest
from txl_keras.training.step import learning_rate_at

LN2 = math.log(2.0)
CALL_SECONDS = 2.0  # a compiled call of steps runs about this long: a stop request waits no longer
PROGRESS_SECONDS = 60.0  # a long stretch between log lines still prints a line this often


class NonFiniteLossError(RuntimeError):
    pass


def check_batch_chunk(chunks, per_replica):
    """A ValueError unless `batch_chunk` divides each replica's batch."""
    if per_replica % chunks:
        raise ValueError(f"`batch_chunk`={chunks} must divide each replica's batch of {per_replica} streams.")


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
def naming_damaged_records(info):
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


class TrainingLoop:
    """Train and evaluate a `TransformerXLLM` over `replicas` data-parallel replicas.

    A backend subclass builds `self.model` and provides: `current_step`, `_steps_runner`,
    `_state`, `_state_shapes`, `_assign_state`, `_eval_pass` and `worker_dir`.

    Args:
        model_config: `TransformerXLConfig`.
        train_config: `TrainConfig`.
        replicas: data-parallel replicas over all hosts (each keeps its own memory).
        num_hosts: input pipelines (workers, TPU hosts or JAX processes); the records must match.
        is_chief: whether this process writes logs and summaries.
        log: a print-like function.
    """

    def __init__(self, model_config, train_config, replicas, num_hosts=1, is_chief=True, log=print):
        self.config = model_config
        self.tc = train_config
        self.num_hosts = num_hosts
        self.is_chief = is_chief
        self.log = log if is_chief else (lambda *a, **k: None)
        if train_config.model_dir is None or train_config.records_dir is None:
            raise ValueError("TrainConfig needs `model_dir` (the run folder) and `records_dir` (the records).")
        self.replicas = replicas
        self.cores = replicas // num_hosts
        for name in ("train_batch_size", "eval_batch_size"):
            if getattr(train_config, name) % self.cores:
                raise ValueError(
                    f"{name}={getattr(train_config, name)} (per host) is not divisible by the "
                    f"{self.cores} replicas of each host."
                )
        self.per_replica = train_config.train_batch_size // self.cores
        check_batch_chunk(train_config.batch_chunk, self.per_replica)
        self.word_level = records_level(train_config.records_dir) == "word"  # perplexity, not bits per character
        self.flops_per_token = model_flops_per_token(model_config)
        self._steps_per_call = 1  # grows to about CALL_SECONDS of steps once one call is timed
        self._started = False
        self._writers = {}  # TensorBoard run name -> summary writer (chief only)
        self.last_eval = None  # (step, results) of the latest evaluation
        self.damaged = set()  # checkpoints found damaged when resuming

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

    def train_records(self):
        """The record info of the training split, checked against this run's layout."""
        return load_record_info(self.tc.records_dir, "train", self.tc.train_batch_size, self.config.tgt_len,
                                self.num_hosts)

    def train(self):
        tc = self.tc
        info = self.train_records()
        if not self._started:
            self.restore_or_warm_start()
        step = self.current_step
        if tc.eval_steps and step and step % tc.eval_steps == 0 and \
                run_folder.evaluated_step(tc.model_dir) != step:
            self.log(f"evaluating step {step}, which was saved but not evaluated (an interrupted evaluation)")
            self.evaluate_and_keep_best(step)  # owed: the saved step's evaluation never finished
        if step >= tc.train_steps:  # a finished run, started again
            self.log(f"nothing to train: the run is at step {step} (--train_steps={tc.train_steps})")
            return step
        run = self._steps_runner(info, step)
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
                loss_sum, gnorm_sum, done, bad, step = self._run_steps(run, info, step, boundary, stop)
                elapsed = time.time() - start
                if bad:
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

    def _run_steps(self, run, info, step, boundary, stop):
        """Steps up to `boundary` in calls of about `CALL_SECONDS` each (the first call of one
        step, while it is compiled), so that a stop request is seen within seconds and a
        progress line comes at least every `PROGRESS_SECONDS`. `run(count)` runs up to
        `count` steps: `(loss sum, gradient norm sum, steps done, a non-finite step, the new
        step)`. Returns the sums over the steps, whether one was non-finite, and the new step."""
        loss_sum = gnorm_sum = 0.0
        done, last_line = 0, time.time()
        while step < boundary and stop.signum is None:
            count = min(boundary - step, self._steps_per_call)
            start = time.time()
            with naming_damaged_records(info):
                losses, gnorms, finished, bad, step = run(count)
            loss_sum, gnorm_sum, done = loss_sum + losses, gnorm_sum + gnorms, done + finished
            if bad:
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
        lr = float(learning_rate_at(step, tc))
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

    def save(self):
        step = self.current_step
        state = self._state()  # (every process takes part where the state is gathered)
        damaged = files.join(self.worker_dir(), run_folder.checkpoint_name(step))
        if damaged in self.damaged and files.exists(damaged):
            self.log(f"moved the damaged {damaged} to {run_folder.set_aside(damaged)}")
        if not self.writes_checkpoints:
            return damaged
        path = run_folder.save_checkpoint(self.worker_dir(), step, self.model, state, self.tc.keep_checkpoint_max)
        self.log(f"saved {path}")
        return path

    @property
    def writes_checkpoints(self):
        """Whether this process writes checkpoints (every worker its own, by default)."""
        return True

    def restore(self, path):
        """Restore weights, optimizer, step, randomness and every replica's memory."""
        self._started = True
        state = run_folder.load_state(path)
        self._check_state(state, path)
        run_folder.load_weights(self.model, path)
        self._assign_state(state)

    def _check_state(self, state, path):
        """A RunFolderError naming `path` unless its state fits this run's variables."""
        saved_replicas = sum(1 for k in state if k.startswith("memory_0_replica_"))
        if saved_replicas != self.replicas:
            raise ValueError(
                f"The checkpoint {path} holds the memory of {saved_replicas} replicas but this run "
                f"has {self.replicas}; resume with the same replica layout, or use "
                "--warm_start_path to start from its weights only."
            )
        expected = self._state_shapes()
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

    def _state_names(self, optimizer_count, seed_count):
        """The state's names besides the memory, in order."""
        return (["step", "loss_scale", "good_steps"] + [f"optimizer_{i}" for i in range(optimizer_count)]
                + [f"seed_{i}" for i in range(seed_count)])

    def _memory_shapes(self):
        """The names and shapes of each replica's memory in the state: `memory_{layer}_replica_{r}`
        `(per_replica, mem_len, d_model)` per layer, then the count of valid slots (index `n_layer`, a scalar)."""
        config = self.config
        shape = (self.per_replica, config.mem_len, config.d_model)
        shapes = {}
        for i in range(config.n_layer + 1):
            for r in range(self.replicas):
                shapes[f"memory_{i}_replica_{r}"] = shape if i < config.n_layer else ()
        return shapes

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
        batches = info["num_batch"] if tc.max_eval_batch <= 0 else min(tc.max_eval_batch, info["num_batch"])
        report = _progress(batches, f"eval {split}", self.log if progress else None)
        with naming_damaged_records(info):
            total, count = self._eval_pass(info, settings, tgt_len, batches, report)
        loss = total / max(count, 1)
        result = {"loss": loss, "ppl": math.exp(min(loss, 50)), "bpc": loss / LN2, "tokens": count,
                  "expected_tokens": info["num_targets"], "split": split}
        partial = f" (partial: max_eval_batch={tc.max_eval_batch})" if batches < info["num_batch"] else ""
        bpc = "" if self.word_level else f"bpc {result['bpc']:.4f} | "
        self.log(f"eval {split}: loss {loss:.4f} | ppl {result['ppl']:.3f} | {bpc}"
                 f"tokens {count} of {info['num_targets']}{partial}")
        step = self.current_step
        self.last_eval = (step, result)
        if summaries:
            self.write_summaries("eval", step, {name: result[name] for name in ("loss", "ppl", "bpc", "tokens")})
        return result
