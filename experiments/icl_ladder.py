"""The masked mixers' budget ladder in context: at which budget, if any, does each mixer leave the
zero predictor on icl.py's regression prompts, and does it then form the products y_i x_i?

    python -m experiments.icl --mixer_ladder --docs docs/icl.md    # the ladder; its section of the page
    python -m experiments.icl --mixer_ladder --quick               # the same at a tiny budget (seconds)
    python -m experiments.icl --mixer_ladder --device cuda         # the rungs trained on a GPU

The models are icl_mixers.SequenceRegressor's (mixer.py's blocks, d_model 64): 2- and 4-layer flat,
Toeplitz and recurrent at sigma = 0 and the 4-layer flat at sigma ~ U(0, 5), batches of 256 prompts, at
1x, 4x and 16x the 60 s budget of icl_mixers (--mixer_rungs adds rungs); the 4-layer flat at sigma = 0
also with batches of 64 up to the 4x rung; the 2-layer transformer at the 1x rung as the reference.

Budgets are steps, not seconds. Each (model, depth, batch)'s seconds a step is measured once in the pool
it trains in (two jobs at a time, one thread each; the median of 5 chunks of steps) and cached; the 1x
rung is round(60 s / that) steps (at least 10) and rung r is r times as many, so a rerun, a resumed run
or a busy machine gives the same steps. The report gives prompts seen (steps x batch) and the budget's seconds.

The schedule is warm-up, stable, decay (WSD; Hagele et al. 2024, arXiv 2405.18392): linear warm-up over
10% of the 1x rung's steps, then the peak rate; rung r forks from the stable run at 80% of its steps and
decays linearly to 0 over the last 20%, so one run to the top gives every lower rung for the price of its
decay (tested: a rung's point is what a run of that length ends at). Each rung is a job whose folder keeps
the stable state at its fork, where the next rung starts, and a resume.pt every 1x of steps (a stopped
job goes on). Seed 0 runs each rate of --mixer_rates up to the 4x rung; the rungs above take the 4x
rung's best rate on the sweep prompts; seed 1 runs that rate up the whole ladder. docs/icl.md ("How",
"What was cut") gives the plan's reasons and its cost.
"""

import sys

if __name__ == '__main__':       # not a command, run as a file or with -m: said before any import
    print('icl_ladder.py: error: a part of icl.py, not a command: python -m experiments.icl '
          '--mixer_ladder', file=sys.stderr)
    sys.exit(2)

import copy
import io
import math
import os
import time
from functools import partial

import torch

from harness.cli import write_atomic
from experiments.icl_mixers import (PROBE_HEADER, adam_step, adjusted_loss, diagnose, initialised, probe_cells,
                                   untrained_probes, zero_loss)
from experiments.regression import VERSION, fixed_prompts
from experiments.runner import NO_PLOT, fmt_s, job, load_json, md_table, mean_range, pyplot, save_figure, say, step_times
from harness.checkpoint import reshape_optimizer_state

MIXERS = tuple((v, L, '0') for v in ('flat', 'toeplitz', 'recurrent') for L in (2, 4)) + (('flat', 4, '5'),)
SETTINGS = {
    'full': dict(budget_s=60.0, rungs=(1, 4, 16), sweep_rung=4, rates=(1e-3, 3e-3, 1e-2), seeds=2, batch=256,
                 mixers=MIXERS, subset_batch=64, subset=(('flat', 4, '0'),), subset_top=4,
                 reference=(('transformer', 2, '0'), ('transformer', 2, '5')), warmup=0.1, decay=0.2,
                 d_model=64, calib_steps=100, eval_prompts=20000, sweep_prompts=4000, curve_prompts=1000,
                 curve_points=5),
    'quick': dict(budget_s=0.15, rungs=(1, 2, 4), sweep_rung=2, rates=(1e-3, 3e-3), seeds=2, batch=32,
                  mixers=(('flat', 2, '0'), ('flat', 4, '5')), subset_batch=16, subset=(('flat', 2, '0'),),
                  subset_top=2, reference=(('transformer', 2, '0'), ('transformer', 2, '5')), warmup=0.1,
                  decay=0.2, d_model=16, calib_steps=10, eval_prompts=1000, sweep_prompts=500, curve_prompts=200,
                  curve_points=5),
}
BEGIN, END = '<!-- mixer-ladder:begin -->', '<!-- mixer-ladder:end -->'     # the page's generated section
FIGURE = 'icl_mixer_ladder.png'


# ----------------------------------------------------------------------------- the schedule and one rung's run

def rung_steps(rung, base):
    """Steps of rung `rung` (a multiple of the 1x rung's `base` steps) -> int."""
    return max(1, round(rung * base))


