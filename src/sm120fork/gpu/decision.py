"""Which all-reduce method SGLang runs per token range, in one serving process.

The one pure decision SGLang's side (the patched SGLang and the plugin), the doctor,
``tune`` and docs/policy.md's worked example call: the process's facts and a validated
policy (or None) in; per token range the method, why, and a line per fallback out.
Without a usable policy today's rule holds (our fused path at TP :data:`.policy.DEFAULT_TP`
only); above a policy's last range SGLang's own unfused dispatch runs.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .methods import SERVING, UNFUSED
from .policy import AUTO_ENV, DEFAULT_TP, ENV_VAR, SGLANG_FUSED, read_for_doctor, validate


@dataclasses.dataclass(frozen=True, kw_only=True)
class Process:
    """What the serving process is and has (SGLang's side fills it in at start-up)."""

    world_size: int
    dtype: str = "bf16"
    gpu_major: int | None = None  # compute capability major (12: SM12x); None: not known
    #: which needed names import here (:func:`importable`); None: not known, taken as present
    present: frozenset[str] | None = None
    capturing: bool = False  # a CUDA graph is being captured
    #: AUTO_ENV's value: True/False decides our fused path's auto-enable (a policy's
    #: ranges still hold where it names another method)
    fused_override: bool | None = None


@dataclasses.dataclass(frozen=True)
class Range:
    """Tokens ``min_tokens``..``max_tokens`` (None: no upper end) run ``method``."""

    min_tokens: int
    max_tokens: int | None
    method: str
    wanted: str
    why: str


@dataclasses.dataclass(frozen=True)
class Decision:
    """One TP size's methods per token range, and the fallback lines to log."""

    tp: int
    by_policy: bool
    source: str
    ranges: tuple[Range, ...]
    fallbacks: tuple[str, ...]

    def method_for(self, tokens: int) -> str:
        for rng in self.ranges:
            if tokens >= rng.min_tokens and (rng.max_tokens is None or tokens <= rng.max_tokens):
                return rng.method
        return UNFUSED

    def route_for(self, tokens: int) -> str:
        """What SGLang switches on (a key of :data:`.methods.ROUTES`)."""
        return str(SERVING[self.method_for(tokens)].route)

    @property
    def summary(self) -> str:
        """Per range the method that runs: ``fused_auto for 1-16, ... for 513+ tokens``."""
        merged: list[tuple[str, int, int | None]] = []
        for r in self.ranges:
            low = merged.pop()[1] if merged and merged[-1][0] == r.method else r.min_tokens
            merged.append((r.method, low, r.max_tokens))
        return ", ".join(f"{m} for {lo}-{hi}" if hi is not None else f"{m} for {lo}+"
                         for m, lo, hi in merged) + " tokens"

    @property
    def line(self) -> str:
        """The start-up decision line: per range the method that runs, and the source."""
        return f"all-reduce at TP{self.tp}: {self.summary} ({self.source})"


def needed_names() -> list[str]:
    """Every importable name some method needs (what :func:`importable` is asked)."""
    return sorted({n for spec in SERVING.values() for n in spec.needs_any})


def importable(names: Iterable[str]) -> frozenset[str]:
    """Which of ``names`` import here: a ``module:attribute`` imports the module (SGLang
    has imported FlashInfer already where it matters), a bare module is only looked up."""
    found = set()
    for name in names:
        module, _, attribute = name.partition(":")
        try:
            if attribute:
                if hasattr(importlib.import_module(module), attribute):
                    found.add(name)
            elif importlib.util.find_spec(module) is not None:
                found.add(name)
        except Exception:  # a broken install is "not importable", never an error here
            continue
    return frozenset(found)


def blocker(name: str, process: Process, *, up_to: int | None = None) -> str | None:
    """Why this process cannot run method ``name`` for tokens up to ``up_to`` (None: it can)."""
    spec = SERVING.get(name)
    if spec is None:
        return "this reader does not know the method (a policy from a newer toolkit?)"
    if spec.route is None:
        return "SGLang cannot select it (a bench-only variant)"
    if name == SGLANG_FUSED and process.fused_override is False:
        return f"{AUTO_ENV}=0 turns our fused path off"
    if spec.dtypes and process.dtype not in spec.dtypes:
        return f"it runs {'/'.join(spec.dtypes)} only; this process all-reduces {process.dtype}"
    if spec.world_sizes and process.world_size not in spec.world_sizes:
        return (f"it runs at TP {', '.join(map(str, spec.world_sizes))} only; "
                f"this process is TP{process.world_size}")
    if spec.gpu_majors and process.gpu_major is not None \
            and process.gpu_major not in spec.gpu_majors:
        return (f"it runs on SM{'/'.join(f'{m}x' for m in spec.gpu_majors)} only; this GPU "
                f"is SM{process.gpu_major}x")
    if spec.needs_any and process.present is not None \
            and not set(spec.needs_any) & process.present:
        return f"{' or '.join(spec.needs_any)} does not import here"
    if spec.max_tokens is not None and (up_to is None or up_to > spec.max_tokens):
        return f"it takes at most {spec.max_tokens} tokens"
    if process.capturing and not spec.in_graphs:
        return "it cannot be captured into a CUDA graph"
    return None


def _walk(tp: int, lo: int, hi: int | None, candidates: list[str], why: str,
          process: Process, lines: list[str]) -> Range:
    """The first candidate this process can run over lo..hi; one line per one skipped."""
    order = list(dict.fromkeys([*candidates, UNFUSED]))
    span = f"{lo}-{hi}" if hi is not None else f"{lo}+"
    for i, name in enumerate(order):
        reason = None if name == UNFUSED else blocker(name, process, up_to=hi)
        if reason is None:
            return Range(lo, hi, name, order[0], why if i == 0 else
                         f"{why}; {order[0]} cannot run here, fallen back")
        lines.append(f"TP{tp} tokens {span}: {name} cannot run here ({reason}); falling "
                     f"back to {order[i + 1]}")
    raise AssertionError("UNFUSED always runs")  # pragma: no cover


def decide(policy: Mapping[str, Any] | None, process: Process, *, source: str = "",
           why_not: str = "no policy") -> Decision:
    """The methods per token range at this process's TP size, from a validated ``policy``
    or None; ``source`` names it in the line, ``why_not`` says why none is followed."""
    tp = process.world_size
    lines: list[str] = []
    entry = None
    if policy is not None:
        if not policy.get("for_use"):
            why_not = "the policy is marked not for use"
        else:
            entry = policy["tp"].get(str(tp))
            why_not = f"the policy has no entry for TP{tp}"
    if entry is None:
        if process.fused_override is not None:
            want = SGLANG_FUSED if process.fused_override else UNFUSED
            why = f"{AUTO_ENV}={int(process.fused_override)}; {why_not}"
        else:
            want = SGLANG_FUSED if tp == DEFAULT_TP else UNFUSED
            why = f"today's rule: our fused path at TP{DEFAULT_TP} only; {why_not}"
        rng = _walk(tp, 1, None, [want], why, process, lines)
        return Decision(tp, False, why, (rng,), tuple(lines))
    ranges = [_walk(tp, r["min_tokens"], r["max_tokens"], [r["method"], *r.get("fallback", [])],
                    "measured fastest here", process, lines) for r in entry["ranges"]]
    last = entry["ranges"][-1]["max_tokens"] if entry["ranges"] else 0
    ranges.append(Range(last + 1, None, UNFUSED, UNFUSED,
                        "not measured above" if last else "no range measured"))
    return Decision(tp, True, source or "the policy", tuple(ranges), tuple(lines))


# --- which policy SGLang follows, and SGLang's side -------------------------------------

def measured_where(made: Mapping[str, Any]) -> str:
    """Where and when a policy was measured, as the start-up line and the doctor say it."""
    return (f"measured {made.get('created', '?')} on {made.get('gpu', '?')} "
            f"x{made.get('gpu_count', '?')}"
            + (f", stack {made['stack']}" if made.get("stack") else "")
            + (", on a shared GPU" if made.get("shared_gpu") else ""))


def applicable(facts: Mapping[str, Any], *, gpu_major: int | None, gpu_name: str | None,
               ) -> tuple[dict[str, Any] | None, str, str]:
    """(the policy SGLang follows or None, how the line names it, why none is followed)
    from :func:`.policy.read_for_doctor`'s ``facts``: one marked for use, on SM12x (or an
    unknown GPU), else only on the GPU model it was measured on (so SM90/SM100 without
    such a file stay exactly upstream's)."""
    path, error = str(facts.get("path")), facts.get("error")
    if not facts.get("found"):
        return None, "", f"no policy at {path}" + (f" ({error})" if error else "")
    if error is not None:
        return None, "", f"policy {path} not usable ({error})"
    try:
        doc = validate(facts.get("document"), path)
    except Exception as exc:  # ConfigError: said in the line, never raised into SGLang
        return None, "", f"policy {path} not usable ({getattr(exc, 'message', exc)})"
    made = doc.get("made") or {}
    if not doc["for_use"]:
        return None, "", (f"policy {path} is marked not for use ("
                          f"{made.get('note') or 'made on a shared GPU'})")
    if gpu_major not in (None, 12) and made.get("gpu") != gpu_name:
        return None, "", (f"policy {path} was measured on {made.get('gpu', '?')}, not on "
                          f"this {gpu_name or 'GPU'}: off SM12x a policy is followed only "
                          "on the GPU model it was measured on")
    return doc, f"policy {path}, {measured_where(made)}", ""


#: per process: the file as read ("file"), the GPU ("gpu"), the importable names
#: ("present"), and each decision made, by what it was made from
_SGLANG: dict[Any, Any] = {}


def sglang_forget() -> None:
    """Read the file again at the next call (a changed environment, the CPU probes)."""
    _SGLANG.clear()


def _gpu() -> tuple[int | None, str | None]:
    """(capability major, name) of the GPU, from the torch SGLang loaded (None: not known)."""
    if "gpu" not in _SGLANG:
        try:
            cuda = sys.modules["torch"].cuda
            _SGLANG["gpu"] = (int(cuda.get_device_capability()[0]), str(cuda.get_device_name()))
        except Exception:  # no torch, no GPU: nothing known, nothing raised into SGLang
            _SGLANG["gpu"] = (None, None)
    major, name = _SGLANG["gpu"]
    return major, name


def sglang_decision(tp: int, *, sm12x: bool, dtype: str = "bf16", capturing: bool = False,
                    announce: Callable[[str], None] | None = None,
                    announce_line: bool = True) -> Decision | None:
    """The decision at TP ``tp`` (``sm12x``: SGLang's platform test), or None where SGLang
    keeps its own code (off SM12x without a policy measured on this GPU model).  The file
    is read once a process, each decision made once: ``announce`` gets its line (unless
    ``announce_line`` is false) and its fallback lines then."""
    if "file" not in _SGLANG:
        _SGLANG["file"] = read_for_doctor()
    if not sm12x and not _SGLANG["file"]["found"]:
        return None
    if "present" not in _SGLANG:
        _SGLANG["present"] = importable(needed_names())
    major, name = _gpu()
    major = 12 if sm12x else major
    key = (tp, dtype, capturing, major, name, _override(os.environ.get(AUTO_ENV)))
    made = _SGLANG.get(key)
    if made is None:
        policy, source, why_not = applicable(_SGLANG["file"], gpu_major=major, gpu_name=name)
        process = Process(world_size=tp, dtype=dtype, gpu_major=major, capturing=capturing,
                          present=_SGLANG["present"], fused_override=key[-1])
        made = _SGLANG[key] = decide(policy, process, source=source, why_not=why_not)
        # per batch (no line) only a policy's fallbacks: without one, nothing new runs
        if announce is not None and (announce_line or made.by_policy):
            for text in ([made.line] if announce_line else []) + list(made.fallbacks):
                announce(text)
    return made if sm12x or made.by_policy else None


def sglang_not_followed(tp: int) -> str | None:
    """Off SM12x, where :func:`sglang_decision` left SGLang's code as upstream's: the line
    naming the file found there and why it is not followed (None: no file, or followed)."""
    file = _SGLANG.get("file")
    if file is None or not file["found"]:
        return None
    major, name = _gpu()
    policy, _, why_not = applicable(file, gpu_major=major, gpu_name=name)
    if policy is not None:
        return None
    return f"all-reduce at TP{tp}: SGLang's own code, as upstream ({why_not})"


def sglang_route(tp: int, tokens: int, *, sm12x: bool, dtype: str = "bf16",
                 capturing: bool = False,
                 announce: Callable[[str], None] | None = None) -> str | None:
    """The route (a key of :data:`.methods.ROUTES`) a policy names for a batch of
    ``tokens`` at TP ``tp``; None where no policy decides (SGLang runs today's code)."""
    decision = sglang_decision(tp, sm12x=sm12x, dtype=dtype, capturing=capturing,
                               announce=announce, announce_line=False)
    return decision.route_for(int(tokens)) if decision and decision.by_policy else None


def uses_route(decision: Decision, route: str) -> bool:
    """Whether some token range of ``decision`` runs ``route`` (pcie_ipc: switch it on)."""
    return any(SERVING[r.method].route == route for r in decision.ranges)


def _override(value: str | None) -> bool | None:
    """SGLANG_SM120_FLASHINFER_ALLREDUCE_FUSION_AUTO's value: on, off, or not set."""
    if value is None or not value.strip():
        return None
    return value.strip().lower() in ("1", "on", "true", "yes")


# --- the doctor's view: what SGLang decides with the policy the doctor found -------------

def view(facts: Mapping[str, Any], sizes: Iterable[int], *, override: str | None = None,
         gpu_major: int | None = None, present: frozenset[str] | None = None,
         gpu_name: str | None = None) -> dict[str, Any]:
    """What SGLang runs per TP size (``sizes`` and the policy's own) with the policy the
    doctor found (``facts``: :func:`.policy.read_for_doctor`'s), as data and text; each
    TP size's line is the one SGLang logs at start-up."""
    raw = facts.get("document")
    error = facts.get("error")
    doc: dict[str, Any] = {}
    if raw is not None and error is None:
        try:
            doc = validate(raw, str(facts["path"]))
        except Exception as exc:  # ConfigError: shown, never raised into the doctor
            error = getattr(exc, "message", str(exc))
    made = doc.get("made") or {}
    applies = bool(doc) and doc["for_use"] is True
    source = {"path": facts.get("path"), "named_by": facts.get("named_by"),
              "found": bool(facts.get("found")), "usable": bool(doc), "error": error,
              "version": raw.get("version") if isinstance(raw, dict) else None,
              "for_use": doc.get("for_use"), "shared_gpu": made.get("shared_gpu"),
              "note": made.get("note"), "made": made or None}
    named = (f"named by {ENV_VAR}" if facts.get("named_by") == ENV_VAR
             else f"the default place; {ENV_VAR} names another")
    head = [f"policy file: {facts.get('path')} ({named})"]
    if not facts.get("found"):
        head.append("no policy there: SGLang keeps today's decision")
    elif not doc:
        head.append(f"not usable ({error}): SGLang keeps today's decision")
    else:
        state = ("for use: SGLang follows it" if applies else
                 f"marked NOT FOR USE ({made.get('note') or 'made on a shared GPU'}): "
                 "SGLang ignores it and keeps today's decision")
        head.append(f"format {doc['format']} version {doc['version']}, "
                    f"{measured_where(made)}; {state}")
    forced = _override(override)
    if override is not None:
        head.append(f"{AUTO_ENV}={override} decides our fused path's auto-enable"
                    + (" (the policy's ranges still hold)" if applies else ""))
    policy, source_line, why_not = applicable(facts, gpu_major=gpu_major, gpu_name=gpu_name)
    lines: list[str] = []
    per_tp = []
    for tp in sorted({*sizes, *(int(t) for t in doc.get("tp", {}))}):
        decision = decide(policy, Process(world_size=tp, gpu_major=gpu_major, present=present,
                                          fused_override=forced),
                          source=source_line, why_not=why_not)
        entry = doc.get("tp", {}).get(str(tp)) or {}
        per_tp.append({**dataclasses.asdict(decision), "fallbacks": list(decision.fallbacks),
                       "ranges": [dataclasses.asdict(r) for r in decision.ranges],
                       "decided_by": "policy" if decision.by_policy else (
                           AUTO_ENV if forced is not None else "today's rule"),
                       "followed": decision.by_policy,
                       "measured": list(entry.get("ranges", [])),
                       "excluded": dict(entry.get("excluded", {})),
                       "not_measured": dict(entry.get("not_measured", {}))})
        lines += [decision.line, *(f"  {line}" for line in decision.fallbacks)]
        if entry and not decision.by_policy:
            measured = ", ".join(f"{r['min_tokens']}-{r['max_tokens']}: {r['method']}"
                                 for r in entry.get("ranges", []))
            lines.append(f"  measured (not followed): {measured or 'nothing'}")
        lines += [f"  TP{tp}: {name} left out: {why_out}"
                  for name, why_out in sorted(entry.get("excluded", {}).items())]
    return {"source": source, "applies": applies, "override": override, "tp": per_tp,
            "head": head, "lines": lines}


def main(argv: list[str]) -> int:
    """``python -m <package>.gpu.decision NAME...``: which names import in this interpreter
    (the doctor asks in a child, so FlashInfer's imports stay out of its own process)."""
    from ..util import wire  # the doctor's wire, outside what G7 bundles

    wire.say("IMPORTABLE", {"present": sorted(importable(argv or needed_names()))})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
