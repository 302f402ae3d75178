"""`Perplexity`: exp of the mean negative log-likelihood of the targets seen so far."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="txl_keras")
class Perplexity(keras.metrics.Metric):
    """`exp(sum(w * nll) / sum(w))` over every batch since the last reset.

    It takes the per-token NLL (nats) as `y_pred`, as `TransformerXLCausalLM` gives its
    metrics, so the figure is the corpus perplexity of the text seen, however the
    batches split it (padding, of weight 0, left out).

    Call arguments (`update_state`):
        y_true: the targets (unused: the NLL already scores them).
        y_pred: float `(batch_size, T)`, each target's NLL.
        sample_weight: optional float `(batch_size, T)`.
    """

    def __init__(self, name="perplexity", **kwargs):
        super().__init__(name=name, **kwargs)
        self.total = self.add_variable((), "zeros", dtype="float32", name="total")
        self.count = self.add_variable((), "zeros", dtype="float32", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        nll = ops.cast(y_pred, "float32")
        weight = ops.ones_like(nll) if sample_weight is None else ops.cast(sample_weight, "float32")
        self.total.assign_add(ops.sum(nll * weight))
        self.count.assign_add(ops.sum(weight))

    def result(self):
        return ops.exp(self.total / ops.maximum(self.count, 1e-9))
