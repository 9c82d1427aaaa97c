"""The masked-mixer papers' claims, reproduced at equal compute on this machine.

    python -m experiments.claims                 # the full comparison (about 2 h on 2 CPU cores with everything)
    python -m experiments.claims --quick         # tiny models and budgets: every row in about 3 minutes
    python -m experiments.claims --budget 2      # twice the training time for every run
    python -m experiments.claims --models flat,transformer     # only these models (and the rows they make)
    python -m experiments.claims --models flat,toeplitz,recurrent,transformer --budgets 1,6   # the budget sweep

Every model trains for the same wall-clock budget on the machine it runs on.
First each model's step time is measured by train.py itself (a short run, two
runs at a time, one thread each, as the real runs go); its max_iters is then
budget / step time, so that its cosine schedule ends on time. The step times
are cached in OUT/calibration.json, so a rerun trains the same step counts
(--recalibrate measures again).

Same tuning effort for every model: a learning-rate sweep over --lrs on a proxy
(the first third of the full schedule, seed 0), the best of which is continued
to the full budget (resuming its checkpoint: the same run as if uninterrupted);
then further seeds at that learning rate from scratch. Every model has the shape
and optimiser settings of config/tinystories_cpu.py (d_model 128, 4 layers,
n_ctx 256, batch 8, beta2 0.99, token mixing at 0.3x the learning rate); only
the variant, and the learning rate found by the sweep, differ.

Representation, on the trained checkpoints of every seed: the autoencoders of
AE_MODELS (n_ctx 8, batch 32, lr 1e-3, mixing at 1x: chosen by a sweep, see the
README; the same budget as a language model); retrieval.py on the flat and
transformer embeddings, each beside an untrained twin and with mean pooling, and
on the autoencoders' encoders (the papers' negative control); represent.py (input
representation accuracy, self and non-self, depth 1 and all) on REPRESENT_MODELS
and their untrained twins.

The budget sweep (--budgets 1,6: the budget and 6 times it) trains BUDGET_MODELS at
each budget, each with its own learning-rate sweep (over --lrs) and the same seeds, and the flat
mixer with its mixing matrices regularised (REGULARISE) at the largest budget; then
every final checkpoint is measured on the fixed training and validation windows
(runner.window_loss_job): the generalisation gap. Output: its section in claims.md, its
rows, OUT/budgets.png.

Each finished run writes result.json in its folder under OUT/runs; a killed
claims.py resumes where it stopped and a rerun costs nothing. Output: the
markdown table on stdout and in OUT/claims.md, every run in OUT/runs.jsonl,
and OUT/curves.png (validation loss against training seconds, and the
autoencoders' accuracy and loss; needs matplotlib).

Claims and papers: Badger 2024, "Masked Mixers for Language Generation and
Retrieval" (arXiv 2409.01482), and the blog posts Masked Mixers II, Masked
Mixers IV: Linear Language Models and Masked Recurrent Mixers.
"""

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import time

import numpy as np

from experiments.runner import ROOT, Runner, fmt_s, md_table, reset_dir, say, window_loss_job
CONFIG = os.path.join('config', 'tinystories_cpu.py')   # paths relative to ROOT: runs are started there

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
    'kernel4': (['--variant=kernel', '--kernel=4'], 'mixer'),
    'kernel4_embed': (['--variant=kernel', '--kernel=4', '--embed_linear=True'], 'mixer'),
    'hybrid': (['--variant=hybrid'], 'hybrid'),
    'hybrid_parallel': (['--variant=hybrid_parallel'], 'hybrid'),
    'recurrent': (['--variant=recurrent'], 'mixer'),
    'linear': (['--variant=linear'], 'mixer'),
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

SETTINGS = {   # default run and --quick
    'full': dict(budget_s=150.0, lrs=(1e-3, 3e-3, 9e-3), seeds=2, calib_steps=30, shape=[],
                 ae_shape=['--n_ctx=8', '--n_layer=2', '--batch_size=32', '--mixing_lr_mult=1.0'],
                 ae_budget=1.0, ae_lr=1e-3, budgets=(), reg_seeds=1,
                 mem_lengths=(256, 512, 1024, 2048), mem_shape=['--mem_d_model', '128', '--mem_n_layer', '4'],
                 retrieval=['--max_pairs', '2000', '--steps', '1000', '--n_candidates', '32', '128'],
                 represent=['--T', '16', '--windows', '4', '--positions', '8', '--steps', '600']),
    'quick': dict(budget_s=1.0, lrs=(3e-3,), seeds=2, calib_steps=6,
                  shape=['--d_model=32', '--n_layer=1', '--n_ctx=32', '--batch_size=4', '--eval_windows=8'],
                  ae_shape=['--n_ctx=8'], ae_budget=0.5, ae_lr=3e-3, budgets=(1, 2), reg_seeds=1,
                  mem_lengths=(32, 64), mem_shape=['--mem_d_model', '32', '--mem_n_layer', '1'],
                  retrieval=['--max_pairs', '200', '--steps', '20', '--embed_batch', '16', '--n_candidates', '32'],
                  represent=['--T', '12', '--windows', '1', '--positions', '3', '--steps', '10']),
}


