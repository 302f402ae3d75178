"""The paper's released models as files: where they are, and how to fetch them.

The authors released four TensorFlow checkpoints with their vocabularies
(`http://curtis.ml.cmu.edu/datasets/pretrained_xl`, the layout the original
`tf/sota/download.sh` fetches: `tf_<name>/model/{checkpoint, model.ckpt-N.index,
model.ckpt-N.data-00000-of-00001}` and `tf_<name>/data/{cache.pkl, corpus-info.json}`).
`TXL_KERAS_PRETRAINED_URL` (or `url=`) names a mirror with the same layout.

`fetch` writes each file into `<name>.partial` beside its destination, resumes it with an
HTTP range request when the server allows it (else fetches it again), checks it against
the size the server announced, and only then renames it: an interrupted download never
leaves a file that reads as complete.
"""

import dataclasses
import http.client
import os
import sys
import urllib.error
import urllib.request

from txl_io import files
from tf_records.original import load_cache_vocab

DEFAULT_URL = "http://curtis.ml.cmu.edu/datasets/pretrained_xl"
URL_VARIABLE = "TXL_KERAS_PRETRAINED_URL"
CHUNK = 1 << 20


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


class DownloadError(OSError):
    """A release that cannot be fetched; the message names the URL and the way out."""


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
    from tf_records.vocabulary import Vocabulary

    converted = files.join(converted_folder(name, cache_dir), "vocab.json")
    if files.exists(converted):
        return Vocabulary.load(converted)
    path = files.join(download_folder(name, cache_dir), "data", "cache.pkl")
    fetch(f"{pretrained_url(url)}/{RELEASES[name].folder}/data/cache.pkl", path, log)
    return load_cache_vocab(path)[0]


def fetch(url, path, log=None):
    """Download `url` to `path` (see the module docstring): resumed or restarted, checked,
    renamed into place last. Unreachable: a DownloadError naming the URL."""
    if files.exists(path):
        return path
    partial = path + ".partial"
    files.makedirs(files.dirname(path))
    error = "the file arrived incomplete"
    for _ in range(3):  # a dropped connection is resumed (or restarted) twice
        try:
            if _fetch_into(url, partial, log):
                files.rename(partial, path)
                return path
        except (OSError, http.client.HTTPException) as e:  # (URLError is an OSError)
            error = e
            if isinstance(e, urllib.error.HTTPError) and e.code in (403, 404):
                break
    reason = getattr(error, "reason", None) or error
    raise DownloadError(
        f"Cannot download {url} ({reason}). Check the network, or point {URL_VARIABLE} (or url=) at a mirror of "
        f"{DEFAULT_URL}, or pass the path of a local copy in the release layout "
        "(tf_<name>/model/..., tf_<name>/data/...).") from None


def _fetch_into(url, partial, log):
    """Append the rest of `url` to `partial`; True once it holds the whole file."""
    have = os.path.getsize(partial) if os.path.exists(partial) else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    with urllib.request.urlopen(request, timeout=60) as response:
        if have and response.status != 206:  # no range support: from the start
            have = 0
        length = response.headers.get("Content-Length")
        total = have + int(length) if length is not None else None
        report = _progress(url, total, log)
        with open(partial, "ab" if have else "wb") as f:
            while True:
                chunk = response.read(CHUNK)
                if not chunk:
                    break
                f.write(chunk)
                have += len(chunk)
                report(have)
    return total is None or have == total


def _progress(url, total, log):
    """A progress bar on a terminal; otherwise a line at every 10% (to `log`)."""
    name = url.rsplit("/", 1)[-1]
    if total and sys.stderr.isatty():
        import keras

        bar = keras.utils.Progbar(total, unit_name="byte")
        return lambda done: bar.update(done)
    say = log or (lambda text: print(text, file=sys.stderr, flush=True))
    marks = {max(1, total * k // 10) for k in range(1, 11)} if total else set()
    shown = set()

    def report(done):
        for mark in sorted(m for m in marks if m <= done and m not in shown):
            shown.add(mark)
            say(f"downloading {name}: {100 * mark // total}% of {total / 1e6:,.1f} MB")

    return report
