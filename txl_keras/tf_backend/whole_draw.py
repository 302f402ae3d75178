"""Large random weights drawn at once, taking their size only once (`weight_initializers`)."""

import tensorflow as tf


def draw_as_one_graph(initializer, shape, dtype):
    """`initializer(shape, dtype)` run as a graph, where each op after the random one
    reuses its input's buffer, returned as the one buffer the variable then keeps (run
    eagerly, the scale and the shift each make a new full-size buffer). Grappler's
    constant folding is off while the graph is made and run: the seed and shape are
    constants, so it would otherwise compute the whole table while optimising the graph,
    into a second copy outside TensorFlow's allocator."""
    draw = tf.function(lambda: initializer(shape, dtype=dtype), autograph=False)
    folding = tf.config.optimizer.get_experimental_options().get("constant_folding", True)
    tf.config.optimizer.set_experimental_options({"constant_folding": False})
    try:
        return draw()
    finally:
        tf.config.optimizer.set_experimental_options({"constant_folding": folding})

