"""The masked-mixer papers' claims, reproduced at equal compute on this machine.

    python -m experiments.claims                 # the full comparison (about 2 h on 2 CPU cores with everything)
    python -m experiments.claims --quick         # tiny models and budgets: every row in about 3 minutes
    python -m experiments.claims --budget 2      # twice the training time for every run
    python -m experiments.claims --models flat,transformer     # only these models (and the rows they make)
    python -m experiments.claims --models flat,toeplitz,recurrent,transformer --budgets 1,6   # the budget sweep

Every model trains for the same wall-clock budget on the machine it runs on.
First each model's step time is measured on train.py's own step (its model,
optimisers and data as train.py builds them; two runs at a time, one thread each,
as the real runs go); its max_iters is then budget / step time, so that its cosine
schedule ends on time. The step times are cached in OUT/calibration (runner.step_times),
so a rerun trains the same step counts (--recalibrate measures again).

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

import json
import math
import os
import shutil
import sys
import time

if __name__ == '__main__':       # run as a file too (python experiments/claims.py): the repository root on
    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the path, as -m puts it
    from harness import cli                   # and from here Ctrl-C is one line, torch's import included
    cli.begin('claims.py', keep=True)

import numpy as np


# the compared models (MODELS, ...) are claims_report's, which turns the finished runs into the report
from experiments.claims_report import (AE_MODELS, BUDGET_MODELS, MEMORY_VARIANTS, MODELS, REGULARISE,
                                       REPRESENT_MODELS, RETRIEVAL_MODELS, final_loss, write_report)
from harness.cli import fail, write_atomic
from harness.flags import ArgumentParser, check_folder_writable, number
from harness.flags import listing
from harness.configurator import read_config_file
from data.tokens import token_dtype
from experiments.runner import (ROOT, Runner, command, fmt_s, job, reset_dir, say, step_times, train_job, train_run,
                               window_loss_job)
CONFIG = os.path.join('config', 'tinystories_cpu.py')   # paths relative to ROOT: runs are started there
VERSION = 'claims 2'      # of train.py's loop as these runs use it: in every cached run's key; change it with train.py

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
                  retrieval=['--max_pairs', '200', '--steps', '20', '--embed_batch', '16', '--n_candidates', '32',
                             '--d_r', '32', '--r_layers', '1', '--batch_size', '16'],
                  represent=['--T', '12', '--windows', '1', '--positions', '3', '--steps', '10']),
}



# ----------------------------------------------------------------------------- the comparison

def train_args(base, model, extra):
    """train.py's argv for a MODELS or REGULARISE name (or neither: base and extra alone), in float32 (the
    precision the calibration's step times and docs/claims.md's runs were measured in)."""
    own = MODELS[model][0] if model in MODELS else REGULARISE.get(model, [])
    return [CONFIG, '--dtype=float32', *base, *own, *extra]     # float32, as docs/claims.md's runs: no choice


def train_step(argv):
    """runner.step_time_job's builder of train.py's own step for the settings argv (runner.train_run, from
    the repository root) -> step()."""
    os.chdir(ROOT)
    return train_run(argv)[2]


def calibrate(runner, out, names, base, steps, recalibrate):
    """Seconds a training step of each name (a MODELS name, or 'ae:NAME') -> {name: seconds}: the median of 5
    chunks of steps // 5 steps after 3 warm-up steps (runner.step_times of train_step), measured in the
    pool under the runs' conditions and cached in OUT/calibration, so that a rerun trains the same step counts
    (recalibrate: measured again). The step is train.py's own (train.train_step on the model, optimisers and
    data train.py builds from the run's settings), not a forward and backward of the model alone: the runs'
    step counts are the budget over it, and it is what their seconds are spent on."""
    builders = {}
    for n in names:
        model, extra = (n[3:], base['ae']) if n.startswith('ae:') else (n, [])
        builders[n] = (n.replace(':', '_'), 'experiments.claims:train_step',
                       dict(argv=train_args(base['lm'], model, extra)))
    say('calibration: the step times not yet cached are measured now and fix every run\'s step count, so nothing '
        'else may run on this machine until the calibration ends')
    t = step_times(runner, os.path.join(out, 'calibration'), builders, steps, VERSION, 'calibration', recalibrate)
    return {n: x[0] for n, x in t.items()}


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

    def argv(m, lr, seed, iters, resume=False):          # train.py's, less --out_dir (the job's folder)
        return train_args(base['lm'], m, [f'--learning_rate={lr!r}', f'--min_lr={lr / 10!r}', f'--seed={seed}',
                                           f'--max_iters={iters}', *plan[m]['schedule'],
                                           *(['--init_from=resume'] if resume else [])])

    def run(m, lr, seed, iters, eta, proxy=False, resume=False, prepare=None):
        return job(os.path.join(runs_dir, m), f'lr{lr:g}-seed{seed}' + '-proxy' * proxy,
                   argv(m, lr, seed, iters, resume), eta, VERSION, prepare)

    def proxy(m, lr):
        return run(m, lr, 0, plan[m]['proxy'], plan[m]['proxy'] * step_s[m], proxy=True)

    if len(lrs) > 1:
        jobs = [proxy(m, lr) for m in models for lr in lrs]
        res = iter(runner.map(train_job, jobs, 'learning-rate sweep (proxy: first third of each schedule)'))
        for m in models:
            plan[m]['sweep'] = {lr: final_loss(next(res)) for lr in lrs}
            plan[m]['lr'] = min(lrs, key=lambda lr: plan[m]['sweep'][lr])
    else:
        for m in models:
            plan[m]['sweep'], plan[m]['lr'] = {}, lrs[0]

    def from_proxy(m):
        def prepare(run_dir):
            reset_dir(run_dir)
            src = proxy(m, plan[m]['lr']).dir
            for f in ('ckpt.pt', 'log.jsonl'):
                shutil.copy(os.path.join(src, f), os.path.join(run_dir, f))
        return prepare

    jobs = []
    for m in models:
        lr, steps = plan[m]['lr'], plan[m]['steps']
        for seed in range(seeds):
            resume = seed == 0 and len(lrs) > 1 and math.isfinite(plan[m]['sweep'][lr])
            jobs.append(run(m, lr, seed, steps, (steps - plan[m]['proxy'] * resume) * step_s[m], resume=resume,
                            prepare=from_proxy(m) if resume else None))
            plan[m].setdefault('dirs', []).append(jobs[-1].dir)
    res = iter(runner.map(train_job, jobs, 'full budget at the chosen learning rates'))
    for m in models:
        plan[m]['runs'] = [next(res) for _ in range(seeds)]
        plan[m]['command'] = 'python train.py ' + ' '.join(argv(m, plan[m]['lr'], 0, plan[m]['steps'])) + \
            f' --out_dir=out/{m}'
    return plan


def ae_runs(runner, out, base, step_s, budget_s, lr, seeds):
    """The autoencoders of AE_MODELS: the AE shape, learning rate `lr` (chosen by the sweep
    in the README), budget_s of training each, `seeds` seeds -> {'ae': {model: [(val loss,
    token accuracy) per seed]}, 'ae_untrained_acc': token accuracy at step 0, 'ae_dirs':
    {model: [run folder per seed]}, 'ae_runs': {model: [train.py result per seed]}}."""
    dirs, jobs = {}, []
    for m in AE_MODELS:
        steps = max(12, round(budget_s / step_s[f'ae:{m}']))
        for seed in range(seeds):
            argv = train_args(base['lm'], m, [*base['ae'], f'--learning_rate={lr!r}', f'--min_lr={lr / 10!r}',
                                              f'--seed={seed}', f'--max_iters={steps}',
                                              f'--warmup_iters={max(2, steps // 30)}',
                                              f'--eval_interval={max(1, steps // 8)}'])
            jobs.append(job(os.path.join(out, 'runs', f'ae_{m}'), f'lr{lr:g}-seed{seed}', argv,
                            steps * step_s[f'ae:{m}'], VERSION))
            dirs.setdefault(m, []).append(jobs[-1].dir)
    res = iter(runner.map(train_job, jobs, 'autoencoders'))
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
                jobs.append(job(d, 'windows', [os.path.join(d, 'ckpt.pt')], 5.0, VERSION))
                keys.append(f'{b:g}:{m}')
    windows = {}
    for k, res in zip(keys, runner.map(window_loss_job, jobs, 'train and validation windows of every budget run')):
        windows.setdefault(k, []).append(res)
    return {'budgets': sweep, 'windows': windows}


def unigram(data_dir):
    """The token-frequency level of val.bin under train.bin's add-one unigram ->
    (cross entropy in nats/token, accuracy of always guessing train's most common token)."""
    train, val = (np.memmap(os.path.join(data_dir, f'{s}.bin'), dtype=token_dtype(data_dir), mode='r')
                  for s in ('train', 'val'))
    n = int(max(train.max(), val.max())) + 1
    counts = np.bincount(train, minlength=n)
    p = (counts + 1) / (len(train) + n)
    return float(-np.log(p[val]).mean()), float((val == counts.argmax()).mean())


def tokens_per_step(base_lm):
    """batch_size x n_ctx of the runs (config file, read by configurator.read_config_file, then the
    --key=value overrides)."""
    ns = dict(read_config_file(os.path.join(ROOT, CONFIG)))
    ns.update((k, int(v)) for k, _, v in (a[2:].partition('=') for a in base_lm) if k in ('batch_size', 'n_ctx'))
    return ns['batch_size'] * ns['n_ctx']


# ----------------------------------------------------------------------------- main

def parse_args(argv):
    """The command line -> argparse namespace, checked (one-line errors, exit 2), with
    .s: the SETTINGS of the run ('full' or 'quick')."""
    p = ArgumentParser('claims.py', __doc__)
    count, positive = number(int, 1), number(float, 0, above=True)
    p.add_argument('--quick', action='store_true', help='tiny models and budgets (the smoke test)')
    p.add_argument('--budget', type=positive, default=1.0, help='multiplier of every training budget')
    p.add_argument('--models', type=listing(str, MODELS, what='model'),
                   help=f'comma-separated subset of: {",".join(MODELS)}')
    p.add_argument('--lrs', type=listing(positive),
                   help='comma-separated learning rates of the sweep (default 1e-3,3e-3,9e-3)')
    p.add_argument('--budgets', type=listing(positive), help='comma-separated multiples of the budget for the budget '
                   f'sweep of {",".join(BUDGET_MODELS)} (e.g. 1,6; default: none, 1,2 with --quick)')
    p.add_argument('--seeds', type=count, help='seeds per model at the full budget (default 2)')
    p.add_argument('--workers', type=count, default=2, help='runs at a time')
    p.add_argument('--threads', type=count, default=1, help='torch threads per run')
    p.add_argument('--data_dir', default=os.path.join('data', 'tinystories'), help='prepared data')
    p.add_argument('--out', help='output folder (default out/claims, out/claims_quick with --quick)')
    p.add_argument('--recalibrate', action='store_true', help='measure the step times again')
    args = p.parse_args(argv)
    s = SETTINGS['quick' if args.quick else 'full']
    args.models = args.models or list(MODELS)
    args.lrs = tuple(args.lrs or s['lrs'])
    args.budgets = tuple(sorted(args.budgets)) if args.budgets else s['budgets']
    args.seeds = args.seeds or s['seeds']
    meta_path = os.path.join(args.data_dir, 'meta.json')
    if not os.path.isfile(meta_path):
        p.error(f'{args.data_dir}/meta.json not found: run data/prepare.py first (or set --data_dir)')
    try:
        with open(meta_path) as f:
            args.meta = json.load(f)
        args.meta['train'], args.meta['tokenizer_sha256']
    except (OSError, ValueError, KeyError, TypeError) as e:
        p.error(f'{meta_path} is damaged ({type(e).__name__}: {e}); run data/prepare.py again')
    args.out = args.out or os.path.join('out', 'claims_quick' if args.quick else 'claims')
    p.check(check_folder_writable, args.out, '--out folder')
    args.s = s
    return args


def main(argv=None):
    """Train and measure everything asked (every run cached under OUT), then write the
    report: OUT/claims.md, OUT/runs.jsonl and the plots. Bad arguments: one line, exit 2;
    Ctrl-C: one line, exit 130 (the finished runs stay cached)."""
    args = parse_args(argv)
    try:
        run_claims(args)
    except RuntimeError as e:                      # a step-time job failed: no step counts, no runs
        fail(str(e), 'claims.py', 1)


def run_claims(args):
    """main() on parsed arguments."""
    s, out = args.s, os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    t_start = time.time()
    data_dir = os.path.abspath(args.data_dir)
    if not os.path.relpath(data_dir, ROOT).startswith('..'):   # the same cache keys from any checkout
        data_dir = os.path.relpath(data_dir, ROOT)
    os.chdir(ROOT)                                # every path below: absolute or relative to ROOT
    meta = args.meta
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
    say(f'whole run: about {fmt_s(training_left(args, budget_s) / args.workers)} of language-model training left '
        f'at most (cached runs cost nothing)')
    plan = lm_runs(runner, os.path.join(out, 'runs'), models, base, step_s, budget_s, args.lrs, args.seeds)

    extras = dict(zip(('unigram', 'unigram_acc'), unigram(data_dir)))
    if len(ae) == len(AE_MODELS):
        extras.update(ae_runs(runner, out, base, step_s, s['ae_budget'] * budget_s, s['ae_lr'], args.seeds))
    extras.update(measure_commands(runner, out, plan, extras.get('ae_dirs'), data_dir, args))
    if args.budgets:
        say(f'budget sweep: {", ".join(m for m in BUDGET_MODELS if m in models)} at '
            f'{", ".join(f"{b * budget_s:.0f} s" for b in args.budgets)}; {", ".join(REGULARISE)} at the largest')
        extras.update(budget_runs(runner, out, plan, base, step_s, budget_s, args.budgets, args.lrs,
                                  args.seeds, s['reg_seeds']), budget_s=budget_s)

    n_train = meta['train']['tokens'] if 'tokens' in meta.get('train', {}) else len(
        np.memmap(os.path.join(data_dir, 'train.bin'), dtype=token_dtype(data_dir), mode='r'))
    notes = write_report(out, plan, extras, step_s, args, budget_s, n_train, tokens_per_step(base['lm']))
    write_runs(out, plan)
    for note in notes:
        say(note)
    say(f'claims: done in {fmt_s(time.time() - t_start)}; table in {os.path.join(out, "claims.md")}')
    runner.close()


def training_left(args, budget_s):
    """Seconds of language-model training of the whole run at most (nothing cached): the
    sweeps, the seeds, the budget sweep and REGULARISE's runs."""
    s, models = args.s, args.models
    sweep = len(args.lrs) > 1            # proxies of a third each, the best one continued, other seeds
    per_model = (len(args.lrs) / 3 + 2 / 3 + args.seeds - 1 if sweep else args.seeds) * budget_s
    nb, lb = len([m for m in BUDGET_MODELS if m in models]), len(args.lrs)
    per_b = sum(b * budget_s * (nb * ((lb / 3 + 2 / 3 + args.seeds - 1) if lb > 1 else args.seeds)
                                + ('flat' in models) * (b == max(args.budgets)) * len(REGULARISE) * s['reg_seeds'])
                for b in args.budgets if b != 1)
    return len(models) * per_model + per_b


def measure_commands(runner, out, plan, ae_dirs, data_dir, args):
    """retrieval.py on the flat and transformer checkpoints (and on the autoencoders', given
    ae_dirs), experiments.represent on REPRESENT_MODELS, experiments.bench's training memory
    of MEMORY_VARIANTS and a linear mixer's sample, each output under OUT -> {'retrieval',
    'retrieval_ae', 'represent_MODEL': their JSON results; 'memory': {variant: {n_ctx: bytes
    per training step}} (only when every variant ran); 'sample': text; 'memory_command'}."""
    s, threads, found = args.s, str(args.threads), {}
    cmds, names = [], []
    retrieval = ['--data_dir', data_dir, '--threads', threads, '--untrained',
                 '--cache_dir', os.path.join(out, 'retrieval_cache'), *s['retrieval']]
    if all(m in plan for m in RETRIEVAL_MODELS):
        ckpts = [a for m in RETRIEVAL_MODELS for d in plan[m]['dirs'] for a in ('--ckpt', os.path.join(d, 'ckpt.pt'))]
        cmds.append((['retrieval.py', *ckpts, '--pool', 'last', 'mean', *retrieval, '--overwrite',
                      '--json', os.path.join(out, 'retrieval.json')], os.path.join(out, 'retrieval.txt')))
        names.append('retrieval')
    if ae_dirs:         # the paper's negative control: a trained autoencoder's embeddings
        ckpts = [a for m in AE_MODELS for d in ae_dirs[m] for a in ('--ckpt', os.path.join(d, 'ckpt.pt'))]
        cmds.append((['retrieval.py', *ckpts, *retrieval, '--overwrite', '--json',
                      os.path.join(out, 'retrieval_ae.json')], os.path.join(out, 'retrieval_ae.txt')))
        names.append('retrieval_ae')
    for m in (m for m in REPRESENT_MODELS if m in plan):
        ckpts = [a for d in plan[m]['dirs'] for a in ('--ckpt', os.path.join(d, 'ckpt.pt'))]
        cmds.append((['-m', 'experiments.represent', '--variants', '', '--untrained', *ckpts, '--data_dir', data_dir,
                      '--threads', threads, '--overwrite', '--json', os.path.join(out, f'represent_{m}.json'),
                      *s['represent']], os.path.join(out, f'represent_{m}.txt')))
        names.append(f'represent_{m}')
    for v in MEMORY_VARIANTS:
        cmds.append((['-m', 'experiments.bench', '--mem_cells', f'{v}:{",".join(map(str, s["mem_lengths"]))}',
                      '--device', 'cpu', '--dtype', 'fp32', '--threads', threads, *s['mem_shape']],
                     os.path.join(out, f'memory_{v}.jsonl')))
        names.append(f'memory_{v}')
    if 'linear_mixer' in plan:
        ckpt = os.path.join(plan['linear_mixer']['dirs'][0], 'ckpt.pt')
        cmds.append((['sample.py', '--ckpt', ckpt, '--start',
                      'Once upon a time', '--num_samples', '1', '--max_new_tokens', '80', '--seed', '1',
                      '--temperature', '0.8', '--top_k', '40'], os.path.join(out, 'linear_sample.txt')))
        names.append('sample')
    for name, rc, (_, path) in zip(names, runner.commands(cmds, 'retrieval, representation, memory, sample'), cmds):
        if rc != 0:
            say(f'  {name} failed (exit {rc}): see {path}')
            continue
        if name.startswith('retrieval') or name.startswith('represent'):
            found[name] = json.load(open(os.path.join(out, f'{name}.json')))['results']
        elif name.startswith('memory'):
            cells = [json.loads(l) for l in open(path)]
            found.setdefault('memory', {})[name[7:]] = {c['T']: c['step'] + c['model'] for c in cells if 'step' in c}
        else:
            found['sample'] = open(path).read().strip()
    if 'memory' in found and len(found['memory']) < len(MEMORY_VARIANTS):
        del found['memory']
    found['memory_command'] = ' '.join(['python -m experiments.bench --tables memory --device cpu --dtype fp32 '
                                        '--threads', threads, '--mem_lengths', ','.join(map(str, s['mem_lengths'])),
                                        *s['mem_shape']])
    return found


def write_runs(out, plan):
    """OUT/runs.jsonl: one line per language-model run (model, seed, lr, steps, folder, the
    sweep's proxy losses and train.py's result: its evals in nats/token)."""
    write_atomic(os.path.join(out, 'runs.jsonl'), ''.join(
        json.dumps({'model': m, 'seed': seed, 'lr': p['lr'], 'steps': p['steps'], 'dir': d, 'sweep': p['sweep'], **r})
        + '\n' for m, p in plan.items() for seed, (d, r) in enumerate(zip(p['dirs'], p['runs']))))


if __name__ == '__main__':
    sys.exit(command(main, 'claims.py'))
