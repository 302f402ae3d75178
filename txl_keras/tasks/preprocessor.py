"""`TextPreprocessor`: what both tasks' preprocessors share (KerasHub's `Preprocessor`): a
tokenizer, a segment length, text in and numpy out, and their config."""

import keras

from txl_keras.layers import arguments
from txl_keras.tokenizers import TransformerXLTokenizer


class TextPreprocessor(keras.layers.Layer):
    """The base of the tasks' preprocessors: texts in, numpy batches of segments of
    `sequence_length` tokens out (`call`, a subclass's).

    Args:
        tokenizer: a `TransformerXLTokenizer`.
        sequence_length: int, the segment length.
        **kwargs: `name`.
    """

    def __init__(self, tokenizer, sequence_length, **kwargs):
        kwargs.pop("dtype", None)
        super().__init__(**kwargs)
        self._convert_input_args = False
        self._allow_non_tensor_positional_args = True
        self.tokenizer = tokenizer
        self.sequence_length = arguments.positive_int(type(self).__name__, "sequence_length", sequence_length)
        self.built = True

    def __call__(self, *args, **kwargs):
        # Text in, numpy out: Keras's `Layer.__call__` would convert nothing here, and would
        # wrap an error about the text in lines about the call.
        return self.call(*args, **kwargs)

    def get_config(self):
        return {**{k: v for k, v in super().get_config().items() if k in ("name", "trainable")},
                "tokenizer": keras.saving.serialize_keras_object(self.tokenizer),
                "sequence_length": self.sequence_length}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        tokenizer = config.pop("tokenizer")
        if isinstance(tokenizer, dict):
            tokenizer = keras.saving.deserialize_keras_object(tokenizer)
        return cls(tokenizer=tokenizer if isinstance(tokenizer, TransformerXLTokenizer) else None, **config)
