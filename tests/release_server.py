"""Stand-ins of the paper's released models (tiny checkpoints and vocabularies in the exact
release layout, for all four names), served by a local HTTP server."""

import contextlib
import functools
import http.server
import json
import os
import threading

import numpy as np

from original_formats import CASES, tf_arrays, write_cache_pkl, write_tf_checkpoint
from txl_keras import releases

WORDS = ["<eos>", "<unk>", "the", "history", "of", "a", "city", "is", "long", "and", "old", "The"] + \
    [f"w{i}" for i in range(18)]  # 30 words: the "wt103" case
STAND_INS = {  # release name: (original_formats case, symbols, dataset of the cache.pkl)
    "transfo_xl_wt103": ("wt103", WORDS, "wt103"),
    "transfo_xl_lm1b": ("lm1b", ["<S>", "<UNK>"] + WORDS[2:], "lm1b"),
    "transfo_xl_enwik8": ("enwik8", [str(b) for b in range(97, 117)], "enwik8"),
    "transfo_xl_text8": ("enwik8", list("abcdefghijklmnopqrs_"), "text8"),
}


def write_release(root, name):
    """Release `name`'s files as tf/sota/download.sh finds them on the server."""
    case, symbols, dataset = STAND_INS[name]
    release = releases.RELEASES[name]
    n_token, cutoffs, div_val, d_embed, untie_r, share, same = CASES[case]
    assert len(symbols) == n_token
    folder = os.path.join(root, release.folder)
    os.makedirs(os.path.join(folder, "model"))
    os.makedirs(os.path.join(folder, "data"))
    arrays, _ = tf_arrays(np.random.default_rng(len(name)), n_token, cutoffs, div_val, d_embed, untie_r, share, same)
    write_tf_checkpoint(os.path.join(folder, "model", f"model.ckpt-{release.step}"), arrays)
    unk = "<UNK>" if dataset == "lm1b" else "<unk>"
    write_cache_pkl(os.path.join(folder, "data", "cache.pkl"), symbols, unk=unk if unk in symbols else symbols[0],
                    dataset=dataset)
    with open(os.path.join(folder, "data", "corpus-info.json"), "w") as f:
        json.dump({"vocab_size": n_token, "cutoffs": [0] + cutoffs + [n_token], "dataset": dataset}, f)
    assert sorted(release.files) == sorted(
        os.path.relpath(os.path.join(d, f), folder) for d, _, found in os.walk(folder) for f in found
        if not f.endswith(".meta"))


class Quiet(http.server.SimpleHTTPRequestHandler):
    dropping = set()  # paths whose next response stops halfway (then the path is served whole)
    always_dropping = set()

    def log_message(self, *args):
        pass

    def copyfile(self, source, output):
        path = self.path
        if path in self.dropping or path in self.always_dropping:
            self.dropping.discard(path)
            data = source.read()
            output.write(data[: len(data) // 2])
            output.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        super().copyfile(source, output)


@contextlib.contextmanager
def serve(root):
    """Every stand-in release written under `root` and served: yields `(root, url)`."""
    for name in STAND_INS:
        write_release(root, name)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=root))
    thread = threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True)  # shut down within 10 ms
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
