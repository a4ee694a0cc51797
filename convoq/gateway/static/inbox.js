// The approvals inbox: polls /v1/approvals, renders every parked turn (its metadata, the
// conversation before it, its input and pending calls), sends decisions.
// Data from the server is only ever placed with textContent (tool arguments come from a
// model, messages and metadata from users: any of them may hold markup). The API key comes from the URL fragment (#key=..., never
// sent to the server in a URL) or the form, and is kept in sessionStorage for this tab.
"use strict";

const POLL_MS = 1000;
const state = { key: null, skew: 0, items: new Map() };
const $ = (id) => document.getElementById(id);

function takeKey() {
  const match = /(?:^|[#&])key=([^&]+)/.exec(location.hash);
  if (match) {
    sessionStorage.setItem("convoq-key", decodeURIComponent(match[1]));
    history.replaceState(null, "", location.pathname);
  }
  state.key = sessionStorage.getItem("convoq-key");
  $("key-form").hidden = Boolean(state.key);
}

async function api(method, path, body) {
  const init = { method, headers: { Authorization: "Bearer " + state.key } };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const data = await response.json().catch(() => ({}));
  if (!response.ok) {
    const error = new Error(data.detail || response.statusText);
    error.status = response.status;
    throw error;
  }
  return data;
}

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  Object.assign(node, props || {});
  for (const child of children) node.append(child);
  return node;
}

function expiresText(expiresMs) {
  const left = Math.max(0, Math.round((expiresMs - (Date.now() + state.skew)) / 1000));
  const h = Math.floor(left / 3600), m = Math.floor((left % 3600) / 60), s = left % 60;
  return "expires in " + (h ? h + "h " : "") + (h || m ? m + "m " : "") + s + "s";
}

// The console's pages of the turn and its conversation (the same tab keeps the key).
function consoleHref(turn) {
  return "/console#/c/" + encodeURIComponent(turn.conversation_id);
}

function turnPath(turn) {
  return "/v1/conversations/" + encodeURIComponent(turn.conversation_id) +
    "/turns/" + encodeURIComponent(turn.turn_id);
}

function showOutcome(text, isError) {
  $("outcome").textContent = text;
  $("outcome").className = isError ? "error" : "";
}

async function decide(turn, call, decision, reasonInput, buttons) {
  buttons.forEach((b) => { b.disabled = true; });
  const path = turnPath(turn) + "/approvals/" + encodeURIComponent(call.id);
  try {
    const body = { decision, reason: reasonInput.value || null };
    const after = await api("POST", path, body);
    const verb = decision === "approve" ? "Approved" : "Denied";
    const next = after.outcome === "resume"
      ? "the turn resumes on a worker" : "the turn waits for its other calls";
    const who = after.decision && after.decision.by ? " as " + after.decision.by : "";
    showOutcome(verb + " " + call.name + " (" + call.id + ") of turn " + turn.turn_id +
      " in " + turn.conversation_id + who + ": " + next + ".", false);
  } catch (error) {
    buttons.forEach((b) => { b.disabled = false; });
    showOutcome("Could not record the decision on " + call.id + ": " + error.message, true);
  }
  refresh();
}

// Who decided a call already (the turn waits for its other calls), and when.
function renderDecided(call, decided) {
  const verb = decided.approved ? "approved" : "denied";
  const when = decided.at_ms ? " at " + new Date(decided.at_ms).toLocaleString() : "";
  const why = decided.reason ? ": " + decided.reason : "";
  const node = el("div", { className: "call" },
    el("strong", { className: "tool", textContent: call.name }), " ",
    el("span", { className: "meta", textContent: call.id }), " ",
    el("span", { className: "decided",
      textContent: verb + " by " + (decided.by || "someone") + when + why }));
  node.dataset.callId = call.id;
  return node;
}

function renderCall(turn, call) {
  const decided = (turn.decisions || {})[call.id];
  if (decided) return renderDecided(call, decided);
  const reason = el("input", { className: "reason", placeholder: "reason (optional)" });
  const approve = el("button", { className: "approve", type: "button", textContent: "Approve" });
  const deny = el("button", { className: "deny", type: "button", textContent: "Deny" });
  const buttons = [approve, deny];
  approve.addEventListener("click", () => decide(turn, call, "approve", reason, buttons));
  deny.addEventListener("click", () => decide(turn, call, "deny", reason, buttons));
  const args = el("pre", { className: "arguments",
    textContent: JSON.stringify(call.arguments, null, 2) });
  const node = el("div", { className: "call" },
    el("strong", { className: "tool", textContent: call.name }), " ",
    el("span", { className: "meta", textContent: call.id }), args, reason, " ", approve, " ", deny);
  node.dataset.callId = call.id;
  return node;
}

// Attachments by name and type only: the server never sends their bytes here.
function renderAttachments(attachments, className) {
  return el("ul", { className: "attachments " + className },
    ...attachments.map((a) => el("li", {
      textContent: (a.filename || "(" + a.kind + ")") + " · " + a.mime_type })));
}

// The turn's metadata as given at submit (whose refund is this?), values as JSON.
function renderMetadata(metadata) {
  const list = el("dl", { className: "metadata" });
  for (const [name, value] of Object.entries(metadata || {})) {
    list.append(el("dt", { textContent: name }),
      el("dd", { textContent: typeof value === "string" ? value : JSON.stringify(value) }));
  }
  return list;
}

// The conversation's last few stored turns, oldest first: what led to this call.
function renderConversation(messages) {
  const list = el("ol", { className: "messages" }, ...messages.map((m) => {
    const item = el("li", { className: "message" },
      el("span", { className: "role", textContent: m.role }), " ",
      el("span", { className: "text", textContent: m.text }));
    item.dataset.role = m.role;
    if (m.tool_calls.length) {
      item.append(el("span", { className: "tool-calls",
        textContent: " called " + m.tool_calls.join(", ") }));
    }
    if (m.attachments.length) item.append(renderAttachments(m.attachments, "message-attachments"));
    return item;
  }));
  const heading = messages.length ? "Conversation before this turn (" + messages.length +
    " messages)" : "No earlier turns in this conversation";
  return el("details", { className: "conversation-before", open: messages.length > 0 },
    el("summary", { textContent: heading }), list);
}

function renderTurn(turn) {
  const expires = el("span", { className: "expires" });
  const node = el("li", { className: "turn" },
    el("h2", {}, el("span", { className: "agent", textContent: turn.agent }), " · ",
      el("span", { className: "conversation", textContent: turn.conversation_id })),
    el("div", { className: "meta" }, "turn " + turn.turn_id + " · ", expires, " · ",
      el("a", { className: "console-turn", href: consoleHref(turn) + "/t/" +
        encodeURIComponent(turn.turn_id), textContent: "timeline in the console" }), " · ",
      el("a", { className: "console-conversation", href: consoleHref(turn),
        textContent: "whole conversation" })),
    renderMetadata(turn.metadata),
    renderConversation(turn.conversation || []),
    el("div", { className: "input", textContent: turn.input_text }),
    renderAttachments(turn.input_attachments || [], "input-attachments"),
    ...turn.pending_approvals.map((call) => renderCall(turn, call)));
  node.dataset.turnId = turn.turn_id;
  node.dataset.conversationId = turn.conversation_id;
  return { node, expires, turn };
}

function tick() {
  for (const item of state.items.values()) {
    item.expires.textContent = expiresText(item.turn.expires_ms);
    const soon = item.turn.expires_ms - (Date.now() + state.skew) < 5 * 60 * 1000;
    item.expires.classList.toggle("soon", soon);
  }
}

function apply(data) {
  state.skew = data.now_ms - Date.now();
  const seen = new Set();
  const list = $("turns");
  data.turns.forEach((turn, index) => {
    const id = turn.conversation_id + "\u0000" + turn.turn_id;
    seen.add(id);
    let item = state.items.get(id);
    const decided = JSON.stringify(turn.decisions || {});
    if (item && item.decided !== decided) {
      item.node.remove();  // a call was decided since: shown with who decided it
      item = undefined;
    }
    if (!item) {
      item = renderTurn(turn);
      item.decided = decided;
      state.items.set(id, item);
    }
    if (list.children[index] !== item.node) list.insertBefore(item.node, list.children[index] || null);
  });
  for (const [id, item] of state.items) {
    if (!seen.has(id)) {
      item.node.remove();
      state.items.delete(id);
    }
  }
  const n = data.turns.length;
  $("status").textContent = n === 0 ? "nothing waits for approval"
    : n + (n === 1 ? " turn waits" : " turns wait") + " for approval";
  tick();
}

let timer = null;
async function refresh() {
  clearTimeout(timer);
  if (!state.key) {
    $("status").textContent = "enter an API key with the approve scope";
    return;
  }
  try {
    apply(await api("GET", "/v1/approvals"));
  } catch (error) {
    $("status").textContent = "cannot load approvals: " + error.message;
    if (error.status === 401 || error.status === 403) {
      sessionStorage.removeItem("convoq-key");
      takeKey();
      return;
    }
  }
  timer = setTimeout(refresh, POLL_MS);
}

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem("convoq-key", $("key").value);
  takeKey();
  refresh();
});
takeKey();
setInterval(tick, 1000);
refresh();
