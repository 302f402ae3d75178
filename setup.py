import re

from setuptools import find_packages, setup

VERSION = re.search(r'__version__ = "(.+)"', open("txl_keras/version.py", encoding="utf-8").read()).group(1)

setup(
    name="txl_keras",
    version=VERSION,
    description="Transformer-XL (Dai et al., 2019) for Keras 3 and TensorFlow 2",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=find_packages(include=["txl_keras", "txl_keras.*", "tf_records", "tf_records.*", "txl_io", "txl_io.*"]),
    py_modules=["train_gpu", "train_tpu"],
    install_requires=[
        "tensorflow>=2.16",
        "keras>=3.5",
        "tensorflow-datasets>=4.9",
        "absl-py>=1.0",
        "numpy",
    ],
    extras_require={
        "test": ["pytest>=7", "pytest-xdist>=3.8", "huggingface_hub>=0.24", "kagglehub>=0.3"],
        "jax": ["jax[cpu]>=0.4.30"],
        # the JAX route on a TPU VM: JAX with libtpu (TensorFlow drives TPUs only up to 2.20)
        "tpu": ["jax[tpu]>=0.4.30"],
        "tensorboard": ["tensorboard"],
        # hf:// and kaggle:// presets: the hubs' own clients fetch and publish them
        "hub": ["huggingface_hub>=0.24", "kagglehub>=0.3"],
    },
)
