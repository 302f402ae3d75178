"""Every docstring `Example:` of the layers and models runs and prints what it says."""

import doctest
import importlib

import keras
import numpy as np
import pytest
from keras import ops

import txl_keras

MODULES = [
    "txl_keras.layers.positional_embedding", "txl_keras.layers.relative_attention",
    "txl_keras.layers.positionwise_feed_forward", "txl_keras.layers.transformer_xl_block",
    "txl_keras.layers.memory_cache", "txl_keras.layers.layer_norm", "txl_keras.layers.inference_cache",
    "txl_keras.layers.adaptive_embedding", "txl_keras.layers.adaptive_softmax", "txl_keras.models.transformer_xl",
    "txl_keras.models.transformer_xl_lm", "txl_keras.kernels", "txl_keras.tokenizers.transformer_xl_tokenizer",
]


@pytest.mark.parametrize("name", MODULES)
def test_examples_run(name):
    module = importlib.import_module(name)
    globs = {**vars(module), "np": np, "keras": keras, "ops": ops,
             "TransformerXLConfig": txl_keras.TransformerXLConfig}
    result = doctest.testmod(module, globs=globs, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
