"""Do masked mixers learn in context? mixer.py's sequence models on icl.py's regression prompts,
at equal wall-clock per model, and a diagnostic of where one step of gradient descent fails.

One step of gradient descent from w = 0 predicts y_hat = eta <x_q, X^T y> = eta sum_i y_i <x_i, x_q>
(von Oswald et al. 2023). A masked mixer's token mixing has weights fixed per pair of positions, not
computed from the tokens, so to take that step its per-token MLPs must form the products y_i x_i
(step 1), its mixing must sum them into the query's position, X^T y (step 2), and the query's MLP must
take the inner product with x_q (step 3). The diagnostic separates the three:
  features  the same models given y_i x_i as extra input features (step 1 done for them): if they
            then learn, forming the products is what fails;
  probes    linear probes (ridge, fitted on 3/4 of the sweep prompts, R^2 on the rest) of each trained
            model's hidden states: y_i x_i at the context positions after block 1 (step 1), X^T y at
            the query after the last block (step 2); a model that holds X^T y at the query but does
            not predict fails at step 3. The same probes of the untrained models (same seeds) say
            what random features already give.

Protocol (the claims' at equal compute): each model's step time is calibrated in the pool it trains in
(two runs at a time, one thread each); its step count is budget / step time; a learning-rate sweep
on a proxy (the first third of the schedule, seed 0) over --mixer_lrs, widened by a factor 3 past an
edge that wins (twice at most), then `mixer_seeds` seeds at the chosen rate.
"""

import sys

if __name__ == '__main__':       # not a command, run as a file or with -m: said before any import
    print('icl_mixers.py: error: a part of icl.py, not a command: python -m experiments.icl --mixers', file=sys.stderr)
    sys.exit(2)

import math
import os
import time

import torch
import torch.nn as nn

import mixer
from experiments.regression import (D_X, N_CTX, PARAM_NAMES, VERSION, fixed_prompts, half_sq, mean_loss, oracle,
                                    sample_prompts, train)
from experiments.runner import NO_PLOT, job, md_table, mean_range, pyplot, save_figure, step_times

MIXER_VARIANTS = ('transformer', 'flat', 'toeplitz', 'recurrent', 'linear_attention')
MIXER_NOISE = ('0', '5')


class SequenceRegressor(nn.Module):
    """The prompt through one of mixer.py's sequence models (Badger 2024's masked mixers, the
    transformer, linear attention): tokens (x_i, y_i) and the query (x_q, 0), in that order,
    projected to d_model, through n_layer of mixer.py's Block (its mixing, MLP and norms,
    unchanged); y_hat is read by a Linear at the query (last) position. n_ctx = n + 1. With
    products=True every context token also carries y_i x_i (the query zeros): the diagnostic's
    first step done for the model. float32; Prompts -> y_hat float [B]. ValueError: unknown variant."""

    def __init__(self, variant, n_layer, d_model, products=False, d=D_X, n=N_CTX):
        super().__init__()
        self.cfg = mixer.variant_config(variant, n_ctx=n + 1, d_model=d_model, n_layer=n_layer, n_head=1,
                                        vocab_size=1)
        self.products = products
        self.read_in = nn.Linear(2 * d + 1 if products else d + 1, d_model)
        self.blocks = nn.ModuleList(mixer.Block(self.cfg) for _ in range(n_layer))
        self.norm_f = mixer.make_norm(self.cfg)
        self.read_out = nn.Linear(d_model, 1)

    def tokens(self, prompts):
        """Input vectors float32 [B, n + 1, d + 1] (or [B, n + 1, 2 d + 1] with products), on the model's
        device (prompts are made on the CPU)."""
        context, query = prompts.tokens()
        if self.products:
            context = torch.cat([context, prompts.y[..., None] * prompts.x], -1)
            query = torch.cat([query, torch.zeros_like(prompts.x_q[:, None])], -1)
        return torch.cat([context, query], 1).float().to(self.read_in.weight.device)

    def hidden(self, prompts):
        """The residual stream after each block: list of float [B, n + 1, d_model]."""
        x, out = self.read_in(self.tokens(prompts)), []
        for block in self.blocks:
            x = block(x)
            out.append(x)
        return out

    def forward(self, prompts):
        return self.read_out(self.norm_f(self.hidden(prompts)[-1][:, -1]))[:, 0]


