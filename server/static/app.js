// slotserve's page: a chat playground (streamed), a slot inspector (save, restore,
// erase; slot files), and a live view of /metrics. Plain browser JavaScript, no build.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { history: [], controller: null, lastTokens: null, lastTime: null, names: {} };

function headers(json = true) {
  const h = json ? { "Content-Type": "application/json" } : {};
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function notice(text) {
  const box = $("notice");
  box.textContent = text || "";
  box.hidden = !text;
}

// Every call goes through here: a refused key or an error answer becomes one clear line.
async function api(path, options = {}) {
  const r = await fetch(path, { ...options, headers: { ...headers(options.body !== undefined), ...(options.headers || {}) } });
  if (r.status === 401) {
    notice("The server refused the API key: type the key it was started with (--api-key) in the box above.");
    throw new Error("unauthorized");
  }
  if (!r.ok) {
    let message = r.status + " " + r.statusText;
    try { message = (await r.json()).error.message; } catch (_) { /* not JSON */ }
    notice(message);
    throw new Error(message);
  }
  notice("");
  return r;
}

function addMessage(role, text, image) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  div.dataset.role = role;
  div.textContent = text;
  if (image) {  // the attached image, small, under the text
    const img = document.createElement("img");
    img.src = image;
    img.alt = "attached image";
    img.className = "attached";
    div.appendChild(img);
  }
  $("messages").appendChild(div);
  $("messages").scrollTop = $("messages").scrollHeight;
  return div;
}

// The chosen image file as a data: URL (null: none chosen).
function attachedImage() {
  const file = $("image").files[0];
  if (!file) return Promise.resolve(null);
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

async function send(event) {
  event.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || state.controller) return;
  $("prompt").value = "";
  const image = await attachedImage();
  $("image").value = "";
  const content = image ? [{ type: "text", text }, { type: "image_url", image_url: { url: image } }] : text;
  state.history.push({ role: "user", content });  // follow-ups send the image again: its cache is reused
  addMessage("user", text, image);
  const out = addMessage("assistant", "");
  const body = {
    messages: state.history,
    stream: true,
    temperature: Number($("temperature").value),
    top_p: Number($("top-p").value),
    max_tokens: Number($("max-tokens").value),
    id_slot: Number($("chat-slot").value),
    stream_options: { include_usage: true },
  };
  state.controller = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  let reply = "";
  try {
    const r = await api("v1/chat/completions", { method: "POST", body: JSON.stringify(body), signal: state.controller.signal });
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const frame = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        if (!frame.startsWith("data: ") || frame === "data: [DONE]") continue;
        const data = JSON.parse(frame.slice(6));
        if (data.error) { notice(data.error.message); continue; }
        const delta = (data.choices[0] || {}).delta || {};
        reply += (delta.reasoning_content || "") + (delta.content || "");
        out.textContent = reply;
        if (data.usage) {
          const meta = document.createElement("span");
          meta.className = "meta";
          meta.textContent = data.usage.completion_tokens + " tokens, " + data.usage.prompt_tokens_details.cached_tokens + " cached";
          out.appendChild(meta);
        }
      }
    }
  } catch (err) {
    if (err.name === "AbortError") out.dataset.stopped = "true";
  } finally {
    state.history.push({ role: "assistant", content: reply });
    state.controller = null;
    $("send").disabled = false;
    $("stop").disabled = true;
    refreshSlots();
  }
}

function cell(row, text) {
  const td = document.createElement("td");
  td.textContent = text;
  row.appendChild(td);
  return td;
}

function button(td, label, action) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.addEventListener("click", action);
  td.appendChild(b);
  return b;
}

async function slotAction(id, action, filename) {
  const body = filename ? JSON.stringify({ filename }) : undefined;
  await api(`slots/${id}?action=${action}`, { method: "POST", body });
  await refreshSlots();
}

async function refreshSlots() {
  try {
    const slots = await (await api("slots")).json();
    const body = $("slots").querySelector("tbody");
    body.replaceChildren();
    for (const s of slots) {
      const row = document.createElement("tr");
      row.dataset.slot = s.id;
      cell(row, s.id);
      cell(row, s.is_processing ? "busy" : "idle");
      cell(row, s.n_cached);
      cell(row, s.cache.map((g) => g.n_shared || 0).reduce((a, b) => a + b, 0) + " blocks");
      const input = document.createElement("input");
      input.value = state.names[s.id] || "slot-" + s.id + ".slot";  // kept across refreshes
      input.size = 12;
      input.addEventListener("input", () => { state.names[s.id] = input.value; });
      cell(row, "").appendChild(input);
      const actions = cell(row, "");
      button(actions, "save", () => slotAction(s.id, "save", input.value));
      button(actions, "restore", () => slotAction(s.id, "restore", input.value));
      button(actions, "erase", () => slotAction(s.id, "erase"));
      body.appendChild(row);
    }
    await refreshFiles();
  } catch (_) { /* notice shown */ }
}

async function refreshFiles() {
  const body = $("files").querySelector("tbody");
  body.replaceChildren();
  let files;
  try {
    files = (await (await api("slots/files")).json()).data;
  } catch (_) {
    return; // slot files off (no --slot-save-path): the notice says so
  }
  for (const f of files) {
    const row = document.createElement("tr");
    row.dataset.file = f.filename;
    cell(row, f.filename);
    cell(row, (f.size / 1e6).toFixed(1) + " MB");
    cell(row, f.n_tokens);
    cell(row, new Date(f.created * 1000).toLocaleString());
    cell(row, f.model_match ? "this model" : "another model");
    button(cell(row, ""), "delete", async () => {
      await api("slots/files/" + encodeURIComponent(f.filename), { method: "DELETE" });
      refreshFiles();
    });
    body.appendChild(row);
  }
}

async function refreshLive() {
  try {
    const r = await api("live");
    if (!r.ok) return;
    const live = await r.json();
    const now = performance.now();
    if (state.lastTokens !== null) {
      $("live-tps").textContent = ((live.generated_tokens - state.lastTokens) / ((now - state.lastTime) / 1000)).toFixed(1);
    }
    state.lastTokens = live.generated_tokens;
    state.lastTime = now;
    $("live-running").textContent = live.requests_running ?? "–";
    $("live-waiting").textContent = live.requests_waiting ?? "–";
    const used = live.cache_bytes_used, cap = live.cache_bytes_capacity;
    if (used !== null && cap) $("live-kv").textContent = (100 * used / cap).toFixed(1) + "% of " + (cap / 2 ** 20).toFixed(0) + " MiB";
  } catch (_) { /* the next tick tries again */ }
}

async function describe() {
  try {
    const props = await (await api("props")).json();
    $("model").textContent = props.model_alias + " · context " + props.default_generation_settings.n_ctx + " per slot · " + props.total_slots + " slots";
    $("attach").hidden = !(props.modalities && props.modalities.vision);  // images for a model that takes them
  } catch (_) { /* notice shown */ }
}

function start() {
  $("api-key").value = sessionStorage.getItem("slotserve-key") || "";
  $("api-key").addEventListener("change", () => {
    sessionStorage.setItem("slotserve-key", $("api-key").value);
    describe();
    refreshSlots();
  });
  $("chat-form").addEventListener("submit", send);
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) send(e);
  });
  $("stop").addEventListener("click", () => state.controller && state.controller.abort());
  $("clear").addEventListener("click", () => { state.history = []; $("messages").replaceChildren(); });
  $("refresh").addEventListener("click", refreshSlots);
  describe();
  refreshSlots();
  refreshLive();
  setInterval(refreshLive, 2000);
}

start();
