"""Bad input on every command line: one `error:` line naming the problem and the fix,
exit 2 for usage and 1 for a failure, no traceback, and every artefact that existed
before (records, vocabulary, config.json, checkpoints) byte-identical afterwards."""

import concurrent.futures
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
from helpers import build, env, run, snapshot, train_command, write_corpus
from programs import in_process

from tf_records.vocabulary import Vocabulary
from txl_keras import TransformerXLConfig, run_folder
from txl_keras.generate import sampler_from
from txl_keras.training import TrainConfig

PY = sys.executable


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Records, a trained run folder with three checkpoints, a latin-1 text file."""
    root = tmp_path_factory.mktemp("world")
    records = build(str(root))
    trained = in_process(train_command(records, str(root / "run"), "--train_steps=6", "--iterations=2",
                                       "--save_steps=2", "--do_eval=false"))
    assert trained.returncode == 0, trained.stderr[-2000:]
    with open(root / "latin1.txt", "wb") as f:
        f.write(("caf\u00e9 ol\u00e9 " * 400 + "\n").encode("latin-1") * 8)
    config = json.load(open(root / "run" / "config.json"))
    with open(root / "string_bool.json", "w") as f:
        json.dump({**config, "same_length": "false"}, f)
    Vocabulary(["<eos>", "<unk>", "alpha", "beta"], level="word", add_eos=True, unk_symbol="<unk>").save(
        str(root / "words.json"))
    original_weights(root)
    permuted_records(root)
    return root


def permuted_records(root):
    """`permuted/`: the world's records as if built with a vocabulary of the same size whose
    ids are permuted (its vocab.json and the fingerprint its record infos carry);
    `mismatched/`: the world's records with that vocab.json put beside them."""
    shutil.copytree(root / "records", root / "permuted")
    shutil.copytree(root / "records", root / "mismatched")
    vocab = Vocabulary.load(str(root / "records" / "vocab.json"))
    settings = {k: v for k, v in vocab.to_dict().items() if k not in ("format", "symbols")}
    permuted = Vocabulary(vocab.symbols[1:] + vocab.symbols[:1], **settings)
    permuted.save(str(root / "permuted" / "vocab.json"))
    permuted.save(str(root / "mismatched" / "vocab.json"))
    for name in os.listdir(root / "permuted"):
        if name.startswith("record_info-"):
            info = json.load(open(root / "permuted" / name))
            json.dump({**info, "vocab_fingerprint": permuted.fingerprint()}, open(root / "permuted" / name, "w"))


def original_weights(root):
    """Files in the original release's formats, some of them damaged or mismatched."""
    import pickle

    from original_formats import CASES as ORIGINAL, tf_arrays, write_cache_pkl, write_tf_checkpoint

    n_token, cutoffs, div_val, d_embed, untie_r, share, same = ORIGINAL["enwik8"]
    arrays, _ = tf_arrays(np.random.default_rng(0), n_token, cutoffs, div_val, d_embed, untie_r, share, same)
    os.makedirs(root / "original")
    write_tf_checkpoint(str(root / "original" / "model.ckpt-0"), arrays)
    missing = {k: v for k, v in arrays.items() if not k.endswith("layer_0/ff/layer_1/kernel")}
    write_tf_checkpoint(str(root / "original" / "missing.ckpt-0"), missing)
    flat = {**arrays, "transformer/r_w_bias": arrays["transformer/r_w_bias"].reshape(-1)}
    write_tf_checkpoint(str(root / "original" / "flat_bias.ckpt-0"), flat)
    write_cache_pkl(str(root / "original" / "cache10.pkl"), [f"s{i}" for i in range(9)] + ["<unk>"])
    with open(root / "original" / "list.pkl", "wb") as f:
        pickle.dump(["a", "b"], f, protocol=2)
    with open(root / "config.json", "w") as f:
        f.write(TransformerXLConfig.from_preset("tiny", n_token=n_token).to_json())
    open(root / "original" / "state_dict.pt", "wb").close()


def error_line(result):
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    return lines


