"""Look inside a checkpoint: the token mixing each layer learned, as a figure and a table.

    python -m experiments.look --ckpt out/tinystories_cpu/ckpt.pt            # writes out/tinystories_cpu/look.png
    python -m experiments.look --ckpt out/transformer_cpu/ckpt.pt --out look_tf.png --positions 32 --windows 64

The papers ask whether masked mixers learn "a fundamentally different structure than transformers"
(Badger 2024, arXiv 2409.01482, the hybrids; blog post "Masked Mixers II"); this draws, for each layer
(a row of the figure), the weights with which position i (down) reads position j (across), over the
first --positions positions:

  masked mixers (flat, expanded, multihead, kernel, posenc, linear_mixer): the effective matrix
      M = W * tril(1) (mixer.FlatMixing.matrix), one panel a head (and a tap of the kernel mixer); the
      expanded mixer's two, M1 (2 inner rows a position) and M2 (ExpandedMixing.matrix2), GELU between them;
  Toeplitz: the learned kernel w[k] against the lag k = i - j, one curve a head, and its matrix
      M[i, j] = w[i - j], a head each;
  recurrent: the share a^k its state keeps of a token k steps back, one curve a head, and the matrix the
      mixing reduces to, M[i, j] = v[i] a^(i-j) (column form) or v[j] a^(i-j) (row form), a head each;
  transformer, gpt, hybrid: the softmax attention weights (attention_weights) averaged over
      --windows validation windows read from the checkpoint's data folder (--data_dir), a head each, and
      the hybrid's masked mixing beside them; linear attention: its normalised analogue
      phi(q_i) . phi(k_j) / sum_{j' <= i} phi(q_i) . phi(k_j') (attention_weights).
  The weights are taken from the model's own modules, on its own forward pass (hooks), not recomputed.
An autoencoder's encoder and decoder layers are a row each. Every matrix is drawn on a diverging colour
scale centred at zero (red > 0, white 0, blue < 0), full colour at +-s, s (in the panel's title) the
99th percentile of |M| over its nonzero entries (the first rows, with few entries each, would
otherwise take the whole scale).

The table has one row a matrix: a layer's head (or tap, or M1 / M2), never a mean over heads. For a
matrix M over T positions (for M1 and M2, an inner row's position is r // 2):
  mean lag        = mean over rows i of  sum_j |M[i, j]| (i - j) / sum_j |M[i, j]|   (tokens back)
  diagonal share  = mean over rows i of  |M[i, i]| / sum_j |M[i, j]|
  lag fit         = 1 - sum_{j<=i} (M[i, j] - m[i - j])^2 / sum_{j<=i} (M[i, j] - mean)^2,  m[k] the mean
                    of the entries at lag k, mean that of all entries j <= i: the share of the
                    entries' variance that their lag alone explains (1: Toeplitz, a function of i - j)
rows with sum_j |M[i, j]| = 0 left out. A uniform causal average (the masked mixers' init: each row the
mean of the past) has mean lag (T - 1) / 4 and diagonal share (1/T) sum_i 1 / (i + 1); the table's last
line gives them for T. What each mixing class shows is written here, one function per view
(mixing_views, recurrent_matrix, attention_weights), dispatching on the mixing's class. Reads the
checkpoint alone (loading.load_checkpoint), and for attention val.bin and meta.json of the data
folder. A bad path, a file that is not a checkpoint, an old checkpoint format or bad data: one line,
exit 2.
"""

import argparse
import json
import math
import os
import re
import sys
import textwrap
from dataclasses import dataclass, field

if __name__ == '__main__':       # run as a file too (python experiments/look.py): the repository root on
    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the path, as -m puts it
    from harness import cli                   # and from here Ctrl-C is one line, torch's import included
    cli.begin('look.py', keep=True)

import numpy as np
import torch

from harness import checkpoint, loading
import attention
import mixer
from mixer import causal_mask
from data.tokens import token_dtype
from harness.cli import failing, run_command
from harness.flags import ArgumentParser, check_writable, number

fail = failing('look.py')            # 'PROG: error: msg' on stderr, exit 2


@dataclass(eq=False)
class Panel:
    """One panel of a layer's row, or a row of the table. A matrix: M float [R, C] (row r at position
    rows[r], column c at cols[c], long [R] and [C]); or curves: a list of (label, float [K]) against
    the lag 0..K-1, ylabel naming them."""
    name: str
    M: torch.Tensor = None
    rows: torch.Tensor = None
    cols: torch.Tensor = None
    curves: list = None
    ylabel: str = ''


