"""`LoraModel`: low-rank adaptation of a whole model's attention (KerasHub's `Backbone.enable_lora`).

`enable_lora(rank)` freezes every weight of the model and adapts each `RelativeAttention`'s
query, key, value and output projections (`txl_keras.layers.lora`); the adapters are then the
only trainable weights. Unlike KerasHub, whose adapters are folded into the kernels when a
preset is saved, the model's config records `lora_rank` and `lora_alpha`, so a saved model or
preset loads back with its adapters; `merge_lora_weights()` folds them in for shipping.
`save_lora_weights(path)` / `load_lora_weights(path)` move just the adapters (`.lora.h5`).
"""

import h5py
import numpy as np

from txl_io import files
from txl_keras.layers.relative_attention import RelativeAttention

LORA_SUFFIX = ".lora.h5"


class LoraModel:
    """Mixed into a `keras.Model` whose attention layers are `RelativeAttention`s; the
    model's constructor calls `_restore_lora(lora_rank, lora_alpha)` once it is built."""

    def _attention_layers(self):
        return [layer for layer in self._flatten_layers(include_self=False) if isinstance(layer, RelativeAttention)]

    @property
    def lora_rank(self):
        layers = self._attention_layers()
        return layers[0].lora_rank if layers and layers[0].lora_enabled else None

    @property
    def lora_alpha(self):
        layers = self._attention_layers()
        return layers[0].lora_alpha if layers and layers[0].lora_enabled else None

    def enable_lora(self, rank, lora_alpha=None):
        """Freeze every weight and add rank-`rank` adapters (scaled by `lora_alpha / rank`,
        default 1) to every attention layer's query, key, value and output projections."""
        if self.lora_rank is not None:
            raise ValueError(f"LoRA is already enabled (rank {self.lora_rank}); merge_lora_weights() first to "
                             "start new adapters.")
        quantized = sorted({layer.quantization_mode for layer in self._flatten_layers() if layer.quantization_mode})
        if quantized:
            raise ValueError(f"The model is quantized ({', '.join(quantized)}); LoRA adapts float kernels: enable "
                             "it before quantize(), or load the float model.")
        layers = self._attention_layers()
        shapes = [s for layer in layers for s in (layer.qkv_kernel.shape, layer.o_kernel.shape)]
        from txl_keras.layers import lora

        lora.check_rank(type(self).__name__, rank, lora_alpha, shapes)  # before any weight changes
        for weight in self.weights:
            weight.trainable = False
        for layer in layers:
            layer.enable_lora(rank, lora_alpha)

    def _lora_config(self):
        """The config entries of the adapters (none without them)."""
        return {} if self.lora_rank is None else {"lora_rank": self.lora_rank, "lora_alpha": self.lora_alpha}

    def _restore_lora(self, lora_rank, lora_alpha):
        if lora_rank is not None:
            self.enable_lora(lora_rank, lora_alpha)

    def merge_lora_weights(self):
        """Fold every adapter into its kernel and remove it; every weight is trainable
        again and the model computes what it computed with the adapters."""
        if self.lora_rank is None:
            raise ValueError("There are no LoRA adapters to merge; enable_lora(rank) first.")
        for layer in self._attention_layers():
            layer.merge_lora()
        for layer in self._flatten_layers():
            for weight in layer._trainable_variables:  # the weights made trainable
                weight.trainable = True

    def save_lora_weights(self, filepath, overwrite=True):
        """Write the adapters alone to `filepath` (ending in `.lora.h5`): the rank, the
        scale and each attention layer's four arrays under its path. Written whole."""
        filepath = _lora_path(filepath)
        if self.lora_rank is None:
            raise ValueError("There are no LoRA adapters to save; enable_lora(rank) first.")
        with files.local_output(filepath, suffix=LORA_SUFFIX, overwrite=overwrite) as local:
            with h5py.File(local, "w") as f:
                f.attrs["rank"], f.attrs["alpha"] = self.lora_rank, self.lora_alpha
                for layer in self._attention_layers():
                    for weight in layer.lora_weights():
                        f[weight.path] = np.asarray(weight.numpy() if hasattr(weight, "numpy") else weight)

    def load_lora_weights(self, filepath):
        """Read adapters written by `save_lora_weights` (enabling LoRA at their rank if it is
        not enabled): every array is checked against this model before any is assigned."""
        filepath = _lora_path(filepath)
        if not files.exists(filepath):
            raise FileNotFoundError(f"No LoRA weights at {filepath}; save_lora_weights() writes them.")
        with files.local_input(filepath) as local:
            try:
                with h5py.File(local, "r") as f:
                    rank, alpha = int(f.attrs["rank"]), float(f.attrs["alpha"])
                    arrays = {}
                    f.visititems(lambda name, item: arrays.__setitem__(name, item[()])
                                 if isinstance(item, h5py.Dataset) else None)
            except (OSError, KeyError, ValueError, TypeError) as e:
                raise ValueError(f"{filepath} is not a file of LoRA weights ({' '.join(str(e).split())[:200]}); "
                                 "save_lora_weights() writes them.") from None
        if self.lora_rank is not None and (self.lora_rank, float(self.lora_alpha)) != (rank, alpha):
            raise ValueError(f"{filepath} holds adapters of rank {rank} (alpha {alpha:g}) but this model's are of "
                             f"rank {self.lora_rank} (alpha {self.lora_alpha:g}); both must match.")
        expected = self._lora_shapes(rank)
        found = {name: tuple(a.shape) for name, a in arrays.items()}
        if found != expected:
            missing = sorted(set(expected) - set(found))
            other = sorted(name for name in found if expected.get(name) != found[name])
            raise ValueError(f"{filepath} holds the adapters of another model (missing {missing[:3]}, not matching "
                             f"{other[:3]}); load adapters saved from a model of this config.")
        if self.lora_rank is None:
            self.enable_lora(rank, alpha)
        for layer in self._attention_layers():
            for weight in layer.lora_weights():
                weight.assign(arrays[weight.path])

    def _lora_shapes(self, rank):
        """`{path: shape}` of the adapters that rank-`rank` LoRA gives this model."""
        shapes = {}
        for layer in self._attention_layers():
            prefix = layer.path
            for name, kernel in (("qkv", layer.qkv_kernel), ("o", layer.o_kernel)):
                shapes[f"{prefix}/{name}_lora_a"] = (kernel.shape[0], rank)
                shapes[f"{prefix}/{name}_lora_b"] = (rank, kernel.shape[1])
        return shapes


def _lora_path(filepath):
    filepath = files.user_path(str(filepath))
    if not filepath.endswith(LORA_SUFFIX):
        raise ValueError(f"The file name of LoRA weights must end in `{LORA_SUFFIX}`. Received: filepath={filepath}")
    return filepath
