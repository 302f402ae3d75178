"""`TransformerXLCausalLM`: the language model a user holds, with its tokenizer and preprocessor."""

import collections.abc
import dataclasses
import math

import keras
import numpy as np
from keras import ops

from txl_keras import generate as generation
from txl_keras import samplers
from txl_keras.layers import arguments
from txl_keras.models.transformer_xl_lm import mean_nll
from txl_keras.tasks.stream_memory import hold_memory
from txl_keras.tasks.causal_lm_preprocessor import TransformerXLCausalLMPreprocessor
from txl_keras.tasks import task_presets
from txl_keras.tasks.perplexity import Perplexity
from txl_keras.tasks.task import Task
from txl_keras import optimizers
from txl_keras.schedules import WarmupCosine

# What one new token's text costs beyond its id, as generate builds it (a TensorFlow string
# element per token in `detokenize`, then Python's): the memory check counts it.
TEXT_BYTES_PER_TOKEN = 64


@dataclasses.dataclass
class TextScore:
    """How likely a text is under the model.

    Fields:
        tokens: the symbols scored (every token of the text but the first).
        log_likelihoods: float32 `(len(tokens),)`, each token's log-probability (nats)
            given the text before it.
        perplexity: `exp` of the mean negative log-likelihood per token.
        bits_per_character: the total negative log-likelihood in bits over the text's
            characters (bytes at byte level).
    """

    tokens: list
    log_likelihoods: np.ndarray
    perplexity: float
    bits_per_character: float


