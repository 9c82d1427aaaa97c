"""A GPU session in one command: everything the CUDA path does, in at most 8 minutes, into one folder.

    python -m experiments.gpu_check                                   # data/tinystories, out/gpu_check
    python -m experiments.gpu_check --text_dir ../shared/data/tinystories --out out/gpu_check

On a machine with one CUDA GPU, with only the repository and the TinyStories text beside it
(or its prepared data), it runs three phases. Every step has its own time limit and none
outlasts --budget_s (default 480 s) from the start: a step with no time left is reported
as skipped. A step that fails or times out is reported and the next one runs.
  1. correctness, side by side (nothing here is timed): the GPU tests in three processes (test_compile
     with MIXER_TEST_DEVICE=cuda, in two: the compiled paths on this machine's torch; bf16 causality
     and decoding on CUDA; test_gpu_path's device setup, Toeplitz FFT layout and the refusal with
     the GPU hidden: the rest of test_gpu_path is CPU-only and runs in the suite); an exact resume
     (40 steps straight against 20, stop, resume to 40: the same final loss); torchrun
     --nproc_per_node=1 (NCCL); and bench.py's memory table (each process's own allocator peak,
     which work beside it does not change);
  2. the README's GPU commands, one at a time: config/mixer_gpu.py and transformer_gpu.py as they
     are (compiled, bf16, their micro-batch) for a short run each: steady tokens/s and MFU against
     the GPU's nominal peak, and the peak GPU memory the run took (torch.cuda.max_memory_allocated:
     what a card with less memory than the H200 the configs' comments were measured on needs to
     hold). hybrid_gpu.py, proven on an H200 before, and bench's token-mixing paths, behind
     machine.DEVICE_TUNING['cuda'], left the check for time;
  3. the timed tables and profiles, one at a time, the most wanted first: bench.py's serving table
     (d_model 1024, 8 layers, batches 1 to 256, contexts 512 to 8192 in 16 GiB), its decode table
     for every kind (eager, static, compiled, against the weight-read limit), experiments/profiles.py's
     profile of the compiled decode step (flat, recurrent: host ops, CUDA graph replays, the top
     device ops a token), bench.py's SDPA table (the transformer's eager decode with each attention
     backend forced), the profile of one config/mixer_gpu.py training step (its MFU and top ops), and
     the training table (flat and transformer, eager and compiled).
Output: OUT/report.md, rewritten after every step (a summary row a step, then each finished
table), and every step's console in OUT/<step>.txt. Without a GPU it says so in one line and
exits 2; it exits 1 if any step failed, timed out or was skipped; Ctrl-C stops every running step (each
runs in a session of its own, which the terminal's Ctrl-C does not reach) and exits 130, the report
kept as far as it got. Preparing the data counts against the budget.
"""

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

if __name__ == '__main__':       # run as a file too (python experiments/gpu_check.py): the repository root on
    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the path, as -m puts it
    from harness import cli                   # and from here Ctrl-C is one line, torch's import included
    cli.begin('gpu_check.py', keep=True)

import torch

from harness import machine
from harness.cli import failing, write_atomic
from harness.flags import ArgumentParser, number
from experiments.runner import ROOT, fmt_s, md_table, read_log, say

BUDGET_S = 480                 # the whole check, so that it fits a 15-minute GPU loan with the start-up