GEN = [PY, "-m", "txl_keras.generate", "--model_dir={root}/run", "--prompt=alpha"]
TRAIN = "train"  # train_command(records, run folder, ...)
# (name, command (TRAIN: the trainer on the world's records and run folder), exit code, message fragment)
CASES = [
    # 1. nothing deleted or overwritten
    ("keep_checkpoint_max 0", [TRAIN, "--keep_checkpoint_max=0"], 1, "keep_checkpoint_max` to be a positive"),
    ("convert over a run", [PY, "-m", "txl_keras.convert", "--tf_checkpoint={root}/none", "--output={root}/run"],
     2, "is not empty (it may hold a training run)"),
    ("another d_model", [TRAIN, "--d_model=32", "--train_steps=8"], 1, "holds another model (d_embed: 16 -> 32; "
     "d_model: 16 -> 32); use another --model_dir"),
    ("records of another vocabulary",
     [PY, "-m", "tf_records", "--dataset=text", "--text={root}/latin1.txt", "--encoding=latin-1", "--level=char",
      "--records_dir={root}/records", "--per_host_train_bsz=4", "--per_host_valid_bsz=4", "--tgt_len=8"],
     1, "holds records of another vocabulary"),
    # 2. every flag and field in its domain
    ("num_core_per_host 0", [TRAIN, "--num_core_per_host=0"], 2, "flag --num_core_per_host=0"),
    ("negative learning rate", [TRAIN, "--learning_rate=-1"], 1, "learning_rate` to be > 0"),
    ("layer_norm_epsilon 0", [TRAIN, "--layer_norm_epsilon=0"], 1, "layer_norm_epsilon` to be > 0"),
    ("string boolean in config.json", [TRAIN, "--config={root}/string_bool.json"], 1,
     "string_bool.json: Expected `same_length` to be a boolean"),
    ("nothing to evaluate", [TRAIN, "--model_dir={root}/empty", "--do_train=false"], 1, "nothing to evaluate"),
    ("missing warm start", [TRAIN, "--model_dir={root}/new", "--warm_start_path={root}/records/vocab.json"], 1,
     "--warm_start_path="),
    ("infinite learning rate", [TRAIN, "--learning_rate=inf"], 2, "--learning_rate=inf is not a finite number"),
    ("nan dropout", [TRAIN, "--dropout=nan"], 2, "--dropout=nan is not a finite number"),
    ("infinite temperature", GEN + ["--temperature=inf"], 2, "--temperature=inf is not a finite number"),
    ("a bucket without //", [TRAIN, "--model_dir=gs:bucket/run"], 2, "did you mean gs://bucket/run"),
    ("hosts without a cluster", [TRAIN, "--num_hosts=2"], 1, "--num_hosts=2, but this run has 1 host(s)"),
    ("--text with another corpus", [PY, "-m", "tf_records", "--text={root}/corpus.txt", "--dataset=ptb",
                                    "--records_dir={root}/other"], 2, "which is --dataset=text, not --dataset=ptb"),
    ("two sources to convert", [PY, "-m", "txl_keras.convert", "--tf_checkpoint={root}/original/model.ckpt-0",
                                "--pytorch_state_dict={root}/original/state_dict.pt", "--output={root}/converted"],
     2, "one source at a time"),
    ("top_p 0", GEN + ["--top_p=0"], 1, "top_p` in (0, 1]"),
    ("seed out of range", GEN + ["--seed=-1"], 2, "flag --seed=-1"),
    ("stop symbol not in vocabulary", GEN + ["--stop=<nope>"], 2, "is not in the vocabulary"),
    ("a malformed escape in --stop", GEN + ["--stop=\\x"], 2, "has a malformed escape '\\\\x'"),
    ("beams with a sampling flag", GEN + ["--num_beams=4", "--top_k=40"], 2,
     "--num_beams=4 searches beams, which draw nothing; --top_k only shape a sampled draw"),
    ("no run folder", [PY, "-m", "txl_keras.generate", "--model_dir={root}/nowhere", "--prompt=a"], 1,
     "No run folder at"),
    ("export without run folder", [PY, "-m", "txl_keras.export", "--model_dir={root}/nowhere",
                                   "--output={root}/exported"], 1, "No run folder at"),
    ("records tgt_len 0", [PY, "-m", "tf_records", "--dataset=text", "--text={root}/corpus.txt",
                           "--records_dir={root}/other", "--tgt_len=0"], 2, "flag --tgt_len=0"),
    # 3. data that is not what it seems
    ("latin-1 at char level", [PY, "-m", "tf_records", "--dataset=text", "--text={root}/latin1.txt",
                               "--level=char", "--records_dir={root}/other"], 1, "latin1.txt is not valid utf-8 at byte 3"),
    ("unknown encoding", [PY, "-m", "tf_records", "--dataset=text", "--text={root}/latin1.txt",
                          "--encoding=bogus", "--records_dir={root}/other"], 2, "--encoding='bogus'"),
    ("vocabulary that does not fit", [PY, "-m", "tf_records", "--dataset=text", "--text={root}/latin1.txt",
                                      "--vocab={root}/words.json", "--encoding=latin-1",
                                      "--records_dir={root}/other"], 1, "the vocabulary does not fit"),
    ("symbol outside a vocabulary without <unk>", [PY, "-m", "tf_records", "--dataset=text",
                                                   "--text={root}/latin1.txt", "--vocab={root}/records/vocab.json",
                                                   "--encoding=latin-1", "--records_dir={root}/other"],
     1, "is not in the vocabulary and it has no unknown symbol"),
    # 4. files that do not belong together, or are damaged
    ("empty model_dir", [TRAIN, "--model_dir="], 2, "--model_dir is given empty"),
    ("empty vocabulary flag", [PY, "-m", "tf_records", "--dataset=text", "--text={root}/corpus.txt", "--vocab=",
                               "--records_dir={root}/other"], 2, "--vocab is given empty"),
    ("records of a permuted vocabulary", [TRAIN, "--data_dir={root}/permuted", "--train_steps=8"], 1,
     "was trained with another vocabulary"),
    ("records and a vocab.json that disagree", [TRAIN, "--data_dir={root}/mismatched", "--model_dir={root}/fresh2",
                                                "--do_eval=false"], 1, "were built with another vocabulary than"),
    ("a model the machine cannot hold", [TRAIN, "--model_dir={root}/big", "--d_model=100000000"], 1,
     "--check_memory=false"),
    ("generation the machine cannot hold", GEN + ["--mem_len=1000000000", "--max_new_tokens=1000000000"], 1,
     "Generating with 1 beam(s) at mem_len=1000000000 needs about"),
    ("export the machine cannot hold", [PY, "-m", "txl_keras.export", "--model_dir={root}/run",
                                        "--output={root}/exported", "--mem_len=1000000000"], 1, "Exporting at mem_len"),
    ("evaluation the machine cannot hold", [TRAIN, "--do_train=false", "--eval_mem_len=1000000000"], 1,
     "Evaluating 4 streams at mem_len=1000000000 needs about"),
    ("records of another layout, first attempt", [TRAIN, "--model_dir={root}/fresh", "--train_batch_size=3"], 1,
     "were built for another layout"),
    ("vocabulary of another size", GEN + ["--vocab={root}/words.json"], 1,
     "words.json has 4 symbols but the model has n_token="),
    ("cache.pkl of another size", [PY, "-m", "txl_keras.convert", "--tf_checkpoint={root}/original/model.ckpt-0",
                                   "--cache_pkl={root}/original/cache10.pkl", "--output={root}/converted"],
     1, "The vocabulary has 10 symbols but the weights have n_token=20"),
    ("checkpoint missing a variable", [PY, "-m", "txl_keras.convert",
                                       "--tf_checkpoint={root}/original/missing.ckpt-0", "--output={root}/converted"],
     1, "layer_0/ff/layer_1/kernel"),
    ("one-dimensional r_w_bias", [PY, "-m", "txl_keras.convert", "--tf_checkpoint={root}/original/flat_bias.ckpt-0",
                                  "--output={root}/converted"], 1, "r_w_bias has shape (8,)"),
    ("cache.pkl holding a list", [PY, "-m", "txl_keras.convert", "--tf_checkpoint={root}/original/model.ckpt-0",
                                  "--cache_pkl={root}/original/list.pkl", "--output={root}/converted"],
     1, "holds a list, not the original Corpus or Vocab"),
    ("average onto an existing file", [PY, "-m", "txl_keras.training.average_checkpoints", "--model_dir={root}/run",
                                       "--output={root}/run/config.json"], 2, "exists; pass another --output"),
]


