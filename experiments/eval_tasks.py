"""Score any checkpoint with lm-evaluation-harness (EleutherAI's lm-eval): its tasks, or tasks of your own as YAML.

    python -m experiments.eval_tasks --ckpt out/tinystories_cpu/ckpt.pt \\
        --tasks tinystories_lastword,tinystories_ending,tinystories_bpb      # out/tinystories_cpu/eval.json
    python -m experiments.eval_tasks --ckpt exported/ --tasks lambada_openai --device cuda --output lambada.json

The checkpoint is a train.py ckpt.pt or a folder experiments/convert.py exported, of any LanguageModel kind
(an autoencoder is refused). The model answers lm-eval's three requests through ProjectLM, as lm-eval's own
Hugging Face model (HFLM) does:
  loglikelihood(context, continuation)   the whole text encoded, the continuation the tokens after the
      context's; the context's trailing spaces move to the continuation; an empty context is <|endoftext|>;
      the last n_ctx + 1 tokens kept (a longer context cut from the left), one forward a batch, right-padded
      -> (sum of the continuation's log-probabilities in nats, whether each was the greedy token)
  loglikelihood_rolling(text)            the text in windows of n_ctx tokens after <|endoftext|>, each token
      predicted once (lm-eval's rolling windows) -> its log-probability in nats
  generate_until(context, kwargs)        greedy, through sample.Decoder (every kind's incremental decoding),
      the context's last n_ctx tokens, until one of the task's `until` strings or <|endoftext|> appears or
      max_gen_toks tokens (the task's, else --max_gen_toks); contexts of one length decode as a batch
The shipped tasks (experiments/tasks/, always included; build.py makes their stories) run offline on 500
held-out TinyStories: tinystories_lastword (LAMBADA's protocol: acc, perplexity), tinystories_ending
(HellaSwag's: acc, acc_norm over 4 endings) and tinystories_bpb (bits per byte through loglikelihood_rolling,
printed beside train.py's own figure on the same stories: train.evaluate's windows). --include_path adds
folders of task YAML files; any other name is one of lm-eval's tasks, whose data comes from the Hugging Face
hub (or its local cache). --output (default: eval.json in the checkpoint's folder, the run's) is what
lm_eval.simple_evaluate returns (results per task and metric, configs, versions, n-shot), JSON, with one more
key, "eval_tasks" (the checkpoint, requests per second, the bits-per-byte comparison and each multiple-choice
task's chance). lm-eval's table is printed with one more column, chance: for a multiple-choice task's acc and
acc_norm, the mean over its documents of 1 / its choices. Bad flags, an unknown task or one whose data cannot
be read here (not cached, no network): one line, exit 2; a failed write: one line, exit 1; Ctrl-C: one line,
130.
"""

import argparse
import contextlib
import json
import logging
import math
import os
import sys
import time
from pathlib import Path

if __name__ == '__main__':       # run as a file too (python experiments/eval_tasks.py): the repository root on
    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the path, as -m puts it
    from harness import cli                   # and from here Ctrl-C is one line, torch's import included
    cli.begin('eval_tasks.py', keep=True)

import numpy as np
import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

import sample
from data.outputs import progress_bar
from data.source import hub_unreachable, offline_asked
from experiments.tasks import tinystories
from harness import checkpoint, loading, machine
from harness.cli import failing, run_command, save_results
from harness.flags import ArgumentParser, check_writable, device_error, number

fail = failing('eval_tasks.py')
TASKS_DIR = os.path.dirname(os.path.abspath(tinystories.__file__))     # the shipped tasks, always included
SHIPPED = {f[:-5] for f in os.listdir(TASKS_DIR) if f.endswith('.yaml')}    # each file names its task
BPB_TASK = 'tinystories_bpb'         # the task printed beside train.py's own bits per byte
HUB_PROBE_S = 3.0                    # seconds the Hugging Face Hub has to answer before it counts as offline


def _no_metadata_hint(record):
    """A logging filter: lm-eval's hint, on loading every task with a custom_dataset (the shipped ones), that
    --metadata could pass it keyword arguments (ours take none) is dropped; every other record kept."""
    return 'Custom kwargs can be passed' not in record.getMessage()


