"""The report of experiments/mqar.py (multi-query associative recall, Arora et al. 2023, "Zoology",
arXiv 2312.04927): the accuracy table (kind x T x d_model: the best test accuracy over the learning
rates and that rate), every run, and Zoology's figure 2 redrawn for our kinds (test accuracy against
d_model, a panel per T, a line per kind), each written whole (a temporary file, then os.replace) to
OUT/mqar.md, OUT/results.json and OUT/mqar.png. Every table's heading and every figure's title name
the trainer (trainer(): the warm-up or none), so no number is read without it.
"""

import sys

if __name__ == '__main__':       # not a command, run as a file or with -m: said before any import
    print("mqar_report.py: error: mqar.py's report, not a command: python -m experiments.mqar writes it "
          "(from its cached runs)", file=sys.stderr)
    sys.exit(2)

import json
import os
import platform

import torch

from harness.cli import write_atomic
from experiments.runner import NO_PLOT, fmt_s, md_table, pyplot, save_figure

N_LAYER = 2               # every kind, as Zoology's attention; the best mixer again at deep_layers


def best(runs):
    """{lr: result} -> (best test accuracy, its lr); a failed run counts as 0, a tie goes to the smaller lr."""
    accs = {lr: (r['acc'] if r.get('rc') == 0 else 0.0) for lr, r in runs.items()}
    lr = max(sorted(accs), key=lambda x: accs[x])
    return accs[lr], lr


def row_keys(grid, kinds, deep, s):
    """The table's rows in order: (kind, n_layer) of every kind at N_LAYER, then the deep row."""
    rows = [(k, N_LAYER) for k in kinds]
    if deep:
        rows.append((deep, s['deep_layers']))
    return [r for r in rows if any(key[:2] == r for key in grid)]


def trainer(s, short=False):
    """The trainer of the settings s (its warm-up, s['warmup'], a fraction of the steps; absent or 0: none)
    -> the report's sentence, or (short) the words a table heading or a figure title carries."""
    w = s.get('warmup', 0)
    if short:
        return f'trainer: {100 * w:.3g}% linear warm-up' if w else 'trainer: no warm-up'
    ramp = (f"a linear warm-up, one step at a time, over the first {100 * w:.3g}% of the steps (of the most a "
            "run may take), then Zoology's cosine over 64 epochs, stepped once an epoch (the source: issue 58's "
            "check, where a 10% linear warm-up let the transformer recall at 1e-3, at 1/kv without one; warm-up "
            "is standard for transformers since Vaswani et al. 2017; Zoology's trainer has none)") if w else (
            "no warm-up: Zoology's cosine over 64 epochs, stepped once an epoch, from the first step (Zoology's "
            "trainer)")
    return f'Trainer: AdamW, weight decay {s["weight_decay"]:g} on matrices; {ramp}.'


def label(kind, n_layer):
    """A row's name: the kind, with its layers when they are not N_LAYER."""
    return kind if n_layer == N_LAYER else f'{kind}, {n_layer} layers'


def accuracy_table(grid, rows, s):
    """Markdown: a row per (kind, n_layer), a column per (T, d_model): 'accuracy (lr)'; '-' where a cell
    did not run, 'failed' where every rate failed."""
    cols = [(T, kv, d) for T, kv in s['cells'] for d in s['d_models']]
    body = []
    for kind, L in rows:
        cells = []
        for T, kv, d in cols:
            runs = grid.get((kind, L, T, kv, d))
            if not runs:
                cells.append('-')
            elif all(r.get('rc') != 0 for r in runs.values()):
                cells.append('failed')
            else:
                acc, lr = best(runs)
                cells.append(f'{acc:.3f} ({lr:.2g})')
        body.append([label(kind, L), *cells])
    return md_table(['model', *[f'T={T} kv={kv} d={d}' for T, kv, d in cols]], body)


def runs_table(grid, rows):
    """Markdown: every run (model, T, d_model, lr, test accuracy and loss, epochs, seconds)."""
    body = []
    for kind, L in rows:
        for key in sorted(k for k in grid if k[:2] == (kind, L)):
            for lr, r in sorted(grid[key].items()):
                if r.get('rc') != 0:
                    body.append([label(kind, L), *key[2:], f'{lr:.3g}', 'failed', '', '', '', r.get('line', '')])
                    continue
                note = 'diverged' if r['diverged'] else 'stopped: plateau' if r.get('plateau') else ''
                body.append([label(kind, L), *key[2:], f'{lr:.3g}', f'{r["acc"]:.4f}',
                             'n/a' if r['test_loss'] is None else f'{r["test_loss"]:.3f}',
                             r['epochs'], f'{r["seconds"]:.0f}', note])
    return md_table(['model', 'T', 'kv', 'd_model', 'lr', 'test accuracy', 'test loss (nats)', 'epochs', 'seconds',
                     'note'], body)


def machine_line(s):
    """'Machine: ...' of this run: the device, cores, torch."""
    if s['device'] == 'cuda':
        what = torch.cuda.get_device_name()
    else:
        what = f'{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()})'
    precision = 'float32 (TF32 matmuls)' if s['device'] == 'cuda' else 'float32'
    return (f'Machine: {what}, torch {torch.__version__}, {precision}; {s["workers"]} job(s) at a time, '
            f'{s["threads"]} thread(s) each.')


