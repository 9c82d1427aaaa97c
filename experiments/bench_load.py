"""bench.py's load table: train.py's steady tokens/s on the CPU, quiet and beside processes that only spin, at
fixed thread counts and as train.py chooses them (machine.ThreadChoice); then one run with the threads chosen
through which a busy process comes (at one step) and goes (at a later one), each part's tokens/s beside the
run of the same load throughout.

    python -m experiments.bench --tables load --device cpu       # config/tinystories_cpu.py, 150 steps a run
"""

import os
import subprocess
import sys
import tempfile
import time

if __name__ == '__main__':
    print('bench_load.py: error: bench.py\'s load table, not a command: python -m experiments.bench --tables load',
          file=sys.stderr)
    sys.exit(2)

from experiments.bench_decode import SPIN
from experiments.runner import ROOT, md_row, md_table, say
from harness.loading import read_log


def spinning(n):
    """n processes that only spin (`while True: pass`, until bench.py is gone) -> their Popen list."""
    return [subprocess.Popen([sys.executable, '-c', SPIN, str(os.getpid())]) for _ in range(n)]


def stop(spinners):
    """End the spinning processes of the list, emptied."""
    while spinners:
        p = spinners.pop()
        p.kill()
        p.wait()


def train(args, threads, steps, switch=None):
    """One train.py run of --load_config for `steps` steps (one evaluation, at the end) in a fresh folder,
    threads 'chosen' (no --threads, no OMP_NUM_THREADS) or a count; switch (start, end): one spinning
    process from the step `start` to `end` (read off log.jsonl as it is written) -> the run's log records.
    A run that fails: RuntimeError with the end of its output."""
    out = tempfile.mkdtemp(prefix='bench_load_')
    cmd = [sys.executable, 'train.py', args.load_config, f'--data_dir={args.load_data_dir}', f'--out_dir={out}',
           f'--max_iters={steps}', f'--eval_interval={steps}', '--log_interval=10', '--save_checkpoint=False',
           *args.load_overrides] + ([] if threads == 'chosen' else [f'--threads={threads}'])
    env = {k: v for k, v in os.environ.items() if k != 'OMP_NUM_THREADS'}
    log, spinners = os.path.join(out, 'log.jsonl'), []
    with open(os.path.join(out, 'output.txt'), 'w') as f:
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
        try:
            while p.poll() is None:
                time.sleep(0.2)
                if switch:
                    step = max([r['step'] for r in read_log(log) if r.get('event') == 'train'], default=0)
                    if switch[0] <= step < switch[1] and not spinners:
                        spinners = spinning(1)
                    elif step >= switch[1]:
                        stop(spinners)
        finally:
            stop(spinners)
            p.kill()
            p.wait()
    if p.returncode:
        with open(os.path.join(out, 'output.txt')) as f:
            raise RuntimeError(f'train.py {" ".join(cmd[2:])} failed: {f.read()[-500:]}')
    return read_log(log)


def segment_rates(records, bounds):
    """Tokens/s of the logged intervals in each segment [bounds[i], bounds[i + 1]) of steps (a 'train' event
    counts for the segment its step ends in; the first event, which holds the warm-up, for none) -> list of
    floats (None for a segment with no interval)."""
    trains = [r for r in records if r.get('event') == 'train']
    seconds = {r['step']: (r['step'] - p['step']) * r['ms_per_step'] / 1e3 for p, r in zip(trains, trains[1:])}
    out = []
    for lo, hi in zip(bounds, bounds[1:]):
        rows = [r for r in trains[1:] if lo < r['step'] <= hi]
        total = sum(seconds[r['step']] for r in rows)
        out.append(sum(r['tokens_per_s'] * seconds[r['step']] for r in rows) / total if rows else None)
    return out


def bench_load(args):
    """Print the load table (see the module docstring): for each count of --load_busy spinning processes, a
    row a thread count (1, the cores, chosen), --load_steps steps each; then the run of --load_switch
    'start,end,steps' with the threads chosen."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()
    counts = [*dict.fromkeys([cores, 1]), 'chosen']      # torch's default first: the quiet run the others are of
    print(f'## Training beside busy processes\n\n_`python train.py {args.load_config} {" ".join(args.load_overrides)}`'
          f' for {args.load_steps} steps, CPU, {cores} cores: steady tokens/s (train.py\'s summary: the logged '
          'intervals after the first). Beside: processes that only spin (`while True: pass`). threads: --threads=N, '
          'or chosen by train.py (machine.ThreadChoice; the counts it ran on, in order). "of quiet": of the quiet '
          f'run on {cores} threads, torch\'s default._\n')
    print(md_table(['beside', 'threads', 'tokens/s', 'of quiet'], []), flush=True)
    quiet, fixed = None, {}
    for busy in args.load_busy:
        spinners = spinning(busy)
        try:
            time.sleep(0.5 * bool(busy))
            for threads in counts:
                say(f'load: {busy} busy, threads {threads}')
                records = train(args, threads, args.load_steps)
                rate = [r for r in records if r.get('event') == 'summary'][0]['steady_tokens_per_s']
                quiet = rate if busy == 0 and threads == cores else quiet
                fixed[busy, threads] = rate
                ran = [cores] + [r['threads'] for r in records if r.get('event') == 'threads']
                label = f'chosen: {" -> ".join(map(str, ran))}' if threads == 'chosen' else str(threads)
                print(md_row([f'{busy} busy' if busy else 'nothing', label, f'{rate:,.0f}',
                              f'{rate / quiet:.2f}' if quiet else '-']), flush=True)
        finally:
            stop(spinners)
    start, end, steps = args.load_switch
    say(f'load: 1 busy from step {start} to {end} of {steps}, threads chosen')
    records = train(args, 'chosen', steps, switch=(start, end))
    rates = segment_rates(records, [0, start, end, steps])
    changes = ', '.join(f'step {r["step"]}: {r["from"]} -> {r["threads"]}' for r in records if r.get('event') == 'threads')
    print(f'\n_One run of {steps} steps, threads chosen, one busy process from step {start} to {end}: tokens/s of '
          'each part (its logged intervals, the first left out) against the chosen run of that load throughout '
          f'(above). Changes: {changes or "none"}._\n')
    rows = []
    for (lo, hi), rate, busy in zip([(0, start), (start, end), (end, steps)], rates, (0, 1, 0)):
        ref = fixed.get((busy, 'chosen'))
        rows.append([f'{lo}..{hi}', f'{busy} busy' if busy else 'nothing', '-' if rate is None else f'{rate:,.0f}',
                     '-' if ref is None else f'{ref:,.0f}', '-' if None in (rate, ref) else f'{rate / ref:.2f}'])
    print(md_table(['steps', 'beside', 'tokens/s', 'that load throughout', 'ratio'], rows) + '\n', flush=True)
