"""Generation: the sampling loop, eager incremental decoding, and a static-shape decode
step for torch.compile (the gpt-fast recipe).

    out = generate(model, idx, 100, temperature=0.8, top_k=40)      # eager, through a Cache
    out = generate_static(model, idx, 100, temperature=0, compile=True)
    dec = StaticDecoder(model, compile=True)
    logits = dec.prefill(idx)        # idx long [B, T] -> logits [B, vocab] of the last token
    logits = dec.step(next_token)    # long [B, 1] -> float [B, vocab]
    dec = StaticDecoder(model).allocate(B)        # or a parallel prefill: one pass, not a step a token
    cache = Cache(n_layer); model.hidden(idx, cache); dec.load(cache)

Eager decoding (mixer.LanguageModel.decode with a Cache) grows its caches as it goes
and slices weights by a Python int position: right for eager code, but each new
length is a new shape, so a compiled model would recompile per token. The static
path allocates every cache once at n_ctx (zeros), writes it in place with
index_copy_, and keeps the position a 0-dim long tensor, so one compiled graph
serves every position. Per token each mixing reads its whole n_ctx-long cache and
masks the unwritten part (the dense and Toeplitz mixers' weight row, attention's key
mask): a step costs what the step at position n_ctx costs; the recurrent mixer and
linear attention keep their constant-size state. Both paths equal the full forward
pass (tested, eager and compiled). Every LanguageModel kind; the Autoencoder has no
decoding.
"""

import torch
import torch.nn.functional as F
from einops import rearrange

from attention import Attention, LinearAttention, apply_rope
from mixer import HeadMixing, HybridMixing, MaskedMixing, RecurrentMixing, ToeplitzMixing, mix_tokens


# ----------------------------------------------------------------------------- sampling

class Cache:
    """State for eager incremental decoding (mixer.LanguageModel.decode): the position and
    one dict a layer. The dense and Toeplitz mixings keep their inputs z_j (the mixer's
    KV cache), attention K and V, the recurrent mixing and linear attention a
    fixed-size state."""

    def __init__(self, n_layer):
        self.pos = 0
        self.layers = [dict() for _ in range(n_layer)]

    def nbytes(self):
        """Bytes held by all cached tensors (int)."""
        def walk(d):
            return sum(walk(v) if isinstance(v, dict) else v.numel() * v.element_size()
                       for v in d.values() if isinstance(v, (dict, torch.Tensor)))
        return sum(walk(layer) for layer in self.layers)


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


