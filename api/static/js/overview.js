// The overview page: the cluster, the submit form (with a plan preview) and
// the job list. Refreshed by polling while it is on screen.

import { ApiError, del, get, getToken, post, setToken, uploadDataset } from "./api.js";
import { esc, fmtBytes, fmtRate, fmtSeconds, fmtTime, isNum } from "./format.js";
import { planSummary, renderPlan } from "./plan.js";
import { TERMINAL } from "./states.js";

const $ = (id) => document.getElementById(id);

export const state = {
  cluster: null,
  devices: new Map(), // id -> device of GET /cluster
  jobNames: new Map(), // id -> name, for the cluster's "current job"
  optionsLoaded: false,
  me: null, // GET /users/me: who the token says this is
};

export function showBanner(text) {
  const banner = $("banner");
  banner.textContent = text || "";
  banner.hidden = !text;
}

export function progressHtml(job) {
  const pct = Math.round(100 * Math.min(1, Math.max(0, job.progress || 0)));
  return `<div class="progress ${esc(job.state)}" role="progressbar" aria-valuenow="${pct}"
      aria-valuemin="0" aria-valuemax="100">
    <div class="progress-fill" style="width:${pct}%"></div>
    <span class="progress-label">${job.steps_done} / ${job.steps} steps</span></div>`;
}

export function strategyText(job) {
  const asked = job.spec ? job.spec.strategy : "";
  const chosen = job.plan ? job.plan.strategy : "";
  return chosen && asked && chosen !== asked ? `${asked} → ${chosen}` : asked || chosen;
}

// --- cluster ---------------------------------------------------------------

function meter(ratio, peakBytes) {
  if (!isNum(ratio)) return '<span class="muted">–</span>';
  const pct = Math.round(100 * Math.min(1, Math.max(0, ratio)));
  const peak = isNum(peakBytes) ? `, peak memory ${fmtBytes(peakBytes)}` : "";
  return `<div class="meter" title="busy ${pct}% of the last step${peak}">
    <div class="meter-track"><div class="meter-fill" style="width:${pct}%"></div></div>
    <span class="meter-text">${pct}%</span></div>`;
}

function deviceRow(d, simulated) {
  const memory = simulated
    ? `${d.memory_gb} GB<div class="muted small" title="what the simulation gives this device">sim. ${fmtBytes(d.capacity_bytes)}</div>`
    : `${d.memory_gb} GB`;
  const speed = d.measured
    ? `<span title="${esc(d.measured.model)}: ${fmtSeconds(d.measured.fixed_s)} per micro-batch + ${fmtSeconds(d.measured.per_sample_s)} per sample">${fmtRate(d.measured.samples_per_s)}</span>`
    : `<span class="muted" title="${esc(d.peak_tflops)} TFLOP/s peak (catalogue)">not profiled</span>`;
  let job = `<span class="badge ${esc(d.status)}">${esc(d.status)}</span>`;
  if (d.job_id) {
    const name = state.jobNames.get(d.job_id) || d.job_id.slice(0, 8);
    job += ` <a href="/jobs/${encodeURIComponent(d.job_id)}" data-link>${esc(name)}</a>`;
  }
  return `<tr data-device="${esc(d.id)}">
    <td class="mono">${esc(d.id)}</td><td>${esc(d.type)}</td><td>${esc(d.node)}</td>
    <td class="num">${memory}</td><td class="num">${speed}</td><td>${job}</td>
    <td>${d.status === "busy" ? meter(d.busy_ratio, d.memory_bytes) : '<span class="muted">–</span>'}</td></tr>`;
}

export async function refreshCluster() {
  const cluster = await get("/cluster");
  state.cluster = cluster;
  state.devices = new Map(cluster.nodes.flatMap((n) => n.devices).map((d) => [d.id, d]));
  $("cluster-name").textContent = `${cluster.name}${cluster.simulated ? " · simulated" : ""}`;
  const busy = [...state.devices.values()].filter((d) => d.status === "busy").length;
  $("cluster-summary").textContent =
    `${cluster.num_devices} devices on ${cluster.nodes.length} nodes · ${busy} busy`;
  showBanner(cluster.available ? "" : `Cluster unavailable: ${cluster.message}`);
  const rows = cluster.nodes.flatMap((n) => n.devices).map((d) => deviceRow(d, cluster.simulated));
  $("cluster-table").tBodies[0].innerHTML =
    rows.join("") || '<tr class="empty"><td colspan="7">No devices</td></tr>';
  const profiled = [...state.devices.values()].filter((d) => d.measured);
  $("profile-note").textContent = profiled.length
    ? `Speeds measured for ${profiled[0].measured.model}.`
    : "Speeds appear once devices are profiled (the first job does it).";
  fillDeviceChecks([...state.devices.keys()]);
  return cluster;
}

