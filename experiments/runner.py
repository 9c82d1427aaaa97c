"""Runs many training jobs on a pool of processes, caches what finished, and reports
progress with an ETA: the engine under claims.py (train.py runs at equal compute),
icl.py (in-context regression models) and mqar.py (associative recall).

    runner = Runner(out, workers=2, threads=1)
    results = runner.map(fn, [job(parent, 'flat-lr0.001', spec, eta_seconds, VERSION), ...], 'what')

Every cached job is made by job() (its folder named by a hash of all its settings and its code's
version) and run again only when Runner.cached finds no whole result of those settings, so a killed
experiment resumes where it stopped. Pool processes are spawned, each with `threads` torch threads: two
1-thread runs at a time use 2 cores without the oversubscription that two 2-thread runs cause (their
life: experiments/pool.py). Ctrl-C stops the pool's processes (and the commands they run) and exits 130
with one line; what finished stays cached.
"""

import sys

if __name__ == '__main__':       # not a command, run as a file or with -m: said before any import
    print('runner.py: error: the job pool of claims.py, icl.py and mqar.py, not a command: python -m '
          'experiments.mqar --help', file=sys.stderr)
    sys.exit(2)

import contextlib
import functools
import hashlib
import json
import math
import os
import shutil
import signal
import time
from concurrent.futures import FIRST_COMPLETED, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, NamedTuple, Optional

from harness import cli
from experiments.commands import ROOT, run_command
from experiments.pool import end_pool, new_pool


def say(msg):
    """Print a progress line to stderr, in one write (print's two, the text and its newline, let a Ctrl-C
    between them glue the interrupt's line to it), on a line of its own (cli.own_line)."""
    cli.own_line(msg)


def load_json(path, what='cached result'):
    """The JSON content of the cache file `path`, or None when there is none or it is damaged
    (a torn write, a full disk): then a one-line warning, and the caller computes it again."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        say(f'warning: {path}: a damaged {what} ({type(e).__name__}: {str(e)[:80]}); computing it again')
        return None


def spec_key(obj):
    """A short hash of a JSON-able object: the first 10 hex digits of the SHA-256 of its canonical JSON
    (keys sorted, floats at full precision: 1e-3 and 1.0000001e-3 differ; a tuple and a list alike)."""
    blob = json.dumps(obj, sort_keys=True, separators=(',', ':'))
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


class Job(NamedTuple):
    """One cached job of Runner.map or Runner.chains (made by job()): its folder, the spec its function
    receives, its estimated seconds (ETAs), the version of the code that trains it, prepare(dir) run
    before it (default: empty the folder) and check(dir, cached result) -> None, or why the files the
    result stands for are unusable (a damaged state a later job needs: then it runs again; in
    Runner.chains asked only where the job after it is to run)."""
    dir: str
    spec: Any
    eta: float
    version: str
    prepare: Optional[Callable] = None
    check: Optional[Callable] = None

    @property
    def settings(self):
        """What the job's result depends on: {'argv': spec, 'version': version} (stored beside it)."""
        return {'argv': self.spec, 'version': self.version}


def job(parent, name, spec, eta, version, prepare=None, check=None):
    """The one rule for an experiment's cached job -> Job in PARENT/NAME-KEY: NAME a readable name
    (the kind, the rate, ...: it need not be unique), KEY = spec_key of the spec (JSON-able; it must
    hold every setting the result depends on) and the code's version (a string the experiment changes
    when a change of its code changes results). Two jobs share a folder only if both are equal."""
    return Job(os.path.join(parent, f'{name}-{spec_key([spec, version])}'), spec, eta, version, prepare, check)


def command(main, prog):
    """Run an experiment's main() as its command -> the exit status, through cli.run_command: Ctrl-C
    at any moment is one line and exit 130, a second one ignored while the pool stops and the process
    ends (exits=True: the pool's finalizers run at exit). Every cache file is written whole (cache(),
    write_atomic, save_figure), so the same command resumes."""
    return cli.run_command(prog, main, kept='what finished is cached: run the same command again to go on',
                           exits=True)


# ----------------------------------------------------------------------------- work done in pool processes

