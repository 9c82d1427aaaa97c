"""In-context regression: linear transformers as in-context learners, and masked mixers.

    python -m experiments.icl                   # Table 1 on 2 CPU cores, 3 seeds (docs/icl.md for the time)
    python -m experiments.icl --mixers          # and the masked mixers in context, with the diagnostic
    python -m experiments.icl --ladder          # and the budget ladder of the verdicts that disagree
    python -m experiments.icl --quick --mixers --ladder   # every row and plot at a tiny budget (minutes)
    python -m experiments.icl --layers 1,2,3,4,5,6,7 --params diag --noise 0,3   # any grid of LSA models
    python -m experiments.icl --speed           # the batched trainer against one model at a time (a minute)
    python -m experiments.icl --mixer_ladder --docs docs/icl.md   # only the mixers' budget ladder (hours)
    python -m experiments.icl --compute --docs docs/icl.md        # only the mixer and transformer against compute

Reproduces Vladymyrov, von Oswald, Sandler, Ge, "Linear Transformers are Versatile In-Context
Learners" (NeurIPS 2024, arXiv 2402.14180): a stack of linear self-attention (LSA) layers reads a
prompt of n = 20 noisy linear-regression pairs (x_i, y_i), x_i in R^10, and predicts the query's
noise-free target; trained on prompts whose noise level sigma varies, it discovers in its forward
pass an optimiser that rivals tuned ridge regression. The pieces (task, models, baselines,
training) are experiments/regression.py's; this file runs them: every model of one architecture
as one batched job (runner.Runner caches each), then the report (experiments/icl_report.py: Table
1 ours against the paper's, its claims as verdicts, Theorem 4.1, the budget ladder) and, with
--mixers, the same prompts through mixer.py's sequence models (experiments/icl_mixers.py).
--mixer_ladder runs only the masked mixers' budget ladder (experiments/icl_ladder.py: its plan), --compute
only the 2-layer flat mixer and transformer trained long (experiments/icl_compute.py).

Metric: the adjusted evaluation loss, mean over prompts of 0.5 (y_hat - y_t)^2 minus the same
for the oracle (ridge with the prompt's true sigma), on the same prompts.
"""

import argparse
import math
from collections import namedtuple
import os
import sys
import time

if __name__ == '__main__':       # run as a file too (python experiments/icl.py): the repository root on
    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the path, as -m puts it
    from harness import cli                   # and from here Ctrl-C is one line, torch's import included
    cli.begin('icl.py', keep=True)

import torch

from harness.cli import fail, write_atomic
from harness.flags import ArgumentParser, check_folder_writable, number
from harness.flags import listing
from experiments import icl_compute, icl_ladder, icl_mixers, icl_report
from experiments.icl_report import PAPER_MODELS
from experiments.regression import (NOISE_NAMES, PARAMS, SIGMA_GRID, VERSION, build, check_noise, fixed_prompts,
                                    half_sq, implicit_weights, mean_loss, train, train_batched, y_scale)
from experiments.runner import Runner, command, fmt_s, job, md_table, say, torch_threads


# Budgets (docs/icl.md): the default run, and --quick. mixer_*: experiments/icl_mixers.py's.
SETTINGS = {
    'full': dict(iters=3000, batch_size=256, lr=1e-2, seeds=3, eval_prompts=100000, sweep_prompts=4000,
                 curve_prompts=1000, ladder=(1, 3, 10), ladder_noises=('1', '3', '5', '7'),
                 mixer_budget_s=60.0, mixer_eval_prompts=20000, mixer_batch=64, mixer_d_model=64,
                 mixer_lrs=(3e-4, 1e-3, 3e-3), mixer_seeds=2,
                 mixer_calib_steps=50),
    'quick': dict(iters=40, batch_size=64, lr=5e-3, seeds=2, eval_prompts=1000, sweep_prompts=250,
                  curve_prompts=200, ladder=(1, 2), ladder_noises=('1', '3', '5', '7'),
                  mixer_budget_s=0.3, mixer_eval_prompts=1000, mixer_batch=16, mixer_d_model=16,
                  mixer_lrs=(1e-3, 3e-3), mixer_seeds=2,
                  mixer_calib_steps=3),
}
# The models whose verdicts disagreed with the paper at the default budget: the budget ladder's.
LADDER_MODELS = [(4, 'diag'), (4, 'full'), (7, 'diag'), (7, 'full')]


