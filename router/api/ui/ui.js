// shardlimit live cluster page: polls the router that served it, draws the ring (virtual
// nodes) or the slot table, one card per node and the migration's progress. No framework.
"use strict";

const POLL_MS = 500;
const MAX_TICKS = 4000; // above this many ring points only the arcs are drawn
const SVG = "http://www.w3.org/2000/svg";
const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2",
                 "#edc948", "#ff9da7", "#9c755f", "#bab0ac"];
const colours = new Map();
const cards = new Map();
const number = new Intl.NumberFormat("en-US");
let layout = null; // the last GET /v1/cluster/ring answer
let drawnEpoch = -1;
let migrationStart = null; // {id, keys: {source: keys when first seen}}
let polls = 0;
const RULES_EVERY = 2; // GET /v1/rules on every 2nd poll (once a second)

const $ = (id) => document.getElementById(id);
const fmt = (n) => (n === null || n === undefined ? "–" : number.format(n));
const pct = (x) => (x === null || x === undefined ? "–" : (100 * x).toFixed(1) + " %");

function colour(id) {
  if (!colours.has(id)) {
    const i = colours.size;
    colours.set(id, i < PALETTE.length ? PALETTE[i] : `hsl(${(i * 137.5) % 360} 55% 55%)`);
  }
  return colours.get(id);
}

function el(tag, attrs = {}, text = null, ns = null) {
  const node = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== null) node.textContent = text;
  return node;
}
const svg = (tag, attrs = {}, text = null) => el(tag, attrs, text, SVG);

async function getJSON(path) {
  const resp = await fetch(path, { cache: "no-store", headers: { Accept: "application/json" } });
  if (!resp.ok) throw new Error(`${path}: HTTP ${resp.status}`);
  return resp.json();
}

// ---- layout: ring or slot strip ---------------------------------------------------------

function polar(r, fraction) {
  const a = 2 * Math.PI * fraction - Math.PI / 2; // 0 at the top, clockwise
  return [+(r * Math.cos(a)).toFixed(2), +(r * Math.sin(a)).toFixed(2)];
}

function arcPath(r0, r1, from, to) {
  const large = to - from > 0.5 ? 1 : 0;
  const [ax, ay] = polar(r1, from), [bx, by] = polar(r1, to);
  const [cx, cy] = polar(r0, to), [dx, dy] = polar(r0, from);
  return `M${ax} ${ay}A${r1} ${r1} 0 ${large} 1 ${bx} ${by}L${cx} ${cy}` +
         `A${r0} ${r0} 0 ${large} 0 ${dx} ${dy}Z`;
}

function drawRing(root, data) {
  const R = 160, W = 30;
  root.setAttribute("viewBox", "-220 -220 440 440");
  const points = [];
  for (const n of data.nodes) for (const p of n.points) points.push([p, n.id]);
  points.sort((a, b) => a[0] - b[0]);
  // The arc (previous point, point] belongs to the point's node; merge runs of one owner.
  const arcs = svg("g", { class: "ring-arcs" });
  let i = 0;
  while (i < points.length) {
    const owner = points[i][1];
    let j = i;
    while (j + 1 < points.length && points[j + 1][1] === owner) j++;
    const from = i === 0 ? points[points.length - 1][0] - 1 : points[i - 1][0];
    const to = points[j][0];
    // A single owner of the whole ring: two half circles (an SVG arc cannot close itself).
    const spans = to - from >= 1 ? [[from, from + 0.5], [from + 0.5, to]] : [[from, to]];
    for (const [a, b] of spans) {
      arcs.append(svg("path", { d: arcPath(R - W, R, a, b), fill: colour(owner),
                                "data-owner": owner }));
    }
    i = j + 1;
  }
  root.append(arcs);
  if (points.length <= MAX_TICKS) {
    for (const n of data.nodes) {
      const g = svg("g", { class: "ring-node", "data-node-id": n.id, stroke: colour(n.id) });
      for (const p of n.points) {
        const [x1, y1] = polar(R + 3, p), [x2, y2] = polar(R + 13, p);
        g.append(svg("line", { class: "ring-point", x1, y1, x2, y2, "stroke-width": 1.2 }));
      }
      root.append(g);
    }
  }
  for (const [f, label] of [[0, "0"], [0.25, "¼"], [0.5, "½"], [0.75, "¾"]]) {
    const [x, y] = polar(R + 26, f);
    root.append(svg("text", { x, y: y + 4, "text-anchor": "middle", class: "dim" }, label));
  }
  root.append(svg("text", { x: 0, y: -6, "text-anchor": "middle" },
                  `${fmt(points.length)} virtual nodes`));
  root.append(svg("text", { x: 0, y: 14, "text-anchor": "middle", class: "dim" },
                  `${data.vnodes} per unit of weight`));
  $("layout-title").textContent = "Hash ring";
  $("layout-note").textContent = "Each tick is a virtual node; the arc that ends at a tick " +
    "(clockwise from the top) is owned by that tick's node.";
}

