"""Retrieval with frozen language-model embeddings (Badger 2024, "Masked Mixers for Language Generation and
Retrieval").

    python retrieval.py --ckpt out/ckpt.pt
    python retrieval.py --ckpt out/mixer/ckpt.pt --ckpt out/transformer/ckpt.pt
    python retrieval.py --ckpt out/ckpt.pt --pairs summaries.jsonl --n_candidates 2 8 32

Pairs (data/pairs.py: the sentence rule and how the query is drawn). Each item is a (query, target) pair of
texts: by default, with the inverse cloze task (Lee et al. 2019), one sentence taken out of a story of
--data_dir's val.bin (--split) or of a raw --text file, and the story without it; --pairs FILE.jsonl instead
reads {"query": ..., "target": ...} objects, one per line. The train / test split is by story (--test_frac of
the stories).

Embeddings. Each checkpoint embeds a text with its own tokenizer as <|endoftext|> + text (stories follow an
<|endoftext|> in training; --no-prefix_eot turns this off), and takes the hidden vector of the last token
after block --layer (default the last block, before the final norm); --pool mean takes the mean of the hidden
vectors of all its tokens instead (--pool last mean: both, each with its own retrieval model). --untrained
adds, for each checkpoint, a freshly initialised model of its config (torch seed: the checkpoint's training
seed): the paper's control, since untrained mixer embeddings retrieve poorly. Texts longer than n_ctx are cut
to n_ctx tokens: queries and --pairs targets keep their first tokens, inverse-cloze targets keep a window of
n_ctx tokens centred (as far as the story allows) on the place the sentence was taken from. Texts are sorted
by length and right-padded in batches; a causal model's hidden vector at a position does not depend on later
(padding) tokens, so each text's vector is read at its own last real token. Embeddings are cached in
--cache_dir/<key>.pt, the key being the SHA-256 of the checkpoint file, the pairs and the options
(data/embeddings.py).

Retrieval model (RetrievalMixer, below): a bidirectional (unmasked) mixer over the N + 1 rows [query,
candidate_1 .. candidate_N], each an embedding projected to width d_r; a head d_r -> 1 scores each candidate;
softmax cross-entropy over the N candidates (in random order; negatives are other stories' targets). Its token
mixing is restricted to the permutation-equivariant family, so any N works (train at one N, evaluate at
others) and the scores permute with the candidates.

Baselines without training: cosine similarity of query and candidate embeddings, raw and centred (the mean
embedding of the training pairs subtracted first; LM hidden states share a large common direction).

Report: top-1 accuracy for N in {2, 8, 32, 128} (N candidates: the true target and N - 1 targets of other test
stories; --eval_rounds fixed draws per test query and N, the same draws for every method and checkpoint), with
chance 1/N. An N above the number of test stories is skipped with a note (an error if it was asked for with
--n_candidates). A second table gives the retrieval model's cross-entropy on training and test pairs at each N
(chance: ln N). Each top-1 accuracy has its 95% Wilson interval beside it, over the test queries (a query's
draws share its embedding: the queries are the trials), so an accuracy can be read against chance.

Early stopping: --val_frac of the training stories are held out, the validation loss (at the training N) is
measured every 50 steps, and the retrieval model keeps the parameters of its lowest one among the checks that
beat chance (ln N) by more than two standard errors (of the mean over the validation draws): a check at chance
says nothing learned, and was once kept for being the first. When no check beats chance the table says "no
better than chance at N" and the model keeps its last step's parameters. Training stops after --patience
checks in a row without a lower validation loss (default 5: 250 steps), or at --steps. The table gives the
kept step, the steps trained and the step of the lowest test loss (reported, never used to choose). A kept
step followed by --patience checks that did not improve on it says the retrieval model had budget enough, so
the embeddings, not the retrieval model, limit the comparison; one near --steps says it may not have.
"""

import argparse
import copy
import math
import os
import sys
import time

