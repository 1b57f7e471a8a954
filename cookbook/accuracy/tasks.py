"""The cookbook's own offline accuracy tasks: multiple choice by loglikelihood over items generated from a seed.

No data set is downloaded: each task is a JSONL file of items and an lm-eval task YAML over it, written into the
cache folder by `write_task` from a seed, so the same seed gives byte-identical files (and the same file hash, which
keys the cached reference score). The items are of kinds a 135M instruct model gets mostly right (continuing a
sequence, an antonym, a colour, a capital, a small sum, after a fixed preamble; and recall of a word given about 300
tokens back) with three distractors drawn from the same kind, so chance is 1 in 4. SmolLM2-135M scores 0.975 on
200 items; a 256-token sliding window drops it to 0.875, a RoPE base ten times too small only to 0.955 (measured).
"""
from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path

from ..errors import CookbookError

TASK_PREFIX = "cookbook_"
CHOICES = 4
TASK_FORMAT = "3"  # bump when the generator changes what it writes: the files' hash (and the cached reference) move

DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
LETTERS = [chr(c) for c in range(ord("A"), ord("Z") + 1)]
NUMBER_WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"]
ANTONYMS = [("hot", "cold"), ("big", "small"), ("up", "down"), ("fast", "slow"), ("happy", "sad"), ("light", "dark"),
            ("old", "young"), ("open", "closed"), ("early", "late"), ("hard", "soft"), ("rich", "poor"),
            ("wet", "dry"), ("full", "empty"), ("strong", "weak"), ("long", "short"), ("high", "low"),
            ("good", "bad"), ("true", "false"), ("left", "right"), ("clean", "dirty")]
COLOURS = [("the sky on a clear day", "blue"), ("fresh grass", "green"), ("snow", "white"), ("coal", "black"),
           ("a ripe banana", "yellow"), ("a ripe tomato", "red"), ("an orange", "orange"), ("milk", "white"),
           ("a lemon", "yellow"), ("blood", "red"), ("a crow", "black"), ("the leaves in summer", "green")]
COLOUR_WORDS = ["blue", "green", "white", "black", "yellow", "red", "orange", "purple", "brown", "pink"]
CAPITALS = [("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Germany", "Berlin"), ("Spain", "Madrid"),
            ("England", "London"), ("Russia", "Moscow"), ("China", "Beijing"), ("Egypt", "Cairo"),
            ("Greece", "Athens"), ("Canada", "Ottawa"), ("Portugal", "Lisbon"), ("Austria", "Vienna"),
            ("Ireland", "Dublin"), ("Norway", "Oslo"), ("Sweden", "Stockholm")]


@dataclass(frozen=True)
class Item:
    kind: str
    question: str
    choices: list[str]
    answer: int


def _pick(rng: random.Random, right: str, pool: list[str]) -> tuple[list[str], int]:
    """`right` and three other members of `pool`, shuffled; the index of `right`."""
    others = rng.sample(sorted(set(pool) - {right}), CHOICES - 1)
    options = [right, *others]
    rng.shuffle(options)
    return [f" {o}" for o in options], options.index(right)


def _cycle(rng: random.Random, words: list[str], kind: str) -> Item:
    start = rng.randrange(len(words))
    shown = rng.randint(3, 5)
    seq = [words[(start + i) % len(words)] for i in range(shown + 1)]
    choices, answer = _pick(rng, seq[-1], words)
    return Item(kind, ", ".join(seq[:-1]) + ",", choices, answer)


def _counting(rng: random.Random) -> Item:
    step = rng.choice([1, 2, 3, 5, 10])
    start = rng.randint(1, 40) * step
    seq = [start + i * step for i in range(rng.randint(4, 6))]
    right = seq[-1] + step
    pool = [str(right + d) for d in (-2 * step, -step, step, 2 * step, 1, -1) if right + d > 0] + [str(right)]
    choices, answer = _pick(rng, str(right), pool)
    return Item("counting", ", ".join(map(str, seq)) + ",", choices, answer)


def _sum(rng: random.Random) -> Item:
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    right = a + b
    pool = [str(n) for n in range(max(0, right - 4), right + 5)]
    choices, answer = _pick(rng, str(right), pool)
    return Item("sum", f"{a} + {b} =", choices, answer)


def _antonym(rng: random.Random) -> Item:
    word, right = rng.choice(ANTONYMS)
    choices, answer = _pick(rng, right, [a for _, a in ANTONYMS if a != word])
    return Item("antonym", f"The opposite of {word} is", choices, answer)


def _colour(rng: random.Random) -> Item:
    thing, right = rng.choice(COLOURS)
    choices, answer = _pick(rng, right, COLOUR_WORDS)
    return Item("colour", f"The colour of {thing} is", choices, answer)


def _capital(rng: random.Random) -> Item:
    country, right = rng.choice(CAPITALS)
    choices, answer = _pick(rng, right, [c for _, c in CAPITALS])
    return Item("capital", f"The capital of {country} is", choices, answer)


ANIMALS = ["zebra", "tiger", "horse", "rabbit", "eagle", "dolphin", "monkey", "turtle", "camel", "penguin", "wolf",
           "parrot"]
