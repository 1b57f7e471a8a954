"""Answer matching: robust to case, punctuation and number formats, strict about wrong answers."""
from __future__ import annotations

import pytest

from cookbook.checks.matching import answer_matches, normalize, numbers_in, parse_number


@pytest.mark.parametrize(
    "text, numbers",
    [
        ("2 + 2 = 4", [2, 2, 4]),
        ("1,024", [1024]),
        ("1024", [1024]),
        ("1\u202f024 tokens", [1024]),
        ("one thousand twenty-four", [1024]),
        ("one thousand and twenty-four", [1024]),
        ("a hundred", [100]),
        ("twenty four", [24]),
        ("three hundred and five", [305]),
        ("one two three", [1, 2, 3]),
        ("one, two", [1, 2]),
        ("-4°C and 10-3", [-4, 10, 3]),
        ("3,4", [3, 4]),
        ("2.5 or 24.", [2.5, 24]),
        ("A week is 7 days.", [7]),
        ("seven days", [7]),
        ("No numbers here.", []),
        ("v1.2.3", []),
    ],
)
def test_numbers_in(text: str, numbers: list[float]) -> None:
    assert numbers_in(text) == numbers


@pytest.mark.parametrize(
    "text, value",
    [("1,024", 1024), (" 1024. ", 1024), ("one thousand twenty-four", 1024), ("Twenty-Four", 24), ("Paris", None),
     ("4 apples", None), ("1 2", None)],
)
def test_parse_number(text: str, value: float | None) -> None:
    assert parse_number(text) == value


def test_normalize() -> None:
    assert normalize("  ¡HOLA!  París... ") == "hola paris"


@pytest.mark.parametrize(
    "answer, expected, prompt",
    [
        ("2 + 2 = 4", "4", "What is 2 + 2?"),
        ("12 + 12 = 24", "24", "What is 12 + 12?"),
        ("The answer is twenty-four.", "24", "What is 12 + 12?"),
        ("A week is 7 days.", "7", "How many days are in a week?"),
        ("There are seven days in a week.", "7", "How many days are in a week?"),
        ("2^10 = 1,024", "1024", "What is 2 to the power of 10?"),
        ("It is one thousand and twenty-four.", "1,024", ""),
        ("4 × 1 = 4", "4", "What is 4 times 1?"),
        ("The capital of France is Paris.", "Paris", ""),
        ("PARIS", "paris", ""),
        ("The Spanish word for 'hello' is \"Hola\" in Spanish.", "hola", ""),
        ("¡Hola!", "Hola", ""),
        ('The French word for "thank you" is "merci."', "merci", ""),
        ("It's -4 degrees.", "-4", ""),
    ],
)
def test_right_answers_match(answer: str, expected: str, prompt: str) -> None:
    assert answer_matches(answer, expected, prompt)


@pytest.mark.parametrize(
    "answer, expected, prompt",
    [
        ("12 + 12 = 25", "24", "What is 12 + 12?"),
        ("10 - 3 = 6", "7", "What is 10 - 3?"),
        ("23 + 23 = 35", "24", "What is 12 + 12?"),
        ("240", "24", ""),
        ("2.4", "24", ""),
        ("The answer is 25, or maybe 24.", "24", ""),
        ("2^10 = 2 * 2^9 = 400 = 1000\n\nThe answer is 100", "1024", "What is 2 to the power of 10?"),
        ("I don't know.", "7", ""),
        ("The capital of France is siraP.", "Paris", ""),
        ("A Parisian answer.", "Paris", ""),
        ("Je m'aime.", "merci", ""),
        ("It is 4 degrees.", "-4", ""),
    ],
)
def test_wrong_answers_do_not_match(answer: str, expected: str, prompt: str) -> None:
    assert not answer_matches(answer, expected, prompt)


def test_empty_expectation_is_an_error() -> None:
    with pytest.raises(ValueError):
        answer_matches("anything", " ... ")
