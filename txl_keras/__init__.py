"""txl_keras: Transformer-XL (Dai et al., 2019) for Keras 3 and TensorFlow 2.

The layers (`txl_keras.layers`), the models (`TransformerXL`, `TransformerXLLM`,
`TransformerXLConfig`), the tokenizer, the text task (`TransformerXLCausalLM`: text in,
text out, `fit` on text, presets) and the document classifier (`TransformerXLClassifier`), and the modules `training`, `export`
(`export_saved_model`), `generate` (the module; `txl_keras.generate.generate` the
function), `convert`, `run_folder` and `presets`.

Importing the package has no effect on the process and imports neither Keras nor
TensorFlow: each name loads its module on first use (and so registers its Keras classes
for `keras.saving.load_model`). TensorFlow is imported where it is used: on the
TensorFlow backend, the tokenizer, the data pipeline, the trainers and export.
`prefer_bfc_cpu_allocator()`, called before TensorFlow runs its first operation, selects
TensorFlow's BFC CPU allocator as the programs do (faster CPU training).
"""

from txl_io.lazy_names import lazy_names
from txl_keras.version import __version__

# public name -> the module that holds it
_HOMES = {
    "PRESETS": "txl_keras.models",
    "TransformerXL": "txl_keras.models",
    "TransformerXLConfig": "txl_keras.models",
    "TransformerXLLM": "txl_keras.models",
    "TransformerXLTokenizer": "txl_keras.tokenizers",
    "TransformerXLCausalLM": "txl_keras.tasks",
    "TransformerXLCausalLMPreprocessor": "txl_keras.tasks",
    "TransformerXLClassifier": "txl_keras.tasks",
    "TransformerXLClassifierPreprocessor": "txl_keras.tasks",
    "export_saved_model": "txl_keras.export",
    "upload_preset": "txl_keras.tasks",
    "load_trained_model": "txl_keras.run_folder",
    "prefer_bfc_cpu_allocator": "txl_io.cpu_allocator",
}
_MODULES = ("convert", "export", "generate", "hub", "kernels", "layers", "models", "presets", "run_folder", "tasks",
            "tokenizers", "training")

__getattr__, __dir__, __all__ = lazy_names(__name__, _HOMES, _MODULES)
__all__ = sorted([*__all__, "__version__"])
