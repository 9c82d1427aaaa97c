"""lm-evaluation-harness over this project's models: python test_mixer.py test_eval_tasks

    TestAdapter    experiments/eval_tasks.ProjectLM on tiny models of every LanguageModel kind: loglikelihood is
                   the model's own log-probabilities of the continuation's tokens (computed here from one
                   forward of the whole text), batched or not; a context past n_ctx is cut from the left (the
                   cut tokens change nothing); an empty context starts from <|endoftext|>; a context's trailing
                   spaces belong to the continuation; loglikelihood_rolling is every token's log-probability
                   once, in windows of n_ctx; generate_until is sample.generate's greedy text, cut before the
                   first `until` string, where it stops decoding
    TestTasks      the shipped tasks' documents (experiments/tasks/): built again from the shared valid.txt
                   byte for byte; every last word, ending and distractor as the tasks' protocols say
    TestCommand    the whole command on a tiny checkpoint (--limit 3): the three shipped tasks, their numbers
                   the model's own; a generate_until task from --include_path; unknown tasks, data not
                   reachable offline and bad flags: one line, exit 2
"""

import json
import math
import os
import shutil
import tempfile
import unittest
from unittest import mock

import tiktoken
import torch
import torch.nn.functional as F
from lm_eval.api.instance import Instance

import mixer
import sample
from data.tokenizer import GPT2_PAT
from experiments import eval_tasks
from experiments.tasks import build, tinystories
from harness import loading
from tests.common import HAVE_TEXT, NO_TEXT, TEXT_DIR, run_in_process, tiny_checkpoint, tiny_model
from tests.faults import ENV, error_lines


def tiny_encoding():
    """A byte-level tiktoken BPE with a few merges (' world' and 'Hello' one token each) and <|endoftext|>."""
    ranks = {bytes([b]): b for b in range(256)}
    for piece in (b' w', b'or', b'ld', b' wor', b' world', b'He', b'll', b'Hell', b'Hello'):
        ranks[piece] = len(ranks)
    return tiktoken.Encoding('tiny', pat_str=GPT2_PAT, mergeable_ranks=ranks,
                             special_tokens={'<|endoftext|>': len(ranks)})


ENC = tiny_encoding()
EOT = ENC.eot_token
VOCAB = EOT + 1
N_CTX = 24                      # tests.common.TINY's


def requests(kind, *args):
    return [Instance(kind, {}, a, i) for i, a in enumerate(args)]


def own_logprob(model, ids, n_cont):
    """The model's log-probability (nats) of the last n_cont tokens of ids (list of int, <= n_ctx + 1 of them)
    given the ones before, from one forward of ids[:-1], and whether each is the argmax."""
    x = torch.tensor([ids])
    with torch.no_grad():
        logp = F.log_softmax(model(x[:, :-1])[0][0].double(), -1)
    target = x[0, 1:][-n_cont:]
    rows = logp[-n_cont:]
    return float(rows.gather(1, target[:, None]).sum()), bool((rows.argmax(-1) == target).all())


