"""`TransformerXLClassifierPreprocessor`: documents of any length laid out as streams of segments."""

import keras
import numpy as np

from txl_keras.layers import arguments
from txl_keras.tasks.preprocessor import TextPreprocessor


@keras.saving.register_keras_serializable(package="txl_keras")
class TransformerXLClassifierPreprocessor(TextPreprocessor):
    """Lays documents out for `TransformerXLClassifier`, which reads each one segment by
    segment through the memory, as evaluation reads a corpus.

    Each document is tokenized on its own and padded at its end to whole segments of
    `sequence_length` (`S_d` of them; padding after the last token changes nothing the
    model computes there: attention is causal). The documents go, in order, to the
    `batch_size` streams, each to the stream that is shortest so far; a stream reads its
    documents one after another, and the first segment of each starts with an empty memory
    for that row. A batch is one segment of every stream, so all batches have one shape,
    and batch `s + 1` continues every stream of batch `s`. Streams that have run out read
    idle segments (memory emptied, nothing classified).

    Args:
        tokenizer: a `TransformerXLTokenizer`.
        sequence_length: int, the segment length.
        **kwargs: `name`.

    Call arguments:
        texts: a string or a list of strings (the documents).
        batch_size: int, the number of streams.
        labels: optional sequence of `len(texts)` integer class ids.

    Returns:
        A dict of numpy arrays, `steps = max over streams of their segments`:
        `"token_ids"` int32 `(steps, batch_size, sequence_length)`; `"segment_starts"`
        bool `(steps, batch_size)`, a document's first segment (or an idle one);
        `"end_index"` int32 `(steps, batch_size)`, where a document's last token lies in
        the segment that holds it, else -1; `"document"` int32 `(steps, batch_size)`, the
        index of the document ending there, else -1; with `labels`, `"labels"` int32 and
        `"sample_weight"` float32 `(steps, batch_size)` (1 where a document ends).
    """

    def document_ids(self, texts):
        """int32 ids of each document; an empty one is an error naming it."""
        if isinstance(texts, str):
            texts = [texts]
        if isinstance(texts, np.ndarray) and texts.ndim == 1:
            texts = texts.tolist()
        if not isinstance(texts, (list, tuple)) or not texts:
            raise ValueError("Expected the documents as a non-empty list of strings. Received: "
                             f"{type(texts).__name__ if not isinstance(texts, (list, tuple)) else 'an empty list'}")
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise ValueError(f"Document {i} is a {type(text).__name__}, not a string (decode bytes first).")
        ids = [np.asarray(row, np.int32) for row in self.tokenizer(list(texts)).to_list()]
        for i, row in enumerate(ids):
            if len(row) == 0:
                raise ValueError(f"Document {i} ({texts[i][:40]!r}) encodes to no token: there is nothing to "
                                 "classify; drop it or give it text.")
        return ids

    def call(self, texts, batch_size, labels=None):
        batch_size = arguments.positive_int(type(self).__name__, "batch_size", batch_size)
        documents = self.document_ids(texts)
        if labels is not None:
            labels = np.asarray(labels)
            if labels.shape != (len(documents),) or not np.issubdtype(labels.dtype, np.integer):
                raise ValueError(f"Expected one integer label per document ({len(documents)}). Received labels of "
                                 f"shape {labels.shape} and dtype {labels.dtype}.")
        return self.layout(documents, batch_size, labels)

    def layout(self, documents, batch_size, labels=None):
        """`call`'s arrays for documents already tokenized (lists of int32 ids)."""
        length = self.sequence_length
        segments = [-(-len(ids) // length) for ids in documents]
        streams, filled = [[] for _ in range(batch_size)], [0] * batch_size
        for d, count in enumerate(segments):
            row = int(np.argmin(filled))
            streams[row].append(d)
            filled[row] += count
        steps = max(filled)
        out = {"token_ids": np.zeros((steps, batch_size, length), np.int32),
               "segment_starts": np.ones((steps, batch_size), bool),
               "end_index": np.full((steps, batch_size), -1, np.int32),
               "document": np.full((steps, batch_size), -1, np.int32)}
        for row, docs in enumerate(streams):
            step = 0
            for d in docs:
                ids, count = documents[d], segments[d]
                padded = np.zeros(count * length, np.int32)
                padded[: len(ids)] = ids
                out["token_ids"][step: step + count, row] = padded.reshape(count, length)
                out["segment_starts"][step + 1: step + count, row] = False
                last = step + count - 1
                out["end_index"][last, row] = len(ids) - 1 - (count - 1) * length
                out["document"][last, row] = d
                step += count
        if labels is not None:
            ending = out["document"] >= 0
            out["labels"] = np.where(ending, labels[np.maximum(out["document"], 0)], 0).astype(np.int32)
            out["sample_weight"] = ending.astype(np.float32)
        return out