function fillDeviceChecks(ids) {
  const box = $("f-devices");
  const current = [...box.querySelectorAll("input")].map((i) => i.value);
  if (current.length === ids.length && current.every((v, i) => v === ids[i])) return;
  const checked = new Set([...box.querySelectorAll("input:checked")].map((i) => i.value));
  box.innerHTML = ids.map((id) => {
    const d = state.devices.get(id);
    return `<label title="${esc(d ? d.type : "")}"><input type="checkbox" value="${esc(id)}"
      ${checked.has(id) ? "checked" : ""}> <span class="mono">${esc(id)}</span>
      <span class="muted small">${esc(d ? d.type : "")}</span></label>`;
  }).join("") || '<span class="muted small">No devices</span>';
}

// --- jobs ------------------------------------------------------------------

function jobRow(job) {
  const action = TERMINAL.has(job.state)
    ? `<button type="button" class="link-btn" data-action="delete" data-id="${esc(job.id)}">Delete</button>`
    : `<button type="button" class="link-btn" data-action="stop" data-id="${esc(job.id)}">Stop</button>`;
  const stepTime = isNum(job.measured_step_s)
    ? `${fmtSeconds(job.measured_step_s)}${isNum(job.predicted_step_s) ? ` <span class="muted small">/ ${fmtSeconds(job.predicted_step_s)} pred.</span>` : ""}`
    : isNum(job.predicted_step_s) ? `<span class="muted">${fmtSeconds(job.predicted_step_s)} pred.</span>` : "–";
  return `<tr data-job="${esc(job.id)}" data-state="${esc(job.state)}">
    <td><a href="/jobs/${encodeURIComponent(job.id)}" data-link class="job-link">${esc(job.name)}</a>
      <div class="muted small mono">${esc(job.id.slice(0, 8))}</div></td>
    <td><span class="badge ${esc(job.state)}" title="${esc(job.message)}">${esc(job.state)}</span></td>
    <td>${esc(job.owner)}<div class="muted small">${esc(job.project)}</div></td>
    <td>${esc(job.model_name)}</td>
    <td>${esc(strategyText(job))}</td>
    <td>${progressHtml(job)}</td>
    <td class="num">${fmtRate(job.samples_per_s)}</td>
    <td class="num">${stepTime}</td>
    <td title="${esc(job.created_at)}">${fmtTime(job.created_at)}</td>
    <td>${action}</td></tr>`;
}

// Who the token says this is; on a shared service the list shows their own jobs by
// default ("Mine only"), on a single-user one there is nobody else to hide.
async function whoAmI() {
  const token = getToken();
  if (!state.me || state.me.token !== token) {
    state.me = { ...(await get("/users/me")), token };
    $("jobs-mine-field").hidden = state.me.single_user || !state.me.name;
  }
  return state.me;
}

export async function refreshJobs() {
  const filter = $("jobs-filter").value;
  const me = await whoAmI();
  const mine = !$("jobs-mine-field").hidden && $("jobs-mine").checked && me.name;
  const query = `/jobs?limit=50${filter ? `&state=${encodeURIComponent(filter)}` : ""}` +
    (mine ? `&owner=${encodeURIComponent(me.name)}` : "");
  const page = await get(query);
  for (const job of page.data) state.jobNames.set(job.id, job.name);
  $("jobs-table").tBodies[0].innerHTML = page.data.map(jobRow).join("") ||
    `<tr class="empty"><td colspan="10">${filter ? `No ${filter.toLowerCase()} jobs.` : mine ? "None of yours: untick “Mine only” for your projects' jobs." : "No jobs yet: submit one above."}</td></tr>`;
  $("jobs-count").textContent = page.count > page.data.length
    ? `Newest ${page.data.length} of ${page.count} jobs` : `${page.count} job${page.count === 1 ? "" : "s"}`;
}

// --- form --------------------------------------------------------------------

function fillSelect(select, values, preferred) {
  const keep = select.value;
  select.innerHTML = values.map((v) => `<option value="${esc(v)}">${esc(v)}</option>`).join("");
  const pick = values.includes(keep) ? keep : values.includes(preferred) ? preferred : values[0];
  if (pick !== undefined) select.value = pick;
}

export async function loadOptions() {
  const options = await get("/options");
  fillSelect($("f-model"), options.models, "gpt-tiny");
  fillSelect($("f-strategy"), options.strategies, options.strategies.includes("auto") ? "auto" : "dp");
  fillSelect($("f-dataset"), options.datasets, "default");
  state.optionsLoaded = true;
}

