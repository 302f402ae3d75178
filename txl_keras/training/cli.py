"""The command line shared by train_gpu.py and train_tpu.py.

`define_flags()` (called by the two programs, never on import) defines the flags, each in
its --help group: the data and run flags below, one flag per `TrainConfig` field (its help,
and as default the value a bare command uses: the quickstart preset's where it sets one,
else the field's), and one override flag per model hyper-parameter. Flag names follow the
original `tf/train_gpu.py` and `tf/train.py`. `--config` is a run preset (`quickstart`, the
default: model, corpus and training settings), a model preset, or a config.json; flags
given on the command line override it, and without a run preset a flag not given takes
`TrainConfig`'s default. Unknown or misspelt flags are an error.

TensorFlow's modules (the trainer, evaluation, the records) are imported by the functions
that run the job, so that defining the flags and `--help` import no TensorFlow.
"""

import contextlib
import dataclasses
import json
import os
import sys

from absl import flags

from txl_io import files
from txl_io.program import define
from tf_records.build import VOCAB_FILE, build_records, default_records_dir, load_corpus_info
from tf_records.vocabulary import Vocabulary
from txl_keras import run_folder
from txl_keras.models import sizes
from txl_keras.models.config import PRESETS, TransformerXLConfig
from txl_keras.training import jax_route
from txl_keras.releases import RELEASES
from txl_keras.training.train_config import QUICKSTART, RUN_PRESETS, TrainConfig

FLAGS = flags.FLAGS
MODEL_FLAGS = [
    ("n_layer", "integer"), ("d_model", "integer"), ("d_embed", "integer"), ("n_head", "integer"),
    ("d_head", "integer"), ("d_inner", "integer"), ("dropout", "float"), ("dropatt", "float"),
    ("tgt_len", "integer"), ("mem_len", "integer"), ("clamp_len", "integer"), ("same_length", "bool"),
    ("div_val", "integer"), ("untie_r", "bool"), ("tie_weight", "bool"),
    ("proj_share_all_but_first", "bool"), ("proj_same_dim", "bool"), ("pre_lnorm", "bool"),
    ("attn_type", "integer"), ("init", "string"), ("init_std", "float"), ("proj_init_std", "float"),
    ("init_range", "float"), ("layer_norm_epsilon", "float"),
]
_KINDS = {int: "integer", float: "float", bool: "bool", str: "string"}


def define_flags():
    """Define every trainer flag (once per program), each in its --help group. A flag's
    default is what the bare command uses (the quickstart preset's value where it sets
    one; the help gives the value without a run preset)."""
    quickstart = RUN_PRESETS[QUICKSTART]
    _define_run_flags()
    _define_data_flags(quickstart)
    _define_distribution_flags()
    define("string", "eval_ckpt_path", None, "Evaluate this checkpoint (folder or .weights.h5).", "evaluation")
    define("integer", "start_eval_steps", 0, "--do_eval_only: skip checkpoints before this step.", "evaluation",
           lower_bound=0)
    for field in dataclasses.fields(TrainConfig):
        if field.name == "records_dir":
            continue  # --data_dir
        default, help = field.default, field.metadata["help"]
        if field.name in quickstart["train"]:
            default = quickstart["train"][field.name]
            help += f" (Without a run preset: {'required' if field.default is None else field.default}.)"
        choices = field.metadata.get("choices")
        define("enum" if choices else _KINDS[field.type], field.name, default, help, field.metadata["group"],
               **({"enum_values": list(choices)} if choices else {}))
    model = TransformerXLConfig.from_preset(quickstart["model"], cutoffs=[])
    for name, kind in MODEL_FLAGS:
        define(kind, name, None, f"Override the model preset's {name} (the bare command's "
               f"{quickstart['model']}: {getattr(model, name)}).", "model")


