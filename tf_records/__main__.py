r"""`python -m tf_records`: build vocabulary, corpus info and TFRecords for a corpus.

Flags mirror the original `data_utils.py`. Examples:
    python -m tf_records                                    # the default: stdlib sources
    python -m tf_records --dataset=enwik8 --data_dir=raw/enwik8 --tgt_len=512 \
        --per_host_train_bsz=24 --num_core_per_host=4
    python -m tf_records --dataset=text --text='notes/**/*.md' --level=word
    python -m tf_records --dataset=tfds:tiny_shakespeare --level=char
    python -m tf_records --pretrained=transfo_xl_wt103 --data_dir=raw/wt103   # a released model's test records
"""

from txl_io import startup

startup.start_program()  # first: the BFC CPU allocator, TensorFlow imported without its start-up notices

import codecs
import os

from absl import app, flags

from txl_io import program
from tf_records.build import build_records
from tf_records.corpora import LOADERS, LOCAL_SPLIT_RULE
from txl_keras.releases import RELEASES, release_vocabulary

FLAGS = flags.FLAGS
flags.DEFINE_string("dataset", "stdlib", f"{', '.join(LOADERS)} or tfds:NAME.")
flags.DEFINE_string("data_dir", None, "Folder of the raw corpus files (as getdata.sh leaves them).")
flags.DEFINE_string("records_dir", None, "Output folder (default data/<dataset>).")
flags.DEFINE_list("splits", ["train", "valid", "test"], "Splits to build.")
flags.DEFINE_integer("per_host_train_bsz", 60, "Training streams per host.", lower_bound=1)
flags.DEFINE_integer("per_host_valid_bsz", 60, "Validation streams per host.", lower_bound=1)
flags.DEFINE_integer("per_host_test_bsz", 0, "Test streams per host (0: as validation).", lower_bound=0)
flags.DEFINE_integer("tgt_len", 70, "Tokens per segment.", lower_bound=1)
flags.DEFINE_integer("num_hosts", 1, "Hosts (workers) that will read the records.", lower_bound=1)
flags.DEFINE_integer("num_core_per_host", 1, "Replicas per host; must divide the per-host batches.",
                     lower_bound=1)
flags.DEFINE_integer("num_passes", 1, "Rotated copies of the training data (the original TPU data used 10).",
                     lower_bound=1)
flags.DEFINE_integer("num_shuffle", 4, "lm1b: shuffles of each training shard.", lower_bound=1)
flags.DEFINE_bool("download", False, "Fetch the raw corpus first (needs the network).")
flags.DEFINE_string("text", None, f"Your files: a file, folder or glob (--dataset=text, which --text alone "
                    f"implies). Split rule: {LOCAL_SPLIT_RULE}.")
flags.DEFINE_enum("level", None, ["byte", "char", "word"], "Token level of text/stdlib/tfds corpora.")
flags.DEFINE_bool("lower_case", False, "Lower-case text/tfds corpora.")
flags.DEFINE_integer("min_freq", 1, "Word level: rarer words become <unk>.", lower_bound=1)
flags.DEFINE_integer("max_bytes", None, "text/stdlib: read at most this many characters.", lower_bound=1)
flags.DEFINE_string("tfds_data_dir", None, "tfds:NAME: where the dataset is prepared.")
flags.DEFINE_string("vocab", None, "Encode with this vocab.json (e.g. of converted pretrained weights) "
                    "instead of counting one (every dataset; its level is the vocabulary's).")
flags.DEFINE_string("pretrained", None, f"A released model ({', '.join(RELEASES)}) or a run folder: encode with its "
                    "vocabulary (a released one's is downloaded "
                    "if needed). For a released model the defaults become its corpus (--dataset), the test "
                    "split at the paper's evaluation settings (--tgt_len, --per_host_valid_bsz=16) and "
                    "--records_dir=data/<name>, where train_gpu.py --pretrained looks.")
flags.DEFINE_string("encoding", "utf-8", "text: the files' encoding at char and word level (decoded strictly; "
                    "byte level reads raw bytes).")


def pretrained_defaults():
    """The vocabulary of --pretrained, and its release's defaults for the flags not given."""
    from tf_records.vocabulary import VOCAB_FILE, Vocabulary

    name = FLAGS.pretrained
    if name not in RELEASES:
        return Vocabulary.load(os.path.join(name, VOCAB_FILE))
    release = RELEASES[name]
    defaults = {"dataset": release.dataset, "tgt_len": release.tgt_len, "splits": ["test"],
                "per_host_valid_bsz": 16, "records_dir": os.path.join("data", name)}
    for flag, value in defaults.items():
        if not FLAGS[flag].present:
            FLAGS[flag].value = value
    return release_vocabulary(name)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if FLAGS.text is not None:
        if not FLAGS["dataset"].present:
            FLAGS.dataset = "text"
        elif FLAGS.dataset != "text":
            raise app.UsageError(f"--text reads your files, which is --dataset=text, not --dataset={FLAGS.dataset}; "
                                 "drop one of the two.")
    if FLAGS.pretrained and FLAGS.vocab:
        raise app.UsageError("Give --pretrained or --vocab, not both (--pretrained encodes with its vocabulary).")
    given_vocab = pretrained_defaults() if FLAGS.pretrained else None
    try:
        codecs.lookup(FLAGS.encoding)
    except LookupError:
        raise app.UsageError(f"--encoding={FLAGS.encoding!r} is not an encoding Python knows (e.g. utf-8, "
                             "latin-1, cp1252).") from None
    options = {}
    if FLAGS.dataset in ("text", "stdlib") or FLAGS.dataset.startswith("tfds:"):
        options.update(lower_case=FLAGS.lower_case, min_freq=FLAGS.min_freq)
        if FLAGS.level:
            options["level"] = FLAGS.level
        if FLAGS.max_bytes:
            options["max_bytes"] = FLAGS.max_bytes
    if FLAGS.dataset == "text":
        options.update(text=FLAGS.text, encoding=FLAGS.encoding)
    if FLAGS.dataset.startswith("tfds:"):
        options.update(tfds_data_dir=FLAGS.tfds_data_dir, download=FLAGS.download)
    if FLAGS.dataset == "lm1b":
        options["num_shuffle"] = FLAGS.num_shuffle
    if FLAGS.vocab:
        from tf_records.vocabulary import Vocabulary

        given_vocab = Vocabulary.load(FLAGS.vocab)
    if given_vocab is not None:
        options["vocab"] = given_vocab
    build_records(
        FLAGS.dataset,
        records_dir=FLAGS.records_dir,
        data_dir=FLAGS.data_dir,
        splits=FLAGS.splits,
        per_host_train_bsz=FLAGS.per_host_train_bsz,
        per_host_valid_bsz=FLAGS.per_host_valid_bsz,
        per_host_test_bsz=FLAGS.per_host_test_bsz,
        tgt_len=FLAGS.tgt_len,
        num_hosts=FLAGS.num_hosts,
        num_core_per_host=FLAGS.num_core_per_host,
        num_passes=FLAGS.num_passes,
        do_download=FLAGS.download and not FLAGS.dataset.startswith("tfds:"),
        **options,
    )


if __name__ == "__main__":
    program.run(main)
