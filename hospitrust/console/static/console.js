// hospitrust console: follows run directories through the console's JSON API (or, in a static
// report, through the data embedded in the page). No framework, no network beyond this server.
"use strict";

const REPORT = window.HOSPITRUST_REPORT || null;  // set by `hospitrust report`: everything embedded
const POLL_MS = 400;  // a new round shows within about half a second
const METRIC_LABELS = {
  balanced_accuracy: "balanced accuracy", auc: "AUC", accuracy: "accuracy", worst_class_recall: "worst-class recall",
  macro_f1: "macro-F1", rare_class_macro_f1: "rare-class macro-F1", attack_success_rate: "attack success",
  hospital_mean_accuracy: "hospitals' mean accuracy (federated)",
};

function api(path, params) {
  if (REPORT) return Promise.resolve(reportApi(path, params));
  const query = new URLSearchParams(params || {}).toString();
  return fetch(path + (query ? "?" + query : ""), { credentials: "same-origin" }).then((r) => {
    if (!r.ok) throw new Error(r.status + " " + r.statusText);
    return r.json();
  });
}

function reportApi(path, params) {
  if (path === "api/runs") return { root: REPORT.root, runs: REPORT.runs };
  if (path === "api/state") return REPORT.states[params.run];
  if (path === "api/round") return REPORT.rounds[params.run][params.round];
  throw new Error("no " + path);
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c.nodeType ? c : document.createTextNode(String(c)));
  return node;
}

function fmt(x, digits) {
  if (x === null || x === undefined || Number.isNaN(x)) return "-";
  return typeof x === "number" ? x.toFixed(digits === undefined ? 3 : digits) : String(x);
}

function badge(status) { return el("span", { class: "badge status-" + status.replace(" ", "-"), text: status }); }

// distinct colours for many hospitals: a qualitative palette, then hues spread by the golden angle
const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f",
  "#bcbd22", "#393b79", "#ad494a", "#637939", "#e6550d", "#7b4173", "#3182bd"];
function colour(i) { return i < PALETTE.length ? PALETTE[i] : `hsl(${(i * 137.508) % 360}, 62%, 45%)`; }

let timer = null;
function schedule(fn) { clearTimeout(timer); if (!REPORT) timer = setTimeout(fn, POLL_MS); }
function setLive(on) { const l = document.getElementById("live"); l.className = "live " + (on ? "on" : "off"); l.textContent = REPORT ? "static report" : (on ? "live" : "disconnected"); }

// ---------------------------------------------------------------- run list
function runList() {
  const app = document.getElementById("app");
  document.getElementById("where").textContent = "runs";
  api("api/runs").then((data) => {
    setLive(true);
    if (data.runs.length === 1 && !location.hash) { location.hash = "#/run/" + encodeURIComponent(data.runs[0].id); return; }
    const table = el("table", { id: "runs" },
      el("tr", {}, ...["run", "status", "strategy", "task", "attack", "hospitals", "rounds", "balanced accuracy"].map((h) => el("th", { text: h }))));
    for (const r of data.runs) {
      const status = r.status + (r.resumed_at && r.resumed_at.length ? " (resumed)" : "");
      table.append(el("tr", { "data-run": r.id },
        el("td", {}, el("a", { href: "#/run/" + encodeURIComponent(r.id), text: r.name })),
        el("td", {}, badge(r.status), r.resumed_at && r.resumed_at.length ? " resumed after " + r.resumed_at.join(", ") : "",
          r.failure ? el("div", { class: "reason", text: r.failure }) : null),
        el("td", { text: r.strategy }), el("td", { text: r.task }), el("td", { text: r.attack }),
        el("td", { class: "num", text: r.hospitals }),
        el("td", { class: "num", text: r.rounds_done + (r.rounds_total ? " / " + r.rounds_total : "") }),
        el("td", { class: "num", text: fmt(r.balanced_accuracy) })));
      void status;
    }
    app.replaceChildren(el("h1", { text: data.root }), table);
    schedule(route);
  }).catch(() => { setLive(false); schedule(route); });
}

// ---------------------------------------------------------------- one run
const view = { id: null, state: null, round: null, follow: true, plots: {} };

