"""A training run's log.jsonl, read for experiments/compare.py: its settings, curves and timed intervals, the
peak its MFU was measured against and the machine's load, its loss at any x by linear interpolation, and the
runs that differ only by their seed gathered into groups.

    run = read_run('out/flat')                 # LogError (one line naming the file and line) on a bad log
    run.loss_at(1200.0, 'seconds')             # the validation loss at 1,200 training seconds, or None
    groups = group_runs(runs)                  # [[Run, ...], ...]: one list a setting, seeds together

What a run's x is on each axis: step (optimiser steps); tokens (tokens seen, batch_size x n_ctx x grad_accum x
processes a step, each session's own); seconds (training seconds: the logged intervals' ms_per_step,
evaluation left out, interpolated within an interval); flops (tokens x the model's training FLOPs a token)."""

import sys

if __name__ == '__main__':       # not a command, run as a file or with -m: said before any import
    print("run_log.py: error: compare.py's reader of a run's log.jsonl, not a command: python -m "
          "experiments.compare RUN_DIR ...", file=sys.stderr)
    sys.exit(2)

import json
import os
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

AXES = {'step': 'optimiser steps', 'tokens': 'tokens seen', 'seconds': 'training seconds',
        'flops': 'training FLOPs (forward + backward)'}

# The settings that do not change what a run learns: where it writes and logs, how it is watched, which device
# and threads compute it, how often it evaluates and saves. Runs whose settings differ in these and in `seed`
# alone are one group (the seeds of one setting); any other setting, one not named here included, makes
# another group. The data is compared by what it is (Run.data), not by its folder's name; the processes and
# the precision the run resolved (the 'config' record's world_size and dtype) count as settings.
NOT_RESULT = ('seed', 'out_dir', 'data_dir', 'init_from', 'overwrite', 'run_name', 'project', 'log_to',
              'log_interval', 'eval_interval', 'save_checkpoint', 'save_interval', 'device', 'compile',
              'threads', 'ddp_timeout', 'fft_threshold', 'chunk_size')
TOLERANCE = 1e-9                 # relative: an x this close to an evaluation's is at it


class LogError(ValueError):
    """A log that is not a run of train.py (one line naming the file, and the line where there is one)."""


class Interval(NamedTuple):
    """One logged 'train' record's interval: steps a -> b, its training seconds, whether it is its session's
    first (its warm-up), the peak in effect (FLOP/s over all the run's processes, None if the log names none)
    and its name, and the CPU cores other processes kept busy (None: unknown)."""
    a: int
    b: int
    seconds: float
    first: bool
    peak: Optional[float]
    peak_name: Optional[str]
    other_load: Optional[float]


