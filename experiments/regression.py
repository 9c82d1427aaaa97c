"""In-context linear regression, the harness (Garg et al. 2022's pieces): the task, the linear
self-attention models, the ridge baselines with the models' call signature, and training.

  the task        sample_prompts(): w ~ N(0, I), x ~ N(0, I), y = <w, x> + sigma eps (Vladymyrov,
                  von Oswald, Sandler, Ge, NeurIPS 2024, arXiv 2402.14180, Sec. 5)
  the models      LinearSelfAttention: FULL, DIAG and GD++ (its Eq. 1; von Oswald et al. 2023 for
                  the (x, y) token format and one step of gradient descent)
  the baselines   ridge regressions, model(prompts) -> y_hat: ORACLE (the true sigma), CONSTRR,
                  ADARR, TUNEDRR
  training        train() one model at a time; train_batched() many of one architecture as one
                  program, equal up to float64 rounding
Everything runs in float64: the paper's 7-layer cells at sigma = 0 are about 1e-12, below
float32's resolution. experiments/icl.py runs the experiment.
"""

import sys

if __name__ == '__main__':       # not a command, run as a file or with -m: said before any import
    print("regression.py: error: icl.py's pieces, not a command: python -m experiments.icl --help", file=sys.stderr)
    sys.exit(2)

import copy
import math
import zlib

import torch
import torch.nn as nn

