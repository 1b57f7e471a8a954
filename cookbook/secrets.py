"""Secrets never reach a log, a printed command or a report: one place decides what is secret and masks it.

Two ways a secret is recognised:
- by name, where a variable or flag is shown itself (an `export` line, `recipe show`, the server's command line):
  a secret-named variable (`HF_TOKEN`, `OPENAI_API_KEY`, `DB_PASSWORD` ...) or flag (`api-key`, `hf-token`) is
  always shown masked, whatever its value;
- by value, everywhere else (results, pages, reports, logs, notebooks, the terminal): the values of those variables
  and flags, registered extras (a `--base-url`'s password), `Bearer`/`Basic` credentials and the user:password part
  of any URL. Only values that are plausibly secret are searched for in text (see `plausible_secret`): masking
  `false` or `1` would rewrite ordinary text and the syntax of JSON files.

Every writer goes through `scrub` (text), `scrub_data` (JSON-like data) or `mask_folder` (a run folder, JSON files
masked value by value so that they stay valid JSON).
"""
from __future__ import annotations

import html
import json
import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping
from urllib.parse import quote, urlsplit, urlunsplit

# A secret word is a whole part of the name (between underscores), optionally with a prefix glued on (APIKEY) and
# a plural: HF_TOKEN, OPENAI_API_KEY, hf_token, DB_PASSWORD; but not TOKENIZERS_PARALLELISM or KEYBOARD_LAYOUT.
SECRET_NAME = re.compile(r"(?:^|_)[A-Z0-9]*?(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL)S?(?:_|$)", re.IGNORECASE)
SECRET_FLAGS = ("api-key", "hf-token")
# The environment variable a secret flag is read from in a rendered Launch block (vLLM reads VLLM_API_KEY itself).
SECRET_FLAG_ENV = {"api-key": "VLLM_API_KEY", "hf-token": "HF_TOKEN"}
MASK = "***"
_MIN_SECRET_LEN = 8  # shorter values would mask ordinary words and numbers
_WORD_MAX_LEN = 16  # letters only and shorter than this: a word, not a secret
_NOT_SECRET_WORDS = {"true", "false", "yes", "no", "on", "off", "none", "null", "empty", "enabled", "disabled"}

# A credential in text: an Authorization header's whole value, or "Bearer"/"Basic" and a token holding a digit or
# "=" (so that "Basic checks" stays prose).
_AUTH_HEADER = re.compile(r"""((?:Proxy-)?Authorization["']?\s*[:=]\s*["']?)([^"'\r\n,}]+)""", re.IGNORECASE)
_CREDENTIAL = re.compile(r"\b(Bearer|Basic)(\s+)(?=[A-Za-z0-9._~+/=-]*[0-9=])([A-Za-z0-9._~+/=-]{8,})")
_URL_USERINFO = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@\"'<>]+@")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\x80-\x9f]")

_EXTRA: set[str] = set()  # values registered at run time (a --base-url's password, an API key given in code)


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


def plausible_secret(value: object) -> bool:
    """Could this value be a secret worth searching for in text? Not a boolean, a number, a short value or a
    single word: those occur in ordinary text and JSON syntax, and masking them corrupts files."""
    if not isinstance(value, str):
        return False
    text = value.strip()
    if len(text) < _MIN_SECRET_LEN or text.lower() in _NOT_SECRET_WORDS:
        return False
    try:
        float(text)
        return False
    except ValueError:
        pass
    if text.isalpha() and text.isascii() and len(text) < _WORD_MAX_LEN:
        return False
    return True


def register_secret(value: str | None) -> None:
    """A value that must be masked everywhere from now on in this process (e.g. the password of a --base-url)."""
    if value and plausible_secret(value):
        _EXTRA.add(value)


def secret_values(*envs: Mapping[str, str], flags: Mapping[str, object] | None = None) -> list[str]:
    """Every value that must not be shown: secret-named variables of the given environments and secret flags
    (plausibly secret values only, longest first)."""
    found: set[str] = set()
    for env in envs or (os.environ,):
        for name, value in env.items():
            if is_secret_name(name) and plausible_secret(value):
                found.add(value)
    for name, flag_value in (flags or {}).items():
        if name in SECRET_FLAGS and plausible_secret(flag_value):
            found.add(str(flag_value))
    return sorted(found, key=len, reverse=True)


def current_secrets(extra: Iterable[str] = ()) -> list[str]:
    """The process environment's secret values, the registered ones and `extra`, longest first."""
    values = set(secret_values(os.environ)) | _EXTRA | {v for v in extra if plausible_secret(v)}
    return sorted(values, key=len, reverse=True)


def _forms(value: str) -> list[str]:
    """The value as it appears raw, JSON-escaped (both ways), HTML-escaped and URL-quoted."""
    forms = {value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1], html.escape(value),
             html.escape(value, quote=False), quote(value, safe="")}
    return sorted(forms, key=len, reverse=True)


def strip_url_credentials(url: str) -> str:
    """`http://user:pass@host:8000/v1` -> `http://host:8000/v1` (anything without user info is returned as is)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return _URL_USERINFO.sub(r"\1", url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def mask(text: str, secrets: Iterable[str]) -> str:
    """`text` with every secret value (in any of its escaped forms), credential and URL password masked."""
    for value in sorted({s for s in secrets if s}, key=len, reverse=True):
        for form in _forms(value):
            if form:
                text = text.replace(form, MASK)
    text = _AUTH_HEADER.sub(lambda m: f"{m.group(1)}{MASK}", text)
    text = _CREDENTIAL.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", text)
    return _URL_USERINFO.sub(r"\1", text)


def scrub(text: str, extra: Iterable[str] = ()) -> str:
    """`mask` with the process's current secrets: what every writer and the terminal go through."""
    return mask(text, current_secrets(extra))


