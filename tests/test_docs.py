"""Documentation checks: python test_mixer.py test_docs

The project stands on its own: no file points to the team's private design notes
(their path or their section numbers), and the README explains every model kind,
how to read the code, and where the ideas come from. The README and the results
pages under docs/ name only scripts, flags, configs, variants, models, files and
code that exist, the README stays short (under 24,000 characters, a Results section of at
most 30 lines, no line outside a code block over 200 characters) and links every results page.
"""

import ast
import os
import re
import shlex
import subprocess
import unittest

import attention
import mixer

from tests.common import ROOT
NOTE = 'DES' + 'IGN'   # built so that this file does not match its own search
FORBIDDEN = ('../shared/' + NOTE, NOTE + ' section', NOTE + '.md')
SKIP_DIRS = {'.git', '__pycache__', 'out', 'tinystories'}
README_SECTIONS = ('How the models work', 'Reading the code', 'References')
README_MAX_CHARS = 24_000       # the whole README, in characters: results and detail belong under docs/
RESULTS_MAX_LINES = 30          # its "## Results" section: one short table of headlines
LINE_MAX_CHARS = 200            # any line outside a fenced code block (prose, tables)


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


def long_lines(text, limit=LINE_MAX_CHARS):
    """(line number, length) of every line of a markdown text longer than `limit` characters,
    except inside fenced code blocks (``` or ~~~), where a command stays on one line."""
    out, fence = [], None
    for n, line in enumerate(text.split('\n'), 1):
        mark = line.lstrip()[:3]
        if mark in ('```', '~~~'):
            fence = None if fence == mark else fence or mark
        elif fence is None and len(line) > limit:
            out.append((n, len(line)))
    return out


def readme_size_problems(text):
    """Why a README text is too long -> list of messages, [] when it is short enough: over
    README_MAX_CHARS characters, a Results section (up to the next '## ') over RESULTS_MAX_LINES
    lines or missing, a line outside a code block over LINE_MAX_CHARS characters."""
    problems = []
    if len(text) >= README_MAX_CHARS:
        problems.append(f'{len(text)} characters, the limit {README_MAX_CHARS}: move results to docs/')
    results = readme_section(text, 'Results').strip('\n')
    n_results = len(results.split('\n'))
    if not results.strip():
        problems.append('no "## Results" section')
    elif n_results > RESULTS_MAX_LINES:
        problems.append(f'Results has {n_results} lines, the limit {RESULTS_MAX_LINES}: the detail goes to docs/')
    problems += [f'line {n}: {k} characters, the limit {LINE_MAX_CHARS}: wrap it' for n, k in long_lines(text)]
    return problems


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
        """Every `Name` or `Name.attr` the section points to is in mixer.py or attention.py."""
        section = readme_section(self.text, 'How the models work')
        names = set(re.findall(r'`([A-Z_][A-Za-z_]*(?:\.[A-Za-z_]+)?)`', section))
        self.assertTrue(names)
        # an instance, so that attributes made in __init__ (LanguageModel.wpe) count too
        cfg = mixer.variant_config('posenc', vocab_size=8, n_ctx=4, d_model=8, n_layer=1, n_head=1)
        lm = mixer.LanguageModel(cfg)
        missing = []
        for name in sorted(names):
            cls, _, attr = name.partition('.')
            obj = getattr(mixer, cls, getattr(attention, cls, None))
            if obj is None or attr and not hasattr(lm if cls == 'LanguageModel' else obj, attr):
                missing.append(name)
        self.assertEqual(missing, [], 'README names code that mixer.py and attention.py do not have')


def doc_pages():
    """The pages the staleness checks read: README.md and every docs/*.md (relative to ROOT)."""
    docs = os.path.join(ROOT, 'docs')
    pages = sorted(f'docs/{f}' for f in os.listdir(docs) if f.endswith('.md')) if os.path.isdir(docs) else []
    return ['README.md'] + pages


def read_page(page):
    with open(os.path.join(ROOT, page), encoding='utf-8') as f:
        return f.read()


def line_of(text, pos):
    return text.count('\n', 0, pos) + 1


def readme_commands(text):
    """Every command a page shows, in code spans and code blocks -> list of
    (line, script path, [arguments]): `python X.py ...`, `python -m experiments.X ...` (as
    experiments/X.py) and `torchrun ... X.py ...`, cut at a comment, a pipe of a table or
    the end of the span."""
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
            out.append((line_of(text, m.start()), words[scripts[0]], words[scripts[0] + 1:]))
    return out