@torch.no_grad()
def probe_r2(h, target, lam=1e-3):
    """R^2 on held-out rows of a ridge probe target ~ h: h float [M, k], target float [M, m], the
    first 3/4 of the rows to fit, the rest to test -> float (1: decodable linearly; 0: not at all)."""
    h, target = h.double(), target.double()
    cut = 3 * len(h) // 4
    mu, tm = h[:cut].mean(0), target[:cut].mean(0)
    a = h[:cut] - mu
    w = torch.linalg.solve(a.T @ a + lam * len(a) * torch.eye(h.shape[1], dtype=h.dtype), a.T @ (target[:cut] - tm))
    resid = (h[cut:] - mu) @ w + tm - target[cut:]
    return 1 - (resid ** 2).sum().item() / ((target[cut:] - target[cut:].mean(0)) ** 2).sum().item()


@torch.no_grad()
def diagnose(model, prompts):
    """The probes of the module docstring on `prompts` -> {'products': R^2 of y_i x_i at the context
    positions after block 1, 'sum_first': of X^T y at the query after block 1, 'sum_last': after the
    last block}."""
    hs = [h.cpu() for h in model.hidden(prompts)]
    n = prompts.x.shape[1]
    xty = (prompts.y[..., None] * prompts.x).sum(1).float()                     # X^T y: [B, d]
    prod = (prompts.y[..., None] * prompts.x).float().reshape(-1, prompts.x.shape[-1])
    return {'products': probe_r2(hs[0][:, :n].reshape(-1, hs[0].shape[-1]), prod),
            'sum_first': probe_r2(hs[0][:, -1], xty), 'sum_last': probe_r2(hs[-1][:, -1], xty)}


PROBES = ('products', 'sum_first', 'sum_last')
PROBE_HEADER = ['R^2 y_i x_i (context, block 1)', 'R^2 X^T y (query, block 1)', 'R^2 X^T y (query, last block)']


def probe_cells(probes):
    """diagnose()'s results of several seeds -> the table's three cells (runner.mean_range of each probe)."""
    return [mean_range([p[k] for p in probes]) for k in PROBES]


def untrained_probes(variant, n_layer, d_model, noise, s, seeds):
    """probe_cells of the model before training (what random features give), seeds 0 .. seeds - 1, on the
    sweep prompts of `noise` (s['sweep_prompts'] of them)."""
    sweep = fixed_prompts(noise, s['sweep_prompts'], 'sweep')
    return probe_cells([diagnose(initialised(variant, n_layer, d_model, False, seed).eval(), sweep)
                        for seed in range(seeds)])


def initialised(variant, n_layer, d_model, products, seed):
    """A SequenceRegressor as every run starts it: initialised from torch.manual_seed(seed)."""
    torch.manual_seed(seed)
    return SequenceRegressor(variant, n_layer, d_model, products)


def adam_step(model, opt, batch_size, noise, gen):
    """One training step of a SequenceRegressor as icl_ladder's rungs take it: batch_size fresh prompts of
    `noise` from the generator gen (float32), the loss mean 0.5 (y_hat - y_q)^2, then (unless it is not
    finite: no step) the gradients clipped at norm 1 and opt's step -> the loss (a 0-d tensor, on the model's
    device; the prompts are drawn on the CPU, so a run on a GPU sees the same prompts)."""
    p = sample_prompts(batch_size, noise, gen, dtype=torch.float32)
    y_hat = model(p)
    loss = half_sq(y_hat, p.y_q.to(y_hat.device)).mean()
    if torch.isfinite(loss):
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return loss


def regressor_step(variant, n_layer, d_model, products, batch_size, device='cpu'):
    """runner.step_time_job's builder (the step times of this module's runs and of icl_ladder's): adam_step
    of a SequenceRegressor (Adam at 1e-3) on `device` on batch_size fresh prompts of sigma = 0 -> step()."""
    model = initialised(variant, n_layer, d_model, products, 0).to(device)
    opt, gen = torch.optim.Adam(model.parameters(), lr=1e-3), torch.Generator().manual_seed(0)
    return lambda: adam_step(model, opt, batch_size, '0', gen)


