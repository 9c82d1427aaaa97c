"""The transformer baselines' sequence mixing: causal softmax attention with RoPE (llama-style) or without
(GPT-2-style), and causal linear attention; and the two pieces the masked mixers share with them, the
decoding cache's append (the dense and Toeplitz mixers cache their inputs z_j, their KV cache) and the
chunking of a sequence (the recurrent mixing runs in linear attention's chunks).

Every module maps x float [B, T, d] at positions pos.. to float [B, T, d], with the decoding state of its
layer (a dict: decode.Cache) or None; mixer.Block puts them in the residual stream. weights() gives the
T x T mixing each one applies to its values (experiments/look.py draws them):

    y = attn(x)                              # x float [B, T, d]
    A = attn.weights(x)                      # float [B, H, T, T], rows sum to 1, zero above the diagonal
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange


def append_cache(state, key, x):
    """Decoding: append x [B, H, t, e] along time to the layer state's tensor `key` (a dict a layer:
    decode.Cache) -> all [B, H, n, e] (x when state is None); the buffer doubles when full. Attention's
    K and V go through it, and the dense and Toeplitz mixers' inputs z (mixer.MaskedMixing.mix)."""
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
    learned positions): x float [B, T, d] at positions pos.. -> float [B, T, d]. Decoding appends K, V
    [B, H, t, e] to the layer state. naive=True materialises the [B, H, T, t] scores (O(T^2) memory)."""
    def __init__(self, n_ctx, d_model, n_head, rope=True, naive=False):
        super().__init__()
        self.n_head, self.rope, self.naive = n_head, rope, naive
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj_out = nn.Linear(d_model, d_model, bias=False)
        cos, sin = rope_tables(n_ctx, d_model // n_head)
        self.register_buffer('cos', cos, persistent=False)
        self.register_buffer('sin', sin, persistent=False)

    def heads(self, x, pos=0):
        """q, k, v of x float [B, T, d] at positions pos..: each float [B, H, T, e], RoPE on q and k."""
        T = x.shape[1]
        q, k, v = rearrange(self.qkv(x), 'b t (three h e) -> three b h t e', three=3, h=self.n_head)
        if self.rope:
            cos, sin = self.cos[pos:pos + T], self.sin[pos:pos + T]
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

    def forward(self, x, state=None, pos=0):
        T = x.shape[1]
        q, k, v = self.heads(x, pos)
        k, v = append_cache(state, 'k', k), append_cache(state, 'v', v)
        # query i (at position pos + i) may see keys 0 .. pos + i
        mask = torch.arange(pos + T, device=x.device)[None, :] <= torch.arange(pos, pos + T, device=x.device)[:, None]
        if self.naive:
            y = self.softmax(q, k, mask) @ v                                  # [B, H, T, pos + T] weights
        elif pos == 0:             # the whole prefix (is_causal must be a constant for torch.compile)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif T == 1:               # one new query that may see every key
            y = F.scaled_dot_product_attention(q, k, v)
        else:                      # T new queries after a cached prefix
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj_out(rearrange(y, 'b h t e -> b t (h e)'))


class LinearAttention(nn.Module):
    """Causal linear attention (Katharopoulos et al. 2020, "Transformers are RNNs"), x float [B, T, d] ->
    [B, T, d]: y_i = phi(q_i) S_i / (phi(q_i) . s_i), phi = elu + 1, S_i = sum_{j<=i} phi(k_j) v_j^T,
    s_i = sum_{j<=i} phi(k_j). Chunks of chunk_size (a masked C x C product inside, S and s carried
    between): memory O(T d + C^2). Decoding keeps S [B, H, e, e] and s [B, H, e]; no window past n_ctx."""
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

    def forward(self, x, state=None, pos=0):
        q, k, v = self.features(x)
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


if __name__ == '__main__':
    import sys
    print('attention.py: error: the attention module, not a command: python train.py --variant=transformer trains one (--help)', file=sys.stderr)
    sys.exit(2)