SOLVED = 0.99        # Zoology's early stop: a cell is solved above it
ABOVE = 0.05         # "above 1/kv": by more than this (a model that recalls some keys, not only guesses a value)


def window_table(grid, rows, s):
    """The learning-rate window (docs/mqar_window.md), one table per (T, kv, d_model): a row per model, a column per
    rate with 'accuracy (epochs)' (failed, diverged and stopped-by-plateau runs said so), then the rates at
    which it solved the cell (above SOLVED) and those at which it recalled at all (above 1/kv + ABOVE), or
    'at 1/kv over the whole window' -> markdown."""
    out = []
    for T, kv in s['cells']:
        for d in s['d_models']:
            body = []
            for kind, L in rows:
                runs = grid.get((kind, L, T, kv, d), {})
                if not runs:
                    continue
                cells = []
                for lr in s['lrs']:
                    r = runs.get(lr)
                    cells.append('-' if r is None else 'failed' if r.get('rc') != 0 else
                                 f'{r["acc"]:.3f} ({r["epochs"]}{", diverged" if r["diverged"] else ""})')
                ok = {lr: r['acc'] for lr, r in runs.items() if r.get('rc') == 0}
                solved = [f'{lr:.2g}' for lr in sorted(ok) if ok[lr] > SOLVED]
                above = [f'{lr:.2g}' for lr in sorted(ok) if ok[lr] > 1 / kv + ABOVE]
                body.append([label(kind, L), *cells, ', '.join(solved) or 'none',
                             ', '.join(above) or ('none: at 1/kv over the whole window' if len(ok) == len(s['lrs'])
                                                  else f'none at the {len(ok)} rates run')])
            out += [f'T = {T}, kv = {kv}, d_model {d}: test accuracy (epochs run) at each learning rate '
                    f'({trainer(s, short=True)})', '',
                    md_table(['model', *[f'{lr:.2g}' for lr in s['lrs']], f'solved (> {SOLVED})',
                              f'recalls (> 1/kv + {ABOVE})'], body), '']
    return '\n'.join(out)


def report_text(s, kinds, grid, deep, command, wall_s, cached, total, no_deep=None):
    """The report (markdown); `no_deep`: why there is no deep row, when `deep` is None (default: the
    reasons there may be, --deep_layers 0 or no masked mixer in --kinds)."""
    rows = row_keys(grid, kinds, deep, s)
    cells = ', '.join(f'(T={T}, kv={kv}, batch {s["batch"][T]})' for T, kv in s['cells'])
    heads = s['attention_heads'] or "their variants'"
    job_s = sum(r['seconds'] for runs in grid.values() for r in runs.values() if r.get('rc') == 0)
    return '\n'.join([
        f'# Multi-query associative recall: the {s["protocol"]} protocol', '',
        f'Command: `{command}`', '',
        f'Wall time of this invocation: {fmt_s(wall_s)} ({cached} of {total} runs were cached from an earlier one); '
        f'the runs trained for {fmt_s(job_s)} in all, about {fmt_s(job_s / s["workers"])} on {s["workers"]} '
        'worker(s).',
        machine_line(s), '',
        f'Settings: vocabulary {s["vocab_size"]} (keys 1..{s["vocab_size"] // 2 - 1}, values '
        f'{s["vocab_size"] // 2}..{s["vocab_size"] - 1}); {cells}; d_model {", ".join(map(str, s["d_models"]))}; '
        f'learning rates {", ".join(f"{x:.3g}" for x in s["lrs"])}; {s["n_train"]} training and {s["n_test"]} test '
        f'sequences a cell; at most {s["epochs"]} epochs, stopped once the test accuracy is above 0.99; '
        f'attention kinds with {heads} head(s); seed {s["seed"]}.', '',
        trainer(s), '',
        f'## Test accuracy (the best over the learning rates; that rate in brackets; {trainer(s, short=True)})', '',
        accuracy_table(grid, rows, s), '',
        'Chance: ' + ', '.join(f'T={T}: {1 / (s["vocab_size"] // 2):.3f} for a blind guess among the values, '
                               f'{1 / kv:.3f} for one of the sequence\'s {kv} values not bound to its key'
                               for T, kv in s['cells']) + '.', '',
        (f'Deep row: the masked mixer with the best mean accuracy at {N_LAYER} layers, {deep}, at '
         f'{s["deep_layers"]} layers.' if deep else
         f'Deep row: none ({no_deep or "--deep_layers 0, or no masked mixer in --kinds"}).'),
        '',
        *([f'## The learning-rate window ({trainer(s, short=True)})', '', window_table(grid, rows, s)]
          if len(s['lrs']) >= 3 else []),
        f'## Every run ({trainer(s, short=True)})', '',
        runs_table(grid, rows), ''])


