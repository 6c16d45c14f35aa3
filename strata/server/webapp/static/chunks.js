// One row of chunks: a layer group's chunk map (the pool's own for a model without windows).
// `map` has the picture's per-chunk tuples (chunk_owner, chunk_holders, chunk_filled,
// chunk_state), all of length num_chunks; a cell per chunk, coloured by the conversation
// holding it, filled as far as its cells are written.

const STATES = ["free", "active", "parked", "reserved", "session", "kept"];

export function convColor(convId) {
  return `hsl(${(convId * 137.508) % 360}, 70%, 55%)`;
}

export function bytesText(bytes) {
  if (bytes >= 1048576) return `${(bytes / 1048576).toFixed(1)} MiB`;
  return `${(bytes / 1024).toFixed(1)} KiB`;
}

// [0, 1, 2, 4, 6, 7] -> "0–2, 4, 6–7"
export function rangesText(layers) {
  const parts = [];
  for (let i = 0; i < layers.length; i++) {
    let j = i;
    while (j + 1 < layers.length && layers[j + 1] === layers[j] + 1) j++;
    parts.push(i === j ? String(layers[i]) : `${layers[i]}–${layers[j]}`);
    i = j;
  }
  return parts.join(", ");
}

// Where each conversation is: "in lane N" or "parked" (for a chunk's title).
export function placesOf(picture) {
  const places = new Map();
  for (const c of picture.parked) places.set(c.conv_id, c.lane === null ? "parked in the pool" : `idle in lane ${c.lane}`);
  for (const lane of picture.lanes) if (lane.conv_id) places.set(lane.conv_id, `in lane ${lane.index}`);
  return places;
}

export class ChunkMap {
  constructor(container, group) {
    this.container = container;
    this.group = group;  // 0: the full group (or the only one), 1..: the windowed groups
    this.cells = [];
  }

  draw(map, chunkSize, places) {
    if (this.cells.length !== map.num_chunks) {
      this.container.replaceChildren();
      this.cells = [];
      for (let i = 0; i < map.num_chunks; i++) {
        const cell = document.createElement("div");
        cell.appendChild(document.createElement("div")).className = "fill";
        this.container.appendChild(cell);
        this.cells.push(cell);
      }
    }
    for (let i = 0; i < map.num_chunks; i++) {
      const cell = this.cells[i];
      const owner = map.chunk_owner[i], state = STATES[map.chunk_state[i]], holders = map.chunk_holders[i];
      cell.className = "chunk " + state + (holders > 1 ? " shared" : "");
      cell.dataset.chunk = String(i);
      cell.dataset.conv = String(owner);
      cell.dataset.state = state;
      cell.dataset.group = String(this.group);
      const where = owner && places.has(owner) ? ` (${places.get(owner)})` : "";
      cell.title = `chunk ${i}: ${state === "kept" ? "kept window" : state}` +
        (owner ? `, conversation #${owner}${where}` : "") +
        (holders > 1 ? `, shared by ${holders}` : "") + `, ${map.chunk_filled[i]}/${chunkSize} cells`;
      const fill = cell.firstChild;
      fill.style.height = `${(100 * map.chunk_filled[i]) / chunkSize}%`;
      cell.style.borderColor = owner ? convColor(owner) : "";
      fill.style.background = owner ? convColor(owner) : "";
    }
  }
}
