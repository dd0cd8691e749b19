// The operator page: a thin client of the admin handler's JSON endpoints.
// Every number it shows is one they serve. Data is written with
// textContent only: client keys come from clients.
"use strict";

const REFRESH_MS = 5000;
const state = { csrf: "", hashed: false, rules: [], timer: 0, busy: false };
const $ = (id) => document.getElementById(id);

// el makes an element with attributes and children (strings become text).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(e.dataset, v);
    else if (v !== undefined && v !== null && v !== false) e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  return e;
}

async function api(method, path, body) {
  const opts = { method, credentials: "same-origin", headers: { Accept: "application/json" } };
  if (method !== "GET") opts.headers["X-CSRF-Token"] = state.csrf;
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const res = await fetch(path, opts);
  let data = null;
  try { data = await res.json(); } catch (_) { /* not JSON */ }
  if (!res.ok) {
    const err = new Error((data && data.error) || res.status + " " + res.statusText);
    err.status = res.status;
    throw err;
  }
  return data;
}

// clientQuery names a client in a query: by key, or by hash when the
// handler shows hashes.
function clientQuery(rule, key) {
  const q = new URLSearchParams();
  if (rule) q.set("rule", rule);
  q.set(state.hashed ? "hash" : "key", key);
  return q.toString();
}

function ago(iso) {
  const s = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  if (s < 60) return s + " s ago";
  if (s < 3600) return Math.floor(s / 60) + " min ago";
  return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min ago";
}

function duration(s) {
  if (s < 0) return "never";
  if (s < 90) return s + " s";
  if (s < 5400) return Math.round(s / 60) + " min";
  return (s / 3600).toFixed(1) + " h";
}

function setStatus(text) { $("status").textContent = text; }

// ---- sign-in ---------------------------------------------------------------

async function checkSession() {
  const s = await api("GET", "session");
  state.hashed = s.hashed_keys;
  if (s.signed_in) {
    state.csrf = s.csrf || "";
    showApp(true);
  } else {
    showApp(false);
  }
}

function showApp(on) {
  $("app").hidden = !on;
  $("signin").hidden = on;
  $("signout").hidden = !on || !state.csrf;
  clearInterval(state.timer);
  if (on) {
    refresh();
    state.timer = setInterval(refresh, REFRESH_MS);
  } else {
    setStatus("");
    $("token").focus();
  }
}

$("signin-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  $("signin-error").textContent = "";
  try {
    const s = await api("POST", "session", { token: $("token").value });
    $("token").value = "";
    state.csrf = s.csrf || "";
    state.hashed = s.hashed_keys;
    showApp(true);
  } catch (e) {
    $("signin-error").textContent = e.status === 403 ? "That token is not accepted." : e.message;
  }
});

$("signout").addEventListener("click", async () => {
  try { await api("DELETE", "session"); } catch (_) { /* signed out anyway */ }
  state.csrf = "";
  showApp(false);
});

// ---- refresh ---------------------------------------------------------------

async function refresh() {
  if (state.busy) return;
  state.busy = true;
  try {
    const rules = await api("GET", "rules");
    state.rules = rules.rules || [];
    fillRuleSelects();
    const results = await Promise.allSettled([
      api("GET", "rates").then(renderRates),
      refreshTop(),
      api("GET", "bans?limit=200").then(renderBans),
      api("GET", "overrides").then(renderOverrides),
      api("GET", "health").then(renderHealth),
    ]);
    const failed = results.filter((r) => r.status === "rejected");
    if (failed.some((r) => r.reason && r.reason.status === 403)) {
      showApp(false);
      return;
    }
    setStatus((failed.length ? failed[0].reason.message + " · " : "") + "updated " + new Date().toLocaleTimeString());
  } catch (e) {
    if (e.status === 403) showApp(false);
    else setStatus("cannot reach the server: " + e.message);
  } finally {
    state.busy = false;
  }
}

function canBan(ruleName) {
  const r = state.rules.find((x) => x.name === ruleName);
  return !!r && (r.limits || []).some((l) => l.ban);
}

