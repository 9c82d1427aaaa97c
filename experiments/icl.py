"""In-context regression: linear transformers as in-context learners, and masked mixers.

    python -m experiments.icl                  # the paper's Table 1 on 2 CPU cores (47 min measured; budget: README)
    python -m experiments.icl --quick          # every row and plot at a tiny budget (about 3 minutes measured)
    python -m experiments.icl --layers 1,2,3,4,5,6,7 --params diag --noise 0,3   # any grid of models
    python -m experiments.icl --mixers         # the same prompts through mixer.py's sequence models

Reproduces Vladymyrov, von Oswald, Sandler, Ge, "Linear Transformers are Versatile
In-Context Learners" (NeurIPS 2024, arXiv 2402.14180): a stack of linear
self-attention (LSA) layers reads a prompt of n = 20 noisy linear-regression pairs
(x_i, y_i), x_i in R^10, and predicts the query's noise-free target. Trained on
prompts whose noise level sigma varies, it discovers in its forward pass an optimiser
that rivals tuned ridge regression. The token format and the one-step
gradient-descent construction are von Oswald et al. 2023 ("Transformers learn
in-context by gradient descent").

The file keeps the pieces of an in-context-learning harness apart (Garg et al. 2022):
  the task        sample_prompts(): w ~ N(0, I), x ~ N(0, I), y = <w, x> + sigma eps
  the models      LinearSelfAttention (FULL, DIAG, GD++) and SequenceRegressor (any
                  mixer.py kind on the same tokens)
  the baselines   ridge regressions with the same call signature (model(prompts) ->
                  y_hat): ORACLE (true sigma), CONSTRR, ADARR, TUNEDRR
  the experiment  training jobs run and cached by runner.Runner; evaluation on fixed
                  prompt sets shared by every model; the table against the paper's;
                  the paper's claims as verdicts; plots; Theorem 4.1 read off the models.

Metric: the adjusted evaluation loss, mean over prompts of 0.5 (y_hat - y_t)^2 minus
the same for the oracle (ridge with the prompt's true sigma), on the same prompts.
Everything linear-transformer (training, evaluation, baselines) runs in float64: the
paper's 7-layer cells at sigma = 0 are about 1e-12, below float32's resolution.
"""

import argparse
import copy
import math
import os
import sys
import time
import zlib

import torch
import torch.nn as nn

import mixer
from experiments.runner import Runner, fmt_s, md_table, say

D_X, N_CTX = 10, 20                  # the paper's d and n
NOISE_NAMES = ('0', '1', '2', '3', '4', '5', '6', '7', 'c13', 'c135')
PARAMS = ('full', 'diag', 'gdpp')
PARAM_NAMES = {'full': 'FULL', 'diag': 'DIAG', 'gdpp': 'GD++'}

# Table 1 of the paper (adjusted evaluation loss, columns NOISE_NAMES). 1-layer models
# of every parameterisation share one row there.
PAPER = {
    (1, 'all'): (1.77, 1.64, 1.40, 1.18, 1.02, .907, .841, .806, 1.01, .819),
    (2, 'gdpp'): (.341, .295, .243, .265, .347, .366, .440, .530, .305, .427),
    (2, 'diag'): (.265, .214, .173, .188, .219, .242, .254, .259, .201, .246),
    (4, 'diag'): (1.2e-4, .006, .024, .041, .050, .059, .065, .073, .043, .062),
    (4, 'full'): (1.6e-4, .005, .021, .038, .052, .065, .068, .076, .032, .061),
    (7, 'gdpp'): (2.7e-12, .009, .066, .161, .265, .344, .454, .530, .222, .422),
    (7, 'diag'): (2.5e-12, .002, .014, .027, .040, .047, .052, .059, .018, .046),
    (7, 'full'): (2.5e-12, .002, .010, .025, .035, .047, .050, .057, .010, .035),
    'CONSTRR': (0, .009, .066, .161, .265, .365, .454, .530, .222, .422),
    'ADARR': (0, .003, .016, .034, .053, .068, .081, .092, .051, .084),
    'TUNEDRR': (0, .002, .010, .023, .037, .049, .060, .068, .021, .054),
}
PAPER_MODELS = [(1, 'full'), (1, 'diag'), (1, 'gdpp'), (2, 'gdpp'), (2, 'diag'), (4, 'diag'), (4, 'full'),
                (7, 'gdpp'), (7, 'diag'), (7, 'full')]
SIGMA_GRID = [0.5 * i for i in range(17)]        # Figure 2: fixed sigma 0 .. 8, past every training range

# Budgets, chosen by measurement (README "In-context regression"): the default run, and --quick.
SETTINGS = {
    'full': dict(iters=3000, batch_size=256, lr=1e-2, seeds=1, eval_prompts=100000, sweep_prompts=4000,
                 mixer_iters=600, mixer_batch=64, mixer_d_model=32, mixer_lrs=(1e-3, 3e-3)),
    'quick': dict(iters=60, batch_size=128, lr=5e-3, seeds=1, eval_prompts=2000, sweep_prompts=500,
                  mixer_iters=20, mixer_batch=32, mixer_d_model=16, mixer_lrs=(1e-3,)),
}
MIXER_VARIANTS = ('transformer', 'flat', 'toeplitz', 'recurrent', 'linear_attention')
MIXER_LAYERS = (2, 4)
MIXER_NOISE = ('0', '5')


def fail(msg):
    """Print a one-line error and exit with status 2."""
    print(f'icl.py: error: {msg}', file=sys.stderr)
    sys.exit(2)


# ----------------------------------------------------------------------------- the task

class Prompts:
    """A batch of regression prompts (Vladymyrov et al. 2024, Sec. 5; float64 unless cast).

    x [B, n, d] and y [B, n]: the context pairs, y_i = <w, x_i> + sigma eps_i;
    x_q [B, d] and y_q [B]: the query and its noise-free target <w, x_q>;
    sigma [B]: each prompt's noise standard deviation; w [B, d]: its true weights."""

    def __init__(self, x, y, x_q, y_q, sigma, w):
        self.x, self.y, self.x_q, self.y_q, self.sigma, self.w = x, y, x_q, y_q, sigma, w

    def __len__(self):
        return len(self.y_q)

    def tokens(self):
        """Context tokens e_i = (x_i, y_i) [B, n, d + 1] and query token (x_q, 0) [B, 1, d + 1]."""
        query = torch.cat([self.x_q, torch.zeros_like(self.x_q[:, :1])], 1)[:, None]
        return torch.cat([self.x, self.y[..., None]], -1), query