@keras.saving.register_keras_serializable(package="txl_keras")
class TransformerXLCausalLM(Task):
    """A Transformer-XL language model with its tokenizer: text in, text out, `fit` on text.

    The task holds `model` (a `TransformerXLLM`: the backbone `model.backbone` and the
    adaptive-softmax head) and `preprocessor` (a `TransformerXLCausalLMPreprocessor`,
    whose `tokenizer` is a `TransformerXLTokenizer`), as KerasHub's `CausalLM` does.

    Where Transformer-XL differs from KerasHub's causal LMs:
    - `fit(texts, batch_size=B)` trains on `B` contiguous streams of the text, segment
      after segment, and the memory carries across `fit`'s batches as in the trainers
      (it starts empty at every epoch and every evaluation); the batches must stay in
      order (a list of strings is never shuffled). One epoch over `N` tokens is
      `ceil((N - 1) / (B * tgt_len))` steps.
    - The loss is the adaptive softmax's negative log-likelihood in nats; the metrics
      receive `(targets, per-token NLL)`. `compile()` with no arguments gives the paper's
      recipe (`txl_keras.optimizers`, the trainers' too): Adam, gradient clipping at a
      global norm of 0.25, a linear warmup (a tenth of the steps, at most 1,000) then a
      cosine decay to 0.004 of the peak 2.5e-4, sized anew by every `fit` from its own
      epochs and steps (a second `fit` warms up and decays again; Adam's moments carry
      over), and a perplexity metric.
    - `score` and `generate` read long text through the memory (the model's `tgt_len`,
      `mem_len`, `clamp_len`: a released model carries the paper's evaluation settings).

    Args:
        model: a `TransformerXLLM`.
        preprocessor: a `TransformerXLCausalLMPreprocessor` (its tokenizer's vocabulary
            has `model.config.n_token` symbols).
        **kwargs: `name`.

    Call arguments:
        inputs: `{"token_ids": int (batch_size, T), "target_ids": int (batch_size, T)}`.
        training: bool.

    Returns:
        float32 `(batch_size, T)`, the NLL (nats) of each target given the memory.

    Example:
        >>> lm = TransformerXLCausalLM.from_preset("transfo_xl_wt103")  # doctest: +SKIP
        >>> lm.generate("The history of", max_new_tokens=20)  # doctest: +SKIP
        >>> lm.fit(["my text ...", "more text ..."], batch_size=4, epochs=1)  # doctest: +SKIP
        >>> lm.save_to_preset("my_wt103")  # doctest: +SKIP
    """

    def __init__(self, model, preprocessor, **kwargs):
        super().__init__(**kwargs)
        vocabulary = preprocessor.tokenizer.vocabulary
        if vocabulary is not None and len(vocabulary) != model.config.n_token:
            raise ValueError(f"The tokenizer has {len(vocabulary)} symbols but the model has n_token="
                             f"{model.config.n_token}; pair the model with the vocabulary of its records.")
        self.model = model
        self.preprocessor = preprocessor
        self.stream_memory = None  # a stateful MemoryCache of fit's batch size, made by fit
        self._schedule = None
        self.sampler = None  # compile(sampler=...)

    @property
    def backbone(self):
        return self.model.backbone

    # -- presets ---------------------------------------------------------------------------

    @classmethod
    def _on_language_model(cls, model, tokenizer):
        """The task on a trained `TransformerXLLM` (`from_preset`: `Task.from_preset`)."""
        return cls(model, TransformerXLCausalLMPreprocessor(tokenizer, model.config.tgt_len))

    def save_to_preset(self, preset_dir):
        """Write the task as a preset folder that `from_preset` reads: `config.json` (the
        serialized `TransformerXLLM`), `metadata.json`, `model.weights.h5`,
        `tokenizer.json`, `preprocessor.json` and `assets/tokenizer/vocab.json` (whose
        fingerprint `metadata.json` records: `from_preset` refuses a vocabulary changed
        since). The folder is written whole (staged, then published); an existing file or
        non-empty folder is refused. A local path's `~` is expanded."""
        return task_presets.write(preset_dir, self, self.model, self.model.config)

    def quantize(self, mode=None, config=None, filters=None, **kwargs):
        """int8 weights for generation and scoring: the model's `quantize`
        (`txl_keras.models.int8_model`; Keras's own would convert only the `Dense` layers)."""
        self.model.quantize(mode, config=config, filters=filters, **kwargs)
        self.train_function = self.test_function = self.predict_function = None

    def _check_quantize_args(self, mode, compute_dtype):
        """(Keras's checks before `quantize`, which asks the task to be built: the model checks.)"""

    def export(self, filepath, mem_len=None, clamp_len=None, same_length=None):
        """Write a SavedModel with the tokenizer's text functions and the in-graph
        `generate` (`serving_default`): see `txl_keras.export.export_saved_model`."""
        from txl_keras.export import export_saved_model

        return export_saved_model(self.model, filepath, self.tokenizer.vocabulary, mem_len, clamp_len, same_length)

    # -- training --------------------------------------------------------------------------

    def call(self, inputs, training=False):
        tokens, targets = inputs["token_ids"], inputs["target_ids"]
        if self.stream_memory is None:
            return self.model(tokens, targets=targets, training=training)["nll"]
        mems, valid = self.stream_memory.read()
        out = self.model(tokens, targets=targets, mems=mems, memory_valid=valid, training=training)
        self.stream_memory.write(out["mems"], out["memory_valid"])
        return out["nll"]

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """The mean NLL (nats) of the targets, padding (weight 0) left out (`mean_nll`)."""
        return mean_nll(y_pred, sample_weight, self.losses)

    def compile(self, optimizer="auto", loss="auto", *, weighted_metrics="auto", sampler="top_k", jit_compile="auto",
                **kwargs):
        """Keras's `compile` with the paper's defaults (see the class docstring). `loss`
        must stay "auto": the loss is the adaptive softmax's NLL. Metrics are best given as
        `weighted_metrics` (as KerasHub's): those leave the padding of the last batch out.
        `sampler`: how `generate` picks tokens, a name ("greedy", "top_k", "top_p",
        "random", "beam") or a `txl_keras.samplers.Sampler`. `jit_compile="auto"`: one XLA
        program per step on JAX (not compiling would run each step op by op), a
        `tf.function` graph without XLA on TensorFlow."""
        self.sampler = samplers.get(sampler)
        if loss not in ("auto", None):
            raise ValueError("TransformerXLCausalLM computes its own loss (the adaptive softmax's negative "
                             f"log-likelihood in nats); leave `loss` as 'auto'. Received: loss={loss!r}")
        self._schedule = None
        if optimizer == "auto":
            self._schedule = WarmupCosine(optimizers.LEARNING_RATE)
            optimizer = optimizers.adam(self._schedule)
        if weighted_metrics == "auto":
            weighted_metrics = [Perplexity()]
        if jit_compile == "auto":
            jit_compile = keras.config.backend() == "jax"
        super().compile(optimizer=optimizer, weighted_metrics=weighted_metrics, jit_compile=jit_compile, **kwargs)

    def fit(self, x=None, batch_size=None, epochs=1, validation_data=None, callbacks=None, **kwargs):
        """Train on text: `x` a string, a list of strings or a `tf.data.Dataset` of
        strings (read in order as one text, see `TransformerXLCausalLMPreprocessor`),
        `batch_size` the number of streams (default 1). The memory carries across
        batches; see the class docstring. With `steps_per_epoch`, an epoch longer than the
        text reads it again (the memory carries on), and an endless dataset or iterator is
        read as far as one epoch needs. Other arguments as Keras's `fit`."""
        batch_size = arguments.count("batch_size", 1 if batch_size is None else batch_size, 1)
        epochs = arguments.count("epochs", epochs, 0)
        steps_per_epoch = kwargs.pop("steps_per_epoch", None)
        if steps_per_epoch is not None:
            steps_per_epoch = arguments.count("steps_per_epoch", steps_per_epoch, 1)
        if kwargs.get("shuffle"):
            raise ValueError("fit keeps the text's segments in order (the memory follows the streams); "
                             "drop shuffle=True.")
        kwargs.pop("shuffle", None)
        length = self.preprocessor.sequence_length
        needed = None if steps_per_epoch is None else steps_per_epoch * batch_size * length + 1
        data = self.preprocessor.stream_dataset(self._read_texts(x, needed), batch_size)
        if validation_data is not None:
            validation_data = self.preprocessor.stream_dataset(self._read_texts(validation_data), batch_size)
        if steps_per_epoch is not None and steps_per_epoch > int(data.cardinality()):
            data = data.repeat()
        if not self.compiled:
            self.compile()
        self._use_stream_memory(batch_size)
        steps = steps_per_epoch or int(data.cardinality())
        if self._schedule is not None and epochs > 0:
            self._schedule.size(steps * epochs, start_step=int(ops.convert_to_numpy(self.optimizer.iterations)))
            self.train_function = None  # the schedule's sizes are traced into the step
        callbacks = list(callbacks or []) + [_FreshMemory(self)]
        return super().fit(data, epochs=epochs, validation_data=validation_data, callbacks=callbacks,
                           shuffle=False, steps_per_epoch=steps_per_epoch, **kwargs)

    def evaluate(self, x=None, batch_size=None, callbacks=None, **kwargs):
        """The loss and metrics of text (as `fit` reads it) through the memory."""
        if kwargs.get("_use_cached_eval_dataset"):  # fit's validation: the batches are made already
            return super().evaluate(x, batch_size=batch_size, callbacks=callbacks, **kwargs)
        batch_size = arguments.count("batch_size", 1 if batch_size is None else batch_size, 1)
        data = self.preprocessor.stream_dataset(self._read_texts(x), batch_size)
        if not self.compiled:
            self.compile()
        self._use_stream_memory(batch_size)
        return super().evaluate(data, callbacks=list(callbacks or []) + [_FreshMemory(self)], **kwargs)

    def predict(self, x, *args, **kwargs):
        """Keras's `predict` on batches of ids (`{"token_ids", "target_ids"}`: each target's
        NLL). Text has no single prediction: `score(text)` gives each token's
        log-likelihood and the perplexity, `generate(prompt)` a continuation."""
        if _is_text(x):
            raise ValueError("TransformerXLCausalLM.predict takes batches of ids ({'token_ids', 'target_ids'}), "
                             "not text: call score(text) for its per-token log-likelihoods and perplexity, or "
                             "generate(prompt) to continue it.")
        return super().predict(x, *args, **kwargs)

    def _read_texts(self, x, needed_tokens=None):
        """A list of strings (`_texts`); an endless source is read to `needed_tokens` tokens."""
        return _texts(x, needed_tokens, lambda text: len(self.preprocessor.text_ids(text)))

    def _use_stream_memory(self, batch_size):
        """Hold the memory of `batch_size` streams across batches (`hold_memory`)."""
        hold_memory(self, "stream_memory", self.model.config, batch_size)

    def reset_memory(self):
        """Start every stream afresh (fit and evaluate do at each epoch and evaluation)."""
        if self.stream_memory is not None:
            self.stream_memory.reset()

    # -- text in, text out -------------------------------------------------------------------

    def score(self, text):
        """A `TextScore` of `text` (its tokens as the tokenizer reads text: at word level,
        each line followed by its end symbol), read through the memory in segments of
        `tgt_len`; a list of `TextScore`s of a list of texts, each read on its own."""
        if isinstance(text, (list, tuple)):
            return [self.score(t) for t in text]
        if not isinstance(text, str):
            raise ValueError(f"Expected a text string or a list of them to score. Received: {type(text).__name__}")
        ids = np.asarray(self.tokenizer(text))
        if len(ids) < 2:
            raise ValueError(f"Expected a text of at least 2 tokens (the first is only context). Received: {text!r}")
        nll = generation.score(self.model, ids[None])[0].astype(np.float64)
        characters = len(text.encode("utf-8")) if self.tokenizer.vocabulary.level == "byte" else len(text)
        return TextScore(tokens=[self.tokenizer.id_to_token(int(i)) for i in ids[1:]],
                         log_likelihoods=(-nll).astype("float32"), perplexity=math.exp(min(nll.mean(), 700)),
                         bits_per_character=float(nll.sum() / math.log(2) / max(characters, 1)))

    def generate(self, inputs, max_length=None, max_new_tokens=None, stop_token_ids="auto", strip_prompt=False,
                 sampler=None):
        """Continue prompts: a string gives a string, a list of strings a list, in order.

        Each prompt gives exactly what it gives alone (greedy: the same text; sampled: the
        same text for the same seed), whatever else shares the batch. Unlike a causal LM
        without memory, a prompt's context depends on how it is cut into segments: the
        prompts' contexts go through the memory one length at a time (prompts of one
        length are cut alike), then all rows generate as one batch, each with its own
        count of real memory slots.

        Args:
            inputs: a string or a list of strings.
            max_length: the length in tokens of each prompt and its continuation.
            max_new_tokens: new tokens per prompt (default 100 when `max_length` is not given).
            stop_token_ids: "auto" (the vocabulary's end symbol, `<eos>` or `<S>`, where it
                has one), None, or a tuple of ids, symbols or texts of one token (`"\\n"`
                at byte level, as the command line's `--stop`): a row ends at the first,
                which is kept, and nothing follows it.
            strip_prompt: return the continuations only.
            sampler: a name or a `txl_keras.samplers.Sampler` for this call (default: the
                one of `compile(sampler=...)`, else "top_k").
        """
        single = isinstance(inputs, str)
        prompts = [inputs] if single else list(inputs) if isinstance(inputs, (list, tuple)) else None
        if not prompts or not all(isinstance(p, str) for p in prompts):
            raise ValueError(f"Expected a prompt string or a non-empty list of them. Received: {inputs!r}")
        ids = [np.asarray(row, np.int32) for row in self.preprocessor.generate_preprocess(prompts).to_list()]
        for prompt, row in zip(prompts, ids):
            if len(row) == 0:
                raise ValueError(f"Expected a prompt that encodes to at least one token. Received: {prompt!r}")
        limits = self._new_token_limits(ids, max_length, max_new_tokens)
        stops = self._stop_ids(stop_token_ids)
        sampler = self._sampler(sampler)
        generation.require_generation_memory(self.model.config, len(ids), max(limits), sampler,
                                             bytes_per_token=TEXT_BYTES_PER_TOKEN)
        out = generation.generate(self.model, ids, limits, stop_token=stops, sampler=sampler, check_memory=False)
        texts = [self._text(row[: len(p)], row[len(p):], strip_prompt) for p, row in zip(ids, out)]
        return texts[0] if single else texts

    def stream(self, inputs, max_length=None, max_new_tokens=None, stop_token_ids="auto", sampler=None):
        """Yield the continuation of one prompt (a string) as it is generated, in pieces of
        text whose join is `generate(..., strip_prompt=True)`'s for the same sampler and
        seed (a byte-level piece waits for the rest of its character)."""
        if not isinstance(inputs, str):
            raise ValueError(f"Expected one prompt string. Received: {type(inputs).__name__}")
        prompt = np.asarray(self.preprocessor.generate_preprocess(inputs), np.int32)
        if len(prompt) == 0:
            raise ValueError(f"Expected a prompt that encodes to at least one token. Received: {inputs!r}")
        limit = int(self._new_token_limits([prompt], max_length, max_new_tokens)[0])
        sampler = self._sampler(sampler)
        generation.require_generation_memory(self.model.config, 1, limit, sampler,
                                             bytes_per_token=TEXT_BYTES_PER_TOKEN)
        new, shown = [], ""
        for token in generation.stream(self.model, prompt, limit, sampler, self._stop_ids(stop_token_ids),
                                       seed=sampler.draw_seed()):
            new.append(token)
            text = self._text(prompt, np.asarray(new, np.int32), True)
            complete = text.rstrip("\ufffd") if self.tokenizer.vocabulary.level == "byte" else text
            if len(complete) > len(shown):
                yield complete[len(shown):]
                shown = complete
        text = self._text(prompt, np.asarray(new, np.int32), True)
        if len(text) > len(shown):
            yield text[len(shown):]

    def _text(self, prompt, new, strip_prompt):
        text = self.preprocessor.generate_postprocess(np.concatenate([prompt, new]).astype(np.int32))
        if not strip_prompt:
            return text
        before = self.preprocessor.generate_postprocess(prompt)
        return text[len(before):] if text.startswith(before) else self.preprocessor.generate_postprocess(new)

    def _sampler(self, sampler):
        chosen = samplers.get(sampler if sampler is not None else getattr(self, "sampler", None) or "top_k")
        if chosen.seed is None and chosen.draws:
            chosen = type(chosen).from_config({**chosen.get_config(), "seed": chosen.draw_seed()})
        return chosen

    def _new_token_limits(self, prompts, max_length, max_new_tokens):
        if max_length is not None and max_new_tokens is not None:
            raise ValueError("Give `max_length` or `max_new_tokens`, not both.")
        if max_length is None:
            count = 100 if max_new_tokens is None else max_new_tokens
            if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
                raise ValueError(f"Expected `max_new_tokens` to be a non-negative integer. Received: {count!r}")
            return [int(count)] * len(prompts)
        if isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)):
            raise ValueError(f"Expected `max_length` to be an integer. Received: max_length={max_length!r}")
        longest = max(len(p) for p in prompts)
        if max_length < longest:
            raise ValueError(f"`max_length`={max_length} is below the length of a prompt ({longest} tokens); give "
                             "a larger max_length or use max_new_tokens.")
        return [int(max_length) - len(p) for p in prompts]

    def _stop_ids(self, stop_token_ids):
        if stop_token_ids is None:
            return ()
        if isinstance(stop_token_ids, str) and stop_token_ids == "auto":
            end = self.tokenizer.end_token_id
            return () if end is None else (end,)
        values = stop_token_ids if isinstance(stop_token_ids, (list, tuple)) else [stop_token_ids]
        ids = []
        for value in values:
            if isinstance(value, str):
                ids.append(self.tokenizer.single_token_id(value, "stop_token_ids"))
            elif isinstance(value, (int, np.integer)) and not isinstance(value, bool) \
                    and 0 <= value < self.tokenizer.vocabulary_size():
                ids.append(int(value))
            else:
                raise ValueError(f"Expected `stop_token_ids` to hold token ids in [0, "
                                 f"{self.tokenizer.vocabulary_size()}), symbols or texts of one token. "
                                 f"Received: {value!r}")
        return tuple(ids)

    # -- serialization -------------------------------------------------------------------------

    def get_config(self):
        return {**{k: v for k, v in super().get_config().items() if k in ("name", "trainable")},
                "model": keras.saving.serialize_keras_object(self.model),
                "preprocessor": keras.saving.serialize_keras_object(self.preprocessor)}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        model = keras.saving.deserialize_keras_object(config.pop("model"))
        preprocessor = keras.saving.deserialize_keras_object(config.pop("preprocessor"))
        return cls(model, preprocessor, **config)