function fillRuleSelects() {
  const names = state.rules.map((r) => r.name);
  for (const id of ["top-rule", "ov-rule"]) {
    const sel = $(id);
    const cur = sel.value;
    const have = Array.from(sel.options).map((o) => o.value);
    if (have.join("\n") === names.join("\n")) continue;
    sel.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
    if (names.includes(cur)) sel.value = cur;
  }
}

// ---- rates -----------------------------------------------------------------

function renderRates(data) {
  const box = $("rates");
  const secs = (data.interval_ms || 10000) / 1000;
  const busy = (rr) => (rr.points || []).some((p) => p.allowed || p.denied);
  const quiet = (data.rules || []).filter((rr) => !busy(rr)).map((rr) => rr.rule);
  $("rates-quiet").textContent = quiet.length ? "No request in 15 minutes: " + quiet.join(", ") : "";
  const charts = (data.rules || []).filter(busy).map((rr) => {
    const pts = rr.points || [];
    const max = Math.max(1, ...pts.map((p) => Math.max(p.allowed, p.denied)));
    const w = 300, h = 40;
    const line = (f) => pts.map((p, i) => (i * w / Math.max(1, pts.length - 1)).toFixed(1) + "," + (h - 2 - (f(p) / max) * (h - 4)).toFixed(1)).join(" ");
    const s = svg("svg", { viewBox: `0 0 ${w} ${h}`, preserveAspectRatio: "none", role: "img",
      "aria-label": `${rr.rule}: allowed and denied requests over 15 minutes` });
    s.append(svg("line", { x1: 0, y1: h - 1, x2: w, y2: h - 1, class: "axis" }));
    if (pts.some((p) => p.allowed)) s.append(svg("polyline", { points: line((p) => p.allowed), class: "allowed" }));
    if (pts.some((p) => p.denied)) s.append(svg("polyline", { points: line((p) => p.denied), class: "denied" }));
    // The last complete interval, as rates per second.
    const last = pts.length > 1 ? pts[pts.length - 2] : { allowed: 0, denied: 0 };
    return el("div", { class: "chart", dataset: { rule: rr.rule } },
      el("h3", {}, rr.rule),
      s,
      el("div", { class: "now" },
        el("span", { class: "key-allowed" }, (last.allowed / secs).toFixed(1)), " allowed/s · ",
        el("span", { class: "key-denied" }, (last.denied / secs).toFixed(1)), " denied/s",
        el("span", { class: "muted" }, ` · peak ${(max / secs).toFixed(1)}/s`)));
  });
  box.replaceChildren(...charts);
}

// ---- top clients -----------------------------------------------------------

async function refreshTop() {
  const rule = $("top-rule").value;
  if (!rule) return;
  const q = new URLSearchParams({ rule, by: $("top-by").value, period: $("top-period").value });
  renderTop(await api("GET", "top?" + q));
}

function renderTop(t) {
  const meta = [`${t.total} units ${t.by} in all`, `error ≤ ${t.error_bound} (k = ${t.k})`,
    `${t.servers} server${t.servers === 1 ? "" : "s"} answered`];
  if (t.servers > 1) meta.push(`oldest summary ${(t.lag_ms / 1000).toFixed(1)} s old`);
  if (t.threshold > 1) meta.push(`estimated from ${t.samples} sampled events (threshold ${t.threshold}); a count's title gives its 99 % range`);
  if (t.dropped) meta.push(`${t.dropped} units uncounted (overload)`);
  if (t.fleet_error) meta.push(t.fleet_error);
  $("top-meta").textContent = meta.join(" · ");
  const rows = (t.clients || []).map((c) => {
    const actions = el("td", { class: "actions" },
      el("a", { href: "limits?" + clientQuery(t.rule, c.key), class: "peek-link",
        onclick: (ev) => { ev.preventDefault(); peek(t.rule, c.key); } }, "peek"));
    if (canBan(t.rule) && !c.banned) {
      actions.append(el("button", { type: "button", class: "danger", onclick: () => act("POST", "bans?" + clientQuery(t.rule, c.key)) }, "ban"));
    }
    actions.append(el("button", { type: "button", class: "quiet", onclick: () => prefillOverride(t.rule, c.key) }, "override"));
    return el("tr", { dataset: { key: c.key } },
      el("td", {}, el("code", {}, c.key)),
      el("td", { class: "num", title: `99 %: ${c.low_99} to ${c.high_99}` }, c.count),
      el("td", { class: "num" }, c.error),
      el("td", { title: c.first_seen }, ago(c.first_seen)),
      el("td", {},
        c.banned ? el("span", { class: "badge banned", title: "until " + c.ban_until }, "banned") : null,
        c.overridden ? el("span", { class: "badge overridden" }, "override") : null),
      actions);
  });
  $("top").tBodies[0].replaceChildren(...rows);
  $("top-empty").hidden = rows.length > 0;
}

