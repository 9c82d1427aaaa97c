"""Input representation accuracy: can a model's input be read back from its hidden states?

    python -m experiments.represent                                  # untrained models of the papers' kinds
    python -m experiments.represent --ckpt out/a/ckpt.pt --ckpt out/b/ckpt.pt   # trained checkpoints too
    python -m experiments.represent --quick                          # tiny, seconds

Badger 2024 ("Masked Mixers for Language Generation and Retrieval", arXiv
2409.01482: "Language Mixer Basics", "Flat mixers train faster"; Masked Mixers II,
"Accuracy and flexibility") explains why mixers differ from transformers by this
measurement: a mixer's hidden states keep enough of its input that the input can be
recovered from them, for the token itself (self) and for the earlier tokens
(non-self), while a trained transformer's do not.

The measurement, for a frozen model, a depth l and windows of T tokens: one token
at a time is unknown, the others are given (their true embeddings).
  target   = the residual stream after l blocks on the true input;
  recover  = start the unknown token's input vector at random (N(0, s^2), s the
             embedding rows' std) and minimise the mean squared distance between the
             hidden states and the target by Adam on that vector alone (the model never
             changes), its learning rate decayed by a cosine from --lr to --lr / 100;
  decode   = the recovered vector to the nearest row (Euclidean) of the embedding
             matrix; accuracy = the fraction of tokens decoded to the true token.
  self     : the target is the unknown token's own position;
  non-self : the target is every later position and not its own, so the token is
             recovered only through what the sequence mixing carried forward.
Scored positions: --positions evenly spaced in 0 .. T-2 of each window, all in one
batch. Chance is the accuracy of the random start, decoded the same way. The table
gives the accuracy at half the steps beside the end's; to check convergence, run
again with twice --steps (same windows, same start): the README does, for a mixer
and a transformer.
Output: a markdown table on stdout (and --json). Every input is checked before the
work: a checkpoint whose tokenizer is not the one --data_dir was encoded with (the
windows' token ids would mean other text to it), a --json that exists (without
--overwrite) or cannot be written: one line, exit 2. Ctrl-C: one line, exit 130.
"""

import json
import math
import os
import sys
import time

if __name__ == '__main__':       # run as a file too (python experiments/represent.py): the repository root on
    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the path, as -m puts it
    from harness import cli                   # and from here Ctrl-C is one line, torch's import included
    cli.begin('represent.py')

import numpy as np
import torch

import mixer
from harness.checkpoint import CheckpointError
from harness.loading import load_checkpoint
from harness.cli import failing, run_command, save_results
from harness.flags import ArgumentParser, check_writable, distinct_files, number, random_seed
from harness.flags import listing
from experiments.runner import md_table
from data.tokens import token_dtype

DEFAULT_VARIANTS = ('flat', 'expanded', 'multihead', 'toeplitz', 'recurrent', 'transformer', 'gpt')
SHAPES = {'full': dict(d_model=128, n_layer=4, n_ctx=256, vocab_size=4096),
          'quick': dict(d_model=32, n_layer=2, n_ctx=32, vocab_size=512)}


fail = failing('represent.py')


def nearest_tokens(x, wte):
    """Nearest embedding row (Euclidean) of each vector: x float [..., d], wte [V, d] -> long [...]."""
    return torch.cdist(x.reshape(-1, x.shape[-1]), wte).argmin(-1).reshape(x.shape[:-1])


