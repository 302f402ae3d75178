"""The text task as users call it: stop tokens that end a row for good, batch sizes that
change between calls, one-line errors before Keras wraps them, ids that never wrap,
numbers as numpy gives them, memory checked before work, presets that are one model."""

import json
import math
import os
import signal

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import randomize

from tf_records.vocabulary import Vocabulary
from txl_keras import (TransformerXLCausalLM, TransformerXLCausalLMPreprocessor, TransformerXLConfig,
                       TransformerXLLM, TransformerXLTokenizer)
from txl_keras import generate as generation
from txl_keras import samplers
from txl_keras.models import sizes

TEXT = "".join(f"ROMEO: line {i} of the play, said the other one.\nJULIET: {i * 7} to {i % 5}\n" for i in range(12))


def char_task(tgt_len=8, mem_len=8, seed=0):
    vocab = Vocabulary(sorted(set(TEXT)), level="char")
    config = TransformerXLConfig.from_preset("tiny", n_token=len(vocab), cutoffs=[], tgt_len=tgt_len,
                                             mem_len=mem_len)
    model = TransformerXLLM(config)
    model.build((None, tgt_len))
    randomize(model, scale=1.0, seed=seed)  # peaked distributions with varied tokens
    return TransformerXLCausalLM(model, TransformerXLCausalLMPreprocessor(TransformerXLTokenizer(vocab), tgt_len))


@pytest.fixture(scope="module")
def lm():
    task = char_task()
    task.compile(sampler="greedy")
    return task


