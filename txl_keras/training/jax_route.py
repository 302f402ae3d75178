"""The trainers on the JAX backend: the processes, the device mesh and the `keras.distribution`.

`--mesh` names the mesh's axes and sizes: `batch:8` (data parallel: each device a replica
with its own memory) or `batch:2,model:4` (2 replicas, each split over 4 devices along the
model axis by `TransformerXLLM.get_layout_map`). By default every device is a replica.
Several processes (the hosts of a TPU pod, or GPU/CPU machines) find each other through
`jax.distributed.initialize`: by themselves on a pod, else by `--coordinator_address`,
`--num_processes` and `--process_id`; the mesh's devices are ordered process by process,
so each process's rows of the batch are its records' share.
"""

import contextlib
import os
import re
import sys

MESH_AXES = ("batch", "model")
_MESH = re.compile(r"^(batch|model):([1-9][0-9]*)(,(batch|model):([1-9][0-9]*))?$")


def parse_mesh(text, device_count):
    """`{"batch": n, "model": m}` from a `--mesh` text (None: every device on the batch axis),
    or a ValueError saying what is wrong and what to pass."""
    if text is None:
        return {"batch": device_count, "model": 1}
    match = _MESH.match(text.replace(" ", ""))
    if not match or (match.group(4) and match.group(4) == match.group(1)):
        raise ValueError(f"--mesh={text!r} is not a mesh: pass 'batch:N' (data parallel) or 'batch:N,model:M' "
                         "(N replicas, each split over M devices).")
    sizes = {"batch": 1, "model": 1}
    sizes[match.group(1)] = int(match.group(2))
    if match.group(4):
        sizes[match.group(4)] = int(match.group(5))
    if sizes["batch"] * sizes["model"] != device_count:
        raise ValueError(f"--mesh={text} has {sizes['batch'] * sizes['model']} devices but JAX sees {device_count}; "
                         f"make the sizes multiply to {device_count}.")
    return sizes


def check_flags(flags, backend):
    """A ValueError for a JAX-only flag given on another backend, or process flags that do not
    go together."""
    given = [name for name in ("mesh", "coordinator_address", "num_processes", "process_id")
             if getattr(flags, name) is not None]
    if backend != "jax" and given:
        raise ValueError(f"--{given[0]} is for the JAX backend: run with KERAS_BACKEND=jax, or drop it "
                         "(on TensorFlow, --num_core_per_host and TF_CONFIG lay out the replicas).")
    if backend != "jax":
        return
    process_flags = [flags.coordinator_address, flags.num_processes, flags.process_id]
    if any(v is not None for v in process_flags) and any(v is None for v in process_flags):
        raise ValueError("--coordinator_address, --num_processes and --process_id go together: give all three "
                         "(the same address and count on every process, and each its own id), or none.")
    if flags.num_processes is not None and not 0 <= flags.process_id < flags.num_processes:
        raise ValueError(f"--process_id={flags.process_id} is not in [0, --num_processes={flags.num_processes}).")
    if flags.num_core_per_host is not None:
        raise ValueError("--num_core_per_host is for TensorFlow; on JAX, --mesh lays out the devices.")


def start_processes(flags, on_tpu_pod=False):
    """Join the run's other processes, if it has any: `(num_processes, is_chief)`. A peer that
    never comes ends this process with one line after `--startup_timeout` seconds."""
    import jax

    from txl_keras.training.watchdog import Watchdog

    if flags.num_processes is None and not on_tpu_pod:
        return 1, True
    if flags.num_processes is not None:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU processes' collectives
        arguments = dict(coordinator_address=flags.coordinator_address, num_processes=flags.num_processes,
                         process_id=flags.process_id)
        what = (f"not all {flags.num_processes} processes joined {flags.coordinator_address}; start the same "
                "command on each, with its own --process_id")
    else:
        arguments, what = {}, "the TPU pod's hosts did not all join; start the same command on every host"
    # JAX's own limit is later than the watchdog's, which names the problem in one line.
    with Watchdog(flags.startup_timeout, what):
        jax.distributed.initialize(initialization_timeout=flags.startup_timeout + 60, **arguments)
    return jax.process_count(), jax.process_index() == 0


@contextlib.contextmanager
def peers_watched(num_processes):
    """Run the block; if a collective fails in a run of several processes (a peer died: its
    connections reset), end this process at once with one line and exit status 1. Exiting
    the usual way would first wait in JAX's exit-time barrier for the dead peer, then abort
    with a crash dump."""
    import jax

    try:
        yield
    except jax.errors.JaxRuntimeError as e:
        if num_processes == 1:
            raise
        cause = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
        sys.stdout.flush()
        sys.stderr.write(f"error: a collective across the {num_processes} processes failed, most likely because "
                         f"another process stopped (see its log): {cause}. Start the same command on every "
                         "process to resume from the last checkpoint.\n")
        sys.stderr.flush()
        os._exit(1)


def mesh_devices():
    """Every device of every process, process by process (each process's rows of the batch
    are then its own devices')."""
    import jax

    return [f"{d.platform}:{d.id}" for d in sorted(jax.devices(), key=lambda d: (d.process_index, d.id))]


def replicas(flags):
    """The data-parallel replicas `--mesh` gives."""
    import jax

    return parse_mesh(flags.mesh, jax.device_count())["batch"]


def make_distribution(flags, config):
    """The `keras.distribution` of `--mesh` for a model of `config`; None on one device."""
    import jax
    import keras
    import numpy as np

    from txl_keras.models.layout_map import get_layout_map

    sizes = parse_mesh(flags.mesh, jax.device_count())
    if sizes["batch"] * sizes["model"] == 1:
        return None
    devices = np.array(mesh_devices())
    if sizes["model"] == 1:
        return keras.distribution.DataParallel(device_mesh=keras.distribution.DeviceMesh(
            (sizes["batch"],), ("batch",), devices))
    mesh = keras.distribution.DeviceMesh((sizes["batch"], sizes["model"]), MESH_AXES,
                                         devices.reshape(sizes["batch"], sizes["model"]))
    return keras.distribution.ModelParallel(layout_map=get_layout_map(mesh, config=config), batch_dim_name="batch")
