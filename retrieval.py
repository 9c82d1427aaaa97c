"""Retrieval with frozen language-model embeddings (Badger 2024, "Masked Mixers for
Language Generation and Retrieval").

    python retrieval.py --ckpt out/ckpt.pt
    python retrieval.py --ckpt out/mixer/ckpt.pt --ckpt out/transformer/ckpt.pt
    python retrieval.py --ckpt out/ckpt.pt --pairs summaries.jsonl --n_candidates 2 8 32

Pairs (data/pairs.py: the sentence rule and how the query is drawn). Each item
is a (query, target) pair of texts: by default, with the inverse cloze task
(Lee et al. 2019), one sentence taken out of a story of --data_dir's val.bin
(--split) or of a raw --text file, and the story without it; --pairs FILE.jsonl
instead reads {"query": ..., "target": ...} objects, one per line. The train /
test split is by story (--test_frac of the stories).

Embeddings. Each checkpoint embeds a text with its own tokenizer as
<|endoftext|> + text (stories follow an <|endoftext|> in training;
--no-prefix_eot turns this off), and takes the hidden vector of the last token
after block --layer (default the last block, before the final norm); --pool
mean takes the mean of the hidden vectors of all its tokens instead (--pool last
mean: both, each with its own retrieval model). --untrained adds, for each
checkpoint, a freshly initialised model of its config (torch seed: the
checkpoint's training seed): the paper's control, since untrained mixer
embeddings retrieve poorly. Texts longer than n_ctx are cut to n_ctx tokens: queries and --pairs targets keep
their first tokens, inverse-cloze targets keep a window of n_ctx tokens
centred (as far as the story allows) on the place the sentence was taken from.
Texts are sorted by length and right-padded in batches; a causal model's
hidden vector at a position does not depend on later (padding) tokens, so each
text's vector is read at its own last real token. Embeddings are cached in
--cache_dir/<key>.pt, key = sha256 of the checkpoint file + pairs + options.

Retrieval model (RetrievalMixer, below): a bidirectional (unmasked) mixer over the N + 1
rows [query, candidate_1 .. candidate_N], each an embedding projected to width d_r; a
head d_r -> 1 scores each candidate; softmax cross-entropy over the N candidates (in
random order; negatives are other stories' targets). Its token mixing is restricted
to the permutation-equivariant family, so any N works (train at one N, evaluate at
others) and the scores permute with the candidates.

Baselines without training: cosine similarity of query and candidate
embeddings, raw and centred (the mean embedding of the training pairs
subtracted first; LM hidden states share a large common direction).

Report: top-1 accuracy for N in {2, 8, 32, 128} (N candidates: the true target
and N - 1 targets of other test stories; --eval_rounds fixed draws per test
query and N, the same draws for every method and checkpoint), with chance 1/N.
An N above the number of test stories is skipped with a note (an error if it
was asked for with --n_candidates). A second table gives the retrieval model's
cross-entropy on training and test pairs at each N (chance: ln N). Early
stopping: --val_frac of the training stories are held out, the validation loss
(at the training N) is measured every 50 steps, and the retrieval model keeps
the parameters of its lowest one; the table gives that step and the step of the
lowest test loss (reported, never used to choose). A kept step well before
--steps says the retrieval model had budget enough, so the embeddings, not the
retrieval model, limit the comparison.
"""

import argparse
import copy
import hashlib
import io
import json
import math
import os
import sys
import time
from dataclasses import asdict

from harness import cli
cli.begin('retrieval.py', __name__)    # the first instruction: Ctrl-C is one line from here, torch's import included

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import mixer
from harness.checkpoint import CheckpointError, load_checkpoint, read_checkpoint
from data.pairs import (DEFAULT_NS, UsageError, draw_candidates, encode_pairs, load_pairs, pairs_sha256,
                        plan_splits)
from harness.cli import (ArgumentParser, check_folder_writable, check_writable, device_error, distinct_files, failing,
                 number, random_seed, run_command, save_results, write_atomic)
from data.tokenizer import file_sha256

