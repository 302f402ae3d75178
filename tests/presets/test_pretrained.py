"""The paper's released models in one call, checked offline: stand-in releases
(`release_server`) served by a local HTTP server inside the test."""

import math
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from conftest import to_np
from release_server import STAND_INS, WORDS, Quiet, serve

from txl_keras import releases
from txl_keras import TransformerXLCausalLM
from txl_keras.convert import from_tf_checkpoint

pytestmark = pytest.mark.skipif(keras.config.backend() != "tensorflow", reason="TF checkpoints")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serve(str(tmp_path_factory.mktemp("server"))) as served:
        yield served


def direct_model(server_root, name):
    """The stand-in converted directly from its files at the paper's settings (no download)."""
    release = releases.RELEASES[name]
    return from_tf_checkpoint(os.path.join(server_root, release.folder, "model", f"model.ckpt-{release.step}"),
                              tgt_len=release.tgt_len, mem_len=release.mem_len, clamp_len=release.clamp_len,
                              same_length=True)


@pytest.mark.parametrize("name", sorted(STAND_INS))
def test_from_preset_downloads_converts_caches_and_then_loads_offline(server, tmp_path, name):
    root, url = server
    cache = str(tmp_path / "cache")
    model = TransformerXLCausalLM.from_preset(name, url=url, cache_dir=cache).model
    release = releases.RELEASES[name]
    settings = (model.config.tgt_len, model.config.mem_len, model.config.clamp_len, model.config.same_length)
    assert settings == (release.tgt_len, release.mem_len, release.clamp_len, True)  # the paper's evaluation
    direct = direct_model(root, name)
    x = np.random.default_rng(0).integers(0, model.config.n_token, (2, 9)).astype("int32")
    np.testing.assert_array_equal(to_np(model(x, targets=x)["nll"]), to_np(direct(x, targets=x)["nll"]))
    assert not os.path.exists(os.path.join(cache, "downloads", release.folder))  # converted, then removed
    offline = TransformerXLCausalLM.from_preset(name, url="http://127.0.0.1:9/nothing", cache_dir=cache).model  # no server
    np.testing.assert_array_equal(to_np(offline(x, targets=x)["nll"]), to_np(direct(x, targets=x)["nll"]))


def test_an_interrupted_download_is_retried_and_never_cached_as_complete(server, tmp_path):
    root, url = server
    name = "transfo_xl_wt103"
    data = f"/{releases.RELEASES[name].folder}/model/model.ckpt-0.data-00000-of-00001"
    Quiet.dropping.add(data)  # the first response stops halfway; the retry gets it whole
    model = TransformerXLCausalLM.from_preset(name, url=url, cache_dir=str(tmp_path / "retried")).model
    x = np.arange(6, dtype="int32")[None]
    np.testing.assert_array_equal(to_np(model(x, targets=x)["nll"]), to_np(direct_model(root, name)(x, targets=x)["nll"]))
    Quiet.always_dropping.add(data)
    try:
        cache = str(tmp_path / "failing")
        with pytest.raises(releases.DownloadError, match=f"Cannot download {url}/tf_wt103/model/model.ckpt-0.data"):
            TransformerXLCausalLM.from_preset(name, url=url, cache_dir=cache).model
    finally:
        Quiet.always_dropping.discard(data)
    download = os.path.join(cache, "downloads", "tf_wt103", "model")
    assert os.path.exists(os.path.join(download, "model.ckpt-0.data-00000-of-00001.partial"))
    assert not os.path.exists(os.path.join(download, "model.ckpt-0.data-00000-of-00001"))
    assert not os.path.exists(os.path.join(cache, "pretrained", name))
    TransformerXLCausalLM.from_preset(name, url=url, cache_dir=cache).model  # the same call completes it


def test_an_unreachable_mirror_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv(releases.URL_VARIABLE, "http://127.0.0.1:9/pretrained_xl")
    with pytest.raises(releases.DownloadError) as error:
        TransformerXLCausalLM.from_preset("transfo_xl_text8", cache_dir=str(tmp_path / "cache"))
    message = str(error.value)
    assert "Cannot download http://127.0.0.1:9/pretrained_xl/tf_text8/" in message and "\n" not in message
    assert releases.URL_VARIABLE in message and "local copy" in message
    assert not os.path.exists(tmp_path / "cache" / "pretrained")


def test_a_local_folder_in_the_release_layout_is_converted(server, tmp_path):
    root, _ = server
    import shutil

    local = str(tmp_path / "pretrained_xl" / "tf_enwik8")  # download.sh's local name
    shutil.copytree(os.path.join(root, "tf_enwiki8"), local)
    model = TransformerXLCausalLM.from_preset(local, cache_dir=str(tmp_path / "cache")).model
    assert model.config.mem_len == 3800
    x = np.arange(5, dtype="int32")[None]
    np.testing.assert_array_equal(to_np(model(x, targets=x)["nll"]),
                                  to_np(direct_model(root, "transfo_xl_enwik8")(x, targets=x)["nll"]))


