"""Preset folders of the tasks: one layout for `TransformerXLCausalLM` and `TransformerXLClassifier`.

`config.json` (the serialized model the task loads), `model.weights.h5`, `tokenizer.json`,
`preprocessor.json`, `assets/tokenizer/vocab.json` and `metadata.json` (written last: the
task's class name, the versions, the vocabulary's fingerprint)."""

import datetime
import json

import keras

from txl_io import files
from txl_keras import presets as preset_resolver
from txl_keras.models import sizes
from txl_keras.run_folder import RunFolderError, save_weights
from txl_keras.version import __version__


def write(preset_dir, task, model, config):
    """Write `task`'s preset folder, `model` (serialized and its weights) the part that
    `config.json` holds. Staged, then published whole; an existing file or non-empty
    folder is refused; a local path's `~` is expanded. Returns the folder."""
    preset_dir = files.user_path(preset_dir)
    tokenizer = task.preprocessor.tokenizer
    metadata = {"keras_version": keras.__version__, "txl_keras_version": __version__,
                "parameter_count": sizes.parameter_count(config),
                "vocabulary_fingerprint": tokenizer.vocabulary.fingerprint(),
                "date_saved": datetime.datetime.now().strftime("%Y-%m-%d@%H:%M:%S"),
                "class_name": type(task).__name__}

    def write_json(folder, name, value):
        files.atomic_write(files.join(folder, name), json.dumps(value, indent=2))

    with files.staged_folder(preset_dir, "a preset", last=preset_resolver.METADATA) as staging:
        write_json(staging, "config.json", keras.saving.serialize_keras_object(model))
        save_weights(model, files.join(staging, preset_resolver.WEIGHTS))
        write_json(staging, preset_resolver.TOKENIZER, keras.saving.serialize_keras_object(tokenizer))
        write_json(staging, "preprocessor.json", keras.saving.serialize_keras_object(task.preprocessor))
        assets = files.join(staging, preset_resolver.TOKENIZER_ASSETS)
        files.makedirs(assets)
        tokenizer.save_assets(assets)
        write_json(staging, preset_resolver.METADATA, metadata)
    return preset_dir


def saved_task_class(preset):
    """The task class name a preset folder's `metadata.json` records, else None (a name, or
    another kind of folder)."""
    if not isinstance(preset, str):
        return None
    path = files.join(files.user_path(preset), preset_resolver.METADATA)
    if not files.exists(path):
        return None
    try:
        return json.loads(files.read_text(path)).get("class_name")
    except (ValueError, AttributeError) as e:
        raise RunFolderError(f"{path} is damaged ({e}); save the preset again.") from None


def check_vocabulary(folder, vocabulary):
    """A RunFolderError unless `vocabulary` is the one the preset folder was saved with."""
    recorded = preset_resolver.saved_fingerprint(folder)
    if recorded is not None and vocabulary.fingerprint() != recorded:
        raise RunFolderError(f"The tokenizer in {folder} is not the vocabulary it was saved with (fingerprint "
                             f"{vocabulary.fingerprint()}, {preset_resolver.METADATA} records {recorded}): its ids "
                             "would mean other symbols; restore the files or save the preset again.")


def upload_preset(uri, preset):
    """Publish a preset folder written by `save_to_preset` as the hub handle `uri`
    (`hf://owner/name` or `kaggle://owner/model/keras/variation`), after checking that it
    loads whole as the task it was saved from. Returns `uri`."""
    from txl_keras import hub, tasks  # (the package defines the library's tasks)

    hub.parse(uri)
    folder = files.user_path(preset)
    if not preset_resolver.PresetFolderLoader.matches(folder):
        raise RunFolderError(f"{folder} is not a preset folder (metadata.json, tokenizer.json): upload a folder "
                             "written by save_to_preset.")
    task = tasks.task_classes().get(saved_task_class(folder))
    if task is None:
        raise RunFolderError(f"{folder}'s {preset_resolver.METADATA} names no task txl_keras loads; save it again.")
    task.from_preset(folder)  # every file read and checked, as a user's from_preset(uri) will
    hub.upload(uri, folder)
    return uri
