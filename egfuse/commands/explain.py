"""``egfuse explain REPORT REGION``: one region's proof, read back from a saved report — what spelling it had,
what it became, the rewrites that put the fused form into its class (its certificate) and what onnxruntime
measured."""

from __future__ import annotations

import json
from pathlib import Path

from egfuse.errors import EgfuseError
from egfuse.report import Status


def load_report(path: Path) -> dict:
    try:
        report = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise EgfuseError("no such file", path=str(path)) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise EgfuseError(f"not a report written by `egfuse optimize --report` ({err})", path=str(path)) from None
    if not isinstance(report, dict) or not isinstance(report.get("regions"), list):
        raise EgfuseError("not a report written by `egfuse optimize --report` (no regions)", path=str(path))
    return report


def find_region(report: dict, key: str) -> dict:
    """A region by its index, its softmax node's name or its output's name."""
    regions = report["regions"]
    for region in regions:
        if key in (str(region.get("index")), region.get("softmax"), region.get("output")):
            return region
    known = ", ".join(f"{r.get('index')} ({r.get('softmax')})" for r in regions[:8]) or "none"
    more = f", … {len(regions) - 8} more" if len(regions) > 8 else ""
    raise EgfuseError(f"no region {key!r} in the report; regions: {known}{more}")


def explain(report: dict, key: str) -> str:
    region = find_region(report, key)
    lines = [_headline(report, region)]
    if region.get("variants"):
        lines.append("spelling: " + "; ".join(f"{k}: {v}" for k, v in region["variants"].items()))
    if region.get("reason"):
        lines.append(f"why: {region['reason']}")
    lines.extend(f"note: {n}" for n in region.get("notes", []))
    lines.extend(_numeric(report, region))
    lines.extend(_algebraic(region))
    lines.extend(_costs(region))
    return "\n".join(lines)


def _headline(report: dict, region: dict) -> str:
    what = f"region {region['index']} (softmax node {region['softmax']}, output {region.get('output')})"
    if region["status"] == Status.FUSED:
        return f"{what}: fused → {region['fused_into']} (e-graph form {region['form']}) on target {report['target']}"
    return f"{what}: {region['status']} on target {report['target']}"


def _numeric(report: dict, region: dict) -> list[str]:
    if region["status"] != Status.FUSED:
        return []
    diff = region.get("max_abs_diff")
    if report.get("validated") is None:
        return ["numeric proof: none (validation was not run)"]
    verdict = "passed" if report.get("validated") else "FAILED"
    measured = f", max abs diff {diff:.2e}" if isinstance(diff, int | float) else ""
    return [f"numeric proof: the region's output against the original's on onnxruntime: {verdict}{measured}"]


def _algebraic(region: dict) -> list[str]:
    certificate = region.get("certificate")
    if region["status"] != Status.FUSED:
        return []
    if not certificate:
        return ["algebraic proof: no certificate in this report"]
    steps = certificate["steps"]
    term = certificate["form"]
    for op in reversed(certificate.get("through", [])):  # the layout ops the written program puts around it
        term = f"{op}({term})"
    if certificate.get("reached_at") is None:
        head = (f"algebraic proof: {term} did not join the output's class when the region was "
                f"saturated alone ({len(steps)} iterations): the model-wide e-graph reached it")  # fmt: skip
    else:
        head = (f"algebraic proof: {term} joined the class of the region's output after "
                f"{certificate['reached_at']} iteration(s) of the target's rules (rule: matches; a match is not "
                "always a use, so this lists at least the rewrites that were needed):")  # fmt: skip
    lines = [head]
    for i, step in enumerate(steps, 1):
        listed = ", ".join(f"{name} ×{count}" for name, count in sorted(step.items(), key=lambda kv: (-kv[1], kv[0])))
        lines.append(f"  {i:>2}: {listed or '(nothing new)'}")
    families: dict[str, int] = {}
    for name, count in certificate.get("rules", {}).items():
        family = name.split(".")[0]
        families[family] = families.get(family, 0) + count
    if families:
        ranked = sorted(families.items(), key=lambda kv: -kv[1])
        lines.append("  by family: " + ", ".join(f"{family} {n}" for family, n in ranked))
    return lines


def _costs(region: dict) -> list[str]:
    priced = [c for c in region.get("candidates", []) if c.get("cost_us") is not None]
    if not priced:
        return []
    lines = ["forms in the class, predicted cost on the target (cheapest first):"]
    lines.extend(f"  {c['form']} → {c['op']}: {c['cost_us']:.1f} µs" for c in priced)
    lines.extend(f"  {c['form']}: {c.get('why_not')}" for c in region.get("candidates", []) if c.get("cost_us") is None)
    return lines
