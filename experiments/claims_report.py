"""The report of experiments/claims.py: the compared models, and everything that turns
finished runs into the claims table, its rows, the runs and budget tables, the plots and
OUT/claims.md. Losses are validation losses in nats/token unless named (bits per byte:
the runs table's bits/byte column).

claims.py trains and measures; it imports this module (never the other way round), so
the model tables below are here, where both read them.
"""

import sys

if __name__ == '__main__':       # not a command, run as a file or with -m: said before any import
    print("claims_report.py: error: claims.py's report, not a command: python -m experiments.claims "
          "writes it (from its cached runs)", file=sys.stderr)
    sys.exit(2)

import math
import os

import numpy as np

from harness.cli import write_atomic
from experiments.runner import NO_PLOT, md_table, mean_range, pyplot, save_figure

# name -> (train.py arguments, family). Families decide the "best of" row.
MODELS = {
    'flat': (['--variant=flat'], 'mixer'),
    'transformer': (['--variant=transformer'], 'transformer'),
    'gpt': (['--variant=gpt'], 'transformer'),
    'expanded': (['--variant=expanded'], 'mixer'),
    'flat_nonorm': (['--variant=flat', '--norm=False'], 'mixer'),
    'transformer_nonorm': (['--variant=transformer', '--norm=False'], 'transformer'),
    'posenc': (['--variant=posenc'], 'mixer'),
    'toeplitz': (['--variant=toeplitz'], 'mixer'),
    'multihead2': (['--variant=multihead', '--n_head=2'], 'mixer'),
    'multihead4': (['--variant=multihead', '--n_head=4'], 'mixer'),
    'kernel4': (['--variant=kernel', '--feature_kernel=4'], 'mixer'),
    'kernel4_embed': (['--variant=kernel', '--feature_kernel=4', '--embed_proj=True'], 'mixer'),
    'hybrid': (['--variant=hybrid'], 'hybrid'),
    'hybrid_parallel': (['--variant=hybrid_parallel'], 'hybrid'),
    'recurrent': (['--variant=recurrent'], 'mixer'),
    'linear_mixer': (['--variant=linear_mixer'], 'mixer'),
    'flat_muon': (['--variant=flat', '--optimizer=muon'], 'mixer'),
    'transformer_muon': (['--variant=transformer', '--optimizer=muon'], 'transformer'),
    'transformer_h1': (['--variant=transformer', '--n_head=1'], 'transformer'),
    'transformer_h16': (['--variant=transformer', '--n_head=16'], 'transformer'),
    'flat_d64': (['--variant=flat', '--d_model=64'], 'width'),        # 'width': not in the best-of row
    'flat_d256': (['--variant=flat', '--d_model=256'], 'width'),
    'transformer_d64': (['--variant=transformer', '--d_model=64'], 'width'),
    'transformer_d256': (['--variant=transformer', '--d_model=256'], 'width'),
}
WIDTHS = {'flat': ('flat_d64', 'flat', 'flat_d256'), 'transformer': ('transformer_d64', 'transformer',
                                                                   'transformer_d256')}   # d_model 64, 128, 256
BUDGET_MODELS = ('flat', 'toeplitz', 'recurrent', 'transformer')     # --budgets: the flip with training time
# the flat mixer at the largest --budgets budget with its mixing matrices regularised (its step time, one lr)
REGULARISE = {'flat_mixing_wd': ['--variant=flat', '--mixing_weight_decay=1.0'],
              'flat_mixing_lr': ['--variant=flat', '--mixing_lr_mult=0.1']}
AE_MODELS = ('flat', 'transformer')            # autoencoders, at their LM model's learning rate
RETRIEVAL_MODELS = ('flat', 'transformer')
REPRESENT_MODELS = ('flat', 'expanded', 'multihead2', 'toeplitz', 'recurrent', 'transformer', 'gpt')
MEMORY_VARIANTS = ('flat', 'transformer', 'transformer_naive')


# ----------------------------------------------------------------------------- reading the runs

def final_loss(res):
    """Final val loss (nats/token) of a run, inf for a failed or diverged one."""
    if res is None or res['rc'] != 0 or not res['evals'] or not math.isfinite(res['evals'][-1][1]):
        return float('inf')
    return res['evals'][-1][1]


def losses(plan, m):
    """Final val losses (nats/token) of model m, one per seed (inf for a failed run)."""
    return [final_loss(r) for r in plan[m]['runs']]


