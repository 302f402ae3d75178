"""`TransformerXLClassifier`: long documents classified through the segment memory."""

import json

import keras
import numpy as np
from keras import ops

from txl_io import files
from txl_keras import optimizers
from txl_keras import presets as preset_resolver
from txl_keras.layers import arguments
from txl_keras.models import TransformerXL
from txl_keras.run_folder import RunFolderError, load_weights
from txl_keras.tasks import task_presets
from txl_keras.tasks.classifier_preprocessor import TransformerXLClassifierPreprocessor
from txl_keras.tasks.stream_memory import hold_memory
from txl_keras.tasks.task import Task

FINE_TUNING_LEARNING_RATE = 5e-5  # KerasHub's TextClassifier default


@keras.saving.register_keras_serializable(package="txl_keras")
class TransformerXLClassifier(Task):
    """Classifies documents of any length, read segment by segment through the memory.

    KerasHub's `TextClassifier` shape: a backbone (`TransformerXL`), a preprocessor
    (`TransformerXLClassifierPreprocessor`, with the tokenizer) and a dense head over
    `num_classes` logits; `fit` on `(texts, labels)`, `predict`, `evaluate`,
    `save_to_preset`, `from_preset` (`Task.from_preset`: a classifier saved by
    `save_to_preset`, whole, or a new head on a language model's preset given
    `num_classes=`; `tgt_len=`, `mem_len=`, `dropout=` set either's).

    Where Transformer-XL differs: a KerasHub classifier truncates a document to one
    sequence; here each document is read whole, one segment of `tgt_len` (the
    preprocessor's `sequence_length`) at a time, each segment attending to the memory of
    the segments before it (`mem_len` per layer, so `n_layer * mem_len` tokens back, as in
    the paper), and the document is classified from the last layer's hidden state at its
    last token. Batches are segments of `batch_size` streams of documents (see the
    preprocessor), the memory carried from batch to batch in this task's stateful
    `MemoryCache` (one valid count per row: each document starts with an empty memory).
    As in the paper, no gradient flows into the memory: a step trains on the segments it
    reads. A document starts as a stream does with the backbone's `mem_init`. `loss` is the cross-entropy summed over the documents that end in a batch
    divided by their count; the `accuracy` metric counts documents.

    Args:
        backbone: a `TransformerXL`.
        num_classes: int >= 2.
        preprocessor: a `TransformerXLClassifierPreprocessor`.
        mem_len: None (the backbone's) or int >= 0, the memory each layer keeps.
        dropout: float in [0, 1), on the pooled hidden state.
        activation: None (logits) or the head's activation.
        **kwargs: `name`.

    Call arguments:
        inputs: `{"token_ids": int (batch_size, T), "segment_starts": bool (batch_size,),
            "end_index": int (batch_size,)}`, one batch of the preprocessor's layout.
        training: bool.

    Returns:
        `(batch_size, num_classes)`, the logits of the documents ending in this segment
        (rows whose `end_index` is -1 hold no document's).

    Example:
        >>> clf = TransformerXLClassifier.from_preset("runs/quickstart", num_classes=2)  # doctest: +SKIP
        >>> clf.fit(["a long text ...", "another ..."], [0, 1], batch_size=2, epochs=3)  # doctest: +SKIP
        >>> clf.predict(["a third text ..."])  # doctest: +SKIP
    """

    def __init__(self, backbone, num_classes, preprocessor, mem_len=None, dropout=0.0, activation=None, **kwargs):
        super().__init__(**kwargs)
        layer = type(self).__name__
        if not isinstance(backbone, TransformerXL):
            raise ValueError(f"{layer}: expected `backbone` to be a TransformerXL. Received: {type(backbone).__name__}")
        self.num_classes = arguments.int_at_least(layer, "num_classes", num_classes, 2)
        self.mem_len = backbone.config.mem_len if mem_len is None else arguments.non_negative_int(layer, "mem_len",
                                                                                                    mem_len)
        self.dropout = arguments.rate(layer, "dropout", dropout)
        vocabulary = preprocessor.tokenizer.vocabulary
        if vocabulary is not None and len(vocabulary) != backbone.config.n_token:
            raise ValueError(f"The tokenizer has {len(vocabulary)} symbols but the backbone has n_token="
                             f"{backbone.config.n_token}; pair the backbone with the vocabulary it was trained on.")
        self.backbone = backbone
        self.preprocessor = preprocessor
        self.activation = keras.activations.get(activation)
        self.output_dropout = keras.layers.Dropout(self.dropout, name="output_dropout")
        self.output_dense = keras.layers.Dense(num_classes, activation=self.activation, name="logits",
                                               dtype=backbone.dtype_policy)
        self.output_dense.build((None, backbone.config.d_model))
        self.built = True
        self.document_memory = None  # a stateful MemoryCache of the batch size, made by fit/evaluate/predict
        self._documents_in_batch = None  # how many documents end in the batch of the step being traced

    @property
    def tgt_len(self):
        return self.preprocessor.sequence_length

    # -- presets ---------------------------------------------------------------------------

    @classmethod
    def _check_new(cls, num_classes=None, **kwargs):
        if num_classes is None:
            raise ValueError("The preset is a language model, not a classifier: give num_classes, the number of "
                             "classes of the new head.")

    @classmethod
    def _on_language_model(cls, model, tokenizer, num_classes=None, tgt_len=None, mem_len=None, dropout=0.0):
        """A new head of `num_classes` on a trained language model's backbone, reading
        segments of `tgt_len` (default the model's) with a memory of `mem_len`
        (`from_preset(preset, num_classes=..., tgt_len=..., mem_len=..., dropout=...)`)."""
        sequence_length = model.config.tgt_len if tgt_len is None else tgt_len
        preprocessor = TransformerXLClassifierPreprocessor(tokenizer, sequence_length)
        return cls(model.backbone, num_classes, preprocessor, mem_len=mem_len, dropout=dropout)

    @classmethod
    def _load_saved(cls, found, dtype, num_classes=None, tgt_len=None, mem_len=None, dropout=None):
        """A classifier saved by `save_to_preset`, whole (`num_classes`, if given, must match);
        `tgt_len`, `mem_len` and `dropout`, where given, replace the saved ones (a longer
        memory to classify with, say)."""
        folder = found.folder
        path = files.join(folder, "config.json")
        try:
            serialized = json.loads(files.read_text(path))
            config = dict(serialized["config"])
            config.update({k: v for k, v in (("mem_len", mem_len), ("dropout", dropout)) if v is not None})
            if tgt_len is not None:
                preprocessor = config["preprocessor"]
                config["preprocessor"] = {**preprocessor,
                                          "config": {**preprocessor["config"], "sequence_length": tgt_len}}
        except (ValueError, KeyError, TypeError) as e:
            raise RunFolderError(f"{path} is damaged ({e}); save the classifier again.") from None
        if num_classes is not None and num_classes != config.get("num_classes"):
            raise ValueError(f"{folder} is a classifier of {config.get('num_classes')} classes; received "
                             f"num_classes={num_classes!r}. Drop num_classes to load it, or load its backbone "
                             f"into a new head: TransformerXLClassifier(saved.backbone, {num_classes!r}, "
                             "saved.preprocessor).")
        if dtype is not None:
            config["backbone"]["config"]["dtype"] = dtype
        classifier = keras.saving.deserialize_keras_object({**serialized, "config": config})
        classifier.tokenizer.load_assets(files.join(folder, preset_resolver.TOKENIZER_ASSETS))
        task_presets.check_vocabulary(folder, classifier.tokenizer.vocabulary)
        if len(classifier.tokenizer.vocabulary) != classifier.backbone.config.n_token:
            raise RunFolderError(f"The vocabulary in {folder} has {len(classifier.tokenizer.vocabulary)} symbols but "
                                 f"its backbone has n_token={classifier.backbone.config.n_token}; save it again.")
        load_weights(classifier, files.join(folder, preset_resolver.WEIGHTS))
        return classifier

    def save_to_preset(self, preset_dir):
        """A preset folder (`config.json`: this classifier serialized, `model.weights.h5`,
        `tokenizer.json`, `preprocessor.json`, the vocabulary in `assets/tokenizer/`,
        `metadata.json`) that `from_preset` loads back whole; written as
        `TransformerXLCausalLM.save_to_preset` writes its own."""
        return task_presets.write(preset_dir, self, self, self.backbone.config)

    # -- the computation ------------------------------------------------------------------

    def call(self, inputs, training=False):
        tokens = inputs["token_ids"]
        if self.document_memory is None:  # a call outside fit/evaluate/predict: one segment, no memory
            hidden = self.backbone(tokens, training=training, mem_len=self.mem_len)["hidden"]
        else:
            mems, valid = self.document_memory.read()
            starts = ops.cast(inputs["segment_starts"], "bool")  # a new document: a fresh memory in its row
            if self.document_memory.zero_init:  # mem_init "zeros": mem_len zero vectors that are attended
                mems = [ops.where(starts[:, None, None], ops.zeros_like(m), m) for m in mems]
                valid = ops.where(starts, self.mem_len, valid)
            else:
                valid = ops.where(starts, 0, valid)
            out = self.backbone(tokens, mems=mems, memory_valid=valid, training=training, mem_len=self.mem_len)
            self.document_memory.write(out["mems"], out["memory_valid"])
            hidden = out["hidden"]
        end = ops.cast(inputs["end_index"], "int32")
        at_end = ops.one_hot(ops.clip(end, 0, ops.shape(tokens)[1] - 1), ops.shape(tokens)[1], dtype=hidden.dtype)
        pooled = ops.einsum("btd,bt->bd", hidden, at_end)  # the hidden state at each document's last token
        return self.output_dense(self.output_dropout(pooled, training=training))

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """Cross-entropy over the documents that end in this batch (sample_weight 1)."""
        losses = keras.losses.sparse_categorical_crossentropy(
            y, ops.cast(y_pred, "float32"), from_logits=self.activation in (None, keras.activations.linear))
        weight = ops.ones_like(losses) if sample_weight is None else ops.cast(sample_weight, "float32")
        documents = ops.sum(weight)
        self._documents_in_batch = documents  # the loss tracker's weight (_DocumentMean)
        loss = ops.sum(losses * weight) / ops.maximum(documents, 1.0)
        for extra in self.losses:
            loss = loss + ops.cast(extra, "float32")
        return loss

    def compile(self, optimizer="auto", loss="auto", *, weighted_metrics="auto", **kwargs):
        """Keras's `compile`; "auto" is the recipe's Adam (`txl_keras.optimizers.adam`) at
        5e-5 (KerasHub's fine-tuning rate), unclipped, and an accuracy over documents.
        `loss` must stay "auto" (cross-entropy on the logits)."""
        if loss not in ("auto", None):
            raise ValueError("TransformerXLClassifier computes its own loss (cross-entropy over the documents "
                             f"ending in a batch); leave `loss` as 'auto'. Received: loss={loss!r}")
        if optimizer == "auto":
            optimizer = optimizers.adam(FINE_TUNING_LEARNING_RATE, clip_norm=None)
        if weighted_metrics == "auto":
            weighted_metrics = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
        super().compile(optimizer=optimizer, weighted_metrics=weighted_metrics, **kwargs)
        self._loss_tracker = _DocumentMean(lambda: self._documents_in_batch)

    # -- documents in ---------------------------------------------------------------------

    def fit(self, x=None, y=None, batch_size=None, epochs=1, validation_data=None, shuffle=True, seed=None,
            **kwargs):
        """Train on documents `x` (a list of strings, an array of strings or a
        `tf.data.Dataset` of `(text, label)`) with labels `y` in `[0, num_classes)`;
        `batch_size` streams (default 8). With `shuffle`, each epoch reads the documents
        in a new order (drawn from `seed`). `validation_data`: `(texts, labels)`."""
        texts, labels = self._documents(x, y)
        batch_size = arguments.count("batch_size", 8 if batch_size is None else batch_size, 1)
        epochs = arguments.count("epochs", epochs, 0)
        if "steps_per_epoch" in kwargs:
            raise ValueError("fit reads every document once per epoch; drop steps_per_epoch.")
        documents = self.preprocessor.document_ids(texts)
        layouts = []
        rng = np.random.default_rng(seed)
        for _ in range(max(epochs, 1)):  # each epoch's order, laid out before anything runs
            order = rng.permutation(len(documents)) if shuffle else np.arange(len(documents))
            layouts.append(self.preprocessor.layout([documents[i] for i in order], batch_size, labels[order]))
        steps = max(len(layout["token_ids"]) for layout in layouts)
        data = _epochs_dataset([_padded(layout, steps) for layout in layouts], with_labels=True)
        if validation_data is not None:
            val_texts, val_labels = self._documents(*validation_data)
            validation_data = _dataset(self.preprocessor(val_texts, batch_size, val_labels), with_labels=True)
        if not self.compiled:
            self.compile()
        self._use_document_memory(batch_size)
        return super().fit(data, epochs=epochs, steps_per_epoch=steps, validation_data=validation_data,
                           shuffle=False, **kwargs)

    def evaluate(self, x=None, y=None, batch_size=None, **kwargs):
        """The loss and accuracy of documents `x` with labels `y` (as `fit` takes them)."""
        if kwargs.get("_use_cached_eval_dataset"):  # fit's validation: the batches are made already
            return super().evaluate(x, y, batch_size=batch_size, **kwargs)
        texts, labels = self._documents(x, y)
        batch_size = arguments.count("batch_size", 8 if batch_size is None else batch_size, 1)
        data = _dataset(self.preprocessor(texts, batch_size, labels), with_labels=True)
        if not self.compiled:
            self.compile()
        self._use_document_memory(batch_size)
        return super().evaluate(data, **kwargs)

    def predict(self, x, batch_size=None, **kwargs):
        """The logits `(len(x), num_classes)` of documents `x` (strings), in their order."""
        texts, _ = self._documents(x, None)
        batch_size = arguments.count("batch_size", 8 if batch_size is None else batch_size, 1)
        layout = self.preprocessor(texts, batch_size)
        self._use_document_memory(batch_size)
        logits = super().predict(_dataset(layout, with_labels=False), **kwargs)
        document = layout["document"].reshape(-1)
        result = np.zeros((len(texts), self.num_classes), logits.dtype)
        result[document[document >= 0]] = logits.reshape(-1, self.num_classes)[document >= 0]
        return result

    def _documents(self, x, y):
        """`(texts, labels or None)` from lists, arrays or a dataset of `(text, label)`."""
        import tensorflow as tf

        if isinstance(x, tf.data.Dataset):
            if y is not None:
                raise ValueError("A dataset brings its labels: give it as x alone, of (text, label) pairs.")
            pairs = [(t, l) for batch in x.as_numpy_iterator() for t, l in zip(*[np.atleast_1d(v) for v in batch])]
            x, y = [t.decode("utf-8") if isinstance(t, bytes) else t for t, _ in pairs], [l for _, l in pairs]
        if isinstance(x, str):
            x = [x]
        if isinstance(x, np.ndarray):
            x = x.tolist()
        if not isinstance(x, (list, tuple)):
            raise ValueError(f"Expected the documents as a list of strings. Received: {type(x).__name__}")
        if y is None:
            return list(x), None
        labels = np.asarray(y)
        if labels.ndim != 1 or len(labels) != len(x):
            raise ValueError(f"Expected one label per document: {len(x)} documents, labels of shape {labels.shape}.")
        if labels.size and (not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0
                            or labels.max() >= self.num_classes):
            raise ValueError(f"Expected integer labels in [0, {self.num_classes}) (num_classes={self.num_classes}). "
                             f"Received labels {sorted(set(labels.tolist()))[:10]}.")
        return list(x), labels.astype(np.int32)

    def _use_document_memory(self, batch_size):
        """Hold the memory of `batch_size` streams across batches, one valid count per row
        (`hold_memory`)."""
        hold_memory(self, "document_memory", self.backbone.config, batch_size, mem_len=self.mem_len, per_row=True)

    def get_build_config(self):
        return None  # built on construction: every weight's shape comes from the backbone's config

    def get_compile_config(self):
        return None  # compile() again after loading (its defaults are the fine-tuning recipe)

    def get_config(self):
        return {
            **{k: v for k, v in super().get_config().items() if k in ("name", "trainable")},
            "backbone": keras.saving.serialize_keras_object(self.backbone),
            "num_classes": self.num_classes,
            "preprocessor": keras.saving.serialize_keras_object(self.preprocessor),
            "mem_len": self.mem_len,
            "dropout": self.dropout,
            "activation": keras.activations.serialize(self.activation),
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        for name in ("backbone", "preprocessor"):
            if isinstance(config[name], dict):
                config[name] = keras.saving.deserialize_keras_object(config[name])
        return cls(**config)


class _DocumentMean(keras.metrics.Mean):
    """The `loss` tracker: each batch's loss weighted by the documents that end in it (Keras
    weighs a batch by its rows), so the loss of `fit` and `evaluate` is the documents' mean."""

    def __init__(self, documents_in_batch):
        super().__init__(name="loss")
        self._documents_in_batch = documents_in_batch

    def update_state(self, values, sample_weight=None):
        return super().update_state(values, sample_weight=self._documents_in_batch())


def _inputs(layout):
    return {k: layout[k] for k in ("token_ids", "segment_starts", "end_index")}


def _dataset(layout, with_labels):
    import tensorflow as tf

    if with_labels:
        return tf.data.Dataset.from_tensor_slices((_inputs(layout), layout["labels"], layout["sample_weight"]))
    return tf.data.Dataset.from_tensor_slices(_inputs(layout))


def _padded(layout, steps):
    """A layout grown to `steps` batches with idle segments (memory emptied, nothing classified)."""
    extra = steps - len(layout["token_ids"])
    if extra == 0:
        return layout
    fill = {"token_ids": 0, "segment_starts": True, "end_index": -1, "document": -1, "labels": 0,
            "sample_weight": 0.0}
    return {k: np.concatenate([v, np.full((extra,) + v.shape[1:], fill[k], v.dtype)]) for k, v in layout.items()}


def _epochs_dataset(layouts, with_labels):
    """The epochs' layouts one after another (fit reads `steps` batches per epoch)."""
    data = _dataset(layouts[0], with_labels)
    for layout in layouts[1:]:
        data = data.concatenate(_dataset(layout, with_labels))
    return data
