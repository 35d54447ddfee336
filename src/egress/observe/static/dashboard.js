// egress dashboard: polls dashboard.json once a second and redraws. No dependencies, no network
// beyond this server. Text from the server goes into the DOM as text nodes only.
"use strict";

const POLL_MS = 1000;
const SVG = "http://www.w3.org/2000/svg";
const CLASS_COLORS = {"2xx": "#2e9d5b", "3xx": "#3b7dd8", "4xx": "#e39b1c", "5xx": "#d9413a", failed: "#8a5cc7"};
const MAX_PARTITION_ROWS = 64;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value !== null && value !== undefined && value !== false) node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  for (const child of children) node.append(child instanceof Node ? child : String(child));
  return node;
}

function number(value) {
  if (value === null || value === undefined) return "—";
  if (Math.abs(value) >= 1e6) return (value / 1e6).toFixed(1) + "M";
  if (Math.abs(value) >= 1e4) return (value / 1e3).toFixed(1) + "k";
  return Number.isInteger(value) ? String(value) : value.toFixed(1);
}

function rate(value) {
  return value === null || value === undefined ? "—" : number(value < 10 ? Math.round(value * 10) / 10 : Math.round(value)) + "/s";
}

function seconds(value, atLeast) {
  if (value === null || value === undefined) return "—";
  if (value === 0) return "0 s";
  const text = value < 60 ? value.toFixed(value < 10 ? 1 : 0) + " s" : value < 3600 ? (value / 60).toFixed(1) + " min"
    : (value / 3600).toFixed(1) + " h";
  return (atLeast ? "≥ " : "") + text;
}

function percent(value) {
  return value === null || value === undefined ? "—" : Math.round(value * 100) + "%";
}

function show(id, visible) {
  document.getElementById(id).hidden = !visible;
}

function replace(id, ...children) {
  document.getElementById(id).replaceChildren(...children.filter((child) => child !== null && child !== undefined));
}

// -- graph ----------------------------------------------------------------------------------------

// Columns by longest path from the sources; edges that close a loop (a feedback stream) are found
// by a depth-first walk and left out of the layout, then drawn as arcs below.
function layers(graph) {
  const out = {};
  for (const node of graph.nodes) out[node.id] = [];
  graph.edges.forEach((edge, index) => out[edge.from] && out[edge.from].push([edge.to, index]));
  const back = new Set(), state = {};
  const walk = (id) => {
    state[id] = "open";
    for (const [to, index] of out[id] || []) {
      if (state[to] === "open") back.add(index);
      else if (!state[to]) walk(to);
    }
    state[id] = "done";
  };
  graph.nodes.filter((n) => n.kind === "source").forEach((n) => state[n.id] || walk(n.id));
  graph.nodes.forEach((n) => state[n.id] || walk(n.id));
  const depth = {};
  for (const node of graph.nodes) depth[node.id] = node.kind === "source" ? 0 : 1;
  for (let round = 0; round < graph.nodes.length; round++) {
    let changed = false;
    graph.edges.forEach((edge, index) => {
      if (!back.has(index) && depth[edge.from] + 1 > depth[edge.to]) { depth[edge.to] = depth[edge.from] + 1; changed = true; }
    });
    if (!changed) break;
  }
  return {depth, back};
}

