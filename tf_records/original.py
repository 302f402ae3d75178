"""Files of the original implementation that are data: its `cache.pkl` vocabulary, read
without running pickled code."""

import io
import pickle

from txl_io import files
from tf_records.vocabulary import Vocabulary


class ConversionError(ValueError):
    """Original weights or files that cannot be converted; the message says why."""


class _Plain:
    """Stand-in for every class a cache.pkl names: it only records data."""

    def __init__(self, *args, **kwargs):
        self.args, self.state, self.items = args, {}, {}

    def __setstate__(self, state):
        self.state = state if isinstance(state, dict) else {"state": state}

    def __setitem__(self, key, value):
        self.items[key] = value

    def append(self, value):
        self.items[len(self.items)] = value

    def extend(self, values):
        for value in values:
            self.append(value)


_ALLOWED = {
    ("vocabulary", "Vocab"), ("utils.vocabulary", "Vocab"), ("data_utils", "Corpus"),
    ("collections", "Counter"), ("collections", "OrderedDict"), ("collections", "defaultdict"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"), ("numpy", "dtype"), ("copy_reg", "_reconstructor"), ("copyreg", "_reconstructor"),
    ("__builtin__", "object"), ("builtins", "object"), ("_codecs", "encode"),
}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in _ALLOWED or name in ("Vocab", "Corpus"):
            return _Plain
        raise pickle.UnpicklingError(
            f"cache.pkl refers to {module}.{name}, which a vocabulary never needs; refusing to load it."
        )


def load_cache_vocab(path):
    """`(Vocabulary, dataset)` of an original `cache.pkl` (or HF `vocab.pkl`), read as data only."""
    with io.BytesIO(files.read_bytes(path)) as f:
        try:
            obj = _RestrictedUnpickler(f, encoding="latin1").load()
        except (pickle.UnpicklingError, EOFError) as e:
            raise ConversionError(f"Cannot read the vocabulary in {path}: {e}") from None
    state = obj.state if isinstance(obj, _Plain) else obj
    if not isinstance(state, dict):
        raise ConversionError(f"{path} holds a {type(state).__name__}, not the original Corpus or Vocab.")
    dataset = state.get("dataset")
    vocab = state.get("vocab", obj)
    vstate = vocab.state if isinstance(vocab, _Plain) else vocab
    symbols = vstate.get("idx2sym") if isinstance(vstate, dict) else None
    if not isinstance(symbols, list) or not all(isinstance(s, str) for s in symbols):
        raise ConversionError(f"{path} holds no idx2sym list of symbols.")
    unk_idx = vstate.get("unk_idx")
    if isinstance(unk_idx, int) and not 0 <= unk_idx < len(symbols):
        raise ConversionError(f"{path} names the unknown symbol by id {unk_idx}, outside its {len(symbols)} symbols.")
    unk = symbols[unk_idx] if isinstance(unk_idx, int) else None
    if dataset == "enwik8":
        return Vocabulary(symbols, level="byte", lower_case=True), dataset
    if dataset == "text8":
        return Vocabulary(symbols, level="char", lower_case=True,
                          space_symbol="_" if "_" in symbols else None), dataset
    return Vocabulary(symbols, lower_case=bool(vstate.get("lower_case", False)),
                      add_eos=dataset != "lm1b", add_double_eos=dataset == "lm1b", unk_symbol=unk), dataset