def progress(label, total):
    """A kind of work's progress bar on stdout (data.outputs.progress_bar; elsewhere than a terminal a line
    every 10 s), from its 10th second: requests done of `total`, a second, ETA; gone when the work ends."""
    return progress_bar(f'  {label}', total, 'request', every=10.0, delay=10.0, leave=False)


class BadRequest(ValueError):
    """A request the model cannot score: an empty continuation (log-probability 0 and greedy, above any real
    answer: lm-eval's own HFLM refuses it too), or one longer than its n_ctx (TooLong)."""


class TooLong(BadRequest):
    """A request the model cannot read: a continuation longer than its n_ctx."""


class ProjectLM(TemplateLM):
    """lm-eval's LM over a mixer.LanguageModel (eval mode, on its device) and its tiktoken.Encoding `enc`:
    loglikelihood, loglikelihood_rolling and generate_until (the module's docstring says how each reads
    its text), batch_size sequences a forward or a decoder. max_length is the model's n_ctx. `stats`: for
    each request kind, [requests, seconds, CPU seconds] so far; `choices`: {task: {document: the indices of
    its loglikelihood requests}}, the choices of a multiple-choice task's documents. `threads`: the CPU's
    threads, chosen as train.py chooses them by the forwards' seconds a token (machine.thread_choice;
    OMP_NUM_THREADS fixes them). A continuation longer than n_ctx tokens: TooLong (a ValueError)."""

    def __init__(self, model, enc, batch_size=16, max_gen_toks=256):
        super().__init__()
        self.model, self.enc, self.batch_size, self.max_gen_toks = model, enc, batch_size, max_gen_toks
        self._device = next(model.parameters()).device       # LM.device reads it
        self.stats, self.threads = {}, machine.thread_choice(cuda=self._device.type == 'cuda')
        self.choices = {}

    @property
    def eot_token_id(self):
        """<|endoftext|>'s id: the prefix of an empty context and of every rolling text."""
        return self.enc.eot_token

    @property
    def max_length(self):
        """The model's context n_ctx (tokens)."""
        return self.model.cfg.n_ctx

    def tok_encode(self, string, add_special_tokens=None, **kwargs):
        """str -> token ids (list of int); '<|endoftext|>' in the text is that token (as sample.py reads a prompt)."""
        return self.enc.encode(string, allowed_special={'<|endoftext|>'}, disallowed_special=())

    def tok_decode(self, tokens, **kwargs):
        """Token ids (list of int, or one int) -> str (bytes that are not UTF-8 as U+FFFD)."""
        return self.enc.decode([tokens] if isinstance(tokens, int) else tokens)

    @contextlib.contextmanager
    def _timed(self, kind, n):
        """Count n requests of `kind`, the seconds the block takes and the process's CPU seconds in it
        (every thread's) in self.stats."""
        t0, c0 = time.perf_counter(), time.process_time()
        yield
        count = self.stats.setdefault(kind, [0, 0.0, 0.0])
        count[0] += n
        count[1] += time.perf_counter() - t0
        count[2] += time.process_time() - c0

    def loglikelihood(self, requests, disable_tqdm=False):
        """lm-eval's (context, continuation) requests -> [(log-probability in nats, is_greedy)] (TemplateLM's
        encoding: the trailing-space and empty-context rules, then _loglikelihood_tokens). An empty continuation:
        BadRequest naming its task and document."""
        for req in requests:
            if req.args[1] == '':
                raise BadRequest(f'task {req.task_name!r}, document {req.doc_id}: an empty continuation (its target or '
                                 'choice is \'\'), which would score 0 nats, above every real answer: give it text')
            self.choices.setdefault(req.task_name, {}).setdefault(req.doc_id, set()).add(req.idx)
        with self._timed('loglikelihood', len(requests)):
            return super().loglikelihood(requests, disable_tqdm=True)

    @torch.inference_mode()
    def _loglikelihood_tokens(self, requests, disable_tqdm=False, label='loglikelihood requests'):
        """[(strings, context ids, continuation ids)] -> [(sum of the continuation's log-probabilities, nats;
        each continuation token the argmax)]: the last n_ctx + 1 tokens of context + continuation, all but the
        last the input, longest first, batch_size a forward, right-padded (causal: padding changes nothing).
        BadRequest: a continuation of no token, or TooLong."""
        n_ctx, rows = self.max_length, []
        for strings, ctx, cont in requests:
            if not cont:
                raise BadRequest(f'an empty continuation: no token of its own after the context '
                                 f'...{(strings or [""])[0][-40:]!r}; it would score 0 nats, above every real answer')
            if len(cont) > n_ctx:
                raise TooLong(f'a continuation of {len(cont)} tokens is longer than the model context n_ctx={n_ctx}')
            rows.append(((ctx + cont)[-(n_ctx + 1):], cont))
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))
        out, meter = [None] * len(rows), progress(label, len(rows))
        for b in range(0, len(order), self.batch_size):
            batch = order[b:b + self.batch_size]
            width = len(rows[batch[0]][0]) - 1
            x = torch.zeros(len(batch), width, dtype=torch.long)
            for r, i in enumerate(batch):
                x[r, :len(rows[i][0]) - 1] = torch.tensor(rows[i][0][:-1])
            started = time.perf_counter()
            logits = self.model(x.to(self.device))[0]
            self.threads.stepped(time.perf_counter() - started, x.numel())     # the CPU's threads, as measured
            for r, i in enumerate(batch):
                whole, cont = rows[i]
                n = len(whole) - 1                      # the input's length: its last len(cont) logits score cont
                logp = F.log_softmax(logits[r, n - len(cont):n].float(), dim=-1)
                target = torch.tensor(cont, device=logp.device)
                out[i] = (float(logp.gather(1, target[:, None]).sum()), bool((logp.argmax(-1) == target).all()))
            meter.update(len(batch))
        meter.close()
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        """lm-eval's (text,) requests -> [log-probability of the text, nats]: lm-eval's rolling windows of n_ctx
        tokens after <|endoftext|> (utils.get_rolling_token_windows, context_len=1: every token predicted once;
        a middle window's first token reads only the token before it, the last window a full n_ctx), batched
        across texts."""
        with self._timed('loglikelihood_rolling', len(requests)):
            windows, owner = [], []
            for i, (text,) in enumerate(req.args for req in requests):
                for ctx, cont in map(make_disjoint_window, get_rolling_token_windows(
                        self.tok_encode(text), self.prefix_token_id, self.max_length, 1)):
                    windows.append((None, ctx, cont))
                    owner.append(i)
            totals = [0.0] * len(requests)
            for i, (ll, _) in zip(owner, self._loglikelihood_tokens(windows, label='loglikelihood_rolling windows')):
                totals[i] += ll
            return totals

    def generate_until(self, requests, disable_tqdm=False):
        """lm-eval's (context, generation kwargs) requests -> [the greedy continuation, cut before the first
        `until` string]: contexts of one token length and one set of kwargs decode together, batch_size at a
        time (a decoder's sequences share their position)."""
        with self._timed('generate_until', len(requests)):
            groups, out = {}, [None] * len(requests)
            for i, (context, kwargs) in enumerate(req.args for req in requests):
                kw = normalize_gen_kwargs(kwargs, self.max_gen_toks)
                until = handle_stop_sequences(kw.pop('until', None), eos=self.tok_decode(self.eot_token_id))
                ids = self.tok_encode(context)[-self.max_length:] or [self.eot_token_id]
                groups.setdefault((len(ids), tuple(until), kw['max_gen_toks']), []).append((i, ids))
            meter = progress('generations', len(requests))
            for (_, until, max_new), items in groups.items():
                for b in range(0, len(items), self.batch_size):
                    batch = items[b:b + self.batch_size]
                    texts = self.greedy(torch.tensor([ids for _, ids in batch], device=self.device), until, max_new)
                    for (i, _), text in zip(batch, texts):
                        out[i] = postprocess_generated_text(text, list(until), None)
                    meter.update(len(batch))
            meter.close()
            return out

    @torch.inference_mode()
    def greedy(self, idx, until, max_new):
        """Greedy text after idx long [B, T] (T <= n_ctx) through a sample.Decoder -> list of B str: each row's
        new tokens decoded, stopped once its text holds a string of `until` (then all rows stopped) or after
        max_new tokens: sample.generate's greedy tokens (its window past n_ctx)."""
        ends = [None] * idx.shape[0]                    # each row's new tokens up to its first `until`

        def stop(new):
            for r, row in enumerate(new.tolist()):
                if ends[r] is None and any(u in self.tok_decode(row) for u in until):
                    ends[r] = len(row)
            return None not in ends
        new = sample.generate(self.model, idx, max_new, temperature=0, stop=stop)[:, idx.shape[1]:].tolist()
        return [self.tok_decode(row[:end]) for row, end in zip(new, ends)]


