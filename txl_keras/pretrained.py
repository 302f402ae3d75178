"""The paper's released models in one call: downloaded on request, converted once, cached,
then loaded offline.

    model = TransformerXLLM.from_preset("transfo_xl_wt103")    # first call: download + convert

Only `from_preset` with a released name (`tf_records.releases.RELEASES`) and the
`--pretrained` flags download; nothing else touches the network. The checkpoint is
converted (`txl_keras.convert`) into a run folder under the cache
(`$KERAS_HOME/txl_keras/pretrained/<name>`, `~/.keras` without `KERAS_HOME`, as
`keras.utils.get_file` picks it; `cache_dir=` overrides) with the paper's evaluation
settings in its config.json and the vocabulary beside it; the downloaded files are then
deleted. Later calls load the converted folder without the network.
"""

import dataclasses
import os

from tf_records import files
from tf_records.releases import RELEASES, converted_folder, download_folder, fetch, pretrained_url
from txl_keras.run_folder import CONFIG, load_trained_model, require_config


def load(name_or_path, url=None, cache_dir=None, log=None, **model_kwargs):
    """The `TransformerXLLM` of `resolve(name_or_path)`'s folder (its newest checkpoint)."""
    return load_trained_model(resolve(name_or_path, url, cache_dir, log), **model_kwargs)


def resolve(name_or_path, url=None, cache_dir=None, log=None):
    """A run folder for `name_or_path`: a released name (downloaded and converted on
    first use), a run or converted folder (config.json), or a local folder in the release
    layout (converted into the cache). The paper's settings are in its config.json."""
    if name_or_path in RELEASES:
        converted = converted_folder(name_or_path, cache_dir)
        if not files.exists(files.join(converted, CONFIG)):
            fetch_and_convert(name_or_path, converted, url, cache_dir, log)
        return converted
    if files.exists(files.join(name_or_path, CONFIG)):
        require_config(name_or_path)
        return name_or_path
    release = _release_of_folder(name_or_path)
    if release is None:
        raise ValueError(f"{name_or_path!r} is neither a released model ({', '.join(sorted(RELEASES))}), a run "
                         "folder (config.json) nor a folder in the release layout (model/checkpoint, "
                         "data/cache.pkl).")
    name, settings = release
    converted = converted_folder(f"local-{_slug(name_or_path)}", cache_dir)
    if not files.exists(files.join(converted, CONFIG)):
        convert_release(name_or_path, settings, converted)
    return converted


def _slug(path):
    return "".join(c if c.isalnum() else "_" for c in os.path.abspath(path).strip("/"))[-100:]


def _release_of_folder(folder):
    """`(name, Release)` of a local folder in the release layout (its model.ckpt-N), else None."""
    index = [n for n in files.listdir(files.join(folder, "model")) if n.endswith(".index")]
    if not index or not files.exists(files.join(folder, "data", "cache.pkl")):
        return None
    step = int(index[0][len("model.ckpt-"):-len(".index")])
    base = files.basename(folder.rstrip("/"))
    for name, release in RELEASES.items():
        if base == release.folder or base == release.folder.replace("enwiki8", "enwik8"):
            return name, dataclasses.replace(release, step=step)
    raise ValueError(f"{folder} is in the release layout but its name {base!r} is none of "
                     f"{sorted(r.folder for r in RELEASES.values())}: its evaluation settings are unknown.")


def fetch_and_convert(name, converted, url=None, cache_dir=None, log=None):
    """Download release `name` into the cache, convert it into `converted`, delete the download."""
    release = RELEASES[name]
    base = pretrained_url(url)
    download = download_folder(name, cache_dir)
    with files.exclusive(download, f"The download of {name}"):
        for relative in release.files:
            fetch(f"{base}/{release.folder}/{relative}", files.join(download, relative), log)
        convert_release(download, release, converted)
        for relative in release.files:
            files.remove_file(files.join(download, relative))
    for folder in ("model", "data", ""):
        path = files.join(download, folder) if folder else download
        if files.exists(path) and not files.listdir(path):
            files.remove_folder(path, ())


def convert_release(folder, release, converted):
    """Convert a folder in the release layout into the run folder `converted`."""
    from txl_keras.convert import from_tf_checkpoint, load_cache_vocab, write_converted

    vocab, dataset = load_cache_vocab(files.join(folder, "data", "cache.pkl"))
    model = from_tf_checkpoint(files.join(folder, "model", f"model.ckpt-{release.step}"), tgt_len=release.tgt_len,
                               mem_len=release.mem_len, clamp_len=release.clamp_len,
                               same_length=release.same_length)
    write_converted(converted, model, vocab, dataset)