# The sizes of a check: a GPU's, and the CPU's tiny ones with which the suite runs every step's command
# line (tests/test_gpu_path.py), so that a bad command line fails on the CPU, not in a GPU loan.
# One GPU run of the check, estimated step by step (docs/performance.md, "The GPU check's budget"; not
# yet run on a GPU in this form): data preparation 10 s, correctness side by side about 140 s, two
# configs 60 s, the tables and profiles about 245 s: about 455 of the 480 s.
COMPILE_TESTS = 'tests.test_compile.TestCompile.test_'
GPU = dict(config_steps=100, log_interval=25, resume_steps=40, configs=('mixer_gpu', 'transformer_gpu'),
           tests=[[f'{COMPILE_TESTS}every_kind_compiles_in_one_graph_to_eager_logits_and_gradients',   # about 200 s
                   f'{COMPILE_TESTS}many_lengths_compile_a_bounded_number_of_times'],   # in one process on an H200:
                  [f'{COMPILE_TESTS}inductor_core_kinds_equal_eager',                    # three processes side by side
                   f'{COMPILE_TESTS}train_py_compile_trains_and_loads_uncompiled'],
                  ['tests.test_compile.TestBF16', 'tests.test_compile.TestDecoder',
                   'tests.test_gpu_path.TestDevice', 'tests.test_gpu_path.TestToeplitzFFT',
                   'tests.test_gpu_path.TestGPUCheck.test_refuses_without_a_gpu_in_one_line']],
           train_extra=[],
           bench_serving=['--serve_size', '1024x8', '--serve_batches', '1,8,64,256', '--serve_contexts', '512,2048,8192',
                          '--serve_tokens', '16', '--serve_memory_gb', '16'],
           bench_decode=['--decode_variants', 'flat,toeplitz,recurrent,transformer,linear_attention', '--decode_sizes',
                         '1024x8', '--decode_n_ctx', '512', '--decode_tokens', '32'],
           bench_sdpa=['--decode_sizes', '1024x8', '--decode_n_ctx', '512', '--decode_tokens', '32'],
           profile_decode=['--decode_variants', 'flat,recurrent', '--d_model', '1024', '--n_layer', '8', '--n_ctx', '512',
                           '--tokens', '32'],
           profile_train=['--train', 'config/mixer_gpu.py', '--train_warmup', '3', '--train_steps', '5'],
           bench_train=['--variants', 'flat,transformer', '--compile', '--d_model', '1024', '--n_layer', '8', '--n_ctx',
                        '512', '--batch_size', '32', '--warmup', '2', '--steps', '10'],
           bench_memory=['--mem_scope', 'block', '--mem_batch', '8', '--mem_d_model', '128', '--mem_variants',
                         'flat,toeplitz,recurrent,transformer,linear_attention', '--mem_lengths', '2048,8192,16384'])
TINY = dict(config_steps=4, log_interval=1, resume_steps=4, configs=('mixer_gpu',),
            tests=[['tests.test_sample.TestSample.test_sample_bad_inputs']],
            train_extra=['--d_model=32', '--n_layer=1', '--n_ctx=32', '--batch_size=2', '--grad_accum=1',
                         '--eval_windows=2', '--compile=False'],
            bench_serving=['--quick', '--serve_variants', 'flat,recurrent'], bench_decode=['--quick'],
            bench_sdpa=['--quick'],
            profile_decode=['--decode_variants', 'flat', '--d_model', '32', '--n_layer', '1', '--n_ctx', '32',
                            '--tokens', '4', '--backend', 'eager', '--dtype', 'bf16'],   # the GPU's dtype
            profile_train=['--train', 'config/tinystories_cpu.py', '--train_warmup', '1', '--train_steps', '1',
                           '--train_args=--d_model=32 --n_layer=1 --n_ctx=32 --batch_size=2 --compile=False'],
            bench_train=['--quick', '--variants', 'flat,transformer'], bench_memory=['--quick', '--mem_variants', 'flat'])


@dataclass
class Step:
    """One command of the check: `python argv...` from the repository root, console to
    OUT/name.txt (and stdout alone to OUT/name.md when `table`), at most limit_s seconds."""
    name: str
    what: str                        # the report row's label
    argv: list
    limit_s: int
    env: dict = field(default_factory=dict)
    run_dir: str = None              # a train.py run whose log gives the numbers
    table: bool = False              # a bench.py table: its markdown goes into the report