function drawSlots(root, data) {
  const width = 440, total = 16384; // about the panel's width: text keeps its size
  root.setAttribute("viewBox", `-4 0 ${width + 8} 112`);
  const groups = new Map();
  for (const n of data.nodes) {
    const g = svg("g", { class: "slot-node", "data-node-id": n.id, fill: colour(n.id) });
    groups.set(n.id, g);
    root.append(g);
  }
  for (const [start, end, owner] of data.ranges) {
    const rect = svg("rect", { class: "slot-range", "data-start": start, "data-end": end,
                               x: (start / total) * width, y: 22,
                               width: ((end - start + 1) / total) * width, height: 60 });
    rect.append(svg("title", {}, `slots ${start}–${end} → ${owner}`));
    groups.get(owner).append(rect);
  }
  for (const slot of [0, 4096, 8192, 12288, 16383]) {
    const x = (slot / (total - 1)) * width;
    const anchor = slot === 0 ? "start" : slot === 16383 ? "end" : "middle";
    root.append(svg("line", { x1: x, x2: x, y1: 82, y2: 88, stroke: "#6b7686" }));
    root.append(svg("text", { x, y: 102, "text-anchor": anchor, class: "dim" }, fmt(slot)));
  }
  root.append(svg("text", { x: 0, y: 14, class: "dim" },
                  `${fmt(data.ranges.length)} contiguous ranges`));
  $("layout-title").textContent = "Slot table · 16,384 slots";
  $("layout-note").textContent = "CRC16(key or {tag}) & 16383 picks a slot; " +
    "each slot belongs to one node (hover a range for its slots).";
}

function drawLayout(data) {
  for (const n of data.nodes) colour(n.id); // colours in membership order
  const root = $("layout");
  root.replaceChildren();
  if (data.partitioner === "ring") drawRing(root, data); else drawSlots(root, data);
  const legend = $("legend");
  legend.replaceChildren();
  for (const n of data.nodes) {
    const count = n.points ? `${fmt(n.points.length)} points` : `${fmt(n.slots)} slots`;
    const item = el("li", { class: "legend-item", "data-node-id": n.id });
    const swatch = el("span", { class: "swatch" });
    swatch.style.background = colour(n.id);
    item.append(swatch, el("b", {}, n.id), el("span", { class: "dim" }, count));
    legend.append(item);
  }
  drawnEpoch = data.epoch;
}

// ---- node cards ---------------------------------------------------------------------------

function card(id) {
  if (cards.has(id)) return cards.get(id);
  const c = el("article", { class: "node-card", "data-node-id": id });
  c.style.borderLeftColor = colour(id);
  const head = el("header");
  const swatch = el("span", { class: "swatch" });
  swatch.style.background = colour(id);
  head.append(swatch, el("span", { class: "name" }, id), el("span", { class: "badge" }));
  const dl = el("dl");
  for (const [key, label] of [["keys", "keys"], ["share", "keyspace"], ["load", "load"],
                              ["count", "points"], ["weight", "weight"], ["redis", "redis"]]) {
    dl.append(el("dt", { "data-label": key }, label), el("dd", { class: key }));
    if (key === "share" || key === "load") {
      const bar = el("div", { class: "bar" });
      bar.append(el("span", { class: `bar-${key}` }));
      dl.append(bar);
    }
  }
  c.append(head, el("div", { class: "url" }), dl, el("div", { class: "error" }));
  cards.set(id, c);
  return c;
}

