"""Text <-> token ids as Keras layers."""

from txl_keras.tokenizers.transformer_xl_tokenizer import TransformerXLTokenizer

__all__ = ["TransformerXLTokenizer"]
