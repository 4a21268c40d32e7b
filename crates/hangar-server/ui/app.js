// Hangar's workbench: one page over the public admin and inference APIs. No framework, no
// build step, no network beyond this server. The admin key, when the server asks for one,
// is kept in sessionStorage (this tab only).

const KEY = "hangar-admin-key";
const STATES = ["unloaded", "loading", "loaded", "unloading", "failed"];
const MIB = 1024 * 1024;

const $ = (selector, root = document) => root.querySelector(selector);
const el = (tag, attrs = {}, ...children) => {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k === "style") Object.assign(node.style, v); // CSSOM: allowed by the CSP
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) node.append(child);
  }
  return node;
};

const page = {
  rows: new Map(), // name → admin row
  order: [], // names in config order
  pending: new Set(), // names whose row is to be re-read
  refreshing: null,
};

// ---------------------------------------------------------------------------------------
// HTTP

function authHeaders(extra = {}) {
  const key = sessionStorage.getItem(KEY);
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

let asking = null;
function askKey() {
  if (!asking) {
    asking = new Promise((resolve) => {
      const dialog = $("#key-dialog");
      const form = $("#key-form");
      form.reset();
      const done = (event) => {
        event.preventDefault();
        sessionStorage.setItem(KEY, form.elements.key.value.trim());
        dialog.close();
        form.removeEventListener("submit", done);
        asking = null;
        resolve();
      };
      form.addEventListener("submit", done);
      dialog.showModal();
    });
  }
  return asking;
}

/** A JSON call: `{status, body}`; asks for the admin key once on 401 / 403. */
async function api(path, { method = "GET", body, retry = true } = {}) {
  const init = { method, headers: authHeaders(body === undefined ? {} : { "Content-Type": "application/json" }) };
  if (body !== undefined) init.body = JSON.stringify(body);
  const response = await fetch(path, init);
  if ((response.status === 401 || response.status === 403) && retry) {
    await askKey();
    return api(path, { method, body, retry: false });
  }
  const text = await response.text();
  let parsed = null;
  try {
    parsed = text ? JSON.parse(text) : null;
  } catch {
    parsed = { error: { message: text } };
  }
  return { status: response.status, body: parsed };
}

/** Reads a server-sent-event stream, calling `onOpen()` once it is answered and
 * `onEvent(data)` per event; resolves at its end. */
async function readEvents(path, onEvent, signal, onOpen) {
  const response = await fetch(path, { headers: authHeaders({ Accept: "text/event-stream" }), signal });
  if (response.status === 401 || response.status === 403) {
    await askKey();
    return readEvents(path, onEvent, signal, onOpen);
  }
  if (!response.ok || !response.body) throw new Error(`HTTP ${response.status}`);
  if (onOpen) onOpen();
  return eachEvent(response, onEvent);
}

/** Calls `onEvent(data)` for each event of a server-sent-event response body. */
async function eachEvent(response, onEvent) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, ""))
        .join("\n");
      if (data) onEvent(data);
    }
  }
}

function notice(text) {
  const box = $("#notice");
  box.textContent = text || "";
  box.hidden = !text;
}

function errorText(body, status) {
  const error = body && body.error;
  if (!error) return `HTTP ${status}`;
  if (typeof error === "string") return error;
  return `${error.code ? error.code + ": " : ""}${error.message || ""}`;
}

// ---------------------------------------------------------------------------------------
// Models

async function loadAll() {
  const { status, body } = await api("/v1/admin/models");
  if (status !== 200) {
    notice(`Cannot list models: ${errorText(body, status)}`);
    return;
  }
  notice("");
  page.rows.clear();
  page.order = body.models.map((m) => m.name);
  for (const row of body.models) page.rows.set(row.name, row);
  fillFilters();
  renderTable();
  fillModelSelects();
  readiness();
}

