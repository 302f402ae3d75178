"""`TransformerXLCausalLMPreprocessor`: text -> contiguous streams of segments, and back."""

import keras
import numpy as np
import tensorflow as tf

from tf_records.records import chunk_starts, make_streams
from txl_keras.layers import arguments
from txl_keras.tasks.preprocessor import TextPreprocessor


@keras.saving.register_keras_serializable(package="txl_keras")
class TransformerXLCausalLMPreprocessor(TextPreprocessor):
    """Turns texts into what `TransformerXLCausalLM.fit` trains on, and prompts into ids.

    Unlike a KerasHub preprocessor, which packs each example on its own, Transformer-XL's
    memory needs streams: `call(texts, batch_size)` reads the texts as one text in order
    (at byte and character level a text not ending in a line break is followed by one,
    as `python -m tf_records` reads files), tokenizes it into `N` ids and lays them out as
    the trainers' evaluation records do: `batch_size` contiguous streams that share their
    boundary token, cut into segments of `sequence_length`, so that batch `s + 1`
    continues every stream of batch `s` and one pass scores every token but the first
    exactly once, in `ceil((N - 1) / (batch_size * sequence_length))` batches. The last
    segment is padded with targets of weight 0.

    Args:
        tokenizer: a `TransformerXLTokenizer`.
        sequence_length: int, the segment length (the model's `tgt_len`).
        **kwargs: `name`.

    Call arguments:
        texts: a string, a list of strings or a 1-D string tensor.
        batch_size: int, the number of streams.

    Returns:
        `(x, y, sample_weight)`: `x = {"token_ids", "target_ids"}` and `y` int32
        `(num_batches, batch_size, sequence_length)` (`y` equals `target_ids`),
        `sample_weight` float32 of the same shape, 0 on padding.
    """

    def text_ids(self, texts):
        """int32 numpy ids of the texts read as one text (see the class docstring)."""
        if isinstance(texts, str):
            texts = [texts]
        if isinstance(texts, np.ndarray):
            texts = texts.tolist() if texts.ndim == 1 else None
        if not isinstance(texts, (list, tuple)) or not all(isinstance(t, str) for t in texts):
            raise ValueError("Expected a string or a list of strings (bytes decoded first). Received: "
                             f"{type(texts).__name__}")
        if self.tokenizer.vocabulary.level != "word":
            texts = [t if t.endswith("\n") or not t else t + "\n" for t in texts]
        if not texts:
            return np.zeros((0,), np.int32)
        return self.tokenizer(texts).flat_values.numpy().astype(np.int32)

    def call(self, texts, batch_size):
        batch_size = arguments.positive_int(type(self).__name__, "batch_size", batch_size)
        ids = self.text_ids(texts)
        length = self.sequence_length
        if len(ids) - 1 < batch_size * length:
            raise ValueError(
                f"The text has {len(ids)} tokens: too few to fill one batch of {batch_size} streams of "
                f"{length} tokens (at least {batch_size * length + 1} are needed); pass more text or a smaller "
                "batch_size.")
        streams = make_streams(ids, batch_size, evaluation=True)  # (batch_size, per_stream + 1), padded with -1
        starts = chunk_starts(streams.shape[1], length, evaluation=True)
        padded = np.full((batch_size, starts[-1] + length + 1), -1, np.int32)
        padded[:, : streams.shape[1]] = streams
        blocks = np.stack([padded[:, t: t + length + 1] for t in starts])  # (steps, batch_size, length + 1)
        weights = (blocks[..., 1:] >= 0).astype(np.float32)
        blocks = np.maximum(blocks, 0)  # padding reads a valid id; its targets weigh 0
        targets = blocks[..., 1:]
        return {"token_ids": blocks[..., :-1], "target_ids": targets}, targets, weights

    def stream_dataset(self, texts, batch_size):
        """`call`'s batches as a `tf.data.Dataset`, in order (never shuffle it)."""
        return tf.data.Dataset.from_tensor_slices(self(texts, batch_size))

    def generate_preprocess(self, prompts):
        """Ragged int32 ids of a batch of prompts (`TransformerXLTokenizer.tokenize_prompt`)."""
        return self.tokenizer.tokenize_prompt(prompts)

    def generate_postprocess(self, ids):
        """The text of ids (`TransformerXLTokenizer.detokenize`)."""
        return self.tokenizer.detokenize(ids)
