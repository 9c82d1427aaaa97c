"""retrieval.py's embeddings: texts as vectors of a frozen language model (Badger 2024, "Masked Mixers for
Language Generation and Retrieval"), the last token's hidden vector or the mean of all of them, batched, and
cached by what they depend on (retrieval.py's docstring says how).

    q, t, desc = checkpoint_embeddings(path, pairs, pairs_key, args, pool='last')   # float [P, d] each
    emb = embed_tokens(model, seqs, layer=None, pool='mean')                        # float [len(seqs), d]
"""

import sys

if __name__ == '__main__':       # not a command: said before any import
    print("embeddings.py: error: retrieval.py's text embeddings, not a command: python retrieval.py --help",
          file=sys.stderr)
    sys.exit(2)

import hashlib
import io
import json
import os
import time
from dataclasses import asdict

import torch

import mixer
from data.pairs import UsageError, encode_pairs
from data.tokenizer import file_sha256
from harness.loading import load_checkpoint
from harness.cli import write_atomic

CACHE_VERSION = 1                # a cache file's key holds it: a change of what is cached makes new keys


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
            print(f'\r{label}: {done}/{total}', end='\n' if done == total else '', file=sys.stderr,
                  flush=True)
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
    saved = path if os.path.isfile(path) else os.path.join(path, 'model.safetensors')     # or an export
    weights = {'untrained': json.dumps(asdict(cfg), sort_keys=True), 'seed': seed} if untrained \
        else file_sha256(saved)
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
            print(f'retrieval.py: warning: {cache}: unreadable ({type(e).__name__}); computing the '
                  'embeddings again', file=sys.stderr)
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
        print(f'retrieval.py: warning: could not write the embedding cache {path} ({type(e).__name__}: '
              f'{str(e).splitlines()[0] if str(e) else ""}); going on without it', file=sys.stderr)
