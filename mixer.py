"""Masked mixers and their baselines: every model kind, its config, token mixings, blocks and models.

A masked mixer is an MLP-Mixer (Tolstikhin et al. 2021) made causal: self-attention is replaced by a
learned token-mixing matrix M = W * tril(1) (Badger 2024, "Masked Mixers for Language Generation and
Retrieval", arXiv 2409.01482). One config and one interface for every kind; read top to bottom: config,
token mixings (each with its incremental path), blocks, models. The baselines' attention: attention.py;
sampling: decode.py; FLOPs: machine.py.

    model = build_model(variant_config('toeplitz', d_model=256, n_layer=4, n_ctx=256))
    logits, loss = model(idx, targets)      # idx long [B, T], T <= n_ctx; loss in nats/token
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange

from attention import Attention, LinearAttention, append_cache, chunk_starts

KINDS = ('mixer', 'transformer', 'gpt', 'hybrid', 'linear_attention')
MIXINGS = ('dense', 'toeplitz', 'recurrent')
CHOICES = dict(kind=KINDS, mixing=MIXINGS, activation=('gelu', 'silu', 'none'), recurrent_form=('column', 'row', 'mixed'),
               task=('lm', 'autoencode'), attention=('sdpa', 'naive'), hybrid=('serial', 'parallel'),
               mixing_init=('decay', 'normal'), block_order=('mix_ff', 'ff_mix'), init=('gpt2', 'kaiming'))


@dataclass
class ModelConfig:
    """Every model's hyper-parameters (a kind ignores fields it does not use); ValueError on a bad combination."""
    vocab_size: int = 4096
    n_ctx: int = 256                # the longest input; position-indexed weights have n_ctx rows
    d_model: int = 256
    n_layer: int = 4
    n_head: int = 1                 # mixer: 1 is the papers' flat mixer (no projections); > 1 adds Linear(d, d) in, out
    kind: str = 'mixer'             # KINDS; 'transformer' is llama-style, 'gpt' GPT-2-style (LayerNorm, GELU, no RoPE)
    mixing: str = 'dense'           # the token mixing of 'mixer' and 'hybrid': MIXINGS
    expansion: int = 1              # > 1: the expanded mixer (two masked mixings, GELU between)
    kernel: int = 1                 # > 1: the convolutional mixer (k taps over the feature axis)
    recurrent_form: str = 'mixed'   # 'column' | 'row' | 'mixed' (the heads alternate)
    norm: bool = True               # norm=False with activation='none' is the linear mixer
    activation: str = 'gelu'
    posenc: bool = False            # learned absolute positions (no gain for mixers: Badger 2024)
    attention: str = 'sdpa'         # 'sdpa' (fused) or 'naive' (the T x T scores materialised; same outputs)
    embed_linear: bool = False      # a Linear(d, d) after the embedding (Badger 2024's best kernel mixer)
    ff_mult: int = 4
    tie_embeddings: bool = True
    dropout: float = 0.0
    fft_threshold: int = 256        # the Toeplitz mixing uses the FFT when T >= this (tune per device: bench.py)
    chunk_size: int = 256           # chunk length of the recurrent mixing and linear attention (likewise)
    hybrid: str = 'serial'          # 'serial': Mix(Attn(z)), the paper's best; 'parallel': Attn(z) + Mix(z)
    task: str = 'lm'                # 'lm' (next token) or 'autoencode'
    # Badger & Roland 2026's Toeplitz mixer (arXiv 2605.06683, ethan-w-roland/ToeplitzMixers) as settings:
    mixing_init: str = 'decay'      # Toeplitz w: 'decay' (a moving average, ~16 tokens) or 'normal' (N(0, 2 / n_ctx))
    block_order: str = 'mix_ff'     # 'ff_mix': each block's feed-forward before its sequence mixing
    final_norm: bool = True         # False: no norm before the head
    init: str = 'gpt2'              # 'kaiming': Linear weights N(0, 2 / fan_in), embeddings N(0, 1), no depth scaling

    def __post_init__(self):
        def check(ok, msg):
            if not ok:
                raise ValueError(f'ModelConfig: {msg}')
        for name, allowed in CHOICES.items():
            check(getattr(self, name) in allowed, f'{name} must be one of {allowed}, got {getattr(self, name)!r}')
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
        check(self.mixing_init == 'decay' or self.mixing == 'toeplitz', "mixing_init='normal' is the Toeplitz mixing's")


