"""Put training runs side by side: their loss curves in one figure and one table, from their log.jsonl alone.

    python -m experiments.compare out/tinystories_cpu out/transformer_cpu       # compare.png, compare.md here
    python -m experiments.compare out/flat_s1 out/flat_s2 out/tf_s1 out/tf_s2 --x seconds --logy --out a.svg
    python -m experiments.compare --to tensorboard out/tinystories_cpu     # its log.jsonl to TensorBoard

Each RUN_DIR is a folder train.py wrote (its log.jsonl: a finished run, one still training, or one that
stopped). The figure: the validation loss (nats/token, points at each evaluation) and, lighter, the training
loss (a trailing mean over --smooth logged points) against --x, one colour a setting; beside it the validation
bits per byte. Its format is --out's extension: png, svg or pdf.

The common budget: --budget, else the smallest one every evaluated run reached (the least of their last
evaluations' x). Each run's validation loss there, and at 25, 50 and 75% of it, is read off its evaluations,
linear in --x between the two around it (the column's header says so); a run never evaluated at or past a
point is marked 'not reached'. Those columns are the fair comparison: equal steps, tokens, seconds or FLOPs.

The table, printed and written beside the figure (its name with .md), a row a run: variant, seed, parameters,
tokens seen, final and best validation loss, bits per byte, tokens/s (the logged intervals after each
session's first, whose warm-up they leave out), the peak each run's MFU was stated against and the MFU of
every run against one peak (--peak, else the first run's), the CPU cores other processes kept busy while it
trained ('other load', logged by train.py; 'unknown' in an older log), wall time, and the budget's columns. On
the seconds axis, runs whose loads differ by more than LOAD_GAP cores are named in one warning: their seconds
are not comparable.

Seeds: runs whose settings differ only by seed (and by the settings that do not change what a run learns:
run_log.NOT_RESULT, where it writes and logs, its device and threads, how often it evaluates and saves) are
one group: the figure draws the group's mean with a band from its lowest to its highest run, and a second
table gives each group's mean +- half the range and its n.

--x: step (optimiser steps); tokens (tokens seen, batch_size x n_ctx x grad_accum x world size a step, each
session's own); seconds (training seconds: the logged intervals' ms_per_step, evaluation left out); flops
(tokens x the model's training FLOPs a token, forward and backward, flops_per_token).

--to tensorboard: no figure; each run's log.jsonl is written as the TensorBoard events train.py's
--log_to=tensorboard would have written (RUN_DIR/tensorboard/step and .../tokens), for a run trained without
it.

Runs of different data (another tokenizer or validation split) or tasks are refused: their losses are not
comparable. Bad input (a folder that is not a run, a damaged log line or one that is not a record, mixed data,
an existing output without --overwrite): one line naming it (the file and line for a log), exit 2; nothing
written half.
"""

import os
import sys

if __name__ == '__main__':       # run as a file too (python experiments/compare.py): the repository root on
    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # on the path, as -m
    from harness import cli                   # and from here Ctrl-C is one line
    cli.begin('compare.py', keep=True)

import argparse
import math
from types import SimpleNamespace

from experiments.run_log import AXES, LogError, check_same_data, differences, group_runs, read_run, value_at
from experiments.runner import NO_PLOT, md_table, mean_range, pyplot, save_figure
from harness.cli import failing, run_command, write_atomic, written
from harness.flags import ArgumentParser, DocHelpFormatter, check_folder_writable, check_writable, distinct_files, number
from harness.cli import fail as cli_fail

fail = failing('compare.py')            # 'compare.py: error: msg' on stderr, exit 2
FORMATS = ('png', 'svg', 'pdf')
POINTS = (0.25, 0.5, 0.75, 1.0)         # the fractions of the budget the table reads each run's loss at
LOAD_GAP = 0.5                          # cores: runs whose other load differs more: their seconds differ


# ----------------------------------------------------------------------------- numbers as text

def fmt_x(x, axis):
    """An x on `axis` as a short string with its unit: '3,400 steps', '6.96M tokens', '9.5 min', '4.90e+13
    FLOPs'."""
    if axis == 'step':
        return f'{x:,.0f} steps'
    if axis == 'seconds':
        return f'{x:.0f} s' if x < 120 else f'{x / 60:.1f} min'
    if axis == 'tokens':
        return f'{x / 1e6:.2f}M tokens' if x >= 1e5 else f'{x:,.0f} tokens'
    return f'{x:.2e} FLOPs'


def fmt_flops(f):
    """FLOP/s as '300 GFLOP/s' or '989.0 TFLOP/s'."""
    return f'{f / 1e9:,.0f} GFLOP/s' if f < 1e12 else f'{f / 1e12:,.1f} TFLOP/s'


