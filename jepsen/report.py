"""Reports of a check: a short text summary for the terminal, a self-contained HTML page for a
person, and a JSON object for machines.

The HTML page draws one lane per process and every operation as a bar over the events it spans
(logical time), an `info` bar running on to the end. The linearization found is drawn as a path
through the bars, each point numbered, with the model's state after it in a table below; for a
history that is not linearizable the path is the longest linearizable prefix and it ends at the
operation no order explains, with the smallest window found outlined. Nemesis events are marked
in their own lane. Everything is inline (CSS, script, data): no network, nothing to install.

Histories are untrusted input (any string may be a value). The page template is filled in one
pass, so a value is never scanned for placeholders again; text goes in HTML-escaped, and the
data goes in as JSON with `<`, `>` and `&` escaped, so no string can end its script element.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping, Sequence

from jepsen.history import EventType, History, Operation, is_client_process
from jepsen.models import Model, show
from jepsen.verdict import CheckResult, Failure, Step, Verdict

HEADLINES = {
    Verdict.LINEARIZABLE: "linearizable",
    Verdict.NOT_LINEARIZABLE: "NOT linearizable",
    Verdict.UNKNOWN: "unknown",
}


def _span(operation: Operation) -> str:
    if operation.ret is None:
        return f"events {operation.call}-"
    return f"events {operation.call}-{operation.ret}"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def describe(history: History, model: Model, operation: Operation) -> str:
    """`op 43 (process 11, events 84-85, file:85-86): read -> 2`."""
    where = ""
    if history.lines is not None:
        where = f", {history.where(operation.call)}"
        if operation.ret is not None:
            where += f"-{history.line_of(operation.ret)}"
    return (f"op {operation.id} (process {operation.process}, {_span(operation)}{where}): "
            f"{model.describe_operation(operation)}")


def _failure_lines(history: History, result: CheckResult, failure: Failure) -> list[str]:
    operations = history.operations
    model = next((part.model for part in result.partitions if part.label == failure.partition),
                 result.model)
    partition = f" in partition {failure.partition}" if failure.partition else ""
    blamed = operations[failure.operation]
    lines = [f"  events 0-{failure.prefix_events - 1}{partition} are linearizable "
             f"({len(failure.linearization)} operations in the order found); but no order "
             f"explains the completion at event {failure.prefix_events} of",
             f"    {describe(history, model, blamed)}"]
    start, end = failure.window_events
    lines.append(f"  smallest window found: events {start}-{end}; these {len(failure.window)} "
                 f"operations cannot all have done what they claim, whatever the others did:")
    lines.extend(f"    {describe(history, model, operations[number])}"
                 for number in failure.window)
    if failure.linearization:
        lines.append(f"  state after the linearizable prefix: "
                     f"{model.describe_state(failure.linearization[-1].state)}")
    if not failure.exact:
        lines.append("  (the explanation search ran out of budget: the window may be larger "
                     "than the smallest there is)")
    return lines


def text_summary(history: History, result: CheckResult, *, format: str | None = None) -> str:
    """A few lines for the terminal: what was checked, the verdict, and where it fails."""
    source = history.source or "history"
    kind = f" ({format})" if format else ""
    settled = sum(part.verdict is not Verdict.UNKNOWN for part in result.partitions)
    initial = result.model.describe_initial()
    lines = [
        f"{source}{kind}: {result.operations} operations ({result.checked} checked), "
        f"model {result.model.name}, initial {initial}",
        f"verdict: {HEADLINES[result.verdict]} ({_count(len(result.partitions), 'partition')}, "
        f"{result.steps} steps, {result.elapsed_s * 1000:.0f} ms)",
    ]
    if not history.operations and history.events:
        lines.append(f"  warning: none of its {len(history.events)} events is a client's: a "
                     "process that is not an integer is taken for the nemesis")
    elif not history.events:  # an empty file, or a run stopped before its first operation
        lines.append("  warning: it holds no client operation: nothing was checked")
    if result.verdict is Verdict.UNKNOWN:
        lines.append(f"  {result.reason}; {settled} of {len(result.partitions)} partitions "
                     f"settled; try a longer --timeout")
    if result.failure is not None:
        lines.extend(_failure_lines(history, result, result.failure))
    return "\n".join(lines)


def _steps_json(model: Model, steps: Sequence[Step]) -> list[list[object]]:
    return [[step.operation, model.describe_state(step.state)] for step in steps]


def result_json(history: History, result: CheckResult, *, format: str | None = None
                ) -> dict[str, object]:
    """The result as one JSON object: verdict, operations, elapsed_ms, and the evidence."""
    document: dict[str, object] = {
        "verdict": result.verdict.value,
        "operations": result.operations,
        "checked": result.checked,
        "elapsed_ms": round(result.elapsed_s * 1000, 3),
        "steps": result.steps,
        "model": result.model.name,
        "format": format,
        "source": history.source,
        "partitions": len(result.partitions),
    }
    if result.verdict is Verdict.UNKNOWN:
        document["reason"] = result.reason
    failure = result.failure
    if failure is not None:
        model = next((part.model for part in result.partitions
                      if part.label == failure.partition), result.model)
        document["failure"] = {
            "partition": failure.partition,
            "operation": _operation_json(history, model, history.operations[failure.operation]),
            "prefix_events": failure.prefix_events,
            "linearization": _steps_json(model, failure.linearization),
            "window": [_operation_json(history, model, history.operations[number])
                       for number in failure.window],
            "window_events": list(failure.window_events),
            "exact": failure.exact,
        }
    return document


def _operation_json(history: History, model: Model, operation: Operation) -> dict[str, object]:
    return {"id": operation.id, "process": operation.process, "f": operation.f,
            "key": operation.key, "input": operation.input, "output": operation.output,
            "status": operation.status.value, "call": operation.call, "ret": operation.ret,
            "line": history.line_of(operation.call),
            "description": model.describe_operation(operation)}


def _partition_of(result: CheckResult) -> dict[int, int]:
    return {number: index for index, part in enumerate(result.partitions)
            for number in part.operations}


def _page_data(history: History, result: CheckResult, title: str) -> dict[str, object]:
    partition_of = _partition_of(result)
    failure = result.failure
    parts = []
    for index, part in enumerate(result.partitions):
        steps = part.linearization
        if failure is not None and failure.partition == part.label:
            steps = failure.linearization
        parts.append({"label": part.label or "all", "verdict": part.verdict.value,
                      "steps": _steps_json(part.model, steps), "index": index,
                      "initial": part.model.describe_initial()})
    operations = [{"id": op.id, "process": op.process, "call": op.call,
                   "ret": op.ret if op.status is EventType.OK or op.status is EventType.FAIL
                   else None, "seen": op.ret, "status": op.status.value,
                   "text": result.model.describe_operation(op),
                   "partition": partition_of.get(op.id, -1),
                   "line": history.line_of(op.call)} for op in history.operations]
    others = [{"index": event.index, "process": str(event.process),
               "text": f"{event.f} {show(event.value)}"}
              for event in history.events if not is_client_process(event.process)]
    return {
        "title": title, "verdict": result.verdict.value, "events": len(history.events),
        "operations": operations, "others": others, "partitions": parts,
        "failure": None if failure is None else {
            "partition": next(index for index, part in enumerate(result.partitions)
                              if part.label == failure.partition),
            "operation": failure.operation, "window": list(failure.window),
            "prefix_events": failure.prefix_events, "exact": failure.exact},
    }


def html_report(history: History, result: CheckResult, *, format: str | None = None) -> str:
    """One self-contained HTML page: timeline, linearization, states, summary."""
    title = history.source or "history"
    return fill_page(_PAGE, {
        "TITLE": html.escape(title),
        "VERDICT": html.escape(result.verdict.value),
        "SUMMARY": html.escape(text_summary(history, result, format=format)),
        "DATA": script_json(_page_data(history, result, title)),
    })


_PLACEHOLDER = re.compile(r"\$(TITLE|VERDICT|SUMMARY|DATA)")


def fill_page(template: str, values: Mapping[str, str]) -> str:
    """Every `$NAME` placeholder replaced by its value in one pass over the template: what a
    value brings in (a `$DATA` in a history's summary, say) is never replaced in turn."""
    return _PLACEHOLDER.sub(lambda match: values[match.group(1)], template)


def script_json(document: object) -> str:
    """JSON to embed in a `<script>` element: ASCII, with `<`, `>` and `&` written as `\\u`
    escapes (the same string to a JSON parser), so nothing in it closes the element, opens a
    comment or reads as markup."""
    text = json.dumps(document, ensure_ascii=True)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>$TITLE</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 16px 24px; color: #1d2330; }
h1 { font-size: 18px; margin: 0 0 8px; }
.verdict { display: inline-block; padding: 2px 10px; border-radius: 4px; color: #fff; }
.verdict.linearizable { background: #2f7d4f; }
.verdict.not-linearizable { background: #b3261e; }
.verdict.unknown { background: #8a6d00; }
pre.summary { background: #f4f5f7; padding: 8px 12px; border-radius: 4px; overflow-x: auto;
  font-size: 12px; }
#controls { margin: 10px 0; }
#timeline { overflow: auto; border: 1px solid #d7dae0; border-radius: 4px; max-height: 70vh; }
svg text { font: 11px ui-monospace, monospace; fill: #1d2330; }
.lane-label { font-weight: 600; }
.lane { fill: #fafbfc; } .lane.odd { fill: #f1f3f6; }
.op { stroke: #6b7280; stroke-width: 1; fill: #c9d4e4; cursor: pointer; }
.op.linearized { fill: #9fd3b0; stroke: #2f7d4f; }
.op.fail { fill: #eeeeee; stroke: #b0b0b0; stroke-dasharray: 3 2; }
.op.info { fill: #f3e3b3; stroke: #a88a2a; }
.op.window { stroke: #d97706; stroke-width: 3; }
.op.blamed { fill: #f2a6a0; stroke: #b3261e; stroke-width: 3; }
.op.dim { opacity: 0.25; }
.op.hover { stroke: #1d4ed8; stroke-width: 3; }
.path { fill: none; stroke: #1d4ed8; stroke-width: 1.5; opacity: 0.7; }
.point { fill: #1d4ed8; }
.point-label { font-size: 9px; fill: #1d4ed8; }
.nemesis { stroke: #9333ea; stroke-width: 1; stroke-dasharray: 2 3; opacity: 0.6; }
.nemesis-mark { fill: #9333ea; }
.cut { stroke: #b3261e; stroke-width: 2; }
#tip { position: fixed; pointer-events: none; background: #1d2330; color: #fff; padding: 6px 8px;
  border-radius: 4px; font: 12px ui-monospace, monospace; white-space: pre; display: none;
  z-index: 10; max-width: 600px; }
table { border-collapse: collapse; margin-top: 12px; font: 12px ui-monospace, monospace; }
th, td { border-bottom: 1px solid #e3e5e9; padding: 2px 10px; text-align: left; }
tr.hover td { background: #dbe7ff; } tr.blamed td { background: #fbe0de; }
.legend span { display: inline-block; margin-right: 14px; }
.legend i { display: inline-block; width: 18px; height: 10px; margin-right: 4px;
  border: 1px solid #6b7280; vertical-align: middle; }
</style></head><body>
<h1>$TITLE <span class="verdict $VERDICT">$VERDICT</span></h1>
<pre class="summary">$SUMMARY</pre>
<div id="controls"><label>partition <select id="partition"></select></label></div>
<div class="legend">
<span><i style="background:#9fd3b0;border-color:#2f7d4f"></i>in the linearization</span>
<span><i style="background:#c9d4e4"></i>not (yet) linearized</span>
<span><i style="background:#f3e3b3;border-color:#a88a2a"></i>info: outcome unknown</span>
<span><i style="background:#eee;border-style:dashed"></i>failed: no effect</span>
<span><i style="background:#f2a6a0;border-color:#b3261e"></i>no order explains it</span>
<span><i style="background:#fff;border:3px solid #d97706"></i>in the smallest window</span>
</div>
<div id="timeline"></div>
<div id="tip"></div>
<h2 style="font-size:15px">Linearization and the model's state</h2>
<table><thead><tr><th>#</th><th>op</th><th>process</th><th>events</th><th>operation</th>
<th>state after</th></tr></thead><tbody id="steps"></tbody></table>
<script type="application/json" id="data">$DATA</script>
<script>
"use strict";
const data = JSON.parse(document.getElementById("data").textContent);
const NS = "http://www.w3.org/2000/svg";
const LANE = 26, TOP = 24, LEFT = 110;
const scale = Math.max(3, Math.min(40, 1400 / Math.max(1, data.events)));
const x = (t) => LEFT + 10 + t * scale;
const end = data.events + 2;
const lanes = [...new Set(data.operations.map((op) => op.process))].sort((a, b) => a - b)
  .map(String);
if (data.others.length) lanes.push(...new Set(data.others.map((e) => e.process)));
const laneOf = new Map(lanes.map((name, i) => [name, i]));
const byId = new Map(data.operations.map((op) => [op.id, op]));
const rects = new Map(), rows = new Map();
function el(name, attrs, parent) {
  const node = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}
function text(parent, value, attrs) { el("text", attrs, parent).textContent = value; }
const tip = document.getElementById("tip");
function showTip(ev, lines) {
  tip.textContent = lines.join("\\n"); tip.style.display = "block";
  tip.style.left = (ev.clientX + 14) + "px"; tip.style.top = (ev.clientY + 14) + "px";
}
function hideTip() { tip.style.display = "none"; }
function points(steps) {
  let t = -1;
  return steps.map(([id]) => {
    const op = byId.get(id);
    const hi = op.ret === null ? end : op.ret;
    t = Math.min(Math.max(t + 0.5, op.call + 0.5), hi - 0.25);
    return t;
  });
}
function draw(selected) {
  const box = document.getElementById("timeline"); box.textContent = "";
  const svg = el("svg", {width: x(end) + 20, height: TOP + lanes.length * LANE + 10}, box);
  lanes.forEach((name, i) => {
    el("rect", {x: 0, y: TOP + i * LANE, width: x(end) + 20, height: LANE,
      class: i % 2 ? "lane odd" : "lane"}, svg);
    text(svg, (laneOf.has(name) && /^-?\\d+$/.test(name) ? "process " : "") + name,
      {x: 6, y: TOP + i * LANE + 17, class: "lane-label"});
  });
  for (let t = 0; t <= data.events; t += Math.max(1, Math.round(50 / scale))) {
    text(svg, String(t), {x: x(t), y: 14});
  }
  for (const ev of data.others) {
    el("line", {x1: x(ev.index), x2: x(ev.index), y1: TOP, y2: TOP + lanes.length * LANE,
      class: "nemesis"}, svg);
    const mark = el("circle", {cx: x(ev.index), cy: TOP + laneOf.get(ev.process) * LANE + 13,
      r: 5, class: "nemesis-mark"}, svg);
    mark.addEventListener("mousemove", (e) => showTip(e, [ev.process + ": " + ev.text,
      "event " + ev.index]));
    mark.addEventListener("mouseleave", hideTip);
  }
  const part = data.partitions[selected] || null;
  const failure = data.failure;
  const order = new Map();  // op id -> [position, state after, partition index]
  for (const p of part ? [part] : data.partitions) {
    p.steps.forEach(([id, state], i) => order.set(id, [i, state, p.index]));
  }
  const windowIds = new Set(failure && (!part || failure.partition === selected) ?
    failure.window : []);
  for (const op of data.operations) drawOp(svg, op, part, order, windowIds, selected);
  if (part) drawPath(svg, part);
  if (failure && (!part || failure.partition === selected)) {
    el("line", {x1: x(failure.prefix_events), x2: x(failure.prefix_events), y1: TOP - 6,
      y2: TOP + lanes.length * LANE, class: "cut"}, svg);
  }
  fillTable(part, order);
}
function drawOp(svg, op, part, order, windowIds, selected) {
  const lane = laneOf.get(String(op.process));
  const right = op.ret === null ? end : op.ret;
  const classes = ["op"];
  if (op.status === "fail") classes.push("fail");
  else if (order.has(op.id)) classes.push("linearized");
  else if (op.status === "info") classes.push("info");
  if (windowIds.has(op.id)) classes.push("window");
  if (data.failure && data.failure.operation === op.id) classes.push("blamed");
  if (part && op.partition !== selected) classes.push("dim");
  else if (data.failure && op.call > data.failure.prefix_events) classes.push("dim");
  const rect = el("rect", {x: x(op.call), y: TOP + lane * LANE + 5,
    width: Math.max(3, x(right) - x(op.call)), height: LANE - 10, rx: 3,
    class: classes.join(" ")}, svg);
  rects.set(op.id, rect);
  const lines = ["op " + op.id + "  " + op.text, "process " + op.process + "  " + op.status +
    "  events " + op.call + "-" + (op.seen === null ? "" : op.seen) +
    (op.line ? "  line " + op.line : "")];
  if (data.partitions.length > 1 && op.partition >= 0) {
    lines.push("partition " + data.partitions[op.partition].label);
  }
  if (order.has(op.id)) {
    const [i, state, p] = order.get(op.id);
    const steps = data.partitions[p].steps;
    const before = i === 0 ? data.partitions[p].initial : steps[i - 1][1];
    lines.push("linearized #" + (i + 1) + ": state " + before + " -> " + state);
  } else if (data.failure && data.failure.operation === op.id) {
    lines.push("no order explains this completion");
  }
  rect.addEventListener("mousemove", (e) => { showTip(e, lines); highlight(op.id, true); });
  rect.addEventListener("mouseleave", () => { hideTip(); highlight(op.id, false); });
}
function drawPath(svg, part) {
  const ts = points(part.steps);
  const coords = part.steps.map(([id], i) => {
    const op = byId.get(id);
    return [x(ts[i]), TOP + laneOf.get(String(op.process)) * LANE + LANE / 2];
  });
  if (coords.length > 1) {
    el("polyline", {points: coords.map((c) => c.join(",")).join(" "), class: "path"}, svg);
  }
  coords.forEach(([cx, cy], i) => {
    el("circle", {cx, cy, r: 2.5, class: "point"}, svg);
    if (scale >= 8) text(svg, String(i + 1), {x: cx + 3, y: cy - 4, class: "point-label"});
  });
}
function fillTable(part, order) {
  const body = document.getElementById("steps"); body.textContent = ""; rows.clear();
  const add = (cells, id, cls) => {
    const tr = document.createElement("tr");
    if (cls) tr.className = cls;
    for (const c of cells) { const td = document.createElement("td"); td.textContent = c;
      tr.appendChild(td); }
    body.appendChild(tr);
    if (id !== null) {
      rows.set(id, tr);
      tr.addEventListener("mouseenter", () => highlight(id, true));
      tr.addEventListener("mouseleave", () => highlight(id, false));
    }
  };
  if (!part) { add(["", "", "", "", "choose a partition to see its linearization", ""], null);
    return; }
  add(["0", "", "", "", "initial state", part.initial], null);
  part.steps.forEach(([id, state], i) => {
    const op = byId.get(id);
    add([String(i + 1), String(id), String(op.process), op.call + "-" +
      (op.seen === null ? "" : op.seen), op.text, state], id);
  });
  const failure = data.failure;
  if (failure && failure.partition === part.index) {
    const op = byId.get(failure.operation);
    add(["!", String(op.id), String(op.process), op.call + "-" + op.seen, op.text,
      "no order of the operations explains this result"], op.id, "blamed");
  }
}
function highlight(id, on) {
  const rect = rects.get(id), row = rows.get(id);
  if (rect) rect.classList.toggle("hover", on);
  if (row) row.classList.toggle("hover", on);
}
const select = document.getElementById("partition");
data.partitions.forEach((part, i) => {
  const option = document.createElement("option");
  option.value = String(i); option.textContent = part.label + " (" + part.verdict + ")";
  select.appendChild(option);
});
if (data.partitions.length > 1) {
  const all = document.createElement("option"); all.value = "-1";
  all.textContent = "all partitions"; select.insertBefore(all, select.firstChild);
} else {
  document.getElementById("controls").style.display = "none";
}
const initial = data.failure ? data.failure.partition : (data.partitions.length > 1 ? -1 : 0);
select.value = String(initial);
select.addEventListener("change", () => draw(Number(select.value)));
draw(initial);
</script></body></html>
"""
