"""The text task: fit on text with the memory across batches, presets saved and loaded,
text in and text out; checked against brute-force computations on the model itself."""

import math
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import to_np

from tf_records.vocabulary import Vocabulary
from txl_keras import (TransformerXLCausalLM, TransformerXLCausalLMPreprocessor, TransformerXLConfig,
                       TransformerXLLM, TransformerXLTokenizer)
from txl_keras.tasks import WarmupCosine

WORDS = ["alpha", "beta", "gamma", "delta", "kappa", "omega"]
TEXT = "".join(" ".join(WORDS[(i * 2 + j) % 6] for j in range(3 + i % 3)) + "\n" for i in range(30))


def make_task(mem_len=8, tgt_len=8, **overrides):
    vocab = Vocabulary(["<eos>", "<unk>"] + WORDS, add_eos=True, unk_symbol="<unk>")
    config = TransformerXLConfig.from_preset("tiny", n_token=len(vocab), cutoffs=[], tgt_len=tgt_len,
                                             mem_len=mem_len, **overrides)
    tokenizer = TransformerXLTokenizer(vocab)
    return TransformerXLCausalLM(TransformerXLLM(config), TransformerXLCausalLMPreprocessor(tokenizer, tgt_len))


def test_the_preprocessor_lays_text_out_as_contiguous_streams_scoring_every_target_once():
    lm = make_task()
    ids = lm.tokenizer(TEXT).numpy()
    for batch in (1, 3, 4):
        x, y, weight = lm.preprocessor(TEXT, batch)
        steps, length = x["token_ids"].shape[0], lm.preprocessor.sequence_length
        assert steps == math.ceil((len(ids) - 1) / (batch * length))
        np.testing.assert_array_equal(y, x["target_ids"])
        # each stream's inputs continue from batch to batch, its targets are the next tokens
        tokens = x["token_ids"].transpose(1, 0, 2).reshape(batch, -1)
        targets = y.transpose(1, 0, 2).reshape(batch, -1)
        kept = weight.transpose(1, 0, 2).reshape(batch, -1) > 0
        np.testing.assert_array_equal(tokens[:, 1:][kept[:, :-1]], targets[:, :-1][kept[:, :-1]])
        # the weighted targets, stream after stream, are the text's tokens but the first, once each
        np.testing.assert_array_equal(np.concatenate([t[k] for t, k in zip(targets, kept)]), ids[1:])


def test_a_text_that_cannot_fill_one_batch_is_a_clear_error():
    lm = make_task()
    with pytest.raises(ValueError, match=r"too few to fill one batch of 4 streams of 8 tokens \(at least 33"):
        lm.fit("alpha beta gamma", batch_size=4)


def test_evaluation_through_the_memory_equals_reading_each_stream_at_once():
    """With a memory as long as a stream, the task's batches see exactly what one call on
    the whole stream sees: the perplexity is the brute-force one."""
    lm = make_task(mem_len=64, tgt_len=8)
    x, y, weight = lm.preprocessor(TEXT, 3)
    stream_tokens = x["token_ids"].transpose(1, 0, 2).reshape(3, -1)
    stream_targets = y.transpose(1, 0, 2).reshape(3, -1)
    kept = weight.transpose(1, 0, 2).reshape(3, -1)
    assert stream_tokens.shape[1] <= 64 + 8
    nll = to_np(lm.model(stream_tokens, targets=stream_targets)["nll"])
    expected = math.exp((nll * kept).sum() / kept.sum())
    lm.compile()
    result = lm.evaluate(TEXT, batch_size=3, return_dict=True, verbose=0)
    assert result["perplexity"] == pytest.approx(expected, rel=1e-4)
    again = lm.evaluate(TEXT, batch_size=3, return_dict=True, verbose=0)  # streams start afresh each time
    assert again["perplexity"] == pytest.approx(expected, rel=1e-4)
    lines = tf.data.Dataset.from_tensor_slices(TEXT.splitlines(keepends=True)).batch(7)  # a dataset of strings
    from_dataset = lm.evaluate(lines, batch_size=3, return_dict=True, verbose=0)
    assert from_dataset["perplexity"] == pytest.approx(expected, rel=1e-4)


