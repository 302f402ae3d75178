"""Generation on the text task: batches of prompts of any lengths equal each prompt alone,
samplers by name and object, beam search against greedy and against brute force, stop
tokens, streaming, and every bad input a clear error."""

import itertools

import numpy as np
import pytest
from conftest import randomize, to_np, word_task

from txl_keras import TransformerXLConfig, TransformerXLLM
from txl_keras import samplers
from txl_keras.generate import generate

PROMPTS = ["alpha beta", "gamma", "delta kappa omega sigma", "alpha beta gamma delta kappa omega sigma theta alpha",
           "theta\nalpha"]


def beam_search(model, prompt, max_new_tokens, sampler):
    """The new tokens of the best beam of one prompt (1-D ids)."""
    return generate(model, [prompt], max_new_tokens, sampler=sampler)[0][len(prompt):]


@pytest.fixture(scope="module")
def lm():
    return word_task()


@pytest.mark.parametrize("sampler", ["greedy", samplers.TopKSampler(k=4, seed=3),
                                     samplers.TopPSampler(p=0.9, temperature=1.5, seed=5),
                                     samplers.RandomSampler(seed=11), samplers.BeamSampler(num_beams=3)])
def test_a_batch_of_prompts_of_any_lengths_equals_each_prompt_alone(lm, sampler):
    together = lm.generate(PROMPTS, max_new_tokens=9, sampler=sampler, stop_token_ids=None)
    alone = [lm.generate(p, max_new_tokens=9, sampler=sampler, stop_token_ids=None) for p in PROMPTS]
    assert together == alone
    assert all(t.startswith(p.split("\n")[0]) for t, p in zip(together, PROMPTS))


def test_compiled_sampler_names_and_a_call_override(lm):
    lm.compile(sampler="greedy")
    greedy = lm.generate("alpha beta", max_new_tokens=6, stop_token_ids=None)
    assert greedy == lm.generate("alpha beta", max_new_tokens=6, stop_token_ids=None, sampler=samplers.GreedySampler())
    assert lm.generate("alpha beta", max_new_tokens=6, stop_token_ids=None, sampler="beam") is not None
    lm.compile(sampler=samplers.TopKSampler(k=1, seed=0))  # k=1 is greedy
    assert lm.generate("alpha beta", max_new_tokens=6, stop_token_ids=None) == greedy
    assert {name: type(samplers.get(name)) for name in samplers.SAMPLERS} == {
        "greedy": samplers.GreedySampler, "top_k": samplers.TopKSampler, "top_p": samplers.TopPSampler,
        "random": samplers.RandomSampler, "beam": samplers.BeamSampler}
    assert (samplers.get("top_k").k, samplers.get("top_p").p, samplers.get("beam").num_beams) == (5, 0.1, 5)
    with pytest.raises(ValueError, match="Unknown sampler 'nucleus'"):
        lm.compile(sampler="nucleus")


def test_stop_tokens_end_each_row_at_its_own_place(lm):
    free = lm.generate(PROMPTS, max_new_tokens=10, sampler="greedy", stop_token_ids=None)
    new = [lm.tokenizer.tokenize_prompt(t).numpy().tolist()[len(lm.tokenizer.tokenize_prompt(p).numpy()):]
           for t, p in zip(free, PROMPTS)]
    stop_ids = (new[0][2], new[2][1])
    stopped = lm.generate(PROMPTS, max_new_tokens=10, sampler="greedy", stop_token_ids=stop_ids)
    for p, full, cut in zip(PROMPTS, new, stopped):
        ends = [k for k, t in enumerate(full) if t in stop_ids]
        expected = full[: ends[0] + 1] if ends else full
        got = lm.tokenizer.tokenize_prompt(cut).numpy().tolist()[len(lm.tokenizer.tokenize_prompt(p).numpy()):]
        assert got == expected
    tokens = lm.generate("alpha", max_new_tokens=10, sampler="greedy", stop_token_ids=[lm.tokenizer.id_to_token(
        stop_ids[0])])
    assert lm.generate("alpha", max_new_tokens=10, sampler="greedy", stop_token_ids=stop_ids[:1]) == tokens