def fail(msg):
    """Print a one-line error and exit with status 2."""
    print(f'claims.py: error: {msg}', file=sys.stderr)
    sys.exit(2)


# ----------------------------------------------------------------------------- the comparison

def train_args(base, model, extra):
    """train.py's argv for a MODELS or REGULARISE name (or neither: base and extra alone)."""
    own = MODELS[model][0] if model in MODELS else REGULARISE.get(model, [])
    return [CONFIG, *base, *own, *extra]


def calibrate(runner, out, names, base, steps, recalibrate):
    """Median ms per training step of each name (a MODELS name, or 'ae:NAME') measured by
    train.py under the run conditions -> {name: seconds per step}; cached in OUT/calibration.json."""
    path = os.path.join(out, 'calibration.json')
    cal = {} if recalibrate or not os.path.isfile(path) else json.load(open(path))
    todo = [n for n in names if n not in cal or cal[n]['argv_base'] != base]
    jobs = []
    for n in todo:
        model, extra = (n[3:], base['ae']) if n.startswith('ae:') else (n, [])
        argv = train_args(base['lm'], model, [*extra, f'--max_iters={steps}', '--eval_interval=100000',
                                               '--log_interval=5', '--save_checkpoint=False',
                                               f'--out_dir={os.path.join(out, "calibration", n)}'])
        jobs.append((os.path.join(out, 'calibration', n), argv, 10 + 0.5 * steps, None))   # a guess: ~0.5 s a step
        shutil.rmtree(jobs[-1][0], ignore_errors=True)        # measured now, never taken from a cache
    if jobs:
        say('calibration: the step times measured now fix every run\'s step count, so nothing else '
            'may run on this machine until the calibration ends')
    for n, res in zip(todo, runner.train_batch(jobs, 'calibration') if jobs else []):
        logs = [json.loads(l) for l in open(os.path.join(out, 'calibration', n, 'log.jsonl'))]
        ms = [r['ms_per_step'] for r in logs if r.get('event') == 'train']
        if res['rc'] != 0 or not ms:
            fail(f'calibration run of {n} failed: see {os.path.join(out, "calibration", n, "console.txt")}')
        cal[n] = {'s_per_step': statistics.median(ms[1:] or ms) / 1000, 'argv_base': base}
    with open(path + '.tmp', 'w') as f:
        json.dump(cal, f, indent=1)
    os.replace(path + '.tmp', path)
    return {n: cal[n]['s_per_step'] for n in names}


def lm_runs(runner, runs_dir, models, base, step_s, budget_s, lrs, seeds):
    """The sweep and the seeds of every model, each run in RUNS_DIR/model/lrLR-seedS ->
    {model: {'lr', 'sweep', 'runs', 'dirs', 'steps', 'command'}}."""
    plan = {}
    for m in models:
        steps = max(12, round(budget_s / step_s[m]))
        proxy = steps // 3 if len(lrs) > 1 else steps
        plan[m] = dict(steps=steps, proxy=proxy, schedule=[
            f'--lr_decay_iters={steps}', f'--warmup_iters={max(2, steps // 30)}',
            f'--eval_interval={max(1, steps // 4)}'])

    def argv(m, lr, seed, iters, run_dir, resume=False):
        return train_args(base['lm'], m, [f'--learning_rate={lr:g}', f'--min_lr={lr / 10:g}', f'--seed={seed}',
                                           f'--max_iters={iters}', *plan[m]['schedule'], f'--out_dir={run_dir}',
                                           *(['--init_from=resume'] if resume else [])])

    def rdir(m, lr, seed, tag=''):
        return os.path.join(runs_dir, m, f'lr{lr:g}-seed{seed}{tag}')

    if len(lrs) > 1:
        jobs = [(rdir(m, lr, 0, '-proxy'), argv(m, lr, 0, plan[m]['proxy'], rdir(m, lr, 0, '-proxy')),
                 plan[m]['proxy'] * step_s[m], None) for m in models for lr in lrs]
        res = iter(runner.train_batch(jobs, 'learning-rate sweep (proxy: first third of each schedule)'))
        for m in models:
            plan[m]['sweep'] = {lr: final_loss(next(res)) for lr in lrs}
            plan[m]['lr'] = min(lrs, key=lambda lr: plan[m]['sweep'][lr])
    else:
        for m in models:
            plan[m]['sweep'], plan[m]['lr'] = {}, lrs[0]

    def from_proxy(m):
        def prepare(run_dir):
            reset_dir(run_dir)
            src = rdir(m, plan[m]['lr'], 0, '-proxy')
            for f in ('ckpt.pt', 'log.jsonl'):
                shutil.copy(os.path.join(src, f), os.path.join(run_dir, f))
        return prepare

    jobs = []
    for m in models:
        lr, steps = plan[m]['lr'], plan[m]['steps']
        for seed in range(seeds):
            d = rdir(m, lr, seed)
            resume = seed == 0 and len(lrs) > 1 and math.isfinite(plan[m]['sweep'][lr])
            jobs.append((d, argv(m, lr, seed, steps, d, resume), (steps - plan[m]['proxy'] * resume) * step_s[m],
                         from_proxy(m) if resume else None))
    res = iter(runner.train_batch(jobs, 'full budget at the chosen learning rates'))
    for m in models:
        plan[m]['runs'] = [next(res) for _ in range(seeds)]
        plan[m]['dirs'] = [rdir(m, plan[m]['lr'], s) for s in range(seeds)]
        plan[m]['command'] = 'python train.py ' + ' '.join(argv(m, plan[m]['lr'], 0, plan[m]['steps'], f'out/{m}'))
    return plan


