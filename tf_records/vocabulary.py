"""Vocabularies as in the original `vocabulary.py`, saved as plain JSON (no pickle)."""

import collections
import hashlib
import json

import numpy as np

from txl_io import files

LEVELS = ("word", "char", "byte")
FORMAT = "txl_keras.vocabulary.v1"


VOCAB_FILE = "vocab.json"  # a records folder's (and a run folder's) vocabulary

class Vocabulary:
    """Symbols <-> ids, with the original tokenisation rules.

    `level="word"`: a line is stripped, lower-cased if `lower_case`, split on
    whitespace, then wrapped `<S> ... <S>` if `add_double_eos` or followed by `<eos>`
    if `add_eos`. `level="char"`: a symbol per character (text8 turns spaces into
    `_` before: its `space_symbol`). `level="byte"`: a symbol per byte value, written as its decimal
    string like the original enwik8 files; newline bytes are not symbols.
    Unknown symbols map to `unk_symbol` when the vocabulary has one, else they are an
    error.
    """

    def __init__(self, symbols, level="word", lower_case=False, add_eos=False,
                 add_double_eos=False, unk_symbol=None, space_symbol=None):
        if level not in LEVELS:
            raise ValueError(f"Expected `level` in {LEVELS}. Received: {level!r}")
        self.symbols = list(symbols)
        self.level = level
        self.lower_case = lower_case
        self.add_eos = add_eos
        self.add_double_eos = add_double_eos
        self.unk_symbol = unk_symbol
        self.index = {s: i for i, s in enumerate(self.symbols)}
        if len(self.index) != len(self.symbols):
            raise ValueError("A vocabulary cannot hold the same symbol twice.")
        if unk_symbol is not None and unk_symbol not in self.index:
            raise ValueError(f"The unknown symbol {unk_symbol!r} is not in the vocabulary.")
        if space_symbol is not None and (level != "char" or space_symbol not in self.index):
            raise ValueError(f"A space symbol is a symbol of a char-level vocabulary. Received: {space_symbol!r}")
        self.space_symbol = space_symbol
        self.unk_id = self.index.get(unk_symbol) if unk_symbol is not None else None
        self._byte_table = None

    def __len__(self):
        return len(self.symbols)

    # -- tokenisation ------------------------------------------------------------------

    def tokenize(self, line):
        """The symbols of one line of text, with the eos rules applied."""
        line = line.strip()
        if self.lower_case:
            line = line.lower()
        symbols = list(line) if self.level == "char" else line.split()
        if self.add_double_eos:
            return ["<S>"] + symbols + ["<S>"]
        if self.add_eos:
            return symbols + ["<eos>"]
        return symbols

    def encode_lines(self, lines):
        """int32 ids of an iterable of lines (word/char level)."""
        ids = []
        for line in lines:
            ids.extend(self.lookup(symbol) for symbol in self.tokenize(line))
        return np.asarray(ids, np.int32)

    def lookup(self, symbol):
        idx = self.index.get(symbol)
        if idx is not None:
            return idx
        if self.unk_id is not None:
            return self.unk_id
        raise ValueError(
            f"Symbol {symbol!r} is not in the vocabulary and it has no unknown symbol; "
            "rebuild the vocabulary from data that includes it, or build it with an "
            "unknown symbol such as '<unk>'."
        )

    def encode_bytes(self, data):
        """int32 ids of raw bytes (byte level). Newline bytes are dropped when the
        vocabulary has no symbol for them (the enwik8 rule)."""
        if self._byte_table is None:
            table = np.full(256, -1, np.int64)
            for symbol, idx in self.index.items():
                if symbol.isdigit() and int(symbol) < 256:
                    table[int(symbol)] = idx
            self._byte_table = table
        raw = np.frombuffer(data, np.uint8)
        if self._byte_table[ord("\n")] < 0:
            raw = raw[raw != ord("\n")]
        ids = self._byte_table[raw]
        if (ids < 0).any():
            missing = sorted(set(raw[ids < 0].tolist()))[:10]
            if self.unk_id is None:
                raise ValueError(f"Bytes {missing} are not in the byte vocabulary.")
            ids = np.where(ids < 0, self.unk_id, ids)
        return ids.astype(np.int32)

    def encode_chars(self, text):
        """int32 ids of every character of a string, newlines included (char level)."""
        if self.lower_case:
            text = text.lower()
        if self.space_symbol is not None:
            text = text.replace(" ", self.space_symbol)
        points = np.frombuffer(text.encode("utf-32-le"), np.uint32)
        unique, inverse = np.unique(points, return_inverse=True)
        mapping = np.asarray([self.lookup(chr(u)) for u in unique], np.int32)
        return mapping[inverse].astype(np.int32)

    def encode_text(self, text):
        """ids of a string: its UTF-8 bytes, its characters, or its lines of words."""
        if self.level == "byte":
            return self.encode_bytes(text.encode("utf-8"))
        if self.level == "char":
            return self.encode_chars(text)
        return self.encode_lines(text.splitlines())

    def encode_prompt(self, text):
        """ids of a prompt to continue: like `encode_text`, without a closing `<eos>`."""
        if self.level == "word":
            symbols = (text.lower() if self.lower_case else text).split()
            return np.asarray([self.lookup(s) for s in symbols], np.int32)
        return self.encode_text(text)

    def decode(self, ids):
        """Text of ids: bytes decoded as UTF-8 at byte level, symbols joined otherwise."""
        symbols = [self.symbols[int(i)] for i in ids]
        if self.level == "byte":
            data = bytes(int(s) if s.isdigit() else ord("?") for s in symbols)
            return data.decode("utf-8", errors="replace")
        if self.level == "char":
            return "".join(symbols)
        return " ".join(symbols)

    # -- building and saving -----------------------------------------------------------

    @classmethod
    def from_counts(cls, counter, special=(), min_freq=0, max_size=None, **kwargs):
        """Specials first, then symbols by decreasing count (ties: first seen first),
        as the original `build_vocab`."""
        symbols = list(special)
        seen = set(symbols)
        for symbol, count in counter.most_common(max_size):
            if count < min_freq:
                break
            if symbol not in seen:
                symbols.append(symbol)
                seen.add(symbol)
        return cls(symbols, **kwargs)

    @classmethod
    def count_lines(cls, lines, counter=None, **kwargs):
        """Update (or start) a Counter with the symbols of lines, eos rules excluded as
        in the original `count_file` (add_eos=False)."""
        counter = counter if counter is not None else collections.Counter()
        probe = cls([], **{**kwargs, "add_eos": False, "add_double_eos": False, "unk_symbol": None})
        for line in lines:
            counter.update(probe.tokenize(line))
        return counter

    @staticmethod
    def count_bytes(chunks, keep_newline=False):
        """Counter of byte symbols (decimal strings) over byte chunks, in
        first-appearance order (so ties keep it); newline excluded unless kept."""
        return _count_units(
            (np.frombuffer(d, np.uint8) for d in chunks),
            lambda b: None if b == ord("\n") and not keep_newline else str(b),
        )

    @staticmethod
    def count_chars(texts, lower_case=False):
        """Counter of the characters of strings, in first-appearance order."""
        arrays = (
            np.frombuffer((t.lower() if lower_case else t).encode("utf-32-le"), np.uint32)
            for t in texts
        )
        return _count_units(arrays, chr)

    def to_dict(self):
        return {
            "format": FORMAT,
            "level": self.level,
            "lower_case": self.lower_case,
            "add_eos": self.add_eos,
            "add_double_eos": self.add_double_eos,
            "unk_symbol": self.unk_symbol,
            **({"space_symbol": self.space_symbol} if self.space_symbol is not None else {}),
            "symbols": self.symbols,
        }

    def save(self, path):
        files.atomic_write(path, json.dumps(self.to_dict(), ensure_ascii=False))

    @classmethod
    def load(cls, path):
        try:
            data = json.loads(files.read_text(path))
        except FileNotFoundError:
            raise FileNotFoundError(
                f"No vocabulary at {path}. Build the records first with `python -m tf_records`."
            ) from None
        except json.JSONDecodeError as e:
            raise ValueError(f"The vocabulary file {path} is corrupt ({e}); rebuild it.") from None
        if data.get("format") != FORMAT:
            raise ValueError(f"{path} is not a txl_keras vocabulary (format {data.get('format')!r}).")
        data.pop("format")
        if not isinstance(data.get("symbols"), list) or not data["symbols"]:
            raise ValueError(f"{path} holds no symbols; rebuild the vocabulary (python -m tf_records).")
        try:
            return cls(**data)
        except TypeError as e:
            raise ValueError(f"{path} is damaged ({e}); rebuild the vocabulary.") from None

    def fingerprint(self):
        """A digest of everything that decides what an id means (symbols and rules)."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:32]


def _count_units(arrays, to_symbol):
    counts, first, offset = collections.Counter(), {}, 0
    for units in arrays:
        values, index, count = np.unique(units, return_index=True, return_counts=True)
        for v, i, c in zip(values.tolist(), index.tolist(), count.tolist()):
            counts[v] += c
            first.setdefault(v, i + offset)
        offset += len(units)
    ordered = collections.Counter()
    for v in sorted(first, key=first.get):
        symbol = to_symbol(v)
        if symbol is not None:
            ordered[symbol] = counts[v]
    return ordered
