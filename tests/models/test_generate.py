import numpy as np
import pytest
from conftest import small_adaptive_model, to_np

from txl_keras.generate import generate

model_of = small_adaptive_model


def test_greedy_generation_equals_argmax_of_full_recomputation():
    model = model_of(mem_len=32, same_length=False, clamp_len=-1)
    prompt = np.array([[3, 17, 5, 9, 30, 2, 11], [1, 1, 2, 3, 5, 8, 13]], "int32")
    out = generate(model, prompt, max_new_tokens=8, temperature=0)
    assert out.shape == (2, 15)
    sequence = prompt.copy()
    for _ in range(8):
        log_probs = to_np(model(sequence, return_log_probs=True)["log_probs"])[:, -1]
        sequence = np.concatenate([sequence, log_probs.argmax(-1)[:, None].astype("int32")], 1)
    np.testing.assert_array_equal(out, sequence)


def test_sampling_is_seeded_and_filtered():
    model = model_of()
    prompt = np.array([[3, 17, 5]], "int32")
    a = generate(model, prompt, 10, temperature=1.0, seed=7)
    b = generate(model, prompt, 10, temperature=1.0, seed=7)
    c = generate(model, prompt, 10, temperature=1.0, seed=8)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    np.testing.assert_array_equal(generate(model, prompt, 6, top_k=1, seed=3),
                                  generate(model, prompt, 6, temperature=0))
    np.testing.assert_array_equal(generate(model, prompt, 6, top_p=1e-6, seed=3),
                                  generate(model, prompt, 6, temperature=0))


def test_stop_token_ends_rows():
    model = model_of()
    prompt = np.array([[3, 17, 5]], "int32")
    greedy = generate(model, prompt, 6, temperature=0)
    stop = int(greedy[0, 4])  # the second generated token
    out = generate(model, prompt, 6, temperature=0, stop_token=stop)
    np.testing.assert_array_equal(out[0, :5], greedy[0, :5])
    assert (out[0, 5:] == stop).all()
    with pytest.raises(ValueError, match="Prompt ids"):
        generate(model, np.array([[99]]), 2)
