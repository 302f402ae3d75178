"""A new search strategy is one class in one file: min-p sampling (keep the tokens whose
probability is at least `min_p` times the most likely one's), written here and used by the
task's `generate` with nothing else changed."""

import numpy as np
import pytest
from conftest import word_task
from keras import ops

from txl_keras import samplers


class MinPSampler(samplers.RandomSampler):
    """A draw among the tokens with probability >= `min_p` * the largest probability."""

    def __init__(self, min_p=0.1, temperature=1.0, seed=None):
        super().__init__(temperature, seed)
        self.min_p = float(min_p)

    def filter(self, logits):
        cut = ops.max(logits, axis=-1, keepdims=True) + float(np.log(self.min_p))
        return ops.where(logits < cut, -np.inf, logits)

    def get_config(self):
        return {"min_p": self.min_p, **super().get_config()}


PROMPTS = ["alpha beta", "gamma", "delta kappa omega sigma"]


@pytest.fixture(scope="module")
def lm():
    return word_task()


def test_min_p_draws_only_tokens_above_its_cut_brute_force():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 40)).astype("float32") * 3.0
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    sampler = MinPSampler(min_p=0.3, seed=1)
    probs = np.exp(log_probs)
    allowed = probs >= 0.3 * probs.max(-1, keepdims=True)
    drawn = set()
    for step in range(64):
        keys = np.stack([np.full(6, 1, "int32"), np.full(6, step, "int32")], axis=-1)
        tokens = np.asarray(sampler(log_probs, keys))
        assert allowed[np.arange(6), tokens].all()
        drawn |= {(r, int(t)) for r, t in enumerate(tokens)}
    assert len(drawn) > 6  # it draws, not only the most likely token


def test_min_p_in_generate_meets_greedy_and_random_at_its_ends_and_batches_exactly(lm):
    greedy = lm.generate(PROMPTS, max_new_tokens=8, sampler="greedy", stop_token_ids=None)
    assert lm.generate(PROMPTS, max_new_tokens=8, sampler=MinPSampler(min_p=1.0, seed=3), stop_token_ids=None) == greedy
    unfiltered = lm.generate(PROMPTS, max_new_tokens=8, sampler=MinPSampler(min_p=1e-30, seed=7),
                             stop_token_ids=None)
    assert unfiltered == lm.generate(PROMPTS, max_new_tokens=8, sampler=samplers.RandomSampler(seed=7),
                                     stop_token_ids=None)
    sampler = MinPSampler(min_p=0.05, temperature=1.5, seed=11)
    together = lm.generate(PROMPTS, max_new_tokens=8, sampler=sampler, stop_token_ids=None)
    assert together == [lm.generate(p, max_new_tokens=8, sampler=sampler, stop_token_ids=None) for p in PROMPTS]
