"""The in-context regression report: Table 1 ours against the paper's, the paper's claims as
verdicts with their rules, Theorem 4.1 and Figure 5 read off the models, the budget ladder of
the disagreeing verdicts, and Figures 1 and 2 (experiments/icl.py makes the numbers);
report_text puts icl.md together.
"""

import sys

if __name__ == '__main__':       # not a command, run as a file or with -m: said before any import
    print("icl_report.py: error: icl.py's report, not a command: python -m experiments.icl writes it "
          "(from its cached runs)", file=sys.stderr)
    sys.exit(2)

import math

import torch

from experiments import icl_mixers
from experiments.regression import (NOISE_NAMES, PARAM_NAMES, PARAMS, SIGMA_GRID, LinearSelfAttention, adarr,
                                    fixed_prompts, half_sq, oracle, tune_baselines, y_scale)
from experiments.runner import NO_PLOT, md_table, mean_range, pyplot, save_figure


# Table 1 of the paper (adjusted evaluation loss, columns NOISE_NAMES). 1-layer models
# of every parameterisation share one row there.
PAPER = {
    (1, 'all'): (1.77, 1.64, 1.40, 1.18, 1.02, .907, .841, .806, 1.01, .819),
    (2, 'gdpp'): (.341, .295, .243, .265, .347, .366, .440, .530, .305, .427),
    (2, 'diag'): (.265, .214, .173, .188, .219, .242, .254, .259, .201, .246),
    (4, 'diag'): (1.2e-4, .006, .024, .041, .050, .059, .065, .073, .043, .062),
    (4, 'full'): (1.6e-4, .005, .021, .038, .052, .065, .068, .076, .032, .061),
    (7, 'gdpp'): (2.7e-12, .009, .066, .161, .265, .344, .454, .530, .222, .422),
    (7, 'diag'): (2.5e-12, .002, .014, .027, .040, .047, .052, .059, .018, .046),
    (7, 'full'): (2.5e-12, .002, .010, .025, .035, .047, .050, .057, .010, .035),
    'CONSTRR': (0, .009, .066, .161, .265, .365, .454, .530, .222, .422),
    'ADARR': (0, .003, .016, .034, .053, .068, .081, .092, .051, .084),
    'TUNEDRR': (0, .002, .010, .023, .037, .049, .060, .068, .021, .054),
}
PAPER_MODELS = [(1, 'full'), (1, 'diag'), (1, 'gdpp'), (2, 'gdpp'), (2, 'diag'), (4, 'diag'), (4, 'full'),
                (7, 'gdpp'), (7, 'diag'), (7, 'full')]


def baselines(noise, s):
    """The baselines' mean losses on the eval prompts of `noise` (CONSTRR and TUNEDRR
    tuned on its sweep prompts) and at each fixed sigma of SIGMA_GRID (Figure 2's
    sweep prompts) -> ({name: eval loss}, {name: [loss at each sigma]})."""
    fitted = {'ORACLE': oracle, 'ADARR': adarr, **tune_baselines(fixed_prompts(noise, s['sweep_prompts'], 'sweep'))}
    ev = fixed_prompts(noise, s['eval_prompts'], 'eval')
    at_sigma = [fixed_prompts(f'={x:g}', s['sweep_prompts'], 'eval') for x in SIGMA_GRID]
    return ({k: half_sq(f(ev), ev.y_q).mean().item() for k, f in fitted.items()},
            {k: [half_sq(f(p), p.y_q).mean().item() for p in at_sigma] for k, f in fitted.items()})


def best_seed(results):
    """The paper's "best of seeds": the finished run with the lowest sweep-set loss (the
    eval prompts never choose) -> (result, [eval loss of every seed])."""
    ok = [r for r in results if r['rc'] == 0 and r['finished']] or results
    return min(ok, key=lambda r: r['sweep']), [r['eval'] for r in results]


def fmt(x):
    """A loss for the table: 3 significant digits, scientific below 1e-3."""
    if x is None or not math.isfinite(x):
        return 'diverged' if x is not None else '-'
    return f'{x:.2e}' if abs(x) < 1e-3 and x != 0 else f'{x:.3g}'


def paper_row(L, param):
    return PAPER.get((L, 'all') if L == 1 else (L, param))


def gmean(xs):
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else math.nan


