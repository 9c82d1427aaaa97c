"""bench.py's generation-speed tables: how fast the models generate, one sequence or many.

    python -m experiments.bench --tables generation,decode,serving,sdpa     # (bench.py is the entry point)

4. Generation: per-token latency after prompts of several lengths for the flat
   mixer recomputing its window (a full forward per new token, the reference
   code's method), the flat mixer with its cache, the recurrent mixer, the
   transformer with its KV cache and linear attention.
6. Decode step: batch-1 ms/token of sample.Decoder's step (every mixing's step on its buffers at
   n_ctx), eager and under torch.compile, against the weight-read limit:
   parameter bytes / the measured copy bandwidth (STREAM's convention: bytes read +
   written per second of a large tensor copy), the time to read every weight once.
7. Serving: generated tokens/s of B sequences at once at context C (the prefill timed apart),
   and the bytes a sequence holds, cache or state, read off the decoder's own buffers; the
   largest batch that fits a given memory. The figure by which recurrent models argue (Gu & Dao
   2023, "Mamba", arXiv 2312.00752, its inference-throughput figure): a constant-size state
   lets a fixed memory hold more sequences the longer the context.
8. SDPA backends: the transformer's decode with scaled_dot_product_attention forced to each
   backend (torch.nn.attention.sdpa_kernel): does one backend cost the eager decode its time?
9. Loaded (not run by default): the eager decode step on the CPU, quiet and beside processes that
   only spin (a laptop with a browser and a build running), on all threads and on sample.Decoder's.
(The numbers are bench.py's table numbers; tables 1, 2, 3 and 5 are in bench.py.)
"""

import sys

if __name__ == '__main__':       # not a command, run as a file or with -m: said before any import
    print("bench_decode.py: error: bench.py's generation tables, not a command: python -m "
          "experiments.bench --tables serving,decode", file=sys.stderr)
    sys.exit(2)

import os
import statistics
import subprocess
import time
from contextlib import nullcontext

import torch

from harness import machine
import mixer
import sample
from experiments.runner import fmt_bytes, md_row, md_table, say, time_calls

GEN_METHODS = (('flat', 'window recompute'), ('flat', 'cache'), ('recurrent', 'state'),
               ('transformer', 'KV cache'), ('linear_attention', 'state'))
SERVE_KINDS = {'recurrent': 'state', 'linear_attention': 'state', 'flat': 'cache', 'toeplitz': 'cache',
               'transformer': 'KV cache'}
SERVE_WARM = 3           # tokens stepped between the prefill and the clock (a compiled step compiles, records)
PREFILL_TOKENS = 16384   # tokens in one prefill pass: the batch is prefilled in slices of about this many
SDPA_BACKENDS = ('FLASH_ATTENTION', 'EFFICIENT_ATTENTION', 'CUDNN_ATTENTION', 'MATH')


def build(name, args, device=None, **sizes):
    """Model of variant `name` with the given sizes (d_model, n_layer, n_ctx) on `device` (default
    args.device; 'meta': shapes and dtypes without memory) (the tables of bench.py and of this module
    build their models here)."""
    cfg = mixer.variant_config(name, vocab_size=args.vocab_size, n_head=1, **sizes)  # a variant's n_head wins
    if device == 'meta':
        with torch.device('meta'):
            return mixer.build_model(cfg)
    return mixer.build_model(cfg).to(device or args.device)


def nbytes(tensors):
    """Bytes held by the tensors (an iterable) -> int."""
    return sum(t.numel() * t.element_size() for t in tensors)


# ----------------------------------------------------------------------------- 4. generation

@torch.no_grad()
def time_generation(model, prompt_len, n_new, recompute, args):
    """Greedy generation after a random prompt of prompt_len tokens, batch 1.

    recompute=True runs a full forward over the current window for each token;
    otherwise a sample.Decoder (eager): the prompt's prefill, then one step a token (what
    sample.generate() does). Returns (prefill ms, median ms per new token, buffer bytes)."""
    idx = torch.randint(args.vocab_size, (1, prompt_len), device=args.device)
    dec = None if recompute else sample.Decoder(model)
    times = []
    with machine.autocast(args.device, args.dtype):
        for i in range(n_new + 1):
            machine.sync(args.device)
            t0 = time.perf_counter()
            if recompute:
                logits = model(idx[:, -model.max_len:])[0][:, -1]
            else:
                with sample.intra_op_threads(None if i == 0 else dec.threads):       # as sample.generate
                    logits = dec.prefill(idx) if i == 0 else dec.step(idx[:, -1:])
            machine.sync(args.device)
            times.append(1e3 * (time.perf_counter() - t0))
            idx = torch.cat([idx, sample.sample_next(logits, temperature=0)], dim=1)
    state_bytes = 0 if recompute else nbytes(sample.state_tensors(dec.state))
    return times[0], statistics.median(times[1:]), state_bytes


