"""`TransformerXLTokenizer`: text <-> token ids with the original corpora's rules, as a Keras layer."""

import keras
import numpy as np
import tensorflow as tf

from txl_io import files
from tf_records.vocabulary import VOCAB_FILE, Vocabulary


# What Python's `str.splitlines()` breaks lines at and `str.split()` / `str.strip()` treat as
# white space (`str.isspace()`), as RE2 classes: the records are encoded by those functions.
_LINE_BREAKS = "[\n\x0b\x0c\r\x1c\x1d\x1e\\x{85}\\x{2028}\\x{2029}]"
_WHITE_SPACE = ("[\t\n\x0b\x0c\r\x1c-\x1f \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}"
                "\\x{202f}\\x{205f}\\x{3000}]")


def _as_ids(inputs, size):
    """int32 ids of a tensor, an array, a list or a list of lists (ragged), each checked to
    be an integer in `[0, size)` before any cast (eagerly a ValueError; in a graph an
    assertion)."""
    if isinstance(inputs, tf.RaggedTensor) or tf.is_tensor(inputs):
        if not inputs.dtype.is_integer:
            raise ValueError(f"Expected integer token ids. Received dtype {inputs.dtype.name}")
        ids = tf.cast(inputs, tf.int64)
        flat = ids.flat_values if isinstance(ids, tf.RaggedTensor) else ids
        if tf.executing_eagerly():
            _check_range(flat.numpy(), size)
        else:
            in_range = tf.debugging.Assert(tf.reduce_all((flat >= 0) & (flat < size)), [
                f"Token ids must be in [0, {size}); received", tf.reduce_min(flat), tf.reduce_max(flat)])
            with tf.control_dependencies([in_range]):
                ids = tf.identity(ids)
        return tf.cast(ids, tf.int32)
    ragged = isinstance(inputs, (list, tuple)) and inputs and isinstance(inputs[0], (list, tuple, np.ndarray))
    rows = [np.asarray(row) for row in inputs] if ragged else [np.asarray(inputs)]
    for row in rows:
        if row.size and row.dtype.kind not in "iu":
            raise ValueError(f"Expected integer token ids. Received {row.dtype.name if row.dtype.kind != 'O' else 'values'}"
                             f" such as {row.ravel()[0]!r}")
        _check_range(row, size)
    if ragged:
        return tf.ragged.constant([row.tolist() for row in rows], tf.int32)
    return tf.constant(rows[0].astype(np.int32))


def _check_range(ids, size):
    if ids.size and (ids.min() < 0 or ids.max() >= size):
        bad = ids[(ids < 0) | (ids >= size)].ravel()[0]
        raise ValueError(f"Token ids must be in [0, {size}) (the vocabulary's size). Received: {int(bad)}")


def _rewrite(text):
    """`text` as a literal replacement of `tf.strings.regex_replace`."""
    return text.replace("\\", "\\\\")