def ae_runs(runner, out, base, step_s, budget_s, lr, seeds):
    """The autoencoders of AE_MODELS: the AE shape, learning rate `lr` (chosen by the sweep
    in the README), budget_s of training each, `seeds` seeds -> {'ae': {model: [(val loss,
    token accuracy) per seed]}, 'ae_untrained_acc': token accuracy at step 0, 'ae_dirs':
    {model: [run folder per seed]}, 'ae_runs': {model: [train.py result per seed]}}."""
    dirs, jobs = {}, []
    for m in AE_MODELS:
        steps = max(12, round(budget_s / step_s[f'ae:{m}']))
        dirs[m] = [os.path.join(out, 'runs', f'ae_{m}', f'lr{lr:g}-seed{seed}') for seed in range(seeds)]
        for seed, d in enumerate(dirs[m]):
            argv = train_args(base['lm'], m, [*base['ae'], f'--learning_rate={lr:g}', f'--min_lr={lr / 10:g}',
                                              f'--seed={seed}', f'--max_iters={steps}',
                                              f'--warmup_iters={max(2, steps // 30)}',
                                              f'--eval_interval={max(1, steps // 8)}', f'--out_dir={d}'])
            jobs.append((d, argv, steps * step_s[f'ae:{m}'], None))
    res = iter(runner.train_batch(jobs, 'autoencoders'))
    runs = {m: [next(res) for _ in range(seeds)] for m in AE_MODELS}
    ok = [r for m in runs for r in runs[m] if r['rc'] == 0 and r['evals']]
    return {'ae': {m: [(r['evals'][-1][1], r['evals'][-1][3]) if r['rc'] == 0 and r['evals'] else
                       (float('nan'), float('nan')) for r in runs[m]] for m in AE_MODELS},
            'ae_untrained_acc': max(r['evals'][0][3] for r in ok) if ok else float('nan'),
            'ae_dirs': dirs, 'ae_runs': runs}


def budget_runs(runner, out, plan, base, step_s, budget_s, budgets, lrs, seeds, reg_seeds):
    """The budget sweep: BUDGET_MODELS (those in plan) at each multiple b of budget_s, each
    with its own sweep over lrs and `seeds` seeds (b == 1: the main plan's runs), in
    OUT/runs_budgetB; REGULARISE at the largest budget, at the flat mixer's learning rate
    there, `reg_seeds` seeds; then every final checkpoint on the fixed training and
    validation windows -> {'budgets': {b: plan}, 'windows': {'b:model': [window_loss_job
    result per seed]}}; plan as lm_runs', REGULARISE's under the largest budget."""
    models = [m for m in BUDGET_MODELS if m in plan]
    runs_dir = {b: os.path.join(out, 'runs' if b == 1 else f'runs_budget{b:g}') for b in budgets}
    sweep = {}
    for b in budgets:
        sweep[b] = {m: plan[m] for m in models} if b == 1 else lm_runs(
            runner, runs_dir[b], models, base, step_s, b * budget_s, lrs, seeds)
    top = max(budgets)
    if 'flat' in models:
        reg_step_s = {**step_s, **{n: step_s['flat'] for n in REGULARISE}}   # the same step as the flat mixer's
        sweep[top].update(lm_runs(runner, runs_dir[top],
                                  list(REGULARISE), base, reg_step_s, top * budget_s, (sweep[top]['flat']['lr'],),
                                  reg_seeds))
    jobs, keys = [], []
    for b, bplan in sweep.items():
        for m, p in bplan.items():
            for d in p['dirs']:
                jobs.append((os.path.join(d, 'windows'), [os.path.join(d, 'ckpt.pt')], 5.0, None))
                keys.append(f'{b:g}:{m}')
    windows = {}
    for k, res in zip(keys, runner.map(window_loss_job, jobs, 'train and validation windows of every budget run')):
        windows.setdefault(k, []).append(res)
    return {'budgets': sweep, 'windows': windows}


def window_gaps(extras, b, m):
    """(val losses, train-window losses, gaps) per seed of model m at budget b, in nats/token."""
    ws = extras['windows'][f'{b:g}:{m}']
    val = [w['val_loss'] if w['rc'] == 0 else float('nan') for w in ws]
    tr = [w['train_loss'] if w['rc'] == 0 else float('nan') for w in ws]
    return val, tr, [v - t for v, t in zip(val, tr)]