# ----------------------------------------------------------------------------- the LSA jobs

@torch.no_grad()
def evaluate_lsa(model, spec):
    """A trained LSA model on the fixed prompt sets of spec['noise'] -> {'eval', 'sweep' (mean 0.5
    (y_hat - y_q)^2 on the eval and sweep sets; the caller subtracts the oracle's), 'per_layer' (the
    loss of each layer's implicit weights w^l), 'theorem_err' (the largest deviation from Theorem
    4.1's identities), 'sigma_sweep' (the loss at each fixed sigma of SIGMA_GRID), 'state'}."""
    sweep = fixed_prompts(spec['noise'], spec['sweep_prompts'], 'sweep')
    res = {'eval': mean_loss(model, fixed_prompts(spec['noise'], spec['eval_prompts'], 'eval')),
           'sweep': mean_loss(model, sweep)}
    ws = implicit_weights(model, sweep)
    res['per_layer'] = [half_sq((w * sweep.x_q).sum(-1), sweep.y_q).mean().item() for w, _, _ in ws]
    w, a, _ = ws[-1]
    ctx, q = model.run(*sweep.tokens())[-1]
    res['theorem_err'] = max((ctx[..., -1] - (a[:, None] * sweep.y - (sweep.x * w[:, None]).sum(-1))).abs().max().item(),
                             (q[:, 0, -1] + (w * sweep.x_q).sum(-1)).abs().max().item())
    res['sigma_sweep'] = [mean_loss(model, fixed_prompts(f'={x:g}', spec['sweep_prompts'], 'eval')) for x in SIGMA_GRID]
    res['state'] = {k: v.tolist() for k, v in model.state_dict().items() if k != 'q_mask'}
    return res


def lsa_group_job(spec, run_dir=None):
    """Runner job: every LSA model of one architecture (spec 'param', 'n_layer') at once, one a
    (noise, seed) of spec['models'], trained by train_batched with spec's 'iters', 'batch_size',
    'lr', then evaluated (evaluate_lsa) -> {'rc', 'line', 'seconds', 'models': [{'noise', 'seed',
    'curve', 'rollbacks', 'finished', 'params', and evaluate_lsa's keys (eval and sweep inf if it
    diverged)}]}."""
    t0 = time.time()
    models = [build({**spec, 'noise': n, 'seed': seed}) for n, seed in spec['models']]
    fits = train_batched(models, [n for n, _ in spec['models']], [seed for _, seed in spec['models']],
                         spec['iters'], spec['batch_size'], spec['lr'])
    out = []
    for model, (noise, seed), (curve, rollbacks, finished) in zip(models, spec['models'], fits):
        r = {'noise': noise, 'seed': seed, 'curve': curve, 'rollbacks': rollbacks, 'finished': finished,
             'params': sum(p.numel() for p in model.parameters())}
        r.update(evaluate_lsa(model, {**spec, 'noise': noise}) if finished else {'eval': math.inf, 'sweep': math.inf})
        out.append(r)
    seconds = time.time() - t0
    return {'rc': 0, 'models': out, 'seconds': seconds,
            'line': f'{len(out)} models, {sum(not r["finished"] for r in out)} diverged, {seconds:.0f} s'}


def lsa_groups(models, cells, s, iters, tag=''):
    """Jobs (run folder name, spec) of the LSA models: one a (L, param) of `models`, holding every
    (noise, seed) of `cells`, deepest first (the pool then ends with short jobs)."""
    return [(f'lsa-{param}-L{L}-iters{iters}{tag}',
             dict(param=param, n_layer=L, models=[list(c) for c in cells], iters=iters, batch_size=s['batch_size'],
                  lr=s['lr'], eval_prompts=s['eval_prompts'], sweep_prompts=s['sweep_prompts']))
            for L, param in sorted(models, key=lambda m: -m[0])]