from harness import cli
cli.begin('retrieval.py', __name__)    # first, before torch's import: from here Ctrl-C is one line

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from harness.checkpoint import CheckpointError
from harness.loading import read_checkpoint
from data.embeddings import checkpoint_embeddings
from data.pairs import DEFAULT_NS, UsageError, draw_candidates, load_pairs, pairs_sha256, plan_splits
from harness.cli import failing, run_command, save_results
from harness.flags import (ArgumentParser, DocHelpFormatter, check_folder_writable, check_writable,
                           device_error, distinct_files, number, random_seed)

PROG = 'retrieval.py'
CHANCE_SE = 2           # a validation loss beats chance (ln N) below it by more than this many std. errors
fail = failing(PROG)                # 'retrieval.py: error: msg' on stderr, exit 2


# ----------------------------------------------------------------------------- retrieval model

class EquivariantMixerBlock(nn.Module):
    """Pre-norm mixer block over rows [query, c_1 .. c_N]: x float [B, 1 + N, d] -> float [B, 1 + N, d].
    A learned dense (N+1) x (N+1) mixing matrix would tie the model to one N and to the candidates'
    order; this token mixing is the unmasked matrix restricted to the permutation-equivariant family,
    with per-channel vectors a..e (z = LN(x), m = the mean of the candidate rows):
        y_q = a z_q + b m + bias_q,   y_ci = c z_ci + d m + e z_q + bias_c;
    then x += FF(LN(x)), FF = Linear(d, ff d) -> GELU -> Linear(ff d, d)."""

    def __init__(self, d, ff_mult=4, dropout=0.0):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.a, self.c, self.e = (nn.Parameter(torch.ones(d)) for _ in range(3))
        self.b, self.d, self.bias_q, self.bias_c = (nn.Parameter(torch.zeros(d)) for _ in range(4))
        self.ff = nn.Sequential(nn.Linear(d, ff_mult * d), nn.GELU(), nn.Linear(ff_mult * d, d))
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        z = self.norm1(x)
        zq, zc = z[:, :1], z[:, 1:]
        m = zc.mean(1, keepdim=True)
        yq = self.a * zq + self.b * m + self.bias_q
        yc = self.c * zc + self.d * m + self.e * zq + self.bias_c
        x = x + self.drop(torch.cat([yq, yc], 1))
        return x + self.drop(self.ff(self.norm2(x)))


class RetrievalMixer(nn.Module):
    """The retrieval model (Badger 2024): forward(query float [B, d_in], cands float [B, N, d_in]) ->
    scores float [B, N], permutation-equivariant in the candidates, any N >= 1. Inputs are
    standardised per channel (set_input_stats), projected to d_r (one projection for the query,
    one for candidates), mixed by n_layer EquivariantMixerBlocks, scored by LN -> Linear(d_r, 1)."""

    def __init__(self, d_in, d_r=128, n_layer=2, ff_mult=4, dropout=0.0):
        super().__init__()
        self.register_buffer('mu', torch.zeros(d_in))
        self.register_buffer('sd', torch.ones(d_in))
        self.in_q, self.in_c = nn.Linear(d_in, d_r), nn.Linear(d_in, d_r)
        self.blocks = nn.ModuleList(EquivariantMixerBlock(d_r, ff_mult, dropout) for _ in range(n_layer))
        self.norm_f = nn.LayerNorm(d_r)
        self.head = nn.Linear(d_r, 1)

    @torch.no_grad()
    def set_input_stats(self, emb):
        """Store the per-channel mean and standard deviation (at least 1e-6) of emb float [M, d_in], the
        training embeddings; forward standardises its inputs with them."""
        self.mu.copy_(emb.mean(0))
        self.sd.copy_(emb.std(0).clamp(min=1e-6))

    def forward(self, query, cands):
        q = self.in_q((query - self.mu) / self.sd)[:, None]
        c = self.in_c((cands - self.mu) / self.sd)
        x = torch.cat([q, c], 1)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm_f(x[:, 1:])).squeeze(-1)