def _define_run_flags():
    """What the program does: the run preset, the starting weights, train and evaluate."""
    define("string", "config", QUICKSTART, f"Run preset ({', '.join(sorted(RUN_PRESETS))}), model preset "
           f"({', '.join(sorted(PRESETS))}) or the path of a config.json (e.g. one written by "
           "python -m txl_keras.convert).", "run")
    define("string", "pretrained", None, f"Evaluate a released model ({', '.join(RELEASES)}: downloaded and "
           "converted on first use) or a converted folder at its "
           "paper settings: --config, --model_dir and the checkpoint are its, --do_train=false, and by default "
           "--eval_split=test, --eval_batch_size=16 and --data_dir=data/<name> (python -m tf_records "
           "--pretrained=<name> builds them).", "run")
    define("string", "init_from", None, "Start training from the weights of a released model (transfo_xl_wt103, "
           "...: downloaded and converted on first use), a run folder, a converted folder or a folder saved by "
           "TransformerXLCausalLM.save_to_preset. The model is its (--dropout, --dropatt, --tgt_len, --mem_len, "
           "--clamp_len and --same_length may change; the architecture may not); the records must be encoded with "
           "its vocabulary, which is how the default records (data/<dataset>-<its name>) are built. Needs "
           "--model_dir; the run folder's init_from.json records it.", "run")
    define("bool", "do_train", True, "Train.", "run")
    define("bool", "do_eval", True, "Evaluate on --eval_split before and after training.", "run")
    define("bool", "do_eval_only", False, "Evaluate every checkpoint in --model_dir and report the best.", "run")
    define("bool", "check_memory", True, "Refuse a run whose training (or evaluation) cannot fit this machine's "
           "memory (estimated before the model is built; CPUs only).", "run")


def _define_data_flags(quickstart):
    """Where the records come from."""
    define("string", "data_dir", None, "Folder of the TFRecords, vocab.json and corpus-info.json "
           "(default data/<dataset>; built from --dataset when missing).", "data")
    define("string", "dataset", None, "Corpus to build records from when --data_dir is not given (see python -m "
           f"tf_records; default: the run preset's, {quickstart['dataset']} for the bare command, which needs no "
           "download).", "data")
    define("string", "text", None, "Your files: a file, a folder or a glob (--dataset=text, which --text alone "
           "implies).", "data")
    define("enum", "level", None, "--dataset=text/stdlib/tfds: token level of a new vocabulary (default byte; "
           "with --init_from, the model's).", "data", enum_values=["byte", "char", "word"])
    define("string", "corpus_info_path", None, "corpus-info.json (default: in --data_dir).", "data")


def _define_distribution_flags():
    """Hosts, replicas and processes: tf.distribute's and the JAX mesh's."""
    define("integer", "num_hosts", 1, "Hosts (input pipelines) the records were built for.", "distribution",
           lower_bound=1)
    define("integer", "num_core_per_host", None, "Replicas per host (default: all local devices).",
           "distribution", lower_bound=1)
    define("integer", "startup_timeout", 300, "Seconds to wait for all workers (JAX: processes) to join.",
           "distribution", lower_bound=1)
    define("string", "mesh", None, "JAX backend: the device mesh, 'batch:N' (N data-parallel replicas) or "
           "'batch:N,model:M' (each replica split over M devices by TransformerXLLM.get_layout_map); N x M must "
           "be every device of every process (default: batch:<all devices>).", "distribution")
    define("string", "coordinator_address", None, "JAX backend, several processes: HOST:PORT of process 0 (with "
           "--num_processes and --process_id; on a TPU pod the hosts find each other without them).",
           "distribution")
    define("integer", "num_processes", None, "JAX backend: how many processes take part (one per host).",
           "distribution", lower_bound=1)
    define("integer", "process_id", None, "JAX backend: this process's index, from 0.", "distribution",
           lower_bound=0)


def _given(name):
    return FLAGS[name].present


def run_preset():
    """The run preset of --config, or None (--init_from's and --pretrained's models are their own)."""
    return None if FLAGS.init_from or FLAGS.pretrained else RUN_PRESETS.get(FLAGS.config)


def train_config(data_dir, defaults=None):
    """TrainConfig: the flags given on the command line, over `defaults` (a released model's
    settings), over the run preset's settings (if any), over TrainConfig's defaults."""
    preset = run_preset()
    names = [f.name for f in dataclasses.fields(TrainConfig) if f.name != "records_dir"]
    given = {n: FLAGS[n].value for n in names if _given(n)}
    base = {**(preset["train"] if preset else {}), **(defaults or {})}
    return TrainConfig(**{**base, **given, "records_dir": data_dir})