class Check:
    """The check's state: its steps' rows and tables, the deadline, and the report written
    after every step."""

    def __init__(self, out, machine_line, budget_s, t0=None):
        self.out, self.machine_line, self.t0 = out, machine_line, t0 or time.time()
        self.deadline = self.t0 + budget_s
        self.rows, self.tables, self.lock = [], [], threading.Lock()
        self.live, self.stopped = set(), False          # the steps' running processes; set by stop()

    def stop(self):
        """Ctrl-C: kill every running step's process group (the steps after them are skipped)."""
        with self.lock:
            self.stopped = True
            for p in self.live:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)

    def run(self, s):
        """Run step s, or skip it when the budget is spent; adds its row."""
        left = self.deadline - time.time()
        if left < 5 or self.stopped:
            self.add(s.what, 'SKIPPED (interrupted)' if self.stopped else 'SKIPPED (out of time)', '-', '-')
            return
        limit = min(s.limit_s, left)
        t0 = time.time()
        console, md = (os.path.join(self.out, f'{s.name}.{x}') for x in ('txt', 'md'))
        with open(console, 'w') as log, open(md if s.table else os.devnull, 'w') as table:
            # a session of its own, so that a step stopped at its limit (or by Ctrl-C) takes its
            # children with it: torchrun's ranks, bench's memory cells
            p = subprocess.Popen([sys.executable, *s.argv], cwd=ROOT, stdout=table if s.table else log,
                                 stderr=log if s.table else subprocess.STDOUT, env={**os.environ, **s.env},
                                 start_new_session=True)
            with self.lock:
                self.live.add(p)
            try:
                rc = p.wait(timeout=limit)
                status = 'ok' if rc == 0 else f'FAILED (exit {rc})'
            except subprocess.TimeoutExpired:
                status = f'TIMEOUT ({fmt_s(limit)})'
            finally:
                if p.poll() is None or status.startswith('TIMEOUT'):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
                with self.lock:
                    self.live.discard(p)
        if self.stopped:
            status = 'STOPPED (Ctrl-C)'
        self.record(s, status, time.time() - t0)

    def record(self, s, status, seconds):
        """Add the row of step s, which ran: a training run's numbers (when it ended), the tests' last
        line, a table's rows (as far as it got)."""
        numbers = '-'
        if s.run_dir and status == 'ok':
            numbers = describe_run(s.run_dir)
        elif s.name.startswith('tests'):                 # unittest's last line: 'OK' or 'FAILED (failures=1)'
            with open(os.path.join(self.out, f'{s.name}.txt')) as f:
                lines = f.read().strip().splitlines()
            numbers = next((l for l in reversed(lines) if l.startswith(('Ran ', 'OK', 'FAILED'))), '-')
        if s.table and os.path.isfile(os.path.join(self.out, f'{s.name}.md')):
            with open(os.path.join(self.out, f'{s.name}.md')) as f:
                text = f.read()
            body = text[text.find('## '):] if '## ' in text else ''
            if body.strip():
                with self.lock:                            # steps of phase 1 finish side by side
                    self.tables.append(body.strip() + ('' if status == 'ok' else f'\n\n_({s.name}: {status}; the '
                                                                                  'rows above are what it measured)_'))
                numbers = 'below'
        self.add(s.what, status, fmt_s(seconds), numbers)

    def add(self, what, status, time_text, numbers):
        """Add a row to the report and rewrite OUT/report.md."""
        with self.lock:                                # steps of phase 1 finish side by side
            self.rows.append([what, status, time_text, numbers])
            say(f'  {what}: {status} in {time_text}')
            write_atomic(os.path.join(self.out, 'report.md'), self.report())

    def report(self):
        """The report's markdown (str): the machine, the time so far, a row a step, the tables."""
        ok = sum(r[1] == 'ok' for r in self.rows)
        return '\n'.join([f'# GPU check\n\n{self.machine_line}; {fmt_s(time.time() - self.t0)} so far, {ok} of '
                          f'{len(self.rows)} steps ok.\n', md_table(['step', 'result', 'time', 'numbers'], self.rows),
                          '', *[t + '\n' for t in self.tables]])


def summary_of(run_dir):
    """The 'summary' event of a train.py run's log (dict), or None (runner.read_log: no log, a torn one)."""
    try:
        return read_log(os.path.join(run_dir, 'log.jsonl'))[1]
    except ValueError:
        return None


def describe_run(run_dir):
    """'val loss 2.95, 957,481 tokens/s steady, MFU 43.9%, peak memory 21.3 GiB' of a run, or '-'."""
    s = summary_of(run_dir)
    if s is None:
        return '-'
    tok_s, mfu = s.get('steady_tokens_per_s') or s['tokens_per_s'], s.get('steady_mfu') or s['mfu']
    which = 'steady' if s.get('steady_tokens_per_s') else 'whole run'
    mem = f', peak GPU memory {s["peak_memory_gib"]:.1f} GiB' if s.get('peak_memory_gib') is not None else ''
    return f'val loss {s["final_val_loss"]:.4f}, {tok_s:,.0f} tokens/s {which}, MFU {machine.fmt_mfu(mfu)}{mem}'


