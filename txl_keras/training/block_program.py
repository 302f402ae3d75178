"""`SharedBlockProgram`: one XLA program that every group of blocks of a backbone runs
with its own weights (evaluation)."""

import keras
import tensorflow as tf

MAX_GROUP = 4


class SharedBlockProgram:
    """Runs the blocks of a `TransformerXL` against an `InferenceCache` as
    `run_cached_blocks` does, with one XLA-compiled program for `group` consecutive
    blocks, called once per group: the blocks have the same structure, so the weights are
    arguments, bound to the first group's variables while it traces.

    Compiling the whole stack as one program makes XLA compile and keep every block; a
    group of 2 compiles a fraction of that at the same speed, where single blocks are
    slower (XLA runs independent work of successive blocks side by side). So the default
    group is the smallest divisor of `n_layer` from 2 to `MAX_GROUP`, single blocks only
    where there is none. Between groups the hidden states pass through TensorFlow.

    Args:
        backbone: the `TransformerXL` whose blocks it runs.
        group: blocks per program (default: the smallest divisor of `n_layer` from 2 to 4,
            else 1).

    Call arguments:
        hidden: `(batch_size, T, d_model)`, the embedded segment.
        cache: the `InferenceCache` of every layer.
        layer_args: each block's arguments (`TransformerXL.cached_inputs`).

    Returns:
        `(hidden, each block's keys and values)`, as `TransformerXL.run_cached_blocks`.
    """

    def __init__(self, backbone, group=None):
        count = len(backbone.blocks)
        self.group = group or min([d for d in range(2, MAX_GROUP + 1) if count % d == 0] or [1])
        if count % self.group:
            raise ValueError(f"group={self.group} does not divide the {count} blocks.")
        self.backbone = backbone
        self.template = backbone.blocks[: self.group]
        self._program = tf.function(self._run, jit_compile=True, autograph=False)

    def _run(self, weights, hidden, cache, layer_args):
        variables = [variable for block in self.template for variable in block.variables]
        with keras.StatelessScope(state_mapping=list(zip(variables, weights))):
            return self.backbone.run_cached_blocks(hidden, cache, layer_args, blocks=self.template)

    def __call__(self, hidden, cache, layer_args):
        layer_args = tf.nest.map_structure(lambda x: x.value if isinstance(x, keras.Variable) else x, layer_args)
        rows = []
        for start in range(0, len(self.backbone.blocks), self.group):
            end = start + self.group
            blocks = self.backbone.blocks[start:end]
            weights = [variable.value for block in blocks for variable in block.variables]
            part = cache.layers(start, end)
            hidden, group_rows = self._program(weights, hidden, part, layer_args[start:end])
            rows += group_rows
        return hidden, rows