def check_noise(name):
    """A noise setting: '0'..'9' = sigma ~ U(0, that), 'cABC' = sigma uniform over the
    digits {A, B, C}, or a number with '=' in front (e.g. '=2.5': sigma fixed).
    Raises ValueError for anything else."""
    try:
        if name.startswith('='):
            return float(name[1:]) >= 0
        if name.startswith('c') and len(name) > 1:
            return all(c.isdigit() for c in name[1:])
        return float(name) >= 0
    except ValueError:
        pass
    raise ValueError(f'bad noise setting {name!r}: use 0..7 (sigma ~ U(0, that)), c13, c135 (a set), or =2.5 (fixed)')


def sample_sigma(noise, batch, gen, dtype=torch.float64):
    """Per-prompt noise standard deviations [batch] for a setting of check_noise()."""
    check_noise(noise)
    if noise.startswith('='):
        return torch.full((batch,), float(noise[1:]), dtype=dtype)
    if noise.startswith('c'):
        choices = torch.tensor([float(c) for c in noise[1:]], dtype=dtype)
        return choices[torch.randint(len(choices), (batch,), generator=gen)]
    return float(noise) * torch.rand(batch, generator=gen, dtype=dtype)


def y_scale(noise, d=D_X):
    """Standard deviation of y_i under a noise setting: sqrt(d + E[sigma^2])."""
    check_noise(noise)
    if noise.startswith('='):
        var = float(noise[1:]) ** 2
    elif noise.startswith('c'):
        var = sum(float(c) ** 2 for c in noise[1:]) / len(noise[1:])
    else:
        var = float(noise) ** 2 / 3
    return math.sqrt(d + var)


def sample_prompts(batch, noise, gen, d=D_X, n=N_CTX, dtype=torch.float64):
    """Draw `batch` prompts of noise setting `noise` from torch.Generator gen -> Prompts."""
    sigma = sample_sigma(noise, batch, gen, dtype)
    w = torch.randn(batch, d, generator=gen, dtype=dtype)
    x = torch.randn(batch, n + 1, d, generator=gen, dtype=dtype)
    y = torch.einsum('bnd,bd->bn', x, w)
    noisy = y[:, :n] + sigma[:, None] * torch.randn(batch, n, generator=gen, dtype=dtype)
    return Prompts(x[:, :n], noisy, x[:, n], y[:, n], sigma, w)


def fixed_prompts(noise, count, purpose):
    """The fixed prompt set of (noise, purpose) ('eval', 'sweep' for baseline tuning and
    seed / learning-rate choice): the same prompts in every process and every run."""
    gen = torch.Generator().manual_seed(zlib.crc32(f'{purpose}:{noise}:{count}'.encode()))
    return sample_prompts(count, noise, gen)


# ----------------------------------------------------------------------------- linear self-attention

class LinearSelfAttention(nn.Module):
    """A stack of single-head linear self-attention layers (Vladymyrov et al. 2024, Eq. 1):

        e_i <- e_i + P (sum_{j <= n} e_j e_j^T) Q e_i     for every token i, query included,

    where the sum runs over the n context tokens only (the query is never a key or
    value); no softmax, norm, MLP or 1/n. Prediction y_hat = -(last coordinate of the
    query after the last layer). param: 'full' (P, Q free (d+1) x (d+1) matrices),
    'diag' (P = diag(p_x I_d, p_y), Q = diag(q_x I_d, q_y): 4 scalars a layer) or
    'gdpp' (DIAG with q_y = 0: GD++, von Oswald et al. 2023). float64 parameters.

    y_scale c: the trained parameters are those of the same model on tokens (x, y / c),
    an exact reparameterisation (P = D^-1 P' D, Q = D Q' D with D = diag(1, .., 1, 1/c))
    that gives Adam's equal-sized steps equal effect on every entry when c is the
    standard deviation of y (y_scale()); without it the entries that multiply y^2 leave
    their stable range within a few steps at sigma_max = 7. matrices(), omegas() and
    run() are in the paper's coordinates. Raises ValueError for an unknown param or
    n_layer < 1."""

    def __init__(self, n_layer, param='full', d=D_X, init_std=1e-2, y_scale=1.0):
        super().__init__()
        if param not in PARAMS or n_layer < 1:
            raise ValueError(f'LinearSelfAttention: param must be one of {PARAMS} and n_layer >= 1')
        self.param, self.d = param, d
        D = d + 1
        g = torch.ones(D, dtype=torch.float64)
        g[-1] = 1 / y_scale
        self.register_buffer('P_gain', g[None, :] / g[:, None])      # P = P_gain * P'
        self.register_buffer('Q_gain', g[:, None] * g[None, :])      # Q = Q_gain * Q'
        if param == 'full':
            self.P = nn.Parameter(init_std * torch.randn(n_layer, D, D, dtype=torch.float64))
            self.Q = nn.Parameter(init_std * torch.randn(n_layer, D, D, dtype=torch.float64))
        else:   # columns (x, y) of the diagonal
            self.p = nn.Parameter(init_std * torch.randn(n_layer, 2, dtype=torch.float64))
            self.q = nn.Parameter(init_std * torch.randn(n_layer, 2, dtype=torch.float64))
            self.register_buffer('q_mask', torch.tensor([1.0, 0.0 if param == 'gdpp' else 1.0], dtype=torch.float64))

    def diagonals(self):
        """DIAG / GD++: the diagonals of P and Q, each float64 [L, d + 1]."""
        q = self.q * self.q_mask
        return (torch.cat([self.p[:, :1].expand(-1, self.d), self.p[:, 1:]], 1),
                torch.cat([q[:, :1].expand(-1, self.d), q[:, 1:]], 1) * self.Q_gain.diagonal())

    def matrices(self):
        """P, Q: float64 [L, d + 1, d + 1] (DIAG and GD++ as diagonal matrices)."""
        if self.param == 'full':
            return self.P * self.P_gain, self.Q * self.Q_gain
        return tuple(torch.diag_embed(v) for v in self.diagonals())

    def omegas(self):
        """DIAG / GD++ per layer: omega_xx = p_x q_x, omega_xy = p_x q_y, omega_yx = p_y q_x,
        omega_yy = p_y q_y (the paper's Eq. 6), float64 [L, 4]."""
        p, q = self.diagonals()
        p, q = p[:, -2:], q[:, -2:]                    # (x, y) entries
        return torch.stack([p[:, 0] * q[:, 0], p[:, 0] * q[:, 1], p[:, 1] * q[:, 0], p[:, 1] * q[:, 1]], 1)

    def run(self, context, queries):
        """context float [B, n, d + 1], queries float [B, m, d + 1] -> the list of
        (context, queries) after 0, 1, .., L layers. Every query is transformed like the
        paper's single query; no query ever changes a context token."""
        states = [(context, queries)]
        if self.param != 'full':
            pv, qv = self.diagonals()
        else:
            P, Q = self.matrices()
        for l in range(len(self.P if self.param == 'full' else self.p)):
            S = context.mT @ context                                    # [B, D, D]: sum_j e_j e_j^T
            A = P[l] @ S @ Q[l] if self.param == 'full' else pv[l, :, None] * S * qv[l]   # P S Q
            context, queries = context + context @ A.mT, queries + queries @ A.mT
            states.append((context, queries))
        return states

    def forward(self, prompts):
        """Prompts -> y_hat float64 [B]."""
        context, query = prompts.tokens()
        return -self.run(context, query)[-1][1][:, 0, -1]


