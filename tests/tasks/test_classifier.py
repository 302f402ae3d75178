"""The document classifier: documents laid out as streams (checked by rebuilding each one),
segmented reading equal to reading a document at once (the memory's invariant), a label
that only the memory carries, presets and LoRA on the backbone, one-line errors."""

import json
import os

import keras
import numpy as np
import pytest
from conftest import randomize, to_np

from tf_records.vocabulary import Vocabulary
from txl_keras import (TransformerXL, TransformerXLCausalLM, TransformerXLCausalLMPreprocessor,
                       TransformerXLClassifier, TransformerXLClassifierPreprocessor, TransformerXLConfig,
                       TransformerXLLM, TransformerXLTokenizer)
from txl_keras.run_folder import RunFolderError

LETTERS = "abcdefgh"


def documents(count, low, high, seed=0):
    """Documents whose first symbol (X or Y) is their label; the rest is noise."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, count)
    texts = ["XY"[1 - label] + "".join(rng.choice(list(LETTERS), int(rng.integers(low, high)) - 1))
             for label in labels]
    return texts, labels


VOCAB = Vocabulary(sorted("XY" + LETTERS + "\n"), level="char")


def classifier(tgt_len=4, mem_len=8, n_layer=2, seed=1, **config):
    settings = dict(n_token=len(VOCAB), cutoffs=[], tgt_len=tgt_len, mem_len=mem_len, n_layer=n_layer, dropout=0.0,
                    d_model=32, d_inner=64, n_head=2, d_head=16)
    keras.utils.set_random_seed(seed)
    backbone = TransformerXL(TransformerXLConfig.from_preset("tiny", **{**settings, **config}))
    preprocessor = TransformerXLClassifierPreprocessor(TransformerXLTokenizer(VOCAB), tgt_len)
    return TransformerXLClassifier(backbone, 3, preprocessor, mem_len=mem_len)


def test_the_layout_holds_every_document_once_in_its_own_stream_segments():
    texts, _ = documents(23, 1, 30, seed=3)
    preprocessor = TransformerXLClassifierPreprocessor(TransformerXLTokenizer(VOCAB), 4)
    layout = preprocessor(texts, batch_size=5, labels=np.arange(23))
    steps, rows, length = layout["token_ids"].shape
    assert rows == 5 and length == 4
    seen = []
    for row in range(rows):
        start = 0
        for step in range(steps):
            if layout["document"][step, row] < 0:
                continue
            d = layout["document"][step, row]
            assert layout["segment_starts"][start, row] and not layout["segment_starts"][start + 1: step + 1, row].any()
            tokens = layout["token_ids"][start: step + 1, row].reshape(-1)
            read = tokens[: (step - start) * length + layout["end_index"][step, row] + 1]
            np.testing.assert_array_equal(read, np.asarray(preprocessor.tokenizer(texts[d])))
            assert layout["labels"][step, row] == d and layout["sample_weight"][step, row] == 1
            seen.append(int(d))
            start = step + 1
        assert layout["segment_starts"][start:, row].all()  # idle segments after the last document
    assert sorted(seen) == list(range(23))
    assert layout["sample_weight"].sum() == 23


def test_a_document_read_in_segments_is_the_document_read_at_once_alone_or_in_a_batch():
    """With a memory longer than the documents, each segment sees every token before it,
    so the state at a document's last token is the one-pass state: the logits equal the
    head applied to the backbone's whole-document call (all documents in one call, padded
    after their ends, which a causal model's states before them never see)."""
    clf = classifier(tgt_len=4, mem_len=32)
    randomize(clf.backbone, scale=0.3)
    texts, _ = documents(7, 3, 20, seed=5)
    in_batch = clf.predict(texts, batch_size=3, verbose=0)
    ids = [np.asarray(clf.tokenizer(text)) for text in texts]
    padded = np.zeros((len(ids), max(len(i) for i in ids)), "int32")
    for row, document in enumerate(ids):
        padded[row, :len(document)] = document
    hidden = to_np(clf.backbone(padded, mem_len=32)["hidden"])
    for row, (text, logits) in enumerate(zip(texts, in_batch)):
        expected = hidden[row, len(ids[row]) - 1] @ to_np(clf.output_dense.kernel) + to_np(clf.output_dense.bias)
        np.testing.assert_allclose(logits, expected, atol=1e-4)
        np.testing.assert_allclose(clf.predict([text], batch_size=1, verbose=0)[0], logits, atol=1e-5)


