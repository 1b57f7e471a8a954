"""Secrets never reach a log, a printed command or a report: one place decides what is secret and masks it."""
from __future__ import annotations

import os
import re
from typing import Iterable, Mapping

SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
SECRET_FLAGS = ("api-key", "hf-token")
MASK = "***"
_MIN_SECRET_LEN = 4  # shorter values would mask ordinary words


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


def secret_values(*envs: Mapping[str, str], flags: Mapping[str, object] | None = None) -> list[str]:
    """Every value that must not be shown: secret-named variables of the given environments and secret flags."""
    found: set[str] = set()
    for env in envs or (os.environ,):
        for name, value in env.items():
            if is_secret_name(name) and isinstance(value, str) and len(value) >= _MIN_SECRET_LEN:
                found.add(value)
    for name, value in (flags or {}).items():
        if name in SECRET_FLAGS and isinstance(value, str) and len(value) >= _MIN_SECRET_LEN:
            found.add(value)
    return sorted(found, key=len, reverse=True)


def mask(text: str, secrets: Iterable[str]) -> str:
    for value in secrets:
        text = text.replace(value, MASK)
    return text


def masked_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: (MASK if is_secret_name(k) else v) for k, v in env.items()}
