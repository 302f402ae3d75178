"""`python -m txl_keras.generate`: continue a text prompt with a trained model (or score a text).

    python -m txl_keras.generate --model_dir=runs/quickstart --prompt="def main(" \
        --max_new_tokens=200 --temperature=0.8 --top_k=40 --seed=1
    python -m txl_keras.generate --pretrained=transfo_xl_wt103 --prompt="The history of" --stop="<eos>"
    python -m txl_keras.generate --model_dir=runs/quickstart --prompt="def main(" --stop="\n" --num_beams=4
    python -m txl_keras.generate --model_dir=runs/quickstart --score="def main(argv):"

The text is printed as it is generated (beam search prints it at the end). `--stop` (any
number of times) is a symbol of the vocabulary or a text of one token, with Python's
escapes (`--stop="\n"`).
"""


from absl import app, flags

from txl_io import program
from tf_records.vocabulary import Vocabulary
from txl_keras import presets
from txl_keras.models import TransformerXLLM, sizes
from txl_keras.run_folder import load_weights
from txl_keras.samplers import BeamSampler, sampler_from
from txl_keras.tasks import TransformerXLCausalLM, TransformerXLCausalLMPreprocessor
from txl_keras.tokenizers import TransformerXLTokenizer

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "Training folder (config.json, vocab.json, checkpoints) or a folder saved "
                    "by TransformerXLCausalLM.save_to_preset.")
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
flags.DEFINE_integer("num_beams", 1, "Beam search with this many beams (1: sample as the flags above say).",
                     lower_bound=1)
flags.DEFINE_float("length_penalty", 1.0, "Beam search: beams ranked by log-likelihood / new_tokens ** this.",
                   lower_bound=0.0)
flags.DEFINE_multi_string("stop", [], "Stop token: a symbol of the vocabulary (e.g. <eos>) or a text of one token, "
                          "escapes decoded (e.g. \\n); printing ends at it. Repeat the flag for several.")
flags.DEFINE_integer("mem_len", None, "Memory length (default: the config's).", lower_bound=0)
flags.DEFINE_integer("clamp_len", None, "clamp_len for generation (-1 or 0: no clamping).", lower_bound=-1)
flags.DEFINE_bool("check_memory", True, "Refuse a run whose memory (the weights, --mem_len, the beams) cannot fit "
                  "this machine's (estimated before the model is built).")


def model_preset():
    """The `txl_keras.presets.Preset` of --model_dir or --pretrained."""
    if bool(FLAGS.model_dir) == bool(FLAGS.pretrained):
        raise app.UsageError("Give one of --model_dir and --pretrained.")
    return presets.resolve(FLAGS.pretrained or FLAGS.model_dir)


def load_model(found):
    """The model of --checkpoint, else the preset's newest weights, with --mem_len and --clamp_len."""
    overrides = {k: v for k, v in (("mem_len", FLAGS.mem_len), ("clamp_len", FLAGS.clamp_len)) if v is not None}
    config = found.config.replace(**overrides)
    if FLAGS.check_memory:
        what = "Scoring" if FLAGS.score is not None else f"Generating with {FLAGS.num_beams} beam(s)"
        needed = sizes.inference_bytes(config, 1) if FLAGS.score is not None else sizes.inference_bytes(
            config, FLAGS.num_beams, scored_tokens=FLAGS.num_beams, beam_search=FLAGS.num_beams > 1)
        sizes.require_memory(needed, f"{what} at mem_len={config.mem_len}")
    model = TransformerXLLM(config)
    load_weights(model, FLAGS.checkpoint or found.weights)
    return model


def stop_ids(tokenizer):
    """The ids of --stop: symbols, or texts of one token (escapes decoded)."""
    ids = []
    for value in FLAGS.stop:
        text = value.encode("latin-1", "backslashreplace").decode("unicode_escape")
        if text in tokenizer.vocabulary.index:
            ids.append(tokenizer.token_to_id(text))
            continue
        try:
            tokens = tokenizer.tokenize_prompt(text).numpy().tolist()
        except ValueError:
            tokens = []
        unknown = tokenizer.vocabulary.unk_id
        if len(tokens) != 1 or (unknown is not None and tokens[0] == unknown):
            raise app.UsageError(f"--stop={value!r} is not in the vocabulary; give one of its symbols or a text of "
                                 "one token.")
        ids.append(tokens[0])
    return ids


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    found = model_preset()
    vocab = Vocabulary.load(FLAGS.vocab) if FLAGS.vocab else found.load_vocabulary()
    if len(vocab) != found.config.n_token:
        raise ValueError(f"The vocabulary {FLAGS.vocab or found.vocabulary} has {len(vocab)} symbols but the model "
                         f"has n_token={found.config.n_token}; pass the vocabulary its records were built with "
                         "(--vocab).")
    tokenizer = TransformerXLTokenizer(vocab)
    if FLAGS.score is not None:
        return print_score(found, tokenizer)
    stops = stop_ids(tokenizer)
    if len(tokenizer.tokenize_prompt(FLAGS.prompt).numpy()) == 0:
        raise app.UsageError("--prompt encodes to no token; give some text.")
    sampler = BeamSampler(FLAGS.num_beams, FLAGS.length_penalty) if FLAGS.num_beams > 1 else \
        sampler_from(FLAGS.temperature, FLAGS.top_k, FLAGS.top_p, FLAGS.seed)
    model = load_model(found)
    lm = TransformerXLCausalLM(model, TransformerXLCausalLMPreprocessor(tokenizer, model.config.tgt_len))
    options = dict(max_new_tokens=FLAGS.max_new_tokens, stop_token_ids=stops, sampler=sampler)
    if isinstance(sampler, BeamSampler):
        print(lm.generate(FLAGS.prompt, **options))
        return
    print(tokenizer.detokenize(tokenizer.tokenize_prompt(FLAGS.prompt)), end="", flush=True)
    for piece in lm.stream(FLAGS.prompt, **options):
        print(piece, end="", flush=True)
    print()


def print_score(found, tokenizer):
    """The perplexity and bits per character of --score under the model."""
    model = load_model(found)
    lm = TransformerXLCausalLM(model, TransformerXLCausalLMPreprocessor(tokenizer, model.config.tgt_len))
    result = lm.score(FLAGS.score)
    print(f"{len(result.tokens)} tokens scored: perplexity {result.perplexity:.3f} | bits per character "
          f"{result.bits_per_character:.4f}")


if __name__ == "__main__":
    program.run(main)
