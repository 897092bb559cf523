"""The all-reduce policy: from a bench's measurements, per TP size, which method wins where.

The file (JSON, ``policy.json`` beside the bench report) is what SGLang's patched
start-up decision (S2 / G2), its fused-path token cap and the plugin read; the doctor
prints it.  Format version 1::

    {
      "format": "sm120fork-allreduce-policy",
      "version": 1,
      "for_use": true,             # false: made on a shared GPU (or partial); readers
                                   # ignore the file and keep their default decision
      "made": {"created": "...", "gpu": "...", "gpu_count": 8, "shared_gpu": false,
               "stack": "sglang-0.5.23", "dtype": "bf16", "hidden": [4096, 6144, 7168],
               "note": "..."},
      "tp": {
        "2": {
          "fused_max_tokens": 64,  # SGLang's fused path (fused_auto) is taken only for
                                   # 1..64 tokens; 0 = never (fusion off at this TP)
          "ranges": [              # the winner over each range of measured token counts
            {"min_tokens": 1, "max_tokens": 64, "method": "fused_auto", "fused": true},
            {"min_tokens": 65, "max_tokens": 512, "method": "pcie_ipc_rmsnorm",
             "fused": false}],
          "measured_tokens": [1, 2, 4, ...],
          "excluded": {"custom_vllm_rmsnorm": "failed its output check at ..."}
        }
      }
    }

Token counts above the last range were not measured: readers take no fused path there.
The fused path is never chosen where a measured method beat it: ``fused_max_tokens`` is
the largest count T such that at every measured count <= T, at every hidden size, no
other correct method (our other fused variants aside: SGLang cannot choose them) was
faster than ``fused_auto``.  Only the fused-path part is applied by SGLang; the winner
among unfused methods is reported for the user (SGLang's own dispatch picks those).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError  # relative: the plugin wheel may vendor policy + methods
from .methods import FAILED_CHECK, METHODS, TIMED

FORMAT = "sm120fork-allreduce-policy"
VERSION = 1
FILE_NAME = "policy.json"
#: the method that is SGLang's fused path (it passes use_oneshot=None: FlashInfer picks)
SGLANG_FUSED = "fused_auto"
#: where SGLang looks for the file unless SGLANG_SM120_ALLREDUCE_POLICY names one
ENV_VAR = "SGLANG_SM120_ALLREDUCE_POLICY"
DEFAULT_PATH = "~/.config/sm120fork/allreduce-policy.json"


def _latency(rec: Mapping[str, Any]) -> float:
    """A collective is as slow as its slowest rank: the max of the ranks' medians."""
    medians = [m for m in rec.get("rank_medians_us") or [] if m is not None]
    return float(max(medians) if medians else rec["median_us"])