def bench_generation(args):
    """Print the generation table: ms/token and tokens/s per method and prompt length."""
    prompts = args.prompts
    n_ctx = max(prompts) + args.new_tokens
    models, results = {}, {}
    for name, how in GEN_METHODS:
        say(f'generation: {name}, {how}')
        if name not in models:
            models[name] = build(name, args, d_model=args.d_model, n_layer=args.n_layer, n_ctx=n_ctx).eval()
            time_generation(models[name], min(8, max(prompts)), min(2, args.new_tokens), False, args)  # warm-up
        recompute = how == 'window recompute'
        n_new = args.recompute_tokens if recompute else args.new_tokens
        for P in prompts:
            results[name, how, P] = (n_new,) + time_generation(models[name], P, n_new, recompute, args)
    rows = []
    for (name, how, P), (n_new, prefill, ms, cache_bytes) in results.items():
        ref = results[('flat', 'window recompute', P)][2]
        first = results[(name, how, prompts[0])][2]
        rows.append([f'{name}, {how}', P, n_new, f'{prefill:.1f}', f'{ms:.2f}', f'{1e3 / ms:.0f}',
                     f'{ref / ms:.1f}x', f'{ms / first:.2f}', fmt_bytes(cache_bytes) if cache_bytes else '-'])
    print(f'## Generation\n\n_Batch 1, greedy, d_model {args.d_model}, n_layer {args.n_layer}, n_ctx {n_ctx}, '
          f'{args.dtype}. ms/token is the median over the new tokens timed ({args.new_tokens} per prompt; only '
          f'{args.recompute_tokens} for the window recompute, which runs a full forward per token); tokens/s = '
          f'1000 / ms/token. "vs recompute": speed-up over the window recompute at the same prompt; "vs prompt '
          f'{prompts[0]}": ms/token relative to the same method at prompt {prompts[0]}; cache: the bytes of '
          f'the decoder\'s buffers (allocated at n_ctx)._\n')
    print(md_table(['method', 'prompt', 'tokens timed', 'prefill ms', 'ms/token', 'tokens/s', 'vs recompute',
                    f'vs prompt {prompts[0]}', 'cache'], rows) + '\n')


# ----------------------------------------------------------------------------- 6. decode step

def copy_bandwidth(device, nbytes=2 ** 28, repeats=5):
    """Bytes read + written per second of the best of `repeats` copies of an nbytes
    float32 tensor (STREAM's 'copy' convention) -> float, B/s."""
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / min(time_calls(lambda: dst.copy_(src), repeats, device=device))


@torch.no_grad()
def decode_ms(step, prompt, n_new, wait=lambda: None, threads=None):
    """Median ms per step of `step` (long [B, 1] -> logits [B, vocab]) over n_new greedy tokens
    after feeding the prompt (long [B, P]) one token at a time, on `threads` torch threads (None: as they
    are; a Decoder's `threads`: as sample.generate steps it). wait() (the device's synchronize) runs
    before each clock read, so that every column times the work done, not its launch."""
    with sample.intra_op_threads(threads):
        for t in range(prompt.shape[1]):
            logits = step(prompt[:, t:t + 1])
        times = []
        for _ in range(n_new):
            nxt = logits.argmax(-1, keepdim=True)
            wait()
            t0 = time.perf_counter()
            logits = step(nxt)
            wait()
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def eager_ms(model, start, args, wait):
    """Median ms/token of an eager sample.Decoder over --decode_tokens greedy steps at the positions
    start.. (a random prompt prefilled before them): each step reads the positions it has seen, so a
    late start costs more for the cache kinds."""
    dec = sample.Decoder(model)
    prompt = torch.randint(args.vocab_size, (1, start), device=args.device)
    dec.prefill(prompt[:, :-1])
    return decode_ms(dec.step, prompt[:, -1:], args.decode_tokens, wait, dec.threads)


def graphs_compiled():
    """Graphs torch.compile has compiled in this process so far (torch._dynamo's own count)."""
    return torch._dynamo.utils.counters['stats']['unique_graphs']