def fmt_peaks(run):
    """The peaks a run's MFU was stated against: '300 GFLOP/s measured', '2 x 79 GFLOP/s measured', ..."""
    world = run.config.get('world_size', 1)
    kind = lambda name: next((f' {w}' for w in ('measured', 'nominal') if w in (name or '')), '')  # noqa
    said = [(f'{world} x {fmt_flops(p / world)}' if world > 1 else fmt_flops(p)) + kind(name)
            for p, name in run.peaks()]
    return ', '.join(said) or 'none stated'


def loss_cell(run, x, axis):
    """The cell of a run's validation loss at x: '2.8784', 'no eval yet', or 'not reached (last eval at X)'.
    """
    if not run.evals:
        return 'no eval yet'
    v = run.loss_at(x, axis)
    if v is not None:
        return f'{v:.4f}'
    first, last = run.x(run.evals[0][0], axis), run.x(run.evals[-1][0], axis)
    if x > last:
        return f'not reached (last eval at {fmt_x(last, axis)})'
    return f'before its first eval ({fmt_x(first, axis)})'


# ----------------------------------------------------------------------------- the tables

def budget(runs, axis):
    """The smallest common budget: the least, over the runs evaluated, of their last evaluation's x (None when
    no run has one)."""
    ends = [r.x(r.evals[-1][0], axis) for r in runs if r.evals]
    return min(ends) if ends else None


def common_peak(runs, peak):
    """The one peak every MFU is computed against -> (FLOP/s over all a run's processes, what it is): --peak
    when given, else the first run's that states one (the latest peak before its measured intervals); (None,
    why) when none does."""
    if peak:
        return peak, f'--peak {fmt_flops(peak)}'
    for r in runs:
        if r.peaks():
            p, name = r.peaks()[-1]
            world = r.config.get('world_size', 1)
            said = f"{r.path}'s: {name or fmt_flops(p / world)}"
            return p, said + (f' x {world} processes' if world > 1 else '')
    return None, 'no run states its peak'


def point_headers(B, axis):
    """The headers of the budget's columns (25, 50, 75 and 100% of B)."""
    if B is None:
        return [f'val loss at {int(100 * f)}% of the budget' for f in POINTS]
    return [f'val loss at {fmt_x(f * B, axis)} ({int(100 * f)}%)' for f in POINTS[:-1]] + \
        [f'val loss at {fmt_x(B, axis)} (linear in {AXES[axis]})']


def run_table(runs, axis, B, peak):
    """The markdown table, a row a run (the module's docstring names the columns)."""
    from harness.machine import fmt_mfu, hms
    rows = []
    for r in runs:
        tok_s, flops = r.speed()
        c, load = r.config, r.other_load()
        if r.evals:
            final, state = r.evals[-1], '' if r.finished else f' (step {r.evals[-1][0]}, unfinished)'
            cells = [f'{final[1]:.4f}{state}', f'{min(e[1] for e in r.evals):.4f}', f'{final[2]:.4f}']
        else:
            cells = [f'no eval yet (step {r.last_step()})', '-', '-']
        points = [loss_cell(r, f * B, axis) if B is not None else 'no eval yet' for f in POINTS]
        rows.append([r.path, r.variant, r.seed, f'{c.get("params", 0) / 1e6:.2f}M',
                     f'{r.tokens(r.last_step()):,}', *cells, '-' if tok_s is None else f'{tok_s:,.0f}',
                     fmt_peaks(r), fmt_mfu(flops / peak) if flops and peak else 'n/a',
                     'unknown' if load is None else f'{load:.1f}',
                     hms(r.summary['wall_seconds']) if r.finished else 'unfinished', *points])
    header = ['run', 'variant', 'seed', 'parameters', 'tokens seen', 'final val loss', 'best val loss',
              'bits per byte', 'tokens/s', 'peak stated', f'MFU of {fmt_flops(peak) if peak else "-"}',
              'other load (cores)', 'wall time', *point_headers(B, axis)]
    return md_table(header, rows)