def test_max_length_and_strip_prompt(lm):
    full = lm.generate(["alpha beta", "gamma"], max_length=7, sampler="greedy", stop_token_ids=None)
    assert [len(lm.tokenizer.tokenize_prompt(t).numpy()) for t in full] == [7, 7]
    rest = lm.generate(["alpha beta", "gamma"], max_length=7, sampler="greedy", stop_token_ids=None,
                       strip_prompt=True)
    assert [p + r for p, r in zip(["alpha beta", "gamma"], rest)] == full


def log_likelihood(model, prompt, new):
    ids = np.concatenate([prompt, new]).astype("int32")
    nll = to_np(model(ids[None, :-1], targets=ids[None, 1:])["nll"])[0]
    return -nll[len(prompt) - 1:].sum()


def test_beam_search_of_one_beam_is_greedy_and_more_beams_are_at_least_as_likely(lm):
    model = lm.model
    wins = 0
    for prompt in ([2, 3], [4], [5, 6, 7], [9, 2, 3, 4, 5], [8, 8]):
        prompt = np.asarray(prompt, "int32")
        greedy = lm.generate(lm.tokenizer.detokenize(prompt), max_new_tokens=5, sampler="greedy", stop_token_ids=None)
        one = beam_search(model, prompt, 5, samplers.BeamSampler(num_beams=1))
        assert lm.tokenizer.detokenize(np.concatenate([prompt, one])) == greedy
        four = beam_search(model, prompt, 5, samplers.BeamSampler(num_beams=4, length_penalty=0.0))
        wins += log_likelihood(model, prompt, four) >= log_likelihood(model, prompt, one) - 1e-5
    assert wins >= 4


def test_beam_search_finds_the_most_likely_continuation_by_brute_force():
    """A memory longer than the text: every continuation's likelihood is one model call;
    with as many beams as the vocabulary, beam search keeps every prefix and must return
    the best of all |V|**3 continuations."""
    config = TransformerXLConfig.from_preset("tiny", n_token=4, cutoffs=[], mem_len=16, same_length=False)
    model = TransformerXLLM(config)
    randomize(model, scale=1.0)
    prompt = np.array([0, 2, 1], "int32")
    best = max(itertools.product(range(4), repeat=3), key=lambda new: log_likelihood(model, prompt, np.array(new)))
    found = beam_search(model, prompt, 3, samplers.BeamSampler(num_beams=16, length_penalty=0.0))
    assert tuple(found.tolist()) == best


def test_beam_search_on_a_batch_finds_each_prompts_best_continuation_by_brute_force():
    """Prompts of different lengths and limits searched together, a stop token ending a
    beam early: with a beam for every prefix the last step extends (4**2), each prompt gets
    the most likely of all its continuations (each cut at its first stop token), and what it
    gets alone."""
    config = TransformerXLConfig.from_preset("tiny", n_token=4, cutoffs=[], mem_len=16, same_length=False)
    model = TransformerXLLM(config)
    randomize(model, scale=1.0)
    prompts, limits, stop = [np.array([0, 2, 1], "int32"), np.array([3, 1], "int32")], [2, 3], 3
    sampler = samplers.BeamSampler(num_beams=16, length_penalty=0.0)  # every prefix the last step extends
    found = [row[len(p):].tolist() for row, p in
             zip(generate(model, prompts, limits, sampler=sampler, stop_token=stop), prompts)]
    for prompt, limit, got in zip(prompts, limits, found):
        # every continuation of `limit` tokens scored in one call, each cut at its first stop
        every = np.array(list(itertools.product(range(4), repeat=limit)), "int32")
        ids = np.concatenate([np.repeat(prompt[None], len(every), axis=0), every], axis=1)
        nll = to_np(model(ids[:, :-1], targets=ids[:, 1:])["nll"])[:, len(prompt) - 1:]
        likelihoods = {}
        for new, token_nll in zip(every.tolist(), nll):
            cut = new.index(stop) + 1 if stop in new else limit
            likelihoods[tuple(new[:cut])] = -token_nll[:cut].sum()
        assert tuple(got) == max(likelihoods, key=likelihoods.get)
        assert got == generate(model, [prompt], limit, sampler=sampler, stop_token=stop)[0][len(prompt):].tolist()


