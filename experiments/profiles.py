"""Where the time of the two hot loops goes, by torch.profiler: the compiled decode step and one
training step, printed as markdown tables (progress on stderr).

    python -m experiments.profiles --device cuda --what decode --decode_variants flat,recurrent --d_model 1024 --n_layer 8
    python -m experiments.profiles --device cuda --what train --train config/mixer_gpu.py --data_dir data/tinystories

1. Decode step: sample.Decoder(compile=True) of each kind at batch 1 (on CUDA the compiled
   step is a CUDA graph: sample.py), compiled and warmed up on a prompt of n_ctx / 4 tokens, then
   --tokens steps timed without the profiler (median ms) and --tokens steps profiled. Per token:
   the torch ops the host dispatches (aten::, outermost only), the CUDA graphs launched
   (cudaGraphLaunch: is the graph replayed?), the kernels launched outside a graph
   (cudaLaunchKernel and kin), host-device copies, and the kernels that ran on the device; then
   the ops with the most self device time (self CPU time on a CPU) a token. The question it
   answers: how far is the step from the weight-read limit (bench.py's decode table), and is the
   rest host time or device time?
2. Training step: train.py's own build_run and train_step for a config (compiled if the config
   says so), --train_warmup steps, then --train_steps timed (median ms, tokens/s, MFU against
   machine.peak_flops: the datasheet peak on known GPUs) and one step profiled: the ops with the
   most self device time, each op's share of the step's device time (matmuls, the mixing, the
   optimizer's kernels).
Measurements, not assertions: nothing here fails on a slow number.
"""

import os
import shlex
import statistics
import sys
import time

if __name__ == '__main__':       # run as a file too (python experiments/profiles.py): the repository root on
    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the path, as -m puts it
    from harness import cli                   # and from here Ctrl-C is one line, torch's import included
    cli.begin('profiles.py')

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from harness import machine
import mixer
import sample
from harness.flags import ArgumentParser, number
from harness.flags import listing
from experiments.bench import device_and_dtype
from experiments.bench_decode import build, decode_ms, graphs_compiled
from experiments.runner import md_table, say, time_calls, train_run

LAUNCHES = {'graphs': ('cudaGraphLaunch', 'cuGraphLaunch'),
            'kernels': ('cudaLaunchKernel', 'cudaLaunchKernelExC', 'cuLaunchKernel', 'cuLaunchKernelEx'),
            'copies': ('cudaMemcpyAsync', 'cudaMemcpy', 'cuMemcpyAsync')}
TOP = 8                    # ops listed a profile


def activities(device):
    """The profiler's activities on `device`: the CPU, and CUDA's kernels on a GPU."""
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == 'cuda' else [])


def self_time(avg, device):
    """An op's self time (us) on the device (CUDA) or the CPU, from a key_averages() entry."""
    return avg.self_device_time_total if device.type == 'cuda' else avg.self_cpu_time_total


def top_ops(prof, device, per):
    """The TOP ops by self time of a profile -> rows [op, calls per `per`, self us per `per`, share
    of all ops' self time] (the device's time on CUDA, the host's on a CPU)."""
    avgs = [a for a in prof.key_averages() if self_time(a, device) > 0]
    total = sum(self_time(a, device) for a in avgs) or 1.0
    avgs.sort(key=lambda a: -self_time(a, device))
    return [[a.key[:70].replace('|', '/'), f'{a.count / per:.1f}', f'{self_time(a, device) / per:.1f}',
             f'{100 * self_time(a, device) / total:.1f}%'] for a in avgs[:TOP]]


