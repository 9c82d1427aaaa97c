"""Generate text from a checkpoint written by train.py: the command, the sampling loop, and the decoder
that drives each token mixing's step (as gpt-fast's generate.py does, for every model kind).

    python sample.py --ckpt out/ckpt.pt --start "Once upon a time" --num_samples 2
    python sample.py --ckpt out/ckpt.pt --start FILE:prompt.txt --temperature 0.8 --top_k 40 --compile
    python sample.py --ckpt out/ckpt.pt --stop_at_eot --max_new_tokens 1000     # one story per sample

    out = generate(model, idx, 100, temperature=0.8, top_k=40)       # idx long [B, T] -> long [B, T + 100]
    dec = Decoder(model, batch_size=B, compile=True)    # every layer's state, allocated once
    logits = dec.prefill(idx)        # the prompt in one parallel pass -> logits float [B, vocab] after it
    logits = dec.step(next_token)    # long [B, 1] -> float [B, vocab]

Generation is incremental: the prompt is read once, then each new token is one step of every layer's
token mixing on the state that the mixing's init_state allocated (mixer.py). In eager mode a step at
position p reads positions 0..p. With --compile the step runs through torch.compile with the position
held in a 0-dim tensor, so that one graph over n_ctx serves every position; it is compiled before the
first new token, with a line on stderr saying so (seconds to a minute). Every LanguageModel kind decodes
this way; the Autoencoder does not decode. The samples go to stdout; at the end, stderr gets the new
tokens per second (the prompt's prefill included, the compilation not).
"""

import contextlib
import sys
import time

from harness import cli
cli.begin('sample.py', __name__)       # first, before torch's import: from here Ctrl-C is one line

import torch
import torch.nn as nn
import torch.nn.functional as F

from harness.checkpoint import CheckpointError
from harness.loading import load_checkpoint
from harness.machine import memory_error
from harness.cli import failing, run_command
from harness.flags import ArgumentParser, DocHelpFormatter, device_error, number, random_seed

fail = failing('sample.py')            # 'PROG: error: msg' on stderr, exit 2


# ----------------------------------------------------------------------------- sampling

def sample_next(logits, temperature=1.0, top_k=None):
    """Draw one token per row from logits float [B, vocab] -> long [B, 1].

    Temperature 0 takes the argmax; top_k samples among the k largest logits. Any temperature > 0 is safe:
    the row's largest logit is subtracted first (so no exp overflows to inf), and the logits are divided by
    at least float32's smallest normal number (a smaller divisor rounds to 0 there, giving 0 / 0). Near 0
    the draw is among the best tokens, the limit of sampling as the temperature goes to 0."""
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits.float()
    logits = (logits - logits.amax(-1, keepdim=True)) / max(temperature, torch.finfo(torch.float32).tiny)
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, [-1]]
        logits = logits.masked_fill(logits < kth, float('-inf'))
    return torch.multinomial(F.softmax(logits, dim=-1), 1)