# The papers' variants by name -> ModelConfig overrides (`train.py --variant=NAME`).
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
    """ModelConfig of variant `name` on top of the `base` overrides. Raises ValueError for an unknown name."""
    if name not in VARIANTS:
        raise ValueError(f'unknown variant {name!r}; choose from {", ".join(VARIANTS)}')
    return ModelConfig(**{**base, **VARIANTS[name]})


# ----------------------------------------------------------------------------- token mixings

class HeadMixing(nn.Module):
    """Base of the token mixings: x float [B, T, d] at positions pos.. -> float [B, T, d]. n_head = 1:
    no projections (the flat mixer); n_head > 1: Linear(d, d) -> heads of e = d / n_head -> mix ->
    concat -> Linear(d, d). Subclasses implement mix(z [B, H, T, e], state (decoding) or None, pos)."""
    def __init__(self, d_model, n_head):
        super().__init__()
        self.n_head, self.d_model = n_head, d_model
        self.proj_in = nn.Linear(d_model, d_model) if n_head > 1 else None
        self.proj_out = nn.Linear(d_model, d_model) if n_head > 1 else None

    def forward(self, x, state=None, pos=0):
        z = self.proj_in(x) if self.proj_in is not None else x
        y = self.mix(rearrange(z, 'b t (h e) -> b h t e', h=self.n_head), state, pos)
        y = rearrange(y, 'b h t e -> b t (h e)')
        return self.proj_out(y) if self.proj_out is not None else y


def mix_tokens(M, z):
    """M z per head: M float [H, T, S], z float [B, H, S, e] -> [B, H, T, e]. An einsum, not M @ z: matmul
    broadcasts M to a [B, H, T, S] copy, saves it for backward and sums a [B, H, T, S] gradient of it."""
    return torch.einsum('hts,bhse->bhte', M, z)


def prefix_mean(mask):
    """Rows of `mask` (bool [..., R, C]) normalised to sum to 1: a causal running mean."""
    m = mask.float()
    return m / m.sum(-1, keepdim=True).clamp(min=1)


class MaskedMixing(HeadMixing):
    """Dense masked token mixing (Badger 2024): y_i = sum_{j<=i} M[i, j] z_j + c_i, M = W * tril(1)
    formed inside the autograd graph on every call (the upper triangle gets zero gradient: it
    stays exactly 0); length T uses the leading T x T block. expansion e > 1: h = GELU(M1 z + c1),
    e hidden rows a position (row r is position r // e), y = M2 h + c2, both masked by position.
    kernel k > 1 (the "fully convolutional" mixer): k matrices, tap u reading the features
    shifted by u - (k - 1) // 2. Init: rows of M = out_scale x the mean of the past, bias 0;
    for e > 1, M1 = the identity and M2 the prefix mean (one averaging: docs/claims.md)."""
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
        z = append_cache(state, 'z', z)                                        # [B, H, end, e]
        W1 = (self.W1[..., self.e * pos:self.e * end, :end]
              * self.mask1[self.e * pos:self.e * end, :end])              # rows of the new positions
        h = mix_tokens(W1[:, 0], z) if self.k == 1 else torch.einsum('hkts,bhkse->bhte', W1, self._taps(z))
        h = h + self.c1[:, self.e * pos:self.e * end]
        if self.e == 1:
            return h
        h = append_cache(state, 'h', F.gelu(h))                                # [B, H, e end, e]
        W2 = self.W2[:, pos:end, :self.e * end] * self.mask2[pos:end, :self.e * end]
        return mix_tokens(W2, h) + self.c2[:, pos:end]


