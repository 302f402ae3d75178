"""The tasks above the model: `TransformerXLCausalLM` (text) and `TransformerXLClassifier`
(documents), with their preprocessors and metric."""

from txl_keras.tasks.causal_lm import TextScore, TransformerXLCausalLM
from txl_keras.tasks.causal_lm_preprocessor import TransformerXLCausalLMPreprocessor
from txl_keras.tasks.classifier import TransformerXLClassifier
from txl_keras.tasks.classifier_preprocessor import TransformerXLClassifierPreprocessor
from txl_keras.tasks.perplexity import Perplexity
from txl_keras.tasks.task import Task, task_classes
from txl_keras.tasks.task_presets import upload_preset
from txl_keras.schedules import WarmupCosine

__all__ = ["Perplexity", "TextScore", "TransformerXLCausalLM", "TransformerXLCausalLMPreprocessor",
           "TransformerXLClassifier", "TransformerXLClassifierPreprocessor", "Task", "WarmupCosine",
           "task_classes", "upload_preset"]
