"""Masked mixers and their baselines, in one file.

A masked mixer is an MLP-Mixer (Tolstikhin et al. 2021) made causal: self-attention
is replaced by a learned token-mixing matrix M = W * tril(1) (Badger 2024, "Masked
Mixers for Language Generation and Retrieval"; README "How the models work"). This file
holds every model kind behind one config and one interface:

    cfg = ModelConfig(kind='mixer', d_model=256, n_layer=4, n_ctx=256)
    model = build_model(cfg)
    logits, loss = model(idx, targets)          # idx: LongTensor [B, T], T <= n_ctx
    out = model.generate(idx, max_new_tokens=100, temperature=0.8, top_k=40)

Token mixings (all causal, all with an incremental path for generation):
  MaskedMixing    dense masked matrix; flat, expanded (e > 1), kernel k > 1, multi-head
  ToeplitzMixing  M[i, j] = w[i - j]; materialised or FFT causal convolution
  RecurrentMixing M[i, j] = v[i] a^(i-j) (column) or v[j] a^(i-j) (row); O(1) state
  Attention       llama-style causal self-attention with RoPE and a KV cache
  LinearAttention Katharopoulos et al. 2020, phi(x) = elu(x) + 1; O(1) state
Models: LanguageModel (kinds mixer, transformer, hybrid, linear_attention) and
Autoencoder. VARIANTS maps the papers' variant names to config overrides.
"""

import math
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange

KINDS = ('mixer', 'transformer', 'gpt', 'hybrid', 'linear_attention')
MIXINGS = ('dense', 'toeplitz', 'recurrent')