def bench_decode(args):
    """Print the decode-step table: sample.Decoder's step eager (at an early and a late position) and
    compiled, against the weight-read limit, per variant and size (d_model x n_layer). Each row is
    printed (and flushed) as soon as it is measured: a run cut short keeps its rows."""
    bandwidth = copy_bandwidth(args.device)
    early, late = args.decode_n_ctx // 4, args.decode_n_ctx - args.decode_tokens
    how = ('the weights cast to it' if args.decode_cast else 'autocast, float32 weights' if args.dtype == 'bf16'
           else 'float32 weights')
    print(f'## Decode step\n\n_Batch 1, greedy, n_ctx {args.decode_n_ctx}, {args.dtype} ({how}); median ms/token over '
          f'{args.decode_tokens} tokens after a {early}-token prompt. Weight-read limit = '
          f'parameter bytes / copy bandwidth ({bandwidth / 1e9:.1f} GB/s measured, bytes read + written per '
          f'second of a {fmt_bytes(2 ** 28)} copy): the time to read every weight once. eager: sample.Decoder '
          f'not compiled, each step reading the positions it has seen: from position {early}, and "late" from '
          f'{late}; compiled: the same step torch.compile\'d (inductor), one graph over n_ctx for every position; '
          f'compile s: the first compiled step; compiles: graphs compiled for all the tokens._\n')
    print(md_table(['variant', 'd_model x n_layer', 'params', 'weights', 'read limit ms', 'eager ms',
                    'eager ms, late', 'compiled ms', 'compiled / limit', 'compile s', 'compiles'], []), flush=True)
    wait = lambda: machine.sync(args.device)          # noqa: E731
    for d_model, n_layer in args.decode_sizes:
        for name in args.decode_variants:
            say(f'decode: {name}, d_model {d_model}, n_layer {n_layer}')
            torch._dynamo.reset()
            model = build(name, args, d_model=d_model, n_layer=n_layer, n_ctx=args.decode_n_ctx).eval()
            if args.decode_cast:                           # the weights themselves in --dtype: no autocast
                model = model.to(serve_dtype(args))
            prompt = torch.randint(args.vocab_size, (1, early), device=args.device)
            wbytes = nbytes(model.parameters())
            limit = 1e3 * wbytes / bandwidth
            with machine.autocast(args.device, 'fp32' if args.decode_cast else args.dtype):
                eager = [eager_ms(model, start, args, wait) for start in (early, late)]
                dec, graphs = sample.Decoder(model, compile=True), graphs_compiled()
                dec.prefill(prompt[:, :1])
                t0 = time.perf_counter()
                dec.step(prompt[:, 1:2])                   # the first step compiles
                compile_s = time.perf_counter() - t0
                dec.prefill(prompt[:, :1])                 # the sequence again, its buffers zeroed
                compiled = decode_ms(dec.step, prompt[:, 1:], args.decode_tokens, wait, dec.threads)
            print(md_row([name, f'{d_model} x {n_layer}', f'{model.num_params() / 1e6:.2f}M', fmt_bytes(wbytes),
                          f'{limit:.3f}', *(f'{ms:.3f}' for ms in eager), f'{compiled:.3f}',
                          f'{compiled / limit:.1f}x', f'{compile_s:.0f}', graphs_compiled() - graphs]), flush=True)
    print()


# ----------------------------------------------------------------------------- 7. serving

def serve_dtype(args):
    """The dtype the serving table casts its models to: bf16 with --dtype bf16, else fp32."""
    return torch.bfloat16 if args.dtype == 'bf16' else torch.float32


def serve_bytes(name, n_ctx, args):
    """(model bytes: parameters and buffers, cache or state bytes a sequence) of kind `name` at
    context n_ctx and --serve_size in the serving dtype, read off a model and its init_state on the
    meta device: the real tensors' shapes and dtypes, no memory (nothing is allocated before a cell is
    known to fit)."""
    d_model, n_layer = args.serve_size
    return meta_bytes(build(name, args, 'meta', d_model=d_model, n_layer=n_layer, n_ctx=n_ctx).to(serve_dtype(args)))


def meta_bytes(model):
    """(bytes of its parameters and buffers, of a sample.Decoder's state at batch 1) of a model on the meta
    device (the serving table's cells, bench.py's memory check)."""
    state = sample.Decoder(model).state
    return nbytes([*model.parameters(), *model.buffers()]), nbytes(sample.state_tensors(state))