def run_lsa(runner, out, groups, what):
    """Run the LSA group jobs (cached in OUT/runs/NAME) -> (jobs, results), one pair a model:
    ((name, spec with its 'noise' and 'seed'), its result with 'rc')."""
    per_step = 1.1e-3                     # ETA only: seconds a model-step per layer at batch 256 (one thread)
    res = runner.map(lsa_group_job, [job(os.path.join(out, 'runs'), name, spec, len(spec['models']) * spec['iters']
                                         * spec['n_layer'] * per_step * spec['batch_size'] / 256 + 10, VERSION)
                                     for name, spec in groups], what)
    jobs, results = [], []
    for (name, spec), r in zip(groups, res):
        for m in r.get('models', []) if r['rc'] == 0 else []:
            jobs.append((name, {**spec, 'noise': m['noise'], 'seed': m['seed']}))
            results.append({'rc': 0, **m})
    return jobs, results


def speed(s, iters=300, noise='3', n_layer=7):
    """Side by side on this machine, one thread: one noise column of `n_layer` DIAG (its s['seeds']
    seeds, `iters` steps of s['batch_size'] prompts) trained one model at a time (regression.train:
    the loop of Table 1's first version, with today's forward) and as one batched program
    (train_batched) -> markdown table (wall-clock s, prompts/s) and a line with the speed-up and
    the largest parameter difference relative to the parameters' scale (float64 rounding: about
    1e-10). The caller's torch thread count is restored afterwards."""
    with torch_threads(1):
        return _speed(s, iters, noise, n_layer)


def _speed(s, iters, noise, n_layer):
    """speed()'s measurement, on the current thread count."""
    seeds = list(range(s['seeds']))
    one, many, warm = ([build(dict(param='diag', n_layer=n_layer, noise=noise, seed=k)) for k in seeds]
                       for _ in range(3))
    train(warm[0], noise, 3, s['batch_size'], s['lr'], 0)                    # first calls: not timed
    train_batched(warm, [noise] * len(seeds), seeds, 3, s['batch_size'], s['lr'])
    t0 = time.perf_counter()
    for k, model in zip(seeds, one):
        train(model, noise, iters, s['batch_size'], s['lr'], k)
    t1 = time.perf_counter()
    train_batched(many, [noise] * len(seeds), seeds, iters, s['batch_size'], s['lr'])
    t2 = time.perf_counter()
    a = torch.cat([p.flatten() for m in one for p in m.parameters()])
    b = torch.cat([p.flatten() for m in many for p in m.parameters()])
    prompts = len(seeds) * iters * s['batch_size']
    rows = [[what, f'{t:.1f} s', f'{prompts / t:,.0f}'] for what, t in
            (('one model at a time (`regression.train`)', t1 - t0),
             ('all seeds as one program (`regression.train_batched`)', t2 - t1))]
    return md_table(['trainer', 'wall-clock', 'prompts/s'], rows) + (
        f'\n\n{n_layer}-layer DIAG, U(0,{noise}), {len(seeds)} seeds, {iters} steps of {s["batch_size"]} prompts, '
        f'1 thread: {(t1 - t0) / (t2 - t1):.2f}x; largest parameter difference '
        f'{((a - b).abs().max() / a.abs().max()).item():.1e} of their scale.')


def training_noise(name):
    """An argparse type: a noise setting to train on (regression.check_noise; a fixed sigma '=x' is for
    evaluation only; its variance must be a float64, regression.y_scale, or every job of it fails as it
    builds its model) -> the name; argparse.ArgumentTypeError (one line) otherwise."""
    try:
        check_noise(name)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if name.startswith('='):
        raise argparse.ArgumentTypeError(f'noise {name!r}: a fixed sigma is for evaluation only; train on 0..7, '
                                         'c13 or c135')
    try:
        y_scale(name)
    except OverflowError:
        raise argparse.ArgumentTypeError(f'noise {name!r} is too large: the variance of its sigma overflows float64 '
                                         '(the paper trains on 0..7)') from None
    return name


