"""What train_tpu.py runs, checked without a TPU: the trainer built as train_tpu.py builds
it (compiled=True: every step is XLA-compiled under TPUStrategy), its replica train and
evaluation steps compiled with jit_compile=True on CPU, a few steps and an evaluation
run, and the traced graphs searched for what TPUs reject."""

import numpy as np
import pytest
import tensorflow as tf
from helpers import build

from tf_records import load_corpus_info
from txl_keras import TransformerXLConfig
from txl_keras.training import TrainConfig, Trainer

# Ops that run on the host or have no XLA kernel, and dtypes TPUs do not have.
HOST_OPS = {"PyFunc", "EagerPyFunc", "PyFuncStateless", "PrintV2", "Print", "StringFormat", "AsString",
            "StringJoin", "Assert"}
BAD_DTYPES = {tf.float64.as_datatype_enum, tf.string.as_datatype_enum, tf.complex128.as_datatype_enum}

CONFIGS = {
    "char": {},
    "adaptive_div_val_1": dict(cutoffs=[8, 16], div_val=1),
    "adaptive_div_val_4": dict(cutoffs=[8, 16], div_val=4, d_embed=16, proj_share_all_but_first=True),
}


def nodes(graph_def):
    yield from graph_def.node
    for function in graph_def.library.function:
        yield from function.node_def


def rejected(concrete):
    """`[op: reason]` of the nodes of a traced function (and every function it calls)."""
    found = []
    for node in nodes(concrete.graph.as_graph_def()):
        if node.op in HOST_OPS:
            found.append(f"{node.name}: host op {node.op}")
        for key, value in node.attr.items():
            types = [value.type] if value.HasField("type") else list(value.list.type)
            if any(t in BAD_DTYPES for t in types):
                found.append(f"{node.name} ({node.op}): {key} has a dtype TPUs reject")
    return found


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_train_tpu_steps_compile_with_xla_and_use_no_tpu_rejected_op(tmp_path, name):
    records = build(str(tmp_path))
    n_token = load_corpus_info(records)["vocab_size"]
    config = TransformerXLConfig.from_preset("tiny", n_token=n_token, dropout=0.1, **CONFIGS[name])
    tc = TrainConfig(model_dir=str(tmp_path / "run"), records_dir=records, train_batch_size=4, eval_batch_size=4,
                     train_steps=4, iterations=2, save_steps=0, learning_rate=3e-3, precision="float32")
    strategy = tf.distribute.get_strategy()  # stands in for TPUStrategy
    trainer = Trainer(strategy, config, tc, log=lambda *_: None, compiled=True)  # as train_tpu.py
    assert trainer.compiled and trainer.model.softmax.tail_mode == "dense"

    inputs = tf.zeros([4, config.tgt_len], tf.int32)
    targets = tf.ones([4, config.tgt_len], tf.int32)
    train_step = tf.function(lambda x, y: strategy.run(tf.function(trainer._replica_step, jit_compile=True),
                                                       args=(x, y)))
    grads, loss, gnorm, finite = train_step(inputs, targets)
    assert np.isfinite(float(loss)) and bool(finite)
    assert rejected(train_step.get_concrete_function(inputs, targets)) == []

    evaluation = trainer.evaluation(*trainer.eval_settings())
    evaluation.start_pass()
    replica_eval = tf.function(evaluation.replica_eval, jit_compile=True)
    eval_step = tf.function(lambda x, y: strategy.run(replica_eval, args=(x, y)))
    padded = tf.concat([targets[:, :-2], -tf.ones([4, 2], tf.int32)], axis=1)  # a padded last chunk
    nll, count = eval_step(inputs, padded)
    assert int(count) == 4 * (config.tgt_len - 2) and count.dtype == tf.int32
    assert rejected(eval_step.get_concrete_function(inputs, padded)) == []

    # the host loop of train_tpu.py and a whole evaluation, end to end
    assert trainer.train() == 4
    assert rejected(trainer._train_fn.get_concrete_function(trainer._iterator[1], tf.constant(2, tf.int64))) == []
    result = trainer.evaluate(progress=False)
    assert np.isfinite(result["loss"]) and result["tokens"] == result["expected_tokens"]


def test_the_memory_is_carried_across_host_loop_calls(tmp_path):
    """Two calls of one step each end where one call of two steps ends: the memory (and
    everything else) stays on the device between host-loop calls."""
    records = build(str(tmp_path))
    n_token = load_corpus_info(records)["vocab_size"]
    config = TransformerXLConfig.from_preset("tiny", n_token=n_token)
    ends = []
    for iterations in (1, 2):
        tc = TrainConfig(model_dir=str(tmp_path / f"run{iterations}"), records_dir=records, train_batch_size=4,
                         eval_batch_size=4, train_steps=2, iterations=iterations, save_steps=0, learning_rate=3e-3)
        trainer = Trainer(tf.distribute.get_strategy(), config, tc, log=lambda *_: None, compiled=True)
        trainer.train()
        ends.append([v.numpy() for v in trainer.memory.memory_variables] + [np.array(w) for w in trainer.model.get_weights()])
    assert np.abs(ends[0][0]).sum() > 0
    for a, b in zip(*ends):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
