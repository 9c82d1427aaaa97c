"""Generate text from a checkpoint written by train.py: the command, the sampling loop, and the decoder
that drives each token mixing's step (gpt-fast's generate.py, for every model kind).

    python sample.py --ckpt out/ckpt.pt --start "Once upon a time" --num_samples 2
    python sample.py --ckpt out/ckpt.pt --start FILE:prompt.txt --temperature 0.8 --top_k 40 --compile

    out = generate(model, idx, 100, temperature=0.8, top_k=40)       # idx long [B, T] -> long [B, T + 100]
    dec = Decoder(model, batch_size=B, compile=True)    # every layer's buffers, allocated once
    logits = dec.prefill(idx)        # the prompt in one parallel pass -> logits float [B, vocab] after it
    logits = dec.step(next_token)    # long [B, 1] -> float [B, vocab]

Generation is incremental: the prompt is read once, then each new token is one step of every layer's
token mixing on the buffers its init_state allocated (mixer.py): eager, a step at position p reads
positions 0..p; --compile runs it through torch.compile with the position a 0-dim tensor, one graph
over n_ctx for every position (compiled on the first new token: seconds to a minute). Every
LanguageModel kind; the Autoencoder has no decoding.
"""

import argparse
import contextlib
import sys

from harness import cli
cli.begin('sample.py', __name__)       # the first instruction: Ctrl-C is one line from here, torch's import included

import torch
import torch.nn.functional as F

from harness.checkpoint import CheckpointError, load_checkpoint
from harness.machine import memory_error
from harness.cli import ArgumentParser, device_error, failing, number, random_seed, run_command

fail = failing('sample.py')            # 'PROG: error: msg' on stderr, exit 2


# ----------------------------------------------------------------------------- sampling

def sample_next(logits, temperature=1.0, top_k=None):
    """Draw one token per row from logits float [B, vocab] -> long [B, 1].

    temperature 0 -> argmax; top_k -> sample among the k largest logits. Safe at any temperature > 0: the row's
    largest logit is subtracted first (no inf), and it divides by at least float32's smallest normal number
    (a smaller one is 0 there: 0 / 0): near 0, a draw among the best tokens, the limit."""
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits.float()
    logits = (logits - logits.amax(-1, keepdim=True)) / max(temperature, torch.finfo(torch.float32).tiny)
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, [-1]]
        logits = logits.masked_fill(logits < kth, float('-inf'))
    return torch.multinomial(F.softmax(logits, dim=-1), 1)


