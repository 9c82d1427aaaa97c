"""train.py's settings: its module-level defaults, overridden by config files and then by --key=value
arguments, type- and range-checked, and on --init_from=resume restored from the checkpoint (nanoGPT's
configurator.py, made strict).

    python train.py config/tinystories_cpu.py --variant=toeplitz --max_iters=500

A config file holds plain Python assignments (`n_layer = 4`). Values given as --key=value are Python
literals (`--lr_decay_iters=None`, `--compile=True`) or bare strings (`--variant=toeplitz`). Unknown keys,
wrong types, values out of range, non-finite numbers and config files that do not run are a one-line
error and exit status 2, wherever the value came from: the merged settings are checked, not the argument
strings.
"""

import ast
import math
import os
import sys
from dataclasses import fields

import mixer
from harness.cli import fail
from harness.machine import MAX_THREADS

# train.py's settings with a fixed set of values, and the numeric settings' lower bounds (the model's are
# mixer.ModelConfig's own, mixer.CHOICES).
SETTING_CHOICES = {'init_from': ('scratch', 'resume'), 'optimizer': ('adamw', 'muon'),
                   'dtype': ('auto', 'float32', 'bfloat16')}
AT_LEAST = {'batch_size': 1, 'grad_accum': 1, 'max_iters': 0, 'warmup_iters': 0, 'eval_interval': 1,
            'eval_windows': 1, 'log_interval': 1, 'save_interval': 0, 'weight_decay': 0, 'grad_clip': 0,
            'mixing_lr_mult': 0, 'min_lr': 0, 'ddp_timeout': 1}


# The model's settings: mixer.ModelConfig's fields but vocab_size (the data's) and task (which the model's
# architecture does not hold: an LM and an autoencoder of one config); the two that change speed, never
# results, default to None: the device's (machine.device_tuning), and may change on resume.
MODEL_KEYS = [f.name for f in fields(mixer.ModelConfig) if f.name not in ('vocab_size', 'task')]
TUNING_KEYS = ('fft_threshold', 'chunk_size')


def collect_defaults(namespace):
    """train.py's settings: the public names of its module namespace (globals()) bound to an int, float, bool,
    str or None, in order (the model's sizes among them: their home), then the other fields of
    mixer.ModelConfig with their defaults (TUNING_KEYS None: the device's) -> {name: default}."""
    own = {k: v for k, v in namespace.items()
           if not k.startswith('_') and isinstance(v, (int, float, bool, str, type(None)))}
    model = {f.name: None if f.name in TUNING_KEYS else f.default for f in fields(mixer.ModelConfig)
             if f.name != 'vocab_size' and f.name not in own}
    return {**own, **model}


def coerce(defaults, key, value):
    """`value` checked against the type of defaults[key] (None is free; an int is taken
    for a float) -> the value; a wrong type: one-line error, exit 2."""
    default = defaults[key]
    if default is None or value is None or isinstance(value, type(default)) and not (
            isinstance(value, bool) and not isinstance(default, bool)):
        return value
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    fail(f'{key} must be {type(default).__name__}, got {value!r}')


def read_config_file(path):
    """The public assignments of a config file -> list of (key, value). A missing file or one that does not
    run (a syntax error, a name error) is a one-line error naming the file and line."""
    if not os.path.isfile(path):
        fail(f'config file {path!r} not found')
    ns = {}
    try:
        with open(path, encoding='utf-8') as f:
            code = compile(f.read(), path, 'exec')
        exec(code, {}, ns)
    except SyntaxError as e:
        fail(f'config file {path}, line {e.lineno}: {e.msg}')
    except Exception as e:                          # the file's own code failed
        import traceback
        line = next((n for f, n in traceback.walk_tb(e.__traceback__) if f.f_code.co_filename == path), '?')
        fail(f'config file {path}, line {line}: {type(e).__name__}: {e}')
    return [(k, v) for k, v in ns.items() if not k.startswith('_')]


def settings(argv, defaults, usage, module):
    """train.py's settings of argv (config files and --key=value) -> (settings dict, checkpoint dict or None):
    parse_overrides, resolve_settings, check_settings. `module`: train.py's, whose comments are --help's."""
    cfg, ckpt = resolve_settings(parse_overrides(argv, defaults, usage, module), defaults)
    check_settings(cfg)
    return cfg, ckpt


def parse_overrides(argv, defaults, usage, module=None):
    """Config files and --key=value (or --key value) arguments -> dict of the keys they set, each coerced to
    its default's type. --help prints `usage` and every setting with its default and its comment in `module`
    (train.py) or mixer.ModelConfig, exit 0."""
    out, args = {}, list(argv)
    while args:
        arg = args.pop(0)
        if arg in ('-h', '--help'):
            from harness.flags import print_settings      # here: a run without --help needs none of it
            print_settings(usage, defaults, filter(None, (module, mixer.ModelConfig)))
            sys.exit(0)
        if not arg.startswith('--'):
            items = read_config_file(arg)
        else:
            key, eq, text = arg[2:].partition('=')
            if not eq:                             # --key value
                if not args or args[0].startswith('--'):
                    fail(f'expected --key=value or --key value, got {arg!r}')
                text = args.pop(0)
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                value = text                       # a bare string such as --variant=toeplitz
            items = [(key, value)]
        for key, value in items:
            if key not in defaults:
                fail(f'unknown setting {key!r} (see --help)')
            out[key] = coerce(defaults, key, value)
    return out


