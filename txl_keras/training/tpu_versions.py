"""Which TensorFlow can drive a TPU: TensorFlow's TPU support ends with `tensorflow-tpu` 2.20.0
(Keras tests TPUs on 2.19.1, "the last version of TensorFlow that supports TPUs"); later
TensorFlows reach TPUs only through JAX (`KERAS_BACKEND=jax`, `keras.distribution`)."""

LAST_TPU_TENSORFLOW = (2, 20)


def tensorflow_drives_tpus(version):
    """Whether TensorFlow `version` ("2.19.1", "2.21.0rc1") can still drive a TPU."""
    major, minor = (int(part) for part in version.split(".")[:2])
    return (major, minor) <= LAST_TPU_TENSORFLOW
