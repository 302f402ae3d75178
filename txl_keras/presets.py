"""Presets: any name or folder a user gives, turned into a config, weights and a vocabulary.

One resolver for the text task (`TransformerXLCausalLM.from_preset`), the trainers'
`--init_from` and `--pretrained`, and generation. It knows files and layouts, not the task:

- a released model's name (`RELEASES`, e.g. "transfo_xl_wt103": the paper's trained
  weights): downloaded on first use, converted once into the cache
  (`$KERAS_HOME/txl_keras/pretrained/<name>`, `~/.keras` without `KERAS_HOME`;
  `cache_dir=` overrides; `TXL_KERAS_PRETRAINED_URL` or `url=` names a mirror), then read
  offline; the downloaded files are deleted after the conversion;
- a run folder (`train_gpu.py`'s `--model_dir`) or a converted folder
  (`python -m txl_keras.convert`): `config.json`, checkpoints, `vocab.json`;
- a preset folder written by `TransformerXLCausalLM.save_to_preset`: `config.json` (the
  serialized `TransformerXLLM`), `metadata.json`, `model.weights.h5`, `tokenizer.json`
  and `assets/tokenizer/vocab.json`;
- a local folder in the release layout (`model/model.ckpt-N*`, `data/cache.pkl`),
  converted into the cache.

The names in `txl_keras.models.PRESETS` ("wt103_base", "tiny", ...) are architectures
with random weights and no vocabulary; they are not presets of trained models, and
`resolve` says so.
"""

import dataclasses
import json
import os

from txl_io import files
from txl_keras.releases import RELEASES, converted_folder, download_folder, fetch, pretrained_url
from tf_records.vocabulary import Vocabulary
from txl_keras.models.config import PRESETS as ARCHITECTURES
from txl_keras.models.config import TransformerXLConfig
from txl_keras.run_folder import CONFIG, VOCAB, RunFolderError, latest_checkpoint, require_config

METADATA = "metadata.json"
WEIGHTS = "model.weights.h5"
TOKENIZER = "tokenizer.json"
TOKENIZER_ASSETS = os.path.join("assets", "tokenizer")


@dataclasses.dataclass(frozen=True)
class Preset:
    """What a preset resolves to.

    Fields:
        source: what the user gave (a name or a path).
        kind: "release", "run folder" (training or conversion output) or "preset folder".
        folder: where its files are (the converted folder in the cache for a release).
        config: its `TransformerXLConfig`.
        weights: the path of its weights (a checkpoint folder or a `.weights.h5`).
        vocabulary: the path of its `vocab.json`, or None when it has none.
    """

    source: str
    kind: str
    folder: str
    config: TransformerXLConfig
    weights: str
    vocabulary: str = None

    def load_vocabulary(self):
        if self.vocabulary is None:
            raise RunFolderError(f"{self.folder} holds no {VOCAB}: it cannot turn text into ids; copy the "
                                 "vocab.json of its records there.")
        return Vocabulary.load(self.vocabulary)


def presets():
    """`{name: description}` of the trained models a name loads (the releases)."""
    return {name: f"trained: the paper's {r.dataset} model ({r.figure}), downloaded and converted on first use"
            for name, r in RELEASES.items()}


def resolve(preset, url=None, cache_dir=None, log=None):
    """The `Preset` of a name or folder (see the module docstring)."""
    if not isinstance(preset, str) or not preset.strip():
        raise ValueError(f"Expected `preset` to be a name or the path of a folder. Received: preset={preset!r}")
    if preset in RELEASES:
        converted = converted_folder(preset, cache_dir)
        if not files.exists(files.join(converted, CONFIG)):
            fetch_and_convert(preset, converted, url, cache_dir, log)
        return _run_folder_preset(preset, "release", converted)
    if preset in ARCHITECTURES:
        raise ValueError(f"{preset!r} is an architecture (random weights, no vocabulary), not a trained model: "
                         f"TransformerXLLM.from_preset({preset!r}) builds it untrained. Trained models: "
                         f"{', '.join(sorted(RELEASES))}, or the folder of a run, a conversion or a saved preset.")
    if not files.isdir(preset):
        raise RunFolderError(f"No run folder at {preset}: give a released model's name ({', '.join(sorted(RELEASES))}) "
                             "or the path of a run, converted or preset folder.")
    if files.exists(files.join(preset, METADATA)) and files.exists(files.join(preset, TOKENIZER)):
        return _preset_folder(preset)
    if files.exists(files.join(preset, CONFIG)):
        return _run_folder_preset(preset, "run folder", preset)
    release = _release_of_folder(preset) if files.isdir(files.join(preset, "model")) else None
    if release is None:
        raise ValueError(f"{preset!r} is neither a released model ({', '.join(sorted(RELEASES))}), a run or "
                         "converted folder (config.json), a preset folder (metadata.json, tokenizer.json) nor a "
                         "folder in the release layout (model/model.ckpt-N, data/cache.pkl).")
    name, settings = release
    converted = converted_folder(f"local-{_slug(preset)}", cache_dir)
    if not files.exists(files.join(converted, CONFIG)):
        convert_release(preset, settings, converted)
    return _run_folder_preset(preset, "release", converted)


def _run_folder_preset(source, kind, folder):
    config = require_config(folder)
    _, newest = latest_checkpoint(folder)
    if newest is None:
        raise RunFolderError(f"No complete checkpoint in {folder}: nothing trained to load.")
    vocab = files.join(folder, VOCAB)
    return Preset(source, kind, folder, config, newest, vocab if files.exists(vocab) else None)


def _preset_folder(folder):
    path = files.join(folder, CONFIG)
    try:
        serialized = json.loads(files.read_text(path))
        config = TransformerXLConfig.from_dict(serialized["config"]["config"])
    except (ValueError, KeyError, TypeError) as e:
        raise RunFolderError(f"{path} is damaged or not the config of a saved TransformerXLCausalLM preset "
                             f"({e}); save the preset again.") from None
    vocab = files.join(folder, TOKENIZER_ASSETS, VOCAB)
    return Preset(folder, "preset folder", folder, config, files.join(folder, WEIGHTS),
                  vocab if files.exists(vocab) else None)


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
