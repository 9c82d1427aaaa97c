"""The baselines' sequence mixing, with the methods of mixer.py's mixings (forward, init_state, step(x,
state, pos), flops, decays): causal softmax attention with RoPE (llama-style) or without (GPT-2-style),
causal linear attention, the transformer-mixer hybrid's branch, and llama's SwiGLU feed-forward. It stands
on mixer.py (the causal rule, the rows a step writes, the state's zeros, the GELU MLP); mixer.Block builds
these through make_mixing and make_ff.

    attn = Attention(n_ctx=256, d_model=256, n_head=4)
    y = attn(x)                              # x float [B, T, d] -> [B, T, d]
    state = attn.init_state(2)               # {'k', 'v': float [2, H, n_ctx, e]}
    y = attn.step(x[:, :5], state, 0)        # the first 5 positions, then attn.step(x[:, 5:6], state, 5)
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange

from mixer import MLP, causal_mask, make_token_mixing, span, state_zeros


def make_mixing(cfg):
    """The sequence mixing of a baseline kind (a mixer.ModelConfig's kind 'transformer', 'gpt', 'hybrid' or
    'linear_attention'), as mixer.Block holds it."""
    naive = cfg.attention == 'naive'
    if cfg.kind in ('transformer', 'gpt'):
        return Attention(cfg.n_ctx, cfg.d_model, cfg.n_head, rope=cfg.kind == 'transformer', naive=naive)
    if cfg.kind == 'hybrid':
        parallel = cfg.hybrid_form == 'parallel'
        attn = Attention(cfg.n_ctx, cfg.d_model, cfg.n_head, naive=naive)
        return HybridMixing(attn, make_token_mixing(cfg, n_head=cfg.n_head if parallel else 1), parallel)
    return LinearAttention(cfg.d_model, cfg.n_head, cfg.chunk_size)


def make_ff(cfg):
    """A baseline block's feed-forward: GPT-2's GELU MLP (mixer.MLP) or llama's SwiGLU."""
    if cfg.kind == 'gpt':
        return MLP(cfg.d_model, cfg.ff_mult * cfg.d_model, cfg.activation)
    return SwiGLU(cfg.d_model, cfg.ff_mult)


# ----------------------------------------------------------------------------- softmax attention