if importlib.util.find_spec("torch") is None:  # (where PyTorch is installed the program reads the file)
    CASES.append(("a state dict without torch", [PY, "-m", "txl_keras.convert",
                                                 "--pytorch_state_dict={root}/original/state_dict.pt",
                                                 "--config_json={root}/config.json", "--output={root}/converted"],
                  1, "needs PyTorch"))


def command(case, root):
    parts = [p.format(root=root) for p in case]
    if parts[0] == TRAIN:
        return train_command(os.path.join(root, "records"), os.path.join(root, "run"), *parts[1:])
    return parts


def _failures(cases, results):
    failures = []
    for (name, _, code, fragment), result in zip(cases, results):
        lines = error_line(result)
        if result.returncode != code or "Traceback" in result.stderr or len(lines) != 1 or fragment not in lines[0]:
            failures.append(f"{name}: exit {result.returncode} (expected {code}), stderr: {result.stderr[-600:]}")
    return failures


def test_every_bad_input_is_one_clear_line_and_changes_nothing(world):
    """Every case through the program's own entry point, in this process."""
    root = str(world)
    before = snapshot(root)
    results = [in_process(command(case[1], root)) for case in CASES]
    assert not _failures(CASES, results), "\n".join(_failures(CASES, results))
    assert snapshot(root) == before


