"""Put training runs side by side: their loss curves in one figure and one table, from their log.jsonl alone.

    python -m experiments.compare out/tinystories_cpu out/transformer_cpu       # compare.png, compare.md here
    python -m experiments.compare out/flat out/toeplitz out/transformer --x tokens --out figs/three.png

Each RUN_DIR is a folder train.py wrote (its log.jsonl: a finished run, one still training, or one that
stopped). The figure: the validation loss (nats/token, points at each evaluation) and, lighter, the training
loss of every run against --x, one colour a run, labelled by variant and folder; beside it the validation bits
per byte. The table, printed and written beside the figure (its name with .md): variant, parameters, tokens
seen, final and best validation loss, bits per byte, tokens/s and MFU (the logged intervals after each
session's first, whose warm-up they leave out), wall time (the finished session's), and the validation loss each
run had reached at the smallest common budget on --x: the least of the runs' last evaluated x, each run's last
evaluation at or before it (its own x in brackets when earlier). That column is the fair comparison: equal
steps, tokens, seconds or FLOPs.

--x: step (optimiser steps); tokens (tokens seen, batch_size x n_ctx x grad_accum x world size a step, each
session's own); seconds (training seconds: the logged intervals' ms_per_step, evaluation left out; an
evaluation between two logged steps interpolated); flops (tokens x the model's training FLOPs a token, forward
and backward, flops_per_token).

Runs of different data (another tokenizer or another validation split: the tokenizer's SHA-256 and the
validation tokens and bytes of the meta.json each run's log records, or, for an older log, of its data_dir) or of
different tasks are refused, since their losses are not comparable. A run without an evaluation yet is shown as
such. Bad input (a folder that is not a run, a damaged log line, mixed data, an unknown --x, a figure that exists
without --overwrite): one line, exit 2; no file is written half.
"""

import os
import sys

if __name__ == '__main__':       # run as a file too (python experiments/compare.py): the repository root on
    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the path, as -m puts it
    from harness import cli                   # and from here Ctrl-C is one line
    cli.begin('compare.py', keep=True)

import json
from dataclasses import dataclass, field

from experiments.runner import NO_PLOT, md_table, pyplot, save_figure
from harness.cli import ArgumentParser, check_writable, distinct_files, failing, run_command, write_atomic
from harness.cli import fail as cli_fail

fail = failing('compare.py')            # 'compare.py: error: msg' on stderr, exit 2
AXES = {'step': 'optimiser steps', 'tokens': 'tokens seen', 'seconds': 'training seconds',
        'flops': 'training FLOPs (forward + backward)'}


@dataclass
class Run:
    """One run folder's log, read: its settings (the first 'config' record's), what identifies its data, its
    sessions [(start step, tokens a step)], the curves train [(step, loss)] and evals [(step, val_loss,
    val_bpb)], the logged intervals [(first step, last step, seconds, first of its session)], its summary."""
    path: str
    config: dict
    data: tuple = None
    sessions: list = field(default_factory=list)
    train: list = field(default_factory=list)
    evals: list = field(default_factory=list)
    intervals: list = field(default_factory=list)
    summary: dict = None

    @property
    def label(self):
        """The figure's name of the run: 'variant (folder)'."""
        return f'{self.config["config"].get("variant", "?")} ({self.path})'

    def tokens(self, step):
        """Tokens seen at `step` (each session's tokens a step from its start)."""
        ends = [s for s, _ in self.sessions[1:]] + [float('inf')]
        return sum(t * max(0, min(step, end) - start) for (start, t), end in zip(self.sessions, ends))

    def seconds(self, step):
        """Training seconds at `step`: the logged intervals' time, interpolated within one, and past the last at
        its rate."""
        done = 0.0
        for a, b, sec, _ in self.intervals:
            if step <= a:
                break
            done += sec * min(1.0, (step - a) / (b - a))
        if self.intervals and step > self.intervals[-1][1]:
            a, b, sec, _ = self.intervals[-1]
            done += sec * (step - b) / (b - a)
        return done

    def x(self, step, axis):
        """The x of `step` on axis 'step', 'tokens', 'seconds' or 'flops'."""
        if axis == 'step':
            return step
        if axis == 'seconds':
            return self.seconds(step)
        return self.tokens(step) * (self.config['flops_per_token'] if axis == 'flops' else 1)

    def last_step(self):
        """The last step the log records."""
        return max([s for s, *_ in self.train + self.evals] + [self.sessions[-1][0]])

    @property
    def finished(self):
        """True when the log ends with train.py's summary (a run resumed after it and stopped has not)."""
        return self.summary is not None and self.summary.get('step', -1) >= self.last_step()