class TestAdapter(unittest.TestCase):

    def lm(self, name, batch_size=3):
        return eval_tasks.ProjectLM(tiny_model(name, vocab_size=VOCAB), ENC, batch_size=batch_size)

    def test_loglikelihood_is_the_models_own_for_every_kind(self):
        """Requests of different lengths, batched 3 a forward (right-padded, longest first): each equals the
        model's log-probability of its continuation tokens after the context's, the continuation the tokens
        of the whole text after as many as the context has (lm-eval's HFLM: 'x w' + 'orld!' is 'x', ' world',
        '!', so '!' after 'x', ' w'; encoded apart it would be 'or', 'ld', '!'), is_greedy the argmax test."""
        pairs = [('Hello', ' world'), ('x w', 'orld!'), ('The end', '.'), ('A cat sat', ' on a mat.'),
                 ('x', 'yz'), ('Hello, Hello', ' world!')]
        for name in mixer.VARIANTS:
            with self.subTest(name):
                lm = self.lm(name)
                got = lm.loglikelihood(requests('loglikelihood', *pairs))
                for (ctx, cont), (ll, greedy) in zip(pairs, got):
                    head = ENC.encode(ctx)
                    tail = ENC.encode(ctx + cont)[len(head):]
                    want = own_logprob(lm.model, head + tail, len(tail))
                    self.assertAlmostEqual(ll, want[0], places=4, msg=(ctx, cont))
                    self.assertEqual(greedy, want[1])

    def test_greedy_is_true_for_the_models_own_choice(self):
        """A continuation of the argmax tokens is greedy; one token off is not."""
        lm = self.lm('flat')
        ids = ENC.encode('Hello')
        with torch.no_grad():
            for _ in range(3):
                ids.append(int(lm.model(torch.tensor([ids]))[0][0, -1].argmax()))
        cont = ids[1:]
        got = lm._loglikelihood_tokens([(None, ids[:1], cont), (None, ids[:1], cont[:-1] + [(cont[-1] + 1) % VOCAB])])
        self.assertEqual([g for _, g in got], [True, False])

    def test_a_long_context_is_cut_from_the_left(self):
        """A context + continuation of 40 tokens, past n_ctx + 1 = 25: the value is the model's over the last 25,
        the 15th token from the start (the last one cut) changed changes nothing (float noise, 1e-6), the 16th
        or the one before the continuation changes it."""
        text = ''.join(chr(97 + (i * 7) % 26) for i in range(40))           # 40 one-byte tokens
        for name in ('flat', 'toeplitz', 'recurrent', 'transformer', 'linear_attention'):
            with self.subTest(name):
                lm = self.lm(name)
                ll = lm.loglikelihood(requests('loglikelihood', (text[:-3], text[-3:])))[0][0]
                self.assertAlmostEqual(ll, own_logprob(lm.model, ENC.encode(text)[-(N_CTX + 1):], 3)[0], places=4)
                changed = [text[:i] + 'Q' + text[i + 1:] for i in (14, 15, 36)]
                got = lm.loglikelihood(requests('loglikelihood', *[(t[:-3], t[-3:]) for t in changed]))
                self.assertAlmostEqual(got[0][0], ll, places=5)
                self.assertGreater(abs(got[1][0] - ll), 2e-5)      # Toeplitz and recurrent decay: 1e-4 nats
                self.assertGreater(abs(got[2][0] - ll), 1e-3)

    def test_an_empty_continuation_is_refused(self):
        """A continuation with no token would score 0 nats and greedy, above every real answer (lm-eval's own HFLM
        asserts there is none): BadRequest naming the task and document, after a context or with none (where
        lm-eval's encoding failed with an IndexError); at the tokens' level too (a continuation the context's
        tokens swallowed)."""
        lm = self.lm('flat')
        for ctx in ('Hello', ''):
            with self.subTest(ctx=ctx), \
                    self.assertRaisesRegex(eval_tasks.BadRequest, "task 'mine', document 7: .*empty"):
                lm.loglikelihood([Instance('loglikelihood', {}, (ctx, ''), 0, metadata=('mine', 7, 1))])
        with self.assertRaisesRegex(eval_tasks.BadRequest, 'empty'):
            lm._loglikelihood_tokens([(('Hello', 'x'), ENC.encode('Hello'), [])])

    def test_an_empty_context_starts_from_endoftext(self):
        """loglikelihood('', text) is the log-probability of all of text's tokens after <|endoftext|>."""
        lm = self.lm('flat')
        ll, _ = lm.loglikelihood(requests('loglikelihood', ('', 'Hello world')))[0]
        ids = ENC.encode('Hello world')
        self.assertAlmostEqual(ll, own_logprob(lm.model, [EOT] + ids, len(ids))[0], places=4)

    def test_trailing_spaces_move_to_the_continuation(self):
        """('Hello ', 'world') is scored as ('Hello', ' world'): ' world' one token after 'Hello', not 'world'
        after 'Hello '; so are two spaces."""
        lm = self.lm('flat')
        got = lm.loglikelihood(requests('loglikelihood', ('Hello ', 'world'), ('Hello', ' world'), ('Hello  ', 'world')))
        self.assertAlmostEqual(got[0][0], got[1][0], places=6)
        self.assertAlmostEqual(got[0][0], own_logprob(lm.model, ENC.encode('Hello world'), 1)[0], places=4)
        naive = own_logprob(lm.model, ENC.encode('Hello ') + ENC.encode('world'), len(ENC.encode('world')))[0]
        self.assertNotAlmostEqual(got[0][0], naive, places=3)
        two = ENC.encode('Hello  world')
        self.assertAlmostEqual(got[2][0], own_logprob(lm.model, two, len(two) - len(ENC.encode('Hello')))[0], places=4)

    def test_rolling_scores_every_token_once_in_windows_of_n_ctx(self):
        """loglikelihood_rolling(text) = the sum over text's tokens of their log-probability, each given the
        tokens of its window: <|endoftext|> + text cut in windows that predict n_ctx tokens each, every one
        read with the n_ctx tokens before its window's end (the last window full). A short text: one window."""
        lm = self.lm('flat', batch_size=2)
        short, long = 'Hello world', ''.join(chr(97 + (i * 5) % 26) for i in range(60))
        got = lm.loglikelihood_rolling(requests('loglikelihood_rolling', (short,), (long,)))
        for text, value in zip((short, long), got):
            t = [EOT] + ENC.encode(text)
            want, start = 0.0, 1
            while start < len(t):
                end = min(start + N_CTX, len(t))
                want += own_logprob(lm.model, t[max(0, end - N_CTX - 1):end], end - start)[0]
                start = end
            self.assertAlmostEqual(value, want, places=3)

    def test_generate_until_is_greedy_and_stops_at_until(self):
        """generate_until without a stop string is sample.generate's greedy text (crossing n_ctx: its window);
        with `until` a piece of that text, the text before it, decoded with fewer decoder calls; two contexts
        of one length in one batch each get their own text. Every kind; the stop and the batch on three."""
        cat, dog = 'Hello world, said the cat', 'Hello world, said the dog'      # one token length

        def gen(lm, *contexts, until=(), n=30):
            return lm.generate_until(requests('generate_until', *[(c, {'until': list(until), 'max_gen_toks': n})
                                                                  for c in contexts]))
        for name in mixer.VARIANTS:
            with self.subTest(name):
                lm = self.lm(name, batch_size=2)
                ids = ENC.encode(cat)
                free = gen(lm, cat)[0]
                want = sample.generate(lm.model, torch.tensor([ids]), 30, temperature=0)[0, len(ids):].tolist()
                self.assertEqual(free, ENC.decode(want).split('<|endoftext|>')[0])
                if name not in ('flat', 'recurrent', 'transformer'):
                    continue
                self.assertGreaterEqual(len(free), 10, 'staging: a text to cut')
                stop = free[6:8]
                calls, step, prefill = [], sample.Decoder.step, sample.Decoder.prefill     # a token's logits each
                with mock.patch.object(sample.Decoder, 'step', lambda dec, idx: calls.append(1) or step(dec, idx)), \
                        mock.patch.object(sample.Decoder, 'prefill', lambda dec, idx: calls.append(1) or prefill(dec, idx)):
                    cut = gen(lm, cat, until=[stop])[0]
                self.assertEqual(cut, free.split(stop)[0])
                self.assertLess(len(calls), 20)                 # 30 without stopping
                self.assertEqual(gen(lm, cat, dog, until=['\n'], n=12)[1], gen(lm, dog, until=['\n'], n=12)[0])