function updateCard(n, counts, leaving) {
  const c = card(n.id);
  const state = n.state === "down" ? "down" : leaving ? "leaving" : "up";
  c.dataset.state = state;
  const q = (sel) => c.querySelector(sel);
  q(".badge").textContent = state;
  q(".badge").className = `badge ${state}`;
  const url = endpointsText(n);
  q(".url").textContent = url.text;
  q(".url").title = url.title;
  q(".keys").textContent = fmt(n.keys);
  q(".share").textContent = pct(n.share);
  q(".load").textContent = pct(n.load_share);
  q(".bar-share").style.width = `${100 * (n.share || 0)}%`;
  q(".bar-share").style.background = colour(n.id);
  q(".bar-load").style.width = `${100 * (n.load_share || 0)}%`;
  q('[data-label="count"]').textContent = counts.label;
  q(".count").textContent = fmt(counts.byNode.get(n.id) ?? 0);
  q(".weight").textContent = fmt(n.weight);
  const redis = redisText(n.redis);
  q(".redis").textContent = redis.text;
  q(".redis").title = redis.title;
  c.dataset.replicas = redis.marker;
  q(".error").textContent = cardError(n);
  return c;
}

// Why a node cannot serve: it is down, or its Redis refuses writes or would evict counters.
function cardError(n) {
  if (n.state === "down" && n.last_error) return n.last_error;
  return n.redis_problem ? `Redis: ${n.redis_problem}` : "";
}

// A shard served from several endpoints: the one this router sends to, and how many are up.
function endpointsText(n) {
  const endpoints = n.endpoints || [];
  if (endpoints.length < 2) return { text: n.url, title: n.url };
  const active = endpoints.find((e) => e.active) || endpoints[0];
  const up = endpoints.filter((e) => e.state === "up").length;
  return {
    text: `${active.url} (${up}/${endpoints.length} endpoints up)`,
    title: endpoints.map((e) => `${e.active ? "* " : ""}${e.url} ${e.state}`).join("\n"),
  };
}

// The shard's Redis: its primary and how many of its replicas are live. A shard whose
// replicas are all down is marked: its `durability: replica` rules answer degraded.
function redisText(r) {
  if (!r) return { text: "-", title: "", marker: "unknown" };
  if (!r.replicated) {
    return { text: `${r.primary}, no replicas`, marker: "none",
             title: "no replicas: durability replica rules are served as primary" };
  }
  const replicas = r.replicas || [];
  const live = replicas.filter((x) => x.up).length;
  const title = replicas.map((x) => `${x.addr} ${x.up ? "up" : "down"}` +
    (x.lag_ms == null ? "" : ` lag ${x.lag_ms} ms`)).join("\n") +
    (r.failovers ? `\n${r.failovers} failover${r.failovers === 1 ? "" : "s"} followed` : "");
  return { text: `${r.primary} + ${live}/${replicas.length} replicas`, title,
           marker: live ? "live" : "no-live-replica" };
}

function layoutCounts() {
  const byNode = new Map();
  if (!layout) return { label: "points", byNode };
  for (const n of layout.nodes) byNode.set(n.id, n.points ? n.points.length : n.slots);
  return { label: layout.partitioner === "ring" ? "points" : "slots", byNode };
}

// ---- migration ----------------------------------------------------------------------------