def window_gaps(extras, b, m):
    """(val losses, train-window losses, gaps) per seed of model m at budget b, in nats/token."""
    ws = extras['windows'][f'{b:g}:{m}']
    val = [w['val_loss'] if w['rc'] == 0 else float('nan') for w in ws]
    tr = [w['train_loss'] if w['rc'] == 0 else float('nan') for w in ws]
    return val, tr, [v - t for v, t in zip(val, tr)]


# ----------------------------------------------------------------------------- verdicts

def stats(xs):
    """(mean, spread: half the range) of a list of numbers, in their units."""
    return float(np.mean(xs)), float((max(xs) - min(xs)) / 2)


def verdict(a, b, expect, higher_is_better=False):
    """Compare per-seed values a (the claim's subject) and b (its reference), losses
    in nats/token unless higher_is_better (accuracies) -> 'yes (better)', 'no (worse)',
    'within noise', ... expect: 'better' | 'worse' | 'equal' | 'not better'. The difference
    counts only when larger than the sum of the two spreads, else 'within noise'."""
    (ma, sa), (mb, sb) = stats(a), stats(b)
    if not (math.isfinite(ma) and math.isfinite(mb)):
        return 'undecided (a run failed)'
    d = (mb - ma) if higher_is_better else (ma - mb)      # < 0: a is better
    if abs(d) <= sa + sb:
        return {'equal': 'yes (within noise)', 'not better': 'yes (within noise)'}.get(expect, 'within noise')
    seen = 'better' if d < 0 else 'worse'
    ok = seen == expect or (expect == 'not better' and seen == 'worse')
    return f'{"yes" if ok else "no"} ({seen})'


def ratio_verdict(measured, claimed, factor=2.0):
    """A ratio claim ("about 4x") agrees when the measured ratio is within `factor` of
    the claimed one, either way: 'yes (1.35x; agree within 2x of 4x)' or 'no (...)'."""
    ok = claimed / factor <= measured <= claimed * factor
    return f'{"yes" if ok else "no"} ({measured:.2f}x; agree within {factor:g}x of {claimed:g}x)'


def fmt(xs, digits=3, sign='', unit=''):
    """'mean +- spread unit' of per-seed values (runner.mean_range), or 'failed in k of n runs' if any is
    not finite."""
    bad = f'failed in {sum(not math.isfinite(x) for x in xs)} of {len(xs)} runs'
    text = mean_range(xs, f'{sign}.{digits}f', f'.{digits}f', bad, one=True)
    return text + (f' {unit}' if unit and text != bad else '')


def cmd(*models):
    """The claims.py command that makes a row (markdown code)."""
    return f'`python -m experiments.claims --models {",".join(models)}`'


# ----------------------------------------------------------------------------- rows

def claim_rows(plan, extras):
    """The claims table rows, [claim, papers, ours, agree?, command], in the report's order;
    losses in nats/token."""
    return (paper_rows(plan, extras) + representation_rows(plan, extras) + memory_rows(extras) + muon_rows(plan)
            + shape_rows(plan) + budget_rows(extras) + best_rows(plan))


def pair_row(plan, claim, papers, a, b, expect):
    """[row] comparing the final losses (nats/token) of models a and b, or [] unless both ran."""
    if a not in plan or b not in plan:
        return []
    la, lb = losses(plan, a), losses(plan, b)
    return [[claim, papers, f'{a} {fmt(la, unit="nats")} vs {b} {fmt(lb, unit="nats")}', verdict(la, lb, expect),
             cmd(a, b)]]