class TestTasks(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.stories = tinystories.read_stories()

    def test_the_file_is_built_again_byte_for_byte(self):
        """build.py on the shared valid.txt with its defaults writes the committed file exactly."""
        if not HAVE_TEXT:
            self.skipTest(NO_TEXT)
        out = os.path.join(tempfile.mkdtemp(prefix='mixer_tasks_'), 'h.jsonl')
        self.addCleanup(shutil.rmtree, os.path.dirname(out), ignore_errors=True)
        r = run_in_process('-m', 'experiments.tasks.build', '--valid', os.path.join(TEXT_DIR, 'valid.txt'), '--out', out,
                           env=ENV)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out, 'rb') as a, open(tinystories.DATA, 'rb') as b:
            self.assertTrue(a.read() == b.read(), 'experiments/tasks/tinystories_heldout.jsonl is not build.py\'s')

    def test_the_documents_follow_the_protocols(self):
        """500 distinct stories; last word: context + ' ' + word + closing punctuation is the story; ending:
        the true ending at `label`, 3 distractors that are other stories' last sentences, none equal to it."""
        self.assertEqual(len(self.stories), 500)
        self.assertEqual(len({s['id'] for s in self.stories}), 500)
        for s in self.stories:
            doc = tinystories.lastword_docs(s)
            self.assertTrue(doc['target'].startswith(' ') and doc['target'][1:].isalpha(), doc['target'])
            rest = s['text'][len(doc['context']) + len(doc['target']):]
            self.assertTrue(s['text'].startswith(doc['context'] + doc['target']) and set(rest) <= set('.!?"\''), rest)
            mc = tinystories.ending_docs(s)
            self.assertEqual(len(mc['choices']), 4)
            self.assertEqual(mc['context'] + mc['choices'][mc['label']], s['text'])
            self.assertEqual(len({c.strip().lower() for c in mc['choices']}), 4, mc['choices'])
            self.assertFalse(mc['context'][-1].isspace())

    def test_distractors_are_near_in_length(self):
        """build.distractors draws among the `near` endings nearest in length: with near=1 each pick is the
        nearest one left (the function the committed file was drawn with)."""
        import random
        pool = [(i, '', 'x' * n + '.') for i, n in enumerate((10, 50, 12, 9, 30, 11))]
        self.assertEqual(sorted(map(len, build.distractors(random.Random(0), pool, 0, near=1))), [10, 12, 13])


