"""Presets on the hubs: `hf://` handles fetched and published with `huggingface_hub` against a
local stand-in server (download, cache, a missing repository, `upload_preset`), `kaggle://`
handles with `kagglehub` against a stand-in of Kaggle's model API, and one-line errors. Nothing reaches a
network."""

import os
import sys

import numpy as np
import pytest
from conftest import randomize
from hub_server import serve

import txl_keras
from tf_records.vocabulary import Vocabulary
from txl_keras import (TransformerXLCausalLM, TransformerXLCausalLMPreprocessor, TransformerXLClassifier,
                       TransformerXLConfig, TransformerXLLM, TransformerXLTokenizer, hub)
from txl_keras.run_folder import RunFolderError

VOCAB = Vocabulary(sorted("abcdefgh \n"), level="char")


@pytest.fixture
def hf(monkeypatch, tmp_path):
    with serve() as (server, url):
        monkeypatch.setenv("HF_ENDPOINT", url)
        monkeypatch.setenv("HF_TOKEN", "hf_test")
        monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))
        yield server


def saved_lm(folder):
    config = TransformerXLConfig.from_preset("tiny", n_token=len(VOCAB), cutoffs=[], tgt_len=4, mem_len=8)
    model = TransformerXLLM(config)
    randomize(model, scale=0.5)
    lm = TransformerXLCausalLM(model, TransformerXLCausalLMPreprocessor(TransformerXLTokenizer(VOCAB), 4))
    lm.save_to_preset(str(folder))
    return lm


def test_a_preset_published_to_the_hub_loads_back_and_is_read_from_the_cache(hf, tmp_path):
    lm = saved_lm(tmp_path / "tiny")
    assert txl_keras.upload_preset("hf://me/tiny", str(tmp_path / "tiny")) == "hf://me/tiny"
    local = {os.path.relpath(os.path.join(d, f), tmp_path / "tiny") for d, _, fs in os.walk(tmp_path / "tiny")
             for f in fs}
    assert set(hf.repos["me/tiny"]) == local
    loaded = TransformerXLCausalLM.from_preset("hf://me/tiny")
    expected = lm.generate("abc", max_new_tokens=8, sampler="greedy")
    assert loaded.generate("abc", max_new_tokens=8, sampler="greedy") == expected
    fetched = [p for m, p in hf.requests if m == "GET" and "/resolve/" in p]
    assert fetched  # the files came from the server
    again = TransformerXLCausalLM.from_preset("hf://me/tiny")
    assert [p for m, p in hf.requests if m == "GET" and "/resolve/" in p] == fetched  # then from the cache
    assert again.generate("abc", max_new_tokens=8, sampler="greedy") == expected
    assert str(tmp_path / "keras_home") in str(hub.download("hf://me/tiny"))


def test_a_classifier_travels_through_the_hub_whole(hf, tmp_path):
    saved_lm(tmp_path / "lm")
    clf = TransformerXLClassifier.from_preset(str(tmp_path / "lm"), num_classes=3)
    clf.save_to_preset(str(tmp_path / "clf"))
    txl_keras.upload_preset("hf://me/clf", str(tmp_path / "clf"))
    loaded = TransformerXLClassifier.from_preset("hf://me/clf")
    texts = ["abc def", "gh"]
    np.testing.assert_allclose(loaded.predict(texts, verbose=0), clf.predict(texts, verbose=0), atol=1e-6)


def test_a_missing_repository_and_bad_folders_are_one_line_each(hf, tmp_path):
    with pytest.raises(hub.HubError, match=r"^Cannot fetch hf://me/missing: no such repository on the hub"):
        TransformerXLCausalLM.from_preset("hf://me/missing")
    saved_lm(tmp_path / "tiny")
    (tmp_path / "tiny" / "tokenizer.json").write_text("{not json")
    before = len(hf.requests)
    with pytest.raises(RunFolderError, match="tokenizer.json is damaged"):
        txl_keras.upload_preset("hf://me/damaged", str(tmp_path / "tiny"))
    with pytest.raises(RunFolderError, match="is not a preset folder"):
        txl_keras.upload_preset("hf://me/empty", str(tmp_path))
    assert len(hf.requests) == before  # nothing was sent
    for bad in ("hf://only-owner", "kaggle://me/model", "hf:/me/x"):
        with pytest.raises(hub.HubError, match="not a"):
            hub.parse(bad)


def test_a_preset_published_to_kaggle_loads_back_and_is_read_from_the_cache(monkeypatch, tmp_path):
    from kaggle_server import serve as serve_kaggle

    monkeypatch.setenv("KAGGLE_API_ENVIRONMENT", "TEST")  # kagglesdk's localhost:7777
    monkeypatch.setenv("KAGGLE_USERNAME", "me")
    monkeypatch.setenv("KAGGLE_KEY", "test")
    monkeypatch.setenv("KAGGLEHUB_CACHE", str(tmp_path / "kagglehub"))
    lm = saved_lm(tmp_path / "tiny")
    with serve_kaggle() as kaggle:
        txl_keras.upload_preset("kaggle://me/tiny/keras/small", str(tmp_path / "tiny"))
        local = {os.path.relpath(os.path.join(d, f), tmp_path / "tiny") for d, _, fs in os.walk(tmp_path / "tiny")
                 for f in fs}
        assert set(kaggle.variations[("me", "tiny", "small")][0]) == local
        loaded = TransformerXLCausalLM.from_preset("kaggle://me/tiny/keras/small")
        expected = lm.generate("abc", max_new_tokens=8, sampler="greedy")
        assert loaded.generate("abc", max_new_tokens=8, sampler="greedy") == expected
        downloads = kaggle.calls.count("DownloadModelInstanceVersion")
        assert downloads == len(local)
        TransformerXLCausalLM.from_preset("kaggle://me/tiny/keras/small")
        assert kaggle.calls.count("DownloadModelInstanceVersion") == downloads  # read from the cache
        with pytest.raises(hub.HubError, match=r"^Cannot fetch kaggle://me/other/keras/small: no such repository"):
            TransformerXLCausalLM.from_preset("kaggle://me/other/keras/small")


def test_without_the_client_library_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # as if not installed
    with pytest.raises(hub.HubError, match=r'huggingface_hub library, which is not installed: pip install -e "\.\[hub\]"'):
        TransformerXLCausalLM.from_preset("hf://me/tiny")