for (const id of ["top-rule", "top-by", "top-period"]) {
  $(id).addEventListener("change", () => refreshTop().catch((e) => setStatus(e.message)));
}

async function peek(rule, key) {
  const data = await api("GET", "limits?" + clientQuery(rule, key)).catch((e) => ({ error: e.message }));
  $("peek").hidden = false;
  $("peek-key").textContent = key;
  $("peek-rule").textContent = rule;
  const rows = (data.limits || []).map((l) => el("tr", {},
    el("td", {}, l.policy),
    el("td", {}, `${l.limit.requests} per ${l.limit.window} (${l.limit.algorithm})`),
    el("td", { class: "num" }, l.remaining),
    el("td", { class: "num" }, duration(Math.ceil(l.reset_after_ms / 1000)))));
  if (data.error) rows.push(el("tr", {}, el("td", { colspan: 4, class: "error" }, data.error)));
  $("peek-table").tBodies[0].replaceChildren(...rows);
}
$("peek-close").addEventListener("click", () => { $("peek").hidden = true; });

// act sends a request that changes state, then refreshes.
async function act(method, path, body) {
  try {
    await api(method, path, body);
  } catch (e) {
    setStatus(e.message);
    throw e;
  } finally {
    refresh();
  }
}

// ---- bans ------------------------------------------------------------------

function renderBans(data) {
  const rows = (data.bans || []).map((b) => el("tr", { dataset: { rule: b.rule, key: b.key } },
    el("td", {}, b.rule),
    el("td", {}, el("code", {}, b.key)),
    el("td", { class: "num", title: b.until }, duration(b.seconds_left)),
    el("td", { class: "actions" },
      el("button", { type: "button", class: "lift", onclick: () => act("DELETE", "bans?" + clientQuery(b.rule, b.key)) }, "Lift"))));
  $("bans").tBodies[0].replaceChildren(...rows);
  $("bans-empty").hidden = rows.length > 0;
  $("bans-total").textContent = data.total > rows.length ? `(${rows.length} of ${data.total})` : "";
}

// ---- overrides -------------------------------------------------------------

function renderOverrides(data) {
  const rows = (data.overrides || []).map((o) => el("tr", { dataset: { rule: o.rule, key: o.key } },
    el("td", {}, o.rule),
    el("td", {}, el("code", {}, o.key)),
    el("td", {}, (o.limits || []).map((l) => `${l.requests}/${l.window}`).join(", ")),
    el("td", {}, o.until ? new Date(o.until).toLocaleString() : "—"),
    el("td", { class: "actions" },
      el("button", { type: "button", class: "danger", onclick: () => act("DELETE", "overrides?" + clientQuery(o.rule, o.key)) }, "Remove"))));
  $("overrides").tBodies[0].replaceChildren(...rows);
  $("overrides-empty").hidden = rows.length > 0;
  const limits = (ls) => (ls || []).map((l) => `${l.requests}/${l.window}`).join(", ");
  const learned = (data.learned || []).map((l) => el("tr", { dataset: { rule: l.rule, key: l.key } },
    el("td", {}, l.rule),
    el("td", {}, el("code", {}, l.key)),
    el("td", {}, `${limits(l.limits)} ${l.unit}`, l.pace ? el("div", { class: "muted small" }, `paced ${l.pace.requests}/${l.pace.window}, burst ${l.pace.burst}`) : null),
    el("td", {}, limits(l.configured)),
    el("td", {}, (l.quotas || []).map((q) => `${q.units}${q.window ? "/" + q.window : ""} less ${q.margin}`).join(", ") || "—",
      l.quotas && l.quotas.length ? el("div", { class: "muted small" }, `answers spread over ${l.spread_ms.toFixed(1)} ms`) : null),
    el("td", { class: "num" }, l.fraction.toFixed(3)),
    el("td", { class: "num" }, String(l.cuts), l.cut_at ? el("div", { class: "muted small" }, "last " + ago(l.cut_at)) : null)));
  $("learned").tBodies[0].replaceChildren(...learned);
  $("learned-part").hidden = learned.length === 0;
}

