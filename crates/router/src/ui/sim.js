// The simulator's page: lists the shipped scenarios (/ui/scenarios), lets a person edit
// capacities, outages and traffic, posts the run to /ui/run and draws the result with the
// router page's chart code. `?scenario=NAME&minutes=M&run=1` selects a scenario, sets its
// simulated duration and runs it at once.
"use strict";

(() => {
  const STRATEGIES = ["switchyard", "ordered", "round_robin", "p2c"];
  let scenarios = [];
  let result = null;
  const $ = (id) => document.getElementById(id);
  const params = new URLSearchParams(location.search);

  function fmtOutages(list) {
    return (list || []).map((o) => `${o.start_s / 60}-${o.end_s / 60}:${o.status}`).join(", ");
  }

  function parseOutages(text) {
    const out = [];
    for (const part of text.split(",").map((s) => s.trim()).filter(Boolean)) {
      const m = part.match(/^(\d+(?:\.\d+)?)-(\d+(?:\.\d+)?)(?::(\d{3}))?$/);
      if (!m) throw new Error(`outage "${part}" is not START-END:STATUS in minutes, e.g. 20-30:503`);
      out.push({ start_s: Math.round(Number(m[1]) * 60), end_s: Math.round(Number(m[2]) * 60),
        status: Number(m[3] || 503) });
    }
    return out;
  }

  function showScenario(sc) {
    $("description").textContent = sc.description;
    $("duration").value = sc.duration_s / 60;
    const t = sc.traffic;
    let html = ` &middot; traffic: ${t.kind}`;
    if (t.kind === "sessions") {
      html += ` &middot; <input id="spm" class="num" value="${t.sessions_per_minute}"> sessions/min
        &middot; <input id="projects" class="num" value="${t.projects}"> projects`;
    } else if (t.kind === "poisson") {
      html += ` &middot; <input id="rps" class="num" value="${t.requests_per_second}"> requests/s`;
    }
    $("traffic").innerHTML = html;
    const table = $("providers");
    table.querySelectorAll("tr.p").forEach((r) => r.remove());
    for (const p of sc.providers) {
      const tr = document.createElement("tr");
      tr.className = "p";
      tr.setAttribute("data-provider", p.name);
      tr.innerHTML = `<td>${SY.escapeHtml(p.name)}</td>
        <td><input class="num rpm" value="${p.rpm === null ? "" : p.rpm}" placeholder="${p.rpm_text || "unlimited"}"></td>
        <td><input class="num itpm" value="${p.itpm === null ? "" : p.itpm}" placeholder="${p.itpm_text || "unlimited"}"></td>
        <td><input class="out" value="${fmtOutages(p.outages)}"></td>`;
      table.appendChild(tr);
    }
  }

  function request() {
    const sc = scenarios.find((s) => s.name === $("scenario").value);
    const num = (v) => (v === "" ? null : Number(v));
    const body = { scenario: sc.name, duration_s: Math.round(Number($("duration").value) * 60),
      traffic: {}, providers: [], strategies: [] };
    if ($("spm")) body.traffic.sessions_per_minute = Number($("spm").value);
    if ($("projects")) body.traffic.projects = Number($("projects").value);
    if ($("rps")) body.traffic.requests_per_second = Number($("rps").value);
    for (const tr of $("providers").querySelectorAll("tr.p")) {
      body.providers.push({ name: tr.getAttribute("data-provider"),
        rpm: num(tr.querySelector(".rpm").value), itpm: num(tr.querySelector(".itpm").value),
        outages: parseOutages(tr.querySelector(".out").value) });
    }
    for (const s of STRATEGIES) if ($("s-" + s).checked) body.strategies.push(s);
    return body;
  }

  async function run() {
    $("error").textContent = "";
    let body;
    try { body = request(); } catch (e) { $("error").textContent = String(e.message || e); return; }
    $("run").disabled = true;
    $("status").textContent = "running…";
    try {
      const r = await fetch("/ui/run", { method: "POST", headers: { "content-type": "application/json" },
        body: JSON.stringify(body) });
      const doc = await r.json();
      if (!r.ok) throw new Error(doc.error ? doc.error.message : `run answered ${r.status}`);
      result = doc;
      $("status").textContent = `done: ${doc.runs.length} strategies, ${doc.runs[0] ? doc.runs[0].intervals.length : 0} intervals`;
      render();
    } catch (e) {
      $("error").textContent = String(e.message || e);
      $("status").textContent = "";
    } finally {
      $("run").disabled = false;
    }
  }

  function render() {
    const pct = (v) => (100 * v).toFixed(2) + " %";
    $("summary").innerHTML = `<table><tr><th>strategy</th><th>requests</th><th>client errors</th>
      <th>affinity retention</th><th>uncached input tokens</th><th>429s</th><th>p50 / p95 / p99 ms</th></tr>` +
      result.runs.map((r) => `<tr data-strategy="${r.strategy}"><td>${r.strategy}</td><td>${r.summary.requests}</td>
      <td>${r.summary.client_errors} (${pct(r.summary.client_error_rate)})</td><td>${pct(r.summary.affinity_retention)}</td>
      <td>${SY.fmt(r.summary.uncached_tokens)}</td><td>${r.summary.rate_limited}</td>
      <td>${Math.round(r.summary.p50_ms)} / ${Math.round(r.summary.p95_ms)} / ${Math.round(r.summary.p99_ms)}</td></tr>`).join("") + "</table>";
    const xFormat = SY.minutes;
    const compare = $("compare");
    compare.innerHTML = "";
    const panel = (parent) => { const d = document.createElement("div"); parent.appendChild(d); return d; };
    const over = (f) => result.runs.map((r) => ({ name: r.strategy, points: r.intervals.map((i) => [i.t_s, f(i)]) }));
    SY.lineChart(panel(compare), { title: "client error rate", series: over((i) => i.requests ? i.client_errors / i.requests : 0), yMin: 0, xFormat });
    SY.lineChart(panel(compare), { title: "affinity retention", series: over((i) => i.affinity), yMin: 0, yMax: 1, xFormat });
    SY.lineChart(panel(compare), { title: "client p95 latency, ms", series: over((i) => i.p95_ms), yMin: 0, xFormat });
    const pick = $("pick");
    const keep = pick.value;
    pick.innerHTML = result.runs.map((r) => `<option>${r.strategy}</option>`).join("");
    if (result.runs.some((r) => r.strategy === keep)) pick.value = keep;
    renderDetail();
  }

  function renderDetail() {
    const run = result.runs.find((r) => r.strategy === $("pick").value) || result.runs[0];
    const detail = $("detail");
    detail.innerHTML = "";
    detail.setAttribute("data-points", run.intervals.length);
    detail.setAttribute("data-strategy", run.strategy);
    const panel = () => { const d = document.createElement("div"); detail.appendChild(d); return d; };
    const xFormat = SY.minutes;
    const per = (f) => result.providers.map((n, k) => ({ name: n, points: run.intervals.map((i) => [i.t_s, f(i.providers[k])]) }));
    if (run.intervals.some((i) => i.providers.some((p) => p.availability !== null))) {
      SY.lineChart(panel(), { title: `availability (${run.strategy})`, series: per((p) => p.availability), yMin: 0, yMax: 1, xFormat });
      SY.lineChart(panel(), { title: `weight (${run.strategy})`, series: per((p) => p.weight), yMin: 0, yMax: 1, xFormat });
    }
    SY.lineChart(panel(), { title: "traffic share (where chains lead)", series: per((p) => p.share), yMin: 0, yMax: 1, xFormat });
    SY.lineChart(panel(), { title: "provider errors + 429s per interval", series: per((p) => p.errors + p.rate_limited), yMin: 0, xFormat });
    SY.lineChart(panel(), { title: "stickiness: affinity retention", series: [{ name: "affinity", points: run.intervals.map((i) => [i.t_s, i.affinity]) }], yMin: 0, yMax: 1, xFormat });
    SY.lineChart(panel(), { title: "client latency, ms", series: [
      { name: "p50", points: run.intervals.map((i) => [i.t_s, i.p50_ms]) },
      { name: "p95", points: run.intervals.map((i) => [i.t_s, i.p95_ms]) }], yMin: 0, xFormat });
    SY.lineChart(panel(), { title: "client errors per interval", series: [{ name: "client errors", points: run.intervals.map((i) => [i.t_s, i.client_errors]) }], yMin: 0, xFormat });
  }

  async function start() {
    $("strategies").innerHTML = STRATEGIES.map((s) => `<label><input type="checkbox" id="s-${s}" checked> ${s}</label> `).join("");
    const r = await fetch("/ui/scenarios");
    scenarios = await r.json();
    $("scenario").innerHTML = scenarios.map((s) => `<option>${SY.escapeHtml(s.name)}</option>`).join("");
    const wanted = params.get("scenario");
    if (wanted && scenarios.some((s) => s.name === wanted)) $("scenario").value = wanted;
    showScenario(scenarios.find((s) => s.name === $("scenario").value));
    if (params.get("minutes")) $("duration").value = params.get("minutes");
    $("scenario").addEventListener("change", () => showScenario(scenarios.find((s) => s.name === $("scenario").value)));
    $("run").addEventListener("click", run);
    $("pick").addEventListener("change", renderDetail);
    if (params.get("run") === "1") run();
  }
  start().catch((e) => { $("error").textContent = String(e); });
})();