def implicit_weights(model, prompts):
    """The per-layer implicit linear model of Theorem 4.1 (Vladymyrov et al. 2024): after
    layer l, for this prompt, every token is mapped by one matrix T^l, so that
    y_i^l = a^l y_i - <w^l, x_i> for every context token and the query's last
    coordinate is -<w^l, x_q>. Read by passing the d + 1 unit vectors as extra queries.
    -> list over l = 1..L of (w^l float [B, d], a^l float [B], T^l float [B, d+1, d+1])."""
    context, _ = prompts.tokens()
    D = context.shape[-1]
    probes = torch.eye(D, dtype=context.dtype).expand(len(prompts), D, D)
    out = []
    for _, q in model.run(context, probes)[1:]:
        T = q.mT                                     # column k = image of unit vector k
        out.append((-T[:, -1, :-1], T[:, -1, -1], T))
    return out


# ----------------------------------------------------------------------------- baselines

def ridge(prompts, lam):
    """Ridge regression on the context: w = (Sigma + lam I)^-1 alpha, Sigma = sum x_i x_i^T,
    alpha = sum y_i x_i; lam float [B] or a number -> y_hat = <w, x_q> float [B]."""
    X, y = prompts.x, prompts.y
    lam = torch.as_tensor(lam, dtype=X.dtype).expand(len(prompts))
    Sigma = X.mT @ X + lam[:, None, None] * torch.eye(X.shape[-1], dtype=X.dtype)
    w = torch.linalg.solve(Sigma, (X.mT @ y[..., None]))[..., 0]
    return (w * prompts.x_q).sum(-1)


def ridge_grid(prompts, lams):
    """y_hat of ridge at every lam of lams float [K, B] (or [K, 1]) at once (one
    eigendecomposition of Sigma per prompt) -> float [K, B]."""
    s, V = torch.linalg.eigh(prompts.x.mT @ prompts.x)                       # [B, d], [B, d, d]
    a = (V.mT @ (prompts.x.mT @ prompts.y[..., None]))[..., 0]             # V^T alpha
    xq = (V.mT @ prompts.x_q[..., None])[..., 0]
    return (a * xq / (s + lams[..., None])).sum(-1)


def noise_estimate(prompts):
    """ADARR's noise variance estimate: the OLS residual sum of squares / (n - d), float [B]."""
    X, y = prompts.x, prompts.y
    w = torch.linalg.lstsq(X, y[..., None]).solution[..., 0]
    return ((y - (X * w[:, None]).sum(-1)) ** 2).sum(-1) / (X.shape[1] - X.shape[2])


def oracle(prompts):
    """Ridge with each prompt's true noise variance (the Bayes-optimal predictor for w ~ N(0, I))."""
    return ridge(prompts, prompts.sigma ** 2)


def adarr(prompts):
    """ADARR: ridge with lam = the OLS noise variance estimate."""
    return ridge(prompts, noise_estimate(prompts))


CONST_GRID = torch.cat([torch.zeros(1), torch.logspace(-3, 3, 61)]).double()
TUNED_MULT = torch.logspace(-1, 1, 41).double()
TUNED_CAP = torch.cat([torch.logspace(-1, 3, 41), torch.tensor([math.inf])]).double()


def half_sq(y_hat, y):
    """Per-prompt loss 0.5 (y_hat - y)^2 (the paper's scale)."""
    return 0.5 * (y_hat - y) ** 2


def tune_baselines(prompts):
    """CONSTRR's lam and TUNEDRR's (multiplier c, cap) minimising the mean loss on
    `prompts` by grid search -> dict of the two fitted baselines, each a function
    Prompts -> y_hat (TUNEDRR: lam = min(c * ADARR's estimate, cap))."""
    const = ridge_grid(prompts, CONST_GRID[:, None])
    lam = CONST_GRID[half_sq(const, prompts.y_q).mean(1).argmin()].item()
    est = noise_estimate(prompts)
    cands = [(c, cap) for c in TUNED_MULT.tolist() for cap in TUNED_CAP.tolist()]
    lams = torch.stack([torch.clamp(c * est, max=cap) for c, cap in cands])
    c, cap = cands[half_sq(ridge_grid(prompts, lams), prompts.y_q).mean(1).argmin()]

    def constrr(p):
        return ridge(p, lam)

    def tunedrr(p):
        return ridge(p, torch.clamp(c * noise_estimate(p), max=cap))
    constrr.desc, tunedrr.desc = f'lam={lam:.3g}', f'c={c:.3g}, cap={cap:.3g}'
    return {'CONSTRR': constrr, 'TUNEDRR': tunedrr}


# ----------------------------------------------------------------------------- masked mixers and friends

class SequenceRegressor(nn.Module):
    """The prompt through one of mixer.py's sequence models (Badger 2024's masked mixers,
    the transformer, linear attention): tokens (x_i, y_i) and the query (x_q, 0), in
    that order, are projected from d + 1 to d_model, pass n_layer of mixer.py's Block
    (its token mixing, MLP and norms, unchanged), and y_hat is read by a Linear at the
    query (last) position. n_ctx = n + 1. float32 parameters; Prompts -> y_hat float [B].
    Raises ValueError for an unknown variant."""

    def __init__(self, variant, n_layer, d_model, d=D_X, n=N_CTX):
        super().__init__()
        self.cfg = mixer.variant_config(variant, n_ctx=n + 1, d_model=d_model, n_layer=n_layer, vocab_size=1)
        self.read_in = nn.Linear(d + 1, d_model)
        self.blocks = nn.ModuleList(mixer.Block(self.cfg) for _ in range(n_layer))
        self.norm_f = mixer.make_norm(self.cfg)
        self.read_out = nn.Linear(d_model, 1)

    def forward(self, prompts):
        context, query = prompts.tokens()
        x = self.read_in(torch.cat([context, query], 1).float())
        for block in self.blocks:
            x = block(x)
        return self.read_out(self.norm_f(x[:, -1]))[:, 0]