def flags_of(script):
    """The --flags a script accepts: train.py's settings, or the argparse options in
    its source and in the source of each module whose add_flags(parser) it calls
    (prepare.py's corpus.add_flags)."""
    if script == 'train.py':
        import train
        return set(train.DEFAULTS) | {'help'}
    with open(os.path.join(ROOT, script), encoding='utf-8') as f:
        text = f.read()
    for name in set(re.findall(r'(\w+)\.add_flags\(', text)):
        for folder in ('data', 'harness', 'experiments'):
            if os.path.isfile(os.path.join(ROOT, folder, name + '.py')):
                with open(os.path.join(ROOT, folder, name + '.py'), encoding='utf-8') as f:
                    text += f.read()
    return set(re.findall(r"""['"]--([A-Za-z_]+)['"]""", text)) | {'help'}


def bad_commands(page, text):
    """'page:line: problem' for every command of the page that names a script, flag,
    config file, variant or claims model the code does not have."""
    from experiments import claims
    bad = []

    def unknown(values, names):     # '' (a command wrapped in the text) and NAME placeholders pass
        return [v for v in values.split(',') if v and not v.isupper() and v not in names]
    for n, script, args in readme_commands(text):
        where = f'{page}:{n}: {script}'
        if not os.path.isfile(os.path.join(ROOT, script)):
            bad.append(f'{where}: no such script')
            continue
        flags = flags_of(script)
        for i, a in enumerate(args):
            value = a.split('=', 1)[1] if '=' in a else (args[i + 1] if i + 1 < len(args) else '')
            if a.startswith('--') and a[2:].split('=')[0] not in flags:
                bad.append(f'{where}: no flag {a.split("=")[0]}')
            elif a.endswith('.py') and not os.path.isfile(os.path.join(ROOT, a)):
                bad.append(f'{where}: no config file {a}')
            if a.split('=')[0] in ('--variant', '--variants'):
                bad += [f'{where}: no variant {v}' for v in unknown(value, mixer.VARIANTS)]
            if a.split('=')[0] == '--models':
                bad += [f'{where}: no claims model {v}' for v in unknown(value, claims.MODELS)]
    return bad


CODE_PATH = re.compile(r'`((?:assets|config|data|docs|experiments|tests)/[\w./-]+\.(?:png|py|md)|[a-z_]+\.py)`')
LINK = re.compile(r'\]\(([^)\s]+)\)')


def links(page, text):
    """(line, target, path relative to ROOT) of every markdown link of a page to a file
    of the repository: resolved relative to the page, without its #anchor."""
    out = []
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r'[a-z]+:', target) or target.startswith('#'):     # a web address, or this page
            continue
        path = os.path.normpath(os.path.join(os.path.dirname(page), target.split('#')[0]))
        out.append((line_of(text, m.start()), target, path))
    return out


def missing_files(page, text):
    """'page:line: ...' for every file the page points to that does not exist: code spans
    naming repository paths (`config/x.py`, `experiments/bench.py`, `train.py`: from the
    root) and markdown links (`docs/claims.md`, `../assets/x.png`: from the page)."""
    missing = [f'{page}:{line_of(text, m.start())}: no file {m.group(1)}' for m in CODE_PATH.finditer(text)
               if not os.path.isfile(os.path.join(ROOT, m.group(1)))]
    missing += [f'{page}:{n}: link to {target}: no file {path}' for n, target, path in links(page, text)
                if not os.path.exists(os.path.join(ROOT, path))]
    return missing


def python_names(rel):
    """(top-level names, {class: its attributes}) that a Python file of the project defines."""
    with open(os.path.join(ROOT, rel), encoding='utf-8') as f:
        tree = ast.parse(f.read())
    top, classes = set(), {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            top.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                top |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        if isinstance(node, ast.ClassDef):
            attrs = classes.setdefault(node.name, set())
            for sub in ast.walk(node):
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    attrs.add(sub.name)
                elif isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store) \
                        and isinstance(sub.value, ast.Name) and sub.value.id == 'self':
                    attrs.add(sub.attr)
                elif isinstance(sub, (ast.Assign, ast.AnnAssign)):
                    for target in (sub.targets if isinstance(sub, ast.Assign) else [sub.target]):
                        attrs |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return top, classes


def project_modules():
    """{module name: path} of the project's Python files that the README names by module:
    the top level, data/ and experiments/."""
    mods = {}
    for folder in ('.', 'data', 'experiments'):
        for f in sorted(os.listdir(os.path.join(ROOT, folder))):
            if f.endswith('.py') and not f.startswith('_'):
                mods.setdefault(f[:-3], os.path.normpath(os.path.join(folder, f)))
    return mods


