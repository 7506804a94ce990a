"""admission.k8s.io/v1 AdmissionReview: decode the request body, encode the response body.

``object`` and ``oldObject`` stay the raw dicts kube-apiserver sent (a patch must apply
to exactly that JSON). ``encode_response`` writes the response by hand, so the keys are
exactly those kube-apiserver's case-sensitive decoder reads and absent fields are absent
(a validating answer may not even carry an empty ``patchType``).
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from fairshare.errors import WireFormatError
from webhook import patches

__all__ = [
    "API_VERSION",
    "KIND",
    "PATCH_TYPE",
    "AdmissionRequest",
    "AdmissionResponse",
    "AdmissionReview",
    "GroupVersionKind",
    "GroupVersionResource",
    "Status",
    "UserInfo",
    "allow",
    "decode_review",
    "deny",
    "encode_response",
]

API_VERSION: Final = "admission.k8s.io/v1"
KIND: Final = "AdmissionReview"
PATCH_TYPE: Final = "JSONPatch"


class _Wire(BaseModel):
    model_config = ConfigDict(
        extra="ignore",
        frozen=True,
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )


class GroupVersionKind(_Wire):
    """``metav1.GroupVersionKind``; the core group is ``""``."""

    group: str = ""
    version: str = ""
    kind: str = ""


class GroupVersionResource(_Wire):
    """``metav1.GroupVersionResource``, e.g. ``{"group":"","version":"v1","resource":"pods"}``."""

    group: str = ""
    version: str = ""
    resource: str = ""


class UserInfo(_Wire):
    """``authenticationv1.UserInfo`` (all fields omitempty)."""

    username: str = ""
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: dict[str, tuple[str, ...]] = Field(default_factory=dict)


class AdmissionRequest(_Wire):
    """``AdmissionRequest``: what the call is about. ``object``/``old_object`` are raw JSON."""

    uid: str = Field(min_length=1)
    kind: GroupVersionKind = Field(default_factory=GroupVersionKind)
    resource: GroupVersionResource = Field(default_factory=GroupVersionResource)
    sub_resource: str = ""
    request_kind: GroupVersionKind | None = None
    request_resource: GroupVersionResource | None = None
    request_sub_resource: str = ""
    name: str = ""
    """Empty on CREATE with ``generateName`` (mutating webhooks run before the name is made)."""
    namespace: str = ""
    operation: str = ""
    """``CREATE``, ``UPDATE``, ``DELETE`` or ``CONNECT``; kept a string so a new verb is
    answered (allowed, ignored) rather than refused as malformed."""
    user_info: UserInfo = Field(default_factory=UserInfo)
    object: dict[str, Any] | None = None
    old_object: dict[str, Any] | None = None
    dry_run: bool = False
    options: dict[str, Any] | None = None


class AdmissionReview(_Wire):
    """The envelope: ``apiVersion``, ``kind`` and one ``request``."""

    api_version: str
    kind: str
    request: AdmissionRequest


class Status(_Wire):
    """The part of ``metav1.Status`` a denial carries (kube-apiserver raises codes < 400)."""

    code: int
    message: str


class AdmissionResponse(_Wire):
    """A decision without its uid (``encode_response`` adds the request's).

    ``patch`` is empty for validating answers and for mutations with nothing to change.
    """

    allowed: bool
    status: Status | None = None
    patch: tuple[patches.PatchOp, ...] = ()
    warnings: tuple[str, ...] = ()


def allow(
    *, patch: tuple[patches.PatchOp, ...] = (), warnings: tuple[str, ...] = ()
) -> AdmissionResponse:
    """An ``allowed: true`` response."""
    return AdmissionResponse(allowed=True, patch=patch, warnings=warnings)


def deny(code: int, message: str, *, warnings: tuple[str, ...] = ()) -> AdmissionResponse:
    """An ``allowed: false`` response with ``status.code`` and ``status.message``."""
    return AdmissionResponse(
        allowed=False, status=Status(code=code, message=message), warnings=warnings
    )


def decode_review(body: bytes) -> AdmissionRequest:
    """Parse an AdmissionReview body and return its request. Raises ``WireFormatError``."""
    try:
        document = json.loads(body)
    except UnicodeDecodeError as exc:
        raise WireFormatError(f"body is not UTF-8 JSON: {exc.reason}") from exc
    except json.JSONDecodeError as exc:
        raise WireFormatError(f"malformed JSON at line {exc.lineno}: {exc.msg}") from exc
    except RecursionError as exc:
        raise WireFormatError("malformed JSON: nested too deeply") from exc
    except ValueError as exc:  # e.g. an integer longer than Python's 4300-digit limit
        raise WireFormatError(f"malformed JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise WireFormatError(f"AdmissionReview must be a JSON object, got {_json_type(document)}")
    for key, want in (("apiVersion", API_VERSION), ("kind", KIND)):
        got = document.get(key)
        if got != want:
            shown = "missing" if got is None else json.dumps(got)
            raise WireFormatError(f'{key} must be "{want}", got {shown}')
    request = document.get("request")
    if not isinstance(request, dict):
        raise WireFormatError(
            "request is missing" if request is None else "request must be an object"
        )
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise WireFormatError(
            "request.uid is missing" if uid is None else "request.uid must be a non-empty string"
        )
    try:
        parsed = AdmissionReview.model_validate(document).request
    except ValidationError as exc:
        raise WireFormatError(_first_problem(exc)) from exc
    _check_object(parsed.object, "request.object")
    _check_object(parsed.old_object, "request.oldObject")
    return parsed


def _check_object(obj: dict[str, Any] | None, where: str) -> None:
    """The parts of a Kubernetes object the policies read, typed as the API types them
    (``metadata`` and ``spec`` objects, names strings, labels and annotations maps of
    strings): a body with other types is refused here (400) instead of failing a policy
    (an internal-error denial)."""
    if obj is None:
        return
    for key in ("metadata", "spec"):
        value = obj.get(key)
        if value is not None and not isinstance(value, dict):
            raise WireFormatError(f"{where}.{key} must be an object, got {_json_type(value)}")
    meta = obj.get("metadata") or {}
    for key in ("name", "generateName", "namespace"):
        value = meta.get(key)
        if value is not None and not isinstance(value, str):
            raise WireFormatError(
                f"{where}.metadata.{key} must be a string, got {_json_type(value)}"
            )
    for key in ("labels", "annotations"):
        value = meta.get(key)
        if value is not None and not (
            isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
        ):
            raise WireFormatError(f"{where}.metadata.{key} must be a map of strings")


def encode_response(uid: str, response: AdmissionResponse) -> dict[str, Any]:
    """The AdmissionReview response body for request ``uid`` (serialise with ``json.dumps``)."""
    body: dict[str, Any] = {"uid": uid, "allowed": response.allowed}
    if not response.allowed and response.status is not None:
        body["status"] = {"code": response.status.code, "message": response.status.message}
    if response.patch:
        body["patchType"] = PATCH_TYPE
        body["patch"] = patches.encode_patch(response.patch)
    warnings = [w for w in (_printable(w) for w in response.warnings) if w]
    if warnings:
        body["warnings"] = list(dict.fromkeys(warnings))
    return {"apiVersion": API_VERSION, "kind": KIND, "response": body}


def _printable(text: str) -> str:
    # kube-apiserver silently drops a warning that contains control characters.
    return "".join(" " if unicodedata.category(c) == "Cc" else c for c in text).strip()


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array"


def _first_problem(exc: ValidationError) -> str:
    error = exc.errors(include_url=False)[0]
    path = ".".join(str(part) for part in error["loc"])
    return f"{path}: {error['msg']}"
