import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from conftest import SMALL_ADAPTIVE, small_adaptive_model, to_np

from txl_keras import TransformerXLConfig, TransformerXLLM

pytestmark = pytest.mark.skipif(keras.config.backend() != "tensorflow", reason="TensorFlow export")

CONFIG = SMALL_ADAPTIVE
model_of = small_adaptive_model


LOADER = r"""
import sys, json
sys.modules["txl_keras"] = None  # prove the SavedModel needs no txl_keras code
sys.modules["tf_records"] = None
sys.modules["txl_io"] = None
import numpy as np, tensorflow as tf
path, data = sys.argv[1], np.load(sys.argv[2])
loaded = tf.saved_model.load(path)
state = loaded.initial_memory(tf.constant(2))
valid, mems = state["memory_valid"], [state["mem_%d" % i] for i in range(2)]
out = {}
for k in range(3):
    x, y = data["x%d" % k], data["y%d" % k]
    scored = loaded.score(x, y, valid, *mems)
    nxt = loaded.next_log_probs(x, valid, *mems)
    out["nll%d" % k] = scored["nll"].numpy().tolist()
    out["last%d" % k] = nxt["log_probs"].numpy().tolist()
    valid, mems = scored["new_memory_valid"], [scored["new_mem_%d" % i] for i in range(2)]
print(json.dumps(out))
"""


