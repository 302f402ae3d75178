"""Raw corpora -> a vocabulary and token-id streams per split, as the original code.

Every loader returns a `Corpus`. Supported `dataset` names: enwik8, text8, wt103, wt2,
ptb, lm1b (the raw formats of the original `getdata.sh`), `stdlib` (the default: the
Python standard library's sources, needs no download), `text` (any local file, folder
or glob) and `tfds:NAME` (TensorFlow Datasets).
"""

import dataclasses
import functools
import glob
import io
import os
import sysconfig
import zipfile
import zlib

import numpy as np

from txl_io import files
from tf_records.vocabulary import Vocabulary

SPLITS = ("train", "valid", "test")
ORDERED = ("enwik8", "text8", "wt103", "wt2", "ptb", "lm1b", "stdlib", "text")
# Adaptive softmax cutoffs of the original (`corpus-info.json`), inner values only.
CUTOFFS = {"wt103": [20000, 40000, 200000], "lm1b": [60000, 100000, 640000]}
ENWIK8_TEST_CHARS = 5_000_000
LOCAL_SPLIT_RULE = (
    "20 files or more: by file, crc32(relative path) % 20 == 0 -> test, == 1 -> valid, else train; "
    "fewer files: the concatenated text's first 90% train, next 5% valid, last 5% test "
    "(cut at a line break for words)"
)
FILE_SPLIT_MIN_FILES = 20


@dataclasses.dataclass
class Corpus:
    """A vocabulary and, per split, a function returning its token ids.

    `split_ids[split]()` returns one int32 array (one stream) or, for lm1b training,
    a list of arrays (the shuffled shards) that are written one after the other.
    """

    name: str
    vocab: Vocabulary
    split_ids: dict
    cutoffs: list = dataclasses.field(default_factory=list)

    def info(self):
        """The original `corpus-info.json` content."""
        inner = [c for c in self.cutoffs if c < len(self.vocab)]
        return {"dataset": self.name, "vocab_size": len(self.vocab), "cutoffs": [0] + inner + [len(self.vocab)]}


def _need(data_dir, names, dataset, hint):
    """The first of `names` present in data_dir, or a clear error listing them."""
    for name in names:
        path = files.join(data_dir, name)
        if files.exists(path):
            return path
    listing = sorted(files.listdir(data_dir))[:20] if files.isdir(data_dir) else "(no such folder)"
    raise FileNotFoundError(
        f"{dataset}: expected one of {list(names)} in --data_dir={data_dir}; found {listing}. "
        f"{hint}"
    )


def _download_hint(dataset):
    return f"Fetch it with `python -m tf_records --dataset={dataset} --download --data_dir=...`."


def _nonempty(ids, dataset, split):
    if isinstance(ids, list):
        total = sum(len(part) for part in ids)
    else:
        total = len(ids)
    if total < 2:
        raise ValueError(
            f"{dataset}: the {split} split has {total} tokens; at least 2 are needed (an input "
            "and a target). Check the corpus files."
        )
    return ids


# -- enwik8 / text8 ----------------------------------------------------------------------


def _read_maybe_zipped(data_dir, name, dataset):
    path = _need(data_dir, [name, name + ".zip"], dataset, _download_hint(dataset))
    if path.endswith(".zip"):
        try:
            with zipfile.ZipFile(io.BytesIO(files.read_bytes(path))) as archive:
                return archive.read(name)
        except (zipfile.BadZipFile, KeyError) as e:
            raise ValueError(f"{path} is not a valid {dataset} archive ({e}); download it again.") from None
    return files.read_bytes(path)


def _three_way(data, n_test):
    if len(data) <= 2 * n_test:
        raise ValueError(f"The corpus has {len(data)} units, fewer than 2 x {n_test} for valid and test.")
    return {"train": data[: -2 * n_test], "valid": data[-2 * n_test: -n_test], "test": data[-n_test:]}


def enwik8(data_dir, test_chars=ENWIK8_TEST_CHARS, vocab=None, **_):
    """Bytes of `enwik8` (or `enwik8.zip`), split 90M/5M/5M; newline bytes dropped."""
    parts = _three_way(_read_maybe_zipped(data_dir, "enwik8", "enwik8"), test_chars)
    vocab = vocab or Vocabulary.from_counts(
        Vocabulary.count_bytes(parts[s] for s in SPLITS), level="byte", lower_case=True
    )
    return Corpus("enwik8", vocab, {s: (lambda s=s: _nonempty(vocab.encode_bytes(parts[s]), "enwik8", s))
                                    for s in SPLITS})