function prefillOverride(rule, key) {
  $("ov-rule").value = rule;
  $("ov-key").value = key;
  $("ov-requests").focus();
}

$("override-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  $("override-error").textContent = "";
  const body = { limits: [{ requests: Number($("ov-requests").value), window: $("ov-window").value }] };
  if ($("ov-ttl").value) body.ttl = $("ov-ttl").value;
  try {
    await act("PUT", "overrides?" + clientQuery($("ov-rule").value, $("ov-key").value), body);
  } catch (e) {
    $("override-error").textContent = e.message;
  }
});

// ---- health ----------------------------------------------------------------

function renderHealth(h) {
  const items = [];
  const add = (term, ...desc) => items.push(el("dt", {}, term), el("dd", {}, ...desc));
  add("Store", h.store);
  add("Circuit breaker", el("span", { class: "badge " + (h.breaker_open ? "open" : "closed") }, h.breaker_open ? "open: store bypassed" : "closed"));
  if ((h.servers || []).length) {
    add("Redis servers", ...h.servers.map((s) => el("div", {},
      el("span", { class: "badge " + (s.up ? "up" : "down") }, s.up ? "up" : "down"),
      s.out_of_memory ? el("span", { class: "badge down", title: "the server refuses writes (OOM): requests that would write go to the failure policy" }, "out of memory") : null,
      s.may_evict ? el("span", { class: "badge warn", title: `maxmemory-policy ${s.maxmemory_policy}: the server may evict rate-limit counters; set noeviction` }, "may evict counters") : null,
      " ", el("code", {}, s.server),
      s.evicted_keys > 0 ? el("span", { class: "muted small" }, ` ${s.evicted_keys} keys evicted`) : null,
      s.error ? el("span", { class: "muted small" }, " " + s.error) : null)));
  } else if (h.store !== "memory") {
    add("Redis servers", el("span", { class: "muted" }, "none used yet"));
  }
  if (h.sync) {
    add("Fleet sync", `last run ${(h.sync.age_ms / 1000).toFixed(1)} s ago, ${h.sync.calls} calls in ${h.sync.duration_ms} ms`,
      h.sync.error ? el("div", { class: "error" }, h.sync.error) : null);
  }
  if ((h.regions || []).length) {
    add("Region peers", ...h.regions.map((p) => el("div", {},
      el("span", { class: "badge " + (p.reachable ? (p.failing ? "warn" : "up") : "down") }, p.reachable ? (p.failing ? "failing" : "reachable") : "unreachable"),
      " ", p.peer, el("span", { class: "muted small" }, ` synced ${(p.lag_ms / 1000).toFixed(1)} s ago`))));
  }
  if (h.top && h.top.server) {
    add("Top clients", `published as ${h.top.server}`,
      h.top.published ? ` ${(h.top.age_ms / 1000).toFixed(1)} s ago` : " (not yet)",
      h.top.error ? el("div", { class: "error" }, h.top.error) : null);
  }
  $("health").replaceChildren(...items);
}

checkSession().catch((e) => setStatus("cannot reach the server: " + e.message));
