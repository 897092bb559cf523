"""How a FlashInfer finds prebuilt modules in a distribution of another name (never
upstream's ``flashinfer-jit-cache``: pip would uninstall it), read from its sources.

- ``prebuilt``: our FlashInfer reads the entry point group ``flashinfer.prebuilt``.
- ``jit-cache-providers``: FlashInfer 0.7.x asks upstream's ``flashinfer-jit-cache`` shim
  (served on FlashInfer's own index, at FlashInfer's version) for its providers.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from sm120fork.errors import ConfigError


@dataclasses.dataclass(frozen=True, kw_only=True)
class Lookup:
    """One way a FlashInfer finds our prebuilt modules."""

    name: str
    #: The entry point group the AOT wheel registers in.
    group: str
    #: The function of the AOT wheel's package that the entry point names.
    function: str
    #: Text of ``flashinfer/jit/env.py`` that shows this FlashInfer has the lookup.
    evidence: str
    #: Distribution FlashInfer asks through (``None``: FlashInfer reads the group itself);
    #: the AOT wheel requires it at exactly its own version.
    through: str | None = None
    #: Where ``through`` is published when that is not the default index.
    through_index: str | None = None


#: The default stack's series (patch 0009 of patches/sglang-0.5.10/flashinfer).
PREBUILT = Lookup(name="prebuilt", group="flashinfer.prebuilt", function="get_jit_cache_dir",
                  evidence='"flashinfer.prebuilt"')
#: FlashInfer 0.7.x as published, through upstream's shim (its
#: JIT_CACHE_PROVIDER_ENTRY_POINT_GROUP and schema version 1).
JIT_CACHE_PROVIDERS = Lookup(
    name="jit-cache-providers", group="flashinfer.jit_cache.providers",
    function="get_provider", evidence="get_jit_cache_providers()",
    through="flashinfer-jit-cache", through_index="https://flashinfer.ai/whl/cu{cuda}")
PROVIDER_SCHEMA_VERSION = 1

#: In the order they are tried: a FlashInfer with our lookup uses it.
LOOKUPS: tuple[Lookup, ...] = (PREBUILT, JIT_CACHE_PROVIDERS)


def of_tree(tree: Path, stack: str) -> Lookup:
    """The lookup of the FlashInfer sources at ``tree``; refuses one that has none."""
    env = tree / "flashinfer" / "jit" / "env.py"
    try:
        text = env.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError("the FlashInfer sources have no readable flashinfer/jit/env.py",
                          where=str(env)) from exc
    found = next((lookup for lookup in LOOKUPS if lookup.evidence in text), None)
    if found is None:
        groups = " or ".join(lookup.group for lookup in LOOKUPS)
        raise ConfigError(
            f"stack {stack}'s FlashInfer has no lookup for prebuilt-module packages (entry "
            f"point group {groups}): it would never load the AOT wheel's module",
            where=str(env),
            fix="add the lookup to the stack's FlashInfer series (patch 0009 of "
                "patches/sglang-0.5.10/flashinfer), or JIT-compile with nvcc >= 12.9")
    return found
