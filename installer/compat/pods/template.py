"""A pod template found in an object, and the small readers every shape finder shares."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Template:
    """One pod template of an object: its PodSpec, where it is and how many pods it makes."""

    path: str                   # "" for a Pod; "spec.template" for a Deployment
    spec: Any                   # the PodSpec (checked by the caller: it may be malformed)
    replicas: int | None = None
    multiplicity: str = ""      # how the object says so, e.g. "group gpu: replicas 2"


class ShapeError(Exception):
    """An object of a known kind lacks the template its kind must hold."""

    def __init__(self, message: str, remedy: str) -> None:
        super().__init__(message)
        self.message = message
        self.remedy = remedy


def at(node: Any, *steps: str) -> Any:
    """The value at a path of mapping keys; None where a step is missing or not a mapping."""
    for step in steps:
        node = node.get(step) if isinstance(node, Mapping) else None
    return node


def count(value: Any) -> int | None:
    """A count as the API server would accept it; None for anything else."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None


def plural(number: int, word: str) -> str:
    return f"{number} {word}" + ("" if number == 1 else "s")


def job_counts(job_spec: Any) -> tuple[int, str]:
    """Pods a Job runs at once (parallelism, default 1) and how the Job says so."""
    parallelism, completions = (count(at(job_spec, f)) for f in ("parallelism", "completions"))
    said = [f"{name} {value}" for name, value in
            (("parallelism", parallelism), ("completions", completions)) if value is not None]
    return (1 if parallelism is None else parallelism), ", ".join(said)