def seq_job(spec, run_dir=None):
    """Runner job of one sequence model. spec: 'variant', 'n_layer', 'd_model', 'products', 'noise',
    'seed', 'batch_size', 'iters', 'lr', 'eval_prompts' (0: a sweep proxy, no evaluation set and no
    probes), 'sweep_prompts', 'curve_prompts' -> {'rc', 'line', 'seconds', 'params', 'curve' [(step, train
    loss, adjusted loss on curve_prompts)], 'sweep', 'eval' (adjusted losses: mean 0.5 (y_hat - y_q)^2
    minus the oracle's on the same prompts), 'probes' (diagnose on the sweep prompts)}."""
    model = initialised(spec['variant'], spec['n_layer'], spec['d_model'], spec['products'], spec['seed'])
    t0 = time.time()
    curve_set = fixed_prompts(spec['noise'], spec['curve_prompts'], 'curve')
    curve, _, finished = train(model, spec['noise'], spec['iters'], spec['batch_size'], spec['lr'], spec['seed'],
                               evaluate=lambda: adjusted_loss(model, curve_set))
    model.eval()
    res = {'rc': 0, 'curve': curve, 'params': sum(p.numel() for p in model.parameters()), 'finished': finished}
    if not finished:
        return {**res, 'eval': math.inf, 'sweep': math.inf, 'line': 'diverged', 'seconds': time.time() - t0}
    sweep = fixed_prompts(spec['noise'], spec['sweep_prompts'], 'sweep')
    res['sweep'] = adjusted_loss(model, sweep)
    if spec['eval_prompts']:
        res.update(eval=adjusted_loss(model, fixed_prompts(spec['noise'], spec['eval_prompts'], 'eval')),
                   probes=diagnose(model, sweep))
    res['seconds'] = time.time() - t0
    res['line'] = f"adjusted {'eval' if spec['eval_prompts'] else 'sweep'} loss {res.get('eval', res['sweep']):.4g}, " \
                  f"{res['seconds']:.0f} s"
    return res


def zero_loss(noise, count, purpose='eval'):
    """The adjusted loss of predicting 0 (no in-context learning) on the fixed prompts (noise, count,
    purpose) -> float (near 0.5 d = 5 minus the oracle's: E y_q^2 = d for w, x_q ~ N(0, I))."""
    return adjusted_loss(lambda p: torch.zeros_like(p.y_q), fixed_prompts(noise, count, purpose))


def adjusted_loss(model, prompts):
    """Mean 0.5 (y_hat - y_q)^2 of the model minus the oracle's (ridge with the true sigma) on the
    same prompts -> float."""
    return mean_loss(model, prompts) - half_sq(oracle(prompts), prompts.y_q).mean().item()


# ----------------------------------------------------------------------------- the runs

def calibrate(runner, out, s, keys):
    """Seconds per training step of each (variant, L, products) (regressor_step in runner.step_times: measured
    in the pool as the runs go, two at a time, one thread each; cached with the runs) -> {key: s_per_step}.
    RuntimeError if one fails."""
    return {k: t[0] for k, t in step_times(runner, os.path.join(out, 'mixers'), {
        (v, L, p): (f'calibrate-{v}-L{L}{"-products" * p}', 'experiments.icl_mixers:regressor_step',
                    dict(variant=v, n_layer=L, d_model=s['mixer_d_model'], products=p, batch_size=s['mixer_batch']))
        for v, L, p in keys}, s['mixer_calib_steps'], VERSION, 'mixers: step-time calibration').items()}


def run_spec(s, key, noise, lr, seed, steps, proxy=False):
    """(run folder name, spec) of a training run (a sweep proxy: not evaluated on the eval set)."""
    v, L, p = key
    return (f'{v}-L{L}{"-products" * p}-noise{noise}-lr{lr:g}-seed{seed}-steps{steps}',
            dict(variant=v, n_layer=L, d_model=s['mixer_d_model'], products=p, noise=noise, seed=seed,
                 batch_size=s['mixer_batch'], iters=steps, lr=lr, eval_prompts=0 if proxy else s['mixer_eval_prompts'],
                 sweep_prompts=s['sweep_prompts'], curve_prompts=s['curve_prompts']))


