"""A fleet file: which servers to validate at once (recipe + base_url, or recipe + launch: true), and what every
run executes. The schema and its loading only; `cookbook.fleet` runs a fleet, `cookbook.k8s` renders one.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import CookbookError
from .recipes import first_error, load_recipe
from .results import parse_hardware


class FleetError(CookbookError):
    """A fleet file that cannot be used."""

    exit_code = 2


class FleetServer(BaseModel):
    """One line of a fleet: a recipe and where its server is."""

    model_config = ConfigDict(extra="forbid")

    recipe: str = Field(description="Recipe id (recipes/<id>/recipe.yaml) or path")
    base_url: str | None = Field(None, description="A running server to validate, e.g. http://gaudi-07:8000")
    launch: bool = Field(False, description="Start the recipe's server on this machine for the run instead")
    hardware: str | None = Field(None, description="What serves base_url, KIND:DESCRIPTION, e.g. 'gaudi2:8 Gaudi 2 cards'")
    name: str | None = Field(None, description="Label of this entry's run folder (default: from the recipe id)")

    @model_validator(mode="after")
    def _one_target(self) -> "FleetServer":
        if bool(self.base_url) == bool(self.launch):
            raise ValueError("give either base_url or launch: true")
        return self

    @field_validator("base_url")
    @classmethod
    def _a_url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^\s/]+", value):
            raise ValueError(f"expected http(s)://host:port, got {value!r}")
        return value

    @field_validator("hardware")
    @classmethod
    def _hardware(cls, value: str | None) -> str | None:
        parse_hardware(value)
        return value

    @field_validator("name")
    @classmethod
    def _label(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", value):
            raise ValueError("letters, digits, '.', '_' and '-' only (it names a folder)")
        return value


class Fleet(BaseModel):
    """A fleet file: the servers, and what every run of them executes."""

    model_config = ConfigDict(extra="forbid")

    servers: list[FleetServer] = Field(min_length=1, description="The entries, validated concurrently")
    notebooks: list[str] | None = Field(None, description="Notebooks each run executes (default: all)")
    params: dict[str, Any] = Field(default_factory=dict, description="Notebook parameters for every run, NAME: value")
    concurrency: int | None = Field(None, ge=1, description="Runs in flight at once (default and ceiling: what one client drives)")
    wait_for_health_s: float = Field(
        0, ge=0, le=86400, description="How long an attached server may take to answer /health before its entry is "
        "'unreachable' (0: one 10-second try); on a cluster, long enough for the servers' start-up and warm-up",
    )

    @field_validator("params")
    @classmethod
    def _upper_case(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if not re.fullmatch(r"[A-Z][A-Z0-9_]*", str(key)):
                raise ValueError(f"parameter names are upper case, got {key!r}")
        return value


def load_fleet(path: Path) -> Fleet:
    """Read and validate a fleet file; errors are one line naming the file and the field."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FleetError(f"{path}: no such fleet file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise FleetError(f"{path}: cannot read ({exc.__class__.__name__})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise FleetError(f"{path}: {f'line {mark.line + 1}' if mark else 'YAML'}: not valid YAML") from None
    if not isinstance(data, dict):
        raise FleetError(f"{path}: (top level): expected a mapping with a `servers:` list")
    try:
        fleet = Fleet.model_validate(data)
    except ValidationError as exc:
        raise FleetError(str(first_error(path, exc))) from None
    for i, server in enumerate(fleet.servers):
        try:
            load_recipe(server.recipe)
        except CookbookError as exc:
            raise FleetError(f"{path}: servers.{i}.recipe: {exc}") from None
    labels = entry_labels(fleet)
    if len(set(labels)) != len(labels):
        raise FleetError(f"{path}: servers: two entries share a folder name; give them distinct `name:`s")
    return fleet


def entry_labels(fleet: Fleet) -> list[str]:
    """One folder name per entry: its `name`, else the recipe id, numbered when a recipe appears more than once."""
    slugs = [s.name or re.sub(r"[^A-Za-z0-9._-]+", "--", s.recipe).strip("-") for s in fleet.servers]
    seen: dict[str, int] = {}
    labels = []
    for server, slug in zip(fleet.servers, slugs):
        if server.name is None and slugs.count(slug) > 1:
            seen[slug] = seen.get(slug, 0) + 1
            slug = f"{slug}-{seen[slug]}"
        labels.append(slug)
    return labels