# The model settings --init_from's model may change: none of them changes a weight's shape.
INIT_FROM_OVERRIDES = ("dropout", "dropatt", "tgt_len", "mem_len", "clamp_len", "same_length")
_RESOLVED = {}  # (flag, value) -> the Preset --init_from or --pretrained names, resolved once


def _resolved(flag, log=print):
    """The `txl_keras.presets.Preset` that --`flag` names (resolved, downloaded if needed,
    once per run), or None when the flag is not given."""
    value = FLAGS[flag].value
    if value and (flag, value) not in _RESOLVED:
        from txl_keras import presets

        _RESOLVED[(flag, value)] = presets.resolve(value, log=log)
    return _RESOLVED.get((flag, value))


def origin():
    """The `txl_keras.presets.Preset` of --init_from (resolved, downloaded if needed, once), or None."""
    found = _resolved("init_from")
    if found is None:
        return None
    lora = dict(found.model_options).get("lora_rank")
    if lora is not None:
        raise ValueError(f"--init_from={FLAGS.init_from} holds LoRA adapters (rank {lora}); the trainers start "
                         "from plain weights: fold them in first (lm = TransformerXLCausalLM.from_preset(...); "
                         "lm.model.merge_lora_weights(); lm.save_to_preset(new_folder)) and start from that "
                         "folder.")
    if dict(found.model_options).get("quantization") is not None:
        raise ValueError(f"--init_from={FLAGS.init_from} holds int8 weights, which do not train; start from "
                         "the float model it was quantized from.")
    return found


def pretrained(log=print):
    """The `txl_keras.presets.Preset` of --pretrained (resolved, downloaded if needed, once), or None."""
    return _resolved("pretrained", log)


def training():
    """Whether this run trains: --do_train, never with --pretrained (which evaluates)."""
    return FLAGS.do_train and not FLAGS.pretrained


def eval_weights():
    """The weights an evaluation-only run loads: --eval_ckpt_path, or --pretrained's newest."""
    return pretrained().weights if FLAGS.pretrained else FLAGS.eval_ckpt_path


def _model_source():
    """The flag that names the model, as a message quotes it."""
    for flag in ("init_from", "pretrained"):
        if FLAGS[flag].value:
            return f"--{flag}={FLAGS[flag].value}"
    return f"--config={FLAGS.config}"


def _model_base():
    """`(kind, value)`: ("json", dict of a config.json) or ("preset", model preset name)."""
    if FLAGS.init_from:
        return "json", origin().config.to_dict()
    if FLAGS.pretrained:
        return "json", pretrained().config.to_dict()
    if FLAGS.config.endswith(".json"):
        try:
            data = json.loads(files.read_text(FLAGS.config))
        except ValueError as e:
            raise ValueError(f"--config={FLAGS.config} is not a valid config.json: {e}") from None
        if isinstance(data, dict) and "class_name" in data:  # a saved preset's serialized model
            data = data.get("config", {}).get("config", data)
        return "json", data
    preset = run_preset()
    name = preset["model"] if preset else FLAGS.config
    if name not in PRESETS:
        raise ValueError(f"--config={FLAGS.config!r} is neither a run preset ({sorted(RUN_PRESETS)}), a model "
                         f"preset ({sorted(PRESETS)}) nor a .json file.")
    return "preset", name


def _model_overrides():
    return {n: FLAGS[n].value for n, _ in MODEL_FLAGS if FLAGS[n].value is not None}


def _config_from_json(base, overrides):
    try:
        return TransformerXLConfig.from_dict(base).replace(**overrides)
    except ValueError as e:
        raise ValueError(f"{_model_source()}: {e}") from None


def check_model_flags():
    """The model's settings against their domains before anything is built or written
    (the vocabulary and cutoffs come later, from the corpus)."""
    kind, base = _model_base()
    if kind == "json":
        _config_from_json(base, _model_overrides())
    else:
        TransformerXLConfig.from_preset(base, cutoffs=[], **_model_overrides())


