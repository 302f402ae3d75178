"""The paper's released models as files: where they are, and how to fetch them.

The authors released four TensorFlow checkpoints with their vocabularies
(`http://curtis.ml.cmu.edu/datasets/pretrained_xl`, the layout the original
`tf/sota/download.sh` fetches: `tf_<name>/model/{checkpoint, model.ckpt-N.index,
model.ckpt-N.data-00000-of-00001}` and `tf_<name>/data/{cache.pkl, corpus-info.json}`).
`TXL_KERAS_PRETRAINED_URL` (or `url=`) names a mirror with the same layout.

Each file is fetched by `txl_io.fetch` (resumed only when the server confirms the same
file, renamed into place last) and checked by what it must be (`check_file`): the
checkpoint read as a TensorFlow checkpoint holding a release's variables, every value
against its checksum; `cache.pkl` by the safe reader, of the release's corpus;
`corpus-info.json` and `model/checkpoint` parsed. A file that fails is moved aside and
fetched again once.
"""

import dataclasses
import json
import os
import re

from tf_records.original import load_cache_vocab
from txl_io import files
from txl_io.fetch import DownloadError, fetch  # noqa: F401 (releases.DownloadError is part of the API)

DEFAULT_URL = "http://curtis.ml.cmu.edu/datasets/pretrained_xl"
URL_VARIABLE = "TXL_KERAS_PRETRAINED_URL"


@dataclasses.dataclass(frozen=True)
class Release:
    """One released model: where its files are, its corpus, and the paper's evaluation."""

    folder: str  # on the server
    dataset: str  # the corpus name of `python -m tf_records`
    step: int  # of model.ckpt-N
    tgt_len: int
    mem_len: int
    clamp_len: int
    figure: str  # the paper's test result, to reproduce
    same_length: bool = True

    @property
    def files(self):
        checkpoint = f"model/model.ckpt-{self.step}"
        return ["data/cache.pkl", "data/corpus-info.json", "model/checkpoint", checkpoint + ".index",
                checkpoint + ".data-00000-of-00001"]


# The evaluation settings of the original tf/sota/*.sh (TEST_TGT_LEN, TEST_MEM_LEN, TEST_CLAMP_LEN).
RELEASES = {
    "transfo_xl_wt103": Release("tf_wt103", "wt103", 0, 128, 1600, 1000, "WikiText-103 test perplexity 18.3"),
    "transfo_xl_enwik8": Release("tf_enwiki8", "enwik8", 0, 128, 3800, 1000, "enwik8 test 0.99 bits per character"),
    "transfo_xl_text8": Release("tf_text8", "text8", 0, 128, 3800, 1000, "text8 test 1.08 bits per character"),
    "transfo_xl_lm1b": Release("tf_lm1b", "lm1b", 1191000, 32, 128, -1, "One Billion Word test perplexity 21.8"),
}


def pretrained_url(url=None):
    """The base URL of the releases: `url`, else `$TXL_KERAS_PRETRAINED_URL`, else the original."""
    return (url or os.environ.get(URL_VARIABLE) or DEFAULT_URL).rstrip("/")


def cache_root(cache_dir=None):
    """Where converted releases are kept: `cache_dir`, else `$KERAS_HOME/txl_keras`
    (`~/.keras/txl_keras`), as `keras.utils.get_file` picks its cache."""
    if cache_dir:
        return cache_dir
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    return os.path.join(home, "txl_keras")


def download_folder(name, cache_dir=None):
    """Where release `name`'s files are downloaded (in the cache)."""
    return files.join(cache_root(cache_dir), "downloads", RELEASES[name].folder)


def converted_folder(name, cache_dir=None):
    """Where `name` (a release, or another model converted on its behalf) is kept converted:
    a run folder in the cache."""
    return files.join(cache_root(cache_dir), "pretrained", name)


def release_vocabulary(name, url=None, cache_dir=None, log=None):
    """The vocabulary of release `name`: the converted folder's, else its cache.pkl
    (downloaded if needed, read as data)."""
    from tf_records.vocabulary import VOCAB_FILE, Vocabulary

    converted = files.join(converted_folder(name, cache_dir), VOCAB_FILE)
    if files.exists(converted):
        return Vocabulary.load(converted)
    path = fetch_file(name, "data/cache.pkl", download_folder(name, cache_dir), url, log)
    return load_cache_vocab(path)[0]