def sample_loop(idx, max_new_tokens, temperature, top_k, max_len, start, step):
    """The one generation loop, of generate() and generate_static().

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


@torch.no_grad()
def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None):
    """Sample max_new_tokens after idx long [B, T] from a mixer.LanguageModel -> long
    [B, T + max_new_tokens], incrementally: one decode() of the prompt, then one token a
    step through the Cache (never recomputing the window). Past n_ctx a position-indexed
    model slides its window: the cache restarts from the last n_ctx / 2 tokens (one
    recompute per n_ctx / 2 new tokens). temperature 0 is greedy; top_k keeps the k
    most likely tokens. Raises ValueError for a prompt longer than n_ctx."""
    cache = None

    def start(tokens):                      # a fresh cache holding `tokens`
        nonlocal cache
        cache = Cache(len(model.blocks))
        return model.decode(tokens, cache)[:, -1]
    return sample_loop(idx, max_new_tokens, temperature, top_k, model.max_len, start,
                       lambda token: model.decode(token, cache)[:, -1])


# ----------------------------------------------------------------------------- the static-shape step


def _write(state, key, x, idx, size):
    """Write x [B, H, t, e] at time indices idx (long [t]) of the buffer `key`, a
    zero [B, H, size, e] tensor allocated on first use; return the whole buffer."""
    if key not in state:
        state[key] = x.new_zeros(*x.shape[:2], size, x.shape[3])
    return state[key].index_copy_(2, idx, x)


def _masked(m, z, state, pos):
    """MaskedMixing (flat, multi-head, kernel, expanded) at position pos: z [B, H, 1, e]."""
    n_ctx = m.mask1.shape[1]
    zs = _write(state, 'z', z, pos[None], n_ctx)                          # [B, H, n_ctx, e]
    rows = m.e * pos + torch.arange(m.e, device=z.device)                 # hidden rows of this position
    W1 = m.W1[..., rows, :] * m.mask1[rows]                               # [H, k, e, n_ctx]
    h = mix_tokens(W1[:, 0], zs) if m.k == 1 else torch.einsum('hkts,bhkse->bhte', W1, m._taps(zs))
    h = h + m.c1[:, rows]
    if m.e == 1:
        return h
    hs = _write(state, 'h', F.gelu(h), rows, m.e * n_ctx)                 # [B, H, e n_ctx, e]
    W2 = m.W2[:, pos[None]] * m.mask2[pos[None]]                          # [H, 1, e n_ctx]
    return mix_tokens(W2, hs) + m.c2[:, pos[None]]


def _toeplitz(m, z, state, pos):
    """ToeplitzMixing at position pos: row w[pos - j] for j <= pos."""
    n_ctx = m.w.shape[1]
    zs = _write(state, 'z', z, pos[None], n_ctx)
    lag = pos - torch.arange(n_ctx, device=z.device)
    row = m.w[:, lag.clamp(min=0)] * (lag >= 0)                           # [H, n_ctx]
    return mix_tokens(row[:, None], zs) + m.c[:, pos[None]]


def _recurrent(m, z, state, pos):
    """RecurrentMixing at position pos: h = a h + u, the constant-size state in place."""
    if 'h' not in state:
        state['h'] = z.new_zeros(z.shape[0], z.shape[1], z.shape[3])
    a = torch.sigmoid(m.decay_logit.float())[:, None].to(z.dtype)         # [H, 1]
    v = m.v[:, pos[None], None]                                           # [H, 1, 1]
    h = state['h'].mul_(a).add_(torch.where(m.column, z, v * z)[:, :, 0])
    return torch.where(m.column, v * h[:, :, None], h[:, :, None]) + m.c[:, pos[None]]


def _attention(a, x, state, pos):
    """Attention at position pos: K, V written at pos, keys after pos masked out
    (naive and SDPA attention compute the same here: one query, n_ctx keys)."""
    q, k, v = rearrange(a.qkv(x), 'b t (three h e) -> three b h t e', three=3, h=a.n_head)
    if a.rope:
        cos, sin = a.cos[pos[None]], a.sin[pos[None]]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    n_ctx = a.cos.shape[0]
    ks, vs = _write(state, 'k', k, pos[None], n_ctx), _write(state, 'v', v, pos[None], n_ctx)
    mask = (torch.arange(n_ctx, device=x.device) <= pos)[None]            # [1 query, n_ctx keys]
    y = F.scaled_dot_product_attention(q, ks, vs, attn_mask=mask)
    return a.proj_out(rearrange(y, 'b h t e -> b t (h e)'))


def _linear_attention(a, x, state, pos):
    """LinearAttention: S += phi(k)^T v, s += phi(k), y = phi(q) S / (phi(q) . s)."""
    q, k, v = rearrange(a.qkv(x), 'b t (three h e) -> three b h t e', three=3, h=a.n_head)
    q, k = F.elu(q) + 1, F.elu(k) + 1
    if 'S' not in state:
        e = q.shape[-1]
        state['S'], state['s'] = q.new_zeros(q.shape[0], a.n_head, e, e), q.new_zeros(q.shape[0], a.n_head, e)
    S = state['S'].add_(k.transpose(-1, -2) @ v)
    s = state['s'].add_(k[:, :, 0])
    y = (q @ S) / (q @ s[..., None] + a.eps)
    return a.proj_out(rearrange(y, 'b h t e -> b t (h e)'))


_MIX = {MaskedMixing: _masked, ToeplitzMixing: _toeplitz, RecurrentMixing: _recurrent}


def mixing_step(mixing, x, state, pos):
    """One token through a block's sequence mixing: x float [B, 1, d] at position pos
    (long, 0-dim), state the layer's dict of static buffers -> float [B, 1, d]."""
    if isinstance(mixing, HeadMixing):
        z = mixing.proj_in(x) if mixing.proj_in is not None else x
        y = _MIX[type(mixing)](mixing, rearrange(z, 'b t (h e) -> b h t e', h=mixing.n_head), state, pos)
        y = rearrange(y, 'b h t e -> b t (h e)')
        return mixing.proj_out(y) if mixing.proj_out is not None else y
    if isinstance(mixing, Attention):
        return _attention(mixing, x, state, pos)
    if isinstance(mixing, LinearAttention):
        return _linear_attention(mixing, x, state, pos)
    if isinstance(mixing, HybridMixing):
        a = _attention(mixing.attn, x, state.setdefault('attn', {}), pos)
        if mixing.parallel:
            return a + mixing_step(mixing.mix, x, state.setdefault('mix', {}), pos)
        return mixing_step(mixing.mix, a, state.setdefault('mix', {}), pos)
    raise TypeError(f'no static decode step for {type(mixing).__name__}')