/** The readiness line, from the rows' `not_serving` (the reasons `GET /readyz` gives). */
function readiness() {
  const idle = page.order.map((name) => page.rows.get(name)).filter((row) => row && row.not_serving);
  const ready = !idle.some((row) => row.not_serving.holds_readiness);
  const listed = idle.map((row) => `${row.name} (${row.not_serving.reason.replaceAll("_", " ")}${row.not_serving.holds_readiness ? "" : ", not counted"})`);
  const line = $("#readiness");
  line.dataset.ready = String(ready);
  line.textContent = ready
    ? `Ready${listed.length ? `; enabled but not serving: ${listed.join(", ")}` : ": every enabled model is serving"}`
    : `Not ready: ${listed.join(", ")}`;
}

/** Re-reads the rows named in `page.pending`, at most one batch at a time. */
function refresh(name) {
  page.pending.add(name);
  if (page.refreshing) return;
  page.refreshing = (async () => {
    while (page.pending.size) {
      const names = [...page.pending];
      page.pending.clear();
      const rows = await Promise.all(names.map((n) => api(`/v1/admin/models/${encodeURIComponent(n)}`)));
      rows.forEach(({ status, body }, i) => {
        if (status === 200) {
          page.rows.set(names[i], body);
          updateRow(names[i]);
        }
      });
    }
    page.refreshing = null;
    fillModelSelects();
    readiness();
  })();
}

function fillFilters() {
  const form = $("#filters");
  const distinct = (f) => [...new Set(page.order.map((n) => f(page.rows.get(n))))].sort();
  const fill = (select, values) => {
    const keep = select.value;
    select.replaceChildren(el("option", { value: "", text: "any" }), ...values.map((v) => el("option", { value: v, text: v })));
    select.value = values.includes(keep) ? keep : "";
  };
  fill(form.elements.state, STATES);
  fill(form.elements.type, distinct((r) => r.type));
  fill(form.elements.backend, distinct((r) => r.resolved_backend));
}

function matches(row) {
  const f = $("#filters").elements;
  return (
    (!f.state.value || row.runtime_state === f.state.value) &&
    (!f.type.value || row.type === f.type.value) &&
    (!f.backend.value || row.resolved_backend === f.backend.value) &&
    (!f.name.value || row.name.includes(f.name.value.trim()))
  );
}

function vramText(row) {
  const spec =
    row.vram_estimate_mib === null || row.vram_estimate_mib === undefined
      ? `— (${row.vram_estimate_source})`
      : `${row.vram_estimate_mib} MiB for ${row.vram_estimate_replica_count} rep. (${row.vram_estimate_source})`;
  const detail = row.vram_detail;
  if (!detail || (detail.admission_mib === row.vram_estimate_mib && detail.admission_method === row.vram_estimate_source)) return spec;
  return `${spec}; admitted as ${detail.admission_mib} MiB (${detail.admission_method})`;
}

function marks(row) {
  const out = [];
  if (row.pinned) out.push(el("span", { class: "mark", title: "pinned in config", text: "pinned" }));
  if (row.leases && row.leases.length) {
    const owners = row.leases.map((l) => l.owner).join(", ");
    out.push(el("span", { class: "mark", title: `leased by ${owners}`, text: `leased ×${row.leases.length}` }));
  }
  if (row.pause) out.push(el("span", { class: "mark", title: `paused (${row.pause.cause})`, text: `paused: ${row.pause.mode}` }));
  const residency = row.residency;
  if (residency && residency.state === "asleep") {
    const since = new Date(residency.since_unix_ms).toLocaleTimeString();
    const freed = residency.gpu_freed_mib ? `; gave back ${residency.gpu_freed_mib} MiB of GPU memory, holds ${residency.gpu_held_mib} MiB` : "";
    out.push(el("span", { class: "mark", "data-residency": "asleep", title: `asleep since ${since}${freed}; a request wakes it`, text: `asleep: ${residency.level}` }));
  }
  if (row.quarantine) out.push(el("span", { class: "mark", title: `retry after ${row.quarantine.retry_after_s} s`, text: "quarantined" }));
  const idle = row.not_serving;
  if (idle) out.push(el("span", { class: "mark", "data-reason": idle.reason, title: idle.holds_readiness ? "not serving: the server is not ready" : "not serving, left out by start-up: the server is ready", text: idle.reason.replaceAll("_", " ") }));
  return out;
}