@dataclass
class Layer:
    """A layer: its name ('layer 0', 'encoder 1'), the panels drawn, and the matrices of the table
    (Panel with M; the drawn matrices and, for Toeplitz, the effective matrices behind its curves)."""
    name: str
    panels: list = field(default_factory=list)
    table: list = field(default_factory=list)


def matrix_panel(name, M, rows=None, cols=None):
    """A Panel of the matrix M float [R, C]; rows, cols default to positions 0..R-1, 0..C-1."""
    M = M.detach().float().cpu()
    return Panel(name, M, torch.arange(M.shape[0]) if rows is None else rows,
                 torch.arange(M.shape[1]) if cols is None else cols)


def head_name(h, n_head):
    """'' for a single head, else 'head h'."""
    return f'head {h}' if n_head > 1 else ''


ATTENTION = (attention.Attention, attention.LinearAttention)      # the mixings whose weights read the input


def recurrent_matrix(mixing, T):
    """The matrix a mixer.RecurrentMixing reduces to over T positions: M[i, j] = v[i] a^(i-j) (column heads)
    or v[j] a^(i-j) (row heads) for j <= i, else 0 -> float32 [H, T, T]."""
    P, v = mixing.powers(T), mixing.v[:, :T].float()
    return torch.where(mixing.column, v[:, :, None] * P, P * v[:, None, :])


def mixing_views(mixing, T):
    """What is drawn of a masked token mixing (a mixer.HeadMixing) over T positions, by its class ->
    {name: a matrix float [H, R, C] (row r at position r // (R / T)), or a curve float [H, T] against the
    lag k = i - j}. Raises TypeError for a class it has no view of."""
    if isinstance(mixing, mixer.FlatMixing):
        return {'M': mixing.matrix(T)}
    if isinstance(mixing, mixer.KernelMixing):
        return {f'tap {u}': M for u, M in enumerate(mixing.matrix(T).unbind(1))}
    if isinstance(mixing, mixer.ExpandedMixing):
        return {'M1': mixing.matrix(T), 'M2': mixing.matrix2(T)}
    if isinstance(mixing, mixer.ToeplitzMixing):
        return {'w[k] against the lag': mixing.w[:, :T], 'M': mixing.matrix(T)}
    if isinstance(mixing, mixer.RecurrentMixing):
        return {'a^k (state)': mixing.powers(T)[:, :, 0], 'M': recurrent_matrix(mixing, T)}
    raise TypeError(f'look.py has no view of {type(mixing).__name__}')


def attention_weights(module, x):
    """The weights with which an attention module (ATTENTION) mixes its values, for its input x float
    [B, T, d] at positions 0..T-1 -> float [B, H, T, T], zero above the diagonal, rows summing to 1
    (y_i = sum_j A[i, j] v_j before proj_out). Softmax attention: softmax(q k^T / sqrt(e)) under the
    causal mask. Linear attention: A[i, j] = phi(q_i) . phi(k_j) / (sum_{j' <= i} phi(q_i) . phi(k_j') +
    eps), rows summing to 1 up to eps; O(T^2), for looking only."""
    if isinstance(module, attention.Attention):
        q, k, _ = module.project(x, slice(0, x.shape[1]))
        return module.softmax(q, k, causal_mask(x.shape[1], device=x.device))
    q, k, _ = module.features(x)
    A = module.causal_scores(q, k)
    return A / (A.sum(-1, keepdim=True) + module.eps)