def read_run(path):
    """The run folder `path` -> Run. Not a folder, no log.jsonl, a damaged line (a torn last one is dropped with
    a warning: checkpoint.read_log), or no 'config' record: one line, exit 2."""
    from harness.checkpoint import CheckpointError, read_log     # imports torch: after the flags are checked
    if not os.path.isdir(path):
        fail(f'{path} is not a folder: give the run folders train.py wrote (its --out_dir)')
    log = os.path.join(path, 'log.jsonl')
    if not os.path.isfile(log):
        fail(f'{path} holds no log.jsonl: not a run folder of train.py')
    try:
        records = read_log(log)
    except CheckpointError as e:
        fail(str(e))
    configs = [r for r in records if r.get('event') == 'config']
    if not configs or not isinstance(configs[0].get('config'), dict):
        fail(f'{log} has no config record: not the log of train.py')
    run = Run(path, configs[0])
    try:
        read_records(run, records)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        fail(f'{log}: a record train.py would not write ({type(e).__name__}: {e})')
    return run


def read_records(run, records):
    """Fill run's sessions, curves, intervals and summary from the log's records, in their order (a session
    starts at each 'config' and 'schedule'). Raises KeyError / TypeError / ValueError on a malformed record."""
    prev = None
    for r in records:
        kind = r.get('event')
        if kind == 'config':
            c, prev = r['config'], None
            tps = int(c['batch_size']) * int(c['n_ctx']) * int(c['grad_accum']) * int(r.get('world_size', 1))
            run.data = data_identity(r, run.path)
        elif kind == 'schedule':
            prev = int(r['from_step'])
            run.sessions.append((prev, tps))
        elif kind == 'train' and prev is not None:
            step = int(r['step'])
            if step <= prev:
                raise ValueError(f'train step {step} after step {prev}')
            run.train.append((step, float(r['loss'])))
            run.intervals.append((prev, step, float(r['ms_per_step']) * (step - prev) / 1000,
                                  prev == run.sessions[-1][0]))
            prev = step
        elif kind == 'eval':
            run.evals.append((int(r['step']), float(r['val_loss']), float(r['val_bpb'])))
        elif kind == 'summary':
            run.summary = r
    if not run.sessions:
        raise ValueError('no schedule record')


def data_identity(config_record, path):
    """What a run's losses were measured on -> (task, tokenizer SHA-256, validation tokens, validation bytes), from
    the data's meta.json the config record holds, else from its data_dir's meta.json as it is now (an older log);
    None where neither is there (a note on stderr: the data is not checked)."""
    meta = config_record.get('meta')
    if not isinstance(meta, dict):
        data_dir = config_record['config'].get('data_dir', '')
        try:
            with open(os.path.join(data_dir, 'meta.json')) as f:
                meta = json.load(f)
        except (OSError, ValueError):
            print(f'compare.py: note: {path}: its log records no data and {data_dir}/meta.json cannot be read: '
                  'its data is not checked', file=sys.stderr)
            return None
    val = meta.get('val', {})
    return (config_record['config'].get('task', 'lm'), meta.get('tokenizer_sha256'), val.get('tokens'),
            val.get('bytes'))


