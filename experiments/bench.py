"""Benchmarks of the masked mixers and their baselines, printed as markdown tables.

    python -m experiments.bench                          # every table at the default sizes
    python -m experiments.bench --quick                  # everything tiny (the smoke test)
    python -m experiments.bench --tables train --variants flat,transformer --d_model 512

Tables (stdout is clean markdown; progress lines go to stderr):
1. Peak of the machine: measured dense matmul FLOP/s (fp32 on CPU, bf16 on CUDA),
   plus the nominal bf16 peak of known GPUs. MFU is reported against both.
2. Training throughput: one forward + backward + AdamW step per variant of
   mixer.VARIANTS at the same size; warm-up steps excluded, median of the rest.
3. Memory vs context length: peak memory of one forward + backward (--mem_batch sequences; the
   whole model, or --mem_scope block: one mixer.Block), each variant in a fresh subprocess, its
   lengths in increasing order. CUDA: max_memory_allocated() minus memory_allocated() before the
   step. CPU: the peak resident set (VmHWM, reset before the step through /proc/self/clear_refs)
   minus the resident set before it, freed heap returned to the OS (malloc_trim) between cells.
   The model's own bytes (parameters and buffers) are printed next to it.
4. Generation, 6. decode step, 7. serving (tokens/s and memory a sequence against batch and
   context) and 8. SDPA backends: generation speed, in experiments/bench_decode.py.
5. Token-mixing paths: the Toeplitz mixing as a matrix or an FFT, the recurrent
   mixing in one chunk or in chunks, per length (behind fft_threshold, chunk_size).
With --compile the training table also times each variant under torch.compile
(compile time: the compiled warm-up step minus an eager step).
"""

import argparse
import ctypes
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time

if __name__ == '__main__':       # run as a file too (python experiments/bench.py): the repository root on
    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the path, as -m puts it
    from harness import cli                   # and from here Ctrl-C is one line, torch's import included
    cli.begin('bench.py')

import torch

from harness import machine
import mixer
from experiments.bench_decode import (GEN_METHODS, SERVE_KINDS, SERVE_WARM, bench_decode, bench_generation,
                                      bench_loaded, bench_sdpa, bench_serving, build, meta_bytes)
from experiments.bench_load import bench_load
from experiments.bench_precision import bench_precision
from harness.flags import ArgumentParser, number
from harness.flags import listing
from experiments.runner import ROOT, md_row, md_table, say, time_calls

TABLES = ('train', 'memory', 'generation', 'paths', 'decode', 'serving', 'sdpa', 'loaded', 'load', 'precision')
ASKED = 3            # the last three tables run only when asked for
MEM_VARIANTS = ('flat', 'multihead', 'kernel', 'expanded', 'transformer', 'transformer_naive', 'toeplitz', 'recurrent',
                'linear_attention')
# --quick's memory table: the flat mixer and naive attention, the linear and the quadratic memory (a fresh process a
# variant, about 4 s of CPU each: the nine of MEM_VARIANTS were most of --quick's time)
QUICK = dict(threads=1, d_model=64, n_layer=2, n_ctx=64, batch_size=2, warmup=1, steps=2, mem_d_model=32,
             mem_n_layer=1, mem_lengths=[64, 128], mem_variants=['flat', 'transformer_naive'], prompts=[16, 32],
             new_tokens=8, recompute_tokens=4,
             path_lengths=[32, 64], decode_variants=['flat'], decode_sizes=[(64, 2)], decode_tokens=16,
             serve_batches=[1, 4], serve_contexts=[32, 128], serve_tokens=8, tries=2, load_steps=10, load_busy=[0, 1],
             load_switch=(10, 20, 30), load_overrides=['--d_model=32', '--n_layer=1', '--n_ctx=32', '--batch_size=4',
                                                       '--eval_windows=4', '--log_interval=5'],
             precision_rounds=3, precision_threads=[1], precision_overrides=['--d_model=32', '--n_layer=1',
                                                                              '--n_ctx=32', '--batch_size=4'])


def is_oom(err):
    """True for a CUDA or CPU out-of-memory error."""
    return isinstance(err, torch.OutOfMemoryError) or any(
        s in str(err).lower() for s in ('out of memory', "can't allocate memory"))