def group_table(groups, axis, B, peak):
    """The markdown table of the groups of more than one run (seeds): a row a group, each number the mean +-
    half the range over its runs (of those that have it: '(k of n)' when not all do)."""
    percent = lambda v: f'{100 * v:.1f}%'          # noqa: E731

    def cell(values, digits, n):
        got = [v for v in values if v is not None]
        text = mean_range(got, digits, digits, bad='-')
        return text + (f' ({len(got)} of {n})' if got and len(got) < n else '')
    rows = []
    for g, differ in zip(groups, differences(groups)):
        n, speed = len(g), [r.speed() for r in g]
        final = [r.evals[-1][1] if r.evals else None for r in g]
        best = [min(e[1] for e in r.evals) if r.evals else None for r in g]
        points = [cell([None if B is None else r.loss_at(f * B, axis) for r in g], '.4f', n) for f in POINTS]
        rows.append([g[0].path + (f' +{n - 1}' if n > 1 else ''), g[0].variant, differ, n,
                     ', '.join(str(r.seed) for r in g), cell(final, '.4f', n), cell(best, '.4f', n),
                     cell([s[0] for s in speed], ',.0f', n),
                     cell([s[1] / peak if s[1] and peak else None for s in speed], percent, n),
                     cell([r.other_load() for r in g], '.1f', n), *points])
    header = ['group', 'variant', 'settings that differ', 'n', 'seeds', 'final val loss', 'best val loss',
              'tokens/s', f'MFU of {fmt_flops(peak) if peak else "-"}', 'other load (cores)',
              *point_headers(B, axis)]
    return md_table(header, rows)


def report(runs, groups, axis, B, peak, peak_source):
    """The printed and written text: the runs' table, the groups' (when a group holds more than one run) and
    what their columns mean."""
    text = [run_table(runs, axis, B, peak)]
    if any(len(g) > 1 for g in groups):
        text += ['', f'Runs that differ only by seed, as {len(groups)} groups (mean +- half the range over '
                     'the n runs of each):', '', group_table(groups, axis, B, peak)]
    text += ['', f'- val loss at X: each run\'s validation loss at X {AXES[axis]}, linear in {AXES[axis]} '
                 'between the two evaluations around X; not reached: never evaluated at or past X.',
             f'- MFU: each run\'s training FLOP/s (tokens/s x FLOPs a token) over one peak, {peak_source}; '
             'peak stated: the peak its own log measured against.',
             '- other load: the CPU cores other processes kept busy while the run trained (the mean over its '
             'measured intervals); unknown: its log does not record it.']
    return '\n'.join(text)


def load_warning(runs, axis):
    """One line naming the runs measured under loads more than LOAD_GAP cores apart on the seconds axis, or
    None."""
    known = [(r, r.other_load()) for r in runs if r.other_load() is not None]
    if axis != 'seconds' or len(known) < 2 or max(l for _, l in known) - min(l for _, l in known) <= LOAD_GAP:
        return None
    said = ', '.join(f'{r.path} {l:.1f}' for r, l in known)
    return (f'compare.py: warning: on the seconds axis these runs trained under loads more than {LOAD_GAP} '
            f'cores apart (other processes\' busy cores: {said}): their seconds are not comparable')


# ----------------------------------------------------------------------------- the figure

def smoothed(points, k):
    """Points [(x, y)] with each y the mean of its own and the k - 1 before it (k 1: as they are)."""
    ys = [y for _, y in points]
    window = lambda i: ys[max(0, i - k + 1):i + 1]          # noqa: E731
    return [(x, sum(window(i)) / len(window(i))) for i, (x, _) in enumerate(points)]


def band(curves):
    """Curves [[(x, y)]] of one group -> (xs, mean, lowest, highest) on the union of their x's that every
    curve covers, each curve read there by value_at (linear between its points)."""
    lo, hi = max(c[0][0] for c in curves), min(c[-1][0] for c in curves)
    xs = sorted({x for c in curves for x, _ in c if lo <= x <= hi})
    ys = [[value_at(c, x) for c in curves] for x in xs]
    return xs, [sum(y) / len(y) for y in ys], [min(y) for y in ys], [max(y) for y in ys]


