// The job page: state and progress, the plan, predicted against measured step
// time and the even baseline, and loss and throughput charts that follow the
// run by polling the REST API once a second until the job is terminal.

import { ApiError, del, get, post } from "./api.js";
import { hbars, lineChart } from "./charts.js";
import {
  elapsedS, esc, fmtDateTime, fmtNum, fmtRate, fmtSeconds, isNum, toDate,
} from "./format.js";
import { refreshCluster, state as overview, strategyText } from "./overview.js";
import { planSummary, renderPlan } from "./plan.js";
import { renderAllocations } from "./schedule.js";
import { TERMINAL } from "./states.js";

const $ = (id) => document.getElementById(id);
const POLL_MS = 1000;
const STRATEGY_NAMES = {
  dp: "Optimal split", even: "Even split", proportional: "Proportional split",
  pp: "Pipeline", hybrid: "Hybrid dp × pp",
};

let current = null; // {id, job, steps: [], planKey, timer, alive}

function comparison(measured, predicted) {
  if (!isNum(measured) || !isNum(predicted) || predicted <= 0) return "";
  const diff = measured / predicted - 1;
  const pct = Math.abs(Math.round(100 * diff));
  if (pct === 0) return "as predicted";
  return `${pct}% ${diff > 0 ? "slower" : "faster"} than predicted`;
}

function renderHead(job) {
  $("job-name").textContent = job.name;
  const badge = $("job-state");
  badge.textContent = job.state;
  badge.className = `badge ${job.state}`;
  const stopping = job.stop_requested && !TERMINAL.has(job.state) ? " · stopping…" : "";
  $("job-meta").innerHTML = `<span class="mono">${esc(job.id)}</span> · ${esc(job.model_name)} ·
    ${esc(strategyText(job))}${stopping}`;
  const message = $("job-message");
  message.hidden = !job.message;
  message.textContent = job.message;
  message.className = `job-message ${job.state}`;
  $("job-stop").hidden = TERMINAL.has(job.state);
  $("job-stop").disabled = job.stop_requested;
  $("job-delete").hidden = !TERMINAL.has(job.state);
  const progress = $("job-progress");
  const pct = Math.round(100 * Math.min(1, Math.max(0, job.progress || 0)));
  progress.className = `progress big ${job.state}`;
  progress.querySelector(".progress-fill").style.width = `${pct}%`;
  const took = elapsedS(job.started_at, job.ended_at);
  progress.querySelector(".progress-label").textContent =
    `${job.steps_done} / ${job.steps} steps${isNum(took) ? ` · ${fmtSeconds(took)}` : ""}`;
  document.title = `${job.name} · ${job.state} · hetsched`;
}

function renderTiles(job) {
  const plan = job.plan;
  const predicted = job.predicted_step_s ?? (plan ? plan.predicted_step_s : null);
  const even = plan && plan.baselines ? plan.baselines.even : null;
  $("t-throughput").textContent = fmtRate(job.samples_per_s);
  $("t-throughput-sub").textContent = plan ? `predicted ${fmtRate(plan.predicted_samples_per_s)}` : "";
  $("t-measured").textContent = fmtSeconds(job.measured_step_s);
  $("t-measured-sub").textContent = comparison(job.measured_step_s, predicted) ||
    (job.steps_done ? "median after the warm-up step" : "");
  $("t-predicted").textContent = fmtSeconds(predicted);
  $("t-predicted-sub").textContent = plan
    ? `${fmtSeconds(plan.compute_s)} compute + ${fmtSeconds(plan.comm_s)} all-reduce` : "";
  $("t-even").textContent = even ? fmtSeconds(even.predicted_step_s) : "–";
  const evenSub = $("t-even-sub");
  evenSub.className = "tile-sub";
  if (even && isNum(predicted) && predicted > 0) {
    const reference = isNum(job.measured_step_s) ? job.measured_step_s : predicted;
    const gain = even.predicted_step_s / reference;
    const basis = isNum(job.measured_step_s) ? "measured" : "predicted";
    evenSub.textContent = `predicted · this job ${gain.toFixed(2)}× ${gain >= 1 ? "faster" : "as fast"} (${basis})`;
    evenSub.classList.add(gain >= 1 ? "good" : "bad");
  } else {
    evenSub.textContent = even ? "predicted" : "";
  }
}

