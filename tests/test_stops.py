"""A stopped run keeps its steps, and three silent bugs stay fixed (issue 87): python test_mixer.py test_stops

SIGTERM saves the step reached and exits 143 (Ctrl-C's 130 is test_faults'); a second Ctrl-C during that
save stops at once with the previous checkpoint whole; save_interval writes checkpoints between evaluations;
a folder holding only a log is refused with what it holds; `--key value` reads as `--key=value`; every
'train' record carries the machine's load. The bugs: every rank resumes rank 0's window generator (a run
resumed on more processes draws as draw_windows' rule says), the training windows' bits per byte use the
training split's bytes per token.
"""

import math
import os
import signal
import tempfile
import time
import unittest
from types import SimpleNamespace
from unittest import mock

import torch

from harness import checkpoint
from tests.common import read_log, run_in_process, tiny_model
from tests.faults import ENV, TINY, Base, ckpt_step, kill_session, popen, records, train


class TestStops(Base):

    def paused(self, name, signals, env=()):
        """A run paused by the faults wrapper in step 8 (checkpoint of step 5 written, save_interval 0), sent
        `signals` one after another once it is there -> (exit code, stderr, its folder)."""
        out, pause = self.folder(name), os.path.join(self.f.tmp, f'{name}.paused')
        p = popen([self.f.wrapper, f'--data_dir={self.f.data}', *TINY, '--max_iters=1000', '--eval_interval=5',
                   '--save_interval=0', '--log_interval=1', f'--out_dir={out}'],
                  env={**ENV, 'PAUSE_AT': '8', 'PAUSE_FILE': pause, **dict(env)})
        try:
            t0 = time.time()
            while not os.path.exists(pause) and p.poll() is None and time.time() - t0 < 600:
                time.sleep(0.05)
            for s in signals:
                os.killpg(p.pid, s)
            _, err = p.communicate(timeout=300)
        finally:
            kill_session(p)
        return p.returncode, err, out

    def folder(self, name):
        return os.path.join(tempfile.mkdtemp(prefix='mixer_stops_', dir=self.f.tmp), name)

    def test_sigterm_saves_the_step_reached(self):
        """SIGTERM (a scheduler's stop) in step 8: the step is saved, exit 143, one line naming it."""
        code, err, out = self.paused('sigterm', [signal.SIGTERM])
        line = self.assert_fault(SimpleNamespace(returncode=code, stdout='', stderr=err), 143,
                                 ['terminated (SIGTERM) at step 8', 'holds step 8', '--init_from=resume'])
        self.assertEqual(ckpt_step(os.path.join(out, 'ckpt.pt')), 8, line)

    def test_a_second_ctrl_c_during_the_stop_save_keeps_the_previous_checkpoint(self):
        """Ctrl-C in step 8, then a second one while the step-8 checkpoint is being written (the wrapper's
        SIGINT_IN_SAVE on the run's second torch.save): the save stops at once, ckpt.pt still holds step 5
        whole, no temporary file is left, and the line says so."""
        code, err, out = self.paused('second_ctrl_c', [signal.SIGINT], env={'SIGINT_IN_SAVE': '2'})
        self.assert_fault(SimpleNamespace(returncode=code, stdout='', stderr=err), 130,
                          ['interrupted (Ctrl-C) at step 8', 'holds step 5'])
        self.assertEqual(ckpt_step(os.path.join(out, 'ckpt.pt')), 5)
        self.assertEqual(sorted(set(os.listdir(out)) - {'.lock'}), ['ckpt.pt', 'log.jsonl'])

    def test_save_interval_saves_between_evaluations(self):
        """save_interval=3 with evaluations at 0 and 7 only: checkpoints of steps 3, 6 and 7, each after its
        step's loss was checked finite."""
        saved, real = [], checkpoint.save_checkpoint

        def save(path, model, model_config, config, step, *a, **k):
            saved.append(step)
            return real(path, model, model_config, config, step, *a, **k)
        with mock.patch.object(checkpoint, 'save_checkpoint', save):
            r = train('--max_iters=7', '--eval_interval=1000', '--save_interval=3', '--log_interval=1',
                      f'--out_dir={self.folder("interval")}', data=self.f.data, in_process=True)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        self.assertEqual(saved, [3, 6, 7])

    def test_a_folder_with_only_a_log_is_refused_with_what_it_holds(self):
        """A run stopped before its first checkpoint leaves log.jsonl alone: a fresh run there is refused in
        one line that says there is nothing to resume and how to replace it."""
        out = self.folder('log_only')
        os.makedirs(out)
        with open(os.path.join(out, 'log.jsonl'), 'w') as f:
            f.write('{"event": "config"}\n')
        r = train('--max_iters=2', f'--out_dir={out}', data=self.f.data, in_process=True)
        self.assert_fault(r, 2, ['saved no checkpoint', 'nothing to resume', '--overwrite=True'])

    def test_key_space_value_reads_as_key_equals_value(self):
        """`--max_iters 3 --learning_rate 1e-3` sets what `--max_iters=3 --learning_rate=1e-3` sets; a last flag
        without its value is one line, exit 2."""
        out = self.folder('spaced')
        r = train('--max_iters', '3', '--learning_rate', '1e-3', f'--out_dir={out}', data=self.f.data,
                  in_process=True)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        cfg = next(e for e in read_log(out) if e['event'] == 'config')['config']
        self.assertEqual((cfg['max_iters'], cfg['learning_rate']), (3, 1e-3))
        r = train(f'--out_dir={self.folder("dangling")}', '--max_iters', data=self.f.data, in_process=True)
        self.assert_fault(r, 2, ["expected --key=value or --key value, got '--max_iters'"])

    def test_every_train_record_carries_the_machines_load(self):
        """Each 'train' record has other_load (cores busy with other processes' work, >= 0, or None where
        /proc/stat cannot be read) and the summary their mean."""
        out = self.folder('load')
        r = train('--max_iters=4', '--log_interval=2', f'--out_dir={out}', data=self.f.data, in_process=True)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        loads = [e['other_load'] for e in read_log(out) if e['event'] == 'train']
        self.assertEqual(len(loads), 2)
        for load in loads:
            self.assertTrue(load is None or load >= 0, loads)
        summary = next(e for e in read_log(out) if e['event'] == 'summary')
        self.assertIn('other_load', summary)