def train_job(argv, run_dir):
    """Runner job: train.main(argv + --out_dir=RUN_DIR) in this (pool) process, its console to
    RUN_DIR/console.txt -> {'rc' (0 ok; train.py's own status on an error, e.g. 2 for bad settings),
    'evals' [(step, val_loss, val_bpb, val_acc)], 'summary', 'line'} read from its log."""
    import train                                  # imported once per pool process
    os.chdir(ROOT)
    with open(os.path.join(run_dir, 'console.txt'), 'a') as f, contextlib.redirect_stdout(f), \
            contextlib.redirect_stderr(f):
        try:
            train.main([*argv, f'--out_dir={run_dir}'])
            rc = 0
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
        except Exception as e:                    # a run that crashes is reported, not the whole claims run
            print(f'{type(e).__name__}: {e}', flush=True)
            rc = 1
    try:
        evals, summary = read_log(os.path.join(run_dir, 'log.jsonl'))
    except ValueError as e:                       # a damaged log (checkpoint.CheckpointError): a failed job
        return {'rc': rc or 1, 'evals': [], 'summary': None, 'line': str(e)}
    return {'rc': rc, 'evals': evals, 'summary': summary,
            'line': f'val {evals[-1][1]:.4f}' if evals else 'no eval'}


def window_loss_job(argv, run_dir):
    """Runner job: the checkpoint argv[0] on its run's eval_windows fixed windows of
    train.bin and of val.bin (train.evaluate; CPU, fp32) -> {'rc', 'train_loss',
    'val_loss' (nats/token), 'line'}: the generalisation gap of a finished run."""
    import train
    from data.tokens import read_prepared
    from harness.loading import load_checkpoint
    os.chdir(ROOT)
    try:
        model, _, ckpt = load_checkpoint(argv[0])
        cfg = {**ckpt['config'], 'eval_train': True}
        meta, train_data, val_data = read_prepared(cfg['data_dir'], cfg['n_ctx'])
        ev = train.evaluate_splits(model, train_data, val_data, cfg, 'cpu', contextlib.nullcontext(), meta)
    except (Exception, SystemExit) as e:        # reported as a failed job, not a crashed experiment
        return {'rc': 1, 'line': f'{type(e).__name__}: {e}'}
    return {'rc': 0, 'train_loss': ev['train_windows_loss'], 'val_loss': ev['val_loss'],
            'line': f'train windows {ev["train_windows_loss"]:.4f}, val {ev["val_loss"]:.4f}'}


def time_calls(fn, n, warmup=0, device=None):
    """Seconds of each of n calls of fn() after `warmup` untimed ones, `device` (a torch device or a
    name; None: none) synchronised before each clock read (machine.sync: CUDA's work done, not only
    launched) -> list of n floats. Every timing loop of the experiments (step times, bench's tables)."""
    from harness.machine import sync
    wait = (lambda: sync(device)) if device is not None else (lambda: None)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(n):
        wait()
        t0 = time.perf_counter()
        fn()
        wait()
        times.append(time.perf_counter() - t0)
    return times