def draw(groups, axis, B, path, args):
    """The figure (the module's docstring says what it shows), by the flags logy, ylim (the loss axis; the
    bits per byte axis at the same place), smooth, dpi and --out's format -> save_figure's line, or NO_PLOT.
    """
    plt = pyplot()
    if plt is None:
        return NO_PLOT
    fig, (ax, ax_bpb) = plt.subplots(1, 2, figsize=(14, 5.5))
    colour = (lambda i: f'C{i}') if len(groups) <= 10 else (lambda i: plt.cm.tab20(i % 20))
    for i, g in enumerate(groups):
        col, n = colour(i), len(g)
        label = f'{g[0].variant} ({g[0].path}' + (f' +{n - 1}): mean of {n} runs, band lowest-highest'
                                                  if n > 1 else ')')
        evaluated = [r for r in g if r.evals]
        trains = [smoothed([(r.x(s, axis), l) for s, l in r.train], args.smooth) for r in g if r.train]
        if trains:                              # one curve: its own points
            ax.plot(*band(trains)[:2], color=col, alpha=0.3, lw=1,
                    label=None if evaluated else label + ' (no eval yet)')
        for a, which in ((ax, 1), (ax_bpb, 2)):
            if evaluated:
                xs, mean, low, high = band([r.curve(axis, which) for r in evaluated])
                a.plot(xs, mean, '-o', color=col, ms=4, label=label)
                if len(evaluated) > 1:
                    a.fill_between(xs, low, high, color=col, alpha=0.2, lw=0)
    for a in (ax, ax_bpb):
        if B is not None:
            a.axvline(B, color='grey', ls=':', lw=1, label=f'common budget ({fmt_x(B, axis)})')
        if args.logy:                   # losses read as plain numbers (3, 2.5), not powers of ten
            a.set_yscale('log')
            from matplotlib.ticker import FormatStrFormatter
            a.yaxis.set_major_formatter(FormatStrFormatter('%g'))
            a.yaxis.set_minor_formatter(FormatStrFormatter('%g'))
        a.set_xlabel(AXES[axis])
        a.grid(alpha=0.3, which='both' if args.logy else 'major')
        a.legend(fontsize=8)
    if args.ylim:
        ax.set_ylim(*args.ylim)
        ratios = [e[2] / e[1] for g in groups for r in g for e in r.evals if e[1] > 0]
        if ratios:                              # one data: bits per byte is the loss times one constant
            ax_bpb.set_ylim(*(v * sum(ratios) / len(ratios) for v in args.ylim))
    ax.set_ylabel('loss (nats/token)')
    ax.set_title('validation loss (points), training loss (light' +
                 (f', mean of {args.smooth} logged points)' if args.smooth > 1 else ')'))
    ax_bpb.set_ylabel('validation bits per byte')
    ax_bpb.set_title('validation bits per byte')
    return save_figure(fig, path, dpi=args.dpi, format=os.path.splitext(path)[1][1:].lower())


# ----------------------------------------------------------------------------- to TensorBoard

def to_tensorboard(run):
    """Write a run's log.jsonl as the events train.py's --log_to=tensorboard writes (harness/trackers.py's
    TensorBoard: RUN/tensorboard/step and RUN/tensorboard/tokens, the settings as a text, each record's
    metrics_of at its step and at the tokens seen then), whole or not at all (cli.written: an existing folder
    is replaced only when the block ends) -> the folder written. OSError from the write."""
    from harness.loading import read_log
    from harness.trackers import TensorBoard, metrics_of, quiet
    target = os.path.join(run.path, 'tensorboard')
    with written(target) as tmp:
        with quiet():                           # its line names the temporary folder: ours names the folder
            tb = TensorBoard({'out_dir': tmp}, None, {}, SimpleNamespace(history=[]))
        try:
            for start, rec in run.settings:
                extra = {k: v for k, v in rec.items() if k not in ('event', 'config')}
                tb.settings({**rec['config'], **extra}, start or 0)   # as Trackers.log sends a 'config' record
            for rec in read_log(os.path.join(run.path, 'log.jsonl')):
                metrics, step = metrics_of(rec), rec.get('step')
                if metrics and isinstance(step, int):
                    tokens = rec.get('tokens', rec.get('tokens_seen'))      # a log before train.py kept them: none
                    tb.record(metrics, step, tokens if isinstance(tokens, int) else run.tokens(step))
        finally:
            tb.close()
        for axis in ('step', 'tokens'):         # TensorBoard writes under OUT_DIR/tensorboard: up one folder
            os.rename(os.path.join(tmp, 'tensorboard', axis), os.path.join(tmp, axis))
        os.rmdir(os.path.join(tmp, 'tensorboard'))
    return target


# ----------------------------------------------------------------------------- the command

def main(argv=None):
    """Command line entry point (argv: list of str; None: sys.argv): exits (SystemExit) with 0, the table
    printed and written, the figure written (--to: the events written); 2, bad input (one line); 1, the figure
    or the events could not be written (matplotlib missing, a failed write: one line, the table printed); 130,
    Ctrl-C (one line: cli.run_command)."""
    sys.exit(run_command('compare.py', compare, argv))


def limits(text):
    """An argparse type: 'LO,HI', two finite numbers, LO < HI -> (LO, HI)."""
    try:
        lo, hi = (float(v) for v in text.split(','))
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected LO,HI (two numbers, e.g. 3.5,5), got {text!r}') from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise argparse.ArgumentTypeError(f'expected LO,HI with LO < HI, both finite, got {text!r}')
    return lo, hi


