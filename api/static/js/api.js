// The REST API under /api/v1: one fetch wrapper that turns every error
// answer into a one-line message, as the API's own errors read.

export const API = "/api/v1";
const TOKEN_KEY = "hetsched.token";

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export function getToken() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(token) {
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
}

/** One line out of FastAPI's error bodies: {detail: "..."} or {detail: [{loc, msg}]}. */
export function errorLine(status, body) {
  const detail = body && typeof body === "object" ? (body.detail ?? body.message) : body;
  if (typeof detail === "string" && detail) return detail;
  if (Array.isArray(detail) && detail.length) {
    const first = detail[0];
    const loc = (first.loc || []).filter((p) => p !== "body" && p !== "query" && p !== "path");
    const where = loc.join(".");
    const more = detail.length > 1 ? ` (and ${detail.length - 1} more)` : "";
    return `${where ? `${where}: ` : ""}${first.msg || "invalid value"}${more}`;
  }
  if (status === 401) return "this server needs an API token (HETSCHED_API_TOKEN)";
  return `request failed with HTTP ${status}`;
}

/** A JSON request, or with ``contentType`` the body (a File, say) sent as it is. */
export async function request(method, path, body, contentType) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = contentType || "application/json";
  const token = getToken();
  // Every call: once tokens exist, reads need one too (only a demo opens them).
  if (token) headers.Authorization = `Bearer ${token}`;
  let response;
  try {
    response = await fetch(API + path, {
      method, headers, body: body === undefined || contentType ? body : JSON.stringify(body),
    });
  } catch (err) {
    throw new ApiError(0, "cannot reach the control plane");
  }
  const text = await response.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch { data = text; }
  }
  if (!response.ok) throw new ApiError(response.status, errorLine(response.status, data));
  return data;
}

export const get = (path) => request("GET", path);
export const post = (path, body) => request("POST", path, body ?? {});
export const del = (path) => request("DELETE", path);
export const uploadDataset = (file) =>
  request("POST", `/datasets?name=${encodeURIComponent(file.name)}`, file, "application/octet-stream");
