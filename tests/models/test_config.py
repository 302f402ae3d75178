import json

import pytest

from txl_keras import PRESETS, TransformerXLConfig, TransformerXLLM


def test_json_round_trip():
    cfg = TransformerXLConfig.from_preset("wt103_base", mem_len=640)
    again = TransformerXLConfig.from_json(cfg.to_json())
    assert again == cfg and again.mem_len == 640
    assert json.loads(cfg.to_json())["cutoffs"] == [20000, 40000, 200000]


def test_presets_follow_the_original_scripts():
    wt103 = TransformerXLConfig.from_preset("wt103_large")
    assert (wt103.n_layer, wt103.d_model, wt103.div_val, wt103.n_token) == (18, 1024, 4, 267735)
    assert wt103.resolved_tie_projs == [False, True, True, True]
    lm1b = TransformerXLConfig.from_preset("lm1b_base")
    assert lm1b.resolved_tie_projs == [False, False, False, False] and not lm1b.proj_same_dim
    assert TransformerXLConfig.from_preset("enwik8_base").resolved_tie_projs == [True]
    for name in PRESETS:
        assert TransformerXLConfig.from_preset(name).d_embed > 0


def test_parameter_counts_match_the_paper():
    # wt103 base: 151M in the paper; enwik8 24 layers: 277M.
    def count(name):
        cfg = TransformerXLConfig.from_preset(name)
        d, L = cfg.d_model, cfg.n_layer
        per_layer = 5 * d * cfg.n_head * cfg.d_head + 2 * d * cfg.d_inner + cfg.d_inner + d + 4 * d
        return L * per_layer + cfg.n_token * cfg.d_embed

    assert count("wt103_base") == pytest.approx(151e6, rel=0.02)
    assert count("enwik8_large") == pytest.approx(277e6, rel=0.02)
    tiny = TransformerXLLM(TransformerXLConfig.from_preset("tiny"))
    tiny.build((None, 8))
    cfg = tiny.config
    want = (cfg.n_layer * (5 * cfg.d_model * cfg.n_head * cfg.d_head + 2 * cfg.d_model * cfg.d_inner
                           + cfg.d_inner + cfg.d_model + 4 * cfg.d_model)
            + cfg.n_token * cfg.d_model + 2 * cfg.n_head * cfg.d_head + cfg.n_token)
    assert tiny.count_params() == want


@pytest.mark.parametrize("changes,message", [
    (dict(d_embed=30, cutoffs=[10, 20], div_val=4), "divisible by div_val"),
    (dict(cutoffs=[20, 10]), "strictly increasing"),
    (dict(cutoffs=[10, 64]), "strictly increasing"),
    (dict(attn_type=3, d_head=4), "n_head\\*d_head == d_model"),
    (dict(mem_len=-1), "mem_len"),
    (dict(attn_type=5), "attn_type"),
    (dict(dropout=1.5), "dropout"),
    (dict(d_model=15), "even"),
    (dict(tie_projs=[True, False]), "tie_projs"),
    (dict(mem_init="random"), "mem_init"),
])
def test_inconsistent_configs_are_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        TransformerXLConfig.from_preset("tiny", **changes)


def test_unknown_fields_and_presets_are_refused():
    with pytest.raises(ValueError, match="Unknown TransformerXLConfig fields \\['n_heads'\\]"):
        TransformerXLConfig.from_dict({"n_heads": 4})
    with pytest.raises(ValueError, match="Available presets"):
        TransformerXLConfig.from_preset("wt104")