def test_a_long_beam_search_logs_its_steps_and_finds_what_one_piece_finds(monkeypatch, caplog):
    """Run in pieces of at most 2 steps with progress logged at once, the search logs each
    piece's step and returns the continuation that pieces of up to 64 steps return."""
    from txl_keras.generate import loop

    config = TransformerXLConfig.from_preset("tiny", n_token=6, cutoffs=[], mem_len=4)
    prompt, sampler = np.array([0, 2, 1, 5, 3], "int32"), samplers.BeamSampler(num_beams=3, length_penalty=0.0)
    whole_model = TransformerXLLM(config)
    randomize(whole_model, scale=1.0)
    whole = beam_search(whole_model, prompt, 7, sampler)
    pieces_model = TransformerXLLM(config)
    pieces_model.set_weights(whole_model.get_weights())
    monkeypatch.setattr(loop, "DECODE_CHUNK", 2)
    monkeypatch.setattr(loop, "PROGRESS_AFTER_S", 0.0)
    with caplog.at_level("INFO", logger=loop.__name__):
        in_pieces = beam_search(pieces_model, prompt, 7, sampler)
    assert in_pieces.tolist() == whole.tolist()
    steps = [int(r.getMessage().split("step ")[1].split(" of at most 7")[0]) for r in caplog.records
             if r.name == loop.__name__]
    assert steps and steps == sorted(set(steps)) and 0 < steps[0] and steps[-1] < 7
    assert all(b - a <= 2 for a, b in zip([0] + steps, steps))


def test_streaming_joins_to_generate(lm):
    sampler = samplers.TopKSampler(k=4, seed=9)
    pieces = list(lm.stream("alpha beta", max_new_tokens=12, sampler=sampler, stop_token_ids=None))
    assert len(pieces) > 1
    assert "".join(pieces) == lm.generate("alpha beta", max_new_tokens=12, sampler=sampler, stop_token_ids=None,
                                          strip_prompt=True)
    with pytest.raises(ValueError, match="BeamSampler chooses its tokens at the end"):
        list(lm.stream("alpha", max_new_tokens=2, sampler="beam"))


@pytest.mark.parametrize("call, message", [
    (lambda lm: lm.generate("", max_new_tokens=2), "encodes to at least one token"),
    (lambda lm: lm.generate([], max_new_tokens=2), "non-empty list"),
    (lambda lm: lm.generate("alpha beta gamma", max_length=2), "below the length of a prompt"),
    (lambda lm: lm.generate("alpha", max_new_tokens=-1), "max_new_tokens"),
    (lambda lm: lm.generate("alpha", max_length=5, max_new_tokens=2), "not both"),
    (lambda lm: lm.generate("alpha", sampler="nucleus"), "Unknown sampler 'nucleus'"),
    (lambda lm: lm.generate("alpha", sampler=samplers.BeamSampler(num_beams=0)), "num_beams"),
    (lambda lm: lm.generate("alpha", stop_token_ids=["zebra"]), "neither a symbol of the vocabulary nor a text of one"),
    (lambda lm: lm.generate("alpha", stop_token_ids=[99]), r"token ids in \[0, 10\)"),
    (lambda lm: lm.generate("alpha", sampler=samplers.TopKSampler(k=0)), "`k` to be a positive integer"),
    (lambda lm: lm.generate("alpha", sampler=samplers.TopPSampler(p=0.0)), r"`p` in \(0, 1\]"),
])
def test_bad_generation_inputs_are_clear_errors(lm, call, message):
    with pytest.raises(ValueError, match=message):
        call(lm)