def recover(model, idx, depth, mode, positions, steps=500, lr=0.02, seed=0, checkpoints=()):
    """Recover input tokens of a frozen mixer.LanguageModel from its residual stream
    after `depth` blocks (1 .. n_layer), one unknown token at a time.

    idx long [B, T]: the windows; positions: the positions j to score (0 <= j < T - 1),
    each in its own copy of each window with only x_j unknown. mode 'self': match
    position j's hidden state; 'nonself': match positions j+1 .. T-1. Adam on the
    unknown vectors for `steps` steps, its learning rate decayed by a cosine from lr to
    lr / 100, loss = mean squared distance.
    -> dict: 'accuracy' (fraction of the B x len(positions) tokens decoded right,
    float), 'chance' (the same for the random start), 'at' ({step: accuracy} at
    `checkpoints`), 'loss' (final). The model's parameters, their requires_grad and
    its train/eval mode are restored: it never changes. Raises ValueError for a bad
    depth, mode or position."""
    if mode not in ('self', 'nonself'):
        raise ValueError(f"mode must be 'self' or 'nonself', got {mode!r}")
    if not 1 <= depth <= len(model.blocks):
        raise ValueError(f'depth must be in 1..{len(model.blocks)}, got {depth}')
    B, T = idx.shape
    pos = torch.as_tensor(positions).repeat(B)                           # [N], N = B x len(positions)
    if not (0 <= int(pos.min()) and int(pos.max()) < T - 1):
        raise ValueError(f'positions must be in 0..{T - 2}')
    idx = idx.repeat_interleave(len(positions), 0)                       # [N, T]: one copy per scored token
    wte = model.wte.weight.detach()
    flags = [p.requires_grad for p in model.parameters()]
    was_training = model.training
    model.eval().requires_grad_(False)
    try:
        t = torch.arange(T)
        unknown = (t[None, :] == pos[:, None]).unsqueeze(-1).float()     # [N, T, 1]
        matched = (t[None, :] == pos[:, None]) if mode == 'self' else (t[None, :] > pos[:, None])
        given = wte[idx]
        with torch.no_grad():
            target = model.hidden(None, depth - 1, embeddings=given)
        g = torch.Generator().manual_seed(seed)
        v = (torch.randn(len(pos), 1, wte.shape[1], generator=g) * wte.std()).requires_grad_()
        truth = idx[torch.arange(len(pos)), pos]

        def score():
            return (nearest_tokens(v.detach()[:, 0], wte) == truth).float().mean().item()
        chance, at = score(), {}
        opt = torch.optim.Adam([v], lr=lr)
        for step in range(1, steps + 1):
            opt.param_groups[0]['lr'] = lr * (0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * (step - 1) / steps)))
            h = model.hidden(None, depth - 1, embeddings=given * (1 - unknown) + v * unknown)
            loss = (h - target).pow(2).sum(-1)[matched].mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step in checkpoints:
                at[step] = score()
        return {'accuracy': score(), 'chance': chance, 'at': at, 'loss': loss.item()}
    finally:
        for p, f in zip(model.parameters(), flags):
            p.requires_grad_(f)
        model.train(was_training)


def windows(data_dir, n_ctx, T, count, vocab_size, seed=0):
    """`count` windows of T tokens: from data_dir/val.bin (evenly spaced) if given, else
    uniform random tokens below vocab_size -> long [count, T]. A missing, damaged or too
    short val.bin: one line, exit 2."""
    if data_dir is None:
        return torch.randint(vocab_size, (count, T), generator=torch.Generator().manual_seed(seed))
    path = os.path.join(data_dir, 'val.bin')
    if not os.path.isfile(path):
        fail(f'{path} not found: run data/prepare.py first (or leave out --data_dir)')
    size, dtype = os.path.getsize(path), token_dtype(data_dir)
    if size % dtype.itemsize or size // dtype.itemsize < T + 1:
        fail(f'{path} holds {size} bytes: not a token file of at least T + 1 = {T + 1} {dtype} ids')
    val = np.memmap(path, dtype=dtype, mode='r')
    starts = np.linspace(0, len(val) - T - 1, count).astype(np.int64)
    return torch.from_numpy(np.stack([val[s:s + T].astype(np.int64) for s in starts]))


def data_tokenizer(data_dir):
    """The SHA-256 of the tokenizer that data_dir's token files were encoded with (its
    meta.json's tokenizer_sha256); a missing or damaged meta.json: one line, exit 2."""
    path = os.path.join(data_dir, 'meta.json')
    if not os.path.isfile(path):
        fail(f'{path} not found: run data/prepare.py first (or leave out --data_dir)')
    try:
        with open(path) as f:
            return str(json.load(f)['tokenizer_sha256'])
    except (OSError, ValueError, KeyError, TypeError) as e:
        fail(f'{path} is damaged ({type(e).__name__}: {e}); run data/prepare.py again')


