"""Presets: any name or folder a user gives, turned into a config, weights and a vocabulary.

One resolver for the text task (`TransformerXLCausalLM.from_preset`), the trainers'
`--init_from` and `--pretrained`, and generation. It knows files and layouts, not the task.
Each source is a `PresetLoader` class, found through one registry (`NAMED_LOADERS`, then
`FOLDER_LOADERS` by what a folder holds):

- `ReleaseLoader`: a released model's name (`RELEASES`, e.g. "transfo_xl_wt103": the paper's trained
  weights): downloaded on first use (each file checked, see `txl_keras.releases`),
  converted once into the cache (`$KERAS_HOME/txl_keras/pretrained/<name>`, `~/.keras`
  without `KERAS_HOME`; `cache_dir=` overrides; `TXL_KERAS_PRETRAINED_URL` or `url=` names
  a mirror), then read offline; the downloaded files are deleted after the conversion;
- `RunFolderLoader`: a run folder (`train_gpu.py`'s `--model_dir`) or a converted folder
  (`python -m txl_keras.convert`): `config.json`, checkpoints, `vocab.json`;
- `PresetFolderLoader`: a preset folder written by `TransformerXLCausalLM.save_to_preset`: `config.json` (the
  serialized `TransformerXLLM`), `metadata.json`, `model.weights.h5`, `tokenizer.json`
  and `assets/tokenizer/vocab.json`;
- `HubLoader`: a hub handle, `hf://owner/name` or `kaggle://owner/model/keras/variation`, fetched
  through the hub's client library (`txl_keras.hub`, the `hub` extra) and read as the folder it is;
- `ReleaseLayoutLoader`: a local folder in the release layout (`model/<checkpoint>.index`, `.data-*`,
  `data/cache.pkl`), converted into the cache: the checkpoint is the one `model/checkpoint`
  names (else the only one there), the corpus the one its folder's name and its
  `cache.pkl` agree on.

A cache entry records what it was converted from (`cache-entry.json`: the release's name,
or a local folder's resolved path and its files' sizes and modification times) and the
size of every file it holds. An entry that is missing a file, damaged, or converted from
files that have changed since is converted again by the next call (one warning line);
`force_download=True` fetches and converts it again in any case. A local folder's entry is
named by a digest of its resolved path, so two folders never share one.

The names in `txl_keras.models.PRESETS` ("wt103_base", "tiny", ...) are architectures
with random weights and no vocabulary; they are not presets of trained models, and
`resolve` says so.
"""

import dataclasses
import hashlib
import json
import os
import re

from tf_records.original import load_cache_vocab
from txl_io import files
from txl_io.fetch import warn
from txl_keras import hub
from txl_keras.releases import (RELEASES, check_file, checkpoint_name, converted_folder,
                                download_folder, fetch_file)
from tf_records.vocabulary import VOCAB_FILE, Vocabulary
from txl_keras.models.config import PRESETS as ARCHITECTURES
from txl_keras.models.config import TransformerXLConfig
from txl_keras.run_folder import CONFIG, RunFolderError, latest_checkpoint, require_config

