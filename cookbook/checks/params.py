"""The checks' parameters (`cookbook verify --param KEY=VALUE`): each check declares what it reads, with a type, a
default and one line, so a misspelt key or a value of the wrong type is refused before any request is sent, and
`cookbook verify --list-params` can list them."""
from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any, Iterable, Literal

from ..errors import UsageError

ParamKind = Literal["int", "float", "bool", "text", "seed", "int list", "float list", "text list"]

# What one value of a kind must be: singular, plural (for a list kind).
_EXPECTED = {
    "int": ("a whole number", "whole numbers"),
    "float": ("a number", "numbers"),
    "bool": ("true or false", "true or false values"),
    "text": ("a word or text", "words"),
    "seed": ("a whole number or a word", "whole numbers or words"),
}


def _number(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


@dataclass(frozen=True)
class Param:
    """One check parameter: `default` says, in words, what the check uses when the parameter is not given."""

    name: str
    kind: ParamKind
    default: str
    help: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()

    @property
    def expected(self) -> str:
        """What a value must be, as the error and the listing say it."""
        is_list = self.kind.endswith(" list")
        one, many = _EXPECTED[self.kind.removesuffix(" list")]
        what = many if is_list else one
        if self.choices:
            what = ", ".join(self.choices[:-1]) + f" or {self.choices[-1]}"
        if self.low is not None and self.high is not None:
            what += f" from {_number(self.low)} to {_number(self.high)}"
        elif self.low is not None:
            what += f" of at least {_number(self.low)}"
        return f"a list (a,b) of {what}" if is_list else what

    def coerce(self, value: Any, flag: str = "--param") -> Any:
        """The value as the check reads it (one value of a list kind becomes a list of one), else a one-line error."""
        if self.kind.endswith(" list"):
            values = value if isinstance(value, list) else [value]
            if not values:
                raise self._refused(value, flag)
            return [self._one(v, value, flag) for v in values]
        if isinstance(value, list):
            raise self._refused(value, flag)
        return self._one(value, value, flag)

    def _one(self, value: Any, given: Any, flag: str) -> Any:
        element = self.kind.removesuffix(" list")
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        coerced: Any
        if element == "int" or (element == "seed" and number):
            if not (number and float(value).is_integer()):
                raise self._refused(given, flag)
            coerced = int(value)
        elif element == "float":
            if not number:
                raise self._refused(given, flag)
            coerced = float(value)
        elif element == "bool":
            if not isinstance(value, bool):
                raise self._refused(given, flag)
            coerced = value
        else:  # text, or a seed given as a word
            if not isinstance(value, str) or not value:
                raise self._refused(given, flag)
            coerced = value
        if self.choices and coerced not in self.choices:
            raise self._refused(given, flag)
        if isinstance(coerced, (int, float)) and not isinstance(coerced, bool):
            if (self.low is not None and coerced < self.low) or (self.high is not None and coerced > self.high):
                raise self._refused(given, flag)
        return coerced

    def _refused(self, given: Any, flag: str) -> UsageError:
        return UsageError(f"{flag} {self.name}: expected {self.expected}, got {str(given)[:40]!r}")


# Parameters several checks read through shared code (the run's seed, the served dtype, the in-flight count).
SEED = Param("seed", "seed", "0", "seed of the generated prompts, filler text and needle values")
DTYPE = Param("dtype", "text", "the recipe's dtype, else the server's, else bf16",
              "the served dtype whose default tolerances judge the run (only read without a recipe)")
CONCURRENCY = Param("concurrency", "int", "the recipe's verification.concurrency, else its --max-num-seqs, else 8",
                    "requests in flight at once (only read without a recipe)", low=1, high=4096)


def declared(specs: Iterable[Any]) -> dict[str, tuple[Param, list[str]]]:
    """Every parameter the given checks (CheckSpecs) declare, with the checks that read it, in registry order."""
    found: dict[str, tuple[Param, list[str]]] = {}
    for spec in specs:
        for param in spec.params:
            found.setdefault(param.name, (param, []))[1].append(spec.name)
    return found


def validate(params: dict[str, Any], selected: Iterable[Any], every: Iterable[Any], flag: str = "--param") -> dict[str, Any]:
    """`params` typed by the selected checks' declarations; an unknown key (naming the nearest known one, or the
    checks that would read it when they are not selected) or a value of the wrong type is a one-line UsageError."""
    known = declared(selected)
    elsewhere = declared(every)
    typed: dict[str, Any] = {}
    for key, value in params.items():
        if key not in known:
            if key in elsewhere:
                readers = ", ".join(elsewhere[key][1])
                raise UsageError(f"{flag} {key}: read only by {readers}, which this run does not select (see --checks)")
            near = difflib.get_close_matches(key, list(known) or list(elsewhere), n=1, cutoff=0.5)
            hint = f"did you mean {near[0]}?" if near else "`cookbook verify --list-params` lists them"
            raise UsageError(f"{flag} {key}: not a parameter of the checks run; {hint}")
        typed[key] = known[key][0].coerce(value, flag)
    return typed


def listing(specs: Iterable[Any]) -> str:
    """The parameters as `cookbook verify --list-params` prints them: name, type, default, checks, one line."""
    lines = []
    for name, (param, readers) in sorted(declared(specs).items()):
        lines.append(f"{name}  ({param.expected}; default: {param.default})")
        lines.append(f"    {param.help}")
        lines.append(f"    read by: {', '.join(readers)}")
    return "\n".join(lines) + "\n"