D_X, N_CTX = 10, 20                  # the paper's d and n
NOISE_NAMES = ('0', '1', '2', '3', '4', '5', '6', '7', 'c13', 'c135')
PARAMS = ('full', 'diag', 'gdpp')
PARAM_NAMES = {'full': 'FULL', 'diag': 'DIAG', 'gdpp': 'GD++'}
SIGMA_GRID = [0.5 * i for i in range(17)]        # Figure 2: fixed sigma 0 .. 8, past every training range
VERSION = 'icl 2'    # of the in-context trainers (here, icl_mixers, icl_ladder): in every cached job's key


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
        if name.startswith('c') and len(name) > 1 and all(c.isdigit() for c in name[1:]):
            return True
        sigma = float(name[1:] if name.startswith('=') else name)
        if math.isfinite(sigma) and sigma >= 0:
            return True
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
    n_layer < 1.

    stack(models) makes K models of one architecture one module whose parameters and
    buffers have a leading model axis (the batched trainer's); every method below
    works on both."""

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

    @classmethod
    def stack(cls, models):
        """K models of one architecture -> one module, each parameter and buffer stacked on a new
        leading model axis (copies, detached from the models)."""
        out = copy.deepcopy(models[0])
        for name, _ in models[0].named_parameters():
            setattr(out, name, nn.Parameter(torch.stack([getattr(m, name).detach() for m in models])))
        for name, _ in models[0].named_buffers():
            setattr(out, name, torch.stack([getattr(m, name) for m in models]))
        return out

    def diagonals(self):
        """DIAG / GD++: the diagonals of P and Q, each float64 [(K,) L, d + 1]."""
        q = self.q * self.q_mask.unsqueeze(-2)
        wide = (*self.p.shape[:-1], self.d)
        return (torch.cat([self.p[..., :1].expand(wide), self.p[..., 1:]], -1),
                torch.cat([q[..., :1].expand(wide), q[..., 1:]], -1) * self.Q_gain.diagonal(0, -2, -1).unsqueeze(-2))

    def matrices(self):
        """P, Q: float64 [(K,) L, d + 1, d + 1] (DIAG and GD++ as diagonal matrices)."""
        if self.param == 'full':
            return self.P * self.P_gain.unsqueeze(-3), self.Q * self.Q_gain.unsqueeze(-3)
        return tuple(torch.diag_embed(v) for v in self.diagonals())

    def layers(self):
        """The layers' A = P S Q as functions of S [(K,) B, D, D], one a layer (P and Q computed once)."""
        if self.param == 'full':
            P, Q = self.matrices()
            return [lambda S, l=l: P[..., l, None, :, :] @ S @ Q[..., l, None, :, :] for l in range(P.shape[-3])]
        p, q = self.diagonals()
        return [lambda S, l=l: p[..., l, None, :, None] * S * q[..., l, None, None, :] for l in range(p.shape[-2])]

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
        for layer in self.layers():
            A = layer(context.mT @ context)                             # P (sum_j e_j e_j^T) Q
            context, queries = context + context @ A.mT, queries + queries @ A.mT
            states.append((context, queries))
        return states

    def forward(self, prompts, query=None):
        """Prompts (or the tensors context [(K,) B, n, d + 1], query [(K,) B, 1, d + 1] of
        Prompts.tokens()) -> y_hat float64 [(K,) B]. Fast path, equal to run()'s up to rounding:
        every token is mapped by one matrix a layer (Theorem 4.1), context <- context M^T with
        M = I + A, so the Gram matrix S = C^T C follows S <- M S M^T and the context itself is
        never updated (D x D products a layer instead of n x D ones)."""
        context, query = prompts.tokens() if query is None else (prompts, query)
        S, eye = context.mT @ context, torch.eye(context.shape[-1], dtype=context.dtype)
        for layer in self.layers():
            A = layer(S)
            M = eye + A
            S, query = M @ S @ M.mT, query + query @ A.mT
        return -query[..., 0, -1]


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
    return {'CONSTRR': constrr, 'TUNEDRR': tunedrr}


# ----------------------------------------------------------------------------- training (a Runner job)

def lr_at(it, iters, lr, warmup):
    """Linear warm-up over `warmup` steps, then cosine decay to 0."""
    if it < warmup:
        return lr * (it + 1) / warmup
    return 0.5 * lr * (1 + math.cos(math.pi * (it - warmup) / max(1, iters - warmup)))


def build(spec):
    """The LSA model of a spec (dict: 'param', 'n_layer', 'noise', 'seed'), initialised from its seed."""
    torch.manual_seed(spec['seed'])
    return LinearSelfAttention(spec['n_layer'], spec['param'], y_scale=y_scale(spec['noise']))


def train(model, noise, iters, batch_size, lr, seed, warmup_frac=0.1, clip=1.0, log_every=None,
          max_rollbacks=8, snapshot_every=100, evaluate=None):
    """Adam on fresh prompts of `noise` each step, loss mean 0.5 (y_hat - y_q)^2, linear
    warm-up (warmup_frac of the steps) then cosine decay, gradient-norm clipping at `clip`.

    Deep LSA stacks are cubic in their input per layer, so one large step can send some
    prompts' outputs to infinity. Stabiliser: every snapshot_every steps the model and
    optimizer state are kept; a non-finite loss restores the last snapshot and halves
    the learning rate for the rest of the run (at most max_rollbacks times).
    -> (curve [(step, mean train loss since the last point[, evaluate()])], rollbacks,
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
            curve.append((it + 1, sum(acc) / max(1, len(acc))) + ((evaluate(),) if evaluate else ()))
            acc = []
    return curve, rollbacks, True


def train_batched(models, noises, seeds, iters, batch_size, lr, warmup_frac=0.1, clip=1.0, log_every=None,
                  max_rollbacks=8, snapshot_every=100):
    """train() for K LinearSelfAttention models of one architecture at once: model k trains on the
    prompts of noises[k] drawn from its own generator (seeds[k]) exactly as train() would draw them,
    and its parameters, Adam state, gradient clipping, learning-rate scale, snapshots and rollbacks
    are its own. The K models run as one module with a leading model axis (LinearSelfAttention.
    stack), whose summed loss gives each model its own gradient, and Adam is applied to the stacked
    tensors: one program for all K. Equal to train() up to float64 rounding (tested; where a run
    blows up and rolls back, rounding differences grow as chaotic runs' do). The models are updated
    in place. -> list over k of train()'s (curve, rollbacks, finished)."""
    K, stack = len(models), LinearSelfAttention.stack(models)
    params = dict(stack.named_parameters())
    gens = [torch.Generator().manual_seed(seed) for seed in seeds]
    m = {n: torch.zeros_like(p) for n, p in params.items()}
    v = {n: torch.zeros_like(p) for n, p in params.items()}
    steps, scale, rollbacks = [0] * K, [1.0] * K, [0] * K
    alive, curves, acc = [True] * K, [[] for _ in range(K)], [[] for _ in range(K)]
    warmup, log_every = max(1, int(warmup_frac * iters)), log_every or max(1, iters // 20)
    snapshot = copy.deepcopy(({n: p.detach() for n, p in params.items()}, m, v, list(steps)))
    prompts = [None] * K
    for it in range(iters):
        prompts = [sample_prompts(batch_size, noises[k], gens[k]) if alive[k] else prompts[k] for k in range(K)]
        tokens = [p.tokens() for p in prompts]
        losses = half_sq(stack(torch.stack([t[0] for t in tokens]), torch.stack([t[1] for t in tokens])),
                         torch.stack([p.y_q for p in prompts])).mean(-1)                      # [K]
        stack.zero_grad(set_to_none=True)
        losses.sum().backward()                     # model k's loss alone reaches model k's parameters
        values = losses.tolist()
        step = [alive[k] and math.isfinite(values[k]) for k in range(K)]
        for k in range(K):
            if alive[k] and not step[k]:            # restore model k's last snapshot, halve its rate
                if rollbacks[k] == max_rollbacks:
                    alive[k] = False
                    continue
                with torch.no_grad():
                    for n in params:
                        params[n][k], m[n][k], v[n][k] = snapshot[0][n][k], snapshot[1][n][k], snapshot[2][n][k]
                steps[k], scale[k], rollbacks[k] = snapshot[3][k], scale[k] / 2, rollbacks[k] + 1
        if not any(step):
            continue
        adam_step(params, m, v, steps, step, [scale[k] * lr_at(it, iters, lr, warmup) for k in range(K)], clip)
        for k in range(K):
            if step[k]:
                acc[k].append(values[k])
        if (it + 1) % snapshot_every == 0:         # the models that stepped now
            on = torch.tensor(step)
            for d, snap in ((params, snapshot[0]), (m, snapshot[1]), (v, snapshot[2])):
                for n in params:
                    snap[n][on] = d[n].detach()[on]
            snapshot[3][:] = [steps[k] if step[k] else snapshot[3][k] for k in range(K)]
        if (it + 1) % log_every == 0 or it == iters - 1:
            for k in range(K):
                if alive[k]:
                    curves[k].append((it + 1, sum(acc[k]) / max(1, len(acc[k]))))
                    acc[k] = []
    with torch.no_grad():
        for k, model in enumerate(models):
            for n, p in model.named_parameters():
                p.copy_(params[n][k])
    return [(curves[k], rollbacks[k], alive[k]) for k in range(K)]


@torch.no_grad()
def adam_step(params, m, v, steps, step, lrs, clip, betas=(0.9, 0.999), eps=1e-8):
    """torch.optim.Adam's update (its foreach arithmetic) with gradient-norm clipping at `clip`, for
    stacked models: params {name: [K, ...] tensor with .grad}, Adam's m and v alike; model k steps
    (steps[k] += 1) only where step[k], at learning rate lrs[k]."""
    K, dtype = len(step), next(iter(params.values())).dtype
    norm = torch.stack([p.grad.flatten(1).pow(2).sum(1) for p in params.values()]).sum(0).sqrt()
    coef = torch.clamp(clip / (norm + 1e-6), max=1.0)                    # clip_grad_norm_, per model
    for k in range(K):
        steps[k] += step[k]
    step_size = torch.tensor([-(lrs[k] / (1 - betas[0] ** steps[k])) if step[k] else 0.0 for k in range(K)],
                             dtype=dtype)
    bc2 = torch.tensor([(1 - betas[1] ** steps[k]) ** 0.5 if step[k] else 1.0 for k in range(K)], dtype=dtype)
    on = torch.tensor(step)
    for n, p in params.items():
        shape = (K,) + (1,) * (p.dim() - 1)
        g = torch.where(on.view(shape), p.grad * coef.view(shape), 0.0)
        new_m, new_v = m[n].lerp(g, 1 - betas[0]), v[n] * betas[1] + (1 - betas[1]) * g * g
        keep = on.view(shape)
        m[n].copy_(torch.where(keep, new_m, m[n]))
        v[n].copy_(torch.where(keep, new_v, v[n]))
        p.copy_(torch.where(keep, p + step_size.view(shape) * m[n] / (v[n].sqrt() / bc2.view(shape) + eps), p))


@torch.no_grad()
def mean_loss(model, prompts, chunk=5000):
    """Mean 0.5 (y_hat - y_q)^2 of model over prompts, computed in float64 on the CPU (chunks of `chunk`;
    a model on a GPU takes the prompts there itself and its y_hat comes back)."""
    total = 0.0
    for i in range(0, len(prompts), chunk):
        p = Prompts(*(t[i:i + chunk] for t in (prompts.x, prompts.y, prompts.x_q, prompts.y_q,
                                               prompts.sigma, prompts.w)))
        total += half_sq(model(p).double().cpu(), p.y_q).sum().item()
    return total / len(prompts)