METADATA = "metadata.json"
CACHE_ENTRY = "cache-entry.json"
WEIGHTS = "model.weights.h5"
TOKENIZER = "tokenizer.json"
TOKENIZER_ASSETS = os.path.join("assets", "tokenizer")
FINGERPRINT = re.compile(r"[0-9a-f]{32}")  # `Vocabulary.fingerprint()`
LANGUAGE_MODEL_TASK = "TransformerXLCausalLM"  # the task whose preset folder holds a language model alone
MODEL_OPTIONS = ("lora_rank", "lora_alpha", "quantization")  # TransformerXLLM arguments a preset's config.json may hold


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
        model_options: `(name, value)` pairs of the `TransformerXLLM` arguments a preset
            folder records beside the config (its LoRA adapters' `lora_rank`, `lora_alpha`;
            `quantization` of int8 weights).
        task_class: the task class a preset folder was saved from, or None. A task other
            than the language model's (a classifier: its head beside the backbone) is
            loaded by that class alone: `config` and the vocabulary are then None.
    """

    source: str
    kind: str
    folder: str
    config: TransformerXLConfig
    weights: str
    vocabulary: str = None
    vocabulary_fingerprint: str = None
    model_options: tuple = ()
    task_class: str = None

    def load_vocabulary(self):
        """The `Vocabulary`, checked against the fingerprint the preset recorded (where it did)."""
        if self.vocabulary is None:
            raise RunFolderError(f"{self.folder} holds no {VOCAB_FILE}: it cannot turn text into ids; copy the "
                                 f"{VOCAB_FILE} of its records there.")
        vocabulary = Vocabulary.load(self.vocabulary)
        if self.vocabulary_fingerprint is not None and vocabulary.fingerprint() != self.vocabulary_fingerprint:
            raise RunFolderError(f"{self.vocabulary} is not the vocabulary the preset {self.folder} was saved with "
                                 f"(fingerprint {vocabulary.fingerprint()}, {METADATA} records "
                                 f"{self.vocabulary_fingerprint}): its ids would mean other symbols; restore the "
                                 "file or save the preset again.")
        return vocabulary


def presets():
    """`{name: description}` of the trained models a name loads (the releases)."""
    return {name: f"trained: the paper's {r.dataset} model ({r.figure}), downloaded and converted on first use"
            for name, r in RELEASES.items()}


@dataclasses.dataclass(frozen=True)
class LoadOptions:
    """How a loader may fetch and convert: a mirror `url`, the cache's `cache_dir`, a `log`
    for progress lines, and `force_download` (fetch and convert again); `task_class` the
    task that loads the preset (a preset folder of another task than it and the language
    model is refused)."""

    url: str = None
    cache_dir: str = None
    log: object = None
    force_download: bool = False
    task_class: str = LANGUAGE_MODEL_TASK


class PresetLoader:
    """One source of presets. `matches(preset)` says whether a name or (expanded) path is
    of this source; `load(preset, options)` gives its `Preset`. A new source (a hub's
    handles) is one subclass added to `LOADERS`. `holds_tasks`: whether its presets may be
    a task's folder (a classifier's) rather than a language model."""

    kind = None
    holds_tasks = False

    @staticmethod
    def matches(preset):
        raise NotImplementedError

    def load(self, preset, options):
        raise NotImplementedError


class ReleaseLoader(PresetLoader):
    """A released model's name: downloaded, checked and converted into the cache once."""

    kind = "release"

    @staticmethod
    def matches(preset):
        return preset in RELEASES

    def load(self, preset, options):
        converted = converted_folder(preset, options.cache_dir)
        _cache_entry(converted, {"release": preset}, options.force_download,
                     lambda: fetch_and_convert(preset, converted, options.url, options.cache_dir, options.log,
                                               options.force_download))
        return _run_folder_preset(preset, self.kind, converted)


class PresetFolderLoader(PresetLoader):
    """A folder written by `TransformerXLCausalLM.save_to_preset`."""

    kind = "preset folder"
    holds_tasks = True

    @staticmethod
    def matches(preset):
        return files.exists(files.join(preset, METADATA)) and files.exists(files.join(preset, TOKENIZER))

    def load(self, preset, options):
        return _preset_folder(preset, options.task_class)


class RunFolderLoader(PresetLoader):
    """A training run's or a conversion's folder: `config.json`, checkpoints, `vocab.json`."""

    kind = "run folder"

    @staticmethod
    def matches(preset):
        return files.exists(files.join(preset, CONFIG))

    def load(self, preset, options):
        return _run_folder_preset(preset, self.kind, preset)


class ReleaseLayoutLoader(PresetLoader):
    """A local folder in the release layout (`model/`, `data/cache.pkl`), converted into the cache."""

    kind = "release"

    @staticmethod
    def matches(preset):
        return files.isdir(files.join(preset, "model"))

    def load(self, preset, options):
        release, prefix = release_of_folder(preset)
        converted = converted_folder(local_entry_name(preset), options.cache_dir)
        _cache_entry(converted, _local_source(preset, prefix), options.force_download,
                     lambda: convert_release(prefix, files.join(preset, "data", "cache.pkl"), release, converted))
        return _run_folder_preset(preset, self.kind, converted)