PROG = 'retrieval.py'
CACHE_VERSION = 1
fail = failing(PROG)                # 'retrieval.py: error: msg' on stderr, exit 2


# ----------------------------------------------------------------------------- embeddings

@torch.no_grad()
def embed_tokens(model, seqs, layer=None, batch_size=64, device='cpu', progress=None, pool='last'):
    """Embeddings float [len(seqs), d] of token id lists (each non-empty, <= n_ctx).

    A language model's embedding is, after block `layer` (default the last), the hidden vector of a text's
    last token (pool='last', Badger 2024's choice) or the mean of the hidden vectors of all its tokens
    (pool='mean'). Texts are sorted by length and right-padded per batch; since the model is causal, a
    text's vectors at its own real tokens are the same as alone. An autoencoder uses its encoder's last
    token (layer must be None, pool 'last'). progress(done, total) is called after each batch. Raises
    ValueError for an empty sequence or an unknown pool."""
    if pool not in ('last', 'mean'):
        raise ValueError(f"pool must be 'last' or 'mean', got {pool!r}")
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    out = [None] * len(seqs)
    is_lm = hasattr(model, 'hidden')
    if not is_lm and pool != 'last':
        raise ValueError("an autoencoder embeds with its encoder's last token only (pool='last')")
    for b0 in range(0, len(order), batch_size):
        idxs = order[b0:b0 + batch_size]
        lens = [len(seqs[i]) for i in idxs]
        if min(lens) < 1:
            raise ValueError('cannot embed an empty token sequence')
        if is_lm:
            T = max(lens)
            pad = seqs[idxs[-1]][-1]                     # any valid id: it is never read
            x = torch.tensor([seqs[i] + [pad] * (T - len(seqs[i])) for i in idxs], device=device)
            h = model.hidden(x, layer=layer)             # [B, T, d]
            n = torch.tensor(lens, device=device)
            if pool == 'last':
                e = h[torch.arange(len(idxs), device=device), n - 1]
            else:
                real = (torch.arange(T, device=device)[None, :] < n[:, None]).unsqueeze(-1)   # [B, T, 1]
                e = (h * real).sum(1) / n[:, None]
        else:                                            # autoencoder: equal lengths only
            e = torch.empty(len(idxs), model.cfg.d_model, device=device)
            for L in sorted(set(lens)):
                rows = [k for k, n in enumerate(lens) if n == L]
                e[rows] = model.encode(torch.tensor([seqs[idxs[k]] for k in rows], device=device))
        for k, i in enumerate(idxs):
            out[i] = e[k].float().cpu()
        if progress:
            progress(min(b0 + batch_size, len(order)), len(order))
    return torch.stack(out)


def progress_printer(label):
    """A progress(done, total) callback printing to stderr (a few lines when not a tty)."""
    tty = sys.stderr.isatty()
    state = {'last': -1}

    def progress(done, total):
        quarter = 4 * done // total
        if tty:
            print(f'\r{label}: {done}/{total}', end='\n' if done == total else '', file=sys.stderr, flush=True)
        elif quarter != state['last'] and (quarter > 0 or done == total):
            state['last'] = quarter
            print(f'{label}: {done}/{total}', file=sys.stderr, flush=True)
    return progress