@dataclass
class Run:
    """One run folder's log: its first 'config' record, what identifies its data, its sessions [(start step,
    tokens a step)], each session's settings [(start step, its 'config' record)], the curves train [(step,
    loss)] and evals [(step, val_loss, val_bpb)], the logged intervals [Interval], its summary."""
    path: str
    config: dict
    data: tuple = None
    sessions: list = field(default_factory=list)
    settings: list = field(default_factory=list)
    train: list = field(default_factory=list)
    evals: list = field(default_factory=list)
    intervals: list = field(default_factory=list)
    summary: dict = None

    @property
    def variant(self):
        """The run's variant setting ('?' where the log has none)."""
        return self.config['config'].get('variant', '?')

    @property
    def seed(self):
        """The run's seed setting (None where the log has none)."""
        return self.config['config'].get('seed')

    def tokens(self, step):
        """Tokens seen at `step` (each session's tokens a step from its start)."""
        ends = [s for s, _ in self.sessions[1:]] + [float('inf')]
        return sum(t * max(0, min(step, end) - start) for (start, t), end in zip(self.sessions, ends))

    def seconds(self, step):
        """Training seconds at `step`: the logged intervals' time, interpolated within one, and past the last
        at its rate."""
        done = 0.0
        for iv in self.intervals:
            if step <= iv.a:
                break
            done += iv.seconds * min(1.0, (step - iv.a) / (iv.b - iv.a))
        if self.intervals and step > self.intervals[-1].b:
            last = self.intervals[-1]
            done += last.seconds * (step - last.b) / (last.b - last.a)
        return done

    def x(self, step, axis):
        """The x of `step` on axis 'step', 'tokens', 'seconds' or 'flops'."""
        if axis == 'step':
            return step
        if axis == 'seconds':
            return self.seconds(step)
        return self.tokens(step) * (self.config['flops_per_token'] if axis == 'flops' else 1)

    def curve(self, axis, which=1):
        """The evaluations as points [(x, value)]: which=1 the validation loss, 2 the bits per byte."""
        return [(self.x(e[0], axis), e[which]) for e in self.evals]

    def loss_at(self, x, axis, which=1):
        """The validation loss (which=2: bits per byte) at `x` on `axis`, linear in x between the two
        evaluations around it (value_at); None where the run was not evaluated at or past x."""
        return value_at(self.curve(axis, which), x)

    def last_step(self):
        """The last step the log records."""
        return max([s for s, *_ in self.train + self.evals] + [self.sessions[-1][0]])

    @property
    def finished(self):
        """True when the log ends with train.py's summary (a run resumed after it and stopped has not)."""
        return self.summary is not None and self.summary.get('step', -1) >= self.last_step()

    def steady(self):
        """The measured intervals: the logged ones but each session's first, whose warm-up they leave out (all
        of them if that leaves none)."""
        return [iv for iv in self.intervals if not iv.first] or self.intervals

    def speed(self):
        """-> (tokens/s, training FLOP/s) over the measured intervals, or (None, None) without any."""
        steady = self.steady()
        secs = sum(iv.seconds for iv in steady)
        if not secs:
            return None, None
        tok_s = sum(self.tokens(iv.b) - self.tokens(iv.a) for iv in steady) / secs
        return tok_s, tok_s * self.config['flops_per_token']

    def peaks(self):
        """The peaks the measured intervals were stated against, in order, each once: [(FLOP/s over all the
        run's processes, its name)]; without a measured interval, the log's last."""
        got = [(iv.peak, iv.peak_name) for iv in self.steady() if iv.peak]
        if not got and self.settings:
            rec = self.settings[-1][1]
            if number(rec.get('peak_flops')):
                got = [(rec['peak_flops'] * rec.get('world_size', 1), rec.get('peak'))]
        return list(dict.fromkeys(got))

    def other_load(self):
        """The CPU cores other processes kept busy while the run trained (float): the mean over the measured
        intervals that record it, weighted by their seconds; else the summary's; None when the log records
        neither (a log older than the field)."""
        known = [iv for iv in self.steady() if iv.other_load is not None]
        secs = sum(iv.seconds for iv in known)
        if secs:
            return sum(iv.other_load * iv.seconds for iv in known) / secs
        load = (self.summary or {}).get('other_load')
        return load if number(load) else None


def value_at(points, x):
    """Points [(x, y)] in increasing x -> y at `x`, linear between the two points around it (the first of two
    at one x); None when x lies past the last point or before the first (beyond a relative TOLERANCE)."""
    if not points:
        return None
    eps = TOLERANCE * max(abs(x), abs(points[-1][0]), 1.0)
    if x > points[-1][0] + eps or x < points[0][0] - eps:
        return None
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x0 + eps:
            return y0
        if x < x1 - eps:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