def test_saved_model_matches_keras_over_consecutive_segments(tmp_path):
    from txl_keras.export import export_saved_model

    model = model_of()
    export_saved_model(model, str(tmp_path / "exported"))
    rng = np.random.default_rng(0)
    data = {}
    for k in range(3):
        data[f"x{k}"] = rng.integers(0, 40, (2, 4)).astype("int32")
        data[f"y{k}"] = rng.integers(0, 40, (2, 4)).astype("int32")
    np.savez(tmp_path / "data.npz", **data)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    result = subprocess.run([sys.executable, "-c", LOADER, str(tmp_path / "exported"), str(tmp_path / "data.npz")],
                            capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    served = json.loads(result.stdout.strip().splitlines()[-1])
    mems = None
    for k in range(3):
        out = model(data[f"x{k}"], targets=data[f"y{k}"], mems=mems, return_log_probs=True)
        mems = out["mems"]
        np.testing.assert_allclose(served[f"nll{k}"], to_np(out["nll"]), atol=1e-4)
        np.testing.assert_allclose(served[f"last{k}"], to_np(out["log_probs"])[:, -1], atol=1e-4)


def test_a_model_fresh_from_its_config_is_built_and_exported(tmp_path):
    import tensorflow as tf

    from txl_keras.export import export_saved_model

    model = TransformerXLLM(TransformerXLConfig(**CONFIG))
    assert model.built and model.count_params() > 0  # built on construction: the config knows every shape
    export_saved_model(model, str(tmp_path / "exported"))
    loaded = tf.saved_model.load(str(tmp_path / "exported"))
    state = loaded.initial_memory(tf.constant(1))
    tokens = tf.constant([[1, 2, 3]], tf.int32)
    out = loaded.score(tokens, tokens, state["memory_valid"], *[state[f"mem_{i}"] for i in range(2)])
    direct = model(np.array([[1, 2, 3]], "int32"), targets=np.array([[1, 2, 3]], "int32"))["nll"]
    np.testing.assert_allclose(out["nll"].numpy(), to_np(direct), atol=1e-5)


SERVER = r"""
import sys, json
sys.modules["txl_keras"] = None  # a server without txl_keras: text in, ids, memory, text out
sys.modules["tf_records"] = None
sys.modules["txl_io"] = None
import tensorflow as tf
loaded = tf.saved_model.load(sys.argv[1])
out = {"ids": loaded.encode(tf.constant("alpha gamma beta"))["ids"].numpy().tolist()}
out["settings"] = json.loads(loaded.vocabulary()["settings"].numpy())
state = loaded.initial_memory(batch_size=tf.constant(1))
ids = tf.constant([out["ids"]], tf.int32)
step = loaded.next_log_probs(tokens=ids, memory_valid=state["memory_valid"],
                             **{f"mem_{i}": state[f"mem_{i}"] for i in range(2)})  # the signatures' names
out["log_probs_shape"] = step["log_probs"].shape.as_list()
nxt = int(tf.argmax(step["log_probs"][0]))
out["text"] = loaded.decode(tf.constant(out["ids"] + [nxt]))["text"].numpy().decode()
errors = []
for tokens, valid in (([[1, 500]], state["memory_valid"]), ([[1, 2]], tf.constant([-5])), ([[1, 2]], tf.constant([99]))):
    try:
        loaded.score(tf.constant(tokens), tf.constant([[1, 2]]), valid, *[state[f"mem_{i}"] for i in range(2)])
        errors.append("none")
    except tf.errors.InvalidArgumentError as e:
        errors.append(e.message.split("assertion failed: [")[1].split("] [")[0].strip().rstrip("."))
out["errors"] = errors
print(json.dumps(out))
"""


def test_a_saved_model_with_its_vocabulary_serves_text_without_txl_keras(tmp_path):
    from tf_records.vocabulary import Vocabulary
    from txl_keras.export import export_saved_model

    model = model_of()  # n_token 40
    symbols = ["<eos>", "<unk>", "alpha", "beta", "gamma"] + [f"w{i}" for i in range(35)]
    vocab = Vocabulary(symbols, level="word", add_eos=True, unk_symbol="<unk>")
    with pytest.raises(ValueError, match="The vocabulary has 5 symbols but the model has n_token=40"):
        export_saved_model(model, str(tmp_path / "wrong"), Vocabulary(symbols[:5], level="word"))
    assert not os.path.exists(tmp_path / "wrong")
    export_saved_model(model, str(tmp_path / "exported"), vocab)
    assert Vocabulary.load(str(tmp_path / "exported" / "assets" / "vocab.json")).symbols == symbols
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    result = subprocess.run([sys.executable, "-c", SERVER, str(tmp_path / "exported")], capture_output=True,
                            text=True, env=env, cwd=str(tmp_path), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    served = json.loads(result.stdout.strip().splitlines()[-1])
    assert served["ids"] == [2, 4, 3] and served["settings"]["level"] == "word"
    assert served["log_probs_shape"] == [1, 40]
    want = int(np.argmax(to_np(model(np.array([[2, 4, 3]], "int32"), return_log_probs=True)["log_probs"])[0, -1]))
    assert served["text"] == "alpha gamma beta " + symbols[want]
    assert served["errors"] == ["`tokens` must hold token ids in [0, n_token=40)",
                                "`memory_valid` must be in [0, mem_len=6]", "`memory_valid` must be in [0, mem_len=6]"]


UNUSUAL_SPACES = "the\u00a0history\u3000of\u2028the\x1chistory\x0bof\x85the\t\x1fhistory\u2029of\u200athe\x1d"


@pytest.mark.parametrize("level,text", [("char", "héllo"), ("byte", "héllo"), ("word", UNUSUAL_SPACES)])
def test_the_text_signatures_follow_the_vocabularys_rules(tmp_path, level, text):
    import tensorflow as tf

    from tf_records.vocabulary import Vocabulary
    from txl_keras.export import export_saved_model

    model = model_of()
    if level == "word":  # white space and line breaks as the records' encoder (Python's str) sees them
        symbols = ["<eos>", "<unk>", "the", "history", "of"] + [f"w{i}" for i in range(35)]
    elif level == "char":
        symbols = list("hélo ") + [f"c{i}" for i in range(35)]
    else:
        symbols = [str(b) for b in sorted(set(text.encode()))]
        symbols += [f"b{i}" for i in range(40 - len(symbols))]
    vocab = Vocabulary(symbols, level=level, **({"unk_symbol": "<unk>"} if level == "word" else {}))
    export_saved_model(model, str(tmp_path / "exported"), vocab)
    loaded = tf.saved_model.load(str(tmp_path / "exported"))
    ids = loaded.encode(tf.constant(text))["ids"].numpy().tolist()
    assert ids == vocab.encode_prompt(text).tolist()
    if level == "word":
        assert 1 not in ids and len(ids) > 9  # every word known: split where Python splits
        return
    assert loaded.decode(tf.constant(ids))["text"].numpy().decode() == vocab.decode(ids) == text


GENERATOR = r"""
import sys, json
sys.modules["txl_keras"] = None  # the whole generation runs in the SavedModel's graph
sys.modules["tf_records"] = None
sys.modules["txl_io"] = None
import tensorflow as tf
loaded = tf.saved_model.load(sys.argv[1])
prompts = tf.constant(json.loads(sys.argv[2]))
out = {}
for name, (temperature, top_k, seed) in {"greedy": (0.0, 0, 0), "top_k": (0.8, 3, 7),
                                          "random": (0.9, 0, 5)}.items():
    texts = loaded.generate(prompts=prompts, max_new_tokens=tf.constant(9), temperature=tf.constant(temperature),
                            top_k=tf.constant(top_k), seed=tf.constant(seed))["texts"]
    out[name] = [t.decode() for t in texts.numpy()]
default = loaded.signatures["serving_default"](prompts=prompts, max_new_tokens=tf.constant(9),
                                               temperature=tf.constant(0.0), top_k=tf.constant(0), seed=tf.constant(0))
out["serving_default"] = [t.decode() for t in default["texts"].numpy()]
print(json.dumps(out))
"""


def test_the_saved_models_generate_is_the_tasks_generate_without_txl_keras(tmp_path):
    from tf_records.vocabulary import Vocabulary
    from txl_keras import TransformerXLCausalLM, TransformerXLCausalLMPreprocessor, TransformerXLTokenizer
    from txl_keras.export import export_saved_model
    from txl_keras.samplers import RandomSampler, TopKSampler

    vocab = Vocabulary(["<eos>", "<unk>", "alpha", "beta", "gamma", "delta", "kappa"], add_eos=True,
                       unk_symbol="<unk>")
    # clamp_len below the keys of a segment (memory and segment): the released models' setting
    model = TransformerXLLM(TransformerXLConfig.from_preset("tiny", n_token=len(vocab), cutoffs=[], tgt_len=4,
                                                            mem_len=6, clamp_len=3, same_length=False))
    lm = TransformerXLCausalLM(model, TransformerXLCausalLMPreprocessor(TransformerXLTokenizer(vocab), 4))
    export_saved_model(model, str(tmp_path / "exported"), vocab)
    prompts = ["alpha beta gamma delta kappa alpha beta", "gamma", "delta kappa\nalpha"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    result = subprocess.run([sys.executable, "-c", GENERATOR, str(tmp_path / "exported"), json.dumps(prompts)],
                            capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    served = json.loads(result.stdout.strip().splitlines()[-1])
    greedy = lm.generate(prompts, max_new_tokens=9, sampler="greedy")
    assert served["greedy"] == greedy and served["serving_default"] == greedy
    assert served["top_k"] == lm.generate(prompts, max_new_tokens=9, sampler=TopKSampler(k=3, temperature=0.8, seed=7))
    assert served["random"] == lm.generate(prompts, max_new_tokens=9, sampler=RandomSampler(temperature=0.9, seed=5))