# The registry, in the order a preset is tried: names first, then folders by what they hold.
class HubLoader(PresetLoader):
    """A hub handle (`hf://owner/name`, `kaggle://owner/model/keras/variation`): its files
    fetched by the hub's client (`txl_keras.hub`, cached there), then read by the folder
    loader of what they hold."""

    kind = "hub"
    holds_tasks = True

    @staticmethod
    def matches(preset):
        return hub.is_handle(preset)

    def load(self, preset, options):
        folder = hub.download(preset, options.cache_dir, options.force_download)
        for loader in FOLDER_LOADERS:
            if loader.matches(folder):
                return dataclasses.replace(loader().load(folder, options), source=preset)
        raise RunFolderError(f"{preset} holds no preset: neither a saved preset (metadata.json, tokenizer.json) nor "
                             "a run or converted folder (config.json); upload a folder written by save_to_preset.")


NAMED_LOADERS = (ReleaseLoader, HubLoader)
FOLDER_LOADERS = (PresetFolderLoader, RunFolderLoader, ReleaseLayoutLoader)


def preset_loader(preset):
    """`(loader, preset)`: the loader of a name or folder, with a path's `~` expanded; a
    clear error for anything no loader takes."""
    if not isinstance(preset, str) or not preset.strip():
        raise ValueError(f"Expected `preset` to be a name or the path of a folder. Received: preset={preset!r}")
    for loader in NAMED_LOADERS:
        if loader.matches(preset):
            return loader(), preset
    if preset in ARCHITECTURES:
        raise ValueError(f"{preset!r} is an architecture (random weights, no vocabulary), not a trained model: "
                         f"TransformerXLLM.from_preset({preset!r}) builds it untrained. Trained models: "
                         f"{', '.join(sorted(RELEASES))}, or the folder of a run, a conversion or a saved preset.")
    preset = os.path.expanduser(preset)
    if not files.isdir(preset):
        raise RunFolderError(f"No run folder at {preset}: give a released model's name ({', '.join(sorted(RELEASES))}) "
                             "or the path of a run, converted or preset folder.")
    for loader in FOLDER_LOADERS:
        if loader.matches(preset):
            return loader(), preset
    raise ValueError(f"{preset!r} is neither a released model ({', '.join(sorted(RELEASES))}), a run or "
                     "converted folder (config.json), a preset folder (metadata.json, tokenizer.json) nor a "
                     "folder in the release layout (model/model.ckpt-N, data/cache.pkl).")


def resolve(preset, url=None, cache_dir=None, log=None, force_download=False):
    """The language model's `Preset` of a name or folder (see the module docstring): its loader's."""
    loader, preset = preset_loader(preset)
    return loader.load(preset, LoadOptions(url, cache_dir, log, force_download))


def _run_folder_preset(source, kind, folder):
    config = require_config(folder)
    _, newest = latest_checkpoint(folder)
    if newest is None:
        raise RunFolderError(f"No complete checkpoint in {folder}: nothing trained to load.")
    vocab = files.join(folder, VOCAB_FILE)
    return Preset(source, kind, folder, config, newest, vocab if files.exists(vocab) else None)


def _preset_folder(folder, loading_task):
    task_class = _metadata(folder).get("class_name")
    if task_class is not None and not (isinstance(task_class, str) and task_class.isidentifier()):
        raise RunFolderError(f"{files.join(folder, METADATA)} is damaged (class_name={task_class!r}); save the "
                             "preset again.")
    if task_class not in (None, LANGUAGE_MODEL_TASK):  # another task's folder, which that task alone reads
        if task_class != loading_task:
            raise RunFolderError(f"{folder} is a saved {task_class}, not a language model: load it with "
                                 f"txl_keras.{task_class}.from_preset.")
        return Preset(folder, "preset folder", folder, None, files.join(folder, WEIGHTS), task_class=task_class)
    path = files.join(folder, CONFIG)
    try:
        serialized = json.loads(files.read_text(path))
        config = TransformerXLConfig.from_dict(serialized["config"]["config"])
        options = tuple((name, serialized["config"][name]) for name in MODEL_OPTIONS if name in serialized["config"])
        _check_model_options(dict(options))
    except (ValueError, KeyError, TypeError) as e:
        raise RunFolderError(f"{path} is damaged or not the config of a saved TransformerXLCausalLM preset "
                             f"({e}); save the preset again.") from None
    _check_tokenizer_file(files.join(folder, TOKENIZER))
    vocab = files.join(folder, TOKENIZER_ASSETS, VOCAB_FILE)
    return Preset(folder, "preset folder", folder, config, files.join(folder, WEIGHTS),
                  vocab if files.exists(vocab) else None, saved_fingerprint(folder), options, task_class)