@torch.no_grad()
def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, compile=False, decoder=None):
    """Sample max_new_tokens after idx long [B, T] from a mixer.LanguageModel -> long [B, T + max_new_tokens]:
    one parallel prefill of the prompt, then one Decoder step a token (compiled with `compile`; `decoder`
    reuses one, its compiled graph too). Once a position-indexed model holds n_ctx tokens its window
    slides: a fresh prefill of the last n_ctx / 2. temperature 0 is greedy; top_k keeps the k most likely
    tokens. ValueError for a prompt longer than n_ctx (a position-indexed model)."""
    dec = decoder or Decoder(model, idx.shape[0], compile=compile)
    logits, out = dec.prefill(idx), [idx]
    for i in range(max_new_tokens):
        out.append(sample_next(logits, temperature, top_k))
        if i == max_new_tokens - 1:
            break
        if dec.max_len is not None and dec.pos >= dec.max_len:
            logits = dec.prefill(torch.cat(out, 1)[:, -(dec.max_len // 2):])
        else:
            logits = dec.step(out[-1])
    return torch.cat(out, 1)


# ----------------------------------------------------------------------------- the decoder

class Decoder:
    """Incremental decoding of batch_size sequences by one LanguageModel (in eval mode): every layer's state,
    allocated once here by the model's init_state (in its dtype, or autocast's if made under autocast),
    and the model's step on it. prefill(idx long [b, T]) starts fresh sequences: the prompt in one
    parallel step -> logits float [b, vocab] after it; step(idx long [B, 1]) -> logits after that token.
    Eager, a step at position p reads positions 0..p (attention.span). compile=True: the step through
    torch.compile(dynamic=False), the position a 0-dim tensor on the device advanced in place (no copy
    from the host a token), one graph over n_ctx for every position (`compiles` counts compilations;
    `backend`: 'inductor', or 'eager' to trace only); on CUDA a CUDA graph (one launch a token) replaying
    the buffers and input token, allocated here and written in place. On the CPU a small step (batch_size
    x d_model <= ONE_THREAD_WIDTH) runs on one torch thread (`threads`). ValueError past n_ctx (max_len)."""

    def __init__(self, model, batch_size=1, compile=False, backend='inductor', cuda_graphs=None):
        p = next(model.parameters())
        self.threads = 1 if p.device.type == 'cpu' and batch_size * model.cfg.d_model <= ONE_THREAD_WIDTH else None
        autocast = p.device.type in ('cpu', 'cuda') and torch.is_autocast_enabled(p.device.type)
        self.layers = model.init_state(batch_size, dtype=torch.get_autocast_dtype(p.device.type) if autocast else None)
        self.model, self.max_len, self.batch, self.compiles, self.pos = model, model.max_len, batch_size, 0, 0
        self._pos = torch.zeros((), dtype=torch.long, device=p.device)        # the position, for the graph
        self._token = torch.zeros(batch_size, 1, dtype=torch.long, device=p.device)
        self.cuda_graphs = p.is_cuda if cuda_graphs is None else cuda_graphs
        if compile:
            for buf in self.buffers():
                torch._dynamo.mark_static_address(buf)

        def counted(gm, example_inputs):
            self.compiles += 1
            if backend == 'inductor':        # torch.compile's mode='reduce-overhead' is this config patch
                from torch._inductor.compile_fx import compile_fx   # here: seconds of import, only if used
                return compile_fx(gm, example_inputs, config_patches={'triton.cudagraphs': self.cuda_graphs})
            return torch._dynamo.lookup_backend(backend)(gm, example_inputs)
        self._compiled = torch.compile(model.step, backend=counted, dynamic=False) if compile else None

    def buffers(self):
        """Every cache and state tensor of every layer."""
        return [b for layer in self.layers for b in _tensors(layer)]

    def _check_batch(self, idx, seqs=slice(None)):
        """ValueError unless idx long [b, t] holds as many sequences as the buffers' `seqs` (a slice)."""
        n = len(range(self.batch)[seqs])
        if idx.shape[0] != n:
            raise ValueError(f'{idx.shape[0]} sequences for a decoder of {n} (its buffers hold a batch of '
                             f'{self.batch}): use a new Decoder for another batch size')

    @torch.no_grad()
    def prefill(self, idx, seqs=slice(None)):
        """Start fresh sequences: the prompt idx long [b, T] at positions 0..T-1 in one parallel, eager step
        into the sequences `seqs` (a slice: a batch prefilled a slice at a time, each at the same T) of the
        buffers -> logits float [b, vocab] after it; the position becomes T. ValueError for T past n_ctx."""
        T = idx.shape[1]
        if self.max_len is not None and T > self.max_len:
            raise ValueError(f'prompt of {T} tokens is longer than n_ctx={self.max_len}')
        self._check_batch(idx, seqs)
        views = [_rows(layer, seqs) for layer in self.layers]           # those sequences' buffers, zeroed
        for buf in (b for v in views for b in _tensors(v)):
            buf.zero_()
        logits = self.model.step(idx, 0, views)
        self.pos = T
        self._pos.fill_(T)
        return logits

    @torch.no_grad()
    def step(self, idx):
        """idx long [B, 1] at the current position -> logits float [B, vocab]."""
        if self.max_len is not None and self.pos >= self.max_len:
            raise ValueError(f'position {self.pos} is past n_ctx={self.max_len}')
        self._check_batch(idx)
        with intra_op_threads(self.threads):
            if self._compiled is None:
                logits = self.model.step(idx, self.pos, self.layers)
            else:                                        # one [B, 1] input tensor: the same strides each token
                logits = self._compiled(self._token.copy_(idx), self._pos, self.layers)
        self.pos += 1
        self._pos.add_(1)                                # on the device, in place: no copy from the host
        return logits


# A decode step on the CPU is many small ops on one token's vectors; with 2 OpenMP threads each op ends
# at a barrier, where a thread the OS has descheduled (a loaded laptop) holds the other for a time slice.
# Measured on 2 cores (bench.py --tables loaded; docs/performance.md, "Decoding now"): the eager flat step
# at d_model 128, batch 1, beside two busy processes took 1.6 to 32 ms on 2 threads (14 tries of 14 over
# 1.5 ms), 1.05 to 2.31 ms on one; quiet, 0.85 to 2.08 and 0.83 to 2.02 ms. Quiet, one thread is as fast
# up to batch x d_model = 1024 (batch 4 at d_model 256, batch 1 at 1024); wider, 2 threads may gain.
ONE_THREAD_WIDTH = 1024


@contextlib.contextmanager
def intra_op_threads(n):
    """torch's intra-op threads set to n (None: as they are) inside the block, restored after it."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _tensors(d):
    """The tensors of a nested state dict."""
    for v in d.values():
        yield from _tensors(v) if isinstance(v, dict) else [v]


def _rows(d, seqs):
    """A nested state dict of views of the sequences `seqs` (a slice) of each buffer."""
    return {k: _rows(v, seqs) if isinstance(v, dict) else v[seqs] for k, v in d.items()}


# ----------------------------------------------------------------------------- the command

def main(argv=None):
    """Command line entry point (argv: list of str; None: sys.argv): exits (SystemExit, as the in-process
    runner experiments/commands.py reads it) with 0, the samples printed; 2, bad input (one line); 130,
    Ctrl-C (one line: cli.run_command); 1, stdout closed."""
    sys.exit(run_command('sample.py', sample, argv))


def sample(argv):
    """Parse `argv`, load the checkpoint, check the sizes against the device's memory (sampling_bytes) and
    print --num_samples samples."""
    p = ArgumentParser('sample.py', __doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # errors: one line
    p.description = __doc__                                 # --help: the whole docstring, as written
    p.add_argument('--ckpt', default='out/ckpt.pt', help='checkpoint from train.py')
    p.add_argument('--start', default='<|endoftext|>', help='prompt text, or FILE:path to read it from a file')
    p.add_argument('--num_samples', type=number(int, 1), default=2)
    p.add_argument('--max_new_tokens', type=number(int, 0), default=200)
    p.add_argument('--temperature', type=number(float, 0), default=0.8, help='0 means greedy')
    p.add_argument('--top_k', type=number(int, 0), default=40, help='0 means no top-k filter')
    p.add_argument('--seed', type=random_seed, default=1337)
    p.add_argument('--device', default='cpu')
    p.add_argument('--compile', action='store_true', help='torch.compile the decoding step (Decoder)')
    args = p.parse_args(argv)
    if device_error(args.device):
        fail(device_error(args.device))

    try:
        model, enc, ckpt = load_checkpoint(args.ckpt, args.device)
    except CheckpointError as e:
        fail(str(e))
    if model.cfg.task != 'lm':
        fail('this checkpoint is an autoencoder; sample.py needs a language model')
    text = args.start
    if text.startswith('FILE:'):
        try:
            text = open(text[5:], encoding='utf-8').read()
        except (OSError, UnicodeDecodeError) as e:
            fail(f'cannot read prompt file {text[5:]!r}: {e}')
    elif any('\udc80' <= c <= '\udcff' for c in text):     # bytes not UTF-8, as Python's argv keeps them
        fail('--start holds bytes that are not UTF-8: give UTF-8 text, or FILE:path of a UTF-8 file')
    ids = enc.encode(text, allowed_special={'<|endoftext|>'})
    if not ids:
        fail('the prompt is empty; pass --start "<|endoftext|>" to start a fresh story')
    if len(ids) > model.cfg.n_ctx:
        print(f'sample.py: warning: the prompt is {len(ids)} tokens, longer than the model context '
              f'n_ctx={model.cfg.n_ctx}: keeping its last {model.cfg.n_ctx} tokens', file=sys.stderr)
        ids = ids[-model.cfg.n_ctx:]
    if why := memory_error(sampling_bytes(model, args.num_samples, len(ids), args.max_new_tokens), args.device,
                           f'sampling {args.num_samples:,} sequences of {len(ids) + args.max_new_tokens:,} tokens'):
        fail(f'{why}: give a smaller --num_samples or --max_new_tokens')     # before anything is allocated

    torch.manual_seed(args.seed)
    idx = torch.tensor([ids] * args.num_samples, device=args.device)
    out = generate(model, idx, args.max_new_tokens, args.temperature, args.top_k or None, compile=args.compile)
    for i, row in enumerate(out.tolist()):
        print(f'--- sample {i + 1} ({ckpt["config"].get("variant", model.cfg.kind)}, step {ckpt["step"]}, '
              f'{len(row) - len(ids)} new tokens)')
        print(enc.decode(row).replace('<|endoftext|>', '\n<|endoftext|>\n').strip())


def sampling_bytes(model, batch, prompt, new_tokens):
    """The least memory in bytes that sampling `batch` sequences of a `prompt`-token prompt and `new_tokens`
    new tokens takes: the model's weights, the decoding state of `batch` sequences (its init_state, read off
    the meta device: nothing allocated), the tokens (int64, the steps' and their concatenation) and, a step,
    the logits and their softmax (float32 [batch, vocab] each) and the prompt's hidden states (float32
    [batch, prompt, d_model]). For sample.py's check against the device's memory (train.py's rule)."""
    def tensors(x):
        return [x] if isinstance(x, torch.Tensor) else [t for v in (x.values() if isinstance(x, dict) else x)
                                                          for t in tensors(v)]
    state = tensors(model.init_state(batch, device='meta'))
    held = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers(), *state])
    return held + batch * (16 * (prompt + new_tokens) + 8 * model.cfg.vocab_size + 4 * prompt * model.cfg.d_model)


if __name__ == '__main__':
    main()
