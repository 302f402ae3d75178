import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# pytest-xdist runs several workers on one machine: each worker (and every process its tests
# start) gets its share of the cores for its operations' thread pools, so that the pools do not
# oversubscribe the CPU (on 2 cores and 2 workers this halves the suite's time). With one
# inter-op thread the trainer runs each batch in one part (`concurrent_parts`), and a test's
# step is traced once instead of once per part; the parts are tested with the option set.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
_THREADS = str(max(1, (os.cpu_count() or 1) // _WORKERS)) if _WORKERS > 1 else None
if _THREADS:
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", _THREADS)
    os.environ.setdefault("TF_NUM_INTEROP_THREADS", _THREADS)
    os.environ.setdefault("OMP_NUM_THREADS", _THREADS)
if os.environ.get("KERAS_BACKEND") == "jax":  # two host devices for keras.distribution (before JAX loads)
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    if _THREADS and "intra_op_parallelism_threads" not in os.environ["XLA_FLAGS"]:
        os.environ["XLA_FLAGS"] += f" --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads={_THREADS}"
sys.path.insert(0, os.path.dirname(__file__))
import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.hookimpl(trylast=True)  # after pytest-xdist has registered its controller
def pytest_configure(config):
    """Load the backend in a process that runs tests; pytest-xdist's controller, which only
    hands tests out, starts the workers without spending seconds importing TensorFlow."""
    if config.pluginmanager.hasplugin("dsession"):
        return
    if os.environ.get("KERAS_BACKEND", "tensorflow") == "tensorflow":
        from txl_io import startup

        # The programs' start: the BFC CPU allocator, TensorFlow's start-up notices kept off the log.
        startup.start_program()
    import keras

    if keras.config.backend() == "tensorflow":
        import tensorflow as tf

        # Two logical CPU devices, so MirroredStrategy tests have two replicas.
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)


# The folders whose modules train, export or start processes, in the order they are handed
# out (--dist loadscope --no-loadscope-reorder): the long modules start first and the many
# short ones even out the two workers at the end.
LONG_FIRST = ("training", "models", "convert", "export", "generate", "presets", "package", "tasks", "storage", "records")


def pytest_collection_modifyitems(items):
    def rank(item):
        folder = item.nodeid.split("/")[1] if item.nodeid.count("/") > 1 else ""
        return LONG_FIRST.index(folder) if folder in LONG_FIRST else len(LONG_FIRST)

    items.sort(key=rank)  # stable: each module's tests keep their order


_MIRRORED = []


@pytest.fixture
def mirrored():
    """One MirroredStrategy over the two logical CPUs, shared by the whole test run (two
    strategies in one process would reuse collective keys)."""
    import tensorflow as tf

    if not _MIRRORED:
        _MIRRORED.append(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))
    return _MIRRORED[0]


@pytest.fixture(autouse=True)
def _seed_and_policy():
    import keras

    keras.utils.set_random_seed(1234)
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")


def to_np(x):
    import keras

    return np.asarray(keras.ops.convert_to_numpy(x), np.float64)


def attention_weights(layer):
    """The numpy weights of a RelativeAttention layer, in tests/reference.py's format."""
    w = {
        "qkv": to_np(layer.qkv_kernel),
        "o": to_np(layer.o_kernel),
        "gamma": to_np(layer.layer_norm.gamma),
        "beta": to_np(layer.layer_norm.beta),
    }
    if layer.position_projection:
        w["r"] = to_np(layer.r_kernel)
    return w


def feed_forward_weights(layer):
    return {
        "k1": to_np(layer.layer_1.kernel),
        "b1": to_np(layer.layer_1.bias),
        "k2": to_np(layer.layer_2.kernel),
        "b2": to_np(layer.layer_2.bias),
        "gamma": to_np(layer.layer_norm.gamma),
        "beta": to_np(layer.layer_norm.beta),
    }


def randomize(layer, scale=0.3, seed=0):
    """Give every weight (biases and norms too) a random value, so no term is zero."""
    rng = np.random.default_rng(seed)
    for var in layer.weights:
        if var.trainable:
            var.assign(rng.normal(0, scale, var.shape).astype(var.dtype))


def gradient(fn, x):
    """d sum(fn(x)) / dx as numpy (zeros where nothing flows), on TF, JAX or torch."""
    import keras

    backend = keras.config.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        x = tf.Variable(x)
        with tf.GradientTape() as tape:
            total = tf.reduce_sum(fn(x))
        g = tape.gradient(total, x)
        return np.zeros(x.shape) if g is None else tf.convert_to_tensor(g).numpy()  # a gather's: IndexedSlices
    if backend == "jax":
        import jax

        return np.asarray(jax.grad(lambda v: fn(v).sum())(x))
    if backend == "torch":
        import torch

        v = torch.tensor(x, requires_grad=True)
        total = fn(v).sum()
        if not total.requires_grad:
            return np.zeros(x.shape)
        total.backward()
        return np.zeros(x.shape) if v.grad is None else v.grad.numpy()
    pytest.skip(f"no gradient helper for backend {backend}")


def central_differences(fn, x, eps=1e-5):
    """d fn(x) / dx of a scalar numpy function by central differences, in float64."""
    x = np.asarray(x, np.float64)
    grad = np.zeros_like(x)
    for index in np.ndindex(*x.shape):
        step = np.zeros_like(x)
        step[index] = eps
        grad[index] = (fn(x + step) - fn(x - step)) / (2 * eps)
    return grad


SMALL_ADAPTIVE = dict(n_token=40, n_layer=2, d_model=12, n_head=2, d_head=6, d_inner=20, dropout=0.0,
                      tgt_len=4, mem_len=6, cutoffs=[10, 24], div_val=2, proj_share_all_but_first=True,
                      untie_r=True, same_length=True, clamp_len=5)


def small_adaptive_model(**overrides):
    """A built, randomized two-layer adaptive-softmax model (export and generation tests)."""
    from txl_keras import TransformerXLConfig, TransformerXLLM

    model = TransformerXLLM(TransformerXLConfig(**{**SMALL_ADAPTIVE, **overrides}))
    model.build((None, 4))
    randomize(model, scale=0.3)
    return model


WORDS = ["alpha", "beta", "gamma", "delta", "kappa", "omega", "sigma", "theta"]


def word_task():
    """A word-level text task over `WORDS` (segments of 4, memory of 6), randomized to peaked
    distributions: a wrong context changes the argmax (generation and sampler tests)."""
    from tf_records.vocabulary import Vocabulary
    from txl_keras import (TransformerXLCausalLM, TransformerXLCausalLMPreprocessor, TransformerXLConfig,
                           TransformerXLLM, TransformerXLTokenizer)

    vocab = Vocabulary(["<eos>", "<unk>"] + WORDS, add_eos=True, unk_symbol="<unk>")
    config = TransformerXLConfig.from_preset("tiny", n_token=len(vocab), cutoffs=[], tgt_len=4, mem_len=6,
                                             same_length=False)
    model = TransformerXLLM(config)
    randomize(model, scale=1.0)
    return TransformerXLCausalLM(model, TransformerXLCausalLMPreprocessor(TransformerXLTokenizer(vocab), 4))