def step_bytes(args):
    """Estimated activation bytes a sequence of one decode step holds: the logits and about ten
    d_model-long vectors (the feed-forward's hidden layer among them), in the serving dtype."""
    return serve_dtype(args).itemsize * (args.vocab_size + 10 * args.serve_size[0])


def largest_batch(model_bytes, per_seq, args):
    """How many sequences fit --serve_memory_gb beside the model: each holds its cache or state
    (per_seq bytes) and a decode step's activations (step_bytes) -> int."""
    return max(0, int((args.serve_memory_gb * 2 ** 30 - model_bytes) // (per_seq + step_bytes(args))))


def serve_estimate(name, n_ctx, batch, model_bytes, per_seq, args):
    """Bytes a serving cell needs at its peak, estimated before anything is allocated: the model, the
    batch's caches and step activations, and one prefill slice (its activations, about 16 values a token
    and d_model, and the flat and Toeplitz mixings' n_ctx x n_ctx matrix)."""
    e, (d, n_layer) = serve_dtype(args).itemsize, args.serve_size
    rows = min(batch, max(1, PREFILL_TOKENS // n_ctx))
    n_head = mixer.variant_config(name, vocab_size=args.vocab_size, d_model=d, n_layer=n_layer, n_ctx=n_ctx,
                                  n_head=1).n_head
    matrix = {'flat': 3 * e, 'toeplitz': 9 + 2 * n_head * e}.get(name, 0) * n_ctx * n_ctx
    return (model_bytes + batch * (per_seq + step_bytes(args)) + rows * per_seq + 16 * rows * n_ctx * d * e
            + matrix)


@torch.no_grad()
def prefill_rows(dec, idx, rows):
    """sample.Decoder.prefill for some of the decoder's sequences: the prompt idx long [b, T] at positions
    0..T-1 in one parallel step into the sequences `rows` (a slice of its batch, b of them; their state
    zeroed first, the other sequences' untouched) -> logits float [b, vocab]; the position becomes T. The
    serving table prefills a batch a slice at a time, every slice at the same T, so that one pass's
    activations stay small. ValueError for idx of another number of sequences than `rows` holds."""
    n = len(range(dec.batch)[rows])
    if idx.dim() != 2 or idx.shape[0] != n:
        raise ValueError(f'tokens of shape {list(idx.shape)} for a slice of the batch that holds {n}: '
                         f'give long [{n}, T]')
    views = [view_rows(layer, rows) for layer in dec.state]
    for tensor in sample.state_tensors(views):
        tensor.zero_()
    logits = dec.model.step(idx, views, 0)
    dec.pos = idx.shape[1]
    return logits


def view_rows(state, rows):
    """A layer's nested state dict of views of the sequences `rows` (a slice) of each of its tensors."""
    return {k: view_rows(v, rows) if isinstance(v, dict) else v[rows] for k, v in state.items()}


@torch.no_grad()
def serve_cell(model, batch, n_ctx, args):
    """Serve `batch` random sequences to context n_ctx through one sample.Decoder (compiled with
    --serve_compile): its buffers allocated at n_ctx, a parallel prefill of the first n_ctx -
    serve_tokens - SERVE_WARM tokens (prefill_rows, a slice of the batch of about PREFILL_TOKENS
    tokens a pass), SERVE_WARM tokens stepped untimed, then serve_tokens
    greedy steps timed (the last at position n_ctx - 1) -> dict(prefill_ms, ms (median ms a step
    of the whole batch), per_seq (buffer bytes a sequence), peak (allocator peak bytes on CUDA,
    the model included, else None))."""
    cuda = args.device.type == 'cuda'
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(args.device)
    if args.serve_compile:
        torch._dynamo.reset()
    prompt_len = n_ctx - args.serve_tokens - SERVE_WARM
    tokens = torch.randint(args.vocab_size, (batch, prompt_len + SERVE_WARM), device=args.device)
    dec = sample.Decoder(model, batch, compile=args.serve_compile)
    rows = min(batch, max(1, PREFILL_TOKENS // prompt_len))
    machine.sync(args.device)
    t0 = time.perf_counter()
    for r in range(0, batch, rows):
        prefill_rows(dec, tokens[r:r + rows, :prompt_len], slice(r, r + rows))
    machine.sync(args.device)
    prefill_ms = 1e3 * (time.perf_counter() - t0)
    ms = decode_ms(dec.step, tokens[:, prompt_len:], args.serve_tokens, lambda: machine.sync(args.device), dec.threads)
    return dict(prefill_ms=prefill_ms, ms=ms, per_seq=nbytes(sample.state_tensors(dec.state)) // batch,
                peak=torch.cuda.max_memory_allocated(args.device) if cuda else None)


def bench_serving(args):
    """Print the serving table: a row a kind, context and batch size (rows printed as measured).
    A cell estimated above --serve_memory_gb (serve_estimate) reads 'over budget' and is not run;
    one that runs out of memory anyway reads 'OOM'."""
    d_model, n_layer = args.serve_size
    cuda = args.device.type == 'cuda'
    gib = f'{args.serve_memory_gb:g} GiB'
    print(f'## Serving\n\n_Generated tokens/s of B sequences at once, greedy, d_model {d_model}, n_layer {n_layer}, '
          f'vocab {args.vocab_size}; weights, caches and states in {args.dtype} (the model cast to it). A '
          f'cell: sample.Decoder ({"compiled" if args.serve_compile else "eager"}) with its buffers at n_ctx '
          f'= context, a parallel prefill (Decoder.prefill, a slice of the batch at a time; "prefill ms", not '
          f'counted in tokens/s), '
          f'{SERVE_WARM} tokens untimed, then the median ms of {args.serve_tokens} steps of the whole batch, the '
          f'last at position context - 1; tokens/s = batch x 1000 / ms. per sequence: the decoder\'s buffer bytes '
          f'/ batch (cache: grows with the context; state: constant). model: parameters and buffers at that '
          f'context. largest batch: (memory - model) / (per sequence + a step\'s activations, estimated '
          f'{fmt_bytes(step_bytes(args))}). "over budget": estimated above {gib}, not run'
          f'{"; peak: torch.cuda.max_memory_allocated over the cell, the model included" if cuda else ""}._\n')
    header = ['kind', 'context', 'batch', 'model', 'per sequence', f'largest batch in {gib}', 'prefill ms',
              'ms/token', 'tokens/s'] + (['peak'] if cuda else [])
    print(md_table(header, []), flush=True)
    budget = args.serve_memory_gb * 2 ** 30
    for name in args.serve_variants:
        for n_ctx in args.serve_contexts:
            model_bytes, per_seq = serve_bytes(name, n_ctx, args)
            fits = [b for b in args.serve_batches if serve_estimate(name, n_ctx, b, model_bytes, per_seq, args) <= budget]
            model = None
            if fits:
                say(f'serving: {name} at context {n_ctx}, batches {fits}')
                model = build(name, args, d_model=d_model, n_layer=n_layer, n_ctx=n_ctx).to(serve_dtype(args)).eval()
            for batch in args.serve_batches:
                cells = ['-', '-', 'over budget'] + (['-'] if cuda else [])
                if batch in fits:
                    try:
                        r = serve_cell(model, batch, n_ctx, args)
                        per_seq = r['per_seq']
                        cells = [f'{r["prefill_ms"]:.1f}', f'{r["ms"]:.3f}', f'{batch * 1e3 / r["ms"]:.0f}']
                        cells += [fmt_bytes(r['peak'])] if cuda else []
                    except torch.OutOfMemoryError:
                        cells = ['-', '-', 'OOM'] + (['-'] if cuda else [])
                print(md_row([f'{name} ({SERVE_KINDS.get(name, "cache")})', n_ctx, batch, fmt_bytes(model_bytes),
                              fmt_bytes(per_seq), f'{largest_batch(model_bytes, per_seq, args):,}', *cells]), flush=True)
            del model
    print()


# ----------------------------------------------------------------------------- 8. SDPA backends

def bench_sdpa(args):
    """Print the transformer's batch-1 decode (sample.Decoder, eager) with scaled_dot_product_attention left to choose its backend, then forced to each
    backend of SDPA_BACKENDS (torch.nn.attention.sdpa_kernel); a backend that cannot run here reads
    'not available' with torch's reason. At --decode_sizes and --decode_n_ctx, as the decode table."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    print(f'## SDPA backends\n\n_The transformer\'s decode, batch 1, greedy, n_ctx {args.decode_n_ctx}, {args.dtype}; '
          f'median ms/token over {args.decode_tokens} tokens after a {args.decode_n_ctx // 4}-token prompt (as the '
          f'decode table). eager: sample.Decoder, not compiled (one query against the keys of the positions '
          f'seen). Backend: torch.nn.attention.sdpa_kernel(SDPBackend.X) around it; "default": none forced._\n')
    print(md_table(['backend', 'd_model x n_layer', 'eager ms'], []), flush=True)
    wait = lambda: machine.sync(args.device)          # noqa: E731
    for d_model, n_layer in args.decode_sizes:
        model = build('transformer', args, d_model=d_model, n_layer=n_layer, n_ctx=args.decode_n_ctx).eval()
        prompt = torch.randint(args.vocab_size, (1, args.decode_n_ctx // 4), device=args.device)
        for backend in ('default', *SDPA_BACKENDS):
            say(f'sdpa: {backend}, d_model {d_model}, n_layer {n_layer}')
            try:
                with sdpa_kernel(getattr(SDPBackend, backend)) if backend != 'default' else nullcontext(), \
                        machine.autocast(args.device, args.dtype):
                    dec = sample.Decoder(model)
                    cell = f'{decode_ms(dec.step, prompt, args.decode_tokens, wait, dec.threads):.3f}'
            except RuntimeError as err:                    # no kernel of this backend for these inputs
                cell = f'not available ({str(err).splitlines()[0][:60]})'
            print(md_row([backend.lower(), f'{d_model} x {n_layer}', cell]), flush=True)
    print()


# ----------------------------------------------------------------------------- 9. a loaded CPU

SPIN = 'import os, sys\nwhile os.getppid() == int(sys.argv[1]):\n    pass'    # spins until bench.py is gone, however


def bench_loaded(args):
    """Print the loaded-CPU table: the eager decode step of the flat mixer (the first of --decode_sizes, n_ctx
    --decode_n_ctx, each batch of --loaded_batches) on all --threads torch threads and as sample.Decoder
    chooses (one thread for a small step: sample.ONE_THREAD_WIDTH), quiet and beside --busy processes that
    only spin (--busy 0: quiet only); --tries tries a row, the two alternating (a fresh decoder each, its
    prompt prefilled, then the median ms of --decode_tokens steps). CPU only: a GPU's step does not wait on
    the CPU's threads."""
    d_model, n_layer = args.decode_sizes[0]
    model = build('flat', args, d_model=d_model, n_layer=n_layer, n_ctx=args.decode_n_ctx).eval()
    print(f'## Decoding on a loaded CPU\n\n_The flat mixer\'s eager decode step, d_model {d_model}, n_layer {n_layer}, '
          f'n_ctx {args.decode_n_ctx}, {args.dtype}, {torch.get_num_threads()} torch threads; a try: a fresh '
          f'sample.Decoder, its {args.decode_n_ctx // 4}-token prompt prefilled, the median ms of '
          f'{args.decode_tokens} steps; {args.tries} tries a row, the two rows of a batch alternating. Beside: '
          f'processes that only spin (`while True: pass`)._\n')
    print(md_table(['beside', 'batch', 'step on', 'tries (median ms each)', 'least', 'largest'], []), flush=True)
    for busy in dict.fromkeys((0, args.busy)):
        spinners = [subprocess.Popen([sys.executable, '-c', SPIN, str(os.getpid())], start_new_session=True)
                    for _ in range(busy)]       # a session of their own: Ctrl-C is bench.py's alone (no traceback each)
        try:
            time.sleep(0.5 * bool(busy))                        # the spinners started
            for batch in args.loaded_batches:
                prompt = torch.randint(args.vocab_size, (batch, args.decode_n_ctx // 4), device=args.device)
                tries = {False: [], True: []}
                for _ in range(args.tries):
                    for own in tries:
                        dec = sample.Decoder(model, batch)
                        dec.prefill(prompt[:, :-1])
                        tries[own].append(decode_ms(dec.step, prompt[:, -1:], args.decode_tokens,
                                                    threads=dec.threads if own else None))
                for own, ms in tries.items():
                    on = f'the decoder\'s: {dec.threads or "all"} thread{"s" * (dec.threads != 1)}' if own else 'all threads'
                    print(md_row([f'{busy} busy processes' if busy else 'nothing', batch, on,
                                  ' '.join(f'{t:.2f}' for t in ms), f'{min(ms):.2f}', f'{max(ms):.2f}']), flush=True)
        finally:
            for spinner in spinners:
                spinner.kill()
                spinner.wait()
    print()
