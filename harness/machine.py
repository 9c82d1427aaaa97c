"""The machine under train.py and bench.py: the device, the processes and the precision;
FLOPs per token and the peak they are measured against (MFU); the CPU's precision, threads and load.

    env = setup_device(cfg)                # cfg: train.py's settings; starts DDP under torchrun
    mfu = flops_per_token(model) * tokens_per_s / peak_flops(env.dev, dtype)
"""

import ctypes
import datetime
import gc
import os
import sys
import time
from contextlib import nullcontext
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn as nn

import mixer
from harness.cli import fail


def keep_freed_memory():
    """Make glibc's malloc (Linux) serve blocks up to 1 GiB from its heap and keep freed memory, not mmap a
    block over 32 MiB afresh each time (the CPU config's [2048, 4096] fp32 logits, their softmax and
    gradient come and go every step, each new mapping page-faulted in at a few GB/s; measured on 2 cores:
    a CPU-config step about 250 -> 170 ms). Freed memory stays with the process. -> True if applied,
    False without glibc (macOS, Windows, musl); never raises."""
    try:
        libc = ctypes.CDLL('libc.so.6')
    except OSError:
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    return bool(libc.mallopt(M_MMAP_THRESHOLD, 1 << 30) and libc.mallopt(M_TRIM_THRESHOLD, 1 << 30))


# ----------------------------------------------------------------------------- FLOPs and peaks

def flops_per_token(model, T=None):
    """Training FLOPs per token (forward + backward = 3 x forward) of a mixer.py model at length T
    (default n_ctx): 2 per weight of every nn.Linear (the LM head included) plus each block's sequence
    mixing's own products (its flops(T): counted as computed, e.g. the flat mixer's whole T x T product,
    zeros included). Norms, activations and the embedding lookup are not counted."""
    T = T or model.cfg.n_ctx
    fwd = sum(2 * m.in_features * m.out_features for m in model.modules() if isinstance(m, nn.Linear))
    fwd += sum(m.mixing.flops(T) for m in model.modules() if isinstance(m, mixer.Block))
    return 3 * fwd


# Nominal dense bf16 peak (FLOP/s, datasheet, no sparsity) by torch.cuda.get_device_name(), matched exactly:
# a substring would give an H100 PCIe (756) or NVL (835) the SXM's 989, and an L40S the L4's 121.
NOMINAL_PEAK = {
    'NVIDIA H100 80GB HBM3': 989e12, 'NVIDIA H100 PCIe': 756e12, 'NVIDIA H100 NVL': 835e12,
    'NVIDIA H200': 989e12, 'NVIDIA H200 NVL': 835e12,
    'NVIDIA A100-SXM4-80GB': 312e12, 'NVIDIA A100-SXM4-40GB': 312e12, 'NVIDIA A100-PCIE-40GB': 312e12,
    'NVIDIA A100 80GB PCIe': 312e12, 'NVIDIA A10': 125e12, 'NVIDIA L4': 121e12, 'NVIDIA L40': 181e12,
    'NVIDIA L40S': 362e12,
}


def matmul_size(device):
    """The side n of the n x n x n products measure_matmul_flops times by default on `device`: 8192 on CUDA
    (enough to fill a GPU), 512 on the CPU (on this project's 2-core AMD EPYC, one float32 thread, ten
    measurements of each, interleaved: 512^3 products over 0.25 s gave a median 97.3 GFLOP/s, sd 5.7, for
    0.27 s of CPU; 1024^3 over 1 s 85.6, sd 4.7, for 1.15 s; 1024^3 over 0.25 s 82.0, sd 10.2)."""
    return 8192 if torch.device(device).type == 'cuda' else 512