function renderStepTimes(job) {
  const plan = job.plan;
  const rows = [];
  if (isNum(job.measured_step_s)) {
    rows.push({ label: "Measured", sub: "median", segments: [{ value: job.measured_step_s, cls: "measured" }],
      value: fmtSeconds(job.measured_step_s) });
  }
  if (plan) {
    rows.push({ label: "Predicted", sub: `${plan.strategy} plan`,
      segments: [{ value: plan.compute_s, cls: "predicted", title: "compute" },
        { value: plan.predicted_step_s - plan.compute_s, cls: "baseline", title: "all-reduce" }],
      value: fmtSeconds(plan.predicted_step_s) });
    for (const [name, base] of Object.entries(plan.baselines || {})) {
      if (name === plan.strategy) continue;
      rows.push({ label: STRATEGY_NAMES[name] || name, sub: "pred.",
        segments: [{ value: base.predicted_step_s, cls: "baseline" }],
        value: fmtSeconds(base.predicted_step_s) });
    }
  }
  const box = $("steptime-view");
  if (!rows.length) box.innerHTML = '<p class="muted">Appears once the job is planned.</p>';
  else hbars(box, rows);
}

function renderDeviceTimes(job, steps) {
  const box = $("device-time-view");
  const last = steps.length ? steps[steps.length - 1] : null;
  const predicted = new Map((job.plan ? job.plan.devices : []).map((d) => [d.id, d]));
  if (!last) {
    $("device-time-note").textContent = "";
    box.innerHTML = '<p class="muted">Appears after the first step.</p>';
    return;
  }
  $("device-time-note").textContent = `step ${last.step} · busy, then waiting; line: predicted busy`;
  hbars(box, last.devices.map((d) => {
    const plan = predicted.get(d.id);
    const type = overview.devices.get(d.id)?.type || "";
    return {
      label: d.id, sub: type,
      segments: [{ value: d.busy_s, cls: "busy", title: `busy ${fmtSeconds(d.busy_s)}` },
        { value: d.wait_s, cls: "wait", title: `waiting ${fmtSeconds(d.wait_s)}` }],
      marker: plan && plan.samples > 0 ? plan.busy_s : null,
      markerTitle: plan ? `predicted busy ${fmtSeconds(plan.busy_s)}` : "",
      value: fmtSeconds(d.busy_s), valueSub: `+ ${fmtSeconds(d.wait_s)} wait`,
    };
  }));
}

const EVENT_LABEL = {
  recovery: "recovered", replan: "re-planned", restart: "restarted", host_bound: "host-bound",
};

/** What an event says in one line. */
function eventText(e) {
  const d = e.data || {};
  if (e.kind === "recovery") {
    const lost = (d.lost || []).length ? `; lost ${d.lost.join(", ")}` : "";
    return `${d.error || "failure"} at step ${(d.failed_step ?? 0) + 1}${lost}; ` +
      `${d.steps_redone ?? 0} steps redone, back in ${fmtSeconds(d.recover_s)}`;
  }
  if (e.kind === "replan") return d.reason || "re-planned";
  if (e.kind === "host_bound") return d.message || "this host cannot keep its GPUs' pace";
  return `control plane restarted; resumed at step ${e.step}`;
}

function eventMarks(job) {
  return (job.events || []).map((e) => ({
    x: e.step, label: EVENT_LABEL[e.kind] || e.kind, title: eventText(e),
  }));
}

