"""The text task's training step as JAX compiles it (the step `keras.distribution` runs on TPU
pods): lowered to StableHLO, it has static shapes only, no host callbacks and no float64."""

import re

import keras
import pytest

from tf_records.vocabulary import Vocabulary
from txl_keras import (TransformerXLCausalLM, TransformerXLCausalLMPreprocessor, TransformerXLConfig,
                       TransformerXLLM, TransformerXLTokenizer)

TEXT = "".join(f"line {i} of the play, said the other one.\n" for i in range(40))


@pytest.mark.skipif(keras.config.backend() != "jax", reason="the JAX step (CI runs tests/tasks on JAX)")
def test_the_lowered_training_step_is_static_with_no_callbacks_or_float64():
    import jax

    vocab = Vocabulary(sorted(set(TEXT)), level="char")
    config = TransformerXLConfig.from_preset("tiny", n_token=len(vocab), cutoffs=[8, 16], div_val=2,
                                             tgt_len=8, mem_len=8)
    lm = TransformerXLCausalLM(TransformerXLLM(config), TransformerXLCausalLMPreprocessor(TransformerXLTokenizer(vocab),
                                                                                         8))
    lm.compile()
    x, y, weights = lm.preprocessor(TEXT, 2)
    data = ({k: v[0] for k, v in x.items()}, y[0], weights[0])
    lm._use_stream_memory(2)  # the state fit carries: the streams' memory, the optimizer's and metrics'
    lm.optimizer.build(lm.trainable_variables)
    lm.compute_metrics(data[0], data[1], lm(data[0]), sample_weight=data[2])
    state = tuple([v.value for v in variables] for variables in (
        lm.trainable_variables, lm.non_trainable_variables, lm.optimizer.variables, lm.metrics_variables))
    text = jax.jit(lm.train_step).lower(state, data).as_text()
    assert "stablehlo" in text and "dot_general" in text  # the step itself
    assert not re.search(r"tensor<[^>]*\?", text), "a dynamic shape"
    assert "f64" not in text, "float64"
    assert not re.search(r"callback|custom_call @xla_python", text), "a host callback"


@pytest.mark.skipif(keras.config.backend() != "jax", reason="the JAX step (CI runs tests/tasks on JAX)")
def test_fit_and_evaluate_run_one_compiled_program_per_step_by_default():
    """The default compile jits the step on JAX: the task's Python `call` runs while tracing,
    not once per batch (which would be JAX running every step op by op)."""
    vocab = Vocabulary(sorted(set(TEXT)), level="char")
    config = TransformerXLConfig.from_preset("tiny", n_token=len(vocab), cutoffs=[], tgt_len=8, mem_len=8)
    lm = TransformerXLCausalLM(TransformerXLLM(config), TransformerXLCausalLMPreprocessor(TransformerXLTokenizer(vocab),
                                                                                         8))
    lm.compile()
    calls, call = [], lm.call
    lm.call = lambda *args, **kwargs: calls.append(1) or call(*args, **kwargs)
    steps = []
    counter = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: steps.append(batch))
    lm.fit(TEXT, batch_size=2, epochs=2, verbose=0, callbacks=[counter])
    lm.evaluate(TEXT, batch_size=2, verbose=0)
    assert len(steps) > 20 and len(calls) <= 4