function intField(id, field) {
  const input = $(id);
  const raw = input.value.trim();
  input.classList.remove("invalid");
  if (!/^-?\d+$/.test(raw)) {
    input.classList.add("invalid");
    throw new ApiError(0, `${field}: must be a whole number`);
  }
  return Number(raw);
}

function planRequest() {
  const devices = [...$("f-devices").querySelectorAll("input:checked")].map((i) => i.value);
  return {
    model: $("f-model").value,
    global_batch: intField("f-global-batch", "global_batch"),
    strategy: $("f-strategy").value,
    ...(devices.length ? { devices } : {}),
  };
}

function jobRequest() {
  const name = $("f-name").value.trim();
  return {
    ...planRequest(),
    name: name || `${$("f-model").value}-${new Date().toISOString().slice(11, 19).replaceAll(":", "")}`,
    dataset: $("f-dataset").value,
    steps: intField("f-steps", "steps"),
    seed: intField("f-seed", "seed"),
  };
}

function formError(err) {
  const box = $("form-error");
  box.classList.remove("form-ok");
  box.textContent = err ? err.message : "";
  if (err && err.status === 401) {
    box.textContent = getToken()
      ? "The API token was refused: check it and try again."
      : "This server needs an API token (HETSCHED_API_TOKEN): enter it above and try again.";
    $("token-field").hidden = false;
    $("f-token").focus();
  }
}

async function withButton(button, busyText, work) {
  const text = button.textContent;
  button.disabled = true;
  button.textContent = busyText;
  try { return await work(); } finally { button.disabled = false; button.textContent = text; }
}

export function setupForm(navigate) {
  $("f-token").value = getToken();
  $("f-token").addEventListener("input", (e) => setToken(e.target.value.trim()));
  $("submit-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    formError(null);
    await withButton($("submit-btn"), "Submitting…", async () => {
      try {
        const job = await post("/jobs", jobRequest());
        navigate(`/jobs/${encodeURIComponent(job.id)}`);
      } catch (err) { formError(err); }
    });
  });
  $("preview-btn").addEventListener("click", async () => {
    formError(null);
    const box = $("plan-preview");
    await withButton($("preview-btn"), "Planning…", async () => {
      try {
        const preview = await post("/plans", planRequest());
        box.hidden = false;
        box.innerHTML = `<div class="card-head"><h2>Plan preview</h2>
          <span class="muted small">${esc(preview.model)} · ${esc(preview.profile_source)} profile ·
          <button type="button" class="link-btn" id="preview-close">close</button></span></div>
          <p class="small">${esc(planSummary(preview.plan))}</p><div id="preview-plan"></div>`;
        renderPlan($("preview-plan"), preview.plan, state.devices);
        $("preview-close").addEventListener("click", () => { box.hidden = true; });
        box.scrollIntoView({ behavior: "smooth", block: "nearest" });
      } catch (err) { box.hidden = true; formError(err); }
    });
  });
  $("profile-btn").addEventListener("click", async () => {
    formError(null);
    await withButton($("profile-btn"), "Profiling…", async () => {
      try {
        await post("/cluster/profile", { model: $("f-model").value, refresh: true });
        await refreshCluster();
      } catch (err) { formError(err); }
    });
  });
  $("f-dataset-file").addEventListener("change", (event) => uploadFiles(event.target));
  $("jobs-filter").addEventListener("change", () => refreshJobs().catch(() => {}));
  $("jobs-mine").addEventListener("change", () => refreshJobs().catch(() => {}));
  $("jobs-table").addEventListener("click", async (event) => {
    const button = event.target.closest("button[data-action]");
    if (!button) return;
    const { action, id } = button.dataset;
    try {
      if (action === "stop") await post(`/jobs/${encodeURIComponent(id)}/stop`);
      else if (window.confirm("Delete this job and its metrics?")) await del(`/jobs/${encodeURIComponent(id)}`);
      await refreshJobs();
    } catch (err) { formError(err); }
  });
}

// Sidecars and tokenizers go first: the server checks a .bin against its sidecar.
async function uploadFiles(input) {
  formError(null);
  const files = [...input.files].sort((a, b) => Number(!a.name.endsWith(".json")) - Number(!b.name.endsWith(".json")));
  const done = [];
  try {
    for (const file of files) done.push((await uploadDataset(file)).name);
  } catch (err) { formError(err); }
  input.value = "";
  if (!done.length) return;
  await loadOptions();
  const dataset = done.filter((n) => n.endsWith(".txt") || n.endsWith(".bin")).pop();
  if (dataset) $("f-dataset").value = dataset;
  const box = $("form-error");
  if (!box.textContent) {
    box.classList.add("form-ok");
    box.textContent = `Uploaded ${done.join(", ")}.`;
  }
}