function drawGraph(graph, sinks) {
  const width = document.getElementById("graph").clientWidth || 800;
  const vertical = width < 640;
  const {depth, back} = layers(graph);
  const levels = [];
  for (const node of graph.nodes) (levels[depth[node.id]] = levels[depth[node.id]] || []).push(node);
  const packed = levels.filter(Boolean);
  const broken = new Set(sinks.filter((s) => s.broken).map((s) => `sink:${s.computation}/${s.sink_id}`));
  const nodeWidth = 150, nodeHeight = 46, across = vertical ? 24 : 90, along = vertical ? 56 : 22;
  const place = {};
  const widest = Math.max(...packed.map((level) => level.length));
  packed.forEach((level, i) => level.forEach((node, j) => {
    const offset = (widest - level.length) / 2;
    place[node.id] = vertical
      ? {x: (j + offset) * (nodeWidth + across), y: i * (nodeHeight + along)}
      : {x: i * (nodeWidth + across), y: (j + offset) * (nodeHeight + along)};
  }));
  const totalWidth = vertical ? widest * (nodeWidth + across) - across : packed.length * (nodeWidth + across) - across;
  const totalHeight = vertical ? packed.length * (nodeHeight + along) - along : widest * (nodeHeight + along) - along;
  const loops = back.size ? 44 : 0;  // room below (beside, when vertical) for the arcs of feedback streams
  const root = svg("svg", {viewBox: `-4 -4 ${totalWidth + 8 + (vertical ? loops : 0)} ${totalHeight + 8 + (vertical ? 0 : loops)}`,
    role: "img", "aria-label": "pipeline graph", width: Math.min(totalWidth + 8 + (vertical ? loops : 0), width), class: "graph"});
  graph.edges.forEach((edge, index) => {
    const a = place[edge.from], b = place[edge.to];
    if (!a || !b) return;
    const group = svg("g", {class: "edge", "data-edge": `${edge.from}->${edge.to}`});
    if (back.has(index)) {
      const [x1, y1, x2, y2] = vertical
        ? [a.x + nodeWidth, a.y + nodeHeight * 0.65, b.x + nodeWidth, b.y + nodeHeight * 0.35]
        : [a.x + nodeWidth * 0.65, a.y + nodeHeight, b.x + nodeWidth * 0.35, b.y + nodeHeight];
      const reach = (vertical ? totalWidth : totalHeight) + 36;  // below (beside) every node
      group.append(svg("path", {d: vertical ? `M${x1},${y1} C${reach},${y1} ${reach},${y2} ${x2},${y2}`
        : `M${x1},${y1} C${x1},${reach} ${x2},${reach} ${x2},${y2}`, class: "feedback"}));
      group.append(svg("text", {x: vertical ? reach - 8 : (x1 + x2) / 2, y: vertical ? (y1 + y2) / 2 + 4 : reach - 4,
        "text-anchor": "middle", class: "edge-rate"}, rate(edge.rate)));
      root.append(group);
      return;
    }
    const [x1, y1, x2, y2] = vertical
      ? [a.x + nodeWidth / 2, a.y + nodeHeight, b.x + nodeWidth / 2, b.y]
      : [a.x + nodeWidth, a.y + nodeHeight / 2, b.x, b.y + nodeHeight / 2];
    const path = vertical
      ? `M${x1},${y1} C${x1},${(y1 + y2) / 2} ${x2},${(y1 + y2) / 2} ${x2},${y2}`
      : `M${x1},${y1} C${(x1 + x2) / 2},${y1} ${(x1 + x2) / 2},${y2} ${x2},${y2}`;
    group.append(svg("path", {d: path}));
    group.append(svg("text", {x: (x1 + x2) / 2, y: (y1 + y2) / 2 + 4, "text-anchor": "middle", class: "edge-rate"},
      rate(edge.rate)));
    root.append(group);
  });
  for (const node of graph.nodes) {
    const at = place[node.id];
    const state = broken.has(node.id) ? "broken" : "ok";
    const group = svg("g", {class: `node ${node.kind}`, "data-node": node.id, "data-state": state,
      transform: `translate(${at.x},${at.y})`});
    group.append(svg("rect", {width: nodeWidth, height: nodeHeight, rx: 8}));
    group.append(svg("text", {x: nodeWidth / 2, y: 19, "text-anchor": "middle", class: "node-label"},
      node.label.length > 20 ? node.label.slice(0, 19) + "…" : node.label));
    group.append(svg("text", {x: nodeWidth / 2, y: 36, "text-anchor": "middle", class: "node-kind"},
      node.kind === "computation" ? "computation" : `${node.kind} · ${node.class}`));
    group.append(svg("title", {}, `${node.kind} ${node.label} (${node.class})`));
    root.append(group);
  }
  return root;
}

// -- sources --------------------------------------------------------------------------------------

