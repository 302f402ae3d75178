import collections

import numpy as np
import pytest

from tf_records import Vocabulary


def test_word_rules_eos_lower_case_and_order():
    counter = Vocabulary.count_lines(["The cat", "the dog  ", "", "a cat"], lower_case=True)
    vocab = Vocabulary.from_counts(counter, special=["<eos>"], lower_case=True, add_eos=True)
    # specials first, then by count (the: 2, cat: 2 in first-seen order), then dog, a
    assert vocab.symbols == ["<eos>", "the", "cat", "dog", "a"]
    assert vocab.tokenize("  The CAT ") == ["the", "cat", "<eos>"]
    assert vocab.tokenize("") == ["<eos>"]  # empty lines still end with <eos> (WikiText)
    np.testing.assert_array_equal(vocab.encode_lines(["The cat", ""]), [1, 2, 0, 0])


def test_double_eos_and_unknown_words():
    vocab = Vocabulary(["<S>", "<UNK>", "hello", "world"], add_double_eos=True, unk_symbol="<UNK>")
    assert vocab.tokenize("hello there") == ["<S>", "hello", "there", "<S>"]
    np.testing.assert_array_equal(vocab.encode_lines(["hello there"]), [0, 2, 1, 0])
    strict = Vocabulary(["<eos>", "hello"], add_eos=True)
    with pytest.raises(ValueError, match="'there' is not in the vocabulary"):
        strict.encode_lines(["hello there"])


def test_byte_level_matches_the_enwik8_convention():
    counts = Vocabulary.count_bytes([b"abca\n", b"cb\nd"])
    assert list(counts) == ["97", "98", "99", "100"]  # first-seen order, newline left out
    vocab = Vocabulary.from_counts(counts, level="byte")
    assert vocab.symbols == ["97", "98", "99", "100"]  # a:2, b:2, c:2 keep order; d:1
    np.testing.assert_array_equal(vocab.encode_bytes(b"d\nab"), [3, 0, 1])  # newline dropped
    kept = Vocabulary.from_counts(Vocabulary.count_bytes([b"a\nb"], keep_newline=True), level="byte")
    assert kept.decode(kept.encode_bytes(b"a\nb")) == "a\nb"


def test_char_level_and_round_trip(tmp_path):
    vocab = Vocabulary.from_counts(Vocabulary.count_chars(["héllo\nwörld"]), level="char")
    ids = vocab.encode_chars("wörld\nhé")
    assert vocab.decode(ids) == "wörld\nhé"
    path = tmp_path / "vocab.json"
    vocab.save(str(path))
    again = Vocabulary.load(str(path))
    assert again.symbols == vocab.symbols and again.level == "char"
    assert "pickle" not in path.read_text()


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="No vocabulary"):
        Vocabulary.load(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="corrupt"):
        Vocabulary.load(str(bad))


def test_from_counts_min_freq_and_max_size():
    counter = collections.Counter({"a": 5, "b": 3, "c": 1})
    assert Vocabulary.from_counts(counter, min_freq=2).symbols == ["a", "b"]
    assert Vocabulary.from_counts(counter, max_size=1).symbols == ["a"]