def paper_rows(plan, extras):
    """The papers' language-modelling rows: each variant vs its reference (final losses in
    nats/token), the cost of removing the layer norms, and whether the linear mixer trains."""
    rows = pair_row(plan, 'flat mixer vs llama-style transformer', 'mixer slightly worse: 1.89 vs 1.71 (12 h, '
                    'RTX 3060)', 'flat', 'transformer', 'worse')
    rows += pair_row(plan, 'flat mixer vs GPT-style transformer', 'mixer better: 1.81 vs 1.96', 'flat', 'gpt', 'better')
    rows += pair_row(plan, 'flat vs expanded mixer', 'flat better: 2.111 vs 2.183 (one epoch)', 'flat', 'expanded',
                     'better')
    if all(m in plan for m in ('flat', 'flat_nonorm', 'transformer', 'transformer_nonorm')):
        dm = [x - y for x, y in zip(losses(plan, 'flat_nonorm'), losses(plan, 'flat'))]
        dt = [x - y for x, y in zip(losses(plan, 'transformer_nonorm'), losses(plan, 'transformer'))]
        rows.append(['layer norms removed: cost to the mixer vs to the transformer',
                     'mixer still trains, transformer degrades (Masked Mixers IV)',
                     f'mixer {fmt(dm, sign="+", unit="nats")}, transformer {fmt(dt, sign="+", unit="nats")}',
                     verdict(dm, dt, 'better'),
                     cmd('flat', 'flat_nonorm', 'transformer', 'transformer_nonorm')])
    rows += pair_row(plan, 'learned positional encoding for the mixer', 'no gain', 'posenc', 'flat', 'not better')
    rows += pair_row(plan, 'Toeplitz vs flat mixer', 'about equal (Masked Recurrent Mixers)', 'toeplitz', 'flat',
                     'equal')
    rows += pair_row(plan, '2 heads vs flat mixer', 'slight gain: 1.72 vs 1.74', 'multihead2', 'flat', 'better')
    rows += pair_row(plan, '4 heads vs flat mixer', 'slight gain: 1.72 vs 1.74', 'multihead4', 'flat', 'better')
    rows += pair_row(plan, 'kernel 4 mixer vs transformer', 'mixer better: 1.74 vs 1.82 (4x V100)', 'kernel4',
                     'transformer', 'better')
    rows += pair_row(plan, 'kernel 4 + linear after the embedding vs kernel 4', 'better: 1.71 vs 1.74',
                     'kernel4_embed', 'kernel4', 'better')
    rows += pair_row(plan, 'hybrid transformer-mixer vs transformer', 'hybrid best of all: 1.59 vs 1.61', 'hybrid',
                     'transformer', 'better')
    rows += pair_row(plan, 'parallel hybrid (attention + mixing side by side) vs transformer',
                     'no gain: 1.61 vs 1.61 (4x V100)', 'hybrid_parallel', 'transformer', 'equal')
    rows += pair_row(plan, 'recurrent vs flat mixer', 'close, with constant-state inference', 'recurrent', 'flat',
                     'equal')
    if 'linear_mixer' in plan:
        ll = losses(plan, 'linear_mixer')
        uni = extras['unigram']
        ok = max(ll) < uni - 0.5
        rows.append(['linear mixer trains (no norm, no nonlinearity)', 'trains, writes grammatical text',
                     f'{fmt(ll)} nats (unigram {uni:.3f}); sample below', 'yes' if ok else 'no',
                     cmd('linear_mixer')])
    return rows


def memory_rows(extras):
    """[row] of the training memory per step (bytes, shown in MiB) of the transformer (SDPA
    and naive attention) over the flat mixer's, at the longest n_ctx all measured; or []."""
    if not extras.get('memory'):
        return []
    mem = extras['memory']
    T = max(t for t in mem['flat'] if all(t in mem[v] for v in mem))
    f, t, n = (mem[v][T] for v in MEMORY_VARIANTS)
    return [[f'training memory per step at n_ctx {T}: transformer / mixer',
             'mixer about 4x less than the transformer',
             f'SDPA {t / f:.2f}x, naive attention {n / f:.2f}x ({f / 2**20:.0f} / {t / 2**20:.0f} / '
             f'{n / 2**20:.0f} MiB: flat / SDPA / naive)',
             f'vs naive: {ratio_verdict(n / f, 4)}; vs SDPA: {ratio_verdict(t / f, 4)}',
             f'`{extras["memory_command"]}`']]


def muon_rows(plan):
    """Muon vs AdamW rows (ours, no paper), flat mixer and transformer, final losses in nats/token."""
    rows = (pair_row(plan, 'Muon vs AdamW, flat mixer', '(no paper: ours)', 'flat_muon', 'flat', 'better') +
            pair_row(plan, 'Muon vs AdamW, transformer', '(no paper: ours)', 'transformer_muon', 'transformer',
                     'better'))
    for row in rows:
        row[3] = row[3].replace('yes', 'Muon better').replace('no', 'Muon not better')
    return rows