function runView(id) {
  if (view.id !== id) {
    Object.assign(view, { id, state: null, round: null, follow: true, plots: {} });
    document.getElementById("app").replaceChildren(skeleton());
  }
  const since = view.state ? view.state.rounds : 0;
  api("api/state", { run: id, since }).then((delta) => {
    setLive(true);
    merge(delta);
    drawHeader();
    drawPlots();
    drawAlerts(delta.alerts, since === 0);
    drawInFlight(delta.in_flight);
    const latest = view.state.rounds;
    if (latest && (view.follow || view.round === null)) view.round = latest;
    drawRoundControls();
    if (view.round && (delta.rounds !== since || since === 0 || !document.getElementById("hospitals").dataset.round)) loadRound(view.round);
    schedule(route);
  }).catch((err) => { setLive(false); document.getElementById("where").textContent = String(err); schedule(route); });
}

function skeleton() {
  return el("div", {},
    el("div", { id: "run-head" }),
    el("div", { class: "panel", id: "in-flight" }),
    el("div", { class: "grid" },
      el("div", {},
        el("div", { class: "panel" }, el("h2", { text: "metrics per round" }), el("div", { id: "metrics-plot" })),
        el("div", { class: "panel" }, el("h2", { id: "trust-title", text: "trust per hospital" }), el("div", { id: "trust-plot" }),
          el("div", { id: "trust-legend", class: "reason" }))),
      el("div", { class: "panel" }, el("h2", { text: "alerts" }), el("div", { id: "alerts" }))),
    el("div", { class: "controls", id: "round-controls" }),
    el("table", { id: "hospitals" }));
}

// the round the ServerApp is waiting on (progress.jsonl): asked, replied, refused and why, waiting, late
function drawInFlight(f) {
  const box = document.getElementById("in-flight");
  if (!f) { box.replaceChildren(); box.style.display = "none"; box.dataset.round = ""; return; }
  box.style.display = "";
  box.dataset.round = f.round;
  const item = (h, cls, text) => el("span", { class: cls, "data-hospital": h, style: "margin-right:12px" }, text);
  box.replaceChildren(
    el("h2", { text: "round " + f.round + " in progress: " + f.replied.length + " of " + f.asked.length + " replied, waiting "
      + f.waited_seconds + " s of " + f.reply_timeout + " s" }),
    el("div", {},
      ...f.replied.map((h) => item(h, "replied", h + " replied")),
      ...Object.entries(f.errors).map(([h, why]) => item(h, "flag refused", h + ": " + why)),
      ...Object.entries(f.unavailable || {}).map(([h, why]) => item(h, "flag unavailable", h + ": " + why)),
      ...f.waiting.map((h) => f.late.includes(h) ? item(h, "flag late", h + " late") : item(h, "waiting", h + " waiting"))));
}

function merge(delta) {
  if (!view.state || delta.since === 0) { view.state = JSON.parse(JSON.stringify(delta)); view.state.allAlerts = delta.alerts.slice(); return; }
  const s = view.state;
  for (const [k, v] of Object.entries(delta.series)) s.series[k] = (s.series[k] || []).concat(v);
  for (const [h, v] of Object.entries(delta.trust.values)) s.trust.values[h] = (s.trust.values[h] || new Array(s.rounds).fill(null)).concat(v);
  for (const [h, m] of Object.entries(delta.trust.marks)) s.trust.marks[h] = (s.trust.marks[h] || []).concat(m);
  s.trust.signal = delta.trust.signal;
  s.allAlerts = s.allAlerts.concat(delta.alerts.filter((a) => a.kind !== "run-failed" || !s.allAlerts.some((b) => b.kind === "run-failed")));
  s.rounds = delta.rounds; s.run = delta.run; s.hospitals = delta.hospitals; s.summary = delta.summary;
}

