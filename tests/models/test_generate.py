import numpy as np
import pytest
from conftest import randomize, to_np

from txl_keras import TransformerXLConfig, TransformerXLLM
from txl_keras.generate import generate

CONFIG = dict(n_token=40, n_layer=2, d_model=12, n_head=2, d_head=6, d_inner=20, dropout=0.0,
              tgt_len=4, mem_len=6, cutoffs=[10, 24], div_val=2, proj_share_all_but_first=True,
              untie_r=True, same_length=True, clamp_len=5)


def model_of(**overrides):
    model = TransformerXLLM(TransformerXLConfig(**{**CONFIG, **overrides}))
    model.build((None, 4))
    randomize(model, scale=0.3)
    return model


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