def fork_step(rung, base, decay):
    """The step where rung `rung` leaves the stable phase: its last `decay` fraction decays -> int."""
    steps = rung_steps(rung, base)
    return steps - max(1, round(decay * steps))


def lr_wsd(it, peak, warmup, fork, end):
    """The learning rate of step `it` (0-based) of a warm-up, stable, decay schedule (Hagele et al. 2024,
    arXiv 2405.18392): linear warm-up over `warmup` steps to `peak`, `peak` until step `fork`, then linear
    decay reaching 0 at step `end`."""
    if it >= fork:
        return peak * (end - it) / (end - fork)
    return peak * min(1.0, (it + 1) / warmup)


def load_state(path, quiet=False):
    """A training state saved by segment_job (torch.load, weights only), or None if there is none or it
    is damaged (a one-line warning unless quiet)."""
    if not os.path.isfile(path):
        return None
    try:
        return torch.load(path, weights_only=True, map_location='cpu')      # a GPU's state goes on anywhere
    except Exception as e:                   # a torn write: start that part again
        if not quiet:
            say(f'warning: {path}: a damaged training state ({type(e).__name__}); not used')
        return None


def check_fork_state(run_dir, res):
    """Runner check of a cached rung (runner.Job.check): a rung that finished must have left its stable state
    (RUN_DIR/state.pt, of this rung's spec), where the next rung starts -> None, or why the rung must train
    again (a missing or damaged state: a torn write, a full disk). A rung that diverged left none. Asked only
    where the next rung is to run (runner.Runner.chains): a finished ladder needs no states."""
    if not res.get('finished', True):
        return None
    state = load_state(os.path.join(run_dir, 'state.pt'), quiet=True)
    if state is None or state.get('spec') != res.get('argv'):
        return 'its stable state (state.pt, where the next rung starts) is missing or damaged'
    return None