def parse(argv):
    """compare's flags -> argparse namespace; bad ones, and outputs that cannot be written: one line, exit 2.
    """
    p = ArgumentParser('compare.py', __doc__, formatter_class=DocHelpFormatter)
    p.description = __doc__                                 # --help: the whole docstring, as written
    p.add_argument('runs', nargs='+', metavar='RUN_DIR', help="train.py's out_dir of each run")
    p.add_argument('--x', default='step', choices=list(AXES), help='the x-axis and the budget of the table')
    p.add_argument('--budget', type=number(float, 0, above=True), default=None,
                   help="the common budget in --x's unit (steps, tokens, seconds, FLOPs); None: the "
                        'smallest that every evaluated run reached')
    p.add_argument('--out', default='compare.png', help='the figure: .png, .svg or .pdf; the table beside it, '
                                                        'its name with .md')
    p.add_argument('--overwrite', action='store_true', help='replace an existing figure and table (--to: the '
                                                             'events)')
    p.add_argument('--logy', action='store_true', help='a logarithmic loss axis')
    p.add_argument('--ylim', type=limits, metavar='LO,HI', help='the loss axis from LO to HI (nats/token)')
    p.add_argument('--smooth', type=number(int, 1), default=1,
                   help='the training curve as the trailing mean of this many logged points')
    p.add_argument('--dpi', type=number(int, 10, high=1200), default=100, help="the figure's dots per inch")
    p.add_argument('--peak', type=number(float, 0, above=True), default=None,
                   help="the peak FLOP/s (over all of a run's processes) every MFU is computed against; "
                        "None: the first run's")
    p.add_argument('--to', choices=['tensorboard'], help="no figure: write each run's log.jsonl as "
                                                         'TensorBoard events in RUN_DIR/tensorboard')
    args = p.parse_args(argv)
    p.check(distinct_files, args.runs, 'RUN_DIR')
    if args.to:
        if 'out' in p.given:
            fail('--to tensorboard writes events in each RUN_DIR, no figure: drop --out')
        for path in args.runs:
            target = os.path.join(path, 'tensorboard')
            if os.path.lexists(target) and not args.overwrite:
                fail(f'{target} exists (a run trained with --log_to=tensorboard, or sent before); remove it, '
                     'or pass --overwrite to replace it')
            if os.path.isdir(path):
                p.check(check_folder_writable, path, 'run folder')
        return args
    ext = os.path.splitext(args.out)[1][1:].lower()
    if ext not in FORMATS:
        fail(f'the figure is a {", ".join(FORMATS[:-1])} or {FORMATS[-1]} file: give --out a path ending in '
             f'one, got {args.out!r}')
    if args.logy and args.ylim and args.ylim[0] <= 0:
        fail(f'--ylim {args.ylim[0]:g},{args.ylim[1]:g} with --logy: a logarithmic axis starts above 0')
    args.md = os.path.splitext(args.out)[0] + '.md'
    for path, what in ((args.out, 'figure'), (args.md, 'table')):
        p.check(check_writable, path, args.overwrite, what)
    return args


def compare(argv):
    """main's work: check the flags and the outputs, read every run, refuse mixed data, then print and write
    the tables and draw the figure (or, --to, write the events)."""
    args = parse(argv)
    try:
        runs = [read_run(path) for path in args.runs]
        check_same_data(runs)
    except LogError as e:
        fail(str(e))
    if args.to:
        for r in runs:
            try:
                target = to_tensorboard(r)
            except OSError as e:
                where = os.path.join(r.path, 'tensorboard')
                cli_fail(f'could not write {where} ({e.strerror or e}); nothing of it was written',
                         'compare.py', 1)
            print(f'tensorboard: {target} (tensorboard --logdir {r.path})', flush=True)
        return
    groups = group_runs(runs)
    B = args.budget or budget(runs, args.x)
    peak, source = common_peak(runs, args.peak)
    text = report(runs, groups, args.x, B, peak, source)
    print(text, flush=True)
    warning = load_warning(runs, args.x)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    try:
        write_atomic(args.md, text + '\n')
    except OSError as e:
        cli_fail(f'could not write {args.md} ({e.strerror or e}); the table above is the result',
                 'compare.py', 1)
    written_line = draw(groups, args.x, B, args.out, args)
    print(written_line)
    if not written_line.startswith('plot: '):       # NO_PLOT, or save_figure's 'plot not written: PATH (why)'
        print(f'compare.py: error: {written_line}; the table above is the result', file=sys.stderr)
        return 1


if __name__ == '__main__':
    main()