def mixing_panels(mixing, T):
    """A masked token mixing's view over T positions (mixing_views) -> (the panels drawn, the matrices of
    the table): its curves against the lag ([H, T]: a Toeplitz w[k], a recurrent a^k), then
    its matrices ([H, R, C]: M = W * tril, a kernel mixer's taps, an expanded mixer's M1 over its inner
    rows and M2, the Toeplitz and recurrent matrices), a panel a head."""
    H, mats, views = mixing.n_head, [], mixing_views(mixing, T)
    curves = [Panel(name, curves=[(f'head {h}', c[h].detach().float()) for h in range(H)], ylabel=name)
              for name, c in views.items() if c.dim() == 2]
    matrices = {name: M for name, M in views.items() if M.dim() == 3}
    for h in range(H):
        for name, M in matrices.items():
            rows, cols = (torch.arange(n) // (n // T) for n in M.shape[1:])   # inner row r: r // expansion
            mats.append(matrix_panel(' '.join(filter(None, [head_name(h, H), name])), M[h], rows, cols))
    return curves + mats, mats


def attention_panels(module, mean):
    """Panels of attention weights averaged over windows, mean float [H, T, T], a head each, named by the
    module's class ('attention', 'linear attention')."""
    kind = re.sub(r'(?<=[a-z])(?=[A-Z])', ' ', type(module).__name__).lower()
    return [matrix_panel(f'{kind} {head_name(h, len(mean)) or ""}'.strip(), mean[h]) for h in range(len(mean))]


def stacks(model):
    """(label, blocks) of each stack: ('layer', blocks) of a LanguageModel, the encoder and decoder of an
    Autoencoder."""
    if isinstance(model, mixer.Autoencoder):
        return [('encoder', model.encoder), ('decoder', model.decoder)]
    return [('layer', model.blocks)]


def needs_data(model):
    """True when a layer's mixing depends on the input (attention, whose weights read it): it needs text."""
    return any(isinstance(m, ATTENTION) for m in model.modules())


@torch.no_grad()
def mean_attention(model, idx):
    """Every attention module's weights on the model's own forward pass over idx long [B, T], averaged
    over the B windows -> {module: float [H, T, T]}. A forward pre-hook reads each module's input."""
    sums, hooks = {}, []

    def hook(module, args):
        sums[module] = sums.get(module, 0) + attention_weights(module, args[0]).float().sum(0)
    for m in model.modules():
        if isinstance(m, ATTENTION):
            hooks.append(m.register_forward_pre_hook(hook))
    try:
        model(idx)
    finally:
        for h in hooks:
            h.remove()
    return {m: s / idx.shape[0] for m, s in sums.items()}


def collect(model, T, idx=None):
    """The layers' panels over the first T positions -> list of Layer. idx long [B, T]: the windows
    attention is averaged over (needed when needs_data(model)). A layer shows each part of its mixing
    that is attention (ATTENTION) or a masked mixing (mixer.HeadMixing): a hybrid's both, its mixing's
    panels named 'mixing ...'."""
    att = mean_attention(model, idx) if needs_data(model) else {}
    layers = []
    for label, blocks in stacks(model):
        for i, block in enumerate(blocks):
            layer = Layer(f'{label} {i}')
            for m in block.mixing.modules():
                if m in att:
                    drawn = table = attention_panels(m, att[m])
                elif isinstance(m, mixer.HeadMixing):
                    drawn, table = mixing_panels(m, T)
                    for p in {id(p): p for p in drawn + table}.values():
                        p.name = p.name if m is block.mixing else f'mixing {p.name}'
                else:
                    continue
                layer.panels, layer.table = layer.panels + drawn, layer.table + table
            layers.append(layer)
    return layers


def lag_stats(M, rows, cols):
    """Mean lag (tokens) and diagonal share of the matrix M float [R, C] whose row r sits at position
    rows[r] and column c at cols[c] (the module docstring defines both) -> (float, float); NaN when
    every row is zero."""
    A = M.abs().double()
    lag = (rows[:, None] - cols[None, :]).double()
    total = A.sum(1)
    keep = total > 0
    if not keep.any():
        return math.nan, math.nan
    mean_lag = ((A * lag).sum(1)[keep] / total[keep]).mean().item()
    diagonal = ((A * (lag == 0)).sum(1)[keep] / total[keep]).mean().item()
    return mean_lag, diagonal


def lag_fit(M, rows, cols):
    """The share of the variance of M's entries at lags >= 0 (M float [R, C], rows and cols their
    positions, as in lag_stats) that their lag alone explains (the module docstring defines it) ->
    float, 1 for a Toeplitz matrix; NaN when the entries do not vary."""
    lag = rows[:, None] - cols[None, :]
    keep = causal_mask(int(max(rows.max(), cols.max())) + 1, rows)[:, cols]          # j <= i
    x, k = M.double()[keep], lag[keep]
    m = torch.zeros(int(k.max()) + 1, dtype=torch.double).index_add_(0, k, x) / torch.bincount(k).clamp(min=1)
    total = ((x - x.mean()) ** 2).sum()
    return 1 - (((x - m[k]) ** 2).sum() / total).item() if total > 0 else math.nan


def uniform_reference(T):
    """Mean lag and diagonal share of the uniform causal average over T positions (M[i, j] = 1/(i+1))."""
    return (T - 1) / 4, sum(1 / (i + 1) for i in range(T)) / T


def table_lines(layers, T):
    """The summary table: a header, one line a matrix of each layer's table (mean lag, diagonal share,
    lag fit), the reference line."""
    lines = [f'{"layer":<11} {"matrix":<26} {"mean lag":>9} {"diagonal share":>15} {"lag fit":>8}']
    for layer in layers:
        for p in layer.table:
            lag, diag = lag_stats(p.M, p.rows, p.cols)
            lines.append(f'{layer.name:<11} {p.name:<26} {lag:9.2f} {diag:15.3f} {lag_fit(p.M, p.rows, p.cols):8.3f}')
    lag, diag = uniform_reference(T)
    lines.append(f'(a uniform causal average over {T} positions: mean lag {lag:.2f}, diagonal share {diag:.3f})')
    return lines


def colour_scale(M):
    """Half-width of the panel's colour scale: the 99th percentile of |M| over its nonzero entries."""
    a = M.abs().flatten()
    a = a[a > 0]
    return max(torch.quantile(a, 0.99).item(), 1e-12) if len(a) else 1.0


def draw(layers, title, path, T):
    """The figure: a row a layer, a panel a matrix (imshow, RdBu_r from -s to +s, s the panel's
    colour_scale, in its title) or a set of curves against the lag; written
    whole (experiments.runner.save_figure) -> 'plot: path'. Raises ImportError without matplotlib."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from experiments.runner import save_figure
    ncols = max(len(layer.panels) for layer in layers)
    fig, axes = plt.subplots(len(layers), ncols, figsize=(2.3 * ncols + 0.8, 2.3 * len(layers) + 0.5), squeeze=False)
    image = None
    for r, (row, layer) in enumerate(zip(axes, layers)):
        first = next((c for c, p in enumerate(layer.panels) if p.curves is None), None)   # the row's first matrix
        for c, ax in enumerate(row):
            if c >= len(layer.panels):
                ax.axis('off')
                continue
            p, name = layer.panels[c], f'{layer.name}: {layer.panels[c].name}'.rstrip(': ')
            if p.curves is not None:
                for label, y in p.curves:
                    ax.plot(np.arange(len(y)), y.numpy(), label=label, lw=1)
                ax.axhline(0, color='grey', lw=0.5)
                ax.set_xticks([0, T - 1])       # few ticks and labels: text is most of the drawing time
                ax.set_xlabel('lag k = i - j', fontsize=7, labelpad=-6)
                ax.set_ylabel(p.ylabel, fontsize=7)
                ax.legend(fontsize=5)
            else:
                s = colour_scale(p.M)
                image = ax.imshow(p.M.numpy(), cmap='RdBu_r', vmin=-s, vmax=s, interpolation='nearest', aspect='auto')
                ax.set_xticks([])               # no ticks; the axes named once a column and a row
                ax.set_yticks([])
                if r == len(layers) - 1:
                    ax.set_xlabel(f'j = 0 .. {T - 1} (read)', fontsize=7)
                if c == first:
                    ax.set_ylabel(f'i = 0 .. {T - 1} (position)', fontsize=7)
                name += f' (±{s:.2g})'
            ax.tick_params(labelsize=6, length=2)
            ax.set_title(name, fontsize=7)
    key = 'matrices: red > 0, white 0, blue < 0, full colour at ±s (in each title)' if image is not None else ''
    width = int(13 * fig.get_figwidth())                  # characters a line at 8 points
    fig.suptitle('\n'.join(textwrap.wrap(title, width) + textwrap.wrap(key, width)), fontsize=8)
    return save_figure(fig, path)


def read_windows(data_dir, ckpt, vocab_size, T, n):
    """n evenly spaced windows of T tokens of data_dir/val.bin -> long [n, T]. The folder's meta.json
    must name the checkpoint's tokenizer (its SHA-256); ids must be below vocab_size. Else one line, exit 2."""
    meta_path, val_path = os.path.join(data_dir, 'meta.json'), os.path.join(data_dir, 'val.bin')
    for p in (meta_path, val_path):
        if not os.path.isfile(p):
            fail(f'{p} not found: attention maps need validation text (run data/prepare.py, or set --data_dir)')
    try:
        with open(meta_path) as f:
            sha = json.load(f)['tokenizer_sha256']
    except (OSError, ValueError, KeyError, TypeError) as e:
        fail(f'{meta_path} is damaged ({type(e).__name__}: {e}); run data/prepare.py again')
    if sha != ckpt['tokenizer']['sha256']:
        fail(f'the data in {data_dir} was encoded with another tokenizer than the checkpoint\'s: '
             'its token ids mean other text (set --data_dir to the folder the model was trained on)')
    size, dtype = os.path.getsize(val_path), token_dtype(data_dir)
    if size % dtype.itemsize or size // dtype.itemsize < T + 1:
        fail(f'{val_path} holds {size} bytes: not a token file of at least {T + 1} {dtype} ids')
    data = np.memmap(val_path, dtype=dtype, mode='r')
    starts = torch.linspace(0, len(data) - T - 1, n).long().tolist()
    idx = torch.from_numpy(np.stack([data[s:s + T].astype(np.int64) for s in starts]))
    if int(idx.max()) >= vocab_size:
        fail(f'{val_path} holds token id {int(idx.max())}, but the model has {vocab_size} tokens')
    return idx


def main(argv=None):
    """Command line entry point (argv: list of str; None: sys.argv): exits (SystemExit) with 0, the table
    printed and the figure written; 2, bad input (one line); 1, the figure could not be written
    (matplotlib missing, a failed write: one line, the table printed) or stdout closed; 130, Ctrl-C (one
    line: cli.run_command; a figure is written whole or not at all)."""
    sys.exit(run_command('look.py', look, argv))


def look(argv):
    """main's work: load --ckpt, collect its layers' mixing, print the table and write the figure."""
    p = ArgumentParser('look.py', __doc__, formatter_class=argparse.RawDescriptionHelpFormatter)   # errors: one line
    p.description = __doc__                                 # --help: the whole docstring, as written
    p.add_argument('--ckpt', required=True, help='a checkpoint written by train.py (any kind)')
    p.add_argument('--out', default=None, help='the figure (PNG); default look.png beside the checkpoint')
    p.add_argument('--positions', type=number(int, 1), default=64, help='the first T positions drawn (at most n_ctx)')
    p.add_argument('--windows', type=number(int, 1), default=32, help='validation windows attention is averaged over')
    p.add_argument('--data_dir', default=None, help="the data folder (default: the checkpoint's data_dir)")
    p.add_argument('--overwrite', action='store_true', help='replace an existing figure at --out')
    p.add_argument('--no_figure', action='store_true', help='print the table only')
    args = p.parse_args(argv)
    if args.data_dir is not None and not os.path.isdir(args.data_dir):
        fail(f'--data_dir {args.data_dir!r} ' + ('is a file, not a folder' if os.path.isfile(args.data_dir) else
             'not found') + ': give the data folder the model was trained on')
    try:
        model, _, ckpt = loading.load_checkpoint(args.ckpt)
    except checkpoint.CheckpointError as e:
        fail(str(e))
    beside = os.path.join(os.path.dirname(os.path.abspath(args.ckpt)), 'look.png')
    out = beside if args.out is None else args.out
    if args.no_figure and args.out is not None:
        fail('--out names a figure and --no_figure asks for none: pass one of them')
    if not args.no_figure:
        try:
            check_writable(out, overwrite=args.overwrite, what='figure')
        except ValueError as e:
            fail(str(e))
        if not out.lower().endswith('.png'):
            fail(f'the figure is a PNG: give --out a path ending in .png, got {out!r}')
    cfg, config = model.cfg, ckpt.get('config', {})
    T = min(args.positions, cfg.n_ctx)
    variant = config.get('variant', cfg.kind)
    print(f'look.py: {args.ckpt}: {variant} ({cfg.kind}, token mixing {cfg.token_mixing}, task {cfg.task}), '
          f'{cfg.n_layer} layers, step {ckpt.get("step", "?")}; the first {T} positions'
          + (f' (n_ctx = {cfg.n_ctx})' if T < args.positions else ''), flush=True)
    idx = None
    if needs_data(model):
        data_dir = args.data_dir or config.get('data_dir')
        if not data_dir:
            fail('the checkpoint names no data folder; pass --data_dir')
        idx = read_windows(data_dir, ckpt, cfg.vocab_size, T, args.windows)
        print(f'attention averaged over {args.windows} windows of {T} tokens of {os.path.join(data_dir, "val.bin")}',
              flush=True)
    layers = collect(model, T, idx)
    print('\n'.join(table_lines(layers, T)), flush=True)
    if args.no_figure:
        return
    print(f'drawing {sum(len(layer.panels) for layer in layers)} panels (a few seconds) ...', flush=True)
    try:
        written = draw(layers, f'{variant} ({cfg.kind}), step {ckpt.get("step", "?")}: token mixing, the first {T} '
                       'positions (row i reads column j)', out, T)
    except ImportError:
        print('look.py: matplotlib is not installed: no figure written (pip install matplotlib, or pass '
              '--no_figure); the table above is the summary', file=sys.stderr)
        return 1
    if not written.startswith('plot: '):           # save_figure's 'plot not written: PATH (why)'
        print(f'look.py: error: {written}; the table above is the summary', file=sys.stderr)
        return 1
    print(written)


if __name__ == '__main__':
    main()