def budget_table(extras, budget_s, n_train, tps):
    """The budget sweep's table: seconds, model, lr, sweep, steps, epochs, val, train windows, gap."""
    rows = []
    for b, bplan in extras['budgets'].items():
        for m, p in bplan.items():
            val, tr, gap = window_gaps(extras, b, m)
            sweep = ', '.join(f'{lr:g}: {v:.3f}' for lr, v in p['sweep'].items()) or '-'
            rows.append([f'{b * budget_s:.0f}', m, f'{p["lr"]:g}', sweep, p['steps'],
                         f'{p["steps"] * tps / n_train:.2f}', fmt(val), fmt(tr), fmt(gap)])
    return md_table(['training s', 'model', 'lr', 'sweep (lr: proxy val loss)', 'steps', 'epochs',
                     'val loss (nats)', 'train-window loss', 'gap (val - train)'], rows)


def final_loss(res):
    """Final val loss (nats/token) of a run, inf for a failed or diverged one."""
    if res is None or res['rc'] != 0 or not res['evals'] or not math.isfinite(res['evals'][-1][1]):
        return float('inf')
    return res['evals'][-1][1]


def unigram(data_dir):
    """The token-frequency level of val.bin under train.bin's add-one unigram ->
    (cross entropy in nats/token, accuracy of always guessing train's most common token)."""
    train = np.memmap(os.path.join(data_dir, 'train.bin'), dtype=np.uint16, mode='r')
    val = np.memmap(os.path.join(data_dir, 'val.bin'), dtype=np.uint16, mode='r')
    n = int(max(train.max(), val.max())) + 1
    counts = np.bincount(train, minlength=n)
    p = (counts + 1) / (len(train) + n)
    return float(-np.log(p[val]).mean()), float((val == counts.argmax()).mean())


# ----------------------------------------------------------------------------- the table

def stats(xs):
    """mean and spread (half the range) of a list of numbers."""
    return float(np.mean(xs)), float((max(xs) - min(xs)) / 2)


def verdict(a, b, expect, higher_is_better=False):
    """Compare per-seed values a (the claim's subject) and b (its reference).
    expect: 'better' | 'worse' | 'equal' | 'not better'. The difference counts only
    when larger than the sum of the two spreads, else 'within noise'."""
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
    """'mean +- spread unit' of per-seed values, or 'failed in k of n runs' if any is not finite."""
    m, s = stats(xs)
    if not math.isfinite(m):
        return f'failed in {sum(not math.isfinite(x) for x in xs)} of {len(xs)} runs'
    return f'{m:{sign}.{digits}f} +- {s:.{digits}f}' + (f' {unit}' if unit else '')


def losses(plan, m):
    return [final_loss(r) for r in plan[m]['runs']]


def cmd(*models):
    """The claims.py command that makes a row (markdown code)."""
    return f'`python -m experiments.claims --models {",".join(models)}`'