def checkpoint_embeddings(path, pairs, pairs_key, args, pool='last', untrained=False):
    """(query, target) embeddings float [P, d] of `pairs` by checkpoint `path` (or, with untrained=True,
    by a freshly initialised model of its config, torch seed = the checkpoint's training seed: the
    paper's control), pooled by `pool`, from the cache when there, and a short description of the
    model. Raises CheckpointError for a bad checkpoint, UsageError for a bad --layer or --pool."""
    model, enc, ckpt = load_checkpoint(path, args.device)
    cfg = model.cfg
    seed = ckpt.get('config', {}).get('seed', args.seed)
    if untrained:
        torch.manual_seed(seed)
        model = mixer.build_model(cfg).to(args.device).eval()
    if args.layer is not None:
        if not hasattr(model, 'hidden'):
            raise UsageError('--layer is not supported for autoencoder checkpoints')
        if not -cfg.n_layer <= args.layer < cfg.n_layer:
            raise UsageError(f'--layer {args.layer} out of range for a {cfg.n_layer}-layer model')
    if pool != 'last' and not hasattr(model, 'hidden'):
        raise UsageError(f'{path} is an autoencoder: it embeds with its last token only (--pool last)')
    desc = f'{cfg.kind}' + (f'/{cfg.token_mixing}' if cfg.kind in ('mixer', 'hybrid') else '') + \
        f' d={cfg.d_model} L={cfg.n_layer} n_ctx={cfg.n_ctx}' + (' autoencoder' if cfg.task != 'lm' else '')
    layer = None if args.layer is None else range(cfg.n_layer)[args.layer]
    weights = {'untrained': json.dumps(asdict(cfg), sort_keys=True), 'seed': seed} if untrained \
        else file_sha256(path if os.path.isfile(path) else os.path.join(path, 'model.safetensors'))   # or exported
    key_src = json.dumps({'v': CACHE_VERSION, 'ckpt': weights, 'pairs': pairs_key,
                          'layer': layer, 'prefix_eot': args.prefix_eot, 'pool': pool})
    key = hashlib.sha256(key_src.encode()).hexdigest()[:32]
    cache = None if args.no_cache else os.path.join(args.cache_dir, f'{key}.pt')
    if cache and os.path.isfile(cache):
        try:
            d = torch.load(cache, map_location='cpu', weights_only=True)
            if d['query'].shape[0] == len(pairs):
                print(f'{path}: embeddings from cache {cache}', file=sys.stderr)
                return d['query'], d['target'], desc
        except Exception as e:                          # unreadable cache (a torn write): recompute
            print(f'{PROG}: warning: {cache}: unreadable ({type(e).__name__}); computing the embeddings again',
                  file=sys.stderr)
    queries, targets = encode_pairs(pairs, enc, cfg.n_ctx, args.prefix_eot)
    t0 = time.time()
    emb = embed_tokens(model, queries + targets, layer, args.embed_batch, args.device,
                       progress_printer(f'{path}: embedding texts'), pool)
    print(f'{path}: embedded {len(queries) + len(targets)} texts in {time.time() - t0:.1f}s', file=sys.stderr)
    q, t = emb[:len(pairs)], emb[len(pairs):]
    if cache:
        save_cache(cache, {'query': q, 'target': t, 'key': key_src})
    return q, t, desc


def save_cache(path, obj):
    """torch.save obj to the cache file `path` whole or not at all (cli.write_atomic). The cache
    only saves time: a failed write (a full disk) is a one-line warning, and the run goes on without it."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    try:
        write_atomic(path, buf.getvalue())
    except OSError as e:
        print(f'{PROG}: warning: could not write the embedding cache {path} ({type(e).__name__}: '
              f'{str(e).splitlines()[0] if str(e) else ""}); going on without it', file=sys.stderr)


# ----------------------------------------------------------------------------- retrieval model

class EquivariantMixerBlock(nn.Module):
    """Pre-norm mixer block over rows [query, c_1 .. c_N], x float [B, 1 + N, d]. A learned dense
    (N+1) x (N+1) mixing matrix would tie the model to one N and to the candidates' order; this
    token mixing is the unmasked matrix restricted to the permutation-equivariant family, with
    per-channel vectors a..e (z = LN(x), m = the mean of the candidate rows):
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
        """Per-channel mean and std of emb float [M, d_in] (the training embeddings)."""
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
                    seed=1337, log=None, val_loss=None, test_loss=None, every=50):
    """Train `model` on pairs (q [P, d_in], t [P, d_in], stories [P]) with n candidates per query
    (negatives from other stories, fresh each step); AdamW, cosine decay.

    Every `every` steps (and at the end) the held-out losses (nats) val_loss() and test_loss() are
    measured, when given, and log(step, train loss, val, test) called. Early stopping: with val_loss, the
    model ends with its parameters of the lowest validation loss. Returns {'train_loss': mean of the last
    50 steps' losses (nats), 'curve': [(step, train loss of the last `every` steps, val loss, test loss)],
    'kept_step': the step whose parameters the model ends with}."""
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    model.set_input_stats(torch.cat([q, t]))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    model.train()
    order, at, recent, curve = rng.permutation(len(q)), 0, [], []
    best = (float('inf'), steps, None)                  # (val loss, step, parameters)
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
            curve.append((step + 1, float(np.mean(recent[-every:])), val_loss() if val_loss else None,
                          test_loss() if test_loss else None))
            model.train()
            if val_loss and curve[-1][2] < best[0]:
                best = (curve[-1][2], step + 1, copy.deepcopy(model.state_dict()))
            if log:
                log(*curve[-1])
    model.eval()
    if best[2] is not None:
        model.load_state_dict(best[2])
    return {'train_loss': float(np.mean(recent[-50:])), 'curve': curve, 'kept_step': best[1]}


