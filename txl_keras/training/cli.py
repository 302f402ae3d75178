"""The absl flags and main routine shared by train_gpu.py and train_tpu.py.

Flag names follow the original `tf/train_gpu.py` and `tf/train.py`; `--config` picks a
preset that the model flags override. Unknown or misspelt flags are an error.
"""

import json
import os
import shutil
import sys

from absl import flags

from tf_records.records import record_info_path
from tf_records.build import VOCAB_FILE, build_records, default_records_dir, load_corpus_info
from txl_keras.atomic_files import atomic_write_text
from txl_keras.models.config import PRESETS, TransformerXLConfig
from txl_keras.training import checkpoints
from txl_keras.training.train_config import PRECISIONS, TrainConfig
from txl_keras.training.trainer import NonFiniteLossError, Trainer

FLAGS = flags.FLAGS

# Data.
flags.DEFINE_string("data_dir", None, "Folder of the TFRecords, vocab.json and corpus-info.json "
                    "(default data/<dataset>; built from --dataset when missing).")
flags.DEFINE_string("dataset", "stdlib", "Corpus to build records from when --data_dir has none "
                    "(see python -m tf_records); the default needs no download.")
flags.DEFINE_string("corpus_info_path", None, "corpus-info.json (default: in --data_dir).")
flags.DEFINE_integer("num_hosts", 1, "Hosts (input pipelines) the records were built for.")
flags.DEFINE_integer("num_core_per_host", None, "Replicas per host (default: all local devices).")
# Run.
flags.DEFINE_string("model_dir", "runs/quickstart", "Checkpoints and summaries.")
flags.DEFINE_bool("do_train", True, "Train.")
flags.DEFINE_bool("do_eval", True, "Evaluate on --eval_split after training.")
flags.DEFINE_bool("do_eval_only", False, "Evaluate every checkpoint in --model_dir and report the best.")
flags.DEFINE_string("eval_ckpt_path", None, "Evaluate this checkpoint (folder or .weights.h5).")
flags.DEFINE_string("warm_start_path", None, "Start from these weights (checkpoint folder or .weights.h5).")
flags.DEFINE_integer("start_eval_steps", 0, "--do_eval_only: skip checkpoints before this step.")
# Optimisation.
flags.DEFINE_float("learning_rate", 1e-3, "Peak learning rate (original: 2.5e-4).")
flags.DEFINE_enum("lr_schedule", "cosine", ["cosine", "inv_sqrt", "constant"], "Decay after warmup.")
flags.DEFINE_float("clip", 0.25, "Clip gradients to this global norm.")
flags.DEFINE_float("min_lr_ratio", 0.004, "Cosine decays to learning_rate * min_lr_ratio.")
flags.DEFINE_integer("warmup_steps", 100, "Linear warmup steps.")
flags.DEFINE_integer("train_batch_size", 16, "Streams per host per step.")
flags.DEFINE_integer("eval_batch_size", 16, "Streams per host in evaluation.")
flags.DEFINE_integer("train_steps", 1200, "Steps to train.")
flags.DEFINE_integer("iterations", 100, "Steps per host-loop call, and the logging interval.")
flags.DEFINE_integer("save_steps", 400, "Save a checkpoint every this many steps (0: only at the end).")
flags.DEFINE_integer("keep_checkpoint_max", 5, "Checkpoints to keep.")
flags.DEFINE_integer("batch_chunk", 1, "Split each replica's batch into this many pieces (gradient accumulation).")
flags.DEFINE_enum("precision", "float32", list(PRECISIONS), "Compute precision.")
flags.DEFINE_bool("xla", False, "XLA-compile the forward and backward pass.")
flags.DEFINE_integer("seed", 1111, "Random seed.")
flags.DEFINE_bool("deterministic", True, "Deterministic ops (needed for bit-exact resume).")
flags.DEFINE_bool("skip_nonfinite", False, "Skip steps with a non-finite loss instead of stopping.")
# Evaluation.
flags.DEFINE_enum("eval_split", "valid", ["valid", "test"], "Split to evaluate.")
flags.DEFINE_integer("eval_tgt_len", None, "Evaluation segment length (default tgt_len).")
flags.DEFINE_integer("eval_mem_len", None, "Evaluation memory length (default mem_len).")
flags.DEFINE_integer("eval_clamp_len", None, "Evaluation clamp_len (default clamp_len).")
flags.DEFINE_bool("eval_same_length", None, "Evaluation same_length (default same_length).")
flags.DEFINE_integer("max_eval_batch", 200, "Evaluate at most this many batches (-1: the whole split).")
# Model: a preset, then the original flags override it.
flags.DEFINE_string("config", "cpu_small", f"Model preset ({', '.join(sorted(PRESETS))}) or the path of a "
                    "config.json (e.g. one written by python -m txl_keras.convert).")