def model_step(model, idx, pos, layers):
    """One token through a LanguageModel: idx long [B, 1] at position pos (long,
    0-dim tensor), layers one state dict per block -> logits float [B, vocab]."""
    x = model.embed_proj(model.wte(idx))
    if model.wpe is not None:
        x = x + model.wpe[pos[None]]
    for block, state in zip(model.blocks, layers):
        x = block.residual(x, lambda z: mixing_step(block.mixing, z, state, pos))
    return model.lm_head(model.norm_f(x))[:, -1]


class StaticDecoder:
    """Static-shape incremental decoding of one LanguageModel (in eval mode).

    prefill(idx long [B, T]) and step(idx long [B, 1]) -> logits float [B, vocab]
    of the last token given; the position advances by the tokens given. With
    compile=True the step runs through torch.compile(dynamic=False): the first
    token runs eagerly and allocates the caches, every later token reuses one
    graph (`compiles` counts the compilations; `backend` names torch.compile's
    backend: 'inductor', or 'eager' for a fast trace-only check). On CUDA the
    compiled step is captured as a CUDA graph (mode 'reduce-overhead': one launch a
    token), which needs the caches at fixed addresses: they are marked static once
    allocated, and written only in place. The position lives on the device and
    advances in place: no host-to-device copy a token.
    reset() zeroes the caches in place (no reallocation, so no recompile).
    Raises ValueError past n_ctx for position-indexed kinds (model.max_len)."""

    def __init__(self, model, compile=False, backend='inductor', cuda_graphs=None):
        self.model, self.max_len, self.compiles = model, model.max_len, 0
        self.layers = [dict() for _ in model.blocks]
        self.pos, self._pos = 0, None
        self.cuda_graphs = next(model.parameters()).is_cuda if cuda_graphs is None else cuda_graphs

        def counted(gm, example_inputs):
            self.compiles += 1
            if backend == 'inductor':        # torch.compile's mode='reduce-overhead' is this config patch
                from torch._inductor.compile_fx import compile_fx   # here: 4 of import decode's 6 s
                return compile_fx(gm, example_inputs, config_patches={'triton.cudagraphs': self.cuda_graphs})
            return torch._dynamo.lookup_backend(backend)(gm, example_inputs)
        self._eager = lambda idx, pos, layers: model_step(model, idx, pos, layers)    # noqa: E731
        self._fn = torch.compile(self._eager, backend=counted, dynamic=False) if compile else self._eager

    def reset(self):
        """Back to position 0: every buffer zeroed in place."""
        for buf in self.buffers():
            buf.zero_()
        if self._pos is not None:
            self._pos.zero_()
        self.pos = 0

    @torch.no_grad()
    def step(self, idx):
        """idx long [B, 1] at the current position -> logits float [B, vocab]."""
        if self.max_len is not None and self.pos >= self.max_len:
            raise ValueError(f'position {self.pos} is past n_ctx={self.max_len}')
        if self.layers[0]:                           # one [B, 1] input tensor, so that strides never vary
            logits = self._fn(self._token.copy_(idx), self._pos, self.layers)
        else:                                        # the first token allocates the caches, eagerly
            self._token = idx.new_empty(idx.shape[0], 1)
            self._pos = torch.zeros((), dtype=torch.long, device=idx.device)
            logits = self._eager(idx, self._pos, self.layers)
            for buf in self.buffers():               # fixed addresses: what a CUDA graph replays
                torch._dynamo.mark_static_address(buf)
        self.pos += 1
        self._pos.add_(1)                            # on the device, in place: no copy from the host
        return logits

    def buffers(self):
        """Every cache tensor of every layer (after the first token has allocated them)."""
        def walk(d):
            for v in d.values():
                yield from walk(v) if isinstance(v, dict) else [v]
        return [b for layer in self.layers for b in walk(layer)]

    def prefill(self, idx):
        """idx long [B, T] -> logits float [B, vocab] after its last token (one step per token)."""
        for t in range(idx.shape[1]):
            logits = self.step(idx[:, t:t + 1])
        return logits

    def allocate(self, batch_size):
        """Allocate every buffer for batch_size sequences (one eager step of token 0, then reset()),
        at the model's device and dtype (the meta device too: shapes without memory) -> self."""
        p = next(self.model.parameters())
        self.step(torch.zeros(batch_size, 1, dtype=torch.long, device=p.device))
        self.reset()
        return self

    @torch.no_grad()
    def load(self, cache, rows=slice(None)):
        """Continue from an eager prefill: a decode.Cache that LanguageModel.hidden or .decode filled
        with a whole prompt in one parallel pass (not one step() a token, as prefill()) is copied into
        the sequences `rows` (a slice of the batch) of the allocated buffers (allocate()), and the
        position becomes cache.pos (load every row's slice at the same position). The cached inputs
        and K, V fill times 0 .. cache.pos - 1, the rest stays zero (masked); a state is copied whole.
        Raises ValueError before allocate() or when the cache's layers are not this model's."""
        if not self.layers[0]:
            raise ValueError('load() needs the buffers: call allocate(batch_size) first')
        if self.max_len is not None and cache.pos > self.max_len:
            raise ValueError(f'cache of {cache.pos} tokens is longer than n_ctx={self.max_len}')

        def copy(static, eager):
            if {k for k in eager if not k.endswith('_len')} != set(static):
                raise ValueError(f'cache holds {sorted(eager)}, the decoder {sorted(static)}: not this model\'s')
            for key, buf in static.items():
                if isinstance(buf, dict):
                    copy(buf, eager[key])
                elif key + '_len' in eager:               # cached along time (dim 2): z, h, k, v
                    n = eager[key + '_len']
                    buf[rows, :, :n].copy_(eager[key][:, :, :n])
                else:                                     # a constant-size state: h, S, s
                    buf[rows].copy_(eager[key])
        for static, eager in zip(self.layers, cache.layers, strict=True):
            copy(static, eager)
        self.pos = cache.pos
        self._pos.fill_(cache.pos)


@torch.no_grad()
def generate_static(model, idx, max_new_tokens, temperature=1.0, top_k=None, compile=False, decoder=None):
    """generate() through a StaticDecoder: idx long [B, T] -> long [B, T +
    max_new_tokens], by the same loop (sample_loop). Past n_ctx a
    position-indexed model slides its window as there: the caches are zeroed and
    refilled from the last n_ctx / 2 tokens. Pass `decoder` to reuse one (and its
    compiled graph) across calls. Raises ValueError for a prompt
    longer than n_ctx."""
    if idx.shape[1] > model.cfg.n_ctx:
        raise ValueError(f'prompt of {idx.shape[1]} tokens is longer than n_ctx={model.cfg.n_ctx}')
    dec = decoder or StaticDecoder(model, compile=compile)

    def start(tokens):                          # the caches zeroed in place, then refilled
        dec.reset()
        return dec.prefill(tokens)
    return sample_loop(idx, max_new_tokens, temperature, top_k, dec.max_len, start, dec.step)


if __name__ == '__main__':
    from cli import fail
    fail('the generation module, not a command: python sample.py --help', 'decode.py')