# ----------------------------------------------------------------------------- training (a Runner job)

def lr_at(it, iters, lr, warmup):
    """Linear warm-up over `warmup` steps, then cosine decay to 0."""
    if it < warmup:
        return lr * (it + 1) / warmup
    return 0.5 * lr * (1 + math.cos(math.pi * (it - warmup) / max(1, iters - warmup)))


def build(spec):
    """The model of a job spec (dict with 'model': 'lsa' or 'seq', see icl_job)."""
    torch.manual_seed(spec['seed'])
    if spec['model'] == 'lsa':
        return LinearSelfAttention(spec['n_layer'], spec['param'], y_scale=y_scale(spec['noise']))
    return SequenceRegressor(spec['variant'], spec['n_layer'], spec['d_model'])


def train(model, noise, iters, batch_size, lr, seed, warmup_frac=0.1, clip=1.0, log_every=None,
          max_rollbacks=8, snapshot_every=100):
    """Adam on fresh prompts of `noise` each step, loss mean 0.5 (y_hat - y_q)^2, linear
    warm-up (warmup_frac of the steps) then cosine decay, gradient-norm clipping at `clip`.

    Deep LSA stacks are cubic in their input per layer, so one large step can send some
    prompts' outputs to infinity. Stabiliser: every snapshot_every steps the model and
    optimizer state are kept; a non-finite loss restores the last snapshot and halves
    the learning rate for the rest of the run (at most max_rollbacks times).
    -> (curve [(step, mean train loss since the last point)], rollbacks,
    finished: False when the loss stayed non-finite after max_rollbacks)."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    dtype = next(model.parameters()).dtype
    warmup = max(1, int(warmup_frac * iters))
    log_every = log_every or max(1, iters // 20)
    curve, acc, scale, rollbacks = [], [], 1.0, 0
    snapshot = copy.deepcopy((model.state_dict(), opt.state_dict()))
    for it in range(iters):
        for g in opt.param_groups:
            g['lr'] = scale * lr_at(it, iters, lr, warmup)
        p = sample_prompts(batch_size, noise, gen, dtype=dtype)
        loss = half_sq(model(p), p.y_q.to(dtype)).mean()
        if not torch.isfinite(loss):
            if rollbacks == max_rollbacks:
                return curve, rollbacks, False
            model.load_state_dict(snapshot[0])
            opt.load_state_dict(snapshot[1])
            scale, rollbacks = scale / 2, rollbacks + 1
            continue
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        acc.append(loss.item())
        if (it + 1) % snapshot_every == 0:
            snapshot = copy.deepcopy((model.state_dict(), opt.state_dict()))
        if (it + 1) % log_every == 0 or it == iters - 1:
            curve.append((it + 1, sum(acc) / max(1, len(acc))))
            acc = []
    return curve, rollbacks, True


@torch.no_grad()
def mean_loss(model, prompts, chunk=5000):
    """Mean 0.5 (y_hat - y_q)^2 of model over prompts, computed in float64 (chunks of `chunk`)."""
    total = 0.0
    for i in range(0, len(prompts), chunk):
        p = Prompts(*(t[i:i + chunk] for t in (prompts.x, prompts.y, prompts.x_q, prompts.y_q,
                                               prompts.sigma, prompts.w)))
        total += half_sq(model(p).double(), p.y_q).sum().item()
    return total / len(prompts)


def icl_job(spec, run_dir=None):
    """Runner job: train the model of spec, then evaluate it on the fixed prompt sets.

    spec: {'model': 'lsa', 'param', 'n_layer'} or {'model': 'seq', 'variant', 'n_layer',
    'd_model'}, with 'noise', 'seed', 'iters', 'batch_size', 'lr', 'eval_prompts',
    'sweep_prompts'. -> {'rc', 'line', 'seconds', 'curve', 'rollbacks', 'finished',
    'params', 'eval' and 'sweep' (mean 0.5 (y_hat - y_q)^2 on the eval and sweep prompt
    sets; the caller subtracts the oracle's)}; LSA models add, on the sweep prompts,
    'per_layer' (the loss of each layer's implicit weights w^l), 'theorem_err' (the
    largest deviation from Theorem 4.1's identities), 'sigma_sweep' (the loss at each
    fixed sigma of SIGMA_GRID) and 'state' (the trained weights)."""
    t0 = time.time()
    model = build(spec)
    curve, rollbacks, finished = train(model, spec['noise'], spec['iters'], spec['batch_size'], spec['lr'],
                                       spec['seed'])
    res = {'rc': 0, 'curve': curve, 'rollbacks': rollbacks, 'finished': finished,
           'params': sum(p.numel() for p in model.parameters())}
    if not finished:
        res.update(eval=math.inf, sweep=math.inf, seconds=time.time() - t0, line='diverged')
        return res
    model.eval()
    sweep = fixed_prompts(spec['noise'], spec['sweep_prompts'], 'sweep')
    res['eval'] = mean_loss(model, fixed_prompts(spec['noise'], spec['eval_prompts'], 'eval'))
    res['sweep'] = mean_loss(model, sweep)
    if spec['model'] == 'lsa':
        with torch.no_grad():
            ws = implicit_weights(model, sweep)
            res['per_layer'] = [half_sq((w * sweep.x_q).sum(-1), sweep.y_q).mean().item() for w, _, _ in ws]
            w, a, _ = ws[-1]
            ctx, q = model.run(*sweep.tokens())[-1]
            res['theorem_err'] = max(
                (ctx[..., -1] - (a[:, None] * sweep.y - (sweep.x * w[:, None]).sum(-1))).abs().max().item(),
                (q[:, 0, -1] + (w * sweep.x_q).sum(-1)).abs().max().item())
            res['sigma_sweep'] = [mean_loss(model, fixed_prompts(f'={s:g}', spec['sweep_prompts'], 'eval'))
                                  for s in SIGMA_GRID]
            res['state'] = {k: v.tolist() for k, v in model.state_dict().items() if k != 'q_mask'}
    res['seconds'] = time.time() - t0
    res['line'] = (f"train {curve[-1][1]:.4g}, eval loss {res['eval']:.4g}, {rollbacks} rollbacks, "
                   f"{res['seconds']:.0f} s")
    return res


# ----------------------------------------------------------------------------- the experiment

def lsa_specs(models, noises, s, seeds):
    """Job (run_dir name, spec) of every LSA model x noise x seed, deepest first (the pool
    then ends with short jobs)."""
    jobs = []
    for L, param in sorted(models, key=lambda m: -m[0]):
        for noise in noises:
            for seed in range(seeds):
                spec = dict(model='lsa', param=param, n_layer=L, noise=noise, seed=seed, iters=s['iters'],
                            batch_size=s['batch_size'], lr=s['lr'], eval_prompts=s['eval_prompts'],
                            sweep_prompts=s['sweep_prompts'])
                jobs.append((f'lsa-{param}-L{L}-noise{noise}-seed{seed}', spec))
    return jobs


def mixer_specs(variants, layers, noises, s, lrs):
    """Job (run_dir name, spec) of every sequence model x depth x noise x learning rate."""
    jobs = []
    for variant in variants:
        for L in layers:
            for noise in noises:
                for lr in lrs:
                    spec = dict(model='seq', variant=variant, n_layer=L, d_model=s['mixer_d_model'], noise=noise,
                                seed=0, iters=s['mixer_iters'], batch_size=s['mixer_batch'], lr=lr,
                                eval_prompts=s['eval_prompts'], sweep_prompts=s['sweep_prompts'])
                    jobs.append((f'seq-{variant}-L{L}-noise{noise}-lr{lr:g}', spec))
    return jobs


# ETA only: measured training throughput (n_layer x batch prompts a second, one thread)
THROUGHPUT = {'lsa': 50000.0, 'seq': 1500.0}


def run_jobs(runner, out, jobs, what):
    """Run (name, spec) jobs through runner (cached in OUT/runs/NAME) -> results in order."""
    return runner.map(icl_job, [(os.path.join(out, 'runs', name), spec,
                                 spec['n_layer'] * spec['iters'] * spec['batch_size'] / THROUGHPUT[spec['model']],
                                 None) for name, spec in jobs], what)


def baselines(noise, s):
    """The baselines' mean losses on the eval prompts of `noise` (CONSTRR and TUNEDRR
    tuned on its sweep prompts) and at each fixed sigma of SIGMA_GRID (Figure 2's
    sweep prompts) -> ({name: eval loss}, {name: [loss at each sigma]}, fitted)."""
    fitted = {'ORACLE': oracle, 'ADARR': adarr, **tune_baselines(fixed_prompts(noise, s['sweep_prompts'], 'sweep'))}
    ev = fixed_prompts(noise, s['eval_prompts'], 'eval')
    at_sigma = [fixed_prompts(f'={x:g}', s['sweep_prompts'], 'eval') for x in SIGMA_GRID]
    return ({k: half_sq(f(ev), ev.y_q).mean().item() for k, f in fitted.items()},
            {k: [half_sq(f(p), p.y_q).mean().item() for p in at_sigma] for k, f in fitted.items()}, fitted)


def best_seed(results):
    """The paper's "best of seeds": the finished run with the lowest sweep-set loss (the
    eval prompts never choose) -> (result, [eval loss of every seed])."""
    ok = [r for r in results if r['rc'] == 0 and r['finished']] or results
    return min(ok, key=lambda r: r['sweep']), [r['eval'] for r in results]


def fmt(x):
    """A loss for the table: 3 significant digits, scientific below 1e-3."""
    if x is None or not math.isfinite(x):
        return 'diverged' if x is not None else '-'
    return f'{x:.2e}' if abs(x) < 1e-3 and x != 0 else f'{x:.3g}'


def paper_row(L, param):
    return PAPER.get((L, 'all') if L == 1 else (L, param))


def gmean(xs):
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else math.nan


def verdicts(adj, base, sig, noises):
    """The paper's claims (Vladymyrov et al. 2024, Sec. 5) checked on our numbers, each
    with its rule -> list of (claim, our numbers, verdict). adj: {(L, param): {noise:
    adjusted loss}}, base: {name: {noise: adjusted}}, sig: {(L, param, noise): [adjusted
    loss at each sigma of SIGMA_GRID]}. 'n/a' when the models it needs were not run."""
    out = []
    unif = [n for n in noises if n in ('1', '2', '3', '4', '5', '6', '7')]

    def have(*models):
        return all(m in adj for m in models)

    ones = [m for m in PAPER_MODELS if m[0] == 1 and m in adj]
    if len(ones) > 1 and '0' in noises:
        vals = [adj[m]['0'] for m in ones]
        out.append(('1 layer: FULL, DIAG and GD++ are one model (1.77 at sigma = 0)',
                    ', '.join(f'{PARAM_NAMES[p]} {fmt(adj[(1, p)]["0"])}' for _, p in ones),
                    'agree' if max(vals) / min(vals) < 1.05 else 'disagree'))
    for L in (4, 7):
        if have((L, 'diag'), (L, 'full')) and unif:
            r = gmean([adj[(L, 'diag')][n] / adj[(L, 'full')][n] for n in unif])
            out.append((f'DIAG matches FULL ({L} layers; rule: geometric-mean ratio over sigma_max 1..7 within 1.5x)',
                        f'DIAG / FULL = {r:.2f}', 'agree' if 1 / 1.5 <= r <= 1.5 else 'disagree'))
    if have((7, 'gdpp')) and unif:
        r = gmean([adj[(7, 'gdpp')][n] / base['CONSTRR'][n] for n in unif])
        out.append(('GD++ stalls at CONSTRR (7 layers; rule: geometric-mean ratio over sigma_max 1..7 within 1.5x)',
                    f'GD++ / CONSTRR = {r:.2f}', 'agree' if 1 / 1.5 <= r <= 1.5 else 'disagree'))
    high = [n for n in ('5', '6', '7') if n in noises]
    for m in [(4, 'diag'), (4, 'full')]:
        if have(m) and high:
            wins = [adj[m][n] < base['ADARR'][n] for n in high]
            out.append((f'{m[0]}-layer {PARAM_NAMES[m[1]]} beats ADARR at high noise (sigma_max {",".join(high)})',
                        ', '.join(f'{fmt(adj[m][n])} vs {fmt(base["ADARR"][n])}' for n in high),
                        'agree' if all(wins) else 'disagree'))
    for m in [(7, 'diag'), (7, 'full')]:
        if have(m) and unif:
            r = max(adj[m][n] / base['TUNEDRR'][n] for n in unif)
            out.append((f'{m[0]}-layer {PARAM_NAMES[m[1]]} matches or beats TUNEDRR (rule: within 10% at every '
                        f'sigma_max 1..7)', f'worst ratio {r:.2f}', 'agree' if r <= 1.1 else 'disagree'))
    if have((7, 'diag'), (7, 'full')) and 'c13' in noises:
        d, f = adj[(7, 'diag')]['c13'], adj[(7, 'full')]['c13']
        out.append(('{1,3}: FULL better than DIAG in distribution (7 layers)', f'FULL {fmt(f)}, DIAG {fmt(d)}',
                    'agree' if f < d else 'disagree'))
        outside = [i for i, x in enumerate(SIGMA_GRID) if x > 3]
        d = sum(sig[(7, 'diag', 'c13')][i] for i in outside) / len(outside)
        f = sum(sig[(7, 'full', 'c13')][i] for i in outside) / len(outside)
        out.append(('{1,3}: DIAG extrapolates better to unseen sigma (mean over sigma 3.5..8)',
                    f'DIAG {fmt(d)}, FULL {fmt(f)}', 'agree' if d < f else 'disagree'))
    if have((7, 'gdpp')) and '0' in noises:
        pl = [max(x, 1e-300) for x in sig[(7, 'gdpp', 'per_layer')]]
        drops = [math.log10(pl[i] / pl[i + 1]) for i in range(len(pl) - 1)]
        early, late = sum(drops[:3]) / 3, sum(drops[-3:]) / 3
        out.append(('GD++ at sigma = 0: error falls super-linearly with depth (rule: mean log10 drop per layer '
                    'larger over the last 3 layers than the first 3, per-layer readout of the 7-layer model)',
                    f'first 3: {early:.2f}, last 3: {late:.2f} decades a layer', 'agree' if late > early else 'disagree'))
    return out


def plot(adj, base, sig, noises, models, path):
    """Figure 1 (adjusted loss against layers, a panel per noise setting) and Figure 2
    (adjusted loss against a fixed sigma, the deepest models of each parameterisation
    trained on {1, 3} or the widest setting run) of the paper, in one PNG -> a line
    saying where, or why not (matplotlib missing)."""
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        return 'plot skipped: matplotlib is not installed (pip install matplotlib)'
    cols = min(5, len(noises))
    rows = -(-len(noises) // cols) + 1
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.8 * rows), squeeze=False)
    colors = {'full': 'C0', 'diag': 'C1', 'gdpp': 'C2', 'CONSTRR': 'C3', 'ADARR': 'C4', 'TUNEDRR': 'C5'}
    for k, noise in enumerate(noises):
        ax = axes[k // cols][k % cols]
        for param in PARAMS:
            pts = sorted((L, adj[(L, p)][noise]) for L, p in models if p == param)
            pts = [(L, max(v, 1e-16)) for L, v in pts if math.isfinite(v)]
            if pts:
                ax.plot(*zip(*pts), 'o-', color=colors[param], label=PARAM_NAMES[param])
        for name in ('CONSTRR', 'ADARR', 'TUNEDRR'):
            if base[name][noise] > 0:
                ax.axhline(base[name][noise], color=colors[name], ls='--', lw=1, label=name)
        ax.set_yscale('log')
        ax.set_title(f'sigma ~ U(0, {noise})' if noise[0].isdigit() else f'sigma in {{{",".join(noise[1:])}}}',
                     fontsize=9)
        ax.set_xlabel('layers', fontsize=8)
    for ax in axes[-2][len(noises) % cols or cols:]:
        ax.axis('off')
    axes[0][0].set_ylabel('adjusted eval loss')
    axes[0][0].legend(fontsize=6)
    deepest = max(L for L, _ in models)
    trained_on = [n for n in ('c13', 'c135', '5', '7') if n in noises][:cols] or noises[:1]
    for k in range(cols):
        ax = axes[-1][k]
        if k >= len(trained_on):
            ax.axis('off')
            continue
        for param in PARAMS:
            if (deepest, param, trained_on[k]) in sig:
                ax.plot(SIGMA_GRID, [max(v, 1e-16) for v in sig[(deepest, param, trained_on[k])]], '-',
                        color=colors[param], label=f'{deepest}L {PARAM_NAMES[param]}')
        for name in ('CONSTRR', 'ADARR', 'TUNEDRR'):
            ax.plot(SIGMA_GRID, [max(v, 1e-16) for v in sig[(name, trained_on[k])]], '--', color=colors[name],
                    lw=1, label=name)
        ax.set_yscale('log')
        ax.set_ylim(1e-4, 10)               # a model that blows up out of distribution leaves the panel
        ax.set_xlabel('sigma (fixed)', fontsize=8)
        ax.set_title(f'trained on {trained_on[k]}', fontsize=9)
    axes[-1][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path + '.tmp.png', dpi=90)
    plt.close(fig)
    os.replace(path + '.tmp.png', path)
    return f'plot: {path}'


def lsa_report(results, jobs, models, noises, s, seeds):
    """The Table 1 report from the finished LSA jobs -> (markdown text, adjusted losses
    {(L, param): {noise: x}}, baselines {name: {noise: x}}, sigma sweeps)."""
    base, sig, adj, spread, rb = {}, {}, {}, {}, {}
    oracle_sig = None
    for noise in noises:
        b, b_sig, _ = baselines(noise, s)
        for name in ('CONSTRR', 'ADARR', 'TUNEDRR'):
            base.setdefault(name, {})[noise] = b[name] - b['ORACLE']
            sig[(name, noise)] = [x - o for x, o in zip(b_sig[name], b_sig['ORACLE'])]
        oracle_sig = b_sig['ORACLE']
        base.setdefault('ORACLE', {})[noise] = b['ORACLE']
    sweep_oracle = {n: half_sq(oracle(p), p.y_q).mean().item()
                    for n in noises for p in [fixed_prompts(n, s['sweep_prompts'], 'sweep')]}
    by_model = {}
    for (name, spec), res in zip(jobs, results):
        by_model.setdefault((spec['n_layer'], spec['param'], spec['noise']), []).append(res)
    for (L, param, noise), runs in by_model.items():
        best, evs = best_seed(runs)
        o = base['ORACLE'][noise]
        adj.setdefault((L, param), {})[noise] = best['eval'] - o
        spread[(L, param, noise)] = (max(evs) - min(evs)) / 2 if len(evs) > 1 else None
        rb[(L, param, noise)] = best.get('rollbacks', 0)
        if best.get('finished'):
            sig[(L, param, noise)] = [x - y for x, y in zip(best['sigma_sweep'], oracle_sig)]
            if noise == '0' or noise == noises[-1]:
                sig[(L, param, 'per_layer' if noise == '0' else 'per_layer_last')] = [
                    x - sweep_oracle[noise] for x in best['per_layer']]
    rows = []
    for L, param in models:
        paper = paper_row(L, param)
        cells = []
        for noise in noises:
            x = adj[(L, param)][noise]
            p = paper[NOISE_NAMES.index(noise)] if paper and noise in NOISE_NAMES else None
            cells.append(f'{fmt(x)}' + (f' ({fmt(p)})' if p is not None else '') +
                         (f' +-{fmt(spread[(L, param, noise)])}' if spread[(L, param, noise)] is not None else '') +
                         ('*' if rb[(L, param, noise)] else ''))
        rows.append([f'{L}L {PARAM_NAMES[param]}', *cells])
    for name in ('CONSTRR', 'ADARR', 'TUNEDRR'):
        rows.append([name, *[f'{fmt(base[name][n])}' + (f' ({fmt(PAPER[name][NOISE_NAMES.index(n)])})'
                                                           if n in NOISE_NAMES else '') for n in noises]])
    header = ['model', *[f'U(0,{n})' if n[0].isdigit() else '{' + ','.join(n[1:]) + '}' for n in noises]]
    text = [md_table(header, rows), '',
            'Cells: ours (the paper\'s), adjusted evaluation loss = model minus oracle, 0.5 squared error, '
            f'{s["eval_prompts"]} fresh prompts shared by every model of a column'
            + (f'; +- half the range over {seeds} seeds, best seed by a separate prompt set' if seeds > 1 else '')
            + ('; * = the training stabiliser rolled back at least once' if any(rb.values()) else '') + '.']
    return '\n'.join(text), adj, base, sig


def theory_report(results, jobs, sig, noises):
    """Theorem 4.1 and Figure 5 read off the trained LSA models: the largest deviation
    from the identities, each layer's implicit-weight loss for the deepest models, and
    the DIAG omegas -> markdown text."""
    errs = [r['theorem_err'] for r in results if r.get('finished') and 'theorem_err' in r]
    text = [f'Theorem 4.1 on every trained model ({len(errs)} models, float64, the sweep prompts): '
            f'largest |y_i^l - (a^l y_i - <w^l, x_i>)| or |y_q^l + <w^l, x_q>| after the last layer = '
            f'{max(errs):.1e}.' if errs else 'Theorem 4.1: no finished model.', '']
    deepest = max(spec['n_layer'] for _, spec in jobs)
    for key, label in (('per_layer', 'sigma = 0'), ('per_layer_last', f'noise {noises[-1]}')):
        rows = [[f'{deepest}L {PARAM_NAMES[p]}', *map(fmt, sig[(deepest, p, key)])]
                for p in PARAMS if (deepest, p, key) in sig]
        if rows:
            text += [f'Adjusted loss of each layer\'s implicit weights w^l (Figure 5), {label}, sweep prompts:', '',
                     md_table(['model', *[f'l={i + 1}' for i in range(deepest)]], rows), '']
    for (name, spec), res in zip(jobs, results):
        if spec['param'] == 'diag' and spec['n_layer'] == deepest and spec['seed'] == 0 and res.get('finished') \
                and spec['noise'] == ('5' if '5' in noises else noises[-1]):
            model = LinearSelfAttention(deepest, 'diag', y_scale=y_scale(spec['noise']))
            model.load_state_dict({k: torch.tensor(v, dtype=torch.float64) for k, v in res['state'].items()},
                                  strict=False)
            om = model.omegas().tolist()
            text += [f'DIAG omegas of the {deepest}-layer model trained at noise {spec["noise"]} (the paper\'s '
                     f'Eq. 6, its coordinates):', '',
                     md_table(['layer', 'omega_xx', 'omega_xy', 'omega_yx', 'omega_yy'],
                              [[l + 1, *[f'{v:.3g}' for v in row]] for l, row in enumerate(om)]), '']
    return '\n'.join(text)


def mixer_report(results, jobs, lsa, base, s):
    """The mixers table: per sequence model, depth and noise, the best learning rate (by
    the sweep prompts) and its adjusted eval loss, beside the LSA models and baselines
    at the same noise -> markdown text. lsa: {(L, param): {noise: adjusted}}."""
    best = {}
    for (name, spec), res in zip(jobs, results):
        key = (spec['variant'], spec['n_layer'], spec['noise'])
        if res['rc'] == 0 and (key not in best or res['sweep'] < best[key][1]['sweep']):
            best[key] = (spec, res)
    noises = sorted({spec['noise'] for _, spec in jobs})
    rows = []
    for variant, L in sorted({k[:2] for k in best}, key=lambda k: (MIXER_VARIANTS.index(k[0]), k[1])):
        cells = []
        for noise in noises:
            sp, r = best.get((variant, L, noise), (None, None))
            cells.append(f'{fmt(r["eval"] - base["ORACLE"][noise])} (lr {sp["lr"]:g})' if r else '-')
        rows.append([f'{L}L {variant}', next(r['params'] for k, (_, r) in best.items() if k[:2] == (variant, L)),
                     *cells])
    for (L, param) in [(1, 'diag'), (2, 'diag'), (4, 'diag')]:
        if (L, param) in lsa and all(n in lsa[(L, param)] for n in noises):
            rows.append([f'{L}L LSA {PARAM_NAMES[param]}', 4 * L, *[fmt(lsa[(L, param)][n]) for n in noises]])
    zero = {n: 0.5 * D_X - base['ORACLE'][n] for n in noises}     # predicting 0: E 0.5 <w, x_q>^2 = d / 2
    rows.append(['predict 0 (no in-context learning)', 0, *[fmt(zero[n]) for n in noises]])
    for name in ('CONSTRR', 'TUNEDRR'):
        rows.append([name, '-', *[fmt(base[name][n]) for n in noises]])
    header = ['model', 'parameters', *[f'U(0,{n})' if n != '0' else 'sigma = 0' for n in noises]]
    sp = jobs[0][1]
    return '\n'.join([md_table(header, rows), '',
                      f'Every sequence model: d_model {sp["d_model"]}, {sp["iters"]} Adam steps of {sp["batch_size"]} '
                      f'prompts, float32, learning rate chosen from {", ".join(f"{x:g}" for x in s["mixer_lrs"])} on '
                      f'separate prompts, 1 seed; adjusted eval loss on the same {s["eval_prompts"]} prompts as '
                      f'the LSA models (which trained {s["iters"]} steps of {s["batch_size"]}).'])


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument('--quick', action='store_true', help='tiny budget: every row and plot in a few minutes')
    p.add_argument('--mixers', action='store_true', help="also the same prompts through mixer.py's sequence models")
    p.add_argument('--mixer_layers', default=','.join(map(str, MIXER_LAYERS)), help='depths of the sequence models')
    p.add_argument('--layers', help="comma-separated depths (with --params: that grid; default the paper's rows)")
    p.add_argument('--params', help='comma-separated parameterisations among full,diag,gdpp')
    p.add_argument('--noise', default=','.join(NOISE_NAMES), help='settings: 0..7 = sigma ~ U(0, x), c13, c135 = sets')
    p.add_argument('--iters', type=int, help='Adam steps per LSA model (default 3000, --quick 60)')
    p.add_argument('--batch_size', type=int, help='prompts per step (default 256)')
    p.add_argument('--lr', type=float, help='peak learning rate (default 1e-2)')
    p.add_argument('--seeds', type=int, help='seeds per cell; the best by separate prompts is reported (default 1)')
    p.add_argument('--eval_prompts', type=int, help='evaluation prompts per noise setting (default 100000)')
    p.add_argument('--workers', type=int, default=2, help='jobs at a time')
    p.add_argument('--threads', type=int, default=1, help='torch threads per job')
    p.add_argument('--device', default='cpu', help='only cpu: these models are too small for a GPU to help')
    p.add_argument('--out', help='output folder (default out/icl, out/icl_quick with --quick)')
    args = p.parse_args(argv)
    if args.device != 'cpu':
        fail(f'--device {args.device}: only cpu is supported (a prompt is 21 tokens of 11 numbers)')
    s = dict(SETTINGS['quick' if args.quick else 'full'])
    for k in ('iters', 'batch_size', 'lr', 'seeds', 'eval_prompts'):
        v = getattr(args, k)
        if v is not None:
            if v <= 0:
                fail(f'--{k} must be positive, got {v}')
            s[k] = v
    for k in ('workers', 'threads'):
        if getattr(args, k) <= 0:
            fail(f'--{k} must be positive')
    args.noises = args.noise.split(',')
    for n in args.noises:
        try:
            check_noise(n)
            if n.startswith('='):
                raise ValueError(f'noise {n!r}: a fixed sigma is for evaluation only; train on 0..7, c13 or c135')
        except ValueError as e:
            fail(str(e))
    try:
        layers = [int(x) for x in args.layers.split(',')] if args.layers else None
        args.mixer_layers = [int(x) for x in args.mixer_layers.split(',')]
    except ValueError:
        fail('--layers and --mixer_layers must be integers separated by commas')
    params = args.params.split(',') if args.params else None
    if params and any(x not in PARAMS for x in params):
        fail(f'--params: choose among {",".join(PARAMS)}, got {args.params!r}')
    if min(layers or [1]) < 1 or min(args.mixer_layers) < 1:
        fail('--layers and --mixer_layers must be >= 1')
    if layers or params:
        args.models = [(L, q) for L in (layers or sorted({m[0] for m in PAPER_MODELS})) for q in (params or PARAMS)]
    else:
        args.models = PAPER_MODELS
    args.s = s
    args.out = os.path.abspath(args.out or os.path.join('out', 'icl_quick' if args.quick else 'icl'))
    return args


def main(argv=None):
    args = parse_args(argv)
    s, out = args.s, args.out
    os.makedirs(out, exist_ok=True)
    os.environ['OMP_NUM_THREADS'] = str(args.threads)
    t0 = time.time()
    runner = Runner(out, args.workers, args.threads)
    say(f'icl: {len(args.models)} LSA models x {len(args.noises)} noise settings x {s["seeds"]} seed(s), '
               f'{s["iters"]} steps of {s["batch_size"]} prompts at lr {s["lr"]:g}, float64; output in {out}')
    jobs = lsa_specs(args.models, args.noises, s, s['seeds'])
    mjobs = mixer_specs(MIXER_VARIANTS, args.mixer_layers, MIXER_NOISE, s, s['mixer_lrs']) if args.mixers else []
    if mjobs:      # the mixers' table compares with these LSA models
        jobs += [j for j in lsa_specs([(1, 'diag'), (2, 'diag'), (4, 'diag')], MIXER_NOISE, s, 1)
                 if j[0] not in {name for name, _ in jobs}]
    results = run_jobs(runner, out, jobs, 'linear self-attention models')
    failed = [name for (name, _), r in zip(jobs, results) if r['rc'] != 0]
    noises = sorted({spec['noise'] for _, spec in jobs}, key=lambda n: (NOISE_NAMES + (n,)).index(n))
    say('baselines: tuning CONSTRR and TUNEDRR, evaluating every baseline')
    models = list(dict.fromkeys(args.models + [(spec['n_layer'], spec['param']) for _, spec in jobs]))
    table, adj, base, sig = lsa_report(results, jobs, models, noises, s, s['seeds'])
    text = ['# In-context regression (Vladymyrov et al. 2024, Table 1)', '', table, '',
            '## The paper\'s claims', '',
            md_table(['claim', 'ours', 'verdict'], verdicts(adj, base, sig, noises)), '',
            '## Theory (Theorem 4.1, Figure 5)', '', theory_report(results, jobs, sig, noises)]
    if mjobs:
        mres = run_jobs(runner, out, mjobs, 'sequence models (mixer.py)')
        failed += [name for (name, _), r in zip(mjobs, mres) if r['rc'] != 0]
        text += ['## Do masked mixers learn in context?', '', mixer_report(mres, mjobs, adj, base, s)]
    text += ['', f'Command: python -m experiments.icl {" ".join(argv if argv is not None else sys.argv[1:])}']
    note = plot(adj, base, sig, noises, models, os.path.join(out, 'icl.png'))
    report = '\n'.join(text) + '\n'
    print(report)
    with open(os.path.join(out, 'icl.md.tmp'), 'w') as f:
        f.write(report)
    os.replace(os.path.join(out, 'icl.md.tmp'), os.path.join(out, 'icl.md'))
    runner.pool.shutdown()
    say(note)
    say(f'icl: done in {fmt_s(time.time() - t0)}; report in {os.path.join(out, "icl.md")}' +
               (f'; FAILED jobs: {", ".join(failed)}' if failed else ''))
    if failed:
        sys.exit(1)


if __name__ == '__main__':
    main()
