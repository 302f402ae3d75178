"""`TextModel`: a language model with its vocabulary, text in and text out."""

import dataclasses
import math

import numpy as np

from tf_records import files
from tf_records.vocabulary import Vocabulary
from txl_keras import generate as generation
from txl_keras import pretrained
from txl_keras.run_folder import VOCAB, load_trained_model


@dataclasses.dataclass
class TextScore:
    """How likely a text is under the model.

    Fields:
        tokens: the symbols scored (every token of the text but the first).
        log_likelihoods: float32 `(len(tokens),)`, each token's log-probability (nats)
            given the text before it.
        perplexity: `exp` of the mean negative log-likelihood per token.
        bits_per_character: the total negative log-likelihood in bits over the text's
            characters (bytes at byte level).
    """

    tokens: list
    log_likelihoods: np.ndarray
    perplexity: float
    bits_per_character: float


class TextModel:
    """A `TransformerXLLM` and the vocabulary it was trained with: `generate("The history
    of")` continues a text, `score("some text")` says how likely one is, both carrying the
    memory across segments of long text (the paper's evaluation settings where the model
    carries them). The code underneath is the command lines' (`txl_keras.generate`).

    Args:
        model: a `TransformerXLLM`.
        vocabulary: its `tf_records.vocabulary.Vocabulary` (`n_token` symbols).

    Example:
        >>> text = TextModel.from_preset("transfo_xl_wt103")  # doctest: +SKIP
        >>> text.generate("The history of", max_new_tokens=20)  # doctest: +SKIP
    """

    def __init__(self, model, vocabulary):
        if len(vocabulary) != model.config.n_token:
            raise ValueError(f"The vocabulary has {len(vocabulary)} symbols but the model has n_token="
                             f"{model.config.n_token}; pair the model with the vocabulary of its records.")
        self.model = model
        self.vocabulary = vocabulary

    @classmethod
    def from_preset(cls, preset, url=None, cache_dir=None):
        """A released model's name (`txl_keras.pretrained.RELEASES`), or the path of a run
        folder, a converted folder or a folder in the release layout (see
        `TransformerXLLM.from_preset`)."""
        folder = pretrained.resolve(preset, url=url, cache_dir=cache_dir)
        path = files.join(folder, VOCAB)
        if not files.exists(path):
            raise FileNotFoundError(f"{folder} holds no {VOCAB}: it cannot turn text into ids.")
        return cls(load_trained_model(folder), Vocabulary.load(path))

    def generate(self, prompt, max_new_tokens=100, temperature=1.0, top_k=0, top_p=1.0, seed=0, stop=None):
        """The prompt and its continuation, as text: `max_new_tokens` tokens sampled (see
        `txl_keras.generate.generate`), up to and including the symbol `stop` if given."""
        ids = self.vocabulary.encode_prompt(prompt)
        if len(ids) == 0:
            raise ValueError(f"Expected a prompt that encodes to at least one token. Received: prompt={prompt!r}")
        stop_id = None
        if stop is not None:
            if stop not in self.vocabulary.index:
                raise ValueError(f"Expected `stop` to be a symbol of the vocabulary. Received: stop={stop!r}")
            stop_id = self.vocabulary.index[stop]
        out = generation.generate(self.model, ids[None], max_new_tokens, temperature, top_k, top_p, seed, stop_id)[0]
        new = list(out[len(ids):])
        if stop_id is not None and stop_id in new:
            new = new[: new.index(stop_id) + 1]
        return self.vocabulary.decode(list(ids) + new)

    def score(self, text):
        """A `TextScore` of `text` (its tokens as the vocabulary encodes text: at word level,
        each line followed by its end-of-line symbol)."""
        ids = self.vocabulary.encode_text(text)
        if len(ids) < 2:
            raise ValueError(f"Expected a text of at least 2 tokens (the first is only context). Received: {text!r}")
        nll = generation.score(self.model, ids[None])[0].astype(np.float64)
        characters = len(text.encode("utf-8")) if self.vocabulary.level == "byte" else len(text)
        return TextScore(tokens=[self.vocabulary.symbols[int(i)] for i in ids[1:]],
                         log_likelihoods=(-nll).astype("float32"), perplexity=math.exp(min(nll.mean(), 700)),
                         bits_per_character=float(nll.sum() / math.log(2) / max(characters, 1)))