FILLER = ["The road to the village was quiet that morning.", "Rain had fallen during the night.",
          "A small shop opened its doors at nine.", "The baker sold bread and cakes.",
          "Children walked to school in pairs.", "The river ran slowly under the old bridge.",
          "A bus stopped at the corner and left again.", "The library was warm and full of books.",
          "Someone was painting a fence near the park.", "The clock in the square struck ten.",
          "Two friends sat on a bench and talked.", "The market was busy by noon."]


def _recall(rng: random.Random) -> Item:
    """A word given once at the start, then about 300 tokens of plain sentences, then asked for: the answer is copied
    from far back (past a 256-token window), where a wrong position encoding or a lossy KV cache shows."""
    animal = rng.choice(ANIMALS)
    filler = " ".join(rng.choice(FILLER) for _ in range(30))
    choices, answer = _pick(rng, animal, ANIMALS)
    question = (f"Remember this: the secret animal is the {animal}. {filler} Question: what was the secret animal? "
                "Answer: the secret animal is the")
    return Item("recall", question, choices, answer)


def _number_word(rng: random.Random) -> Item:
    return _cycle(rng, NUMBER_WORDS[:10], "number-words") if rng.random() < 0.5 else _counting(rng)


MAKERS = [
    lambda rng: _cycle(rng, DAYS, "days"),
    lambda rng: _cycle(rng, MONTHS, "months"),
    lambda rng: _cycle(rng, LETTERS, "letters"),
    _number_word, _counting, _sum, _antonym, _colour, _capital, _recall, _recall,
]


# Every item's question follows this fixed preamble of solved lines (about 60 tokens), so the question is read from
# past position 60: a RoPE base ten times too small leaves a prompt's first 20 or so positions nearly untouched
# (docs/checks.md, the oracle's defects) and with bare 10-to-20-token questions moved 6 items of 200 (measured).
PREAMBLE = ("Each line ends with the word that fits.\n"
            "Monday, Tuesday, Wednesday, Thursday\n"
            "The opposite of up is down\n"
            "2 + 2 = 4\n"
            "The capital of Portugal is Lisbon\n"
            "The colour of coal is black\n"
            "A, B, C, D\n"
            "10, 20, 30, 40\n")


def generate(seed: int, count: int) -> list[Item]:
    """`count` items, the kinds in turn, every choice drawn from `random.Random(seed)`: the same seed, the same items;
    each question after the preamble."""
    rng = random.Random(seed)
    items = [MAKERS[i % len(MAKERS)](rng) for i in range(count)]
    return [Item(it.kind, PREAMBLE + it.question, it.choices, it.answer) for it in items]


def is_own_task(name: str) -> bool:
    return name.startswith(TASK_PREFIX)


# The task names the cookbook writes itself: name -> what it holds. Anything else is a task lm-eval knows.
OWN_TASKS = {f"{TASK_PREFIX}mc": "multiple choice by loglikelihood: sequences, antonyms, colours, capitals, sums"}


def _yaml(name: str, data_file: Path) -> str:
    return "\n".join([
        f"task: {name}",
        "dataset_path: json",
        "dataset_kwargs:",
        "  data_files:",
        f"    test: {json.dumps(str(data_file))}",
        "test_split: test",
        "output_type: multiple_choice",
        'doc_to_text: "{{question}}"',
        'doc_to_choice: "{{choices}}"',
        'doc_to_target: "{{answer}}"',
        'target_delimiter: ""',
        "metric_list:",
        "  - metric: acc",
        "    aggregation: mean",
        "    higher_is_better: true",
        "metadata:",
        f"  version: {TASK_FORMAT}",
        "",
    ])


@dataclass(frozen=True)
class WrittenTask:
    name: str
    folder: Path  # lm-eval's --include_path
    sha256: str  # of the YAML and the items together: keys the cached reference score
    items: int
    prompt_chars: int = 0  # what lm-eval sends, every item's question with each choice: sizes the run's deadline


def write_task(name: str, seed: int, count: int, root: Path) -> WrittenTask:
    """Write the task's items (JSONL) and its lm-eval YAML under `root` (idempotent: the same files each time)."""
    if name not in OWN_TASKS:
        raise CookbookError(f"verification.accuracy.tasks: {name!r} is not one of the cookbook's own tasks ({', '.join(OWN_TASKS)})")
    items = generate(seed, count)
    lines = "".join(json.dumps({"id": i, "kind": it.kind, "question": it.question, "choices": it.choices,
                                "answer": it.answer}) + "\n" for i, it in enumerate(items))
    digest = hashlib.sha256(lines.encode())
    folder = root / f"{name}-seed{seed}-n{count}-v{TASK_FORMAT}"
    data_file = folder / f"{name}.jsonl"
    yaml_text = _yaml(name, data_file)
    digest.update(yaml_text.encode())
    folder.mkdir(parents=True, exist_ok=True)
    for path, text in ((data_file, lines), (folder / f"{name}.yaml", yaml_text)):
        if not path.exists() or path.read_text() != text:
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(text)
            tmp.replace(path)
    chars = sum(len(it.question) + len(choice) for it in items for choice in it.choices)
    return WrittenTask(name, folder, digest.hexdigest(), count, chars)