def save_state(path, **state):
    """torch.save the state whole or not at all (cli.write_atomic; a failed write, e.g. a full disk,
    leaves no temporary file and raises OSError)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    write_atomic(path, buf.getvalue())


def rung_start(spec, run_dir, resume, fork, fork_state):
    """The state segment_job starts from: its own resume.pt `resume` when it is this rung's (and before the
    fork, or past it with the fork's state.pt `fork_state` saved), else the stable state the previous rung
    left (its counters cleared), else None (from initialisation). With no usable previous state, a result
    instead: {'rc': 0, 'finished': False, ...} when that rung diverged, else {'rc': 1, 'line': why}."""
    if resume is not None and resume['spec'] == spec and (resume['step'] <= fork or (
            fork_state is not None and fork_state['spec'] == spec)):
        return resume
    if not spec['prev']:
        return None
    prev_dir = os.path.join(os.path.dirname(run_dir), spec['prev'])
    start, prev = load_state(os.path.join(prev_dir, 'state.pt')), load_json(os.path.join(prev_dir, 'result.json'))
    if start is None or prev is None or start['spec'] != prev.get('argv'):
        if prev is not None and not prev.get('finished', True):
            return {'rc': 0, 'finished': False, 'eval': math.inf, 'sweep': math.inf, 'curve': [], 'branch': [],
                    'line': 'diverged at an earlier rung'}
        return {'rc': 1, 'line': f'no stable state from the rung before ({spec["prev"]})'}
    return {**start, 'curve': [], 'branch': [], 'acc': [], 'train_seconds': [0.0, 0.0], 'seconds': 0.0}


def segment_job(spec, run_dir, device='cpu'):
    """Runner job: one rung of one run (a model, noise, batch, peak rate, seed). From the stable state the
    previous rung left at its fork (spec 'prev': that rung's folder beside run_dir; None: from
    initialisation, seed spec['seed']) it trains at the peak rate up to this rung's fork, saves the state
    there (RUN_DIR/state.pt, for the next rung), decays to this rung's last step and evaluates. Adam,
    gradient clipping at 1, float32, fresh prompts each step from a generator seeded with the seed (the
    same stream a run from step 0 draws). Every spec['ckpt_every'] steps RUN_DIR/resume.pt keeps the whole
    state, so a stopped job goes on where it stopped, to the same numbers. A non-finite loss ends the job
    (finished False); before the fork no state.pt is saved, so the later rungs fail too, while a loss that
    turns non-finite in the decay leaves the later rungs to train on from the fork. spec also: 'variant',
    'n_layer', 'd_model', 'noise', 'batch_size', 'lr', 'base', 'warmup', 'decay', 'rung', 'prev_rung',
    'eval_prompts', 'sweep_prompts', 'curve_prompts', 'curve_every'. `device` ('cpu' or 'cuda') is where it
    trains, not what it trains: the same initialisation and prompts (drawn on the CPU), so it is no part of the
    rung's key, and a rung stopped on a GPU goes on on a CPU (the numbers agree to float rounding, which grows
    over a long run as the threads' does). -> {'rc', 'line', 'finished', 'steps',
    'prompts', 'curve' and 'branch' [(step, mean train loss since the last point, adjusted loss on the
    curve prompts)] of the stable part and of the decay, 'eval', 'sweep' (adjusted losses), 'probes'
    (icl_mixers.diagnose on the sweep prompts), 'train_seconds' (stable, decay), 'seconds', 'params',
    'resumed_at', 'device' (where this job trained: the GPU's name, or 'CPU')}."""
    t0 = time.time()
    base, decay = spec['base'], spec['decay']
    end, fork = rung_steps(spec['rung'], base), fork_step(spec['rung'], base, decay)
    model = initialised(spec['variant'], spec['n_layer'], spec['d_model'], False, spec['seed']).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=spec['lr'])
    gen = torch.Generator().manual_seed(spec['seed'])
    st = {'step': 0, 'curve': [], 'branch': [], 'acc': [], 'train_seconds': [0.0, 0.0], 'seconds': 0.0}
    state_path, resume_path = os.path.join(run_dir, 'state.pt'), os.path.join(run_dir, 'resume.pt')
    resume, fork_state = load_state(resume_path), load_state(state_path, quiet=True)   # the runner said it
    start = rung_start(spec, run_dir, resume, fork, fork_state)
    if start is not None and 'rc' in start:     # no state to start from: the job's result
        return start
    if start is not None:
        model.load_state_dict(start['model'])
        opt.load_state_dict(start['opt'])
        reshape_optimizer_state(opt)                          # a state saved before the masked mixings' W changed shape
        gen.set_state(start['gen'])
        st = {k: copy.deepcopy(start[k]) for k in st}
    resumed_at = st['step'] if start is resume and resume is not None else None
    curve_set = fixed_prompts(spec['noise'], spec['curve_prompts'], 'curve')
    finished, t_prev = True, time.time()

    def snapshot(path):
        save_state(path, spec=spec, model=model.state_dict(), opt=opt.state_dict(), gen=gen.get_state(),
                   **{**st, 'seconds': st['seconds'] + time.time() - t_prev})
    while st['step'] < end:
        it = st['step']
        if it == fork and (fork_state is None or fork_state['spec'] != spec or fork_state['step'] != fork):
            snapshot(state_path)                 # the stable state: where the next rung starts
            fork_state = {'spec': spec, 'step': fork}
        for g in opt.param_groups:
            g['lr'] = lr_wsd(it, spec['lr'], spec['warmup'], fork, end)
        t_step = time.perf_counter()
        loss = adam_step(model, opt, spec['batch_size'], spec['noise'], gen)
        if not torch.isfinite(loss):
            finished = False
            break
        st['acc'].append(loss.item())
        st['train_seconds'][it >= fork] += time.perf_counter() - t_step
        st['step'] = it = it + 1
        if it % spec['curve_every'] == 0 or it in (fork, end):
            st['branch' if it > fork else 'curve'].append(
                (it, sum(st['acc']) / len(st['acc']), adjusted_loss(model, curve_set)))
            st['acc'] = []
        if it % spec['ckpt_every'] == 0 and it < end:
            snapshot(resume_path)
    params = sum(p.numel() for p in model.parameters())
    res = {'rc': 0, 'finished': finished, 'steps': end, 'prompts': end * spec['batch_size'], 'params': params,
           'curve': st['curve'], 'branch': st['branch'], 'train_seconds': st['train_seconds'],
           'resumed_at': resumed_at, 'device': torch.cuda.get_device_name() if device == 'cuda' else 'CPU'}
    if finished:
        model.eval()
        sweep = fixed_prompts(spec['noise'], spec['sweep_prompts'], 'sweep')
        res.update(eval=adjusted_loss(model, fixed_prompts(spec['noise'], spec['eval_prompts'], 'eval')),
                   sweep=adjusted_loss(model, sweep), probes=diagnose(model, sweep))
    else:
        res.update(eval=math.inf, sweep=math.inf)
    res['seconds'] = st['seconds'] + time.time() - t_prev
    if os.path.exists(resume_path):
        os.remove(resume_path)
    res['line'] = (f'adjusted eval loss {res["eval"]:.4g}, ' if finished else 'diverged, ') + \
        f'{end} steps, {time.time() - t0:.0f} s'
    return res


# ----------------------------------------------------------------------------- the plan