@dataclass
class ModelConfig:
    """Every model's hyper-parameters. Fields not used by a kind are ignored.

    kind: 'mixer' | 'transformer' (llama-style) | 'gpt' (GPT-2-style: LayerNorm, GELU
        MLP, no RoPE; use with posenc=True) | 'hybrid' | 'linear_attention'.
    mixing: token mixing of 'mixer' and 'hybrid': 'dense' | 'toeplitz' | 'recurrent'.
    n_head: heads of the token mixing / attention. For a mixer, n_head = 1 is the
        papers' flat mixer (no projections); n_head > 1 adds the projections
        d -> d (split into heads of d / n_head) and d -> d.
    expansion: > 1 makes the expanded mixer (two masked mixings, GELU between).
    kernel: > 1 makes the "fully convolutional" mixer (k taps over the feature axis).
    recurrent_form: 'column' | 'row' | 'mixed' (heads alternate column, row).
    norm / activation: norm=False, activation='none' gives the linear mixer.
    posenc: add a learned absolute position embedding (off by default; Badger 2024
        found no gain for mixers).
    attention: 'sdpa' (fused scaled_dot_product_attention) or 'naive' (softmax of the
        full T x T score matrix, materialised: the baseline of Badger 2024's memory
        comparison). Same outputs, different memory.
    embed_linear: an extra Linear(d, d) after the token embedding (Badger 2024's best
        convolutional mixer had one).
    fft_threshold: the Toeplitz mixing uses the FFT when T >= this (see README).
    chunk_size: chunk length of the recurrent mixing and linear attention.
    hybrid: how the 'hybrid' kind joins attention and the masked mixing: 'serial'
        (Mix(Attn(z)), the paper's best model) or 'parallel' (Attn(z) + Mix(z)).
    task: 'lm' (next-token prediction) or 'autoencode'.
    Raises ValueError on an inconsistent combination.
    """
    vocab_size: int = 4096
    n_ctx: int = 256
    d_model: int = 256
    n_layer: int = 4
    n_head: int = 1
    kind: str = 'mixer'
    mixing: str = 'dense'
    expansion: int = 1
    kernel: int = 1
    recurrent_form: str = 'mixed'
    norm: bool = True
    activation: str = 'gelu'
    posenc: bool = False
    attention: str = 'sdpa'
    embed_linear: bool = False
    ff_mult: int = 4
    tie_embeddings: bool = True
    dropout: float = 0.0
    fft_threshold: int = 256
    chunk_size: int = 256
    hybrid: str = 'serial'
    task: str = 'lm'

    def __post_init__(self):
        def check(ok, msg):
            if not ok:
                raise ValueError(f'ModelConfig: {msg}')
        check(self.kind in KINDS, f'kind must be one of {KINDS}, got {self.kind!r}')
        check(self.mixing in MIXINGS, f'mixing must be one of {MIXINGS}, got {self.mixing!r}')
        check(self.activation in ('gelu', 'none'), f"activation must be 'gelu' or 'none', got {self.activation!r}")
        check(self.recurrent_form in ('column', 'row', 'mixed'), f'bad recurrent_form {self.recurrent_form!r}')
        check(self.task in ('lm', 'autoencode'), f"task must be 'lm' or 'autoencode', got {self.task!r}")
        check(self.attention in ('sdpa', 'naive'), f"attention must be 'sdpa' or 'naive', got {self.attention!r}")
        check(self.hybrid in ('serial', 'parallel'), f"hybrid must be 'serial' or 'parallel', got {self.hybrid!r}")
        for name in ('vocab_size', 'n_ctx', 'd_model', 'n_layer', 'n_head', 'expansion', 'kernel',
                     'ff_mult', 'fft_threshold', 'chunk_size'):
            check(getattr(self, name) >= 1, f'{name} must be >= 1, got {getattr(self, name)}')
        check(self.d_model % self.n_head == 0, f'd_model={self.d_model} is not divisible by n_head={self.n_head}')
        check(not (self.expansion > 1 and self.kernel > 1), 'expansion > 1 and kernel > 1 cannot be combined')
        check(self.expansion == 1 and self.kernel == 1 or self.mixing == 'dense',
              'expansion and kernel apply to the dense mixing only')
        if self.kind in ('transformer', 'hybrid'):
            check((self.d_model // self.n_head) % 2 == 0, 'RoPE needs an even head size d_model / n_head')
        if self.kind == 'hybrid':
            check(self.mixing in ('dense', 'toeplitz') and self.expansion == 1 and self.kernel == 1,
                  "the hybrid's mixing is dense or toeplitz, with expansion = kernel = 1")
        check(0.0 <= self.dropout < 1.0, f'dropout must be in [0, 1), got {self.dropout}')

    @classmethod
    def from_dict(cls, d):
        """Build from a dict, ignoring keys that are not config fields (e.g. train.py's)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


# Short names of the papers' variants -> ModelConfig overrides (applied on top of a
# base config). Tests, bench.py, configs and `train.py --variant=NAME` use this.
VARIANTS = {
    'flat': {},
    'expanded': dict(expansion=2),
    'multihead': dict(n_head=4),
    'kernel': dict(kernel=3),
    'toeplitz': dict(mixing='toeplitz', n_head=4),
    'recurrent': dict(mixing='recurrent', n_head=4, recurrent_form='mixed'),
    'linear': dict(norm=False, activation='none'),
    'posenc': dict(posenc=True),
    'transformer': dict(kind='transformer', n_head=4),
    'gpt': dict(kind='gpt', n_head=4, posenc=True),
    'transformer_naive': dict(kind='transformer', n_head=4, attention='naive'),
    'hybrid': dict(kind='hybrid', n_head=4),
    'hybrid_parallel': dict(kind='hybrid', n_head=4, hybrid='parallel'),
    'linear_attention': dict(kind='linear_attention', n_head=4),
}


def variant_config(name, **base):
    """ModelConfig of variant `name` on top of the `base` keyword overrides.

    Raises ValueError for an unknown variant name."""
    if name not in VARIANTS:
        raise ValueError(f'unknown variant {name!r}; choose from {", ".join(VARIANTS)}')
    return ModelConfig(**{**base, **VARIANTS[name]})


# ----------------------------------------------------------------------------- caches

class Cache:
    """State for incremental decoding: the position and one dict per layer.

    What a layer keeps depends on its token mixing: the dense and Toeplitz mixings
    keep their normalised inputs z_j (the mixer's KV cache), attention keeps K and V,
    the recurrent mixing and linear attention keep a fixed-size state."""

    def __init__(self, n_layer):
        self.pos = 0
        self.layers = [dict() for _ in range(n_layer)]

    def nbytes(self):
        """Bytes held by all cached tensors (int)."""
        def walk(d):
            return sum(walk(v) if isinstance(v, dict) else v.numel() * v.element_size()
                       for v in d.values() if isinstance(v, (dict, torch.Tensor)))
        return sum(walk(layer) for layer in self.layers)


def _sub(state, key):
    """The sub-dict `key` of a layer state (None when not decoding)."""
    return None if state is None else state.setdefault(key, {})


def _append(state, key, x):
    """Append x [B, H, t, e] along time to the cached tensor `key`; return the whole
    (a view [B, H, n, e]). The buffer doubles its capacity when full, so one more
    token costs an O(1) amortised copy, not a copy of the whole cache."""
    if state is None:
        return x
    buf, n = state.get(key), state.get(key + '_len', 0)
    need = n + x.shape[2]
    if buf is None or need > buf.shape[2]:
        grown = x.new_empty(*x.shape[:2], max(need, 2 * n), x.shape[3])
        if buf is not None:
            grown[:, :, :n] = buf[:, :, :n]
        buf = state[key] = grown
    buf[:, :, n:need] = x
    state[key + '_len'] = need
    return buf[:, :, :need]


# ----------------------------------------------------------------------------- token mixings

class HeadMixing(nn.Module):
    """Base of the token mixings: splits d into n_head heads around `mix`.

    With n_head = 1 there are no projections (the papers' flat mixer, head size d);
    with n_head > 1, Linear(d, d) -> heads of d / n_head -> mix -> concat -> Linear(d, d).
    Subclasses implement mix(z, state, pos): z [B, H, T, e] holds positions
    pos .. pos+T-1; `state` is None for a full forward or a dict for decoding."""

    def __init__(self, d_model, n_head):
        super().__init__()
        self.n_head, self.d_model = n_head, d_model
        self.proj_in = nn.Linear(d_model, d_model) if n_head > 1 else None
        self.proj_out = nn.Linear(d_model, d_model) if n_head > 1 else None

    def forward(self, x, state=None, pos=0):
        """x: float [B, T, d] at positions pos..pos+T-1 -> float [B, T, d]."""
        z = self.proj_in(x) if self.proj_in is not None else x
        y = self.mix(rearrange(z, 'b t (h e) -> b h t e', h=self.n_head), state, pos)
        y = rearrange(y, 'b h t e -> b t (h e)')
        return self.proj_out(y) if self.proj_out is not None else y

    def mix_flops(self, T):
        """Forward FLOPs per token of the mixing itself at length T (projections excluded)."""
        raise NotImplementedError


def prefix_mean(mask):
    """Rows of `mask` (bool [..., R, C]) normalised to sum to 1: a causal running mean."""
    m = mask.float()
    return m / m.sum(-1, keepdim=True).clamp(min=1)


class MaskedMixing(HeadMixing):
    """Dense masked token mixing (Badger 2024): y_i = sum_{j<=i} M[i, j] z_j + c_i.

    M = W * tril(1) is formed inside the autograd graph on every call, so the upper
    triangle gets zero gradient and stays exactly zero. A length-T input uses the
    leading T x T block. Variants:
      expansion e > 1: h = GELU(M1 z + c1) with e * n_ctx hidden rows, hidden row r
          belonging to position r // e (M1[r, j] = 0 for j > r // e), then
          y = M2 h + c2 with M2[i, r] = 0 for r // e > i: causal for every e.
      kernel k > 1 ("fully convolutional" mixer, Badger 2024): k matrices; tap u
          reads the feature axis shifted by u - (k - 1) // 2 (zero padded): a
          convolution over features whose channels are tokens.
    Init: each row of M is `out_scale` x the mean of the allowed (past) positions,
    bias 0. For e > 1, M1 starts as the identity per position (hidden row r copies
    z_{r // e}) and M2 as out_scale x the prefix mean: one averaging, as in the flat
    mixer, not an average of averages. Measured at the CPU config (400 steps, lr 3e-3,
    seeds 0 and 1): val loss 4.14 / 4.13 nats with M1 at the prefix mean, 3.89 / 3.90
    with this init (README, claims). Decoding caches the mixing's inputs z (and the
    hidden rows for e > 1)."""

    def __init__(self, n_ctx, d_model, n_head=1, expansion=1, kernel=1, out_scale=1.0):
        super().__init__(d_model, n_head)
        self.e, self.k = expansion, kernel
        rows = torch.arange(n_ctx * expansion) // expansion              # position of each hidden row
        mask1 = torch.arange(n_ctx)[None, :] <= rows[:, None]             # [e n_ctx, n_ctx]
        self.register_buffer('mask1', mask1, persistent=False)
        if expansion == 1:
            W1 = prefix_mean(mask1) * out_scale / kernel
        else:
            W1 = (rows[:, None] == torch.arange(n_ctx)[None, :]).float()    # hidden row r = z_{r // e}
        self.W1 = nn.Parameter(W1.repeat(n_head, kernel, 1, 1))
        self.c1 = nn.Parameter(torch.zeros(n_head, n_ctx * expansion, 1))
        if expansion > 1:
            mask2 = rows[None, :] <= torch.arange(n_ctx)[:, None]         # [n_ctx, e n_ctx]
            self.register_buffer('mask2', mask2, persistent=False)
            self.W2 = nn.Parameter(prefix_mean(mask2).repeat(n_head, 1, 1) * out_scale)
            self.c2 = nn.Parameter(torch.zeros(n_head, n_ctx, 1))

    def matrix(self, T):
        """Effective first mixing for length T: float [H, k, e T, T], zero above the diagonal."""
        return self.W1[..., :self.e * T, :T] * self.mask1[:self.e * T, :T]

    def _taps(self, z):
        """The k feature-shifted copies of z [B, H, t, e] -> [B, H, k, t, e]."""
        left = (self.k - 1) // 2
        zp = F.pad(z, (left, self.k - 1 - left))
        n = z.shape[-1]
        return torch.stack([zp[..., u:u + n] for u in range(self.k)], dim=2)

    def mix(self, z, state=None, pos=0):
        T = z.shape[2]
        end = pos + T
        z = _append(state, 'z', z)                                        # [B, H, end, e]
        W1 = (self.W1[..., self.e * pos:self.e * end, :end]
              * self.mask1[self.e * pos:self.e * end, :end])              # rows of the new positions
        h = W1[:, 0] @ z if self.k == 1 else (W1 @ self._taps(z)).sum(2)
        h = h + self.c1[:, self.e * pos:self.e * end]
        if self.e == 1:
            return h
        h = _append(state, 'h', F.gelu(h))                                # [B, H, e end, e]
        W2 = self.W2[:, pos:end, :self.e * end] * self.mask2[pos:end, :self.e * end]
        return W2 @ h + self.c2[:, pos:end]

    def mix_flops(self, T):
        return 2 * T * self.d_model * self.e * (self.k + (self.e > 1))


class ToeplitzMixing(HeadMixing):
    """Toeplitz masked mixing: M[i, j] = w[i - j] for j <= i, n_ctx weights per head.

    A causal convolution along the sequence. Two paths give the same result
    (tested): the materialised T x T matrix, and an FFT convolution (pad to 2T,
    rfft, multiply, irfft, keep the first T), used when T >= fft_threshold.
    Init: w[k] = (1 - b) b^k with b = 1 - 1/16, an exponential moving average
    over about 16 tokens, times out_scale. Bias c per position and head, init 0.
    Decoding caches z."""

    def __init__(self, n_ctx, d_model, n_head=1, fft_threshold=256, out_scale=1.0):
        super().__init__(d_model, n_head)
        self.fft_threshold = fft_threshold
        b = 1 - 1 / 16
        self.w = nn.Parameter(out_scale * ((1 - b) * b ** torch.arange(n_ctx).float()).repeat(n_head, 1))
        self.c = nn.Parameter(torch.zeros(n_head, n_ctx, 1))

    def matrix(self, rows, T):
        """Rows `rows` (a slice) of the effective matrix for length T: float [H, R, T]."""
        lag = (torch.arange(rows.start, rows.stop, device=self.w.device)[:, None]
               - torch.arange(T, device=self.w.device)[None, :])
        return self.w[:, lag.clamp(min=0)] * (lag >= 0)

    def mix(self, z, state=None, pos=0, use_fft=None):
        T = z.shape[2]
        z = _append(state, 'z', z)
        if use_fft is None:
            use_fft = state is None and T >= self.fft_threshold
        if use_fft:
            assert pos == 0, 'the FFT path computes a whole sequence'
            n = 2 * T
            zf = torch.fft.rfft(z.float(), n=n, dim=2)                   # [B, H, n/2+1, e]
            wf = torch.fft.rfft(self.w[:, :T].float(), n=n, dim=1)        # [H, n/2+1]
            y = torch.fft.irfft(zf * wf[:, :, None], n=n, dim=2)[:, :, :T].to(z.dtype)
        else:
            y = self.matrix(slice(pos, pos + T), pos + T) @ z
        return y + self.c[:, pos:pos + T]

    def mix_flops(self, T):
        if T >= self.fft_threshold:   # rfft(z) + irfft of length 2T (~2.5 n log2 n each) + product
            return int(self.d_model * (10 * math.log2(2 * T) + 6))
        return 2 * T * self.d_model


def chunk_starts(T, chunk_size):
    """Start positions of the chunks of a length-T sequence: 0, chunk_size, ... Under
    torch.compile with a dynamic T, range(0, T, chunk_size) would specialise on T and
    recompile for every length; counting the chunks first guards on their number only."""
    return [i * chunk_size for i in range((T + chunk_size - 1) // chunk_size)]


class RecurrentMixing(HeadMixing):
    """Masked recurrent mixing (Badger, blog post "Masked Recurrent Mixers").

    Per head h a decay a = sigmoid(decay_logit) in (0, 1) and per-position v, c:
      column form  M[i, j] = v[i] a^(i-j):  h_t = a h_{t-1} + z_t,      y_t = v_t h_t + c_t
      row form     M[i, j] = v[j] a^(i-j):  h_t = a h_{t-1} + v_t z_t,  y_t = h_t + c_t
    form='mixed' alternates column (even heads) and row (odd heads).
    Training runs the parallel form in chunks of chunk_size: inside a chunk the
    matrix a^(i-j) is materialised (exponents i - j >= 0 only, so no overflow at
    any length), the state carries across chunks. Decoding is the same code with a
    chunk of one token: one state vector [B, H, d / H] per layer, whatever the
    position. Init: time constants 1/(1 - a) from 4 to n_ctx tokens (geometric
    over heads), v = out_scale (1 - a) (a normalised moving average), c = 0."""

    def __init__(self, n_ctx, d_model, n_head=1, form='mixed', chunk_size=256, out_scale=1.0):
        super().__init__(d_model, n_head)
        self.chunk_size = chunk_size
        tau = torch.logspace(math.log10(4), math.log10(max(n_ctx, 4)), n_head) if n_head > 1 else torch.tensor([16.])
        a = torch.exp(-1 / tau)
        self.decay_logit = nn.Parameter(torch.logit(a))
        self.v = nn.Parameter(out_scale * (1 - a)[:, None].repeat(1, n_ctx))     # [H, n_ctx]
        self.c = nn.Parameter(torch.zeros(n_head, n_ctx, 1))
        column = [form == 'column' or (form == 'mixed' and h % 2 == 0) for h in range(n_head)]
        self.register_buffer('column', torch.tensor(column)[:, None, None], persistent=False)  # [H, 1, 1]

    def powers(self, T):
        """a^(i-j) for j <= i, else 0: float32 [H, T, T]."""
        lag = torch.arange(T, device=self.v.device)
        lag = lag[:, None] - lag[None, :]
        log_a = F.logsigmoid(self.decay_logit.float())[:, None, None]
        return torch.exp(lag.clamp(min=0) * log_a) * (lag >= 0)

    def matrix(self, T):
        """The effective mixing matrix of length T (for tests): float32 [H, T, T]."""
        v = self.v[:, :T].float()
        return torch.where(self.column, v[:, :, None] * self.powers(T), self.powers(T) * v[:, None, :])

    def mix(self, z, state=None, pos=0):
        h = None if state is None else state.get('h')
        ys = []
        for s in chunk_starts(z.shape[2], self.chunk_size):
            y, h = self._chunk(z[:, :, s:s + self.chunk_size], h, pos + s)
            ys.append(y)
        if state is not None:
            state['h'] = h
        return torch.cat(ys, dim=2)

    def _chunk(self, z, h0, pos):
        """One chunk z [B, H, C, e] at positions pos.., state h0 [B, H, e] or None (zeros).

        Returns (y [B, H, C, e], state after the chunk [B, H, e])."""
        C = z.shape[2]
        v = self.v[:, pos:pos + C, None]                                          # [H, C, 1]
        u = torch.where(self.column, z, v * z)
        hs = self.powers(C).to(z.dtype) @ u                                       # [B, H, C, e]
        if h0 is not None:
            log_a = F.logsigmoid(self.decay_logit.float())[:, None]
            carry = torch.exp(torch.arange(1, C + 1, device=z.device) * log_a)   # a^(t+1): [H, C]
            hs = hs + carry[:, :, None].to(z.dtype) * h0[:, :, None]
        y = torch.where(self.column, v * hs, hs) + self.c[:, pos:pos + C]
        return y, hs[:, :, -1]

    def mix_flops(self, T):
        return 2 * min(T, self.chunk_size) * self.d_model


def rope_tables(n_ctx, head_size, base=10000.0):
    """cos, sin of the rotary position embedding (Su et al. 2021): float [n_ctx, head_size / 2]."""
    inv_freq = base ** (-torch.arange(0, head_size, 2).float() / head_size)
    angles = torch.arange(n_ctx).float()[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    """Rotate x [B, H, T, e] by cos, sin [T, e / 2] (half-split convention)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


class Attention(nn.Module):
    """Causal self-attention with a KV cache: llama-style with RoPE (Su et al. 2021),
    or GPT-2-style without (rope=False; positions then come from a learned embedding).

    x: float [B, T, d] at positions pos..pos+T-1 -> float [B, T, d]. Decoding
    appends K, V [B, H, t, d / H] to the layer state. naive=True computes
    softmax(Q K^T / sqrt(e) + causal mask) V with the [B, H, T, t] scores
    materialised, as plain PyTorch code does (memory O(T^2) per head)."""

    def __init__(self, n_ctx, d_model, n_head, rope=True, naive=False):
        super().__init__()
        self.n_head, self.rope, self.naive = n_head, rope, naive
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj_out = nn.Linear(d_model, d_model, bias=False)
        cos, sin = rope_tables(n_ctx, d_model // n_head)
        self.register_buffer('cos', cos, persistent=False)
        self.register_buffer('sin', sin, persistent=False)

    def forward(self, x, state=None, pos=0):
        T = x.shape[1]
        q, k, v = rearrange(self.qkv(x), 'b t (three h e) -> three b h t e', three=3, h=self.n_head)
        if self.rope:
            cos, sin = self.cos[pos:pos + T], self.sin[pos:pos + T]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k, v = _append(state, 'k', k), _append(state, 'v', v)
        # query i (at position pos + i) may see keys 0 .. pos + i
        mask = torch.arange(pos + T, device=x.device)[None, :] <= torch.arange(pos, pos + T, device=x.device)[:, None]
        if self.naive:
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])      # [B, H, T, pos + T]
            y = scores.masked_fill(~mask, float('-inf')).softmax(-1) @ v
        elif pos == 0:             # the whole prefix (is_causal must be a constant for torch.compile)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif T == 1:               # one new query that may see every key
            y = F.scaled_dot_product_attention(q, k, v)
        else:                      # T new queries after a cached prefix
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj_out(rearrange(y, 'b h t e -> b t (h e)'))

    def mix_flops(self, T):
        """QK^T and AV at length T, counted in full: 4 T d forward FLOPs per token."""
        return 4 * T * self.qkv.in_features


class LinearAttention(nn.Module):
    """Causal linear attention (Katharopoulos et al. 2020, "Transformers are RNNs").

    phi(x) = elu(x) + 1; y_i = phi(q_i) S_i / (phi(q_i) . s_i) with S_i = sum_{j<=i}
    phi(k_j) v_j^T and s_i = sum_{j<=i} phi(k_j). Training computes it in chunks of
    chunk_size (a masked C x C product inside a chunk, the prefix sums S, s carried
    between chunks), so memory is O(T d + C^2) per layer, never O(T d^2).
    Decoding keeps S [B, H, e, e] and s [B, H, e]: constant size. No position
    signal, so generation can run past n_ctx without a window."""

    def __init__(self, d_model, n_head, chunk_size=256, eps=1e-6):
        super().__init__()
        self.n_head, self.chunk_size, self.eps = n_head, chunk_size, eps
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj_out = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, state=None, pos=0):
        q, k, v = rearrange(self.qkv(x), 'b t (three h e) -> three b h t e', three=3, h=self.n_head)
        q, k = F.elu(q) + 1, F.elu(k) + 1
        S = None if state is None else state.get('S')
        s = None if state is None else state.get('s')
        ys = []
        for c0 in chunk_starts(x.shape[1], self.chunk_size):
            qc, kc, vc = (t[:, :, c0:c0 + self.chunk_size] for t in (q, k, v))
            A = (qc @ kc.transpose(-1, -2)).tril()                    # [B, H, C, C]
            num, den = A @ vc, A.sum(-1, keepdim=True)
            if S is not None:
                num = num + qc @ S
                den = den + qc @ s[..., None]
            ys.append(num / (den + self.eps))
            S = kc.transpose(-1, -2) @ vc + (0 if S is None else S)  # [B, H, e, e]
            s = kc.sum(2) + (0 if s is None else s)                   # [B, H, e]
        if state is not None:
            state['S'], state['s'] = S, s
        return self.proj_out(rearrange(torch.cat(ys, dim=2), 'b h t e -> b t (h e)'))

    def mix_flops(self, T):
        d = self.qkv.in_features
        return 4 * min(T, self.chunk_size) * d + 4 * d * d // self.n_head


class HybridMixing(nn.Module):
    """Transformer-mixer hybrids (Badger 2024, "Transformer mixer hybrids learn most
    efficiently"): attention and a masked token mixing in one residual
    branch, x [B, T, d] -> [B, T, d].

    serial (the paper's best model): y = Mix(Attn(z)). The mixing starts at the
    identity (M = I on the lower triangle, bias 0), so a fresh hybrid computes
    exactly what the transformer with the same attention weights computes and
    learns what to mix. A prefix-mean start (the mixers' own init) would hand every
    position the average of all earlier attention outputs at step 0 and average away
    the selectivity attention exists for: measured at the CPU config (400 steps, lr
    3e-3, seeds 0 and 1), val loss 3.95 / 3.97 nats with it, 3.64 / 3.64 with the
    identity, the transformer 3.63 / 3.63 (README, claims).
    parallel (the paper's second hybrid, no gain there): y = Attn(z) + Mix(z), Mix a
    masked mixing with n_head heads and projections (as the multihead mixer), so that
    its output, like attention's, enters through a small-init projection. A flat
    mixing there (no projection) put its raw, fast-growing matrix noise straight into
    the residual stream: measured (d 64, 2 layers, 80 steps, lr 3e-3) val loss 5.09
    nats against 4.07 with heads, the transformer 3.88."""

    def __init__(self, cfg):
        super().__init__()
        self.parallel = cfg.hybrid == 'parallel'
        self.attn = Attention(cfg.n_ctx, cfg.d_model, cfg.n_head, naive=cfg.attention == 'naive')
        if self.parallel:
            self.mix = make_token_mixing(cfg, n_head=cfg.n_head)
        else:
            self.mix = make_token_mixing(cfg, n_head=1)
            identity_(self.mix)

    def forward(self, x, state=None, pos=0):
        a = self.attn(x, _sub(state, 'attn'), pos)
        if self.parallel:
            return a + self.mix(x, _sub(state, 'mix'), pos)
        return self.mix(a, _sub(state, 'mix'), pos)


def identity_(mixing):
    """Set a flat (one head, no expansion, kernel 1) dense or Toeplitz masked mixing
    to the identity in place: M = I, bias 0. Raises ValueError for any other mixing."""
    with torch.no_grad():
        if isinstance(mixing, MaskedMixing) and mixing.W1.shape[:2] == (1, 1) and mixing.e == 1:
            mixing.W1.copy_(torch.eye(mixing.W1.shape[-1]).expand_as(mixing.W1))
            mixing.c1.zero_()
        elif isinstance(mixing, ToeplitzMixing) and mixing.w.shape[0] == 1:
            mixing.w.zero_()
            mixing.w[:, 0] = 1.0
            mixing.c.zero_()
        else:
            raise ValueError(f'identity_: no identity init for {type(mixing).__name__} of this shape')


# Init scale of a mixer block's token mixing when nothing projects its output (n_head = 1):
# the branch starts at about the scale of the N(0, 0.02) embeddings. Measured (d 128,
# 2 layers, n_ctx 128, batch 16, lr 3e-3; train loss after 100 steps on TinyStories):
# scale 1.0 -> 6.0 nats (stuck at the unigram loss), 0.1 -> 5.71, 0.01 -> 4.32, 0 -> 4.29.
MIX_INIT_SCALE = 0.01


def make_token_mixing(cfg, n_head, out_scale=1.0):
    """The masked token mixing selected by cfg.mixing, with n_head heads."""
    if cfg.mixing == 'dense':
        return MaskedMixing(cfg.n_ctx, cfg.d_model, n_head, cfg.expansion, cfg.kernel, out_scale)
    if cfg.mixing == 'toeplitz':
        return ToeplitzMixing(cfg.n_ctx, cfg.d_model, n_head, cfg.fft_threshold, out_scale)
    return RecurrentMixing(cfg.n_ctx, cfg.d_model, n_head, cfg.recurrent_form, cfg.chunk_size, out_scale)


# ----------------------------------------------------------------------------- blocks and models

class MLP(nn.Module):
    """Mixer feed-forward: Linear(d, ff_mult d) -> GELU (or identity) -> Linear(ff_mult d, d)."""

    def __init__(self, d_model, hidden, activation='gelu'):
        super().__init__()
        self.fc = nn.Linear(d_model, hidden)
        self.act = nn.GELU() if activation == 'gelu' else nn.Identity()
        self.proj_out = nn.Linear(hidden, d_model)

    def forward(self, x):
        return self.proj_out(self.act(self.fc(x)))


class SwiGLU(nn.Module):
    """Llama feed-forward: W2 (silu(W1 x) * W3 x), hidden = 2/3 of ff_mult d rounded up to 32."""

    def __init__(self, d_model, ff_mult):
        super().__init__()
        hidden = 32 * math.ceil(2 * ff_mult * d_model / 3 / 32)
        self.fc = nn.Linear(d_model, 2 * hidden, bias=False)
        self.proj_out = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x):
        gate, up = self.fc(x).chunk(2, dim=-1)
        return self.proj_out(F.silu(gate) * up)


def make_norm(cfg):
    """LayerNorm for mixers (as in the papers) and GPT, RMSNorm for the llama-style
    kinds, identity when cfg.norm is False (the linear mixer)."""
    if not cfg.norm:
        return nn.Identity()
    return nn.LayerNorm(cfg.d_model) if cfg.kind in ('mixer', 'gpt') else nn.RMSNorm(cfg.d_model)


class Block(nn.Module):
    """Pre-norm residual block: x += Mix(LN(x)); x += FF(LN(x)) (MLP-Mixer, Badger 2024).

    Mix is the kind's sequence mixing (masked token mixing, attention, linear
    attention, or the hybrid); FF is the GELU MLP for mixers, SwiGLU otherwise."""

    def __init__(self, cfg):
        super().__init__()
        self.norm1, self.norm2 = make_norm(cfg), make_norm(cfg)
        if cfg.kind == 'mixer':
            self.mixing = make_token_mixing(cfg, cfg.n_head, MIX_INIT_SCALE if cfg.n_head == 1 else 1.0)
            self.ff = MLP(cfg.d_model, cfg.ff_mult * cfg.d_model, cfg.activation)
        elif cfg.kind == 'gpt':
            self.mixing = Attention(cfg.n_ctx, cfg.d_model, cfg.n_head, rope=False, naive=cfg.attention == 'naive')
            self.ff = MLP(cfg.d_model, cfg.ff_mult * cfg.d_model, cfg.activation)
        else:
            self.mixing = {'transformer': lambda: Attention(cfg.n_ctx, cfg.d_model, cfg.n_head,
                                                            naive=cfg.attention == 'naive'),
                           'hybrid': lambda: HybridMixing(cfg),
                           'linear_attention': lambda: LinearAttention(cfg.d_model, cfg.n_head, cfg.chunk_size),
                           }[cfg.kind]()
            self.ff = SwiGLU(cfg.d_model, cfg.ff_mult)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, state=None, pos=0):
        """x: float [B, T, d] at positions pos.. -> float [B, T, d]; state: the layer's cache or None."""
        x = x + self.drop(self.mixing(self.norm1(x), state, pos))
        return x + self.drop(self.ff(self.norm2(x)))


class _Model(nn.Module):
    """Shared parts of LanguageModel and Autoencoder: embedding, head, init, counts."""

    def _build_io(self, cfg):
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.embed_proj = nn.Linear(cfg.d_model, cfg.d_model) if cfg.embed_linear else nn.Identity()
        self.norm_f = make_norm(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight

    def _init_weights(self, n_blocks):
        """GPT-2 init: Linear and Embedding weights N(0, 0.02), biases 0, and every
        projection into the residual stream N(0, 0.02 / sqrt(2 n_blocks)). Token
        mixing parameters keep the init of their own class."""
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
                if getattr(m, 'bias', None) is not None:
                    nn.init.zeros_(m.bias)
        for block in self.modules():
            if isinstance(block, Block):
                for name, p in block.named_parameters():
                    if name.endswith('proj_out.weight'):
                        nn.init.normal_(p, std=0.02 / math.sqrt(2 * n_blocks))

    @staticmethod
    def loss(logits, targets):
        """Mean cross entropy (nats/token) of logits [B, T, vocab] against targets
        long [B, T] (-1 ignored); None when targets is None."""
        if targets is None:
            return None
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-1)

    def num_params(self):
        """Number of parameters (tied embeddings counted once)."""
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self, T=None):
        """Training FLOPs per token (forward + backward = 3 x forward) at length T
        (default n_ctx): 2 per weight of every Linear (the LM head included) plus each
        token mixing's matmuls as they are computed (the dense mixer's full T x T
        product, zeros included; attention's QK^T and AV in full). Norms, activations
        and the embedding lookup are not counted."""
        T = T or self.cfg.n_ctx
        fwd = sum(2 * m.in_features * m.out_features for m in self.modules() if isinstance(m, nn.Linear))
        fwd += sum(m.mix_flops(T) for m in self.modules() if hasattr(m, 'mix_flops'))
        return 3 * fwd


