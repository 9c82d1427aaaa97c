"""The three TinyStories tasks' documents, for lm-evaluation-harness (the YAML files beside this one name these
functions with `!function tinystories.NAME`; lm-eval loads this file by its path, so it imports nothing of
the project, and `datasets` only where a task is loaded).

Every task reads the same held-out stories, tinystories_heldout.jsonl beside this file (build.py wrote it
from TinyStories' validation text, which no checkpoint of this project trains on), one JSON object a line:
{"id": the story's number in valid.txt, "text": the story, stripped, "distractors": 3 endings of other
stories, "label": where the true ending stands among the 4 choices (0..3)}. From a story:

  tinystories_lastword  LAMBADA's protocol (Paperno et al. 2016; lm-eval's lambada_openai): the context is
                        the story up to its last word, the target " word" (the final punctuation dropped);
                        loglikelihood -> acc (the word is the greedy continuation) and perplexity.
  tinystories_ending    HellaSwag's protocol (Zellers et al. 2019; lm-eval's hellaswag): the context is the
                        story up to its last sentence, the choices that sentence and 3 last sentences of
                        other stories (of about its length), each after the story's own whitespace before
                        its last sentence; multiple_choice -> acc and acc_norm (log-likelihood per byte).
  tinystories_bpb       the story whole, through loglikelihood_rolling -> bits_per_byte, byte_perplexity,
                        word_perplexity (lm-eval's wikitext protocol).

    last_word('They played all day.')       # -> ('They played all', 'day')
    last_sentence('A cat sat. It was red.')  # -> ('A cat sat.', ' ', 'It was red.')
"""

import json
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, 'tinystories_heldout.jsonl')

_LAST_WORD = re.compile(r' ([A-Za-z]+)[.!?"\']*\Z')                 # ' word' then closing punctuation only
_SENTENCE_END = re.compile(r'[.!?]["\']?(?=\s+["\']?[A-Z])')         # a cut after '.', '!"', ... before a capital


def last_word(text):
    """A story (str) -> (context, word): the text before its last word's space and that word (letters only), or
    None when the story does not end in one space, a word of letters and closing punctuation ('.', '!"')."""
    m = _LAST_WORD.search(text)
    return (text[:m.start()], m.group(1)) if m and m.start() > 0 else None


def last_sentence(text, min_words=4, max_words=40):
    """A story (str) -> (context, whitespace, ending): the text before its last sentence (ending in '.', '!',
    '?', maybe a closing quote), the whitespace between, and the last sentence; or None when the story has no
    cut before a capital letter, or its last sentence has fewer than min_words or more than max_words words."""
    cuts = [m.end() for m in _SENTENCE_END.finditer(text)]
    if not cuts:
        return None
    context, rest = text[:cuts[-1]], text[cuts[-1]:]
    ending = rest.lstrip()
    if not min_words <= len(ending.split()) <= max_words:
        return None
    return context, rest[:len(rest) - len(ending)], ending


def read_stories(path=DATA):
    """The held-out stories of `path` (JSON lines) -> list of dicts (id, text, distractors, label)."""
    with open(path, encoding='utf-8') as f:
        return [json.loads(line) for line in f if line.strip()]


def lastword_docs(story):
    """A story's tinystories_lastword document: {context, target} (target ' word')."""
    context, word = last_word(story['text'])
    return {'context': context, 'target': ' ' + word}


def ending_docs(story):
    """A story's tinystories_ending document: {context, choices (4 str, each after the story's whitespace
    before its last sentence), label}."""
    context, space, ending = last_sentence(story['text'])
    choices = list(story['distractors'])
    choices.insert(story['label'], ending)
    return {'context': context, 'choices': [space + c for c in choices], 'label': story['label']}


def _dataset(make, **kwargs):
    """{'test': datasets.Dataset} of make(story) for every held-out story (lm-eval's custom_dataset; its
    metadata keyword arguments are ignored)."""
    import datasets                     # here: the rest of the project runs without it
    return {'test': datasets.Dataset.from_list([make(s) for s in read_stories()])}


def lastword(**kwargs):
    """tinystories_lastword's dataset."""
    return _dataset(lastword_docs)


def ending(**kwargs):
    """tinystories_ending's dataset."""
    return _dataset(ending_docs)


def bpb(**kwargs):
    """tinystories_bpb's dataset: {text} a story."""
    return _dataset(lambda s: {'text': s['text']})
