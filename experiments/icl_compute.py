"""In context against compute: does the masked mixer's gap to attention close with compute, stay, or grow?

    python -m experiments.icl --compute --docs docs/icl.md   # about 2 h a model on one core (2 cores: both at once)
    python -m experiments.icl --compute --device cuda        # the same rungs on a GPU (an H100: 12 min a model, both at once)
    python -m experiments.icl --compute --quick              # the same at a tiny budget (seconds)

Tong & Pehlevan 2024 ("MLPs learn in-context on regression and classification tasks", arXiv 2405.15618,
figure 1c) plot each model's excess loss against training compute and find MLP-Mixers learning in-context
regression "comparably with Transformers under the same compute budget". Here the ladder's 2-layer flat
masked mixer and 2-layer transformer (icl_mixers.SequenceRegressor, d_model 64, batches of 256 prompts,
sigma = 0, each at the rate the ladder chose for it) train far longer: one warm-up, stable, decay run a
model (icl_ladder's schedule and rung jobs), its rungs at 400k, 1.6M, 6.4M and 20M prompts (1x, 4x, 16x and
50x of 1,563 steps: fixed steps, not seconds, so the budget does not depend on the machine). Each rung's
adjusted loss (model minus the oracle; at sigma = 0 the oracle is exact and the adjusted loss is the loss)
on 20,000 fresh prompts goes against its training FLOPs (machine.flops_per_token x 21 tokens a prompt x
prompts seen: forward and backward), beside one step of gradient descent (icl_ladder.gd_step_loss).
"""

import sys

if __name__ == '__main__':       # not a command, run as a file or with -m: said before any import
    print('icl_compute.py: error: a part of icl.py, not a command: python -m experiments.icl '
          '--compute', file=sys.stderr)
    sys.exit(2)

from functools import partial
import math
import os

from experiments.icl_ladder import (fmt_count, gd_step_loss, noise_label, rung_steps, run_chain, segment_job,
                                    step_seconds)
from experiments.icl_mixers import initialised, zero_loss
from experiments.runner import NO_PLOT, md_table, pyplot, save_figure

SETTINGS = {
    'full': dict(models=(('flat', 2, 3e-3), ('transformer', 2, 1e-2)), noise='0', batch=256, base=1563,
                 rungs=(1, 4, 16, 50), d_model=64, warmup=0.1, decay=0.2, eval_prompts=20000, sweep_prompts=4000,
                 curve_prompts=1000, curve_points=5, calib_steps=100, seeds=1),
    'quick': dict(models=(('flat', 2, 3e-3), ('transformer', 2, 1e-2)), noise='0', batch=32, base=10,
                  rungs=(1, 2, 4), d_model=16, warmup=0.1, decay=0.2, eval_prompts=1000, sweep_prompts=500,
                  curve_prompts=200, curve_points=5, calib_steps=10, seeds=1),
}
BEGIN, END = '<!-- icl-compute:begin -->', '<!-- icl-compute:end -->'     # the page's generated section
FIGURE = 'icl_compute.png'


def flops_per_prompt(variant, n_layer, d_model):
    """Training FLOPs of one prompt (21 tokens: 20 pairs and the query) through the model (forward and
    backward: machine.flops_per_token's count of every Linear and the token mixing)."""
    from harness.machine import flops_per_token
    model = initialised(variant, n_layer, d_model, False, 0)
    T = model.cfg.n_ctx
    return flops_per_token(model, T) * T


def compute_runs(runner, out, C):
    """Every rung of every model's one run, cached in OUT/compute (icl_ladder.run_chain jobs, its seconds a
    step for the ETAs only), trained on C['device'] (no part of a rung's key: a run may change machines) ->
    {'rows': [(model tuple, rung, result)], 'flops': {(variant, n_layer): FLOPs a prompt}, 'results': every
    rung's result}."""
    models = [(v, n, C['noise'], C['batch'], tuple(C['rungs'])) for v, n, _ in C['models']]
    step_s = step_seconds(runner, out, C, sorted({(v, n, C['batch']) for v, n, _ in C['models']}))
    chains = [run_chain(os.path.join(out, 'compute'), C, cfg, C['base'], step_s[(cfg[0], cfg[1], cfg[3])], lr, seed,
                        cfg[4]) for cfg, (_, _, lr) in zip(models, C['models']) for seed in range(C['seeds'])]
    res = runner.chains(partial(segment_job, device=C.get('device', 'cpu')), chains,
                        'in context against compute: one run a model, every rung')
    rows = [(cfg, r, x) for cfg, rs in zip([m for m in models for _ in range(C['seeds'])], res)
            for r, x in zip(cfg[4], rs)]
    return {'rows': rows, 'flops': {m[:2]: flops_per_prompt(m[0], m[1], C['d_model']) for m in models},
            'results': [x for rs in res for x in rs]}


def at_flops(points, f):
    """The loss at FLOPs f on a model's curve `points` [(FLOPs, loss)] by linear interpolation in log-log, or
    None outside its range."""
    points = sorted(points)
    for (f0, y0), (f1, y1) in zip(points, points[1:]):
        if f0 <= f <= f1:
            t = math.log(f / f0) / math.log(f1 / f0)
            return math.exp(math.log(y0) + t * (math.log(y1) - math.log(y0)))
    return None