def check_same_data(runs):
    """Refuse (one line, exit 2) runs whose data or task differ: their losses are not comparable."""
    known = [r for r in runs if r.data is not None]
    for r in known[1:]:
        a, b = known[0], r
        if a.data[0] != b.data[0]:
            fail(f'{a.path} is a {a.data[0]} run and {b.path} a {b.data[0]} run: their losses are not comparable')
        if a.data != b.data:
            said = lambda d: f'tokenizer {str(d[1])[:12]}..., validation {d[2]} tokens, {d[3]} bytes'  # noqa: E731
            fail(f'runs of different data: {a.path} ({said(a.data)}) and {b.path} ({said(b.data)}): their losses '
                 'are not comparable; compare runs of one data folder')


# ----------------------------------------------------------------------------- the table

def fmt_x(x, axis):
    """An x on `axis` as a short string with its unit: '3,400 steps', '6.96M tokens', '9.5 min', '4.90e+13 FLOPs'."""
    if axis == 'step':
        return f'{x:,.0f} steps'
    if axis == 'seconds':
        return f'{x:.0f} s' if x < 120 else f'{x / 60:.1f} min'
    if axis == 'tokens':
        return f'{x / 1e6:.2f}M tokens' if x >= 1e5 else f'{x:,.0f} tokens'
    return f'{x:.2e} FLOPs'


def speed(run):
    """-> (tokens/s, MFU) over the logged intervals but each session's first (all of them if that leaves none;
    None, None without any). MFU against the peak the run's config record names (peak_flops, FLOP/s a process)."""
    steady = [i for i in run.intervals if not i[3]] or run.intervals
    secs = sum(sec for _, _, sec, _ in steady)
    if not secs:
        return None, None
    tok_s = sum(run.tokens(b) - run.tokens(a) for a, b, _, _ in steady) / secs
    c = run.config
    peak = c.get('peak_flops')
    return tok_s, tok_s * c['flops_per_token'] / c.get('world_size', 1) / peak if peak else None


def budget(runs, axis):
    """The smallest common budget: the least, over the runs evaluated, of their last evaluation's x (None when no
    run has one)."""
    ends = [r.x(r.evals[-1][0], axis) for r in runs if r.evals]
    return min(ends) if ends else None


def table(runs, axis):
    """The markdown table of the runs (the module's docstring names the columns)."""
    from harness.machine import fmt_mfu, hms
    B = budget(runs, axis)
    rows = []
    for r in runs:
        tok_s, mfu = speed(r)
        c = r.config
        if r.evals:
            final, state = r.evals[-1], '' if r.finished else f' (step {r.evals[-1][0]}, unfinished)'
            best = min(e[1] for e in r.evals)
            reached = [e for e in r.evals if r.x(e[0], axis) <= B * (1 + 1e-9)]
            at = reached[-1] if reached else None
            at_b = 'none' if at is None else f'{at[1]:.4f}' + (
                f' (at {fmt_x(r.x(at[0], axis), axis)})' if r.x(at[0], axis) < B * (1 - 1e-9) else '')
            cells = [f'{final[1]:.4f}{state}', f'{best:.4f}', f'{final[2]:.4f}']
        else:
            cells, at_b = [f'no eval yet (step {r.last_step()})', '-', '-'], 'no eval yet'
        rows.append([r.path, c['config'].get('variant', '?'), f'{c.get("params", 0) / 1e6:.2f}M',
                     f'{r.tokens(r.last_step()):,}', *cells, '-' if tok_s is None else f'{tok_s:,.0f}',
                     '-' if mfu is None else fmt_mfu(mfu),
                     hms(r.summary['wall_seconds']) if r.finished else 'unfinished', at_b])
    header = ['run', 'variant', 'parameters', 'tokens seen', 'final val loss', 'best val loss', 'bits per byte',
              'tokens/s', 'MFU', 'wall time', 'val loss at ' + ('-' if B is None else fmt_x(B, axis))]
    return md_table(header, rows)