def _metadata(folder):
    """The dict of a preset folder's `metadata.json`."""
    path = files.join(folder, METADATA)
    try:
        metadata = json.loads(files.read_text(path))
    except ValueError as e:
        raise RunFolderError(f"{path} is damaged ({e}); save the preset again.") from None
    if not isinstance(metadata, dict):
        raise RunFolderError(f"{path} is damaged (not a JSON object); save the preset again.")
    return metadata


def saved_fingerprint(folder):
    """The vocabulary fingerprint a preset folder's `metadata.json` records (None if none)."""
    fingerprint = _metadata(folder).get("vocabulary_fingerprint")
    if fingerprint is not None and not (isinstance(fingerprint, str) and FINGERPRINT.fullmatch(fingerprint)):
        raise RunFolderError(f"{files.join(folder, METADATA)} is damaged (vocabulary_fingerprint={fingerprint!r}); "
                             "save the preset again.")
    return fingerprint


def _check_model_options(options):
    """A ValueError unless the recorded LoRA settings are None or positive numbers (rank an
    integer) and the quantization None or "int8"."""
    rank, alpha = options.get("lora_rank"), options.get("lora_alpha")
    if options.get("quantization") not in (None, "int8"):
        raise ValueError(f"quantization={options['quantization']!r} is not None or 'int8'")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 1):
        raise ValueError(f"lora_rank={rank!r} is not a positive integer")
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0):
        raise ValueError(f"lora_alpha={alpha!r} is not a positive number")


def _check_tokenizer_file(path):
    """Refuse a `tokenizer.json` that is not a serialized `TransformerXLTokenizer`."""
    try:
        serialized = json.loads(files.read_text(path))
        valid = isinstance(serialized, dict) and serialized.get("class_name") == "TransformerXLTokenizer" \
            and isinstance(serialized.get("config"), dict)
    except ValueError as e:
        raise RunFolderError(f"{path} is damaged ({' '.join(str(e).split())}); save the preset again.") from None
    if not valid:
        raise RunFolderError(f"{path} is damaged: it is not a serialized TransformerXLTokenizer; save the preset "
                             "again.")


def local_entry_name(folder):
    """The cache entry of a local release folder: its name, then a digest of its resolved path."""
    resolved = os.path.realpath(folder)
    readable = "".join(c if c.isalnum() or c in "-_." else "_" for c in os.path.basename(resolved))[:40]
    return f"local-{readable}-{hashlib.sha256(resolved.encode('utf-8', 'surrogateescape')).hexdigest()[:32]}"


def release_of_folder(folder):
    """`(Release, checkpoint prefix)` of a local folder in the release layout: the checkpoint
    `model/checkpoint` names (else the only one), the release its folder's name and its
    `cache.pkl` agree on; a ValueError saying which is which otherwise."""
    model = files.join(folder, "model")
    pointer = files.join(model, "checkpoint")
    if files.exists(pointer):
        name = checkpoint_name(pointer)
        if not files.exists(files.join(model, name + ".index")):
            raise ValueError(f"{pointer} names the checkpoint {name}, but {model} holds no {name}.index.")
    else:
        names = sorted(n[: -len(".index")] for n in files.listdir(model) if n.endswith(".index"))
        if len(names) != 1:
            found = ", ".join(names) or "none"
            raise ValueError(f"{model} holds {len(names)} checkpoints ({found}) and no checkpoint file naming one: "
                             "write model/checkpoint (model_checkpoint_path: \"NAME\") or keep only one.")
        name = names[0]
    cache = files.join(folder, "data", "cache.pkl")
    if not files.exists(cache):
        raise ValueError(f"{folder} is in the release layout but has no data/cache.pkl (its vocabulary).")
    _, dataset = load_cache_vocab(cache)
    base = files.basename(folder.rstrip("/"))
    by_name = [r for r in RELEASES.values() if base in (r.folder, r.folder.replace("enwiki8", "enwik8"))]
    by_corpus = [r for r in RELEASES.values() if r.dataset == dataset]
    if by_name and dataset is not None and by_name[0].dataset != dataset:
        raise ValueError(f"{folder} is named as the {by_name[0].dataset} release but its data/cache.pkl is the "
                         f"vocabulary of the {dataset} corpus: rename the folder tf_{dataset} (or fix its data/).")
    release = (by_name or by_corpus or [None])[0]
    if release is None:
        raise ValueError(f"{folder} is in the release layout but neither its name {base!r} nor its cache.pkl names "
                         f"a released corpus ({sorted(r.folder for r in RELEASES.values())}): its evaluation "
                         "settings are unknown.")
    info = files.join(folder, "data", "corpus-info.json")
    if files.exists(info):
        check_file(release, "data/corpus-info.json", info)
    return release, files.join(model, name)


