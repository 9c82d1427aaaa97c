"""bench.py's precision table: train.py's own step of a config in float32 and under bf16 autocast (and, with
--compile, bf16 compiled), alternated step by step in one process, at each thread count asked; tokens/s, the
bf16 / float32 ratio of each round (median and quartiles: a ratio measured in one process, so another
process's load moves both arms alike), MFU against each precision's own measured peak, and what train.py's
dtype='auto' keeps on this CPU (machine.native_bf16, machine.PrecisionChoice's margin).

    python -m experiments.bench --tables precision --device cpu      # config/tinystories_cpu.py, 100 rounds
"""

import statistics
import sys
import time

if __name__ == '__main__':
    print("bench_precision.py: error: bench.py's precision table, not a command: python -m experiments.bench "
          '--tables precision', file=sys.stderr)
    sys.exit(2)

import torch

from experiments.runner import md_table, say, torch_threads, train_run
from harness import machine


def quartiles(values):
    """(p25, median, p75) of a list of numbers."""
    q = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return q[0], statistics.median(values), q[2]


def timed(step, env, autocast):
    """Seconds of one call of step() under `autocast` (env.autocast swapped for it, then restored)."""
    before, env.autocast = env.autocast, autocast
    try:
        t0 = time.perf_counter()
        step()
        return time.perf_counter() - t0
    finally:
        env.autocast = before


def bench_precision(args):
    """Print the precision table (the module docstring) of --precision_config on args.device (a CPU)."""
    margin, rows, native = machine.PrecisionChoice().margin, [], machine.native_bf16()
    for threads in args.precision_threads:
        argv = [args.precision_config, f'--data_dir={args.precision_data_dir}', '--dtype=float32',
                f'--threads={threads}', *args.precision_overrides]
        with torch_threads(threads):
            say(f'precision: {threads} thread(s), {args.precision_rounds} rounds')
            run, cfg, step = train_run(argv)
            arms = {'float32': (step, run, torch.autocast('cpu', enabled=False)),
                    'bfloat16': (step, run, torch.autocast('cpu', dtype=torch.bfloat16))}
            compile_s = None
            if args.compile:
                c_run, _, c_step = train_run([*argv, '--compile=True'])
                bf16 = torch.autocast('cpu', dtype=torch.bfloat16)
                compile_s = timed(c_step, c_run.env, bf16)          # the first step compiles
                arms['bfloat16, compiled'] = (c_step, c_run, bf16)
            times = {arm: [] for arm in arms}
            for r in range(3 + args.precision_rounds):              # 3 warm-up rounds, then the timed ones
                order = list(arms) if r % 2 == 0 else list(reversed(arms))
                for arm in order:
                    s, arm_run, ctx = arms[arm]
                    t = timed(s, arm_run.env, ctx)
                    if r >= 3:
                        times[arm].append(t)
            tokens = cfg['batch_size'] * cfg['n_ctx'] * cfg['grad_accum']
            flops = machine.flops_per_token(run.raw_model, cfg['n_ctx'])
            for arm, ts in times.items():
                tok_s = tokens / statistics.median(ts)
                peak, _ = machine.peak_flops('cpu', torch.float32 if arm == 'float32' else torch.bfloat16)
                ratios = [f / b for f, b in zip(times['float32'], ts)]
                p25, mid, p75 = quartiles(ratios)
                rows.append([threads, arm, f'{tok_s:,.0f}', '1' if arm == 'float32' else
                             f'{mid:.2f} [{p25:.2f}, {p75:.2f}]', machine.fmt_mfu(flops * tok_s / peak),
                             f'{peak / 1e9:,.0f}'])
            chosen = 'bfloat16' if native and statistics.median(
                [f / b for f, b in zip(times['float32'], times['bfloat16'])]) >= margin else 'float32'
            rows.append([threads, "train.py's dtype='auto' keeps", chosen, '', '',
                         '' if compile_s is None else f'(compile: {compile_s:.0f} s)'])
    flags = 'yes (avx512_bf16 or amx_bf16)' if native else 'no: float32 without measuring'
    print(f'## Precision on this CPU\n\n_`train.py {args.precision_config}` '
          f'{" ".join(args.precision_overrides)}: its own step (train.train_step, {tokens:,} tokens), float32 and '
          f'bf16 autocast (weights and optimiser state float32) alternated step by step in one process, '
          f'{args.precision_rounds} rounds after 3 warm-up; tokens/s of the median step; "vs float32": the '
          f'median [p25, p75] of each round\'s float32 / arm step-time ratio; MFU against the measured matmul peak '
          f'of the arm\'s precision (GFLOP/s, at that thread count). Native bf16: {flags}; train.py keeps bf16 '
          f'when it is at least {margin}x float32._\n')
    print(md_table(['threads', 'arm', 'tokens/s', 'vs float32', 'MFU', 'peak GFLOP/s'], rows) + '\n', flush=True)