def _check_length(T, limit):
    if limit is not None and T > limit:
        raise ValueError(f'sequence of {T} tokens is longer than n_ctx={limit}')


class LanguageModel(_Model):
    """Causal LM of any kind (mixer, transformer, gpt, hybrid, linear_attention).

    forward(idx [B, T] long, targets [B, T] long or None) -> (logits float [B, T, vocab],
    loss: mean next-token cross entropy in nats, or None). T <= n_ctx, else ValueError.
    Position-indexed kinds (everything but linear attention without posenc) can
    decode n_ctx positions; generate() then slides the window (see there)."""

    def __init__(self, cfg):
        super().__init__()
        self._build_io(cfg)
        self.wpe = nn.Parameter(0.02 * torch.randn(cfg.n_ctx, cfg.d_model)) if cfg.posenc else None
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self._init_weights(cfg.n_layer)
        self.max_len = None if cfg.kind == 'linear_attention' and not cfg.posenc else cfg.n_ctx

    def hidden(self, idx, cache=None, layer=None):
        """Residual stream after block `layer` (default: the last, before the final
        norm): float [B, T, d]. With a Cache, idx holds the tokens after cache.pos and
        the cache advances. Raises ValueError past n_ctx (position-indexed kinds)."""
        return self.hidden_from_embeddings(self.wte(idx), cache, layer)

    def hidden_from_embeddings(self, x, cache=None, layer=None):
        """hidden() for input vectors x float [B, T, d] in place of the token embeddings
        wte(idx) (input representation accuracy optimises them: represent.py)."""
        pos = cache.pos if cache is not None else 0
        _check_length(pos + x.shape[1], self.max_len)
        x = self.embed_proj(x)
        if self.wpe is not None:
            x = x + self.wpe[pos:pos + x.shape[1]]
        n = len(self.blocks) if layer is None else range(len(self.blocks))[layer] + 1
        for i, block in enumerate(self.blocks[:n]):
            x = block(x, None if cache is None else cache.layers[i], pos)
        if cache is not None:
            cache.pos += x.shape[1]
        return x

    def forward(self, idx, targets=None):
        logits = self.lm_head(self.norm_f(self.hidden(idx)))
        return logits, self.loss(logits, targets)

    def decode(self, idx, cache):
        """Incremental forward: logits [B, T, vocab] of the tokens idx [B, T] that follow
        the cache.pos tokens already in `cache`; equals forward() on the whole sequence."""
        return self.lm_head(self.norm_f(self.hidden(idx, cache)))

    def embed(self, idx, layer=None):
        """Embedding of each text (Badger 2024): the hidden vector of the last token
        after block `layer` (default the last): float [B, d]."""
        return self.hidden(idx, layer=layer)[:, -1]

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """Sample max_new_tokens after idx [B, T] -> long [B, T + max_new_tokens].

        Incremental: one decode() of the prompt, then one token per step through the
        cache or recurrent state (never recomputing the window). Past n_ctx a
        position-indexed model slides its window: it restarts the cache from the
        last n_ctx / 2 tokens (one recompute per n_ctx / 2 new tokens).
        temperature 0 means greedy; top_k keeps the k most likely tokens.
        Raises ValueError for a prompt longer than n_ctx."""
        cache = None

        def start(tokens):                      # a fresh cache holding `tokens`
            nonlocal cache
            cache = Cache(len(self.blocks))
            return self.decode(tokens, cache)[:, -1]
        return sample_loop(idx, max_new_tokens, temperature, top_k, self.max_len, start,
                           lambda token: self.decode(token, cache)[:, -1])


