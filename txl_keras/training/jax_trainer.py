"""`JaxTrainer`: the shared loop (`loop.TrainingLoop`) on the JAX backend, under a `keras.distribution`.

One jitted step takes the weights, Adam's moments, the random generators' state and the
memory as arrays and returns them updated; the loop keeps them between steps (the weights
in the model's variables). Where TensorFlow keeps one memory variable per replica, here
the memory is one array of the global batch sharded over the mesh's batch axis: replica
`r`'s rows are `r * per_replica ...`, the rows the records give replica `r` on TensorFlow,
so a checkpoint's `memory_{i}_replica_{r}` means the same on both backends. Dropout draws
one mask of the global batch's shape, which every device holds its own part of.

The step is the trainers' step (`txl_keras.training.step`) on the whole batch: gradients
summed over `batch_chunk` chunks (each chunk takes the same rows of every replica, as each
replica chunks its own batch), `checked_gradients`, Adam (`txl_keras.optimizers.adam_update`,
TensorFlow's fused kernel's arithmetic), and a non-finite step not applied (skipped with
`skip_nonfinite`, else the call's remaining steps change nothing and the loop stops).
"""

import contextlib

import keras
import numpy as np
from keras import ops

from tf_records.dataset import stream_dataset
from txl_keras.generate.loop import scored_segment, with_values
from txl_keras.models.transformer_xl_lm import TransformerXLLM
from txl_keras.optimizers import adam_update
from txl_keras.training.loop import TrainingLoop
from txl_keras.training.step import added, checked_gradients, halts, learning_rate_at, piece_loss


def data_parallel_size(distribution):
    """The replicas of a `keras.distribution` (the size of its batch axis); 1 without one."""
    if distribution is None:
        return 1
    mesh = distribution.device_mesh
    return mesh.shape[list(mesh.axis_names).index(distribution.batch_dim_name)]


