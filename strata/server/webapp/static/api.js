// Talking to the server: the API key, and server-sent events read with fetch.
// EventSource cannot send an Authorization header, so every stream (the chat's answers
// and the monitor's feed) is a fetch whose body is parsed here as SSE.

const KEY_STORE = "strata.apiKey";

export class AuthNeeded extends Error {}

export class ApiError extends Error {
  constructor(status, body) {
    const err = body && body.error ? body.error : {};
    super(err.message || `HTTP ${status}`);
    this.status = status;
    this.code = err.code || null;
  }
}

export function apiKey() {
  return localStorage.getItem(KEY_STORE) || "";
}

export function setApiKey(key) {
  if (key) localStorage.setItem(KEY_STORE, key);
  else localStorage.removeItem(KEY_STORE);
}

function headers(extra) {
  const h = Object.assign({}, extra || {});
  const key = apiKey();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

async function failure(response) {
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (response.status === 401) return new AuthNeeded(new ApiError(401, body).message);
  return new ApiError(response.status, body);
}

export async function getJson(path) {
  const response = await fetch(path, { headers: headers() });
  if (!response.ok) throw await failure(response);
  return response.json();
}

// POSTs `body` (or GETs when body is null) and calls onEvent(object) for each `data:` JSON
// payload until `[DONE]` or the end of the stream. Aborting `signal` ends the request:
// the server sees the connection close and frees the request's lane and chunks.
export async function streamEvents(path, body, onEvent, signal) {
  const init = { headers: headers({ Accept: "text/event-stream" }), signal };
  if (body !== null) {
    init.method = "POST";
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (!response.ok) throw await failure(response);
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
      if (!data) continue;  // a comment (keep-alive)
      if (data === "[DONE]") return;
      onEvent(JSON.parse(data));
    }
  }
}