// A source's unread records are in no partition yet (their keys decide the partition when read).
function sourcesTable(doc) {
  const cluster = doc.worker !== null && doc.worker !== undefined;
  const head = ["Source", ...(cluster ? ["Owner"] : []), "Unread", "State"];
  const body = (doc.sources || []).map((s) => {
    const state = s.finished ? "read to its end" : "reading";
    const cells = [
      ["Source", s.source_id, "name"],
      ...(cluster ? [["Owner", s.owner || "—", "owner"]] : []),
      ["Unread", s.unread_records === null || s.unread_records === undefined ? "unknown" : number(s.unread_records),
        "unread-records"],
      ["State", state, "state"],
    ];
    return el("tr", {"data-source": s.source_id},
      cells.map(([label, text, name]) => el("td", {"data-label": label, class: name}, text)));
  });
  return el("table", {class: "partitions sources"},
    el("thead", {}, el("tr", {}, head.map((h) => el("th", {}, h)))), el("tbody", {}, body));
}

// -- webhook endpoints ----------------------------------------------------------------------------

function endpointsTable(doc) {
  const head = ["Sink", "Endpoint", "State", "Backlog", "Delivered", "Partitions"];
  const body = (doc.endpoints || []).map((e) => {
    const cells = [
      ["Sink", `${e.computation}/${e.sink_id}`, "sink"], ["Endpoint", e.endpoint, "name"],
      ["State", e.state.replace("_", "-"), "state"], ["Backlog", number(e.backlog), "backlog"],
      ["Delivered", number(e.delivered), "delivered"], ["Partitions", String(e.partitions), "partitions"],
    ];
    return el("tr", {"data-endpoint": e.endpoint, "data-state": e.state},
      cells.map(([label, text, name]) => el("td", {"data-label": label, class: name}, text)));
  });
  return el("table", {class: "partitions endpoints"},
    el("thead", {}, el("tr", {}, head.map((h) => el("th", {}, h)))), el("tbody", {}, body));
}

// -- partitions -----------------------------------------------------------------------------------

function partitionsTable(doc) {
  const cluster = doc.worker !== null && doc.worker !== undefined;
  const rows = [...doc.partitions].sort((a, b) => (b.input_lag || 0) - (a.input_lag || 0)
    || a.computation.localeCompare(b.computation) || a.partition - b.partition);
  const head = ["Partition", ...(cluster ? ["Owner"] : []), "Lag", "Lag age", "In", "Out", "Unacked", "State"];
  const body = rows.slice(0, MAX_PARTITION_ROWS).map((p) => {
    const state = p.blocked ? "blocked" : p.input_lag ? "lagging" : "ok";
    const cells = [
      ["Partition", `${p.computation}/${p.partition}`, "name"],
      ...(cluster ? [["Owner", p.owner || "—", "owner"]] : []),
      ["Lag", number(p.input_lag), "lag-messages"],
      ["Lag age", seconds(p.input_lag_seconds, p.input_lag_seconds_at_least), "lag-seconds"],
      ["In", rate(p.rate_in), "rate-in"],
      ["Out", rate(p.rate_out), "rate-out"],
      ["Unacked", number(p.unacknowledged), "unacknowledged"],
      ["State", p.blocked ? `blocked: ${p.blocked}` : state, "state"],
    ];
    return el("tr", {"data-partition": `${p.computation}/${p.partition}`, "data-state": state},
      cells.map(([label, text, name]) => el("td", {"data-label": label, class: name}, text)));
  });
  const table = el("table", {class: "partitions"}, el("thead", {}, el("tr", {}, head.map((h) => el("th", {}, h)))),
    el("tbody", {}, body));
  const more = rows.length > MAX_PARTITION_ROWS
    ? el("p", {class: "muted"}, `${rows.length - MAX_PARTITION_ROWS} more partitions (the most lagging are shown)`) : null;
  return [table, more];
}

// -- sinks ----------------------------------------------------------------------------------------