def panels(cells, xlabel, title, path, width, xaxis):
    """A figure of MQAR test accuracy, panels side by side: cells [(panel title, lines [(label, n_layer, colour
    index, points [(x, accuracy)])], dotted levels [(y, line style)])], a line of the deep row dashed, each
    panel's x axis set by xaxis(ax) -> a line saying where, or why not (matplotlib missing)."""
    plt = pyplot()
    if plt is None:
        return NO_PLOT
    fig, axes = plt.subplots(1, len(cells), figsize=(width * len(cells) + 2.5, 4.2), squeeze=False)
    colors = plt.get_cmap('tab20')
    for ax, (name, lines, levels) in zip(axes[0], cells):
        for text, L, k, pts in lines:           # 10 colours twice, the second time paler, each its marker
            if pts:
                ax.plot(*zip(*pts), '--' if L != N_LAYER else '-', marker='osD^v<>ph*'[k % 10], ms=4, lw=1.4,
                        color=colors(2 * (k % 10) + (k // 10) % 2), label=text)
        for y, style in levels:
            ax.axhline(y, color='grey', ls=style, lw=1)
        xaxis(ax)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel(xlabel)
        ax.set_title(name)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel('MQAR test accuracy')
    axes[0][-1].legend(fontsize=7, loc='center left', bbox_to_anchor=(1.02, 0.5))
    fig.suptitle(title, fontsize=10, wrap=True)           # wrapped at the figure's edges, never cut off
    return save_figure(fig, path, dpi=100)


def plot(grid, kinds, deep, s, path):
    """Zoology's figure 2 for our kinds: test accuracy (best over the rates) against d_model, a panel per
    (T, kv), a line per kind (the deep row dashed), the two chance levels dotted -> a line saying where,
    or why not (matplotlib missing)."""
    rows = row_keys(grid, kinds, deep, s)

    def xaxis(ax):
        ax.set_xscale('log', base=2)
        ax.set_xticks(s['d_models'], [str(d) for d in s['d_models']])
    return panels([(f'T = {T}, kv = {kv}',
                    [(label(k, L), L, kinds.index(k), [(d, best(grid[(k, L, T, kv, d)])[0]) for d in s['d_models']
                                                       if (k, L, T, kv, d) in grid]) for k, L in rows],
                    [(1 / kv, ':'), (1 / (s['vocab_size'] // 2), (0, (1, 4)))]) for T, kv in s['cells']],
                  'd_model', f'MQAR, {s["protocol"]} protocol (vocabulary {s["vocab_size"]}, {trainer(s, short=True)}; '
                  'dotted: 1/kv and chance)',
                  path, 4.2, xaxis)


def plot_window(grid, kinds, deep, s, path):
    """The learning-rate window: test accuracy against the learning rate (log axis), a panel per (T, kv,
    d_model), a line per model (failed runs left out, a diverged run at its 0), 1/kv and SOLVED dotted ->
    a line saying where, or why not (matplotlib missing)."""
    rows = row_keys(grid, kinds, deep, s)
    return panels([(f'T = {T}, kv = {kv}, d_model {d}',
                    [(label(k, L), L, i, sorted((lr, r['acc']) for lr, r in grid.get((k, L, T, kv, d), {}).items()
                                                if r.get('rc') == 0)) for i, (k, L) in enumerate(rows)],
                    [(1 / kv, ':'), (SOLVED, (0, (1, 4)))]) for T, kv in s['cells'] for d in s['d_models']],
                  'peak learning rate', f'MQAR learning-rate window ({s["protocol"]} protocol, vocabulary '
                  f'{s["vocab_size"]}, at most {s["epochs"]} epochs of {s["n_train"]}, {trainer(s, short=True)}; '
                  f'dotted: 1/kv and {SOLVED})',
                  path, 5.5, lambda ax: ax.set_xscale('log'))


def write(out, s, kinds, grid, deep, command, wall_s, cached, total, no_deep=None):
    """Write OUT/mqar.md (printed too), OUT/results.json and OUT/mqar.png (report_text: `no_deep` says why
    there is no deep row) -> notes (lines to show)."""
    text = report_text(s, kinds, grid, deep, command, wall_s, cached, total, no_deep)
    print(text)
    runs = [{'kind': k, 'n_layer': L, 'T': T, 'kv': kv, 'd_model': d, 'lr': lr, **{x: r.get(x) for x in (
        'rc', 'acc', 'test_loss', 'epochs', 'steps', 'seconds', 'diverged', 'plateau', 'params', 'curve', 'line')}}
            for (k, L, T, kv, d), by_lr in grid.items() for lr, r in by_lr.items()]
    settings = {**s, 'batch': {str(T): b for T, b in s['batch'].items()}}
    for name, content in (('mqar.md', text),
                          ('results.json', json.dumps({'command': command, 'wall_s': wall_s, 'settings': settings,
                                                       'deep': deep, 'runs': runs}, indent=1))):
        write_atomic(os.path.join(out, name), content)
    notes = [plot(grid, kinds, deep, s, os.path.join(out, 'mqar.png'))]
    if len(s['lrs']) >= 3:
        notes.append(plot_window(grid, kinds, deep, s, os.path.join(out, 'mqar_lr.png')))
    return notes + [f'report: {os.path.join(out, "mqar.md")}']