for _name, _kind in [
    ("n_layer", "integer"), ("d_model", "integer"), ("d_embed", "integer"), ("n_head", "integer"),
    ("d_head", "integer"), ("d_inner", "integer"), ("dropout", "float"), ("dropatt", "float"),
    ("tgt_len", "integer"), ("mem_len", "integer"), ("clamp_len", "integer"), ("same_length", "bool"),
    ("div_val", "integer"), ("untie_r", "bool"), ("tie_weight", "bool"),
    ("proj_share_all_but_first", "bool"), ("proj_same_dim", "bool"), ("pre_lnorm", "bool"),
    ("attn_type", "integer"), ("init", "string"), ("init_std", "float"), ("proj_init_std", "float"),
    ("init_range", "float"), ("layer_norm_epsilon", "float"),
]:
    getattr(flags, f"DEFINE_{_kind}")(_name, None, f"Override the preset's {_name}.")
MODEL_FLAGS = [n for n in TransformerXLConfig.__dataclass_fields__ if n in FLAGS]


def model_config(corpus_info):
    """The preset (or config.json) with the flags' overrides; a preset takes its
    vocabulary size and cutoffs from the corpus, a config.json must have its size."""
    overrides = {n: FLAGS[n].value for n in MODEL_FLAGS if FLAGS[n].value is not None}
    cutoffs = corpus_info["cutoffs"][1:-1]
    if FLAGS.config.endswith(".json"):
        with open(FLAGS.config) as f:
            config = TransformerXLConfig.from_json(f.read()).replace(**overrides)
        if config.n_token != corpus_info["vocab_size"]:
            raise ValueError(
                f"{FLAGS.config} has n_token={config.n_token} but the records have a vocabulary of "
                f"{corpus_info['vocab_size']}; build the records with the model's vocabulary "
                "(python -m tf_records --vocab=...)."
            )
        return config
    return TransformerXLConfig.from_preset(
        FLAGS.config, n_token=corpus_info["vocab_size"], cutoffs=cutoffs, **overrides)


def train_config(data_dir):
    names = [n for n in TrainConfig.__dataclass_fields__ if n not in ("records_dir",)]
    return TrainConfig(records_dir=data_dir, **{n: FLAGS[n].value for n in names})