def test_fit_on_strings_lowers_the_loss_in_the_documented_number_of_steps():
    lm = make_task()
    lm.compile(optimizer=keras.optimizers.Adam(1e-2))  # explicit arguments override the defaults
    before = lm.evaluate([TEXT], batch_size=2, return_dict=True, verbose=0)["perplexity"]
    steps = []
    counter = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: steps.append(batch))
    n = len(lm.tokenizer(TEXT).numpy())
    lm.fit([TEXT], batch_size=2, epochs=3, verbose=0, callbacks=[counter])
    assert len(steps) == 3 * math.ceil((n - 1) / (2 * 8))
    after = lm.evaluate([TEXT], batch_size=2, return_dict=True, verbose=0)["perplexity"]
    assert after < 0.6 * before


def test_compile_defaults_are_the_papers_recipe_sized_by_fit():
    lm = make_task()
    lm.compile()
    assert isinstance(lm.optimizer, keras.optimizers.Adam) and lm.optimizer.global_clipnorm == 0.25
    history = lm.fit(TEXT, batch_size=2, epochs=2, verbose=0).history
    assert set(history) == {"loss", "perplexity"}
    np.testing.assert_allclose(history["perplexity"], np.exp(history["loss"]), rtol=0.05)  # (loss: mean of batches)
    schedule = lm.optimizer._learning_rate
    steps = 2 * math.ceil((len(lm.tokenizer(TEXT).numpy()) - 1) / 16)
    assert schedule.total_steps == steps and schedule.warmup_steps == steps // 10
    with pytest.raises(ValueError, match="leave `loss` as 'auto'"):
        lm.compile(loss="sparse_categorical_crossentropy")
    with pytest.raises(ValueError, match="drop shuffle=True"):
        lm.fit(TEXT, batch_size=2, shuffle=True)


def test_the_schedule_is_the_papers_warmup_and_cosine_from_where_fit_started():
    peak, total, warm, ratio, start = 2.5e-4, 500, 40, 0.004, 30
    schedule = WarmupCosine(peak, total_steps=total, warmup_steps=warm, start_step=start)
    for step in (0, 1, 20, 40, 41, 250, 499, 500, 700):
        if step < warm:
            want = peak * step / warm
        else:
            progress = min((step - warm) / (total - warm), 1.0)
            want = peak * ((1 - ratio) * 0.5 * (1 + math.cos(math.pi * progress)) + ratio)
        assert float(to_np(schedule(step + start))) == pytest.approx(want, rel=1e-5, abs=1e-12)
    assert float(to_np(WarmupCosine(peak)(123))) == pytest.approx(peak)  # not sized yet: the peak


def test_a_saved_preset_loads_with_the_same_scores_and_greedy_text(tmp_path):
    lm = make_task()
    lm.fit(TEXT, batch_size=2, epochs=1, verbose=0)
    folder = str(tmp_path / "preset")
    lm.save_to_preset(folder)
    assert sorted(os.listdir(folder)) == ["assets", "config.json", "metadata.json", "model.weights.h5",
                                          "preprocessor.json", "tokenizer.json"]
    assert os.listdir(os.path.join(folder, "assets", "tokenizer")) == ["vocab.json"]
    loaded = TransformerXLCausalLM.from_preset(folder)
    text = "alpha beta gamma\ndelta kappa omega\n"
    np.testing.assert_allclose(loaded.score(text).log_likelihoods, lm.score(text).log_likelihoods, atol=1e-6)
    assert loaded.generate("alpha beta", max_new_tokens=10, sampler="greedy") == \
        lm.generate("alpha beta", max_new_tokens=10, sampler="greedy")
    with pytest.raises(FileExistsError, match="is not empty"):
        lm.save_to_preset(folder)


def test_scoring_text_is_the_model_on_its_tokens():
    lm = make_task()
    score = lm.score("alpha beta gamma\n")
    direct = to_np(lm.model(np.array([[2, 3, 4]]), targets=np.array([[3, 4, 0]]))["nll"])[0]
    np.testing.assert_allclose(score.log_likelihoods, -direct, rtol=1e-5, atol=1e-6)
    assert score.tokens == ["beta", "gamma", "<eos>"]