class ToeplitzMixing(HeadMixing):
    """Toeplitz masked mixing (blog post "Masked Recurrent Mixers"): M[i, j] = w[i - j] for j <= i, n_ctx
    weights a head: a causal convolution. Two equal paths (tested): the T x T matrix, and for T >=
    fft_threshold an FFT (pad to 2T, rfft, multiply, irfft, keep T). Init 'decay': w[k] = out_scale
    (1 - b) b^k, b = 15/16 (a moving average over ~16 tokens); 'normal': w ~ N(0, 2 / n_ctx) (Kaiming,
    Badger & Roland 2026's Toeplitz mixer, arXiv 2605.06683); bias c 0. Decoding caches z."""
    def __init__(self, n_ctx, d_model, n_head=1, fft_threshold=256, out_scale=1.0, init='decay'):
        super().__init__(d_model, n_head)
        self.fft_threshold = fft_threshold
        b = 1 - 1 / 16
        w = (out_scale * ((1 - b) * b ** torch.arange(n_ctx).float()).repeat(n_head, 1) if init == 'decay' else
             torch.randn(n_head, n_ctx) * math.sqrt(2 / n_ctx))
        self.w = nn.Parameter(w)
        self.c = nn.Parameter(torch.zeros(n_head, n_ctx, 1))

    def matrix(self, rows, T):
        """Rows `rows` (a slice) of the effective matrix for length T: float [H, R, T]."""
        lag = (torch.arange(rows.start, rows.stop, device=self.w.device)[:, None]
               - torch.arange(T, device=self.w.device)[None, :])
        return self.w[:, lag.clamp(min=0)] * (lag >= 0)

    def mix(self, z, state=None, pos=0, use_fft=None):
        T = z.shape[2]
        z = append_cache(state, 'z', z)
        if use_fft is None:
            use_fft = state is None and T >= self.fft_threshold
        if use_fft:
            # The transformed axis last and contiguous, the layout cuFFT computes in: torch.compile
            # traces the FFTs' output strides, and with the length axis at dim 2 the traced strides
            # were not the ones CUDA returns (inductor failed 'stride 1==8 at dim=2' on an H200).
            assert pos == 0, 'the FFT path computes a whole sequence'
            n = 2 * T
            zf = torch.fft.rfft(rearrange(z.float(), 'b h t e -> b h e t').contiguous(), n=n)   # [B, H, e, n/2+1]
            wf = torch.fft.rfft(self.w[:, :T].float(), n=n)                                      # [H, n/2+1]
            y = torch.fft.irfft(zf * wf[:, None], n=n)[..., :T]                                  # [B, H, e, T]
            y = rearrange(y, 'b h e t -> b h t e').to(z.dtype)
        else:
            y = mix_tokens(self.matrix(slice(pos, pos + T), pos + T), z)
        return y + self.c[:, pos:pos + T]


class RecurrentMixing(HeadMixing):
    """Masked recurrent mixing (blog post "Masked Recurrent Mixers"). Per head a decay
    a = sigmoid(decay_logit) in (0, 1), per position v and c:
      column form  M[i, j] = v[i] a^(i-j):  h_t = a h_{t-1} + z_t,      y_t = v_t h_t + c_t
      row form     M[i, j] = v[j] a^(i-j):  h_t = a h_{t-1} + v_t z_t,  y_t = h_t + c_t
    'mixed': even heads column, odd heads row. Training runs the parallel form in chunks (a^(i-j) for
    i >= j only: no overflow), the state carried between them; decoding is a chunk of one token, the
    state [B, H, e] a layer. Init: time constants 1 / (1 - a) from 4 to n_ctx, v = out_scale (1 - a)."""
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
        """One chunk z [B, H, C, e] at positions pos.., state h0 [B, H, e] or None (zeros)
        -> (y [B, H, C, e], the state after the chunk [B, H, e])."""
        C = z.shape[2]
        v = self.v[:, pos:pos + C, None]                                          # [H, C, 1]
        u = torch.where(self.column, z, v * z)
        hs = mix_tokens(self.powers(C).to(z.dtype), u)                            # [B, H, C, e]
        if h0 is not None:
            log_a = F.logsigmoid(self.decay_logit.float())[:, None]
            carry = torch.exp(torch.arange(1, C + 1, device=z.device) * log_a)   # a^(t+1): [H, C]
            hs = hs + carry[:, :, None].to(z.dtype) * h0[:, :, None]
        y = torch.where(self.column, v * hs, hs) + self.c[:, pos:pos + C]
        return y, hs[:, :, -1]