def shape_rows(plan):
    """The rows of the transformer's head count and of the best width (d_model) of the flat
    mixer and the transformer at equal time; final losses in nats/token."""
    rows = []
    if all(m in plan for m in ('transformer_h1', 'transformer', 'transformer_h16')):
        l1, l4, l16 = (losses(plan, m) for m in ('transformer_h1', 'transformer', 'transformer_h16'))
        rows.append(['fewer attention heads are more efficient for TinyStories (same d_model, equal time)',
                     'Badger 2024: fewer heads better', f'1 head {fmt(l1)}, 4 heads {fmt(l4)}, 16 heads {fmt(l16)}',
                     f'1 vs 16: {verdict(l1, l16, "better")}; 1 vs 4: {verdict(l1, l4, "better")}',
                     cmd('transformer_h1', 'transformer', 'transformer_h16')])
    if all(m in plan for w in WIDTHS.values() for m in w):
        best, cells = {}, []
        for kind, names in WIDTHS.items():
            means = {d: np.mean(losses(plan, m)) for d, m in zip((64, 128, 256), names)}
            best[kind] = min(means, key=means.get)
            cells.append(f'{kind}: ' + ', '.join(f'd{d} {fmt(losses(plan, m))}' for d, m in zip(means, names)))
        agree = 'yes' if best['flat'] > best['transformer'] else 'no'
        rows.append(['at equal compute the best mixer width is larger than the best transformer width',
                     'flat best near d_model 1024, transformer near 512 (12 h runs)',
                     '; '.join(cells) + f' nats; best: flat d{best["flat"]}, transformer d{best["transformer"]}',
                     f'{agree} ({best["flat"]} vs {best["transformer"]})',
                     cmd(*WIDTHS['flat'], *WIDTHS['transformer'])])
    return rows


def best_rows(plan):
    """[row] of the best mixer vs the best transformer (lowest mean final loss, nats/token,
    of each family), or [] unless both families ran."""
    best = {}
    for fam in ('mixer', 'transformer'):
        cands = [m for m in plan if MODELS[m][1] == fam and math.isfinite(np.mean(losses(plan, m)))]
        if cands:
            best[fam] = min(cands, key=lambda m: np.mean(losses(plan, m)))
    if len(best) < 2:
        return []
    bm, bt = best['mixer'], best['transformer']
    return [['best mixer vs best transformer (each at its best lr)', 'about equal (the papers\' best mixer '
             '1.74 vs transformer 1.82)', f'{bm} {fmt(losses(plan, bm))} vs {bt} {fmt(losses(plan, bt))}',
             verdict(losses(plan, bm), losses(plan, bt), 'better'), cmd(bm, bt)]]


def budget_rows(extras):
    """The budget sweep's claims rows: each mixer of BUDGET_MODELS vs the transformer at
    every budget; the generalisation gaps; each REGULARISE run vs the flat mixer and the
    transformer at the largest budget (val and train-window losses in nats/token)."""
    if 'budgets' not in extras:
        return []
    sweep, bs, seconds = extras['budgets'], sorted(extras['budgets']), extras['budget_s']
    top, rows = bs[-1], []
    command = f'`python -m experiments.claims --budgets {",".join(f"{b:g}" for b in bs)}`'

    def val(b, m):
        return window_gaps(extras, b, m)[0]

    def gap(b, m):
        return window_gaps(extras, b, m)[2]

    mixers = ([m for m in BUDGET_MODELS if m != 'transformer' and m in sweep[top]]
              if 'transformer' in sweep[top] else [])
    for m in mixers:
        seen = {b: verdict(val(b, m), val(b, 'transformer'), 'better') for b in bs}
        cells = [f'{b * seconds:.0f} s: {fmt(val(b, m))} vs {fmt(val(b, "transformer"))} ({seen[b]})' for b in bs]
        rows.append([f'{m} mixer vs transformer as the budget grows (val loss)',
                     'flat slightly worse in 12 h runs (1.89 vs 1.71); our 150 s: mixers better',
                     '; '.join(cells), f'flips: {"yes" if "better" in seen[bs[0]] and "worse" in seen[top] else "no"}',
                     command])
    if all(m in sweep[b] for b in (bs[0], top) for m in ('flat', 'transformer')) and top != bs[0]:
        grow = {m: [g1 - g0 for g0, g1 in zip(gap(bs[0], m), gap(top, m))] for m in ('flat', 'transformer')}
        v = verdict(grow['flat'], grow['transformer'], 'better', higher_is_better=True)   # 'better': grows more
        rows.append(['the flat mixer\'s generalisation gap (val - train windows) grows faster than the transformer\'s',
                     '(the README\'s reading of the flip)',
                     '; '.join(f'{b * seconds:.0f} s: flat {fmt(gap(b, "flat"))} vs transformer '
                               f'{fmt(gap(b, "transformer"))}' for b in bs) +
                     f' nats; growth flat {fmt(grow["flat"], sign="+")} vs transformer '
                     f'{fmt(grow["transformer"], sign="+")}',
                     v.replace('yes (better)', 'yes (grows faster)').replace('no (worse)', 'no (grows slower)'),
                     command])
    for n in (n for n in REGULARISE if n in sweep[top]):
        reg, flat = window_gaps(extras, top, n), window_gaps(extras, top, 'flat')
        vs_t = (verdict(reg[0], val(top, 'transformer'), 'better') if 'transformer' in sweep[top]
                else 'no transformer run')
        rows.append([f'{n} ({" ".join(REGULARISE[n][1:])}) vs the flat mixer at {top * seconds:.0f} s',
                     '(tests the reading: the mixing matrices overfit)',
                     f'{fmt(reg[0])} vs flat {fmt(flat[0])} nats; gap {fmt(reg[2])} vs {fmt(flat[2])}',
                     f'vs flat: {verdict(reg[0], flat[0], "better")}; vs transformer: {vs_t}', command])
    return rows


