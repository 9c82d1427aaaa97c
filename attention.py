"""The transformer baselines' pieces: causal softmax attention with RoPE (llama-style) or without
(GPT-2-style), causal linear attention, the transformer-mixer hybrid's branch and the llama feed-forward;
and what the masked mixers share with them: the decoding cache's write (the dense and Toeplitz mixers
cache their inputs z_j, their KV cache), the recurrent state kept in place, the positions of a step, and
the chunks of a sequence (the recurrent mixing runs in linear attention's chunks).

Each module has mixer.py's three faces: forward(x float [B, T, d]) -> float [B, T, d], the parallel pass;
step(x, state, pos), t new tokens at positions pos.. on buffers it allocates at n_ctx in `state`; flops(T).
mixer.Block puts them in the residual stream. weights() gives the T x T mixing each one applies to its
values (experiments/look.py draws them):

    y = attn(x)                              # x float [B, T, d]
    A = attn.weights(x)                      # float [B, H, T, T], rows sum to 1, zero above the diagonal
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange


def positions(pos, t):
    """The positions pos..pos+t-1 of t new tokens: pos a 0-dim long tensor -> long [t] on its device."""
    return pos + torch.arange(t, device=pos.device)


def write_cache(state, key, x, at, size):
    """A decoding step's cache write: x [B, H, t, e] at time indices `at` (long [t]) of the layer state's
    buffer `key`, allocated on first use as zeros [B, H, size, e] of x's dtype and device and written in
    place ever after (fixed addresses: what a CUDA graph replays) -> the whole buffer. Attention's K and V
    go through it, and the masked mixings' inputs z (mixer.HeadMixing.mix_step); a later position is
    masked by the reader."""
    if key not in state:
        state[key] = x.new_zeros(*x.shape[:2], size, x.shape[3])
    return state[key].index_copy_(2, at, x)


def keep_state(state, key, x):
    """A decoding step's constant-size state x (a recurrent mixing's h, linear attention's S and s) kept
    in the layer state's buffer `key`: the first becomes the buffer, later ones are copied into it in
    place (its fixed address is what a CUDA graph replays)."""
    if key in state:
        state[key].copy_(x)
    else:
        state[key] = x.contiguous()


def chunk_starts(T, chunk_size):
    """Start positions 0, chunk_size, ... of a length-T sequence's chunks (LinearAttention's, and
    mixer.RecurrentMixing's). (Counting the
    chunks first: under torch.compile, range(0, T, chunk_size) would recompile per T.)"""
    return [i * chunk_size for i in range((T + chunk_size - 1) // chunk_size)]


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
    """Causal self-attention, llama-style with RoPE (Su et al. 2021) or GPT-2-style without (rope=False:
    learned positions): x float [B, T, d] -> float [B, T, d]. Decoding keeps K and V [B, H, n_ctx, e] (the
    KV cache). naive=True materialises the [B, H, T, T] scores (O(T^2) memory)."""
    def __init__(self, n_ctx, d_model, n_head, rope=True, naive=False):
        super().__init__()
        self.n_ctx, self.n_head, self.rope, self.naive = n_ctx, n_head, rope, naive
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj_out = nn.Linear(d_model, d_model, bias=False)
        cos, sin = rope_tables(n_ctx, d_model // n_head)
        self.register_buffer('cos', cos, persistent=False)
        self.register_buffer('sin', sin, persistent=False)

    def heads(self, x, at=None):
        """q, k, v of x float [B, T, d] at positions `at` (long [T]; None: 0..T-1): each float [B, H, T, e],
        RoPE on q and k."""
        q, k, v = rearrange(self.qkv(x), 'b t (three h e) -> three b h t e', three=3, h=self.n_head)
        if self.rope:
            T = x.shape[1]
            cos, sin = (self.cos[:T], self.sin[:T]) if at is None else (self.cos[at], self.sin[at])
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return q, k, v

    @staticmethod
    def softmax(q, k, mask):
        """The attention weights softmax(q k^T / sqrt(e)) over the keys `mask` allows: q float [B, H, T, e],
        k [B, H, S, e], mask bool [T, S] -> float [B, H, T, S], rows summing to 1 (what the naive path
        multiplies V by)."""
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        return scores.masked_fill(~mask, float('-inf')).softmax(-1)

    def weights(self, x):
        """The attention weights of x float [B, T, d] at positions 0..T-1: float [B, H, T, T], zero above
        the diagonal, rows summing to 1 (y_i = sum_j A[i, j] v_j before proj_out)."""
        q, k, _ = self.heads(x)
        return self.softmax(q, k, torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device).tril())

    def forward(self, x):
        T = x.shape[1]
        q, k, v = self.heads(x)
        if self.naive:                     # the [B, H, T, T] weights materialised
            y = self.softmax(q, k, torch.ones(T, T, dtype=torch.bool, device=x.device).tril()) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj_out(rearrange(y, 'b h t e -> b t (h e)'))

    def step(self, x, state, pos):
        """t new tokens: their K, V written at their positions of the [B, H, n_ctx, e] caches, each query
        seeing the keys up to its own position (the naive and SDPA paths compute the same here)."""
        at = positions(pos, x.shape[1])
        q, k, v = self.heads(x, at)
        k, v = write_cache(state, 'k', k, at, self.n_ctx), write_cache(state, 'v', v, at, self.n_ctx)
        mask = torch.arange(self.n_ctx, device=x.device)[None, :] <= at[:, None]       # [t queries, n_ctx keys]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj_out(rearrange(y, 'b h t e -> b t (h e)'))

    def flops(self, T):
        return 4 * T * self.qkv.in_features             # QK^T and AV in full


class LinearAttention(nn.Module):
    """Causal linear attention (Katharopoulos et al. 2020, "Transformers are RNNs"), x float [B, T, d] ->
    [B, T, d]: y_i = phi(q_i) S_i / (phi(q_i) . s_i), phi = elu + 1, S_i = sum_{j<=i} phi(k_j) v_j^T,
    s_i = sum_{j<=i} phi(k_j). Chunks of chunk_size (a masked C x C product inside, S and s carried
    between): memory O(T d + C^2). Decoding keeps S [B, H, e, e] and s [B, H, e]; no limit at n_ctx."""
    def __init__(self, d_model, n_head, chunk_size=256, eps=1e-6):
        super().__init__()
        self.n_head, self.chunk_size, self.eps = n_head, chunk_size, eps
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj_out = nn.Linear(d_model, d_model, bias=False)

    def features(self, x):
        """phi(q), phi(k), v of x float [B, T, d]: each float [B, H, T, e], phi = elu + 1 > 0."""
        q, k, v = rearrange(self.qkv(x), 'b t (three h e) -> three b h t e', three=3, h=self.n_head)
        return F.elu(q) + 1, F.elu(k) + 1, v

    def weights(self, x):
        """The weights linear attention puts on the values, as one matrix: A[i, j] = phi(q_i) . phi(k_j) /
        (sum_{j' <= i} phi(q_i) . phi(k_j') + eps) for j <= i, else 0; x float [B, T, d] at positions
        0..T-1 -> float [B, H, T, T], rows summing to 1 up to eps (y_i = sum_j A[i, j] v_j before
        proj_out). O(T^2): for looking, not for the forward pass."""
        q, k, _ = self.features(x)
        A = (q @ k.transpose(-1, -2)).tril()
        return A / (A.sum(-1, keepdim=True) + self.eps)

    def forward(self, x):
        return self.scan(x, None, None)[0]

    def step(self, x, state, pos):
        """t new tokens after the state S [B, H, e, e], s [B, H, e] (none at first), kept in place after."""
        y, S, s = self.scan(x, state.get('S'), state.get('s'))
        keep_state(state, 'S', S)
        keep_state(state, 's', s)
        return y

    def scan(self, x, S, s):
        """x float [B, T, d] after the state S, s (None: none) -> (y [B, T, d], S, s after x)."""
        q, k, v = self.features(x)
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
        return self.proj_out(rearrange(torch.cat(ys, dim=2), 'b h t e -> b t (h e)')), S, s

    def flops(self, T):
        d = self.qkv.in_features
        return 4 * min(T, self.chunk_size) * d + 4 * d * d // self.n_head


class HybridMixing(nn.Module):
    """Transformer-mixer hybrids (Badger 2024): attention and a masked token mixing (mixer.py's, given) in
    one branch, x float [B, T, d] -> [B, T, d]. serial (the paper's best): Mix(Attn(z)); parallel:
    Attn(z) + Mix(z). Its step is its two parts' steps, each on its own state ('attn', 'mix'); its FLOPs
    theirs."""
    def __init__(self, attn, mix, parallel=False):
        super().__init__()
        self.attn, self.mix, self.parallel = attn, mix, parallel

    def forward(self, x):
        a = self.attn(x)
        return a + self.mix(x) if self.parallel else self.mix(a)

    def step(self, x, state, pos):
        a = self.attn.step(x, state.setdefault('attn', {}), pos)
        mix = lambda z: self.mix.step(z, state.setdefault('mix', {}), pos)      # noqa: E731
        return a + mix(x) if self.parallel else mix(a)

    def flops(self, T):
        return self.attn.flops(T) + self.mix.flops(T)


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


if __name__ == '__main__':
    import sys
    print('attention.py: error: the attention module, not a command: python train.py --variant=transformer trains one (--help)', file=sys.stderr)
    sys.exit(2)