def load_checkpoints(args):
    """Every --ckpt, loaded and checked before any work -> list of (path, model, checkpoint
    dict). A missing or corrupt checkpoint, an autoencoder, or (with --data_dir) a tokenizer
    other than the data's: one line, exit 2 (an n_ctx below --T: measure's check of every model)."""
    out, data_sha = [], data_tokenizer(args.data_dir) if args.data_dir and args.ckpt else None
    for path in args.ckpt:
        try:
            model, _, ckpt = load_checkpoint(path)
        except CheckpointError as e:
            fail(str(e))
        if model.cfg.task != 'lm':
            fail(f'{path} is an autoencoder; represent.py needs a language model')
        sha = ckpt['tokenizer']['sha256']
        if data_sha is not None and sha != data_sha:
            fail(f'{path} was trained with another tokenizer (sha256 {sha}) than {args.data_dir} was encoded with '
                 f'(sha256 {data_sha}): its token ids would mean other text; use the data dir it was trained on')
        out.append((path, model, ckpt))
    return out


def models(args, checkpoints):
    """(name, model, trained?, checkpoint path or None) for every --variants (untrained,
    seeded), every checkpoint of load_checkpoints and, with --untrained, an untrained
    model of each checkpoint's config (seeded by the checkpoint's own training seed, so
    two seeds give two)."""
    for name in args.variants:
        torch.manual_seed(args.seed)
        yield name, mixer.build_model(mixer.variant_config(name, n_head=1, **args.shape)), False, None
    for path, model, ckpt in checkpoints:
        yield f'{ckpt["config"]["variant"]} ({path})', model, True, path
        if args.untrained:
            torch.manual_seed(ckpt['config'].get('seed', args.seed))
            yield f'{ckpt["config"]["variant"]} ({path}, untrained)', mixer.build_model(model.cfg), False, path


def depth(text):
    """A --depths item: a block count, or 'all' (the model's n_layer); ValueError otherwise."""
    return text if text == 'all' else int(text)


def parse_args(argv):
    """The command line -> argparse namespace, checked (one-line errors, exit 2: a bad value, a --ckpt
    given twice, --untrained without --ckpt, a --data_dir that is not a folder, a --json that exists or
    cannot be written, an empty one),
    with .shape: the untrained models' sizes, and .steps: --quick's 60 unless --steps was given."""
    p = ArgumentParser('represent.py', __doc__)
    count = number(int, 1)
    p.add_argument('--variants', type=listing(str, tuple(mixer.VARIANTS), empty=True, what='variant'),
                   default=','.join(DEFAULT_VARIANTS), help='untrained models of these mixer.VARIANTS (empty: none)')
    p.add_argument('--ckpt', action='append', default=[], help='a trained checkpoint (repeatable)')
    p.add_argument('--untrained', action='store_true',
                   help="also an untrained model of each checkpoint's config (seeded by its training seed)")
    p.add_argument('--T', type=number(int, 2), default=32, help='tokens a window')
    p.add_argument('--windows', type=count, default=4, help='windows a model')
    p.add_argument('--positions', type=count, default=8, help='scored positions a window, evenly spaced')
    p.add_argument('--steps', type=number(int, 2), default=None,
                   help='Adam steps of the recovery; None: 500, or 60 with --quick')
    p.add_argument('--lr', type=number(float, 0, above=True), default=0.02, help='peak Adam learning rate on the '
                   'input vectors (cosine decay to 1/100 of it); the embedding rows of a trained model have a std '
                   'of about 0.06')
    p.add_argument('--depths', type=listing(depth, items="integers or 'all'"), default='1,all',
                   help="depths: block counts, or 'all' for the model's n_layer")
    p.add_argument('--data_dir', help='windows from this prepared data dir (default: random tokens)')
    p.add_argument('--seed', type=random_seed, default=0)
    p.add_argument('--threads', type=count, default=2)
    p.add_argument('--quick', action='store_true', help='tiny models and 60 steps (the smoke test)')
    p.add_argument('--json', help='also write the results here')
    p.add_argument('--overwrite', action='store_true', help='replace an existing --json file')
    args = p.parse_args(argv)
    if not args.variants and not args.ckpt:
        p.error('nothing to measure: give --variants or --ckpt')
    p.check(distinct_files, args.ckpt, '--ckpt')
    if args.untrained and not args.ckpt:
        p.error("--untrained adds an untrained model of each --ckpt's config: give --ckpt")
    if args.data_dir is not None and not os.path.isdir(args.data_dir):
        p.error(f'--data_dir {args.data_dir!r} ' + ('is a file, not a folder' if os.path.isfile(args.data_dir) else
                'not found') + ': give a folder data/prepare.py wrote, or leave it out for random tokens')
    args.shape = SHAPES['quick' if args.quick else 'full']
    if args.steps is None:                      # --quick's preset only where --steps was not given
        args.steps = 60 if args.quick else 500
    if args.json is not None:
        p.check(check_writable, args.json, args.overwrite, '--json file')
    return args