def measure_matmul_flops(device='cpu', dtype=torch.float32, n=None, seconds=0.25):
    """Measured dense matmul throughput of this machine, FLOP/s (float): the median of batches of 4 n x n x n
    products of `dtype` on `device` (n: matmul_size(device) by default) over about `seconds`, after 3 warm-up
    products (the median, not the best: a run's MFU should not move with one lucky batch). A GPU is measured
    as GPUs are: products large enough to fill it, timed by CUDA events around the queued work (1024^3 bf16
    products timed by the host clock gave an H200 150 TFLOP/s, where 8192^3 products run at about 790). A CPU:
    one torch thread's rate, timed by its own CPU clock (time.thread_time counts no time other processes take
    the core: by the wall clock, a second of a shared 2-core machine halved the peak), times the threads, at
    most the cores this process may use (cpu_share: threads beyond them add no FLOPs)."""
    cuda, threads = torch.device(device).type == 'cuda', torch.get_num_threads()
    n, clock = n or matmul_size(device), time.perf_counter if cuda else time.thread_time
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    torch.set_num_threads(threads if cuda else 1)
    for _ in range(3):
        a @ b
    if cuda:
        torch.cuda.synchronize(device)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    rates = []
    start = clock()
    while clock() - start < seconds or len(rates) < 3:
        if cuda:
            begin.record()
        t = clock()
        for _ in range(4):
            a @ b
        if cuda:
            end.record()
            end.synchronize()
            elapsed = begin.elapsed_time(end) / 1e3          # ms -> s, the GPU's own clock
        else:
            elapsed = clock() - t
        rates.append(4 * 2 * n ** 3 / max(elapsed, 1e-9))
    torch.set_num_threads(threads)
    median = sorted(rates)[len(rates) // 2]
    return median if cuda else median * min(threads, cpu_share())


def fmt_mfu(mfu):
    """An MFU (achieved FLOP/s over a peak, float) as '43.9%'; None 'n/a'; above 1 (a peak below what the
    model achieved, e.g. a GPU measured with products too small to fill it) 'n/a (peak below ...)'."""
    if mfu is None:
        return 'n/a'
    return f'{100 * mfu:.1f}%' if mfu <= 1 else 'n/a (peak below the achieved rate)'


def nominal_peak(device):
    """Nominal bf16 dense FLOP/s of the CUDA device's model (NOMINAL_PEAK, exact name), or None if
    unknown or not CUDA."""
    if not str(device).startswith('cuda'):
        return None
    return NOMINAL_PEAK.get(torch.cuda.get_device_name(device).strip())


_MEASURED_PEAK = {}      # (device, dtype, torch threads) -> FLOP/s, measured once a process


def peak_flops(device, dtype):
    """The peak MFU is reported against -> (FLOP/s, what it is): a GPU's nominal dense bf16 peak where
    NOMINAL_PEAK knows it (MFU's convention: the datasheet, not what a library reaches), else this machine's
    measured `dtype` matmul peak (measure_matmul_flops, about 0.3 s), measured once a process for each
    device, dtype and thread count: a pool process of claims.py trains dozens of runs."""
    nominal = nominal_peak(device)
    if nominal:
        name = torch.cuda.get_device_name(device)
        return nominal, f'the nominal bf16 dense peak of {name}, {nominal / 1e12:.0f} TFLOP/s'
    key = (str(device), dtype, torch.get_num_threads())
    if key not in _MEASURED_PEAK:
        _MEASURED_PEAK[key] = measure_matmul_flops(device, dtype)
    measured = _MEASURED_PEAK[key]
    return measured, (f'the measured {str(dtype).split(".")[-1]} matmul peak, {measured / 1e9:.0f} GFLOP/s '
                      'per process')


# Settings that change speed, never results, tuned per device type (bench.py's "Token-mixing paths"
# table measures them; the numbers: docs/performance.md): the Toeplitz mixing's FFT threshold and the
# recurrent mixing's and linear attention's chunk. The CPU's are mixer.ModelConfig's defaults (measured on
# 2 cores); a GPU's differ. CUDA: on one H200 (batch 32,
# d_model 1024, 4 heads, bf16, forward + backward), the Toeplitz FFT beat the T x T matrix from T = 128 on
# (at 64 the two were even); the recurrent mixing in one chunk beat chunks of 256 at every length, and at
# 4096 chunks of 2048 were as fast as one: chunks of 2048, one chunk for every training length up to 2048.
# Not longer: linear attention shares chunk_size, and its chunk holds a [B, H, C, C] product, at C = 8192
# naive attention's memory.
DEVICE_TUNING = {'cuda': dict(fft_threshold=128, chunk_size=2048)}


def device_tuning(kind):
    """The speed settings of a device type ('cpu', 'cuda') -> {'fft_threshold', 'chunk_size'}:
    DEVICE_TUNING's, else mixer.ModelConfig's defaults."""
    fields = mixer.ModelConfig.__dataclass_fields__
    return {k: DEVICE_TUNING.get(kind, {}).get(k, fields[k].default) for k in ('fft_threshold', 'chunk_size')}


def check_memory(model_cfg, env):
    """Exit 2 with one line (train.py's) when training the model of model_cfg (a mixer.ModelConfig) needs more
    than the device's memory: 16 bytes a parameter (its float32 weight, gradient and two Adam moments),
    counted on the meta device (nothing allocated)."""
    with torch.device('meta'):
        n = mixer.build_model(model_cfg).num_params()
    if why := memory_error(16 * n, env.dev, f'training the model of {n:,} parameters'):
        fail(why)


def memory_error(need, device, what):
    """None if `need` bytes fit the memory of `device` (a GPU's own, else the machine's physical memory), else
    one line: what `what` would need and what the device has (train.py's model, bench.py's tables)."""
    dev = torch.device(device)
    have = (torch.cuda.get_device_properties(dev).total_memory if dev.type == 'cuda'
            else os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES'))
    if need > have:
        return (f'{what} would need {need / 2 ** 30:,.1f} GiB, more than the {have / 2 ** 30:,.1f} GiB '
                f'{dev} has')


# ----------------------------------------------------------------------------- device and processes

def setup_device(cfg):
    """The device, the processes (torchrun sets RANK / WORLD_SIZE / LOCAL_RANK; DDP is started here, NCCL on
    CUDA, gloo on CPU) and the precision of train.py's settings cfg -> SimpleNamespace(dev, cuda, ddp, rank,
    world, local, master, dtype ('float32' | 'bfloat16': float32 with dtype='auto' on a CPU until the tuning
    chooses), autocast context, tuning: a Tuning (the CPU's precision with dtype='auto', and its threads:
    fixed by cfg['threads'] or OMP_NUM_THREADS set by the user, not torchrun's 1; on CUDA as they are)). dev
    always names its GPU ('cuda:N'): a bare 'cuda' or 'auto' on a CUDA machine is the current device (cuda:0
    unless CUDA_VISIBLE_DEVICES or the caller chose another), under torchrun cuda:LOCAL_RANK; CUDA calls that
    want an index (torch.cuda.set_device) get one. An unavailable device: one-line error, exit 2."""
    ddp = int(os.environ.get('RANK', -1)) != -1
    dev = cfg['device']
    if dev == 'auto':
        dev = 'cuda' if torch.cuda.is_available() else 'cpu'
    try:
        kind = torch.device(dev).type
    except RuntimeError:
        fail(f"unknown device {dev!r}: use 'auto', 'cpu', 'cuda' or 'cuda:N'")
    if kind not in ('cpu', 'cuda'):
        fail(f"device {dev!r} is not supported: use 'auto', 'cpu', 'cuda' or 'cuda:N'")
    cuda = kind == 'cuda'
    if cuda and not torch.cuda.is_available():
        fail(f'device {dev} requested but CUDA is not available')
    if dev == 'cpu':                   # before any thread starts (gloo's included)
        keep_freed_memory()            # large per-step tensors: no page faults each step
    rank, world, local = 0, 1, 0
    if ddp:
        rank, world, local = (int(os.environ[k]) for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK'))
        if cuda:
            dev = f'cuda:{local}'
            torch.cuda.set_device(dev)
        dist.init_process_group(backend='nccl' if cuda else 'gloo',
                                timeout=datetime.timedelta(seconds=cfg.get('ddp_timeout', 300)))
    elif cuda:
        # Without torchrun: make the device current, or every argument-less call (synchronize, the
        # caches) would use GPU 0; torch.cuda.set_device refuses a device without an index.
        if torch.device(dev).index is None:
            dev = f'cuda:{torch.cuda.current_device()}'
        try:
            torch.cuda.set_device(dev)
        except (RuntimeError, ValueError) as e:
            fail(f'device {dev}: {str(e).splitlines()[0]}')
    dtype = cfg['dtype'] if cfg['dtype'] != 'auto' else ('bfloat16' if cuda else 'float32')
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    env = SimpleNamespace(dev=dev, cuda=cuda, ddp=ddp, rank=rank, world=world, local=local, master=rank == 0,
                          dtype=dtype, autocast=autocast(dev, dtype))
    env.tuning = Tuning(env, cfg['dtype'], cfg.get('threads'))
    return env


def end_ddp(clean):
    """End this process's part of a DDP run: wait for every rank when it ended `clean` (rank 0 may still be
    saving), collect the garbage (DDP sits in reference cycles: freed at interpreter exit, after gloo's
    threads, it aborted about one run in 20 with SIGABRT), then destroy the process group."""
    if clean:
        dist.barrier()
    gc.collect()
    dist.destroy_process_group()


def collective_failure(e, cfg, env):
    """A DDP collective that failed (RuntimeError e) because another rank stalled or died -> one line naming
    it, else None (train.main stops the run with it)."""
    text = str(e)
    if 'timed out' in text.lower() or 'timeout' in text.lower():
        return f'rank {env.rank}: a collective waited ddp_timeout={cfg["ddp_timeout"]} s for the other ranks'
    for sign, what in (('Connection closed by peer', 'its connection closed'),
                       ('Connection reset', 'its connection was reset'), ('Broken pipe', 'a broken pipe'),
                       ('NCCL', 'an NCCL error')):
        if sign in text:
            return f'rank {env.rank}: another rank left the run ({what})'
    return None


def autocast(device, dtype):
    """The context the forward passes of train.py and bench.py run under: bf16 autocast on `device`
    (a torch.device or a name, 'cuda:1') when dtype is 'bfloat16' or 'bf16', else a no-op context."""
    if dtype in ('bfloat16', 'bf16'):
        return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)
    return nullcontext()


# ----------------------------------------------------------------------------- the CPU's threads

def cpu_share():
    """The CPU cores this process may use: those of its affinity mask, divided among torchrun's processes on
    this machine (LOCAL_WORLD_SIZE) -> int >= 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1
    return max(1, cores // int(os.environ.get('LOCAL_WORLD_SIZE', 1)))


def cpu_sample():
    """The machine's CPU time so far (Linux /proc/stat: all cores' ticks, and their idle and iowait ticks) and
    this process's -> (total ticks, idle ticks, this process's CPU seconds); None without /proc/stat."""
    try:
        with open('/proc/stat') as f:
            ticks = [int(t) for t in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return sum(ticks), ticks[3] + ticks[4], time.process_time()


def idle_cores():
    """The machine's idle CPU cores since the last call (cpu_sample: idle ticks over all ticks, times the
    cores) -> float, or None on the first call or where /proc/stat cannot be read."""
    now, last = cpu_sample(), getattr(idle_cores, 'last', None)
    idle_cores.last = now
    if now is None or last is None or now[0] == last[0]:
        return None
    return (now[1] - last[1]) / (now[0] - last[0]) * (os.cpu_count() or 1)


class LoadMeter:
    """How busy the machine is with other processes' work, between two reads: read() -> the cores busy over
    the time since the last read (cpu_sample) less the cores this process used meanwhile, float >= 0; None at
    the first read or where /proc/stat cannot be read. A run's log records it (train.py's 'train' events), so
    that times of a quiet and a loaded run are not compared unawares (experiments/compare.py)."""

    def __init__(self):
        self.last = (cpu_sample(), time.perf_counter())

    def read(self):
        (now, t), (last, t0) = (cpu_sample(), time.perf_counter()), self.last
        self.last = (now, t)
        if now is None or last is None or now[0] == last[0] or t <= t0:
            return None
        cores = os.cpu_count() or 1
        busy = (1 - (now[1] - last[1]) / (now[0] - last[0])) * cores
        return round(max(0.0, busy - (now[2] - last[2]) / (t - t0)), 2)


MAX_THREADS = max(1024, os.cpu_count() or 1)   # here 16,384 torch threads failed to start; 10^6 crashed


def thread_choice(fixed=None, cuda=False):
    """This process's ThreadChoice: fixed at `fixed` (a --threads flag), or at OMP_NUM_THREADS where the user
    set it to a count (ASCII digits; not torchrun's default 1), else chosen; with work on CUDA torch's threads
    as they are. A fixed count above the cores this process may use (cpu_share) is used as asked, with one
    warning line on stderr (rank 0): its threads wait for cores, and the MFU peak counts the cores alone. An
    OMP_NUM_THREADS count above MAX_THREADS (--threads: configurator's check) is ignored, with a warning."""
    omp = os.environ.get('OMP_NUM_THREADS', '') if 'LOCAL_WORLD_SIZE' not in os.environ else ''
    omp = int(omp) if omp.isascii() and omp.isdigit() else None
    master = int(os.environ.get('RANK', 0)) == 0
    if not cuda and not fixed and omp is not None and omp > MAX_THREADS:
        if master:
            print(f'warning: OMP_NUM_THREADS={omp} is more threads than torch runs in one process (at most '
                  f'{MAX_THREADS}): ignored, the threads are chosen by measuring', file=sys.stderr,
                  flush=True)
        omp = None
    count, what = (fixed, f'threads={fixed}') if fixed else (omp, f'OMP_NUM_THREADS={omp}')
    if not cuda and count and count > cpu_share() and master:
        print(f'warning: {what} is more threads than the {cpu_share()} cores this process may use: they wait '
              'for one another (a slower step), and the MFU peak counts the cores alone', file=sys.stderr,
              flush=True)
    return ThreadChoice(fixed=torch.get_num_threads() if cuda else count or None)


class ThreadChoice:
    """torch's intra-op threads on the CPU, chosen by measuring and chosen again as the machine's load moves.
    Why: with 2 threads on 2 cores and another busy process, each parallel region waits at its barrier for the
    thread whose core the other process holds (a time slice), and the step runs several times slower than
    on one thread; quiet, 2 threads are nearly twice as fast (docs/performance.md, "CPU training on a busy
    machine").

    stepped(seconds, work=1) after each step of `work` units (a training step: 1) -> None, or the change made,
    {'threads': new, 'from': old, 'rate': units/s at new, 'rate_from': units/s at old}. After `warmup` steps
    it times `tries` steps at each count in candidates (1, 2, 4, ... and `cores`), leaving a count early whose
    first step is over twice the best, and keeps the fastest; it measures again every `every` steps, when the
    median of the last 3 steps moves by more than `margin` from the time it chose by, and when (Linux) at
    least half a core stood idle while it ran on fewer than `cores`. Measuring costs about tries x (each
    slower count's extra time) every `every` steps: under 1% of a quiet 2-core run at the defaults. `fixed` (a
    count: --threads, or OMP_NUM_THREADS set by the user) or a share of one core: no choice, no change."""

    def __init__(self, cores=None, fixed=None, warmup=5, tries=3, every=250, margin=0.3):
        self.cores = fixed or cores or cpu_share()
        counts = {*(2 ** i for i in range(self.cores.bit_length())), self.cores}
        self.candidates = [] if fixed or self.cores == 1 else sorted(counts)
        self.warmup, self.tries, self.every, self.margin = warmup, tries, every, margin
        self.queue, self.times, self.recent, self.since, self.ref = [], {}, [], 0, None
        self._set(self.cores)

    def stepped(self, seconds, work=1.0):
        if not self.candidates:
            return None
        t, self.since = seconds / work, self.since + 1
        if self.queue:                                          # measuring
            return self._measure(t)
        if self.ref is None:                                    # warming up
            if self.since >= self.warmup:
                self._start()
            return None
        self.recent = (self.recent + [t])[-3:]
        moved = len(self.recent) == 3 and abs(sorted(self.recent)[1] / self.ref - 1) > self.margin
        idle = self.threads < self.cores and self.since % 10 == 0 and (idle_cores() or 0) >= 0.5
        if moved or idle or self.since >= self.every:
            self._start()
        return None

    def _start(self):
        """Measure every candidate count, from the first."""
        self.times, self.queue = {}, list(self.candidates)
        self._set(self.queue[0])

    def _measure(self, t):
        """A measured step took t seconds per unit at self.threads: go on to the next count, or choose."""
        mine = self.times.setdefault(self.threads, [])
        mine.append(t)
        median = {n: sorted(v)[len(v) // 2] for n, v in self.times.items()}
        best = min((median[n] for n, v in self.times.items() if len(v) == self.tries), default=None)
        if len(mine) < self.tries and (best is None or t <= 2 * best):
            return None
        self.queue.pop(0)
        if self.queue:
            return self._set(self.queue[0])
        old, new = self.chosen, min(median, key=median.get)
        self.chosen, self.ref, self.since, self.recent = new, median[new], 0, []
        self._set(new)
        if new != old:
            return {'threads': new, 'from': old, 'rate': 1 / median[new],
                    'rate_from': 1 / median[old] if old in median else None}
        return None

    def _set(self, n):
        """torch's intra-op threads set to n (the count measured next, or the one chosen)."""
        if not hasattr(self, 'chosen'):
            self.chosen = n
        self.threads = n
        torch.set_num_threads(n)


# ----------------------------------------------------------------------------- the CPU's precision

def native_bf16(cpuinfo='/proc/cpuinfo'):
    """True where the CPU multiplies bf16 natively: the flags avx512_bf16 (AVX-512 BF16) or amx_bf16 (Intel
    AMX) in Linux's /proc/cpuinfo (`cpuinfo`: another file, for a test). False where they are absent or the
    file cannot be read (other systems): there bf16 is emulated and float32 is the faster."""
    try:
        with open(cpuinfo) as f:
            flags = next((line for line in f if line.startswith('flags')), '').split()
    except OSError:
        return False
    return 'avx512_bf16' in flags or 'amx_bf16' in flags


class PrecisionChoice:
    """dtype='auto' on a CPU with native bf16 (native_bf16): float32 or bf16 autocast, whichever trains faster
    here, chosen once by measuring. After `warmup` steps in float32 it alternates bf16 and float32 steps,
    drops the first of each (bf16's kernels are made on their first call), times `tries` of each, and keeps
    bf16 when float32's median step is at least `margin` times bf16's (a clear gain, not noise); the weights
    and the optimiser's state stay float32 either way (autocast). dtype: the precision of the next step.
    stepped(seconds) after each step -> None, or at the choice {'dtype', 'rates': {dtype: steps/s}}."""

    def __init__(self, warmup=3, tries=4, margin=1.1):
        self.warmup, self.tries, self.margin = warmup, tries, margin
        self.times, self.seen, self.dtype, self.decided = {'float32': [], 'bfloat16': []}, 0, 'float32', False

    def stepped(self, seconds):
        self.seen += 1
        if self.seen > self.warmup + 2:
            self.times[self.dtype].append(seconds)
        if self.seen < self.warmup + 2 * (self.tries + 1):
            if self.seen >= self.warmup:
                self.dtype = 'bfloat16' if self.dtype == 'float32' else 'float32'
            return None
        median = {k: sorted(v)[len(v) // 2] for k, v in self.times.items()}
        self.dtype = 'bfloat16' if median['float32'] >= self.margin * median['bfloat16'] else 'float32'
        self.decided = True
        return {'dtype': self.dtype, 'rates': {k: 1 / v for k, v in median.items()}}


class Tuning:
    """What train.py's step runs on that is chosen by measuring: the precision (env.dtype, env.autocast:
    PrecisionChoice with dtype='auto' on a CPU with native bf16, else fixed) and then the CPU's threads
    (ThreadChoice). dtypes: the precisions it may run in. stepped(seconds) after each training step -> None,
    or the change made: {'event': 'precision', 'dtype', 'rates'} or {'event': 'threads', 'threads', 'from',
    'rate', 'rate_from'} (rates in steps/s). Under DDP every rank takes rank 0's precision. peak() -> the peak
    MFU is measured against for the precision in use (peak_flops)."""

    def __init__(self, env, dtype, threads):
        self.env, self.threads = env, thread_choice(threads, env.cuda)
        auto = dtype == 'auto' and not env.cuda and native_bf16()
        self.precision = PrecisionChoice() if auto else None
        self.dtypes = ('float32', 'bfloat16') if auto else (env.dtype,)

    def peak(self):
        return peak_flops(self.env.dev, getattr(torch, self.env.dtype))

    def dtype_setting(self, asked):
        """The dtype setting a checkpoint keeps, so that a resumed run trains as this one did: the precision
        chosen once it is chosen, else the setting `asked`."""
        return self.env.dtype if self.precision and self.precision.decided else asked

    def stepped(self, seconds):
        if self.precision is None or self.precision.decided:
            change = self.threads.stepped(seconds)
            return change and {'event': 'threads', **change}
        change, env = self.precision.stepped(seconds), self.env
        if change and env.ddp:
            ranks = [change]
            dist.broadcast_object_list(ranks, src=0)
            change = ranks[0]
            self.precision.dtype = change['dtype']
        env.dtype = self.precision.dtype
        env.autocast = autocast(env.dev, env.dtype)
        return change and {'event': 'precision', **change}


# ----------------------------------------------------------------------------- time

def sync(device):
    """Wait for the work queued on `device` (a torch.device or a name): CUDA's synchronize, a
    no-op on the CPU. What a clock read after device work needs."""
    if torch.device(device).type == 'cuda':
        torch.cuda.synchronize(device)


def hms(seconds):
    """Seconds -> 'H:MM:SS'."""
    seconds = int(round(seconds))
    return f'{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}'


if __name__ == '__main__':
    fail('the device and timing module, not a command: python -m experiments.bench measures this machine',
         'harness/machine.py')
