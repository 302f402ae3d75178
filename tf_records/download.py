"""`--download`: fetch a corpus from its usual public address, only when asked."""

import os
import tarfile
import zipfile
import zlib

from txl_io import files
from txl_io.fetch import fetch

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


def check_archive(dataset, path):
    """Raise ValueError naming what is wrong when `path` is not the archive of `dataset` it must be."""
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
        except (zipfile.BadZipFile, KeyError) as e:
            raise ValueError(f"not the zip archive of {dataset} ({e})") from None
    elif path.endswith((".tgz", ".tar.gz")):
        try:
            with tarfile.open(path) as archive:
                archive.getmembers()
        except (tarfile.TarError, EOFError, zlib.error) as e:
            raise ValueError(f"not the tar archive of {dataset} ({e})") from None


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
    """Fetch (`txl_io.fetch`: resumed, checked, fetched again once if damaged) and unpack
    the raw files of a dataset into data_dir (a local folder)."""
    if dataset not in SOURCES:
        raise ValueError(f"No download source for {dataset!r}; sources exist for {sorted(SOURCES)}.")
    if not files.is_local(data_dir):
        raise ValueError(f"--download writes into a local --data_dir, not {data_dir}; download locally, then copy.")
    files.makedirs(data_dir)
    for url, name, unpack in SOURCES[dataset]:
        path = files.join(data_dir, name)
        fetch(url, path, check=lambda local: check_archive(dataset, local), log=log, timeout=timeout,
              hint=f"Download it on a connected machine and copy it to {path}, then run again.")
        if unpack:
            _unpack(dataset, path, data_dir)