def top1(results, dirs, untrained=False, pool='last'):
    """Top-1 accuracy of the trained retrieval model at N = 32, one per checkpoint folder in dirs."""
    by_ckpt = {(r['ckpt'], r['untrained'], r['pool']): r['accuracy']['mixer (trained)']['32'] for r in results}
    return [by_ckpt[(os.path.join(d, 'ckpt.pt'), untrained, pool)] for d in dirs]


def represented(results, trained, mode):
    """Input representation accuracy (represent.py) per seed at the deepest layer: mode 'self' | 'nonself'."""
    deepest = max(r['depth'] for r in results)
    return [r[mode]['accuracy'] for r in results if r['trained'] == trained and r['depth'] == deepest]


def representation_rows(plan, extras):
    """The claims rows of retrieval, autoencoding and input representation accuracy
    (accuracies in [0, 1], autoencoder losses in nats/token), [claim, papers, ours, agree?, command]."""
    rows = []
    r = extras.get('retrieval')
    if r:
        f, t = plan['flat']['dirs'], plan['transformer']['dirs']
        rows.append(['retrieval top-1 at N=32, mixer vs transformer embeddings (last token)',
                     "mixer's embeddings retrieve better", f'flat {fmt(top1(r, f))} vs transformer {fmt(top1(r, t))} '
                     f'(untrained: {fmt(top1(r, f, True))} vs {fmt(top1(r, t, True))})',
                     verdict(top1(r, f), top1(r, t), 'better', higher_is_better=True), cmd('flat', 'transformer')])
        rows.append(['retrieval top-1 at N=32, mixer vs transformer, mean pooling instead of the last token',
                     '(the paper embeds with the last token)',
                     f'flat {fmt(top1(r, f, pool="mean"))} vs transformer {fmt(top1(r, t, pool="mean"))}',
                     verdict(top1(r, f, pool='mean'), top1(r, t, pool='mean'), 'better', higher_is_better=True),
                     cmd('flat', 'transformer')])
        rows.append(['untrained flat mixer embeddings retrieve worse than trained ones (control)',
                     'untrained mixer embeddings retrieve poorly', f'untrained {fmt(top1(r, f, True))} vs trained '
                     f'{fmt(top1(r, f))} (chance 0.031)', verdict(top1(r, f, True), top1(r, f), 'worse', True),
                     cmd('flat', 'transformer')])
    if extras.get('ae'):
        a, uni = extras['ae'], extras['unigram']
        level = max(extras['unigram_acc'], extras['ae_untrained_acc'])
        acc = {m: [x[1] for x in a[m]] for m in a}
        loss = {m: [x[0] for x in a[m]] for m in a}
        learned = max(np.mean(acc['flat']), np.mean(acc['transformer'])) > level + 0.05
        rows.append(['autoencoder token accuracy, mixer vs transformer', 'the mixer reconstructs better',
                     f'flat {fmt(acc["flat"])} vs transformer {fmt(acc["transformer"])} (most common token '
                     f'{extras["unigram_acc"]:.3f}, untrained {extras["ae_untrained_acc"]:.3f}); loss '
                     f'{fmt(loss["flat"])} vs {fmt(loss["transformer"])} nats (unigram {uni:.3f})',
                     verdict(acc['flat'], acc['transformer'], 'better', higher_is_better=True) if learned else
                     'neither learns (both within 0.05 of the most-common-token or untrained level)',
                     cmd('flat', 'transformer')])
    ra = extras.get('retrieval_ae')
    if ra:
        d = extras['ae_dirs']['flat']
        rows.append(["trained autoencoder's embeddings retrieve no better than an untrained one's (flat, N=32)",
                     'yes: autoencoder embeddings retrieve poorly', f'trained {fmt(top1(ra, d))} vs untrained '
                     f'{fmt(top1(ra, d, True))}', verdict(top1(ra, d), top1(ra, d, True), 'not better', True),
                     cmd('flat', 'transformer')])
    rep = {m[len('represent_'):]: extras[m] for m in extras if m.startswith('represent_')}

    def acc(m, mode, trained=True):
        return represented(rep[m], trained, mode)
    if 'flat' in rep:
        ok = min(np.mean(acc('flat', 'self')), np.mean(acc('flat', 'nonself'))) >= 0.9
        rows.append(['trained flat mixer represents self and non-self tokens accurately (after all blocks)',
                     'yes: near 1 (Badger 2024, "Accurate representation")', f'self {fmt(acc("flat", "self"))}, '
                     f'non-self {fmt(acc("flat", "nonself"))} (untrained {fmt(acc("flat", "self", False))}, '
                     f'{fmt(acc("flat", "nonself", False))})', 'yes (0.9 or more)' if ok else 'no (below 0.9)',
                     cmd('flat')])
    if 'flat' in rep and 'transformer' in rep:
        rows.append(['non-self representation accuracy after all blocks, trained: flat mixer vs transformer',
                     'mixer accurate, transformer not', f'flat {fmt(acc("flat", "nonself"))} vs transformer '
                     f'{fmt(acc("transformer", "nonself"))}',
                     verdict(acc('flat', 'nonself'), acc('transformer', 'nonself'), 'better', True),
                     cmd('flat', 'transformer')])
    if 'transformer' in rep:
        rows.append(['the transformer loses non-self accuracy with training (after all blocks)',
                     'yes', f'trained {fmt(acc("transformer", "nonself"))} vs untrained '
                     f'{fmt(acc("transformer", "nonself", False))}',
                     verdict(acc('transformer', 'nonself'), acc('transformer', 'nonself', False), 'worse', True),
                     cmd('transformer')])
    if 'flat' in rep and 'expanded' in rep:
        rows.append(['expanded vs flat mixer: non-self accuracy after all blocks', 'expanded worse',
                     f'untrained: expanded {fmt(acc("expanded", "nonself", False))} vs flat '
                     f'{fmt(acc("flat", "nonself", False))}; trained: {fmt(acc("expanded", "nonself"))} vs '
                     f'{fmt(acc("flat", "nonself"))}', 'untrained: ' + verdict(
                         acc('expanded', 'nonself', False), acc('flat', 'nonself', False), 'worse', True) +
                     '; trained: ' + verdict(acc('expanded', 'nonself'), acc('flat', 'nonself'), 'worse', True),
                     cmd('flat', 'expanded')])
    return rows