def number(v):
    """True for an int or float (not a bool)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# ----------------------------------------------------------------------------- reading

def read_run(path):
    """The run folder `path` -> Run. Not a folder, no log.jsonl, a damaged line (a torn last one is dropped
    with a warning: loading.read_log), a line that is JSON but not a record (loading.read_log too), a
    record train.py would not write, or no 'config' record: LogError (one line naming the file, and its line).
    """
    from harness.checkpoint import CheckpointError
    from harness.loading import read_log     # imports torch: after the flags are checked
    if not os.path.isdir(path):
        raise LogError(f'{path} is not a folder: give the run folders train.py wrote (its --out_dir)')
    log = os.path.join(path, 'log.jsonl')
    if not os.path.isfile(log):
        raise LogError(f'{path} holds no log.jsonl: not a run folder of train.py')
    try:
        records = read_log(log)
        with open(log, 'rb') as f:            # the line of each record: read_log skips the empty ones
            lines = [i + 1 for i, line in enumerate(f.read().split(b'\n')) if line.strip()]
    except (CheckpointError, OSError) as e:
        raise LogError(str(e)) from None
    configs = [r for r in records if r.get('event') == 'config']
    if not configs or not isinstance(configs[0].get('config'), dict):
        raise LogError(f'{log} has no config record: not the log of train.py')
    run = Run(path, configs[0])
    read_records(run, records, log, lines)
    return run


def read_records(run, records, log, lines):
    """Fill run's sessions, settings, curves, intervals and summary from the log's records (dicts), in their
    order (a session starts at each 'config' and its 'schedule'; the peak in effect is the latest record's
    'peak_flops' and 'peak'). A record train.py would not write: LogError naming `log` and its line
    (lines[i])."""
    from harness.checkpoint import tokens_per_step     # read_run has imported it (and torch) already
    prev, peak, tps, world = None, (None, None), None, 1
    for i, r in enumerate(records):
        kind = r.get('event')
        try:
            if number(r.get('peak_flops')):
                peak = (float(r['peak_flops']), r.get('peak'))
            if kind == 'config':
                c, prev, world = r['config'], None, int(r.get('world_size', 1))
                tps = tokens_per_step({k: int(c[k]) for k in ('batch_size', 'n_ctx', 'grad_accum')}, world)
                run.data = data_identity(r, run.path)
                run.settings.append((None, r))
            elif kind == 'schedule':
                prev = int(r['from_step'])
                if tps is None:
                    raise ValueError('a schedule before any config record')
                run.sessions.append((prev, tps))
                if run.settings and run.settings[-1][0] is None:
                    run.settings[-1] = (prev, run.settings[-1][1])
            elif kind == 'train' and prev is not None:
                step, load = int(r['step']), r.get('other_load')
                if step <= prev:
                    raise ValueError(f'train step {step} after step {prev}')
                if load is not None and not number(load):
                    raise ValueError(f'other_load {load!r} is not a number')
                run.train.append((step, float(r['loss'])))
                seconds = float(r['ms_per_step']) * (step - prev) / 1000
                run.intervals.append(Interval(prev, step, seconds, prev == run.sessions[-1][0],
                                              peak[0] and peak[0] * world, peak[1],
                                              None if load is None else float(load)))
                prev = step
            elif kind == 'eval':
                run.evals.append((int(r['step']), float(r['val_loss']), float(r['val_bpb'])))
            elif kind == 'summary':
                run.summary = r
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
            raise LogError(f'{log}, line {lines[i]}: a record train.py would not write ({type(e).__name__}: '
                           f'{e})') from None
    if not run.sessions:
        raise LogError(f'{log}: a record train.py would not write (no schedule record)')
    by_step = {e[0]: e for e in run.evals}          # a step evaluated twice (a resumed session): its last
    run.evals = sorted(by_step.values())


def data_identity(config_record, path):
    """What a run's losses were measured on -> (task, tokenizer SHA-256, validation tokens, validation bytes),
    from the data's meta.json the config record holds, else from its data_dir's meta.json as it is now (an
    older log); None where neither is there (a note on stderr: the data is not checked)."""
    meta = config_record.get('meta')
    if not isinstance(meta, dict):
        data_dir = config_record['config'].get('data_dir', '')
        try:
            with open(os.path.join(data_dir, 'meta.json')) as f:
                meta = json.load(f)
        except (OSError, ValueError):
            print(f'compare.py: note: {path}: its log records no data and {data_dir}/meta.json cannot be '
                  'read: its data is not checked', file=sys.stderr)
            return None
    val = meta.get('val', {})
    return (config_record['config'].get('task', 'lm'), meta.get('tokenizer_sha256'), val.get('tokens'),
            val.get('bytes'))


def check_same_data(runs):
    """LogError (one line) for runs whose data or task differ: their losses are not comparable."""
    known = [r for r in runs if r.data is not None]
    for b in known[1:]:
        a = known[0]
        if a.data[0] != b.data[0]:
            raise LogError(f'{a.path} is a {a.data[0]} run and {b.path} a {b.data[0]} run: their losses are '
                           'not comparable')
        if a.data != b.data:
            said = lambda d: f'tokenizer {str(d[1])[:12]}..., validation {d[2]} tokens, {d[3]} bytes'  # noqa
            raise LogError(f'runs of different data: {a.path} ({said(a.data)}) and {b.path} '
                           f'({said(b.data)}): their losses are not comparable; compare runs of one data '
                           'folder')


# ----------------------------------------------------------------------------- seeds as groups

def result_settings(run):
    """The settings a run's result depends on: its first 'config' record's settings less NOT_RESULT, with the
    processes and precision it resolved -> {name: value}."""
    c = {k: v for k, v in run.config['config'].items() if k not in NOT_RESULT}
    return {**c, 'world_size': run.config.get('world_size', 1), 'resolved dtype': run.config.get('dtype')}


def group_runs(runs):
    """The runs gathered by result_settings (runs that differ only by seed, or by a setting of NOT_RESULT, are
    one group) -> [[Run, ...], ...], groups and their runs in the order given."""
    groups = {}
    for r in runs:
        groups.setdefault(json.dumps(result_settings(r), sort_keys=True, default=str), []).append(r)
    return list(groups.values())


def differences(groups):
    """For each group, the settings whose values are not the same in every group -> [str], e.g.
    'variant=flat, learning_rate=0.003' ('-' when there is one group, or nothing differs)."""
    settings = [result_settings(g[0]) for g in groups]
    names = sorted({k for s in settings for k in s})
    differ = [k for k in names if len({json.dumps(s.get(k), default=str) for s in settings}) > 1]
    return [', '.join(f'{k}={s.get(k)}' for k in differ) or '-' for s in settings]