function actionButtons(row) {
  const name = row.name;
  const state = row.runtime_state;
  const act = (label, handler, enabled = true) =>
    el("button", { type: "button", "data-action": label.toLowerCase(), disabled: !enabled, onclick: handler, "aria-label": `${label} ${name}` }, label);
  return [
    act("Load", () => openLoad(name), state !== "loading" && state !== "unloading"),
    act("Unload", () => post(name, "unload"), state === "loaded" || state === "loading"),
    row.pause ? act("Continue", () => post(name, "continue"), state === "loaded") : act("Pause", () => post(name, "pause", { mode: "in_place" }), state === "loaded"),
    row.residency && row.residency.state === "asleep"
      ? act("Wake", () => post(name, "wake"), state === "loaded")
      : act("Sleep", () => post(name, "sleep"), state === "loaded" && Boolean(row.capabilities && row.capabilities.sleep_levels)),
    act("Lease", () => lease(name), state !== "unloading"),
    act("Checksum", () => checksum(name), Boolean(row.weights_path || (row.definition && row.definition.model_path))),
    act("Logs", () => showLogs(name)),
  ];
}

function rowCells(row) {
  const state = row.runtime_state;
  const stateCell = [el("span", { class: `state state-${state}`, text: state })];
  if (state === "loading" && row.load_progress !== null && row.load_progress !== undefined) {
    stateCell.push(" ", el("progress", { max: "1", value: String(row.load_progress), "aria-label": `${row.name} load progress` }));
  }
  return [
    el("th", { scope: "row", text: row.name }),
    el("td", { text: row.type }),
    el("td", { text: row.resolved_backend }),
    el("td", { text: row.configured_enabled ? "enabled" : "disabled" }),
    el("td", { class: "state-cell" }, stateCell),
    el("td", { text: `${row.loaded_replicas} / ${row.replicas}` }),
    el("td", { text: `${row.runtime_inflight} / ${row.queue_depth}` }),
    el("td", { text: vramText(row) }),
    el("td", {}, marks(row)),
    el("td", { class: "error-text", title: row.last_error || "", text: row.last_error || "" }),
    el("td", { class: "actions" }, actionButtons(row)),
  ];
}

function renderRow(row) {
  const tr = el("tr", { "data-model": row.name, "data-state": row.runtime_state }, rowCells(row));
  tr.hidden = !matches(row);
  return tr;
}

function renderTable() {
  const body = $("#models tbody");
  const fragment = document.createDocumentFragment();
  for (const name of page.order) fragment.append(renderRow(page.rows.get(name)));
  body.replaceChildren(fragment);
  countShown();
}

function updateRow(name) {
  const old = $(`#models tbody tr[data-model="${CSS.escape(name)}"]`);
  const fresh = renderRow(page.rows.get(name));
  if (old) {
    // Keep keyboard focus on the same action after the row is redrawn.
    const focused = old.contains(document.activeElement) ? document.activeElement.dataset.action : null;
    old.replaceWith(fresh);
    if (focused) $(`button[data-action="${focused}"]`, fresh)?.focus();
  }
  countShown();
}

function applyFilters() {
  for (const tr of $("#models tbody").children) tr.hidden = !matches(page.rows.get(tr.dataset.model));
  countShown();
}

function countShown() {
  const shown = [...$("#models tbody").children].filter((tr) => !tr.hidden).length;
  $("#model-count").textContent = `(${shown} of ${page.order.length})`;
}

async function post(name, action, body = {}) {
  const { status, body: answer } = await api(`/v1/admin/models/${encodeURIComponent(name)}/${action}`, { method: "POST", body });
  if (status >= 400) notice(`${action} ${name}: ${errorText(answer, status)}`);
  else notice("");
  refresh(name);
}

