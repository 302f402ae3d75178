"""Layers build only the weights their calls use, and a constructor argument outside its
domain is an error naming the layer and the argument."""

import warnings

import keras
import numpy as np
import pytest

from txl_keras.layers import (AdaptiveEmbedding, AdaptiveSoftmax, MemoryCache, PositionalEmbedding,
                              PositionwiseFeedForward, RelativeAttention, ReplicaDropout, TransformerXLBlock)
from txl_keras.layers.inference_cache import CacheStore

CASES = [
    (lambda: PositionwiseFeedForward(128, 512), "PositionwiseFeedForward", "dropout", "512"),
    (lambda: PositionwiseFeedForward(0), "PositionwiseFeedForward", "inner_dim", "0"),
    (lambda: PositionwiseFeedForward(16, pre_lnorm="yes"), "PositionwiseFeedForward", "pre_lnorm", "'yes'"),
    (lambda: RelativeAttention(2, 4.0), "RelativeAttention", "head_dim", "4.0"),
    (lambda: RelativeAttention(0, 4), "RelativeAttention", "num_heads", "0"),
    (lambda: RelativeAttention(2, 4, attention_dropout=1.0), "RelativeAttention", "attention_dropout", "1.0"),
    (lambda: RelativeAttention(2, 4, layer_norm_epsilon=0), "RelativeAttention", "layer_norm_epsilon", "0"),
    (lambda: RelativeAttention(2, 4, position_projection=1), "RelativeAttention", "position_projection", "1"),
    (lambda: TransformerXLBlock(2, 4, 16, dropout=-0.1), "TransformerXLBlock", "dropout", "-0.1"),
    (lambda: TransformerXLBlock(2, 4, True), "TransformerXLBlock", "inner_dim", "True"),
    (lambda: ReplicaDropout(1.5), "ReplicaDropout", "rate", "1.5"),
    (lambda: PositionalEmbedding(8, clamp_len=-2), "PositionalEmbedding", "clamp_len", "-2"),
    (lambda: PositionalEmbedding(7), "PositionalEmbedding", "hidden_dim", "7"),
    (lambda: MemoryCache(4, num_layers=0, hidden_dim=8), "MemoryCache", "num_layers", "0"),
    (lambda: MemoryCache(-1, num_layers=2, hidden_dim=8), "MemoryCache", "mem_len", "-1"),
    (lambda: MemoryCache(4, num_layers=2, hidden_dim=8, stateful=True), "MemoryCache", "batch_size", "None"),
    (lambda: CacheStore(4, 2, 1, 8, batch_size=2, segment_length=0), "CacheStore", "segment_length", "0"),
    (lambda: AdaptiveEmbedding(100, 16, 0), "AdaptiveEmbedding", "hidden_dim", "0"),
    (lambda: AdaptiveSoftmax(100, -16, 16), "AdaptiveSoftmax", "embedding_dim", "-16"),
]


@pytest.mark.parametrize("make,layer,name,value", CASES, ids=[f"{c[1]}-{c[2]}" for c in CASES])
def test_a_wrong_argument_is_named(make, layer, name, value):
    with pytest.raises(ValueError, match=rf"^{layer}: expected `{name}` to be .*\. Received: {name}={value}$"):
        make()


def _weight_names(layer):
    return sorted(w.path.split("/")[-1] for w in layer.weights)


def test_attention_without_positions_has_no_position_projection_and_trains_every_weight():
    attention = RelativeAttention(num_heads=2, head_dim=4)
    inputs = keras.Input((5, 8))
    model = keras.Model(inputs, attention(inputs))
    assert _weight_names(attention) == ["beta", "gamma", "o_kernel", "qkv_kernel"]
    model.compile(optimizer="adam", loss="mse")
    x = np.random.default_rng(0).normal(size=(4, 5, 8)).astype("float32")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, x, epochs=1, verbose=0)
    assert not [w for w in caught if "Gradients do not exist" in str(w.message)]


def test_the_first_call_decides_the_projection_and_the_config_keeps_it():
    h = keras.random.normal((2, 3, 8))
    projected = RelativeAttention(num_heads=2, head_dim=4)
    projected(h, position_encoding=keras.random.normal((3, 8)))  # a sinusoid encoding (K, hidden_dim)
    assert "r_kernel" in _weight_names(projected)
    assert RelativeAttention.from_config(projected.get_config()).position_projection is True
    learned = RelativeAttention(num_heads=2, head_dim=4)
    learned(h, position_encoding=keras.random.normal((3, 2, 4)))  # learned keys (K, H, Dh)
    assert "r_kernel" not in _weight_names(learned) and learned.get_config()["position_projection"] is False
    with pytest.raises(ValueError, match=r"built without a position projection .* received shape \(3, 8\)"):
        learned(h, position_encoding=keras.random.normal((3, 8)))
    block = TransformerXLBlock(num_heads=2, head_dim=4, inner_dim=16)
    block(h)
    assert "r_kernel" not in _weight_names(block) and block.get_config()["position_projection"] is False
