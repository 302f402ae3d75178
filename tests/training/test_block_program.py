"""`SharedBlockProgram`: every block runs through one compiled program with its own
weights, and gives what the backbone computes by itself."""

import numpy as np
import pytest
import tensorflow as tf

from txl_keras import TransformerXLConfig
from txl_keras.layers import CacheStore
from txl_keras.models.transformer_xl import TransformerXL
from txl_keras.training.block_program import SharedBlockProgram


def randomize(model, rng):
    for variable in model.weights:
        variable.assign(rng.normal(scale=0.3, size=variable.shape).astype("float32"))


@pytest.mark.parametrize("changes,group", [({}, 1), ({"untie_r": True, "pre_lnorm": True, "clamp_len": 5}, 2)])
def test_one_program_for_all_groups_of_blocks_equals_the_plain_backbone(changes, group):
    config = TransformerXLConfig.from_preset("tiny", n_layer=2 * group, **changes)
    model = TransformerXL(config)
    rng = np.random.default_rng(0)
    randomize(model, rng)
    batch, tgt_len, mem_len = 2, 4, 6
    store = CacheStore(mem_len, config.n_layer, 2 * config.n_head, config.d_head, batch, tgt_len)
    n, width = config.n_layer, 2 * config.n_head * config.d_head
    # A ring that has wrapped: its oldest row is not in slot 0.
    store.reset([rng.normal(size=(batch, mem_len, width)).astype("float32") for _ in range(n)], 5)
    store.append([rng.normal(size=(batch, tgt_len, width)).astype("float32") for _ in range(n)], 6)
    assert int(store.offset.numpy()) != 0
    tokens = rng.integers(0, config.n_token, (batch, tgt_len)).astype("int32")
    cache = store.read()
    settings = config.with_memory(mem_len)
    # Reference: the backbone by itself.
    want, want_rows, _ = model.forward_with_cache(tokens, cache, mem_len=mem_len)
    program = SharedBlockProgram(model, group=group)

    @tf.function
    def grouped(x):
        hidden, layer_args = model.cached_inputs(x, cache, settings)
        return program(hidden, cache, layer_args)

    got, got_rows = grouped(tokens)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    for a, b in zip(got_rows, want_rows):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5)
    assert program._program.experimental_get_tracing_count() == 1  # one program, two groups


def test_the_default_group_divides_the_blocks():
    groups = {n: SharedBlockProgram(TransformerXL(TransformerXLConfig.from_preset("tiny", n_layer=n))).group
              for n in (1, 3, 6, 7, 16)}
    assert groups == {1: 1, 3: 3, 6: 2, 7: 1, 16: 2}
    with pytest.raises(ValueError, match="group=2 does not divide the 3 blocks"):
        SharedBlockProgram(TransformerXL(TransformerXLConfig.from_preset("tiny", n_layer=3)), group=2)
