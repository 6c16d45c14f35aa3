// The Monitor page: the live feed (/monitor/feed, read with fetch so the API key can be
// sent) drawn as the pool's grid, the lanes, the parked conversations in LRU order, the
// pool's events as they happen, and the last minutes of tokens/s, queue, CPU and RAM.

import { AuthNeeded, streamEvents } from "./api.js";
import { drawChart } from "./charts.js";
import { ChunkMap, bytesText, convColor, placesOf, rangesText } from "./chunks.js";

const $ = (id) => document.getElementById(id);
const HISTORY = 300;  // samples kept (one a second)
const MAX_EVENTS = 100;

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function convLabel(convId) {
  return convId ? `#${convId}` : "—";
}

// A layer group's label: its window, its layers, its chunks held of its size, and its bytes.
function groupLabel(name, layers, map, chunkSize, bytesPerCell, kept) {
  const held = map.num_chunks - map.num_chunks_free;
  const which = layers.length ? `${layers.length} layer${layers.length > 1 ? "s" : ""} (${rangesText(layers)})`
    : "no layer (its chunks hold no K/V; they bound each conversation's length)";
  return `${name} · ${which} · ${held}/${map.num_chunks} chunks held` + (kept ? ` (${kept} kept)` : "") +
    ` · ${bytesText(map.num_chunks * chunkSize * bytesPerCell)}`;
}

// A lane's or a parked conversation's chunks: the full group's, then each windowed group's.
function chunksText(numChunks, windowChunks, groups) {
  if (!groups.length) return String(numChunks);
  return `${numChunks} · ` + groups.map((g, k) => `w${g.window}: ${windowChunks[k]}`).join(" · ");
}

export class Monitor {
  constructor(askKey) {
    this.askKey = askKey;
    this.controller = null;
    this.samples = [];
    this.full = new ChunkMap($("grid"), 0);
    this.windowRows = [];  // one {label, map} per windowed layer group, in group order
    this.onModel = null;
  }

  start() {
    if (this.controller) return;
    this.controller = new AbortController();
    this.run(this.controller.signal);
  }

  stop() {
    if (this.controller) this.controller.abort();
    this.controller = null;
  }

  async run(signal) {
    $("monitor-status").textContent = "connecting…";
    try {
      await streamEvents("/monitor/feed", null, (frame) => this.frame(frame), signal);
      $("monitor-status").textContent = "the server closed the feed";
    } catch (err) {
      if (err.name === "AbortError") return;
      $("monitor-status").textContent = "feed: " + err.message;
      if (err instanceof AuthNeeded) { this.controller = null; this.askKey(); return; }
    }
    if (this.controller && this.controller.signal === signal) {
      this.controller = null;
      setTimeout(() => { if (!document.getElementById("monitor-view").hidden) this.start(); }, 2000);
    }
  }

  frame(frame) {
    $("monitor-status").textContent = `live · ${frame.model} · ${frame.state}`;
    if (frame.picture) this.picture(frame.picture);
    if (frame.moe) this.moe(frame.moe);
    if (frame.events) this.events(frame.events);
    if (frame.samples) {
      this.samples.push(...frame.samples);
      this.samples.splice(0, Math.max(0, this.samples.length - HISTORY));
      this.charts();
    }
  }

  moe(m) {
    const mib = (b) => (b / 1048576).toFixed(1);
    const b = m.budget;
    $("moe-summary").hidden = false;
    $("moe-summary").textContent =
      `experts: ${m.resident} slots per layer (${m.evict}${m.prefetch ? ", prefetch" : ""})` +
      ` · hit ${(100 * m.hit_ratio).toFixed(0)}% · ${mib(m.bytes_copied_per_token)} MiB copied/token` +
      ` · evictions ${m.evictions}` +
      (b ? ` · budget ${mib(b.device_bytes)} MiB: weights ${mib(b.resident_bytes)}, experts ${mib(b.expert_bytes)},` +
           ` rings ${mib(b.ring_bytes)}, free ${mib(b.free_bytes)}` : "");
  }

  picture(p) {
    const held = p.num_chunks - p.num_chunks_free;
    $("pool-summary").textContent =
      `${held}/${p.num_chunks} chunks held · ${p.chunk_size} cells each · ${p.pooled ? "shared pool" : "reserved per lane"}` +
      ` · queued ${p.num_queued} · running ${p.num_running}` +
      ` · evictions ${p.num_evictions} · refusals ${p.num_refusals} · truncations ${p.num_truncations}`;
    const places = placesOf(p);
    this.full.draw(p, p.chunk_size, places);
    this.windowGroups(p, places);
    this.lanes(p);
    this.parked(p);
  }

