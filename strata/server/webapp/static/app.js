// The page's entry: tabs (#chat, #monitor), the API key dialog, and the model's name.

import { AuthNeeded, apiKey, getJson, setApiKey } from "./api.js";
import { Chat } from "./chat.js";
import { Monitor } from "./monitor.js";

const $ = (id) => document.getElementById(id);

function askKey() {
  const dialog = $("key-dialog");
  if (dialog.open) return;
  $("key-input").value = apiKey();
  dialog.showModal();
}

async function loadModel() {
  try {
    const models = await getJson("/v1/models");
    $("model-name").textContent = models.data.length ? models.data[0].id : "";
  } catch (err) {
    if (err instanceof AuthNeeded) askKey();
    else $("model-name").textContent = err.message;
  }
}

function show(tab, monitor) {
  const onMonitor = tab === "monitor";
  $("chat-view").hidden = onMonitor;
  $("monitor-view").hidden = !onMonitor;
  $("tab-chat").classList.toggle("active", !onMonitor);
  $("tab-monitor").classList.toggle("active", onMonitor);
  if (onMonitor) monitor.start(); else monitor.stop();
}

function main() {
  const monitor = new Monitor(askKey);
  const chat = new Chat(askKey);
  window.strataApp = { chat, monitor };  // for the browser tests and the console
  $("key-form").addEventListener("submit", (e) => {
    e.preventDefault();
    setApiKey($("key-input").value.trim());
    $("key-dialog").close();
    loadModel();
    if (!$("monitor-view").hidden) { monitor.stop(); monitor.start(); }
  });
  $("key-button").addEventListener("click", askKey);
  $("tab-chat").addEventListener("click", () => { location.hash = "chat"; });
  $("tab-monitor").addEventListener("click", () => { location.hash = "monitor"; });
  window.addEventListener("hashchange", () => show(location.hash.slice(1), monitor));
  show(location.hash.slice(1), monitor);
  loadModel();
}

main();
