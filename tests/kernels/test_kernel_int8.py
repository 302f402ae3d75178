"""The int8 product beside its plain computation and a numpy one: float rows times int8
rows, for a few rows and many, of rank 2 and 3, eagerly and inside a compiled function."""

import keras
import numpy as np
import pytest
from conftest import to_np

from txl_keras.kernels import int8


@pytest.mark.parametrize("shape", [(1, 24), (5, 24), (2, 3, 24), (70, 24)])
def test_times_rows_is_the_product_with_the_rows_as_floats(shape):
    rng = np.random.default_rng(0)
    x = rng.normal(size=shape).astype("float32")
    rows = rng.integers(-127, 128, (37, 24)).astype("int8")
    expected = x.astype(np.float64) @ rows.T.astype(np.float64)
    variable = keras.Variable(rows, dtype="int8", trainable=False)
    for product in (int8.times_rows, int8.times_rows_reference):
        np.testing.assert_allclose(to_np(product(keras.ops.convert_to_tensor(x), variable)), expected,
                                   rtol=1e-5, atol=1e-3)


@pytest.mark.skipif(keras.config.backend() != "tensorflow", reason="the compiled product is TensorFlow's")
def test_times_rows_inside_a_graph_function_reads_the_variables_current_rows():
    import tensorflow as tf

    rng = np.random.default_rng(1)
    x = tf.constant(rng.normal(size=(2, 16)).astype("float32"))
    variable = keras.Variable(rng.integers(-127, 128, (9, 16)).astype("int8"), dtype="int8", trainable=False)
    step = tf.function(lambda x: int8.times_rows(x, variable))
    first = step(x).numpy()
    variable.assign(-to_np(variable).astype("int8"))
    np.testing.assert_allclose(step(x).numpy(), -first, rtol=1e-6)