def main(argv=None):
    """Command line entry point (argv: list of str; None: sys.argv): exits (SystemExit, as the in-process
    runner experiments/commands.py reads it) with 0, the table on stdout and --json written; 2, bad input
    (one line); 1, --json unwritable at the end (one line, the table printed) or stdout closed; 130,
    Ctrl-C (one line: cli.run_command; --json is written only at the end)."""
    sys.exit(run_command('represent.py', represent, argv))


def represent(argv):
    """main's work: parse_args(argv), measure, write --json."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    out = measure(args)
    if args.json:
        save_results(args.json, out, 'represent.py', indent=1)


def measure(args):
    """The measurement of every model asked, its table printed -> --json's content."""
    checkpoints = load_checkpoints(args)
    sizes = [(v, args.shape['n_ctx'], args.shape['n_layer']) for v in args.variants] + \
        [(path, m.cfg.n_ctx, m.cfg.n_layer) for path, m, _ in checkpoints]
    for name, n_ctx, n_layer in sizes:                  # before any work
        if args.T > n_ctx:
            fail(f'--T {args.T} is longer than {name}\'s n_ctx {n_ctx}')
        if any(d != 'all' and not 1 <= d <= n_layer for d in args.depths):
            fail(f'--depths {",".join(map(str, args.depths))}: {name} has {n_layer} blocks')
    rows, results, t0 = [], [], time.time()
    half = args.steps // 2
    positions = np.unique(np.linspace(0, args.T - 2, args.positions).round().astype(int)).tolist()
    for name, model, trained, path in models(args, checkpoints):
        idx = windows(args.data_dir, model.cfg.n_ctx, args.T, args.windows, model.cfg.vocab_size, args.seed)
        if int(idx.max()) >= model.cfg.vocab_size:
            fail(f'{args.data_dir} holds token ids beyond {name}\'s vocabulary')
        depths = list(dict.fromkeys(len(model.blocks) if d == 'all' else d for d in args.depths))
        if len(depths) < len(args.depths):
            print(f'{name}: --depths {",".join(map(str, args.depths))} name depth {len(model.blocks)} twice (its '
                  f'n_layer): measured once', file=sys.stderr, flush=True)
        for d in depths:
            res = {m: recover(model, idx, d, m, positions, args.steps, args.lr, args.seed, checkpoints=(half,))
                   for m in ('self', 'nonself')}
            results.append({'model': name, 'trained': trained, 'ckpt': path, 'depth': d, **res})
            rows.append([name, 'trained' if trained else 'untrained', d,
                         *(f'{res[m]["accuracy"]:.3f} ({res[m]["at"][half]:.3f})' for m in ('self', 'nonself')),
                         f'{res["self"]["chance"]:.3f} / {res["nonself"]["chance"]:.3f}'])
            print(f'{name}, depth {d}: self {res["self"]["accuracy"]:.3f}, non-self {res["nonself"]["accuracy"]:.3f}'
                  f' ({time.time() - t0:.0f} s so far)', file=sys.stderr, flush=True)
    source = f'windows of {args.data_dir}/val.bin' if args.data_dir else 'uniform random tokens'
    print(f'## Input representation accuracy\n\n_{args.windows} windows of {args.T} tokens ({source}), '
          f'{len(positions)} scored positions each, one unknown token at a time (the others given); Adam, lr '
          f'{args.lr:g} (cosine decay), {args.steps} steps on its input vector, mean squared distance to the '
          f'hidden states after '
          f'`depth` blocks at its own position (self) or at the later ones (non-self); decoded to the nearest '
          f'embedding row. Cell: accuracy at the end (at step {half}). Chance: the random start, decoded (self / '
          f'non-self)._\n')
    print(md_table(['model', 'weights', 'depth', 'self', 'non-self', 'chance'], rows))
    print(f'\ndone in {time.time() - t0:.0f} s', file=sys.stderr)
    return {'args': {k: v for k, v in vars(args).items()}, 'results': results}


if __name__ == '__main__':
    main()