def plan(data, out, device, sizes):
    """The check's phases -> (correctness: chains of steps run side by side, each chain in order;
    configs: steps one at a time; tables: steps one at a time)."""
    z = sizes
    n, half = z['resume_steps'], z['resume_steps'] // 2
    base = ['train.py', 'config/tinystories_cpu.py', f'--data_dir={data}', f'--device={device}',
            f'--eval_interval={half}', '--eval_windows=16', f'--log_interval={max(1, n // 4)}', *z['train_extra']]
    straight, split, ddp = (os.path.join(out, n) for n in ('resume_straight', 'resume_split', 'torchrun_nccl'))
    bench = ['-m', 'experiments.bench', '--device', device]
    correctness = [
        [Step(f'tests{i + 1}', f'tests, MIXER_TEST_DEVICE={device}: {", ".join(names)}', ['-m', 'unittest', *names],
              240, env={'MIXER_TEST_DEVICE': device})] for i, names in enumerate(z['tests'])] + [
        [Step('bench_memory', 'bench: memory against n_ctx (allocator peaks: side by side is fair)',
              [*bench, '--tables', 'memory', *z['bench_memory']], 120, table=True)],
        [Step('resume_straight', f'{n} steps straight', [*base, f'--out_dir={straight}', '--overwrite=True',
                                                         f'--max_iters={n}'], 120, run_dir=straight)],
        [Step('resume_first_half', f'{half} steps, stopped', [*base, f'--out_dir={split}', '--overwrite=True',
                                                              f'--max_iters={half}'], 120),
         Step('resume_second_half', f'resumed to {n} steps', [*base, f'--out_dir={split}', '--init_from=resume',
                                                              f'--max_iters={n}'], 120, run_dir=split)],
        [Step('torchrun', f'torchrun --nproc_per_node=1 ({"NCCL" if device == "cuda" else "gloo"})',
              ['-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=1', *base, f'--out_dir={ddp}',
               '--overwrite=True', f'--max_iters={n}'], 150, run_dir=ddp)]]
    n = z['config_steps']
    configs = [Step(f'train_{c}', f'python train.py config/{c}.py ({n} steps)',
                    ['train.py', f'config/{c}.py', f'--data_dir={data}', f'--out_dir={os.path.join(out, c)}',
                     '--overwrite=True', f'--device={device}', f'--max_iters={n}', f'--eval_interval={n}',
                     '--eval_windows=32', f'--log_interval={z["log_interval"]}', *z['train_extra']], 90,
                    run_dir=os.path.join(out, c))
               for c in z['configs']]
    profiles = ['-m', 'experiments.profiles', '--device', device]
    tables = [Step('bench_serving', 'bench: serving (tokens/s and memory a sequence, batch x context)',
                   [*bench, '--tables', 'serving', *z['bench_serving']], 120, table=True),
              Step('bench_decode', 'bench: decode step, every kind', [*bench, '--tables', 'decode', *z['bench_decode']],
                   120, table=True),
              Step('profile_decode', 'profile: the compiled decode step',
                   [*profiles, '--what', 'decode', *z['profile_decode']], 90, table=True),
              Step('bench_sdpa', 'bench: the transformer\'s decode by SDPA backend',
                   [*bench, '--tables', 'sdpa', *z['bench_sdpa']], 60, table=True),
              Step('profile_train', 'profile: one training step', [*profiles, '--what', 'train', f'--data_dir={data}',
                                                                   *z['profile_train']], 90, table=True),
              Step('bench_train', 'bench: training throughput', [*bench, '--tables', 'train', *z['bench_train']], 90,
                   table=True)]
    return correctness, configs, tables


def run_check(data, out, device='cuda', sizes=GPU, budget_s=BUDGET_S, machine_line=None, t0=None):
    """Run every step of plan() into `out`, within budget_s seconds of t0 (default: now) -> the Check
    (its rows: [what, status, time, numbers]). KeyboardInterrupt (Ctrl-C) kills the running steps,
    adds their rows and is raised again. device 'cpu' with sizes=TINY runs every command line on the
    CPU in about a minute (the suite)."""
    check = Check(out, machine_line or f'device {device}', budget_s, t0)
    correctness, configs, tables = plan(data, out, device, sizes)
    pool = ThreadPoolExecutor(len(correctness))                      # nothing here is timed: side by side
    try:
        list(pool.map(lambda chain: [check.run(s) for s in chain], correctness))
    except KeyboardInterrupt:
        check.stop()                   # before the pool is waited for: its threads wait on the steps
        raise
    finally:
        pool.shutdown()
    a, b = (summary_of(os.path.join(out, n)) for n in ('resume_straight', 'resume_split'))
    a, b = (s and s['final_val_loss'] for s in (a, b))
    same = a is not None and b is not None and abs(a - b) <= 1e-4 * abs(a)
    check.add('the resumed run ends at the straight run\'s loss', 'ok' if same else 'FAILED', '-', f'{a} vs {b}')
    for s in configs + tables:                                       # timed: one at a time
        check.run(s)
    return check