def fetch_file(name, relative, folder, url=None, log=None):
    """Release `name`'s file `relative` (e.g. "data/cache.pkl") in `folder`, downloaded from
    the mirror if absent and checked (`check_file`); its path."""
    base = pretrained_url(url)
    return fetch(f"{base}/{RELEASES[name].folder}/{relative}", files.join(folder, relative),
                 check=lambda path: check_file(RELEASES[name], relative, path), log=log,
                 hint=f"Check the network, or point {URL_VARIABLE} (or url=) at a mirror of {DEFAULT_URL}, or pass "
                      "the path of a local copy in the release layout (tf_<name>/model/..., tf_<name>/data/...).")


# -- what each file of a release must be ---------------------------------------------------------

# Variables every released checkpoint holds (the rest follows from them at conversion).
REQUIRED_VARIABLES = ("transformer/r_w_bias", "transformer/layer_0/rel_attn/qkv/kernel")
OPTIMIZER_VARIABLE = re.compile(r"(/Adam(_1)?$|^global_step$|^beta[12]_power$)")


def check_file(release, relative, path):
    """Raise ValueError naming what is wrong when `path` is not the file `relative` of
    `release` must be (see the module docstring)."""
    if relative == "data/cache.pkl":
        _, dataset = load_cache_vocab(path)
        if dataset is not None and dataset != release.dataset:
            raise ValueError(f"its cache.pkl is the vocabulary of the {dataset} corpus, where {release.folder} is "
                             f"the {release.dataset} model")
    elif relative == "data/corpus-info.json":
        info = _json(path)
        if info.get("dataset") not in (None, release.dataset):
            raise ValueError(f"its corpus-info.json names the {info['dataset']} corpus, where {release.folder} is "
                             f"the {release.dataset} model")
    elif relative == "model/checkpoint":
        checkpoint_name(path)
    elif relative.endswith(".index"):
        _checkpoint_reader(path[: -len(".index")])
    elif ".data-" in relative:
        check_checkpoint_values(path[: path.index(".data-")])


def checkpoint_name(path):
    """The checkpoint a `checkpoint` file (TensorFlow's text format) names, e.g. "model.ckpt-0"."""
    try:
        text = files.read_text(path)
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not text") from None
    found = re.search(r'^model_checkpoint_path:\s*"([^"\n]+)"', text, re.MULTILINE)
    if found is None:
        raise ValueError(f"{path} names no model_checkpoint_path (TensorFlow's checkpoint file)")
    name = found.group(1).replace("\\", "/").rsplit("/", 1)[-1]
    if not re.fullmatch(r"[\w.+-]+", name) or name in (".", ".."):
        raise ValueError(f"{path} names the checkpoint {found.group(1)!r}, which is not a file name")
    return name


def check_checkpoint_values(prefix):
    """Read every model variable of the checkpoint at `prefix` (each against its checksum)."""
    reader = _checkpoint_reader(prefix)
    for name in reader.get_variable_to_shape_map():
        if not OPTIMIZER_VARIABLE.search(name):
            try:
                reader.get_tensor(name)
            except Exception as e:  # OpError (checksum, missing file), IndexError (a short file)
                raise ValueError(f"{prefix}.data-*: {name} cannot be read ({str(e).splitlines()[0]})") from None


def _checkpoint_reader(prefix):
    import tensorflow as tf

    try:
        reader = tf.train.load_checkpoint(prefix)
    except Exception as e:  # OpError: not an index at all
        raise ValueError(f"{prefix}.index is not a TensorFlow checkpoint index ({str(e).splitlines()[0]})") from None
    missing = [name for name in REQUIRED_VARIABLES if not reader.has_tensor(name)]
    if missing:
        raise ValueError(f"the checkpoint {prefix} holds no {', '.join(missing)}: not a released Transformer-XL")
    return reader


def _json(path):
    try:
        value = json.loads(files.read_text(path))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not JSON ({e})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} holds a {type(value).__name__}, not an object")
    return value


