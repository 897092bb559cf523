"""The all-reduce policy: from a bench's measurements, per TP size, which method runs where.

docs/policy.md documents the file (a test checks it names every key the bench writes) and
how the ranges are ranked: per measured token count the methods SGLang can run that ran at
every hidden size, by their worst ratio to the fastest; a method that failed its output
check anywhere is left out of the whole TP size.
"""

from __future__ import annotations

import itertools
import json
import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError  # relative: the plugin wheel vendors policy + methods
from .methods import FAILED_CHECK, METHODS, NOT_RUNNABLE, SERVING, TIMED

FORMAT = "sm120fork-allreduce-policy"
VERSION = 2
FILE_NAME = "policy.json"
#: the method that is SGLang's fused path (it passes use_oneshot=None: FlashInfer picks)
SGLANG_FUSED = "fused_auto"
#: where SGLang looks for the file unless SGLANG_SM120_ALLREDUCE_POLICY names one
ENV_VAR = "SGLANG_SM120_ALLREDUCE_POLICY"
DEFAULT_PATH = "~/.config/sm120fork/allreduce-policy.json"


def latency(rec: Mapping[str, Any]) -> float:
    """A collective is as slow as its slowest rank: the max of the ranks' medians."""
    medians = [m for m in rec.get("rank_medians_us") or [] if m is not None]
    return float(max(medians) if medians else rec["median_us"])


def servable(name: str) -> bool:
    """Whether SGLang can run this bench method when a policy names it."""
    return name in SERVING and SERVING[name].route is not None


def _worst_ratios(by_hidden: Mapping[int, Mapping[str, float]]) -> dict[str, float]:
    """Per method that ran at every hidden size: its worst latency / the fastest's."""
    names = set.intersection(*(set(m) for m in by_hidden.values()))
    return {n: max(m[n] / min(m.values()) for m in by_hidden.values()) for n in names}


