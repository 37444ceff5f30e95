// Entry point: a small client-side router over "/" and "/jobs/{id}" (the
// server answers both with this page), health in the top bar, and the
// overview's polling loop.

import { hideJob, showJob } from "./job.js";
import { loadOptions, refreshCluster, refreshJobs, setupForm, showBanner } from "./overview.js";
import { refreshSchedule } from "./schedule.js";

const $ = (id) => document.getElementById(id);
const OVERVIEW_POLL_MS = 2000;
const HEALTH_POLL_MS = 5000;

let overviewTimer = null;

function showView(name) {
  for (const view of document.querySelectorAll(".view")) view.hidden = view.id !== `view-${name}`;
}

async function pollOverview() {
  clearTimeout(overviewTimer);
  try {
    if (!document.hidden) {
      await Promise.all([refreshCluster(), refreshJobs(), refreshSchedule()]);
    }
  } catch (err) {
    // A shared service shows its jobs only to a token: ask for one where jobs are submitted.
    if (err.status === 401) {
      $("token-field").hidden = false;
      showBanner(`${err.message}: enter your API token in the form below`);
    } else showBanner(err.message);
  }
  if (!$("view-overview").hidden) overviewTimer = setTimeout(pollOverview, OVERVIEW_POLL_MS);
}

function route() {
  const path = window.location.pathname;
  const match = path.match(/^\/jobs\/([^/]+)\/?$/);
  clearTimeout(overviewTimer);
  if (path === "/" || path === "/index.html") {
    hideJob();
    showView("overview");
    document.title = "hetsched";
    loadOptions().catch((err) => showBanner(err.message));
    pollOverview();
  } else if (match) {
    showView("job");
    showJob(decodeURIComponent(match[1]), { onMissing: missing, navigate });
  } else {
    missing(`No page at ${path}.`);
  }
}

function missing(text) {
  hideJob();
  $("missing-text").textContent = text;
  showView("missing");
}

export function navigate(path) {
  if (path !== window.location.pathname) window.history.pushState({}, "", path);
  window.scrollTo(0, 0);
  route();
}

async function pollHealth() {
  const box = $("health");
  try {
    const response = await fetch("/healthz", { headers: { Accept: "application/json" } });
    const health = await response.json();
    const ok = response.ok && health.status === "ok";
    const clusterUp = health.cluster === "available";
    box.className = `health ${ok ? (clusterUp ? "ok" : "warn") : "down"}`;
    box.querySelector(".health-text").textContent =
      ok ? (clusterUp ? "healthy" : "no cluster") : health.status || "unhealthy";
    box.title = `database ${health.database} · cluster ${health.cluster} · executor ${health.executor}` +
      (health.version ? ` · v${health.version}` : "");
  } catch {
    box.className = "health down";
    box.querySelector(".health-text").textContent = "unreachable";
  }
  setTimeout(pollHealth, HEALTH_POLL_MS);
}

document.addEventListener("click", (event) => {
  const link = event.target.closest("a[data-link]");
  if (!link || event.metaKey || event.ctrlKey || event.shiftKey || event.button !== 0) return;
  event.preventDefault();
  navigate(link.getAttribute("href"));
});
window.addEventListener("popstate", route);
document.addEventListener("visibilitychange", () => {
  if (!document.hidden && !$("view-overview").hidden) pollOverview();
});

setupForm(navigate);
route();
pollHealth();