class _FreshMemory(keras.callbacks.Callback):
    """Empty streams at every epoch and around every evaluation."""

    def __init__(self, task):
        super().__init__()
        self.task = task

    def on_epoch_begin(self, epoch, logs=None):
        self.task.reset_memory()

    def on_test_begin(self, logs=None):
        self.task.reset_memory()

    def on_test_end(self, logs=None):
        self.task.reset_memory()


def _is_text(x):
    import tensorflow as tf

    return isinstance(x, (str, bytes)) or (isinstance(x, (list, tuple)) and any(isinstance(t, str) for t in x)) \
        or (isinstance(x, tf.data.Dataset) and getattr(x.element_spec, "dtype", None) == tf.string)


def _texts(x, needed_tokens=None, count_tokens=len):
    """A list of strings from a string, a list, an array, an iterator or a `tf.data.Dataset`
    of strings; an endless dataset or an iterator is read until the texts hold
    `needed_tokens` tokens (`count_tokens(text)`), and refused without it."""
    import tensorflow as tf

    what = "Expected text: a string, a list of strings, a numpy array of strings or a tf.data.Dataset of strings"
    if x is None:
        raise ValueError(f"{what}. Received: None")
    if isinstance(x, str):
        return [x]
    if isinstance(x, bytes):
        raise ValueError(f"{what}. Received bytes: decode them first (x.decode('utf-8')).")
    if isinstance(x, tf.data.Dataset):
        spec = x.element_spec
        if not (isinstance(spec, tf.TensorSpec) and spec.dtype == tf.string):
            raise ValueError(f"Expected a dataset of strings (or of batches of strings). Received elements {spec}")
        endless = int(x.cardinality()) == int(tf.data.INFINITE_CARDINALITY)
        if endless and needed_tokens is None:
            raise ValueError("The dataset is endless (it repeats): give steps_per_epoch (fit reads as much text as "
                             "one epoch needs), or pass a finite dataset.")
        items = (t.decode("utf-8") for batch in x.as_numpy_iterator() for t in np.atleast_1d(batch).tolist())
        return _read(items, needed_tokens if endless else None, count_tokens)
    if isinstance(x, np.ndarray):
        if x.ndim > 1:
            raise ValueError(f"{what}. Received an array of shape {x.shape}: give a 1-D array of strings.")
        x = x.tolist() if x.ndim == 1 else [x.item()]
    if isinstance(x, (list, tuple)):
        texts = list(x)
        if not texts:
            raise ValueError(f"{what}. Received an empty {type(x).__name__}: there is no text.")
        for item in texts:
            if not isinstance(item, str):
                hint = " (decode bytes first)" if isinstance(item, bytes) else ""
                raise ValueError(f"Expected every item of the text to be a string{hint}. Received an item of type "
                                 f"{type(item).__name__}: {item!r:.60}")
        return texts
    if isinstance(x, collections.abc.Iterator):
        if needed_tokens is None:
            raise ValueError("An iterator may be endless: give steps_per_epoch (fit reads as much text as one epoch "
                             "needs), or pass a list of strings (list(...) of a finite iterator).")
        return _read(x, needed_tokens, count_tokens)
    raise ValueError(f"{what}. Received: {type(x).__name__}")


def _read(items, needed_tokens, count_tokens):
    """The strings of `items`, all of them, or the first that hold `needed_tokens` tokens."""
    texts, tokens = [], 0
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"Expected every item of the text to be a string. Received an item of type "
                             f"{type(item).__name__}: {item!r:.60}")
        texts.append(item)
        if needed_tokens is not None:
            tokens += count_tokens(item)
            if tokens >= needed_tokens:
                break
    if not texts:
        raise ValueError("The text is empty: the dataset or iterator gave no string.")
    return texts