function renderEvents(job, checkpoints) {
  const events = job.events || [];
  $("events-card").hidden = !events.length && !checkpoints.length;
  $("events-view").innerHTML = events.map((e) =>
    `<li><span class="badge ${esc(e.kind)}">${esc(EVENT_LABEL[e.kind] || e.kind)}</span>
      <span class="muted">step ${e.step}</span> ${esc(eventText(e))}</li>`).join("");
  const last = checkpoints.length ? checkpoints[checkpoints.length - 1] : null;
  $("checkpoint-link").innerHTML = last
    ? `<a href="${esc(last.url)}" download>download checkpoint of step ${last.step}</a>` : "";
}

function renderCharts(job, steps) {
  const plan = job.plan;
  const marks = eventMarks(job);
  lineChart($("loss-chart"), {
    series: [
      { name: "loss", color: "var(--series-1)", points: steps.map((s) => [s.step, s.loss]) },
      // the held-out split, on the steps that were evaluated
      { name: "validation loss", color: "var(--series-2)",
        points: steps.filter((s) => isNum(s.val_loss)).map((s) => [s.step, s.val_loss]) },
    ],
    marks,
    yFormat: (v) => fmtNum(v, 3), xLabel: "step",
    emptyText: TERMINAL.has(job.state) ? "No steps were run" : "Waiting for the first step…",
  });
  const refs = [];
  if (plan) refs.push({ y: plan.predicted_samples_per_s, label: "predicted", color: "var(--series-2)" });
  const even = plan && plan.baselines ? plan.baselines.even : null;
  if (even) refs.push({ y: even.predicted_samples_per_s, label: "even split (pred.)", color: "var(--series-3)" });
  lineChart($("throughput-chart"), {
    series: [{ name: "samples/s", color: "var(--series-1)", points: steps.map((s) => [s.step, s.samples_per_s]) }],
    refs, marks, yZero: true, yFormat: (v) => fmtNum(v, 3), xLabel: "step",
    emptyText: TERMINAL.has(job.state) ? "No steps were run" : "Waiting for the first step…",
  });
  const last = steps.length ? steps[steps.length - 1] : null;
  const lastVal = steps.filter((s) => isNum(s.val_loss)).pop();
  $("loss-last").textContent = (last ? `step ${last.step}: ${fmtNum(last.loss, 4)}` : "")
    + (lastVal ? ` · validation ${fmtNum(lastVal.val_loss, 4)} (step ${lastVal.step})` : "");
  $("tput-last").textContent = last ? `step ${last.step}: ${fmtRate(last.samples_per_s)}` : "";
}

function renderSpec(job) {
  const s = job.spec;
  const model = typeof s.model === "string" ? s.model
    : `${s.model.name} (${s.model.num_layers} layers, d_model ${s.model.d_model})`;
  const took = elapsedS(job.started_at, job.ended_at);
  const items = [
    ["Model", model], ["Dataset", s.dataset], ["Global batch", s.global_batch], ["Steps", s.steps],
    ["Strategy", strategyText(job)], ["Seed", s.seed],
    ["Optimizer", `AdamW, lr ${s.optimizer.lr}, weight decay ${s.optimizer.weight_decay}`],
    ["Devices", job.devices.length ? job.devices.join(", ") : s.devices ? `${s.devices.join(", ")} (requested)` : "any free"],
    ["Submitted", fmtDateTime(job.created_at)], ["Started", fmtDateTime(job.started_at)],
    ["Ended", fmtDateTime(job.ended_at)], ["Run time", isNum(took) ? fmtSeconds(took) : "–"],
    ["Submission id", job.submission_id || "–"], ["Job id", job.id],
  ];
  $("job-spec").innerHTML = items.map(([k, v]) => `<dt>${esc(k)}</dt><dd>${esc(v)}</dd>`).join("");
}

