"""Text and HTML of the ``status`` / ``explain`` reports. ``fairshare.report`` builds them as
plain dicts and re-exports every ``render_*`` function; this module only renders a dict,
so ``-o table``, ``-o json|yaml`` and the ``/status`` page cannot disagree.
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from fairshare.resources import GPU

__all__ = ["render_explain_text", "render_status_html", "render_status_text", "to_json"]


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*headers).rstrip()]
    lines += [fmt.format(*row).rstrip() for row in rows]
    return lines


def _counts(row: Mapping[str, Any]) -> bool:
    """A resource row with anything to show (the text table leaves out the rest)."""
    zero = (None, "0")
    return any(row.get(k) not in zero for k in ("used", "quotaUsed", "guaranteed", "limit"))


def _cell(value: object) -> str:
    """A table cell: "-" for none; an exact ``p/q`` amount (a GPU total with no finite
    decimal, e.g. MIG sevenths) as a 3-decimal approximation, ``~4.143``, for people
    (``-o json`` keeps the exact form)."""
    if value is None:
        return "-"
    text = str(value)
    num, slash, den = text.partition("/")
    if slash and num.isdigit() and den.isdigit() and int(den):
        return f"~{int(num) / int(den):.3f}"
    return text


def _weight_text(t: Mapping[str, Any]) -> str:
    """``weight 3``; in a tree, where the weight in the whole tree differs from the
    configured one: ``weight 3 (1.5 in the whole tree)``."""
    configured = t.get("configuredWeight", t["weight"])
    if abs(configured - t["weight"]) <= 1e-9 * max(1.0, abs(configured)):
        return f"weight {configured:g}"
    return f"weight {configured:g} ({t['weight']:.4g} in the whole tree)"


def render_status_text(report: Mapping[str, Any]) -> str:
    """The status report as terminal text: one table per tenant, then the cluster."""
    lines: list[str] = [f"WARNING: {w}" for w in report.get("warnings", ())]
    for t in report["tenants"]:
        pods = t["pods"]
        parent = f"  in {t['parent']}" if t.get("parent") else ""
        lines.append(
            f"{t.get('level', 'tenant').upper()} {t['name']}{parent}  {_weight_text(t)}  "
            f"dominant share {t['dominantShare']:.4f}  fair share {t['fairShare']:.4f}  "
            f"pods: {pods['running']} running, {pods['pending']} pending, "
            f"{pods['held']} held by the gate"
        )
        if t.get("namespaces") is not None:
            lines.append(f"  namespaces: {', '.join(t['namespaces']) or '-'}")
        quota = any("quotaUsed" in r for r in t["resources"])
        headers = ["RESOURCE", "USED", *(["QUOTA-USED"] if quota else []), "GUARANTEED", "LIMIT"]
        rows = [
            [
                r["resource"],
                _cell(r["used"]),
                *([_cell(r.get("quotaUsed"))] if quota else []),
                _cell(r["guaranteed"]),
                _cell(r["limit"]),
            ]
            for r in t["resources"]
            if r["resource"] == GPU or _counts(r)
        ]
        lines += ["  " + line for line in _table(headers, rows)]
        lines.append("")
    c = report["cluster"]
    lines.append(
        f"CLUSTER  {c['nodes']} node(s)  GPUs {c['gpusAllocated']:g}/{c['gpus']:g} allocated "
        f"({100 * c['gpuAllocationRatio']:.1f}%)  fragmentation {c['gpuFragmentation']:g} GPU "
        f"({100 * c['gpuFragmentationRatio']:.1f}%)"
    )
    lines += _health_lines(report.get("health"))
    if report["heldPods"]:
        lines.append("")
        lines.append("HELD BY THE GATE")
        lines += [f"  {p['pod']}: {p['reason']}" for p in report["heldPods"]]
    if report["pendingPods"]:
        lines.append("")
        lines.append("PENDING")
        lines += [f"  {p['pod']}: {p['reason']}" for p in report["pendingPods"]]
    if report.get("gangs"):
        lines.append("")
        lines.append("GANGS")
        lines += _table(
            ["GROUP", "TENANT", "MEMBERS", "BOUND", "STATE", "HELD-GPU", "WHY IT WAITS"],
            [_gang_cells(g) for g in report["gangs"]],
        )
    if report.get("usageHistory"):
        lines.append("")
        lines.append("USAGE HISTORY (weights above are lowered by WEIGHT-FACTOR)")
        rows = [
            [h["tenant"], f"{h['usageShare']:.4f}", f"{h['weightedShare']:.4f}",
             f"{h['weightFactor']:.2f}"]
            for h in report["usageHistory"]
        ]  # fmt: skip
        lines += _table(["TENANT", "USAGE-SHARE", "WEIGHTED-SHARE", "WEIGHT-FACTOR"], rows)
    return "\n".join(lines) + "\n"


def _health_troubled(h: Mapping[str, Any] | None) -> bool:
    return bool(h) and bool(
        h["nodes"] or any(not c["covered"] for c in h["guarantees"])  # type: ignore[index]
    )


def _health_lines(h: Mapping[str, Any] | None) -> list[str]:
    """The HEALTH section of ``fairshare status``: only when some GPU failed, some node
    warns, or the guarantees are not covered."""
    if h is None or not _health_troubled(h):
        return []
    lines = [
        "",
        f"HEALTH  {h['gpusInService']:g} GPU(s) in service, {h['gpusFailed']:g} failed, "
        f"{h['unhealthyDevices']} unhealthy device(s) on healthy nodes",
    ]
    rows = [
        [
            n["name"],
            "failed" if n["failed"] else ("devices" if n["gpus"] else "warning"),
            f"{n['gpus']:g}",
            ", ".join(f"{t} {g:g}" for t, g in n["tenants"].items()) or "-",
            n["reason"] or n["warning"] or "-",
        ]
        for n in h["nodes"]
    ]
    if rows:
        lines += ["  " + x for x in _table(["NODE", "STATE", "GPUS-OUT", "TENANTS", "WHY"], rows)]
    for c in h["guarantees"]:
        if not c["covered"]:
            lines.append(
                f"  guarantees of {c['resource']} not covered: {c['guaranteed']:g} guaranteed, "
                f"{c['inService']:g} in service ({100 * c['coverage']:.0f}%); every tenant's "
                "guaranteed start is scaled down by the same factor"
            )
    return lines


def _health_html(h: Mapping[str, Any] | None) -> list[str]:
    if h is None or not _health_troubled(h):
        return []
    parts = [
        "<h2>GPU health</h2>",
        f"<p id=health>{h['gpusInService']:g} GPU(s) in service &middot; "
        f"<b class=bad id=gpus-failed>{h['gpusFailed']:g}</b> failed &middot; "
        f"{h['unhealthyDevices']} unhealthy device(s) on healthy nodes</p>",
    ]
    for c in h["guarantees"]:
        if not c["covered"]:
            parts.append(
                f"<p class=bad id=guarantees-uncovered>guarantees of {_e(c['resource'])} not "
                f"covered: {c['guaranteed']:g} guaranteed, {c['inService']:g} in service "
                f"({100 * c['coverage']:.0f}%)</p>"
            )
    if h["nodes"]:
        parts.append(
            "<table id=failed-nodes><tr><th>node</th><th>state</th><th>GPUs out</th>"
            "<th>tenants holding GPUs there</th><th>why</th></tr>"
        )
        for n in h["nodes"]:
            state = "failed" if n["failed"] else ("devices" if n["gpus"] else "warning")
            who = ", ".join(f"{_e(t)} {g:g}" for t, g in n["tenants"].items()) or "-"
            parts.append(
                f"<tr><td>{_e(n['name'])}</td><td>{state}</td><td class=num>{n['gpus']:g}</td>"
                f"<td>{who}</td><td>{_e(n['reason'] or n['warning'] or '-')}</td></tr>"
            )
        parts.append("</table>")
    return parts


def _gang_cells(g: Mapping[str, Any]) -> list[str]:
    n = "?" if g["minCount"] is None else str(g["minCount"])
    return [
        g["group"],
        g["tenant"] or "-",
        f"{g['members']}/{n}",
        str(g["bound"]),
        g["state"],
        f"{g['heldGpus']:g}",
        g["reason"] or "-",
    ]


def render_explain_text(report: Mapping[str, Any]) -> str:
    """The explain report as terminal text."""
    lines = [f"WARNING: {w}" for w in report.get("warnings", ())]
    lines.append(f"POD {report['pod']}")
    lines.append(f"tenant: {report['tenant'] or '(none)'} (from {report['tenantSource']})")
    wh = report["webhook"]
    lines.append("")
    lines.append("WEBHOOK (admission now): " + ("allowed" if wh["allowed"] else "denied"))
    if wh["message"]:
        lines.append(f"  {wh['message']}")
    lines += [f"  warning: {w}" for w in wh["warnings"]]
    if wh.get("quota"):
        levels = any("level" in q for q in wh["quota"])
        rows = [
            [
                *([f"{q['level']} {q['tenant']}"] if levels else []),
                q["resource"],
                _cell(q["used"]),
                _cell(q["requested"]),
                _cell(q["limit"]),
                _cell(q["headroom"]),
                "yes" if q["fits"] else "NO",
            ]
            for q in wh["quota"]
        ]
        headers = ["RESOURCE", "USED", "REQUESTED", "LIMIT", "HEADROOM", "FITS"]
        if levels:
            headers.insert(0, "LEVEL")
        lines += ["  " + line for line in _table(headers, rows)]
    hw = report.get("hardware")
    if hw is not None:
        lines += ["", "HARDWARE: " + _hardware_text(hw)]
    if "error" in report:
        lines += ["", f"EXTENDER: {report['error']}"]
        return "\n".join(lines) + "\n"
    ext = report["extender"]
    lines.append("")
    if "boundTo" in ext:
        lines.append(f"EXTENDER: already bound to {ext['boundTo']}")
        return "\n".join(lines) + "\n"
    lines.append(f"EXTENDER (scheduling now): {ext['verdict']}")
    g = ext.get("gang")
    if g is not None:
        n = "?" if g["minCount"] is None else g["minCount"]
        lines.append(
            f"  gang: {g['group']}, {g['members']} of {n} members, {g['bound']} bound, "
            f"{g['state']}" + (f", yields to {g['waitingFor']}" if g.get("waitingFor") else "")
        )
        if g.get("misfit"):
            m = g["misfit"]
            lines.append(f"  {m['member']} fits no node beside the members placed before it:")
            lines += [f"    {node}: {why}" for node, why in m["nodes"].items()]
    gate = ext.get("gate")
    if gate is not None:
        after = "-" if gate["shareAfter"] is None else f"{gate['shareAfter']:.4f}"
        lines.append(
            f"  gate: current share {gate['currentShare']:.4f}, after this pod {after}, "
            f"fair share {gate['fairShare']:.4f}"
            + (f", waiting for {gate['waitingFor']}" if gate["waitingFor"] else "")
            + (
                f" (its blocked pod {gate['blockedPod']}: fits no node now, would fit a "
                "drained one; holdForBlockedTenants)"
                if gate.get("blockedPod")
                else ""
            )
        )
    for g in ext.get("noTakeBack", ()):
        lines.append(
            f"  no take-back: tenant {g['tenant']} is above its fair share, but reclaim takes "
            f"nothing from it for this tenant until {g['until']}: its pods "
            f"{', '.join(g['pods'])} got their room from this tenant (reclaimTakeBackAfter)"
        )
    rows = [[n["node"], "fits" if n["fits"] else "no", n["reason"]] for n in ext["nodes"]]
    lines += ["  " + line for line in _table(["NODE", "FIT", "REASON"], rows)]
    return "\n".join(lines) + "\n"


def _hardware_text(hw: Mapping[str, Any]) -> str:
    """One line on the run a hardware fault took (``report.explain_pod``'s ``hardware``)."""
    what = f"pod group {hw['key']}" if hw.get("gang") else f"pod {hw['key']}"
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(hw["lostAt"])))
    role = hw.get("role")
    if role == "evicted":
        head = f"evicted at {when} so that {what} restarts whole"
    elif role == "lost":
        head = f"lost to a hardware fault at {when}"
    else:
        queued = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(hw["queuedAt"])))
        head = (
            f"replaces the run of {what} lost at {when}; it keeps that run's place in its "
            f"tenant's queue (queued {queued})"
        )
    return f"{head}: {hw['reason']}"


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1d2430;background:#f7f8fa}
h1{font-size:1.4em;margin:0 0 .2em}h2{font-size:1.1em;margin:1.4em 0 .4em}
.muted{color:#667}table{border-collapse:collapse;background:#fff;margin:.3em 0 1em}
th,td{border:1px solid #d5d9e0;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#eef1f5}td.num{text-align:right;font-variant-numeric:tabular-nums}
.tenant{background:#fff;border:1px solid #d5d9e0;border-radius:6px;padding:.6em 1em;
margin:.6em 0;display:inline-block;vertical-align:top;margin-right:1em}
.bar{display:inline-block;height:.7em;background:#4a7bd0;border-radius:2px}
.fair{display:inline-block;height:.7em;background:#c5d3ea;border-radius:2px}
.dev{display:inline-block;width:7.5em;border:1px solid #b8c0cc;border-radius:4px;
margin:2px;padding:2px 4px;font-size:12px;background:#fff}
.dev.full{background:#fde9d9}.dev.part{background:#fff6d6}.bad{color:#b00020}.warn{color:#a05a00}
.held{color:#8a4b00}
"""


def _e(value: object) -> str:
    return html.escape(_cell(value))


def render_status_html(report: Mapping[str, Any], *, refresh: int = 10) -> str:
    """The status report as one self-contained HTML page (inline CSS, no scripts or
    external assets) that reloads itself every ``refresh`` seconds."""
    c = report["cluster"]
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        f'<meta http-equiv="refresh" content="{int(refresh)}">',
        "<title>fairshare status</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>fairshare status</h1>",
        f"<p class=muted id=cluster>{c['nodes']} node(s) &middot; GPUs "
        f"<b id=gpus-allocated>{c['gpusAllocated']:g}</b> / <b id=gpus>{c['gpus']:g}</b> "
        f"allocated ({100 * c['gpuAllocationRatio']:.1f}%) &middot; fragmentation "
        f"{c['gpuFragmentation']:g} GPU ({100 * c['gpuFragmentationRatio']:.1f}%) &middot; "
        f"refreshes every {int(refresh)} s</p>",
        "<h2>Tenants</h2>",
    ]
    for t in report["tenants"]:
        pods = t["pods"]
        ds, fs = t["dominantShare"], t["fairShare"]
        level = f"{t['level']}, " if t.get("level") else ""
        parent = f"in {t['parent']}, " if t.get("parent") else ""
        parts.append(f'<div class=tenant id="tenant-{_e(t["name"])}">')
        parts.append(
            f"<b>{_e(t['name'])}</b> <span class=muted>{_e(level)}{_e(parent)}"
            f"{_e(_weight_text(t))}</span><br>"
            f"dominant share <b class=share>{ds:.4f}</b> "
            f'<span class=bar style="width:{min(ds, 1) * 120:.0f}px"></span><br>'
            f"fair share <b class=fair-share>{fs:.4f}</b> "
            f'<span class=fair style="width:{min(fs, 1) * 120:.0f}px"></span><br>'
            f"pods: <b class=running>{pods['running']}</b> running, "
            f"<b class=pending>{pods['pending']}</b> pending, "
            f"<b class=held-count>{pods['held']}</b> held by the gate"
        )
        quota = any("quotaUsed" in r for r in t["resources"])
        head = "".join(
            f"<th>{h}</th>"
            for h in ["resource", "used", *(["quota used"] if quota else []), "guaranteed", "limit"]
        )
        parts.append(f"<table><tr>{head}</tr>")
        for r in t["resources"]:
            if r["resource"] != GPU and not _counts(r):
                continue
            cells = [r["used"], *([r.get("quotaUsed")] if quota else []), r["guaranteed"]]
            cells.append(r["limit"])
            tds = "".join(f"<td class=num>{_e(v)}</td>" for v in cells)
            parts.append(f"<tr><td>{_e(r['resource'])}</td>{tds}</tr>")
        parts.append("</table></div>")
    parts += _health_html(report.get("health"))
    parts.append("<h2>GPU devices</h2><table id=nodes><tr><th>node</th><th>model</th>")
    parts.append("<th>health</th><th>devices (free GPU; tenants holding shares)</th></tr>")
    for n in report["nodes"]:
        devs = []
        for d in n["devices"]:
            used = 1 - d["free"]
            cls = "full" if d["free"] <= 0 else ("part" if used > 0 else "")
            who = ", ".join(f"{_e(t)} {g:g}" for t, g in d["holders"].items()) or "unused"
            devs.append(
                f'<span class="dev {cls}">gpu{d["index"]}: {d["free"]:g} free<br>{who}</span>'
            )
        health = "ok" if n["healthy"] else f"<span class=bad>{_e(n['healthReason'])}</span>"
        if n["healthy"] and n.get("healthWarning"):
            health = f"<span class=warn>{_e(n['healthWarning'])}</span>"
        if n.get("unhealthyGpus"):
            health += f" <span class=bad>{n['unhealthyGpus']} unhealthy GPU(s)</span>"
        parts.append(
            f"<tr><td>{_e(n['name'])}</td><td>{_e(n['gpuModel'] or '-')}</td>"
            f"<td>{health}</td><td>{''.join(devs) or '-'}</td></tr>"
        )
    parts.append("</table>")
    parts.append("<h2>Pods the gate holds</h2>")
    if report["heldPods"]:
        parts.append("<table id=held><tr><th>pod</th><th>tenant</th><th>reason</th></tr>")
        for p in report["heldPods"]:
            parts.append(
                f"<tr><td>{_e(p['pod'])}</td><td>{_e(p['tenant'])}</td>"
                f"<td class=held>{_e(p['reason'])}</td></tr>"
            )
        parts.append("</table>")
    else:
        parts.append("<p class=muted id=held>none</p>")
    if report.get("gangs"):
        parts.append("<h2>Pod groups</h2>")
        heads = ["group", "tenant", "members", "bound", "state", "held GPU", "why it waits"]
        parts.append("<table id=gangs><tr>" + "".join(f"<th>{h}</th>" for h in heads) + "</tr>")
        for g in report["gangs"]:
            parts.append("<tr>" + "".join(f"<td>{_e(v)}</td>" for v in _gang_cells(g)) + "</tr>")
        parts.append("</table>")
    if report["pendingPods"]:
        parts.append("<h2>Other pending pods</h2>")
        parts.append("<table id=pending><tr><th>pod</th><th>tenant</th><th>reason</th></tr>")
        for p in report["pendingPods"]:
            parts.append(
                f"<tr><td>{_e(p['pod'])}</td><td>{_e(p['tenant'])}</td>"
                f"<td>{_e(p['reason'])}</td></tr>"
            )
        parts.append("</table>")
    parts.append("</body></html>\n")
    return "".join(parts)


def to_json(report: Mapping[str, Any]) -> str:
    """The report as indented JSON text."""
    return json.dumps(report, indent=2) + "\n"