async function lease(name) {
  const { status, body } = await api(`/v1/admin/models/${encodeURIComponent(name)}/leases`, {
    method: "POST",
    body: { owner: "workbench", ttl_seconds: 3600 },
  });
  notice(status >= 400 ? `lease ${name}: ${errorText(body, status)}` : `Leased ${name} for an hour (lease ${body.id}).`);
  refresh(name);
}

async function checksum(name) {
  notice(`Checksumming ${name}…`);
  const { status, body } = await api(`/v1/admin/models/${encodeURIComponent(name)}/weights-checker`, {
    method: "POST",
    body: { action: "checksum" },
  });
  const done = () => `${name}: SHA-256 checksum ${body.digest.checksum} over ${body.digest.tensors.length} tensors (${body.elapsed_ms} ms).`;
  notice(status >= 400 ? `checksum ${name}: ${errorText(body, status)}` : done());
}

// ---------------------------------------------------------------------------------------
// The load dialog, from load_constraints and load_recommendations.

/** The effective loaded value: a key present in load_override wins, even when null. */
function effective(row, field) {
  const override = row.load_override || {};
  if (Object.prototype.hasOwnProperty.call(override, field)) return override[field];
  return row.definition ? row.definition[field] ?? null : null;
}

function describe(value, constraint) {
  if (value === null || value === undefined) {
    if (constraint && constraint.default !== undefined && constraint.default !== null) return `runtime default (${display(constraint.default, constraint)})`;
    if (constraint && constraint.null_means) return `null: ${constraint.null_means}`;
    return "runtime default";
  }
  return display(value, constraint);
}

function display(value, constraint) {
  if (constraint && constraint.unit === "bytes" && constraint.display_unit === "mib" && typeof value === "number") {
    return `${(value / MIB).toFixed(0)} MiB`;
  }
  return String(value);
}

const NULL = "__null__";

function fieldControl(field, constraint) {
  const id = `load-${field}`;
  const bytesAsMib = constraint.unit === "bytes" && constraint.display_unit === "mib";
  const number = (attrs) =>
    el("input", {
      id,
      name: field,
      type: "number",
      inputmode: "numeric",
      min: constraint.minimum !== undefined ? String(bytesAsMib ? Math.ceil(constraint.minimum / MIB) : constraint.minimum) : null,
      max: constraint.maximum !== undefined ? String(bytesAsMib ? Math.floor(constraint.maximum / MIB) : constraint.maximum) : null,
      step: constraint.step !== undefined && !bytesAsMib ? String(constraint.step) : constraint.kind === "float" ? "any" : "1",
      placeholder: describe(null, constraint),
      ...attrs,
    });
  const select = (values, withNull) =>
    el(
      "select",
      { id, name: field },
      el("option", { value: "", text: "(configured)" }),
      withNull ? el("option", { value: NULL, text: `null — ${constraint.null_means || "runtime default"}` }) : null,
      values.map((v) => el("option", { value: JSON.stringify(v), text: String(v) })),
    );
  switch (constraint.kind) {
    case "integer":
    case "float":
      return number({});
    case "integer_or_null": {
      const wrap = el("span", { class: "or-null" }, number({}), " ", el("label", {}, el("input", { type: "checkbox", name: `${field}__null` }), " null"));
      return wrap;
    }
    case "enum":
      return select(constraint.allowed_values || [], false);
    case "gpu_list":
      return gpuChoice(field, constraint);
    case "string_or_null":
      if (constraint.allowed_values && constraint.allowed_values.length) return select(constraint.allowed_values, true);
      return el("span", { class: "or-null" }, el("input", { id, name: field, type: "text", placeholder: describe(null, constraint) }), " ", el("label", {}, el("input", { type: "checkbox", name: `${field}__null` }), " null"));
    default:
      return el("input", { id, name: field, type: "text" });
  }
}

/**
 * A `gpu_list` field: a checkbox per GPU the server reads (those the definition allows), with
 * its memory free under the budget; none checked sends nothing (any allowed GPU).
 */