def sweep_lrs(runner, out, s, cells, steps_of):
    """The learning-rate sweep of every cell (key, noise) on the proxy (a third of the steps, seed 0),
    widened past a winning edge by a factor 3, twice at most -> {cell: {lr: sweep-set loss}}."""
    tried = {c: {} for c in cells}
    todo = {c: list(s['mixer_lrs']) for c in cells}
    for _ in range(3):
        jobs = [(c, lr, run_spec(s, c[0], c[1], lr, 0, max(1, steps_of[c[0]] // 3), proxy=True))
                for c in cells for lr in todo[c]]
        if not jobs:
            break
        res = runner.map(seq_job, [job(os.path.join(out, 'mixers'), name, spec, spec['iters'] / steps_of[c[0]]
                                       * s['mixer_budget_s'], VERSION) for c, lr, (name, spec) in jobs],
                         'mixers: learning-rate sweep (proxy: the first third of each schedule)')
        for (c, lr, _), r in zip(jobs, res):
            tried[c][lr] = r['sweep'] if r['rc'] == 0 else math.inf
        todo = {}
        for c in cells:
            lrs, best = sorted(tried[c]), min(tried[c], key=tried[c].get)
            if len(lrs) > 1 and best in (lrs[0], lrs[-1]) and len(lrs) < len(s['mixer_lrs']) + 2:
                todo[c] = [best / 3 if best == lrs[0] else best * 3]
        todo = {c: v for c, v in todo.items() if v}
        cells = list(todo)
    return tried


def mixer_runs(runner, out, s):
    """Every model of the comparison and of the diagnostic -> {'step_s': {key: s}, 'sweeps': {cell:
    {lr: loss}}, 'runs': {cell: [seq_job result per seed]}, 'lr': {cell: lr}}; cell = ((variant, L,
    products), noise)."""
    keys = [(v, L, False) for v in MIXER_VARIANTS for L in s['mixer_layers']]
    diag = [(v, min(s['mixer_layers']), True) for v in MIXER_VARIANTS]
    step_s = calibrate(runner, out, s, keys + diag)
    steps_of = {k: max(3, round(s['mixer_budget_s'] / step_s[k])) for k in step_s}
    cells = [(k, n) for k in keys for n in MIXER_NOISE]
    sweeps = sweep_lrs(runner, out, s, cells, steps_of)
    lr = {c: min(sweeps[c], key=sweeps[c].get) for c in cells}
    dcells = [((v, L, True), MIXER_NOISE[0]) for v, L, _ in diag]        # the plain model's rate, at sigma = 0
    lr.update({c: lr[((c[0][0], c[0][1], False), c[1])] for c in dcells})
    jobs = [(c, run_spec(s, c[0], c[1], lr[c], seed, steps_of[c[0]]))
            for c in cells + dcells for seed in range(s['mixer_seeds'] if c in cells else 1)]
    res = runner.map(seq_job, [job(os.path.join(out, 'mixers'), name, spec, s['mixer_budget_s'], VERSION)
                               for _, (name, spec) in jobs], 'mixers: full budget at the chosen learning rates')
    runs = {}
    for (c, _), r in zip(jobs, res):
        runs.setdefault(c, []).append(r)
    return {'step_s': step_s, 'steps': steps_of, 'sweeps': sweeps, 'runs': runs, 'lr': lr}


# ----------------------------------------------------------------------------- the report

def runs_stat(runs, key='eval'):
    """runner.mean_range of the runs' `key`, or 'failed' when one of them failed (rc != 0: never read as
    diverged)."""
    if any(r.get('rc') != 0 for r in runs):
        return 'failed'
    return mean_range([r[key] for r in runs])


def mixer_report(plan, lsa, s):
    """The mixers' table (adjusted eval loss, mean +- half range over seeds, chosen lr, steps, the
    lrs swept), the reference lines, and the diagnostic table -> markdown text. lsa: {(L, param):
    {noise: adjusted}} of Table 1's best seeds."""
    rows = []
    for (key, noise), runs in plan['runs'].items():
        if key[2]:
            continue
        rows.append([f'{key[1]}L {key[0]}', next((r['params'] for r in runs if 'params' in r), '-'),
                     'sigma = 0' if noise == '0' else f'U(0,{noise})',
                     runs_stat(runs), f'{plan["lr"][(key, noise)]:g}', plan['steps'][key],
                     ', '.join(f'{lr:g}: {v:.3g}' for lr, v in sorted(plan['sweeps'][(key, noise)].items()))])
    for noise in MIXER_NOISE:
        label = 'sigma = 0' if noise == '0' else f'U(0,{noise})'
        for L, p in ((1, 'diag'), (2, 'diag')):
            if (L, p) in lsa and noise in lsa[(L, p)]:
                what = ' (one step of gradient descent)' if L == 1 else ''
                rows.append([f'{L}L LSA {PARAM_NAMES[p]}{what}', 4 * L, label, f'{lsa[(L, p)][noise]:.3g}', '', '', ''])
        zero = zero_loss(noise, s['mixer_eval_prompts'])
        rows.append(['predict 0 (no in-context learning)', 0, label, f'{zero:.4g}', '', '', ''])
    drows = []
    for (key, noise), runs in plan['runs'].items():
        if noise != MIXER_NOISE[0] or key[1] != min(s['mixer_layers']):
            continue
        pr = [r['probes'] for r in runs if r.get('probes')]
        drows.append((2 * key[2], f'{key[1]}L {key[0]}{" given y_i x_i" * key[2]}', runs_stat(runs),
                      *probe_cells(pr)))
        if not key[2]:                         # the same probes before training: what random features give
            drows.append((1, f'{key[1]}L {key[0]} at initialisation', '',
                          *untrained_probes(key[0], key[1], s['mixer_d_model'], noise, s, len(runs))))
    drows = [list(r[1:]) for r in sorted(drows, key=lambda r: r[0])]
    return '\n'.join([
        md_table(['model', 'parameters', 'noise', 'adjusted eval loss', 'lr', 'steps',
                  'sweep (lr: proxy adjusted loss)'], rows), '',
        f'Each sequence model: d_model {s["mixer_d_model"]}, batches of {s["mixer_batch"]} prompts, float32, '
        f'{s["mixer_budget_s"]:g} s of training (steps = budget / its calibrated step time), its own '
        f'learning-rate sweep on {s["sweep_prompts"]} separate prompts, {s["mixer_seeds"]} seeds; adjusted eval loss '
        f'(the oracle\'s on the same prompts subtracted) on {s["mixer_eval_prompts"]} fresh prompts a noise '
        'setting.', '',
        '### Where one step of gradient descent fails', '',
        md_table(['model (sigma = 0)', 'adjusted loss', *PROBE_HEADER], drows), '',
        'R^2: linear (ridge) probes of the models\' hidden states, fitted on 3/4 of the sweep prompts and '
        'scored on the rest ("at initialisation": before training, the same seeds). "given y_i x_i": the same '
        'model with y_i x_i as extra input features, trained at the '
        'plain model\'s learning rate, 1 seed.'])


def plot_mixers(plan, lsa, path, s):
    """Adjusted loss on the curve prompts against prompts seen for every model (mean over seeds;
    dotted: given y_i x_i), a panel per noise, with one step of gradient descent (1-layer LSA),
    2-layer DIAG and the zero predictor (on the same curve prompts) as lines -> a
    line saying where, or why not (matplotlib missing)."""
    plt = pyplot()
    if plt is None:
        return NO_PLOT
    fig, axes = plt.subplots(1, len(MIXER_NOISE), figsize=(7 * len(MIXER_NOISE), 5), squeeze=False)
    for ax, noise in zip(axes[0], MIXER_NOISE):
        for (key, n), runs in ((c, r) for c, r in plan['runs'].items() if c[1] == noise):
            curves = [r['curve'] for r in runs if r.get('finished', True) and r['curve']]
            if not curves:
                continue
            xs = [c[0] * s['mixer_batch'] for c in curves[0]]
            ys = [max(sum(c[k][2] for c in curves) / len(curves), 1e-6) for k in range(len(xs))]
            style = ':' if key[2] else '-' if key[1] == min(s['mixer_layers']) else '--'
            ax.plot(xs, ys, style, color=f'C{MIXER_VARIANTS.index(key[0])}', lw=1 if key[2] else 1.5,
                    label=f'{key[1]}L {key[0]}{" given y_i x_i" * key[2]}')
        for (L, p), style, label in (((1, 'diag'), (0, (5, 5)), 'one GD step (1L LSA)'),
                                     ((2, 'diag'), '-.', '2L DIAG')):
            if (L, p) in lsa and noise in lsa[(L, p)]:
                ax.axhline(lsa[(L, p)][noise], color='k', ls=style, lw=1, label=label)
        ax.axhline(zero_loss(noise, s['curve_prompts'], 'curve'), color='grey', ls='-', lw=3, alpha=0.4,
                   label='predict 0')
        ax.set_xscale('log')
        ax.set_yscale('log')
        ax.set_xlabel('prompts seen')
        ax.set_ylabel('adjusted loss (curve prompts)')
        ax.set_title('sigma = 0' if noise == '0' else f'sigma ~ U(0, {noise})')
        ax.legend(fontsize=7, ncol=2)
        ax.grid(alpha=0.3)
    return save_figure(fig, path)
