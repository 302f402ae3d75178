import os
import zipfile

import numpy as np
import pytest

from tf_records import load_corpus


def write(path, text, mode="w"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, mode) as f:
        f.write(text)


def test_enwik8_bytes_split_and_newlines_dropped(tmp_path):
    data = bytes(range(32, 127)) * 3 + b"\n" + b"abc" * 20
    with zipfile.ZipFile(tmp_path / "enwik8.zip", "w") as z:
        z.writestr("enwik8", data)
    corpus = load_corpus("enwik8", data_dir=str(tmp_path), test_chars=30)
    train, valid, test = (corpus.split_ids[s]() for s in ("train", "valid", "test"))
    assert len(valid) == 30 and len(test) == 30
    assert len(train) == len(data) - 60 - 1  # the one newline byte is dropped
    assert corpus.vocab.decode(test) == (b"abc" * 10).decode()
    assert len(corpus.vocab) == 95  # byte values 32..126, no newline


def test_text8_chars_with_underscores(tmp_path):
    text = "anarchism originated as a term " * 4 + "abcdefghij"
    with zipfile.ZipFile(tmp_path / "text8.zip", "w") as z:
        z.writestr("text8", text)
    corpus = load_corpus("text8", data_dir=str(tmp_path), test_chars=5)
    assert corpus.vocab.decode(corpus.split_ids["valid"]()) == "abcde"
    assert corpus.vocab.decode(corpus.split_ids["test"]()) == "fghij"
    assert corpus.vocab.decode(corpus.split_ids["train"]()[:12]) == "anarchism_or"
    assert " " not in corpus.vocab.symbols


def test_wikitext_eos_every_line_vocab_from_train(tmp_path):
    write(str(tmp_path / "wiki.train.tokens"), " = Title = \n\n the cat <unk> sat \n")
    write(str(tmp_path / "wiki.valid.tokens"), " the dog \n")
    write(str(tmp_path / "wiki.test.tokens"), " the cat \n")
    corpus = load_corpus("wt103", data_dir=str(tmp_path))
    assert corpus.vocab.symbols[0] == "<eos>"
    train = corpus.vocab.decode(corpus.split_ids["train"]())
    assert train == "= Title = <eos> <eos> the cat <unk> sat <eos>"
    assert corpus.vocab.decode(corpus.split_ids["valid"]()) == "the <unk> <eos>"  # dog unseen in train
    # the original cutoffs, less those beyond this tiny vocabulary
    assert corpus.cutoffs == [20000, 40000, 200000]
    assert corpus.info()["cutoffs"] == [0, len(corpus.vocab)]


def test_ptb_lower_case_vocab_from_all_splits(tmp_path):
    write(str(tmp_path / "ptb.train.txt"), " The cat \n")
    write(str(tmp_path / "ptb.valid.txt"), " a Dog \n")
    write(str(tmp_path / "ptb.test.txt"), " the bird \n")
    corpus = load_corpus("ptb", data_dir=str(tmp_path))
    assert set(corpus.vocab.symbols) == {"<eos>", "the", "cat", "a", "dog", "bird"}
    assert corpus.vocab.decode(corpus.split_ids["valid"]()) == "a dog <eos>"


def test_lm1b_double_eos_fixed_vocab_and_shuffles(tmp_path):
    write(str(tmp_path / "1b_word_vocab.txt"), "<S> 0\n</S> 0\n<UNK> 0\nthe 5\ncat 3\ndog 2\n")
    shard = tmp_path / "training-monolingual.tokenized.shuffled" / "news.en-00001-of-00100"
    write(str(shard), "the cat\nthe dog\nthe bird\n")
    write(str(tmp_path / "heldout-monolingual.tokenized.shuffled" / "news.en.heldout-00000-of-00050"),
          "the cat\n")
    corpus = load_corpus("lm1b", data_dir=str(tmp_path), num_shuffle=2)
    streams = corpus.split_ids["train"]()
    assert len(streams) == 2  # one shard, two shuffles
    for stream in streams:
        sentences = corpus.vocab.decode(stream).replace("<S> <S>", "<S>|<S>").split("|")
        assert sorted(sentences) == ["<S> the <UNK> <S>", "<S> the cat <S>", "<S> the dog <S>"]
    np.testing.assert_array_equal(corpus.split_ids["valid"](), corpus.split_ids["test"]())
    assert corpus.vocab.decode(corpus.split_ids["test"]()) == "<S> the cat <S>"