def test_the_memory_carries_a_label_set_in_the_first_of_many_segments():
    """Documents of 4 to 8 segments whose class is their first symbol: read through a
    memory it is learnt; without one (mem_len=0) the last segment cannot see it."""
    texts, labels = documents(300, 16, 32)
    accuracy = {}
    for mem_len in (32, 0):
        clf = classifier(tgt_len=4, mem_len=mem_len)
        clf.compile(optimizer=keras.optimizers.Adam(3e-3))
        clf.fit(texts[:220], labels[:220], batch_size=16, epochs=12, verbose=0, seed=0)
        accuracy[mem_len] = clf.evaluate(texts[220:], labels[220:], batch_size=16, return_dict=True,
                                         verbose=0)["accuracy"]
        predicted = clf.predict(texts[220:], batch_size=16, verbose=0).argmax(1)
        assert np.mean(predicted == labels[220:]) == pytest.approx(accuracy[mem_len], abs=1e-6)
    assert accuracy[32] >= 0.95 and accuracy[0] <= 0.7, accuracy


def test_a_saved_classifier_loads_back_whole_and_a_language_model_gives_its_backbone(tmp_path):
    config = TransformerXLConfig.from_preset("tiny", n_token=len(VOCAB), cutoffs=[], tgt_len=4, mem_len=8)
    model = TransformerXLLM(config)
    randomize(model, scale=0.3)
    lm = TransformerXLCausalLM(model, TransformerXLCausalLMPreprocessor(TransformerXLTokenizer(VOCAB), 4))
    lm.save_to_preset(str(tmp_path / "lm"))
    for preset in (str(tmp_path / "lm"), "transfo_xl_wt103"):  # (a released model: refused before its download)
        with pytest.raises(ValueError, match="is a language model, not a classifier: give num_classes"):
            TransformerXLClassifier.from_preset(preset, cache_dir=str(tmp_path / "cache"))
    assert not os.path.exists(tmp_path / "cache")
    clf = TransformerXLClassifier.from_preset(str(tmp_path / "lm"), num_classes=2, mem_len=12)
    np.testing.assert_array_equal(to_np(clf.backbone.word_emb.weights[0]), to_np(model.backbone.word_emb.weights[0]))
    assert (clf.tgt_len, clf.mem_len) == (4, 12)

    clf.backbone.enable_lora(2)  # LoRA on the backbone: its adapters and the new head train
    assert len(clf.trainable_weights) == 4 * config.n_layer + 2
    texts, labels = documents(40, 5, 15)
    clf.fit(texts, labels, batch_size=4, epochs=1, verbose=0)
    clf.save_to_preset(str(tmp_path / "clf"))
    assert json.load(open(tmp_path / "clf" / "metadata.json"))["class_name"] == "TransformerXLClassifier"
    again = TransformerXLClassifier.from_preset(str(tmp_path / "clf"))
    assert again.backbone.lora_rank == 2 and again.mem_len == 12
    longer = TransformerXLClassifier.from_preset(str(tmp_path / "clf"), tgt_len=8, mem_len=16, dropout=0.1)
    assert (longer.tgt_len, longer.mem_len, longer.dropout, longer.num_classes) == (8, 16, 0.1, 2)
    np.testing.assert_allclose(again.predict(texts, verbose=0), clf.predict(texts, verbose=0), atol=1e-6)
    with pytest.raises(ValueError, match="is a classifier of 2 classes; received num_classes=5"):
        TransformerXLClassifier.from_preset(str(tmp_path / "clf"), num_classes=5)
    with pytest.raises(ValueError, match="Expected `dtype` to be a dtype policy .* given by name"):
        TransformerXLClassifier.from_preset(str(tmp_path / "clf"), 2)
    with pytest.raises(RunFolderError, match="is a saved TransformerXLClassifier, not a language model"):
        TransformerXLCausalLM.from_preset(str(tmp_path / "clf"))


@pytest.mark.parametrize("call, message", [
    (lambda c: c.fit(["abc", ""], [0, 1]), "Document 1 \\(''\\) encodes to no token"),
    (lambda c: c.fit(["abc", "bcd"], [0, 3]), "labels in \\[0, 3\\)"),
    (lambda c: c.fit(["abc", "bcd"], [0]), "one label per document: 2 documents"),
    (lambda c: c.fit(["abc", b"bcd"], [0, 1]), "Document 1 is a bytes, not a string"),
    (lambda c: c.fit(["abc"], [0], batch_size=0), "`batch_size` to be an integer >= 1"),
    (lambda c: c.fit(["abc"], [0], steps_per_epoch=3), "drop steps_per_epoch"),
    (lambda c: c.predict(42), "Expected the documents as a list of strings"),
    (lambda c: c.compile(loss="mse"), "leave `loss` as 'auto'"),
    (lambda c: TransformerXLClassifier(c.backbone, 1, c.preprocessor), "`num_classes` to be an integer >= 2"),
])
def test_bad_input_is_one_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call(classifier())
