"""Train / evaluate Transformer-XL on a Cloud TPU (a TPU VM or a pod slice).

    python train_tpu.py --tpu=local --config=wt103_large --data_dir=gs://bucket/wt103 ...

The loop, flags and checkpoints are the ones of train_gpu.py; only the strategy differs.
On the JAX backend (KERAS_BACKEND=jax, the route for TensorFlow 2.21 and later) every host
of the TPU VM or pod slice runs the same command, and --mesh lays out the devices.
Without a reachable TPU it stops within seconds with a message saying what to pass.
"""

import glob
import os

from txl_io import program, startup

startup.start_program()  # first: the BFC CPU allocator, TensorFlow imported without its start-up notices

from absl import app, flags  # noqa: E402,I001

from txl_keras.training import cli, jax_route
from txl_keras.training.tpu_versions import tensorflow_drives_tpus
from txl_keras.training.watchdog import Watchdog

cli.define_flags()
program.define("string", "tpu", None, "TPU name or grpc:// address; 'local' on a TPU VM.", "distribution")
program.define("string", "tpu_zone", None, "GCE zone of the TPU (with a TPU name).", "distribution")
program.define("string", "gcp_project", None, "GCP project of the TPU (with a TPU name).", "distribution")
program.define("integer", "tpu_timeout", 120, "Seconds to wait for the TPU to answer.", "distribution", lower_bound=1)
FLAGS = flags.FLAGS


class NoTPUError(RuntimeError):
    pass


def _local_tpu_present():
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def connect_tpu():
    """`(strategy, num_hosts)`, or NoTPUError with what to do."""
    import tensorflow as tf

    tpu = FLAGS.tpu or os.environ.get("TPU_NAME")
    if not tpu:
        raise NoTPUError("No TPU given: pass --tpu=NAME (with --tpu_zone and --gcp_project), "
                         "--tpu=grpc://HOST:8470, or --tpu=local on a TPU VM. For GPUs or CPUs use train_gpu.py.")
    if not tensorflow_drives_tpus(tf.__version__):
        raise NoTPUError(f"TensorFlow {tf.__version__} cannot drive TPUs (TensorFlow's TPU support ends with "
                         "tensorflow-tpu 2.20): train on the JAX backend with keras.distribution (docs/tpu.md; "
                         'pip install -e ".[tpu]"), or install tensorflow-tpu==2.19.1 for this program.')
    if tpu == "local" and not _local_tpu_present():
        raise NoTPUError("--tpu=local but this machine has no TPU devices (/dev/accel*); run on a TPU VM, "
                         "or use train_gpu.py.")
    with Watchdog(FLAGS.tpu_timeout, f"the TPU {tpu!r} did not answer; check the name, zone and project, "
                  "and that it is running"):
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
                tpu=tpu, zone=FLAGS.tpu_zone, project=FLAGS.gcp_project)
            if tpu != "local":
                tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
        except (ValueError, tf.errors.NotFoundError, tf.errors.UnavailableError, IndexError) as e:
            raise NoTPUError(f"Could not reach the TPU {tpu!r}: {str(e).splitlines()[0]}") from None
    strategy = tf.distribute.TPUStrategy(resolver)
    return strategy, strategy.extended.num_hosts


def start_jax():
    """`(num_hosts, is_chief)` of a TPU VM or pod slice on JAX, or NoTPUError with what to do."""
    import jax

    if FLAGS.tpu not in (None, "local"):
        raise NoTPUError(f"--tpu={FLAGS.tpu} names a TPU for TensorFlow; on JAX run this command on the TPU VM "
                         "itself (on every host of a pod slice), without --tpu.")
    try:
        num_hosts, is_chief = jax_route.start_processes(FLAGS, on_tpu_pod=True)
    except (ValueError, RuntimeError) as e:
        raise NoTPUError(f"JAX found no TPU pod to join ({str(e).splitlines()[0]}); run on a TPU VM, or use "
                         "train_gpu.py on GPUs and CPUs.") from None
    platform = jax.devices()[0].platform
    if platform != "tpu":
        raise NoTPUError(f"JAX sees no TPU here (its devices are {platform}); run on a TPU VM, or use train_gpu.py "
                         "on GPUs and CPUs.")
    return num_hosts, is_chief


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    import keras

    backend = keras.backend.backend()
    jax_route.check_flags(FLAGS, backend)
    if backend == "jax":  # keras.distribution over the TPU's devices (--mesh)
        try:
            num_hosts, is_chief = start_jax()
        except NoTPUError as e:
            raise SystemExit(f"error: {e}")
        with jax_route.peers_watched(num_hosts):
            cli.run(None, num_hosts=num_hosts, is_chief=is_chief, log=lambda *a: print(*a, flush=True))
        return
    try:
        strategy, num_hosts = connect_tpu()
    except NoTPUError as e:
        raise SystemExit(f"error: {e}")
    # Every TPU step is XLA-compiled: the static-shape paths are selected whatever --xla says.
    cli.run(strategy, num_hosts=num_hosts, is_chief=True, log=lambda *a: print(*a, flush=True), compiled=True)


if __name__ == "__main__":
    program.run(main)