def test_local_text_split_rule_and_levels(tmp_path):
    for i in range(3):
        write(str(tmp_path / "docs" / f"{i}.txt"), "".join(f"line {i} {j}\n" for j in range(40)))
    corpus = load_corpus("text", text=str(tmp_path / "docs"), level="char")
    parts = [corpus.vocab.decode(corpus.split_ids[s]()) for s in ("train", "valid", "test")]
    whole = "".join(open(tmp_path / "docs" / f"{i}.txt").read() for i in range(3))
    assert "".join(parts) == whole
    assert len(parts[0]) == int(len(whole) * 0.9)
    words = load_corpus("text", text=str(tmp_path / "docs" / "*.txt"), level="word")
    assert words.vocab.decode(words.split_ids["test"]()).endswith("line 2 39 <eos>")


def test_many_files_are_split_by_file(tmp_path):
    import zlib

    for i in range(60):
        write(str(tmp_path / "src" / f"mod{i}.py"), f"value_{i} = {i}\n")
    corpus = load_corpus("text", text=str(tmp_path / "src"), level="char")
    for split in ("train", "valid", "test"):
        text = corpus.vocab.decode(corpus.split_ids[split]())
        for i in range(60):
            bucket = zlib.crc32(f"mod{i}.py".encode()) % 20
            expected = "test" if bucket == 0 else "valid" if bucket == 1 else "train"
            assert (f"value_{i} = {i}\n" in text) == (expected == split)


def test_stdlib_default_needs_no_download():
    corpus = load_corpus("stdlib", max_bytes=200_000)
    train = corpus.split_ids["train"]()
    assert len(train) >= 180_000  # bytes of 90% of 200,000 characters, whole files
    assert "def " in corpus.vocab.decode(train[:20000])


def test_missing_files_and_unknown_names_are_explained(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"expected one of \['wiki.train.tokens'\]"):
        load_corpus("wt103", data_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"\['enwik8', 'enwik8.zip'\].*--download"):
        load_corpus("enwik8", data_dir=str(tmp_path))
    with pytest.raises(ValueError, match="Unknown dataset 'wt104'"):
        load_corpus("wt104", data_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="names no file"):
        load_corpus("text", text=str(tmp_path / "nothing*.txt"))


def test_empty_split_is_refused(tmp_path):
    write(str(tmp_path / "ptb.train.txt"), "a b c\n")
    write(str(tmp_path / "ptb.valid.txt"), "")
    write(str(tmp_path / "ptb.test.txt"), "a\n")
    corpus = load_corpus("ptb", data_dir=str(tmp_path))
    with pytest.raises(ValueError, match="valid split has 0 tokens"):
        corpus.split_ids["valid"]()


def test_tfds_text_offline_with_mock_data():
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=2):
        corpus = load_corpus("tfds:tiny_shakespeare", level="char")
        ids = corpus.split_ids["train"]()
    assert len(ids) > 0 and corpus.name == "tfds:tiny_shakespeare"
    assert len(corpus.vocab) == len(set(corpus.vocab.symbols))


def test_an_existing_vocabulary_encodes_the_corpus(tmp_path):
    from tf_records import Vocabulary

    write(str(tmp_path / "wiki.train.tokens"), " the cat \n")
    write(str(tmp_path / "wiki.valid.tokens"), " the dog \n")
    write(str(tmp_path / "wiki.test.tokens"), " cat \n")
    given = Vocabulary(["<eos>", "<unk>", "cat", "the"], add_eos=True, unk_symbol="<unk>")
    corpus = load_corpus("wt103", data_dir=str(tmp_path), vocab=given)
    np.testing.assert_array_equal(corpus.split_ids["valid"](), [3, 1, 0])
    assert corpus.vocab is given


def test_the_records_cutoffs_are_the_architecture_presets():
    """The paper's adaptive softmax cutoffs are written in the data package (the records'
    corpus info) and in the model's architecture presets, which the layering keeps apart:
    they must be the same."""
    from tf_records.corpora import CUTOFFS
    from txl_keras.models.config import PRESETS

    assert all(PRESETS[f"{corpus}_{size}"]["cutoffs"] == cutoffs for corpus, cutoffs in CUTOFFS.items()
               for size in ("base", "large"))
