"""Runs many training jobs on a pool of processes, caches what finished, and reports
progress with an ETA: the engine under claims.py (train.py runs at equal compute) and
icl.py (in-context regression models).

    runner = Runner(out, workers=2, threads=1)
    results = runner.train_batch([(run_dir, train_argv, eta_seconds, None), ...], 'what')

A job whose folder holds a result.json of the same arguments is not run again, so a
killed experiment resumes where it stopped. Pool processes are spawned, each with
`threads` torch threads: two 1-thread runs at a time use 2 cores without the
oversubscription that two 2-thread runs cause.
"""

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository root


def say(msg):
    print(msg, file=sys.stderr, flush=True)



# ----------------------------------------------------------------------------- work done in pool processes

def train_in_process(argv, log_path):
    """Run train.main(argv) in this (pool) process, console output to log_path.
    -> exit status (0 ok; train.py's own status on an error, e.g. 2 for bad settings)."""
    import train                                  # imported once per pool process
    os.chdir(ROOT)
    with open(log_path, 'a') as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        try:
            train.main(argv)
            return 0
        except SystemExit as e:
            return e.code if isinstance(e.code, int) else 1
        except Exception as e:                    # a run that crashes is reported, not the whole claims run
            print(f'{type(e).__name__}: {e}', flush=True)
            return 1


def train_job(argv, run_dir):
    """Runner job: train.py with argv, console to RUN_DIR/console.txt -> {'rc', 'evals',
    'summary', 'line'} read from its log."""
    rc = train_in_process(argv, os.path.join(run_dir, 'console.txt'))
    evals, summary = read_log(os.path.join(run_dir, 'log.jsonl'))
    return {'rc': rc, 'evals': evals, 'summary': summary,
            'line': f'val {evals[-1][1]:.4f}' if evals else 'no eval'}


def window_loss_job(argv, run_dir):
    """Runner job: the checkpoint argv[0] on its run's eval_windows fixed windows of
    train.bin and of val.bin (train.evaluate; CPU, fp32) -> {'rc', 'train_loss',
    'val_loss' (nats/token), 'line'}: the generalisation gap of a finished run."""
    import train
    from checkpoint import load_checkpoint
    os.chdir(ROOT)
    try:
        model, _, ckpt = load_checkpoint(argv[0])
        cfg = {**ckpt['config'], 'eval_train': True}
        train_data, val_data = (train.load_tokens(os.path.join(cfg['data_dir'], f'{s}.bin')) for s in ('train', 'val'))
        ev = train.evaluate_splits(model, train_data, val_data, cfg, 'cpu', contextlib.nullcontext(), 1.0)
    except (Exception, SystemExit) as e:        # reported as a failed job, not a crashed experiment
        return {'rc': 1, 'line': f'{type(e).__name__}: {e}'}
    return {'rc': 0, 'train_loss': ev['train_windows_loss'], 'val_loss': ev['val_loss'],
            'line': f'train windows {ev["train_windows_loss"]:.4f}, val {ev["val_loss"]:.4f}'}


