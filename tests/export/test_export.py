import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from conftest import SMALL_ADAPTIVE, randomize, to_np

from txl_keras import TransformerXLConfig, TransformerXLLM

pytestmark = pytest.mark.skipif(keras.config.backend() != "tensorflow", reason="TensorFlow export")

WORDS = ["<eos>", "<unk>", "alpha", "beta", "gamma"] + [f"w{i}" for i in range(35)]  # n_token 40
GENERATOR_WORDS = ["<eos>", "<unk>", "alpha", "beta", "gamma", "delta", "kappa"]
PROMPTS = ["alpha beta gamma delta kappa alpha beta", "gamma", "delta kappa\nalpha"]
SAMPLED = {"greedy": (0.0, 0, 0), "top_k": (0.8, 3, 7), "random": (0.9, 0, 5)}  # temperature, top_k, seed

# Run in a process where txl_keras, tf_records and txl_io cannot be imported: everything a
# server without the library does with the two SavedModels.
SERVER = r"""
import sys, json
sys.modules["txl_keras"] = None
sys.modules["tf_records"] = None
sys.modules["txl_io"] = None
import numpy as np, tensorflow as tf
scorer, generator, data = tf.saved_model.load(sys.argv[1]), tf.saved_model.load(sys.argv[2]), np.load(sys.argv[3])
out = {}

# Three consecutive segments, the memory carried from each call to the next.
state = scorer.initial_memory(tf.constant(2))
valid, mems = state["memory_valid"], [state["mem_%d" % i] for i in range(2)]
for k in range(3):
    x, y = data["x%d" % k], data["y%d" % k]
    scored = scorer.score(x, y, valid, *mems)
    nxt = scorer.next_log_probs(x, valid, *mems)
    out["nll%d" % k] = scored["nll"].numpy().tolist()
    out["last%d" % k] = nxt["log_probs"].numpy().tolist()
    valid, mems = scored["new_memory_valid"], [scored["new_mem_%d" % i] for i in range(2)]

# Text in, ids, memory, text out, by the signatures' argument names.
out["ids"] = scorer.encode(tf.constant("alpha gamma beta"))["ids"].numpy().tolist()
out["settings"] = json.loads(scorer.vocabulary()["settings"].numpy())
state = scorer.initial_memory(batch_size=tf.constant(1))
step = scorer.next_log_probs(tokens=tf.constant([out["ids"]], tf.int32), memory_valid=state["memory_valid"],
                             **{f"mem_{i}": state[f"mem_{i}"] for i in range(2)})
out["log_probs_shape"] = step["log_probs"].shape.as_list()
nxt = int(tf.argmax(step["log_probs"][0]))
out["text"] = scorer.decode(tf.constant(out["ids"] + [nxt]))["text"].numpy().decode()
errors = []
for tokens, valid in (([[1, 500]], state["memory_valid"]), ([[1, 2]], tf.constant([-5])), ([[1, 2]], tf.constant([99]))):
    try:
        scorer.score(tf.constant(tokens), tf.constant([[1, 2]]), valid, *[state[f"mem_{i}"] for i in range(2)])
        errors.append("none")
    except tf.errors.InvalidArgumentError as e:
        errors.append(e.message.split("assertion failed: [")[1].split("] [")[0].strip().rstrip("."))
out["errors"] = errors

# The whole generation in the graph, and serving_default.
prompts = tf.constant(json.loads(sys.argv[4]))
for name, (temperature, top_k, seed) in json.loads(sys.argv[5]).items():
    texts = generator.generate(prompts=prompts, max_new_tokens=tf.constant(9), temperature=tf.constant(temperature),
                               top_k=tf.constant(top_k), seed=tf.constant(seed))["texts"]
    out[name] = [t.decode() for t in texts.numpy()]
default = generator.signatures["serving_default"](prompts=prompts, max_new_tokens=tf.constant(9),
                                                  temperature=tf.constant(0.0), top_k=tf.constant(0),
                                                  seed=tf.constant(0))
out["serving_default"] = [t.decode() for t in default["texts"].numpy()]
generate_errors = []
for changed in (dict(prompts=[""]), dict(max_new_tokens=-1), dict(max_new_tokens=10**7), dict(temperature=-1.0),
                dict(temperature=float("nan")), dict(top_k=-3), dict(seed=-1)):
    arguments = {**dict(prompts=["gamma"], max_new_tokens=3, temperature=0.0, top_k=0, seed=0), **changed}
    try:
        generator.generate(**{k: tf.constant(v) for k, v in arguments.items()})
        generate_errors.append("none")
    except tf.errors.InvalidArgumentError as e:
        generate_errors.append(e.message.split("assertion failed: [")[-1].split("; received]")[0])
out["generate_errors"] = generate_errors
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Two SavedModels and what a process without txl_keras got from them: the small
    adaptive model (never called before its export) with a word vocabulary, and a tiny
    generator whose clamp_len is below a segment's keys (the released models' setting)."""
    from tf_records.vocabulary import Vocabulary
    from txl_keras import TransformerXLCausalLM, TransformerXLCausalLMPreprocessor, TransformerXLTokenizer
    from txl_keras.export import export_saved_model

    folder = tmp_path_factory.mktemp("saved_models")
    model = TransformerXLLM(TransformerXLConfig(**SMALL_ADAPTIVE))
    assert model.built and model.count_params() > 0  # built on construction: the config knows every shape
    randomize(model, scale=0.3)
    vocab = Vocabulary(WORDS, level="word", add_eos=True, unk_symbol="<unk>")
    export_saved_model(model, str(folder / "scorer"), vocab)

    generator_vocab = Vocabulary(GENERATOR_WORDS, add_eos=True, unk_symbol="<unk>")
    generator = TransformerXLLM(TransformerXLConfig.from_preset(
        "tiny", n_token=len(generator_vocab), cutoffs=[], tgt_len=4, mem_len=6, clamp_len=3, same_length=False))
    lm = TransformerXLCausalLM(generator, TransformerXLCausalLMPreprocessor(TransformerXLTokenizer(generator_vocab), 4))
    export_saved_model(generator, str(folder / "generator"), generator_vocab)

    rng = np.random.default_rng(0)
    data = {f"{name}{k}": rng.integers(0, 40, (2, 4)).astype("int32") for k in range(3) for name in "xy"}
    np.savez(folder / "data.npz", **data)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    result = subprocess.run([sys.executable, "-c", SERVER, str(folder / "scorer"), str(folder / "generator"),
                             str(folder / "data.npz"), json.dumps(PROMPTS), json.dumps(SAMPLED)],
                            capture_output=True, text=True, env=env, cwd=str(folder), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    served = json.loads(result.stdout.strip().splitlines()[-1])
    return dict(folder=folder, model=model, vocab=vocab, lm=lm, data=data, served=served)


def test_saved_model_matches_keras_over_consecutive_segments(exported):
    model, data, served = exported["model"], exported["data"], exported["served"]
    mems = None
    for k in range(3):
        out = model(data[f"x{k}"], targets=data[f"y{k}"], mems=mems, return_log_probs=True)
        mems = out["mems"]
        np.testing.assert_allclose(served[f"nll{k}"], to_np(out["nll"]), atol=1e-4)
        np.testing.assert_allclose(served[f"last{k}"], to_np(out["log_probs"])[:, -1], atol=1e-4)


def test_a_saved_model_loaded_here_scores_as_the_model(exported):
    import tensorflow as tf

    loaded = tf.saved_model.load(str(exported["folder"] / "scorer"))
    state = loaded.initial_memory(tf.constant(1))
    tokens = tf.constant([[1, 2, 3]], tf.int32)
    out = loaded.score(tokens, tokens, state["memory_valid"], *[state[f"mem_{i}"] for i in range(2)])
    direct = exported["model"](np.array([[1, 2, 3]], "int32"), targets=np.array([[1, 2, 3]], "int32"))["nll"]
    np.testing.assert_allclose(out["nll"].numpy(), to_np(direct), atol=1e-5)


def test_a_saved_model_with_its_vocabulary_serves_text_without_txl_keras(exported, tmp_path):
    from tf_records.vocabulary import Vocabulary
    from txl_keras.export import export_saved_model

    model, served = exported["model"], exported["served"]
    with pytest.raises(ValueError, match="The vocabulary has 5 symbols but the model has n_token=40"):
        export_saved_model(model, str(tmp_path / "wrong"), Vocabulary(WORDS[:5], level="word"))
    assert not os.path.exists(tmp_path / "wrong")
    assert Vocabulary.load(str(exported["folder"] / "scorer" / "assets" / "vocab.json")).symbols == WORDS
    assert served["ids"] == [2, 4, 3] and served["settings"]["level"] == "word"
    assert served["log_probs_shape"] == [1, 40]
    want = int(np.argmax(to_np(model(np.array([[2, 4, 3]], "int32"), return_log_probs=True)["log_probs"])[0, -1]))
    assert served["text"] == "alpha gamma beta " + WORDS[want]
    assert served["errors"] == ["`tokens` must hold token ids in [0, n_token=40)",
                                "`memory_valid` must be in [0, mem_len=6]", "`memory_valid` must be in [0, mem_len=6]"]


UNUSUAL_SPACES = "the\u00a0history\u3000of\u2028the\x1chistory\x0bof\x85the\t\x1fhistory\u2029of\u200athe\x1d"


@pytest.mark.parametrize("level,text", [("char", "héllo"), ("byte", "héllo"), ("word", UNUSUAL_SPACES)])
def test_the_text_signatures_follow_the_vocabularys_rules(level, text):
    """The `encode` and `decode` functions the export traces, run as graphs (the saved and
    loaded ones are checked on a word vocabulary above)."""
    import tensorflow as tf

    from tf_records.vocabulary import Vocabulary
    from txl_keras.export import _text_signatures
    from txl_keras.tokenizers import TransformerXLTokenizer

    if level == "word":  # white space and line breaks as the records' encoder (Python's str) sees them
        symbols = ["<eos>", "<unk>", "the", "history", "of"] + [f"w{i}" for i in range(35)]
    elif level == "char":
        symbols = list("hélo ") + [f"c{i}" for i in range(35)]
    else:
        symbols = [str(b) for b in sorted(set(text.encode()))]
        symbols += [f"b{i}" for i in range(40 - len(symbols))]
    vocab = Vocabulary(symbols, level=level, **({"unk_symbol": "<unk>"} if level == "word" else {}))
    signatures = _text_signatures(TransformerXLTokenizer(vocab))
    encode, decode = (tf.function(function, input_signature=spec, autograph=False) for function, spec in
                      (signatures["encode"], signatures["decode"]))  # as the export traces them
    ids = encode(tf.constant(text))["ids"].numpy().tolist()
    assert ids == vocab.encode_prompt(text).tolist()
    if level == "word":
        assert 1 not in ids and len(ids) > 9  # every word known: split where Python splits
        return
    assert decode(tf.constant(ids))["text"].numpy().decode() == vocab.decode(ids) == text


def test_the_saved_models_generate_is_the_tasks_generate_without_txl_keras(exported):
    from txl_keras.samplers import RandomSampler, TopKSampler

    lm, served = exported["lm"], exported["served"]
    greedy = lm.generate(PROMPTS, max_new_tokens=9, sampler="greedy")
    assert served["greedy"] == greedy and served["serving_default"] == greedy
    assert served["top_k"] == lm.generate(PROMPTS, max_new_tokens=9, sampler=TopKSampler(k=3, temperature=0.8, seed=7))
    assert served["random"] == lm.generate(PROMPTS, max_new_tokens=9, sampler=RandomSampler(temperature=0.9, seed=5))
    # each text ends at its first end symbol, and nothing follows it: the text drawn without stops, cut there
    free = lm.generate(PROMPTS, max_new_tokens=9, sampler=RandomSampler(temperature=0.9, seed=5), stop_token_ids=None)
    ids = [lm.tokenizer.tokenize_prompt(t).numpy().tolist() for t in free]
    starts = [len(lm.tokenizer.tokenize_prompt(p).numpy()) for p in PROMPTS]
    cut = [row[: start + row[start:].index(0) + 1] if 0 in row[start:] else row for row, start in zip(ids, starts)]
    assert served["random"] == [lm.tokenizer.detokenize(row) for row in cut]
    assert served["random"] != free  # an end symbol was met


def test_the_saved_models_generate_names_each_bad_argument(exported):
    assert exported["served"]["generate_errors"] == [
        "Invalid argument of generate: each of `prompts` must encode to at least one token (an empty prompt has "
        "nothing to continue)"] + ["Invalid argument of generate: `max_new_tokens` must be in [0, 4096] (continue a "
                                   "longer text by calling generate again)"] * 2 + [
        "Invalid argument of generate: `temperature` must be a finite number >= 0 (0: greedy)"] * 2 + [
        "Invalid argument of generate: `top_k` must be >= 0 (0: every token)",
        "Invalid argument of generate: `seed` must be >= 0"]


def test_the_export_traces_each_endpoint_once(tmp_path, monkeypatch):
    """Counted by the model's cached calls: an export makes as many as one trace of each
    endpoint made by hand (a second trace inside `tf.saved_model.save` would double them)."""
    import tensorflow as tf

    from tf_records.vocabulary import Vocabulary
    from txl_keras import export
    from txl_keras.tokenizers import TransformerXLTokenizer

    vocab = Vocabulary(GENERATOR_WORDS, add_eos=True, unk_symbol="<unk>")
    model = TransformerXLLM(TransformerXLConfig.from_preset("tiny", n_token=len(vocab), cutoffs=[], tgt_len=4,
                                                            mem_len=6, clamp_len=3))
    calls = []
    call_with_cache = TransformerXLLM.call_with_cache
    monkeypatch.setattr(TransformerXLLM, "call_with_cache",
                        lambda self, *a, **k: calls.append(1) or call_with_cache(self, *a, **k))
    serving = model.config.with_memory(None, None, None)
    endpoints = {"generate": export._generate_signature(model, serving, TransformerXLTokenizer(vocab)),
                 **export._signatures(model, serving)}
    for function, spec in endpoints.values():
        tf.function(function, input_signature=spec, autograph=False).get_concrete_function()
    once = len(calls)
    assert once > len(endpoints) - 1  # every endpoint but initial_memory runs the model
    calls.clear()
    export.export_saved_model(model, str(tmp_path / "saved"), vocab)
    assert len(calls) == once