function gpuChoice(field, constraint) {
  const wrap = el("fieldset", { id: `load-${field}`, class: "gpu-choice", "aria-label": "GPUs this load may use" });
  const allowed = loading?.definition?.gpus;
  api("/v1/admin/gpu-memory").then(({ status, body }) => {
    const gpus = status === 200 ? body.gpus.filter((g) => !allowed || allowed.includes(g.index)) : [];
    if (!gpus.length) {
      wrap.replaceChildren(el("span", { class: "muted", text: body?.error ? `no GPUs: ${body.error}` : "no GPUs" }));
      return;
    }
    wrap.replaceChildren(
      ...gpus.map((g) => {
        const free = (g.budget_mib ?? g.total_mib) - g.used_mib;
        const box = el("input", { type: "checkbox", name: field, value: String(g.index), "data-gpu": String(g.index) });
        return el("label", {}, box, ` GPU ${g.index} · ${g.name} · ${free} MiB free`);
      }),
    );
  });
  wrap.append(el("span", { class: "muted", text: describe(null, constraint) }));
  return wrap;
}

let loading = null; // the row the dialog is for

function openLoad(name) {
  const row = page.rows.get(name);
  loading = row;
  const form = $("#load-form");
  form.reset();
  $("#load-title").textContent = `Load ${name}`;
  $("#load-state").textContent = `${row.resolved_backend} · ${row.runtime_state}` + (row.is_loaded ? " — unload it before changing replicas or overrides" : "");
  $("#load-error").textContent = "";
  const fields = $("#load-fields");
  fields.replaceChildren();
  // Replicas: bounded by replica_max.
  fields.append(
    el(
      "div",
      { class: "field", "data-field": "replicas" },
      el("label", { for: "load-replicas", text: "replicas" }),
      el("input", { id: "load-replicas", name: "replicas", type: "number", min: "1", max: String(row.replica_max), step: "1", placeholder: String(row.definition?.replicas ?? 1) }),
      el("span", { class: "effective", text: `1 – ${row.replica_max}; now ${row.replicas}` }),
      el("p", { class: "field-error", id: "error-replicas" }),
    ),
  );
  const constraints = row.load_constraints || {};
  for (const [field, constraint] of Object.entries(constraints)) {
    const unit = constraint.unit === "bytes" && constraint.display_unit === "mib" ? " (MiB)" : "";
    fields.append(
      el(
        "div",
        { class: "field", "data-field": field },
        el("label", { for: `load-${field}`, text: field + unit }),
        fieldControl(field, constraint),
        el("span", { class: "effective", text: `effective: ${describe(effective(row, field), constraint)}` }),
        el("p", { class: "field-error", id: `error-${field}` }),
      ),
    );
  }
  // Presets that fill several fields at once.
  const presets = $("#load-presets");
  presets.replaceChildren();
  for (const [id, recommendation] of Object.entries(row.load_recommendations || {})) {
    if (recommendation.kind !== "pair_presets") continue;
    // Presets only name fields the model accepts.
    if (!recommendation.fields.every((f) => f in constraints)) continue;
    for (const pair of recommendation.recommended_pairs || []) {
      presets.append(
        el("button", {
          type: "button",
          "data-preset": pair.label,
          title: (recommendation.notes || []).join(" "),
          onclick: () => {
            for (const f of recommendation.fields) setField(f, pair[f]);
          },
          text: pair.label,
        }),
      );
    }
    presets.dataset.group = id;
  }
  $("#load-dialog").showModal();
  $("#load-replicas").focus();
}

function setField(field, value) {
  const control = $("#load-form").elements[field];
  if (!control) return;
  if (control.tagName === "SELECT") control.value = value === null ? NULL : JSON.stringify(value);
  else control.value = value;
}