@contextlib.contextmanager
def torch_threads(n):
    """torch's intra-op threads set to n inside the block, the caller's count restored after it."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def step_time_job(spec, run_dir=None):
    """Runner job: seconds a training step of the step function that spec['builder'] ('module:function',
    imported here, called with spec['args']) returns, measured in this pool process as the runs go:
    spec['warmup'] steps untimed, then spec['chunks'] chunks of spec['steps'] steps, each timed -> {'rc',
    's_per_step' (the median chunk's seconds a step: a chunk another process slowed does not move it),
    's_fastest' (the fastest chunk's: what an uncontended machine gives), 'chunks', 'line'}."""
    import importlib
    import torch
    module, name = spec['builder'].split(':')
    try:
        step = getattr(importlib.import_module(module), name)(**spec['args'])
    except SystemExit as e:                        # a builder's settings refused (train.py's: one line)
        return {'rc': 1, 'line': f'its step builder exited ({e.code})'}
    device = 'cuda' if torch.cuda.is_initialized() else None
    for _ in range(spec['warmup']):
        step()
    chunks = [t / spec['steps'] for t in time_calls(lambda: [step() for _ in range(spec['steps'])], spec['chunks'],
                                                    device=device)]
    s = sorted(chunks)[len(chunks) // 2]
    return {'rc': 0, 's_per_step': s, 's_fastest': min(chunks), 'chunks': chunks, 'line': f'{1000 * s:.1f} ms a step'}


def train_run(argv):
    """train.py's run of the settings argv (config files and --key=value), built as train.main builds it
    (the settings checked, the device set up, the data loaded, the model and its optimisers made), nothing
    written -> (run: train.build_run's namespace, with .env and .train_data; cfg: the settings; step(): one
    train.train_step on freshly drawn windows at the peak learning rate -> its loss tensor). Bad settings
    or data: train.py's one line, exit 2."""
    from data.tokens import read_prepared
    from harness import cli, configurator, machine
    import train
    cfg, _ = configurator.settings([*argv, '--init_from=scratch'], train.DEFAULTS, train.__doc__, train)
    env = machine.setup_device(cfg)
    try:
        meta, train_data, _ = read_prepared(cfg['data_dir'], cfg['n_ctx'])
    except ValueError as e:
        cli.fail(str(e))
    run = train.build_run(cfg, None, env, meta)
    run.env, run.train_data = env, train_data
    for _, opt in run.optimizers:                     # the peak learning rate, as train.train's loop sets it
        for group in opt.param_groups:
            group['lr'] = cfg['learning_rate'] * group['lr_mult']

    def step():
        starts = train.draw_windows(run.batch_gen, len(train_data), cfg['n_ctx'], cfg['batch_size'],
                                    cfg['grad_accum'], env.world)[env.rank]
        return train.train_step(run.model, run.optimizers, train_data, starts, cfg, env)
    return run, cfg, step


# ----------------------------------------------------------------------------- runs and their cache

def read_log(path):
    """Events of a train.py log.jsonl: (evals [(step, val_loss, val_bpb, val_acc)], summary or None).
    loading.read_log reads it: a last line torn by a crash is dropped with a warning."""
    from harness.loading import read_log as read_records
    evals, summary = [], None
    for rec in read_records(path):
        if rec.get('event') == 'eval':
            evals.append((rec['step'], rec['val_loss'], rec['val_bpb'], rec.get('val_acc')))
        elif rec.get('event') == 'summary':
            summary = rec
    return evals, summary


def interruptible(method):
    """A Runner method whose last positional argument names its work (`what`): Ctrl-C in it stops the
    pool and exits 130 with one line (Runner.stop)."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except KeyboardInterrupt:
            self.stop(args[-1])
    return run


class Runner:
    """Runs jobs (job(): a Job each) on a pool of `workers` processes with `threads` threads each,
    caches each finished job's result.json (keyed by the job's settings), and prints progress
    and ETAs. claims.py runs train.py through it; icl.py and mqar.py run their own jobs."""

    def __init__(self, out, workers, threads):
        self.out, self.workers, self.threads = out, workers, threads
        os.environ['OMP_NUM_THREADS'] = str(threads)     # the pool's processes (and their commands) start so
        self.ran = 0                                 # jobs run (not taken from the cache) so far
        self.pool = self.new_pool()

    def new_pool(self):
        """A fresh pool of spawned processes (pool.new_pool)."""
        return new_pool(self.workers, self.threads)

    def submit(self, fn, *args):
        """pool.submit, Ctrl-C held while it may start a pool process (cli.deferred_interrupt): the process
        starts with SIGINT blocked, so a Ctrl-C during its start-up is no traceback of its own, and
        this one's Ctrl-C comes when the submit is done, not lost."""
        with cli.deferred_interrupt():
            return self.pool.submit(fn, *args)

    def stop(self, what):
        """Ctrl-C: end the pool (end_pool: its processes, the commands they run and its thread), say so
        in one line, exit 130. A second Ctrl-C while it stops (`timeout -s INT` signals the process and
        its group) is ignored."""
        with contextlib.suppress(ValueError):                  # not the main thread: no handler to set
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        end_pool(self.pool)
        cli.own_line(f'{os.path.basename(sys.argv[0])}: interrupted (Ctrl-C) during {what}; the runs that '
                     f'finished are cached in {self.out}: run the same command again to go on')
        sys.exit(130)

    def close(self):
        """The experiment is done with the pool: its processes finish their jobs and end, its thread is
        joined (pool.shutdown(wait=True)). Ctrl-C while it waits ends the pool at once (end_pool) and goes
        on as KeyboardInterrupt: nothing is left running for concurrent.futures' exit hook."""
        try:
            self.pool.shutdown(wait=True)
        except KeyboardInterrupt:
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGINT, signal.SIG_IGN)
            end_pool(self.pool)
            raise

    def cached(self, job, check=True):
        """The cached result of `job` (a Job), marked 'cached': True, or None: no result.json yet, a damaged one, one of other
        settings, or (if `check`) files that job.check finds unusable (each but the first said in one line;
        the job then runs again)."""
        res = load_json(os.path.join(job.dir, 'result.json'))
        if res is None:
            return None
        if not isinstance(res, dict) or spec_key([res.get('argv'), res.get('version')]) != spec_key(
                [job.spec, job.version]):
            say(f'warning: {job.dir}: its result.json is of other settings or code; computing it again')
            return None
        reason = job.check(job.dir, res) if job.check and check else None
        if reason:
            say(f'warning: {job.dir}: {reason}; computing it again')
            return None
        return {**res, 'cached': True}

    def outcome(self, fut):
        """A finished future's result dict; a job whose process died (killed, out of memory)
        is a failed job, and the pool is replaced for the jobs after it; a job that raised (a GPU
        out of memory, a full disk) is a failed job whose line names the error."""
        try:
            return fut.result()
        except BrokenProcessPool as e:
            if getattr(self.pool, '_broken', False):       # once, not for each job of the broken pool
                end_pool(self.pool)
                self.pool = self.new_pool()
            return {'rc': 1, 'line': f'its process died ({e})'}
        except Exception as e:                             # the job's own error, raised in its process
            return {'rc': 1, 'line': f'{type(e).__name__}: {e}'}

    def start(self, fn, job):
        """Set a job's folder up (job.prepare, default: emptied), write its settings.json, submit it."""
        (job.prepare or reset_dir)(job.dir)
        cache(os.path.join(job.dir, 'settings.json'), job.settings)
        return self.submit(fn, job.spec, job.dir)

    def finish(self, job, fut):
        """A finished job's result with its settings; cached (result.json) if it succeeded."""
        res = {**job.settings, **self.outcome(fut)}
        if res['rc'] == 0:
            cache(os.path.join(job.dir, 'result.json'), res)
        return res

    def progress(self, done, todo, run_dir, res, t0, left):
        """Print a finished job's line: its place, folder, outcome, time so far and the phase's ETA
        (`left`: the unfinished jobs' estimated seconds, spread over the workers)."""
        say(f'  [{done}/{todo}] {os.path.relpath(run_dir, self.out)}: '
            f'{"ok" if res["rc"] == 0 else "FAILED (exit %s)" % res["rc"]}, {res.get("line", "")}; '
            f'{fmt_s(time.time() - t0)} so far, about {fmt_s(max(0.0, left) / self.workers)} left in this phase')

    def map(self, fn, jobs, what):
        """jobs: list of Job (job()) -> list of results, in order (chains() of one job each).

        fn(spec, run_dir) runs in a pool process and returns a JSON-able dict with 'rc'
        (0 = ok) and 'line' (a short summary for the progress line); the result is that
        dict with the job's settings ('argv': its spec, 'version') added. A job whose folder
        holds a result.json of the same settings (Runner.cached) is not run again; a failed job
        (rc != 0) is not cached, so the next call retries it."""
        return [rs[0] for rs in self.chains(fn, [[j] for j in jobs], what, check_last=True)]

    @interruptible
    def chains(self, fn, chains, what, check_last=False):
        """chains: lists of Job as in map(), each list run in order (a job may read what the job before
        it left in its folder), the lists side by side: whenever a worker is free it takes the next job
        of the chain with the most work left (a cached job is skipped). A cached job's check (the files a
        later job reads) is made only where the job after it is to run (and on the last job if check_last,
        as map's are): a chain whose jobs are all cached needs none of its files but the results (e.g. a
        ladder moved to another machine without its states). After a failed job the rest of its chain is
        not run (each gets {'rc': 1, 'line': ...}, not cached) -> a list of results per chain, in order,
        and self.ran counts the jobs run."""
        results = []
        for chain in chains:
            rs, next_runs = [None] * len(chain), check_last
            for i in reversed(range(len(chain))):
                rs[i] = self.cached(chain[i], check=next_runs)
                next_runs = rs[i] is None
            results.append(rs)
        todo = sum(r is None for rs in results for r in rs)
        total = sum(map(len, chains))
        if todo < total:
            say(f'{what}: {total - todo} of {total} runs cached')
        left = sum(j.eta for chain, rs in zip(chains, results) for j, r in zip(chain, rs) if r is None)
        if todo:
            say(f'{what}: {todo} runs, about {fmt_s(left / self.workers)} on {self.workers} workers' +
                (f' ({sum(any(r is None for r in rs) for rs in results)} chains)' if max(map(len, chains)) > 1 else ''))
        cursor, running, t0, done, skipped = [0] * len(chains), {}, time.time(), 0, 0

        def advance(c):                       # past the chain's finished (cached) jobs
            while cursor[c] < len(chains[c]) and results[c][cursor[c]] is not None:
                cursor[c] += 1

        def work_left(c):
            return sum(j.eta for j, r in zip(chains[c][cursor[c]:], results[c][cursor[c]:]) if r is None)
        for c in range(len(chains)):
            advance(c)
        while True:
            ready = [c for c in range(len(chains)) if cursor[c] < len(chains[c]) and c not in running.values()]
            while ready and len(running) < self.workers:
                c = max(ready, key=work_left)
                ready.remove(c)
                running[self.start(fn, chains[c][cursor[c]])] = c
            if not running:
                break
            for fut in wait(running, return_when=FIRST_COMPLETED)[0]:
                c = running.pop(fut)
                j = chains[c][cursor[c]]
                res = self.finish(j, fut)
                if res['rc'] != 0:            # the rest of the chain needs this job's output
                    for i in range(cursor[c] + 1, len(chains[c])):
                        if results[c][i] is None:
                            results[c][i] = {**chains[c][i].settings, 'rc': 1,
                                             'line': f'not run: {os.path.relpath(j.dir, self.out)} failed'}
                            skipped, left = skipped + 1, left - chains[c][i].eta
                results[c][cursor[c]] = res
                done += 1
                left -= j.eta
                self.progress(done + skipped, todo, j.dir, res, t0, left)    # skipped: ended, not run
                advance(c)
        self.ran += done
        return results

    @interruptible
    def commands(self, jobs, what):
        """jobs: list of (args, out_path) run as `python args...` on the pool -> exit statuses.
        A command whose output exists from the same args (OUT_PATH.args.json) is not run again;
        a command to run loses its OUT_PATH.args.json first, so one stopped halfway is never
        taken for done."""
        def cached(args, path):
            return os.path.isfile(path) and load_json(path + '.args.json', 'record of a command') == args
        futs = []
        for args, path in jobs:
            if cached(args, path):
                futs.append(None)
                continue
            if os.path.exists(path + '.args.json'):
                os.remove(path + '.args.json')
            futs.append(self.submit(run_command, args, path))
        todo = sum(f is not None for f in futs)
        say(f'{what}: {todo} commands' + (f', {len(jobs) - todo} cached' if todo < len(jobs) else ''))
        rcs = []
        for f, (args, path) in zip(futs, jobs):
            rcs.append(0 if f is None else self.outcome(f))
            if isinstance(rcs[-1], dict):                  # its process died
                rcs[-1] = rcs[-1]['rc']
            if f is not None and rcs[-1] == 0:
                cache(path + '.args.json', args)
        return rcs


def step_times(runner, parent, builders, steps, version, what, fresh=False):
    """The one step-time calibration of the experiments: seconds a training step of each step builder,
    builders {key: (job name, 'module:function', its keyword arguments)}, each a cached job
    (PARENT/NAME-KEY: step_time_job, 3 warm-up steps, then 5 chunks of steps // 5 steps) measured in the
    pool the runs train in, so under their conditions (two jobs at a time, one thread each on the CPU);
    `fresh`: measured again, the cached ones removed first -> {key: (median seconds a step, the fastest
    chunk's)}. RuntimeError naming the jobs that failed."""
    jobs = [job(parent, name, dict(builder=builder, args=args, warmup=3, chunks=5, steps=max(1, steps // 5)),
                3 + 0.1 * steps, version) for name, builder, args in builders.values()]
    if fresh:
        for j in jobs:
            shutil.rmtree(j.dir, ignore_errors=True)
    res = runner.map(step_time_job, jobs, what)
    if any(r['rc'] != 0 for r in res):
        raise RuntimeError('a step-time job failed (' + '; '.join(r.get('line', '') for r in res if r['rc']) + ')')
    return {key: (r['s_per_step'], r['s_fastest']) for key, r in zip(builders, res)}


def cache(path, obj):
    """Write obj as JSON to the cache file `path`, whole or not at all (cli.write_atomic). A
    failed write (a full disk) is a one-line warning: the job runs again next time."""
    from harness.cli import write_atomic
    try:
        write_atomic(path, json.dumps(obj))
    except OSError as e:
        say(f'warning: could not cache {path} ({e.strerror or e}); it runs again next time')


def reset_dir(run_dir):
    """Empty run_dir (made if missing) for a job's fresh start."""
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)


def fmt_s(s):
    """Seconds as '42 s' or '3.5 min'."""
    return f'{s / 60:.1f} min' if s >= 90 else f'{s:.0f} s'


def fmt_bytes(nbytes):
    """Bytes -> '12.3 KiB', '4.5 MiB' or '1.2 GiB' (str)."""
    for unit, scale in (('GiB', 2 ** 30), ('MiB', 2 ** 20)):
        if nbytes >= scale:
            return f'{nbytes / scale:.1f} {unit}'
    return f'{nbytes / 2 ** 10:.1f} KiB'


def save_figure(fig, path, dpi=90, format='png'):
    """Lay out a matplotlib figure, write it to `path` (PNG, or `format`: 'svg', 'pdf') whole (cli.written:
    its folders made, as cli.check_folder_writable promises; a temporary file beside it, then a rename: a
    stopped run leaves no half-written image) and close it -> 'plot: path', or 'plot not written: path (why)'
    when the write fails (a full disk: no temporary file left, the old figure as it was; the experiment's
    tables stand without it)."""
    import matplotlib.pyplot as plt
    from harness.cli import written
    try:
        fig.tight_layout()
        with written(path) as tmp:
            fig.savefig(tmp, dpi=dpi, format=format)
    except OSError as e:
        return f'plot not written: {path} ({e.strerror or e})'
    finally:
        plt.close(fig)
    return f'plot: {path}'


def pyplot():
    """matplotlib.pyplot on the Agg backend, or None when matplotlib is not installed (then a figure's
    function returns NO_PLOT: the tables stand without it)."""
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        return None


NO_PLOT = 'plot skipped: matplotlib is not installed (pip install matplotlib)'


def mean_range(xs, digits='.4g', half='.2g', bad='diverged', one=False):
    """The reports' 'mean +- half the range' of per-seed values xs, each part by its format spec or
    function (`digits`, `half`); one value: its mean alone, unless `one`; `bad` when there is none or
    one is not finite (a diverged or failed run) -> str."""
    if not xs or not all(math.isfinite(x) for x in xs):
        return bad
    f, g = ((x if callable(x) else lambda v, spec=x: format(v, spec)) for x in (digits, half))
    return f(sum(xs) / len(xs)) + (f' +- {g((max(xs) - min(xs)) / 2)}' if len(xs) > 1 or one else '')


def md_row(cells):
    """One markdown table line of a list of cells (a table printed a row at a time keeps its
    rows when the run is cut short)."""
    return '| ' + ' | '.join(map(str, cells)) + ' |'


def md_table(header, rows):
    """A markdown table of a header and rows (lists of cells)."""
    return '\n'.join([md_row(header), '|' + '---|' * len(header)] + [md_row(r) for r in rows])
