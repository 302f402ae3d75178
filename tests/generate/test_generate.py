import gc
import weakref

import numpy as np
import pytest
from conftest import randomize, small_adaptive_model, to_np

from txl_keras.generate import _COMPILED, generate

model_of = small_adaptive_model


def test_greedy_generation_equals_argmax_of_full_recomputation():
    """A memory longer than the whole text: each new token sees every earlier one, so the
    model run once on the whole output (causal) must put its argmax on every generated
    token."""
    model = model_of(mem_len=32, same_length=False, clamp_len=-1)
    randomize(model, scale=1.0)  # peaked attention: a wrong position key changes the argmax
    prompt = np.array([[3, 17, 5, 9, 30, 2, 11], [1, 1, 2, 3, 5, 8, 13]], "int32")
    out = generate(model, prompt, max_new_tokens=8, temperature=0)
    assert out.shape == (2, 15)
    np.testing.assert_array_equal(out[:, :7], prompt)
    log_probs = to_np(model(out[:, :-1], return_log_probs=True)["log_probs"])
    np.testing.assert_array_equal(log_probs[:, 6:].argmax(-1), out[:, 7:])


def test_greedy_generation_with_a_short_memory_equals_stepping_the_model():
    """mem_len 5 < the text, clamp_len 3, same_length (attn_type 1's key/value-only memory
    is checked in test_transformer_xl_lm): the reference runs the model itself on the
    prompt's segments and then token by token, carrying its hidden-state memory
    (keys and position keys recomputed at every call); generation keeps only the keys and
    values and projects the position keys once."""
    model = model_of(mem_len=5, same_length=True, clamp_len=3)
    randomize(model, scale=1.0)  # peaked attention: a wrong position key changes the argmax
    prompt = np.array([[3, 17, 5, 9, 30, 2, 11, 4, 4, 20], [1, 1, 2, 3, 5, 8, 13, 21, 34, 0]], "int32")
    out = generate(model, prompt, max_new_tokens=7, temperature=0)
    mems, tgt_len = None, model.config.tgt_len
    for start in range(0, prompt.shape[1] - 1, tgt_len):
        mems = model(prompt[:, start:min(start + tgt_len, prompt.shape[1] - 1)], mems=mems)["mems"]
    sequence, last = prompt, prompt[:, -1:]
    for _ in range(7):
        result = model(last, mems=mems, return_log_probs=True)
        mems, last = result["mems"], to_np(result["log_probs"])[:, -1].argmax(-1)[:, None].astype("int32")
        sequence = np.concatenate([sequence, last], 1)
    np.testing.assert_array_equal(out, sequence)


def test_sampling_is_seeded_and_filtered():
    model = model_of()
    prompt = np.array([[3, 17, 5]], "int32")
    a = generate(model, prompt, 10, temperature=1.0, seed=7)
    b = generate(model, prompt, 10, temperature=1.0, seed=7)
    c = generate(model, prompt, 10, temperature=1.0, seed=8)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    decoders = lambda: [k for k in _COMPILED[model] if k[0] == "decode"]  # noqa: E731
    assert len(decoders()) == 1  # the three calls share their compiled steps (seed is an input)
    np.testing.assert_array_equal(generate(model, prompt, 6, top_k=1, seed=3),
                                  generate(model, prompt, 6, temperature=0))
    np.testing.assert_array_equal(generate(model, prompt, 6, top_p=1e-6, seed=3),
                                  generate(model, prompt, 6, temperature=0))
    assert len(decoders()) == 4  # one per sampler and length (greedy twice)
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None  # the compiled steps do not keep the model alive


def greedy_cut_at(greedy, prompt_length, stop):
    """A greedy row without stops, cut after the first `stop` of its new tokens."""
    new = list(greedy[prompt_length:])
    return np.asarray(list(greedy[:prompt_length]) + (new[: new.index(stop) + 1] if stop in new else new))


