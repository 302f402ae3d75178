"""`TransformerXLConfig`: every hyper-parameter of the original, validated, and presets."""

import dataclasses
import json
import math

from txl_keras.layers.adaptive_clusters import check_cutoffs

ATTN_TYPES = {
    0: "relative (Dai et al., the paper)",
    1: "learnable relative (Shaw et al.)",
    2: "absolute sinusoid (Vaswani et al.; vanilla Transformer with mem_len=0)",
    3: "learnable absolute per layer (Al-Rfou et al.)",
}


@dataclasses.dataclass
class TransformerXLConfig:
    """Hyper-parameters of a Transformer-XL, named as in the original code.

    Beyond the original flags, three fields select the behaviour of one of the two
    original implementations where they differ (needed to reproduce converted weights):
    `mem_init` ("empty": a stream's first segment has no memory; "zeros": the TF code's
    `mem_len` zero vectors that are attended), `same_length_convention` ("tf": each
    query sees `mem_len + 1` keys; "pytorch": `mem_len`), `cluster_order` ("tf" or
    "pytorch" placement of the tail-cluster logits in the adaptive softmax head).

    `d_embed=None` means `d_model`. `tie_projs=None` derives the projection tying from
    `proj_share_all_but_first` as the original scripts do.
    """

    n_token: int = 204
    n_layer: int = 12
    d_model: int = 512
    d_embed: int = None
    n_head: int = 8
    d_head: int = 64
    d_inner: int = 2048
    dropout: float = 0.1
    dropatt: float = 0.0
    tgt_len: int = 128
    mem_len: int = 128
    ext_len: int = 0
    clamp_len: int = -1
    same_length: bool = False
    cutoffs: list = dataclasses.field(default_factory=list)
    div_val: int = 1
    untie_r: bool = False
    tie_weight: bool = True
    tie_projs: list = None
    proj_share_all_but_first: bool = False
    proj_same_dim: bool = True
    pre_lnorm: bool = False
    attn_type: int = 0
    init: str = "normal"
    init_std: float = 0.02
    proj_init_std: float = 0.01
    init_range: float = 0.1
    layer_norm_epsilon: float = 1e-5
    mem_init: str = "empty"
    same_length_convention: str = "tf"
    cluster_order: str = "tf"

    def __post_init__(self):
        if self.d_embed is None:
            self.d_embed = self.d_model
        self._check_types()
        self.cutoffs = list(self.cutoffs)
        if self.tie_projs is not None:
            self.tie_projs = list(self.tie_projs)
        self.validate()

    def _check_types(self):
        """Every field has its type: no string "false" counted as True, no 2.5 truncated to 2."""
        def is_int(v):
            return isinstance(v, int) and not isinstance(v, bool)

        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "cutoffs":
                ok = isinstance(value, (list, tuple)) and all(is_int(c) for c in value)
                expected = "a list of integers"
            elif f.name == "tie_projs":
                ok = value is None or isinstance(value, (list, tuple)) and all(isinstance(t, bool) for t in value)
                expected = "None or a list of booleans (true/false, not strings)"
            elif f.type is bool:
                ok, expected = isinstance(value, bool), "a boolean (true/false, not a string)"
            elif f.type is int:
                ok, expected = is_int(value), "an integer"
            elif f.type is float:
                ok = (is_int(value) or isinstance(value, float)) and math.isfinite(value)
                expected = "a finite number"
            else:
                ok, expected = isinstance(value, str), "a string"
            if not ok:
                self._fail(f.name, expected)

    def _fail(self, name, expected):
        raise ValueError(
            f"Expected `{name}` to be {expected}. Received: {name}={getattr(self, name)!r}"
        )

    def validate(self):
        positive = ("n_token", "n_layer", "d_model", "d_embed", "n_head", "d_head", "d_inner", "tgt_len")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                self._fail(name, "a positive integer")
        for name in ("mem_len", "ext_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                self._fail(name, "a non-negative integer")
        if self.clamp_len < -1:
            self._fail("clamp_len", "-1 or 0 (no clamping) or a positive integer")
        for name in ("init_std", "proj_init_std", "init_range", "layer_norm_epsilon"):
            if not getattr(self, name) > 0:
                self._fail(name, "> 0")
        for name in ("dropout", "dropatt"):
            if not 0.0 <= getattr(self, name) < 1.0:
                self._fail(name, "in [0, 1)")
        if self.d_model % 2:
            self._fail("d_model", "even (the sinusoid encoding has sin and cos halves)")
        if self.attn_type not in ATTN_TYPES:
            self._fail("attn_type", f"one of {sorted(ATTN_TYPES)}")
        if self.attn_type == 3 and self.n_head * self.d_head != self.d_model:
            raise ValueError(
                "attn_type 3 adds per-layer position embeddings of width n_head*d_head to "
                f"the hidden states, so it needs n_head*d_head == d_model. Received: "
                f"n_head={self.n_head}, d_head={self.d_head}, d_model={self.d_model}"
            )
        if self.init not in ("normal", "uniform"):
            self._fail("init", "'normal' or 'uniform'")
        if self.mem_init not in ("empty", "zeros"):
            self._fail("mem_init", "'empty' or 'zeros'")
        if self.same_length_convention not in ("tf", "pytorch"):
            self._fail("same_length_convention", "'tf' or 'pytorch'")
        if self.cluster_order not in ("tf", "pytorch"):
            self._fail("cluster_order", "'tf' or 'pytorch'")
        if self.ext_len >= self.tgt_len:
            raise ValueError(
                "Expected `ext_len` < `tgt_len` (the cached part of a segment must not be "
                f"empty). Received: ext_len={self.ext_len}, tgt_len={self.tgt_len}"
            )
        check_cutoffs(self.n_token, self.cutoffs, self.d_embed, self.div_val)
        if self.tie_projs is not None and len(self.tie_projs) != len(self.cutoffs) + 1:
            raise ValueError(
                f"Expected one `tie_projs` entry per cluster ({len(self.cutoffs) + 1}). "
                f"Received: tie_projs={self.tie_projs}"
            )

    @property
    def resolved_tie_projs(self):
        """Which adaptive-softmax clusters reuse the input projection.

        Without cutoffs the output projection is the input one (as in the TF code);
        otherwise `proj_share_all_but_first` ties every tail cluster.
        """
        if self.tie_projs is not None:
            return list(self.tie_projs)
        if not self.cutoffs:
            return [True]
        return [False] + [self.proj_share_all_but_first] * len(self.cutoffs)

    @property
    def max_klen(self):
        """Table length of the learned position embeddings of attn_type 1 and 3."""
        return self.tgt_len + self.ext_len + self.mem_len

    def with_memory(self, mem_len=None, clamp_len=None, same_length=None):
        """A validated copy with the memory settings of evaluation or serving; `None`
        keeps the config's value. The one place where such overrides are resolved."""
        changes = {k: v for k, v in (("mem_len", mem_len), ("clamp_len", clamp_len),
                                     ("same_length", same_length)) if v is not None}
        return self.replace(**changes) if changes else self

    def replace(self, **changes):
        """A validated copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"Unknown TransformerXLConfig fields {unknown}. Known fields: {sorted(known)}"
            )
        return cls(**values)

    def to_json(self):
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text):
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_preset(cls, name, **overrides):
        """The config of a named preset (see `PRESETS`), with fields overridden."""
        if name not in PRESETS:
            raise ValueError(f"Unknown preset {name!r}. Available presets: {sorted(PRESETS)}")
        return cls.from_dict({**PRESETS[name], **overrides})


_TF_LNORM = {"layer_norm_epsilon": 1e-12}
_WT103 = {"n_token": 267735, "cutoffs": [20000, 40000, 200000]}
_LM1B = {"n_token": 793470, "cutoffs": [60000, 100000, 640000]}
_ENWIK8_LARGE = dict(
    n_token=204, n_layer=24, d_model=1024, n_head=8, d_head=128, d_inner=3072,
    dropout=0.15, dropatt=0.15, tgt_len=768, mem_len=768, **_TF_LNORM,
)

# Architecture and training-time memory of the original scripts (tf/scripts, tf/sota).
PRESETS = {
    "enwik8_base": dict(
        n_token=204, n_layer=12, d_model=512, n_head=8, d_head=64, d_inner=2048,
        dropout=0.1, dropatt=0.0, tgt_len=512, mem_len=512, **_TF_LNORM,
    ),
    "enwik8_large": _ENWIK8_LARGE,
    "text8_large": {**_ENWIK8_LARGE, "n_token": 27},
    "wt103_base": dict(
        **_WT103, n_layer=16, d_model=410, n_head=10, d_head=41, d_inner=2100,
        dropout=0.1, dropatt=0.0, tgt_len=150, mem_len=150, div_val=1, untie_r=True,
        proj_share_all_but_first=True, **_TF_LNORM,
    ),
    "wt103_large": dict(
        **_WT103, n_layer=18, d_model=1024, n_head=16, d_head=64, d_inner=4096,
        dropout=0.2, dropatt=0.2, tgt_len=384, mem_len=384, div_val=4, untie_r=True,
        proj_share_all_but_first=True, proj_same_dim=True, init_std=0.005, **_TF_LNORM,
    ),
    "lm1b_base": dict(
        **_LM1B, n_layer=18, d_model=1024, n_head=8, d_head=128, d_inner=4096,
        dropout=0.1, dropatt=0.0, tgt_len=256, mem_len=256, div_val=4, untie_r=True,
        proj_share_all_but_first=False, proj_same_dim=False, **_TF_LNORM,
    ),
    "lm1b_large": dict(
        **_LM1B, n_layer=24, d_model=1280, n_head=16, d_head=80, d_inner=8192,
        dropout=0.05, dropatt=0.05, tgt_len=32, mem_len=32, div_val=4, untie_r=True,
        proj_share_all_but_first=False, proj_same_dim=False, init_std=0.005, **_TF_LNORM,
    ),
    # The benchmark config of the reference (6 layers of 256, vocabulary 204).
    "char_small": dict(
        n_token=204, n_layer=6, d_model=256, n_head=8, d_head=32, d_inner=1024,
        dropout=0.1, dropatt=0.0, tgt_len=128, mem_len=128,
    ),
    # Small enough to train for a few minutes on 2 CPU cores (the quickstart).
    "cpu_small": dict(
        n_token=256, n_layer=4, d_model=128, n_head=4, d_head=32, d_inner=512,
        dropout=0.1, dropatt=0.0, tgt_len=64, mem_len=64,
    ),
    # For tests and demos: a few thousand parameters.
    "tiny": dict(
        n_token=64, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32,
        dropout=0.0, dropatt=0.0, tgt_len=8, mem_len=8,
    ),
}