function drawHeader() {
  const s = view.state, r = s.run;
  document.getElementById("where").textContent = r.name;
  const head = document.getElementById("run-head");
  const final = s.summary && s.summary.final;
  head.replaceChildren(
    el("h1", {}, r.name + " ", badge(r.status), r.resumed_at && r.resumed_at.length ? " resumed after round " + r.resumed_at.join(", ") : ""),
    el("div", { class: "meta" },
      "strategy ", el("b", { text: r.strategy }), " · task ", el("b", { text: r.task }), " · attack ", el("b", { text: r.attack }),
      " · hospitals ", el("b", { text: r.hospitals }), r.left_out && r.left_out.length ? el("span", { class: "flag", text: " + " + r.left_out.length + " left out" }) : null, " · rounds ", el("b", { id: "rounds-done", text: r.rounds_done + (r.rounds_total ? " / " + r.rounds_total : "") }),
      final ? el("span", {}, " · final balanced accuracy ", el("b", { text: fmt(final.balanced_accuracy) }), ", AUC ", el("b", { text: fmt(final.auc) })) : null,
      r.privacy && r.privacy !== "off" ? el("span", {}, " · privacy ", el("b", { text: r.privacy }), privacyText(s.summary && s.summary.privacy)) : null,
      r.failure ? el("div", { class: "flag", text: (r.status === "stopped" ? "" : "failed: ") + r.failure }) : null));
}

// summary.json's privacy: the largest local epsilon a hospital reported, the central one, who ran out of budget
function privacyText(p) {
  if (!p) return "";
  const parts = [];
  if (p.max_local_epsilon !== undefined) parts.push("local ε ≤ " + fmt(p.max_local_epsilon));
  if (p.central) parts.push("central ε " + fmt(p.central.epsilon));
  if (p.delta !== undefined) parts.push("δ " + p.delta);
  if (p.budget_spent && p.budget_spent.length) parts.push("budget spent: " + p.budget_spent.join(", "));
  return parts.length ? " (" + parts.join(", ") + ")" : "";
}

// the simulated attackers, where the run recorded them (rows of the shown round, or the summary)
function attacker(h) {
  const s = view.state;
  if (!s || !s.ground_truth) return false;
  if (s.summary && s.summary.malicious_hospitals) return s.summary.malicious_hospitals.includes(h);
  return (view.attackers || new Set()).has(h);
}

function plotWidth(node) { return Math.max(320, (node.clientWidth || 700) - 10); }

function drawPlots() {
  const s = view.state;
  const rounds = s.series.round || [];
  const metricKeys = Object.keys(s.series).filter((k) => k !== "round");
  const metricData = [rounds, ...metricKeys.map((k) => s.series[k])];
  const mNode = document.getElementById("metrics-plot");
  if (!view.plots.metrics || view.plots.metricKeys !== metricKeys.join()) {
    mNode.replaceChildren();
    view.plots.metricKeys = metricKeys.join();
    view.plots.metrics = new uPlot({
      width: plotWidth(mNode), height: 260, scales: { x: { time: false }, y: { range: [0, 1] } },
      axes: [{ label: "round", incrs: [1, 2, 5, 10, 20, 50, 100], values: (u, v) => v.map((x) => Number.isInteger(x) ? x : "") }, {}],
      series: [{ label: "round" }, ...metricKeys.map((k, i) => ({ label: METRIC_LABELS[k] || k, stroke: colour(i), width: 2, show: i < 3 || k === "hospital_mean_accuracy" }))],
    }, metricData, mNode);
  } else view.plots.metrics.setData(metricData);

  const hospitals = s.hospitals;
  const trustData = [rounds, ...hospitals.map((h) => (s.trust.values[h] || []).slice(0, rounds.length))];
  const tNode = document.getElementById("trust-plot");
  document.getElementById("trust-title").textContent = s.trust.signal.replace("_", " ") + " per hospital";
  if (!view.plots.trust || view.plots.trustKeys !== hospitals.join()) {
    tNode.replaceChildren();
    view.plots.trustKeys = hospitals.join();
    view.plots.trust = new uPlot({
      width: plotWidth(tNode), height: 240, legend: { show: false }, scales: { x: { time: false } },
      axes: [{ label: "round", incrs: [1, 2, 5, 10, 20, 50, 100], values: (u, v) => v.map((x) => Number.isInteger(x) ? x : "") }, {}],
      series: [{}, ...hospitals.map((h, i) => ({ label: h, stroke: colour(i), width: attacker(h) ? 3 : 1.5,
        dash: attacker(h) ? [6, 4] : undefined, spanGaps: false }))],
    }, trustData, tNode);
  } else view.plots.trust.setData(trustData);
  const legend = document.getElementById("trust-legend");
  legend.replaceChildren(...hospitals.map((h, i) => el("span", { style: `color:${colour(i)};margin-right:10px;white-space:nowrap` },
    (attacker(h) ? "▬ ▬ " : "■ ") + h + (attacker(h) ? " (attacker)" : ""))));
}