# ----------------------------------------------------------------------------- train.py's bits per byte

@torch.inference_mode()
def train_bpb(model, enc, texts, windows, batch_size):
    """train.py's bits per byte of `texts` (list of str), as its validation reads a prepared split: the texts
    each followed by <|endoftext|> (data/prepare.py's token stream), bytes_per_token their UTF-8 bytes over
    its tokens -> {'windows': train.evaluate's bpb over `windows` evenly spaced windows of n_ctx tokens (its
    own figure), 'every_token': the same over every token once (back-to-back windows), 'every_token_no_eot':
    that without the <|endoftext|> targets' nats (lm-eval's count), 'tokens', 'bytes'}."""
    import train                        # here: only this comparison needs train.py's evaluate
    eot, n_ctx = enc.eot_token, model.cfg.n_ctx
    ids = np.array([t for text in texts for t in enc.encode(text, disallowed_special=()) + [eot]], dtype=np.int64)
    n_bytes = sum(len(text.encode('utf-8')) for text in texts)
    if len(ids) < n_ctx + 2:
        return None
    dev = next(model.parameters()).device
    cfg = {'n_ctx': n_ctx, 'batch_size': batch_size, 'eval_windows': windows, 'task': 'lm'}
    own = train.evaluate(model, ids, cfg, dev, contextlib.nullcontext(), n_bytes / len(ids))['val_bpb']
    model.eval()                                        # train.evaluate leaves the model in train mode
    full = (len(ids) - 1) // n_ctx                      # every token once: back-to-back windows, then the rest
    chunks = [ids[s * n_ctx:(s + 1) * n_ctx + 1] for s in range(full)]
    batches = [torch.from_numpy(np.stack(chunks[b:b + batch_size])) for b in range(0, full, batch_size)]
    if len(ids) - 1 > full * n_ctx:
        batches.append(torch.from_numpy(ids[None, full * n_ctx:]))
    nats = {True: 0.0, False: 0.0}                      # on <|endoftext|> targets, on the rest
    for w in batches:
        w = w.to(dev)
        logits = model(w[:, :-1])[0].float()
        loss = F.cross_entropy(logits.flatten(0, 1), w[:, 1:].flatten(), reduction='none')
        for is_eot in (True, False):
            nats[is_eot] += float(loss[(w[:, 1:].flatten() == eot) == is_eot].sum())
    bits = 1 / (math.log(2) * n_bytes)
    return {'windows': own, 'n_windows': windows, 'every_token': (nats[True] + nats[False]) * bits,
            'every_token_no_eot': nats[False] * bits, 'tokens': int(len(ids)), 'bytes': n_bytes}