def test_a_memory_longer_than_the_text_is_cut_to_it_and_changes_nothing(world):
    """`--mem_len` far beyond the prompt and the new tokens (or the scored text) allocates only
    what they fill: the command runs at once and prints what the library gives with the
    run's own, uncut memory, which is longer than the text too."""
    from txl_keras import TransformerXLCausalLM
    from txl_keras.generate import generate, score

    root = str(world)
    lm = TransformerXLCausalLM.from_preset(f"{root}/run")
    prompt = lm.tokenizer.tokenize_prompt("alpha").numpy()
    uncut = generate(lm.model, [prompt], 6, temperature=0, mem_len=100)[0]  # 100 > the 5 + 6 tokens
    generated = in_process([PY, "-m", "txl_keras.generate", f"--model_dir={root}/run", "--prompt=alpha",
                            "--max_new_tokens=6", "--temperature=0", "--mem_len=10000000"])
    assert generated.returncode == 0, generated.stderr[-2000:]
    assert generated.stdout == lm.tokenizer.detokenize(uncut) + "\n"
    ids = lm.tokenizer("alpha beta").numpy()
    nll = score(lm.model, ids[None], mem_len=100)  # longer than the text
    scored = in_process([PY, "-m", "txl_keras.generate", f"--model_dir={root}/run", "--score=alpha beta",
                         "--mem_len=1000000000"])
    assert scored.returncode == 0, scored.stderr[-2000:]
    assert f"perplexity {np.exp(np.mean(nll)):.3f} " in scored.stdout, (scored.stdout, nll)


def test_a_long_beam_search_says_how_far_it_is(world, monkeypatch):
    """The command's beam search, which prints its text at the end, reports its steps on
    stderr once it runs longer than `loop.PROGRESS_AFTER_S` (here at once)."""
    from txl_keras.generate import loop

    monkeypatch.setattr(loop, "PROGRESS_AFTER_S", 0.0)
    found = in_process([PY, "-m", "txl_keras.generate", f"--model_dir={world}/run", "--prompt=alpha",
                        "--max_new_tokens=5", "--num_beams=3"])
    assert found.returncode == 0, found.stderr[-2000:]
    steps = [line for line in found.stderr.splitlines() if line.startswith("Beam search with 3 beams: step ")]
    assert steps and all(" of at most 5 " in line for line in steps), found.stderr
    assert found.stdout.startswith("alpha")


def program_of(case):
    return "train_gpu.py" if case[1][0] == TRAIN else case[1][2] if case[1][1] == "-m" else case[1][1]


def test_every_program_reports_bad_input_the_same_in_a_process_of_its_own(world):
    """One case of each program as a user runs it: a Python process of its own, TensorFlow's
    log level unset. Its whole stderr is the one error line: the program keeps TensorFlow's
    start-up notices off (tests/package/test_program_output.py brings them back)."""
    root = str(world)
    before = snapshot(root)
    firsts = list({program_of(case): case for case in reversed(CASES)}.values())
    assert len(firsts) == 6, [program_of(c) for c in firsts]
    as_users = {k: v for k, v in env().items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda case: run(command(case[1], root), timeout=120, env=as_users), firsts))
    assert not _failures(firsts, results), "\n".join(_failures(firsts, results))
    for case, result in zip(firsts, results):
        assert result.stderr.splitlines() == error_line(result), (case[0], result.stderr)
    assert snapshot(root) == before