def prepare(args, out, timeout_s):
    """The data dir: --data_dir if prepared, else prepared from --text_dir into OUT/data within
    timeout_s seconds (exit 2 if that fails or takes longer)."""
    if os.path.isfile(os.path.join(args.data_dir, 'meta.json')):
        return os.path.abspath(args.data_dir)
    data = os.path.join(out, 'data')
    try:
        r = subprocess.run([sys.executable, 'data/prepare.py', '--train', os.path.join(args.text_dir, 'train.txt'),
                            '--valid', os.path.join(args.text_dir, 'valid.txt'), '--out', data], cwd=ROOT,
                           capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        fail(f'preparing {args.text_dir} took more than {fmt_s(timeout_s)}, half the check\'s budget: prepare '
             f'it once with data/prepare.py and pass --data_dir')
    if r.returncode:
        fail(f'no prepared data in {args.data_dir}, and preparing {args.text_dir} failed: '
             f'{(r.stderr.strip().splitlines() or ["?"])[-1]}')
    return data


fail = failing('gpu_check.py')


def parse_args(argv):
    """The command line -> argparse.Namespace (--budget_s under 60: a one-line error, exit 2)."""
    p = ArgumentParser('gpu_check.py', __doc__)
    p.add_argument('--data_dir', default=os.path.join('data', 'tinystories'), help='prepared data, if there is one')
    p.add_argument('--text_dir', default=os.path.join('..', 'shared', 'data', 'tinystories'),
                   help='train.txt and valid.txt, prepared into OUT/data when --data_dir has no meta.json')
    p.add_argument('--out', default=os.path.join('out', 'gpu_check'), help='output folder')
    p.add_argument('--budget_s', type=number(int, 60), default=BUDGET_S, help='the whole check\'s time limit, seconds')
    return p.parse_args(argv)


def main(argv=None):
    """The check from the command line: exit 0 when every step is ok, 1 when one is not, 2 without a
    GPU or data, 130 on Ctrl-C."""
    args = parse_args(argv)
    if not torch.cuda.is_available():
        fail('no GPU here (torch.cuda.is_available() is False): run it on a machine with a CUDA GPU')
    out = os.path.abspath(args.out)
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        fail(f'cannot write {out} ({e})')
    machine_line = (f'{torch.cuda.get_device_name()}; torch {torch.__version__}, CUDA {torch.version.cuda}, '
                    f'cuDNN {torch.backends.cudnn.version()}')
    say(f'gpu_check on {machine_line}; at most {fmt_s(args.budget_s)}; output in {out}')
    if os.path.isdir(args.text_dir):          # the tests' text (tests/common.py); without it, those that
        os.environ['TINYSTORIES_DIR'] = os.path.abspath(args.text_dir)     # train on it skip (the row says so)
    else:
        say(f'gpu_check: no text in {args.text_dir}: the tests that need it will skip (send --text_dir along)')
    t0 = time.time()
    try:
        check = run_check(prepare(args, out, args.budget_s / 2), out, 'cuda', GPU, args.budget_s, machine_line, t0)
    except KeyboardInterrupt:
        print(f'gpu_check: interrupted (Ctrl-C): the running steps were stopped; the report so far is in '
              f'{os.path.join(out, "report.md")}', file=sys.stderr)
        sys.exit(130)
    ok = sum(r[1] == 'ok' for r in check.rows)
    print(check.report())
    say(f'gpu_check: {ok} of {len(check.rows)} steps ok in {fmt_s(time.time() - check.t0)}; report in '
        f'{os.path.join(out, "report.md")}')
    sys.exit(0 if ok == len(check.rows) else 1)


if __name__ == '__main__':
    sys.exit(cli.run_command('gpu_check.py', main))        # Ctrl-C in main: its own line (the report so far)
