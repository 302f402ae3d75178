"""The text task above the model: `TransformerXLCausalLM` with its preprocessor and metric."""

from txl_keras.tasks.causal_lm import TextScore, TransformerXLCausalLM
from txl_keras.tasks.causal_lm_preprocessor import TransformerXLCausalLMPreprocessor
from txl_keras.tasks.perplexity import Perplexity
from txl_keras.schedules import WarmupCosine

__all__ = ["Perplexity", "TextScore", "TransformerXLCausalLM", "TransformerXLCausalLMPreprocessor", "WarmupCosine"]