def representation_table(extras):
    """Every represent.py result of the run: model x weights x depth, self and non-self
    accuracy (mean +- spread over seeds; in brackets, at half the recovery steps) -> a
    markdown table, or '' without results."""
    rows = []
    for name in (n for n in extras if n.startswith('represent_')):
        res = extras[name]
        for trained in (False, True):
            for depth in sorted({r['depth'] for r in res}):
                sel = [r for r in res if r['trained'] == trained and r['depth'] == depth]
                cells = [f'{fmt([r[m]["accuracy"] for r in sel])} ({fmt([list(r[m]["at"].values())[0] for r in sel])})'
                         for m in ('self', 'nonself')]
                rows.append([name[len('represent_'):], 'trained' if trained else 'untrained', depth, *cells,
                             f'{max(r[m]["chance"] for r in sel for m in ("self", "nonself")):.3f}'])
    return md_table(['model', 'weights', 'depth', 'self', 'non-self', 'chance (max)'], rows) if rows else ''


def run_rows(plan, n_train_tokens, tokens_per_step):
    """The runs table rows: model, lr, sweep, steps, tokens, epochs, val loss (nats/token),
    val bits per byte, command (mean +- spread over seeds)."""
    rows = []
    for m, p in plan.items():
        ls = losses(plan, m)
        bpb = [r['evals'][-1][2] if math.isfinite(final_loss(r)) else float('nan') for r in p['runs']]
        sweep = ', '.join(f'{lr:g}: {v:.3f}' for lr, v in p['sweep'].items()) or '-'
        tokens = p['steps'] * tokens_per_step
        rows.append([m, f'{p["lr"]:g}', sweep, p['steps'], f'{tokens / 1e6:.2f}M', f'{tokens / n_train_tokens:.2f}',
                     fmt(ls), fmt(bpb), f'`{p["command"]}`'])
    return rows


