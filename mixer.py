"""Masked mixers: every model kind, its config, the masked token mixings, blocks and models.

A masked mixer is an MLP-Mixer (Tolstikhin et al. 2021) made causal: self-attention is replaced by a
learned token-mixing matrix M = W * tril(1) (Badger 2024, "Masked Mixers for Language Generation and
Retrieval", arXiv 2409.01482). Read top to bottom: the config, the building blocks, the masked token
mixings (the flat one first), then the block and the models. The baselines' sequence mixing (attention,
linear attention, the hybrid) is in attention.py, which stands on this file; generation is in sample.py.

    cfg = variant_config('flat', vocab_size=4096, n_ctx=256, d_model=256, n_layer=4, n_head=1)
    model = build_model(cfg)
    logits, loss = model(idx, targets)      # idx long [B, T], T <= n_ctx; loss in nats per token
    state = model.init_state(B)             # decoding: every layer's state, allocated once
    logits = model.step(idx[:, :5], state, 0)        # then model.step(next_token, state, 5), ...
"""

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange

KINDS = ('mixer', 'transformer', 'gpt', 'hybrid', 'linear_attention')
TOKEN_MIXINGS = ('flat', 'toeplitz', 'recurrent')
CHOICES = dict(kind=KINDS, task=('lm', 'autoencode'), activation=('gelu', 'silu', 'none'),
               token_mixing=TOKEN_MIXINGS, attention=('sdpa', 'naive'), hybrid_form=('serial', 'parallel'),
               recurrent_form=('column', 'row', 'mixed'), mixing_init=('average', 'normal'),
               block_order=('mix_ff', 'ff_mix'), init=('gpt2', 'kaiming'))