def _local_source(folder, prefix):
    """What a local release folder's conversion is made of: its path and its files' sizes and times."""
    model = files.dirname(prefix)
    used = [prefix + ".index"] + [files.join(model, n) for n in files.listdir(model)
                                  if n.startswith(files.basename(prefix) + ".data-")]
    used += [files.join(folder, "data", n) for n in ("cache.pkl", "corpus-info.json")]
    used += [files.join(model, "checkpoint")]
    stamps = {}
    for path in used:
        if files.exists(path):
            stat = os.stat(path) if files.is_local(path) else None
            stamps[os.path.relpath(path, folder)] = [files.size(path), stat.st_mtime_ns if stat else None]
    return {"folder": os.path.realpath(folder), "files": stamps}


def _cache_entry(converted, source, force, build):
    """Make `converted` (a cache entry) by `build()` unless it is whole and made from `source`."""
    locks = files.join(files.dirname(files.dirname(converted)), "locks")
    with files.exclusive(files.join(locks, files.basename(converted)), f"The cache entry {converted}"):
        problem = "is converted again (force_download=True)" if force else _entry_problem(converted, source)
        if problem is None:
            return
        if files.exists(converted):
            warn(f"the cache entry {converted} {problem}; converting it again")
            files.remove_tree(converted)  # (an entry of the cache: ours to replace)
        build()
        held = {os.path.relpath(os.path.join(d, f), converted): files.size(os.path.join(d, f))
                for d, _, found in files.walk(converted) for f in found}
        files.atomic_write(files.join(converted, CACHE_ENTRY), json.dumps({"source": source, "files": held}))


def _entry_problem(converted, source):
    """None when the cache entry `converted` is whole and made from `source`; else what is wrong."""
    if not files.exists(converted):
        return "is missing"
    try:
        entry = json.loads(files.read_text(files.join(converted, CACHE_ENTRY)))
        held = entry["files"]
        recorded = entry["source"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"has no readable {CACHE_ENTRY} (an interrupted or damaged conversion)"
    for name, size in held.items():
        path = files.join(converted, name)
        if not files.exists(path) or files.size(path) != size:
            return f"lost or damaged {name}"
    if recorded != source:
        return "was converted from files that have changed since"
    return None


def fetch_and_convert(name, converted, url=None, cache_dir=None, log=None, force_download=False):
    """Download release `name` into the cache (each file checked), convert it into
    `converted`, delete the download."""
    release = RELEASES[name]
    download = download_folder(name, cache_dir)
    with files.exclusive(download, f"The download of {name}"):
        if force_download:
            for relative in release.files:
                files.remove_file(files.join(download, relative))
        for relative in release.files:
            fetch_file(name, relative, download, url, log)
        prefix = files.join(download, "model", f"model.ckpt-{release.step}")
        convert_release(prefix, files.join(download, "data", "cache.pkl"), release, converted)
        for relative in release.files:
            files.remove_file(files.join(download, relative))
    for folder in ("model", "data", ""):
        path = files.join(download, folder) if folder else download
        if files.exists(path) and not files.listdir(path):
            files.remove_folder(path, ())


def convert_release(prefix, cache_pkl, release, converted):
    """Convert the checkpoint at `prefix` and its `cache.pkl` (a release's files) into the
    run folder `converted`, with the release's evaluation settings."""
    from txl_keras.convert import from_tf_checkpoint, write_converted

    vocab, dataset = load_cache_vocab(cache_pkl)
    model = from_tf_checkpoint(prefix, tgt_len=release.tgt_len, mem_len=release.mem_len,
                               clamp_len=release.clamp_len, same_length=release.same_length)
    write_converted(converted, model, vocab, dataset)