def model_config(corpus_info):
    """The preset (or config.json) with the flags' overrides; a preset takes its
    vocabulary size and cutoffs from the corpus, a config.json must have its size."""
    overrides = _model_overrides()
    kind, base = _model_base()
    if kind == "json":
        config = _config_from_json(base, overrides)
        if config.n_token != corpus_info["vocab_size"]:
            raise ValueError(
                f"{_model_source()} has n_token={config.n_token} but the records have a vocabulary of "
                f"{corpus_info['vocab_size']}; build the records with the model's vocabulary "
                "(python -m tf_records --vocab=...)."
            )
        return config
    return TransformerXLConfig.from_preset(
        base, n_token=corpus_info["vocab_size"], cutoffs=corpus_info["cutoffs"][1:-1], **overrides)


def _dataset():
    """--dataset; "text" when only --text is given; else the run preset's corpus."""
    if FLAGS.text is not None and FLAGS.dataset not in (None, "text"):
        raise ValueError(f"--text reads your files, which is --dataset=text, not --dataset={FLAGS.dataset}; drop "
                         "one of the two.")
    preset = RUN_PRESETS.get(FLAGS.config)
    return FLAGS.dataset or ("text" if FLAGS.text is not None else None) or (preset["dataset"] if preset else "stdlib")


def default_data_dir():
    """data/<dataset>, or data/<dataset>-<model> for records in --init_from's vocabulary, or
    data/<release> for --pretrained (where `python -m tf_records --pretrained=<release>` builds)."""
    if FLAGS.pretrained:
        return os.path.join("data", os.path.basename(FLAGS.pretrained.rstrip("/")))
    folder = default_records_dir(_dataset())
    if FLAGS.init_from:
        name = os.path.basename(os.path.abspath(FLAGS.init_from)) if os.path.sep in FLAGS.init_from \
            else FLAGS.init_from
        folder += "-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return folder


def check_init_from():
    """--init_from's and --text's flags, before anything is resolved or written."""
    _dataset()  # --text with another --dataset is refused
    if not FLAGS.init_from:
        return
    for flag in ("pretrained", "warm_start_path"):
        if FLAGS[flag].value:
            raise ValueError(f"--init_from and --{flag} both name the weights to start from; give one.")
    if FLAGS["config"].present:
        raise ValueError(f"--init_from={FLAGS.init_from} brings its own model; drop --config={FLAGS.config}.")
    if not FLAGS["model_dir"].present:
        raise ValueError("--init_from needs --model_dir, the new run's folder.")
    changed = [n for n, _ in MODEL_FLAGS if FLAGS[n].value is not None and n not in INIT_FROM_OVERRIDES]
    if changed:
        raise ValueError(f"--{changed[0]} would change the architecture of --init_from's model; only "
                         f"{', '.join('--' + n for n in INIT_FROM_OVERRIDES)} may change.")


def check_vocabulary(records_dir, model_dir=None):
    """The run folder's vocabulary, and --init_from's, must be the records' (the ids mean its symbols)."""
    _check_run_vocabulary(records_dir, model_dir)
    found = origin()
    if found is None:
        return
    mine = found.load_vocabulary()
    path = files.join(records_dir, VOCAB_FILE)
    theirs = Vocabulary.load(path) if files.exists(path) else None
    if theirs is None or theirs.to_dict() != mine.to_dict():
        what = "no vocab.json" if theirs is None else f"another vocabulary ({len(theirs)} {theirs.level} symbols)"
        raise ValueError(f"The records in {records_dir} have {what}, but --init_from={FLAGS.init_from} reads "
                         f"{len(mine)} {mine.level} symbols: build them with its vocabulary (python -m tf_records "
                         f"--vocab={found.vocabulary} ...), or leave --data_dir out to build them.")