def _tp_policy(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One world size's records -> its policy entry."""
    excluded: dict[str, str] = {}
    not_measured: dict[str, str] = {}
    for rec in records:
        if rec.get("kind") == "point" and rec.get("status") == FAILED_CHECK:
            excluded.setdefault(rec["method"], f"failed its output check at "
                                f"{rec['tokens']} tokens, hidden {rec['hidden']}")
        elif (rec.get("kind") == "method" and rec.get("status") == NOT_RUNNABLE
              and servable(str(rec.get("method")))):
            not_measured.setdefault(rec["method"], str(rec.get("reason") or "not runnable"))
    lat: dict[int, dict[int, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for rec in records:
        if (rec.get("kind") == "point" and rec.get("status") == TIMED
                and rec["method"] not in excluded and servable(rec["method"])):
            lat[int(rec["tokens"])][int(rec["hidden"])][rec["method"]] = latency(rec)
    # per token count (in order) the winner: the method fastest at every hidden size, else
    # the best worst-case ratio; ties go to the registry's order
    ratios: dict[int, dict[str, float]] = {}
    winners: dict[int, str] = {}
    for t in sorted(lat):
        worst = ratios[t] = _worst_ratios(lat[t])
        fastest = {min(m, key=m.__getitem__) for m in lat[t].values()}
        if worst:
            winners[t] = fastest.pop() if len(fastest) == 1 else min(
                worst, key=lambda n: (worst[n], list(METHODS).index(n)))
    ranges: list[dict[str, Any]] = []
    for winner, run in itertools.groupby(winners, key=winners.__getitem__):
        group = list(run)
        others = set.intersection(*(set(ratios[t]) for t in group)) - {winner}
        worst = {n: max(ratios[t][n] for t in group) for n in others}
        ranges.append({"min_tokens": ranges[-1]["max_tokens"] + 1 if ranges else 1,
                       "max_tokens": group[-1], "method": winner,
                       "fallback": sorted(others, key=lambda n: (worst[n],
                                                                 list(METHODS).index(n)))})
    named = {n for r in ranges for n in (r["method"], *r["fallback"])}
    return {"ranges": ranges, "measured_tokens": list(winners), "excluded": excluded,
            "not_measured": {n: why for n, why in not_measured.items() if n not in named}}


def derive(records_by_world: Mapping[int, Sequence[Mapping[str, Any]]], *,
           made: Mapping[str, Any], for_use: bool) -> dict[str, Any]:
    """The policy document of a bench run (records per world size)."""
    return {"format": FORMAT, "version": VERSION, "for_use": for_use, "made": dict(made),
            "tp": {str(ws): _tp_policy(recs) for ws, recs in sorted(records_by_world.items())
                   if any(r.get("kind") == "point" for r in recs)}}


def write(doc: Mapping[str, Any], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / FILE_NAME
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return path


def _int_at_least(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _entry(entry: Mapping[str, Any], key: str) -> dict[str, Any]:
    low = 1
    ranges = entry.get("ranges")
    if not isinstance(ranges, list):
        raise ConfigError("ranges must be a list", where=f"{key}.ranges")
    for i, rng in enumerate(ranges):
        where = f"{key}.ranges[{i}]"
        if not isinstance(rng, dict):
            raise ConfigError("each range is a table", where=where)
        if rng.get("min_tokens") != low:
            raise ConfigError(f"min_tokens must be {low}: ranges are contiguous from 1 token",
                              where=f"{where}.min_tokens")
        if not _int_at_least(rng.get("max_tokens"), low):
            raise ConfigError(f"max_tokens must be an integer >= {low}",
                              where=f"{where}.max_tokens")
        if not isinstance(rng.get("method"), str) or not rng["method"]:
            raise ConfigError("method must name a method", where=f"{where}.method",
                              fix=f"one of {sorted(n for n, s in SERVING.items() if s.route)}")
        fallback = rng.get("fallback", [])
        if not isinstance(fallback, list) or not all(isinstance(f, str) for f in fallback):
            raise ConfigError("fallback must be a list of method names",
                              where=f"{where}.fallback")
        low = rng["max_tokens"] + 1
    return {**entry, "ranges": [{**r, "fallback": list(r.get("fallback", []))}
                                for r in ranges]}


def validate(doc: Any, where: str) -> dict[str, Any]:
    """The document, or a ConfigError naming the file and the dotted key."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError(f"not an all-reduce policy (format must be {FORMAT!r})",
                          where=f"{where}: format")
    version = doc.get("version")
    if version != VERSION:
        raise ConfigError(f"policy version {version!r}: this reader takes versions {VERSION}",
                          where=f"{where}: version",
                          fix="re-make it with this toolkit: nox -s tune -- --stack NAME")
    if not isinstance(doc.get("for_use"), bool):
        raise ConfigError("for_use must be true or false", where=f"{where}: for_use")
    tps = doc.get("tp")
    if not isinstance(tps, dict):
        raise ConfigError("tp must be a table of TP sizes", where=f"{where}: tp")
    entries: dict[str, Any] = {}
    for tp, entry in tps.items():
        key = f"{where}: tp.{tp}"
        if not str(tp).isdigit() or int(tp) < 2:
            raise ConfigError("TP sizes are integers >= 2", where=key)
        if not isinstance(entry, dict):
            raise ConfigError("each TP size maps to a table", where=key)
        entries[str(tp)] = _entry(entry, key)
    made = doc.get("made", {})
    if not isinstance(made, dict):
        raise ConfigError("made must be a table", where=f"{where}: made")
    return {**doc, "made": made, "tp": entries}


def load(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read the policy: {exc}", where=str(path)) from exc
    return validate(doc, str(path))


def describe(doc: Mapping[str, Any]) -> list[str]:
    """One line per TP size: the method per token range, fallbacks in brackets."""
    lines = []
    if not doc.get("for_use"):
        lines.append("marked NOT FOR USE (" + str(doc.get("made", {}).get(
            "note") or "made on a shared GPU") + "): SGLang ignores it")
    for tp, entry in sorted(doc.get("tp", {}).items(), key=lambda kv: int(kv[0])):
        ranges = ", ".join(
            f"{r['min_tokens']}-{r['max_tokens']}: {r['method']}"
            + (f" (then {', '.join(r['fallback'])})" if r.get("fallback") else "")
            for r in entry.get("ranges", []))
        lines.append(f"TP{tp}: {ranges or 'none measured'}"
                     + ("; above: SGLang's own dispatch" if ranges else ""))
    return lines


# SGLang's patched code cannot import this module, so it spells the place out; a test
# (test_sglang_looks_where_the_doctor_looks) checks each such patch reads ENV_VAR, else
# DEFAULT_PATH.

#: SGLang's explicit auto-enable override (S2/G2): it decides before any policy does
AUTO_ENV = "SGLANG_SM120_FLASHINFER_ALLREDUCE_FUSION_AUTO"
#: the TP size today's rule auto-enables on SM12x (one node) when no policy applies
DEFAULT_TP = 2


def locate(environ: Mapping[str, str] | None = None) -> Path:
    """Where SGLang's patched code (S1/S2, G2/G3) looks: ENV_VAR's file, else DEFAULT_PATH."""
    env = os.environ if environ is None else environ
    return Path(os.path.expanduser(env.get(ENV_VAR) or DEFAULT_PATH))


def read_for_doctor(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Where SGLang looks, who named that place, the document found there (as read, so a
    doctor's record can be judged elsewhere) or why none was read; never raises."""
    env = os.environ if environ is None else environ
    where = locate(env)
    facts: dict[str, Any] = {"path": str(where),
                             "named_by": ENV_VAR if env.get(ENV_VAR) else "default",
                             "found": where.is_file(), "document": None, "error": None}
    if facts["found"]:
        try:
            facts["document"] = json.loads(where.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            facts["error"] = f"cannot read it: {exc}"
    elif os.path.lexists(where):
        facts["error"] = "not a file"
    return facts