def configs(L):
    """The ladder's runs -> [(variant, n_layer, noise, batch, rungs)]: the mixers at L['batch'] up every
    rung, L['subset'] at L['subset_batch'] up to L['subset_top'], L['reference'] at the 1x rung."""
    return ([(v, n, noise, L['batch'], tuple(L['rungs'])) for v, n, noise in L['mixers']] +
            [(v, n, noise, L['subset_batch'], tuple(r for r in L['rungs'] if r <= L['subset_top']))
             for v, n, noise in L['subset']] +
            [(v, n, noise, L['batch'], (1,)) for v, n, noise in L['reference']])


def label(cfg):
    """A configs() tuple -> its name in the tables, e.g. '4L flat'."""
    return f'{cfg[1]}L {cfg[0]}'


def noise_label(noise):
    """A noise setting ('0' or the top of U(0, x)) -> its name in the tables, e.g. 'sigma = 0'."""
    return 'sigma = 0' if noise == '0' else f'U(0,{noise})'


def keep_dir(run_dir):
    """A rung's folder before its job: made if missing, kept otherwise (its resume.pt and state.pt are
    checked against the job's spec by segment_job)."""
    os.makedirs(run_dir, exist_ok=True)


def run_chain(parent, L, cfg, base, s_per_step, lr, seed, rungs):
    """The jobs (runner.Job in folder `parent`) of one run's rungs `rungs` (ascending), each starting where
    the one before it forked, the first at initialisation; a later part of a run is a slice of its whole
    chain. cfg: configs()'s tuple; base: the 1x rung's steps; s_per_step: for the ETAs."""
    v, n, noise, batch, _ = cfg
    jobs, prev = [], None
    for r in rungs:
        start = fork_step(prev.spec['rung'], base, L['decay']) if prev else 0
        spec = dict(variant=v, n_layer=n, d_model=L['d_model'], noise=noise, seed=seed, batch_size=batch, lr=lr,
                    base=base, warmup=max(1, round(L['warmup'] * base)), decay=L['decay'], rung=r,
                    prev=os.path.basename(prev.dir) if prev else None, prev_rung=prev.spec['rung'] if prev else None,
                    eval_prompts=L['eval_prompts'], sweep_prompts=L['sweep_prompts'],
                    curve_prompts=L['curve_prompts'], curve_every=max(1, base // L['curve_points']), ckpt_every=base)
        eta = (rung_steps(r, base) - start) * s_per_step * 1.05 + 2
        prev = job(parent, f'{v}-L{n}-noise{noise}-b{batch}-lr{lr:g}-seed{seed}-x{r:g}', spec, eta, VERSION, keep_dir,
                   check_fork_state)
        jobs.append(prev)
    return jobs


def step_seconds(runner, out, L, keys):
    """Seconds a training step of each (variant, n_layer, batch) of `keys` at L['d_model'] on L['device'] (if
    given and not the CPU, part of the key: a GPU's step times are its own) (runner.step_times of
    icl_mixers.regressor_step, cached in OUT/mixer_ladder, measured in the pool the runs train in: the median
    of 5 chunks of steps) -> {key: seconds}. RuntimeError if one fails."""
    return {k: t[0] for k, t in step_times(runner, os.path.join(out, 'mixer_ladder'), {
        (v, n, b): (f'calibrate-{v}-L{n}-d{L["d_model"]}-b{b}', 'experiments.icl_mixers:regressor_step',
                    dict(variant=v, n_layer=n, d_model=L['d_model'], products=False, batch_size=b,
                         **({'device': L['device']} if L.get('device', 'cpu') != 'cpu' else {})))
        for v, n, b in keys}, L['calib_steps'], VERSION, 'seconds a step (calibration)').items()}


def ladder_runs(runner, out, L):
    """Every job of the ladder (the module docstring's plan), cached in OUT/mixer_ladder -> {'configs',
    'step_s' {(variant, n_layer, batch): s}, 'base' {same: 1x steps}, 'lr' {cfg: chosen rate}, 'sweep'
    {cfg: {rung: {rate: result of seed 0}}}, 'runs' {cfg: {rung: [result per seed at the chosen rate]}},
    'top' {cfg: [the chosen rate's results of seed 0, a rung each]}, 'results' [every rung's result]};
    cfg: configs()'s tuple. L['base_steps'] {(variant, n_layer, batch): 1x steps}, if given, pins the budgets
    (another run's, e.g. a page's on another machine); the calibration then only times the ETAs. Every rung
    trains on L['device'] ('cpu' default; no part of its key, so a ladder may go on on another machine).
    RuntimeError if a calibration job fails (the budgets need every one)."""
    cfgs = configs(L)
    step_s = step_seconds(runner, out, L, sorted({(c[0], c[1], c[3]) for c in cfgs}))
    base = {k: L.get('base_steps', {}).get(k, max(10, round(L['budget_s'] / s))) for k, s in step_s.items()}

    def chain(cfg, lr, seed, part=slice(None)):          # a part of the run's rungs
        k = (cfg[0], cfg[1], cfg[3])
        return run_chain(os.path.join(out, 'mixer_ladder'), L, cfg, base[k], step_s[k], lr, seed, cfg[4])[part]

    def swept(cfg):
        return [r for r in cfg[4] if r <= L['sweep_rung']]
    first = [(cfg, lr) for cfg in cfgs for lr in L['rates']]
    later = [chain(c, L['rates'][0], 0, slice(len(swept(c)), None)) for c in cfgs if len(c[4]) > len(swept(c))]
    later += [chain(c, L['rates'][0], s) for c in cfgs for s in range(1, L['seeds'])]
    eta = sum(j.eta for ch in [chain(c, lr, 0, slice(len(swept(c)))) for c, lr in first] + later for j in ch)
    say(f'mixer ladder: {len(cfgs)} models, {sum(map(len, later)) + sum(len(swept(c)) for c, _ in first)} rungs to '
        f'train, about {fmt_s(eta)} of jobs in all if none is cached ({fmt_s(eta / runner.workers)} on '
        f'{runner.workers} workers)')
    train = partial(segment_job, device=L.get('device', 'cpu'))      # where it trains: no part of a rung's key
    res = runner.chains(train, [chain(c, lr, 0, slice(len(swept(c)))) for c, lr in first],
                        f'mixer ladder: every rate, seed 0, up to the {swept(cfgs[0])[-1]:g}x rung')
    sweep, first_runs = {}, {}
    for (cfg, lr), rs in zip(first, res):
        for r, x in zip(swept(cfg), rs):
            sweep.setdefault(cfg, {}).setdefault(r, {})[lr] = x
        first_runs[(cfg, lr)] = rs
    rate = {}                                # the best at the highest swept rung, on the sweep prompts
    for cfg in cfgs:
        at = sweep[cfg][swept(cfg)[-1]]
        rate[cfg] = min(L['rates'], key=lambda a: at[a].get('sweep', math.inf) if at[a]['rc'] == 0 else math.inf)
    second = [(cfg, 0) for cfg in cfgs if len(cfg[4]) > len(swept(cfg))] + \
             [(cfg, s) for cfg in cfgs for s in range(1, L['seeds'])]
    chains = [chain(cfg, rate[cfg], s, slice(len(swept(cfg)) if s == 0 else 0, None)) for cfg, s in second]
    res2 = runner.chains(train, chains, 'mixer ladder: the chosen rates, up every rung, every seed')
    runs, top = {}, {}
    for cfg in cfgs:
        rs = first_runs[(cfg, rate[cfg])]
        runs[cfg] = {r: [x] for r, x in zip(swept(cfg), rs)}
        top[cfg] = list(rs)
    for (cfg, s), rs in zip(second, res2):
        rungs = cfg[4][len(swept(cfg)):] if s == 0 else cfg[4]
        for r, x in zip(rungs, rs):
            runs[cfg].setdefault(r, []).append(x)
        if s == 0:
            top[cfg] += rs
    return {'configs': cfgs, 'step_s': step_s, 'base': base, 'lr': rate, 'sweep': sweep, 'runs': runs, 'top': top,
            'results': [x for rs in res + res2 for x in rs]}


# ----------------------------------------------------------------------------- the report

def gd_step_loss(noise, L, purpose='eval'):
    """One step of gradient descent from w = 0 with the best step size (von Oswald et al. 2023): y_hat =
    eta <x_q, X^T y>, eta fitted by least squares on the sweep prompts -> its adjusted loss on the eval
    prompts (purpose 'curve': the curve prompts) (float; at sigma = 0 about 0.5 d (1 - n / (n + d + 1)) =
    1.77, what a 1-layer linear self-attention reaches)."""
    def s(p):
        return (p.x_q * (p.y[..., None] * p.x).sum(1)).sum(-1)
    sw = fixed_prompts(noise, L['sweep_prompts'], 'sweep')
    eta = ((s(sw) * sw.y_q).sum() / (s(sw) ** 2).sum()).item()
    return adjusted_loss(lambda p: eta * s(p), fixed_prompts(noise, L[f'{purpose}_prompts'], purpose))


def losses(xs):
    """The finished eval losses of a rung's seeds, or None if any seed diverged or failed."""
    out = [x.get('eval', math.inf) if x['rc'] == 0 else math.inf for x in xs]
    return out if all(math.isfinite(v) for v in out) else None


def left_zero(xs, zero):
    """Below the zero predictor by more than the seeds' spread and by more than 1% of it: zero minus the
    mean of the seeds' losses larger than their range, max - min (which puts every seed below it; one
    seed: below it), and than 0.01 x zero (the sweeps' "not flat" line: two seeds that agree to 1e-4
    are not a model that left it by 3e-4) -> bool."""
    return bool(xs) and clear_drop(zero - sum(xs) / len(xs), max(xs) - min(xs), zero)


def clear_drop(drop, spread, zero):
    """A fall in adjusted loss that counts: larger than the seeds' spread and than 1% of the zero
    predictor's loss `zero` (left_zero, and the report's "still falling") -> bool."""
    return drop > max(spread, 0.01 * zero)


def fmt_count(n):
    """A count of prompts: 950, 210k, 3.36M."""
    return f'{n / 1e6:.2f}M' if n >= 1e6 else f'{n / 1e3:.0f}k' if n >= 1e4 else f'{n:,}'


def sweep_rows(plan, c, zero):
    """The ladder's sweep-table rows of config c, one a swept rung: each rate's adjusted loss on the sweep
    prompts (seed 0) and the best rate, '(edge)' when it lies at the edge of a sweep that is not flat (its
    rates differ by more than 1% of `zero`, the predict-0 loss)."""
    rows = []
    for r, by_rate in sorted(plan['sweep'][c].items()):
        vals = {a: x.get('sweep', math.inf) if x['rc'] == 0 else math.inf for a, x in by_rate.items()}
        finite = [v for v in vals.values() if math.isfinite(v)]
        best = min(vals, key=vals.get)
        edge = best in (min(vals), max(vals)) and len(finite) > 1 and max(finite) - min(finite) > 0.01 * zero
        rows.append([label(c), c[3], noise_label(c[2]), f'{r:g}x', ', '.join(f'{a:g}: {v:.4g}' for a, v in
                                                                       sorted(vals.items())),
                     f'{best:g}' + (' (edge)' if edge else '')])
    return rows


def ladder_report(plan, L, meta=''):
    """The ladder's markdown section (the plan's results) -> str: the ladder table (adjusted eval loss
    per rung, mean +- half range over seeds), the budgets (steps, prompts, seconds), each mixer's first
    rung off the zero predictor (left_zero) and its top rung beside one step of
    gradient descent and the 2-layer transformer, the sweeps, and the probes at the top rung, trained
    and untrained. meta: a line about the run (command, time), put first."""
    n_ref = len(L['reference'])                  # configs() puts the references last
    cfgs, refs = plan['configs'][:len(plan['configs']) - n_ref], plan['configs'][len(plan['configs']) - n_ref:]
    noises = sorted({c[2] for c in plan['configs']})
    zero = {n: zero_loss(n, L['eval_prompts']) for n in noises}
    gd = {n: gd_step_loss(n, L) for n in noises}
    tf = {c[2]: losses(plan['runs'][c][1]) for c in refs}
    rungs = list(L['rungs'])

    def cell(cfg, r):
        if r not in plan['runs'][cfg]:
            return '-'
        if any(x['rc'] != 0 for x in plan['runs'][cfg][r]):
            return 'failed'
        xs = losses(plan['runs'][cfg][r])
        return mean_range(xs) if xs else 'diverged'
    rows = [[label(c), c[3], noise_label(c[2]), f'{plan["lr"][c]:g}', *[cell(c, r) for r in rungs]] for c in cfgs]
    budget = []
    for c in cfgs + refs:
        k = (c[0], c[1], c[3])
        top = [x for x in plan['top'][c] if x['rc'] == 0 and x.get('train_seconds')]
        measured = sum(x['train_seconds'][0] for x in top) + top[-1]['train_seconds'][1] if top else math.nan
        budget.append([label(c), c[3], noise_label(c[2]), f'{1000 * plan["step_s"][k]:.1f}', plan['base'][k],
                       ' / '.join(fmt_count(rung_steps(r, plan['base'][k]) * c[3]) for r in c[4]),
                       ' / '.join(f'{r * L["budget_s"]:g}' for r in c[4]),
                       f'{measured:.0f}' if measured >= 10 else f'{measured:.2f}'])
    summary = []
    for c in cfgs:
        first = next((r for r in c[4] if losses(plan['runs'][c][r]) and left_zero(losses(plan['runs'][c][r]),
                                                                                 zero[c[2]])), None)
        top = losses(plan['runs'][c][c[4][-1]])
        k = (c[0], c[1], c[3])
        where = (f'{first:g}x ({fmt_count(rung_steps(first, plan["base"][k]) * c[3])} prompts, '
                 f'{first * L["budget_s"]:g} s)' if first else f'not by {c[4][-1]:g}x')
        closed = f'{100 * (zero[c[2]] - sum(top) / len(top)) / (zero[c[2]] - gd[c[2]]):.1f}%' if top else '-'
        falling = '-'
        if len(c[4]) > 1 and top and losses(plan['runs'][c][c[4][-2]]):
            before = losses(plan['runs'][c][c[4][-2]])
            spread = max(max(top) - min(top), max(before) - min(before))
            falling = 'yes' if clear_drop(sum(before) / len(before) - sum(top) / len(top), spread, zero[c[2]]) else 'no'
        summary.append([label(c), c[3], noise_label(c[2]), where, f'{c[4][-1]:g}x: {cell(c, c[4][-1])}',
                        f'{zero[c[2]]:.4g}', f'{gd[c[2]]:.3g}', mean_range(tf[c[2]]) if tf.get(c[2]) else '-', closed,
                        falling])
    sweeps = [row for c in cfgs + refs for row in sweep_rows(plan, c, zero[c[2]])]
    probes = []
    for c in cfgs + refs:
        top = plan['runs'][c][c[4][-1]]
        probes.append([f'{label(c)}, {c[4][-1]:g}x', c[3], noise_label(c[2]), cell(c, c[4][-1]),
                       *probe_cells([x['probes'] for x in top if x['rc'] == 0 and x.get('probes')])])
        probes.append([f'{label(c)} at initialisation', c[3], noise_label(c[2]), '',
                       *untrained_probes(c[0], c[1], L['d_model'], c[2], L, len(top))])
    head = [f'{r:g}x' for r in rungs]
    swept = max(r for r in rungs if r <= L['sweep_rung'])
    return '\n'.join([
        meta, '',
        md_table(['model', 'batch', 'noise', 'rate', *head], rows), '',
        f'Adjusted eval loss (model minus the oracle, 0.5 squared error, {L["eval_prompts"]} fresh prompts a noise '
        f'setting), mean +- half the range over {L["seeds"]} seeds at the chosen rate; rung r: r x '
        f'{L["budget_s"]:g} s of training (steps ' + ('pinned by --mixer_base_steps, another run\'s calibration; the '
                                         'one below is this run\'s, for its ETAs' if L.get('base_steps') else
                                         'from the calibration below') + '), warm-up, stable and the last '
        f'{100 * L["decay"]:g}% decaying to 0.', '',
        md_table(['model', 'batch', 'noise', 'ms a step (calibrated)', 'steps at 1x', 'prompts seen at each rung',
                  'budget seconds at each rung' + (" (the pinned steps' machine)" if L.get('base_steps') else ''),
                  'measured training s (top rung, seed 0)'], budget), '',
        md_table(['model', 'batch', 'noise', 'first rung below predict-0 by more than the seeds\' spread and 1%',
                  'top rung', 'predict 0', 'one GD step', '2L transformer (1x)', 'gap to one GD step closed',
                  'still falling at the top'], summary), '',
        'One GD step: y_hat = eta <x_q, X^T y> with eta fitted on the sweep prompts (the best 1-layer linear '
        'self-attention), on the same eval prompts as the models. 1%: of predict 0 (two seeds that agree to 1e-4 '
        'have not left it by 3e-4). Still falling: the top rung below the rung before it by more than the larger '
        'seeds\' spread and 1% of predict 0 (then a higher rung, --mixer_rungs, may move it further).', '',
        md_table(['model', 'batch', 'noise', 'rung', 'rate: adjusted loss on the sweep prompts (seed 0)',
                  'best'], sweeps), '',
        f'The rungs above {swept:g}x use the {swept:g}x rung\'s best rate. (edge): the best '
        'rate is at the edge of a sweep that is not flat (its rates differ by more than 1% of predict-0).', '',
        md_table(['model (top rung)', 'batch', 'noise', 'adjusted loss', *PROBE_HEADER], probes), '',
        'R^2: linear (ridge) probes of the hidden states, fitted on 3/4 of the sweep prompts and scored on the '
        'rest, mean +- half range over the seeds; "at initialisation": the same seeds before training.'])


def plot_ladder(plan, L, path):
    """Adjusted loss on the curve prompts against prompts seen, a panel per noise setting: each model's
    rungs (the end of each rung's decay; mean over seeds, bars: the range) joined, batch 64 dotted, seed
    0's run at the chosen rate through its stable phases as a thin line; predict 0, one GD step and the
    2-layer transformer's 1x level on the same prompts -> a line saying where, or why not (matplotlib
    missing). Everything drawn is on the curve prompts (the tables: on the eval prompts)."""
    plt = pyplot()
    if plt is None:
        return NO_PLOT
    import matplotlib.ticker
    noises = sorted({c[2] for c in plan['configs']})
    fig, axes = plt.subplots(1, len(noises), figsize=(7 * len(noises), 6.5), squeeze=False)
    variants = sorted({c[0] for c in plan['configs']})
    for ax, noise in zip(axes[0], noises):
        for c in (c for c in plan['configs'] if c[2] == noise):
            ref = c[0] == 'transformer'
            color, style = 'k' if ref else f'C{variants.index(c[0])}', ':' if c[3] != L['batch'] else '-' if \
                c[1] == 2 else '--'
            trace = [pt for x in plan['top'][c] if x['rc'] == 0 for pt in x['curve']]
            if trace:
                ax.plot([pt[0] * c[3] for pt in trace], [max(pt[2], 1e-3) for pt in trace], style, color=color,
                        lw=0.6, alpha=0.5)
            pts = [(rung_steps(r, plan['base'][(c[0], c[1], c[3])]) * c[3],
                    [x['branch'][-1][2] for x in plan['runs'][c][r]]) for r in c[4] if losses(plan['runs'][c][r])]
            if not pts:
                continue
            means = [max(sum(ys) / len(ys), 1e-3) for _, ys in pts]
            ax.errorbar([x for x, _ in pts], means, yerr=[[m - max(min(ys), 1e-3) for m, (_, ys) in zip(means, pts)],
                                                         [max(ys) - m for m, (_, ys) in zip(means, pts)]],
                        fmt=style + ('s' if ref else 'o'), color=color, lw=1.5, ms=4, capsize=2,
                        label=f'{label(c)}, batch {c[3]}' + (' (1x)' if ref else ''))
            if ref:
                ax.axhline(means[-1], color='k', ls='-.', lw=1, label='2L transformer level (1x)')
        ax.axhline(zero_loss(noise, L['curve_prompts'], 'curve'), color='grey', lw=3, alpha=0.4, label='predict 0')
        ax.axhline(gd_step_loss(noise, L, 'curve'), color='k', ls=(0, (5, 5)), lw=1, label='one GD step')
        ax.set(xscale='log', yscale='log', xlabel='prompts seen', ylabel=f'adjusted loss ({L["curve_prompts"]} '
               'curve prompts)', title=noise_label(noise).replace('U(0,', 'sigma ~ U(0, '))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.legend(fontsize=7, ncol=3, loc='upper center', bbox_to_anchor=(0.5, -0.12))     # below: no point hidden
        ax.grid(alpha=0.3)
    return save_figure(fig, path)


def check_docs(page, figure=FIGURE, markers=(BEGIN, END)):
    """Raise ValueError (one line) unless `page` can take a generated section (the ladder's by default): a
    file holding its markers (BEGIN, END) once each, in that order, writable, with an assets/ folder
    beside its folder for the figure -> the figure's path there."""
    BEGIN, END = markers
    try:
        with open(page, encoding='utf-8') as f:
            text = f.read()
    except OSError as e:
        raise ValueError(f'--docs {page}: cannot read it ({e.strerror or e})')
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f'--docs {page}: the page needs the lines {BEGIN} and {END}, once each, in that order')
    assets = os.path.join(os.path.dirname(os.path.abspath(page)), '..', 'assets')
    if not os.path.isdir(assets) or not os.access(assets, os.W_OK) or not os.access(page, os.W_OK):
        raise ValueError(f'--docs {page}: the page and an assets/ folder beside its folder must be writable')
    return os.path.normpath(os.path.join(assets, figure))


def write_docs(page, section, drawn, figure, markers=(BEGIN, END),
               alt='The mixers\' budget ladder: adjusted loss against prompts seen'):
    """Replace the text between the page's markers (BEGIN and END lines) with `section` and a link to
    `figure`, the page's figure (check_docs), copied from `drawn` (this run's figure). Each written whole
    or not at all (a temporary file, then a rename), the figure first; the rest of the page stays byte
    for byte. Raises OSError."""
    BEGIN, END = markers
    with open(page, encoding='utf-8') as f:
        text = f.read()
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    with open(drawn, 'rb') as f:
        write_atomic(figure, f.read())
    link = os.path.relpath(figure, os.path.dirname(os.path.abspath(page)))
    body = f'{section}\n\n![{alt}]({link})\n'
    write_atomic(page, f'{head}{BEGIN}\n{body}{END}{tail}')