class HybridMixing(nn.Module):
    """Transformer-mixer hybrids (Badger 2024): attention and a masked mixing in one branch, x float [B, T, d]
    -> [B, T, d]. serial (the paper's best): Mix(Attn(z)), the mixing started at the identity, so a fresh
    hybrid is the transformer (a prefix-mean start averages attention's selectivity away: docs/claims.md).
    parallel: Attn(z) + Mix(z), Mix with n_head heads and a small-init output projection, as attention."""
    def __init__(self, cfg):
        super().__init__()
        self.parallel = cfg.hybrid == 'parallel'
        self.attn = Attention(cfg.n_ctx, cfg.d_model, cfg.n_head, naive=cfg.attention == 'naive')
        self.mix = make_token_mixing(cfg, n_head=cfg.n_head if self.parallel else 1)
        if not self.parallel:
            with torch.no_grad():                  # M = I (its bias starts at 0): a fresh hybrid is the transformer
                if cfg.mixing == 'dense':
                    self.mix.W1.copy_(torch.eye(cfg.n_ctx).expand_as(self.mix.W1))
                else:                              # Toeplitz: lag 0 only
                    self.mix.w.zero_()
                    self.mix.w[:, 0] = 1.0

    def forward(self, x, state=None, pos=0):
        s_attn, s_mix = (None, None) if state is None else (state.setdefault('attn', {}), state.setdefault('mix', {}))
        a = self.attn(x, s_attn, pos)
        return a + self.mix(x, s_mix, pos) if self.parallel else self.mix(a, s_mix, pos)


# Init scale of a mixer's token mixing when nothing projects its output (n_head = 1): near the
# N(0, 0.02) embeddings' scale. 1 stuck at the unigram loss; 0.01 learned as fast as 0 (docs/claims.md).
MIX_INIT_SCALE = 0.01


def make_token_mixing(cfg, n_head, out_scale=1.0):
    """The masked token mixing selected by cfg.mixing, with n_head heads."""
    if cfg.mixing == 'dense':
        return MaskedMixing(cfg.n_ctx, cfg.d_model, n_head, cfg.expansion, cfg.kernel, out_scale)
    if cfg.mixing == 'toeplitz':
        return ToeplitzMixing(cfg.n_ctx, cfg.d_model, n_head, cfg.fft_threshold, out_scale, cfg.mixing_init)
    return RecurrentMixing(cfg.n_ctx, cfg.d_model, n_head, cfg.recurrent_form, cfg.chunk_size, out_scale)


# ----------------------------------------------------------------------------- blocks and models

class MLP(nn.Module):
    """Mixer feed-forward: Linear(d, hidden) -> GELU (or SiLU, or identity) -> Linear(hidden, d)."""
    def __init__(self, d_model, hidden, activation='gelu'):
        super().__init__()
        self.fc = nn.Linear(d_model, hidden)
        self.act = {'gelu': nn.GELU(), 'silu': nn.SiLU()}.get(activation, nn.Identity())
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
    """Pre-norm residual block (MLP-Mixer, Badger 2024): x += Mix(norm(x)); x += FF(norm(x)) (the
    other way round with block_order='ff_mix'), Mix the kind's sequence mixing, FF the GELU MLP
    (mixers, GPT) or SwiGLU. forward(x float [B, T, d], state (the layer's decoding dict) or None, pos)."""
    def __init__(self, cfg):
        super().__init__()
        self.norm1, self.norm2 = make_norm(cfg), make_norm(cfg)
        if cfg.kind == 'mixer':
            self.mixing = make_token_mixing(cfg, cfg.n_head, MIX_INIT_SCALE if cfg.n_head == 1 else 1.0)
        elif cfg.kind in ('transformer', 'gpt'):
            self.mixing = Attention(cfg.n_ctx, cfg.d_model, cfg.n_head, rope=cfg.kind == 'transformer',
                                    naive=cfg.attention == 'naive')
        elif cfg.kind == 'hybrid':
            self.mixing = HybridMixing(cfg)
        else:
            self.mixing = LinearAttention(cfg.d_model, cfg.n_head, cfg.chunk_size)
        self.ff = (MLP(cfg.d_model, cfg.ff_mult * cfg.d_model, cfg.activation) if cfg.kind in ('mixer', 'gpt')
                   else SwiGLU(cfg.d_model, cfg.ff_mult))
        self.drop = nn.Dropout(cfg.dropout)
        self.ff_first = cfg.block_order == 'ff_mix'

    def forward(self, x, state=None, pos=0):
        return self.residual(x, lambda z: self.mixing(z, state, pos))

    def residual(self, x, mix):
        """The block's two residual branches in its order, with `mix` (z float [B, T, d] -> the same) as
        the sequence mixing: forward's, or decode.py's static step."""
        if self.ff_first:
            x = x + self.drop(self.ff(self.norm2(x)))
            return x + self.drop(mix(self.norm1(x)))
        x = x + self.drop(mix(self.norm1(x)))
        return x + self.drop(self.ff(self.norm2(x)))


