"""`python -m txl_keras.generate`: continue a text prompt with a trained model (or score a text).

    python -m txl_keras.generate --model_dir=runs/quickstart --prompt="def main(" \
        --max_new_tokens=200 --temperature=0.8 --top_k=40 --seed=1
    python -m txl_keras.generate --pretrained=transfo_xl_wt103 --prompt="The history of" --stop="<eos>"
    python -m txl_keras.generate --model_dir=runs/quickstart --score="def main(argv):"
"""


from absl import app, flags

from tf_records import files, program
from tf_records.vocabulary import Vocabulary
from txl_keras.generate import generate, score
from txl_keras.run_folder import VOCAB, load_trained_model, require_config

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "Training folder (config.json, vocab.json, checkpoints).")
flags.DEFINE_string("pretrained", None, "A released model (transfo_xl_wt103, transfo_xl_enwik8, transfo_xl_text8, "
                    "transfo_xl_lm1b: downloaded and converted on first use) or a folder in the release layout, "
                    "instead of --model_dir.")
flags.DEFINE_string("checkpoint", None, "Checkpoint folder (default: the newest).")
flags.DEFINE_string("vocab", None, "vocab.json (default: the one in --model_dir).")
flags.DEFINE_string("prompt", "", "Text to continue.")
flags.DEFINE_string("score", None, "Score this text instead of generating: its perplexity and bits per character.")
flags.DEFINE_integer("max_new_tokens", 200, "Tokens to generate (>= 0).", lower_bound=0)
flags.DEFINE_float("temperature", 1.0, "Sampling temperature (0: greedy).", lower_bound=0.0)
flags.DEFINE_integer("top_k", 0, "Keep only the k most likely tokens (0: all).", lower_bound=0)
flags.DEFINE_float("top_p", 1.0, "Nucleus sampling mass in (0, 1] (1: all tokens).", lower_bound=0.0,
                   upper_bound=1.0)
flags.DEFINE_integer("seed", 0, "Sampling seed, in [0, 2**31).", lower_bound=0, upper_bound=2**31 - 1)
flags.DEFINE_string("stop", None, "Stop symbol (e.g. <eos>); printing ends at it.")
flags.DEFINE_integer("mem_len", None, "Memory length (default: the config's).", lower_bound=0)
flags.DEFINE_integer("clamp_len", None, "clamp_len for generation (-1 or 0: no clamping).", lower_bound=-1)


def model_folder():
    if bool(FLAGS.model_dir) == bool(FLAGS.pretrained):
        raise app.UsageError("Give one of --model_dir and --pretrained.")
    if FLAGS.pretrained:
        from txl_keras import pretrained

        return pretrained.resolve(FLAGS.pretrained)
    return FLAGS.model_dir


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    folder = model_folder()
    config = require_config(folder)
    vocab_path = FLAGS.vocab or files.join(folder, VOCAB)
    vocab = Vocabulary.load(vocab_path)
    if len(vocab) != config.n_token:
        raise ValueError(f"The vocabulary {vocab_path} has {len(vocab)} symbols but the model has n_token="
                         f"{config.n_token}; pass the vocabulary its records were built with (--vocab).")
    if FLAGS.score is not None:
        return print_score(folder, vocab)
    stop = None
    if FLAGS.stop:
        if FLAGS.stop not in vocab.index:
            raise app.UsageError(f"--stop={FLAGS.stop!r} is not in the vocabulary; give one of its symbols.")
        stop = vocab.index[FLAGS.stop]
    ids = vocab.encode_prompt(FLAGS.prompt)
    if len(ids) == 0:
        raise app.UsageError("--prompt encodes to no token; give some text.")
    model = load_trained_model(folder, FLAGS.checkpoint)
    out = generate(model, ids[None], FLAGS.max_new_tokens, FLAGS.temperature, FLAGS.top_k, FLAGS.top_p,
                   FLAGS.seed, stop, FLAGS.mem_len, FLAGS.clamp_len)[0]
    new = list(out[len(ids):])
    if stop is not None and stop in new:
        new = new[: new.index(stop) + 1]  # print up to the stop symbol, once
    print(vocab.decode(list(ids) + new))


def print_score(folder, vocab):
    """The perplexity and bits per character of --score under the model."""
    from txl_keras.text import TextModel

    result = TextModel(load_trained_model(folder, FLAGS.checkpoint), vocab).score(FLAGS.score)
    print(f"{len(result.tokens)} tokens scored: perplexity {result.perplexity:.3f} | bits per character "
          f"{result.bits_per_character:.4f}")


if __name__ == "__main__":
    program.run(main)
