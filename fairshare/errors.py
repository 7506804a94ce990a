"""The project's exception tree.

::

    FairshareError
    ├── ConfigError       a config document is invalid; carries every FieldError found
    ├── WireFormatError   a request body (AdmissionReview, ExtenderArgs) cannot be decoded
    └── NativeError       a compiled kernel was called with inputs it cannot handle

``fairshare.quantities.QuantityError`` also derives from ``FairshareError`` (and from
``ValueError``). Denials and filter outcomes are return values, never exceptions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["ConfigError", "FairshareError", "FieldError", "NativeError", "WireFormatError"]


class FairshareError(Exception):
    """Base class of every exception raised on purpose by fairshare."""


@dataclass(frozen=True, slots=True)
class FieldError:
    """One problem in a config document, located by a field path.

    ``path`` uses the document's own (camelCase) keys, list indexes in brackets and dots
    between keys, e.g. ``tenants[2].weight``; ``(root)`` stands for the whole document.
    Modelled on k8s ``field.Error``.
    """

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class ConfigError(FairshareError):
    """A config document failed validation.

    ``errors`` lists every problem found (not just the first); ``str()`` renders them
    one per line as ``path: message``.
    """

    errors: list[FieldError]

    def __init__(self, errors: Iterable[FieldError]) -> None:
        self.errors = list(errors)
        # Passing the list through keeps the exception picklable (args == (errors,)).
        super().__init__(self.errors)

    def __str__(self) -> str:
        return "\n".join(str(error) for error in self.errors)


class WireFormatError(FairshareError):
    """A wire message (AdmissionReview, extender args) could not be decoded."""


class NativeError(FairshareError):
    """A native kernel was given inputs it cannot process (checked before the call)."""
