"""Released models from a mirror that misbehaves, cache entries that were damaged, and local
release folders as the original writes them: each case ends in the right model (the one a
direct conversion of the intended files gives) or in one clear line, and a later call
against a good mirror succeeds without anyone deleting a file by hand."""

import os
import shutil

import keras
import numpy as np
import pytest
from conftest import to_np
from faulty_server import faulty_server
from original_formats import CASES, tf_arrays, write_tf_checkpoint
from release_server import write_release

from txl_keras import TransformerXLCausalLM, presets, releases
from txl_keras.convert import from_tf_checkpoint

pytestmark = pytest.mark.skipif(keras.config.backend() != "tensorflow", reason="TF checkpoints")

NAME = "transfo_xl_wt103"
RELEASE = releases.RELEASES[NAME]
DATA = f"/{RELEASE.folder}/model/model.ckpt-0.data-00000-of-00001"
INDEX = f"/{RELEASE.folder}/model/model.ckpt-0.index"
CACHE_PKL = f"/{RELEASE.folder}/data/cache.pkl"
X = np.arange(1, 10, dtype="int32")[None]


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("mirror"))
    for name in (NAME, "transfo_xl_lm1b"):
        write_release(root, name)
    with faulty_server(root) as (url, faults, requests):
        yield root, url, faults, requests
        faults.clear()


def tree(folder):
    return {os.path.relpath(os.path.join(d, f), folder): open(os.path.join(d, f), "rb").read()
            for d, _, found in os.walk(folder) for f in found}


def nll(model):
    return to_np(model(X, targets=X)["nll"])


def direct_nll(prefix, release=RELEASE):
    return nll(from_tf_checkpoint(prefix, tgt_len=release.tgt_len, mem_len=release.mem_len,
                                  clamp_len=release.clamp_len, same_length=True))


@pytest.mark.parametrize("path, fault", [(DATA, "html"), (DATA, "cut_no_length"), (INDEX, "empty"),
                                         (CACHE_PKL, "html")])
def test_a_bad_file_from_the_mirror_is_moved_aside_and_fetched_again(mirror, tmp_path, path, fault, capsys):
    root, url, faults, _ = mirror
    faults[path] = [fault]
    model = TransformerXLCausalLM.from_preset(NAME, url=url, cache_dir=str(tmp_path / "cache")).model
    np.testing.assert_array_equal(nll(model), direct_nll(os.path.join(root, RELEASE.folder, "model", "model.ckpt-0")))
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and ".rejected" in warnings[0] and os.path.basename(path) in warnings[0]


def test_a_mirror_that_stays_bad_is_one_clear_error_and_heals_when_it_is_fixed(mirror, tmp_path):
    root, url, faults, _ = mirror
    before = tree(root)
    cache = str(tmp_path / "cache")
    faults[DATA] = ["cut_no_length", "cut_no_length"]  # (no Content-Length: only the checksums tell)
    with pytest.raises(releases.DownloadError) as error:
        TransformerXLCausalLM.from_preset(NAME, url=url, cache_dir=cache)
    message = str(error.value)
    assert f"{url}{DATA}" in message and "cannot be read" in message and releases.URL_VARIABLE in message
    assert "\n" not in message
    assert not os.path.exists(os.path.join(cache, "pretrained", NAME))
    model = TransformerXLCausalLM.from_preset(NAME, url=url, cache_dir=cache).model  # the mirror is good again
    np.testing.assert_array_equal(nll(model), direct_nll(os.path.join(root, RELEASE.folder, "model", "model.ckpt-0")))
    assert tree(root) == before  # nothing outside the cache changed


def test_a_release_of_another_corpus_on_the_mirror_is_refused_naming_both(mirror, tmp_path):
    root, url, faults, _ = mirror
    wrong = os.path.join(root, "lm1b_cache.pkl")
    shutil.copy(os.path.join(root, "tf_lm1b", "data", "cache.pkl"), wrong)
    faults[CACHE_PKL] = []
    original = os.path.join(root, RELEASE.folder, "data", "cache.pkl")
    kept = open(original, "rb").read()
    try:
        shutil.copy(wrong, original)
        with pytest.raises(releases.DownloadError, match="vocabulary of the lm1b corpus, where tf_wt103 is the wt103"):
            TransformerXLCausalLM.from_preset(NAME, url=url, cache_dir=str(tmp_path / "cache"))
    finally:
        open(original, "wb").write(kept)
        os.remove(wrong)