def claim_rows(plan, extras):
    """The claims table rows: [claim, papers, ours, agree?, command]."""
    rows = []

    def pair(claim, papers, a, b, expect):
        if a in plan and b in plan:
            la, lb = losses(plan, a), losses(plan, b)
            rows.append([claim, papers, f'{a} {fmt(la, unit="nats")} vs {b} {fmt(lb, unit="nats")}',
                         verdict(la, lb, expect), cmd(a, b)])

    pair('flat mixer vs llama-style transformer', 'mixer slightly worse: 1.89 vs 1.71 (12 h, RTX 3060)',
         'flat', 'transformer', 'worse')
    pair('flat mixer vs GPT-style transformer', 'mixer better: 1.81 vs 1.96', 'flat', 'gpt', 'better')
    pair('flat vs expanded mixer', 'flat better: 2.111 vs 2.183 (one epoch)', 'flat', 'expanded', 'better')
    if all(m in plan for m in ('flat', 'flat_nonorm', 'transformer', 'transformer_nonorm')):
        dm = [x - y for x, y in zip(losses(plan, 'flat_nonorm'), losses(plan, 'flat'))]
        dt = [x - y for x, y in zip(losses(plan, 'transformer_nonorm'), losses(plan, 'transformer'))]
        rows.append(['layer norms removed: cost to the mixer vs to the transformer',
                     'mixer still trains, transformer degrades (Masked Mixers IV)',
                     f'mixer {fmt(dm, sign="+", unit="nats")}, transformer {fmt(dt, sign="+", unit="nats")}',
                     verdict(dm, dt, 'better'),
                     cmd('flat', 'flat_nonorm', 'transformer', 'transformer_nonorm')])
    pair('learned positional encoding for the mixer', 'no gain', 'posenc', 'flat', 'not better')
    pair('Toeplitz vs dense mixer', 'about equal (Masked Recurrent Mixers)', 'toeplitz', 'flat', 'equal')
    pair('2 heads vs flat mixer', 'slight gain: 1.72 vs 1.74', 'multihead2', 'flat', 'better')
    pair('4 heads vs flat mixer', 'slight gain: 1.72 vs 1.74', 'multihead4', 'flat', 'better')
    pair('kernel 4 mixer vs transformer', 'mixer better: 1.74 vs 1.82 (4x V100)', 'kernel4', 'transformer', 'better')
    pair('kernel 4 + linear after the embedding vs kernel 4', 'better: 1.71 vs 1.74', 'kernel4_embed', 'kernel4',
         'better')
    pair('hybrid transformer-mixer vs transformer', 'hybrid best of all: 1.59 vs 1.61', 'hybrid', 'transformer',
         'better')
    pair('parallel hybrid (attention + mixing side by side) vs transformer', 'no gain: 1.61 vs 1.61 (4x V100)',
         'hybrid_parallel', 'transformer', 'equal')
    pair('recurrent vs dense mixer', 'close, with constant-state inference', 'recurrent', 'flat', 'equal')
    if 'linear' in plan:
        ll = losses(plan, 'linear')
        uni = extras['unigram']
        ok = max(ll) < uni - 0.5
        rows.append(['linear mixer trains (no norm, no nonlinearity)', 'trains, writes grammatical text',
                     f'{fmt(ll)} nats (unigram {uni:.3f}); sample below', 'yes' if ok else 'no', cmd('linear')])
    rows += representation_rows(plan, extras)
    if extras.get('memory'):
        mem = extras['memory']
        T = max(t for t in mem['flat'] if all(t in mem[v] for v in mem))
        f, t, n = (mem[v][T] for v in MEMORY_VARIANTS)
        rows.append([f'training memory per step at n_ctx {T}: transformer / mixer',
                     'mixer about 4x less than the transformer',
                     f'SDPA {t / f:.2f}x, naive attention {n / f:.2f}x ({f / 2**20:.0f} / {t / 2**20:.0f} / '
                     f'{n / 2**20:.0f} MiB: flat / SDPA / naive)',
                     f'vs naive: {ratio_verdict(n / f, 4)}; vs SDPA: {ratio_verdict(t / f, 4)}',
                     f'`{extras["memory_command"]}`'])
    pair('Muon vs AdamW, flat mixer', '(no paper: ours)', 'flat_muon', 'flat', 'better')
    pair('Muon vs AdamW, transformer', '(no paper: ours)', 'transformer_muon', 'transformer', 'better')
    for row in rows:
        if row[1] == '(no paper: ours)':
            row[3] = row[3].replace('yes', 'Muon better').replace('no', 'Muon not better')
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
    rows += budget_rows(extras)
    best = {}
    for fam in ('mixer', 'transformer'):
        cands = [m for m in plan if MODELS[m][1] == fam and math.isfinite(np.mean(losses(plan, m)))]
        if cands:
            best[fam] = min(cands, key=lambda m: np.mean(losses(plan, m)))
    if len(best) == 2:
        bm, bt = best['mixer'], best['transformer']
        rows.append(['best mixer vs best transformer (each at its best lr)', 'about equal (the papers\' best mixer '
                     '1.74 vs transformer 1.82)', f'{bm} {fmt(losses(plan, bm))} vs {bt} {fmt(losses(plan, bt))}',
                     verdict(losses(plan, bm), losses(plan, bt), 'better'), cmd(bm, bt)])
    return rows


def budget_rows(extras):
    """The budget sweep's rows: each mixer of BUDGET_MODELS vs the transformer at every
    budget; the generalisation gaps; each REGULARISE run vs the flat mixer and the
    transformer at the largest budget."""
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


def top1(results, dirs, untrained=False, pool='last', n='32'):
    """Top-1 accuracy of the trained retrieval model at N = n, one per checkpoint folder in dirs."""
    by_ckpt = {(r['ckpt'], r['untrained'], r['pool']): r['accuracy']['mixer (trained)'][n] for r in results}
    return [by_ckpt[(os.path.join(d, 'ckpt.pt'), untrained, pool)] for d in dirs]


def represented(results, trained, mode, depth='all'):
    """Input representation accuracy (represent.py) per seed: mode 'self' | 'nonself', depth 1 or 'all'."""
    deepest = max(r['depth'] for r in results)
    return [r[mode]['accuracy'] for r in results
            if r['trained'] == trained and r['depth'] == (deepest if depth == 'all' else depth)]


def representation_rows(plan, extras):
    """The claims rows of retrieval, autoencoding and input representation accuracy."""
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
    accuracy (mean +- spread over seeds; in brackets, at half the recovery steps)."""
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
    rows = []
    for m, p in plan.items():
        ls = losses(plan, m)
        bpb = [r['evals'][-1][2] if math.isfinite(final_loss(r)) else float('nan') for r in p['runs']]
        sweep = ', '.join(f'{lr:g}: {v:.3f}' for lr, v in p['sweep'].items()) or '-'
        tokens = p['steps'] * tokens_per_step
        rows.append([m, f'{p["lr"]:g}', sweep, p['steps'], f'{tokens / 1e6:.2f}M', f'{tokens / n_train_tokens:.2f}',
                     fmt(ls), fmt(bpb), f'`{p["command"]}`'])
    return rows


def pyplot():
    """matplotlib.pyplot with the Agg backend, or None when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        return None