def verdicts(adj, base, sig, noises):
    """The paper's claims (Vladymyrov et al. 2024, Sec. 5) checked on our numbers, each
    with its rule -> list of (claim, our numbers, verdict). adj: {(L, param): {noise:
    adjusted loss}}, base: {name: {noise: adjusted}}, sig: {(L, param, noise): [adjusted
    loss at each sigma of SIGMA_GRID]}. 'n/a' when the models it needs were not run."""
    out = []
    unif = [n for n in noises if n in ('1', '2', '3', '4', '5', '6', '7')]
    ran = ', '.join(unif)                   # the noise levels that ran, each named

    def have(*models):
        return all(m in adj for m in models)

    ones = [m for m in PAPER_MODELS if m[0] == 1 and m in adj]
    if len(ones) > 1 and '0' in noises:
        vals = [adj[m]['0'] for m in ones]
        out.append(('1 layer: FULL, DIAG and GD++ are one model (1.77 at sigma = 0)',
                    ', '.join(f'{PARAM_NAMES[p]} {fmt(adj[(1, p)]["0"])}' for _, p in ones),
                    'agree' if max(vals) / min(vals) < 1.05 else 'disagree'))
    for L in (4, 7):
        if have((L, 'diag'), (L, 'full')) and unif:
            r = gmean([adj[(L, 'diag')][n] / adj[(L, 'full')][n] for n in unif])
            out.append((f'DIAG matches FULL ({L} layers; rule: geometric-mean ratio over sigma_max {ran} within 1.5x)',
                        f'DIAG / FULL = {r:.2f}', 'agree' if 1 / 1.5 <= r <= 1.5 else 'disagree'))
    if have((7, 'gdpp')) and unif:
        r = gmean([adj[(7, 'gdpp')][n] / base['CONSTRR'][n] for n in unif])
        out.append((f'GD++ stalls at CONSTRR (7 layers; rule: geometric-mean ratio over sigma_max {ran} within 1.5x)',
                    f'GD++ / CONSTRR = {r:.2f}', 'agree' if 1 / 1.5 <= r <= 1.5 else 'disagree'))
    high = [n for n in ('5', '6', '7') if n in noises]
    for m in [(4, 'diag'), (4, 'full')]:
        if have(m) and high:
            wins = [adj[m][n] < base['ADARR'][n] for n in high]
            out.append((f'{m[0]}-layer {PARAM_NAMES[m[1]]} beats ADARR at high noise (sigma_max {", ".join(high)})',
                        ', '.join(f'{fmt(adj[m][n])} vs {fmt(base["ADARR"][n])}' for n in high),
                        'agree' if all(wins) else 'disagree'))
    for m in [(7, 'diag'), (7, 'full')]:
        if have(m) and unif:
            r = max(adj[m][n] / base['TUNEDRR'][n] for n in unif)
            out.append((f'{m[0]}-layer {PARAM_NAMES[m[1]]} matches or beats TUNEDRR (rule: within 10% at every '
                        f'sigma_max {ran})', f'worst ratio {r:.2f}', 'agree' if r <= 1.1 else 'disagree'))
    if have((7, 'diag'), (7, 'full')) and 'c13' in noises:
        d, f = adj[(7, 'diag')]['c13'], adj[(7, 'full')]['c13']
        out.append(('{1,3}: FULL better than DIAG in distribution (7 layers)', f'FULL {fmt(f)}, DIAG {fmt(d)}',
                    'agree' if f < d else 'disagree'))
    if all((7, p, 'c13') in sig for p in ('diag', 'full')):          # both finished (a diverged model: no sweep)
        outside = [i for i, x in enumerate(SIGMA_GRID) if x > 3]
        d = sum(sig[(7, 'diag', 'c13')][i] for i in outside) / len(outside)
        f = sum(sig[(7, 'full', 'c13')][i] for i in outside) / len(outside)
        out.append(('{1,3}: DIAG extrapolates better to unseen sigma (mean over sigma 3.5..8)',
                    f'DIAG {fmt(d)}, FULL {fmt(f)}', 'agree' if d < f else 'disagree'))
    if (7, 'gdpp', 'per_layer') in sig and '0' in noises:
        pl = [max(x, 1e-300) for x in sig[(7, 'gdpp', 'per_layer')]]
        drops = [math.log10(pl[i] / pl[i + 1]) for i in range(len(pl) - 1)]
        early, late = sum(drops[:3]) / 3, sum(drops[-3:]) / 3
        out.append(('GD++ at sigma = 0: error falls super-linearly with depth (rule: mean log10 drop per layer '
                    'larger over the last 3 layers than the first 3, per-layer readout of the 7-layer model)',
                    f'first 3: {early:.2f}, last 3: {late:.2f} decades a layer', 'agree' if late > early else 'disagree'))
    return out


