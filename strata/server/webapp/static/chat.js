// The Chat page: conversations in a sidebar, streamed answers, stop, edit-and-resend,
// regenerate, the system prompt and sampling settings, and what each answer cost.
// Edits and regenerates resend a shorter history: the server finds the longest cached token
// prefix, so the new answer branches from the cached conversation (`cached_tokens`).

import { AuthNeeded, streamEvents } from "./api.js";
import { renderMarkdown } from "./markdown.js";
import { costLine } from "./cost.js";
import { Store } from "./store.js";

const $ = (id) => document.getElementById(id);

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

export class Chat {
  constructor(askKey) {
    this.askKey = askKey;
    this.store = new Store();
    this.current = null;
    this.controller = null;  // the AbortController of the answer being streamed
    $("new-chat").addEventListener("click", () => this.select(this.store.create().id));
    $("composer").addEventListener("submit", (e) => { e.preventDefault(); this.send(); });
    $("input").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); this.send(); }
    });
    $("stop").addEventListener("click", () => this.stop());
    $("system-prompt").addEventListener("input", (e) => {
      if (this.current) { this.current.system = e.target.value; this.store.save(); }
    });
    const numbers = { temperature: "temperature", top_p: "top-p", top_k: "top-k", max_tokens: "max-tokens", seed: "seed" };
    for (const [name, id] of Object.entries(numbers)) {
      const input = $(id);
      if (this.store.settings[name] !== null) input.value = this.store.settings[name];
      input.addEventListener("change", () => {
        this.store.settings[name] = input.value === "" ? null : Number(input.value);
        this.store.save();
      });
    }
    const first = this.store.conversations[0] || this.store.create();
    this.select(first.id);
  }

  get busy() { return this.controller !== null; }

  select(id) {
    if (this.busy) return;
    this.current = this.store.get(id);
    $("system-prompt").value = this.current.system || "";
    this.renderSidebar();
    this.renderMessages();
  }

  renderSidebar() {
    const list = $("conversations");
    list.replaceChildren();
    for (const c of this.store.conversations) {
      const item = el("li", c === this.current ? "active" : "");
      item.dataset.id = c.id;
      const open = item.appendChild(el("button", "open", c.title));
      open.type = "button";
      open.addEventListener("click", () => this.select(c.id));
      const remove = item.appendChild(el("button", "remove quiet", "×"));
      remove.type = "button";
      remove.title = "delete this conversation";
      remove.addEventListener("click", () => {
        if (this.busy && c === this.current) return;
        this.store.remove(c.id);
        const next = this.store.conversations[0] || this.store.create();
        this.select(next.id);
      });
      list.appendChild(item);
    }
  }

  renderMessages() {
    const box = $("messages");
    box.replaceChildren();
    this.current.messages.forEach((m, i) => box.appendChild(this.messageNode(m, i)));
    box.scrollTop = box.scrollHeight;
  }

  messageNode(message, index) {
    const node = el("div", "message " + message.role);
    node.dataset.role = message.role;
    node.dataset.index = String(index);
    const head = node.appendChild(el("div", "head"));
    head.appendChild(el("span", "who", message.role === "user" ? "you" : "assistant"));
    const body = node.appendChild(el("div", "content"));
    if (message.role === "assistant") renderMarkdown(message.content, body);
    else body.textContent = message.content;  // what the user typed, as typed
    const last = index === this.current.messages.length - 1;
    if (message.role === "user") {
      this.button(head, "edit", "Edit", () => this.edit(index, node));
    } else if (last) {
      this.button(head, "regenerate", "Regenerate", () => this.regenerate());
    }
    if (message.error) node.appendChild(el("div", "error", message.error));
    if (message.cost) node.appendChild(costLine(message.cost, message.stopped));
    else if (message.stopped) node.appendChild(el("div", "cost", "stopped"));
    return node;
  }

  button(parent, className, label, action) {
    const b = parent.appendChild(el("button", "quiet " + className, label));
    b.type = "button";
    b.addEventListener("click", () => { if (!this.busy) action(); });
    return b;
  }

  send() {
    const text = $("input").value;
    if (this.busy || !text.trim()) return;
    $("input").value = "";
    this.current.messages.push({ role: "user", content: text });
    this.answer();
  }

  regenerate() {
    const messages = this.current.messages;
    while (messages.length && messages[messages.length - 1].role === "assistant") messages.pop();
    if (messages.length) this.answer();
  }

  edit(index, node) {
    const body = node.querySelector(".content");
    const box = el("textarea", "editing");
    box.value = this.current.messages[index].content;
    body.replaceChildren(box);
    const row = node.appendChild(el("div", "buttons"));
    this.button(row, "resend", "Send", () => {
      this.current.messages.splice(index);  // this turn and everything after it
      this.current.messages.push({ role: "user", content: box.value });
      this.answer();
    });
    this.button(row, "cancel", "Cancel", () => this.renderMessages());
    box.focus();
  }

  stop() {
    if (this.controller) this.controller.abort();
  }

  requestBody() {
    const s = this.store.settings;
    const messages = [];
    if (this.current.system && this.current.system.trim()) messages.push({ role: "system", content: this.current.system });
    for (const m of this.current.messages) messages.push({ role: m.role, content: m.content });
    const body = { messages, stream: true, stream_options: { include_usage: true } };
    if (s.temperature !== null) body.temperature = s.temperature;
    if (s.top_p !== null) body.top_p = s.top_p;
    if (s.top_k) body.top_k = s.top_k;
    if (s.max_tokens) body.max_tokens = s.max_tokens;
    if (s.seed !== null && s.seed !== "") body.seed = s.seed;
    return body;
  }

  async answer() {
    const conversation = this.current;
    const body = this.requestBody();
    const message = { role: "assistant", content: "" };
    conversation.messages.push(message);
    this.store.touch(conversation);
    this.renderSidebar();
    this.renderMessages();
    const node = $("messages").lastElementChild;
    node.classList.add("streaming");
    const content = node.querySelector(".content");
    this.controller = new AbortController();
    $("stop").hidden = false;
    $("send").disabled = true;
    const sent = performance.now();
    const cost = { ttft_ms: null };
    let pending = false;
    const paint = () => { pending = false; renderMarkdown(message.content, content); $("messages").scrollTop = 1e9; };
    try {
      await streamEvents("/v1/chat/completions", body, (event) => {
        if (event.error) throw new Error(event.error.message || "the server ended the answer");
        if (event.usage) cost.usage = event.usage;
        if (event.timings) cost.timings = event.timings;
        const choice = event.choices && event.choices[0];
        if (!choice) return;
        const text = choice.delta && choice.delta.content;
        if (text) {
          if (cost.ttft_ms === null) cost.ttft_ms = performance.now() - sent;
          message.content += text;
          if (!pending) { pending = true; requestAnimationFrame(paint); }
        }
        if (choice.finish_reason) { cost.finish_reason = choice.finish_reason; cost.truncated = !!choice.truncated; }
      }, this.controller.signal);
    } catch (err) {
      if (err.name === "AbortError") message.stopped = true;
      else if (err instanceof AuthNeeded) { message.error = err.message; this.askKey(); }
      else message.error = err.message;
    } finally {
      cost.total_ms = performance.now() - sent;
      if (cost.usage || cost.timings) message.cost = cost;
      this.controller = null;
      $("stop").hidden = true;
      $("send").disabled = false;
      this.store.touch(conversation);
      if (conversation === this.current) this.renderMessages();
    }
  }
}