def parse_args(argv):
    """The command line -> argparse.Namespace with .s (the settings), .models, .noises, .out."""
    p = ArgumentParser('icl.py', __doc__)
    count, positive = number(int, 1), number(float, 0, above=True)
    p.add_argument('--quick', action='store_true', help='tiny budget: every row and plot in a few minutes')
    p.add_argument('--speed', action='store_true',
                   help='only time the batched LSA trainer against one model at a time')
    p.add_argument('--mixers', action='store_true', help="also the same prompts through mixer.py's sequence models")
    p.add_argument('--ladder', action='store_true', help='also the budget ladder of the verdicts that disagree')
    p.add_argument('--mixer_layers', type=listing(count), default='2,4', help='depths of the sequence models')
    p.add_argument('--mixer_ladder', action='store_true',
                   help="only the masked mixers' budget ladder in context (experiments/icl_ladder.py)")
    p.add_argument('--mixer_rungs', type=listing(positive),
                   help="the mixer ladder's multiples of the 60 s budget, 1 first (default 1,4,16)")
    p.add_argument('--mixer_rates', type=listing(positive),
                   help="the mixer ladder's peak learning rates (default 1e-3,3e-3,1e-2)")
    p.add_argument('--mixer_base_steps', type=listing(base_steps_item, items='MODEL:LAYERS:BATCH=STEPS items'),
                   help="the mixer ladder's 1x steps of each (model, layers, batch), e.g. flat:2:256=1666,...: "
                        "another run's budgets (a page's 'steps at 1x'), in place of this machine's calibration")
    p.add_argument('--compute', action='store_true', help='only the 2-layer flat mixer and transformer trained '
                   'long, their loss against training FLOPs (experiments/icl_compute.py; hours)')
    p.add_argument('--docs', help="with --mixer_ladder or --compute: write its section into this page (between "
                                  "its markers) and its figure into the assets/ folder beside")
    p.add_argument('--ladder_budgets', type=listing(positive),
                   help="the ladder's multiples of the LSA budget (default 1,3,10)")
    p.add_argument('--mixer_budget', type=positive,
                   help='seconds of training per sequence model; with --mixer_ladder its 1x rung (default 60)')
    p.add_argument('--layers', type=listing(count),
                   help="comma-separated depths (with --params: that grid; default the paper's rows)")
    p.add_argument('--params', type=listing(str, PARAMS, what='parameterisation'),
                   help='comma-separated parameterisations among full,diag,gdpp')
    p.add_argument('--noise', dest='noises', type=listing(training_noise), default=','.join(NOISE_NAMES),
                   help='settings: 0..7 = sigma ~ U(0, x), c13, c135 = sets')
    p.add_argument('--iters', type=count, help='Adam steps per LSA model (default 3000, --quick 40)')
    p.add_argument('--batch_size', type=count, help='prompts per step (default 256)')
    p.add_argument('--lr', type=positive, help='peak learning rate (default 1e-2)')
    p.add_argument('--seeds', type=count, help='seeds per cell; the best by separate prompts is reported (default 3)')
    p.add_argument('--eval_prompts', type=count, help='evaluation prompts per noise setting (default 100000)')
    p.add_argument('--workers', type=count, default=2, help='jobs at a time')
    p.add_argument('--threads', type=count, default=1, help='torch threads per job')
    p.add_argument('--device', default='cpu', choices=('cpu', 'cuda'),
                   help='cuda: only with --compute or --mixer_ladder (their long runs); the rest is too small for a '
                        'GPU to help')
    p.add_argument('--out', help='output folder (default out/icl, out/icl_quick with --quick)')
    args = p.parse_args(argv)
    if args.device == 'cuda' and not (args.compute or args.mixer_ladder):
        p.error('--device cuda goes with --compute or --mixer_ladder; the rest runs on the CPU (a prompt is 21 tokens '
                'of 11 numbers)')
    if args.device == 'cuda' and not torch.cuda.is_available():
        p.error('--device cuda: CUDA is not available here (--device cpu runs the same plan, for hours)')
    s = dict(SETTINGS['quick' if args.quick else 'full'])
    for k, v in (('iters', args.iters), ('batch_size', args.batch_size), ('lr', args.lr), ('seeds', args.seeds),
                 ('eval_prompts', args.eval_prompts), ('mixer_budget_s', args.mixer_budget)):
        if v is not None:
            s[k] = v
    s['mixer_layers'] = tuple(args.mixer_layers)
    if args.ladder_budgets:
        s['ladder'] = tuple(args.ladder_budgets)
        if 1 not in s['ladder']:
            p.error(f'--ladder_budgets must be positive and hold 1 (Table 1\'s runs), got {args.ladder_budgets}')
    args.ladder_settings = parse_mixer_ladder(p, args)
    if args.layers or args.params:
        args.models = [(L, q) for L in (args.layers or sorted({m[0] for m in PAPER_MODELS}))
                       for q in (args.params or PARAMS)]
    else:
        args.models = PAPER_MODELS
    args.s = s
    args.out = os.path.abspath(args.out or os.path.join('out', 'icl_quick' if args.quick else 'icl'))
    p.check(check_folder_writable, args.out)
    return args


