// A plan drawn as a table: each device's share of the global batch as a bar
// cut into its micro-batches, its micro-batch and accumulation, predicted
// busy time and peak memory, and pipeline layer ranges when the plan has them.

import { esc, fmtBytes, fmtPct, fmtRate, fmtSeconds, isNum } from "./format.js";

/** Split `samples` into `accum` micro-batches as equal as integers allow (as the runtime does). */
function microBatches(samples, accum) {
  if (!(accum > 0) || !(samples > 0)) return [];
  const base = Math.floor(samples / accum);
  const extra = samples % accum;
  return Array.from({ length: accum }, (_, i) => base + (i < extra ? 1 : 0));
}

function shareBar(d, globalBatch) {
  const total = Math.max(1, globalBatch);
  const parts = microBatches(d.samples, d.accum_steps).map((n, i) =>
    `<div class="share-micro" style="width:${(100 * n / total).toFixed(2)}%"
      title="micro-batch ${i + 1}: ${n} samples"></div>`).join("");
  return `<div class="share-bar"><div class="share-track">${parts}</div>
    <span class="share-pct">${fmtPct(d.samples / total)}</span></div>`;
}

function layersBar(d, numBlocks, lastStage) {
  if (!Array.isArray(d.layers)) return "–";
  const [first, last] = d.layers;
  const staged = d.stage !== null && d.stage !== undefined;
  const holdsEmbedding = staged ? d.stage === 0 : first === 0;
  const holdsHead = staged ? d.stage === lastStage.get(d.pipeline) : last === numBlocks;
  const left = numBlocks ? (100 * first) / numBlocks : 0;
  const width = numBlocks ? (100 * (last - first)) / numBlocks : 0;
  // Stage 0 also holds the embedding and the last stage the final norm and head.
  const parts = [];
  if (holdsEmbedding) parts.push("embedding");
  if (last - first === 1) parts.push(`block ${first}`);
  else if (last > first) parts.push(`blocks ${first}–${last - 1}`);
  if (holdsHead) parts.push("head");
  const label = parts.join(" + ");
  return `<div class="layers-track" title="[${first}, ${last})">
      <div class="layers-fill" style="left:${left.toFixed(2)}%;width:${Math.max(width, 0.8).toFixed(2)}%"></div>
    </div><div class="small muted">${label}</div>`;
}

/**
 * Render `plan` (the plan document of DESIGN.md) into `container`.
 * `devices` maps device id -> {type, node} from GET /cluster, for labels.
 */
export function renderPlan(container, plan, devices = new Map()) {
  if (!plan) {
    container.innerHTML = '<p class="muted">No plan yet.</p>';
    return;
  }
  const hasLayers = plan.devices.some((d) => Array.isArray(d.layers));
  const numBlocks = hasLayers ? Math.max(...plan.devices.map((d) => (d.layers ? d.layers[1] : 0))) : 0;
  const hasStages = plan.devices.some((d) => d.stage !== null && d.stage !== undefined);
  const lastStage = new Map(); // pipeline -> its last stage, which holds the head
  for (const d of plan.devices) {
    if (hasStages && d.stage !== null && d.stage !== undefined) {
      lastStage.set(d.pipeline, Math.max(lastStage.get(d.pipeline) ?? 0, d.stage));
    }
  }
  const rows = plan.devices.map((d) => {
    const info = devices.get(d.id) || {};
    const idle = d.samples === 0;
    return `<tr class="${idle ? "muted" : ""}" data-device="${esc(d.id)}">
      <td class="mono">${esc(d.id)}</td>
      <td>${esc(info.type || "")}</td>
      <td class="share">${shareBar(d, plan.global_batch)}</td>
      <td class="num">${d.samples}</td>
      <td class="num">${idle ? "–" : `${d.micro_batch} × ${d.accum_steps}`}</td>
      <td class="num">${idle ? "–" : fmtSeconds(d.busy_s)}</td>
      <td class="num">${idle ? "–" : fmtBytes(d.peak_bytes)}</td>
      ${hasStages ? `<td class="num">${d.pipeline ?? "–"} / ${d.stage ?? "–"}</td>` : ""}
      ${hasLayers ? `<td class="layers">${layersBar(d, numBlocks, lastStage)}</td>` : ""}
    </tr>`;
  }).join("");
  const excluded = (plan.excluded || []).length
    ? `<ul class="excluded">${plan.excluded.map((e) =>
      `<li><span class="mono">${esc(e.id)}</span> left out: ${esc(e.reason)}</li>`).join("")}</ul>` : "";
  const notes = (plan.notes || []).length
    ? `<ul class="plan-notes">${plan.notes.map((n) => `<li>${esc(n)}</li>`).join("")}</ul>` : "";
  container.innerHTML = `<div class="table-wrap"><table class="table plan-table">
      <thead><tr>
        <th>Device</th><th>Type</th><th title="One block per micro-batch">Share of the batch</th>
        <th class="num">Samples</th><th class="num" title="micro-batch × accumulation steps">Micro × accum</th>
        <th class="num">Busy (pred.)</th><th class="num">Peak memory</th>
        ${hasStages ? '<th class="num" title="pipeline / stage">Pipe / stage</th>' : ""}
        ${hasLayers ? "<th>Layers</th>" : ""}
      </tr></thead>
      <tbody>${rows}</tbody>
    </table></div>${excluded}${notes}`;
}

/** One line: strategy, predicted step and throughput, and the gain over the even split. */
export function planSummary(plan) {
  if (!plan) return "";
  const parts = [
    `${plan.strategy} · batch ${plan.global_batch}`,
    `predicted ${fmtSeconds(plan.predicted_step_s)} per step (${fmtSeconds(plan.compute_s)} compute + ${fmtSeconds(plan.comm_s)} all-reduce)`,
    fmtRate(plan.predicted_samples_per_s),
  ];
  const even = plan.baselines && plan.baselines.even;
  if (even && isNum(even.predicted_step_s) && plan.predicted_step_s > 0) {
    const gain = even.predicted_step_s / plan.predicted_step_s;
    parts.push(gain >= 1 ? `${gain.toFixed(2)}× faster than the even split`
      : `${(1 / gain).toFixed(2)}× slower than the even split`);
  }
  return parts.join(" · ");
}
