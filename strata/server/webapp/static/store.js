// Conversations and settings, kept in this browser's localStorage.
// A conversation: {id, title, system, messages: [{role, content, cost?, stopped?, error?}], updated}.

const CONVERSATIONS = "strata.conversations";
const SETTINGS = "strata.settings";
export const DEFAULT_SETTINGS = { temperature: 0.7, top_p: 0.95, top_k: 0, max_tokens: 512, seed: null };

function read(key, fallback) {
  try {
    const value = JSON.parse(localStorage.getItem(key));
    return value === null ? fallback : value;
  } catch (e) {
    return fallback;
  }
}

export class Store {
  constructor() {
    const list = read(CONVERSATIONS, []);
    this.conversations = Array.isArray(list) ? list.filter((c) => c && typeof c.id === "string" && Array.isArray(c.messages)) : [];
    this.settings = Object.assign({}, DEFAULT_SETTINGS, read(SETTINGS, {}));
  }

  save() {
    localStorage.setItem(CONVERSATIONS, JSON.stringify(this.conversations));
    localStorage.setItem(SETTINGS, JSON.stringify(this.settings));
  }

  create() {
    const id = "c" + Date.now().toString(36) + Math.random().toString(36).slice(2, 6);
    const conversation = { id, title: "New chat", system: "", messages: [], updated: Date.now() };
    this.conversations.unshift(conversation);
    this.save();
    return conversation;
  }

  get(id) {
    return this.conversations.find((c) => c.id === id) || null;
  }

  remove(id) {
    this.conversations = this.conversations.filter((c) => c.id !== id);
    this.save();
  }

  touch(conversation) {
    conversation.updated = Date.now();
    const first = conversation.messages.find((m) => m.role === "user");
    if (first) conversation.title = first.content.slice(0, 48) || "New chat";
    this.conversations.sort((a, b) => b.updated - a.updated);
    this.save();
  }
}
