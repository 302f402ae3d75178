"""Layer normalisation over the last axis, with its gradient written out."""

from keras import ops


def layer_norm_reference(x, gamma, beta, epsilon):
    """`(x - mean) / sqrt(var + epsilon) * gamma + beta` over the last axis: x `(..., D)`,
    gamma and beta `(D,)` -> `(..., D)`, in x's dtype."""
    centred = x - ops.mean(x, axis=-1, keepdims=True)
    return centred * ops.rsqrt(ops.mean(ops.square(centred), axis=-1, keepdims=True) + epsilon) * gamma + beta


def layer_norm(x, gamma, beta, epsilon):
    """`layer_norm_reference` with its gradient written out from the normalised rows and
    the reciprocal deviations kept from the forward pass, `dx = (g - mean(g) - x_hat *
    mean(g * x_hat)) / sigma` with `g = upstream * gamma`: one operation per term, about
    half the passes over the rows of autodiff's."""

    @ops.custom_gradient
    def norm(x, gamma, beta):
        centred = x - ops.mean(x, axis=-1, keepdims=True)
        inverse = ops.rsqrt(ops.mean(ops.square(centred), axis=-1, keepdims=True) + epsilon)
        normed = centred * inverse

        def grad(*args, upstream=None):  # (TF and JAX pass `upstream` first, PyTorch by name)
            upstream = args[0] if upstream is None else upstream
            rows = tuple(range(len(upstream.shape) - 1))
            scaled = upstream * gamma
            d_x = (scaled - ops.mean(scaled, axis=-1, keepdims=True)
                   - normed * ops.mean(scaled * normed, axis=-1, keepdims=True)) * inverse
            return d_x, ops.sum(upstream * normed, axis=rows), ops.sum(upstream, axis=rows)

        return normed * gamma + beta, grad

    return norm(*(ops.convert_to_tensor(a) for a in (x, gamma, beta)))
