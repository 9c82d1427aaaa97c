"""Multi-query associative recall (MQAR) for every model kind, with the field's protocol.

    python -m experiments.mqar                    # the CPU protocol: 2 cores, about 1 h 45 min measured (docs/mqar.md)
    python -m experiments.mqar --protocol gpu     # Zoology's figure-2 grid on one GPU (days: docs/mqar.md)
    python -m experiments.mqar --estimate         # only measure step times and print the protocol's time
    python -m experiments.mqar --quick            # every kind at a tiny cell, well under a minute
    python -m experiments.mqar --kinds transformer,flat --d_models 64 --cells 64:4   # any part of a grid

The task is Arora, Eyuboglu et al. 2023, "Zoology: Measuring and Improving Recall in Efficient
Language Models" (arXiv 2312.04927): multi-query associative recall as its section 4.1 defines it,
the sweep of its figure 2, built as the paper's code builds it (zoology/data/associative_recall.py
with the figure-2 config: filler 0). A sequence of T tokens opens with kv key-value pairs
k_1 v_1 ... k_kv v_kv, keys drawn without replacement from [1, V/2) and values from [V/2, V)
(disjoint halves of the vocabulary); every key is then asked again, once, at a later even position
2 kv + 2 g, the gaps g drawn without replacement with probability proportional to (g + 1)^(a - 1),
a = power_a = 0.01 (short gaps are likely); every other position holds the filler token 0. The
target at a query's position is its key's value (the next token the model predicts); every other
target is ignored. Loss (cross entropy) and accuracy (the fraction of test queries whose argmax is
exactly the value) are taken at the answer positions alone, where the logits are computed
(`answer_logits`: the model's own forward pass, its head applied at those positions).

Every kind of mixer.py (mixer.VARIANTS less `transformer_naive`, the transformer's outputs by
another attention kernel) trains through its own LanguageModel at the same d_model and n_layer = 2,
the attention kinds with one head as Zoology's attention (--attention_heads); then the masked mixer
with the best mean accuracy trains again with 4 layers. Each (kind, layers, T, d_model, lr) is one
cached job of runner.Runner (OUT/runs/NAME/result.json): a stopped command, run again, trains
only the jobs it had not finished (a job stopped midway starts over).
Training is Zoology's trainer: AdamW (betas 0.9, 0.999, weight decay 0.01 on matrices as
optim.param_groups sets it), the learning rate on a cosine over 64 epochs stepped once an epoch
(nearly constant over the few epochs a run lasts), the test set scored after every epoch and
training stopped once its accuracy is above 0.99. --warmup W adds a linear warm-up (lr_at): over
the first fraction W of all the run's steps (epochs x steps an epoch, the most it may take) the rate
rises from 0, one step at a time, then follows that cosine. The window protocol has W = 0.1 by
default (issue 58's check: with a 10% warm-up the transformer recalled at 1e-3, where it sat at
1/kv without), every other protocol 0 (Zoology's trainer has none). A cell's number is the best test
accuracy over its learning rates (Zoology's figure: "the maximum performance for each model over four
learning rates"), with that rate. The reading of the results is docs/mqar.md's (the window's: docs/mqar_window.md);
experiments/mqar_report.py writes OUT/mqar.md (tables, command, wall time), OUT/mqar.png (accuracy against
d_model, a panel per T, a line per kind) and OUT/results.json (every run).
"""

import argparse
import dataclasses
import itertools
import math
import os
import sys
import time

if __name__ == '__main__':       # run as a file too (python experiments/mqar.py): the repository root on
    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the path, as -m puts it
    from harness import cli                   # and from here Ctrl-C is one line, torch's import included
    cli.begin('mqar.py', keep=True)

import numpy as np
import torch
import torch.nn.functional as F

import mixer
from harness.cli import fail
from harness.flags import ArgumentParser, check_folder_writable, number
from harness.flags import assignments, listing
from experiments import mqar_report
from experiments.mqar_data import FILLER, POWER_A, check_cell, load_split, make_data, mqar, split_files
from experiments.mqar_report import N_LAYER, best
from experiments.runner import Runner, command, fmt_s, job, say, step_times

STOP_ACC = 0.99           # Zoology's early_stopping_threshold on the test accuracy
VERSION = 'mqar 2'        # of the trainer (fit, cell_job): part of every cached job's key; change it with them
WEIGHT_DECAY = 0.01       # torch.optim.AdamW's default: Zoology's optimiser
SCHEDULE_EPOCHS = 64      # Zoology's max_epochs, the length of its per-epoch cosine
# the variants MQAR trains (--kinds), and the masked mixers among them (one of which trains deeper)
MQAR_VARIANTS = tuple(v for v in mixer.VARIANTS if v != 'transformer_naive')
MASKED_VARIANTS = tuple(v for v in MQAR_VARIANTS
                        if mixer.VARIANTS[v].get('kind', mixer.ModelConfig.kind) == 'mixer')