def train_retrieval(model, q, t, stories, n, steps=400, batch_size=64, lr=2e-3, weight_decay=0.05,
                    seed=1337, log=None, val_loss=None, test_loss=None, every=50, chance=None, patience=0):
    """Train `model` on pairs (queries q float [P, d_in], targets t float [P, d_in], the story of each pair
    `stories` int [P]) with n candidates per query (negatives from other stories, drawn afresh at every
    step); AdamW, the learning rate decaying along a cosine from lr to lr / 10 over `steps`.

    Every `every` steps (and at the end) the held-out losses (nats) val_loss() (a float, or (mean, standard
    error)) and test_loss() are measured, when given, and log(step, train loss, val, test) called. Early
    stopping, with val_loss: the model ends with its parameters of the lowest validation loss among the
    checks that beat `chance` (nats: ln of the validation candidates; None: every check counts), below it by
    more than CHANCE_SE standard errors; after `patience` checks in a row without a lower one training stops
    (0: it runs all `steps`). When no check beats chance the model keeps its last parameters. Returns
    {'train_loss': mean of the last 50 steps' losses (nats), 'curve': [(step, train loss of the last `every`
    steps, val loss, test loss)], 'val_se': each check's standard error, 'kept_step': the step whose
    parameters the model ends with (None when no check beat chance), 'last_step': the last step trained,
    'chance': `chance`}."""
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    model.set_input_stats(torch.cat([q, t]))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    model.train()
    order, at, recent, curve, ses = rng.permutation(len(q)), 0, [], [], []
    best = (float('inf'), None, None)                   # (val loss, step, parameters) of a check below chance
    for step in range(steps):
        for g in opt.param_groups:
            g['lr'] = lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
        if at + batch_size > len(order):
            order, at = rng.permutation(len(q)), 0
        pos = order[at:at + batch_size]
        at += batch_size
        cands, labels = (torch.from_numpy(a) for a in draw_candidates(rng, stories, pos, n))
        loss = F.cross_entropy(model(q[torch.from_numpy(pos)], t[cands]), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        recent.append(loss.item())
        if (step + 1) % every == 0 or step + 1 == steps:
            model.eval()
            got = val_loss() if val_loss else None
            v, se = got if isinstance(got, tuple) else (got, 0.0)
            curve.append((step + 1, float(np.mean(recent[-every:])), v, test_loss() if test_loss else None))
            ses.append(se)
            model.train()
            if val_loss and v < best[0] and (chance is None or v + CHANCE_SE * se < chance):
                best = (v, step + 1, copy.deepcopy(model.state_dict()))
            if log:
                log(*curve[-1])
            since = len(curve) - 1 - [c[0] for c in curve].index(best[1]) if best[1] is not None else 0
            if patience and since >= patience:     # `patience` checks since the kept one, none lower
                break
    model.eval()
    if best[2] is not None:
        model.load_state_dict(best[2])
    kept = best[1] if val_loss else curve[-1][0]
    return {'train_loss': float(np.mean(recent[-50:])), 'curve': curve, 'val_se': ses, 'kept_step': kept,
            'last_step': curve[-1][0], 'chance': chance}


def scored_draws(score_fn, q, t, draws, batch=256):
    """Score fixed draws in batches of `batch` queries. `draws` (data/pairs.py's candidate_draws) is
    (queries int [K], indices into q float [P, d]; cands int [K, n], indices into t float [P, d]; labels
    int [K]). Yields, per batch, (score_fn(query float [B, d], cands float [B, n, d]) -> scores float
    [B, n], labels long [B])."""
    qs, cs, ls = draws
    for i in range(0, len(qs), batch):
        yield (score_fn(q[torch.from_numpy(qs[i:i + batch])], t[torch.from_numpy(cs[i:i + batch])]),
               torch.from_numpy(ls[i:i + batch]))


@torch.no_grad()
def retrieval_loss(model, q, t, draws, with_se=False):
    """Mean cross-entropy (nats) of the retrieval model's scores on fixed draws; with_se: (mean, the standard
    error of that mean over the draws)."""
    nats = torch.cat([F.cross_entropy(s, y, reduction='none') for s, y in scored_draws(model, q, t, draws)])
    if not with_se:
        return nats.mean().item()
    return nats.mean().item(), (nats.std().item() / math.sqrt(len(nats)) if len(nats) > 1 else 0.0)


@torch.no_grad()
def accuracy(score_fn, q, t, draws):
    """Top-1 accuracy (a float in [0, 1]) of score_fn(query float [B, d], cands float [B, n, d]) -> scores
    float [B, n] on fixed draws (data/pairs.py's candidate_draws)."""
    hits = sum((s.argmax(-1) == y).sum().item() for s, y in scored_draws(score_fn, q, t, draws))
    return hits / len(draws[0])


def cosine_scores(center=None):
    """A score_fn(query float [B, d], cands float [B, n, d]) -> float [B, n]: the cosine similarity of the
    query and each candidate, after subtracting `center` (float [d]) from both when it is given."""
    def score(query, cands):
        if center is not None:
            query, cands = query - center, cands - center
        return F.cosine_similarity(query[:, None], cands, dim=-1)
    return score


def wilson(p, n, z=1.96):
    """The Wilson score interval of a proportion p (float in [0, 1]) measured on n trials -> (low, high);
    z 1.96: 95%. Unlike p +- z sqrt(p (1 - p) / n) it stays in [0, 1] and is not empty at p 0 or 1 (Wilson
    1927)."""
    centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n)