def base_steps_item(text):
    """One item of --mixer_base_steps: 'flat:2:256=1666' -> (('flat', 2, 256), 1666). ValueError if malformed
    or not positive."""
    key, _, steps = text.partition('=')
    v, n, b = key.split(':')
    out = ((v, int(n), int(b)), int(steps))
    if min(out[0][1], out[0][2], out[1]) < 1:
        raise ValueError(text)
    return out


def parse_mixer_ladder(p, args):
    """The settings of --mixer_ladder (icl_ladder.SETTINGS with --mixer_rungs, --mixer_rates and
    --mixer_budget) or of --compute (icl_compute.SETTINGS), and args.figure (the --docs page's figure path,
    checked), or a one-line error (p.error: exit 2)."""
    L = dict((icl_compute if args.compute else icl_ladder).SETTINGS['quick' if args.quick else 'full'])
    L['device'] = args.device
    if args.mixer_budget is not None and not args.compute:
        L['budget_s'] = args.mixer_budget
    for flag, key in (('mixer_rungs', 'rungs'), ('mixer_rates', 'rates')):
        if getattr(args, flag) is not None:
            L[key] = tuple(getattr(args, flag))
    if L['rungs'][0] != 1 or list(L['rungs']) != sorted(set(L['rungs'])):
        p.error(f'--mixer_rungs must start at 1 (the --mixer_budget budget) and grow, got {args.mixer_rungs}')
    if (args.mixer_rungs or args.mixer_rates or args.mixer_base_steps) and not args.mixer_ladder:
        p.error('--mixer_rungs, --mixer_rates and --mixer_base_steps go with --mixer_ladder')
    if args.mixer_base_steps:
        want = sorted({(c[0], c[1], c[3]) for c in icl_ladder.configs(L)})
        if sorted(k for k, _ in args.mixer_base_steps) != want:
            p.error('--mixer_base_steps must give each model of the ladder once: '
                    + ','.join(f'{v}:{n}:{b}=STEPS' for v, n, b in want))
        L['base_steps'] = dict(args.mixer_base_steps)
    if args.docs and not (args.mixer_ladder or args.compute):
        p.error('--docs goes with --mixer_ladder or --compute')
    if args.mixer_ladder + args.compute + (args.mixers or args.ladder or args.speed) > 1:
        p.error('--mixer_ladder and --compute run alone: one of them, without --mixers, --ladder and --speed')
    args.figure = None
    if args.docs and args.quick:
        p.error('--docs writes the page from a full run; a --quick run\'s numbers never go on it (its report is in '
                '--out)')
    if args.docs:
        sec = SECTIONS['compute' if args.compute else 'mixer_ladder']
        args.figure = p.check(icl_ladder.check_docs, args.docs, sec.module.FIGURE, (sec.module.BEGIN, sec.module.END))
    return L


def write_report(path, text):
    """Write a report whole (cli.write_atomic), after it was printed; a failed write: one line
    naming the cause, and exit 1."""
    try:
        write_atomic(path, text)
    except OSError as e:
        fail(f'could not write {path} ({e.strerror or e}); the report is the text above', 'icl.py', 1)


# The sections a page takes from one command (--mixer_ladder, --compute): their module (its BEGIN, END and
# FIGURE), the names of its plan, report and figure functions there, the figure's words on the page.
Section = namedtuple('Section', 'module runs report plot what alt')
SECTIONS = {
    'mixer_ladder': Section(icl_ladder, 'ladder_runs', 'ladder_report', 'plot_ladder', 'the mixers\' budget ladder',
                            'The mixers\' budget ladder: adjusted loss against prompts seen'),
    'compute': Section(icl_compute, 'compute_runs', 'compute_report', 'plot_compute', 'in context against compute',
                       'In context against compute: adjusted loss against training FLOPs'),
}