# ----------------------------------------------------------------------------- the command

def task_manager(names, include):
    """lm-eval's TaskManager that knows every name of `names`: the shipped tasks and the --include_path folders
    `include` alone when they have them all (fast), else with lm-eval's own tasks too (seconds to index).
    Exits 2 (one line) naming a task it does not know, or the file of --include_path that names it but cannot
    be read (unreadable)."""
    from lm_eval.tasks import TaskManager
    tm = TaskManager(include_path=[TASKS_DIR, *include], include_defaults=False)
    for name, why in unreadable(include, [n for n in names if n not in tm.all_tasks]).items():
        fail(f'task {name!r}: {why}')
    if not set(names) <= set(tm.all_tasks):
        print('eval_tasks.py: indexing lm-eval\'s own tasks (seconds) ...', flush=True)
        tm = TaskManager(include_path=[TASKS_DIR, *include])
    for name in (n for n in names if n not in tm.all_tasks):
        fail(f'unknown task {name!r}: not one of lm-eval\'s tasks, groups or tags, nor in experiments/tasks/'
             + (' or --include_path' if include else ' (pass --include_path DIR for your own task YAML files)'))
    return tm


def unreadable(include, names):
    """The YAML files under the --include_path folders `include` that lm-eval cannot read (its index skips them
    without a word, so their tasks were 'unknown') and that name a task of `names` -> {name: 'FILE: why'}."""
    import re
    import yaml
    from lm_eval.tasks._yaml_loader import load_yaml      # lm-eval's own reader (!function tags and all)
    found = {}
    for path in sorted(p for folder in include for p in Path(folder).glob('**/*.yaml')) if names else ():
        try:
            load_yaml(path, resolve_func=False)
        except Exception as e:
            if isinstance(e, yaml.MarkedYAMLError) and e.problem_mark is not None:
                why = f'not valid YAML ({e.problem} at line {e.problem_mark.line + 1})'
            else:
                why = f'unreadable to lm-eval ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ""})'
            text = path.read_text(errors='replace')
            for name in names:
                if re.search(rf'^\s*(task|group|tag)\s*:\s*["\']?{re.escape(name)}(["\'\s]|$)', text, re.M):
                    found.setdefault(name, f'{path}, which names it, is {why}')
    return found


