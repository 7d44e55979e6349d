"""The built-in graded workload: short questions with exact, automatically checked answers.

A pass rate from n graded items has a 95% interval of about +-1/sqrt(n), so telling two
configurations' quality apart needs hundreds of items, and items a small model gets right only
some of the time (a 135M model: small sums, picking a field out of a sentence, following a format,
copying, single-word translations, yes/no facts, a number remembered across two turns). Answers are
a word or a number, so `max_tokens` stays small and the whole set runs in minutes.

Every item carries a short system message (SYSTEM) in place of the chat template's default one: the
model is told to answer with the answer only, so prompts are ~10 tokens shorter, answers stop sooner and
pass more often (on the embedded model, 64 items: fp32 19 -> 24 passed, W4A16 22 -> 26, answers 13.5 -> 11
tokens), which is what a graded short-answer set wants.

Generated from a seed (same seed, same items, same order); the families are interleaved, so any
prefix (`limit`) covers every task kind. `builtin-graded` in bench/workload.py reads it.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Callable

from specledger.records.question import Question

DEFAULT_SIZE = 320
MAX_NEW_TOKENS = 16
SYSTEM = "Answer with the answer only."

_CITIES = "Paris Lisbon Madrid Berlin Vienna Dublin Oslo Rome Prague Warsaw Athens Cairo Tokyo Lima".split()
_NAMES = "Anna Ben Clara David Emma Felix Grace Henry Iris Jack Laura Marco Nina Oscar Paula Sam".split()
_COLOURS = "red blue green yellow black white orange purple brown pink".split()
_ITEMS = "apple river chair window garden bottle pencil candle mirror ladder basket button".split()
_WORDS = {  # English -> French, Spanish, German (common single words)
    "cat": ("chat", "gato", "Katze"), "dog": ("chien", "perro", "Hund"), "house": ("maison", "casa", "Haus"),
    "water": ("eau", "agua", "Wasser"), "bread": ("pain", "pan", "Brot"), "book": ("livre", "libro", "Buch"),
    "sun": ("soleil", "sol", "Sonne"), "tree": ("arbre", "árbol|arbol", "Baum"), "red": ("rouge", "rojo", "rot"),
    "one": ("un|une", "uno|una", "eins"), "two": ("deux", "dos", "zwei"), "three": ("trois", "tres", "drei"),
    "hello": ("bonjour|salut", "hola", "hallo"), "thank you": ("merci", "gracias", "danke"),
    "milk": ("lait", "leche", "Milch"), "car": ("voiture", "coche|carro|auto", "Auto|Wagen"),
}
_LANGS = ("French", "Spanish", "German")
_FACTS = [  # (question, answer)
    ("Is the sun a star?", "yes"), ("Is water wet?", "yes"), ("Do fish live in water?", "yes"),
    ("Is ice cold?", "yes"), ("Do birds have feathers?", "yes"), ("Is Paris in France?", "yes"),
    ("Is the moon bigger than the earth?", "no"), ("Can a dog fly?", "no"), ("Is fire cold?", "no"),
    ("Do cats bark?", "no"), ("Is the sea made of sand?", "no"), ("Is two bigger than five?", "no"),
    ("Is snow white?", "yes"), ("Do trees have leaves?", "yes"), ("Is a car an animal?", "no"),
    ("Is a week seven days long?", "yes"), ("Do people breathe air?", "yes"), ("Is grass blue?", "no"),
    ("Is one plus one two?", "yes"), ("Can a stone swim?", "no"),
]
_TOPICS = [  # (text, accepted one-word topics)
    ("The puppy wagged its tail and barked at the mailman every morning.", "dog|dogs|puppy|puppies|pet|pets"),
    ("We mixed flour, eggs and sugar, then baked it for forty minutes.", "baking|cake|cooking|food|recipe|bread"),
    ("The team scored twice in the second half and won the final.", "football|soccer|sport|sports|match|game"),
    ("Heavy rain and strong winds are expected across the coast tonight.", "weather|storm|rain|forecast"),
    ("She practised the piano for two hours before the concert.", "music|piano|concert|practice"),
    ("The train left the station late and arrived an hour after noon.", "train|trains|travel|transport|railway"),
    ("He planted tomatoes and watered the roses in the garden.", "gardening|garden|plants|flowers"),
    ("The kitten slept in a box and chased a ball of yarn.", "cat|cats|kitten|kittens|pet|pets"),
]


def _arithmetic(rng: random.Random, i: int) -> Question:
    a, b = rng.randint(2, 19), rng.randint(2, 19)
    op = rng.choice(["+", "-", "+", "*"]) if i % 3 else "+"
    if op == "-" and b > a:
        a, b = b, a
    answer = {"+": a + b, "-": a - b, "*": a * b}[op]
    word = {"+": "plus", "-": "minus", "*": "times"}[op]
    text = f"What is {a} {word} {b}? Answer with the number only."
    return Question(f"arith-{i}", "arithmetic", "math", (text,), (f"number:{answer}",), MAX_NEW_TOKENS)


def _extraction(rng: random.Random, i: int) -> Question:
    name, city, n = rng.choice(_NAMES), rng.choice(_CITIES), rng.randint(100, 999)
    colour = rng.choice(_COLOURS)
    field, answer = rng.choice([("city", city), ("name of the customer", name), ("order number", str(n)),
                                ("colour", colour)])
    text = (f"Text: \"{name} ordered a {colour} bag (order {n}), shipped to {city}.\"\n"
            f"What is the {field}? Answer with one word.")
    return Question(f"extract-{i}", "extraction", "rag", (text,), (f"contains:{answer}",), MAX_NEW_TOKENS)


def _format(rng: random.Random, i: int) -> Question:
    word = rng.choice(_ITEMS + _COLOURS)
    text = f"Write the word \"{word}\" in capital letters. Answer with one word in capitals."
    return Question(f"format-{i}", "format", "qa", (text,), (f"caps:{word.upper()}",), MAX_NEW_TOKENS)


def _copy(rng: random.Random, i: int) -> Question:
    words = rng.sample(_ITEMS + _COLOURS, 3)
    phrase = " ".join(words)
    text = f"Repeat exactly, and nothing else: {phrase}"
    return Question(f"copy-{i}", "copy", "qa", (text,), (f"contains:{phrase}",), MAX_NEW_TOKENS)


def _translation(rng: random.Random, i: int) -> Question:
    en = rng.choice(sorted(_WORDS))
    k = rng.randrange(len(_LANGS))
    text = f"Translate the English word \"{en}\" into {_LANGS[k]}. Answer with one word."
    return Question(f"translate-{i}", "translation", "translation", (text,), (f"contains:{_WORDS[en][k]}",),
                    MAX_NEW_TOKENS)


def _yes_no(rng: random.Random, i: int) -> Question:
    q, a = rng.choice(_FACTS)
    return Question(f"yesno-{i}", "yes-no", "qa", (f"{q} Answer yes or no.",), (f"word:{a}",), MAX_NEW_TOKENS)


def _topic(rng: random.Random, i: int) -> Question:
    t, topics = rng.choice(_TOPICS)
    text = f"Text: \"{t}\"\nIn one word, what is this text about?"
    return Question(f"topic-{i}", "topic", "summarization", (text,), (f"contains:{topics}",), MAX_NEW_TOKENS)


def _recall(rng: random.Random, i: int) -> Question:
    n = rng.randint(2, 99)
    turns = (f"Remember this number: {n}. Reply with OK.", "What number did I ask you to remember? "
             "Answer with the number only.")
    return Question(f"recall-{i}", "recall", "multi_turn", turns, ("", f"number:{n}"), MAX_NEW_TOKENS)


FAMILIES: tuple[Callable[[random.Random, int], Question], ...] = (
    _arithmetic, _extraction, _format, _copy, _translation, _yes_no, _topic, _recall)


def graded_questions(n: int = DEFAULT_SIZE, seed: int = 0) -> list[Question]:
    """n items, the families taken in turn, each family drawing from its own seeded stream."""
    streams = [random.Random(f"{seed}:{f.__name__}") for f in FAMILIES]
    return [replace(FAMILIES[i % len(FAMILIES)](streams[i % len(FAMILIES)], i // len(FAMILIES)), system=SYSTEM)
            for i in range(n)]
