// Switchyard's small chart library, shared by the router's /ui and the simulator's page.
// Hand-written SVG, no dependency. Every drawn series is a <path class="series"> carrying
// data-name (series name) and data-points (number of points), so a headless browser test can
// check what was drawn.
"use strict";

const SY = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2",
    "#db2777", "#65a30d", "#475569", "#ea580c"];

  function el(name, attrs, parent) {
    const e = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (parent) parent.appendChild(e);
    return e;
  }

  function text(parent, x, y, s, attrs) {
    const t = el("text", Object.assign({ x, y }, attrs || {}), parent);
    t.textContent = s;
    return t;
  }

  function color(i) { return PALETTE[i % PALETTE.length]; }

  function fmt(v) {
    if (!isFinite(v)) return "";
    const a = Math.abs(v);
    if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (a >= 1e3) return (v / 1e3).toFixed(1) + "k";
    if (a >= 10 || v === Math.round(v)) return String(Math.round(v));
    return v.toFixed(2);
  }

  // A line chart. opts: {title, series: [{name, points: [[x, y], ...], color?}], yMin?, yMax?,
  // xFormat?(x) -> label, width?, height?, step? (draw as steps)}.
  function lineChart(container, opts) {
    const W = opts.width || 460, H = opts.height || 180;
    const m = { l: 44, r: 10, t: 22, b: 34 };
    container.innerHTML = "";
    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, class: "chart",
      "data-title": opts.title }, container);
    text(svg, m.l, 14, opts.title, { class: "title" });
    const pts = opts.series.flatMap((s) => s.points.filter((p) => p[1] !== null && isFinite(p[1])));
    const xs = pts.map((p) => p[0]);
    let x0 = Math.min(...xs), x1 = Math.max(...xs);
    if (!pts.length) { x0 = 0; x1 = 1; }
    if (x1 === x0) x1 = x0 + 1;
    let y0 = opts.yMin !== undefined ? opts.yMin : Math.min(0, ...pts.map((p) => p[1]));
    let y1 = opts.yMax !== undefined ? opts.yMax : Math.max(1e-9, ...pts.map((p) => p[1]));
    if (opts.yMax === undefined) y1 = y1 * 1.08;
    if (y1 === y0) y1 = y0 + 1;
    const X = (x) => m.l + ((x - x0) / (x1 - x0)) * (W - m.l - m.r);
    const Y = (y) => H - m.b - ((y - y0) / (y1 - y0)) * (H - m.t - m.b);
    const axis = el("g", { class: "axis" }, svg);
    for (let i = 0; i <= 4; i++) {
      const v = y0 + ((y1 - y0) * i) / 4;
      el("line", { x1: m.l, x2: W - m.r, y1: Y(v), y2: Y(v), class: "grid" }, axis);
      text(axis, m.l - 4, Y(v) + 3, fmt(v), { "text-anchor": "end" });
    }
    const xf = opts.xFormat || fmt;
    for (let i = 0; i <= 4; i++) {
      const v = x0 + ((x1 - x0) * i) / 4;
      text(axis, X(v), H - m.b + 13, xf(v), { "text-anchor": "middle" });
    }
    opts.series.forEach((s, i) => {
      const c = s.color || color(i);
      let d = "", prev = null;
      for (const p of s.points) {
        if (p[1] === null || !isFinite(p[1])) { prev = null; continue; }
        if (prev === null) d += `M${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`;
        else if (opts.step) d += `H${X(p[0]).toFixed(1)}V${Y(p[1]).toFixed(1)}`;
        else d += `L${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`;
        prev = p;
      }
      const n = s.points.filter((p) => p[1] !== null && isFinite(p[1])).length;
      el("path", { d, stroke: c, class: "series", "data-name": s.name, "data-points": n,
        fill: "none" }, svg);
      if (n === 1) {
        const p = s.points.find((q) => q[1] !== null && isFinite(q[1]));
        el("circle", { cx: X(p[0]), cy: Y(p[1]), r: 2.5, fill: c }, svg);
      }
    });
    const legend = el("g", { class: "legend" }, svg);
    let lx = m.l;
    opts.series.forEach((s, i) => {
      el("rect", { x: lx, y: H - 12, width: 9, height: 9, fill: s.color || color(i) }, legend);
      const t = text(legend, lx + 12, H - 4, s.name);
      lx += 18 + 6.5 * s.name.length;
      return t;
    });
    return svg;
  }

  // A state strip: one row per name, one cell per sample, coloured by state.
  // opts: {title, rows: [{name, cells: [state, ...]}], colors: {state: colour}, labels}.
  function stateStrip(container, opts) {
    const W = opts.width || 460, rowH = 16;
    const m = { l: 90, r: 10, t: 22, b: 20 };
    const H = m.t + m.b + rowH * Math.max(1, opts.rows.length);
    container.innerHTML = "";
    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, class: "chart strip",
      "data-title": opts.title }, container);
    text(svg, m.l, 14, opts.title, { class: "title" });
    opts.rows.forEach((r, i) => {
      const y = m.t + i * rowH;
      text(svg, m.l - 4, y + 11, r.name, { "text-anchor": "end" });
      const n = Math.max(1, r.cells.length);
      const w = (W - m.l - m.r) / n;
      const g = el("g", { class: "series", "data-name": r.name, "data-points": r.cells.length }, svg);
      r.cells.forEach((s, j) => {
        el("rect", { x: m.l + j * w, y, width: Math.max(w, 0.5) + 0.2, height: rowH - 3,
          fill: opts.colors[s] || "#e5e7eb", "data-state": s }, g);
      });
    });
    let lx = m.l;
    for (const [s, c] of Object.entries(opts.colors)) {
      el("rect", { x: lx, y: H - 12, width: 9, height: 9, fill: c }, svg);
      const label = (opts.labels && opts.labels[s]) || s;
      text(svg, lx + 12, H - 4, label);
      lx += 20 + 6.5 * label.length;
    }
    return svg;
  }

  function clockTime(ms) {
    const d = new Date(ms);
    return d.toISOString().slice(11, 19);
  }

  function minutes(s) { return (s / 60).toFixed(0) + "m"; }

  function escapeHtml(s) {
    return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;",
      '"': "&quot;", "'": "&#39;" }[c]));
  }

  return { lineChart, stateStrip, color, fmt, clockTime, minutes, escapeHtml };
})();