def budget_table(extras, budget_s, n_train, tps):
    """The budget sweep's table (markdown): seconds, model, lr, sweep, steps, epochs, val loss,
    train-window loss, gap (nats/token, mean +- spread over seeds)."""
    rows = []
    for b, bplan in extras['budgets'].items():
        for m, p in bplan.items():
            val, tr, gap = window_gaps(extras, b, m)
            sweep = ', '.join(f'{lr:g}: {v:.3f}' for lr, v in p['sweep'].items()) or '-'
            rows.append([f'{b * budget_s:.0f}', m, f'{p["lr"]:g}', sweep, p['steps'],
                         f'{p["steps"] * tps / n_train:.2f}', fmt(val), fmt(tr), fmt(gap)])
    return md_table(['training s', 'model', 'lr', 'sweep (lr: proxy val loss)', 'steps', 'epochs',
                     'val loss (nats)', 'train-window loss', 'gap (val - train)'], rows)


# ----------------------------------------------------------------------------- plots

def plot_budgets(extras, path):
    """The budget sweep: final validation loss (left) and generalisation gap (right)
    against training seconds, one line per model, the range over seeds shaded; the
    REGULARISE runs as points at the largest budget -> path, or a note."""
    plt = pyplot()
    if plt is None:
        return NO_PLOT
    bs, sec = sorted(extras['budgets']), extras['budget_s']
    if not any(m in extras['budgets'][b] for b in bs for m in BUDGET_MODELS):
        return f'plot not written: {path} (no budget run finished)'
    fig, axes = plt.subplots(1, 2, figsize=(14, 5.5))
    for i, m in enumerate(BUDGET_MODELS):
        have = [b for b in bs if m in extras['budgets'][b]]
        if not have:
            continue
        for ax, k in zip(axes, (0, 2)):
            ys = np.array([window_gaps(extras, b, m)[k] for b in have])
            x = [b * sec for b in have]
            ax.plot(x, ys.mean(1), '--' if m == 'transformer' else '-', marker='o', color=f'C{i}', label=m)
            ax.fill_between(x, ys.min(1), ys.max(1), color=f'C{i}', alpha=0.2)
    for j, n in enumerate(n for n in REGULARISE if n in extras['budgets'][bs[-1]]):
        for ax, k in zip(axes, (0, 2)):
            y = window_gaps(extras, bs[-1], n)[k]
            ax.plot([bs[-1] * sec] * len(y), y, 'x^'[j % 2], ms=9, color=f'C{len(BUDGET_MODELS) + j}', label=n)
    for ax, label in zip(axes, ('final validation loss (nats/token)', 'gap: validation - training windows (nats)')):
        ax.set_xscale('log')
        ax.set_xlabel('training seconds (each run its own cosine schedule)')
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_title('Equal wall-clock budgets: mean over seeds, range shaded')
    axes[1].set_title('Generalisation gap at the end of each run')
    return save_figure(fig, path, dpi=110)