TRAIN_CONFIG = dict(model_dir="m", records_dir="r")
# Every field through the library: (call, message fragment); the command lines give the same message.
CALLS = [
    (lambda: TrainConfig(**TRAIN_CONFIG, save_steps=-1), "save_steps` to be a non-negative"),
    (lambda: TrainConfig(**TRAIN_CONFIG, keep_checkpoint_max=0), "keep_checkpoint_max` to be a positive"),
    (lambda: TrainConfig(**TRAIN_CONFIG, min_lr_ratio=2.0), "min_lr_ratio` to be in [0, 1]"),
    (lambda: TrainConfig(**TRAIN_CONFIG, clip=-1.0), "clip` to be >= 0"),
    (lambda: TrainConfig(**TRAIN_CONFIG, eval_steps=-1), "eval_steps` to be a non-negative"),
    (lambda: TrainConfig(**TRAIN_CONFIG, warmup_steps=-1), "warmup_steps` to be a non-negative"),
    (lambda: TrainConfig(**TRAIN_CONFIG, iterations=0), "iterations` to be a positive"),
    (lambda: TrainConfig(**TRAIN_CONFIG, concurrent_parts=-1), "concurrent_parts` to be a non-negative"),
    (lambda: TrainConfig(**TRAIN_CONFIG, train_batch_size=60, batch_chunk=4, concurrent_parts=2),
     "`batch_chunk` x `concurrent_parts` = 8 must divide"),
    (lambda: TrainConfig(**TRAIN_CONFIG, xla="false"), "xla` to be a boolean"),
    (lambda: TrainConfig(**TRAIN_CONFIG, train_steps=10.5), "train_steps` to be an integer"),
    (lambda: TransformerXLConfig(dropout=1.0), "dropout` to be in [0, 1)"),
    (lambda: TransformerXLConfig(dropatt=-0.1), "dropatt` to be in [0, 1)"),
    (lambda: TransformerXLConfig(layer_norm_epsilon=0.0), "layer_norm_epsilon` to be > 0"),
    (lambda: TransformerXLConfig(clamp_len=-5), "clamp_len` to be -1 or 0"),
    (lambda: TransformerXLConfig(mem_len=-1), "mem_len` to be a non-negative"),
    (lambda: TransformerXLConfig(same_length="false"), "same_length` to be a boolean"),
    (lambda: TransformerXLConfig.from_json('{"pre_lnorm": "false"}'), "pre_lnorm` to be a boolean"),
    (lambda: TransformerXLConfig(n_token=100, cutoffs=[20.5]), "cutoffs` to be a list of integers"),
    (lambda: TransformerXLConfig(n_token=100, cutoffs=[50, 20]), "strictly increasing"),
    (lambda: TransformerXLConfig(n_token=100, cutoffs=[100]), "strictly increasing"),
    (lambda: TransformerXLConfig(n_layer=2.0), "n_layer` to be an integer"),
    (lambda: TransformerXLConfig(init_std=float("nan")), "init_std` to be a finite number"),
    (lambda: sampler_from(temperature=-1.0), "temperature` to be a finite number >= 0"),
    (lambda: sampler_from(top_k=-1), "top_k` to be a non-negative"),
    (lambda: sampler_from(top_p=0.0), "top_p` in (0, 1]"),
    (lambda: sampler_from(top_p=1.5), "top_p` in (0, 1]"),
]


@pytest.mark.parametrize("call, fragment", CALLS, ids=[c[1][:30] for c in CALLS])
def test_every_field_is_checked_against_its_domain(call, fragment):
    with pytest.raises(ValueError) as error:
        call()
    assert fragment in str(error.value)