def _tp_policy(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One world size's records -> its policy entry."""
    excluded: dict[str, str] = {}
    for rec in records:
        if rec.get("kind") == "point" and rec.get("status") == FAILED_CHECK:
            excluded.setdefault(rec["method"], f"failed its output check at "
                                f"{rec['tokens']} tokens, hidden {rec['hidden']}")
    lat: dict[int, dict[int, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for rec in records:
        if (rec.get("kind") == "point" and rec.get("status") == TIMED
                and rec["method"] not in excluded and rec["method"] in METHODS):
            lat[int(rec["tokens"])][int(rec["hidden"])][rec["method"]] = _latency(rec)
    tokens = sorted(lat)
    winners: list[str] = []
    fused_ok: list[bool] = []
    for t in tokens:
        by_hidden = lat[t]
        per_hidden = {h: min(m, key=m.__getitem__) for h, m in by_hidden.items()}
        if len(set(per_hidden.values())) == 1:
            winner = next(iter(per_hidden.values()))
        else:  # no method wins at every hidden size: the best worst-case ratio
            names = set.intersection(*(set(m) for m in by_hidden.values()))
            winner = min(names, key=lambda n: max(
                m[n] / min(m.values()) for m in by_hidden.values()))
        winners.append(winner)
        fused_ok.append(all(
            SGLANG_FUSED in m and all(v >= m[SGLANG_FUSED] for n, v in m.items()
                                      if not METHODS[n].ours)
            for m in by_hidden.values()))
    cap = 0
    for t, ok in zip(tokens, fused_ok, strict=True):
        if not ok:
            break
        cap = t
    ranges: list[dict[str, Any]] = []
    low = 1
    for t, winner in zip(tokens, winners, strict=True):
        if ranges and ranges[-1]["method"] == winner:
            ranges[-1]["max_tokens"] = t
        else:
            ranges.append({"min_tokens": low, "max_tokens": t, "method": winner,
                           "fused": METHODS[winner].fused})
        low = t + 1
    return {"fused_max_tokens": cap, "ranges": ranges, "measured_tokens": tokens,
            "excluded": excluded}


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


def validate(doc: Any, where: str) -> dict[str, Any]:
    """The document, or a ConfigError naming the file and the dotted key."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError(f"not an all-reduce policy (format must be {FORMAT!r})",
                          where=where)
    if doc.get("version") != VERSION:
        raise ConfigError(f"policy version {doc.get('version')!r} is not {VERSION}",
                          where=f"{where}: version", fix="re-make it with this toolkit's bench")
    if not isinstance(doc.get("for_use"), bool):
        raise ConfigError("for_use must be true or false", where=f"{where}: for_use")
    tps = doc.get("tp")
    if not isinstance(tps, dict):
        raise ConfigError("tp must be a table of TP sizes", where=f"{where}: tp")
    for tp, entry in tps.items():
        key = f"{where}: tp.{tp}"
        if not str(tp).isdigit() or not isinstance(entry, dict):
            raise ConfigError("each TP size maps to a table", where=key)
        cap = entry.get("fused_max_tokens")
        if not isinstance(cap, int) or isinstance(cap, bool) or cap < 0:
            raise ConfigError("fused_max_tokens must be an integer >= 0",
                              where=f"{key}.fused_max_tokens")
        low = 1
        for i, rng in enumerate(entry.get("ranges", [])):
            if (not isinstance(rng, dict) or rng.get("min_tokens") != low
                    or not isinstance(rng.get("max_tokens"), int)
                    or rng["max_tokens"] < low or not isinstance(rng.get("method"), str)):
                raise ConfigError("ranges must be contiguous from 1, each with min_tokens, "
                                  "max_tokens and method", where=f"{key}.ranges[{i}]")
            low = rng["max_tokens"] + 1
    return doc


def load(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read the policy: {exc}", where=str(path)) from exc
    return validate(doc, str(path))


def describe(doc: Mapping[str, Any]) -> list[str]:
    """One line per TP size: what SGLang takes, and the winner per token range."""
    lines = []
    if not doc.get("for_use"):
        lines.append("marked NOT FOR USE (" + str(doc.get("made", {}).get(
            "note") or "made on a shared GPU") + "): SGLang ignores it")
    for tp, entry in sorted(doc.get("tp", {}).items(), key=lambda kv: int(kv[0])):
        cap = entry["fused_max_tokens"]
        fused = f"fused path for 1-{cap} tokens" if cap else "fused path never"
        ranges = ", ".join(f"{r['min_tokens']}-{r['max_tokens']}: {r['method']}"
                           for r in entry.get("ranges", []))
        lines.append(f"TP{tp}: {fused}; winners {ranges or 'none measured'}")
    return lines


def locate(environ: Mapping[str, str] | None = None) -> Path:
    """Where SGLang's patched start-up (S1/S2, G2/G3) looks for the policy."""
    import os

    env = os.environ if environ is None else environ
    return Path(os.path.expanduser(env.get(ENV_VAR) or DEFAULT_PATH))


def doctor_lines(path: Path | None = None,
                 environ: Mapping[str, str] | None = None) -> list[str]:
    """For the doctor: which policy SGLang would follow here, per TP size, or why none.

    Never raises: a missing or bad file is a line saying SGLang keeps its default
    decision (the TP2 rule), which is what the patched SGLang then does.
    """
    where = path or locate(environ)
    if not where.is_file():
        return [f"all-reduce policy: none at {where} ({ENV_VAR} names another): SGLang "
                "keeps its default decision (fused path auto-enabled at TP2 only)"]
    try:
        doc = load(where)
    except ConfigError as exc:
        return [f"all-reduce policy: {where} is not usable ({exc.message}): SGLang keeps "
                "its default decision"]
    made = doc.get("made", {})
    head = (f"all-reduce policy: {where} (measured {made.get('created', '?')} on "
            f"{made.get('gpu', '?')} x{made.get('gpu_count', '?')}"
            + (f", stack {made['stack']}" if made.get("stack") else "") + ")")
    return [head, *(f"  {line}" for line in describe(doc))]
