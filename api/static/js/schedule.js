// The scheduling policy on the dashboard: the overview's queue and allocation
// (GET /schedule) and a job's allocation history (JobPublic.allocations).

import { get } from "./api.js";
import { esc, fmtDateTime, fmtRate, fmtSeconds } from "./format.js";

const $ = (id) => document.getElementById(id);

function jobLink(row) {
  return `<a href="/jobs/${encodeURIComponent(row.id)}" data-link>${esc(row.name)}</a>
    <span class="muted small mono">${esc(row.id.slice(0, 8))}</span>`;
}

function devicesText(ids) {
  return ids.length ? ids.join(", ") : "–";
}

function scheduleRow(row) {
  const where = row.status === "waiting"
    ? `waiting ${fmtSeconds(row.waiting_s)}`
    : row.status === "moving"
      ? `${esc(devicesText(row.held))} → ${esc(devicesText(row.devices))}`
      : esc(devicesText(row.held.length ? row.held : row.devices));
  const rate = row.samples_per_s > 0 ? fmtRate(row.samples_per_s) : "–";
  return `<tr data-schedule-job="${esc(row.id)}" data-status="${esc(row.status)}">
    <td>${jobLink(row)}</td><td><span class="badge ${esc(row.status)}">${esc(row.status)}</span></td>
    <td class="mono small">${where}</td><td class="num">${row.priority}</td>
    <td class="num">${rate}</td><td class="small">${esc(row.reason)}</td></tr>`;
}

/** The overview's schedule card: running jobs first, then the queue in order. */
export async function refreshSchedule() {
  const schedule = await get("/schedule");
  const order = { running: 0, pinned: 0, moving: 1, waiting: 2 };
  const rows = [...schedule.jobs].sort((a, b) => order[a.status] - order[b.status]);
  $("schedule-policy").textContent = `policy ${schedule.policy}` +
    (schedule.queue.length ? ` · ${schedule.queue.length} waiting` : "");
  $("schedule-policy").title = schedule.solver || "";
  $("schedule-table").tBodies[0].innerHTML = rows.map(scheduleRow).join("") ||
    '<tr class="empty"><td colspan="6">No job is running or waiting.</td></tr>';
}

/** A job page's allocation history: where the policy started and moved it. */
export function renderAllocations(job) {
  const history = job.allocations || [];
  $("allocations-card").hidden = !history.length;
  $("allocations-view").innerHTML = history.map((a) => {
    const what = a.from_devices.length
      ? `moved from ${esc(devicesText(a.from_devices))} to ${esc(devicesText(a.devices))}`
      : `started on ${esc(devicesText(a.devices))}`;
    return `<li><span class="badge allocation">${esc(a.policy)}</span>
      <span class="muted">step ${a.step} · ${esc(fmtDateTime(a.time))}</span> ${what}
      <div class="muted small">${esc(a.reason)}</div></li>`;
  }).join("");
}