# ----------------------------------------------------------------------------- report

def markdown_table(results, ns):
    """Markdown table: one row per (checkpoint, method), one column per N, chance (1/N) first; each top-1
    accuracy with its 95% Wilson interval in brackets (evaluate's 'accuracy_95')."""
    lines = ['| checkpoint | method | ' + ' | '.join(f'N={n} (95% interval)' for n in ns) + ' |',
             '|---|---|' + '---:|' * len(ns),
             '| (chance) | 1/N | ' + ' | '.join(f'{1 / n:.3f}' for n in ns) + ' |']
    for r in results:
        for method, accs in r['accuracy'].items():
            ci = r['accuracy_95'][method]
            cells = [f'{accs[str(n)]:.3f} ({ci[str(n)][0]:.3f}-{ci[str(n)][1]:.3f})' for n in ns]
            lines.append(f'| {r["name"]} | {method} | ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def loss_table(results, ns, steps):
    """Markdown table of the retrieval model's cross-entropy (nats) on its training pairs and the test pairs
    at each N (chance: ln N), the step it was kept at (the lowest validation loss among the checks below
    chance; none: no check was, 'no better than chance at N'), the steps it trained (of --steps: fewer when
    --patience stopped it) and the step of its lowest test loss (reported, never used)."""
    lines = ['| checkpoint | ' + ' | '.join(f'N={n} train / test' for n in ns) +
             ' | kept step (lowest val loss below chance) | steps trained | lowest test loss at step |',
             '|---|' + '---:|' * (len(ns) + 3)]
    lines.append('| (chance: ln N) | ' + ' | '.join(f'{math.log(n):.3f}' for n in ns) + ' | | | |')
    for r in results:
        cells = [('-' if r['loss'][str(n)]['train'] is None else f'{r["loss"][str(n)]["train"]:.3f}') +
                 f' / {r["loss"][str(n)]["test"]:.3f}' for n in ns]
        kept = f'none: no better than chance at N={r["val_n"]}' if r['kept_step'] is None else r['kept_step']
        lines.append(f'| {r["name"]} | ' + ' | '.join(cells) +
                     f' | {kept} | {r["last_step"]} of {steps} | {r["best_test_step"]} |')
    return '\n'.join(lines)


def build_parser():
    """The command line parser (flags.ArgumentParser: a bad flag or value is one line, exit 2)."""
    p = ArgumentParser(PROG, __doc__, formatter_class=DocHelpFormatter)
    p.description = __doc__                                 # --help: the whole docstring, as written
    g = p.add_argument_group('models')
    g.add_argument('--ckpt', action='append', required=True, metavar='PATH',
                   help='checkpoint from train.py; repeat to compare checkpoints in one table')
    g.add_argument('--layer', type=int, default=None, help='embed with the hidden vector after this block '
                   '(0-based, negative counts from the end; None: the last block, before the final norm)')
    g.add_argument('--prefix_eot', action=argparse.BooleanOptionalAction, default=True,
                   help='start every text with <|endoftext|>')
    g.add_argument('--device', default='cpu')
    g.add_argument('--threads', type=int, default=1,
                   help='torch CPU threads (the matrices are small: on a busy CPU one thread is much faster '
                        'than two)')
    g.add_argument('--embed_batch', type=int, default=64, help='texts per embedding forward pass')
    g.add_argument('--pool', nargs='+', choices=('last', 'mean'), default=['last'],
                   help="text embedding: the last token's hidden vector (the paper's) and/or the mean over "
                        "its tokens")
    g.add_argument('--untrained', action='store_true', help="also embed with an untrained model of each "
                   "checkpoint's config (its training seed): the paper's control")
    g = p.add_argument_group('pairs')
    g.add_argument('--data_dir', default='data/tinystories', help='prepared data (stories of --split.bin)')
    g.add_argument('--split', default='val', choices=('val', 'train'),
                   help='which prepared split the stories come from (default val: unseen by the LMs)')
    g.add_argument('--text',
                   help='raw text file of stories separated by <|endoftext|>, instead of --data_dir')
    g.add_argument('--pairs',
                   help='JSONL file of {"query": ..., "target": ...} pairs, instead of inverse cloze')
    g.add_argument('--max_pairs', type=int, default=2000)
    g.add_argument('--per_story', type=int, default=1, help='inverse cloze pairs per story')
    g.add_argument('--test_frac', type=float, default=0.2, help='fraction of stories held out for testing')
    g = p.add_argument_group('retrieval model')
    g.add_argument('--d_r', type=int, default=128, help='width of the retrieval mixer')
    g.add_argument('--r_layers', type=int, default=2, help='blocks of the retrieval mixer')
    g.add_argument('--train_n', type=int, default=16, help='candidates per query in training')
    g.add_argument('--steps', type=int, default=400, help='training steps of the retrieval mixer, at most '
                   '(--patience may stop it sooner)')
    g.add_argument('--batch_size', type=int, default=64)
    g.add_argument('--lr', type=number(float, 0, above=True), default=2e-3)
    g.add_argument('--weight_decay', type=number(float, 0), default=0.05)
    g.add_argument('--dropout', type=float, default=0.0)
    g.add_argument('--patience', type=number(int, 0), default=5,
                   help='early stopping: stop after this many checks (one every 50 steps) in a row '
                        'without a validation loss lower than the kept one (0: run all --steps); a kept step '
                        'followed by this many checks says the retrieval model had budget enough, one nearer '
                        'the end that it may not have')
    g.add_argument('--val_frac', type=float, default=0.1,
                   help='fraction of the training stories held out for early stopping (0: none, keep the '
                        'last step)')
    g = p.add_argument_group('evaluation and output')
    g.add_argument('--n_candidates', type=int, nargs='+', metavar='N',
                   help=f'candidate counts to evaluate (default {" ".join(map(str, DEFAULT_NS))}; '
                        'defaults above the test set size are skipped, explicit ones are an error)')
    g.add_argument('--eval_rounds', type=int, default=3, help='fixed candidate draws per test query and N')
    g.add_argument('--seed', type=random_seed, default=1337)
    g.add_argument('--cache_dir', default=os.path.join('out', 'retrieval_cache'))
    g.add_argument('--no_cache', action='store_true', help='neither read nor write the embedding cache')
    g.add_argument('--json', metavar='PATH', help='also write the results as JSON here')
    g.add_argument('--overwrite', action='store_true', help='replace an existing --json file')
    return p


def check_args(args):
    """Raise UsageError for an out-of-range option, a value given twice (--pool, --n_candidates), both --pairs
    and --text, an empty path, a folder for --pairs or a file for --data_dir, a --ckpt that is not a
    file (missing, or a folder) or names a checkpoint twice, an unusable --device, or an output that
    cannot be written: an existing --json without --overwrite, a --json or --cache_dir in a folder that
    takes no file. Checked before any work, so a long run never ends unable to save."""
    for name in ('max_pairs', 'per_story', 'd_r', 'r_layers', 'train_n', 'steps', 'batch_size',
                 'eval_rounds', 'embed_batch', 'threads'):
        if getattr(args, name) < 1:
            raise UsageError(f'--{name} must be >= 1, got {getattr(args, name)}')
    if args.train_n < 2:
        raise UsageError('--train_n must be >= 2')
    if not 0 < args.test_frac < 1:
        raise UsageError(f'--test_frac must be in (0, 1), got {args.test_frac}')
    if args.n_candidates and min(args.n_candidates) < 1:
        raise UsageError('--n_candidates must be >= 1')
    if not 0 <= args.dropout < 1:
        raise UsageError('--dropout must be in [0, 1)')
    if not 0 <= args.val_frac < 1:
        raise UsageError(f'--val_frac must be in [0, 1), got {args.val_frac}')
    for name in ('pool', 'n_candidates'):
        values = getattr(args, name) or []
        twice = [v for i, v in enumerate(values) if v in values[:i]]
        if twice:
            raise UsageError(f'--{name} names {twice[0]} twice; give each once')
    for name in ('pairs', 'text', 'data_dir', 'cache_dir'):
        if getattr(args, name) == '':
            raise UsageError(f'--{name} is empty; give a path')
    if args.pairs is not None and args.text is not None:
        raise UsageError('pass at most one of --pairs and --text')
    if args.pairs is not None and os.path.isdir(args.pairs):
        raise UsageError(f'--pairs {args.pairs} is a folder, not a JSONL file')
    if args.pairs is None and args.text is None and os.path.isfile(args.data_dir):
        raise UsageError(f'--data_dir {args.data_dir} is a file, not a prepared data folder '
                         '(or pass --text FILE)')
    try:                                    # each check raises a one-line ValueError (CheckpointError is one)
        for path in args.ckpt:
            if not os.path.isfile(path):    # not a file: read_checkpoint's one line says what it is instead
                read_checkpoint(path)
        distinct_files(args.ckpt, '--ckpt')
        if device_error(args.device):
            raise ValueError(device_error(args.device))
        if args.json is not None:
            check_writable(args.json, args.overwrite, '--json file')
        if not args.no_cache:
            check_folder_writable(args.cache_dir, '--cache_dir')
    except ValueError as e:
        raise UsageError(str(e))


def fit_retrieval_model(args, name, q, t, sp):
    """Train a RetrievalMixer (torch seed --seed) on the embeddings q, t float [P, d] of the pairs listed
    in `sp`.fit (plan_splits' plan), early-stopped on the pairs in `sp`.val (only a check below chance,
    ln sp.val_n, is kept; --patience), with its progress on stderr under `name` -> (model,
    train_retrieval's dict)."""
    tr, va, te = torch.tensor(sp.fit), torch.tensor(sp.val, dtype=torch.long), torch.tensor(sp.test)
    torch.manual_seed(args.seed)            # same init whether or not embeddings were cached
    model = RetrievalMixer(q.shape[1], args.d_r, args.r_layers, dropout=args.dropout)
    t0 = time.time()
    fit = train_retrieval(
        model, q[tr], t[tr], sp.stories[sp.fit], sp.train_n, args.steps, args.batch_size, args.lr,
        args.weight_decay, args.seed,
        val_loss=(lambda: retrieval_loss(model, q[va], t[va], sp.val_draws, True)) if sp.val_draws else None,
        test_loss=lambda: retrieval_loss(model, q[te], t[te], sp.test_draws),
        log=lambda s, a, v, b: print(f'{name}: retrieval mixer step {s}/{args.steps} train loss {a:.3f} '
                                     f'val loss {v if v is None else round(v, 3)} test loss {b:.3f}',
                                     file=sys.stderr),
        chance=math.log(sp.val_n) if sp.val_draws else None, patience=args.patience)
    print(f'{name}: trained the retrieval mixer in {time.time() - t0:.1f}s ({fit["last_step"]} steps); '
          f'{kept_cell(fit, sp.val_n)}', file=sys.stderr)
    return model, fit


def kept_cell(fit, val_n):
    """What train_retrieval's dict `fit` kept, in words: 'kept step 100 (val loss 2.601 +- 0.031, chance ln 16
    = 2.773)', or 'no better than chance at N=16 (lowest val loss 2.770 +- 0.025, chance ln 16 = 2.773): kept
    its last step, 400' (+-: one standard error)."""
    if fit['chance'] is None:
        return f'kept step {fit["kept_step"]} (its last: no validation stories)'
    chance = f'chance ln {val_n} = {fit["chance"]:.3f}'
    at = {c[0]: (c[2], se) for c, se in zip(fit['curve'], fit['val_se'])}
    if fit['kept_step'] is None:
        low = min(at.values())
        return (f'no better than chance at N={val_n} (lowest val loss {low[0]:.3f} +- {low[1]:.3f}, '
                f'{chance}): kept its last step, {fit["last_step"]}')
    v, se = at[fit['kept_step']]
    return f'kept step {fit["kept_step"]} (val loss {v:.3f} +- {se:.3f}, {chance})'


def evaluate(model, fit, q, t, sp):
    """Scores of embeddings q, t float [P, d] on plan `sp`: {'accuracy': {method: {str(N): top-1}},
    'accuracy_95': {method: {str(N): [low, high]}} (its 95% Wilson interval over the test queries: each
    query's rounds share its embedding, so the queries, not the draws, are the trials), 'loss': {str(N):
    {'train': nats or None, 'test': nats}}, and from `fit` (train_retrieval's dict) 'final_train_loss',
    'curve', 'val_se' (each check's standard error), 'kept_step' (None: no check beat chance), 'last_step',
    'val_chance' (nats, ln 'val_n'; None without validation stories), 'kept' (kept_cell's words),
    'best_test_step'}."""
    tr, te = torch.tensor(sp.fit), torch.tensor(sp.test)
    center = torch.cat([q[tr], t[tr]]).mean(0)
    methods = {'mixer (trained)': model, 'cosine': cosine_scores(), 'cosine (centred)': cosine_scores(center)}
    acc = {m: {str(n): accuracy(fn, q[te], t[te], sp.draws[n]) for n in sp.ns} for m, fn in methods.items()}
    loss = {str(n): {'train': retrieval_loss(model, q[tr], t[tr], sp.train_draws[n]) if n in sp.train_draws
                     else None, 'test': retrieval_loss(model, q[te], t[te], sp.draws[n])} for n in sp.ns}
    ci = {m: {k: list(wilson(a, len(sp.test))) for k, a in by_n.items()} for m, by_n in acc.items()}
    return {'accuracy': acc, 'accuracy_95': ci, 'loss': loss, 'final_train_loss': fit['train_loss'],
            **{k: fit[k] for k in ('curve', 'val_se', 'kept_step', 'last_step')}, 'val_chance': fit['chance'],
            'val_n': sp.val_n, 'kept': kept_cell(fit, sp.val_n),
            'best_test_step': min(fit['curve'], key=lambda c: c[3])[0]}


def run(args):
    """The experiment on parsed `args` (progress on stderr): for each checkpoint, control and
    pool, embeddings, a retrieval mixer and scores. Returns the results dict (--json's
    content). Raises UsageError for bad options or input, CheckpointError for a bad checkpoint."""
    check_args(args)
    pairs, source = load_pairs(args)
    sp = plan_splits(args, pairs)
    pairs_key = pairs_sha256(pairs)
    print(f'{source}: {len(pairs)} pairs, {len(sp.train)} train / {len(sp.test)} test '
          f'({sp.n_train_stories} / {sp.n_test_stories} stories)', file=sys.stderr)
    results = []
    for path in args.ckpt:
        for untrained in (False, True) if args.untrained else (False,):
            for pool in args.pool:
                name = (path + (' (untrained)' if untrained else '')
                        + (f' [{pool} pool]' if pool != 'last' else ''))
                q, t, desc = checkpoint_embeddings(path, pairs, pairs_key, args, pool, untrained)
                model, fit = fit_retrieval_model(args, name, q, t, sp)
                results.append({'ckpt': path, 'name': name, 'model': desc, 'untrained': untrained,
                                'pool': pool, **evaluate(model, fit, q, t, sp)})
    return {'source': source, 'pairs': len(pairs), 'train_pairs': len(sp.fit), 'val_pairs': len(sp.val),
            'test_pairs': len(sp.test), 'test_stories': sp.n_test_stories, 'ns': sp.ns, 'train_n': sp.train_n,
            'eval_trials': args.eval_rounds, 'notes': sp.notes, 'results': results, 'args': vars(args)}


def main(argv=None):
    """Command line entry point (argv: list of str; None: sys.argv). Exits (SystemExit, which the
    in-process runner experiments/commands.py reads) with 0 when the tables are printed on stdout and
    --json is written; 2 for bad input (one line); 1 when --json could not be written at the end (the
    tables are printed) or stdout is closed; 130 on Ctrl-C (one line naming the embedding cache:
    cli.run_command)."""
    args = build_parser().parse_args(argv)
    kept = None if args.no_cache else f'the embeddings computed so far are cached in {args.cache_dir}'
    sys.exit(run_command(PROG, run_and_report, args, kept=kept))


def run_and_report(args):
    """run(args), its tables printed (report) and --json written: main's work."""
    if args.threads >= 1:
        torch.set_num_threads(args.threads)
    try:
        out = run(args)
    except (UsageError, CheckpointError) as e:
        fail(str(e))
    report(out, args)
    sys.stdout.flush()
    if args.json:
        save_results(args.json, out, PROG)


def report(out, args):
    """Print the tables and notes of run()'s results `out` to stdout."""
    print(f'Top-1 retrieval accuracy, {out["source"]}: {out["train_pairs"]} train / {out["val_pairs"]} '
          f'validation (early stopping) / {out["test_pairs"]} test pairs; retrieval mixer trained at '
          f'N={out["train_n"]}; {out["eval_trials"]} fixed candidate draws per test query and N; in brackets '
          f'the 95% Wilson interval over the {out["test_pairs"]} test queries; chance 1/N first.\n')
    print(markdown_table(out['results'], out['ns']))
    print(f'\nThe retrieval mixer\'s loss (nats) on its training pairs (1 draw each) and the test pairs. Its '
          f'validation and test losses were measured every 50 steps; it keeps the parameters of the lowest '
          f'validation loss below chance (ln N of the validation candidates, by more than {CHANCE_SE} '
          f'standard errors; none below: its last step\'s) and stops after {args.patience or "no"} checks '
          'in a row without a lower one (--patience):\n')
    print(loss_table(out['results'], out['ns'], args.steps))
    print()
    for r in out['results']:
        print(f'- {r["name"]}: {r["model"]}; {r["kept"]}')
    for note in out['notes']:
        print(f'- note: {note}')


if __name__ == '__main__':
    main()