FILE_EXTENSIONS = ('py', 'md', 'bin', 'json', 'jsonl', 'txt', 'png', 'pt', 'tiktoken')


class TestReadingOrder(unittest.TestCase):
    def test_dotted_names_exist(self):
        """Every `module.name` (`machine.setup_device`, `sample.Decoder`) and `Class.attr`
        (`Decoder.step`) that "How the models work" and "Reading the code" name is
        defined in the project's code, wherever it lives."""
        text = read_page('README.md')
        sections = readme_section(text, 'How the models work') + readme_section(text, 'Reading the code')
        modules = project_modules()
        names = {rel: python_names(rel) for rel in modules.values()}
        classes = {}
        for _, cls in names.values():
            for c, attrs in cls.items():
                classes.setdefault(c, set()).update(attrs)
        dotted = set(re.findall(r'`([A-Za-z_]\w*)\.([A-Za-z_]\w*)`', sections))
        self.assertIn(('machine', 'setup_device'), dotted)
        missing = []
        for first, second in sorted(dotted):
            if second in FILE_EXTENSIONS:            # `train.py`, `train.bin`: files, checked above
                continue
            if first in modules:
                ok = second in names[modules[first]][0]
            elif first.lstrip('_')[:1].isupper():
                ok = second in classes.get(first, ())
            else:                                   # enc.decode, tiktoken.Encoding: not the project's
                continue
            if not ok:
                missing.append(f'{first}.{second}')
        self.assertEqual(missing, [], 'the README names code that does not exist where it says')


class TestReadmeCommands(unittest.TestCase):
    """The README and the results pages under docs/ name only what the code has: every
    command's script, config file, flags, variants and claims models, and every file they
    point to (a cheap guard against results tables that no longer match the code)."""

    @classmethod
    def setUpClass(cls):
        cls.pages = {page: read_page(page) for page in doc_pages()}

    def test_every_page_names_what_the_code_has(self):
        self.assertIn('docs/claims.md', self.pages)
        n_commands = sum(len(readme_commands(text)) for text in self.pages.values())
        self.assertGreater(n_commands, 30)
        self.assertGreater(len(readme_commands(self.pages['README.md'])), 20)
        bad = []
        for page, text in self.pages.items():
            bad += bad_commands(page, text) + missing_files(page, text)
        self.assertEqual(bad, [], 'commands or files on these pages that the code does not have')

    def test_figures_are_shown(self):
        """Every figure in assets/ is on some page, linked from where that page lives."""
        shown = {path for page, text in self.pages.items() for _, _, path in links(page, text)}
        figures = {f'assets/{f}' for f in os.listdir(os.path.join(ROOT, 'assets')) if f.endswith('.png')}
        self.assertIn('assets/claims_curves.png', figures)
        self.assertEqual(sorted(figures - shown), [], 'figures no page shows')

    def test_readme_is_short(self):
        """Under README_MAX_CHARS characters, a Results section of at most RESULTS_MAX_LINES lines,
        no line outside a code block over LINE_MAX_CHARS: the detail lives on the docs/ pages."""
        self.assertEqual(readme_size_problems(self.pages['README.md']), [], 'README.md is too long')

    def test_size_check_sees_each_excess(self):
        """readme_size_problems itself: a short README passes; one too long, one with a long Results
        section and one with a long prose line each fail; a long line in a code block passes."""
        short = '# t\n\n```bash\n' + 'x' * 300 + '\n```\n\n## Results\n\n| a | b |\n|---|---|\n\n## References\n'
        self.assertEqual(readme_size_problems(short), [])
        for broken, why in [(short + 'word\n' * 8000, 'characters, the limit'),
                            (short.replace('|---|---|\n', '|---|---|\n' + '| 1 | 2 |\n' * 30), 'Results has'),
                            (short + 'y' * 201 + '\n', 'line 13: 201 characters'),
                            (short.replace('## Results', '## Outcomes'), 'no "## Results"')]:
            problems = readme_size_problems(broken)
            self.assertEqual(len(problems), 1, problems)
            self.assertIn(why, problems[0])

    def test_readme_links_every_page(self):
        text = self.pages['README.md']
        linked = {path for _, _, path in links('README.md', text)}
        unlinked = [p for p in self.pages if p != 'README.md' and p not in linked]
        self.assertEqual(unlinked, [], 'docs pages the README does not link')
        for page in self.pages:        # the results pages say what they measure, how, and on what
            if page != 'README.md':
                self.assertIn('Machine:', self.pages[page], f'{page} does not name its machine')


if __name__ == '__main__':
    unittest.main()
