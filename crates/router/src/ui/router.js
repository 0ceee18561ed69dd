// The router's live view: polls /ui/history (only samples after the last one held) every
// 5 s and redraws every route's charts; the chain box asks /ui/chain.
"use strict";

(() => {
  const POLL_MS = 5000;
  let points = [];
  let errorClasses = [];
  let capacity = 3600;
  let windowMs = 3600 * 1000;

  async function poll() {
    try {
      const since = points.length ? `?since=${points[points.length - 1].t}` : "";
      const r = await fetch(`/ui/history${since}`);
      if (!r.ok) throw new Error(`/ui/history answered ${r.status}`);
      const doc = await r.json();
      errorClasses = doc.error_classes;
      capacity = doc.capacity;
      windowMs = doc.window_s * 1000;
      document.getElementById("period").textContent = doc.period_s;
      points = points.concat(doc.points);
      const newest = points.length ? points[points.length - 1].t : 0;
      points = points.filter((p) => p.t >= newest - windowMs).slice(-capacity);
      render();
      document.getElementById("error").textContent = "";
    } catch (e) {
      document.getElementById("error").textContent = String(e);
    }
  }

  // Series of one route: route key -> {model, providers: name -> [{t, sample}]}.
  function byRoute() {
    const routes = new Map();
    for (const p of points) {
      for (const r of p.routes) {
        if (!routes.has(r.route)) routes.set(r.route, { model: r.model, providers: new Map() });
        const e = routes.get(r.route);
        for (const s of r.providers) {
          if (!e.providers.has(s.name)) e.providers.set(s.name, []);
          e.providers.get(s.name).push({ t: p.t, s });
        }
      }
    }
    return routes;
  }

  function render() {
    const root = document.getElementById("routes");
    root.setAttribute("data-points", points.length);
    const routes = byRoute();
    const xFormat = SY.clockTime;
    for (const [key, route] of routes) {
      const id = "route-" + key.replace(/[^a-zA-Z0-9_-]/g, "_");
      let box = document.getElementById(id);
      if (!box) {
        box = document.createElement("div");
        box.className = "route";
        box.id = id;
        box.setAttribute("data-route", key);
        box.innerHTML = `<h2>${SY.escapeHtml(key)} <span class="muted">model ${SY.escapeHtml(route.model)}</span></h2>
          <div class="now"></div><div class="charts">
          <div class="c-avail"></div><div class="c-weight"></div><div class="c-share"></div>
          <div class="c-errors"></div><div class="c-state"></div></div>`;
        root.appendChild(box);
      }
      const names = [...route.providers.keys()];
      const series = (f) => names.map((n) => ({ name: n,
        points: route.providers.get(n).map((q) => [q.t, f(q.s)]) }));
      SY.lineChart(box.querySelector(".c-avail"), { title: "availability", series: series((s) => s.availability), yMin: 0, yMax: 1, xFormat });
      SY.lineChart(box.querySelector(".c-weight"), { title: "weight", series: series((s) => s.weight), yMin: 0, yMax: 1, xFormat });
      SY.lineChart(box.querySelector(".c-share"), { title: "traffic share (successes)", series: series((s) => s.share), yMin: 0, yMax: 1, xFormat });
      // Errors by class, summed over the route's providers, per sample; classes never seen
      // in the window are left out.
      const times = points.map((p) => p.t);
      const sums = new Map(times.map((t) => [t, errorClasses.map(() => 0)]));
      for (const n of names) {
        for (const q of route.providers.get(n)) {
          const row = sums.get(q.t);
          if (row) q.s.errors.forEach((v, ci) => { row[ci] += v; });
        }
      }
      const perClass = errorClasses.map((c, ci) => ({ name: c,
        points: times.map((t) => [t, sums.get(t)[ci]]) }));
      let shown = perClass.filter((s) => s.points.some((p) => p[1] > 0));
      if (!shown.length) shown = [{ name: "all classes", points: times.map((t) => [t, 0]) }];
      SY.lineChart(box.querySelector(".c-errors"), { title: "errors by class (per sample)", series: shown, yMin: 0, xFormat });
      SY.stateStrip(box.querySelector(".c-state"), {
        title: "pauses and open circuits",
        rows: names.map((n) => ({ name: n, cells: route.providers.get(n).map((q) =>
          !q.s.eligible ? "ineligible" : q.s.open ? "open" : q.s.paused ? "paused" : "serving") })),
        colors: { serving: "#bbf7d0", paused: "#fcd34d", open: "#f87171", ineligible: "#d1d5db" },
      });
      // The latest sample as a table.
      const last = names.map((n) => route.providers.get(n).slice(-1)[0].s);
      const hourErrors = (n) => route.providers.get(n).reduce((a, q) => a + q.s.errors.reduce((x, y) => x + y, 0), 0);
      const hourServed = (n) => route.providers.get(n).reduce((a, q) => a + q.s.served, 0);
      box.querySelector(".now").innerHTML = `<table><tr><th>provider</th><th>availability</th><th>weight</th>
        <th>served (hour)</th><th>errors (hour)</th><th>state</th></tr>` + last.map((s) => `<tr data-provider="${SY.escapeHtml(s.name)}">
        <td>${SY.escapeHtml(s.name)}</td><td>${s.availability.toFixed(3)}</td><td>${s.weight.toFixed(3)}</td>
        <td>${hourServed(s.name)}</td><td>${hourErrors(s.name)}</td>
        <td class="${s.open ? "bad" : s.paused ? "warn" : "ok"}">${!s.eligible ? "ineligible" : s.open ? "circuit open" : s.paused ? "paused" : "serving"}</td></tr>`).join("") + "</table>";
    }
  }

  async function showChain(project) {
    const out = document.getElementById("chain");
    const r = await fetch(`/ui/chain?project=${encodeURIComponent(project)}`);
    const doc = await r.json();
    if (!r.ok) {
      out.innerHTML = `<p class="bad">${SY.escapeHtml(doc.error ? doc.error.message : r.status)}</p>`;
      return;
    }
    out.setAttribute("data-project", doc.project);
    out.innerHTML = doc.routes.map((rc) => `<div class="route" data-chain-route="${SY.escapeHtml(rc.route)}">
      <b>${SY.escapeHtml(rc.route)}</b> (${SY.escapeHtml(rc.model)}): ${rc.pinned ? "pinned chain" : "no pin; chain from the current weights"};
      first try now: <b>${SY.escapeHtml(rc.first || "none")}</b>
      <ol>${rc.chain.map((e) => `<li data-provider="${SY.escapeHtml(e.name)}">${SY.escapeHtml(e.name)}
        <span class="muted">weight ${e.weight.toFixed(3)}, availability ${e.availability.toFixed(3)}</span>
        ${!e.eligible ? '<span class="bad">ineligible</span>' : ""}${e.open ? '<span class="bad"> circuit open</span>' : ""}${e.paused ? '<span class="warn"> paused</span>' : ""}</li>`).join("")}</ol></div>`).join("");
  }

  document.getElementById("chain-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const project = document.getElementById("project").value.trim();
    if (project) showChain(project);
  });
  const initial = new URLSearchParams(location.search).get("project");
  if (initial) {
    document.getElementById("project").value = initial;
    showChain(initial);
  }
  poll();
  setInterval(poll, POLL_MS);
})();