def check_settings(cfg):
    """Check the merged non-model settings (the model's are mixer.ModelConfig's) against RULES: the first
    violation is a one-line error, exit 2. Non-finite numbers are refused."""
    for key, value in cfg.items():
        if isinstance(value, float) and not math.isfinite(value):
            fail(f'{key} must be a finite number, got {value!r}')
    for key, (ok, what) in RULES.items():
        if not ok(cfg[key]):
            fail(f'{key} must be {what}, got {cfg[key]!r}')
    if cfg['log_to'] or cfg['run_name'] is not None or cfg['project'] is not None:
        from harness import trackers    # here: a run without trackers never imports them
        trackers.check_log_to(cfg)      # log_to, run_name, project; the named libraries import


def is_count(value):
    """True for an int that is not a bool (True is an int to Python, not a count to a setting)."""
    return isinstance(value, int) and not isinstance(value, bool)


def count_from(low, high=None, none=''):
    """A rule: None (which means `none`, when said) or an int, not a bool, from `low` (to `high`)."""
    what = f'an int >= {low}' if high is None else f'an int from {low} to {high}'
    return (lambda v: v is None or is_count(v) and low <= v <= (high or v),
            f'None ({none}) or {what}' if none else f'None or {what}')


def is_number(value):
    """True for an int or a float that is not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# Each setting's rule: (whether a value keeps it, what the value must be, in the error's words)
RULES = {
    **{k: (lambda v, c=c: v in c, 'one of ' + ', '.join(map(repr, c))) for k, c in SETTING_CHOICES.items()},
    **{k: (lambda v, low=low: v >= low, f'>= {low}') for k, low in AT_LEAST.items()},
    'mixing_weight_decay': (lambda v: v is None or is_number(v) and v >= 0, 'a number >= 0 or None'),
    'learning_rate': (lambda v: v > 0, '> 0'),
    'lr_decay_iters': count_from(1),
    'beta1': (lambda v: 0 <= v < 1, 'in [0, 1)'),
    'beta2': (lambda v: 0 <= v < 1, 'in [0, 1)'),
    'threads': count_from(1, MAX_THREADS, 'chosen by measuring'),
    'fft_threshold': count_from(1, none="the device's own"),
    'chunk_size': count_from(1, none="the device's own"),
    'out_dir': (lambda v: bool(v.strip()), "a folder's name"),
    'data_dir': (lambda v: bool(v.strip()), "a folder's name"),
}


def resolve_settings(overrides, defaults, model_keys=tuple(k for k in MODEL_KEYS if k not in TUNING_KEYS)):
    """The run's settings -> (settings dict, checkpoint dict or None): defaults < the variant's
    (mixer.VARIANTS) < config files and --key=value for a fresh run; for init_from='resume', the saved run's
    settings (ckpt['config'], and its architecture ckpt['model_config']) < the explicit overrides, each
    change printed; a resume at max_iters has nothing to do (one line, exit 0). Model settings cannot change
    on resume; that and an unreadable checkpoint are one-line errors, exit 2."""
    cfg = dict(defaults)
    var = overrides.get('variant', cfg['variant'])
    if var not in mixer.VARIANTS:
        fail(f'unknown variant {var!r}; choose from {", ".join(mixer.VARIANTS)}')
    cfg.update(mixer.VARIANTS[var])
    cfg.update(overrides)
    if cfg['init_from'] != 'resume':
        return cfg, None
    from harness.loading import EXPORT_FILES, CheckpointError, read_checkpoint  # here: a fresh run reads none
    ckpt_path = os.path.join(cfg['out_dir'], 'ckpt.pt')
    if os.path.isdir(ckpt_path):            # an exported folder put where the run's checkpoint goes, say
        exported = any(os.path.exists(os.path.join(ckpt_path, f)) for f in EXPORT_FILES)
        fail(f'--init_from=resume but {ckpt_path} is a folder, not the checkpoint file train.py writes'
             + ('; a folder experiments/convert.py exported holds no optimiser or RNG state to resume: '
                'resume from the checkpoint it was exported from' if exported else ''))
    if not os.path.isfile(ckpt_path):
        fail(f'--init_from=resume but {ckpt_path} does not exist')
    try:
        ckpt = read_checkpoint(ckpt_path, keys=('config', 'step', 'best_val_loss', 'rng'))
    except CheckpointError as e:
        fail(str(e))
    saved = {k: v for k, v in ckpt.get('config', {}).items() if k in defaults}
    # the architecture; a field added since the checkpoint was made has its default (what the model had then)
    saved.update({k: ckpt['model_config'].get(k, defaults.get(k)) for k in [*model_keys, 'task']})
    cfg = {**defaults, **saved, 'init_from': 'resume', 'out_dir': cfg['out_dir']}
    master = int(os.environ.get('RANK', 0)) == 0
    if master:
        print(f'resuming {ckpt_path} with its saved settings')
    for k, v in overrides.items():
        if k in ('init_from', 'out_dir') or v == cfg[k]:
            continue
        if k in model_keys or k in ('task', 'variant'):
            fail(f'{k} cannot change on resume (saved {cfg[k]!r}, asked {v!r})')
        if master:
            print(f'  changed on resume: {k} = {v!r} (saved run: {cfg[k]!r})')
        cfg[k] = v
    if cfg['max_iters'] < ckpt['step']:
        fail(f'max_iters={cfg["max_iters"]} is below the checkpoint\'s step {ckpt["step"]}')
    if cfg['max_iters'] == ckpt['step']:           # a finished run: no second evaluation and summary
        if master:
            print(f'train.py: nothing to do: {ckpt_path} holds step {ckpt["step"]}, max_iters is '
                  f'{cfg["max_iters"]} (a larger --max_iters trains on)')
        sys.exit(0)
    return cfg, ckpt


if __name__ == '__main__':
    fail("train.py's settings, not a command: python train.py --help lists them", 'harness/configurator.py')