def rope_tables(n_ctx, head_size, base=10000.0):
    """cos, sin of the rotary position embedding (Su et al. 2021): float [n_ctx, head_size / 2]."""
    inv_freq = base ** (-torch.arange(0, head_size, 2).float() / head_size)
    angles = torch.arange(n_ctx).float()[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    """x float [B, H, T, e] rotated by cos, sin float [T, e / 2] (half-split convention) -> [B, H, T, e]."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


class Attention(nn.Module):
    """Causal self-attention (Vaswani et al. 2017), llama-style with RoPE (Su et al. 2021) or GPT-2-style
    without (rope=False: the model adds learned positions): x float [B, T, d] -> float [B, T, d], heads of
    e = d / n_head features (RoPE needs e even: mixer.ModelConfig refuses an odd one). naive=True
    materialises the [B, H, T, T] weights (O(T^2) memory); the default is scaled_dot_product_attention's
    fused implementations. qkv and proj_out are Linear layers without bias."""
    def __init__(self, n_ctx, d_model, n_head, rope=True, naive=False):
        super().__init__()
        self.n_ctx, self.n_head, self.head_size = n_ctx, n_head, d_model // n_head
        self.rope, self.naive = rope, naive
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj_out = nn.Linear(d_model, d_model, bias=False)
        cos, sin = rope_tables(n_ctx, self.head_size) if rope else (torch.zeros(0), torch.zeros(0))
        self.register_buffer('cos', cos, persistent=False)
        self.register_buffer('sin', sin, persistent=False)

    def project(self, x, rows):
        """q, k, v of x float [B, t, d] at the positions `rows` (a slice, or long [t]): each float [B, H, t,
        e], q and k rotated by RoPE."""
        q, k, v = rearrange(self.qkv(x), 'b t (three H e) -> three b H t e', three=3, H=self.n_head)
        if self.rope:
            cos, sin = self.cos[rows], self.sin[rows]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return q, k, v

    @staticmethod
    def softmax(q, k, mask):
        """softmax(q k^T / sqrt(e)) over the keys `mask` allows: q float [B, H, T, e], k [B, H, n, e], mask
        bool [T, n] -> float [B, H, T, n], rows summing to 1 (what the naive path multiplies V by)."""
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        return scores.masked_fill(~mask, float('-inf')).softmax(-1)

    def forward(self, x):
        T = x.shape[1]
        q, k, v = self.project(x, slice(0, T))
        if self.naive:                     # the [B, H, T, T] weights materialised
            y = self.softmax(q, k, causal_mask(T, device=x.device)) @ v
        else:                              # causal_mask(T) as SDPA's flag, which lets it pick a fused kernel
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj_out(rearrange(y, 'b H t e -> b t (H e)'))

    def init_state(self, batch_size, device=None, dtype=None):
        """{'k', 'v': float [B, H, n_ctx, e]}: the keys and values of the positions seen (the KV cache)."""
        shape = (batch_size, self.n_head, self.n_ctx, self.head_size)
        return {kv: state_zeros(self, *shape, device=device, dtype=dtype) for kv in ('k', 'v')}

    def step(self, x, state, pos):
        """x float [B, t, d], t new tokens at positions pos..pos+t-1 (span) -> float [B, t, d]: their keys
        and values are written into the state at their positions, and each query reads the keys up to its
        own position (causal_mask)."""
        rows, end = span(pos, x.shape[1], self.n_ctx)
        q, k_new, v_new = self.project(x, rows)
        k, v = state['k'], state['v']
        k[:, :, rows], v[:, :, rows] = k_new.to(k.dtype), v_new.to(v.dtype)    # in place: the cache stays put
        mask = causal_mask(end, rows, x.device)
        y = F.scaled_dot_product_attention(q, k[:, :, :end], v[:, :, :end], attn_mask=mask)
        return self.proj_out(rearrange(y, 'b H t e -> b t (H e)'))

    def flops(self, T):
        return 4 * T * self.qkv.in_features             # QK^T and AV in full

    def decays(self):             # no parameters of its own: its Linear layers follow every Linear's rule
        return {}


# ----------------------------------------------------------------------------- linear attention

class LinearAttention(nn.Module):
    """Causal linear attention (Katharopoulos et al. 2020, "Transformers are RNNs"), x float [B, T, d] ->
    [B, T, d]: y_i = phi(q_i) S_i / (phi(q_i) . s_i), phi = elu + 1, S_i = sum_{j<=i} phi(k_j) v_j^T,
    s_i = sum_{j<=i} phi(k_j). Decoding one token is that recurrence (S += phi(k) v^T, s += phi(k));
    training and a prompt read in chunks of C = chunk_size positions (a causal C x C product inside each,
    S and s carried between them): memory O(T d + C^2). No position enters it: no limit at n_ctx."""
    def __init__(self, d_model, n_head, chunk_size, eps=1e-6):
        super().__init__()
        self.n_head, self.head_size, self.chunk_size, self.eps = n_head, d_model // n_head, chunk_size, eps
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj_out = nn.Linear(d_model, d_model, bias=False)

    def features(self, x):
        """phi(q), phi(k), v of x float [B, T, d]: each float [B, H, T, e], phi = elu + 1 > 0."""
        q, k, v = rearrange(self.qkv(x), 'b t (three H e) -> three b H t e', three=3, H=self.n_head)
        return F.elu(q) + 1, F.elu(k) + 1, v

    def causal_scores(self, q, k):
        """phi(q_i) . phi(k_j) for j <= i, else 0: q, k float [B, H, T, e] -> [B, H, T, T]."""
        return (q @ k.transpose(-1, -2)) * causal_mask(q.shape[2], device=q.device)

    def forward(self, x):
        return self.scan(x, None, None)[0]

    def init_state(self, batch_size, device=None, dtype=None):
        """{'S': float [B, H, e, e], the sum of phi(k_j) v_j^T over the positions seen; 's': float [B, H,
        e], the sum of phi(k_j)}."""
        B, H, e = batch_size, self.n_head, self.head_size
        return {'S': state_zeros(self, B, H, e, e, device=device, dtype=dtype),
                's': state_zeros(self, B, H, e, device=device, dtype=dtype)}

    def step(self, x, state, pos):
        """x float [B, t, d], t new tokens after the state S, s (updated in place) -> float [B, t, d]: one
        token is the recurrence itself, more (a prompt) go through the chunked scan."""
        S, s = state['S'], state['s']
        if x.shape[1] > 1:
            y, S_new, s_new = self.scan(x, S, s)
            S.copy_(S_new)
            s.copy_(s_new)
            return y
        q, k, v = self.features(x)                                    # [B, H, 1, e]
        S += (k.transpose(-1, -2) @ v).to(S.dtype)                    # S += phi(k) v^T
        s += k[:, :, 0].to(s.dtype)                                   # s += phi(k)
        y = (q @ S.to(q.dtype)) / (q @ s.to(q.dtype)[..., None] + self.eps)
        return self.proj_out(rearrange(y, 'b H t e -> b t (H e)'))

    def scan(self, x, S, s):
        """x float [B, T, d] after the state S, s (None: zero) -> (y float [B, T, d], S and s after x)."""
        q, k, v = self.features(x)
        ys, C = [], self.chunk_size
        for i in range((x.shape[1] + C - 1) // C):        # the chunks counted first: under torch.compile,
            qc, kc, vc = (t[:, :, i * C:(i + 1) * C] for t in (q, k, v))    # range(0, T, C) recompiles per T
            A = self.causal_scores(qc, kc)                            # [B, H, C, C]
            num, den = A @ vc, A.sum(-1, keepdim=True)
            if S is not None:
                num = num + qc @ S.to(qc.dtype)
                den = den + qc @ s.to(qc.dtype)[..., None]
            ys.append(num / (den + self.eps))
            S = kc.transpose(-1, -2) @ vc + (0 if S is None else S)  # [B, H, e, e]
            s = kc.sum(2) + (0 if s is None else s)                   # [B, H, e]
        return self.proj_out(rearrange(torch.cat(ys, dim=2), 'b H t e -> b t (H e)')), S, s

    def flops(self, T):
        d = self.qkv.in_features
        return 4 * min(T, self.chunk_size) * d + 4 * d * d // self.n_head

    def decays(self):             # no parameters of its own: its Linear layers follow every Linear's rule
        return {}


# ----------------------------------------------------------------------------- the hybrid's branch

class HybridMixing(nn.Module):
    """Transformer-mixer hybrids (Badger 2024): attention and a masked token mixing (mixer.py's, given) in
    one branch, x float [B, T, d] -> [B, T, d]. hybrid_form 'serial' (the paper's best): Mix(Attn(z)), the
    mixing started at M = I (its identity_start), so that a fresh hybrid is the transformer (a prefix-mean
    start averages attention's selectivity away: docs/claims.md); 'parallel': Attn(z) + Mix(z). Its state,
    step, FLOPs and weight-decay flags are its two parts' ('attn', 'token_mixing')."""
    def __init__(self, attn, token_mixing, parallel=False):
        super().__init__()
        self.attn, self.parallel = attn, parallel
        self.token_mixing = token_mixing if parallel else token_mixing.identity_start()

    def forward(self, x):
        a = self.attn(x)
        return a + self.token_mixing(x) if self.parallel else self.token_mixing(a)

    def init_state(self, batch_size, device=None, dtype=None):
        """{'attn': the attention's state, 'token_mixing': the mixing's} (their init_state)."""
        return {'attn': self.attn.init_state(batch_size, device, dtype),
                'token_mixing': self.token_mixing.init_state(batch_size, device, dtype)}

    def step(self, x, state, pos):
        a = self.attn.step(x, state['attn'], pos)
        mixing, mixing_state = self.token_mixing, state['token_mixing']
        return a + mixing.step(x, mixing_state, pos) if self.parallel else mixing.step(a, mixing_state, pos)

    def flops(self, T):
        return self.attn.flops(T) + self.token_mixing.flops(T)

    def decays(self):
        return {**self.attn.decays(), **self.token_mixing.decays()}


# ----------------------------------------------------------------------------- the feed-forward

class SwiGLU(nn.Module):
    """Llama's feed-forward, per position: W2 (silu(W1 x) * W3 x), x float [..., d] -> [..., d]; its width
    d_ff is 2/3 of ff_mult * d, rounded up to a multiple of 32."""
    def __init__(self, d_model, ff_mult):
        super().__init__()
        d_ff = 32 * math.ceil(2 * ff_mult * d_model / 3 / 32)
        self.fc = nn.Linear(d_model, 2 * d_ff, bias=False)
        self.proj_out = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        gate, up = self.fc(x).chunk(2, dim=-1)
        return self.proj_out(F.silu(gate) * up)


if __name__ == '__main__':
    import sys
    print('attention.py: error: the attention module, not a command: python train.py --variant=transformer '
          'trains one (--help)', file=sys.stderr)
    sys.exit(2)
