"""`SharedBlockProgram`: every block runs through one compiled program with its own
weights, and gives what the backbone computes by itself."""

import numpy as np
import pytest
import tensorflow as tf

from txl_keras import TransformerXLConfig
from txl_keras.layers import KeyValueMemory
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
    memory = KeyValueMemory(mem_len, config.n_layer, 2 * config.n_head * config.d_head, batch, tgt_len,
                            num_heads=config.n_head)
    n = config.n_layer
    # A ring that has wrapped: its oldest row is not in slot 0.
    memory.reset([rng.normal(size=(batch, mem_len, memory.width)).astype("float32") for _ in range(n)], 5)
    memory.append([rng.normal(size=(batch, tgt_len, memory.width)).astype("float32") for _ in range(n)], 6)
    assert int(memory.offset.numpy()) != 0
    tokens = rng.integers(0, config.n_token, (batch, tgt_len)).astype("int32")
    kvs, valid = memory.read()
    # Reference: the backbone by itself, the memory in time order.
    want = model(tokens, memory_kv=kvs, memory_valid=valid, mem_len=mem_len)
    program = SharedBlockProgram(model, group=group)
    rings, offset, valid = memory.read_rings()
    got = tf.function(lambda x: model(x, memory_kv=rings, memory_kv_offset=offset, memory_valid=valid,
                                      mem_len=mem_len, block_program=program))(tokens)
    np.testing.assert_allclose(got["hidden"].numpy(), want["hidden"].numpy(), rtol=1e-5, atol=1e-5)
    for a, b in zip(got["segment_kv"], want["segment_kv"]):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5)
    assert int(got["memory_valid"]) == int(want["memory_valid"]) == mem_len
    assert "memory_kv" not in got  # the rings' owner stores segment_kv
    assert program._program.experimental_get_tracing_count() == 1  # one program, two groups


def test_the_default_group_divides_the_blocks():
    groups = {n: SharedBlockProgram(TransformerXL(TransformerXLConfig.from_preset("tiny", n_layer=n))).group
              for n in (1, 3, 6, 7, 16)}
    assert groups == {1: 1, 3: 3, 6: 2, 7: 1, 16: 2}
    with pytest.raises(ValueError, match="group=2 does not divide the 3 blocks"):
        SharedBlockProgram(TransformerXL(TransformerXLConfig.from_preset("tiny", n_layer=3)), group=2)


def test_rings_shorter_than_the_memory_are_refused():
    config = TransformerXLConfig.from_preset("tiny")
    model = TransformerXL(config)
    rings = [np.zeros((2 * config.n_head, 1, 4, config.d_head), "float32")] * config.n_layer
    with pytest.raises(ValueError, match="rings hold 4 rows, fewer than mem_len=6"):
        model(np.zeros((1, 2), "int32"), memory_kv=rings, memory_kv_offset=0, mem_len=6)
    time_major = [np.zeros((1, 6, 2 * config.n_head * config.d_head), "float32")] * config.n_layer
    with pytest.raises(ValueError, match="head-major"):  # rings are read as KeyValueMemory stores them
        model(np.zeros((1, 2), "int32"), memory_kv=time_major, memory_kv_offset=0, mem_len=6)
    with pytest.raises(ValueError, match="without `mems`"):
        model(np.zeros((1, 2), "int32"), mems=[np.zeros((1, 4, config.d_model), "float32")] * config.n_layer,
              memory_kv=rings, memory_kv_offset=0)