def test_a_damaged_cache_entry_is_rebuilt_and_force_download_fetches_again(mirror, tmp_path, capsys):
    root, url, _, requests = mirror
    cache = str(tmp_path / "cache")
    expected = direct_nll(os.path.join(root, RELEASE.folder, "model", "model.ckpt-0"))
    found = presets.resolve(NAME, url=url, cache_dir=cache)
    weights = [os.path.join(d, f) for d, _, names in os.walk(found.folder) for f in names if f.endswith(".h5")]
    assert weights
    open(weights[0], "r+b").truncate(100)  # partly lost
    model = TransformerXLCausalLM.from_preset(NAME, url=url, cache_dir=cache).model
    np.testing.assert_array_equal(nll(model), expected)
    assert "lost or damaged" in capsys.readouterr().err
    os.remove(os.path.join(found.folder, presets.CACHE_ENTRY))  # as an interrupted conversion leaves it
    np.testing.assert_array_equal(nll(TransformerXLCausalLM.from_preset(NAME, url=url, cache_dir=cache).model),
                                  expected)
    before = len(requests)
    TransformerXLCausalLM.from_preset(NAME, url=url, cache_dir=cache)  # whole: no request
    assert len(requests) == before
    model = TransformerXLCausalLM.from_preset(NAME, url=url, cache_dir=cache, force_download=True).model
    assert len(requests) == before + len(RELEASE.files)
    np.testing.assert_array_equal(nll(model), expected)


def local_copy(mirror_root, where, name=NAME):
    shutil.copytree(os.path.join(mirror_root, releases.RELEASES[name].folder), where)
    return str(where)


def other_weights(prefix, seed):
    """A checkpoint of the wt103 stand-in's shapes with other values, at `prefix`."""
    n_token, cutoffs, div_val, d_embed, untie_r, share, same = CASES["wt103"]
    arrays, _ = tf_arrays(np.random.default_rng(seed), n_token, cutoffs, div_val, d_embed, untie_r, share, same)
    return write_tf_checkpoint(prefix, arrays)


def test_a_local_folder_changed_after_its_conversion_is_converted_again(mirror, tmp_path):
    local = local_copy(mirror[0], tmp_path / "tf_wt103")
    cache = str(tmp_path / "cache")
    first = nll(TransformerXLCausalLM.from_preset(local, cache_dir=cache).model)
    prefix = os.path.join(local, "model", "model.ckpt-0")
    np.testing.assert_array_equal(first, direct_nll(prefix))
    other_weights(prefix, seed=5)  # new weights under the same name
    second = nll(TransformerXLCausalLM.from_preset(local, cache_dir=cache).model)
    np.testing.assert_array_equal(second, direct_nll(prefix))
    assert not np.array_equal(first, second)


def test_model_checkpoint_chooses_among_several_and_any_name_works(mirror, tmp_path):
    local = local_copy(mirror[0], tmp_path / "tf_wt103")
    best = other_weights(os.path.join(local, "model", "model.ckpt-best"), seed=6)  # its checkpoint file names it
    model = TransformerXLCausalLM.from_preset(local, cache_dir=str(tmp_path / "cache")).model
    np.testing.assert_array_equal(nll(model), direct_nll(best))
    os.remove(os.path.join(local, "model", "checkpoint"))
    with pytest.raises(ValueError, match=r"2 checkpoints \(model.ckpt-0, model.ckpt-best\).*model/checkpoint"):
        TransformerXLCausalLM.from_preset(local, cache_dir=str(tmp_path / "cache"))


def test_a_checkpoint_of_another_corpus_in_a_release_named_folder_is_refused(mirror, tmp_path):
    local = local_copy(mirror[0], tmp_path / "tf_wt103", name="transfo_xl_lm1b")
    with pytest.raises(ValueError, match="named as the wt103 release but its data/cache.pkl is the vocabulary of "
                                         "the lm1b corpus"):
        TransformerXLCausalLM.from_preset(local, cache_dir=str(tmp_path / "cache"))
    renamed = local_copy(mirror[0], tmp_path / "my_model", name="transfo_xl_lm1b")  # the corpus names it
    assert TransformerXLCausalLM.from_preset(renamed, cache_dir=str(tmp_path / "cache")).model.config.tgt_len == 32


def test_two_folders_whose_paths_differ_in_punctuation_never_share_a_cache_entry(mirror, tmp_path):
    cache = str(tmp_path / "cache")
    spaced = local_copy(mirror[0], tmp_path / "a b" / "tf_wt103")
    underscored = local_copy(mirror[0], tmp_path / "a_b" / "tf_wt103")
    other_weights(os.path.join(underscored, "model", "model.ckpt-0"), seed=7)
    for local in (spaced, underscored):
        model = TransformerXLCausalLM.from_preset(local, cache_dir=cache).model
        np.testing.assert_array_equal(nll(model), direct_nll(os.path.join(local, "model", "model.ckpt-0")))
    assert presets.local_entry_name(spaced) != presets.local_entry_name(underscored)