/** The load body: only fields the user set; `null` where asked for. */
function loadBody(row) {
  const form = $("#load-form").elements;
  const body = {};
  const replicas = form.replicas.value.trim();
  if (replicas !== "") body.replicas = Number(replicas);
  for (const [field, constraint] of Object.entries(row.load_constraints || {})) {
    if (constraint.kind === "gpu_list") {
      const checked = [...document.querySelectorAll(`#load-form input[name="${CSS.escape(field)}"]:checked`)];
      if (checked.length) body[field] = checked.map((box) => Number(box.value));
      continue;
    }
    const control = form[field];
    const isNull = form[`${field}__null`]?.checked;
    if (isNull) {
      body[field] = null;
      continue;
    }
    if (!control || control.value === "") continue;
    if (control.tagName === "SELECT") {
      body[field] = control.value === NULL ? null : JSON.parse(control.value);
    } else if (constraint.kind === "integer" || constraint.kind === "integer_or_null" || constraint.kind === "float") {
      const n = Number(control.value);
      body[field] = constraint.unit === "bytes" && constraint.display_unit === "mib" ? Math.round(n * MIB) : n;
    } else {
      body[field] = control.value;
    }
  }
  return body;
}

async function submitLoad(event) {
  event.preventDefault();
  const row = loading;
  for (const p of document.querySelectorAll("#load-form .field-error")) p.textContent = "";
  const submit = $("#load-submit");
  submit.disabled = true;
  submit.textContent = "Loading…";
  const { status, body } = await api(`/v1/admin/models/${encodeURIComponent(row.name)}/load`, { method: "POST", body: loadBody(row) });
  submit.disabled = false;
  submit.textContent = "Load";
  refresh(row.name);
  if (status < 400) {
    $("#load-dialog").close();
    notice("");
    return;
  }
  const message = errorText(body, status);
  const field = body && body.error && body.error.field;
  const slot = field && $(`#error-${CSS.escape(field)}`);
  if (slot) {
    slot.textContent = message;
    $("#load-form").elements[field]?.focus();
  } else {
    $("#load-error").textContent = message;
  }
}

// ---------------------------------------------------------------------------------------
// Live updates: the event stream, polling while it is down.

async function follow() {
  let poll = null;
  for (;;) {
    try {
      const onEvent = (data) => {
        const event = JSON.parse(data);
        if (event.type === "resync") loadAll();
        else if (event.model) refresh(event.model);
      };
      // Changes between the listing and the stream's start would be missed: re-read once
      // the stream is open.
      await readEvents("/v1/admin/events", onEvent, undefined, () => {
        setLive("live");
        loadAll();
      });
    } catch (error) {
      // Fall through to polling.
    }
    setLive("polling");
    if (!poll) poll = setInterval(() => loadAll(), 2000);
    await new Promise((resolve) => setTimeout(resolve, 5000));
    clearInterval(poll);
    poll = null;
    await loadAll();
  }
}

function setLive(how) {
  $("#live").textContent = how === "live" ? "● live" : how === "polling" ? "○ polling" : how;
  $("#live").dataset.state = how;
}

// ---------------------------------------------------------------------------------------
// GPU memory

async function showGpu() {
  const { status, body } = await api("/v1/admin/gpu-memory");
  if (status !== 200) {
    $("#gpu-error").textContent = errorText(body, status);
    return;
  }
  $("#gpu-error").textContent = body.error || "";
  $("#gpus").replaceChildren(
    ...body.gpus.map((g) => {
      const used = el("div", { class: "used", style: { width: `${(100 * g.used_mib) / g.total_mib}%` } });
      const bar = el("div", { class: "bar", role: "img", "aria-label": `GPU ${g.index}: ${g.used_over_total}` }, used);
      // Who holds what on it, in order, over the used part: each model's engine (or
      // hangard's own process, for in-process engines).
      let left = 0;
      for (const h of g.holders || []) {
        const width = (100 * h.mib) / g.total_mib;
        const who = h.model ?? "hangard (in-process engines)";
        bar.append(el("div", { class: "holder", "data-model": h.model ?? "", style: { left: `${left}%`, width: `${width}%` }, title: `${who}: ${h.mib} MiB`, text: who }));
        left += width;
      }
      if (g.budget_mib !== undefined) bar.append(el("div", { class: "budget", style: { left: `${(100 * g.budget_mib) / g.total_mib}%` }, title: `budget ${g.budget_mib} MiB` }));
      return el("div", { class: "gpu" }, el("div", { text: `GPU ${g.index} · ${g.name} · ${g.used_over_total}${g.budget_mib !== undefined ? ` · budget ${g.budget_mib}MiB` : ""}` }), bar);
    }),
  );
  $("#gpu-models tbody").replaceChildren(
    ...body.models.map((m) =>
      el(
        "tr",
        {},
        el("th", { scope: "row", text: m.name }),
        el("td", {}, el("span", { class: `state state-${m.runtime_state}`, text: m.runtime_state })),
        el("td", { text: m.vram_estimate_mib === null ? "—" : `${m.vram_estimate_mib} MiB × ${m.vram_estimate_replica_count}` }),
        el("td", { text: m.vram_estimate_source }),
        el("td", { text: m.vram_detail ? `${m.vram_detail.admission_mib} MiB (${m.vram_detail.admission_method})` : "—" }),
        el("td", { class: "placement", text: m.placement ? `GPU ${m.placement.gpus.join(", ")} (${m.placement.source})` : "—" }),
      ),
    ),
  );
}