function chart(series, bucketSeconds) {
  const names = Object.keys(series).filter((name) => series[name].some((v) => v > 0));
  const count = (series["2xx"] || []).length;
  const totals = Array.from({length: count}, (_, i) => names.reduce((sum, name) => sum + series[name][i], 0));
  const peak = Math.max(1, ...totals);
  const width = 300, height = 70, bar = width / count;
  const root = svg("svg", {viewBox: `0 0 ${width} ${height + 14}`, class: "chart", role: "img",
    "aria-label": "responses by status class"});
  root.append(svg("line", {x1: 0, y1: height + 0.5, x2: width, y2: height + 0.5, class: "axis"}));
  for (let i = 0; i < count; i++) {
    let top = height;
    for (const name of names) {
      const value = series[name][i];
      if (!value) continue;
      const h = Math.max(1, (value / peak) * (height - 10));
      top -= h;
      const rect = svg("rect", {x: i * bar + 0.5, y: top, width: Math.max(1, bar - 1), height: h, fill: CLASS_COLORS[name]});
      rect.append(svg("title", {}, `${name}: ${number(value)}`));
      root.append(rect);
    }
  }
  const minutes = Math.round((count * bucketSeconds) / 60);
  root.append(svg("text", {x: 0, y: height + 12, class: "tick"}, `−${minutes} min`));
  root.append(svg("text", {x: width, y: height + 12, class: "tick", "text-anchor": "end"}, "now"));
  if (names.length) root.append(svg("text", {x: 0, y: 8, class: "tick"}, `${number(peak)} per ${bucketSeconds} s`));
  const legend = el("div", {class: "legend"}, names.map((name) =>
    el("span", {}, el("i", {style: `background:${CLASS_COLORS[name]}`}), name === "failed" ? "attempt failed" : name)));
  return el("div", {class: "chart-box"}, root, names.length ? legend : el("div", {class: "legend muted"}, "no responses yet"));
}

function stat(label, value, name) {
  return el("div", {class: `stat ${name || ""}`}, el("span", {class: "stat-value"}, value), el("span", {class: "stat-label"}, label));
}

function sinkCard(sink, bucketSeconds) {
  const responses = Object.entries(sink.responses).map(([cls, n]) => `${cls} ${number(n)}`).join(" · ") || "none";
  return el("article", {class: "card sink", "data-sink": `${sink.computation}/${sink.sink_id}`,
    "data-state": sink.broken ? "broken" : "ok"},
  el("div", {class: "card-head"},
    el("h3", {}, el("span", {class: "muted"}, `${sink.computation} / `), sink.sink_id),
    el("span", {class: "muted"}, sink.sink_class),
    el("span", {class: `badge ${sink.broken ? "bad" : "good"}`}, sink.broken ? "BROKEN" : "OK")),
  sink.broken ? el("pre", {class: "sink-error"}, sink.error) : null,
  el("div", {class: "stats"},
    stat("delivered", rate(sink.rate), "delivered-rate"),
    stat("delivered total", number(sink.delivered), "delivered"),
    stat("attempt failures", number(sink.attempt_failures), "attempt-failures"),
    stat("retries", number(sink.retries), "retries"),
    stat("dead letters", number(sink.dead_letters), "dead-letters")),
  el("div", {class: "responses muted"}, "responses: ", responses),
  chart(sink.chart, bucketSeconds));
}

// -- throttlers -----------------------------------------------------------------------------------

function meter(fraction, color) {
  const width = fraction === null || fraction === undefined ? 0 : Math.min(1, Math.max(0, fraction)) * 100;
  return el("div", {class: "meter"}, el("div", {style: `width:${width}%;background:${color}`}));
}

function throttlerCard(t) {
  const limit = t.limit === null || t.limit === undefined ? "unlimited" : rate(t.limit);
  const used = t.limit ? t.rate / t.limit : null;
  return el("article", {class: "card throttler", "data-throttler": t.throttler_id},
    el("div", {class: "card-head"}, el("h3", {}, t.throttler_id),
      el("span", {class: "muted"}, t.controller_here ? "controller here" : "client (this process)")),
    el("div", {class: "granted"}, el("b", {class: "throttler-rate"}, rate(t.rate)), " granted of ",
      el("b", {class: "throttler-limit"}, limit)),
    meter(used, used !== null && used > 0.95 ? "#e39b1c" : "#3b7dd8"),
    el("div", {class: "stats"}, stat("queue", number(t.queue_size), "queue-size"),
      stat("oldest wait", seconds(t.wait_seconds), "wait")),
    t.classes.length ? el("table", {class: "classes"},
      el("thead", {}, el("tr", {}, ["Class", "Granted", "Share", "Weight"].map((h) => el("th", {}, h)))),
      el("tbody", {}, t.classes.map((c) => el("tr", {"data-class": c.class_id},
        el("td", {"data-label": "Class"}, c.class_id),
        el("td", {"data-label": "Granted"}, rate(c.rate), c.pending_requests ? ` (${number(c.pending_requests)} waiting)` : ""),
        el("td", {"data-label": "Share", class: "share"}, meter(c.share, "#3b7dd8"), percent(c.share)),
        el("td", {"data-label": "Weight", class: "weight"}, meter(c.weight_share, "#9aa5b1"),
          `${percent(c.weight_share)} (${number(c.weight)})`))))) : null);
}

