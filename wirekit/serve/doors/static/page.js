// The live page of `wirekit serve` (wirekit/serve/doors/page.py).
//
// Polls GET /stats and GET /controller (read-only, no token), keeps what it has seen in
// memory -- the quota of every (node, device, model) row and each model's response times,
// over the last minutes -- and draws it: a card per model (figures, a table by device, a
// quota chart with the controller's decisions on it, a response-time chart with the
// target), and a timeline of decisions, quota changes and models added or removed.
//
// The page is built with DOM calls and textContent only (no HTML strings: names come from
// the server), and runs under a Content-Security-Policy without inline script or style.
// URL parameters: ?poll=<seconds between polls> (default 2), ?minutes=<history kept>
// (default 10).
"use strict";

(() => {
  const params = new URLSearchParams(window.location.search);
  const POLL_MS = clamp((Number(params.get("poll")) || 2) * 1000, 250, 60000);
  const KEEP_MS = clamp((Number(params.get("minutes")) || 10) * 60000, 60000, 6 * 3600000);
  const MAX_EVENTS = 300; // kept in memory
  const EVENTS_SHOWN = 12; // rows of the timeline shown until "show all" is pressed
  const SVG_NS = "http://www.w3.org/2000/svg";
  const PALETTE = ["#2f6fdb", "#e07b00", "#1a9c5b", "#c2185b", "#7b52c4", "#00838f",
    "#8d6e63", "#5c6bc0", "#9e9d24", "#d84315"];
  const STATUS_COLOR = { applied: "#2f6fdb", refused: "#e07b00", failed: "#c62828" };

  const state = {
    polls: 0,
    samples: [], // {t, quotas: {rowKey: quota}, models: {name: {p95, p99}}}
    models: null, // the model names of the last poll (null before the first)
    quotas: null, // rowKey -> quota at the last poll
    decisionKeys: new Set(), // the decisions already on the timeline
    events: [], // newest last: {t, kind, model, row, old, new, status, reason, saw, by}
    prevCounts: null, // {t, requests: {name: n}}: rates when /stats gives none
    skewMs: 0, // the server's clock minus the page's (from the Date header)
    colors: new Map(), // "node/device" -> colour
    cards: new Map(), // model -> its <article>
    allEvents: false, // the whole timeline shown
  };

  function clamp(v, lo, hi) {
    return Math.min(hi, Math.max(lo, v));
  }

  function isNum(v) {
    return typeof v === "number" && Number.isFinite(v);
  }

  // ---- formatting ---------------------------------------------------------------------

  function fmtSeconds(s) {
    if (!isNum(s)) return "–";
    const ms = s * 1000;
    if (ms < 1) return `${ms.toFixed(2)} ms`;
    if (ms < 10) return `${ms.toFixed(1)} ms`;
    if (ms < 1000) return `${ms.toFixed(0)} ms`;
    return `${s.toFixed(2)} s`;
  }

  function fmtRate(r) {
    if (!isNum(r)) return "–";
    return r < 10 ? r.toFixed(1) : r.toFixed(0);
  }

  function fmtQuota(q) {
    if (!isNum(q)) return "–";
    return String(Math.round(q * 1000) / 1000);
  }

  function fmtInt(n) {
    return isNum(n) ? Math.round(n).toLocaleString("en-US") : "–";
  }

  function fmtClock(t, seconds) {
    const d = new Date(t);
    const two = (n) => String(n).padStart(2, "0");
    const hm = `${two(d.getHours())}:${two(d.getMinutes())}`;
    return seconds ? `${hm}:${two(d.getSeconds())}` : hm;
  }

  function fmtStates(states) {
    const parts = Object.entries(states || {})
      .filter(([, n]) => n > 0)
      .map(([k, n]) => `${k} ${fmtInt(n)}`);
    return parts.length ? parts.join(" · ") : "–";
  }

  // ---- DOM helpers --------------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null) continue;
      if (k === "class") node.className = v;
      else if (k === "data") for (const [dk, dv] of Object.entries(v)) node.dataset[dk] = dv;
      else node.setAttribute(k, v);
    }
    for (const c of children) {
      if (c === undefined || c === null) continue;
      node.append(typeof c === "string" ? document.createTextNode(c) : c);
    }
    return node;
  }

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== undefined && v !== null) node.setAttribute(k, String(v));
    }
    for (const c of children) {
      if (c === undefined || c === null) continue;
      node.append(typeof c === "string" ? document.createTextNode(c) : c);
    }
    return node;
  }

  // A figure: its value shown, and (data-value) the raw number, for tools and tests.
  function figure(field, label, shown, raw) {
    return el("div", { class: "fig" },
      el("span", { class: "v", data: { field, value: isNum(raw) ? String(raw) : "" } }, shown),
      el("span", { class: "k" }, label));
  }

  function colorOf(deviceKey) {
    let c = state.colors.get(deviceKey);
    if (!c) {
      c = PALETTE[state.colors.size % PALETTE.length];
      state.colors.set(deviceKey, c);
    }
    return c;
  }

  // ---- reading the documents ----------------------------------------------------------

  function rowKey(r) {
    return `${r.node}/${r.device}/${r.model}`;
  }

  // Each model's figures, from the fields /stats has (per model: rate, latency and
  // devices; or, before those, the controller's window), with a rate from two polls when
  // it has none.
  function modelsOf(stats, quotaRows, now) {
    const win = (stats.window && stats.window.models) || {};
    const winRows = (stats.window && stats.window.rows) || {};
    const names = new Set(Object.keys(stats.models || {}));
    for (const r of quotaRows) names.add(r.model);
    const out = new Map();
    for (const name of [...names].sort()) {
      const s = (stats.models || {})[name] || {};
      const w = win[name];
      let latency = s.latency || null;
      if (!latency && w) latency = { p50: w.p50, p95: w.p95, p99: w.p99 };
      let rate = isNum(s.rate) ? s.rate : w && isNum(w.rate) ? w.rate : null;
      const prev = state.prevCounts;
      if (rate === null && prev && isNum(s.requests) && isNum(prev.requests[name])) {
        const dt = (now - prev.t) / 1000;
        if (dt > 0) rate = Math.max(0, s.requests - prev.requests[name]) / dt;
      }
      const devices = new Map(); // "node/device" -> {requests, states, latency, inFlight}
      if (s.devices) {
        for (const [key, d] of Object.entries(s.devices)) {
          devices.set(key, {
            requests: d.requests, states: d.states || {}, latency: d.latency || null,
            inFlight: d.in_flight,
          });
        }
      } else {
        for (const [key, r] of Object.entries(winRows)) {
          const parts = key.split("/");
          if (parts.length !== 3 || parts[2] !== name) continue;
          devices.set(`${parts[0]}/${parts[1]}`, {
            requests: r.requests, states: { ok: r.ok, "not ok": r.errors },
            latency: { p50: r.p50, p95: r.p95, p99: r.p99 }, inFlight: null, windowed: true,
          });
        }
      }
      const statuses = s.statuses || {};
      let errors = 0;
      for (const [k, n] of Object.entries(statuses)) if (k !== "ok" && isNum(n)) errors += n;
      out.set(name, {
        name, requests: s.requests, queue: s.queue, statuses, errors, latency, rate, devices,
        // served: it has rows in the catalog (a removed model keeps its figures in /stats)
        present: quotaRows.some((r) => r.model === name),
      });
    }
    return out;
  }

  function sawText(m) {
    if (!m || typeof m !== "object") return "";
    const metric = m.metric || "p95";
    const source = m.source === "device" ? m.device_window : m.window;
    const value = source && source[metric];
    const parts = [];
    if (isNum(value)) parts.push(`${metric} ${fmtSeconds(value)}`);
    if (isNum(m.target)) parts.push(`target ${fmtSeconds(m.target)}`);
    if (isNum(m.ratio)) parts.push(`×${m.ratio.toFixed(2)}`);
    if (m.source) parts.push(`(${m.source})`);
    return parts.join(" ");
  }

  // What an operator's decision about a whole model changed: "key old → new, ..." (set),
  // its quotas (add, remove).
  function changeText(d) {
    const show = (v) => (v === null || v === undefined ? "–" : String(v));
    if (d.kind === "set") {
      const before = d.before || {}, after = d.after || {};
      return Object.keys(after).map((k) => `${k} ${show(before[k])} → ${show(after[k])}`)
        .join(", ");
    }
    const doc = (d.kind === "remove" ? d.before : d.after) || {};
    return Object.entries(doc.quotas || {}).map(([row, q]) => `${row} ${fmtQuota(q)}`)
      .join(", ");
  }

  // The timeline's name of a decision: the controller's or an operator's quota change
  // ("decision applied"), a model added, removed or its settings set by an operator.
  const MODEL_EVENTS = { add: ["model added", "add"], remove: ["model removed", "remove"],
    set: ["settings set", "set"] };
  function decisionKind(d) {
    const names = MODEL_EVENTS[d.kind];
    if (!names) return `decision ${d.status}`;
    return d.status === "applied" ? names[0] : `${names[1]} ${d.status}`;
  }

  function addEvent(ev) {
    state.events.push(ev);
    state.events.sort((a, b) => a.t - b.t);
    if (state.events.length > MAX_EVENTS) state.events.splice(0, state.events.length - MAX_EVENTS);
  }

  // Fold one poll into the page's memory.
  function absorb(stats, ctl, now) {
    const quotaRows = (ctl && ctl.quotas) || stats.quotas || [];
    const models = modelsOf(stats, quotaRows, now);
    const quotas = {};
    for (const r of quotaRows) quotas[rowKey(r)] = r.quota;

    // the decisions, once each: the controller's and the operators' (quota changes, models
    // added, removed, their settings set: ``by`` says who)
    const explained = new Set();
    const listed = new Set(); // /controller lists its last decisions: one gone never returns
    for (const d of (ctl && ctl.decisions) || []) {
      const key = `${d.time}|${d.node}/${d.device}/${d.model}|${d.new}|${d.status}|${d.kind}`;
      listed.add(key);
      if (state.decisionKeys.has(key)) continue;
      const t = d.time * 1000 - state.skewMs;
      const by = d.by && d.by !== "controller" ? d.by : "";
      const why = by ? `${d.reason} (${by})` : d.reason;
      const reason = d.error ? `${why}: ${d.error}` : why;
      if (MODEL_EVENTS[d.kind]) {
        const kind = decisionKind(d);
        // the same change seen between two polls, before /controller listed it
        state.events = state.events.filter((e) => !(e.kind === kind && !e.status &&
          e.model === d.model && Math.abs(e.t - t) < 10 * POLL_MS + 5000));
        addEvent({ t, kind, status: d.status, model: d.model, reason, saw: changeText(d), by });
        continue;
      }
      const row = `${d.node}/${d.device}/${d.model}`;
      if (d.status === "applied") explained.add(row);
      addEvent({
        t, kind: decisionKind(d), status: d.status, model: d.model, row, old: d.old, new: d.new,
        reason, saw: sawText(d.metrics), by,
      });
    }
    state.decisionKeys = listed;
    // a model added or removed that a decision listed already explains
    const decided = (kind, name) => state.events.some((e) => e.kind === kind && e.status &&
      e.model === name && Math.abs(e.t - now) < 10 * POLL_MS + 5000);
    // quota changes no decision explains (an operator's without a controller, another
    // replica's), models added and removed
    if (state.quotas) {
      for (const [key, q] of Object.entries(quotas)) {
        const old = state.quotas[key];
        if (old !== undefined && old !== q && !explained.has(key)) {
          addEvent({ t: now, kind: "quota changed", model: key.split("/")[2], row: key,
            old, new: q, reason: "seen between two polls", saw: "" });
        }
      }
    }
    const names = new Set([...models.values()].filter((m) => m.present).map((m) => m.name));
    if (state.models) {
      for (const name of names) {
        if (!state.models.has(name) && !decided("model added", name)) {
          addEvent({ t: now, kind: "model added", model: name });
        }
      }
      for (const name of state.models) {
        if (!names.has(name) && !decided("model removed", name)) {
          addEvent({ t: now, kind: "model removed", model: name });
        }
      }
    }
    state.models = names;
    state.quotas = quotas;
    const sample = { t: now, quotas, models: {} };
    for (const m of models.values()) {
      sample.models[m.name] = {
        p95: m.latency ? m.latency.p95 : null, p99: m.latency ? m.latency.p99 : null,
      };
    }
    state.samples.push(sample);
    while (state.samples.length && state.samples[0].t < now - KEEP_MS) state.samples.shift();
    const requests = {};
    for (const m of models.values()) requests[m.name] = m.requests;
    state.prevCounts = { t: now, requests };
    return { models, quotaRows };
  }

  // ---- charts -------------------------------------------------------------------------

  // The top of a y axis of four equal steps, each a round number, at least ``v``.
  function niceMax(v) {
    if (!(v > 0)) return 1;
    const step = v / 4;
    const p = 10 ** Math.floor(Math.log10(step));
    for (const m of [1, 2, 2.5, 5, 10]) if (step <= m * p) return 4 * m * p;
    return 40 * p;
  }

  // A time-series chart: series [{label, color, points: [[t, v]], step, dash}], markers
  // [{t, color, title}] (vertical lines), hline {v, label} (a dashed level).
  function chart({ t0, t1, series, markers, hline, yMax, yFormat, title }) {
    const W = 560, H = 170, L = 58, R = 12, T = 10, B = 24;
    const pw = W - L - R, ph = H - T - B;
    // the axis fits the values, but a rare spike (a cold start) does not flatten the rest:
    // past twice the 90th percentile of what is shown, lines run along the top
    const values = [];
    for (const s of series) for (const [t, v] of s.points) if (isNum(v) && t >= t0) values.push(v);
    values.sort((a, b) => a - b);
    let top = values.length ? values[values.length - 1] : 0;
    if (!yMax && values.length >= 10) {
      top = Math.min(top, values[Math.floor(values.length * 0.9)] * 2);
    }
    top = Math.max(top, yMax || 0);
    if (hline && isNum(hline.v)) top = Math.max(top, hline.v * 1.15);
    top = niceMax(top);
    const x = (t) => L + ((t - t0) / (t1 - t0)) * pw;
    const y = (v) => T + ph - (Math.min(v, top) / top) * ph;
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img",
      "aria-label": title });
    root.append(svg("title", {}, title));
    for (let i = 0; i <= 4; i++) {
      const v = (top * i) / 4;
      root.append(svg("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "grid" }));
      root.append(svg("text", { x: L - 6, y: y(v) + 4, class: "tick", "text-anchor": "end" },
        yFormat(v)));
    }
    const span = t1 - t0;
    const step = [10e3, 15e3, 30e3, 60e3, 120e3, 300e3, 600e3, 1800e3, 3600e3]
      .find((s) => span / s <= 6) || 3600e3;
    for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) {
      root.append(svg("line", { x1: x(t), x2: x(t), y1: T, y2: T + ph, class: "grid" }));
      root.append(svg("text", { x: x(t), y: H - 6, class: "tick", "text-anchor": "middle" },
        fmtClock(t, step < 60e3)));
    }
    if (hline && isNum(hline.v)) {
      root.append(svg("line", { x1: L, x2: W - R, y1: y(hline.v), y2: y(hline.v),
        class: "target" }));
      root.append(svg("text", { x: W - R - 4, y: y(hline.v) - 4, class: "tick target-label",
        "text-anchor": "end", stroke: "#fff", "stroke-width": 3, "paint-order": "stroke" },
      hline.label));
    }
    for (const m of markers || []) {
      if (m.t < t0 || m.t > t1) continue;
      const g = svg("g", { class: "marker" }, svg("title", {}, m.title));
      g.append(svg("line", { x1: x(m.t), x2: x(m.t), y1: T, y2: T + ph, stroke: m.color,
        class: "marker-line" }));
      g.append(svg("path", { d: `M${x(m.t) - 4},${T} h8 l-4,6 z`, fill: m.color }));
      root.append(g);
    }
    series.forEach((s, i) => {
      // lines at the same level (two rows at quota 1) are drawn a little apart
      const nudge = s.step ? (i - (series.length - 1) / 2) * 2.5 : 0;
      let d = "";
      let last = null;
      for (const [t, v] of s.points) {
        if (!isNum(v)) { last = null; continue; }
        const px = x(t).toFixed(1), py = (y(v) + nudge).toFixed(1);
        if (last === null) d += `M${px},${py}`;
        else d += s.step ? `H${px}V${py}` : `L${px},${py}`;
        last = v;
      }
      if (s.step && last !== null) d += `H${x(t1).toFixed(1)}`;
      if (d) {
        root.append(svg("path", { d, fill: "none", stroke: s.color, "stroke-width": 2,
          "stroke-dasharray": s.dash, class: "series" }, svg("title", {}, s.label)));
      }
    });
    return root;
  }

  function legend(items) {
    return el("div", { class: "legend" }, ...items.map(({ label, color, dash }) =>
      el("span", { class: "item" },
        svg("svg", { viewBox: "0 0 18 8", width: 18, height: 8 },
          svg("line", { x1: 0, x2: 18, y1: 4, y2: 4, stroke: color, "stroke-width": 2.5,
            "stroke-dasharray": dash })),
        label)));
  }

  // ---- rendering ----------------------------------------------------------------------

  function renderStatus(stats, ctl, now) {
    const pills = [];
    const pill = (text, cls) => el("span", { class: `pill ${cls || ""}` }, text);
    if (typeof stats.ready === "boolean") {
      pills.push(pill(stats.ready ? "ready" : "not ready", stats.ready ? "ok" : "bad"));
    }
    pills.push(pill(`store ${stats.store || "?"}${stats.replica ? ` · replica ${stats.replica}` : ""}`));
    if (ctl && ctl.enabled) {
      const policy = String(ctl.policy || "").split(":").pop();
      pills.push(pill(`controller ${policy} · every ${ctl.period} s · ${fmtInt(ctl.periods)} periods` +
        (ctl.failures ? ` · ${ctl.failures} failed` : ""), ctl.failures ? "warn" : "ok"));
    } else {
      pills.push(pill("controller off"));
    }
    pills.push(pill(`queue ${fmtInt(stats.queue)}`, stats.queue > 0 ? "warn" : ""));
    if (stats.cache) {
      pills.push(pill(`cache ${fmtInt(stats.cache.hits)} hits / ${fmtInt(stats.cache.misses)} misses`));
    }
    if (isNum(stats.resubmissions) && stats.resubmissions > 0) {
      pills.push(pill(`${fmtInt(stats.resubmissions)} resubmitted`, "warn"));
    }
    if (Array.isArray(stats.backed_off) && stats.backed_off.length) {
      pills.push(pill(`backed off: ${stats.backed_off.map(String).join(", ")}`, "bad"));
    }
    document.getElementById("status").replaceChildren(...pills);
    renderReadiness(stats);
    document.getElementById("updated").textContent =
      `updated ${fmtClock(now, true)} · every ${POLL_MS / 1000} s`;
  }

  // /readyz's reasons (in /stats as ready_reasons, under its policy ready_policy): why the
  // dispatcher is not ready, or what its policy lets pass ("any": a model not ready)
  function renderReadiness(stats) {
    const box = document.getElementById("readiness");
    const reasons = Array.isArray(stats.ready_reasons) ? stats.ready_reasons.map(String) : [];
    box.hidden = reasons.length === 0;
    box.classList.toggle("bad", stats.ready === false);
    const policy = stats.ready_policy ? ` (policy ${stats.ready_policy})` : "";
    document.getElementById("readiness-head").textContent =
      `/readyz${policy}: ${stats.ready === false ? "not ready:" : "ready, though:"}`;
    document.getElementById("ready-reasons").replaceChildren(
      ...reasons.map((r) => el("li", {}, r)));
  }

  // The device a request is counted on, as shown: "node/device", or one of the two keys
  // /stats (and /metrics' device label) gives requests no device answered: "none" (failed,
  // refused, abandoned or lost: a failure) and "cache" (answered from the response cache).
  const NO_DEVICE = "none";
  const CACHE_DEVICE = "cache";
  function deviceLabel(key) {
    if (key === NO_DEVICE) return "none: not answered (failed, abandoned or lost)";
    if (key === CACHE_DEVICE) return "cache: answered from the response cache";
    return key;
  }

  function deviceTable(m, rows, span) {
    const head = el("tr", {}, ...["device", "type", "quota", "requests", "end states", "p50",
      "p95", "p99", "in flight"].map((h) => el("th", {}, h)));
    const keys = new Map(); // "node/device" -> its quota row (if any)
    for (const r of rows) keys.set(`${r.node}/${r.device}`, r);
    for (const k of m.devices.keys()) if (!keys.has(k)) keys.set(k, null);
    const body = [];
    let windowed = false;
    for (const [key, r] of keys) {
      const d = m.devices.get(key) || {};
      windowed = windowed || Boolean(d.windowed);
      const lat = d.latency || {};
      const quota = r ? r.quota : null;
      const bar = el("span", { class: "bar" }, svg("svg", { viewBox: "0 0 40 8", width: 40,
        height: 8 }, svg("rect", { x: 0, y: 0, width: 40, height: 8, class: "bar-bg" }),
      svg("rect", { x: 0, y: 0, width: isNum(quota) ? 40 * clamp(quota, 0, 1) : 0, height: 8,
        fill: colorOf(key) })));
      const rowClass = quota === 0 ? "off" : key === NO_DEVICE ? "failure" : "";
      body.push(el("tr", { class: rowClass, data: { device: key } },
        el("td", {}, svg("svg", { viewBox: "0 0 10 10", width: 10, height: 10, class: "dot" },
          svg("circle", { cx: 5, cy: 5, r: 5, fill: colorOf(key) })), deviceLabel(key)),
        el("td", {}, r ? r.device_type || "" : ""),
        el("td", { class: "num" }, bar, el("span", { data: { field: "quota" } }, fmtQuota(quota))),
        el("td", { class: "num", data: { field: "requests", value: isNum(d.requests) ? String(d.requests) : "" } },
          fmtInt(d.requests)),
        el("td", {}, fmtStates(d.states)),
        el("td", { class: "num" }, fmtSeconds(lat.p50)),
        el("td", { class: "num" }, fmtSeconds(lat.p95)),
        el("td", { class: "num" }, fmtSeconds(lat.p99)),
        el("td", { class: "num" }, isNum(d.inFlight) ? fmtInt(d.inFlight) : "–")));
    }
    const table = el("table", { class: "devices" }, el("thead", {}, head), el("tbody", {}, ...body));
    const note = el("p", { class: "muted small" }, windowed
      ? "by device: over the controller's recent window"
      : "by device: requests and end states since this process started; p50/p95/p99 over" +
        ` the last ${isNum(span) ? `${span} s` : "minute"}`);
    return el("div", { class: "table-wrap" }, table, note);
  }

  function renderModel(m, rows, target, span, now) {
    let card = state.cards.get(m.name);
    if (!card) {
      card = el("article", { class: "model panel", data: { model: m.name } });
      state.cards.set(m.name, card);
    }
    const lat = m.latency || {};
    const head = el("div", { class: "model-head" },
      el("h2", { data: { field: "name" } }, m.name),
      isNum(target) ? el("span", { class: "pill" }, `target p95 ${fmtSeconds(target)}`) : null,
      m.present ? null : el("span", { class: "pill bad" }, "removed"));
    if (m.present) delete card.dataset.removed;
    else card.dataset.removed = "true";
    const figures = el("div", { class: "figures" },
      figure("rate", "requests/s", fmtRate(m.rate), m.rate),
      figure("requests", "requests stored", fmtInt(m.requests), m.requests),
      figure("queue", "queue", fmtInt(m.queue), m.queue),
      figure("errors", "not ok", fmtInt(m.errors), m.errors),
      figure("p50", "p50", fmtSeconds(lat.p50), lat.p50),
      figure("p95", "p95", fmtSeconds(lat.p95), lat.p95),
      figure("p99", "p99", fmtSeconds(lat.p99), lat.p99));
    const states = el("div", { class: "states" }, el("span", { class: "k" }, "end states "),
      el("span", { data: { field: "states" } }, fmtStates(m.statuses)));

    // charts: the quota of each of its rows, with the decisions; its p95/p99 and target
    const first = state.samples.length ? state.samples[0].t : now;
    const t0 = Math.max(now - KEEP_MS, Math.min(first, now - 60e3));
    const quotaSeries = rows.map((r) => {
      const key = rowKey(r);
      return {
        label: `${r.node}/${r.device}`, color: colorOf(`${r.node}/${r.device}`), step: true,
        points: state.samples.map((s) => [s.t, s.quotas[key]]),
      };
    });
    const markers = state.events
      .filter((e) => e.model === m.name && e.kind !== "quota changed")
      .map((e) => ({
        t: e.t,
        color: e.status ? STATUS_COLOR[e.status] || "#555" : "#6a1b9a",
        title: `${fmtClock(e.t, true)} ${e.kind}${e.row ? ` ${e.row}` : ""}` +
          (isNum(e.old) ? ` ${fmtQuota(e.old)} → ${fmtQuota(e.new)}` : "") +
          (e.reason ? `: ${e.reason}` : ""),
      }));
    const quotaChart = el("figure", {},
      el("figcaption", {}, "quota by device ", el("span", { class: "muted" },
        "(▼ controller decisions)")),
      chart({ t0, t1: now, series: quotaSeries, markers, yMax: 1, yFormat: (v) => v.toFixed(2),
        title: `quota of ${m.name} by device` }),
      legend(quotaSeries));
    const latSeries = [
      { label: "p95", color: "#2f6fdb", points: state.samples.map((s) => [s.t,
        (s.models[m.name] || {}).p95]) },
      { label: "p99", color: "#9bb7ec", dash: "4 3", points: state.samples.map((s) => [s.t,
        (s.models[m.name] || {}).p99]) },
    ];
    const latChart = el("figure", {},
      el("figcaption", {}, "response time"),
      chart({ t0, t1: now, series: latSeries, markers,
        hline: isNum(target) ? { v: target, label: "target" } : null,
        yFormat: (v) => (v === 0 ? "0" : fmtSeconds(v)), title: `response time of ${m.name}` }),
      legend([...latSeries, ...(isNum(target) ? [{ label: "target", color: "#c62828",
        dash: "6 4" }] : [])]));
    if (!m.present) {  // no rows left: what it did, without the charts
      card.replaceChildren(head, figures, states, deviceTable(m, rows, span));
      return card;
    }
    card.replaceChildren(head, figures, states, deviceTable(m, rows, span),
      el("div", { class: "charts" }, quotaChart, latChart));
    return card;
  }

  function renderEvents() {
    const tbody = document.querySelector("#events tbody");
    const newest = [...state.events].reverse();
    const shown = state.allEvents ? newest : newest.slice(0, EVENTS_SHOWN);
    const rows = shown.map((e) => el("tr",
      { class: e.status ? `ev ${e.status}` : "ev", data: { kind: e.kind, model: e.model,
        row: e.row || "", old: isNum(e.old) ? String(e.old) : "",
        new: isNum(e.new) ? String(e.new) : "", by: e.by || "" } },
      el("td", { class: "num" }, fmtClock(e.t, true)),
      el("td", {}, e.kind),
      el("td", {}, e.row || e.model || ""),
      el("td", { class: "num" }, isNum(e.old) ? `${fmtQuota(e.old)} → ${fmtQuota(e.new)}` : ""),
      el("td", {}, e.reason || ""),
      el("td", {}, e.saw || "")));
    tbody.replaceChildren(...rows);
    document.getElementById("no-events").hidden = rows.length > 0;
    const more = document.getElementById("more-events");
    more.hidden = newest.length <= EVENTS_SHOWN;
    more.textContent = state.allEvents
      ? `show the newest ${EVENTS_SHOWN}`
      : `show all ${newest.length} (${newest.length - EVENTS_SHOWN} older)`;
  }

  function render(stats, ctl, folded, now) {
    renderStatus(stats, ctl, now);
    const targets = (ctl && ctl.targets) || {};
    const cards = [];
    const order = [...folded.models.values()].sort((a, b) => Number(b.present) - Number(a.present));
    for (const m of order) {
      const rows = folded.quotaRows.filter((r) => r.model === m.name);
      cards.push(renderModel(m, rows, targets[m.name], stats.stats_window, now));
    }
    for (const name of [...state.cards.keys()]) {
      if (!folded.models.has(name)) state.cards.delete(name);
    }
    document.getElementById("models").replaceChildren(...cards);
    renderEvents();
  }

  // ---- polling ------------------------------------------------------------------------

  async function getJson(path) {
    const resp = await fetch(path, { cache: "no-store", headers: { Accept: "application/json" } });
    if (!resp.ok) throw new Error(`${path} answered HTTP ${resp.status}`);
    return { doc: await resp.json(), date: Date.parse(resp.headers.get("Date") || "") };
  }

  function showProblem(text) {
    const p = document.getElementById("problem");
    p.textContent = text;
    p.hidden = !text;
  }

  async function poll() {
    try {
      // /controller adds the decisions and targets; without it the page shows the rest
      const [stats, ctl] = await Promise.all([
        getJson("/stats"), getJson("/controller").catch(() => ({ doc: null })),
      ]);
      const now = Date.now();
      // the Date header has whole seconds: only a clock off by more is corrected
      if (isNum(stats.date) && Math.abs(stats.date - now) > 3000) state.skewMs = stats.date - now;
      const folded = absorb(stats.doc, ctl.doc, now);
      render(stats.doc, ctl.doc, folded, now);
      showProblem("");
      state.polls += 1;
      document.body.dataset.polls = String(state.polls);
    } catch (err) {
      showProblem(`cannot read the server: ${err && err.message ? err.message : err}`);
    } finally {
      window.setTimeout(poll, POLL_MS);
    }
  }

  document.getElementById("more-events").addEventListener("click", () => {
    state.allEvents = !state.allEvents;
    renderEvents();
  });
  poll();
})();