// ---------------------------------------------------------------------------------------
// Logs

let logs = null; // AbortController of the followed log

function showLogs(name) {
  switchView("logs");
  $("#logs-model").value = name;
  startLogs();
}

async function startLogs() {
  if (logs) logs.abort();
  const form = $("#logs-form").elements;
  const name = form.model.value;
  const out = $("#log-lines");
  out.textContent = "";
  if (!name) return;
  const append = (line) => {
    out.append(`${line.timestamp} [${line.replica}] ${line.stream}: ${line.line}\n`);
    out.scrollTop = out.scrollHeight;
  };
  if (!form.follow.checked) {
    const { status, body } = await api(`/v1/admin/models/${encodeURIComponent(name)}/logs?tail=500`);
    if (status !== 200) out.textContent = errorText(body, status);
    else body.lines.forEach(append);
    return;
  }
  logs = new AbortController();
  const signal = logs.signal;
  readEvents(`/v1/admin/models/${encodeURIComponent(name)}/logs?follow=true&tail=500`, (data) => append(JSON.parse(data)), signal).catch((error) => {
    if (!signal.aborted) out.append(`(log stream ended: ${error.message})\n`);
  });
}

// ---------------------------------------------------------------------------------------
// Playground

/** The playground's conversation: its model and the turns sent so far (OpenAI messages). */
const chat = { model: null, messages: [] };

function newConversation() {
  chat.model = null;
  chat.messages = [];
  $("#play-turns").replaceChildren();
}

/** Appends one turn to the transcript; returns its text element. */
function turn(role, text) {
  const body = el("span", { class: "text", text });
  const item = el("li", { class: `turn ${role}` }, el("span", { class: "role", text: role === "user" ? "You" : chat.model }), body);
  $("#play-turns").append(item);
  return body;
}