def _check_run_vocabulary(records_dir, model_dir):
    records_path = files.join(records_dir, VOCAB_FILE)
    run_path = files.join(model_dir, VOCAB_FILE) if model_dir else None
    if not run_path or not files.exists(run_path) or not files.exists(records_path):
        return
    theirs, mine = Vocabulary.load(records_path), Vocabulary.load(run_path)
    if theirs.fingerprint() != mine.fingerprint():
        raise ValueError(f"The run folder {model_dir} was trained with another vocabulary ({run_path}, fingerprint "
                         f"{mine.fingerprint()}) than the records in {records_dir} are encoded with (fingerprint "
                         f"{theirs.fingerprint()}): their ids mean other symbols. Use the records of the run's "
                         "vocabulary (python -m tf_records --vocab=" + run_path + " ...) or another --model_dir.")


def prepare_data(tc, num_core_per_host, log):
    """Build the default corpus's records into the default folder if they are missing."""
    from tf_records.records import record_info_path

    data_dir = tc.records_dir
    kind, base = _model_base()
    tgt_len = FLAGS.tgt_len or (base["tgt_len"] if kind == "json" else PRESETS[base]["tgt_len"])
    eval_tgt_len = tc.eval_tgt_len or tgt_len
    needed = [("train", tc.train_batch_size, tgt_len), (tc.eval_split, tc.eval_batch_size, eval_tgt_len)]
    missing = [s for s, b, t in needed if not files.exists(record_info_path(data_dir, s, b, t, FLAGS.num_hosts))]
    if missing and FLAGS.data_dir is None and not FLAGS.pretrained:
        log(f"building the {_dataset()} records in {data_dir} (no download)")
        options = {"text": FLAGS.text} if FLAGS.text else {}
        if FLAGS.level:
            options["level"] = FLAGS.level
        if origin() is not None:
            options["vocab"] = origin().load_vocabulary()
        for split, batch, length in needed:
            if split in missing:
                build_records(_dataset(), data_dir, splits=[split], tgt_len=length,
                              per_host_train_bsz=batch, per_host_valid_bsz=batch,
                              num_hosts=FLAGS.num_hosts, num_core_per_host=num_core_per_host, log=log, **options)


def run(strategy, num_hosts=1, is_chief=True, log=print, compiled=None):
    """Train and/or evaluate under `strategy`, as the flags say. Returns the eval results.

    `strategy` None: the JAX backend, under the `keras.distribution` of `--mesh`
    (`jax_route`). `compiled=True` (train_tpu.py) compiles every step with XLA whatever
    --xla says (on JAX every step is)."""
    if FLAGS.num_hosts != num_hosts:
        raise ValueError(f"--num_hosts={FLAGS.num_hosts}, but this run has {num_hosts} host(s) (on GPUs and CPUs the "
                         "workers TF_CONFIG's cluster lists; on TPUs the pod's hosts): give the cluster, or "
                         f"--num_hosts={num_hosts}.")
    _RESOLVED.clear()  # each run resolves its presets afresh (a program may run several)
    check_init_from()
    defaults = pretrained_settings(log) if FLAGS.pretrained else None
    if FLAGS.init_from:
        defaults = {"warm_start_path": origin().weights}
    tc = train_config(FLAGS.data_dir or default_data_dir(), defaults)
    check_paths(tc)
    check_model_flags()
    check_run_folder(tc)
    on_jax = strategy is None
    if on_jax:
        compiled = True
    cores = (jax_route.replicas(FLAGS) if on_jax else strategy.num_replicas_in_sync) // num_hosts
    if is_chief:  # only the chief builds missing default records; other workers read them
        prepare_data(tc, cores, log)
    corpus_info = load_corpus_info(files.dirname(FLAGS.corpus_info_path) if FLAGS.corpus_info_path
                                   else tc.records_dir)
    check_vocabulary(tc.records_dir, tc.model_dir)
    config = model_config(corpus_info)
    if FLAGS.check_memory:
        check_memory(config, tc, cores, compiled)
    trainer = make_trainer(strategy, config, tc, num_hosts, is_chief, log, compiled)
    if FLAGS.do_eval_only:
        return evaluate_checkpoints(trainer, log)
    if not training():  # evaluation never writes into the run folder
        return evaluate(trainer, tc, log)
    trainer.train_records()  # records of another layout: refused before the run folder is written
    # (Every JAX process writes through process 0: it alone holds the folder.)
    with run_folder.lock(trainer.worker_dir()) if trainer.writes_checkpoints else contextlib.nullcontext():
        if is_chief:
            run_folder.claim(tc.model_dir, config)
            copy_vocabulary(tc)
            record_origin(tc)
        results = train(trainer, tc, log)
        if is_chief:
            files.atomic_write(files.join(tc.model_dir, "eval_results.json"), json.dumps(results, indent=2))
    return results