def jobs_line(jobs, workers):
    """Where a section's jobs trained and for how long (their 'device' and 'seconds'; a job that failed
    is counted with its time, not its device) -> str: '8 training jobs on CPU, their own time summed
    59.0 min (about 29.5 min on 2 workers)', or with several devices each one's count and time, e.g.
    '100 training jobs: 53 on CPU, their own time summed 348.2 min; 47 on NVIDIA H200, 96.7 min' (no
    wall-time estimate: the devices' workers are not this run's)."""
    by = {}
    for x in jobs:
        if x['rc'] == 0:
            n, s = by.get(x.get('device', 'CPU'), (0, 0.0))
            by[x.get('device', 'CPU')] = (n + 1, s + x.get('seconds', 0))
    total = sum(x.get('seconds', 0) for x in jobs)
    if len(by) <= 1:
        return (f'{len(jobs)} training jobs on {next(iter(by), "no device")}, their own time summed {fmt_s(total)} '
                f'(about {fmt_s(total / workers)} on {workers} workers)')
    parts = [f'{n} on {d}, ' + ('their own time summed ' if i == 0 else '') + fmt_s(s)
             for i, (d, (n, s)) in enumerate(sorted(by.items()))]
    return f'{len(jobs)} training jobs: ' + '; '.join(parts)


def section(args, argv, name):
    """--mixer_ladder or --compute (SECTIONS[name]): run its plan, then write OUT/NAME.md, its figure
    (OUT/NAME.png, and beside the --docs page) and, with --docs, the page's section, only from a finished
    plan whose figure was drawn; print the report and a summary line (jobs run: 0 when everything came
    from the cache). Exits 1 if a job failed."""
    sec, L, out, t0 = SECTIONS[name], args.ladder_settings, args.out, time.time()
    runs, report_of, plot = (getattr(sec.module, f) for f in (sec.runs, sec.report, sec.plot))
    runner = Runner(out, args.workers, args.threads)
    say(f'icl: {sec.what}, rungs {",".join(f"{r:g}" for r in L["rungs"])}, {L["seeds"]} seed(s); output in {out}')
    try:
        plan = runs(runner, out, L)
    except RuntimeError as e:
        fail(str(e), 'icl.py', 1)
    finally:
        runner.close()
    jobs = plan['results']
    failed = sum(x['rc'] != 0 for x in jobs)
    meta = (f'`python -m experiments.icl {" ".join(argv)}`: {jobs_line(jobs, args.workers)}' +
            (f'; {failed} failed' if failed else '') + '.')
    report = report_of(plan, L, meta)
    figure = os.path.join(out, f'{name}.png')
    note = plot(plan, L, figure)
    print(report)
    write_report(os.path.join(out, f'{name}.md'), report + '\n')
    if args.docs and (failed or not note.startswith('plot: ')):
        why = (f'{failed} of {len(jobs)} jobs failed (run the same command again to retry them)' if failed else
               f'its figure was not drawn ({note})')
        fail(f'{args.docs} not written: {why}; a page is written from a finished plan and its figure only', 'icl.py', 1)
    if args.docs:
        try:
            icl_ladder.write_docs(args.docs, report, figure, args.figure, (sec.module.BEGIN, sec.module.END), sec.alt)
        except OSError as e:
            fail(f'could not write {args.docs} ({e.strerror or e}); the report is above and in '
                 f'{os.path.join(out, f"{name}.md")}', 'icl.py', 1)
        note += f'; section written into {args.docs}'
    say(note)
    say(f'icl: {sec.what} done in {fmt_s(time.time() - t0)}; {runner.ran} jobs run; report in '
        f'{os.path.join(out, f"{name}.md")}')
    if failed:
        sys.exit(1)


