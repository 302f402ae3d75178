"""`Int8Model`: Keras's `quantize("int8")` for a whole Transformer-XL.

Every weight that generation and scoring read in bulk becomes int8 with float scales
(`txl_keras.layers.quantization`): the attention's query, key, value, position and output
kernels, the feed-forward's two kernels, the adaptive embedding's tables and the adaptive
softmax's (tied or not). Biases, layer norms, the small embedding projections and the
softmax's tail-cluster logits stay float, as do activations. Unlike Keras's `Model.quantize`,
which converts only the layer types it knows and warns about the rest, the whole model is
converted or nothing is. The model's config records `quantization="int8"`, so a saved model
or preset builds itself quantized and loads its int8 values.
"""

from txl_keras.layers import quantization
from txl_keras.layers.adaptive_embedding import AdaptiveEmbedding


class Int8Model:
    """Mixed into a `keras.Model` built of `QuantizableLayer`s; the model's constructor
    calls `_restore_quantization(quantization)` once it is built."""

    def _quantizable_layers(self):
        """The layers to convert, the embedding first (a tied softmax reads its tables)."""
        layers = [layer for layer in self._flatten_layers(include_self=False)
                  if isinstance(layer, quantization.QuantizableLayer)]
        return sorted(layers, key=lambda layer: not isinstance(layer, AdaptiveEmbedding))

    @property
    def quantization(self):
        """"int8" once quantized, else None."""
        layers = self._quantizable_layers()
        return "int8" if layers and layers[0].quantization_mode == "int8" else None

    def quantize(self, mode=None, config=None, filters=None, **kwargs):
        """Make the model's weights int8 (see the module): per output column of a kernel, per
        row of an embedding table. Keras's `config` is accepted and its quantizers unused;
        `filters` is refused (the model is converted whole)."""
        name = type(self).__name__
        quantization.check_mode(name, mode)
        kwargs.pop("type_check", None)
        if filters is not None or kwargs:
            raise ValueError(f"{name}.quantize converts the whole model; drop filters= and other arguments "
                             f"(received filters={filters!r}, {sorted(kwargs)}).")
        if self.quantization is not None:
            raise ValueError(f"{name} is already quantized ({self.quantization}); load the float model to "
                             "quantize it again.")
        if getattr(self, "lora_rank", None) is not None:
            raise ValueError(f"{name} has LoRA adapters (rank {self.lora_rank}): merge_lora_weights() first, then "
                             "quantize().")
        for layer in self._quantizable_layers():
            if layer.quantization_mode is None:
                layer.quantize(mode)
        self.train_function = self.test_function = self.predict_function = None

    def _quantization_config(self):
        """The config entry of the int8 weights (none while float)."""
        return {} if self.quantization is None else {"quantization": self.quantization}

    def _restore_quantization(self, mode):
        if mode is not None:
            self.quantize(mode)