def test_stop_token_ends_rows():
    model = model_of()
    prompt = np.array([[3, 17, 5]], "int32")
    greedy = generate(model, prompt, 6, temperature=0)
    stop = int(greedy[0, 4])  # the second generated token
    out = generate(model, prompt, 6, temperature=0, stop_token=stop)
    expected = greedy_cut_at(greedy[0], 3, stop)
    np.testing.assert_array_equal(out[0, : len(expected)], expected)
    assert (out[0, len(expected):] == -1).all()  # nothing follows the stop
    with pytest.raises(ValueError, match="Prompt ids"):
        generate(model, np.array([[99]]), 2)


def next_token_distribution(model, prompt):
    return np.exp(to_np(model(prompt, return_log_probs=True)["log_probs"])[0, -1])


@pytest.mark.parametrize("filters, kept", [
    (dict(top_k=5), lambda p: np.argsort(-p)[:5]),
    (dict(top_p=0.6), lambda p: np.argsort(-p)[: int(np.searchsorted(np.cumsum(np.sort(p)[::-1]), 0.6)) + 1]),
])
def test_top_k_and_top_p_sample_the_filtered_distribution(filters, kept):
    """4000 draws of the first new token (one row each): the frequencies are those of the
    model's distribution restricted to the kept tokens and renormalised (numpy)."""
    model = model_of(mem_len=8)
    prompt = np.array([[3, 17, 5]], "int32")
    p = next_token_distribution(model, prompt)
    keep = kept(p)
    assert 2 < len(keep) < 30  # a filter that keeps some tokens and drops others
    want = np.zeros_like(p)
    want[keep] = p[keep] / p[keep].sum()
    draws = generate(model, np.repeat(prompt, 4000, 0), 1, temperature=1.0, seed=np.arange(4000), **filters)[:, -1]
    freq = np.bincount(draws, minlength=len(p)) / len(draws)
    assert freq[want == 0].sum() == 0  # nothing outside the kept set
    np.testing.assert_array_less(np.abs(freq - want), 5 * np.sqrt(want * (1 - want) / len(draws)) + 1e-9)


def test_top_p_keeps_the_most_likely_token_at_the_boundary():
    model = model_of(mem_len=8)
    prompt = np.array([[3, 17, 5]], "int32")
    best = int(np.argmax(next_token_distribution(model, prompt)))
    draws = generate(model, np.repeat(prompt, 50, 0), 1, top_p=np.nextafter(0.0, 1.0), seed=np.arange(50))[:, -1]
    assert (draws == best).all()


def test_stop_token_with_a_batch_ends_each_row_on_its_own():
    model = model_of(mem_len=8)
    prompt = np.array([[3, 17, 5], [8, 1, 30]], "int32")
    greedy = generate(model, prompt, 8, temperature=0)
    stop = int(greedy[0, 4])  # row 0's second new token
    out = generate(model, prompt, 8, temperature=0, stop_token=stop)
    listed = generate(model, [row for row in prompt], 8, temperature=0, stop_token=stop)
    for row in range(2):
        expected = greedy_cut_at(greedy[row], 3, stop)
        np.testing.assert_array_equal(out[row, : len(expected)], expected)  # unchanged until it stops
        assert (out[row, len(expected):] == -1).all()  # then nothing
        np.testing.assert_array_equal(listed[row], expected)  # a list of prompts: each row up to its stop
        alone = generate(model, [prompt[row]], 8, temperature=0, stop_token=stop)
        np.testing.assert_array_equal(alone[0], expected)  # alone == in a batch


def test_a_long_generation_runs_in_pieces_that_continue_each_other():
    """More new tokens than one compiled piece of the token loop: the same tokens as one
    step at a time through `stream`, which keeps nothing of the loop's pieces."""
    from txl_keras.generate import DECODE_CHUNK, stream
    from txl_keras.samplers import GreedySampler

    model = model_of(mem_len=8)
    prompt = np.array([3, 17, 5], "int32")
    steps = DECODE_CHUNK * 2 + 5
    out = generate(model, [prompt], steps, temperature=0)[0]
    np.testing.assert_array_equal(out[3:], list(stream(model, prompt, steps, GreedySampler())))
