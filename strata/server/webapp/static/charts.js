// Line charts on a canvas: the last minutes of one or two series (no library, no DOM text
// from data: numbers only, drawn with fillText).

const COLORS = ["#4f8cff", "#f59e0b"];

export function drawChart(canvas, series, options) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, pad = 4, left = 44;
  ctx.clearRect(0, 0, w, h);
  const all = series.flatMap((s) => s.values);
  const top = Math.max(options && options.min_top ? options.min_top : 1, ...all) * 1.1;
  ctx.strokeStyle = "#2a3140";
  ctx.fillStyle = "#8a93a6";
  ctx.font = "11px sans-serif";
  for (const f of [0, 0.5, 1]) {
    const y = h - pad - f * (h - 2 * pad);
    ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(w, y); ctx.stroke();
    ctx.fillText((top * f).toFixed(top * f >= 10 ? 0 : 1), 2, y + 4);
  }
  series.forEach((s, k) => {
    const n = s.values.length;
    if (!n) return;
    ctx.strokeStyle = COLORS[k % COLORS.length];
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    s.values.forEach((v, i) => {
      const slot = s.capacity - n + i;  // the newest value at the right edge
      const x = left + (slot / Math.max(1, s.capacity - 1)) * (w - left);
      const y = h - pad - (v / top) * (h - 2 * pad);
      if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
    });
    ctx.stroke();
    ctx.fillStyle = COLORS[k % COLORS.length];
    const latest = s.values[n - 1];
    ctx.fillText(`${s.label} ${latest.toFixed(latest >= 100 ? 0 : 1)}`, left + 6 + k * 150, 12);
  });
}