def text8(data_dir, test_chars=ENWIK8_TEST_CHARS, vocab=None, **_):
    """Characters of `text8` (or `text8.zip`), split 90M/5M/5M, spaces written `_`."""
    raw = _read_maybe_zipped(data_dir, "text8", "text8").decode("utf-8")
    parts = {s: p.strip().replace(" ", "_") for s, p in _three_way(raw, test_chars).items()}
    if vocab is None:
        counts = Vocabulary.count_chars(parts[s] for s in SPLITS)
        vocab = Vocabulary.from_counts(counts, level="char", lower_case=True, space_symbol="_" if "_" in counts else None)
    return Corpus("text8", vocab, {s: (lambda s=s: _nonempty(vocab.encode_chars(parts[s]), "text8", s))
                                   for s in SPLITS})


# -- word-level corpora ------------------------------------------------------------------


def _read_lines(path):
    return files.read_text(path).splitlines()


def _word_corpus(name, data_dir, pattern, lower_case, count_splits, vocab=None):
    paths = {s: _need(data_dir, [pattern.format(s)], name, _download_hint(name)) for s in SPLITS}
    if vocab is None:
        counter = None
        for s in count_splits:
            counter = Vocabulary.count_lines(_read_lines(paths[s]), counter, lower_case=lower_case)
        vocab = Vocabulary.from_counts(counter, special=["<eos>"], lower_case=lower_case, add_eos=True)
        if "<unk>" in vocab.index:
            vocab = Vocabulary(vocab.symbols, lower_case=lower_case, add_eos=True, unk_symbol="<unk>")
    return Corpus(
        name,
        vocab,
        {s: (lambda s=s: _nonempty(vocab.encode_lines(_read_lines(paths[s])), name, s)) for s in SPLITS},
        CUTOFFS.get(name, []),
    )


def wt103(data_dir, vocab=None, **_):
    """WikiText-103 `wiki.{split}.tokens`: words, `<eos>` after every line, vocab from train."""
    return _word_corpus("wt103", data_dir, "wiki.{}.tokens", False, ["train"], vocab)


def wt2(data_dir, vocab=None, **_):
    """WikiText-2, as WikiText-103."""
    return _word_corpus("wt2", data_dir, "wiki.{}.tokens", False, ["train"], vocab)


def ptb(data_dir, vocab=None, **_):
    """Penn Treebank `ptb.{split}.txt`: lower-cased words with `<eos>`, vocab from all splits."""
    return _word_corpus("ptb", data_dir, "ptb.{}.txt", True, SPLITS, vocab)


def lm1b(data_dir, num_shuffle=4, vocab=None, **_):
    """One Billion Word: the fixed vocabulary file, `<S>`-wrapped sentences, the training
    shards shuffled `num_shuffle` times each (seed 123456, as the original), the heldout
    file for both valid and test."""
    vocab_path = _need(data_dir, ["1b_word_vocab.txt"], "lm1b", _download_hint("lm1b"))
    symbols = [line.split()[0] for line in _read_lines(vocab_path) if line.strip()]
    vocab = vocab or Vocabulary(symbols, add_double_eos=True, unk_symbol="<UNK>" if "<UNK>" in symbols else None)
    train_glob = files.join(data_dir, "training-monolingual.tokenized.shuffled", "news.en-*")
    shards = files.glob(train_glob)
    heldout = _need(
        data_dir,
        [files.join("heldout-monolingual.tokenized.shuffled", "news.en.heldout-00000-of-00050"),
         "news.en.heldout-00000-of-00050"],
        "lm1b",
        _download_hint("lm1b"),
    )

    def train():
        if not shards:
            raise FileNotFoundError(f"lm1b: no training shards match {train_glob}. {_download_hint('lm1b')}")
        rng = np.random.RandomState(123456)
        streams = []
        for shard in shards:
            sentences = [vocab.encode_lines([line]) for line in _read_lines(shard) if line.strip()]
            for _ in range(num_shuffle):
                order = rng.permutation(len(sentences))
                streams.append(np.concatenate([sentences[i] for i in order]))
        return _nonempty(streams, "lm1b", "train")

    @functools.lru_cache(maxsize=1)  # valid and test are the same file: encode it once
    def heldout_ids():
        return _nonempty(vocab.encode_lines(line for line in _read_lines(heldout) if line.strip()),
                         "lm1b", "heldout")

    return Corpus("lm1b", vocab, {"train": train, "valid": heldout_ids, "test": heldout_ids},
                  CUTOFFS["lm1b"])


# -- local text, the standard library, TensorFlow Datasets ----------------------------------


def _split_text(text, level):
    """The position rule of LOCAL_SPLIT_RULE (on bytes at byte level, else characters)."""
    cuts = [int(len(text) * 0.90), int(len(text) * 0.95)]
    if level == "word":
        cuts = [text.find("\n", c) + 1 or len(text) for c in cuts]
    return {"train": text[: cuts[0]], "valid": text[cuts[0]: cuts[1]], "test": text[cuts[1]:]}