class TestCommand(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.ckpt = tiny_checkpoint()
        cls.tmp = tempfile.mkdtemp(prefix='mixer_eval_')

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_eval(self, *args, env=None):
        """The command in this process, offline (HF_HUB_OFFLINE=1) unless `env` says otherwise."""
        return run_in_process('-m', 'experiments.eval_tasks', '--ckpt', self.ckpt, *args, timeout=300,
                              env=env or {**ENV, 'HF_HUB_OFFLINE': '1', 'HF_DATASETS_OFFLINE': '1'})

    def run_own_task(self, name, docs, yaml_rest):
        """A task of one's own, run: `docs` (dicts) in docs.jsonl of a folder of self.tmp and NAME.yaml reading
        them as its test split, then `yaml_rest` (the YAML's other lines); eval_tasks run on it with
        --include_path -> (the finished command, its JSON output); exit 0 asserted."""
        folder = os.path.join(self.tmp, name)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, 'docs.jsonl'), 'w') as f:
            f.writelines(json.dumps(doc) + '\n' for doc in docs)
        with open(os.path.join(folder, name + '.yaml'), 'w') as f:
            f.write(f'task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n'
                    f'    test: {folder}/docs.jsonl\n' + yaml_rest)
        out = os.path.join(self.tmp, name + '.json')
        r = self.run_eval('--tasks', name, '--include_path', folder, '--output', out)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        with open(out) as f:
            return r, json.load(f)

    def test_the_shipped_tasks_score_the_models_own_numbers(self):
        """--limit 3 on the three tasks: exit 0; the JSON holds each task's metrics, and the last-word task's
        perplexity is exp(-mean log-probability) of the 3 targets computed here from the checkpoint's model;
        the printed table shows its acc; train.py's bits per byte sits beside the rolling one."""
        out = os.path.join(self.tmp, 'three.json')
        r = self.run_eval('--tasks', 'tinystories_lastword,tinystories_ending,tinystories_bpb', '--limit', '3',
                          '--output', out)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        with open(out) as f:
            got = json.load(f)
        res = got['results']
        self.assertEqual(sorted(res), ['tinystories_bpb', 'tinystories_ending', 'tinystories_lastword'])
        for task, metrics in (('tinystories_lastword', ('acc', 'perplexity')), ('tinystories_ending', ('acc', 'acc_norm')),
                              ('tinystories_bpb', ('bits_per_byte', 'byte_perplexity', 'word_perplexity'))):
            for m in metrics:
                self.assertIn(f'{m},none', res[task])
        model, enc, _ = loading.load_checkpoint(self.ckpt)
        lls = []
        for s in tinystories.read_stories()[:3]:
            doc = tinystories.lastword_docs(s)
            ids = enc.encode(doc['context'] + doc['target'])
            lls.append(own_logprob(model, ids[-(model.cfg.n_ctx + 1):], len(ids) - len(enc.encode(doc['context'])))[0])
        self.assertAlmostEqual(math.log(res['tinystories_lastword']['perplexity,none']), -sum(lls) / 3, places=4)
        self.assertIn(f"|{res['tinystories_ending']['acc,none']:.4f}|", r.stdout.replace(' ', ''))
        # chance beside the multiple-choice task's acc and acc_norm (4 endings: 1/4), blank beside the others
        table = [line.replace(' ', '') for line in r.stdout.splitlines() if line.startswith('|')]
        self.assertTrue(table[0].endswith('|Stderr|chance|'), table[0])
        task = None
        for line in table[2:]:
            cells = line.split('|')
            task = cells[1] or task                     # a task's later rows leave its cell empty
            multiple_choice = task == 'tinystories_ending' and cells[5] in ('acc', 'acc_norm')
            self.assertTrue(line.endswith('|0.2500|' if multiple_choice else '||'), line)
        self.assertEqual(got['eval_tasks']['chance'], {'tinystories_ending': 0.25})
        cmp = got['eval_tasks']['train_py_bpb']
        self.assertIn(f"train.py on the same 3 stories: {cmp['windows']:.4f} (4 windows", r.stdout)
        self.assertEqual(cmp['n_windows'], 4)                   # the checkpoint's eval_windows
        self.assertLess(cmp['every_token_no_eot'], cmp['every_token'])
        self.assertEqual(set(got['eval_tasks']['requests']), {'loglikelihood', 'loglikelihood_rolling'})

    def test_a_generate_until_task_from_include_path(self):
        """A YAML task of one's own (a local JSON lines file, generate_until until '.', 6 tokens) whose first
        target is the checkpoint's greedy text (sample.generate, cut at '.') and whose second is not: exit 0,
        exact_match 0.5, 2 generate_until requests counted."""
        model, enc, _ = loading.load_checkpoint(self.ckpt)
        ids = enc.encode('Once upon a time')
        text = enc.decode(sample.generate(model, torch.tensor([ids]), 6, temperature=0)[0, len(ids):].tolist())
        want = text.split('<|endoftext|>')[0].split('.')[0]
        _, got = self.run_own_task(
            'my_next_words', [{'q': 'Once upon a time', 'a': a} for a in (want, want + 'x')],
            'output_type: generate_until\ntest_split: test\ndoc_to_text: "q"\ndoc_to_target: "a"\n'
            'generation_kwargs:\n  until: ["."]\n  max_gen_toks: 6\n  do_sample: false\n'
            'metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n')
        self.assertEqual(got['results']['my_next_words']['exact_match,none'], 0.5, want)
        self.assertEqual(got['eval_tasks']['requests']['generate_until']['requests'], 2)

    def test_chance_is_the_mean_of_one_over_each_documents_choices(self):
        """A multiple-choice task of one's own whose documents have 2, 4 and 5 choices: its chance is (1/2 +
        1/4 + 1/5) / 3, printed beside its acc and in the JSON."""
        docs = [{'q': 'Once upon a', 'choices': [' ' + c for c in choices], 'label': 0}
                for choices in (['time', 'day'], ['time', 'day', 'cat', 'dog'], ['a', 'b', 'c', 'd', 'e'])]
        r, got = self.run_own_task(
            'my_pick', docs, 'output_type: multiple_choice\ntest_split: test\ndoc_to_text: "{{q}}"\n'
            'doc_to_choice: "{{choices}}"\ndoc_to_target: label\n'
            'metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n')
        want = (1 / 2 + 1 / 4 + 1 / 5) / 3
        self.assertAlmostEqual(got['eval_tasks']['chance']['my_pick'], want, places=12)
        row, = [line for line in r.stdout.splitlines() if line.startswith('|my_pick')]
        self.assertTrue(row.replace(' ', '').endswith(f'|{want:.4f}|'), row)

    def test_the_default_output_is_in_the_runs_folder(self):
        """Without --output the results go to eval.json beside the checkpoint (in an exported folder: in it),
        not the working directory; a second run is refused without --overwrite, the first file kept."""
        run = os.path.join(self.tmp, 'run')
        os.makedirs(run, exist_ok=True)
        shutil.copy(self.ckpt, os.path.join(run, 'ckpt.pt'))
        args = ['-m', 'experiments.eval_tasks', '--ckpt', os.path.join(run, 'ckpt.pt'), '--tasks',
                'tinystories_lastword', '--limit', '1']
        env = {**ENV, 'HF_HUB_OFFLINE': '1'}
        r = run_in_process(*args, env=env, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        self.assertIn(f'wrote {run}/eval.json', r.stdout)
        with open(os.path.join(run, 'eval.json')) as f:
            first = f.read()
        self.assertIn('tinystories_lastword', json.loads(first)['results'])
        r = run_in_process(*args, env=env, timeout=300)
        self.assertEqual((r.returncode, error_lines(r.stderr)),
                         (2, [f'eval_tasks.py: error: {run}/eval.json exists; remove it, choose another '
                              'path, or pass --overwrite']))
        with open(os.path.join(run, 'eval.json')) as f:
            self.assertEqual(f.read(), first)

    def test_an_exported_folder_scores_as_its_checkpoint(self):
        """experiments/convert.py's export of the checkpoint (a folder, nothing unpickled) gets the same numbers."""
        folder = os.path.join(self.tmp, 'exported')
        r = run_in_process('-m', 'experiments.convert', '--ckpt', self.ckpt, '--out', folder, env=ENV)
        self.assertEqual(r.returncode, 0, r.stderr)
        got = []
        for ckpt in (self.ckpt, folder):
            out = os.path.join(self.tmp, f'{len(got)}.json')
            r = run_in_process('-m', 'experiments.eval_tasks', '--ckpt', ckpt, '--tasks', 'tinystories_lastword',
                               '--limit', '2', '--output', out, env={**ENV, 'HF_HUB_OFFLINE': '1'}, timeout=300)
            self.assertEqual(r.returncode, 0, r.stderr[-2000:])
            with open(out) as f:
                got.append(json.load(f)['results']['tinystories_lastword'])
        self.assertEqual(got[0], got[1])

    def test_bad_input_is_one_line_and_exit_2(self):
        """An unknown task (lm-eval's own tasks not indexed here: seconds), a task whose hub dataset is not
        cached (HF_HUB_OFFLINE=1, or no answer from the hub: at once, not after the hub client's retries), an
        empty task name, a missing --include_path, an existing --output: one line each, naming the cause."""
        hub = os.path.join(self.tmp, 'hub')
        os.makedirs(hub, exist_ok=True)
        with open(os.path.join(hub, 'hub.yaml'), 'w') as f:
            f.write('task: not_cached_here\ndataset_path: EleutherAI/no_such_dataset_for_tests\noutput_type: loglikelihood\n'
                    'test_split: test\ndoc_to_text: "a"\ndoc_to_target: "b"\n'
                    'metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n')
        existing = os.path.join(self.tmp, 'existing.json')
        open(existing, 'w').close()
        from lm_eval import tasks
        real = tasks.TaskManager

        def only_ours(include_path=None, include_defaults=True):        # lm-eval's 14,000 tasks unindexed
            return real(include_path=include_path, include_defaults=False)
        online = {k: v for k, v in ENV.items() if k not in ('HF_HUB_OFFLINE', 'HF_DATASETS_OFFLINE')}
        staged = OSError('staged: no network')
        no_answer = mock.patch('huggingface_hub.HfApi.dataset_info', side_effect=staged)
        for args, env, words in (
                (['--tasks', 'no_such_task'], None, ["unknown task 'no_such_task'"]),
                (['--tasks', 'not_cached_here', '--include_path', hub], None, ["task 'not_cached_here'", 'offline']),
                (['--tasks', 'not_cached_here', '--include_path', hub], online, ["task 'not_cached_here'", 'offline']),
                (['--tasks', 'tinystories_bpb,'], None, ['empty name']),
                (['--tasks', 'tinystories_bpb', '--include_path', os.path.join(self.tmp, 'none')], None, ['not found']),
                (['--tasks', 'tinystories_bpb', '--output', existing], None, ['exists', '--overwrite'])):
            with self.subTest(args[1], online=env is online), mock.patch.object(tasks, 'TaskManager', only_ours), \
                    no_answer:
                r = self.run_eval(*args, *([] if '--output' in args else ['--output', os.path.join(self.tmp, 'x.json')]),
                                  env=env)
                self.assertEqual(r.returncode, 2, r.stderr[-2000:])
                lines = error_lines(r.stderr)
                self.assertEqual(len(lines), 1, r.stderr)
                self.assertTrue(lines[0].startswith('eval_tasks.py: error: '), lines)
                for w in words:
                    self.assertIn(w, lines[0])
                if env is online:
                    self.assertIn('the Hugging Face Hub does not answer (OSError: staged: no network)', r.stdout)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, 'x.json')))


    def test_a_task_file_that_cannot_be_read_is_named(self):
        """--include_path tasks lm-eval cannot use, each one line naming the cause, exit 2, no offline advice (the
        hub does not answer here, HF_HUB_OFFLINE: the advice is for data the network could give): a YAML syntax
        error (lm-eval skips the file: it was 'unknown task'), no dataset_path (a TypeError), a template error,
        an empty answer (a target of '')."""
        docs = os.path.join(self.tmp, 'qa.jsonl')
        with open(docs, 'w') as f:
            f.write(json.dumps({'q': 'Once upon a', 'a': 'time', 'e': ''}) + '\n')
        head = f'dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {docs}\ntest_split: test\n'
        cases = {'broken': (f'task: broken\n{head}output_type: loglikelihood\ndoc_to_text: "q\ndoc_to_target: "a"\n',
                            ['broken.yaml', 'not valid YAML', 'line 9']),
                 'no_path': ('task: no_path\noutput_type: loglikelihood\ntest_split: test\ndoc_to_text: "q"\n'
                             'doc_to_target: "a"\n', ['no dataset_path']),
                 'template': (f'task: template\n{head}output_type: loglikelihood\ndoc_to_text: "{{{{q"\n'
                              'doc_to_target: "a"\n', ['TemplateSyntaxError']),
                 'empty_answer': (f'task: empty_answer\n{head}output_type: loglikelihood\ndoc_to_text: "q"\n'
                                  'doc_to_target: "e"\n', ["task 'empty_answer'", 'empty'])}
        for name, (yaml_text, words) in cases.items():
            folder = os.path.join(self.tmp, 'cases', name)
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f'{name}.yaml'), 'w') as f:
                f.write(f'{yaml_text}metric_list:\n  - metric: acc\n    aggregation: mean\n'
                        '    higher_is_better: true\n')
            with self.subTest(name):
                r = self.run_eval('--tasks', name, '--include_path', folder, '--output',
                                  os.path.join(self.tmp, f'{name}.json'))
                self.assertEqual(r.returncode, 2, r.stderr[-2000:])
                lines = error_lines(r.stderr, allow=(r'(examples/s|it/s)\]$',))     # datasets' and lm-eval's bars
                self.assertEqual(len(lines), 1, r.stderr)
                for w in words:
                    self.assertIn(w, lines[0])
                self.assertNotIn('offline', lines[0])


if __name__ == '__main__':
    unittest.main()