# The protocols (docs/mqar.md). cells: (T, kv); batch: sequences a step at each T; lrs: the sweep, the
# best per cell; epochs: at most (a run stops once its test accuracy is above STOP_ACC).
PROTOCOLS = {
    # Zoology's figure 2 (zoology/experiments/paper/zoology_figure2.py): 4 learning rates on logspace(-4, -2).
    'gpu': dict(vocab_size=8192, cells=((64, 4), (128, 8), (256, 16), (512, 64)),
                batch={64: 512, 128: 512, 256: 256, 512: 128}, d_models=(64, 128, 256, 512),
                n_train=100_000, n_test=3_000, epochs=64, lrs=tuple(float(x) for x in np.logspace(-4, -2, 4)),
                patience=None, warmup=0.0, deep_layers=4, device='cuda', workers=1, threads=4),
    # 2 CPU cores (sized at about 90 minutes; the run measured 1 h 45 min): calibrated (docs/mqar.md) so
    # that the transformer solves T = 64, kv = 4 at d_model 64 within the budget (it did by its 2nd epoch
    # in 3 seeds of 3, and in the run).
    'cpu': dict(vocab_size=64, cells=((64, 4), (128, 8)), batch={64: 32, 128: 32}, d_models=(64, 128),
                n_train=16_000, n_test=1_000, epochs=3, lrs=(3e-4, 1e-3), patience=None, warmup=0.0,
                deep_layers=4, device='cpu', workers=2, threads=1),
    # The learning-rate window (docs/mqar_window.md): the easiest cell at d_model 128, 8 rates log-spaced by
    # 10^(1/3) from 1e-4 to 2.2e-2 (Zoology's four among them), up to 16 epochs, the plateau rule after 8 epochs
    # without a rise.
    # Vocabulary 256 > T for T = 64 and the T = 128 cell (Zoology's generator asserts vocab_size > input_seq_len).
    # A 10% linear warm-up (issue 58: without one the transformer sat at 1/kv from 1e-3 up; warm-up is standard
    # for transformers since Vaswani et al. 2017); --warmup 0 is the window's first table, trained without.
    'window': dict(vocab_size=256, cells=((64, 4),), batch={64: 32, 128: 32}, d_models=(128,),
                   n_train=16_000, n_test=1_000, epochs=16, lrs=tuple(float(x) for x in np.logspace(-4, -5 / 3, 8)),
                   patience=8, warmup=0.1, deep_layers=0, device='cpu', workers=2, threads=1),
    # --quick: every kind at a tiny cell, one rate, for the tests.
    'quick': dict(vocab_size=32, cells=((16, 2),), batch={16: 32}, d_models=(32,),
                  n_train=3072, n_test=256, epochs=4, lrs=(1e-3,), patience=None, warmup=0.0,
                  deep_layers=4, device='cpu', workers=2, threads=1),
}


# ----------------------------------------------------------------------------- models, scoring, training

def model_config(kind, T, vocab_size, d_model, n_layer, attention_heads=1, fields=None):
    """mixer.ModelConfig of variant `kind` at n_ctx = T: the variant's own fields, except that the attention
    kinds (transformer, gpt, hybrids, linear attention) get `attention_heads` heads (Zoology's attention has 1;
    0 keeps the variant's), then `fields` (a dict of ModelConfig fields: another form of the kind, e.g. Badger
    & Roland 2026's Toeplitz mixer; docs/mqar_window.md). ValueError for a shape or field the kind refuses."""
    own = {'n_head': 1, **mixer.VARIANTS[kind]}
    if attention_heads and own.get('kind', mixer.ModelConfig.kind) != 'mixer':
        own['n_head'] = attention_heads
    own.update(fields or {})
    try:
        return mixer.ModelConfig(vocab_size=vocab_size, n_ctx=T, d_model=d_model, n_layer=n_layer, **own)
    except TypeError as e:                            # a field ModelConfig does not have
        raise ValueError(str(e).replace('__init__()', 'ModelConfig')) from None


def build(kind, T, vocab_size, d_model, n_layer, seed, attention_heads=1, fields=None):
    """The LanguageModel of model_config(...), initialised from torch.manual_seed(seed)."""
    torch.manual_seed(seed)
    return mixer.build_model(model_config(kind, T, vocab_size, d_model, n_layer, attention_heads, fields))


def row_name(kind, fields):
    """A model's name in tables and cached jobs: the kind and its extra fields, e.g. 'toeplitz[n_head=1]'."""
    return kind + (f'[{",".join(f"{k}={v}" for k, v in sorted(fields.items()))}]' if fields else '')


ROW_FIELDS = ('kind', 'token_mixing')     # what a row's model is: its --kinds name sets them, --fields never changes them