def no_dataset(tm, name):
    """Why task `name` of TaskManager tm reads no data: its YAML has no dataset_path (nor custom_dataset nor a
    class of its own) -> one line, or None."""
    from lm_eval.tasks._yaml_loader import load_yaml
    entry = tm.task_index.get(name)
    try:
        cfg = load_yaml(entry.yaml_path, resolve_func=False) if entry is not None and entry.yaml_path else None
    except Exception:
        return None
    if isinstance(cfg, dict) and 'task' in cfg and not {'dataset_path', 'custom_dataset', 'class'} & set(cfg):
        return (f'task {name!r} ({entry.yaml_path}) has no dataset_path: name the data it reads (a hub dataset, or '
                'json, csv or parquet with dataset_kwargs: data_files)')
    return None


@contextlib.contextmanager
def offline_mode():
    """Inside (as True), huggingface_hub and datasets read only their local cache, as under HF_HUB_OFFLINE=1
    (set here on their module constants: they read the variable once, at import)."""
    import datasets.config
    import huggingface_hub.constants
    places = [(huggingface_hub.constants, 'HF_HUB_OFFLINE'), (datasets.config, 'HF_HUB_OFFLINE'),
              (datasets.config, 'HF_DATASETS_OFFLINE')]
    before = [getattr(m, a) for m, a in places]
    for m, a in places:
        setattr(m, a, True)
    try:
        yield True
    finally:
        for (m, a), v in zip(places, before):
            setattr(m, a, v)


def hub_access(names):
    """The context the tasks' data is read in: nothing for the shipped tasks alone; else offline_mode() when
    HF_HUB_OFFLINE asks for it or the hub does not answer (said on stdout), so that a dataset in the local
    cache loads at once and any other fails at once, not after the hub client's retries (~25 s)."""
    if set(names) <= SHIPPED:
        return contextlib.nullcontext(False)
    why = 'HF_HUB_OFFLINE' if offline_asked() else hub_unreachable(HUB_PROBE_S)
    if why is None:
        return contextlib.nullcontext(False)
    if why != 'HF_HUB_OFFLINE':
        print(f'eval_tasks.py: the Hugging Face Hub does not answer ({why}): reading its datasets from the local '
              'cache only', flush=True)
    return offline_mode()


def check_tasks(tm, names, offline):
    """Load each task of `names` once, so that one whose data cannot be read here is named: exits 2 (one line: a
    task without dataset_path says so, no_dataset); `offline`: the hub is not reachable (hub_access), which the
    line says where the cause is one the network could remove (an OSError: a file or dataset not found, no
    connection), not for a template's error."""
    for name in names:
        try:
            tm.load([name])
        except Exception as e:          # datasets and the hub raise many types: a missing file, no network, ...
            why = str(e).splitlines()[0][:200] if str(e) else ''
            fail(no_dataset(tm, name) or f'task {name!r} could not be loaded ({type(e).__name__}: {why})' + (
                 '; offline, only datasets in the local cache can be read: run it once with the network'
                 if offline and isinstance(e, OSError) else ''))