class TestSilentBugs(unittest.TestCase):

    def test_every_rank_resumes_rank_0s_window_generator(self):
        """A checkpoint of one process resumed on two: both ranks restore rank 0's window generator, so they
        draw the same [world, ...] windows and each takes its row (before: rank 1 kept a fresh seed-1337
        generator and drew other windows than rank 0's)."""
        import train
        model = tiny_model('flat')
        gen = torch.Generator().manual_seed(1337)
        train.draw_windows(gen, 1000, 8, 4, 1, 1)                   # the saved run drew some windows first
        ckpt = {'model': model.state_dict(), 'step': 3, 'best_val_loss': 1.0, 'tokens_seen': 96,
                'config': {}, 'rng': [{'torch': torch.get_rng_state(), 'batch': gen.get_state(), 'cuda': None}]}
        draws = []
        for rank in (0, 1):
            mine = torch.Generator().manual_seed(1337)
            env = SimpleNamespace(rank=rank, master=rank == 0, cuda=False)
            self.assertEqual(checkpoint.restore(ckpt, model, [], mine, env)[:2], (3, 96))
            draws.append(train.draw_windows(mine, 1000, 8, 4, 1, 2))
        torch.testing.assert_close(draws[0], draws[1])
        torch.testing.assert_close(draws[0], train.draw_windows(gen, 1000, 8, 4, 1, 2))

    def test_an_older_checkpoint_counts_its_tokens_from_its_settings(self):
        """A checkpoint without tokens_seen: step x batch_size x n_ctx x grad_accum x its processes."""
        model = tiny_model('flat')
        rng = {'torch': torch.get_rng_state(), 'batch': torch.Generator().get_state(), 'cuda': None}
        ckpt = {'model': model.state_dict(), 'step': 5, 'best_val_loss': 1.0, 'rng': [rng, rng],
                'config': {'batch_size': 4, 'n_ctx': 8, 'grad_accum': 2}}
        env = SimpleNamespace(rank=0, master=True, cuda=False)
        self.assertEqual(checkpoint.restore(ckpt, model, [], torch.Generator(), env)[1], 5 * 4 * 8 * 2 * 2)

    def test_training_windows_bits_per_byte_use_the_training_splits_bytes(self):
        """evaluate_splits with eval_train: the training windows' bits per byte is their loss over ln 2 over
        train's bytes per token, not val's (before: val's, 1.2% low on the shared data)."""
        import numpy as np
        import train
        model = tiny_model('flat').train()
        data = np.random.default_rng(0).integers(0, 64, 500).astype(np.uint16)
        cfg = {'n_ctx': 8, 'batch_size': 4, 'eval_windows': 4, 'task': 'lm', 'eval_train': True}
        meta = {'val': {'bytes_per_token': 4.0}, 'train': {'bytes_per_token': 2.0}}
        ev = train.evaluate_splits(model, data, data, cfg, 'cpu', torch.autocast('cpu', enabled=False), meta)
        self.assertAlmostEqual(ev['train_windows_bpb'], ev['train_windows_loss'] / math.log(2) / 2.0)
        self.assertAlmostEqual(ev['val_bpb'], ev['val_loss'] / math.log(2) / 4.0)


if __name__ == '__main__':
    unittest.main()
