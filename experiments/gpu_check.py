"""The first run on a GPU: everything the CUDA path does, in one command, into one folder.

    python -m experiments.gpu_check                                   # data/tinystories, out/gpu_check
    python -m experiments.gpu_check --text_dir ../shared/data/tinystories --out out/gpu_check

On a machine with one CUDA GPU, in about 10 minutes, with only the repository and the
TinyStories text beside it, it runs in turn (each step with its own time limit; a step
that fails is reported and the next one runs):
  1. the suite's GPU-able tests on CUDA (MIXER_TEST_DEVICE=cuda: every kind's causality and
     cached and static decoding under bf16 autocast, tolerance 4 bf16 ulps of the logits'
     scale; the compiled paths; the CUDA-path tests);
  2. the CPU config, then config/mixer_gpu.py and config/transformer_gpu.py, a few hundred steps
     each, eager and compiled (tokens/s and MFU against the GPU's nominal peak, from the logs);
  3. an exact resume: N steps straight against N/2, stop, resume to N (the same final loss);
  4. torchrun --nproc_per_node=1 (NCCL);
  5. bench.py's tables: training throughput and MFU, memory against n_ctx up to 16384, decode
     against the weight-read limit at the measured bandwidth, the token-mixing paths (the
     fft_threshold and chunk_size to put in machine.DEVICE_TUNING['cuda']).
Output: OUT/report.md (a summary line a step and the tables) and every step's console in
OUT/<step>.txt. Without a GPU it says so in one line and exits 2.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import torch

from experiments.runner import ROOT, fmt_s, md_table, say

TRAIN_STEPS = 300


def fail(msg):
    """Print a one-line error and exit with status 2."""
    print(f'gpu_check: error: {msg}', file=sys.stderr)
    sys.exit(2)


def step(out, name, args, limit_s, env=None):
    """Run `python args...` from the repository root, console to OUT/name.txt, at most limit_s
    seconds -> (ok: bool, seconds, console text)."""
    t0 = time.time()
    path = os.path.join(out, f'{name}.txt')
    try:
        with open(path, 'w') as f:
            rc = subprocess.run([sys.executable, *args], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                timeout=limit_s, env={**os.environ, **(env or {})}).returncode
    except subprocess.TimeoutExpired:
        rc = 'timeout'
    text = open(path).read()
    say(f'  {name}: {"ok" if rc == 0 else f"FAILED ({rc})"} in {fmt_s(time.time() - t0)}')
    return rc == 0, time.time() - t0, text


def summary_of(out_dir):
    """(final val loss, tokens/s, MFU) from a train.py run's log, or Nones."""
    path = os.path.join(out_dir, 'log.jsonl')
    if not os.path.isfile(path):
        return None, None, None
    s = [json.loads(l) for l in open(path) if '"summary"' in l]
    return (s[-1]['final_val_loss'], s[-1]['tokens_per_s'], s[-1]['mfu']) if s else (None, None, None)


def prepare(args, out, rows):
    """The data dir: --data_dir if prepared, else prepared from --text_dir into OUT/data."""
    if os.path.isfile(os.path.join(args.data_dir, 'meta.json')):
        return os.path.abspath(args.data_dir)
    data = os.path.join(out, 'data')
    ok, s, _ = step(out, 'prepare', ['data/prepare.py', '--train', os.path.join(args.text_dir, 'train.txt'),
                                     '--valid', os.path.join(args.text_dir, 'valid.txt'), '--out', data], 300)
    rows.append(['prepare the data', 'ok' if ok else 'FAILED', fmt_s(s), data])
    return data


def train_runs(args, out, data, rows):
    """Step 2: the three configs, eager and compiled, TRAIN_STEPS steps each."""
    for config in ('tinystories_cpu', 'mixer_gpu', 'transformer_gpu'):
        for compiled in (False, True):
            name = f'train_{config}_{"compiled" if compiled else "eager"}'
            run_dir = os.path.join(out, name)
            ok, s, _ = step(out, name, ['train.py', f'config/{config}.py', f'--data_dir={data}',
                                        f'--out_dir={run_dir}', '--overwrite=True', '--device=cuda',
                                        f'--max_iters={TRAIN_STEPS}', f'--eval_interval={TRAIN_STEPS}',
                                        '--eval_windows=32', '--log_interval=25', f'--compile={compiled}'], 240)
            loss, tok_s, mfu = summary_of(run_dir)
            rows.append([name, 'ok' if ok else 'FAILED', fmt_s(s), f'val loss {loss:.4f}, {tok_s:,.0f} tokens/s, '
                         f'MFU {100 * mfu:.1f}% (nominal peak)' if loss is not None else '-'])