@dataclass
class ModelConfig:
    """A model's hyper-parameters, in groups by the kinds that read them (a kind ignores the fields of the
    other groups). Raises ValueError for a value out of range or a combination no model is built from.
    The first five fields have no default: their defaults are train.py's settings, as in nanoGPT.
    train.py has a setting of the same name for every field, and the comment after a field is its --help."""
    # every kind
    vocab_size: int                 # tokens (the data's: data/prepare.py's meta.json)
    n_ctx: int                      # tokens per window; position-indexed weights have n_ctx rows
    d_model: int                    # the residual stream's width
    n_layer: int                    # blocks (per stack: an autoencoder has two)
    n_head: int                     # mixers: 1 is the papers' flat mixer; > 1 adds Linear(d, d) in and out
    kind: str = 'mixer'             # 'mixer', 'transformer' (llama), 'gpt', 'hybrid' or 'linear_attention'
    task: str = 'lm'                # 'lm' (next token) or 'autoencode'
    norm: bool = True               # norm=False with activation='none' is the linear mixer
    activation: str = 'gelu'        # the feed-forward's: 'gelu', 'silu' or 'none'
    ff_mult: int = 4                # the feed-forward's width d_ff, in units of d_model
    posenc: bool = False            # learned absolute positions added to the input (no gain for mixers)
    embed_proj: bool = False        # a Linear(d, d) after the embedding (Badger 2024's best kernel mixer)
    tie_embeddings: bool = True     # the LM head is the embedding matrix
    dropout: float = 0.0
    # the masked mixings ('mixer', and the hybrid's mixing)
    token_mixing: str = 'flat'      # 'flat', 'toeplitz' or 'recurrent'
    expansion: int = 1              # > 1: the expanded mixer (two masked mixings, GELU between)
    feature_kernel: int = 1         # > 1: the kernel mixer, a convolution of this many taps over the features
    # the attention kinds ('transformer', 'gpt', 'hybrid')
    attention: str = 'sdpa'         # 'sdpa' (fused) or 'naive' (the T x T scores materialised; same outputs)
    # the hybrid
    hybrid_form: str = 'serial'     # 'serial': Mix(Attn(z)), the paper's best; 'parallel': Attn(z) + Mix(z)
    # the recurrent mixing
    recurrent_form: str = 'mixed'   # its heads: 'column', 'row' or 'mixed' (the two alternating)
    # Badger & Roland 2026's Toeplitz mixer as settings, for any kind (arXiv 2605.06683, ToeplitzMixers)
    mixing_init: str = 'average'    # Toeplitz w: 'average' (a moving average of ~16 tokens) or 'normal'
    block_order: str = 'mix_ff'     # or 'ff_mix': each block's feed-forward before its token mixing
    final_norm: bool = True         # False: no norm before the head
    init: str = 'gpt2'              # or 'kaiming': Linear weights N(0, 2 / fan_in), embeddings N(0, 1)
    # speed only: the outputs agree at any value (tested)
    fft_threshold: int = 256        # the Toeplitz mixing uses the FFT when T >= this (docs/performance.md)
    chunk_size: int = 256           # chunk length of the recurrent mixing and of linear attention

    def __post_init__(self):
        def check(ok, msg):
            if not ok:
                raise ValueError(f'ModelConfig: {msg}')
        for name, allowed in CHOICES.items():
            value = getattr(self, name)
            check(value in allowed, f'{name} must be one of {allowed}, got {value!r}')
        for name in ('vocab_size', 'n_ctx', 'd_model', 'n_layer', 'n_head', 'expansion', 'feature_kernel',
                     'ff_mult', 'fft_threshold', 'chunk_size'):
            check(getattr(self, name) >= 1, f'{name} must be >= 1, got {getattr(self, name)}')
        check(self.d_model % self.n_head == 0,
              f'd_model={self.d_model} is not divisible by n_head={self.n_head}')
        check(not (self.expansion > 1 and self.feature_kernel > 1),
              'expansion > 1 and feature_kernel > 1 cannot be combined')
        check(self.expansion == 1 and self.feature_kernel == 1 or self.token_mixing == 'flat',
              'expansion and feature_kernel apply to the flat mixing only')
        check(self.kind not in ('transformer', 'hybrid') or (self.d_model // self.n_head) % 2 == 0,
              'RoPE needs an even head size d_model / n_head')
        check(self.kind != 'hybrid' or self.token_mixing in ('flat', 'toeplitz')
              and self.expansion == self.feature_kernel == 1,
              "the hybrid's token mixing is flat or toeplitz, with expansion = feature_kernel = 1")
        check(0.0 <= self.dropout < 1.0, f'dropout must be in [0, 1), got {self.dropout}')
        check(self.mixing_init == 'average' or self.token_mixing == 'toeplitz',
              "mixing_init='normal' is the Toeplitz mixing's")


# The papers' variants by name -> ModelConfig overrides (`train.py --variant=NAME`).
VARIANTS = {
    'flat': {},
    'expanded': dict(expansion=2),
    'multihead': dict(n_head=4),
    'kernel': dict(feature_kernel=3),       # the papers' "kernel mixer": a convolution over the features
    'toeplitz': dict(token_mixing='toeplitz', n_head=4),
    'recurrent': dict(token_mixing='recurrent', n_head=4, recurrent_form='mixed'),
    'linear_mixer': dict(norm=False, activation='none'),      # no norm, no nonlinearity
    'posenc': dict(posenc=True),
    'transformer': dict(kind='transformer', n_head=4),
    'gpt': dict(kind='gpt', n_head=4, posenc=True),
    'transformer_naive': dict(kind='transformer', n_head=4, attention='naive'),
    'hybrid': dict(kind='hybrid', n_head=4),
    'hybrid_parallel': dict(kind='hybrid', n_head=4, hybrid_form='parallel'),
    'linear_attention': dict(kind='linear_attention', n_head=4),
}


def variant_config(name, **base):
    """ModelConfig of variant `name`: its VARIANTS overrides on top of the fields in `base` (which must
    give the five without a default). Raises ValueError for an unknown name."""
    if name not in VARIANTS:
        raise ValueError(f'unknown variant {name!r}; choose from {", ".join(VARIANTS)}')
    return ModelConfig(**{**base, **VARIANTS[name]})


# ----------------------------------------------------------------------------- building blocks
# What every sequence mixing uses (these and attention.py's): the causal rule, where a decoding step writes
# and reads, the zeros its state starts from; then the blocks' norm and feed-forward.

def causal_mask(T, rows=slice(None), device=None):
    """The causal rule, j <= i: which of the positions j = 0..T-1 the positions i in `rows` (a slice, or
    long [R] of positions; default all T) may read -> bool [R, T]. Every causal mask of the models is this
    one (SDPA's is_causal=True is tested equal to it; the Toeplitz FFT keeps it by its padding, tested)."""
    pos = torch.arange(T, device=device)
    return pos <= pos[rows][:, None]


def prefix_mean(mask):
    """Rows of `mask` (bool [..., R, C]) scaled to sum to 1: a causal running mean -> float [..., R, C]."""
    m = mask.float()
    return m / m.sum(-1, keepdim=True).clamp(min=1)


def span(pos, t, n_ctx):
    """Where a decoding step of t new tokens at positions pos..pos+t-1 writes and what it reads -> (rows,
    end): it writes rows `rows` of its state and reads positions 0..end-1. pos an int (an eager step):
    rows = slice(pos, pos + t), end = pos + t, so a step reads, and costs, what it has seen. pos a 0-dim
    long tensor (sample.Decoder's compiled step): rows = pos + arange(t), end = n_ctx, the positions past
    the new tokens masked: the same shapes at every position, one graph for them all."""
    if isinstance(pos, int):
        return slice(pos, pos + t), pos + t
    return pos + torch.arange(t, device=pos.device), n_ctx


def state_zeros(module, *shape, device=None, dtype=None):
    """The zeros a decoding state starts from: float `shape` on `device` in `dtype`, by default those of
    the module's parameters (every init_state's tensors come from here)."""
    p = next(module.parameters())
    return torch.zeros(shape, device=device or p.device, dtype=dtype or p.dtype)


def make_norm(cfg):
    """A block's norm: LayerNorm for mixers (as in the papers) and GPT, RMSNorm for the llama-style kinds,
    the identity without norm (the linear mixer)."""
    if not cfg.norm:
        return nn.Identity()
    return nn.LayerNorm(cfg.d_model) if cfg.kind in ('mixer', 'gpt') else nn.RMSNorm(cfg.d_model)


class MLP(nn.Module):
    """The mixers' and GPT-2's feed-forward, per position: Linear(d, d_ff) -> GELU (or SiLU, or the
    identity) -> Linear(d_ff, d); x float [..., d] -> [..., d]."""
    def __init__(self, d_model, d_ff, activation):
        super().__init__()
        self.fc = nn.Linear(d_model, d_ff)
        self.act = {'gelu': nn.GELU(), 'silu': nn.SiLU()}.get(activation, nn.Identity())
        self.proj_out = nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.proj_out(self.act(self.fc(x)))


# ----------------------------------------------------------------------------- the masked token mixings
# Every sequence mixing (these and attention.py's) maps x float [B, T, d] -> [B, T, d] and has five
# methods: forward; init_state, its decoding state (every buffer's shape in its docstring); step(x, state,
# pos), equal to forward (tested); flops, its forward FLOPs per token; decays, which of its own parameters
# take weight decay. In the einops patterns, H is the head axis and e = d / H the features per head.

class HeadMixing(nn.Module):
    """What the masked mixings share, their heads: n_head = 1 mixes x itself (the papers' flat mixer);
    n_head > 1 projects x by Linear(d, d) (proj_in), mixes each head of e = d / n_head features by its own
    matrix, concatenates the heads and projects back (proj_out). mix(M, z) is the product of each head's
    matrix and its inputs."""
    BIASES = ('c',)                                  # the position-indexed biases: no weight decay

    def __init__(self, n_ctx, d_model, n_head):
        super().__init__()
        self.n_ctx, self.d_model, self.n_head, self.head_size = n_ctx, d_model, n_head, d_model // n_head
        self.proj_in = nn.Linear(d_model, d_model) if n_head > 1 else nn.Identity()
        self.proj_out = nn.Linear(d_model, d_model) if n_head > 1 else nn.Identity()

    @staticmethod
    def mix(M, z):
        """M z per head: M float [H, R, C], z float [B, H, C, e] -> [B, H, R, e]. An einsum, not M @ z:
        matmul would broadcast M to a [B, H, R, C] copy and save it for backward."""
        return torch.einsum('Hrc,bHce->bHre', M, z)

    def decays(self):
        """{parameter: whether it takes weight decay} of its own parameters (not the projections')."""
        return {p: p.dim() >= 2 and n not in self.BIASES for n, p in self.named_parameters(recurse=False)}


class MatrixMixing(HeadMixing):
    """The masked mixings whose output is one matrix product per head, y = M z + c (the flat, kernel and
    Toeplitz mixings): their forward pass, decoding state and decoding step, written once. Each subclass
    builds its weights and its bias c float [H, n_ctx, 1] in its own __init__ and says what M is:
    matrix(T, rows), the rows `rows` of M over the inputs 0..T-1."""

    def forward(self, x):
        z = rearrange(self.proj_in(x), 'b t (H e) -> b H t e', H=self.n_head)      # the heads: [B, H, T, e]
        T = z.shape[2]
        y = self.mix(self.matrix(T), z) + self.c[:, :T]                             # M z + c
        return self.proj_out(rearrange(y, 'b H t e -> b t (H e)'))

    def init_state(self, batch_size, device=None, dtype=None):
        """{'z': float [B, H, n_ctx, e]}: the inputs z_j of the positions seen (the mixer's KV cache)."""
        shape = batch_size, self.n_head, self.n_ctx, self.head_size
        return {'z': state_zeros(self, *shape, device=device, dtype=dtype)}

    def step(self, x, state, pos):
        """x float [B, t, d], the new tokens at positions pos..pos+t-1 (an int, or a 0-dim long tensor:
        span), after the inputs in state['z'] -> float [B, t, d], the new rows of M z + c; their z are
        written into state['z'] in place."""
        rows, end = span(pos, x.shape[1], self.n_ctx)                   # writes `rows`, reads positions < end
        z = state['z']
        z[:, :, rows] = rearrange(self.proj_in(x), 'b t (H e) -> b H t e', H=self.n_head).to(z.dtype)
        y = self.mix(self.matrix(end, rows), z[:, :, :end]) + self.c[:, rows]
        return self.proj_out(rearrange(y, 'b H t e -> b t (H e)'))


class FlatMixing(MatrixMixing):
    """The flat masked mixing (Badger 2024, "Masked Mixers for Language Generation and Retrieval", arXiv
    2409.01482), per head:  y_i = sum_{j <= i} M[i, j] z_j + c_i,  M = W * tril(1).
    W float [H, n_ctx, n_ctx], c [H, n_ctx, 1]. M is formed inside the autograd graph on every call (W's
    upper triangle gets zero gradient); a length-T input uses the leading T x T block, as a longer input
    would. Init: each row of M the mean of the past, times out_scale; c = 0."""
    def __init__(self, n_ctx, d_model, n_head, out_scale=1.0):
        super().__init__(n_ctx, d_model, n_head)
        self.register_buffer('mask', causal_mask(n_ctx), persistent=False)                  # tril(1)
        self.W = nn.Parameter((prefix_mean(self.mask) * out_scale).repeat(n_head, 1, 1))
        self.c = nn.Parameter(torch.zeros(n_head, n_ctx, 1))

    def matrix(self, T, rows=None):
        """The rows `rows` (span's; default all T) of M = W * tril(1) over the inputs 0..T-1: float
        [H, R, T]. W.narrow, not W[..., :T]: at T = n_ctx a slice is W itself, and W's gradient would take
        the einsum's strides, which DDP warns of."""
        rows = slice(0, T) if rows is None else rows
        return self.W.narrow(-1, 0, T)[..., rows, :] * self.mask[rows, :T]

    def flops(self, T):                     # the whole T x T product, zeros included
        return 2 * T * self.d_model

    def identity_start(self):                # M = I, each token passed through (the serial hybrid's start)
        with torch.no_grad():
            self.W.copy_(torch.eye(self.n_ctx).expand_as(self.W))
        return self


class KernelMixing(MatrixMixing):
    """The kernel mixer, Badger 2024's "fully convolutional" mixer: a convolution over the feature axis
    whose channels are the tokens. With k = feature_kernel taps, per head:
    y_i = sum_u sum_{j <= i} M_u[i, j] shift_u(z_j) + c_i,  M_u = W[:, u] * tril(1), where tap u reads the
    features shifted by u - (k - 1) // 2 (zero outside the head). W float [H, k, n_ctx, n_ctx],
    c [H, n_ctx, 1]. Init: each row of each M_u the mean of the past, times out_scale / k; c = 0."""
    def __init__(self, n_ctx, d_model, n_head, feature_kernel, out_scale=1.0):
        super().__init__(n_ctx, d_model, n_head)
        self.feature_kernel = feature_kernel
        self.register_buffer('mask', causal_mask(n_ctx), persistent=False)                  # tril(1)
        start = prefix_mean(self.mask) * out_scale / feature_kernel
        self.W = nn.Parameter(start.repeat(n_head, feature_kernel, 1, 1))
        self.c = nn.Parameter(torch.zeros(n_head, n_ctx, 1))

    matrix = FlatMixing.matrix                # the flat mixing's M = W * tril(1), per tap: [H, k, R, T]

    def mix(self, M, z):
        """sum_u M_u shift_u(z): M float [H, k, R, C], z float [B, H, C, e] -> [B, H, R, e]."""
        k = self.feature_kernel
        left = (k - 1) // 2
        zp = F.pad(z, (left, k - 1 - left))                                       # the feature axis padded
        taps = torch.stack([zp[..., u:u + z.shape[-1]] for u in range(k)], dim=2)     # [B, H, k, C, e]
        return torch.einsum('Hkrc,bHkce->bHre', M, taps)

    def flops(self, T):
        return 2 * T * self.d_model * self.feature_kernel

    def identity_start(self):                # M = I on the unshifted tap, 0 on the others
        k = self.feature_kernel
        with torch.no_grad():
            self.W.copy_(torch.eye(self.n_ctx) * (torch.arange(k) == (k - 1) // 2)[:, None, None])
        return self


class ExpandedMixing(HeadMixing):
    """The expanded mixer (Badger 2024): the MLP-Mixer's token MLP made causal, per head. The first mixing
    writes `expansion` inner rows per position (inner row r belongs to position r // expansion and reads
    the positions j <= r // expansion): g = GELU(M z + c), M = W * mask; the second reads the inner rows of
    the positions <= i: y_i = sum_r M2[i, r] g_r + c2_i, M2 = W2 * mask2. With n = expansion * n_ctx inner
    rows: W float [H, n, n_ctx], c [H, n, 1], W2 [H, n_ctx, n], c2 [H, n_ctx, 1]. Init: M copies z_{r //
    expansion} to row r, M2 is the mean of the past times out_scale (one average: docs/claims.md)."""
    BIASES = ('c', 'c2')

    def __init__(self, n_ctx, d_model, n_head, expansion, out_scale=1.0):
        super().__init__(n_ctx, d_model, n_head)
        self.expansion = expansion
        at = torch.arange(n_ctx * expansion) // expansion                    # the position of each inner row
        self.register_buffer('mask', causal_mask(n_ctx)[at], persistent=False)     # row r reads j <= at[r]
        self.W = nn.Parameter((at[:, None] == torch.arange(n_ctx)[None, :]).float().repeat(n_head, 1, 1))
        self.c = nn.Parameter(torch.zeros(n_head, n_ctx * expansion, 1))
        self.register_buffer('mask2', causal_mask(n_ctx)[:, at], persistent=False)  # y_i reads at[r] <= i
        self.W2 = nn.Parameter(prefix_mean(self.mask2).repeat(n_head, 1, 1) * out_scale)
        self.c2 = nn.Parameter(torch.zeros(n_head, n_ctx, 1))

    def matrix(self, T, rows=None):
        """The inner rows `rows` (default all expansion * T) of M = W * mask over the inputs 0..T-1: float
        [H, R, T]."""
        rows = slice(0, self.expansion * T) if rows is None else rows
        return self.W.narrow(-1, 0, T)[:, rows] * self.mask[rows, :T]

    def matrix2(self, T, rows=None):
        """The rows `rows` (default all T) of M2 over the inner rows of the positions 0..T-1: float [H, R,
        expansion * T]."""
        rows, C = slice(0, T) if rows is None else rows, self.expansion * T
        return self.W2.narrow(-1, 0, C)[:, rows] * self.mask2[rows, :C]

    def forward(self, x):
        z = rearrange(self.proj_in(x), 'b t (H e) -> b H t e', H=self.n_head)      # [B, H, T, e]
        T = z.shape[2]
        g = F.gelu(self.mix(self.matrix(T), z) + self.c[:, :self.expansion * T])    # [B, H, expansion T, e]
        y = self.mix(self.matrix2(T), g) + self.c2[:, :T]
        return self.proj_out(rearrange(y, 'b H t e -> b t (H e)'))

    def init_state(self, batch_size, device=None, dtype=None):
        """{'z': float [B, H, n_ctx, e], the inputs seen; 'g': float [B, H, expansion * n_ctx, e], their
        inner rows GELU(M z + c)}."""
        shape = batch_size, self.n_head, self.n_ctx, self.head_size
        inner = batch_size, self.n_head, self.expansion * self.n_ctx, self.head_size
        return {'z': state_zeros(self, *shape, device=device, dtype=dtype),
                'g': state_zeros(self, *inner, device=device, dtype=dtype)}

    def step(self, x, state, pos):
        """MatrixMixing.step's, through both mixings: the new positions' inner rows of g are written, then
        read (x float [B, t, d] -> [B, t, d])."""
        n, z, g = self.expansion, state['z'], state['g']
        rows, end = span(pos, x.shape[1], self.n_ctx)
        inner, _ = span(n * pos, n * x.shape[1], n * self.n_ctx)              # the new positions' inner rows
        z[:, :, rows] = rearrange(self.proj_in(x), 'b t (H e) -> b H t e', H=self.n_head).to(z.dtype)
        g_new = F.gelu(self.mix(self.matrix(end, inner), z[:, :, :end]) + self.c[:, inner])
        g[:, :, inner] = g_new.to(g.dtype)
        y = self.mix(self.matrix2(end, rows), g[:, :, :n * end]) + self.c2[:, rows]
        return self.proj_out(rearrange(y, 'b H t e -> b t (H e)'))

    def flops(self, T):
        return 4 * T * self.d_model * self.expansion


class ToeplitzMixing(MatrixMixing):
    """The Toeplitz masked mixing (blog post "Masked Recurrent Mixers"), per head M[i, j] = w[i - j] for
    j <= i, n_ctx weights per head (a causal convolution along the sequence): y_i = sum_{k <= i} w[k]
    z_{i-k} + c_i. w float [H, n_ctx], c [H, n_ctx, 1]. Two equal paths (tested): the T x T matrix, and for
    T >= fft_threshold an FFT (pad to 2T, rfft, multiply, irfft, keep T). Decoding is MatrixMixing's (the
    inputs seen, the new rows of M), with this M. Init (mixing_init) 'average': w[k] = out_scale (1 - b)
    b^k, b = 15/16 (a moving average over ~16 tokens); 'normal': w ~ N(0, 2 / n_ctx) (Kaiming, Badger &
    Roland 2026, arXiv 2605.06683); c = 0."""
    def __init__(self, n_ctx, d_model, n_head, fft_threshold, mixing_init, out_scale=1.0):
        super().__init__(n_ctx, d_model, n_head)
        self.fft_threshold = fft_threshold
        b = 1 - 1 / 16
        if mixing_init == 'average':
            w = out_scale * ((1 - b) * b ** torch.arange(n_ctx).float()).repeat(n_head, 1)
        else:
            w = torch.randn(n_head, n_ctx) * math.sqrt(2 / n_ctx)
        self.w = nn.Parameter(w)
        self.c = nn.Parameter(torch.zeros(n_head, n_ctx, 1))

    def matrix(self, T, rows=None):
        """The rows `rows` (default all T) of M[i, j] = w[i - j] (0 for j > i) over the inputs 0..T-1: float
        [H, R, T]."""
        rows = slice(0, T) if rows is None else rows
        pos = torch.arange(T, device=self.w.device)
        lag = pos[rows][:, None] - pos                                              # i - j: [R, T]
        return self.w[:, lag.clamp(min=0)] * causal_mask(T, rows, self.w.device)

    def forward(self, x):
        z = rearrange(self.proj_in(x), 'b t (H e) -> b H t e', H=self.n_head)      # [B, H, T, e]
        T = z.shape[2]
        Mz = self.fft(z) if T >= self.fft_threshold else self.mix(self.matrix(T), z)
        return self.proj_out(rearrange(Mz + self.c[:, :T], 'b H t e -> b t (H e)'))

    def fft(self, z):
        """M z of z float [B, H, T, e] by FFT -> [B, H, T, e]. Causal by its padding: the product of rffts of
        length 2T is the circular convolution over 2T, whose output i < T sums w[k] z[i - k] over k <= i
        alone (nothing wraps around: tested). The length axis is last and contiguous: at dim 2, inductor's
        traced strides were not CUDA's ('stride 1==8 at dim=2' on an H200)."""
        T, n = z.shape[2], 2 * z.shape[2]
        zf = torch.fft.rfft(rearrange(z.float(), 'b H t e -> b H e t').contiguous(), n=n)   # [B, H, e, n/2+1]
        wf = torch.fft.rfft(self.w[:, :T].float(), n=n)                                      # [H, n/2+1]
        y = torch.fft.irfft(zf * wf[:, None], n=n)[..., :T]                                  # [B, H, e, T]
        return rearrange(y, 'b H e t -> b H t e').to(z.dtype)

    def flops(self, T):                      # the FFT: rfft(z) + irfft of length 2T + the product
        if T >= self.fft_threshold:
            return int(self.d_model * (10 * math.log2(2 * T) + 6))
        return 2 * T * self.d_model

    def identity_start(self):               # w = (1, 0, 0, ...): M = I
        with torch.no_grad():
            self.w.copy_(torch.eye(1, self.n_ctx).expand_as(self.w))
        return self


class RecurrentMixing(HeadMixing):
    """The masked recurrent mixing (blog post "Masked Recurrent Mixers"), each head with its own rate
    a = sigmoid(a_logit) in (0, 1) and state h:
      column form  M[i, j] = v[i] a^(i-j):  h_t = a h_{t-1} + z_t,      y_t = v_t h_t + c_t
      row form     M[i, j] = v[j] a^(i-j):  h_t = a h_{t-1} + v_t z_t,  y_t = h_t + c_t
    form 'mixed': even heads column, odd heads row. a_logit float [H], v [H, n_ctx], c [H, n_ctx, 1]. A
    decoding step of one token is that recurrence; forward and a prompt go through scan(): chunks of
    chunk_size, each one product by a^(i-j) (j <= i only: no overflow), h carried between the chunks
    (tested equal). Init: the time constants 1 / (1 - a) spread from 4 to n_ctx tokens, v = out_scale
    (1 - a)."""
    def __init__(self, n_ctx, d_model, n_head, form, chunk_size, out_scale=1.0):
        super().__init__(n_ctx, d_model, n_head)
        self.chunk_size = chunk_size
        tau = (torch.logspace(math.log10(4), math.log10(max(n_ctx, 4)), n_head) if n_head > 1
               else torch.tensor([16.]))
        a = torch.exp(-1 / tau)
        self.a_logit = nn.Parameter(torch.logit(a))
        self.v = nn.Parameter(out_scale * (1 - a)[:, None].repeat(1, n_ctx))     # [H, n_ctx]
        self.c = nn.Parameter(torch.zeros(n_head, n_ctx, 1))
        column = [form == 'column' or (form == 'mixed' and head % 2 == 0) for head in range(n_head)]
        self.register_buffer('column', torch.tensor(column)[:, None, None], persistent=False)  # [H, 1, 1]

    def powers(self, T):
        """a^(i-j) for j <= i, else 0: float32 [H, T, T], as exp((i - j) log a)."""
        pos = torch.arange(T, device=self.v.device)
        lag = (pos[:, None] - pos[None, :]).clamp(min=0)
        log_a = F.logsigmoid(self.a_logit.float())[:, None, None]
        return torch.exp(lag * log_a) * causal_mask(T, device=self.v.device)

    def forward(self, x):
        y, _ = self.scan(rearrange(self.proj_in(x), 'b t (H e) -> b H t e', H=self.n_head), None, 0)
        return self.proj_out(rearrange(y, 'b H t e -> b t (H e)'))

    def init_state(self, batch_size, device=None, dtype=None):
        """{'h': float [B, H, e]}: each head's state h after the positions seen (constant size)."""
        return {'h': state_zeros(self, batch_size, self.n_head, self.head_size, device=device, dtype=dtype)}

    def step(self, x, state, pos):
        """x float [B, t, d] at positions pos.. after the state h, which is updated in place -> float
        [B, t, d]: one token is the recurrence h = a h + u, more (a prompt, pos an int) go through scan()."""
        z = rearrange(self.proj_in(x), 'b t (H e) -> b H t e', H=self.n_head)      # [B, H, t, e]
        h = state['h']                                                              # [B, H, e]
        if z.shape[2] > 1:
            y, h_new = self.scan(z, h, pos)
            h.copy_(h_new)
        else:
            rows, column = span(pos, 1, self.n_ctx)[0], self.column[:, 0]
            v, a = self.v[:, rows], torch.sigmoid(self.a_logit.float())[:, None]     # [H, 1], [H, 1]
            z = z[:, :, 0]                                                           # [B, H, e]
            h.copy_(a * h + torch.where(column, z, v * z))                          # h = a h + u
            y = (torch.where(column, v * h, h) + self.c[:, rows, 0])[:, :, None].to(x.dtype)
        return self.proj_out(rearrange(y, 'b H t e -> b t (H e)'))

    def scan(self, z, h, pos):
        """z float [B, H, T, e] at positions pos.. (an int) after the state h float [B, H, e] (None: zero)
        -> (y float [B, H, T, e], the state after z [B, H, e]). Per chunk of C positions: the states are
        a^(i-j) u, with the state before the chunk as its input at position -1."""
        ys, C = [], self.chunk_size
        for i in range((z.shape[2] + C - 1) // C):    # the chunks counted first: under torch.compile,
            start = i * C                              # range(0, T, C) would recompile per T
            zc, rows = z[:, :, start:start + C], slice(pos + start, pos + start + min(C, z.shape[2] - start))
            v = self.v[:, rows, None]                                                   # [H, C, 1]
            u = torch.where(self.column, zc, v * zc)
            if h is None:
                hs = self.mix(self.powers(u.shape[2]).to(u.dtype), u)                  # [B, H, C, e]
            else:                                                                       # h the input at -1
                u = torch.cat([h[:, :, None].to(u.dtype), u], 2)
                hs = self.mix(self.powers(u.shape[2]).to(u.dtype), u)[:, :, 1:]
            ys.append(torch.where(self.column, v * hs, hs) + self.c[:, rows])
            h = hs[:, :, -1]
        return torch.cat(ys, dim=2), h

    def flops(self, T):
        return 2 * min(T, self.chunk_size) * self.d_model


# The init scale of a mixer's token mixing when nothing projects its output (n_head = 1), near the N(0, 0.02)
# embeddings' scale: at 1 training stuck at the unigram loss, 0.01 learned as fast as 0 (docs/claims.md).
MIX_INIT_SCALE = 0.01


def make_token_mixing(cfg, n_head, out_scale=1.0):
    """The masked token mixing cfg selects (token_mixing, expansion, feature_kernel), with n_head heads."""
    if cfg.token_mixing == 'toeplitz':
        return ToeplitzMixing(cfg.n_ctx, cfg.d_model, n_head, cfg.fft_threshold, cfg.mixing_init, out_scale)
    if cfg.token_mixing == 'recurrent':
        return RecurrentMixing(cfg.n_ctx, cfg.d_model, n_head, cfg.recurrent_form, cfg.chunk_size, out_scale)
    if cfg.expansion > 1:
        return ExpandedMixing(cfg.n_ctx, cfg.d_model, n_head, cfg.expansion, out_scale)
    if cfg.feature_kernel > 1:
        return KernelMixing(cfg.n_ctx, cfg.d_model, n_head, cfg.feature_kernel, out_scale)
    return FlatMixing(cfg.n_ctx, cfg.d_model, n_head, out_scale)


# ----------------------------------------------------------------------------- blocks and models

class Block(nn.Module):
    """Pre-norm residual block (MLP-Mixer, Badger 2024): x += Mix(norm(x)); x += FF(norm(x)) (the other way
    round with block_order='ff_mix'), Mix the kind's sequence mixing, FF the GELU MLP (mixers, GPT) or
    SwiGLU. forward(x float [B, T, d]) -> [B, T, d]; step(x, state, pos): the same with the mixing's step."""
    def __init__(self, cfg):
        super().__init__()
        self.norm1, self.norm2 = make_norm(cfg), make_norm(cfg)
        if cfg.kind == 'mixer':
            self.mixing = make_token_mixing(cfg, cfg.n_head, MIX_INIT_SCALE if cfg.n_head == 1 else 1.0)
            self.ff = MLP(cfg.d_model, cfg.ff_mult * cfg.d_model, cfg.activation)
        else:       # the baselines stand on this file: imported where one is built, so no import makes a loop
            import attention
            self.mixing, self.ff = attention.make_mixing(cfg), attention.make_ff(cfg)
        self.drop = nn.Dropout(cfg.dropout)
        self.ff_first = cfg.block_order == 'ff_mix'

    def forward(self, x):
        if self.ff_first:
            x = x + self.drop(self.ff(self.norm2(x)))
            return x + self.drop(self.mixing(self.norm1(x)))
        x = x + self.drop(self.mixing(self.norm1(x)))
        return x + self.drop(self.ff(self.norm2(x)))

    def step(self, x, state, pos):
        if self.ff_first:
            x = x + self.drop(self.ff(self.norm2(x)))
            return x + self.drop(self.mixing.step(self.norm1(x), state, pos))
        x = x + self.drop(self.mixing.step(self.norm1(x), state, pos))
        return x + self.drop(self.ff(self.norm2(x)))


class TokenModel(nn.Module):
    """What LanguageModel and Autoencoder share, from tokens to logits: the embedding wte float [vocab, d],
    an optional Linear(d, d) after it (embed_proj), the final norm, the head (lm_head, tied to wte unless
    tie_embeddings=False), the init and the loss."""
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.embed_proj = nn.Linear(cfg.d_model, cfg.d_model) if cfg.embed_proj else nn.Identity()
        self.norm_f = make_norm(cfg) if cfg.final_norm else nn.Identity()
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight

    def _init_weights(self, n_blocks):
        """GPT-2 init: Linear and Embedding weights N(0, 0.02), biases 0, the projections into the residual
        stream N(0, 0.02 / sqrt(2 n_blocks)); the token mixings keep their own init. cfg.init 'kaiming'
        (Badger & Roland 2026): Linear weights N(0, 2 / fan_in), biases 0, embeddings N(0, 1) (a tied head
        is that matrix), no depth scaling."""
        kaiming = self.cfg.init == 'kaiming'
        linear_init = nn.init.kaiming_normal_ if kaiming else functools.partial(nn.init.normal_, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                # A tied head is the embedding, already drawn (modules() reaches wte first): kaiming's fan-in
                # draw would overwrite its N(0, 1). GPT-2's init draws it again from the same N(0, 0.02),
                # kept so that its draws stay what they were.
                if not (kaiming and m.weight is self.wte.weight):
                    linear_init(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, std=1.0 if kaiming else 0.02)
        for name, p in [] if kaiming else self.named_parameters():
            if name.endswith('proj_out.weight'):     # the projections into the residual stream, all in blocks
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * n_blocks))

    @staticmethod
    def loss(logits, targets):
        """Mean cross entropy in nats per token of logits float [B, T, vocab] against targets long [B, T]
        (-1 ignored); None without targets."""
        if targets is None:
            return None
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-1)

    def num_params(self):
        """The number of parameters (tied embeddings counted once)."""
        return sum(p.numel() for p in self.parameters())


class LanguageModel(TokenModel):
    """Causal language model of any kind: forward(idx long [B, T], targets long [B, T] or None) -> (logits
    float [B, T, vocab], the mean next-token cross entropy in nats per token, or None); T <= n_ctx, else
    ValueError (max_len is None for linear attention without posenc: it has no limit). init_state and
    step: decoding (sample.Decoder)."""
    def __init__(self, cfg):
        super().__init__(cfg)
        self.wpe = nn.Parameter(0.02 * torch.randn(cfg.n_ctx, cfg.d_model)) if cfg.posenc else None
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self._init_weights(cfg.n_layer)
        self.max_len = None if cfg.kind == 'linear_attention' and not cfg.posenc else cfg.n_ctx

    def hidden(self, idx, layer=None, embeddings=None):
        """The residual stream after block `layer` (default the last): float [B, T, d], of idx long [B, T],
        or of the input vectors `embeddings` float [B, T, d] in place of wte(idx) (experiments/represent.py).
        A text's embedding (Badger 2024, retrieval.py) is its last row, hidden(idx)[:, -1]."""
        x = self.wte(idx) if embeddings is None else embeddings
        if self.max_len is not None and x.shape[1] > self.max_len:
            raise ValueError(f'sequence of {x.shape[1]} tokens is longer than n_ctx={self.max_len}')
        x = self.embed_proj(x)
        if self.wpe is not None:
            x = x + self.wpe[:x.shape[1]]
        n = len(self.blocks) if layer is None else range(len(self.blocks))[layer] + 1
        for block in self.blocks[:n]:
            x = block(x)
        return x

    def forward(self, idx, targets=None):
        logits = self.lm_head(self.norm_f(self.hidden(idx)))
        return logits, self.loss(logits, targets)

    def init_state(self, batch_size, device=None, dtype=None):
        """The decoding state of batch_size sequences: one dict per block (its mixing's init_state)."""
        return [block.mixing.init_state(batch_size, device, dtype) for block in self.blocks]

    def step(self, idx, state, pos):
        """t new tokens idx long [B, t] at positions pos..pos+t-1 (an int, or a 0-dim long tensor for one
        compiled graph: span) through every block's step on `state` (init_state's, updated in place) ->
        logits float [B, vocab] after the last of them: forward()'s at that position."""
        x = self.embed_proj(self.wte(idx))
        if self.wpe is not None:
            x = x + self.wpe[span(pos, idx.shape[1], self.cfg.n_ctx)[0]]
        for block, block_state in zip(self.blocks, state):
            x = block.step(x, block_state, pos)
        return self.lm_head(self.norm_f(x[:, -1]))


class Autoencoder(TokenModel):
    """Autoencoder (blog post "Masked Mixers II"): the last token's last encoder hidden vector e float
    [B, d], repeated T times, is the decoder's input; the decoder reconstructs every token.
    forward(idx long [B, T], targets or None) -> (logits float [B, T, vocab], cross entropy in nats per
    token). The encoder adds the positions its kind adds (wpe with posenc, as LanguageModel); attention
    kinds (and posenc) add learned positions to the decoder's input (wpe_dec): attention over T equal
    vectors sees no order."""
    def __init__(self, cfg):
        super().__init__(cfg)
        self.encoder = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.decoder = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        needs_pos = cfg.kind != 'mixer' or cfg.posenc
        self.wpe_dec = nn.Parameter(0.02 * torch.randn(cfg.n_ctx, cfg.d_model)) if needs_pos else None
        self._init_weights(2 * cfg.n_layer)
        # drawn last, so that every other weight is what it was before the encoder had positions
        self.wpe = nn.Parameter(0.02 * torch.randn(cfg.n_ctx, cfg.d_model)) if cfg.posenc else None

    def encode(self, idx):
        """idx long [B, T] -> its embedding float [B, d] (the last token, after the last encoder block).
        ValueError when T > n_ctx."""
        if idx.shape[1] > self.cfg.n_ctx:
            raise ValueError(f'sequence of {idx.shape[1]} tokens is longer than n_ctx={self.cfg.n_ctx}')
        x = self.embed_proj(self.wte(idx))
        if self.wpe is not None:
            x = x + self.wpe[:idx.shape[1]]
        for block in self.encoder:
            x = block(x)
        return x[:, -1]

    def decode_embedding(self, e, T):
        """The embedding e float [B, d] -> logits float [B, T, vocab] of the T tokens."""
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
    print('mixer.py: error: the models module, not a command: python train.py --variant=NAME trains one '
          '(--help)', file=sys.stderr)
    sys.exit(2)