NO_PLOT = 'no plot: matplotlib is not installed (pip install matplotlib)'


def save(fig, plt, path):
    fig.tight_layout()
    fig.savefig(path + '.tmp.png', dpi=110)
    os.replace(path + '.tmp.png', path)
    plt.close(fig)
    return f'plot: {path}'


def plot_budgets(extras, path):
    """The budget sweep: final validation loss (left) and generalisation gap (right)
    against training seconds, one line per model, the range over seeds shaded; the
    REGULARISE runs as points at the largest budget -> path, or a note."""
    plt = pyplot()
    if plt is None:
        return NO_PLOT
    fig, axes = plt.subplots(1, 2, figsize=(14, 5.5))
    bs, sec = sorted(extras['budgets']), extras['budget_s']
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
    return save(fig, plt, path)


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
    return save(fig, plt, path)


# ----------------------------------------------------------------------------- main

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument('--quick', action='store_true', help='tiny models and budgets (the smoke test)')
    p.add_argument('--budget', type=float, default=1.0, help='multiplier of every training budget')
    p.add_argument('--models', help=f'comma-separated subset of: {",".join(MODELS)}')
    p.add_argument('--lrs', help='comma-separated learning rates of the sweep (default 1e-3,3e-3,9e-3)')
    p.add_argument('--budgets', help='comma-separated multiples of the budget for the budget sweep of '
                   f'{",".join(BUDGET_MODELS)} (e.g. 1,6; default: none, 1,2 with --quick)')
    p.add_argument('--seeds', type=int, help='seeds per model at the full budget (default 2)')
    p.add_argument('--workers', type=int, default=2, help='runs at a time')
    p.add_argument('--threads', type=int, default=1, help='torch threads per run')
    p.add_argument('--data_dir', default=os.path.join('data', 'tinystories'), help='prepared data')
    p.add_argument('--out', help='output folder (default out/claims, out/claims_quick with --quick)')
    p.add_argument('--recalibrate', action='store_true', help='measure the step times again')
    args = p.parse_args(argv)
    s = SETTINGS['quick' if args.quick else 'full']
    args.models = args.models.split(',') if args.models else list(MODELS)
    bad = [m for m in args.models if m not in MODELS]
    if bad:
        fail(f'unknown model(s) {",".join(bad)}; choose from {",".join(MODELS)}')
    try:
        args.lrs = tuple(float(x) for x in args.lrs.split(',')) if args.lrs else s['lrs']
    except ValueError:
        fail(f'--lrs must be numbers separated by commas, got {args.lrs!r}')
    try:
        args.budgets = tuple(sorted({float(x) for x in args.budgets.split(',')})) if args.budgets else s['budgets']
    except ValueError:
        fail(f'--budgets must be numbers separated by commas, got {args.budgets!r}')
    if args.budgets and min(args.budgets) <= 0:
        fail('--budgets must be positive')
    args.seeds = args.seeds or s['seeds']
    for name in ('budget', 'seeds', 'workers', 'threads'):
        if getattr(args, name) <= 0 or min(args.lrs) <= 0:
            fail(f'--{name} and --lrs must be positive')
    if not os.path.isfile(os.path.join(args.data_dir, 'meta.json')):
        fail(f'{args.data_dir}/meta.json not found: run data/prepare.py first (or set --data_dir)')
    args.out = args.out or os.path.join('out', 'claims_quick' if args.quick else 'claims')
    args.s = s
    return args


