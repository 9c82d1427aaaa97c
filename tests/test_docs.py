"""Documentation checks: python test_mixer.py test_docs

The project stands on its own: no file points to the team's private design notes
(their path or their section numbers), and the README explains every model kind,
how to read the code, and where the ideas come from.
"""

import os
import re
import shlex
import subprocess
import unittest

import mixer

from tests.common import ROOT
NOTE = 'DES' + 'IGN'   # built so that this file does not match its own search
FORBIDDEN = ('../shared/' + NOTE, NOTE + ' section', NOTE + '.md')
SKIP_DIRS = {'.git', '__pycache__', 'out', 'tinystories'}
README_SECTIONS = ('How the models work', 'Reading the code', 'References')


def project_files():
    """Paths (relative to ROOT) of the files git tracks, plus new files it does not
    ignore; without git, every file under ROOT outside SKIP_DIRS and out*/."""
    try:
        out = subprocess.run(['git', 'ls-files', '--cached', '--others', '--exclude-standard', '-z'],
                             cwd=ROOT, capture_output=True, check=True).stdout
        return sorted({p for p in out.decode('utf-8').split('\0') if p})
    except (OSError, subprocess.CalledProcessError):
        found = []
        for dirpath, dirnames, filenames in os.walk(ROOT):
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith('out')]
            found += [os.path.relpath(os.path.join(dirpath, f), ROOT) for f in filenames]
        return sorted(found)


def readme_section(text, title):
    """Body of the '## title' section of a markdown text ('' if absent)."""
    m = re.search(rf'^## {re.escape(title)}[ \t]*\n(.*?)(?=^## |\Z)', text, re.M | re.S)
    return m.group(1) if m else ''


class TestNoPrivateReferences(unittest.TestCase):
    def test_no_file_mentions_the_design_notes(self):
        files = project_files()
        self.assertIn('README.md', files)
        hits = []
        for rel in files:
            try:
                with open(os.path.join(ROOT, rel), encoding='utf-8') as f:
                    for n, line in enumerate(f, 1):
                        hits += [f'{rel}:{n}: {line.strip()[:100]}' for s in FORBIDDEN if s in line]
            except (OSError, UnicodeDecodeError):   # deleted in the work tree, or binary
                continue
        self.assertEqual(hits, [], 'files refer to the private design notes; explain in the README instead')


class TestReadme(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(os.path.join(ROOT, 'README.md'), encoding='utf-8') as f:
            cls.text = f.read()

    def test_sections_present(self):
        for title in README_SECTIONS:
            self.assertTrue(readme_section(self.text, title).strip(), f'README has no "## {title}" section')

    def test_every_variant_explained(self):
        section = readme_section(self.text, 'How the models work')
        missing = [name for name in mixer.VARIANTS if f'`{name}`' not in section]
        self.assertEqual(missing, [], 'variants missing from README "How the models work"')

    def test_named_code_exists(self):
        """Every `Name` or `Name.attr` the section points to is in mixer.py."""
        section = readme_section(self.text, 'How the models work')
        names = set(re.findall(r'`([A-Z_][A-Za-z_]*(?:\.[A-Za-z_]+)?)`', section))
        self.assertTrue(names)
        # an instance, so that attributes made in __init__ (LanguageModel.wpe) count too
        lm = mixer.LanguageModel(mixer.variant_config('posenc', vocab_size=8, n_ctx=4, d_model=8, n_layer=1))
        missing = []
        for name in sorted(names):
            cls, _, attr = name.partition('.')
            obj = getattr(mixer, cls, None)
            if obj is None or attr and not hasattr(lm if cls == 'LanguageModel' else obj, attr):
                missing.append(name)
        self.assertEqual(missing, [], 'README names code that mixer.py does not have')


def readme_commands(text):
    """Every command the README shows, in code spans and code blocks -> list of
    (script path, [arguments]): `python X.py ...`, `python -m experiments.X ...` (as
    experiments/X.py) and `torchrun ... X.py ...`, cut at
    a comment, a pipe of a table or the end of the span."""
    out = []
    for m in re.finditer(r'(?:python|torchrun)\s[^`\n|]*', text):
        line = m.group(0).split('  #')[0].split(' && ')[0]
        try:
            words = shlex.split(line)
        except ValueError:                     # an unbalanced quote: the plain words will do
            words = line.split()
        words = [f'{w.replace(".", "/")}.py' if i and words[i - 1] == '-m' else w for i, w in enumerate(words)]
        scripts = [i for i, w in enumerate(words) if w.endswith('.py')]
        if scripts:
            out.append((words[scripts[0]], words[scripts[0] + 1:]))
    return out


def flags_of(script):
    """The --flags a script accepts: train.py's settings, or the argparse options in
    its source."""
    if script == 'train.py':
        import train
        return set(train.DEFAULTS) | {'help'}
    with open(os.path.join(ROOT, script), encoding='utf-8') as f:
        return set(re.findall(r"""['"]--([A-Za-z_]+)['"]""", f.read())) | {'help'}


class TestReadmeCommands(unittest.TestCase):
    """The README names only what the code has: every command's script, config file,
    flags, variants and claims models, and every file it points to (a cheap guard
    against results tables that no longer match the code)."""

    @classmethod
    def setUpClass(cls):
        with open(os.path.join(ROOT, 'README.md'), encoding='utf-8') as f:
            cls.text = f.read()
        cls.commands = readme_commands(cls.text)

    def test_commands_name_what_the_code_has(self):
        from experiments import claims
        self.assertGreater(len(self.commands), 30)
        bad = []

        def unknown(values, names):     # '' (a command wrapped in the text) and NAME placeholders pass
            return [v for v in values.split(',') if v and not v.isupper() and v not in names]
        for script, args in self.commands:
            if not os.path.isfile(os.path.join(ROOT, script)):
                bad.append(f'{script}: no such script')
                continue
            flags = flags_of(script)
            for i, a in enumerate(args):
                value = a.split('=', 1)[1] if '=' in a else (args[i + 1] if i + 1 < len(args) else '')
                if a.startswith('--') and a[2:].split('=')[0] not in flags:
                    bad.append(f'{script}: no flag {a.split("=")[0]}')
                elif a.endswith('.py') and not os.path.isfile(os.path.join(ROOT, a)):
                    bad.append(f'{script}: no config file {a}')
                if a.split('=')[0] in ('--variant', '--variants'):
                    bad += [f'{script}: no variant {v}' for v in unknown(value, mixer.VARIANTS)]
                if a.split('=')[0] == '--models':
                    bad += [f'{script}: no claims model {v}' for v in unknown(value, claims.MODELS)]
        self.assertEqual(bad, [], 'README commands name what the code does not have')

    def test_files_it_points_to_exist(self):
        paths = set(re.findall(r'[(`]((?:assets|config|data)/[\w./-]+\.(?:png|py|md))[)`]', self.text))
        paths |= set(re.findall(r'`((?:experiments/|tests/)?[a-z_]+\.py)`', self.text))
        self.assertIn('assets/claims_curves.png', paths)
        missing = sorted(p for p in paths if not os.path.isfile(os.path.join(ROOT, p)))
        self.assertEqual(missing, [], 'README points to files that do not exist')


if __name__ == '__main__':
    unittest.main()