def compute_report(plan, C, meta=''):
    """The section: a table (model, rung, steps, prompts, training FLOPs, adjusted eval loss, and for the
    mixer the transformer's loss at the same FLOPs, interpolated in log-log between its rungs) and the
    answer: whether the mixer's loss over the transformer's at equal FLOPs falls (the gap closes), holds
    or grows from the first such rung to the last -> markdown."""
    gd, zero = gd_step_loss(C['noise'], C), zero_loss(C['noise'], C['eval_prompts'])
    (mv, mn, _), (tv, tn, _) = C['models']
    curve = {}
    for cfg, r, x in plan['rows']:
        if x['rc'] == 0 and x.get('finished'):
            curve.setdefault(cfg[:2], []).append((plan['flops'][cfg[:2]] * rung_steps(r, C['base']) * cfg[3], x['eval']))
    body, ratios = [], {}
    for cfg, r, x in plan['rows']:
        steps = rung_steps(r, C['base'])
        flops = plan['flops'][cfg[:2]] * steps * cfg[3]
        ok = x['rc'] == 0 and x.get('finished')
        ref = at_flops(curve.get((tv, tn), []), flops) if ok and cfg[:2] == (mv, mn) else None
        if ref:
            ratios[r] = x['eval'] / ref
        body.append([f'{cfg[1]}L {cfg[0]}', f'{r:g}x', steps, fmt_count(steps * cfg[3]), f'{flops:.3g}',
                     f'{x["eval"]:.4g}' if ok else 'failed' if x['rc'] != 0 else 'diverged',
                     f'{ref:.4g} ({ratios[r]:.3g}x)' if ref else '-'])
    answer = ('not answered: fewer than two mixer rungs lie inside the transformer\'s range of FLOPs (or a rung '
              'failed or diverged)')
    if len(ratios) >= 2:
        first, last = ratios[min(ratios)], ratios[max(ratios)]
        trend = 'closes' if last < first / 1.1 else 'grows' if last > first * 1.1 else 'stays'
        answer = (f'the gap {trend} with compute: at equal training FLOPs the {mn}-layer {mv} mixer\'s adjusted loss '
                  f'is {first:.3g}x the {tn}-layer {tv}\'s at its {min(ratios):g}x rung and {last:.3g}x at its '
                  f'{max(ratios):g}x rung ({fmt_count(rung_steps(max(ratios), C["base"]) * C["batch"])} prompts); a '
                  'change of less than 10% reads as "stays"')
    return '\n'.join([
        meta, '',
        md_table(['model', 'rung', 'steps', 'prompts seen', 'training FLOPs', 'adjusted eval loss',
                  f'{tn}L {tv} at the same FLOPs (mixer / it)'], body), '',
        f'Adjusted eval loss on {C["eval_prompts"]} fresh prompts ({noise_label(C["noise"])}: the oracle is exact, '
        f'so this is the loss itself); predict 0: {zero:.4g}; one GD step: {gd:.3g}. One run a model at its '
        f'rate ({", ".join(f"{n}L {v} {lr:g}" for v, n, lr in C["models"])}), batch {C["batch"]}, rung r: r x '
        f'{C["base"]} steps, warm-up, stable, the last {100 * C["decay"]:g}% decaying to 0; FLOPs: forward and '
        'backward, every Linear and the token mixing (machine.flops_per_token), 21 tokens a prompt.', '',
        f'**Answer**: {answer}.'])


def plot_compute(plan, C, path):
    """Adjusted loss against training FLOPs, log-log: each model's rungs (the end of each rung's decay, on the
    curve prompts) joined, its stable phase a thin line; one GD step and predict 0 as levels (the oracle,
    exact at sigma = 0, is the axis' floor) -> a line saying where, or why not (matplotlib missing)."""
    plt = pyplot()
    if plt is None:
        return NO_PLOT
    fig, ax = plt.subplots(figsize=(7, 5))
    for i, (v, n, _) in enumerate(C['models']):
        per = plan['flops'][(v, n)] * C['batch']
        rows = [(r, x) for cfg, r, x in plan['rows'] if cfg[:2] == (v, n) and x['rc'] == 0 and x.get('finished')]
        trace = [pt for _, x in rows for pt in x['curve']]
        if trace:
            ax.plot([pt[0] * per for pt in trace], [max(pt[2], 1e-4) for pt in trace], color=f'C{i}', lw=0.6,
                    alpha=0.5)
        pts = [(rung_steps(r, C['base']) * per, max(x['branch'][-1][2], 1e-4)) for r, x in rows if x['branch']]
        if pts:
            ax.plot(*zip(*pts), 'o-', color=f'C{i}', lw=1.5, ms=4, label=f'{n}L {v}')
    ax.axhline(zero_loss(C['noise'], C['curve_prompts'], 'curve'), color='grey', lw=3, alpha=0.4, label='predict 0')
    ax.axhline(gd_step_loss(C['noise'], C, 'curve'), color='k', ls=(0, (5, 5)), lw=1, label='one GD step')
    ax.set(xscale='log', yscale='log', xlabel='training FLOPs', ylabel=f'adjusted loss ({C["curve_prompts"]} curve '
           'prompts; the oracle: 0)', title=f'In context against compute ({noise_label(C["noise"])})')
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)