async function play(event) {
  event.preventDefault();
  const form = $("#play-form").elements;
  const row = page.rows.get(form.model.value);
  const out = $("#play-output");
  if (!row) return;
  const text = form.text.value;
  if (row.type === "embedding") {
    out.hidden = false;
    out.textContent = "";
    const { status, body } = await api("/v1/embeddings", { method: "POST", body: { model: row.name, input: text } });
    if (status !== 200) out.textContent = errorText(body, status);
    else {
      const v = body.data[0].embedding;
      out.textContent = `${v.length} dimensions: [${v.slice(0, 8).map((x) => x.toFixed(4)).join(", ")}${v.length > 8 ? ", …" : ""}]`;
    }
    return;
  }
  out.hidden = true;
  // A conversation is with one model: another model starts a new one.
  if (chat.model !== row.name) newConversation();
  chat.model = row.name;
  chat.messages.push({ role: "user", content: text });
  turn("user", text);
  const answer = turn("assistant", "");
  const item = answer.parentElement;
  form.text.value = "";
  const request = {
    model: row.name,
    messages: chat.messages.slice(),
    max_tokens: Number(form.max_tokens.value) || 128,
    stream: true,
    stream_options: { include_usage: true },
  };
  // Blank: the engine's default sampling (docs/defaults.md).
  if (form.temperature.value !== "") request.temperature = Number(form.temperature.value);
  const failed = (message) => {
    // The refused turn leaves the conversation, so the next message continues without it.
    chat.messages.pop();
    item.classList.add("error");
    answer.textContent = message;
    item.dataset.done = "true";
  };
  let response;
  try {
    response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: authHeaders({ "Content-Type": "application/json" }),
      body: JSON.stringify(request),
    });
  } catch (error) {
    failed(error.message);
    return;
  }
  if (!response.ok) {
    failed(errorText(await response.json().catch(() => null), response.status));
    return;
  }
  let finish = null;
  let usage = null;
  let streamError = null;
  await eachEvent(response, (data) => {
    if (data === "[DONE]") return;
    const chunk = JSON.parse(data);
    if (chunk.error) streamError = errorText(chunk, 500);
    const choice = chunk.choices && chunk.choices[0];
    if (choice && choice.delta && choice.delta.content) answer.append(choice.delta.content);
    if (choice && choice.finish_reason) finish = choice.finish_reason;
    if (chunk.usage) usage = chunk.usage;
  }).catch((error) => {
    streamError = error.message;
  });
  if (streamError) {
    failed(`${answer.textContent}\n${streamError}`);
    return;
  }
  chat.messages.push({ role: "assistant", content: answer.textContent });
  const cached = usage && usage.prompt_tokens_details ? usage.prompt_tokens_details.cached_tokens : 0;
  const meta = [
    finish && `finish: ${finish}`,
    usage && `${usage.prompt_tokens} prompt tokens${cached ? ` (${cached} cached)` : ""}, ${usage.completion_tokens} completion`,
  ];
  item.append(el("span", { class: "meta", text: meta.filter(Boolean).join(" · ") }));
  item.dataset.done = "true";
}

function fillModelSelects() {
  const logsSelect = $("#logs-model");
  const keepLogs = logsSelect.value;
  logsSelect.replaceChildren(...page.order.map((n) => el("option", { value: n, text: n })));
  if (keepLogs) logsSelect.value = keepLogs;
  const playSelect = $("#play-model");
  const keepPlay = playSelect.value;
  const playable = page.order.filter((n) => {
    const r = page.rows.get(n);
    return r.is_loaded && (r.type === "llm" || r.type === "embedding");
  });
  playSelect.replaceChildren(...playable.map((n) => el("option", { value: n, text: `${n} (${page.rows.get(n).type})` })));
  if (playable.includes(keepPlay)) playSelect.value = keepPlay;
}

// ---------------------------------------------------------------------------------------
// Views and start-up

function switchView(view) {
  for (const button of document.querySelectorAll("nav button")) button.setAttribute("aria-pressed", String(button.dataset.view === view));
  for (const section of document.querySelectorAll("main > section")) section.hidden = section.id !== `view-${view}`;
  if (view === "gpu") showGpu();
}

function start() {
  for (const button of document.querySelectorAll("nav button")) button.addEventListener("click", () => switchView(button.dataset.view));
  $("#filters").addEventListener("input", applyFilters);
  $("#filters").addEventListener("submit", (e) => e.preventDefault());
  $("#load-form").addEventListener("submit", submitLoad);
  $("#load-form").addEventListener("input", (event) => {
    // A field's server error goes once the field is edited.
    const field = event.target.closest(".field");
    if (field) $(".field-error", field).textContent = "";
    $("#load-error").textContent = "";
  });
  $("#load-cancel").addEventListener("click", () => $("#load-dialog").close());
  $("#logs-form").addEventListener("submit", (e) => {
    e.preventDefault();
    startLogs();
  });
  $("#play-form").addEventListener("submit", play);
  $("#play-new").addEventListener("click", newConversation);
  // Ctrl+Enter (or Cmd+Enter) sends; Enter alone is a new line.
  $("#play-form textarea").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("#play-form").requestSubmit();
  });
  loadAll().then(follow);
}

start();