def _file_split(relative_path):
    bucket = zlib.crc32(relative_path.encode("utf-8")) % 20
    return "test" if bucket == 0 else "valid" if bucket == 1 else "train"


def _split_files(paths, root, level, max_bytes=None, encoding="utf-8", skip_undecodable=False):
    """LOCAL_SPLIT_RULE over files: whole files per split when there are many, so every
    split is a sample of the same kinds of file."""
    def read(group, budget):
        return _read_files(group, budget, None if level == "byte" else encoding, skip_undecodable)

    if len(paths) < FILE_SPLIT_MIN_FILES:
        return _split_text(read(paths, max_bytes), level)
    groups = {s: [] for s in SPLITS}
    for path in paths:
        groups[_file_split(os.path.relpath(path, root))].append(path)
    budget = {s: None if not max_bytes else int(max_bytes * share)
              for s, share in (("train", 0.9), ("valid", 0.05), ("test", 0.05))}
    return {s: read(groups[s], budget[s]) for s in SPLITS}


def _level(level, vocab, default):
    """The token level: --level, else the --vocab's, else the corpus's default."""
    if vocab is not None and level is not None and level != vocab.level:
        raise ValueError(f"--level={level} but --vocab is a {vocab.level}-level vocabulary; drop --level "
                         "or give a vocabulary of that level.")
    level = level or (vocab.level if vocab is not None else default)
    if level not in ("byte", "char", "word"):
        raise ValueError(f"Expected --level to be byte, char or word. Received: {level!r}")
    return level


def _local_corpus(name, parts, level, lower_case=False, min_freq=1, vocab=None):
    """A corpus of split texts (bytes at byte level), with a counted vocabulary or `vocab`."""
    if level == "byte":
        vocab = vocab or Vocabulary.from_counts(
            Vocabulary.count_bytes((parts[s] for s in SPLITS), keep_newline=True), level="byte"
        )
        encode = lambda s: vocab.encode_bytes(parts[s])  # noqa: E731
    elif level == "char":
        vocab = vocab or Vocabulary.from_counts(
            Vocabulary.count_chars((parts[s] for s in SPLITS), lower_case), level="char",
            lower_case=lower_case,
        )
        encode = lambda s: vocab.encode_chars(parts[s])  # noqa: E731
    else:
        counter = None if vocab else Vocabulary.count_lines(parts["train"].splitlines(), lower_case=lower_case)
        vocab = vocab or Vocabulary.from_counts(
            counter, special=["<eos>", "<unk>"], min_freq=min_freq, lower_case=lower_case,
            add_eos=True, unk_symbol="<unk>",
        )
        encode = lambda s: vocab.encode_lines(parts[s].splitlines())  # noqa: E731
    return Corpus(name, vocab, {s: (lambda s=s: _nonempty(encode(s), name, s)) for s in SPLITS})


def text_files(pattern):
    """The files named by a file, a folder (recursively) or a glob, sorted."""
    if files.isdir(pattern):
        found = [files.join(root, f) for root, _, names in files.walk(pattern) for f in names]
    elif files.isfile(pattern):
        found = [pattern]
    elif files.is_local(pattern):
        found = glob.glob(pattern, recursive=True)
    else:
        found = files.glob(pattern)
    found = sorted(f for f in found if files.isfile(f))
    if not found:
        raise FileNotFoundError(f"--text={pattern!r} names no file (expected a file, a folder or a glob).")
    return found


def _decode(data, path, encoding):
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not valid {encoding} at byte {e.start} ({e.reason}); pass its encoding "
                         "(e.g. --encoding=latin-1), or --level=byte to read raw bytes.") from None


def _read_files(paths, max_bytes=None, encoding=None, skip_undecodable=False):
    """The files joined, each ending in a newline: raw bytes (`encoding=None`, byte level)
    or text decoded strictly (an error names the file and byte offset; with
    `skip_undecodable` such files are left out). At most `max_bytes` bytes or characters."""
    parts, total = [], 0
    newline = "\n" if encoding else b"\n"
    for path in paths:
        data = files.read_bytes(path)
        if encoding:
            try:
                data = _decode(data, path, encoding)
            except ValueError:
                if skip_undecodable:
                    continue
                raise
        parts.append(data if data.endswith(newline) else data + newline)
        total += len(parts[-1])
        if max_bytes and total >= max_bytes:
            break
    joined = newline[:0].join(parts)
    return joined[:max_bytes] if max_bytes else joined


