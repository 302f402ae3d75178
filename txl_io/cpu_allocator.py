"""TensorFlow's CPU allocator: select the BFC allocator, which keeps freed memory for reuse.

TensorFlow's default CPU allocator hands every large buffer back to the operating system
when it is freed, so each step faults its temporaries and activations in again, page by
page; the BFC allocator (TensorFlow's GPU allocator, also used for host memory on GPU
machines) keeps them. It must be chosen before TensorFlow creates its CPU device; a value
already in the environment wins (`TF_CPU_ALLOCATOR_USE_BFC=false` keeps TensorFlow's
default). Its limit defaults to 64 GB and is raised to the machine's memory where that is
larger.
"""

import os

USE_BFC = "TF_CPU_ALLOCATOR_USE_BFC"
LIMIT_MB = "TF_CPU_BFC_MEM_LIMIT_IN_MB"
DEFAULT_LIMIT_MB = 1 << 16


def machine_memory_mb():
    """Physical memory in MB, or None where the platform does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
    except (AttributeError, OSError, ValueError):
        return None


def prefer_bfc_cpu_allocator(environ=os.environ):
    """Set the two variables TensorFlow reads when it creates its CPU allocator, unless
    the user set them. No effect once TensorFlow has made its devices."""
    if USE_BFC in environ:
        return
    environ[USE_BFC] = "true"
    memory = machine_memory_mb()
    if LIMIT_MB not in environ and memory and memory > DEFAULT_LIMIT_MB:
        environ[LIMIT_MB] = str(memory)