def test_float_token_ids_are_refused_not_truncated():
    from txl_keras import TransformerXLLM
    from txl_keras.generate import generate

    model = TransformerXLLM(TransformerXLConfig.from_preset("tiny", n_token=16))
    with pytest.raises(ValueError, match="Expected integer token ids"):
        model(np.full((1, 4), 1.7, "float32"))
    with pytest.raises(ValueError, match="Expected integer token ids"):
        model(np.zeros((1, 4), "int32"), targets=np.full((1, 4), 2.0, "float32"))
    with pytest.raises(ValueError, match="Expected integer token ids"):
        generate(model, np.full((1, 2), 3.0), 1)


def test_a_damaged_newest_checkpoint_is_named_left_in_place_and_resume_uses_the_one_before(world, tmp_path):
    """Truncated weights or an empty state: the run resumes from the complete checkpoint
    before it, ends with the weights of a run that never saw the damage, and the
    damaged files are kept (set aside once a new checkpoint of their step is written)."""
    records = os.path.join(str(world), "records")
    # the reference: the same run folder without checkpoint 6, resumed from checkpoint 4
    reference = str(tmp_path / "reference")
    shutil.copytree(os.path.join(str(world), "run"), reference)
    shutil.rmtree(os.path.join(reference, "ckpt-00000006"))
    with open(os.path.join(reference, run_folder.INDEX), "w") as f:
        json.dump({"checkpoints": ["ckpt-00000002", "ckpt-00000004"]}, f)
    ran = in_process(train_command(records, reference, "--train_steps=8", "--iterations=2", "--save_steps=2",
                                   "--do_eval=false"))
    assert ran.returncode == 0 and "(step 4)" in ran.stdout, ran.stderr[-2000:]
    for damage in ("weights", "state"):
        model_dir = str(tmp_path / damage)
        shutil.copytree(os.path.join(str(world), "run"), model_dir)
        newest = os.path.join(model_dir, "ckpt-00000006")
        if damage == "weights":
            path = os.path.join(newest, run_folder.WEIGHTS)
            data = open(path, "rb").read()
            open(path, "wb").write(data[: len(data) // 2])
        else:
            open(os.path.join(newest, run_folder.STATE), "wb").close()
        damaged = snapshot(newest)
        resumed = in_process(train_command(records, model_dir, "--train_steps=8", "--iterations=2",
                                           "--save_steps=2", "--do_eval=false"))
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        assert f"the checkpoint {newest} is damaged" in resumed.stderr
        assert "ckpt-00000004 (step 4)" in resumed.stdout
        assert snapshot(newest + ".damaged") == damaged  # kept as it was
        a, b = run_folder.load_state(os.path.join(reference, "ckpt-00000008")), \
            run_folder.load_state(os.path.join(model_dir, "ckpt-00000008"))
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=f"{damage}: {name}")
        assert _same_weights(reference, model_dir), damage


def _same_weights(a, b):
    import h5py

    def arrays(path):
        out = {}
        with h5py.File(os.path.join(path, "ckpt-00000008", run_folder.WEIGHTS)) as f:
            f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
        return out
    x, y = arrays(a), arrays(b)
    return x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)


