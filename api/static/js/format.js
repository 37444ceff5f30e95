// Number and text formatting shared by the dashboard views.

/** Escape text for insertion into HTML. */
export function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ({
    "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;",
  })[c]);
}

export function isNum(x) {
  return typeof x === "number" && Number.isFinite(x);
}

/** Seconds as "412 ms", "1.23 s" or "2 min 5 s". */
export function fmtSeconds(s) {
  if (!isNum(s)) return "–";
  if (s < 0.001) return `${(s * 1e6).toFixed(0)} µs`;
  if (s < 1) return `${(s * 1000).toFixed(s < 0.1 ? 1 : 0)} ms`;
  if (s < 10) return `${s.toFixed(2)} s`;
  if (s < 120) return `${s.toFixed(1)} s`;
  const m = Math.floor(s / 60);
  return `${m} min ${Math.round(s - 60 * m)} s`;
}

/** Bytes in decimal units, as the planner's messages use them. */
export function fmtBytes(b) {
  if (!isNum(b)) return "–";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  let v = b;
  while (v >= 1000 && i < units.length - 1) { v /= 1000; i += 1; }
  return `${v >= 100 || i === 0 ? v.toFixed(0) : v.toFixed(1)} ${units[i]}`;
}

/** Samples per second, three significant figures. */
export function fmtRate(r) {
  if (!isNum(r)) return "–";
  return `${r >= 100 ? r.toFixed(0) : r.toPrecision(3)} samples/s`;
}

export function fmtNum(x, digits = 3) {
  if (!isNum(x)) return "–";
  if (Math.abs(x) >= 1000) return x.toFixed(0);
  return Number(x.toPrecision(digits)).toString();
}

export function fmtPct(x) {
  return isNum(x) ? `${Math.round(100 * x)}%` : "–";
}

/** A timestamp (ISO string or epoch seconds) as local time, with "ago" when recent. */
export function fmtTime(t) {
  const d = toDate(t);
  if (!d) return "–";
  const ago = (Date.now() - d.getTime()) / 1000;
  if (ago >= 0 && ago < 60) return `${Math.max(0, Math.round(ago))} s ago`;
  if (ago >= 0 && ago < 3600) return `${Math.round(ago / 60)} min ago`;
  const sameDay = new Date().toDateString() === d.toDateString();
  return sameDay ? d.toLocaleTimeString() : d.toLocaleString();
}

export function fmtDateTime(t) {
  const d = toDate(t);
  return d ? d.toLocaleString() : "–";
}

export function toDate(t) {
  if (t === null || t === undefined || t === "") return null;
  const d = typeof t === "number" ? new Date(t * 1000) : new Date(t);
  return Number.isNaN(d.getTime()) ? null : d;
}

/** Seconds between two timestamps, or from the first until now. */
export function elapsedS(start, end) {
  const a = toDate(start);
  if (!a) return null;
  const b = toDate(end) ?? new Date();
  return (b.getTime() - a.getTime()) / 1000;
}

export function median(values) {
  const v = values.filter(isNum).sort((a, b) => a - b);
  if (!v.length) return null;
  const mid = Math.floor(v.length / 2);
  return v.length % 2 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
}