def outermost(event):
    """True if no aten:: op encloses this profiler event (it was dispatched, not called by one)."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith('aten::'):
            return False
        parent = parent.cpu_parent
    return True


def host_counts(prof, tokens):
    """Per token of a profile: outermost aten ops, CUDA graph launches, kernel launches outside a
    graph, host-device copies, device kernels -> dict of floats."""
    events = prof.events()
    n = {k: sum(e.name in names for e in events) / tokens for k, names in LAUNCHES.items()}
    n['ops'] = sum(e.name.startswith('aten::') and outermost(e) for e in events) / tokens
    n['device'] = sum(e.device_type == DeviceType.CUDA for e in events) / tokens
    return n


@torch.no_grad()
def profile_decode(args):
    """Print the decode-step profile of each of --decode_variants (see the module docstring)."""
    wait = lambda: machine.sync(args.device)          # noqa: E731
    counts, tops = [], []
    for name in args.decode_variants:
        say(f'profile: decode, {name}')
        torch._dynamo.reset()
        model = build(name, args, d_model=args.d_model, n_layer=args.n_layer, n_ctx=args.n_ctx).eval()
        prompt = torch.randint(args.vocab_size, (1, args.n_ctx // 4), device=args.device)
        with machine.autocast(args.device, args.dtype):      # the Decoder made under the autocast it steps in
            dec, graphs = sample.Decoder(model, compile=True, backend=args.backend), graphs_compiled()
            ms = decode_ms(dec.step, prompt[:, :args.n_ctx // 8], args.tokens, wait, dec.threads)     # compiles, warms up
            for t in range(args.n_ctx // 8, args.n_ctx // 4):                               # the prompt's rest
                logits = dec.step(prompt[:, t:t + 1])
            wait()
            with profile(activities=activities(args.device)) as prof:
                for _ in range(args.tokens):
                    logits = dec.step(logits.argmax(-1, keepdim=True))
                wait()
        n = host_counts(prof, args.tokens)
        counts.append([name, f'{args.d_model} x {args.n_layer}', f'{ms:.3f}', f'{n["ops"]:.1f}', f'{n["graphs"]:.2f}',
                       f'{n["kernels"]:.1f}', f'{n["copies"]:.1f}', f'{n["device"]:.1f}', graphs_compiled() - graphs])
        tops += [[name] + row for row in top_ops(prof, args.device, args.tokens)]
    where = 'device' if args.device.type == 'cuda' else 'CPU'
    print(f'## Decode step profile\n\n_sample.Decoder(compile=True, backend {args.backend}), batch 1, n_ctx '
          f'{args.n_ctx}, {args.dtype}, {args.device.type}; ms/token: median of {args.tokens} steps without the '
          f'profiler; the rest per token over {args.tokens} profiled steps. host ops: aten:: ops dispatched (no '
          f'aten op around them); graph launches: cudaGraphLaunch (1 a token: the step is one CUDA graph '
          f'replayed); kernel launches: outside a graph; device kernels: all that ran, in graphs or not._\n')
    print(md_table(['variant', 'd_model x n_layer', 'ms/token', 'host ops', 'graph launches', 'kernel launches',
                    'host-device copies', 'device kernels', 'compiles'], counts) + '\n')
    print(f'Top ops by self {where} time a token:\n')
    print(md_table(['variant', 'op', 'calls a token', f'self {where} us a token', 'share'], tops) + '\n', flush=True)


def profile_train(args):
    """Print the training-step profile of --train (see the module docstring)."""
    argv = [args.train, f'--data_dir={args.data_dir}', f'--device={args.device}', *shlex.split(args.train_args)]
    run, cfg, step = train_run(argv)
    env = run.env
    say(f'profile: train {args.train}, {args.train_warmup} warm-up steps (compile: {cfg["compile"]})')
    warm_s = sum(time_calls(step, args.train_warmup, device=env.dev))
    times = time_calls(step, args.train_steps, device=env.dev)
    with profile(activities=activities(torch.device(env.dev))) as prof:
        step()
        machine.sync(env.dev)
    ms = 1e3 * statistics.median(times)
    tokens = cfg['batch_size'] * cfg['grad_accum'] * cfg['n_ctx']
    peak, what = machine.peak_flops(env.dev, torch.bfloat16 if env.dtype == 'bfloat16' else torch.float32)
    mfu = machine.flops_per_token(run.raw_model, cfg['n_ctx']) * tokens / (ms / 1e3) / peak
    where = 'device' if env.cuda else 'CPU'
    print(f'## Training step profile\n\n_`python train.py {args.train}` ({cfg["variant"]}, d_model {cfg["d_model"]}, '
          f'{cfg["n_layer"]} layers, n_ctx {cfg["n_ctx"]}, {cfg["batch_size"]} x {cfg["grad_accum"]} windows a step, '
          f'{env.dtype}, compile {cfg["compile"]}) on {env.dev}: train.train_step, median of {args.train_steps} '
          f'steps after {args.train_warmup} warm-up ({warm_s:.0f} s), then one step profiled. MFU against '
          f'{what}._\n')
    print(md_table(['ms/step', 'tokens/s', 'MFU'], [[f'{ms:.1f}', f'{tokens / (ms / 1e3):,.0f}',
                                                      machine.fmt_mfu(mfu)]]) + '\n')
    print(f'Top ops by self {where} time of the profiled step:\n')
    print(md_table(['op', 'calls', f'self {where} us', 'share'], top_ops(prof, torch.device(env.dev), 1)) + '\n',
          flush=True)


def parse_args(argv=None):
    """Command-line flags (flags.ArgumentParser: a bad flag is one line, exit 2)."""
    p = ArgumentParser('profiles.py', __doc__)
    count = number(int, 1)
    p.add_argument('--what', type=listing(str, ('decode', 'train'), what='profile'), default='decode,train',
                   help='profiles to print, comma separated')
    p.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    p.add_argument('--dtype', choices=('fp32', 'bf16'), help='decode profile; default: bf16 on CUDA, fp32 on CPU')
    p.add_argument('--decode_variants', type=listing(str, tuple(mixer.VARIANTS), what='variant'),
                   default='flat,recurrent', help='kinds of the decode profile')
    p.add_argument('--d_model', type=count, default=1024)
    p.add_argument('--n_layer', type=count, default=8)
    p.add_argument('--n_ctx', type=number(int, 8), default=512)
    p.add_argument('--vocab_size', type=count, default=4096)
    p.add_argument('--tokens', type=count, default=32, help='decode steps timed, and profiled')
    p.add_argument('--backend', default='inductor', help='torch.compile backend of the decode step (eager: a fast '
                   'trace-only check)')
    p.add_argument('--train', default='config/mixer_gpu.py', help='the config of the training profile')
    p.add_argument('--data_dir', default='data/tinystories', help='prepared data of the training profile')
    p.add_argument('--train_args', default='', help='more train.py settings, e.g. "--batch_size=64"')
    p.add_argument('--train_warmup', type=number(int, 0), default=3,
                   help='training steps before the clock (compilation)')
    p.add_argument('--train_steps', type=count, default=5, help='training steps timed')
    args = p.parse_args(argv)
    device_and_dtype(p, args)
    if args.n_ctx // 4 + 2 * args.tokens > args.n_ctx:
        p.error(f'--tokens: the prompt (n_ctx / 4) and twice the tokens must fit n_ctx={args.n_ctx}')
    return args


def main(argv=None):
    args = parse_args(argv)
    print(f'# profiles.py\n\n{args.device}; torch {torch.__version__}\n')
    for what, fn in (('decode', profile_decode), ('train', profile_train)):
        if what in args.what:
            t0 = time.perf_counter()
            fn(args)
            say(f'{what}: {time.perf_counter() - t0:.0f} s')


if __name__ == '__main__':
    from harness.cli import run_command
    sys.exit(run_command('profiles.py', main, sys.argv[1:]))