def plot(plan, step_s, path, ae_runs=None):
    """Validation loss vs training seconds, one line per model (seed 0), and, given the
    autoencoder runs, their token accuracy and loss vs seconds (every seed) -> path, or a note."""
    plt = pyplot()
    if plt is None:
        return NO_PLOT
    fig, axes = plt.subplots(1, 2 if ae_runs else 1, figsize=(15 if ae_runs else 9, 6), squeeze=False)
    ax = axes[0, 0]
    for i, (m, p) in enumerate(plan.items()):
        ev = p['runs'][0]['evals']
        if ev:
            args, family = MODELS[m]
            style = '-.' if family == 'hybrid' else \
                '--' if {'--variant=transformer', '--variant=gpt'} & set(args) else '-'
            ax.plot([s * step_s[m] for s, *_ in ev[1:]], [e[1] for e in ev[1:]], style, marker='.x+'[i // 20 % 3],
                    color=plt.cm.tab20(i % 20), label=m)
    ax.set_xlabel('training seconds (steps x calibrated step time)')
    ax.set_ylabel('validation loss (nats/token)')
    ax.set_title('Equal wall-clock budget: mixers solid, transformers dashed, hybrids dash-dot (seed 0)')
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    if ae_runs:
        ax, twin = axes[0, 1], axes[0, 1].twinx()
        for i, (m, runs) in enumerate(ae_runs.items()):
            for seed, r in enumerate(runs):
                t = [s * step_s[f'ae:{m}'] for s, *_ in r['evals']]
                ax.plot(t, [e[3] for e in r['evals']], '-', marker='.', color=f'C{i}',
                        label=f'{m} accuracy' if seed == 0 else None)
                twin.plot(t, [e[1] for e in r['evals']], ':', color=f'C{i}', label=f'{m} loss' if seed == 0 else None)
        ax.set_xlabel('training seconds')
        ax.set_ylabel('validation token accuracy (solid)')
        twin.set_ylabel('validation loss, nats/token (dotted)')
        ax.set_title('Autoencoders (every seed)')
        ax.legend(loc='center right', fontsize=8)
        ax.grid(alpha=0.3)
    return save_figure(fig, path, dpi=110)


# ----------------------------------------------------------------------------- the report

def write_report(out, plan, extras, step_s, args, budget_s, n_train, tps):
    """The whole report of finished runs: prints the markdown and writes it to OUT/claims.md,
    with OUT/curves.png and, after a budget sweep, OUT/budgets.png. plan: claims.lm_runs';
    extras: the other measurements (claims.main); step_s: seconds per step of each model;
    args: claims.parse_args'; budget_s: seconds of training per run; n_train: tokens of
    train.bin; tps: tokens per training step -> the plots' notes (path, or why none)."""
    text = ['# Claims at equal compute\n',
            f'Every model: {budget_s:.0f} s of training ({args.workers} runs at a time, {args.threads} thread(s) '
            f'each), learning rate chosen from {", ".join(f"{x:g}" for x in args.lrs)} on the first third of the '
            f'schedule, {args.seeds} seeds; ours = mean +- half the range over seeds, validation loss in '
            f'nats/token unless named; "agree" only when the difference exceeds the two spreads added.\n',
            md_table(['claim (from the papers)', 'what the papers report', 'ours (mean +- spread over seeds)',
                      'agree?', 'command'], claim_rows(plan, extras)), '\n## Runs\n',
            md_table(['model', 'lr', 'sweep (lr: proxy val loss)', 'steps', 'tokens', 'epochs', 'val loss (nats)',
                      'val bits/byte', 'command (seed 0)'], run_rows(plan, n_train, tps))]
    table = representation_table(extras)
    if table:
        text += ['\n## Input representation accuracy\n', f'`python -m experiments.represent --untrained --ckpt ... '
                 f'{" ".join(args.s["represent"])}` on each seed\'s checkpoint (untrained: the same config, seeded '
                 f'by the run\'s seed); cell: accuracy at the end (at half the steps), mean +- spread over seeds.\n',
                 table]
    for name, title in (('retrieval', 'Retrieval'), ('retrieval_ae', 'Retrieval with autoencoder embeddings')):
        if extras.get(name):
            report = open(os.path.join(out, f'{name}.txt')).read()      # its stderr (progress), then its stdout
            text += [f'\n## {title}\n', report[report.find('Top-1 retrieval accuracy'):].strip()]
    notes = []
    if 'budgets' in extras:
        text += ['\n## Budget sweep\n', f'Every run of `python -m experiments.claims --budgets '
                 f'{",".join(f"{b:g}" for b in args.budgets)}` at each budget (its own learning-rate sweep over '
                 f'{", ".join(f"{x:g}" for x in args.lrs)} on the first third, {args.seeds} seeds; the main '
                 f'run\'s at 1x); losses of the final checkpoint on the run\'s eval_windows fixed windows '
                 f'of val.bin and of train.bin, mean +- spread over seeds. {", ".join(REGULARISE)}: the flat mixer at '
                 f'the largest budget with {"; ".join(" ".join(a[1:]) for a in REGULARISE.values())}, at the flat '
                 f'mixer\'s learning rate there, {args.s["reg_seeds"]} seed(s).\n',
                 budget_table(extras, budget_s, n_train, tps)]
        notes.append(plot_budgets(extras, os.path.join(out, 'budgets.png')))
    if extras.get('sample'):
        text += ['\n## A linear mixer writes\n', '\n'.join('> ' + l for l in extras['sample'].splitlines())]
    notes.insert(0, plot(plan, step_s, os.path.join(out, 'curves.png'), extras.get('ae_runs')))
    report = '\n'.join(text) + '\n'
    print(report)
    write_atomic(os.path.join(out, 'claims.md'), report)
    return notes
