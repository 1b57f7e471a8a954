"""One way to talk to any OpenAI-compatible vLLM server: the CPU one we start, a Gaudi box, or a proxy.

Everything downstream (checks, probes, benchmarks, notebooks) takes an `Endpoint`: a base URL and a model name,
plus the server-side extras vLLM offers beside the OpenAI API (/health, /metrics, /tokenize).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import httpx

from .errors import ServerDown, ServerError, UsageError
from .secrets import register_secret, strip_url_credentials

DEFAULT_TIMEOUT_S = 60.0
_METRIC_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_base_url(url: str, flag: str = "--base-url") -> tuple[str, tuple[str, str] | None]:
    """An http(s) server URL as (the root without /v1 and without credentials, (user, password) or None).
    Anything else (no scheme or host, another scheme, a bad port, a broken IPv6 literal) is refused in one line."""
    text = str(url).strip()
    shown = strip_url_credentials(text)
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise UsageError(f"{flag}: {shown!r} is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"{flag}: {shown!r} is not an http:// or https:// URL with a host (e.g. http://127.0.0.1:8000)")
    if parts.query or parts.fragment or any(c.isspace() for c in text):
        raise UsageError(f"{flag}: {shown!r}: a server URL has no spaces, query or fragment")
    auth = None
    if parts.username is not None or parts.password is not None:
        auth = (unquote(parts.username or ""), unquote(parts.password or ""))
        register_secret(auth[1])
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    netloc = host + (f":{port}" if port is not None else "")
    root = urlunsplit((parts.scheme, netloc, parts.path, "", "")).rstrip("/")
    return (root[: -len("/v1")] if root.endswith("/v1") else root), auth


def normalize_base_url(url: str) -> str:
    """Accept http://host:port or http://host:port/v1; keep the server root (without /v1 and credentials)."""
    return parse_base_url(url)[0]


@dataclass(frozen=True)
class Metric:
    name: str
    labels: dict[str, str]
    value: float


def parse_metrics(text: str) -> list[Metric]:
    """Prometheus text format, enough of it for vLLM's /metrics."""
    metrics: list[Metric] = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _METRIC_LINE.match(line)
        if not match:
            continue
        name, labels, value = match.groups()
        try:
            number = float(value)
        except ValueError:
            continue
        metrics.append(Metric(name, dict(_LABEL.findall(labels or "")), number))
    return metrics


def metric_value(metrics: list[Metric], name: str, **labels: str) -> float | None:
    """Sum of the samples called `name` whose labels include `labels` (None when there is none)."""
    found = [m.value for m in metrics if m.name == name and all(m.labels.get(k) == v for k, v in labels.items())]
    return sum(found) if found else None


def kv_pool_from_metrics(metrics: list[Metric]) -> int | None:
    """KV pool size in tokens from vllm:cache_config_info (kv_cache_size_tokens, or blocks x block size)."""
    for m in metrics:
        if m.name.startswith("vllm:cache_config_info"):
            tokens = m.labels.get("kv_cache_size_tokens")
            if tokens and tokens.isdigit():
                return int(tokens)
            blocks, block = m.labels.get("num_gpu_blocks"), m.labels.get("block_size")
            if blocks and block and blocks.isdigit() and block.isdigit():
                return int(blocks) * int(block)
    return None


@dataclass
class Endpoint:
    """A server to talk to. The API key, if any, comes from the environment and is never printed."""

    base_url: str
    model: str
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = DEFAULT_TIMEOUT_S
    _http: httpx.Client | None = field(default=None, repr=False, compare=False)
    _auth: tuple[str, str] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        # The URL shown and written everywhere carries no credentials; they are kept aside for the requests.
        self.base_url, self._auth = parse_base_url(self.base_url)

    @property
    def api_url(self) -> str:
        return f"{self.base_url}/v1"

    @property
    def api_key(self) -> str:
        return os.environ.get(self.api_key_env) or "EMPTY"

    def http(self) -> httpx.Client:
        if self._http is None:
            headers = {"Authorization": f"Bearer {self.api_key}"}
            self._http = httpx.Client(base_url=self.base_url, timeout=self.timeout_s, headers=headers)
        return self._http

    def openai(self, timeout_s: float | None = None, max_retries: int = 0) -> Any:
        """A synchronous OpenAI client with a bounded timeout and no silent retries."""
        from openai import OpenAI

        return OpenAI(
            base_url=self.api_url, api_key=self.api_key, timeout=timeout_s or self.timeout_s, max_retries=max_retries
        )

    def async_openai(self, timeout_s: float | None = None, max_retries: int = 0) -> Any:
        from openai import AsyncOpenAI

        return AsyncOpenAI(
            base_url=self.api_url, api_key=self.api_key, timeout=timeout_s or self.timeout_s, max_retries=max_retries
        )

    # -- vLLM's extras ------------------------------------------------------------------------------------------

    def _get(self, path: str, timeout_s: float | None = None) -> httpx.Response:
        try:
            return self.http().get(path, timeout=timeout_s or self.timeout_s)
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as exc:
            raise ServerDown(f"{self.base_url}{path}: {type(exc).__name__}: server not reachable") from None
        except httpx.TimeoutException:
            raise ServerDown(f"{self.base_url}{path}: no answer within {timeout_s or self.timeout_s:.0f} s") from None

    def healthy(self, timeout_s: float = 5.0) -> bool:
        try:
            return self._get("/health", timeout_s).status_code == 200
        except ServerDown:
            return False

    def metrics(self) -> list[Metric]:
        response = self._get("/metrics")
        if response.status_code != 200:
            raise ServerError(f"{self.base_url}/metrics: HTTP {response.status_code}")
        return parse_metrics(response.text)

    def served_models(self) -> list[str]:
        response = self._get("/v1/models")
        if response.status_code != 200:
            raise ServerError(f"{self.base_url}/v1/models: HTTP {response.status_code}")
        return [m["id"] for m in response.json().get("data", [])]

    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text` in this model's tokenizer (vLLM's /tokenize)."""
        try:
            response = self.http().post(
                "/tokenize", json={"model": self.model, "prompt": text, "add_special_tokens": add_special_tokens}
            )
        except httpx.HTTPError as exc:
            raise ServerDown(f"{self.base_url}/tokenize: {type(exc).__name__}") from None
        if response.status_code != 200:
            raise ServerError(f"{self.base_url}/tokenize: HTTP {response.status_code}: {response.text[:200]}")
        return list(response.json()["tokens"])

    def detokenize(self, tokens: list[int]) -> str:
        try:
            response = self.http().post("/detokenize", json={"model": self.model, "tokens": tokens})
        except httpx.HTTPError as exc:
            raise ServerDown(f"{self.base_url}/detokenize: {type(exc).__name__}") from None
        if response.status_code != 200:
            raise ServerError(f"{self.base_url}/detokenize: HTTP {response.status_code}: {response.text[:200]}")
        return str(response.json()["prompt"])

    def process_start_time(self) -> float | None:
        return metric_value(self.metrics(), "process_start_time_seconds")

    def kv_pool_tokens(self) -> int | None:
        return kv_pool_from_metrics(self.metrics())

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None