function render(job, steps, checkpoints) {
  renderHead(job);
  renderEvents(job, checkpoints);
  renderAllocations(job);
  renderTiles(job);
  const planKey = JSON.stringify(job.plan);
  if (planKey !== current.planKey || overview.devices.size !== current.numDevices) {
    current.planKey = planKey;
    current.numDevices = overview.devices.size;
    $("plan-summary").textContent = planSummary(job.plan);
    if (job.plan) renderPlan($("plan-view"), job.plan, overview.devices);
    else $("plan-view").innerHTML = `<p class="muted">${TERMINAL.has(job.state)
      ? "This job ended before it was planned." : "No plan yet: the job is waiting for devices."}</p>`;
  }
  renderStepTimes(job);
  renderDeviceTimes(job, steps);
  renderCharts(job, steps);
  renderSpec(job);
}

function appendLog(lines) {
  if (!lines.length) return;
  const box = $("job-log");
  const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 8;
  box.insertAdjacentHTML("beforeend", lines.map((l) => {
    const t = toDate(l.time);
    return `<div class="log-line ${esc(l.level)}"><span class="log-time">${t ? t.toLocaleTimeString([], { hour12: false }) : ""}</span>
      <span class="log-msg">${esc(l.message)}</span></div>`;
  }).join(""));
  if (atBottom) box.scrollTop = box.scrollHeight;
}

async function fetchSteps(id, since) {
  const page = await get(`/jobs/${encodeURIComponent(id)}/metrics?since=${since}`);
  return Array.isArray(page) ? page : page.data;
}

async function poll(view) {
  if (!view.alive) return;
  let again = true;
  try {
    const job = await get(`/jobs/${encodeURIComponent(view.id)}`);
    const since = view.steps.length ? view.steps[view.steps.length - 1].step + 1 : 0;
    const [fresh, log, checkpoints] = await Promise.all([
      fetchSteps(view.id, since),
      get(`/jobs/${encodeURIComponent(view.id)}/logs?since=${view.logLines}`),
      get(`/jobs/${encodeURIComponent(view.id)}/checkpoints`),
    ]);
    if (!view.alive) return;
    view.logLines += log.data.length;
    appendLog(log.data);
    view.steps.push(...fresh.filter((s) => s.step >= since));
    view.job = job;
    $("job-error").textContent = "";
    render(job, view.steps, checkpoints.data);
    // Poll once more after the job turns terminal, so its last steps are in.
    if (TERMINAL.has(job.state)) { again = !view.sawTerminal; view.sawTerminal = true; }
  } catch (err) {
    if (err instanceof ApiError && err.status === 404) {
      view.onMissing(`No job ${view.id}: it never existed or was deleted.`);
      return;
    }
    $("job-error").textContent = err.message;
  }
  if (again && view.alive) view.timer = setTimeout(() => poll(view), POLL_MS);
}

export function showJob(id, { onMissing, navigate }) {
  hideJob();
  current = { id, job: null, steps: [], planKey: null, numDevices: -1, timer: null, alive: true,
    sawTerminal: false, logLines: 0, onMissing };
  for (const box of ["plan-view", "steptime-view", "device-time-view", "job-spec", "job-log"]) $(box).innerHTML = "";
  $("job-name").textContent = "Loading…";
  $("job-error").textContent = "";
  $("job-stop").onclick = async () => {
    try {
      const job = await post(`/jobs/${encodeURIComponent(id)}/stop`);
      if (current && current.id === id) renderHead(job);
    } catch (err) { $("job-error").textContent = err.message; }
  };
  $("job-delete").onclick = async () => {
    if (!window.confirm("Delete this job and its metrics?")) return;
    try {
      await del(`/jobs/${encodeURIComponent(id)}`);
      navigate("/");
    } catch (err) { $("job-error").textContent = err.message; }
  };
  if (!overview.devices.size) refreshCluster().catch(() => {});
  poll(current);
}

export function hideJob() {
  if (!current) return;
  current.alive = false;
  clearTimeout(current.timer);
  current = null;
}
