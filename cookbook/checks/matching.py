"""Robust answer matching for the known-answer checks.

A model may answer "24", "12 + 12 = 24", "The answer is twenty-four." or "1,024" for 1024; it may write "PARIS",
"Paris." or "¡Hola!". Matching ignores case, accents, punctuation and number formats, but stays strict enough that
a wrong answer fails:

- a numeric expectation is compared with the first number of the answer that is not merely repeated from the
  prompt ("12 + 12 = 25" is wrong even though it contains 12; "2 + 2 = 4" is right),
- a text expectation must appear as whole words ("Paris" matches "the capital is Paris." but not "Parisian").
"""
from __future__ import annotations

import re
import unicodedata

_SMALL = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
    "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15, "sixteen": 16,
    "seventeen": 17, "eighteen": 18, "nineteen": 19, "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50,
    "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90,
}
_SCALES = {"hundred": 100, "thousand": 1_000, "million": 1_000_000, "billion": 1_000_000_000}
# Digits with optional thousands separators (comma, thin or no-break space), a decimal part and a sign that is not
# a subtraction ("10-3" is two numbers, "-4" one). Separator groups must be exactly three digits ("3,4" is two).
_DIGITS = re.compile(
    r"(?<![\w.])(?P<sign>[-\u2212](?=\d))?"
    r"(?P<int>\d{1,3}(?:[,\u202f\u00a0]\d{3})+|\d+)(?P<frac>\.\d+)?(?![\d])"
)
_WORD = re.compile(r"[a-z]+")


def normalize(text: str) -> str:
    """Lower case, no accents, punctuation as spaces, single spaces: 'PARÍS!' -> 'paris'."""
    decomposed = unicodedata.normalize("NFKD", text)
    plain = "".join(c for c in decomposed if not unicodedata.combining(c)).casefold()
    return " ".join(re.sub(r"[^\w]+", " ", plain).split())


def _kind(word: str) -> str | None:
    if word in _SCALES:
        return "hundred" if word == "hundred" else "scale"
    value = _SMALL.get(word)
    if value is None:
        return word if word in ("and", "a") else None
    return "unit" if value < 10 else "teen" if value < 20 else "tens"


# Which word kinds may follow which: 'twenty four' and 'one hundred and five' are one number, 'one two' is two.
_FOLLOWS = {
    None: {"unit", "teen", "tens", "a"},
    "unit": {"hundred", "scale"},
    "teen": {"hundred", "scale"},
    "tens": {"unit", "hundred", "scale"},
    "hundred": {"unit", "teen", "tens", "scale", "and"},
    "scale": {"unit", "teen", "tens", "and"},
    "and": {"unit", "teen", "tens"},
    "a": {"hundred", "scale"},
}


def _value(words: list[str]) -> float:
    total, current = 0, 0
    for word in words:
        if word in _SMALL:
            current += _SMALL[word]
        elif word == "hundred":
            current = (current or 1) * 100
        elif word in _SCALES:
            total += (current or 1) * _SCALES[word]
            current = 0
    return float(total + current)


def _word_numbers(text: str) -> list[tuple[int, float]]:
    """(position, value) of every run of English number words ('one thousand and twenty-four')."""
    found: list[tuple[int, float]] = []
    run: list[str] = []
    run_start, last_end = 0, 0

    def flush() -> None:
        while run and run[-1] in ("and", "a"):
            run.pop()
        if run:
            found.append((run_start, _value(run)))
        run.clear()

    for match in _WORD.finditer(text.casefold()):
        word, kind = match.group(), _kind(match.group())
        if run and (text[last_end : match.start()].strip(" -") or kind not in _FOLLOWS[_kind(run[-1])]):
            flush()
        if kind is not None and kind in _FOLLOWS[None] and not run:
            run.append(word)
            run_start = match.start()
        elif kind is not None and run:
            run.append(word)
        last_end = match.end()
    flush()
    return found


def numbers_in(text: str) -> list[float]:
    """Every number in `text` in reading order, written in digits ('1,024', '-4', '2.5') or words ('twenty-four')."""
    found = []
    for match in _DIGITS.finditer(text):
        digits = match.group("int").replace(",", "").replace("\u202f", "").replace("\u00a0", "")
        value = float(digits + (match.group("frac") or ""))
        found.append((match.start(), -value if match.group("sign") else value))
    found.extend(_word_numbers(text))
    return [value for _, value in sorted(found)]


def parse_number(text: str) -> float | None:
    """The number `text` is, if it is exactly one ('1,024', 'one thousand twenty-four'), else None."""
    stripped = text.strip().rstrip(".")
    numbers = numbers_in(stripped)
    if len(numbers) != 1:
        return None
    leftover = [w for w in _WORD.findall(_DIGITS.sub(" ", stripped.casefold())) if _kind(w) is None]
    return numbers[0] if not leftover else None


def answered_number(answer: str, expected: float, prompt: str = "") -> float | None:
    """The number the answer gives: its first number that is the expected one or not repeated from the prompt."""
    from_prompt = set(numbers_in(prompt))
    for value in numbers_in(answer):
        if value == expected or value not in from_prompt:
            return value
    return None


def answer_matches(answer: str, expected: str, prompt: str = "") -> bool:
    """Whether `answer` gives `expected` ('24', 'Paris'); see the module docstring for the rules."""
    number = parse_number(expected)
    if number is not None:
        return answered_number(answer, number, prompt) == number
    wanted = normalize(expected)
    if not wanted:
        raise ValueError("expected answer is empty")
    return f" {wanted} " in f" {normalize(answer)} "