def make_trainer(strategy, config, tc, num_hosts, is_chief, log, compiled):
    """The TensorFlow `Trainer` under `strategy`, or on JAX (`strategy` None) the `JaxTrainer`."""
    if strategy is None:
        from txl_keras.training.jax_trainer import JaxTrainer

        return JaxTrainer(jax_route.make_distribution(FLAGS, config), config, tc, num_hosts=num_hosts,
                          is_chief=is_chief, log=log)
    from txl_keras.training.trainer import Trainer

    return Trainer(strategy, config, tc, num_hosts=num_hosts, is_chief=is_chief, log=log, compiled=compiled)


def check_run_folder(tc):
    """Before any record is built: an existing run folder must hold the model the flags
    describe (with the vocabulary size and cutoffs it has, which come from the records)."""
    existing = run_folder.read_config(tc.model_dir) if training() and not FLAGS.do_eval_only else None
    if existing is None:
        return
    kind, base = _model_base()
    if kind == "json":
        planned = _config_from_json(base, _model_overrides())
    else:
        planned = TransformerXLConfig.from_preset(base, n_token=existing.n_token, cutoffs=existing.cutoffs,
                                                  **_model_overrides())
    run_folder.check_claim(tc.model_dir, planned)


def record_origin(tc):
    """init_from.json: the model a fresh --init_from run started from."""
    found = origin()
    path = files.join(tc.model_dir, run_folder.ORIGIN)
    if found is None or files.exists(path):
        return
    files.atomic_write(path, json.dumps({"init_from": FLAGS.init_from, "kind": found.kind, "folder": found.folder,
                                         "weights": found.weights}, indent=2))


def pretrained_settings(log):
    """--pretrained: evaluate that model (its newest weights, at the settings of its
    config.json: the paper's). Returns the TrainConfig settings it implies (flags given on
    the command line win)."""
    if FLAGS["do_train"].present and FLAGS.do_train:
        raise ValueError("--pretrained evaluates a released model; it does not train (use --init_from to "
                         "start training from its weights).")
    for flag in ("config", "eval_ckpt_path"):
        if FLAGS[flag].present:
            raise ValueError(f"--pretrained={FLAGS.pretrained} brings its own model and weights; drop "
                             f"--{flag}={FLAGS[flag].value}.")
    return {"model_dir": pretrained(log).folder, "eval_split": "test", "eval_batch_size": 16}


def check_paths(tc):
    """The run folder, the records and the weights the flags name, before anything runs."""
    if tc.model_dir is None or not str(tc.model_dir).strip():
        raise ValueError("--model_dir is required (the run folder) unless --config is a run preset, and it must "
                         f"not be empty. Received: --model_dir={tc.model_dir!r}")
    for path in (tc.model_dir, tc.records_dir):
        files.check_access(path)
    for flag, path in (("warm_start_path", tc.warm_start_path), ("eval_ckpt_path", eval_weights())):
        if path and not files.exists(run_folder.weights_path(path)):
            raise ValueError(f"--{flag}={path}: no weights there; give a checkpoint folder (ckpt-NNNNNNNN) "
                             "or a .weights.h5 file.")