def run_ladder(runner, out, s, noises, jobs, results):
    """The budget ladder: the models deciding the verdicts that disagree (LADDER_MODELS) at every
    multiple of s['ladder'] of the LSA budget (1: Table 1's runs), on s['ladder_noises'] (those
    run), seed 0 -> {multiple: {(L, param): {noise: eval loss}}}."""
    cols = [n for n in s['ladder_noises'] if n in noises]
    ladder = {1: {}}
    for (_, spec), r in zip(jobs, results):
        if (spec['n_layer'], spec['param']) in LADDER_MODELS and spec['noise'] in cols and spec['seed'] == 0:
            ladder[1].setdefault((spec['n_layer'], spec['param']), {})[spec['noise']] = r['eval']
    for mult in (m for m in s['ladder'] if m != 1):
        jobs, res = run_lsa(runner, out, lsa_groups(LADDER_MODELS, [(n, 0) for n in cols], s,
                                                    int(mult * s['iters']), '-ladder'),
                            f'budget ladder: {mult:g}x the LSA budget')
        for (_, spec), r in zip(jobs, res):
            ladder.setdefault(mult, {}).setdefault((spec['n_layer'], spec['param']), {})[spec['noise']] = r['eval']
    return ladder


def main(argv=None):
    """Run the experiment of argv (see --help): writes OUT/icl.md, OUT/icl.png (and OUT/mixers.png
    with --mixers) and prints the report. Exits 2 on bad arguments, 1 if a job failed."""
    args = parse_args(argv)
    s, out = args.s, args.out
    args.argv = argv
    if args.speed:
        print(speed(s, iters=30 if args.quick else 300))
        return
    os.makedirs(out, exist_ok=True)
    with torch_threads(args.threads):        # the report's small tensor work: 2 threads on 2 busy cores
        if args.mixer_ladder or args.compute:  # were 6x slower than 1
            return section(args, argv if argv is not None else sys.argv[1:], 'compute' if args.compute else 'mixer_ladder')
        run_all(args)


def run_all(args):
    """Table 1, and the LSA ladder and the mixers as args ask: main's work."""
    s, out, argv = args.s, args.out, args.argv
    t0, runner = time.time(), Runner(out, args.workers, args.threads)
    say(f'icl: {len(args.models)} LSA models x {len(args.noises)} noise settings x {s["seeds"]} seed(s), '
        f'{s["iters"]} steps of {s["batch_size"]} prompts at lr {s["lr"]:g}, float64; output in {out}')
    models = list(dict.fromkeys(args.models + ([(1, 'diag'), (2, 'diag')] if args.mixers else [])))
    cells = [(n, seed) for n in args.noises for seed in range(s['seeds'])]
    if args.mixers:
        cells += [(n, seed) for n in icl_mixers.MIXER_NOISE if n not in args.noises for seed in range(s['seeds'])]
    groups = lsa_groups(models, cells, s, s['iters'])
    jobs, results = run_lsa(runner, out, groups, 'linear self-attention models')
    failed = len(groups) - len({name for name, _ in jobs})         # group jobs that failed: no models of theirs
    # the plan's noise settings, a column each, whether or not their jobs finished (a failed one reads 'failed')
    noises = sorted({n for n, _ in cells}, key=lambda n: (NOISE_NAMES + (n,)).index(n))
    say('baselines: tuning CONSTRR and TUNEDRR, evaluating every baseline')
    table, adj, base, sig = icl_report.lsa_report(results, jobs, models, noises, s, s['seeds'])
    ladder = run_ladder(runner, out, s, noises, jobs, results) if args.ladder else None
    notes = [icl_report.plot(adj, base, sig, noises, models, os.path.join(out, 'icl.png'))]
    plan = None
    if args.mixers:
        try:
            plan = icl_mixers.mixer_runs(runner, out, s)
        except RuntimeError as e:                # a step-time job failed: no budgets, no runs
            fail(str(e), 'icl.py', 1)
        notes.append(icl_mixers.plot_mixers(plan, adj, os.path.join(out, 'mixers.png'), s))
    report = icl_report.report_text(table, adj, base, sig, noises, results, jobs, s, ladder, plan,
                                    ' '.join(argv if argv is not None else sys.argv[1:]))
    print(report)
    write_report(os.path.join(out, 'icl.md'), report)
    runner.close()
    for note in notes:
        say(note)
    say(f'icl: done in {fmt_s(time.time() - t0)}; report in {os.path.join(out, "icl.md")}'
        + (f'; {failed} LSA jobs FAILED (their cells read \'failed\'; run again to retry them)' if failed else ''))
    if failed:
        sys.exit(1)


if __name__ == '__main__':
    sys.exit(command(main, 'icl.py'))
