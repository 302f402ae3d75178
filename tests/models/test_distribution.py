"""`keras.distribution` on JAX: the text task's `fit` on 8 virtual CPU devices, data parallel
and model parallel (`TransformerXLLM.get_layout_map`), gives the losses of one device with the
same global batch, and the model-parallel weights really are split across the devices."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from txl_keras import TransformerXLConfig, TransformerXLLM

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.slow
def test_data_and_model_parallel_fit_give_one_devices_losses():
    # 8 devices on 2 cores may reach a collective minutes apart when the machine is busy
    # (XLA's 40 s rendezvous limit would abort the run); a hang still ends at 300 s. CI runs
    # this test alone (.ci/run): under another process's load XLA:CPU's collectives of 8
    # virtual devices on 2 cores have hung.
    flags = ["--xla_force_host_platform_device_count=8", "--xla_cpu_collective_timeout_seconds=300",
             "--xla_cpu_collective_call_terminate_timeout_seconds=300"]
    env = {**os.environ, "KERAS_BACKEND": "jax", "XLA_FLAGS": " ".join(flags), "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(["timeout", "-k", "10", "600", sys.executable, os.path.join(HERE, "distributed_fit.py")],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(done.stdout)
    single = runs["single"]["losses"]
    assert len(single) >= 4 and single[-1] < single[0]
    for name in ("data_parallel", "model_parallel"):
        np.testing.assert_allclose(runs[name]["losses"], single, rtol=1e-5, atol=1e-5, err_msg=name)
    assert runs["data_parallel"]["qkv_spec"] == ["None", "None"]  # replicated
    sharded = runs["model_parallel"]
    assert sharded["qkv_spec"] == ["None", "model"] and sharded["devices"] == 8
    assert sharded["qkv_shard_shapes"] == [[16, 12]]  # (d_model, 3 * 16 / 4) on each device
    # int8 kernels are stored (out, in): the heads are their rows, each row's scale goes with it
    (nll, _), (sharded_nll, specs) = runs["int8"]["single"], runs["int8"]["model_parallel"]
    assert specs == {"qkv_kernel": ["model", "None"], "qkv_kernel_scale": ["model"], "o_kernel": ["None", "model"],
                     "o_kernel_scale": ["None"]}
    np.testing.assert_allclose(sharded_nll, nll, rtol=1e-5, atol=1e-5)


def test_the_layout_map_shards_only_what_divides():
    mesh = keras.distribution.DeviceMesh((1, 3), ("batch", "model"), np.array([["cpu:0", "cpu:1", "cpu:2"]]))
    config = TransformerXLConfig.from_preset("tiny", n_token=66, cutoffs=[18, 30], n_head=3, d_head=4, d_inner=32)
    layouts = TransformerXLLM.get_layout_map(mesh, config=config)
    keys = set(layouts)
    assert r".*rel_attn/o_kernel" in keys  # 3 heads of 4: 12 columns divide by 3
    assert r".*ff/layer_1/kernel" not in keys  # d_inner 32 does not
    assert {k for k in keys if "adaptive_embed" in k} == {r".*adaptive_embed/cutoff_0_lookup_table",
                                                          r".*adaptive_embed/cutoff_1_lookup_table",
                                                          r".*adaptive_embed/cutoff_2_lookup_table"}


def test_the_int8_layout_follows_the_stored_shapes_and_refuses_another_quantization():
    mesh = keras.distribution.DeviceMesh((1, 3), ("batch", "model"), np.array([["cpu:0", "cpu:1", "cpu:2"]]))
    # clusters of 18, 12 and 37 words; 3 heads of 4; a feed-forward of 33
    config = TransformerXLConfig.from_preset("tiny", n_token=67, cutoffs=[18, 30], n_head=3, d_head=4, d_inner=33)
    int8, plain = (TransformerXLLM.get_layout_map(mesh, config=config, quantization=q) for q in ("int8", None))
    axes = {key: tuple(int8[key].axes) for key in int8}
    for kernel in (r".*rel_attn/(qkv|r)_kernel", r".*rel_attn/o_kernel", r".*ff/layer_1/kernel", r".*ff/layer_2/kernel"):
        assert axes[kernel] == tuple(reversed(plain[kernel].axes)), kernel  # stored (out, in)
    assert axes[r".*rel_attn/(qkv|r)_kernel_scale"] == axes[r".*ff/layer_1/kernel_scale"] == ("model",)
    assert r".*rel_attn/o_kernel_scale" not in axes and r".*ff/layer_2/kernel_scale" not in axes  # replicated
    assert axes[r".*adaptive_embed/cutoff_0_lookup_table_scale"] == ("model",)
    assert r".*adaptive_embed/cutoff_2_lookup_table" not in axes and r".*adaptive_embed/cutoff_2_lookup_table_scale" \
        not in axes  # 37 rows do not divide by 3
    with pytest.raises(ValueError, match="`quantization` must be None or 'int8'. Received: quantization='int4'"):
        TransformerXLLM.get_layout_map(mesh, config=config, quantization="int4")
