"""`prefer_bfc_cpu_allocator()` (every program's start; `txl_keras.prefer_bfc_cpu_allocator`
for a user's script) selects TensorFlow's BFC CPU allocator (freed buffers are kept for the
next step instead of being returned to the OS and faulted in again), unless the user chose;
`import txl_keras` alone leaves the process's environment as it was."""

import os
import subprocess
import sys

from txl_io import cpu_allocator

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# TensorFlow imported first, as scripts do; a 64 MB temporary in an XLA computation run
# five times; the page faults of the last three runs are counted.
PROBE = """
import resource
import os
import tensorflow as tf
import txl_keras
assert "TF_CPU_ALLOCATOR_USE_BFC" not in os.environ  # importing the library changes nothing
txl_keras.prefer_bfc_cpu_allocator()
x = tf.random.normal((4096, 4096))
f = tf.function(lambda x: tf.reduce_sum(tf.exp(x * 0.5) * 2.0, axis=-1), jit_compile=True)
for _ in range(2):
    f(x).numpy()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    f(x).numpy()
print(tf.config.experimental.get_memory_info("CPU:0")["peak"] > 0,
      resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_the_bfc_allocator_is_chosen_by_one_call_and_steps_reuse_its_memory():
    env = {k: v for k, v in os.environ.items() if k not in (cpu_allocator.USE_BFC, cpu_allocator.LIMIT_MB)}
    env["KERAS_BACKEND"] = "tensorflow"
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    has_stats, faults = out.stdout.split()
    assert has_stats == "True"  # only BFC allocators keep statistics
    # TensorFlow's default allocator faults the 16,384 pages of the temporary in at every run.
    assert int(faults) < 0.1 * 3 * 16384, faults


def test_the_users_choice_wins_and_the_limit_follows_the_machine(monkeypatch):
    environ = {cpu_allocator.USE_BFC: "false"}
    cpu_allocator.prefer_bfc_cpu_allocator(environ)
    assert environ == {cpu_allocator.USE_BFC: "false"}

    monkeypatch.setattr(cpu_allocator, "machine_memory_mb", lambda: 16_000)
    environ = {}
    cpu_allocator.prefer_bfc_cpu_allocator(environ)
    assert environ == {cpu_allocator.USE_BFC: "true"}  # TensorFlow's 64 GB limit is above the machine

    monkeypatch.setattr(cpu_allocator, "machine_memory_mb", lambda: 512_000)
    environ = {}
    cpu_allocator.prefer_bfc_cpu_allocator(environ)
    assert environ == {cpu_allocator.USE_BFC: "true", cpu_allocator.LIMIT_MB: "512000"}

    environ = {cpu_allocator.LIMIT_MB: "1000"}
    cpu_allocator.prefer_bfc_cpu_allocator(environ)
    assert environ == {cpu_allocator.USE_BFC: "true", cpu_allocator.LIMIT_MB: "1000"}
