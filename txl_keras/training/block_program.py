"""`SharedBlockProgram`: one XLA program that every group of blocks of a backbone runs
with its own weights."""

import keras
import tensorflow as tf

MAX_GROUP = 4


class SharedBlockProgram:
    """Runs the blocks of a `TransformerXL` (`backbone(..., block_program=program)`)
    with one XLA-compiled program for `group` consecutive blocks, called once per group:
    the blocks have the same structure, so the weights are arguments, bound to the first
    group's variables while it traces.

    Compiling the whole stack as one program makes XLA compile and keep every block (for
    wt103_base's 16 layers, ~11 MB of compiler memory and code per layer that the process
    keeps). A group of 2 compiles an eighth of that: wt103's evaluation peaks 15-25 MB
    lower at batch 1 and ~50 MB lower at batch 8 than with groups of 4, at the same speed,
    where single blocks lost 10-20% at batch 1 (XLA runs independent work of successive
    blocks side by side). So the default group is the smallest divisor of `n_layer` from 2
    to `MAX_GROUP`, single blocks only where there is none. Between groups the hidden
    states `(batch_size, T, d_model)` pass through TensorFlow.

    Args:
        backbone: the `TransformerXL` whose blocks it runs.
        group: blocks per program (default: the smallest divisor of `n_layer` from 2 to 4,
            else 1).

    Call arguments and returns: those of `TransformerXL.run_blocks(hidden, layers,
    static)`.
    """

    def __init__(self, backbone, group=None):
        count = len(backbone.blocks)
        self.group = group or min([d for d in range(2, MAX_GROUP + 1) if count % d == 0] or [1])
        if count % self.group:
            raise ValueError(f"group={self.group} does not divide the {count} blocks.")
        self.backbone = backbone
        self.template = backbone.blocks[: self.group]
        self._program = tf.function(self._run, jit_compile=True)

    def _run(self, weights, hidden, layers, static):
        variables = [variable for block in self.template for variable in block.variables]
        with keras.StatelessScope(state_mapping=list(zip(variables, weights))):
            return self.backbone.run_blocks(hidden, layers, static, blocks=self.template)

    def __call__(self, hidden, layers, static):
        layers = tf.nest.map_structure(lambda x: x.value if isinstance(x, keras.Variable) else x, layers)
        inputs, current_kv = [], []
        for start in range(0, len(self.backbone.blocks), self.group):
            blocks = self.backbone.blocks[start:start + self.group]
            weights = [variable.value for block in blocks for variable in block.variables]
            hidden, group_inputs, group_kv = self._program(weights, hidden, layers[start:start + self.group], static)
            inputs += group_inputs
            current_kv += group_kv
        return hidden, inputs, current_kv