def own_field(kind, name, fields=None):
    """The value of ModelConfig field `name` in the row of variant `kind` with `fields`: the field's value
    there, else the variant's, else ModelConfig's default (e.g. own_field('flat', 'kind') == 'mixer')."""
    return {**mixer.VARIANTS[kind], **(fields or {})}.get(name, getattr(mixer.ModelConfig, name))


def check_fields(fields, kinds):
    """--fields (a dict of ModelConfig fields) checked before any config is built -> None. Raises ValueError
    (one line) for a name that is not a field of mixer.ModelConfig; a value not of its field's type ('n_head
    must be int, got 'abc''); or a field of ROW_FIELDS that changes what a row of `kinds` is (flat with
    kind=transformer would train a transformer named flat[kind=transformer]): another model is another
    --kinds name."""
    types = {f.name: f.type for f in dataclasses.fields(mixer.ModelConfig)}
    for name, value in fields.items():
        if name not in types:
            raise ValueError(f'{name} is not a field of ModelConfig; choose from {", ".join(types)}')
        want = types[name]
        ok = isinstance(value, bool) == (want is bool) and isinstance(value, (int, float) if want is float else want)
        if not ok:
            raise ValueError(f'{name} must be {want.__name__}, got {value!r}')
    for kind in kinds:
        for name in ROW_FIELDS:
            if name in fields and fields[name] != own_field(kind, name):
                raise ValueError(f'{name}={fields[name]} changes what the {kind} row is (its model\'s {name} would be '
                                 f'{fields[name]!r}, not {own_field(kind, name)!r}, under the name '
                                 f'{row_name(kind, fields)}); choose models by --kinds, and give --fields only the '
                                 'other settings of a kind')


def answer_logits(model, inputs, targets):
    """The model's logits at the answer positions alone: float [n_answers, vocab] (rows: the positions
    where targets >= 0, row-major), and the answers long [n_answers]. The same numbers as
    model(inputs)[0][targets >= 0] (the head is per position), without the head at every position."""
    mask = targets >= 0
    return model.lm_head(model.norm_f(model.hidden(inputs)[mask])), targets[mask]


def count_correct(logits, answers):
    """Exact answers: logits float [n, vocab], answers long [n] -> (rows whose argmax is the answer, n).
    A near miss is wrong; so is a tie unless the answer is the first of the tied maxima."""
    return int((logits.argmax(-1) == answers).sum()), int(answers.numel())


@torch.no_grad()
def evaluate(model, inputs, targets, batch_size):
    """Test loss (nats per answer) and accuracy (the fraction of answers exactly right) -> (loss, acc)."""
    model.eval()
    total, correct, count = 0.0, 0, 0
    for i in range(0, len(inputs), batch_size):
        logits, ans = answer_logits(model, inputs[i:i + batch_size], targets[i:i + batch_size])
        total += F.cross_entropy(logits.float(), ans, reduction='sum').item()
        c, n = count_correct(logits, ans)
        correct, count = correct + c, count + n
    model.train()
    return total / count, correct / count


def optimizer(model, lr, weight_decay=WEIGHT_DECAY):
    """Zoology's AdamW (betas 0.9, 0.999) at peak rate lr, weight decay on matrices (optim.param_groups)."""
    from harness.optim import param_groups
    groups = param_groups(model, {'weight_decay': weight_decay, 'mixing_weight_decay': None, 'mixing_lr_mult': 1.0})
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999))


def plateaued(accs, patience, rise=0.01):
    """The plateau rule: True when the last `patience` epochs of test accuracies `accs` (one per epoch) brought
    no rise of `rise` over the best before them (None: never); patience is long (8 epochs in the window
    protocol): MQAR runs sit at 1/kv for many epochs before they recall."""
    if not patience or len(accs) <= patience:
        return False
    return max(accs[-patience:]) < max(accs[:-patience]) + rise


def warmup_steps(warmup, steps):
    """The warm-up's steps: the fraction `warmup` (in [0, 1)) of `steps`, rounded, at least 1 if warmup > 0."""
    return max(1, round(warmup * steps)) if warmup else 0