def run_command(args, out_path):
    """Run a project script (python args...) with stdout to out_path -> exit status."""
    tmp = out_path + '.tmp'
    with open(tmp, 'w') as f:
        rc = subprocess.run([sys.executable, *args], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
    os.replace(tmp, out_path)
    return rc


def _pool_init(threads):
    import torch
    torch.set_num_threads(threads)


# ----------------------------------------------------------------------------- runs and their cache

def read_log(path):
    """Events of a train.py log.jsonl: (evals [(step, val_loss, val_bpb, val_acc)], summary or None)."""
    evals, summary = [], None
    if os.path.isfile(path):
        for line in open(path):
            rec = json.loads(line)
            if rec.get('event') == 'eval':
                evals.append((rec['step'], rec['val_loss'], rec['val_bpb'], rec.get('val_acc')))
            elif rec.get('event') == 'summary':
                summary = rec
    return evals, summary


class Runner:
    """Runs jobs on a pool of `workers` processes with `threads` threads each, caches
    each finished job's result.json (keyed by the job's arguments), and prints progress
    and ETAs. claims.py runs train.py through it; icl.py runs its own training jobs."""

    def __init__(self, out, workers, threads):
        self.out, self.workers = out, workers
        self.pool = ProcessPoolExecutor(workers, mp_context=get_context('spawn'),
                                        initializer=_pool_init, initargs=(threads,))

    def result_path(self, run_dir):
        return os.path.join(run_dir, 'result.json')

    def cached(self, run_dir, argv):
        """The cached result of this exact argv in run_dir, or None."""
        path = self.result_path(run_dir)
        if os.path.isfile(path):
            res = json.load(open(path))
            if res.get('argv') == argv:
                return res
        return None

    def map(self, fn, jobs, what):
        """jobs: list of (run_dir, argv, eta_seconds, prepare) -> list of results, in order.

        fn(argv, run_dir) runs in a pool process and returns a JSON-able dict with 'rc'
        (0 = ok) and 'line' (a short summary for the progress line); the result is that
        dict with 'argv' added. prepare(run_dir) sets the folder up (default: empty it).
        A job whose run_dir holds a result.json of the same argv is not run again; a
        failed job (rc != 0) is not cached, so the next call retries it."""
        results, todo = [None] * len(jobs), []
        for i, (run_dir, argv, eta, prepare) in enumerate(jobs):
            results[i] = self.cached(run_dir, argv)
            if results[i] is None:
                todo.append(i)
        if len(todo) < len(jobs):
            say(f'{what}: {len(jobs) - len(todo)} of {len(jobs)} runs cached')
        left = sum(jobs[i][2] for i in todo)
        t0, done, futures = time.time(), 0, {}
        for i in todo:
            run_dir, argv, eta, prepare = jobs[i]
            (prepare or reset_dir)(run_dir)
            futures[self.pool.submit(fn, argv, run_dir)] = i
        if todo:
            say(f'{what}: {len(todo)} runs, about {fmt_s(left / self.workers)} on {self.workers} workers')
        for fut in as_completed(futures):
            i = futures[fut]
            run_dir, argv, eta, _ = jobs[i]
            res = {'argv': argv, **fut.result()}
            if res['rc'] == 0:
                with open(self.result_path(run_dir) + '.tmp', 'w') as f:
                    json.dump(res, f)
                os.replace(self.result_path(run_dir) + '.tmp', self.result_path(run_dir))
            results[i] = res
            done += 1
            left -= eta
            say(f'  [{done}/{len(todo)}] {os.path.relpath(run_dir, self.out)}: '
                f'{"ok" if res["rc"] == 0 else "FAILED (exit %s)" % res["rc"]}, {res.get("line", "")}; '
                f'{fmt_s(time.time() - t0)} so far, about {fmt_s(max(0.0, left) / self.workers)} left in this phase')
        return results

    def train_batch(self, jobs, what):
        """train.py runs: jobs as in map(), argv the train.py arguments -> results with
        'rc', 'evals' [(step, val_loss, val_bpb, val_acc)], 'summary', 'argv'."""
        return self.map(train_job, jobs, what)

    def commands(self, jobs, what):
        """jobs: list of (args, out_path) run as `python args...` on the pool -> exit statuses.
        A command whose output exists from the same args (OUT_PATH.args.json) is not run again."""
        def cached(args, path):
            return os.path.isfile(path) and os.path.isfile(path + '.args.json') and \
                json.load(open(path + '.args.json')) == args
        futs = [None if cached(args, path) else self.pool.submit(run_command, args, path) for args, path in jobs]
        todo = sum(f is not None for f in futs)
        say(f'{what}: {todo} commands' + (f', {len(jobs) - todo} cached' if todo < len(jobs) else ''))
        rcs = []
        for f, (args, path) in zip(futs, jobs):
            rcs.append(0 if f is None else f.result())
            if f is not None and rcs[-1] == 0:
                with open(path + '.args.json', 'w') as fh:
                    json.dump(args, fh)
        return rcs


def reset_dir(run_dir):
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)


def fmt_s(s):
    return f'{s / 60:.1f} min' if s >= 90 else f'{s:.0f} s'


def md_table(header, rows):
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    return '\n'.join(lines + ['| ' + ' | '.join(map(str, r)) + ' |' for r in rows])