def sample_loop(idx, max_new_tokens, temperature, top_k, max_len, start, step):
    """The generation loop shared by LanguageModel.generate and decode.generate.

    start(tokens long [B, t]) -> logits float [B, vocab] after the last of them, from a
    fresh state; step(token long [B, 1]) -> logits after it. Once max_len tokens are in
    the state (None: never), the window slides: start() again from the last
    max_len / 2 tokens. -> long [B, T + max_new_tokens]."""
    logits, pos, out = start(idx), idx.shape[1], [idx]
    for i in range(max_new_tokens):
        nxt = sample_next(logits, temperature, top_k)
        out.append(nxt)
        if i == max_new_tokens - 1:
            break
        if max_len is not None and pos >= max_len:
            window = torch.cat(out, 1)[:, -(max_len // 2):]
            logits, pos = start(window), window.shape[1]
        else:
            logits, pos = step(nxt), pos + 1
    return torch.cat(out, 1)


def sample_next(logits, temperature=1.0, top_k=None):
    """Draw one token per row from logits float [B, vocab] -> long [B, 1].

    temperature 0 -> argmax; top_k -> sample among the k largest logits."""
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, [-1]]
        logits = logits.masked_fill(logits < kth, float('-inf'))
    return torch.multinomial(F.softmax(logits.float(), dim=-1), 1)


class Autoencoder(_Model):
    """Autoencoder (Badger, blog post "Masked Mixers II"): encoder blocks read the tokens; the last
    token's last hidden vector e [B, d] is repeated T times as the decoder's input;
    the decoder blocks reconstruct every token (cross entropy at all T positions).

    Works with any kind. The decoder input carries no token other than through e;
    transformer-like kinds (and posenc=True) add a learned position embedding to
    it, since attention over T identical vectors could not tell positions apart.
    forward(idx [B, T], targets [B, T] or None) -> (logits [B, T, vocab], loss nats)."""

    def __init__(self, cfg):
        super().__init__()
        self._build_io(cfg)
        self.encoder = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.decoder = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        needs_pos = cfg.kind != 'mixer' or cfg.posenc
        self.wpe_dec = nn.Parameter(0.02 * torch.randn(cfg.n_ctx, cfg.d_model)) if needs_pos else None
        self._init_weights(2 * cfg.n_layer)

    def encode(self, idx):
        """idx long [B, T] -> embedding float [B, d] (last token, last encoder block)."""
        _check_length(idx.shape[1], self.cfg.n_ctx)
        x = self.embed_proj(self.wte(idx))
        for block in self.encoder:
            x = block(x)
        return x[:, -1]

    def decode_embedding(self, e, T):
        """Embedding e float [B, d] -> logits float [B, T, vocab] of the T tokens."""
        x = e[:, None, :].expand(-1, T, -1)
        if self.wpe_dec is not None:
            x = x + self.wpe_dec[:T]
        for block in self.decoder:
            x = block(x)
        return self.lm_head(self.norm_f(x))

    def forward(self, idx, targets=None):
        logits = self.decode_embedding(self.encode(idx), idx.shape[1])
        return logits, self.loss(logits, targets)


# ----------------------------------------------------------------------------- retrieval model

class EquivariantMixerBlock(nn.Module):
    """Pre-norm mixer block over rows [query, c_1 .. c_N] (x: float [B, 1 + N, d]).

    Token mixing: the unmasked mixing matrix restricted to the permutation-
    equivariant family, with per-channel coefficient vectors a..e and row-type
    biases (z = LN(x), m = mean over candidates of z):
        y_q = a z_q + b m + bias_q,   y_ci = c z_ci + d m + e z_q + bias_c.
    Then the feature MLP: x += FF(LN(x)), FF = Linear(d, ff d) -> GELU -> Linear."""

    def __init__(self, d, ff_mult=4, dropout=0.0):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.a, self.c, self.e = (nn.Parameter(torch.ones(d)) for _ in range(3))
        self.b, self.d = (nn.Parameter(torch.zeros(d)) for _ in range(2))
        self.bias_q, self.bias_c = nn.Parameter(torch.zeros(d)), nn.Parameter(torch.zeros(d))
        self.ff = nn.Sequential(nn.Linear(d, ff_mult * d), nn.GELU(), nn.Linear(ff_mult * d, d))
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        z = self.norm1(x)
        zq, zc = z[:, :1], z[:, 1:]
        m = zc.mean(1, keepdim=True)
        yq = self.a * zq + self.b * m + self.bias_q
        yc = self.c * zc + self.d * m + self.e * zq + self.bias_c
        x = x + self.drop(torch.cat([yq, yc], 1))
        return x + self.drop(self.ff(self.norm2(x)))


class RetrievalMixer(nn.Module):
    """Scores N candidates for a query from frozen embeddings (retrieval.py's docstring).

    forward(query float [B, d_in], cands float [B, N, d_in]) -> scores float [B, N],
    permutation-equivariant in the candidates, for any N >= 1. Inputs are
    standardised per channel with statistics set by set_input_stats (training
    embeddings), then projected to d_r (one projection for the query row, one for
    candidate rows), mixed by n_layer EquivariantMixerBlocks, and scored by
    LN -> Linear(d_r, 1) on the candidate rows."""

    def __init__(self, d_in, d_r=128, n_layer=2, ff_mult=4, dropout=0.0):
        super().__init__()
        self.register_buffer('mu', torch.zeros(d_in))
        self.register_buffer('sd', torch.ones(d_in))
        self.in_q, self.in_c = nn.Linear(d_in, d_r), nn.Linear(d_in, d_r)
        self.blocks = nn.ModuleList(EquivariantMixerBlock(d_r, ff_mult, dropout) for _ in range(n_layer))
        self.norm_f = nn.LayerNorm(d_r)
        self.head = nn.Linear(d_r, 1)

    @torch.no_grad()
    def set_input_stats(self, emb):
        """Per-channel mean and std of emb float [M, d_in] (the training embeddings)."""
        self.mu.copy_(emb.mean(0))
        self.sd.copy_(emb.std(0).clamp(min=1e-6))

    def forward(self, query, cands):
        q = self.in_q((query - self.mu) / self.sd)[:, None]
        c = self.in_c((cands - self.mu) / self.sd)
        x = torch.cat([q, c], 1)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm_f(x[:, 1:])).squeeze(-1)


def build_model(cfg):
    """The model for cfg: Autoencoder if cfg.task == 'autoencode', else LanguageModel."""
    return Autoencoder(cfg) if cfg.task == 'autoencode' else LanguageModel(cfg)