def plot(adj, base, sig, noises, models, path):
    """Figure 1 (adjusted loss against layers, a panel per noise setting) and Figure 2
    (adjusted loss against a fixed sigma, the deepest models of each parameterisation
    trained on {1, 3} or the widest setting run) of the paper, in one PNG -> a line
    saying where, or why not (matplotlib missing; no model with a finite loss: every one diverged
    or failed, and the tables say so). A model that diverged (inf) or failed (absent from adj) is
    left out of its panel, as is a baseline that is not finite."""
    if not any(math.isfinite(v) for m in models for v in adj.get(m, {}).values()):
        return 'plot skipped: no model has a finite loss to draw (every one diverged or failed: the tables say so)'
    plt = pyplot()
    if plt is None:
        return NO_PLOT
    cols = min(5, len(noises))
    rows = -(-len(noises) // cols) + 1
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.8 * rows), squeeze=False)
    colors = {'full': 'C0', 'diag': 'C1', 'gdpp': 'C2', 'CONSTRR': 'C3', 'ADARR': 'C4', 'TUNEDRR': 'C5'}
    for k, noise in enumerate(noises):
        ax = axes[k // cols][k % cols]
        for param in PARAMS:
            pts = sorted((L, adj[(L, p)][noise]) for L, p in models if p == param and noise in adj.get((L, p), {}))
            pts = [(L, max(v, 1e-16)) for L, v in pts if math.isfinite(v)]
            if pts:
                ax.plot(*zip(*pts), 'o-', color=colors[param], label=PARAM_NAMES[param])
        for name in ('CONSTRR', 'ADARR', 'TUNEDRR'):
            if math.isfinite(base[name][noise]) and base[name][noise] > 0:
                ax.axhline(base[name][noise], color=colors[name], ls='--', lw=1, label=name)
        ax.set_yscale('log')
        ax.set_title(f'sigma ~ U(0, {noise})' if noise[0].isdigit() else f'sigma in {{{",".join(noise[1:])}}}',
                     fontsize=9)
        ax.set_xlabel('layers', fontsize=8)
    for ax in axes[-2][len(noises) % cols or cols:]:
        ax.axis('off')
    axes[0][0].set_ylabel('adjusted eval loss')
    axes[0][0].legend(fontsize=6)
    deepest = max(L for L, _ in models)
    trained_on = [n for n in ('c13', 'c135', '5', '7') if n in noises][:cols] or noises[:1]
    for k in range(cols):
        ax = axes[-1][k]
        if k >= len(trained_on):
            ax.axis('off')
            continue
        for param in PARAMS:
            if (deepest, param, trained_on[k]) in sig:
                ax.plot(SIGMA_GRID, [max(v, 1e-16) if math.isfinite(v) else math.nan
                                     for v in sig[(deepest, param, trained_on[k])]], '-',
                        color=colors[param], label=f'{deepest}L {PARAM_NAMES[param]}')
        for name in ('CONSTRR', 'ADARR', 'TUNEDRR'):
            ax.plot(SIGMA_GRID, [max(v, 1e-16) if math.isfinite(v) else math.nan for v in sig[(name, trained_on[k])]],
                    '--', color=colors[name], lw=1, label=name)
        ax.set_yscale('log')
        ax.set_ylim(1e-4, 10)               # a model that blows up out of distribution leaves the panel
        ax.set_xlabel('sigma (fixed)', fontsize=8)
        ax.set_title(f'trained on {trained_on[k]}', fontsize=9)
    axes[-1][0].legend(fontsize=6)
    return save_figure(fig, path)


def lsa_report(results, jobs, models, noises, s, seeds):
    """The Table 1 report from the finished LSA models (results and jobs: one per model) -> (markdown
    text, adjusted losses of the best seed {(L, param): {noise: x}}, baselines {name: {noise: x}},
    sigma sweeps). A cell: the best seed's adjusted loss (the paper's protocol: best of seeds, chosen
    on separate prompts), the paper's in brackets, and with several seeds their mean +- half range."""
    base, sig, adj, spread, rb = {}, {}, {}, {}, {}
    oracle_sig = None
    for noise in noises:
        b, b_sig = baselines(noise, s)
        for name in ('CONSTRR', 'ADARR', 'TUNEDRR'):
            base.setdefault(name, {})[noise] = b[name] - b['ORACLE']
            sig[(name, noise)] = [x - o for x, o in zip(b_sig[name], b_sig['ORACLE'])]
        oracle_sig = b_sig['ORACLE']
        base.setdefault('ORACLE', {})[noise] = b['ORACLE']
    sweep_oracle = {n: half_sq(oracle(p), p.y_q).mean().item()
                    for n in noises for p in [fixed_prompts(n, s['sweep_prompts'], 'sweep')]}
    by_model = {}
    for (name, spec), res in zip(jobs, results):
        by_model.setdefault((spec['n_layer'], spec['param'], spec['noise']), []).append(res)
    for (L, param, noise), runs in by_model.items():
        best, evs = best_seed(runs)
        o = base['ORACLE'][noise]
        adj.setdefault((L, param), {})[noise] = best['eval'] - o
        spread[(L, param, noise)] = mean_range([e - o for e in evs], fmt, fmt) if len(evs) > 1 else None
        rb[(L, param, noise)] = best.get('rollbacks', 0)
        if best.get('finished'):
            sig[(L, param, noise)] = [x - y for x, y in zip(best['sigma_sweep'], oracle_sig)]
            if noise == '0' or noise == noises[-1]:
                sig[(L, param, 'per_layer' if noise == '0' else 'per_layer_last')] = [
                    x - sweep_oracle[noise] for x in best['per_layer']]
    rows = []
    for L, param in models:
        paper = paper_row(L, param)
        cells = []
        for noise in noises:
            if noise not in adj.get((L, param), {}):          # its job failed (runner): no model to report
                cells.append('failed')
                continue
            x = adj[(L, param)][noise]
            p = paper[NOISE_NAMES.index(noise)] if paper and noise in NOISE_NAMES else None
            cells.append(f'{fmt(x)}' + (f' ({fmt(p)})' if p is not None else '') +
                         ('*' if rb[(L, param, noise)] else '') +
                         (f' [{spread[(L, param, noise)]}]' if spread[(L, param, noise)] else ''))
        rows.append([f'{L}L {PARAM_NAMES[param]}', *cells])
    for name in ('CONSTRR', 'ADARR', 'TUNEDRR'):
        rows.append([name, *[f'{fmt(base[name][n])}' + (f' ({fmt(PAPER[name][NOISE_NAMES.index(n)])})'
                                                           if n in NOISE_NAMES else '') for n in noises]])
    header = ['model', *[f'U(0,{n})' if n[0].isdigit() else '{' + ','.join(n[1:]) + '}' for n in noises]]
    text = [md_table(header, rows), '',
            'Cells: ours (the paper\'s), adjusted evaluation loss = model minus oracle, 0.5 squared error, '
            f'{s["eval_prompts"]} fresh prompts shared by every model of a column'
            + (f'; the best of {seeds} seeds (chosen on a separate prompt set, as the paper reports the best of 5), '
               f'then in square brackets the mean +- half the range over the {seeds} seeds' if seeds > 1 else '')
            + ('; * = the training stabiliser rolled back at least once' if any(rb.values()) else '') + '.']
    return '\n'.join(text), adj, base, sig


def theory_report(results, jobs, sig, noises):
    """Theorem 4.1 and Figure 5 read off the trained LSA models: the largest deviation
    from the identities, each layer's implicit-weight loss for the deepest models, and
    the DIAG omegas -> markdown text."""
    errs = [r['theorem_err'] for r in results if r.get('finished') and 'theorem_err' in r]
    text = [f'Theorem 4.1 on every trained model ({len(errs)} models, float64, the sweep prompts): '
            f'largest |y_i^l - (a^l y_i - <w^l, x_i>)| or |y_q^l + <w^l, x_q>| after the last layer = '
            f'{max(errs):.1e}.' if errs else 'Theorem 4.1: no finished model.', '']
    deepest = max((spec['n_layer'] for _, spec in jobs), default=0)       # 0: no model finished its job
    for key, label in (('per_layer', 'sigma = 0'), ('per_layer_last', f'noise {noises[-1]}')):
        rows = [[f'{deepest}L {PARAM_NAMES[p]}', *map(fmt, sig[(deepest, p, key)])]
                for p in PARAMS if (deepest, p, key) in sig]
        if rows:
            text += [f'Adjusted loss of each layer\'s implicit weights w^l (Figure 5), {label}, sweep prompts:', '',
                     md_table(['model', *[f'l={i + 1}' for i in range(deepest)]], rows), '']
    for (name, spec), res in zip(jobs, results):
        if spec['param'] == 'diag' and spec['n_layer'] == deepest and spec['seed'] == 0 and res.get('finished') \
                and spec['noise'] == ('5' if '5' in noises else noises[-1]):
            model = LinearSelfAttention(deepest, 'diag', y_scale=y_scale(spec['noise']))
            model.load_state_dict({k: torch.tensor(v, dtype=torch.float64) for k, v in res['state'].items()},
                                  strict=False)
            om = model.omegas().tolist()
            text += [f'DIAG omegas of the {deepest}-layer model trained at noise {spec["noise"]} (the paper\'s '
                     f'Eq. 6, its coordinates):', '',
                     md_table(['layer', 'omega_xx', 'omega_xy', 'omega_yx', 'omega_yy'],
                              [[l + 1, *[f'{v:.3g}' for v in row]] for l, row in enumerate(om)]), '']
    return '\n'.join(text)


def ladder_report(ladder, base, s):
    """The budget ladder: the four verdicts that disagreed at the default budget, recomputed at each
    multiple of it on the cells that decide them. ladder: {multiple: {(L, param): {noise: adjusted
    loss}}} -> markdown text (one table: verdict rows, one column a budget, and the cells)."""
    rows, budgets = {}, sorted(ladder)
    keep = ('DIAG matches FULL', 'beats ADARR', 'matches or beats TUNEDRR')
    for b in budgets:
        noises = sorted({n for cells in ladder[b].values() for n in cells}, key=NOISE_NAMES.index)
        for claim, ours, verdict in verdicts(ladder[b], base, {}, noises):
            if any(k in claim for k in keep):
                rows.setdefault(claim, {})[b] = f'{verdict}: {ours}'
    cells = [[f'{L}L {PARAM_NAMES[p]}', f'{b:g}x', *[fmt(ladder[b][(L, p)].get(n)) for n in ('1', '3', '5', '7')]]
             for b in budgets for (L, p) in sorted(ladder[b])]
    return '\n'.join([md_table(['claim', *[f'{b:g}x ({b * s["iters"]:.0f} steps)' for b in budgets]],
                                [[c, *[v.get(b, '-') for b in budgets]] for c, v in rows.items()]), '',
                      md_table(['model', 'budget', 'U(0,1)', 'U(0,3)', 'U(0,5)', 'U(0,7)'], cells)])


def report_text(table, adj, base, sig, noises, results, jobs, s, ladder=None, plan=None, command=''):
    """The whole markdown report (OUT/icl.md) -> str: Table 1 (table, adj, base, sig: lsa_report's),
    the paper's claims as verdicts, Theorem 4.1, the budget ladder (ladder: run_ladder's eval losses,
    None: no ladder), the masked mixers (plan: icl_mixers.mixer_runs', None: none), then the command
    line (command: its arguments after python -m experiments.icl)."""
    text = ['# In-context regression (Vladymyrov et al. 2024, Table 1)', '', table, '', '## The paper\'s claims', '',
            md_table(['claim', 'ours', 'verdict'], verdicts(adj, base, sig, noises)), '',
            '## Theory (Theorem 4.1, Figure 5)', '', theory_report(results, jobs, sig, noises)]
    if ladder is not None:
        ladder = {b: {m: {n: v - base['ORACLE'][n] for n, v in c.items()} for m, c in lad.items()}
                  for b, lad in ladder.items()}
        text += ['', '## The budget ladder of the disagreeing verdicts', '', ladder_report(ladder, base, s)]
    if plan is not None:
        text += ['', '## Do masked mixers learn in context?', '', icl_mixers.mixer_report(plan, adj, s)]
    text += ['', f'Command: python -m experiments.icl {command}']
    return '\n'.join(text) + '\n'