def scored_draws(score_fn, q, t, draws, batch=256):
    """Scores of fixed draws (queries [K], cands [K, n], labels [K]) of pairs q [P, d],
    t [P, d] in batches: yields (score_fn(query [B, d], cands [B, n, d]) -> [B, n], labels [B])."""
    qs, cs, ls = draws
    for i in range(0, len(qs), batch):
        yield (score_fn(q[torch.from_numpy(qs[i:i + batch])], t[torch.from_numpy(cs[i:i + batch])]),
               torch.from_numpy(ls[i:i + batch]))


@torch.no_grad()
def retrieval_loss(model, q, t, draws):
    """Mean cross-entropy (nats) of the retrieval model's scores on fixed draws."""
    nats = sum(F.cross_entropy(s, y, reduction='sum').item() for s, y in scored_draws(model, q, t, draws))
    return nats / len(draws[0])


@torch.no_grad()
def accuracy(score_fn, q, t, draws):
    """Top-1 accuracy of score_fn(query [B, d], cands [B, n, d]) -> [B, n] on fixed draws."""
    return sum((s.argmax(-1) == y).sum().item() for s, y in scored_draws(score_fn, q, t, draws)) / len(draws[0])


def cosine_scores(center=None):
    """A score_fn(query [B, d], cands [B, n, d]) -> [B, n]: cosine similarity, of the
    vectors less `center` (float [d]) when given."""
    def score(query, cands):
        if center is not None:
            query, cands = query - center, cands - center
        return F.cosine_similarity(query[:, None], cands, dim=-1)
    return score


# ----------------------------------------------------------------------------- report

def markdown_table(results, ns):
    """Markdown table: one row per (checkpoint, method), one column per N, chance (1/N) first."""
    lines = ['| checkpoint | method | ' + ' | '.join(f'N={n}' for n in ns) + ' |',
             '|---|---|' + '---:|' * len(ns),
             '| (chance) | 1/N | ' + ' | '.join(f'{1 / n:.3f}' for n in ns) + ' |']
    for r in results:
        for method, accs in r['accuracy'].items():
            lines.append(f'| {r["name"]} | {method} | ' + ' | '.join(f'{accs[str(n)]:.3f}' for n in ns) + ' |')
    return '\n'.join(lines)


def loss_table(results, ns, steps):
    """Markdown table of the retrieval model's cross-entropy (nats) on its training pairs
    and the test pairs at each N (chance: ln N), the step it was kept at (lowest
    validation loss) and the step of its lowest test loss (reported, never used)."""
    lines = ['| checkpoint | ' + ' | '.join(f'N={n} train / test' for n in ns) +
             ' | kept step (lowest val loss) | lowest test loss at step |', '|---|' + '---:|' * (len(ns) + 2)]
    lines.append('| (chance: ln N) | ' + ' | '.join(f'{math.log(n):.3f}' for n in ns) + ' | | |')
    for r in results:
        cells = [('-' if r['loss'][str(n)]['train'] is None else f'{r["loss"][str(n)]["train"]:.3f}') +
                 f' / {r["loss"][str(n)]["test"]:.3f}' for n in ns]
        lines.append(f'| {r["name"]} | ' + ' | '.join(cells) +
                     f' | {r["kept_step"]} of {steps} | {r["best_test_step"]} of {steps} |')
    return '\n'.join(lines)


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    pass