def main(argv=None):
    args = parse_args(argv)
    s, out = args.s, os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    os.environ['OMP_NUM_THREADS'] = str(args.threads)      # pool processes start with this many threads
    t_start = time.time()
    data_dir = os.path.abspath(args.data_dir)
    if not os.path.relpath(data_dir, ROOT).startswith('..'):   # the same cache keys from any checkout
        data_dir = os.path.relpath(data_dir, ROOT)
    os.chdir(ROOT)                                # every path below: absolute or relative to ROOT
    meta = json.load(open(os.path.join(data_dir, 'meta.json')))
    base = {'lm': [*s['shape'], f'--data_dir={data_dir}']}
    base['ae'] = ['--task=autoencode', *s['ae_shape']]
    budget_s = s['budget_s'] * args.budget
    models = args.models
    ae = [m for m in AE_MODELS if m in models]
    runner = Runner(out, args.workers, args.threads)
    say(f'claims: {len(models)} models, learning rates {", ".join(f"{x:g}" for x in args.lrs)}, '
        f'{args.seeds} seeds, {budget_s:.0f} s of training per run, {args.workers} runs at a time x '
        f'{args.threads} thread(s); output in {out}')

    step_s = calibrate(runner, out, models + [f'ae:{m}' for m in ae], base, s['calib_steps'], args.recalibrate)
    for m in models:
        say(f'  {m}: {1000 * step_s[m]:.1f} ms/step -> {max(12, round(budget_s / step_s[m]))} steps')
    sweep = len(args.lrs) > 1            # proxies of a third each, the best one continued, other seeds
    per_model = (len(args.lrs) / 3 + 2 / 3 + args.seeds - 1 if sweep else args.seeds) * budget_s
    nb, lb = len([m for m in BUDGET_MODELS if m in models]), len(args.lrs)
    per_b = sum(b * budget_s * (nb * ((lb / 3 + 2 / 3 + args.seeds - 1) if lb > 1 else args.seeds)
                                + ('flat' in models) * (b == max(args.budgets)) * len(REGULARISE) * s['reg_seeds'])
                for b in args.budgets if b != 1)
    say(f'whole run: about {fmt_s((len(models) * per_model + per_b) / args.workers)} of language-model training left '
        f'at most (cached runs cost nothing)')
    plan = lm_runs(runner, os.path.join(out, 'runs'), models, base, step_s, budget_s, args.lrs, args.seeds)

    extras = dict(zip(('unigram', 'unigram_acc'), unigram(data_dir)))
    if len(ae) == len(AE_MODELS):
        extras.update(ae_runs(runner, out, base, step_s, s['ae_budget'] * budget_s, s['ae_lr'], args.seeds))

    cmds, names = [], []
    retrieval = ['--data_dir', data_dir, '--threads', str(args.threads), '--untrained',
                 '--cache_dir', os.path.join(out, 'retrieval_cache'), *s['retrieval']]
    if all(m in models for m in RETRIEVAL_MODELS):
        ckpts = [a for m in RETRIEVAL_MODELS for d in plan[m]['dirs'] for a in ('--ckpt', os.path.join(d, 'ckpt.pt'))]
        cmds.append((['retrieval.py', *ckpts, '--pool', 'last', 'mean', *retrieval,
                      '--json', os.path.join(out, 'retrieval.json')], os.path.join(out, 'retrieval.txt')))
        names.append('retrieval')
    if 'ae_dirs' in extras:         # the paper's negative control: a trained autoencoder's embeddings
        ckpts = [a for m in AE_MODELS for d in extras['ae_dirs'][m] for a in ('--ckpt', os.path.join(d, 'ckpt.pt'))]
        cmds.append((['retrieval.py', *ckpts, *retrieval, '--json', os.path.join(out, 'retrieval_ae.json')],
                     os.path.join(out, 'retrieval_ae.txt')))
        names.append('retrieval_ae')
    for m in (m for m in REPRESENT_MODELS if m in models):
        ckpts = [a for d in plan[m]['dirs'] for a in ('--ckpt', os.path.join(d, 'ckpt.pt'))]
        cmds.append((['-m', 'experiments.represent', '--variants', '', '--untrained', *ckpts, '--data_dir', data_dir, '--threads',
                      str(args.threads), '--overwrite', '--json', os.path.join(out, f'represent_{m}.json'),
                      *s['represent']], os.path.join(out, f'represent_{m}.txt')))
        names.append(f'represent_{m}')
    for v in MEMORY_VARIANTS:
        cmds.append((['-m', 'experiments.bench', '--mem_cells', f'{v}:{",".join(map(str, s["mem_lengths"]))}', '--device', 'cpu',
                      '--dtype', 'fp32', '--threads', str(args.threads), *s['mem_shape']],
                     os.path.join(out, f'memory_{v}.jsonl')))
        names.append(f'memory_{v}')
    if 'linear' in models:
        cmds.append((['sample.py', '--ckpt', os.path.join(plan['linear']['dirs'][0], 'ckpt.pt'), '--start',
                      'Once upon a time', '--num_samples', '1', '--max_new_tokens', '80', '--seed', '1',
                      '--temperature', '0.8', '--top_k', '40'], os.path.join(out, 'linear_sample.txt')))
        names.append('sample')
    for name, rc, (_, path) in zip(names, runner.commands(cmds, 'retrieval, representation, memory, sample'), cmds):
        if rc != 0:
            say(f'  {name} failed (exit {rc}): see {path}')
            continue
        if name.startswith('retrieval') or name.startswith('represent'):
            extras[name] = json.load(open(os.path.join(out, f'{name}.json')))['results']
        elif name.startswith('memory'):
            cells = [json.loads(l) for l in open(path)]
            extras.setdefault('memory', {})[name[7:]] = {c['T']: c['step'] + c['model'] for c in cells if 'step' in c}
        else:
            extras['sample'] = open(path).read().strip()
    if 'memory' in extras and len(extras['memory']) < len(MEMORY_VARIANTS):
        del extras['memory']
    extras['memory_command'] = ' '.join(['python -m experiments.bench --tables memory --device cpu --dtype fp32 --threads',
                                         str(args.threads), '--mem_lengths', ','.join(map(str, s['mem_lengths'])),
                                         *s['mem_shape']])

    if args.budgets:
        say(f'budget sweep: {", ".join(m for m in BUDGET_MODELS if m in models)} at '
            f'{", ".join(f"{b * budget_s:.0f} s" for b in args.budgets)}; {", ".join(REGULARISE)} at the largest')
        extras.update(budget_runs(runner, out, plan, base, step_s, budget_s, args.budgets, args.lrs,
                                  args.seeds, s['reg_seeds']), budget_s=budget_s)

    # report
    n_train = meta['train']['tokens'] if 'tokens' in meta.get('train', {}) else len(
        np.memmap(os.path.join(data_dir, 'train.bin'), dtype=np.uint16, mode='r'))
    tps = tokens_per_step(base['lm'])
    rows = claim_rows(plan, extras)
    text = ['# Claims at equal compute\n',
            f'Every model: {budget_s:.0f} s of training ({args.workers} runs at a time, {args.threads} thread(s) '
            f'each), learning rate chosen from {", ".join(f"{x:g}" for x in args.lrs)} on the first third of the '
            f'schedule, {args.seeds} seeds; ours = mean +- half the range over seeds, validation loss in '
            f'nats/token unless named; "agree" only when the difference exceeds the two spreads added.\n',
            md_table(['claim (from the papers)', 'what the papers report', 'ours (mean +- spread over seeds)',
                      'agree?', 'command'], rows), '\n## Runs\n',
            md_table(['model', 'lr', 'sweep (lr: proxy val loss)', 'steps', 'tokens', 'epochs', 'val loss (nats)',
                      'val bits/byte', 'command (seed 0)'], run_rows(plan, n_train, tps))]
    table = representation_table(extras)
    if table:
        text += ['\n## Input representation accuracy\n', f'`python -m experiments.represent --untrained --ckpt ... '
                 f'{" ".join(s["represent"])}` on each seed\'s checkpoint (untrained: the same config, seeded by the '
                 f'run\'s seed); cell: accuracy at the end (at half the steps), mean +- spread over seeds.\n', table]
    for name, title in (('retrieval', 'Retrieval'), ('retrieval_ae', 'Retrieval with autoencoder embeddings')):
        if extras.get(name):
            report = open(os.path.join(out, f'{name}.txt')).read()      # its stderr (progress), then its stdout
            text += [f'\n## {title}\n', report[report.find('Top-1 retrieval accuracy'):].strip()]
    if 'budgets' in extras:
        text += ['\n## Budget sweep\n', f'Every run of `python -m experiments.claims --budgets '
                 f'{",".join(f"{b:g}" for b in args.budgets)}` at each budget (its own learning-rate sweep over '
                 f'{", ".join(f"{x:g}" for x in args.lrs)} on the first third, {args.seeds} seeds; the main '
                 f'run\'s at 1x); losses of the final checkpoint on the run\'s eval_windows fixed windows '
                 f'of val.bin and of train.bin, mean +- spread over seeds. {", ".join(REGULARISE)}: the flat mixer at '
                 f'the largest budget with {"; ".join(" ".join(a[1:]) for a in REGULARISE.values())}, at the flat '
                 f'mixer\'s learning rate there, {s["reg_seeds"]} seed(s).\n',
                 budget_table(extras, budget_s, n_train, tps)]
        note_b = plot_budgets(extras, os.path.join(out, 'budgets.png'))
    if extras.get('sample'):
        text += ['\n## A linear mixer writes\n', '\n'.join('> ' + l for l in extras['sample'].splitlines())]
    note = plot(plan, step_s, os.path.join(out, 'curves.png'), extras.get('ae_runs'))
    report = '\n'.join(text) + '\n'
    print(report)
    with open(os.path.join(out, 'claims.md.tmp'), 'w') as f:
        f.write(report)
    os.replace(os.path.join(out, 'claims.md.tmp'), os.path.join(out, 'claims.md'))
    with open(os.path.join(out, 'runs.jsonl.tmp'), 'w') as f:
        for m, p in plan.items():
            for seed, (d, r) in enumerate(zip(p['dirs'], p['runs'])):
                f.write(json.dumps({'model': m, 'seed': seed, 'lr': p['lr'], 'steps': p['steps'], 'dir': d,
                                    'sweep': p['sweep'], **r}) + '\n')
    os.replace(os.path.join(out, 'runs.jsonl.tmp'), os.path.join(out, 'runs.jsonl'))
    say(note)
    if 'budgets' in extras:
        say(note_b)
    say(f'claims: done in {fmt_s(time.time() - t_start)}; table in {os.path.join(out, "claims.md")}')
    runner.pool.shutdown()


def tokens_per_step(base_lm):
    """batch_size x n_ctx of the runs (config file, then the --key=value overrides)."""
    ns = {}
    exec(open(os.path.join(ROOT, CONFIG)).read(), {}, ns)
    for a in base_lm:
        k, _, v = a[2:].partition('=')
        if k in ('batch_size', 'n_ctx'):
            ns[k] = int(v)
    return ns['batch_size'] * ns['n_ctx']


if __name__ == '__main__':
    main()