@torch.no_grad()
def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, compile=False, decoder=None,
             stop=None):
    """Sample max_new_tokens after idx long [B, T] from a mixer.LanguageModel -> long [B, T +
    max_new_tokens]: one parallel prefill of the prompt, then one Decoder step per token (compiled with
    `compile`; `decoder` reuses a Decoder, and its compiled graph too), on the decoder's threads. Once a
    position-indexed model holds n_ctx tokens, its window slides: a fresh prefill of the last n_ctx / 2.
    Temperature 0 is greedy; top_k keeps the k most likely tokens; stop(new long [B, t]) -> True ends the
    generation early, after t new tokens (the output then has fewer columns). ValueError for a prompt
    longer than n_ctx (a position-indexed model)."""
    dec = decoder or Decoder(model, idx.shape[0], compile=compile)
    logits, out = dec.prefill(idx), [idx]
    with intra_op_threads(dec.threads):
        for i in range(max_new_tokens):
            out.append(sample_next(logits, temperature, top_k))
            if i == max_new_tokens - 1 or (stop is not None and stop(torch.cat(out[1:], 1))):
                break
            if dec.max_len is not None and dec.pos >= dec.max_len:
                logits = dec.prefill(torch.cat(out, 1)[:, -(dec.max_len // 2):])
            else:
                logits = dec.step(out[-1])
    return torch.cat(out, 1)


# ----------------------------------------------------------------------------- the decoder

class Decoder(nn.Module):
    """Incremental decoding of batch_size sequences by one LanguageModel in eval mode, driven the way
    gpt-fast's generate.py drives its model. The Decoder holds the model's state (its init_state, allocated
    once here, in the dtype the model computes in: the weights' dtype, or autocast's when the Decoder is
    made under autocast) and runs the model's step on it.

    prefill(idx long [B, T]) starts fresh sequences: the prompt in one parallel step -> logits float
    [B, vocab] after it. step(idx long [B, t]) -> the logits after those t tokens; the position advances
    by t. A step at position p reads positions 0..p (mixer.span). With compile=True a one-token step goes
    through compiled_step instead: one torch.compile'd graph for every position (`backend` names another
    torch.compile backend, e.g. 'eager' to trace only). `threads` is the number of torch threads a step of
    this size runs best on, which generate steps on: on the CPU, 1 when batch_size x d_model <=
    ONE_THREAD_WIDTH, else None (the threads as they are). ValueError for what it cannot take: another
    batch size, an empty prompt, a position past n_ctx (max_len), or a dtype other than its state's
    (another autocast than the one it was made under)."""

    def __init__(self, model, batch_size=1, compile=False, backend='inductor'):
        super().__init__()
        p = next(model.parameters())
        self.model, self.max_len, self.batch = model, model.max_len, batch_size
        self.device, self.param_dtype = p.device, p.dtype
        self.dtype = autocast_dtype(p.device) or p.dtype
        self.state = model.init_state(batch_size, dtype=self.dtype)
        self.pos = 0                       # the next position
        small = p.device.type == 'cpu' and batch_size * model.cfg.d_model <= ONE_THREAD_WIDTH
        self.threads = 1 if small else None
        self.compiled = None
        if compile:     # the graph's inputs are attributes, so that torch.compile keeps their addresses
            self.token = torch.zeros(batch_size, 1, dtype=torch.long, device=p.device)
            self.pos_on_device = torch.zeros((), dtype=torch.long, device=p.device)
            mode = 'reduce-overhead' if backend == 'inductor' else None
            self.compiled = torch.compile(self.graph_step, backend=backend, mode=mode, dynamic=False)

    def check(self, idx):
        """ValueError unless idx long [B, t] (t >= 1) fits the state's batch, computed in the dtype the state
        was made for (the autocast it was made under, or none)."""
        if idx.dim() != 2 or idx.shape[0] != self.batch or idx.shape[1] == 0:
            raise ValueError(f'tokens of shape {list(idx.shape)} for a decoder whose state holds a batch of '
                             f'{self.batch}: give long [{self.batch}, t], t >= 1 (another batch size: '
                             'a new Decoder)')
        if (autocast_dtype(self.device) or self.param_dtype) != self.dtype:
            raise ValueError(f"this decoder's state is {self.dtype}, but the model would compute in "
                             f'{autocast_dtype(self.device) or self.param_dtype}: step it under the autocast '
                             'it was made under (or outside, if it was made outside), or make a new Decoder')

    @torch.no_grad()
    def prefill(self, idx):
        """Start fresh sequences: the prompt idx long [B, T] at positions 0..T-1 in one parallel, eager step
        on the zeroed state -> logits float [B, vocab] after it; the position becomes T. ValueError for T
        past n_ctx."""
        if self.max_len is not None and idx.shape[1] > self.max_len:
            raise ValueError(f'prompt of {idx.shape[1]} tokens is longer than n_ctx={self.max_len}')
        self.check(idx)
        for tensor in state_tensors(self.state):
            tensor.zero_()
        logits = self.model.step(idx, self.state, 0)
        self.pos = idx.shape[1]
        return logits

    @torch.no_grad()
    def step(self, idx):
        """idx long [B, t] at the current position -> logits float [B, vocab] after them; the position
        advances by t. ValueError past n_ctx."""
        self.check(idx)
        if self.max_len is not None and self.pos + idx.shape[1] > self.max_len:
            raise ValueError(f'positions {self.pos}..{self.pos + idx.shape[1] - 1} are past '
                             f'n_ctx={self.max_len}')
        if self.compiled is not None and idx.shape[1] == 1:
            logits = self.compiled_step(idx)
        else:
            logits = self.model.step(idx, self.state, self.pos)
        self.pos += idx.shape[1]
        return logits

    def compiled_step(self, idx):
        """One token idx long [B, 1] through the compiled graph (graph_step) -> logits float [B, vocab]; on
        CUDA the graph is a CUDA graph, one launch per token (mode='reduce-overhead'). Its inputs are
        written in place: the token, and the position as a 0-dim tensor on the device (a step then reads
        all n_ctx positions of a cache, those past the token masked: mixer.span)."""
        self.token.copy_(idx)
        self.pos_on_device.fill_(self.pos)
        return self.compiled().clone()            # a CUDA graph's output is overwritten by its next replay

    def graph_step(self):
        """The one-token step the compiled graph holds: self.token at self.pos_on_device -> logits float
        [B, vocab]."""
        return self.model.step(self.token, self.state, self.pos_on_device)


def autocast_dtype(device):
    """The dtype autocast computes in on `device` (a torch.device), or None outside autocast."""
    on = device.type in ('cpu', 'cuda') and torch.is_autocast_enabled(device.type)
    return torch.get_autocast_dtype(device.type) if on else None


# The widest decode step (batch_size x d_model) run on one CPU thread: on a busy CPU, a step's threads
# wait for each other at every small op (measured in docs/performance.md, "Decoding on a loaded CPU").
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


def state_tensors(state):
    """Every tensor of a decoding state, one after another (a generator): `state` is a list with one nested
    dict of tensors per layer, as LanguageModel.init_state returns it (Decoder.state), or one such dict."""
    for v in (state.values() if isinstance(state, dict) else state):
        yield from state_tensors(v) if isinstance(v, (dict, list)) else [v]


# ----------------------------------------------------------------------------- the command

def main(argv=None):
    """Command line entry point (argv: list of str; None: sys.argv). Exits (SystemExit, which the
    in-process runner experiments/commands.py reads) with 0 when the samples are printed; 2 for bad input
    (one line); 130 on Ctrl-C (one line: cli.run_command); 1 when stdout is closed."""
    sys.exit(run_command('sample.py', sample, argv))


def sample(argv):
    """Parse `argv`, load the checkpoint, check the sizes against the device's memory (sampling_bytes),
    and print --num_samples samples on stdout; on stderr, a line while --compile compiles and the new
    tokens per second at the end."""
    p = ArgumentParser('sample.py', __doc__, formatter_class=DocHelpFormatter)  # errors: one line
    p.description = __doc__                                 # --help: the whole docstring, as written
    p.add_argument('--ckpt', default='out/ckpt.pt', help='checkpoint from train.py (or a folder convert.py '
                                                         'exported)')
    p.add_argument('--start', default='<|endoftext|>',
                   help='prompt text, or FILE:path to read it from a file')
    p.add_argument('--num_samples', type=number(int, 1), default=2, help='samples, drawn as one batch')
    p.add_argument('--max_new_tokens', type=number(int, 0), default=200,
                   help='new tokens per sample, at most')
    p.add_argument('--stop_at_eot', action='store_true', help='end each sample at the end of its story: its '
                   'first <|endoftext|> after the prompt')
    p.add_argument('--temperature', type=number(float, 0), default=0.8, help='0 means greedy')
    p.add_argument('--top_k', type=number(int, 0), default=40, help='0 means no top-k filter')
    p.add_argument('--seed', type=random_seed, default=1337, help="torch's seed for the draws")
    p.add_argument('--device', default='auto', help="'auto' (cuda when there is one, else cpu), 'cpu', "
                                                    "'cuda', 'cuda:N'")
    p.add_argument('--compile', action='store_true', help='torch.compile the decoding step (Decoder)')
    p.add_argument('--dtype', choices=('float32', 'bfloat16'), default='float32',
                   help='the weights and the decoding state: bfloat16 reads half the bytes per token (on a '
                        'CPU with native bf16, or a GPU); float32, the checkpoint as trained')
    args = p.parse_args(argv)
    if args.device == 'auto':
        args.device = 'cuda' if torch.cuda.is_available() else 'cpu'
    if device_error(args.device):
        fail(device_error(args.device))

    try:
        model, enc, ckpt = load_checkpoint(args.ckpt, args.device)
    except CheckpointError as e:
        fail(str(e))
    if model.cfg.task != 'lm':
        fail('this checkpoint is an autoencoder; sample.py needs a language model')
    model = model.to(getattr(torch, args.dtype))
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
    need = sampling_bytes(model, args.num_samples, len(ids), args.max_new_tokens)
    what = f'sampling {args.num_samples:,} sequences of {len(ids) + args.max_new_tokens:,} tokens'
    if why := memory_error(need, args.device, what):
        fail(f'{why}: give a smaller --num_samples or --max_new_tokens')     # before anything is allocated

    torch.manual_seed(args.seed)
    idx = torch.tensor([ids] * args.num_samples, device=args.device)
    dec = Decoder(model, args.num_samples, compile=args.compile)
    if args.compile:
        compile_now(dec, idx)
    ends = [None] * args.num_samples                    # each sample's new tokens up to its <|endoftext|>

    def story_ended(new):
        for r in (r for r, end in enumerate(ends) if end is None and new[r, -1] == enc.eot_token):
            ends[r] = new.shape[1]
        return None not in ends
    started = time.perf_counter()
    out = generate(model, idx, args.max_new_tokens, args.temperature, args.top_k or None, decoder=dec,
                   stop=story_ended if args.stop_at_eot else None).tolist()     # on the host: work done
    seconds = time.perf_counter() - started
    new_tokens = 0
    for i, row in enumerate(out):
        new = row[len(ids):len(ids) + (ends[i] or len(row))]
        new_tokens += len(new)
        print(f'--- sample {i + 1} ({ckpt["config"].get("variant", model.cfg.kind)}, step {ckpt["step"]}, '
              f'{len(new)} new tokens' + (', to <|endoftext|>)' if ends[i] else ')'))
        print(enc.decode(ids + new).replace('<|endoftext|>', '\n<|endoftext|>\n').strip())
    sys.stdout.flush()
    print(f'sample.py: {new_tokens:,} new tokens in {seconds:.2f} s, {new_tokens / max(seconds, 1e-9):,.1f} '
          f'tokens/s ({args.num_samples} sample(s) as one batch, the prompt\'s {len(ids)} tokens read first, '
          f'on {args.device}, {args.dtype}' + (', compiled' if args.compile else '') + ')', file=sys.stderr)


def compile_now(dec, idx):
    """Compile a Decoder's one-token step (made with compile=True) before sampling, so that the tokens per
    second count decoding alone: one prefill and one step of the prompt's first token (the next prefill
    resets the state they leave). A line on stderr says so while it compiles, and one gives its seconds
    after."""
    print('sample.py: compiling the decoding step (torch.compile, once: seconds to a minute) ...',
          file=sys.stderr, flush=True)
    started = time.perf_counter()
    with intra_op_threads(dec.threads):
        dec.prefill(idx[:, :1])
        if dec.max_len is None or dec.max_len >= 2:
            dec.step(idx[:, :1])
    print(f'sample.py: compiled in {time.perf_counter() - started:.1f} s', file=sys.stderr, flush=True)


def sampling_bytes(model, batch, prompt, new_tokens):
    """The least memory in bytes that sampling `batch` sequences takes, each a `prompt`-token prompt and
    `new_tokens` new tokens: the model's weights; the decoding state of `batch` sequences (its init_state,
    read off the meta device, so nothing is allocated); the tokens (int64: the steps' and their
    concatenation); per step, the logits and their softmax (float32 [batch, vocab] each); and the prompt's
    hidden states (float32 [batch, prompt, d_model]). For sample.py's check against the device's memory
    (the same rule as train.py's)."""
    state = list(state_tensors(model.init_state(batch, device='meta')))
    held = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers(), *state])
    per_sequence = 16 * (prompt + new_tokens) + 8 * model.cfg.vocab_size + 4 * prompt * model.cfg.d_model
    return held + batch * per_sequence


if __name__ == '__main__':
    main()
