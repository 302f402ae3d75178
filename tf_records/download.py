"""`--download`: fetch a corpus from its usual public address, only when asked."""

import os
import tarfile
import urllib.error
import urllib.request
import zipfile

from txl_io import files

# What the original getdata.sh fetches. Each entry: (url, file name, unpack?).
SOURCES = {
    "enwik8": [("http://mattmahoney.net/dc/enwik8.zip", "enwik8.zip", False)],
    "text8": [("http://mattmahoney.net/dc/text8.zip", "text8.zip", False)],
    "wt103": [("https://wikitext.smerity.com/wikitext-103-v1.zip", "wikitext-103-v1.zip", True)],
    "wt2": [("https://wikitext.smerity.com/wikitext-2-v1.zip", "wikitext-2-v1.zip", True)],
    "ptb": [("http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz", "simple-examples.tgz", True)],
    "lm1b": [
        ("http://www.statmt.org/lm-benchmark/1-billion-word-language-modeling-benchmark-r13output.tar.gz",
         "1-billion-word-language-modeling-benchmark-r13output.tar.gz", True),
        ("https://raw.githubusercontent.com/rafaljozefowicz/lm/master/1b_word_vocab.txt",
         "1b_word_vocab.txt", False),
    ],
}
# Files the loaders read, moved out of the archives' folders.
MEMBERS = {
    "wt103": {"wikitext-103/wiki.train.tokens", "wikitext-103/wiki.valid.tokens", "wikitext-103/wiki.test.tokens"},
    "wt2": {"wikitext-2/wiki.train.tokens", "wikitext-2/wiki.valid.tokens", "wikitext-2/wiki.test.tokens"},
    "ptb": {"./simple-examples/data/ptb.train.txt", "./simple-examples/data/ptb.valid.txt",
            "./simple-examples/data/ptb.test.txt"},
}
EXPECTED_SIZE = {"enwik8": 100_000_000, "text8": 100_000_000}


def fetch(url, path, timeout=30):
    """Download `url` to `path` atomically, with a clear error when offline."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, files.local_output(path) as tmp:
            with open(tmp, "wb") as out:
                while True:
                    chunk = response.read(1 << 20)
                    if not chunk:
                        break
                    out.write(chunk)
    except (urllib.error.URLError, OSError) as e:
        raise RuntimeError(
            f"Could not download {url} ({getattr(e, 'reason', e)}). The network is not reachable "
            f"from here: download it on a connected machine and copy it to {path}, then run "
            "again without --download."
        ) from None


def _verify(dataset, path, source):
    if path.endswith(".zip"):
        try:
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()
                if bad:
                    raise ValueError(f"member {bad} is damaged")
                if dataset in EXPECTED_SIZE:
                    size = archive.getinfo(dataset).file_size
                    if size != EXPECTED_SIZE[dataset]:
                        raise ValueError(f"{dataset} has {size} bytes, expected {EXPECTED_SIZE[dataset]}")
        except (zipfile.BadZipFile, KeyError, ValueError) as e:
            files.remove_file(source)
            raise ValueError(f"The download {source} failed verification ({e}); it was removed, try again.") from None
    elif path.endswith((".tgz", ".tar.gz")):
        try:
            with tarfile.open(path) as archive:
                archive.getmembers()
        except tarfile.TarError as e:
            files.remove_file(source)
            raise ValueError(f"The download {source} failed verification ({e}); it was removed, try again.") from None


def _unpack(dataset, path, data_dir):
    wanted = MEMBERS.get(dataset)
    if path.endswith(".zip"):
        with zipfile.ZipFile(path) as archive:
            for name in archive.namelist():
                if wanted and name in wanted:
                    with archive.open(name) as src, files.local_output(files.join(data_dir, os.path.basename(name))) as tmp:
                        with open(tmp, "wb") as dst:
                            dst.write(src.read())
    else:
        with tarfile.open(path) as archive:
            for member in archive.getmembers():
                if not member.isfile():
                    continue
                if wanted and member.name not in wanted:
                    continue
                target = os.path.basename(member.name) if wanted else member.name.split("/", 1)[-1]
                src = archive.extractfile(member)
                with files.local_output(files.join(data_dir, target)) as tmp:
                    with open(tmp, "wb") as dst:
                        dst.write(src.read())


def download(dataset, data_dir, timeout=30, log=print):
    """Fetch, verify and unpack the raw files of a dataset into data_dir."""
    if dataset not in SOURCES:
        raise ValueError(f"No download source for {dataset!r}; sources exist for {sorted(SOURCES)}.")
    files.makedirs(data_dir)
    for url, name, unpack in SOURCES[dataset]:
        path = files.join(data_dir, name)
        if not files.exists(path):
            log(f"downloading {url}")
            fetch(url, path, timeout)
        with files.local_input(path) as local:
            _verify(dataset, local, path)
            if unpack:
                _unpack(dataset, local, data_dir)