def local_text(text, level=None, lower_case=False, min_freq=1, max_bytes=None, encoding="utf-8", vocab=None,
               **_):
    """Any local text: files in sorted order, split by LOCAL_SPLIT_RULE; byte level by
    default (or the level of `vocab`), char and word levels decode `encoding` strictly."""
    found = text_files(text)
    if files.is_local(text):
        found = [os.path.abspath(f) for f in found]
    root = text if files.isdir(text) else files.dirname(os.path.commonpath(found))
    if files.is_local(text):
        root = os.path.abspath(root)
    level = _level(level, vocab, "byte")
    parts = _split_files(found, root, level, max_bytes, encoding)
    return _local_corpus("text", parts, level, lower_case, min_freq, vocab)


def stdlib_files():
    """The `.py` files of the running interpreter's standard library (no site-packages)."""
    root = sysconfig.get_paths()["stdlib"]
    found = []
    for dirpath, dirnames, names in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__"))
        found.extend(os.path.join(dirpath, n) for n in sorted(names) if n.endswith(".py"))
    if not found:
        raise FileNotFoundError(f"No Python sources under {root}; use --dataset=text --text=PATH instead.")
    return found


def stdlib(level=None, max_bytes=8_000_000, vocab=None, **_):
    """The default corpus: this interpreter's standard-library sources, byte level, split
    by file (LOCAL_SPLIT_RULE); with `max_bytes`, files are taken in crc32 order so the
    sample is not one alphabetical corner of the library. At char and word level the few
    test files that are deliberately not UTF-8 are left out."""
    root = sysconfig.get_paths()["stdlib"]
    paths = sorted(stdlib_files(), key=lambda p: zlib.crc32(os.path.relpath(p, root).encode("utf-8")))
    level = _level(level, vocab, "byte")
    parts = _split_files(paths, root, level, max_bytes, skip_undecodable=True)
    return _local_corpus("stdlib", parts, level, vocab=vocab)


def tfds_text(name, data_dir=None, level=None, lower_case=False, min_freq=1, download=False, vocab=None, **_):
    """A text dataset of TensorFlow Datasets: each split's string feature joined by lines."""
    import tensorflow_datasets as tfds

    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except Exception as e:  # tfds raises its own DatasetNotFoundError
        raise ValueError(f"Unknown TensorFlow Datasets name {name!r}: {e}") from None
    if download:
        builder.download_and_prepare()
    wanted = {"train": ["train"], "valid": ["validation", "valid", "test"], "test": ["test", "validation"]}
    feature = next((k for k, v in builder.info.features.items()
                    if getattr(v, "tf_dtype", None) is not None and v.tf_dtype.name == "string"), None)
    if feature is None:
        raise ValueError(f"tfds:{name} has no text feature; features: {list(builder.info.features)}")

    def read(split):
        errors = []
        for candidate in wanted[split]:
            try:
                ds = builder.as_dataset(split=candidate)
            except Exception as e:  # unknown split, or not prepared
                errors.append(f"{candidate}: {str(e).splitlines()[0]}")
                continue
            text = "\n".join(_decode(ex[feature], f"tfds:{name} {candidate}", "utf-8") for ex in tfds.as_numpy(ds))
            return text.encode("utf-8") if level == "byte" else text
        raise FileNotFoundError(
            f"tfds:{name} has no readable {split} split in {data_dir or '~/tensorflow_datasets'} "
            f"({'; '.join(errors)}). Add --download to fetch and prepare it, or pass "
            "--tfds_data_dir where it was prepared."
        )

    level = _level(level, vocab, "char")
    parts = {s: read(s) for s in SPLITS}
    return _local_corpus(f"tfds:{name}", parts, level, lower_case, min_freq, vocab)


LOADERS = {
    "enwik8": enwik8, "text8": text8, "wt103": wt103, "wt2": wt2, "ptb": ptb, "lm1b": lm1b,
    "stdlib": stdlib, "text": local_text,
}


def load_corpus(dataset, data_dir=None, **options):
    """The `Corpus` of a dataset name (see the module docstring).

    `vocab=` (a Vocabulary) encodes the paper's corpora with an existing vocabulary, such
    as the one of converted pretrained weights, instead of counting a new one.
    """
    if dataset.startswith("tfds:"):
        return tfds_text(dataset[len("tfds:"):], data_dir=options.pop("tfds_data_dir", None), **options)
    if dataset not in LOADERS:
        raise ValueError(
            f"Unknown dataset {dataset!r}. Expected one of {sorted(LOADERS)} or tfds:NAME."
        )
    if dataset == "text" and not options.get("text"):
        raise ValueError("--dataset=text needs --text=PATH (a file, a folder or a glob).")
    if dataset not in ("stdlib", "text") and not data_dir:
        raise ValueError(f"--dataset={dataset} needs --data_dir, the folder of its raw files.")
    return LOADERS[dataset](data_dir=data_dir, **options)
