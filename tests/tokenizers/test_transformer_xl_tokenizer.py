"""The tokenizer layer gives exactly the ids the records are written with (tf_records'
Python encoder, an independent implementation), on every corpus rule, and turns them back
into the text."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_records import corpora
from tf_records.vocabulary import Vocabulary
from txl_keras.tokenizers import TransformerXLTokenizer

# Line breaks and white space beyond ASCII that Python's splitlines / split honour.
UNUSUAL = "the\u00a0cat\u3000sat\u2028on the\r\nmat\x0bthe\x1cdog  \t sat\u2029\u0085end\n\n lone \n"


def word_vocab(**rules):
    symbols = ["<eos>", "<unk>", "<S>", "the", "cat", "sat", "on", "mat", "dog", "end", "lone", "The"]
    return Vocabulary(symbols, **rules)


VOCABULARIES = {
    "words with <eos> and <unk>": word_vocab(add_eos=True, unk_symbol="<unk>"),
    "lower-cased words": word_vocab(add_eos=True, unk_symbol="<unk>", lower_case=True),
    "sentences in <S>": word_vocab(add_double_eos=True, unk_symbol="<unk>"),
    "characters": Vocabulary(list("abcdefghijklmnopqrstuvwxyz \n.é\u3000\u2028\r\x0bTHE"), level="char",
                             unk_symbol="."),
    "text8 characters": Vocabulary(list("_abcdefghijklmnopqrstuvwxyz"), level="char", lower_case=True,
                                   space_symbol="_"),
    "bytes with newlines": Vocabulary([str(b) for b in range(256)], level="byte"),
    "bytes without newlines (enwik8)": Vocabulary([str(b) for b in range(256) if b != 10], level="byte"),
}
TEXTS = ["the cat sat on the mat\n", UNUSUAL, "", "\n", "The CAT", "lone", "thé cat\n\nmat"]


@pytest.mark.parametrize("name", sorted(VOCABULARIES))
def test_ids_are_those_the_records_are_written_with(name):
    vocab = VOCABULARIES[name]
    tokenizer = TransformerXLTokenizer(vocab)
    texts = [t.lower() if name.startswith("text8") else t for t in TEXTS]
    if name.startswith("text8"):
        texts = ["the cat sat on the mat", "abc def", ""]
    for text in texts:
        expected = vocab.encode_text(text)
        np.testing.assert_array_equal(tokenizer(text).numpy(), expected, err_msg=repr(text))
    batch = tokenizer(texts)  # ragged: each row as the string alone
    assert isinstance(batch, tf.RaggedTensor)
    for row, text in zip(batch, texts):
        np.testing.assert_array_equal(row.numpy(), vocab.encode_text(text))


def test_inside_tf_data_the_ids_are_the_same():
    vocab = VOCABULARIES["words with <eos> and <unk>"]
    tokenizer = TransformerXLTokenizer(vocab)
    dataset = tf.data.Dataset.from_tensor_slices(TEXTS).map(tokenizer)
    for ids, text in zip(dataset.as_numpy_iterator(), TEXTS):
        np.testing.assert_array_equal(ids, vocab.encode_text(text))


def test_a_local_text_corpus_and_the_tokenizer_agree(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("".join(f"line {i} of the notes , with words\u00a0and more\n" for i in range(200)))
    corpus = corpora.load_corpus("text", text=str(path), level="word")
    parts = corpora._split_text(path.read_text(), "word")
    tokenizer = TransformerXLTokenizer(corpus.vocab)
    for split in ("train", "valid", "test"):
        np.testing.assert_array_equal(tokenizer(parts[split]).numpy(), corpus.split_ids[split]())


@pytest.mark.parametrize("name, text", [
    ("words with <eos> and <unk>", "the cat sat\non the mat\n\nthe dog\n"),
    ("sentences in <S>", "the cat sat\non the mat\n"),
    ("characters", "the cat sat on the mat\néa\n"),
    ("text8 characters", "the cat sat on the mat"),
    ("bytes with newlines", "thé cat\n\u3000 sat 🐈\n"),
    ("bytes without newlines (enwik8)", "thé cat sat 🐈"),
])
def test_detokenize_inverts_tokenize_for_text_inside_the_vocabulary(name, text):
    tokenizer = TransformerXLTokenizer(VOCABULARIES[name])
    assert tokenizer.detokenize(tokenizer(text)) == text
    assert tokenizer.detokenize(tokenizer([text, text])) == [text, text]


def test_prompts_leave_an_unfinished_line_open():
    tokenizer = TransformerXLTokenizer(VOCABULARIES["words with <eos> and <unk>"])
    eos = tokenizer.token_to_id("<eos>")
    ids = tokenizer.tokenize_prompt(["the cat", "the cat\n", "the\ncat", ""])
    assert ids.to_list() == [[3, 4], [3, 4, eos], [3, eos, 4], []]
    sentences = TransformerXLTokenizer(VOCABULARIES["sentences in <S>"])
    assert sentences.tokenize_prompt("the cat").numpy().tolist() == [2, 3, 4]


def test_unknown_symbols_map_to_unk_or_are_an_error_naming_the_symbol():
    tokenizer = TransformerXLTokenizer(VOCABULARIES["words with <eos> and <unk>"])
    assert tokenizer("the zebra").numpy().tolist() == [3, 1, 0]
    strict = TransformerXLTokenizer(Vocabulary(["<eos>", "the", "cat"], add_eos=True))
    with pytest.raises(ValueError, match="Symbol 'zebra' is not in the vocabulary"):
        strict("the zebra cat")
    with pytest.raises(tf.errors.InvalidArgumentError, match="zebra"):
        list(tf.data.Dataset.from_tensor_slices(["the zebra"]).map(strict))
    enwik8 = TransformerXLTokenizer(Vocabulary([str(b) for b in range(128) if b != 10], level="byte"))
    with pytest.raises(ValueError, match=r"Bytes \[169, 195\]"):
        enwik8("é")


def test_lookups_and_their_errors():
    tokenizer = TransformerXLTokenizer(VOCABULARIES["words with <eos> and <unk>"])
    assert tokenizer.vocabulary_size() == 12 and tokenizer.get_vocabulary()[3] == "the"
    assert tokenizer.token_to_id("cat") == 4 and tokenizer.id_to_token(4) == "cat"
    assert tokenizer.end_token_id == 0
    with pytest.raises(ValueError, match="Token 'zebra' is not in the vocabulary"):
        tokenizer.token_to_id("zebra")
    with pytest.raises(ValueError, match=r"Expected `id` to be an integer in \[0, 12\)"):
        tokenizer.id_to_token(12)
    with pytest.raises(ValueError, match=r"Token ids must be in \[0, 12\) .* Received: 40"):
        tokenizer.detokenize([3, 40])
    with pytest.raises(ValueError, match="has no vocabulary yet"):
        TransformerXLTokenizer()("the cat")


@pytest.mark.parametrize("ids, message", [
    (2**40, r"must be in \[0, 12\) .* Received: 1099511627776"),  # would wrap to 0 in int32
    ([3, 2**32 + 2], r"Received: 4294967298"),  # would wrap to 2 ("the") in int32
    ([-1], r"Received: -1"),
    ([[3, 4], [5, 12]], r"Received: 12"),  # a batch
    ([[3], [4, 99]], r"Received: 99"),  # a ragged batch
    (np.array([3, 2**40]), r"Received: 1099511627776"),
    (tf.constant([3, 2**40], tf.int64), r"Received: 1099511627776"),
    ([2.7, 3.2], r"Expected integer token ids. Received float64"),  # never truncated
    (np.array([3.0]), r"Expected integer token ids"),
    (tf.constant([3.0]), r"Expected integer token ids. Received dtype float32"),
    (["the"], r"Expected integer token ids"),
])
def test_detokenize_refuses_ids_outside_the_vocabulary_and_non_integers_before_any_cast(ids, message):
    tokenizer = TransformerXLTokenizer(VOCABULARIES["words with <eos> and <unk>"])
    with pytest.raises(ValueError, match=message):
        tokenizer.detokenize(ids)
    # in a graph the same ids are an assertion naming the range, not a wrapped id
    if tf.is_tensor(ids) and ids.dtype.is_integer:
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"Token ids must be in \[0, 12\)"):
            tf.function(tokenizer.detokenize)(ids)


def test_single_token_ids_take_symbols_and_texts_of_one_token():
    words = TransformerXLTokenizer(VOCABULARIES["words with <eos> and <unk>"])
    assert words.single_token_id("<eos>") == 0 and words.single_token_id("cat") == 4
    assert words.single_token_id("\n") == 0  # a line break is the end symbol at word level... as tokenized
    nl = TransformerXLTokenizer(VOCABULARIES["bytes with newlines"])
    assert nl.single_token_id("\n") == 10 and nl.single_token_id("10") == 10 and nl.single_token_id("A") == 65
    for tokenizer, text in ((words, "zebra"), (words, "the cat"), (nl, "ab"), (nl, "")):
        with pytest.raises(ValueError, match="neither a symbol of the vocabulary nor a text of one token"):
            tokenizer.single_token_id(text, "stop_token_ids")


def test_config_and_assets_round_trip(tmp_path):
    vocab = VOCABULARIES["text8 characters"]
    tokenizer = TransformerXLTokenizer(vocab, name="text8")
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(tokenizer))
    assert isinstance(restored, TransformerXLTokenizer) and restored.vocabulary is None  # the vocabulary is an asset
    tokenizer.save_assets(str(tmp_path))
    restored.load_assets(str(tmp_path))
    assert restored.name == "text8" and restored.vocabulary.to_dict() == vocab.to_dict()
    np.testing.assert_array_equal(restored("a cab").numpy(), tokenizer("a cab").numpy())