class _Model(nn.Module):
    """What LanguageModel and Autoencoder share: embedding, head, init, loss."""
    def _build_io(self, cfg):
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.embed_proj = nn.Linear(cfg.d_model, cfg.d_model) if cfg.embed_linear else nn.Identity()
        self.norm_f = make_norm(cfg) if cfg.final_norm else nn.Identity()
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight

    def _init_weights(self, n_blocks):
        """GPT-2 init: Linear and Embedding weights N(0, 0.02), biases 0, projections into
        the residual stream N(0, 0.02 / sqrt(2 n_blocks)); token mixings keep their own. With
        cfg.init 'kaiming' (Badger & Roland 2026): Linear weights N(0, 2 / fan_in), biases 0,
        embeddings N(0, 1) (torch's default), no depth scaling."""
        if self.cfg.init == 'kaiming':
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    nn.init.kaiming_normal_(m.weight)
                    if m.bias is not None:
                        nn.init.zeros_(m.bias)
                elif isinstance(m, nn.Embedding):
                    nn.init.normal_(m.weight)
            return
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
        """Mean cross entropy (nats/token) of logits [B, T, vocab] against targets long
        [B, T] (-1 ignored); None when targets is None."""
        if targets is None:
            return None
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-1)

    def num_params(self):
        """Number of parameters (tied embeddings counted once)."""
        return sum(p.numel() for p in self.parameters())


class LanguageModel(_Model):
    """Causal language model of any kind: forward(idx long [B, T], targets long [B, T] or
    None) -> (logits float [B, T, vocab], mean next-token cross entropy in nats or None).
    T <= n_ctx, else ValueError (max_len None: linear attention without posenc has no
    limit). decode() is the incremental pass that generation (decode.py) steps through."""
    def __init__(self, cfg):
        super().__init__()
        self._build_io(cfg)
        self.wpe = nn.Parameter(0.02 * torch.randn(cfg.n_ctx, cfg.d_model)) if cfg.posenc else None
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self._init_weights(cfg.n_layer)
        self.max_len = None if cfg.kind == 'linear_attention' and not cfg.posenc else cfg.n_ctx

    def hidden(self, idx, cache=None, layer=None):
        """Residual stream after block `layer` (default the last, before the final norm):
        float [B, T, d]. With a Cache, idx are the tokens after cache.pos, and the cache
        advances. Raises ValueError past n_ctx."""
        return self.hidden_from_embeddings(self.wte(idx), cache, layer)

    def hidden_from_embeddings(self, x, cache=None, layer=None):
        """hidden() of input vectors x float [B, T, d] in place of wte(idx) (input
        representation accuracy optimises them: experiments/represent.py)."""
        pos = cache.pos if cache is not None else 0
        if self.max_len is not None and pos + x.shape[1] > self.max_len:
            raise ValueError(f'sequence of {pos + x.shape[1]} tokens is longer than n_ctx={self.max_len}')
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
        """Incremental forward: logits float [B, T, vocab] of the tokens idx long [B, T]
        after the cache.pos tokens in `cache`; equals forward() on the whole sequence."""
        return self.lm_head(self.norm_f(self.hidden(idx, cache)))

    def embed(self, idx, layer=None):
        """A text's embedding (Badger 2024): the last token's hidden vector after block
        `layer` (default the last): float [B, d]."""
        return self.hidden(idx, layer=layer)[:, -1]


class Autoencoder(_Model):
    """Autoencoder (blog post "Masked Mixers II"): encoder blocks read the tokens; the last token's last
    hidden vector e [B, d], repeated T times, is the decoder's input; the decoder reconstructs every
    token. forward(idx long [B, T], targets or None) -> (logits float [B, T, vocab], cross entropy over
    the T positions in nats). Attention kinds (and posenc) add learned positions to the decoder's
    input: attention over T equal vectors could not tell positions apart."""
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
        if idx.shape[1] > self.cfg.n_ctx:
            raise ValueError(f'sequence of {idx.shape[1]} tokens is longer than n_ctx={self.cfg.n_ctx}')
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


def build_model(cfg):
    """The model of cfg: Autoencoder if cfg.task == 'autoencode', else LanguageModel."""
    return Autoencoder(cfg) if cfg.task == 'autoencode' else LanguageModel(cfg)


if __name__ == '__main__':
    import sys
    print('mixer.py: error: the models module, not a command: python train.py --variant=NAME trains one (--help)', file=sys.stderr)
    sys.exit(2)