class JaxTrainer(TrainingLoop):
    """Train and evaluate a `TransformerXLLM` on JAX under a `keras.distribution`.

    Args:
        distribution: `keras.distribution.DataParallel` or `ModelParallel` (whose layout
            map shards the weights, `TransformerXLLM.get_layout_map`), or None (one device).
        model_config: `TransformerXLConfig`.
        train_config: `TrainConfig` (precision float32 or mixed_bfloat16).
        num_hosts: JAX processes; each reads its own share of the records.
        is_chief: whether this process writes logs, summaries and checkpoints.
        log: a print-like function.
    """

    compiled = True  # every step is one XLA program: the static-shape paths

    def __init__(self, distribution, model_config, train_config, num_hosts=1, is_chief=True, log=print):
        import jax

        if train_config.precision == "mixed_float16":
            raise ValueError("--precision=mixed_float16 needs a loss scale, which the JAX trainer does not keep; "
                             "use mixed_bfloat16 (or float32) on JAX.")
        if train_config.deterministic:
            jax.config.update("jax_default_matmul_precision", "highest")
        super().__init__(model_config, train_config, data_parallel_size(distribution), num_hosts, is_chief, log)
        self.distribution = distribution
        keras.utils.set_random_seed(train_config.seed)
        with distribution.scope() if distribution else contextlib.nullcontext():
            self.model = TransformerXLLM(model_config, tail_mode="dense", dtype=train_config.precision,
                                         name="transformer_xl_lm")
        self.seed_slots = [i for i, v in enumerate(self.model.non_trainable_variables)
                           if "seed_generator_state" in v.path]
        # Every array the steps take is placed (committed) before the first call, so that the
        # arrays they return, placed alike, are taken by the same compiled program.
        if distribution is None:
            self.data_sharding = self.replicated = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        else:
            mesh, spec = distribution.device_mesh.backend_mesh, jax.sharding.PartitionSpec
            self.data_sharding = jax.sharding.NamedSharding(mesh, spec(distribution.batch_dim_name))
            self.replicated = jax.sharding.NamedSharding(mesh, spec())
        # An `InferenceCache` ring `(G, batch, slots, W)`: its streams where their tokens are.
        self.ring_sharding = self.replicated if distribution is None else \
            jax.sharding.NamedSharding(mesh, spec(None, distribution.batch_dim_name))
        self._step = 0
        self._good_steps = 0
        self._adam = None  # (iterations, moments m, moments v), made on first use
        self._memory = None  # (per-layer memory of the global batch, count of valid slots)
        self._iterator = None  # [step it is positioned at, iterator of this host's batches]
        self._train_fn = None
        self._evaluations = {}  # (evaluation settings, tgt_len) -> jitted (start, segment)

    @property
    def current_step(self):
        return self._step

    @property
    def writes_checkpoints(self):
        return self.is_chief  # one run folder for every process: the state is gathered

    def worker_dir(self):
        return self.tc.model_dir

    # -- arrays --------------------------------------------------------------------------

    def _global(self, local):
        """The global array of this process's rows `local` (numpy), sharded over the batch axis."""
        import jax

        return jax.make_array_from_process_local_data(self.data_sharding, np.asarray(local))

    def _local_rows(self, rows):
        """This process's share of `rows` (the global batch's rows, in replica order)."""
        import jax

        share = len(rows) // self.num_hosts
        return rows[jax.process_index() * share:(jax.process_index() + 1) * share]

    @staticmethod
    def _numpy(array):
        """The whole of an array as numpy, gathered from every process where it is spread over them."""
        from jax.experimental import multihost_utils

        if getattr(array, "is_fully_addressable", True) or array.is_fully_replicated:
            return np.asarray(array)
        return np.asarray(multihost_utils.process_allgather(array, tiled=True))

    def _zeros_like_weights(self):
        import jax

        return [jax.device_put(np.zeros(v.shape, v.dtype), w.sharding)
                for v, w in zip(self.model.trainable_variables, self._weights(self.model.trainable_variables))]

    def _optimizer_state(self):
        if self._adam is None:
            self._adam = (0, self._zeros_like_weights(), self._zeros_like_weights())
        return self._adam

    def _memory_state(self):
        if self._memory is None:
            config = self.config
            rows = self.per_replica * self.cores
            zeros = np.zeros((rows, config.mem_len, config.d_model), keras.backend.standardize_dtype(
                self.model.compute_dtype))
            valid = np.int32(config.mem_len if config.mem_init == "zeros" else 0)
            self._memory = ([self._global(zeros) for _ in range(config.n_layer)], valid)
        return self._memory

    # -- training ------------------------------------------------------------------------

    def _chunks(self, x):
        """`batch_chunk` slices of a global batch, slice `k` holding rows `k * piece ...` of
        every replica (each replica chunks its own rows, as on TensorFlow)."""
        chunks = self.tc.batch_chunk
        if chunks == 1:
            return [x]
        grouped = ops.reshape(x, (self.replicas, chunks, self.per_replica // chunks) + tuple(x.shape[1:]))
        return [ops.reshape(grouped[:, k], (-1,) + tuple(x.shape[1:])) for k in range(chunks)]

    def _unchunk(self, parts):
        """The inverse of `_chunks`."""
        if len(parts) == 1:
            return parts[0]
        shape = tuple(parts[0].shape[1:])
        grouped = ops.stack([ops.reshape(p, (self.replicas, -1) + shape) for p in parts], 1)
        return ops.reshape(grouped, (-1,) + shape)

    def _step_fn(self, state, inputs, targets):
        """One training step on the global batch: the new state, and the step's
        `(loss, gradient norm, applied, bad)`, zeros where it was not applied."""
        import jax

        tc, model = self.tc, self.model
        trainable, non_trainable, adam, memory, valid, step, good, halted = state
        global_tokens = float(np.prod(inputs.shape))

        def chunk_loss(weights, non_trainable, inputs, targets, mems):
            out, non_trainable = model.stateless_call(weights, non_trainable, inputs, targets=targets, mems=mems,
                                                      memory_valid=valid, training=True)
            loss, nll_sum = piece_loss(out["nll"], global_tokens)
            return loss, (nll_sum, out["mems"], out["memory_valid"], non_trainable)

        grad_fn = jax.value_and_grad(chunk_loss, has_aux=True)
        grads, nll_total, new_parts = None, 0.0, []
        chunked = [self._chunks(m) for m in memory]
        for k, (chunk_inputs, chunk_targets) in enumerate(zip(self._chunks(inputs), self._chunks(targets))):
            (_, (nll_sum, mems, new_valid, non_trainable)), chunk_grads = grad_fn(
                trainable, non_trainable, chunk_inputs, chunk_targets, [m[k] for m in chunked])
            grads = added(grads, chunk_grads)
            nll_total = nll_total + nll_sum
            new_parts.append(mems)
        new_memory = [self._unchunk([p[i] for p in new_parts]) for i in range(self.config.n_layer)]
        grads, gnorm, forward_ok, finite = checked_gradients(grads, nll_total, tc.clip)
        forward_ok, finite = forward_ok & ~halted, finite & ~halted
        bad = halted | halts(finite, tc)
        lr = learning_rate_at(step, tc)
        iterations, ms, vs = adam

        def apply(_):
            t = iterations + 1
            updated = [adam_update(w, g, m, v, t, lr) for w, g, m, v in zip(trainable, grads, ms, vs)]
            return [u[0] for u in updated], (t, [u[1] for u in updated], [u[2] for u in updated])

        trainable, adam = jax.lax.cond(finite, apply, lambda _: (trainable, adam), None)
        memory = [ops.where(forward_ok, new, old) for new, old in zip(new_memory, memory)]
        valid = ops.where(forward_ok, ops.cast(new_valid, "int32"), valid)
        applied = ops.cast(finite, "float32")
        state = (trainable, non_trainable, adam, memory, valid, step + ops.cast(~bad, "int32"),
                 good + ops.cast(finite, "int32"), bad)
        return state, (nll_total / global_tokens * applied, gnorm * applied, applied, bad)

    def _compiled_step(self):
        import jax

        if self._train_fn is None:
            self._train_fn = jax.jit(self._step_fn, donate_argnums=(0,))
        return self._train_fn

    def lowered_train_step(self):
        """The training step lowered for this run's shapes (`jax.stages.Lowered`), as the loop compiles it."""
        import jax

        batch = (self.per_replica * self.replicas, self.config.tgt_len)
        tokens = jax.ShapeDtypeStruct(batch, "int32", sharding=self.data_sharding)
        return jax.jit(self._step_fn).lower(self._gather_state(), tokens, tokens)

    def _scalar(self, value, dtype):
        import jax

        return jax.device_put(np.asarray(value, dtype), self.replicated)

    def _weights(self, variables):
        """The values of `variables`, placed as their layouts say (one device without a distribution)."""
        import jax

        return [v.value if self.distribution else jax.device_put(v.value, self.replicated) for v in variables]

    def _gather_state(self):
        memory, valid = self._memory_state()
        iterations, ms, vs = self._optimizer_state()
        return (self._weights(self.model.trainable_variables), self._weights(self.model.non_trainable_variables),
                (self._scalar(iterations, "int32"), ms, vs), memory, self._scalar(valid, "int32"),
                self._scalar(self._step, "int32"), self._scalar(self._good_steps, "int32"), self._scalar(False, bool))

    def _scatter_state(self, state):
        trainable, non_trainable, adam, memory, valid, step, good, _ = state
        for variable, value in zip(self.model.trainable_variables, trainable):
            variable.assign(value)
        for variable, value in zip(self.model.non_trainable_variables, non_trainable):
            variable.assign(value)
        self._adam, self._memory = adam, (memory, valid)
        self._step, self._good_steps = int(step), int(good)

    def _train_iterator(self, info, step):
        import jax

        dataset = stream_dataset(info, jax.process_index(), 1, repeat=True, vocab_size=self.config.n_token,
                                 skip=step)
        return dataset.as_numpy_iterator()

    def _steps_runner(self, info, step):
        """`run(count)` for the loop: `count` steps dispatched one after another, their sums read once."""
        step_fn = self._compiled_step()

        def run(count):
            if self._iterator is None or self._iterator[0] != self._step:
                self._iterator = [self._step, self._train_iterator(info, self._step)]
            state = self._gather_state()
            sums = None
            for _ in range(count):
                inputs, targets = next(self._iterator[1])
                state, out = step_fn(state, self._global(inputs), self._global(targets))
                sums = out if sums is None else tuple(a + b for a, b in zip(sums[:3], out[:3])) + (out[3],)
            self._scatter_state(state)
            loss, gnorm, done, bad = (self._numpy(x) for x in sums)
            self._iterator[0] = self._step
            if bool(bad):
                self._iterator = None  # it is ahead of the step now
            return float(loss), float(gnorm), int(done), bool(bad), self._step

        return run

    # -- checkpoints -----------------------------------------------------------------------

    def _state(self):
        _, ms, vs = self._optimizer_state()
        iterations = self._adam[0]
        seeds = [self.model.non_trainable_variables[i].value for i in self.seed_slots]
        names = self._state_names(1 + 2 * len(ms), len(seeds))
        values = [np.array(self._step, np.int64), np.array(1.0, np.float32), np.array(self._good_steps, np.int64),
                  np.array(int(iterations), np.int64)]
        values += [self._numpy(x) for x in ms + vs + seeds]
        state = dict(zip(names, values))
        memory, valid = self._memory_state()
        for i, layer in enumerate(memory + [None]):
            rows = self._numpy(layer) if layer is not None else None
            for r in range(self.replicas):
                state[f"memory_{i}_replica_{r}"] = np.array(int(valid), np.int32) if rows is None else \
                    rows[r * self.per_replica:(r + 1) * self.per_replica]
        return state

    def _state_shapes(self):
        weights = self.model.trainable_variables
        seeds = [self.model.non_trainable_variables[i] for i in self.seed_slots]
        names = self._state_names(1 + 2 * len(weights), len(seeds))
        shapes = [(), (), (), ()] + [tuple(v.shape) for v in weights + weights + seeds]
        return {**dict(zip(names, shapes)), **self._memory_shapes()}

    def _assign_state(self, state):
        import jax

        weights = self.model.trainable_variables
        n = len(weights)
        self._step, self._good_steps = int(state["step"]), int(state["good_steps"])

        shardings = [w.sharding for w in self._weights(weights)]

        def placed(first):
            return [jax.device_put(np.asarray(state[f"optimizer_{first + i}"], v.dtype), sharding)
                    for i, (v, sharding) in enumerate(zip(weights, shardings))]

        self._adam = (int(state["optimizer_0"]), placed(1), placed(1 + n))
        for k, i in enumerate(self.seed_slots):
            self.model.non_trainable_variables[i].assign(state[f"seed_{k}"])
        dtype = keras.backend.standardize_dtype(self.model.compute_dtype)
        memory = []
        for i in range(self.config.n_layer):
            rows = np.concatenate([state[f"memory_{i}_replica_{r}"] for r in range(self.replicas)]).astype(dtype)
            memory.append(self._global(self._local_rows(rows)))
        self._memory = (memory, np.int32(state[f"memory_{self.config.n_layer}_replica_0"]))
        self._iterator = None

    # -- evaluation ------------------------------------------------------------------------

    def _evaluation(self, settings, tgt_len, weights):
        """`(start, segment)`, jitted, of the evaluation at `settings` and segment length
        `tgt_len`: `start(weights)` is an empty `InferenceCache` of the global batch (its
        rings sharded over the batch axis, as the streams are); `segment(weights, cache,
        inputs, targets)` is `(summed NLL, scored targets, the cache advanced)` of one
        segment (`generate.loop.scored_segment`; targets < 0 are padding). `weights`
        (`_eval_weights`) are the trainable then the other variables' values, placed."""
        import jax

        key = (settings.to_json(), tgt_len)
        if key not in self._evaluations:
            model = self.model
            variables = model.trainable_variables + model.non_trainable_variables
            rows = self.tc.eval_batch_size // self.cores * self.cores * self.num_hosts
            scorer = scored_segment(model, settings)

            def start():
                return model.init_cache(rows, settings.mem_len, settings.clamp_len, segment_length=tgt_len)

            def segment(cache, inputs, targets):
                nll, cache = scorer(inputs, targets, cache)
                return ops.sum(nll), ops.sum(ops.cast(targets >= 0, "int32")), cache

            start, segment = with_values(variables, start), with_values(variables, segment)
            placed = jax.tree_util.tree_map(lambda _: self.replicated, jax.eval_shape(start, weights))
            placed = placed.map_rings(lambda _: self.ring_sharding)
            self._evaluations[key] = (jax.jit(start, out_shardings=placed), jax.jit(segment))
        return self._evaluations[key]

    def _eval_weights(self):
        return self._weights(self.model.trainable_variables) + self._weights(self.model.non_trainable_variables)

    def _eval_pass(self, info, settings, tgt_len, batches, report):
        """The summed NLL and count of the targets of the pass's first `batches` batches."""
        import jax

        weights = self._eval_weights()
        start, segment = self._evaluation(settings, tgt_len, weights)
        cache = start(weights)
        dataset = stream_dataset(info, jax.process_index(), 1, repeat=False, vocab_size=settings.n_token)
        total, count = 0.0, 0
        for i, (inputs, targets) in enumerate(dataset.as_numpy_iterator()):
            if i >= batches:
                break
            nll, n, cache = segment(weights, cache, self._global(inputs), self._global(targets))
            total, count = total + float(self._numpy(nll)), count + int(self._numpy(n))
            report(i + 1, total / max(count, 1))
        return total, count