# ----------------------------------------------------------------------------- the figure

def draw(runs, axis, path):
    """The figure: validation loss (points and line) and training loss (lighter) against `axis`, and validation
    bits per byte, one colour a run, the smallest common budget dotted -> save_figure's line, or NO_PLOT."""
    plt = pyplot()
    if plt is None:
        return NO_PLOT
    fig, (ax, ax_bpb) = plt.subplots(1, 2, figsize=(14, 5.5))
    colour = (lambda i: f'C{i}') if len(runs) <= 10 else (lambda i: plt.cm.tab20(i % 20))
    for i, r in enumerate(runs):
        label = r.label + ('' if r.evals else ' (no eval yet)')
        if r.train:
            ax.plot([r.x(s, axis) for s, _ in r.train], [l for _, l in r.train], color=colour(i), alpha=0.3, lw=1,
                    label=None if r.evals else label)
        if r.evals:
            xs = [r.x(s, axis) for s, *_ in r.evals]
            ax.plot(xs, [e[1] for e in r.evals], '-o', color=colour(i), ms=4, label=label)
            ax_bpb.plot(xs, [e[2] for e in r.evals], '-o', color=colour(i), ms=4, label=label)
    B = budget(runs, axis)
    for a in (ax, ax_bpb):
        if B is not None:
            a.axvline(B, color='grey', ls=':', lw=1, label=f'smallest common budget ({fmt_x(B, axis)})')
        a.set_xlabel(AXES[axis])
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    ax.set_ylabel('loss (nats/token)')
    ax.set_title('validation loss (points), training loss (light)')
    ax_bpb.set_ylabel('validation bits per byte')
    ax_bpb.set_title('validation bits per byte')
    return save_figure(fig, path, dpi=100)


# ----------------------------------------------------------------------------- the command

def main(argv=None):
    """Command line entry point (argv: list of str; None: sys.argv): exits (SystemExit) with 0, the table printed
    and written, the figure written; 2, bad input (one line); 1, the figure could not be written (matplotlib
    missing, a failed write: one line, the table printed); 130, Ctrl-C (one line: cli.run_command)."""
    sys.exit(run_command('compare.py', compare, argv))


def compare(argv):
    """main's work: check the flags and the outputs, read every run, refuse mixed data, print and write the
    table, draw the figure."""
    import argparse
    p = ArgumentParser('compare.py', __doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.description = __doc__                                 # --help: the whole docstring, as written
    p.add_argument('runs', nargs='+', metavar='RUN_DIR', help="train.py's out_dir of each run")
    p.add_argument('--x', default='step', choices=list(AXES), help='the x-axis and the budget of the last column')
    p.add_argument('--out', default='compare.png', help='the figure (PNG); the table beside it, its name with .md')
    p.add_argument('--overwrite', action='store_true', help='replace an existing figure and table')
    args = p.parse_args(argv)
    p.check(distinct_files, args.runs, 'RUN_DIR')
    if not args.out.lower().endswith('.png'):
        fail(f'the figure is a PNG: give --out a path ending in .png, got {args.out!r}')
    md = args.out[:-4] + '.md'
    for path, what in ((args.out, 'figure'), (md, 'table')):
        p.check(check_writable, path, args.overwrite, what)
    runs = [read_run(path) for path in args.runs]
    check_same_data(runs)
    text = table(runs, args.x)
    print(text, flush=True)
    try:
        write_atomic(md, text + '\n')
    except OSError as e:
        cli_fail(f'could not write {md} ({e.strerror or e}); the table above is the result', 'compare.py', 1)
    written = draw(runs, args.x, args.out)
    print(written)
    if not written.startswith('plot: '):            # NO_PLOT, or save_figure's 'plot not written: PATH (why)'
        print(f'compare.py: error: {written}; the table above is the result', file=sys.stderr)
        return 1


if __name__ == '__main__':
    main()