@keras.saving.register_keras_serializable(package="txl_keras")
class TransformerXLTokenizer(keras.layers.Layer):
    """Text to token ids and back, with the rules of the vocabulary's corpus.

    The ids are exactly those `python -m tf_records` writes for the same text
    (`Vocabulary.encode_text`): at byte level a symbol per UTF-8 byte (newlines dropped
    where the vocabulary has no symbol for them, as enwik8's); at character level a
    symbol per character (lower-cased where the corpus is; text8's spaces are its `_`);
    at word level each line (what `str.splitlines` gives) is stripped, lower-cased where
    the corpus is, split on white space and followed by `<eos>` (WikiText, PTB, your own
    text) or wrapped in `<S> ... <S>` (One Billion Word). A symbol outside the vocabulary
    maps to its unknown symbol (`<unk>`) where it has one and is an error naming the
    symbol where it has none.

    `detokenize` turns ids back into text: bytes decoded as UTF-8, characters joined,
    words joined by spaces with each line's end symbol written as a line break, so that
    `detokenize(tokenize(text)) == text` for text inside the vocabulary written as the
    corpus is (one space between words and a line break after every line at word level).

    It runs TensorFlow string operations: use it eagerly or inside `tf.data.Dataset.map`,
    on any Keras backend. Its outputs are TensorFlow tensors.

    The vocabulary travels as an asset, as KerasHub's tokenizers' do: `get_config` holds
    none, `save_assets` / `load_assets` write and read `vocab.json`, and Keras calls them
    for a `.keras` file (a model holding the tokenizer loads back whole) as presets do.

    Args:
        vocabulary: a `tf_records.vocabulary.Vocabulary`, the path of a `vocab.json`, or
            None to load one later (`load_assets`, as `from_config` and presets do).
        **kwargs: `name`.

    Call arguments:
        inputs: a string, or a list / 1-D tensor of `batch_size` strings.

    Returns:
        int32 `(length,)` for one string, a `tf.RaggedTensor` int32
        `(batch_size, None)` for a batch.

    Example:
    >>> from tf_records.vocabulary import Vocabulary
    >>> tokenizer = TransformerXLTokenizer(Vocabulary(["<eos>", "<unk>", "the", "cat"], add_eos=True,
    ...                                               unk_symbol="<unk>"))
    >>> tokenizer("the cat\\nthe dog").numpy().tolist()
    [2, 3, 0, 2, 1, 0]
    >>> tokenizer.detokenize([2, 3, 0, 2, 3, 0])
    'the cat\\nthe cat\\n'
    """

    def __init__(self, vocabulary=None, **kwargs):
        kwargs.pop("dtype", None)
        super().__init__(dtype="int32", **kwargs)
        self._convert_input_args = False  # strings stay TensorFlow tensors
        self._allow_non_tensor_positional_args = True
        self.vocabulary = None
        self.built = True
        if vocabulary is not None:
            self.set_vocabulary(vocabulary)

    # -- the vocabulary ----------------------------------------------------------------

    def set_vocabulary(self, vocabulary):
        """Use `vocabulary` (a `Vocabulary` or the path of a vocab.json)."""
        if isinstance(vocabulary, str):
            vocabulary = Vocabulary.load(vocabulary)
        if not isinstance(vocabulary, Vocabulary):
            raise ValueError("Expected `vocabulary` to be a tf_records.vocabulary.Vocabulary or the path of a "
                             f"vocab.json. Received: {type(vocabulary).__name__}")
        self.vocabulary = vocabulary
        v = vocabulary
        self.end_token_id = v.index.get("<S>" if v.add_double_eos else "<eos>") if v.level == "word" else None
        missing = -1 if v.unk_id is None else v.unk_id
        with tf.init_scope():
            self._symbols = tf.constant(v.symbols)
            self._table = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(self._symbols, tf.range(len(v), dtype=tf.int32)), missing)
            self._id_of_byte = tf.constant([v.index.get(str(b), missing) for b in range(256)], tf.int32)
            self._display = tf.constant(self._display_strings())

    def _display_strings(self):
        """What each id writes in `detokenize`."""
        v = self.vocabulary
        if v.level == "byte":
            return [bytes([int(s)]) if s.isdigit() and int(s) < 256 else b"?" for s in v.symbols]
        if v.level == "char":
            return [" " if s == v.space_symbol else s for s in v.symbols]
        return ["\n" if i == self.end_token_id else f"{s} " for i, s in enumerate(v.symbols)]

    def _require_vocabulary(self):
        if self.vocabulary is None:
            raise ValueError("This TransformerXLTokenizer has no vocabulary yet; pass `vocabulary=` or call "
                             "`load_assets(folder)` / `set_vocabulary(...)`.")
        return self.vocabulary

    def vocabulary_size(self):
        return len(self._require_vocabulary())

    def get_vocabulary(self):
        return list(self._require_vocabulary().symbols)

    def token_to_id(self, token):
        index = self._require_vocabulary().index
        if token not in index:
            raise ValueError(f"Token {token!r} is not in the vocabulary of {len(index)} symbols.")
        return index[token]

    def id_to_token(self, id):
        symbols = self._require_vocabulary().symbols
        if isinstance(id, bool) or not isinstance(id, (int, np.integer)) or not 0 <= id < len(symbols):
            raise ValueError(f"Expected `id` to be an integer in [0, {len(symbols)}). Received: id={id!r}")
        return symbols[int(id)]

    def single_token_id(self, text, name="token"):
        """The id of a symbol of the vocabulary, or of a text of exactly one token (at byte
        level `"\\n"` is the symbol `"10"`); else a ValueError naming `name`."""
        vocabulary = self._require_vocabulary()
        if text in vocabulary.index:
            return vocabulary.index[text]
        try:
            tokens = self.tokenize_prompt(text).numpy().tolist() if text else []
        except (ValueError, tf.errors.InvalidArgumentError):
            tokens = []
        if len(tokens) != 1 or (vocabulary.unk_id is not None and tokens[0] == vocabulary.unk_id):
            raise ValueError(f"`{name}`: {text!r} is neither a symbol of the vocabulary nor a text of one token; "
                             "give one of its symbols or a text of one token.")
        return tokens[0]

    # -- text -> ids ---------------------------------------------------------------------

    def __call__(self, inputs):
        # Strings in, TensorFlow tensors out: none of Layer.__call__'s conversions (or its
        # wrapping of the errors that name a missing symbol) applies.
        return self.tokenize(inputs)

    def call(self, inputs):
        return self.tokenize(inputs)

    def tokenize(self, inputs):
        """The ids of a string (int32 `(length,)`) or of a batch of strings (ragged)."""
        return self._tokenize(inputs, prompt=False)

    def tokenize_prompt(self, inputs):
        """`tokenize` for text to continue: at word level an unfinished last line (no line
        break at the end) gets no closing end symbol, so the model continues the line."""
        return self._tokenize(inputs, prompt=True)

    def _tokenize(self, inputs, prompt):
        v = self._require_vocabulary()
        texts = tf.convert_to_tensor(inputs, tf.string)
        scalar = texts.shape.rank == 0
        if texts.shape.rank not in (0, 1):
            raise ValueError(f"Expected a string or a 1-D batch of strings. Received shape {texts.shape}")
        batch = texts[None] if scalar else texts
        if v.level == "byte":
            ids, pieces = self._byte_ids(batch), None
        else:
            pieces = self._char_pieces(batch) if v.level == "char" else self._word_pieces(batch, prompt)
            ids = tf.ragged.map_flat_values(self._table.lookup, pieces)
        ids = self._checked(ids, pieces, batch)
        return ids[0] if scalar else ids

    def _byte_ids(self, texts):
        pieces = tf.strings.bytes_split(texts)
        values = tf.cast(tf.reshape(tf.io.decode_raw(pieces.flat_values, tf.uint8), [-1]), tf.int32)
        values = pieces.with_flat_values(values)
        if "10" not in self.vocabulary.index:  # enwik8 has no symbol for newline bytes: they are dropped
            values = tf.ragged.boolean_mask(values, tf.not_equal(values, 10))
        return tf.ragged.map_flat_values(tf.gather, self._id_of_byte, values)

    def _char_pieces(self, texts):
        v = self.vocabulary
        if v.lower_case:
            texts = tf.strings.lower(texts, encoding="utf-8")
        if v.space_symbol is not None:
            texts = tf.strings.regex_replace(texts, " ", _rewrite(v.space_symbol))
        return tf.strings.unicode_split(texts, "UTF-8")

    def _word_pieces(self, texts, prompt):
        v = self.vocabulary
        if v.lower_case:
            texts = tf.strings.lower(texts, encoding="utf-8")
        unified = tf.strings.regex_replace(tf.strings.regex_replace(texts, "\r\n", "\n"), _LINE_BREAKS, "\n")
        # str.splitlines: no line after a final break, and no line at all in ""
        lines = tf.strings.split(tf.strings.regex_replace(unified, "\n$", ""), sep="\n")
        nonempty = tf.strings.length(texts) > 0
        lines = tf.ragged.boolean_mask(lines, tf.logical_and(tf.ones_like(lines, tf.bool), nonempty[:, None]))
        lines = tf.ragged.map_flat_values(tf.strings.regex_replace, lines, _WHITE_SPACE + "+", " ")
        if v.add_double_eos:
            lines = tf.ragged.map_flat_values(lambda line: tf.strings.join(["<S> ", line, " <S>"]), lines)
        elif v.add_eos:
            lines = tf.ragged.map_flat_values(lambda line: tf.strings.join([line, " <eos>"]), lines)
        words = tf.strings.split(lines).merge_dims(1, 2)
        if prompt and (v.add_eos or v.add_double_eos):
            finished = tf.strings.regex_full_match(texts, "(?s).*" + _LINE_BREAKS)
            drop = tf.cast(tf.logical_and(nonempty, tf.logical_not(finished)), tf.int64)
            keep = tf.ragged.range(words.row_lengths()) < (words.row_lengths() - drop)[:, None]
            words = tf.ragged.boolean_mask(words, keep)
        return words

    def _checked(self, ids, pieces, texts):
        """`ids`, refusing symbols outside a vocabulary without an unknown symbol."""
        if self.vocabulary.unk_id is not None:
            return ids
        bad = ids.flat_values < 0
        if tf.executing_eagerly():
            if bool(tf.reduce_any(bad)):
                if pieces is None:
                    missing = sorted(set(tf.boolean_mask(self._raw_bytes(texts), bad).numpy().tolist()))
                    raise ValueError(f"Bytes {missing[:10]} are not in the byte vocabulary, which has no unknown "
                                     "symbol; use a vocabulary built from text with them.")
                symbol = tf.boolean_mask(pieces.flat_values, bad)[0].numpy().decode("utf-8", "replace")
                raise ValueError(f"Symbol {symbol!r} is not in the vocabulary and it has no unknown symbol; "
                                 "use text inside the vocabulary, or a vocabulary with an unknown symbol.")
            return ids
        shown = tf.strings.as_string(ids.flat_values) if pieces is None else pieces.flat_values
        check = tf.debugging.Assert(tf.logical_not(tf.reduce_any(bad)), [
            "A symbol is not in the vocabulary and it has no unknown symbol:", tf.boolean_mask(shown, bad)[:1]])
        with tf.control_dependencies([check]):
            return tf.identity(ids)

    def _raw_bytes(self, texts):
        values = tf.reshape(tf.io.decode_raw(tf.strings.bytes_split(texts).flat_values, tf.uint8), [-1])
        return values if "10" in self.vocabulary.index else tf.boolean_mask(values, tf.not_equal(values, 10))

    # -- ids -> text ---------------------------------------------------------------------

    def detokenize(self, inputs):
        """The text of ids: int `(length,)` gives a string, `(batch_size, length)` (dense or
        ragged) a list of strings (TensorFlow string tensors inside a `tf.function`)."""
        v = self._require_vocabulary()
        ids = _as_ids(inputs, len(v))
        if ids.shape.rank not in (1, 2):
            raise ValueError(f"Expected ids of shape (length,) or (batch_size, length). Received shape {ids.shape}")
        text = tf.strings.reduce_join(tf.gather(self._display, ids), axis=-1)
        if v.level == "byte":
            text = tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="replace")
        elif v.level == "word":
            text = tf.strings.regex_replace(tf.strings.regex_replace(text, " \n", "\n"), " $", "")
            if v.add_double_eos:  # "<S> words <S>" per line: an opening break and doubled ones go
                text = tf.strings.regex_replace(tf.strings.regex_replace(text, "\n\n", "\n"), "^\n", "")
        if not tf.executing_eagerly():
            return text
        if text.shape.rank == 0:
            return text.numpy().decode("utf-8")
        return [t.decode("utf-8") for t in text.numpy().tolist()]

    # -- saving ----------------------------------------------------------------------------

    def save_assets(self, dir_path):
        self._require_vocabulary().save(files.join(dir_path, VOCAB_FILE))

    def load_assets(self, dir_path):
        self.set_vocabulary(Vocabulary.load(files.join(dir_path, VOCAB_FILE)))

    def get_config(self):
        # The vocabulary travels as an asset (`save_assets`), as KerasHub's tokenizers' do.
        return {k: v for k, v in super().get_config().items() if k in ("name", "trainable")}

    def compute_output_spec(self, inputs):
        return keras.KerasTensor((None,), dtype="int32")
