"""The optimisers of train.py: parameter groups (the token-mixing matrices' own learning rate and weight
decay), AdamW and Muon (the learning-rate schedule is train.py's get_lr).

    optimizers = build_optimizers(model, cfg, cuda=False)   # [('optimizer', AdamW)] (+ 'optimizer_muon')

cfg is train.py's settings dict (learning_rate, weight_decay, beta1, beta2, optimizer, mixing_lr_mult,
mixing_weight_decay).
"""

import torch

import mixer


def muon_params(model):
    """The parameters that optimizer='muon' gives to torch.optim.Muon: the 2-D weights of
    the nn.Linear layers inside the blocks (mixer.Block: attention, MLP and head
    projections); never embeddings, the (tied) LM head, norms, biases or the
    token mixings' own matrices. Returns a set of parameter ids."""
    return {id(m.weight) for b in model.modules() if isinstance(b, mixer.Block)
            for m in b.modules() if isinstance(m, torch.nn.Linear) and m.weight.dim() == 2}


def param_groups(model, cfg, only=None):
    """AdamW groups of a mixer.py model: weight decay on matrices only (not biases, norms or what
    a sequence mixing says takes none: its decays(); the token mixings' matrices at
    mixing_weight_decay when set), and the token mixings' own parameters at `mixing_lr_mult` times
    the learning rate. Each group carries 'lr_mult'.
    `only`: a set of parameter ids to group (default: every parameter)."""
    mixing = {id(p): d for b in model.modules() if isinstance(b, mixer.Block)
              for p, d in b.mixing.decays().items()}
    groups = {}
    for p in model.parameters():
        if only is not None and id(p) not in only:
            continue
        decay = mixing.get(id(p), p.dim() >= 2)
        wd = cfg['weight_decay'] if decay else 0.0
        if id(p) in mixing and decay and cfg['mixing_weight_decay'] is not None:
            wd = cfg['mixing_weight_decay']
        mult = cfg['mixing_lr_mult'] if id(p) in mixing else 1.0
        groups.setdefault((decay, wd, mult), []).append(p)
    return [{'params': ps, 'weight_decay': wd, 'lr_mult': mult} for (_, wd, mult), ps in groups.items()]


def build_optimizers(model, cfg, cuda):
    """AdamW over every parameter, or with optimizer='muon' Muon over muon_params and
    AdamW over the rest -> list of (checkpoint key, optimizer)."""
    muon_ids = muon_params(model) if cfg['optimizer'] == 'muon' else set()
    adamw_ids = {id(p) for p in model.parameters()} - muon_ids
    out = [('optimizer', torch.optim.AdamW(param_groups(model, cfg, adamw_ids), lr=cfg['learning_rate'],
                                           betas=(cfg['beta1'], cfg['beta2']), fused=cuda))]
    if muon_ids:
        muon = torch.optim.Muon(param_groups(model, cfg, muon_ids), lr=cfg['learning_rate'],
                                weight_decay=cfg['weight_decay'], adjust_lr_fn='match_rms_adamw')
        out.append(('optimizer_muon', muon))
    return out


if __name__ == '__main__':
    from harness.cli import fail
    fail("train.py's optimisers and schedule, not a command: python train.py --help", 'harness/optim.py')