def json_safe(results):
    """simple_evaluate's dict -> the same as plain JSON values (lm-eval's own writer's rule for the rest:
    numpy numbers as numbers, anything else as its str)."""
    from lm_eval.utils import handle_non_serializable
    return json.loads(json.dumps(results, default=handle_non_serializable))


def main(argv=None):
    """Command line entry point (argv: list of str; None: sys.argv): exits 0, the table printed and --output
    written; 2, bad input (one line); 1, --output could not be written or stdout closed; 130, Ctrl-C (one line:
    cli.run_command; --output is written whole or not at all)."""
    sys.exit(run_command('eval_tasks.py', evaluate_tasks, argv))


def parse(argv):
    """evaluate_tasks' flags -> (argparse namespace, task names, --include_path folders); bad ones exit 2."""
    p = ArgumentParser('eval_tasks.py', __doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.description = __doc__                                 # --help: the whole docstring, as written
    p.add_argument('--ckpt', required=True, help='a checkpoint written by train.py, or a folder convert.py exported')
    p.add_argument('--tasks', required=True, help='comma-separated task names (lm-eval tasks, groups, tags)')
    p.add_argument('--include_path', action='append', default=[], help='a folder of task YAML files (repeatable)')
    p.add_argument('--output', help="the results (JSON): lm_eval.simple_evaluate's dict; None: eval.json in "
                                    "the checkpoint's folder (the run's)")
    p.add_argument('--limit', type=number(int, 1), default=None, help='score only the first N documents of each task')
    p.add_argument('--batch_size', type=number(int, 1), default=16, help='sequences a forward or a decoder')
    p.add_argument('--device', default='cpu')
    p.add_argument('--max_gen_toks', type=number(int, 1), default=256,
                   help="generate_until's limit, unless the task sets one")
    p.add_argument('--bootstrap_iters', type=number(int, 0), default=1000,
                   help="lm-eval's resamples for the standard error of perplexity-like metrics (0: none)")
    p.add_argument('--overwrite', action='store_true', help='replace an existing --output')
    args = p.parse_args(argv)
    names = [n.strip() for n in args.tasks.split(',')]
    if not all(names):
        fail(f'--tasks {args.tasks!r} has an empty name: give names separated by commas')
    if len(set(names)) < len(names):
        fail(f'--tasks {args.tasks!r} names a task twice; give each once')
    for path in args.include_path:
        if not os.path.isdir(path):
            fail(f'--include_path {path!r} ' + ('is a file, not a folder' if os.path.exists(path) else 'not found')
                 + ': give a folder of task YAML files')
    if device_error(args.device):
        fail(device_error(args.device))
    if args.output is None:
        run = args.ckpt if os.path.isdir(args.ckpt) else os.path.dirname(args.ckpt) or '.'
        args.output = os.path.join(run, 'eval.json')
    p.check(check_writable, args.output, args.overwrite, 'results file')
    return args, names, args.include_path


def evaluate_tasks(argv):
    """main's work: parse argv, load --ckpt, run lm-eval on --tasks, print its table and write --output."""
    args, names, include = parse(argv)
    try:
        model, enc, ckpt = loading.load_checkpoint(args.ckpt, args.device)
    except checkpoint.CheckpointError as e:
        fail(str(e))
    if model.cfg.task != 'lm':
        fail('this checkpoint is an autoencoder; eval_tasks.py scores a language model')
    hinting = logging.getLogger('lm_eval.api.task')
    if _no_metadata_hint not in hinting.filters:
        hinting.addFilter(_no_metadata_hint)
    tm = task_manager(names, include)
    cfg, config = model.cfg, ckpt.get('config', {})
    variant = config.get('variant', cfg.kind)
    from lm_eval import simple_evaluate
    from lm_eval.utils import make_table
    os.environ.setdefault('DISABLE_MULTIPROC', '1')     # lm-eval's bootstrap here, not in a pool of every core
    with hub_access(names) as offline:
        check_tasks(tm, names, offline)
        print(f'eval_tasks.py: {args.ckpt}: {variant} ({cfg.kind}), n_ctx {cfg.n_ctx}, step {ckpt.get("step", "?")}; '
              f'{", ".join(names)}' + (f' (the first {args.limit} documents each)' if args.limit else '')
              + f'; {args.device}, batch {args.batch_size}', flush=True)
        lm, t0 = ProjectLM(model, enc, args.batch_size, args.max_gen_toks), time.perf_counter()
        try:
            results = simple_evaluate(model=lm, tasks=names, task_manager=tm, limit=args.limit, log_samples=False,
                                      bootstrap_iters=args.bootstrap_iters, batch_size=args.batch_size,
                                      device=args.device)
        except BadRequest as e:
            fail(str(e))
    seconds = time.perf_counter() - t0
    chance = chance_levels(results, lm)
    print(with_chance(make_table(results), results, chance))
    if results.get('groups'):
        print(make_table(results, 'groups'))
    extra = {'checkpoint': os.path.abspath(args.ckpt), 'variant': variant, 'kind': cfg.kind, 'n_ctx': cfg.n_ctx,
             'step': ckpt.get('step'), 'device': args.device, 'batch_size': args.batch_size,
             'torch_threads': torch.get_num_threads(), 'seconds': seconds,
             'requests': {k: {'requests': n, 'seconds': s, 'cpu_seconds': c, 'per_second': n / s}
                          for k, (n, s, c) in lm.stats.items()}}
    for kind, r in extra['requests'].items():
        print(f'{kind}: {r["requests"]} requests in {r["seconds"]:.1f} s ({r["cpu_seconds"]:.1f} s of CPU, '
              f'{torch.get_num_threads()} threads), {r["per_second"]:.1f} requests/s')
    extra['chance'] = chance
    if BPB_TASK in names:
        extra['train_py_bpb'] = compare_bpb(results, model, enc, config, args)
    results['eval_tasks'] = extra
    save_results(args.output, json_safe(results), 'eval_tasks.py')
    print(f'eval_tasks.py: {len(names)} task(s) in {seconds:.0f} s; wrote {args.output}')


def chance_levels(results, lm):
    """The accuracy a guess gets on each multiple-choice task of simple_evaluate's `results` -> {task: the
    mean over its documents scored of 1 / the document's choices (its loglikelihood requests,
    ProjectLM.choices)}."""
    configs = results.get('configs', {})
    return {task: sum(1 / len(c) for c in lm.choices[task].values()) / len(lm.choices[task])
            for task in results.get('results', {}) if task in lm.choices and lm.choices[task]
            and configs.get(task, {}).get('output_type') == 'multiple_choice'}


def with_chance(table, results, chance):
    """lm-eval's markdown table (make_table) with a column 'chance' after its last: `chance` of the task
    beside its acc and acc_norm rows, blank beside the rest."""
    by_name = {str(results['results'][t].get('alias', t)).strip(): v for t, v in chance.items()}
    lines, task = table.split('\n'), None
    for i, line in enumerate(lines):
        cells = line.split('|')
        if i == 0:
            lines[i] = line + 'chance|'
        elif i == 1:
            lines[i] = line + '-----:|'
        elif len(cells) > 5:
            task = cells[1].strip().lstrip('- ') or task
            metric = cells[5].strip()
            value = by_name.get(task) if metric in ('acc', 'acc_norm') else None
            lines[i] = line + ('' if value is None else f'{value:.4f}').rjust(6) + '|'
    return '\n'.join(lines)


def compare_bpb(results, model, enc, config, args):
    """Print tinystories_bpb's bits per byte beside train.py's on the same stories (train_bpb) -> its dict."""
    texts = [s['text'] for s in tinystories.read_stories()][:args.limit]
    got = train_bpb(model, enc, texts, config.get('eval_windows', 64), args.batch_size)
    if got is None:
        print(f'{BPB_TASK}: too few tokens for one train.py window of n_ctx + 1 tokens: no comparison')
        return None
    rolling = results['results'][BPB_TASK]['bits_per_byte,none']
    print(f'{BPB_TASK}: bits per byte {rolling:.4f} (lm-eval: each story alone after <|endoftext|>, rolling '
          f'windows of n_ctx); train.py on the same {len(texts)} stories: {got["windows"]:.4f} ({got["n_windows"]} '
          f'windows of n_ctx tokens of the stories joined by <|endoftext|>, that token scored as 0 bytes), '
          f'{got["every_token"]:.4f} over every token, {got["every_token_no_eot"]:.4f} without the <|endoftext|> '
          'targets')
    return got


if __name__ == '__main__':
    main()