def test_presets_name_what_they_are():
    assert "transfo_xl_wt103" in TransformerXLCausalLM.presets
    assert "trained" in TransformerXLCausalLM.presets["transfo_xl_wt103"]
    with pytest.raises(ValueError, match="'wt103_base' is an architecture \\(random weights, no vocabulary\\)"):
        TransformerXLCausalLM.from_preset("wt103_base")
    with pytest.raises(ValueError, match=r"TransformerXLCausalLM.from_preset\('transfo_xl_wt103'\).model"):
        TransformerXLLM.from_preset("transfo_xl_wt103")
    with pytest.raises(ValueError, match="No run folder at no/such/folder: give a released model's name"):
        TransformerXLCausalLM.from_preset("no/such/folder")


def test_a_new_preset_source_is_one_loader_class(tmp_path, monkeypatch):
    """A source of presets (here: a folder holding a handle that names a saved preset) is one
    `PresetLoader` subclass in the registry; `from_preset` then loads it like any other."""
    from txl_keras import presets

    class HandleLoader(presets.PresetLoader):
        kind = "handle"

        @staticmethod
        def matches(preset):
            return os.path.exists(os.path.join(preset, "handle.txt"))

        def load(self, preset, options):
            with open(os.path.join(preset, "handle.txt")) as f:
                return presets.PresetFolderLoader().load(f.read().strip(), options)

    lm = make_task()
    saved = str(tmp_path / "saved")
    lm.save_to_preset(saved)
    handle = tmp_path / "handle"
    handle.mkdir()
    (handle / "handle.txt").write_text(saved)
    with pytest.raises(ValueError, match="is neither a released model"):
        TransformerXLCausalLM.from_preset(str(handle))
    monkeypatch.setattr(presets, "FOLDER_LOADERS", (HandleLoader,) + presets.FOLDER_LOADERS)
    loaded = TransformerXLCausalLM.from_preset(str(handle))
    assert loaded.score(TEXT[:60]).perplexity == pytest.approx(lm.score(TEXT[:60]).perplexity, rel=1e-6)


def test_a_new_task_is_one_subclass_whose_from_preset_loads_a_language_model(tmp_path):
    """A task written on `Task` (here: a text's hidden states) gets `from_preset` whole; it says
    only how it is made on a trained language model. Its model is the saved one, weight for
    weight, with the saved vocabulary; a damaged class name in a preset folder is named."""
    from txl_keras.tasks.task import Task

    class HiddenStates(Task):
        def __init__(self, backbone, preprocessor, **kwargs):
            super().__init__(**kwargs)
            self.backbone, self.preprocessor = backbone, preprocessor

        @classmethod
        def _on_language_model(cls, model, tokenizer, name=None):
            return cls(model.backbone, TransformerXLCausalLMPreprocessor(tokenizer, model.config.tgt_len), name=name)

    lm = make_task()
    keras.utils.set_random_seed(3)
    for w in lm.model.weights:
        w.assign(keras.random.normal(w.shape, stddev=0.2, dtype=w.dtype))
    lm.save_to_preset(str(tmp_path / "lm"))
    task = HiddenStates.from_preset(str(tmp_path / "lm"), name="hidden")
    assert task.name == "hidden" and task.tokenizer.vocabulary.symbols == lm.tokenizer.vocabulary.symbols
    assert len(task.backbone.weights) == len(lm.backbone.weights)
    for mine, saved in zip(task.backbone.weights, lm.backbone.weights):
        np.testing.assert_array_equal(to_np(mine), to_np(saved))
    metadata = tmp_path / "lm" / "metadata.json"
    metadata.write_text(metadata.read_text().replace('"TransformerXLCausalLM"', "5"))
    with pytest.raises(ValueError, match=r"metadata.json is damaged \(class_name=5\)"):
        HiddenStates.from_preset(str(tmp_path / "lm"))