// -- epoch parts ----------------------------------------------------------------------------------

const PART_COLORS = {read: "#3b7dd8", "Input.Throttle": "#e39b1c", process: "#2e9d5b", commit: "#8a5cc7", deliver: "#d9413a"};

function partSeconds(value) {
  if (value > 0 && value < 1) return (value * 1000).toFixed(value < 0.01 ? 1 : 0) + " ms";
  return seconds(value);
}

// Per computation, a bar of the time its epochs spent in each part over the window, and the figures.
function epochParts(doc) {
  return (doc.epoch_parts || []).map((c) => {
    const bar = svg("svg", {viewBox: "0 0 300 14", class: "parts-bar", role: "img",
      "aria-label": `epoch parts of ${c.computation}`, preserveAspectRatio: "none"});
    let x = 0;
    for (const p of c.parts) {
      const w = c.total_seconds ? 300 * p.seconds / c.total_seconds : 0;
      if (w > 0) bar.append(svg("rect", {x, y: 0, width: w, height: 14, fill: PART_COLORS[p.part] || "#9aa5b1",
        "data-part": p.part}));
      x += w;
    }
    const over = c.window_seconds ? `last ${seconds(c.window_seconds)}` : "since start";
    return el("div", {class: "card parts", "data-epoch-parts": c.computation},
      el("div", {class: "card-head"}, el("h3", {}, c.computation), el("span", {class: "muted"}, over)),
      bar,
      el("div", {class: "legend"}, ...c.parts.map((p) => el("span", {class: "part", "data-part": p.part,
        "data-seconds": String(p.seconds)}, el("i", {style: `background:${PART_COLORS[p.part] || "#9aa5b1"}`}),
        `${p.part} `, el("span", {class: "part-seconds"}, partSeconds(p.seconds)),
        p.share === null ? "" : ` (${percent(p.share)})`))));
  });
}

// -- page -----------------------------------------------------------------------------------------

function render(doc) {
  document.title = `${doc.title} · egress`;
  replace("title", doc.title, doc.worker ? el("span", {class: "muted"}, ` · worker ${doc.worker}`) : null,
    doc.stopping ? el("span", {class: "badge bad"}, "stopping") : null);
  replace("updated", `updated ${new Date(doc.time * 1000).toLocaleTimeString()}`);
  const problems = Object.entries(doc.status);
  show("problems", problems.length > 0);
  replace("problems-body", ...problems.map(([path, error]) =>
    el("div", {class: "problem", "data-path": path}, el("code", {}, path), el("pre", {}, error))));
  show("graph-section", doc.graph.nodes.length > 0);
  if (doc.graph.nodes.length) replace("graph", drawGraph(doc.graph, doc.sinks));
  show("epoch-parts-section", (doc.epoch_parts || []).length > 0);
  replace("epoch-parts", ...epochParts(doc));
  show("sources-section", (doc.sources || []).length > 0);
  replace("sources", sourcesTable(doc));
  show("partitions-section", doc.partitions.length > 0);
  replace("partitions", ...partitionsTable(doc));
  show("sinks-section", doc.sinks.length > 0);
  replace("sinks", ...doc.sinks.map((sink) => sinkCard(sink, doc.bucket_seconds)));
  show("endpoints-section", (doc.endpoints || []).length > 0);
  replace("endpoints", endpointsTable(doc));
  show("throttlers-section", doc.throttlers.length > 0);
  replace("throttlers", ...doc.throttlers.map(throttlerCard));
  document.body.dataset.renders = String(Number(document.body.dataset.renders || 0) + 1);
}

function connection(state, text) {
  const badge = document.getElementById("connection");
  badge.dataset.state = state;
  badge.textContent = text;
}

async function poll() {
  try {
    const answer = await fetch("dashboard.json", {cache: "no-store"});
    if (!answer.ok) throw new Error(`HTTP ${answer.status}`);
    render(await answer.json());
    connection("live", "live");
  } catch (error) {
    connection("lost", `no answer: ${error.message}`);
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

poll();