  // With sliding-window layer groups: a label over the full group's row, then one row per window.
  windowGroups(p, places) {
    const groups = p.groups || [];
    $("full-label").hidden = !groups.length;
    $("legend-kept").hidden = !groups.length;
    if (groups.length) {
      $("full-label").textContent = groupLabel("full attention", p.full_layers, p, p.chunk_size, p.full_bytes_per_cell, 0);
    }
    const rows = $("window-groups");
    if (this.windowRows.length !== groups.length) {
      rows.replaceChildren();
      this.windowRows = groups.map((g, k) => {
        const row = rows.appendChild(el("div", "group-row"));
        row.dataset.group = String(k + 1);
        row.dataset.window = String(g.window);
        const label = row.appendChild(el("p", "group-label muted"));
        return { label, map: new ChunkMap(row.appendChild(el("div", "grid")), k + 1) };
      });
    }
    groups.forEach((g, k) => {
      const { label, map } = this.windowRows[k];
      label.textContent = groupLabel(`window ${g.window}`, g.layers, g, p.chunk_size, g.bytes_per_cell, g.num_chunks_kept);
      map.draw(g, p.chunk_size, places);
    });
  }

  lanes(p) {
    const body = $("lanes").tBodies[0];
    body.replaceChildren();
    for (const lane of p.lanes) {
      const row = el("tr", "lane " + lane.state);
      row.dataset.lane = String(lane.index);
      row.dataset.state = lane.state;
      row.dataset.conv = String(lane.conv_id);
      row.appendChild(el("td", null, lane.index === 0 ? "0 (main)" : String(lane.index)));
      const conv = row.appendChild(el("td", "conv", convLabel(lane.conv_id)));
      if (lane.conv_id) conv.style.color = convColor(lane.conv_id);
      let state = lane.state;
      if (lane.state === "prefill") state += ` ${lane.num_cells}/${lane.num_prompt_tokens}`;
      if (lane.state === "decode") state += ` +${lane.num_output_tokens}`;
      row.appendChild(el("td", "state", state));
      row.appendChild(el("td", null, String(lane.num_cells)));
      row.appendChild(el("td", "chunks", chunksText(lane.num_chunks, lane.window_chunks || [], p.groups || [])));
      const request = row.appendChild(el("td", "request muted", lane.request_id || ""));
      request.title = lane.request_id || "";
      body.appendChild(row);
    }
  }

  parked(p) {
    const list = $("parked");
    list.replaceChildren();
    if (!p.parked.length) list.appendChild(el("li", "muted", "none"));
    for (const c of p.parked) {
      const item = el("li", "parked-conv");
      item.dataset.conv = String(c.conv_id);
      const name = item.appendChild(el("span", "conv", convLabel(c.conv_id)));
      name.style.color = convColor(c.conv_id);
      item.appendChild(document.createTextNode(
        ` ${c.num_cells} cells · ${chunksText(c.num_chunks, c.window_chunks || [], p.groups || [])} chunks` + (c.lane === null ? " · in the pool" : ` · idle in lane ${c.lane}`)));
      list.appendChild(item);
    }
  }

  events(events) {
    const list = $("events");
    for (const e of events) {
      const item = el("li", "event " + e.kind);
      item.dataset.kind = e.kind;
      const when = new Date(e.at * 1000).toLocaleTimeString();
      const who = e.conv_ids.length ? " " + e.conv_ids.map(convLabel).join(", ") : "";
      item.textContent = `${when} ${e.kind}${e.count > 1 ? " ×" + e.count : ""}${who}`;
      list.prepend(item);
    }
    while (list.children.length > MAX_EVENTS) list.lastElementChild.remove();
  }

  charts() {
    const take = (key) => this.samples.map((s) => s[key]);
    const series = (label, key) => ({ label, values: take(key), capacity: HISTORY });
    drawChart($("chart-tokens"), [series("tok/s", "tokens_per_s")]);
    drawChart($("chart-queue"), [series("queued", "num_queued"), series("running", "num_running")]);
    drawChart($("chart-cpu"), [series("machine", "cpu_percent"), series("server", "process_cpu_percent")], { min_top: 100 });
    drawChart($("chart-ram"), [series("machine %", "ram_used_percent")], { min_top: 100 });
    const latest = this.samples[this.samples.length - 1];
    if (latest) $("server-rss").textContent = `${latest.rss_mib.toFixed(0)} MiB`;
  }
}