@pytest.fixture
def ctrl_c_raises():
    """SIGINT raises KeyboardInterrupt, as in a terminal, even where the test runner was
    started with SIGINT ignored (a shell's background job)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def cut_at_first(text, prompt, stop):
    """The greedy text without stops, cut after the first stop symbol of its continuation."""
    new = text[len(prompt):]
    return prompt + (new[: new.index(stop) + 1] if stop in new else new)


# -- stop tokens ------------------------------------------------------------------------------

def test_a_row_ends_at_its_first_stop_alone_in_a_batch_and_streamed(lm):
    prompts = ["ROMEO:", "O", "JULIET: 3"]
    free = lm.generate(prompts, max_new_tokens=20, stop_token_ids=None)
    stop = free[0][len("ROMEO:") + 2]  # the third symbol row 0 generates
    stop_id = lm.tokenizer.token_to_id(stop)
    expected = [cut_at_first(t, p, stop) for t, p in zip(free, prompts)]
    assert expected[0] != free[0]  # the stop is met within the limit
    assert lm.generate(prompts, max_new_tokens=20, stop_token_ids=(stop_id,)) == expected
    for prompt, want in zip(prompts, expected):
        assert lm.generate(prompt, max_new_tokens=20, stop_token_ids=(stop_id,)) == want
        assert lm.generate(prompt, max_new_tokens=20, stop_token_ids=(stop,)) == want  # the symbol itself
        streamed = "".join(lm.stream(prompt, max_new_tokens=20, stop_token_ids=(stop_id,)))
        assert prompt + streamed == want


def test_stop_tokens_take_text_as_the_command_line_does():
    vocab = Vocabulary([str(b) for b in range(256)], level="byte")
    config = TransformerXLConfig.from_preset("tiny", n_token=256, cutoffs=[], tgt_len=4, mem_len=4)
    task = TransformerXLCausalLM(TransformerXLLM(config), TransformerXLCausalLMPreprocessor(
        TransformerXLTokenizer(vocab), 4))
    assert task._stop_ids(["\n"]) == (10,) and task._stop_ids(["10"]) == (10,) and task._stop_ids(["a"]) == (97,)
    with pytest.raises(ValueError, match="'ab' is neither a symbol of the vocabulary nor a text of one token"):
        task._stop_ids(["ab"])


# -- batch sizes that change ------------------------------------------------------------------

def test_any_sequence_of_fit_and_evaluate_batch_sizes_works_each_from_an_empty_memory():
    """Each call starts its streams empty: an evaluation at batch b equals a fresh task's
    evaluation at b with the same weights, whatever ran before."""
    task = char_task()
    task.compile(optimizer=keras.optimizers.SGD(0.0))  # the weights stay: every evaluation is comparable
    reference = {}
    for b in (1, 3):
        fresh = char_task()
        fresh.compile(optimizer=keras.optimizers.SGD(0.0))
        reference[b] = fresh.evaluate(TEXT, batch_size=b, verbose=0, return_dict=True)["perplexity"]
    task.fit(TEXT, batch_size=2, verbose=0)
    for b in (3, 1, 3):
        got = task.evaluate(TEXT, batch_size=b, verbose=0, return_dict=True)["perplexity"]
        assert got == pytest.approx(reference[b], rel=1e-5)
    task.fit(TEXT, batch_size=1, verbose=0)
    assert task.evaluate(TEXT, batch_size=3, verbose=0, return_dict=True)["perplexity"] == \
        pytest.approx(reference[3], rel=1e-5)


def test_a_failed_call_leaves_the_task_usable():
    task = char_task()
    task.fit(TEXT, batch_size=2, verbose=0)
    with pytest.raises(ValueError, match="too few to fill one batch"):
        task.evaluate(TEXT, batch_size=10**6, verbose=0)
    with pytest.raises(ValueError, match="batch_size"):
        task.fit(TEXT, batch_size=2.0, verbose=0)
    assert task.stream_memory.batch_size == 2
    assert math.isfinite(task.evaluate(TEXT, batch_size=2, verbose=0, return_dict=True)["loss"])  # still works


def test_epochs_zero_then_two_and_steps_beyond_the_text():
    task = char_task()
    steps = []
    counter = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: steps.append(batch))
    assert task.fit(TEXT, batch_size=2, epochs=0, verbose=0).history == {}
    task.fit(TEXT, batch_size=2, epochs=2, verbose=0, callbacks=[counter])
    per_epoch = math.ceil((len(TEXT) - 1) / (2 * 8))
    assert len(steps) == 2 * per_epoch
    steps.clear()
    task.fit(TEXT, batch_size=2, epochs=1, steps_per_epoch=per_epoch + 7, verbose=0, callbacks=[counter])
    assert len(steps) == per_epoch + 7  # the text is read again
    with pytest.raises(ValueError, match=r"Expected `epochs` to be an integer >= 0. Received: epochs=-1"):
        task.fit(TEXT, epochs=-1)


def test_each_fit_sizes_its_own_schedule_from_where_the_optimizer_stands():
    task = char_task()
    task.compile()
    task.fit(TEXT, batch_size=2, epochs=1, verbose=0)
    schedule, first = task.optimizer._learning_rate, int(task.optimizer.iterations.numpy())
    task.fit(TEXT[: len(TEXT) // 2], batch_size=1, epochs=3, verbose=0)
    total = 3 * math.ceil((len(TEXT) // 2 - 1) / 8)
    assert (schedule.start_step, schedule.total_steps) == (first, total)
    # the second fit warms up again and decays: its middle step is well above the floor
    middle = float(schedule(first + total // 2))
    assert middle > 0.3 * schedule.peak
    assert float(schedule(first)) == 0.0 and float(schedule(first + total)) == pytest.approx(0.004 * schedule.peak)


def test_endless_sources_need_steps_per_epoch_and_are_read_as_far_as_it_needs():
    task = char_task()
    endless = tf.data.Dataset.from_tensor_slices(TEXT.splitlines(keepends=True)).repeat()
    with pytest.raises(ValueError, match="endless .* give steps_per_epoch"):
        task.fit(endless, batch_size=2)
    with pytest.raises(ValueError, match="iterator may be endless: give steps_per_epoch"):
        task.fit(iter(TEXT.splitlines(keepends=True)), batch_size=2)
    steps = []
    counter = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: steps.append(batch))
    task.fit(endless, batch_size=2, steps_per_epoch=5, verbose=0, callbacks=[counter])
    task.fit((line for line in TEXT.splitlines(keepends=True) * 1000), batch_size=1, steps_per_epoch=3, verbose=0,
             callbacks=[counter])
    assert len(steps) == 8


# -- errors of one line -------------------------------------------------------------------------

@pytest.mark.parametrize("call, message", [
    (lambda t: t.fit("", verbose=0), "The text has 0 tokens: too few to fill one batch"),
    (lambda t: t.fit("short", batch_size=1, verbose=0), "The text has 6 tokens: too few"),
    (lambda t: t.fit([TEXT, 3], verbose=0), "every item of the text to be a string. Received an item of type int"),
    (lambda t: t.fit(TEXT.encode(), verbose=0), "Received bytes: decode them first"),
    (lambda t: t.fit([TEXT.encode()], verbose=0), r"string \(decode bytes first\)"),
    (lambda t: t.fit(TEXT, batch_size=0, verbose=0), "`batch_size` to be an integer >= 1. Received: batch_size=0"),
    (lambda t: t.fit(TEXT, batch_size=-2, verbose=0), "Received: batch_size=-2"),
    (lambda t: t.fit(TEXT, batch_size=2.0, verbose=0), r"Received: batch_size=2\.0"),
    (lambda t: t.fit(TEXT, batch_size=10**12, verbose=0), "too few to fill one batch of 1000000000000 streams"),
    (lambda t: t.fit({"text": TEXT}, verbose=0), "Expected text: .* Received: dict"),
    (lambda t: t.fit([], verbose=0), "empty list: there is no text"),
    (lambda t: t.evaluate(None, verbose=0), "Expected text: .* Received: None"),
    (lambda t: t.evaluate(TEXT, batch_size=0, verbose=0), "`batch_size` to be an integer >= 1"),
    (lambda t: t.fit(TEXT, steps_per_epoch=0, verbose=0), "`steps_per_epoch` to be an integer >= 1"),
    (lambda t: t.predict(TEXT), r"not text: call score\(text\) .* or generate\(prompt\)"),
    (lambda t: t.predict([TEXT]), r"call score\(text\)"),
    (lambda t: t.score(3), "Expected a text string or a list of them to score"),
    (lambda t: t.tokenizer.detokenize([2**40]), r"Token ids must be in \[0, \d+\)"),
])
def test_bad_input_is_one_value_error_line_raised_before_keras_wraps_it(call, message):
    task = char_task()
    with pytest.raises(ValueError, match=message) as error:
        call(task)
    text = str(error.value)
    assert "\n" not in text and "Exception encountered" not in text and "Arguments received" not in text


def test_score_of_a_list_scores_each_text_on_its_own(lm):
    texts = ["ROMEO: one line", "JULIET: 3 to 4 said the other"]
    assert [s.log_likelihoods.tolist() for s in lm.score(texts)] == \
        [lm.score(t).log_likelihoods.tolist() for t in texts]


# -- numbers as users pass them -----------------------------------------------------------------

def test_numpy_numbers_are_numbers_and_non_finite_values_are_refused():
    assert samplers.TopKSampler(k=np.int64(3), temperature=np.float32(0.5), seed=np.int32(4)).temperature == 0.5
    assert samplers.TopPSampler(p=np.float64(0.5)).p == 0.5
    assert samplers.BeamSampler(num_beams=np.int16(2), length_penalty=np.float32(0.5)).num_beams == 2
    for make, name in ((lambda v: samplers.BeamSampler(length_penalty=v), "length_penalty"),
                       (lambda v: samplers.RandomSampler(temperature=v), "temperature"),
                       (lambda v: samplers.TopPSampler(p=v), "p"),
                       (lambda v: samplers.sampler_from(temperature=v), "temperature")):
        for value in (float("nan"), float("inf"), np.float32("nan")):
            with pytest.raises(ValueError, match=f"`{name}`"):
                make(value)
    with pytest.raises(ValueError, match="`k` to be a positive integer"):
        samplers.TopKSampler(k=np.float32(3))


def test_a_tiny_temperature_is_greedy_not_an_underflow(lm):
    greedy = lm.generate(["ROMEO:", "O"], max_new_tokens=12, stop_token_ids=None, sampler="greedy")
    for temperature in (1e-50, 1e-30, np.finfo(np.float32).tiny):
        sampler = samplers.RandomSampler(temperature=temperature, seed=5)
        assert lm.generate(["ROMEO:", "O"], max_new_tokens=12, stop_token_ids=None, sampler=sampler) == greedy


# -- memory before work, Ctrl-C ---------------------------------------------------------------

def test_generation_refuses_what_cannot_fit_before_any_work(lm, monkeypatch):
    with pytest.raises(sizes.MemoryEstimateError, match=r"Generating 2,147,483,647 new tokens .* GB of memory"):
        lm.generate("the", max_new_tokens=2**31 - 1)  # > 100 GB for its text alone
    # a machine with 50 MB to spare beyond the model's inference at batch 2
    spare = sizes.inference_bytes(lm.model.config, 2, scored_tokens=2) + (50 << 20)
    monkeypatch.setattr(sizes, "available_bytes", lambda: spare)
    with pytest.raises(sizes.MemoryEstimateError, match="Generating 10,000,000 new tokens for 2 prompt"):
        lm.generate(["R", "O"], max_new_tokens=10**7)
    with pytest.raises(sizes.MemoryEstimateError, match="Generating 10,000,000"):
        next(lm.stream("R", max_new_tokens=10**7))
    with pytest.raises(sizes.MemoryEstimateError, match="Generating 10,000,000"):
        generation.generate(lm.model, [np.array([1, 2])], 10**7)
    assert len(lm.generate("ROMEO:", max_new_tokens=3, stop_token_ids=None)) == len("ROMEO:") + 3


def _interrupted_after_one_piece(lm, sampler, generate):
    """The steps of each piece a generation with `sampler` ran, Ctrl-C raised while its
    first piece ran (its compiled search already traced)."""
    (key, search), = [(k, f) for k, f in generation._COMPILED[lm.model].items()
                      if k[0] == "decode" and k[2] == generation._sampler_key(sampler) and k[4] == ()]
    taken = []

    def interrupted_piece(state, steps, inputs):
        out = search(state, steps, inputs)
        taken.append(int(out[3]))
        signal.raise_signal(signal.SIGINT)  # Ctrl-C while the piece ran
        return out

    generation._COMPILED[lm.model][key] = interrupted_piece
    try:
        with pytest.raises(KeyboardInterrupt):
            generate()
    finally:
        generation._COMPILED[lm.model][key] = search
    return taken


def test_a_signal_stops_a_long_generation_after_one_piece_of_its_loop(lm, ctrl_c_raises):
    """Ctrl-C during a compiled piece of the token loop is handled when the piece returns:
    the rest of the generation never runs."""
    lm.generate("ROMEO:", max_new_tokens=3, stop_token_ids=None)  # the token loop compiled
    taken = _interrupted_after_one_piece(
        lm, samplers.GreedySampler(), lambda: lm.generate("ROMEO:", max_new_tokens=30_000, stop_token_ids=None))
    assert taken == [1]  # the first piece is one step; the later ones last about generation.PIECE_S


# -- what travels with a model ------------------------------------------------------------------

def test_a_keras_file_of_the_task_loads_back_whole_with_its_vocabulary(lm, tmp_path):
    path = str(tmp_path / "task.keras")
    lm.save(path)
    loaded = keras.models.load_model(path)
    assert loaded.tokenizer.vocabulary.to_dict() == lm.tokenizer.vocabulary.to_dict()
    assert loaded.generate(["ROMEO:", "O"], max_new_tokens=10, sampler="greedy", stop_token_ids=None) == \
        lm.generate(["ROMEO:", "O"], max_new_tokens=10, sampler="greedy", stop_token_ids=None)


def test_a_preset_is_one_model_its_vocabulary_and_tokenizer_file_checked(lm, tmp_path):
    folder = str(tmp_path / "preset")
    lm.save_to_preset(folder)
    vocab_path = os.path.join(folder, "assets", "tokenizer", "vocab.json")
    data = json.load(open(vocab_path))
    data["symbols"][3], data["symbols"][4] = data["symbols"][4], data["symbols"][3]  # same size, two swapped
    with open(vocab_path, "w") as f:
        json.dump(data, f)
    with pytest.raises(ValueError, match="is not the vocabulary the preset .* was saved with"):
        TransformerXLCausalLM.from_preset(folder)
    folder = str(tmp_path / "other")
    lm.save_to_preset(folder)
    with open(os.path.join(folder, "tokenizer.json"), "w") as f:
        f.write("{not json")
    with pytest.raises(ValueError, match="tokenizer.json is damaged"):
        TransformerXLCausalLM.from_preset(folder)
    with open(os.path.join(folder, "tokenizer.json"), "w") as f:
        json.dump({"class_name": "Dense", "config": {}}, f)
    with pytest.raises(ValueError, match="tokenizer.json is damaged: it is not a serialized TransformerXLTokenizer"):
        TransformerXLCausalLM.from_preset(folder)


def test_paths_as_users_give_them(lm, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert lm.save_to_preset("~/saved") == str(tmp_path / "saved")
    assert os.path.isfile(tmp_path / "saved" / "metadata.json") and not os.path.exists("~")
    a_file = tmp_path / "a_file"
    a_file.write_text("mine")
    with pytest.raises(FileExistsError, match=f"{a_file} is a file, not a folder"):
        lm.save_to_preset(str(a_file))
    traced = []
    monkeypatch.setattr(tf.saved_model, "save", lambda *a, **k: traced.append(a))
    with pytest.raises(FileExistsError, match=f"{a_file} is a file, not a folder"):
        lm.export(str(a_file))
    assert a_file.read_text() == "mine" and not traced


def test_generate_calls_with_other_settings_reuse_their_steps_without_retracing_warnings(lm, caplog):
    """Other lengths, batch sizes, temperatures, nucleus masses and length penalties reuse
    the compiled search (TensorFlow warns when one function is traced again and again)."""
    import logging

    with caplog.at_level(logging.WARNING, logger="tensorflow"):
        for n in (3, 5, 7, 9, 11, 70):
            lm.generate("ROMEO:", max_new_tokens=n, stop_token_ids=None)
        for t in (0.5, 0.6, 0.7, 0.8, 0.9, 1.1):
            lm.generate(["ROMEO:", "JU"], max_new_tokens=4, sampler=samplers.TopKSampler(k=2, temperature=t, seed=1))
            lm.generate("O", max_new_tokens=4, sampler=samplers.TopPSampler(p=t / 2, temperature=t, seed=2))
            "".join(lm.stream("ROMEO:", max_new_tokens=2, sampler=samplers.RandomSampler(temperature=t, seed=3)))
        for penalty in (0.0, 0.5, 1.0):
            lm.generate(["ROMEO:", "O"], max_new_tokens=3, sampler=samplers.BeamSampler(2, length_penalty=penalty))
    assert not [r for r in caplog.records if "retracing" in r.getMessage()]
    decoders = [k for k in generation._COMPILED[lm.model] if k[0] == "decode"]
    assert sum(k[2][0] == "TopKSampler" for k in decoders) == 1  # one loop for the six temperatures
    assert sum(k[2][0] == "BeamSampler" for k in decoders) == 1  # and for the three length penalties


def test_a_sampler_drawn_in_reused_steps_draws_with_its_own_temperature(lm):
    """Steps traced for one temperature, reused for another, draw as that other: a very low
    temperature is greedy, and a high one is not."""
    greedy = lm.generate("ROMEO:", max_new_tokens=30, stop_token_ids=None, sampler="greedy")
    hot = samplers.RandomSampler(temperature=50.0, seed=9)
    cold = samplers.RandomSampler(temperature=1e-3, seed=9)
    assert lm.generate("ROMEO:", max_new_tokens=30, stop_token_ids=None, sampler=hot) != greedy
    assert lm.generate("ROMEO:", max_new_tokens=30, stop_token_ids=None, sampler=cold) == greedy


def test_beam_search_runs_in_pieces_that_continue_each_other_and_a_signal_stops_it(lm, ctrl_c_raises):
    """One beam over more steps than one piece is greedy's text; Ctrl-C during a piece ends
    the search when that piece returns."""
    steps = generation.DECODE_CHUNK * 2 + 7
    greedy = lm.generate("ROMEO:", max_new_tokens=steps, stop_token_ids=None, sampler="greedy")
    assert lm.generate("ROMEO:", max_new_tokens=steps, stop_token_ids=None,
                       sampler=samplers.BeamSampler(num_beams=1)) == greedy
    two = samplers.BeamSampler(num_beams=2)
    lm.generate("ROMEO:", max_new_tokens=2, stop_token_ids=None, sampler=two)  # its search compiled
    taken = _interrupted_after_one_piece(
        lm, two, lambda: lm.generate("ROMEO:", max_new_tokens=30_000, stop_token_ids=None, sampler=two))
    assert taken == [1]


@pytest.mark.skipif(keras.config.backend() != "tensorflow", reason="tf.distribute")
def test_fit_under_a_strategy_of_several_replicas_says_what_runs_there_instead(mirrored):
    with mirrored.scope():
        task = char_task()
    for call in (lambda: task.fit(TEXT, batch_size=2, verbose=0), lambda: task.evaluate(TEXT, batch_size=2, verbose=0)):
        with pytest.raises(ValueError, match=r"^TransformerXLCausalLM.fit, evaluate and predict do not run under a "
                                             r"tf.distribute strategy of 2 replicas.*train_gpu.py.*keras.distribution"):
            call()