function renderMigration(m, nodes) {
  const box = $("migration");
  if (!m) {
    box.dataset.phase = "none";
    box.replaceChildren(el("p", { class: "migration-summary" }, "No migration."));
    return;
  }
  const phase = m.phase || "copying";
  box.dataset.phase = phase;
  box.dataset.running = String(!!m.running);
  const sources = Object.entries(m.sources || {});
  const keysOf = new Map(nodes.map((n) => [n.id, n.keys]));
  if (!migrationStart || migrationStart.id !== m.id) {
    migrationStart = { id: m.id, keys: new Map(sources.map(([id]) => [id, keysOf.get(id)])) };
  }
  let fraction = phase === "done" ? 1 : phase === "finalizing" ? 0.99 : 0;
  if (phase === "copying" && sources.length) {
    let sum = 0;
    for (const [id, s] of sources) {
      const total = Math.max(1, migrationStart.keys.get(id) || 0);
      sum += s.done ? 1 : Math.min(0.99, s.scanned / total);
    }
    fraction = sum / sources.length;
  }
  const undoing = m.reverts ? ` (undoing ${m.reverts})` : "";
  const title = phase === "done" ? `Migration ${m.id}${undoing} done`
    : `Migration ${m.id}${undoing}: ${phase}`;
  let text = `${title} · ${fmt(m.keys_moved ?? 0)} keys moved`;
  if (m.keys_per_s) text += ` · ${fmt(Math.round(m.keys_per_s))} keys/s`;
  if (phase === "done" && m.seconds !== undefined) text += ` in ${m.seconds.toFixed(2)} s`;
  const bar = el("div", { class: "progress" });
  const fill = el("span");
  fill.style.width = `${(100 * fraction).toFixed(1)}%`;
  bar.append(fill);
  const parts = [el("p", { class: "migration-summary" }, text), bar];
  if (sources.length) {
    const table = el("table", { class: "sources" });
    const head = el("tr");
    for (const h of ["source", "scanned", "moved", ""]) head.append(el("th", {}, h));
    table.append(head);
    for (const [id, s] of sources) {
      const row = el("tr", { "data-source": id });
      row.append(el("td", {}, id), el("td", {}, fmt(s.scanned)), el("td", {}, fmt(s.moved)),
                 el("td", {}, s.done ? "✓ done" : s.copying === false ? "waiting" : "copying…"));
      table.append(row);
    }
    parts.push(table);
  }
  if (m.blocked) {
    // What keeps the migration from going on, and where: the operator's next step.
    parts.push(el("p", { class: "error blocked", "data-node-id": m.blocked.node },
                  `blocked by ${m.blocked.node}: ${m.blocked.reason}`));
  } else if (m.last_error) {
    parts.push(el("p", { class: "error" }, `paused: ${m.last_error}`));
  }
  box.replaceChildren(...parts);
}

// ---- the loop -----------------------------------------------------------------------------

function render(cluster) {
  for (const n of cluster.nodes) colour(n.id);
  $("epoch").textContent = fmt(cluster.epoch);
  $("partitioner").textContent = layout && layout.vnodes
    ? `${cluster.partitioner} · ${layout.vnodes} vnodes` : cluster.partitioner;
  $("node-count").textContent = fmt(cluster.nodes.length);
  $("key-total").textContent = fmt(cluster.nodes.reduce((s, n) => s + (n.keys || 0), 0));
  if (layout && layout.epoch !== drawnEpoch) drawLayout(layout);
  const members = new Set(layout ? layout.nodes.map((n) => n.id) : []);
  const counts = layoutCounts();
  const box = $("nodes");
  const seen = new Set();
  cluster.nodes.forEach((n, i) => {
    seen.add(n.id);
    const c = updateCard(n, counts, layout !== null && !members.has(n.id));
    if (box.children[i] !== c) box.insertBefore(c, box.children[i] || null);
  });
  for (const [id, c] of cards) {
    if (!seen.has(id)) { c.remove(); cards.delete(id); }
  }
  const down = new Set(cluster.nodes.filter((n) => n.state === "down").map((n) => n.id));
  for (const g of $("layout").querySelectorAll("[data-node-id], [data-owner]")) {
    g.classList.toggle("down-layout", down.has(g.dataset.nodeId || g.dataset.owner));
  }
  renderMigration(cluster.migration, cluster.nodes);
}

// The rules file's last refused edit (GET /v1/rules `file.rejected`), until one is accepted.
function renderRulesFile(file) {
  const line = $("rules-file");
  const rejected = file && file.rejected;
  line.hidden = !rejected;
  line.textContent = rejected
    ? `rules file rejected at ${rejected.at}: ${rejected.cause}; ` +
      `still serving rules version ${rejected.serving_version}`
    : "";
}

function setStatus(ok, text) {
  const status = $("status");
  status.dataset.ok = String(ok);
  status.textContent = text;
}

async function poll() {
  const started = performance.now();
  try {
    const cluster = await getJSON("v1/cluster");
    if (!layout || layout.epoch < cluster.epoch) layout = await getJSON("v1/cluster/ring");
    render(cluster);
    if (polls++ % RULES_EVERY === 0) renderRulesFile((await getJSON("v1/rules")).file);
    setStatus(true, `live · updated ${new Date().toLocaleTimeString("en-GB")}`);
  } catch (err) {
    setStatus(false, `router unreachable (${err.message}); retrying`);
  }
  setTimeout(poll, Math.max(50, POLL_MS - (performance.now() - started)));
}

poll();