def test_a_corrupt_record_met_while_training_names_the_file(tmp_path):
    records = build(str(tmp_path))
    path = os.path.join(records, "train.bsz-4.tlen-8.hosts-1.host-0.tfrecords")
    data = bytearray(open(path, "rb").read())
    data[len(data) // 50: len(data) // 50 + 16] = b"\xff" * 16  # an early record
    open(path, "wb").write(bytes(data))
    result = in_process(train_command(records, str(tmp_path / "m"), "--train_steps=40", "--iterations=20",
                                      "--do_eval=false", "--save_steps=0"))
    lines = error_line(result)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert len(lines) == 1 and f"Record file {path} is corrupt" in lines[0] and "rebuild" in lines[0]


def test_text_with_another_encoding_and_a_given_vocabulary(tmp_path):
    """Byte level reads raw bytes; --encoding decodes; --vocab is honoured by --dataset=text."""
    from tf_records import build_records, load_record_info, stream_dataset
    from tf_records.vocabulary import Vocabulary

    latin = tmp_path / "latin1.txt"
    latin.write_bytes(("na\u00efve caf\u00e9\n" * 300).encode("latin-1"))
    raw = build_records("text", str(tmp_path / "bytes"), text=str(latin), splits=["train"], tgt_len=8,
                        per_host_train_bsz=2, log=lambda *_: None)
    symbols = Vocabulary.load(os.path.join(raw, "vocab.json")).symbols
    assert "239" in symbols and "233" in symbols  # 0xEF, 0xE9: the file's bytes, no U+FFFD
    chars = build_records("text", str(tmp_path / "chars"), text=str(latin), encoding="latin-1", level="char",
                          splits=["train"], tgt_len=8, per_host_train_bsz=2, log=lambda *_: None)
    assert "\u00e9" in Vocabulary.load(os.path.join(chars, "vocab.json")).symbols
    # --vocab: the given vocabulary's ids, not a recount
    corpus = write_corpus(str(tmp_path / "corpus.txt"))
    given = Vocabulary(["<eos>", "<unk>", "gamma", "alpha", "beta", "delta", "kappa", "omega", "sigma", "theta.",
                        "alpha.", "beta.", "gamma.", "delta.", "kappa.", "omega.", "sigma.", "theta"],
                       level="word", add_eos=True, unk_symbol="<unk>")
    given.save(str(tmp_path / "vocab.json"))
    out = build_records("text", str(tmp_path / "words"), text=corpus, vocab=Vocabulary.load(str(tmp_path / "vocab.json")),
                        splits=["train"], tgt_len=8, per_host_train_bsz=1, log=lambda *_: None)
    assert Vocabulary.load(os.path.join(out, "vocab.json")).symbols == given.symbols
    info = load_record_info(out, "train", 1, 8)
    first = next(iter(stream_dataset(info)))[0].numpy()[0]
    line = open(corpus).readline().split()
    assert list(first[: len(line)]) == [given.index[w] for w in line]


@pytest.mark.slow
def test_sigkill_inside_a_checkpoint_write_then_resume(world, tmp_path):
    """A real SIGKILL while the process is writing a checkpoint (stopped inside the write by
    a hook that waits for the signal), on two replicas each drawing its own dropout masks:
    the folder keeps its previous checkpoint, and the same command resumes from it to the
    bit-identical weights, optimizer, randomness, memories and loss curve of an
    uninterrupted run."""
    records = os.path.join(str(world), "records")
    model_dir = str(tmp_path / "killed")
    flags_ = ["--train_steps=8", "--iterations=2", "--save_steps=4", "--do_eval=false", "--num_core_per_host=2",
              "--dropout=0.1", "--dropatt=0.1"]
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(  # stops the process inside the write of checkpoint 8
        "import os, time\n"
        "if os.environ.get('TXL_TEST_HANG_IN_SAVE'):\n"
        "    original = os.replace\n"
        "    def replace(source, target, *args, **kwargs):\n"
        "        if 'ckpt-00000008' in str(source):\n"
        "            print('INSIDE-WRITE', flush=True)\n"
        "            time.sleep(600)\n"
        "        return original(source, target, *args, **kwargs)\n"
        "    os.replace = replace\n")
    command = ["timeout", "-k", "10", "240"] + train_command(records, model_dir, *flags_)
    hanging = env(TXL_TEST_HANG_IN_SAVE="1")
    hanging["PYTHONPATH"] = str(hook) + os.pathsep + hanging["PYTHONPATH"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=hanging,
                               start_new_session=True)
    for line in process.stdout:
        if "INSIDE-WRITE" in line:
            os.killpg(process.pid, signal.SIGKILL)
            break
    process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL
    assert run_folder.latest_checkpoint(model_dir)[0] == 4  # the interrupted write does not count
    assert any(name.endswith(".partial") for name in os.listdir(model_dir))  # it was inside the write
    resumed = run(train_command(records, model_dir, *flags_))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from" in resumed.stdout and "(step 4)" in resumed.stdout
    reference = str(tmp_path / "reference")
    uninterrupted = run(train_command(records, reference, *flags_))
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-2000:]
    assert _same_weights(reference, model_dir)
    a, b = (run_folder.load_state(os.path.join(d, "ckpt-00000008")) for d in (reference, model_dir))
    assert sorted(a) == sorted(b) and any(k.startswith("memory_0_replica_1") for k in a)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)

    def losses(text):
        return [line.split("| tok/s")[0] for line in text.splitlines() if line.startswith("step ")]

    assert losses(resumed.stdout) == losses(uninterrupted.stdout)[-len(losses(resumed.stdout)):]
    assert not any(name.endswith(".partial") for name in os.listdir(model_dir))