def mask_data(data: Any, secrets: Iterable[str]) -> Any:
    """JSON-like data with secrets masked inside its strings (keys too); numbers, booleans and structure untouched."""
    values = sorted({s for s in secrets if s}, key=len, reverse=True)

    def walk(item: Any) -> Any:
        if isinstance(item, str):
            return mask(item, values)
        if isinstance(item, dict):
            return {walk(k) if isinstance(k, str) else k: walk(v) for k, v in item.items()}
        if isinstance(item, list):
            return [walk(v) for v in item]
        return item

    return walk(data)


def scrub_data(data: Any, extra: Iterable[str] = ()) -> Any:
    return mask_data(data, current_secrets(extra))


def escape_control(text: str) -> str:
    """Control characters (ESC, CR, BEL, C1 ...) as visible escapes, so that no value can drive a terminal;
    newlines and tabs stay."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


class ScrubbingStream:
    """A text stream (the terminal) that masks secrets and escapes control characters in everything written."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def write(self, text: str) -> int:
        self._inner.write(escape_control(scrub(text)))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class ScrubbingFilter(logging.Filter):
    """Masks secrets in a log record's message before any handler formats it (papermill logs every kernel message,
    a traceback that printed a token included, at DEBUG)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = scrub(record.getMessage()), None
        return True


@contextmanager
def scrubbed_logs(*names: str) -> Iterator[None]:
    """For the duration, every record the named loggers emit is scrubbed, whatever level logging runs at."""
    loggers, scrubber = [logging.getLogger(n) for n in names], ScrubbingFilter()
    for logger in loggers:
        logger.addFilter(scrubber)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(scrubber)


def masked_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: (MASK if is_secret_name(k) else v) for k, v in env.items()}


def masked_flags(flags: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (MASK if k in SECRET_FLAGS and isinstance(v, str) else v) for k, v in flags.items()}


# ---------------------------------------------------------------------------------------------------------------
# Files


@dataclass
class FolderMasking:
    """What `mask_folder` did: files rewritten with the secret masked, binary files overwritten in place."""

    masked: list[Path] = field(default_factory=list)
    binary: list[Path] = field(default_factory=list)

    @property
    def changed(self) -> list[Path]:
        return sorted(self.masked + self.binary)


def _json_indent(text: str) -> int | None:
    lines = text.splitlines()
    if len(lines) < 2:
        return None
    second = lines[1]
    return len(second) - len(second.lstrip(" ")) or None


def mask_text_file(path: Path, text: str, secrets: list[str]) -> str:
    """The masked content of one text file; a JSON file (results, notebooks, summaries) is masked value by value
    and written back in its own indentation, so it stays valid JSON whatever the secret looks like."""
    if mask(text, secrets) == text:
        return text  # nothing to mask: the file stays byte for byte as it was
    if path.suffix in (".json", ".ipynb") or text.lstrip().startswith(("{", "[")):
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            data = None
        if data is not None:
            masked = mask_data(data, secrets)
            out = json.dumps(masked, indent=_json_indent(text), ensure_ascii=False,
                             sort_keys=path.suffix == ".ipynb")
            return out + ("\n" if text.endswith("\n") else "")
    return mask(text, secrets)


def scrub_file_text(path: Path, text: str) -> str:
    """What a writer puts in `path`: `text` with the process's current secrets masked (JSON value by value)."""
    return mask_text_file(Path(path), text, current_secrets())


def _needles(secrets: list[str]) -> list[bytes]:
    return sorted({form.encode() for s in secrets for form in _forms(s) if form}, key=len, reverse=True)


def scan_folder(folder: Path, secrets: Iterable[str]) -> list[Path]:
    """Every file under `folder` that holds a secret value in any of its forms (bytes, so binary files count)."""
    needles = _needles([s for s in secrets if s])
    patterns = [re.compile(p.pattern.encode(), p.flags & re.IGNORECASE) for p in (_URL_USERINFO, _CREDENTIAL, _AUTH_HEADER)]
    found = []
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file() and not p.is_symlink()):
        data = path.read_bytes()
        if any(n in data for n in needles) or (path.suffix != ".png" and any(p.search(data) for p in patterns)):
            if not needles and mask_text_file(path, data.decode("utf-8", "replace"), []) == data.decode("utf-8", "replace"):
                continue  # a pattern matched bytes that masking leaves as they are
            found.append(path)
    return found


def mask_folder(folder: Path, secrets: Iterable[str]) -> FolderMasking:
    """Mask secret values in every file under `folder`. Text files are rewritten atomically (JSON value by value);
    a binary file keeps its size and every other byte, the secret's bytes overwritten with '*' (never deleted)."""
    values = sorted({s for s in secrets if plausible_secret(s)}, key=len, reverse=True)
    outcome = FolderMasking()
    for path in scan_folder(folder, values):
        data = path.read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            masked = data
            for needle in _needles(values):
                masked = masked.replace(needle, b"*" * len(needle))
            if masked != data:
                _write_bytes(path, masked)
                outcome.binary.append(path)
            continue
        _write_bytes(path, mask_text_file(path, text, values).encode("utf-8"))
        outcome.masked.append(path)
    return outcome


def _write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.masking")
    tmp.write_bytes(data)
    os.replace(tmp, path)