def prepare_data(num_core_per_host, log):
    """The records folder; builds the default corpus's records there if they are missing."""
    data_dir = FLAGS.data_dir or default_records_dir(FLAGS.dataset)
    if FLAGS.config.endswith(".json"):
        with open(FLAGS.config) as f:
            preset = json.load(f)
    elif FLAGS.config in PRESETS:
        preset = PRESETS[FLAGS.config]
    else:
        raise ValueError(f"--config={FLAGS.config!r} is neither a preset ({sorted(PRESETS)}) nor a .json file.")
    tgt_len = FLAGS.tgt_len or preset["tgt_len"]
    eval_tgt_len = FLAGS.eval_tgt_len or tgt_len
    needed = [("train", FLAGS.train_batch_size, tgt_len), (FLAGS.eval_split, FLAGS.eval_batch_size, eval_tgt_len)]
    missing = [s for s, b, t in needed if not os.path.exists(record_info_path(data_dir, s, b, t, FLAGS.num_hosts))]
    if missing and FLAGS.data_dir is None:
        log(f"building the {FLAGS.dataset} records in {data_dir} (no download)")
        for split, batch, length in needed:
            if split in missing:
                build_records(FLAGS.dataset, data_dir, splits=[split], tgt_len=length,
                              per_host_train_bsz=batch, per_host_valid_bsz=batch,
                              num_hosts=FLAGS.num_hosts, num_core_per_host=num_core_per_host, log=log)
    return data_dir


def run(strategy, num_hosts=1, is_chief=True, log=print):
    """Train and/or evaluate under `strategy`, as the flags say. Returns the eval results."""
    cores = strategy.num_replicas_in_sync // num_hosts
    # Only the chief builds missing default records; other workers read the same folder.
    data_dir = prepare_data(cores, log) if is_chief else FLAGS.data_dir or default_records_dir(FLAGS.dataset)
    corpus_info = load_corpus_info(os.path.dirname(FLAGS.corpus_info_path) if FLAGS.corpus_info_path else data_dir)
    config = model_config(corpus_info)
    tc = train_config(data_dir)
    os.makedirs(tc.model_dir, exist_ok=True)
    if is_chief:
        atomic_write_text(os.path.join(tc.model_dir, "config.json"), config.to_json())
        vocab = os.path.join(data_dir, VOCAB_FILE)
        if os.path.exists(vocab):  # generation and export find it beside the checkpoints
            shutil.copyfile(vocab, os.path.join(tc.model_dir, VOCAB_FILE))
    trainer = Trainer(strategy, config, tc, num_hosts=num_hosts, is_chief=is_chief, log=log)
    results = {}
    if FLAGS.do_eval_only:
        return evaluate_checkpoints(trainer, log)
    if FLAGS.do_train:
        if FLAGS.do_eval and not checkpoints.latest_checkpoint(tc.model_dir)[1] and not FLAGS.warm_start_path:
            results["before"] = trainer.evaluate(progress=False)
        try:
            trainer.train()
        except NonFiniteLossError as e:
            log(str(e))
            sys.exit(2)
    elif FLAGS.eval_ckpt_path:
        trainer.load_weights(FLAGS.eval_ckpt_path)
    else:
        trainer.restore_or_warm_start()
    if FLAGS.do_eval:
        results["after"] = trainer.evaluate()
        if "before" in results:
            b, a = results["before"], results["after"]
            log(f"validation bpc {b['bpc']:.3f} -> {a['bpc']:.3f}, ppl {b['ppl']:.2f} -> {a['ppl']:.2f}")
    if is_chief:
        atomic_write_text(os.path.join(tc.model_dir, "eval_results.json"), json.dumps(results, indent=2))
    return results


def evaluate_checkpoints(trainer, log):
    """Evaluate every saved checkpoint from --start_eval_steps on; report the best."""
    found = [(s, p) for s, p in checkpoints.list_checkpoints(FLAGS.model_dir) if s >= FLAGS.start_eval_steps]
    if not found:
        raise FileNotFoundError(f"No checkpoint at or after step {FLAGS.start_eval_steps} in {FLAGS.model_dir}.")
    results = {}
    for step, path in found:
        trainer.load_weights(path)
        results[step] = trainer.evaluate(progress=False)
    best = min(results, key=lambda s: results[s]["loss"])
    log(f"best checkpoint: step {best}, loss {results[best]['loss']:.4f}, ppl {results[best]['ppl']:.3f}, "
        f"bpc {results[best]['bpc']:.4f}")
    return {"checkpoints": results, "best_step": best}
