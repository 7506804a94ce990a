"""MIG slices on a node, as the NVIDIA device plugin exposes them: the ``mixed`` strategy
(one ``nvidia.com/mig-<profile>`` resource per profile) and the ``single`` one (slices
offered as ``nvidia.com/gpu``, the profile in the ``nvidia.com/gpu.product`` label). A
slice of profile p counts as the config's GPU fraction ``mig[p]``; profiles the config
does not list are not counted, and slices never hold shared-GPU pods.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Final

GPU: Final = "nvidia.com/gpu"
MIG_PREFIX: Final = "nvidia.com/mig-"
LABEL_PRODUCT: Final = "nvidia.com/gpu.product"
LABEL_STRATEGY: Final = "nvidia.com/mig.strategy"

_SINGLE_PRODUCT: Final = re.compile(r".+-MIG-(?P<profile>[0-9a-z]+([.+-][0-9a-z]+)*)")


@dataclass(frozen=True)
class MigSlices:
    """A node's MIG inventory: whole GPUs, slices per profile, the strategy's profile.

    ``slices`` maps a profile to its slice count (profiles of the config only);
    ``single`` is the profile of a ``single``-strategy node ("" otherwise), whose
    ``nvidia.com/gpu`` units are slices, so ``devices`` is then 0. ``unknown`` names a
    ``single`` profile the config does not list (the node's slices cannot be counted).
    """

    devices: int = 0
    slices: Mapping[str, int] = field(default_factory=dict)
    single: str = ""
    unknown: str = ""

    @property
    def has_slices(self) -> bool:
        return bool(self.slices) or bool(self.single)


def resource_name(profile: str) -> str:
    """``1g.10gb`` → ``nvidia.com/mig-1g.10gb``."""
    return MIG_PREFIX + profile


def single_profile(labels: Mapping[str, str]) -> str:
    """The MIG profile of a ``single``-strategy node from its product label, or ""."""
    if labels.get(LABEL_STRATEGY, "single") != "single":
        return ""
    m = _SINGLE_PRODUCT.fullmatch(labels.get(LABEL_PRODUCT, ""))
    return m.group("profile") if m else ""


def node_slices(
    allocatable: Mapping[str, Fraction],
    labels: Mapping[str, str],
    fractions: Mapping[str, Fraction],
) -> MigSlices:
    """The node's inventory from its allocatable and GPU feature discovery labels."""
    whole = int(allocatable.get(GPU, Fraction(0)))
    profile = single_profile(labels)
    if profile:
        if profile not in fractions:
            return MigSlices(devices=0, single=profile, unknown=profile)
        return MigSlices(devices=0, slices={profile: whole} if whole else {}, single=profile)
    slices = {
        name[len(MIG_PREFIX) :]: int(n)
        for name, n in sorted(allocatable.items())
        if name.startswith(MIG_PREFIX) and name[len(MIG_PREFIX) :] in fractions and n >= 1
    }
    return MigSlices(devices=whole, slices=slices)
