"""`Task`: what the text tasks share, as KerasHub's `Task`: a preprocessor with its tokenizer,
and `from_preset`, one way for every task to load a trained model."""

import keras

from txl_keras import presets as preset_resolver
from txl_keras.models import TransformerXLLM
from txl_keras.run_folder import RunFolderError, load_trained_model, load_weights
from txl_keras.tokenizers import TransformerXLTokenizer


class Task(keras.Model):
    """The base of `TransformerXLCausalLM` and `TransformerXLClassifier`: a model with a
    `preprocessor` (whose `tokenizer` turns text into ids).

    A subclass says how it is made on a trained language model
    (`_on_language_model(model, tokenizer, **kwargs)`, `model` a `TransformerXLLM`; its
    arguments checked first by `_check_new(**kwargs)`) and, where its preset folder holds
    more than a language model (a classifier's head), how such a folder loads
    (`_load_saved(found, dtype, **kwargs)`, `found` a `presets.Preset`). A new task is one
    subclass; its preset folder is written by `task_presets.write`."""

    presets = preset_resolver.presets()

    @property
    def tokenizer(self):
        return self.preprocessor.tokenizer

    @classmethod
    def from_preset(cls, preset, dtype=None, url=None, cache_dir=None, force_download=False, **kwargs):
        """The task of `preset`: a folder written by this class's `save_to_preset` loads
        whole; anything else a trained language model loads from (a released model's
        name, downloaded and converted on first use; a run folder, a converted folder, a
        language model's preset folder, a local folder in the release layout; a hub handle,
        `hf://` or `kaggle://`, fetched first) gives a new task on that model, made with
        the subclass's `kwargs`. `dtype` a dtype policy such as "mixed_bfloat16". A
        released model's cache entry that is damaged is converted again by the next call;
        `force_download=True` fetches and converts it again in any case. Architecture
        presets ("wt103_base", ...) have no trained weights or vocabulary:
        `TransformerXLLM.from_preset` builds those."""
        if dtype is not None and not isinstance(dtype, (str, keras.DTypePolicy)):
            raise ValueError(f"Expected `dtype` to be a dtype policy such as 'mixed_bfloat16'. Received: dtype="
                             f"{dtype!r} (a task's own arguments, such as num_classes, are given by name).")
        loader, preset = preset_resolver.preset_loader(preset)
        if not loader.holds_tasks:  # a language model: the new task's arguments are checked before it loads
            cls._check_new(**kwargs)
        found = loader.load(preset, preset_resolver.LoadOptions(url=url, cache_dir=cache_dir,
                                                                force_download=force_download,
                                                                task_class=cls.__name__))
        if found.config is None:  # a folder of this task that holds more than a language model
            return cls._load_saved(found, dtype, **kwargs)
        if loader.holds_tasks:
            cls._check_new(**kwargs)
        vocabulary = found.load_vocabulary()
        return cls._on_language_model(_language_model(found, dtype), TransformerXLTokenizer(vocabulary), **kwargs)

    @classmethod
    def _check_new(cls, **kwargs):
        """Refuse `kwargs` that cannot make a new task on a language model (checked before a
        released model is downloaded)."""

    @classmethod
    def _on_language_model(cls, model, tokenizer, **kwargs):
        raise NotImplementedError(f"{cls.__name__} must say how it is made on a language model (_on_language_model).")

    @classmethod
    def _load_saved(cls, found, dtype, **kwargs):
        raise NotImplementedError(f"{cls.__name__} saves more than a language model and must say how its preset "
                                  "folder loads (_load_saved).")


def task_classes():
    """`{class name: class}` of every `Task` subclass defined so far."""
    found, todo = {}, list(Task.__subclasses__())
    while todo:
        cls = todo.pop()
        found[cls.__name__] = cls
        todo += cls.__subclasses__()
    return found


def _language_model(found, dtype):
    """The `TransformerXLLM` of a resolved preset (`presets.Preset`), its weights loaded."""
    options = {} if dtype is None else {"dtype": dtype}
    try:
        if found.kind == "preset folder":
            model = TransformerXLLM(found.config, **dict(found.model_options), **options)
            load_weights(model, found.weights)
            return model
        return load_trained_model(found.folder, **options)
    except (OSError, ValueError) as e:
        if found.kind != "release":
            raise
        raise RunFolderError(f"The cache entry {found.folder} cannot be loaded ({' '.join(str(e).split())}); "
                             "from_preset(..., force_download=True) converts it again, or delete that "
                             "folder.") from None
