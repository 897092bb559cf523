"""The all-reduce policy: from a bench's measurements, per TP size, which method wins where.

The file (JSON, ``policy.json`` beside the bench report) is what SGLang's patched
start-up decision (S2 / G2), its fused-path token cap and the plugin read; the doctor
prints it.  README.md documents the format for users (a test checks that its table names
every key the bench writes).  Format version 1::

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



# --- where SGLang looks, and what it then decides (the doctor's view) ---------------------
#
# SGLang's patched code (S1's ``sm120_allreduce_policy`` in utils/common.py, G2's
# ``_flashinfer_allreduce_fusion_auto_enable``, G3's ``flashinfer_ar_fusion_applies``, and
# so the plugin's hooks made from G2/G3) cannot import this module, so it spells the
# place out; a test (``test_sglang_looks_where_the_doctor_looks``) checks that every patch
# that reads a policy reads ENV_VAR, else DEFAULT_PATH, and nothing else.  The doctor
# uses :func:`locate`.

#: SGLang's explicit auto-enable override (S2/G2): it decides before any policy does
AUTO_ENV = "SGLANG_SM120_FLASHINFER_ALLREDUCE_FUSION_AUTO"
#: the TP size today's rule auto-enables on SM12x (one node) when no policy applies
DEFAULT_TP = 2


def locate(environ: Mapping[str, str] | None = None) -> Path:
    """Where SGLang's patched start-up (S1/S2, G2/G3) looks for the policy: the file
    ``SGLANG_SM120_ALLREDUCE_POLICY`` names, else ``DEFAULT_PATH`` (``~`` expanded)."""
    import os

    env = os.environ if environ is None else environ
    return Path(os.path.expanduser(env.get(ENV_VAR) or DEFAULT_PATH))


def read_for_doctor(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The doctor's facts about the policy: where SGLang looks, who named that place,
    and the document found there (as read, so a record can be judged elsewhere).
    Never raises."""
    import os

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


def _method(name: str) -> str:
    return name if name in METHODS else f"{name} (a method this toolkit does not know)"


def view(facts: Mapping[str, Any], sizes: Sequence[int], *,
         override: str | None = None) -> dict[str, Any]:
    """What SGLang does with the policy the doctor found, per TP size, as data and text
    (``head``: the file's lines, ``lines``: one per TP size).

    ``facts``: :func:`read_for_doctor`'s; ``sizes``: the TP sizes to show (the policy's
    own are added); ``override``: the value of :data:`AUTO_ENV` in force, if any.  The
    decision per TP size is the one the patched SGLang makes: the policy's where it is
    usable and has the TP size, else today's rule (:data:`DEFAULT_TP` only); an override
    decides the auto-enable, and the policy's token cap holds even then.
    """
    raw = facts.get("document")
    error = facts.get("error")
    doc: dict[str, Any] = {}
    if raw is not None and error is None:
        try:
            doc = validate(raw, str(facts["path"]))
        except ConfigError as exc:
            error = exc.message
    valid = bool(doc)
    made = doc.get("made") or {}
    applies = valid and doc["for_use"] is True
    named = (f"named by {ENV_VAR}" if facts.get("named_by") == ENV_VAR
             else f"the default place; {ENV_VAR} names another")
    source: dict[str, Any] = {
        "path": facts.get("path"), "named_by": facts.get("named_by"),
        "found": bool(facts.get("found")), "usable": valid, "error": error,
        "version": raw.get("version") if isinstance(raw, dict) else None,
        "for_use": doc.get("for_use") if valid else None,
        "shared_gpu": made.get("shared_gpu"), "note": made.get("note"),
        "made": made or None}
    lines = [f"policy file: {facts.get('path')} ({named})"]
    if not facts.get("found"):
        lines.append("no policy there: SGLang keeps today's decision")
    elif not valid:
        lines.append(f"not usable ({error}): SGLang keeps today's decision")
    else:
        where = (f"measured {made.get('created', '?')} on {made.get('gpu', '?')} "
                 f"x{made.get('gpu_count', '?')}"
                 + (f", stack {made['stack']}" if made.get("stack") else "")
                 + (", on a shared GPU" if made.get("shared_gpu") else ""))
        state = ("for use: SGLang follows it" if applies else
                 f"marked NOT FOR USE ({made.get('note') or 'made on a shared GPU'}): "
                 "SGLang ignores it and keeps today's decision")
        lines.append(f"format {doc['format']} version {doc['version']}, {where}; {state}")
    if override is not None:
        lines.append(f"{AUTO_ENV}={override} decides the auto-enable at every TP size"
                     + (" (the policy's token cap still holds)" if applies else ""))
    head, lines = lines, []
    tps: dict[str, Any] = doc["tp"] if valid else {}
    shown = sorted({*sizes, *(int(t) for t in tps)})
    per_tp: list[dict[str, Any]] = []
    for tp in shown:
        entry = tps.get(str(tp)) if applies else None
        ranges = list((tps.get(str(tp)) or {}).get("ranges", []))
        excluded = dict((tps.get(str(tp)) or {}).get("excluded", {}))
        if entry is not None:
            cap: int | None = int(entry["fused_max_tokens"])
            by, auto = "policy", bool(cap)
            what = (f"fused path for 1-{cap} tokens, unfused above" if cap else
                    "fused path never (a measured method beat it from 1 token on)")
        else:
            cap, by, auto = None, "today's rule", tp == DEFAULT_TP
            why = ("not in the policy" if applies else "")
            what = ((f"{why}: " if why else "") + "today's decision: " + (
                f"fused path auto-enabled at TP{DEFAULT_TP} on one node, no token cap "
                "beyond SGLang's own" if auto else
                f"not auto-enabled (only TP{DEFAULT_TP} is)"))
        if override is not None:
            by = AUTO_ENV
            auto = override.strip().lower() in ("1", "on")
        per_tp.append({"tp": tp, "decided_by": by, "auto_enable": auto,
                       "fused_max_tokens": cap, "ranges": ranges, "excluded": excluded,
                       "followed": entry is not None})
        winners = ", ".join(f"{r['min_tokens']}-{r['max_tokens']}: {_method(r['method'])}"
                            for r in ranges)
        measured = ""
        if winners:
            measured = ("; measured winners " if entry is not None
                        else "; measured (not followed): ") + winners
            if cap:
                measured += f"; above {ranges[-1]['max_tokens']} tokens not measured"
        lines.append(f"TP{tp}: {what}{measured}")
        for name, why_out in sorted(excluded.items()):
            lines.append(f"  TP{tp}: {_method(name)} left out: {why_out}")
    return {"source": source, "applies": applies, "override": override, "tp": per_tp,
            "head": head, "lines": lines}