def machine_line(args):
    """One line naming the machine: GPU name or CPU model, torch version, threads."""
    if args.device.type == 'cuda':
        name = torch.cuda.get_device_name(args.device)
    else:
        cpuinfo = open('/proc/cpuinfo').read().splitlines() if sys.platform == 'linux' else []
        name = next((l.split(':', 1)[1].strip() for l in cpuinfo if l.startswith('model name')), platform.processor())
    return (f'machine: {name}; torch {torch.__version__}; threads {torch.get_num_threads()}; '
            f'device {args.device}; dtype {args.dtype}')


# ----------------------------------------------------------------------------- 1. peak

def bench_peak(args):
    """Measured (and nominal, on known GPUs) matmul peak, FLOP/s -> dict."""
    dtype = torch.bfloat16 if args.dtype == 'bf16' else torch.float32
    n = machine.matmul_size(args.device)
    measured = machine.measure_matmul_flops(args.device, dtype, n=n, seconds=0.1 if args.quick else 0.5)
    peak = dict(measured=measured, nominal=machine.nominal_peak(args.device))
    rows = [[f'measured {args.dtype} matmul', f'{measured / 1e9:.1f}']]
    if peak['nominal']:
        rows.append(['nominal bf16 dense (datasheet)', f'{peak["nominal"] / 1e9:.1f}'])
    how = ('timed by CUDA events' if args.device.type == 'cuda' else 'on one thread, timed by its own CPU clock '
           f'(machine.measure_matmul_flops), times {torch.get_num_threads()} threads')
    print(f'## Peak of the machine\n\n_Best batch of 4 products {n} x {n} x {n} (torch) after 3 warm-up '
          f'products, {how}, GFLOP/s._\n')
    print(md_table(['peak', 'GFLOP/s'], rows) + '\n')
    return peak


# ----------------------------------------------------------------------------- 2. training