function drawAlerts(fresh, reset) {
  const box = document.getElementById("alerts");
  const all = view.state.allAlerts;
  if (reset) box.replaceChildren();
  const shown = reset ? all : fresh;
  for (const a of shown.slice().reverse()) {
    box.prepend(el("div", { "data-kind": a.kind }, el("span", { class: "kind kind-" + a.kind, text: a.kind }), a.text));
  }
  if (!all.length) box.replaceChildren(el("div", { class: "reason", text: "no alerts" }));
  else { const none = box.querySelector(".reason"); if (none && none.textContent === "no alerts") none.remove(); }
}

function drawRoundControls() {
  const box = document.getElementById("round-controls");
  const n = view.state.rounds;
  if (!n) { box.replaceChildren(el("span", { class: "reason", text: "no round finished yet" })); return; }
  const slider = el("input", { type: "range", min: 1, max: n, value: view.round, id: "round-slider" });
  slider.oninput = () => { view.round = Number(slider.value); view.follow = view.round === n; loadRound(view.round); };
  const follow = el("input", { type: "checkbox", checked: view.follow, id: "follow" });
  follow.onchange = () => { view.follow = follow.checked; if (view.follow) { view.round = n; loadRound(n); } };
  box.replaceChildren(el("b", { id: "round-label", text: "round " + view.round + " of " + n }), slider,
    el("label", {}, follow, " follow the latest round"));
}

function loadRound(rnd) {
  const id = view.id;
  api("api/round", { run: id, round: rnd }).then((data) => { if (view.id === id) drawHospitals(data); });
}

function drawHospitals(data) {
  const table = document.getElementById("hospitals");
  view.attackers = new Set(data.rows.filter((r) => r.malicious).map((r) => r.hospital));
  const truth = view.state.ground_truth;
  const privacy = data.rows.some((r) => r.privacy);  // local DP: each hospital's (epsilon, delta) after the round
  const head = ["hospital", "status", "why", "weight", "signals", "flags", "accuracy (own val)", "contribution (FP / EE)"];
  if (privacy) head.push("privacy ε (δ)");
  table.replaceChildren(el("tr", {}, ...head.map((h) => el("th", { text: h }))));
  table.dataset.round = data.round;
  for (const r of data.rows) {
    const flags = [];
    if (r.flagged) flags.push(el("span", { class: "flag", text: "flagged " }));
    if (r.duplicates_of && r.duplicates_of.length) flags.push(el("span", { text: "same update as " + r.duplicates_of.join(", ") }));
    const contribution = r.contribution && (r.contribution.fp !== undefined || r.contribution.ee !== undefined)
      ? fmt(r.contribution.fp) + " / " + fmt(r.contribution.ee) : "-";
    table.append(el("tr", { "data-hospital": r.hospital, class: truth && r.malicious ? "malicious" : "" },
      el("td", { text: r.hospital }),
      el("td", { class: "status" }, badge(r.status)),
      el("td", { class: "reason", text: r.reason || "" }),
      el("td", { class: "num", text: fmt(r.weight) }),
      el("td", { class: "signals" }, ...r.signals.map(([k, v]) => el("span", {}, k + " " + v))),
      el("td", {}, ...flags),
      el("td", { class: "num", text: fmt(r.accuracy) }),
      el("td", { class: "num", text: contribution }),
      ...(privacy ? [el("td", { class: "num privacy", text: r.privacy
        ? fmt(r.privacy.epsilon) + " (" + r.privacy.delta + ")" + (r.privacy.budget_spent ? " spent" : "") : "-" })] : [])));
  }
  const label = document.getElementById("round-label");
  if (label) label.textContent = "round " + data.round + " of " + view.state.rounds;
}

function route() {
  const m = location.hash.match(/^#\/run\/(.+)$/);
  if (m) runView(decodeURIComponent(m[1])); else { view.id = null; runList(); }
}

window.addEventListener("hashchange", () => { clearTimeout(timer); route(); });
window.addEventListener("load", route);