def check_memory(config, tc, cores, compiled):
    """Refuse, with the figures, a run whose training (or evaluation only) cannot fit this
    machine's memory (on CPUs; accelerators hold their own)."""
    import tensorflow as tf

    from txl_keras.training.evaluation import SCORE_TOKENS

    if compiled or tf.config.list_logical_devices("GPU"):
        return
    if not (training() and not FLAGS.do_eval_only):
        if FLAGS.do_eval or FLAGS.do_eval_only:
            settings = config.with_memory(tc.eval_mem_len, tc.eval_clamp_len, tc.eval_same_length)
            tgt_len = tc.eval_tgt_len or config.tgt_len
            needed = sizes.inference_bytes(settings, tc.eval_batch_size, segment_length=tgt_len,
                                           scored_tokens=max(SCORE_TOKENS, tc.eval_batch_size * tgt_len),
                                           compiled=tc.eval_xla)
            sizes.require_memory(needed, f"Evaluating {tc.eval_batch_size} streams at mem_len={settings.mem_len}")
        return
    needed, available = sizes.training_bytes(config, tc.train_batch_size // cores, cores), sizes.available_bytes()
    if available is not None and needed > available:
        raise ValueError(
            f"This run needs at least {needed / 1e9:,.1f} GB of memory to train ({sizes.parameter_count(config):,} "
            f"parameters, their gradients and Adam's moments, and the activations of {tc.train_batch_size} "
            f"streams of {config.tgt_len} tokens) but {available / 1e9:,.1f} GB are available; make the model or "
            "the batch smaller (or pass --check_memory=false to try anyway).")


def copy_vocabulary(tc):
    """The records' vocabulary into the run folder, where generation and export find it."""
    source, target = files.join(tc.records_dir, VOCAB_FILE), files.join(tc.model_dir, VOCAB_FILE)
    if files.exists(source) and not files.exists(target):
        files.atomic_write(target, files.read_bytes(source))


def train(trainer, tc, log):
    """Train (evaluating before, if the run starts afresh, and after); the results."""
    from txl_keras.training.loop import NonFiniteLossError

    results = {}
    if FLAGS.do_eval and not run_folder.latest_checkpoint(tc.model_dir)[1]:
        trainer.restore_or_warm_start()  # a warm start is evaluated before it trains
        results["before"] = trainer.evaluate(progress=False)
    try:
        trainer.train()
    except NonFiniteLossError as e:
        log(str(e))
        sys.exit(2)
    if FLAGS.do_eval:
        step = trainer.current_step
        if trainer.last_eval and trainer.last_eval[0] == step:
            results["after"] = trainer.last_eval[1]  # --eval_steps just evaluated this step
        else:
            results["after"] = trainer.evaluate()
        if "before" in results:
            b, a = results["before"], results["after"]
            bpc = "" if trainer.word_level else f"bpc {b['bpc']:.3f} -> {a['bpc']:.3f}, "
            log(f"validation {bpc}ppl {b['ppl']:.2f} -> {a['ppl']:.2f}")
    best = run_folder.read_best(tc.model_dir) if tc.eval_steps else None
    if best:
        results["best"] = best
        log(f"best validation loss {best['loss']:.4f} (ppl {best.get('ppl', float('nan')):.3f}, bpc "
            f"{best.get('bpc', float('nan')):.4f}) at step {best['step']}: {files.join(tc.model_dir, best['weights'])}")
    return results


def evaluate(trainer, tc, log):
    """Evaluate a checkpoint (--eval_ckpt_path, else the newest) without writing anything."""
    weights = eval_weights()
    if weights:
        trainer.load_weights(weights)
    elif not trainer.restore_or_warm_start():
        raise ValueError(f"--do_train=false but there is no checkpoint in {tc.model_dir} and no "
                         "--eval_ckpt_path: nothing to evaluate.")
    return {"after": trainer.evaluate(summaries=False)} if FLAGS.do_eval else {}


def evaluate_checkpoints(trainer, log):
    """Evaluate every saved checkpoint from --start_eval_steps on; report the best."""
    model_dir = trainer.tc.model_dir
    found = [(s, p) for s, p in run_folder.list_checkpoints(model_dir) if s >= FLAGS.start_eval_steps]
    if not found:
        raise FileNotFoundError(f"No checkpoint at or after step {FLAGS.start_eval_steps} in {model_dir}.")
    results = {}
    for step, path in found:
        trainer.load_weights(path)
        results[step] = trainer.evaluate(progress=False, summaries=False)
    best = min(results, key=lambda s: results[s]["loss"])
    log(f"best checkpoint: step {best}, loss {results[best]['loss']:.4f}, ppl {results[best]['ppl']:.3f}, "
        f"bpc {results[best]['bpc']:.4f}")
    return {"checkpoints": results, "best_step": best}
