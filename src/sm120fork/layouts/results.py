"""What every layout's behaviour checks share: the result type, the probe's line, and
the shape of a GPU layer harness case the checks judge.

Below verify/ and gpu/ (both use the adapters): the adapters get the harness's case
runner passed in (:data:`LayerRunner`), they do not import it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

RESULT_MARKER = "SM120FORK-PROBE-RESULT "
REQUIREMENTS = "pip install --group sglang-probe  # in the checkout, pip >= 25.1"


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    """One observed behaviour against the one expected; values are compact JSON."""

    name: str
    capability: str
    expected: str
    observed: str
    passed: bool
    detail: str


def compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


class LayerOutcome(Protocol):
    """One case of the GPU layer harness (:class:`sm120fork.gpu.sglang_layer.CaseOutcome`)."""

    @property
    def passed(self) -> bool: ...

    @property
    def hung(self) -> bool: ...

    @property
    def problems(self) -> Sequence[str]: ...

    @property
    def ranks(self) -> Sequence[dict[str, Any]]: ...


#: ``run(case, sglang_path=..., layout=..., python=..., device="cpu", tokens=...,
#: timeout=..., start_timeout=...)``: :func:`sm120fork.gpu.sglang_layer.run_case`.
LayerRunner = Callable[..., LayerOutcome]