def lr_at(step, lr, per_epoch, epochs, warmup=0.0):
    """The learning rate of optimiser step `step` (0-based, counted over the whole run) of a run of at
    most `epochs` epochs of `per_epoch` steps at peak rate lr: Zoology's cosine over SCHEDULE_EPOCHS
    epochs, lr * 0.5 (1 + cos(pi (e - 1) / SCHEDULE_EPOCHS)) in epoch e = step // per_epoch + 1 (constant
    within an epoch), times the warm-up's linear ramp (step + 1) / W over the first W = warmup_steps(warmup,
    epochs * per_epoch) steps (as train.get_lr: the first step at lr / W, step W - 1 at the full rate). With
    warmup 0 it is Zoology's trainer exactly; with the window's 0.1, the first 800 of its 8,000 steps (1.6
    of 16 epochs) ramp, then the cosine, at 0.87 lr in the 16th epoch (issue 58)."""
    rate = lr * 0.5 * (1 + math.cos(math.pi * (step // per_epoch) / SCHEDULE_EPOCHS))
    w = warmup_steps(warmup, epochs * per_epoch)
    return rate * (step + 1) / w if step < w else rate


def fit(model, train, test, spec, device):
    """Train model on train = (inputs, targets) for at most spec['epochs'] epochs of spec['batch_size']
    sequences, shuffled by spec['seed'], at the rate lr_at sets every step (spec['lr'] times Zoology's
    cosine over SCHEDULE_EPOCHS epochs, stepped once an epoch, and a linear warm-up over the fraction
    spec['warmup'] of the steps where the spec has one), scoring test after every epoch and stopping
    once its accuracy is above STOP_ACC (Zoology's early stop), the plateau rule holds (plateaued,
    spec['patience']) or the loss is not finite -> {'curve': [(epoch, mean train loss, test loss, test
    acc)], 'acc', 'test_loss' (of the last epoch; a diverged run: 0 and None, JSON's null), 'epochs',
    'steps', 'diverged', 'plateau' (stopped by the plateau rule), 'seconds'}."""
    opt = optimizer(model, spec['lr'], spec['weight_decay'])
    n, bs = len(train[0]), spec['batch_size']
    per_epoch = max(1, n // bs)
    step, curve, diverged, plateau = 0, [], False, False
    gen, t0 = torch.Generator().manual_seed(spec['seed']), time.time()
    model.train()
    for epoch in range(1, spec['epochs'] + 1):
        order, losses = torch.randperm(n, generator=gen), []
        for b in range(per_epoch):
            rate = lr_at(step, spec['lr'], per_epoch, spec['epochs'], spec.get('warmup', 0.0))
            for g in opt.param_groups:
                g['lr'] = rate * g['lr_mult']
            idx = order[b * bs:(b + 1) * bs]
            logits, ans = answer_logits(model, train[0][idx].to(device), train[1][idx].to(device))
            loss = F.cross_entropy(logits.float(), ans)
            if not torch.isfinite(loss):
                diverged = True
                break
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            step += 1
        if diverged:
            break
        test_loss, acc = evaluate(model, test[0].to(device), test[1].to(device), 4 * bs)
        curve.append((epoch, sum(losses) / len(losses), test_loss, acc))
        if acc > STOP_ACC:
            break
        if plateaued([c[3] for c in curve], spec['patience']):
            plateau = True
            break
    last = curve[-1] if curve else (0, None, None, 0.0)
    return {'curve': curve, 'acc': 0.0 if diverged else last[3], 'test_loss': None if diverged else last[2],
            'epochs': len(curve), 'steps': step, 'diverged': diverged, 'plateau': plateau,
            'seconds': time.time() - t0}


def cell_job(spec, run_dir):
    """Runner job: one (kind, n_layer, T, kv, d_model, lr) trained and scored. spec: those keys and
    'fields', 'vocab_size', 'attention_heads', 'batch_size', 'epochs', 'patience', 'seed', 'device',
    'warmup' (only when it is not 0: plan()),
    'data' (the file names of split_files, read from OUT/data: run_dir is OUT/runs/NAME) and 'task'
    (the task's constants, for the cache key) -> {'rc', 'line', 'params', and fit()'s keys}."""
    device = spec['device']
    if device == 'cuda':
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    data_dir = os.path.join(os.path.dirname(os.path.dirname(run_dir)), 'data')
    try:
        train, test = (load_split(os.path.join(data_dir, spec['data'][k])) for k in ('train', 'test'))
    except ValueError as e:
        return {'rc': 1, 'line': str(e)}
    model = build(spec['kind'], spec['T'], spec['vocab_size'], spec['d_model'], spec['n_layer'], spec['seed'],
                  spec['attention_heads'], spec['fields']).to(device)
    res = fit(model, train, test, spec, device)
    res.update(rc=0, params=model.num_params(),
               line=f"acc {res['acc']:.3f}{' (diverged)' if res['diverged'] else ''}"
                    f"{' (plateau)' if res['plateau'] else ''}, {res['epochs']} epochs, "
                    f"{res['seconds']:.0f} s")
    return res


# ----------------------------------------------------------------------------- step times and the plan

def train_step(kind, n_layer, T, kv, d_model, batch_size, vocab_size, attention_heads, fields, device):
    """runner.step_time_job's builder: one training step of the shape (Zoology's AdamW, the loss at the
    answer positions, answer_logits) on one batch of MQAR sequences, on `device` -> step()."""
    model = build(kind, T, vocab_size, d_model, n_layer, 0, attention_heads, fields).to(device)
    opt = optimizer(model, 1e-4)
    x, y = (torch.from_numpy(a).to(device) for a in mqar(batch_size, T, kv, vocab_size, 0))

    def step():
        logits, ans = answer_logits(model, x, y)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(logits, ans).backward()
        opt.step()
    return step


def shape_seconds(runner, out, s, shapes):
    """Seconds a training step of every shape (kind, n_layer, T, kv, d_model) at its T's batch (train_step
    in runner.step_times: cached in OUT/step_times, measured as the runs go) -> ({shape: the median
    seconds}, {shape: the fastest chunk's}): the ETAs and --estimate (a job runs at most its epochs,
    early stopping only shortens it). RuntimeError if one fails."""
    t = step_times(runner, os.path.join(out, 'step_times'), {
        sh: ('-'.join(map(str, sh)), 'experiments.mqar:train_step',
             dict(kind=sh[0], n_layer=sh[1], T=sh[2], kv=sh[3], d_model=sh[4], batch_size=s['batch'][sh[2]],
                  vocab_size=s['vocab_size'], attention_heads=s['attention_heads'], fields=s['fields'],
                  device=s['device'])) for sh in shapes},
        6, VERSION, f'step times of {len(shapes)} model shapes (for the ETAs)')
    return {sh: x[0] for sh, x in t.items()}, {sh: x[1] for sh, x in t.items()}


def job_seconds(s, T, step_s):
    """A job's time at most from its step time at length T: every epoch's steps and its test pass (a
    forward, about a third of a training step a sequence)."""
    bs = s['batch'][T]
    return s['epochs'] * (s['n_train'] // bs + s['n_test'] / bs / 3) * step_s


TASK = dict(power_a=POWER_A, filler=FILLER, stop_acc=STOP_ACC, schedule_epochs=SCHEDULE_EPOCHS)    # the task's and trainer's constants: in every job's key


def plan(s, kinds, n_layer, seed, out=''):
    """Every job of the grid for `kinds` at n_layer -> list of (runner.Job in OUT/runs, its shape (kind,
    n_layer, T, kv, d_model)); each job's eta is 0 until run_grid sets it from the step times. The
    warm-up is in a job's spec (so its key) only when it is not 0: a job without one keeps the key it
    had before there was a warm-up, so the runs cached then are found (tests/test_mqar.py pins one)."""
    jobs = []
    for kind, (T, kv), d, lr in itertools.product(kinds, s['cells'], s['d_models'], s['lrs']):
        spec = dict(kind=kind, fields=s['fields'], n_layer=n_layer, T=T, kv=kv, d_model=d, lr=lr,
                    vocab_size=s['vocab_size'], attention_heads=s['attention_heads'],
                    batch_size=s['batch'][T], epochs=s['epochs'], patience=s['patience'],
                    weight_decay=s['weight_decay'], seed=seed,
                    device=s['device'], data=split_files(s, T, kv, seed), task=TASK,
                    **({'warmup': s['warmup']} if s['warmup'] else {}))
        name = f'{row_name(kind, s["fields"])}-L{n_layer}-T{T}-kv{kv}-d{d}-lr{lr:.3g}' + (
            f'-warmup{s["warmup"]:g}' if s['warmup'] else '')
        jobs.append((job(os.path.join(out, 'runs'), name, spec, 0.0, VERSION), (kind, n_layer, T, kv, d)))
    return jobs


def run_grid(runner, s, jobs, times, what):
    """Run the jobs of plan() on the pool, longest first -> {(row name, n_layer, T, kv, d_model): {lr: result}}
    (row_name: the kind and its extra fields)."""
    jobs = sorted(((j._replace(eta=job_seconds(s, j.spec['T'], times[shape])), shape) for j, shape in jobs),
                  key=lambda x: -x[0].eta)
    return collect([j for j, _ in jobs], runner.map(cell_job, [j for j, _ in jobs], what))


def collect(jobs, results):
    """Jobs of plan() and their results (None: left out) -> {(row name, n_layer, T, kv, d_model): {lr: result}}."""
    grid = {}
    for j, r in zip(jobs, results):
        sp = j.spec
        if r is not None:
            grid.setdefault((row_name(sp['kind'], sp['fields']), sp['n_layer'], sp['T'], sp['kv'], sp['d_model']),
                            {})[sp['lr']] = r
    return grid


def best_mixer(grid, n_layer, fields=None):
    """The masked-mixer variant (MASKED_VARIANTS) of the grid (rows of those variants with `fields`) with
    the best mean over cells of its best accuracy (the first in MASKED_VARIANTS on a tie), or None when it
    has none.
    Only a row whose model is a masked mixer (ModelConfig kind 'mixer' with `fields` applied) counts:
    a row named flat[kind=transformer] trains a transformer (check_fields refuses such fields)."""
    means = {}
    for k in MASKED_VARIANTS:
        if own_field(k, 'kind', fields) != 'mixer':
            continue
        cells = [best(r)[0] for key, r in grid.items() if key[0] == row_name(k, fields) and key[1] == n_layer]
        if cells:
            means[k] = sum(cells) / len(cells)
    return max(means, key=means.get) if means else None


def train_flops(s, kind, n_layer, T, kv, d_model):
    """Training FLOPs of one job if it runs all its epochs (machine.flops_per_token, with the head
    counted at the kv answer positions of a sequence alone, as answer_logits computes it)."""
    from harness.machine import flops_per_token
    model = mixer.build_model(model_config(kind, T, s['vocab_size'], d_model, n_layer, s['attention_heads'],
                                           s['fields']))
    head = 3 * 2 * d_model * s['vocab_size']
    return s['epochs'] * s['n_train'] * (T * (flops_per_token(model, T) - head) + kv * head)


def estimate(s, jobs, deep, times, fastest, out):
    """The time of the protocol's jobs (plan()'s, the deep row's `deep` kind among them) from the measured
    step times (times: the median steps; fastest: each shape's fastest chunk, what an uncontended machine
    would give), at most (every job runs all its epochs; early stopping only shortens it), and its FLOPs
    -> report lines."""
    per_kind, flops, best_case = {}, 0.0, 0.0
    for j, shape in jobs:
        label = f'{shape[0]} ({shape[1]} layers)'
        per_kind[label] = per_kind.get(label, 0.0) + job_seconds(s, j.spec['T'], times[shape])
        best_case += job_seconds(s, j.spec['T'], fastest[shape])
        flops += train_flops(s, *shape)
    total = sum(per_kind.values())
    long = lambda sec: f'{sec / 3600:.1f} h' if sec >= 7200 else fmt_s(sec)
    lines = [f'{label:32s} {long(sec):>10s} of jobs' for label, sec in per_kind.items()]
    lines += [f'{len(s["lrs"])} learning rates, {s["epochs"]} epochs of {s["n_train"]} sequences at most a job; '
              f'the deep row is {deep[0] if deep else "none"} at {s["deep_layers"]} layers here (in a run, the best '
              'mixer)',
              f'estimated time: at most {long(total / s["workers"])} on {s["workers"]} worker(s) '
              f'(each shape\'s median step, measured on {s["device"]} as the runs go, {s["workers"]} at a time, '
              f'{s["threads"]} thread(s) each: {os.path.join(out, "step_times")}); '
              f'{long(best_case / s["workers"])} from each shape\'s fastest step (an uncontended machine)',
              f'training FLOPs, every job to its last epoch: {flops / 1e15:.2f} PFLOP']
    return lines


# ----------------------------------------------------------------------------- the command

def cell(text):
    """'T:kv' -> (T, kv) (ints); ValueError otherwise."""
    T, kv = text.split(':')
    return int(T), int(kv)


def parse_args(argv):
    """The command line -> argparse.Namespace with .s (the settings), .kinds and .out. Every setting is
    checked before any work: a one-line error and exit 2 on a bad one."""
    p = ArgumentParser('mqar.py', __doc__, formatter_class=argparse.HelpFormatter)
    count, zero_up = number(int, 1), number(int, 0)
    p.add_argument('--protocol', choices=('cpu', 'window', 'gpu'),
                   help="cpu (the default): the 2-core protocol, about 1 h 45 min; window: the learning-rate "
                        "window at T=64, kv=4, d_model 128 (hours); gpu: Zoology's figure-2 grid")
    p.add_argument('--quick', action='store_true', help='every kind at a tiny cell, one rate (seconds: the tests)')
    p.add_argument('--estimate', action='store_true', help='only measure step times and print the time it takes')
    p.add_argument('--cached_only', action='store_true', help="train nothing: the report of the plan's 2-layer runs "
                   "cached under --out so far (a run not yet cached reads '-'), written to OUT/cached_only; "
                   "refused, with nothing made, when --out holds no cached run")
    p.add_argument('--kinds', type=listing(str, MQAR_VARIANTS, what='kind'), default=','.join(MQAR_VARIANTS),
                   help='model kinds (default: every mixer.VARIANTS name but transformer_naive)')
    p.add_argument('--cells', type=listing(cell, items='T:kv pairs (e.g. 64:4,128:8)'),
                   help="T:kv pairs, e.g. 64:4,128:8 (default the protocol's)")
    p.add_argument('--d_models', type=listing(count),
                   help="widths, e.g. 64,128 (default the protocol's)")
    p.add_argument('--lrs', type=listing(number(float, 0, above=True)),
                   help="learning rates of the sweep (default the protocol's)")
    p.add_argument('--epochs', type=count, help="epochs at most (default the protocol's)")
    p.add_argument('--n_train', type=count, help="training sequences a cell (default the protocol's)")
    p.add_argument('--n_test', type=count, help="test sequences a cell (default the protocol's)")
    p.add_argument('--vocab_size', type=number(int, 4), help="vocabulary (default the protocol's)")
    p.add_argument('--batch_size', type=count, help="sequences a step at every T (default the protocol's by T)")
    p.add_argument('--fields', type=assignments, default='', help="ModelConfig fields for every kind given, e.g. "
                   "n_head=1,mixing_init=normal (another form of a kind; its rows are named kind[fields]), each of "
                   "its field's type; never kind or mixing, which --kinds chooses")
    p.add_argument('--patience', type=zero_up, help="the plateau rule: stop after this many epochs without a rise "
                   "of 0.01 in test accuracy (default the protocol's: 8 for window, none otherwise)")
    p.add_argument('--warmup', type=number(float, 0), metavar='FRACTION',
                   help="a linear warm-up, per step, over this fraction (in [0, 1)) of the run's steps, then "
                        "Zoology's cosine (lr_at). Default the protocol's: 0.1 for window (issue 58), 0 (Zoology's "
                        "trainer) for the others; --warmup 0 on window: its first table's runs, from the cache")
    p.add_argument('--weight_decay', type=number(float, 0), default=WEIGHT_DECAY,
                   help="AdamW's weight decay on matrices (default 0.01, torch's and Zoology's)")
    p.add_argument('--attention_heads', type=zero_up, default=1,
                   help="heads of the attention kinds (default 1, Zoology's; 0: the variants')")
    p.add_argument('--deep_layers', type=zero_up, help='layers of the best mixer\'s second row (0: none; default 4)')
    p.add_argument('--seed', type=zero_up, default=0,
                   help='data (train: seed, test: seed + 10), init and shuffling (default 0)')
    p.add_argument('--device', choices=('cpu', 'cuda'), help="default: the protocol's")
    p.add_argument('--workers', type=count, help="jobs at a time (default the protocol's: 2 on cpu, 1 on gpu)")
    p.add_argument('--threads', type=count, help='torch threads a job (default 1 on cpu)')
    p.add_argument('--out', help='output folder (default out/mqar, out/mqar_window, out/mqar_gpu, out/mqar_quick)')
    args = p.parse_args(argv)
    if args.quick and args.protocol:
        p.error('--quick is a protocol of its own: give --quick or --protocol, not both')
    name = 'quick' if args.quick else args.protocol or 'cpu'
    s = {**PROTOCOLS[name], 'protocol': name, 'attention_heads': args.attention_heads,
         'weight_decay': args.weight_decay, 'fields': args.fields}
    for k in ('cells', 'd_models', 'lrs'):
        if getattr(args, k):
            s[k] = tuple(getattr(args, k))
    for k in ('epochs', 'n_train', 'n_test', 'vocab_size', 'deep_layers', 'device', 'workers', 'threads',
              'patience', 'warmup'):
        if getattr(args, k) is not None:
            s[k] = getattr(args, k)
    s['batch'] = {T: s['batch'].get(T, 32) if args.batch_size is None else args.batch_size for T, _ in s['cells']}
    if args.cached_only and args.estimate:
        p.error('--cached_only reports the cached runs and --estimate measures the step times: give one of them')
    p.check(check_fields, s['fields'], args.kinds, prefix='--fields: ')
    if not s['warmup'] < 1:
        p.error(f'--warmup is a fraction of the steps, in [0, 1): got {s["warmup"]}')
    if s['vocab_size'] > 32767:
        p.error(f'--vocab_size must be in 4..32767 (the data are stored as int16), got {s["vocab_size"]}')
    if s['n_train'] < max(s['batch'].values()):
        p.error(f'--n_train={s["n_train"]} is smaller than a batch ({max(s["batch"].values())} sequences)')
    for T, kv in s['cells']:
        p.check(check_cell, T, kv, s['vocab_size'], prefix='--cells: ')
        for kind, d in itertools.product(args.kinds, s['d_models']):
            p.check(model_config, kind, T, s['vocab_size'], d, N_LAYER, args.attention_heads, s['fields'],
                    prefix=f'{kind} at d_model {d}: ')
    if s['device'] == 'cuda' and not torch.cuda.is_available():
        p.error('--device cuda: CUDA is not available here (the gpu protocol needs a GPU; --device cpu runs it here)')
    s['seed'], args.s = args.seed, s
    args.out = os.path.abspath(args.out or os.path.join('out', {'cpu': 'mqar', 'gpu': 'mqar_gpu', 'window': 'mqar_window',
                                                               'quick': 'mqar_quick'}[name]))
    p.check(check_cached_runs if args.cached_only else check_folder_writable, args.out)
    return args


def check_cached_runs(out):
    """--cached_only's folder `out`, a report-only mode: raise ValueError (one line) unless it holds a cached
    run (some OUT/runs/NAME/result.json, of any plan: the report reads '-' where this plan's are missing),
    so that a typo in --out is refused before anything is made, and unless its report folder
    (OUT/cached_only) can be written."""
    runs = os.path.join(out, 'runs')
    if not os.path.isdir(out):
        raise ValueError(f'--cached_only reports the runs cached under --out, and {out} does not exist '
                         '(a typo? without --cached_only the runs are trained there)')
    if not any(os.path.isfile(os.path.join(runs, name, 'result.json')) for name in
               (os.listdir(runs) if os.path.isdir(runs) else ())):
        raise ValueError(f'--cached_only reports the runs cached under --out, and {out} holds none (no '
                         'runs/NAME/result.json: a typo? without --cached_only the runs are trained there)')
    check_folder_writable(os.path.join(out, 'cached_only'), 'report folder')


def main(argv=None):
    """Run the experiment of argv (see --help): OUT/mqar.md, OUT/mqar.png, OUT/results.json, the report
    on stdout. Exits 2 on bad arguments, 1 if a job failed, 130 on Ctrl-C (what finished stays cached)."""
    args = parse_args(argv)
    s, out, t0 = args.s, args.out, time.time()
    command = 'python -m experiments.mqar ' + ' '.join(argv if argv is not None else sys.argv[1:])
    plan_line = (f'mqar: {s["protocol"]} protocol, {len(args.kinds)} kinds x {len(s["cells"])} (T, kv) x '
                 f'{len(s["d_models"])} d_model x {len(s["lrs"])} lrs, {s["n_train"]} training sequences, at most '
                 f'{s["epochs"]} epochs')
    if args.cached_only:              # a report of what is cached: no data, nothing trained
        say(f'{plan_line}; --cached_only: the report of its runs cached in {os.path.join(out, "runs")}')
    else:
        os.makedirs(out, exist_ok=True)
        try:
            made = make_data(os.path.join(out, 'data'), s, s['seed'])
        except OSError as e:          # a full disk, a folder made read-only since the check
            fail(f'could not write the data under {out} ({e.strerror or e})', 'mqar.py', 1)
        say(f'{plan_line}; data: {len(made)} files generated, in {os.path.join(out, "data")}')
    runner = Runner(out, s['workers'], s['threads'])
    jobs = plan(s, args.kinds, N_LAYER, s['seed'], out)
    try:
        if args.cached_only:              # nothing trained: the report of what is cached, apart from a full run's
            grid, deep = collect([j for j, _ in jobs], [runner.cached(j) for j, _ in jobs]), None
            out = os.path.join(out, 'cached_only')
            os.makedirs(out, exist_ok=True)
        elif args.estimate:
            deep = [k for k in args.kinds if k in MASKED_VARIANTS][:1]
            jobs += plan(s, deep, s['deep_layers'], s['seed']) if s['deep_layers'] else []
            times, fastest = shape_seconds(runner, out, s, list(dict.fromkeys(sh for _, sh in jobs)))
            print('\n'.join(estimate(s, jobs, deep, times, fastest, out)))
            return 0
        else:
            times = shape_seconds(runner, out, s, list(dict.fromkeys(sh for _, sh in jobs)))[0]
            grid = run_grid(runner, s, jobs, times, f'{N_LAYER}-layer models')
            deep = best_mixer(grid, N_LAYER, s['fields']) if s['deep_layers'] else None
            if deep:
                jobs = plan(s, [deep], s['deep_layers'], s['seed'], out)
                times.update(shape_seconds(runner, out, s, [sh for _, sh in jobs])[0])
                grid.update(run_grid(runner, s, jobs, times, f'the best mixer ({deep}) at {s["deep_layers"]} layers'))
    except RuntimeError as e:           # a step-time job failed: no ETA, no run
        fail(f'measuring the step times failed ({e})', 'mqar.py', 1)
    finally:
        runner.close()
    total = len(jobs) if args.cached_only else sum(len(r) for r in grid.values())
    cached = sum(bool(r.get('cached')) for runs in grid.values() for r in runs.values())
    kinds = [row_name(k, s['fields']) for k in args.kinds]
    no_deep = ('--cached_only reports the 2-layer runs alone' if args.cached_only else
               '--deep_layers 0' if not s['deep_layers'] else 'no masked mixer in --kinds')
    try:
        notes = mqar_report.write(out, s, kinds, grid, deep and row_name(deep, s['fields']), command,
                                  time.time() - t0, cached, total, no_deep)
    except OSError as e:
        fail(f'could not write the report under {out} ({e.strerror or e}); the runs are cached there: run the '
             'same command again to write it', 'mqar.py', 1)
    failed = sum(r.get('rc') != 0 for runs in grid.values() for r in runs.values())
    for note in notes:
        say(note)
    say(f'mqar: done in {fmt_s(time.time() - t0)}'
        + (f'; {failed} runs FAILED (run again to retry them)' if failed else ''))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(command(main, 'mqar.py'))