def build_parser():
    """The command line parser (cli.ArgumentParser: a bad flag or value is one line, exit 2)."""
    p = ArgumentParser(PROG, __doc__, formatter_class=_HelpFormatter)
    p.description = __doc__                                 # --help: the whole docstring, as written
    g = p.add_argument_group('models')
    g.add_argument('--ckpt', action='append', required=True, metavar='PATH',
                   help='checkpoint from train.py; repeat to compare checkpoints in one table')
    g.add_argument('--layer', type=int, default=None, help='embed with the hidden vector after this block (0-based, '
                   'negative counts from the end; None: the last block, before the final norm)')
    g.add_argument('--prefix_eot', action=argparse.BooleanOptionalAction, default=True, help='start every text with <|endoftext|>')
    g.add_argument('--device', default='cpu')
    g.add_argument('--threads', type=int, default=1,
                   help='torch CPU threads (the matrices are small: one thread is much faster than two on a busy CPU)')
    g.add_argument('--embed_batch', type=int, default=64, help='texts per embedding forward pass')
    g.add_argument('--pool', nargs='+', choices=('last', 'mean'), default=['last'],
                   help="text embedding: the last token's hidden vector (the paper's) and/or the mean over tokens")
    g.add_argument('--untrained', action='store_true', help="also embed with an untrained model of each "
                   "checkpoint's config (its training seed): the paper's control")
    g = p.add_argument_group('pairs')
    g.add_argument('--data_dir', default='data/tinystories', help='prepared data (stories of --split.bin)')
    g.add_argument('--split', default='val', choices=('val', 'train'),
                   help='which prepared split the stories come from (default val: unseen by the LMs)')
    g.add_argument('--text', help='raw text file of stories separated by <|endoftext|>, instead of --data_dir')
    g.add_argument('--pairs', help='JSONL file of {"query": ..., "target": ...} pairs, instead of inverse cloze')
    g.add_argument('--max_pairs', type=int, default=2000)
    g.add_argument('--per_story', type=int, default=1, help='inverse cloze pairs per story')
    g.add_argument('--test_frac', type=float, default=0.2, help='fraction of stories held out for testing')
    g = p.add_argument_group('retrieval model')
    g.add_argument('--d_r', type=int, default=128, help='width of the retrieval mixer')
    g.add_argument('--r_layers', type=int, default=2, help='blocks of the retrieval mixer')
    g.add_argument('--train_n', type=int, default=16, help='candidates per query in training')
    g.add_argument('--steps', type=int, default=400)
    g.add_argument('--batch_size', type=int, default=64)
    g.add_argument('--lr', type=number(float, 0, above=True), default=2e-3)
    g.add_argument('--weight_decay', type=number(float, 0), default=0.05)
    g.add_argument('--dropout', type=float, default=0.0)
    g.add_argument('--val_frac', type=float, default=0.1,
                   help='fraction of the training stories held out for early stopping (0: none, keep the last step)')
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
        raise UsageError(f'--data_dir {args.data_dir} is a file, not a prepared data folder (or pass --text FILE)')
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
    """(model, train_retrieval's dict): a RetrievalMixer (torch seed --seed) trained on the embeddings q, t
    float [P, d] of plan_splits' `sp`.fit pairs, early-stopped on its val pairs, logged to stderr as `name`."""
    tr, va, te = torch.tensor(sp.fit), torch.tensor(sp.val, dtype=torch.long), torch.tensor(sp.test)
    torch.manual_seed(args.seed)            # same init whether or not embeddings were cached
    model = RetrievalMixer(q.shape[1], args.d_r, args.r_layers, dropout=args.dropout)
    t0 = time.time()
    fit = train_retrieval(
        model, q[tr], t[tr], sp.stories[sp.fit], sp.train_n, args.steps, args.batch_size, args.lr,
        args.weight_decay, args.seed,
        val_loss=(lambda: retrieval_loss(model, q[va], t[va], sp.val_draws)) if sp.val_draws else None,
        test_loss=lambda: retrieval_loss(model, q[te], t[te], sp.test_draws),
        log=lambda s, a, v, b: print(f'{name}: retrieval mixer step {s}/{args.steps} train loss {a:.3f} '
                                     f'val loss {v if v is None else round(v, 3)} test loss {b:.3f}',
                                     file=sys.stderr))
    print(f'{name}: trained the retrieval mixer in {time.time() - t0:.1f}s, kept step '
          f'{fit["kept_step"]}', file=sys.stderr)
    return model, fit


