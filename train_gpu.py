"""Train / evaluate Transformer-XL on CPU, GPUs, or several machines (tf.distribute).

    python train_gpu.py                       # quickstart: stdlib corpus, small model, CPU
    python train_gpu.py --config=enwik8_base --data_dir=data/enwik8 --train_batch_size=24 ...

One machine: MirroredStrategy over its GPUs (or --num_core_per_host logical CPUs), one
CPU otherwise. Several machines: set TF_CONFIG as for MultiWorkerMirroredStrategy on
each worker; every worker runs the same command.

On the JAX backend (KERAS_BACKEND=jax) the same flags train under keras.distribution:
--mesh lays out the devices, and several machines run the same command with
--coordinator_address, --num_processes and each its own --process_id.
"""

import json
import os

from txl_io import program, startup

startup.start_program()  # first: the BFC CPU allocator, TensorFlow imported without its start-up notices

from absl import app, flags  # noqa: E402,I001

from txl_keras.training import cli, jax_route
from txl_keras.training.watchdog import Watchdog

cli.define_flags()
program.define("integer", "collective_timeout", 600, "Seconds before a collective with a dead peer fails.",
               "distribution", lower_bound=1)
FLAGS = flags.FLAGS


def make_strategy():
    """`(strategy, num_hosts, is_chief)` for this machine and TF_CONFIG."""
    import tensorflow as tf

    cluster = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
    workers = cluster.get("worker", [])
    if len(workers) > 1:
        options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=FLAGS.collective_timeout)
        with Watchdog(FLAGS.startup_timeout, f"not all {len(workers)} workers of TF_CONFIG joined; "
                      "start the same command on every worker"):
            strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
            strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
        resolver = strategy.cluster_resolver
        return strategy, len(workers), resolver.task_type in (None, "chief") or resolver.task_id == 0
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        devices = [f"/gpu:{i}" for i in range(FLAGS.num_core_per_host or len(gpus))]
        return tf.distribute.MirroredStrategy(devices), 1, True
    cores = FLAGS.num_core_per_host or 1
    if cores > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * cores)
        return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(cores)]), 1, True
    return tf.distribute.get_strategy(), 1, True


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    import keras

    backend = keras.backend.backend()
    jax_route.check_flags(FLAGS, backend)
    if backend == "jax":
        num_hosts, is_chief = jax_route.start_processes(FLAGS)
        with jax_route.peers_watched(num_hosts):  # no strategy: the keras.distribution of --mesh
            cli.run(None, num_hosts=num_hosts, is_chief=is_chief, log=lambda *a: print(*a, flush=True))
        return
    strategy, num_hosts, is_chief = make_strategy()
    cli.run(strategy, num_hosts=num_hosts, is_chief=is_chief, log=lambda *a: print(*a, flush=True))


if __name__ == "__main__":
    program.run(main)
