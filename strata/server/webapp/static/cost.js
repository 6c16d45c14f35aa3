// What an answer cost, from the stream's usage chunk and the final chunk's `timings`
// (llama.cpp's names): prompt tokens, cached tokens (the conversation cache's reuse),
// time to first token, and decode speed.

function fmt(n, digits) {
  return n === null || n === undefined || Number.isNaN(n) ? "?" : Number(n).toFixed(digits);
}

export function costText(cost) {
  const usage = cost.usage || {};
  const t = cost.timings || {};
  const prompt = usage.prompt_tokens !== undefined ? usage.prompt_tokens : (t.prompt_n || 0) + (t.cache_n || 0);
  const details = usage.prompt_tokens_details || {};
  const cached = details.cached_tokens !== undefined ? details.cached_tokens : t.cache_n;
  const parts = [
    `prompt ${prompt} tok`,
    `cached ${cached === undefined ? "?" : cached}`,
    `TTFT ${fmt(cost.ttft_ms === null ? null : cost.ttft_ms / 1000, 2)} s`,
    `${fmt(t.predicted_per_second, 1)} tok/s`,
    `${usage.completion_tokens !== undefined ? usage.completion_tokens : t.predicted_n} tokens`,
  ];
  if (t.prompt_ms !== undefined) parts.splice(3, 0, `prompt read ${fmt(t.prompt_ms / 1000, 2)} s`);
  if (cost.truncated) parts.push("truncated: the pool was full");
  else if (cost.finish_reason === "length") parts.push("stopped at max_tokens");
  return parts.join(" · ");
}

export function costLine(cost, stopped) {
  const line = document.createElement("div");
  line.className = "cost";
  line.textContent = costText(cost) + (stopped ? " · stopped" : "");
  const usage = cost.usage || {};
  const t = cost.timings || {};
  line.dataset.prompt = String(usage.prompt_tokens !== undefined ? usage.prompt_tokens : "");
  const details = usage.prompt_tokens_details || {};
  line.dataset.cached = String(details.cached_tokens !== undefined ? details.cached_tokens : (t.cache_n !== undefined ? t.cache_n : ""));
  return line;
}