def train_step_ms(name, args, compile=False):
    """Median ms of one forward + backward + AdamW step of variant `name` (batch
    [batch_size, n_ctx] of random tokens), torch.compile'd if `compile` -> (model, ms,
    ms of the warm-up steps)."""
    torch._dynamo.reset()
    model = build(name, args, d_model=args.d_model, n_layer=args.n_layer, n_ctx=args.n_ctx)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    step_model = torch.compile(model) if compile else model
    x = torch.randint(args.vocab_size, (args.batch_size, args.n_ctx + 1), device=args.device)

    def step():
        with machine.autocast(args.device, args.dtype):
            _, loss = step_model(x[:, :-1], x[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    times = [1e3 * t for t in time_calls(step, args.warmup + args.steps, device=args.device)]
    return model, statistics.median(times[args.warmup:]), sum(times[:args.warmup])


COMPILED_NOTE = '; compiled: the same step under torch.compile (inductor); compile s: its warm-up minus eager\'s'


def bench_train(args, peak):
    """Print the training-throughput table: params, ms/step, tokens/s, MFU, vs transformer."""
    results, compiled = {}, {}
    for name in args.variants:
        say(f'train: {name}')
        model, ms, warm = train_step_ms(name, args)
        tok_s = args.batch_size * args.n_ctx / (ms / 1e3)
        results[name] = (model.num_params(), ms, tok_s, machine.flops_per_token(model, args.n_ctx) * tok_s)
        if args.compile:
            say(f'train: {name}, torch.compile')
            _, c_ms, c_warm = train_step_ms(name, args, compile=True)
            compiled[name] = (c_ms, (c_warm - warm) / 1e3)
    base = results['transformer'][2] if 'transformer' in results else None
    rows = []
    for name, (params, ms, tok_s, flops) in results.items():
        row = [name, f'{params / 1e6:.2f}M', f'{ms:.1f}', f'{tok_s:.0f}', machine.fmt_mfu(flops / peak['measured'])]
        row += [machine.fmt_mfu(flops / peak['nominal'])] if peak['nominal'] else []
        if flops > peak['measured']:
            say(f'error: {name} achieved {flops / 1e9:.0f} GFLOP/s, above the measured peak '
                f'{peak["measured"] / 1e9:.0f}: the peak measurement is wrong, MFU not reported')
        row += [f'{tok_s / base:.2f}x' if base else '-']
        if args.compile:
            c_ms, c_s = compiled[name]
            row += [f'{c_ms:.1f}', f'{tok_s * ms / c_ms:.0f}', f'{ms / c_ms:.2f}x', f'{c_s:.0f}']
        rows.append(row)
    print(f'## Training throughput\n\n_Forward + backward + AdamW, batch {args.batch_size} x n_ctx {args.n_ctx}, '
          f'd_model {args.d_model}, n_layer {args.n_layer}, vocab {args.vocab_size}, {args.dtype}; median of '
          f'{args.steps} steps after {args.warmup} warm-up. MFU = machine.flops_per_token(model, n_ctx) x tokens/s / '
          f'measured peak; "vs transformer" is the tokens/s ratio'
          f'{COMPILED_NOTE if args.compile else ""}._\n')
    header = ['variant', 'params', 'ms/step', 'tokens/s', 'MFU'] + (['MFU (nominal)'] if peak['nominal'] else [])
    header += ['vs transformer'] + (['compiled ms/step', 'compiled tokens/s', 'compiled vs eager', 'compile s']
                                    if args.compile else [])
    print(md_table(header, rows) + '\n')


# ----------------------------------------------------------------------------- 3. memory

def mem_estimate(name, T, args):
    """Rough bytes one forward + backward at length T needs (model included), used
    only to skip cells over --mem_budget_gb: the n_ctx x n_ctx terms (the flat
    mixer's W, its mask, masked product and gradients; the Toeplitz lag index and
    gathered matrix below fft_threshold) plus linear terms for activations and logits."""
    d, L, H = args.mem_d_model, args.mem_n_layer, 4
    B = args.mem_batch
    per_layer = {'flat': 17 * T * T, 'multihead': 17 * H * T * T, 'kernel': 17 * 3 * T * T, 'expanded': 17 * 4 * T * T,
                 'transformer_naive': 16 * B * H * T * T,
                 'toeplitz': (8 + 24 * H) * T * T if T < mixer.ModelConfig.fft_threshold else 0}
    return L * (per_layer.get(name, 0) + 64 * 4 * B * T * d) + 4 * 4 * B * T * args.vocab_size


def rss_bytes(field):
    """Resident set (VmRSS) or its peak (VmHWM) of this process, bytes (Linux)."""
    return next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith(field))


def mem_cell(name, T, args):
    """Peak bytes of one forward + backward of variant `name` at n_ctx = T, batch --mem_batch, over
    the bytes held before it (see the module docstring) -> (step bytes, model bytes). --mem_scope
    block: one mixer.Block on random float input [B, T, mem_d_model] (loss: its sum), no embedding
    or head; model: the whole language model on random tokens."""
    if args.mem_scope == 'block':
        cfg = mixer.variant_config(name, vocab_size=args.vocab_size, d_model=args.mem_d_model, n_ctx=T,
                                   n_layer=1, n_head=1)       # a variant's own n_head wins; one block
        model = mixer.Block(cfg).to(args.device)
        x = torch.randn(args.mem_batch, T, args.mem_d_model, device=args.device, requires_grad=True)

        def loss_of(n):
            return model(x[:, :n]).float().sum()
    else:
        model = build(name, args, d_model=args.mem_d_model, n_layer=args.mem_n_layer, n_ctx=T)
        x = torch.randint(args.vocab_size, (args.mem_batch, T + 1), device=args.device)

        def loss_of(n):
            return model(x[:, :n], x[:, 1:n + 1])[1]
    w = min(T, 16)
    with machine.autocast(args.device, args.dtype):    # a short warm-up step: lazy initialisation not counted
        loss_of(w).backward()
    model.zero_grad(set_to_none=True)
    gc.collect()
    if args.device.type == 'cuda':
        machine.sync(args.device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(args.device)
        base = torch.cuda.memory_allocated(args.device)
    else:
        ctypes.CDLL('libc.so.6').malloc_trim(0)
        base = rss_bytes('VmRSS')
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')            # resets VmHWM to the current resident set
    x.grad = None
    with machine.autocast(args.device, args.dtype):
        loss_of(T).backward()
    machine.sync(args.device)
    peak = torch.cuda.max_memory_allocated(args.device) if args.device.type == 'cuda' else rss_bytes('VmHWM')
    model_bytes = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    return peak - base, model_bytes


def mem_child(args):
    """--mem_cells NAME:T1,T2,..: run the cells in increasing T in this process and
    print one JSON line per cell: {"T": T, "step": bytes, "model": bytes} or {"T": T, "error": "OOM"}."""
    name, lengths = args.mem_cells
    for T in lengths:
        try:
            step, model_bytes = mem_cell(name, T, args)
            out = dict(T=T, step=step, model=model_bytes)
        except RuntimeError as err:
            if not is_oom(err):
                raise
            out = dict(T=T, error='OOM')
        print(json.dumps(out), flush=True)
        gc.collect()
        if args.device.type == 'cuda':
            torch.cuda.empty_cache()
        if 'error' in out:
            break


def bench_memory(args):
    """Print peak memory vs context length, one fresh subprocess per variant, each row as soon
    as its variant is measured."""
    lengths = sorted(args.mem_lengths)
    budget = args.mem_budget_gb * 2**30
    method = ('torch.cuda.max_memory_allocated() - memory_allocated() before the step' if args.device.type == 'cuda'
              else 'peak resident set (VmHWM, reset before the step) - resident set before the step')
    what = 'one mixer.Block (no embedding or head)' if args.mem_scope == 'block' else f'n_layer {args.mem_n_layer}'
    print(f'## Memory vs context length\n\n_One forward + backward, batch {args.mem_batch}, d_model {args.mem_d_model}, '
          f'{what}, n_ctx = T, {args.dtype}. Cell: step MiB + model MiB; step = {method}, '
          f'i.e. activations, gradients and temporaries; model = parameters + buffers. One fresh process per '
          f'variant. "over budget": estimated above --mem_budget_gb {args.mem_budget_gb:.3g}, not run._\n')
    print(md_table(['variant'] + [f'T={T}' for T in lengths], []), flush=True)
    for name in args.mem_variants:
        cells = {T: 'over budget' for T in lengths if mem_estimate(name, T, args) > budget}
        run = [T for T in lengths if T not in cells]
        say(f'memory: {name} at {run}')
        cmd = [sys.executable, '-m', 'experiments.bench', '--mem_cells', f'{name}:{",".join(map(str, run))}',
               '--device', str(args.device), '--dtype', args.dtype, '--vocab_size', str(args.vocab_size),
               '--threads', str(args.threads), '--mem_d_model', str(args.mem_d_model), '--mem_n_layer',
               str(args.mem_n_layer), '--mem_batch', str(args.mem_batch), '--mem_scope', args.mem_scope]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT) if run else None
        for line in proc.stdout.splitlines() if run else []:
            r = json.loads(line)
            cells[r['T']] = r.get('error') or f'{r["step"] / 2**20:.1f} + {r["model"] / 2**20:.1f}'
        if run and proc.returncode != 0:
            say(proc.stderr[-2000:])
        for T in run:       # a child killed by the OS (e.g. the OOM killer) leaves cells unreported
            cells.setdefault(T, 'OOM' if proc.returncode < 0 else 'error')
        print(md_row([name] + [cells[T] for T in lengths]), flush=True)
    print()


# ----------------------------------------------------------------------------- 5. computation paths

def time_mix(mix, z, args):
    """Median ms of one forward + backward of mix(z) (z float [B, H, T, e]: a token mixing's heads)."""
    def step():
        with machine.autocast(args.device, args.dtype):
            mix(z).sum().backward()
    return 1e3 * statistics.median(time_calls(step, args.steps, args.warmup, args.device))


PATH_CHUNKS = (2048, 256)      # the recurrent chunks timed beside one chunk (DEVICE_TUNING's candidates)


def bench_paths(args):
    """Print ms of one forward + backward of a token mixing alone, per length T, for
    the two Toeplitz paths (materialised matrix, FFT) and the recurrent mixing in
    one chunk (the whole T x T matrix) or in chunks of PATH_CHUNKS ('-' where a chunk
    is the whole sequence): the measurements behind machine.DEVICE_TUNING's
    fft_threshold and chunk_size. Rows print as they are measured."""
    print(f'## Token-mixing paths\n\n_One forward + backward of the token mixing alone, batch {args.batch_size}, '
          f'd_model {args.d_model}, 4 heads, {args.dtype}; median ms. fft_threshold (machine.DEVICE_TUNING: '
          f'{machine.device_tuning(args.device.type)["fft_threshold"]} on {args.device.type}) switches the Toeplitz '
          f'mixing to the FFT; chunk_size ({machine.device_tuning(args.device.type)["chunk_size"]}) is the '
          f'recurrent chunk._\n')
    print(md_table(['T', 'Toeplitz matrix', 'Toeplitz FFT', 'recurrent, one chunk']
                   + [f'recurrent, chunks of {c}' for c in PATH_CHUNKS], []), flush=True)
    for T in args.path_lengths:
        z = torch.randn(args.batch_size, 4, T, args.d_model // 4, device=args.device, requires_grad=True)
        toeplitz = mixer.ToeplitzMixing(T, args.d_model, 4, fft_threshold=T, mixing_init='average')
        toeplitz = toeplitz.to(args.device)
        ms = [time_mix(lambda z: toeplitz.mix(toeplitz.matrix(T), z), z, args), time_mix(toeplitz.fft, z, args)]
        for chunk in (T, *PATH_CHUNKS):
            recurrent = mixer.RecurrentMixing(T, args.d_model, 4, 'mixed', chunk_size=chunk).to(args.device)
            ms.append(None if chunk > T or (chunk == T and len(ms) > 2) else
                      time_mix(lambda z: recurrent.scan(z, None, 0)[0], z, args))
        print(md_row([T] + ['-' if m is None else f'{m:.2f}' for m in ms]), flush=True)
    print()


# ----------------------------------------------------------------------------- main

def size(text):
    """An argparse type: 'DxL' (d_model x n_layer, both >= 1, e.g. 128x4) -> (d_model, n_layer)."""
    try:
        d_model, n_layer = (int(v) for v in text.split('x'))
        if min(d_model, n_layer) >= 1:
            return d_model, n_layer
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f'expected d_modelxn_layer pairs, e.g. 128x4,512x8, got {text!r}')


def device_and_dtype(p, args):
    """args.device (a name) -> a torch.device, and args.dtype None -> bf16 on CUDA, fp32 on CPU; a bad
    or absent device: p.error (exit 2). (bench.py's and experiments/profiles.py's command lines.)"""
    try:
        args.device = torch.device(args.device)
    except RuntimeError as err:
        p.error(str(err))
    if args.device.type == 'cuda' and not torch.cuda.is_available():
        p.error('--device cuda: CUDA is not available')
    args.dtype = args.dtype or ('bf16' if args.device.type == 'cuda' else 'fp32')


def parse_args(argv=None):
    """Command-line flags (flags.ArgumentParser: a bad flag is one line, exit 2)."""
    p = ArgumentParser('bench.py', __doc__)
    count, positive, variants = number(int, 1), number(float, 0, above=True), tuple(mixer.VARIANTS)
    counts = listing(count)
    p.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    p.add_argument('--dtype', choices=('fp32', 'bf16'), help='default: bf16 (autocast) on CUDA, fp32 on CPU')
    p.add_argument('--compile', action='store_true', help='also time the training step under torch.compile')
    p.add_argument('--quick', action='store_true', help='everything tiny (the smoke test): under a minute on 2 cores')
    p.add_argument('--tables', type=listing(str, TABLES, what='table'), default=list(TABLES[:-ASKED]),
                   help='tables to print, comma separated')
    p.add_argument('--variants', type=listing(str, variants, what='variant'), default=list(variants),
                   help='variants of the training table, comma separated')
    p.add_argument('--threads', type=count, default=torch.get_num_threads(), help='torch CPU threads')
    p.add_argument('--vocab_size', type=count, default=4096)
    p.add_argument('--d_model', type=count, default=256, help='width of the training and generation tables')
    p.add_argument('--n_layer', type=count, default=4)
    p.add_argument('--n_ctx', type=count, default=512, help='training table context length')
    p.add_argument('--batch_size', type=count, default=4)
    p.add_argument('--warmup', type=number(int, 0), default=1, help='training steps not timed')
    p.add_argument('--steps', type=count, default=3, help='timed training steps (median)')
    p.add_argument('--mem_lengths', type=counts, default=[512, 1024, 2048, 4096, 8192])
    p.add_argument('--mem_d_model', type=count, default=128)
    p.add_argument('--mem_n_layer', type=count, default=2)
    p.add_argument('--mem_batch', type=count, default=1, help='sequences in the memory table\'s step')
    p.add_argument('--mem_scope', choices=('model', 'block'), default='model',
                   help='memory of the whole language model, or of one mixer.Block alone')
    p.add_argument('--mem_variants', type=listing(str, variants, what='variant'), default=list(MEM_VARIANTS),
                   help='variants of the memory table, comma separated')
    p.add_argument('--mem_budget_gb', type=positive, help='memory cells estimated above this are not run '
                   '(default: 8 on CPU, 90%% of the GPU memory on CUDA)')
    p.add_argument('--prompts', type=counts, default=[64, 512, 2048], help='prompt lengths of the generation table')
    p.add_argument('--new_tokens', type=count, default=256, help='tokens generated after each prompt')
    p.add_argument('--recompute_tokens', type=count, default=16, help='tokens timed for the window recompute')
    p.add_argument('--path_lengths', type=counts, default=[128, 256, 512, 1024, 2048, 4096])
    p.add_argument('--decode_variants', type=listing(str, variants, what='variant'),
                   default=['flat', 'toeplitz', 'recurrent', 'transformer', 'linear_attention'],
                   help='variants of the decode table')
    p.add_argument('--decode_sizes', type=listing(size), default=[(128, 4), (512, 8)],
                   help='d_model x n_layer of the decode and SDPA tables, e.g. 128x4,512x8')
    p.add_argument('--decode_n_ctx', type=count, default=256)
    p.add_argument('--decode_tokens', type=count, default=128, help='tokens timed per decode row')
    p.add_argument('--busy', type=number(int, 0), default=2, help='processes that only spin beside the loaded table\'s step')
    p.add_argument('--tries', type=count, default=7, help='tries a row of the loaded table')
    p.add_argument('--loaded_batches', type=counts, default=[1], help='batch sizes of the loaded table')
    p.add_argument('--precision_config', default='config/tinystories_cpu.py',
                   help="the precision table's train.py config")
    p.add_argument('--precision_data_dir', default='data/tinystories', help="the precision table's prepared data")
    p.add_argument('--precision_rounds', type=count, default=100, help='timed rounds of the precision table')
    p.add_argument('--precision_threads', type=listing(count), default=[1, machine.cpu_share()],
                   help="the precision table's thread counts")
    p.add_argument('--precision_overrides', type=lambda text: text.split(), default=[],
                   help="train.py settings after the precision table's config, e.g. '--batch_size=16'")
    p.add_argument('--decode_cast', action='store_true',
                   help="the decode table's weights cast to --dtype (bf16: half the bytes a step reads) where it "
                        'otherwise runs float32 weights under autocast')
    p.add_argument('--load_config', default='config/tinystories_cpu.py', help='the load table\'s train.py config')
    p.add_argument('--load_data_dir', default='data/tinystories', help='the load table\'s prepared data')
    p.add_argument('--load_steps', type=count, default=150, help='steps of each run of the load table')
    p.add_argument('--load_busy', type=listing(number(int, 0)), default=[0, 1, 2],
                   help='spinning processes beside the load table\'s runs, a row group each')
    p.add_argument('--load_switch', type=listing(count), default=(500, 1500, 2000),
                   help='START,END,STEPS: the load table\'s run with a busy process from step START to END')
    p.add_argument('--load_overrides', type=lambda text: text.split(), default=[],
                   help='more train.py settings for the load table\'s runs, e.g. "--d_model=64"')
    p.add_argument('--serve_variants', type=listing(str, variants, what='variant'), default=list(SERVE_KINDS),
                   help='kinds of the serving table')
    p.add_argument('--serve_size', type=size, help='d_model x n_layer of the serving table (default: 1024x8 on '
                   'CUDA, --d_model x --n_layer on CPU)')
    p.add_argument('--serve_batches', type=counts, default=[1, 8, 64, 256], help='batch sizes of the serving table')
    p.add_argument('--serve_contexts', type=counts, default=[512, 2048, 8192], help='contexts of the serving table')
    p.add_argument('--serve_tokens', type=count, default=32, help='steps timed per serving cell')
    p.add_argument('--serve_memory_gb', type=positive, default=16.0, help='the memory of the serving table: cells '
                   'estimated above it are not run; its largest-batch column')
    p.add_argument('--serve_compile', action='store_true', help='serve through the torch.compile\'d static step '
                   '(CUDA graphs on CUDA): one compilation a cell')
    p.add_argument('--mem_cells', type=lambda text: (text.partition(':')[0], listing(count)(text.partition(':')[2])),
                   help=argparse.SUPPRESS)      # internal: run the memory cells NAME:T1,T2,.. in this process
    args = p.parse_args(argv)
    if args.quick:
        given = given_flags(p, argv)
        for k, v in QUICK.items():
            if k not in given:              # a flag given wins over --quick, even at its default value
                setattr(args, k, v)
    device_and_dtype(p, args)
    if args.mem_budget_gb is None:
        args.mem_budget_gb = (0.9 * torch.cuda.get_device_properties(args.device).total_memory / 2**30
                              if args.device.type == 'cuda' else 8.0)
    if args.serve_size is None:
        args.serve_size = (1024, 8) if args.device.type == 'cuda' else (args.d_model, args.n_layer)
    if not args.serve_tokens < min(args.serve_contexts) - SERVE_WARM:
        p.error(f'--serve_tokens must be >= 1 and leave a prompt: below the smallest context - {SERVE_WARM}')
    check_models(p, args)
    check_decode(p, args)
    check_memory(p, args)
    return args


def given_flags(p, argv):
    """The flags given on the command line argv (None: sys.argv[1:]) of parser p -> the set of their
    dests. argv is parsed again into a namespace whose every dest holds a sentinel: argparse puts a
    default only on a dest the namespace lacks, so the sentinel stays exactly where no flag was given
    (a flag given at its default value counts as given, unlike a comparison with the default)."""
    unset = object()
    ns = argparse.Namespace(**{a.dest: unset for a in p._actions if a.dest != argparse.SUPPRESS})
    p.parse_args(argv, namespace=ns)
    return {k for k, v in vars(ns).items() if v is not unset}


def check_decode(p, args):
    """The decode and SDPA tables' tokens checked before any model is built: each row feeds a prompt of
    --decode_n_ctx // 4 tokens (at least 2: the compiled step's warm-up steps two of them), then times
    --decode_tokens steps, which must end by n_ctx for every kind whose sample.Decoder stops there (every
    position-indexed kind, the recurrent one included: its buffers are allocated at n_ctx; linear
    attention without position encoding has no limit, model.max_len None, read off a model on the meta
    device). Else p.error: one line, exit 2, as the serving table checks its own."""
    kinds = ((args.decode_variants if 'decode' in args.tables else [])
             + (['transformer'] if 'sdpa' in args.tables else []) + (['flat'] if 'loaded' in args.tables else []))
    for table in ('loaded', 'load', 'precision'):
        if table in args.tables and args.device.type != 'cpu':
            p.error(f'the {table} table measures the CPU: run it with --device cpu, not {args.device}')
    if 'load' in args.tables and not 0 < args.load_switch[0] < args.load_switch[1] < args.load_switch[2] if \
            len(args.load_switch) == 3 else 'load' in args.tables:
        p.error(f'--load_switch must be START,END,STEPS with 0 < START < END < STEPS, got {args.load_switch}')
    if not kinds:
        return
    n_ctx, prompt = args.decode_n_ctx, args.decode_n_ctx // 4
    if prompt < 2:
        p.error(f'--decode_n_ctx must be >= 8 (the decode rows\' prompt is a quarter of it, at least 2 tokens), '
                f'got {n_ctx}')
    d_model = args.decode_sizes[0][0]
    bounded = [k for k in dict.fromkeys(kinds)
               if build(k, args, 'meta', d_model=d_model, n_layer=1, n_ctx=n_ctx).max_len is not None]
    if bounded and prompt + args.decode_tokens > n_ctx:
        p.error(f'--decode_tokens {args.decode_tokens} do not fit --decode_n_ctx {n_ctx} after its {prompt}-token '
                f'prompt (n_ctx / 4), where the decoder of {", ".join(bounded)} stops: give --decode_tokens <= '
                f'{n_ctx - prompt} or a larger --decode_n_ctx')


def check_memory(p, args):
    """The decode, SDPA and generation tables' models checked against the device's memory before any is
    built (machine.memory_error, train.py's rule): each row's weights and its decoder's buffers at batch 1,
    read off a model and a sample.Decoder on the meta device as the serving table reads its cells (their
    least: a table needs more). Else p.error: one line, exit 2, saying what the row would need."""
    decode = ((args.decode_variants if 'decode' in args.tables else []) + (['transformer'] * ('sdpa' in args.tables))
              + (['flat'] * ('loaded' in args.tables)))
    rows = [(k, d, L, args.decode_n_ctx) for d, L in args.decode_sizes for k in dict.fromkeys(decode)]
    rows += [(k, args.d_model, args.n_layer, max(args.prompts) + args.new_tokens)
             for k in dict.fromkeys(name for name, _ in GEN_METHODS) if 'generation' in args.tables]
    for name, d_model, n_layer, n_ctx in rows:
        model = build(name, args, 'meta', d_model=d_model, n_layer=n_layer, n_ctx=n_ctx)
        need = sum(meta_bytes(model))
        why = machine.memory_error(need, args.device, f'{name} at d_model {d_model}, n_layer {n_layer}, n_ctx '
                                   f'{n_ctx} (its weights and decoder buffers)')
        if why:
            p.error(why)


def check_models(p, args):
    """Every model the asked tables build must be valid (mixer.ModelConfig's checks: heads
    that divide d_model, ...), checked before any table runs: else p.error (exit 2)."""
    gen = {name for name, _ in GEN_METHODS}
    plan = {'train': [(v, args.d_model, args.n_layer) for v in args.variants],
            'memory': [(v, args.mem_d_model, args.mem_n_layer) for v in args.mem_variants],
            'generation': [(v, args.d_model, args.n_layer) for v in sorted(gen)],
            'paths': [('toeplitz', args.d_model, 1), ('recurrent', args.d_model, 1)],
            'decode': [(v, d, L) for d, L in args.decode_sizes for v in args.decode_variants],
            'serving': [(v, *args.serve_size) for v in args.serve_variants],
            'sdpa': [('transformer', d, L) for d, L in args.decode_sizes], 'loaded': [('flat', *args.decode_sizes[0])]}
    for table in args.tables:
        for name, d_model, n_layer in plan.get(table, []):          # the load table: train.py checks its own
            try:
                mixer.variant_config(name, vocab_size=args.vocab_size, d_model=d_model, n_layer=n_layer,
                                     n_ctx=args.n_ctx, n_head=1)
            except ValueError as e:
                p.error(f'the {table} table\'s {name} (--d_model etc.): {e}')


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.mem_cells:
        return mem_child(args)
    if args.device.type == 'cpu':
        machine.keep_freed_memory()   # as train.py does (the memory table's children do not)
    start = time.perf_counter()
    print(f'# bench.py\n\n{machine_line(args)}\n')
    peak = bench_peak(args) if 'train' in args.tables else None      # what the training table's MFU is against
    for name, bench in (('train', lambda: bench_train(args, peak)), ('memory', lambda: bench_memory(args)),
                        ('generation', lambda: bench_generation(args)), ('paths', lambda: bench_paths(args)),
                        ('decode', lambda: bench_decode(args)), ('serving', lambda: bench_serving(args)),
                        ('sdpa', lambda: bench_sdpa(args)), ('loaded', lambda: bench_loaded(args)),
                        ('load', lambda: bench_load(args)), ('precision', lambda: bench_precision(args))):
        if name in args.tables:
            t0 = time.perf_counter()
            bench()
            say(f'{name}: {time.perf_counter() - t0:.0f} s')
    say(f'done in {time.perf_counter() - start:.0f} s')


if __name__ == '__main__':
    from harness.cli import run_command
    sys.exit(run_command('bench.py', main))