def resume_and_ddp(args, out, data, rows):
    """Steps 3 and 4: an exact resume, and torchrun with one NCCL process."""
    base = ['train.py', 'config/tinystories_cpu.py', f'--data_dir={data}', '--device=cuda', '--eval_interval=20',
            '--eval_windows=16', '--log_interval=10']
    straight, split = os.path.join(out, 'resume_straight'), os.path.join(out, 'resume_split')
    ok1 = step(out, 'resume_straight', [*base, f'--out_dir={straight}', '--overwrite=True', '--max_iters=40'], 120)[0]
    ok2 = step(out, 'resume_first_half', [*base, f'--out_dir={split}', '--overwrite=True', '--max_iters=20'], 120)[0]
    ok3 = step(out, 'resume_second_half', [*base, f'--out_dir={split}', '--init_from=resume', '--max_iters=40'], 120)[0]
    a, b = summary_of(straight)[0], summary_of(split)[0]
    same = a is not None and b is not None and abs(a - b) <= 1e-4 * abs(a)
    rows.append(['resume equals the straight run', 'ok' if ok1 and ok2 and ok3 and same else 'FAILED', '-',
                 f'{a} vs {b}'])
    ddp = os.path.join(out, 'torchrun_nccl')
    ok, s, _ = step(out, 'torchrun_nccl', ['-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=1',
                                           *base, f'--out_dir={ddp}', '--overwrite=True', '--max_iters=40'], 180)
    rows.append(['torchrun --nproc_per_node=1 (NCCL)', 'ok' if ok else 'FAILED', fmt_s(s),
                 f'val loss {summary_of(ddp)[0]}'])


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument('--data_dir', default=os.path.join('data', 'tinystories'), help='prepared data, if there is one')
    p.add_argument('--text_dir', default=os.path.join('..', 'shared', 'data', 'tinystories'),
                   help='train.txt and valid.txt, prepared into OUT/data when --data_dir has no meta.json')
    p.add_argument('--out', default=os.path.join('out', 'gpu_check'), help='output folder')
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        fail('no GPU here (torch.cuda.is_available() is False): run it on a machine with a CUDA GPU')
    out = os.path.abspath(args.out)
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        fail(f'cannot write {out} ({e})')
    t0, rows = time.time(), []
    machine_line = (f'{torch.cuda.get_device_name()}; torch {torch.__version__}, CUDA {torch.version.cuda}, '
                    f'cuDNN {torch.backends.cudnn.version()}')
    say(f'gpu_check on {machine_line}; output in {out}')
    ok, s, text = step(out, 'tests', ['test_mixer.py', 'test_compile', 'test_gpu_path', 'test_model'], 300,
                       env={'MIXER_TEST_DEVICE': 'cuda'})
    rows.append(['tests on CUDA (bf16 causality and decoding, compiled paths)', 'ok' if ok else 'FAILED', fmt_s(s),
                 text.strip().splitlines()[-1] if text.strip() else '-'])
    data = prepare(args, out, rows)
    train_runs(args, out, data, rows)
    resume_and_ddp(args, out, data, rows)
    ok, s, bench_md = step(out, 'bench', [
        '-m', 'experiments.bench', '--device', 'cuda', '--compile', '--tables', 'train,memory,decode,paths',
        '--variants', 'flat,toeplitz,recurrent,transformer', '--d_model', '1024', '--n_layer', '8', '--n_ctx', '512',
        '--batch_size', '32', '--mem_lengths', '1024,2048,4096,8192,16384', '--mem_batch', '8', '--mem_scope', 'block',
        '--decode_sizes', '512x8,1024x8', '--path_lengths', '256,512,1024,2048,4096,8192'], 420)
    rows.append(['bench tables', 'ok' if ok else 'FAILED', fmt_s(s), 'below'])
    bench_md = bench_md[bench_md.find('# bench.py'):] if '# bench.py' in bench_md else bench_md[-3000:]
    report = '\n'.join([f'# GPU check\n\n{machine_line}; {fmt_s(time.time() - t0)} in all.\n',
                        md_table(['step', 'result', 'time', 'numbers'], rows), '', bench_md])
    with open(os.path.join(out, 'report.md'), 'w') as f:
        f.write(report)
    print(report)
    say(f'gpu_check: done in {fmt_s(time.time() - t0)}; report in {os.path.join(out, "report.md")}')
    sys.exit(0 if all(r[1] == 'ok' for r in rows) else 1)


if __name__ == '__main__':
    main()