def test_a_classifier_fine_tunes_from_a_folder_in_the_release_layout(server, tmp_path):
    """The released model's backbone under a new head: fit on labelled documents lowers the
    loss, and a document's logits are the head on the state at its last token when the
    backbone reads it segment by segment as a stream (its `mem_init` zeros, `same_length`)."""
    from txl_keras import TransformerXLClassifier

    root, _ = server
    import shutil

    local = str(tmp_path / "pretrained_xl" / "tf_enwik8")
    shutil.copytree(os.path.join(root, "tf_enwiki8"), local)
    clf = TransformerXLClassifier.from_preset(local, num_classes=2, tgt_len=4, mem_len=16,
                                              cache_dir=str(tmp_path / "cache"))
    symbols = [chr(b) for b in range(97, 117)]
    rng = np.random.default_rng(0)
    texts = ["".join(rng.choice(symbols, int(rng.integers(3, 12)))) for _ in range(24)]
    labels = np.array([int(t[0] < "k") for t in texts])
    clf.compile(optimizer=keras.optimizers.Adam(1e-3))
    before = clf.evaluate(texts, labels, batch_size=4, return_dict=True, verbose=0)["loss"]
    clf.fit(texts, labels, batch_size=4, epochs=3, verbose=0)
    assert clf.evaluate(texts, labels, batch_size=4, return_dict=True, verbose=0)["loss"] < before
    document = max(texts, key=len)
    ids = np.asarray(clf.tokenizer(document))
    padded = np.zeros(-(-len(ids) // 4) * 4, "int32")
    padded[: len(ids)] = ids
    out = None
    for start in range(0, len(padded), 4):
        out = clf.backbone(padded[None, start: start + 4], mems=out and out["mems"],
                           memory_valid=out and out["memory_valid"], mem_len=16)
    hidden = to_np(out["hidden"])[0, (len(ids) - 1) % 4]
    assert len(padded) > 4 and clf.backbone.config.mem_init == "zeros"
    np.testing.assert_allclose(clf.predict([document] + texts[:5], batch_size=3, verbose=0)[0],
                               hidden @ to_np(clf.output_dense.kernel) + to_np(clf.output_dense.bias), atol=1e-4)


def test_text_in_text_out(server, tmp_path):
    _, url = server
    text = TransformerXLCausalLM.from_preset("transfo_xl_wt103", url=url, cache_dir=str(tmp_path / "cache"))
    out = text.generate("the history of", max_new_tokens=6, sampler="greedy")
    assert out.startswith("the history of") and len(text.tokenizer.tokenize_prompt(out)) == 3 + 6
    scored = text.score("the history of a city\nis long and old")
    ids = text.tokenizer.vocabulary.encode_text("the history of a city\nis long and old")
    assert scored.tokens == [WORDS[i] for i in ids[1:]]
    direct = to_np(text.model(ids[None, :-1], targets=ids[None, 1:])["nll"])[0]  # one segment: the plain call
    np.testing.assert_allclose(scored.log_likelihoods, -direct, rtol=1e-5, atol=1e-5)
    assert scored.perplexity == pytest.approx(math.exp(direct.mean()), rel=1e-5)
    characters = len("the history of a city\nis long and old")
    assert scored.bits_per_character == pytest.approx(direct.sum() / math.log(2) / characters, rel=1e-5)


def run(command, env, cwd):
    return subprocess.run(["timeout", "-k", "10", "300"] + command, capture_output=True, text=True, env=env, cwd=cwd)


@pytest.mark.slow
def test_the_command_lines_reproduce_a_released_models_evaluation_in_two_commands(server, tmp_path):
    """`python -m tf_records --pretrained=...` builds the test records with its vocabulary,
    `train_gpu.py --pretrained=...` evaluates them at the paper's settings (the NLL of a
    direct computation), and `python -m txl_keras.generate --pretrained=...` generates."""
    root, url = server
    raw = tmp_path / "raw"
    raw.mkdir()
    lines = ["the history of a city is long", "a city is old and long", "the city of history"] * 10
    for split in ("train", "valid", "test"):
        (raw / f"wiki.{split}.tokens").write_text("\n".join(lines) + "\n")
    env = {**os.environ, "KERAS_HOME": str(tmp_path / "keras"), releases.URL_VARIABLE: url,
           "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": os.getcwd()}
    records = run([sys.executable, "-m", "tf_records", "--pretrained=transfo_xl_wt103", f"--data_dir={raw}",
                   "--per_host_valid_bsz=1"], env, tmp_path)
    assert records.returncode == 0, records.stderr[-2000:]
    evaluated = run([sys.executable, os.path.abspath("train_gpu.py"), "--pretrained=transfo_xl_wt103",
                     "--eval_batch_size=1"], env, tmp_path)  # (relative folders land in tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    loss = float(evaluated.stdout.split("eval test: loss ")[1].split()[0])
    model = direct_model(root, "transfo_xl_wt103")
    from tf_records.vocabulary import Vocabulary
    from txl_keras.generate import score

    vocab = Vocabulary.load(str(tmp_path / "keras" / "txl_keras" / "pretrained" / "transfo_xl_wt103" / "vocab.json"))
    ids = vocab.encode_lines(lines)
    assert loss == pytest.approx(float(score(model, ids[None]).mean()), rel=1e-4)
    generated = run([sys.executable, "-m", "txl_keras.generate", "--pretrained=transfo_xl_wt103",
                     "--prompt=the history of", "--max_new_tokens=5", "--temperature=0"], env, tmp_path)
    assert generated.returncode == 0, generated.stderr[-2000:]
    assert generated.stdout.strip().startswith("the history of")