def evaluate(model, fit, q, t, sp):
    """Scores of embeddings q, t float [P, d] on plan `sp`: {'accuracy': {method: {str(N):
    top-1}}, 'loss': {str(N): {'train': nats or None, 'test': nats}}, and from `fit`
    (train_retrieval's dict) 'final_train_loss', 'curve', 'kept_step', 'best_test_step'}."""
    tr, te = torch.tensor(sp.fit), torch.tensor(sp.test)
    center = torch.cat([q[tr], t[tr]]).mean(0)
    methods = {'mixer (trained)': model, 'cosine': cosine_scores(), 'cosine (centred)': cosine_scores(center)}
    acc = {m: {str(n): accuracy(fn, q[te], t[te], sp.draws[n]) for n in sp.ns} for m, fn in methods.items()}
    loss = {str(n): {'train': retrieval_loss(model, q[tr], t[tr], sp.train_draws[n]) if n in sp.train_draws
                     else None, 'test': retrieval_loss(model, q[te], t[te], sp.draws[n])} for n in sp.ns}
    return {'accuracy': acc, 'loss': loss, 'final_train_loss': fit['train_loss'], 'curve': fit['curve'],
            'kept_step': fit['kept_step'], 'best_test_step': min(fit['curve'], key=lambda c: c[3])[0]}


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
                name = path + (' (untrained)' if untrained else '') + (f' [{pool} pool]' if pool != 'last' else '')
                q, t, desc = checkpoint_embeddings(path, pairs, pairs_key, args, pool, untrained)
                model, fit = fit_retrieval_model(args, name, q, t, sp)
                results.append({'ckpt': path, 'name': name, 'model': desc, 'untrained': untrained, 'pool': pool,
                                **evaluate(model, fit, q, t, sp)})
    return {'source': source, 'pairs': len(pairs), 'train_pairs': len(sp.fit), 'val_pairs': len(sp.val),
            'test_pairs': len(sp.test), 'test_stories': sp.n_test_stories, 'ns': sp.ns, 'train_n': sp.train_n,
            'eval_trials': args.eval_rounds, 'notes': sp.notes, 'results': results, 'args': vars(args)}


def main(argv=None):
    """Command line entry point (argv: list of str; None: sys.argv): exits (SystemExit, as the in-process
    runner experiments/commands.py reads it) with 0, the tables printed on stdout and --json written; 2,
    bad input (one line); 1, --json could not be written at the end (the tables are printed) or stdout
    closed; 130, Ctrl-C (one line naming the embedding cache: cli.run_command)."""
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
    print(f'Top-1 retrieval accuracy, {out["source"]}: {out["train_pairs"]} train / {out["val_pairs"]} validation '
          f'(early stopping) / {out["test_pairs"]} test pairs; retrieval mixer trained at N={out["train_n"]}; '
          f'{out["eval_trials"]} fixed candidate draws per test query and N.\n')
    print(markdown_table(out['results'], out['ns']))
    print(f'\nThe retrieval mixer\'s loss (nats) on its training pairs (1 draw each) and the test pairs. Its '
          f'validation and test losses at N={out["train_n"]} were measured every 50 steps; it keeps the parameters '
          f'of the lowest validation loss (early stopping):\n')
    print(loss_table(out['results'], out['ns'], args.steps))
    print()
    for r in out['results']:
        print(f'- {r["name"]}: {r["model"]}')
    for note in out['notes']:
        print(f'- note: {note}')


if __name__ == '__main__':
    main()
