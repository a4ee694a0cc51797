// The console's core: the API key, calls to the gateway's JSON routes, a turn's events
// followed over SSE, small DOM helpers and the router that shows one view at a time.
// Data from the server is only ever placed as text (textContent, text nodes, attribute
// values): messages, ids, metadata and tool arguments may all hold markup. The API key
// comes from the URL fragment (#...key=..., never sent to the server in a URL) or the
// form, and is kept in sessionStorage for this tab (the approvals inbox keeps it there too).
"use strict";

const C = (window.convoqConsole = { key: null, me: null, views: {}, controller: null });

C.$ = (id) => document.getElementById(id);

// An element with properties and children (nodes, or strings as text: nothing is parsed as HTML).
C.el = function (tag, props, ...children) {
  const node = document.createElement(tag);
  const { dataset, ...rest } = props || {};
  Object.assign(node, rest);
  Object.assign(node.dataset, dataset || {});
  for (const child of children) {
    if (child !== null && child !== undefined && child !== false) node.append(child);
  }
  return node;
};

C.clear = (node) => { while (node.firstChild) node.firstChild.remove(); };

C.takeKey = function () {
  const match = /(?:^#|&)key=([^&]*)/.exec(location.hash);
  if (match) {
    const given = decodeURIComponent(match[1]);
    if (given !== sessionStorage.getItem("convoq-key")) C.me = null;
    sessionStorage.setItem("convoq-key", given);
    const rest = location.hash.replace(match[0], "").replace(/^#?&?/, "");
    history.replaceState(null, "", location.pathname + (rest ? "#" + rest : "#/conversations"));
  }
  C.key = sessionStorage.getItem("convoq-key");
  C.$("key-form").hidden = Boolean(C.key);
};

C.api = async function (method, path, body, signal) {
  const init = { method, headers: { Authorization: "Bearer " + C.key }, signal };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (response.status === 204) return {};
  let data;
  try {
    data = await response.json();
  } catch (error) {
    // A read cut off by leaving the page is no answer: nothing may render from it.
    if (response.ok || (signal && signal.aborted)) throw error;
    data = {};
  }
  if (!response.ok) {
    const error = new Error(data.detail || response.statusText);
    error.status = response.status;
    throw error;
  }
  return data;
};
C.get = (path, signal) => C.api("GET", path, undefined, signal);

C.blob = async function (path, type, signal) {
  const response = await fetch(path, { headers: { Authorization: "Bearer " + C.key }, signal });
  if (!response.ok) throw new Error("attachment: " + response.status);
  return new Blob([await response.arrayBuffer()], { type });
};

C.may = (scope) => Boolean(C.me && (C.me.scopes.includes(scope) || C.me.scopes.includes("admin")));

C.convPath = (cid) => "/v1/conversations/" + encodeURIComponent(cid);
C.turnPath = (cid, tid) => C.convPath(cid) + "/turns/" + encodeURIComponent(tid);
C.convHref = (cid) => "#/c/" + encodeURIComponent(cid);
C.turnHref = (cid, tid) => C.convHref(cid) + "/t/" + encodeURIComponent(tid);

C.when = (ms) => (ms ? new Date(ms).toLocaleString() : "—");
C.ago = function (ms) {
  if (!ms) return "—";
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 60) return s + "s ago";
  if (s < 3600) return Math.floor(s / 60) + "m ago";
  if (s < 86400) return Math.floor(s / 3600) + "h ago";
  return Math.floor(s / 86400) + "d ago";
};
C.json = (value) => JSON.stringify(value, null, 2);
C.status = (status) => C.el("span", { className: "status", textContent: status, dataset: { status } });
C.link = (href, text, className) => C.el("a", { href, textContent: text, className: className || "" });
C.facts = function (pairs) {
  const list = C.el("dl", { className: "facts" });
  for (const [name, value] of pairs) {
    if (value === null || value === undefined || value === "") continue;
    list.append(C.el("dt", { textContent: name }), C.el("dd", {}, value));
  }
  return list;
};
C.usage = (u) => (u ? u.prompt_tokens + " prompt · " + u.completion_tokens + " completion · "
  + u.total_tokens + " total tokens, " + u.requests + " model calls" : "—");
// US dollars, with the models the price table does not price named (never guessed).
C.usd = (n) => "$" + (n >= 0.01 || n === 0 ? n.toFixed(2) : n.toPrecision(2));
C.cost = (c) => (c ? C.usd(c.usd) + (c.unpriced.length ? " (not priced: " + c.unpriced.join(", ") + ")" : "") : null);

// Re-renders `container` with `render` only when `data` changed since its last render,
// keeping the keyboard focus on the link or control it was on (same href or action).
C.update = function (container, data, render) {
  const signature = JSON.stringify(data);
  if (container.dataset.signature === signature) return false;
  container.dataset.signature = signature;
  const active = document.activeElement;
  const mark = (node) => node.getAttribute("href") || node.dataset.action || node.id || null;
  const key = active && container.contains(active) ? mark(active) : null;
  C.clear(container);
  render();
  if (key) {
    for (const node of container.querySelectorAll("a, button, input, summary")) {
      if (mark(node) === key) { node.focus(); break; }
    }
  }
  return true;
};

C.notice = function (text, isError) {
  C.$("notice").textContent = text;
  C.$("notice").className = isError ? "error" : "";
};

// Runs `load` every `ms` until the view is left (its signal aborts), never two at once.
C.every = function (ms, load, signal) {
  const tick = async () => {
    if (signal.aborted) return;
    try {
      if (!document.hidden) await load();
    } catch (error) {
      if (!signal.aborted) C.notice("cannot refresh: " + error.message, true);
    }
    if (!signal.aborted) setTimeout(tick, ms);
  };
  setTimeout(tick, ms);
};

// A turn's events (the gateway's SSE route, read with fetch: it carries the key) from
// after `after`, each handed to onEvent({id, type, data}); reconnects where it stopped
// until "done" (or, with settled, the turn parked), or the signal aborts.
C.follow = async function (cid, tid, after, onEvent, signal, settled) {
  let last = after || "0";
  for (let round = 0; round < 100 && !signal.aborted; round++) {
    let ended = false;
    try {
      const query = "?after=" + encodeURIComponent(last) + (settled ? "&until=settled" : "");
      const response = await fetch(C.turnPath(cid, tid) + "/events" + query,
        { headers: { Authorization: "Bearer " + C.key, Accept: "text/event-stream" }, signal });
      if (!response.ok) return;
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const event = C.parseEvent(buffer.slice(0, cut));
          buffer = buffer.slice(cut + 2);
          if (!event) continue;
          last = event.id || last;
          const parks = event.type === "status" && event.data.status === "awaiting_approval";
          ended = ended || event.type === "done" || (settled && parks);
          onEvent(event);
        }
      }
    } catch (error) {
      if (signal.aborted) return;
      await new Promise((resolve) => setTimeout(resolve, 1000));
    }
    if (ended) return;
  }
};

C.parseEvent = function (block) {
  const event = { id: null, type: "message", data: {} };
  let data = null;
  for (const line of block.split("\n")) {
    if (line.startsWith("id: ")) event.id = line.slice(4);
    else if (line.startsWith("event: ")) event.type = line.slice(7);
    else if (line.startsWith("data: ")) data = line.slice(6);
  }
  if (data === null) return null;
  try { event.data = JSON.parse(data); } catch (error) { return null; }
  return event;
};

// The route in the fragment: #/conversations[?prefix=..], #/c/{cid}, #/c/{cid}/t/{tid},
// #/workers.
C.route = function () {
  const [path, query] = location.hash.replace(/^#/, "").split("?");
  const params = new URLSearchParams(query || "");
  const parts = path.split("/").filter(Boolean).map((p) => decodeURIComponent(p));
  if (parts[0] === "c" && parts.length === 2) return { view: "conversation", cid: parts[1], params };
  if (parts[0] === "c" && parts[2] === "t" && parts.length === 4) {
    return { view: "turn", cid: parts[1], tid: parts[3], params };
  }
  if (parts[0] === "workers") return { view: "workers", params };
  return { view: "conversations", params };
};

C.show = async function () {
  if (C.controller) C.controller.abort();
  const controller = (C.controller = new AbortController());
  const main = C.$("view");
  C.clear(main);
  main.dataset.state = "loading";
  if (!C.key) {
    main.append(C.el("p", { textContent: "Enter an API key with the read scope." }));
    return;
  }
  const route = C.route();
  for (const a of document.querySelectorAll("nav a[data-nav]")) {
    const here = a.dataset.nav === route.view || (a.dataset.nav === "conversations" && route.view !== "workers");
    if (here) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  try {
    if (!C.me) await C.whoAmI();
    await C.views[route.view](main, route, controller.signal);
    if (controller.signal.aborted) return;
    main.dataset.state = "ready";
    if (C.$("notice").className === "error") C.notice("", false);
    document.body.dataset.readyMs = String(Math.round(performance.now()));
    const heading = main.querySelector("h2");
    if (heading && document.activeElement === document.body) heading.focus();
  } catch (error) {
    if (controller.signal.aborted) return;
    // Nothing of what the view began to show stays: only why it cannot be shown.
    C.clear(main);
    main.append(C.el("p", { className: "muted", textContent: "This page cannot be shown." }));
    main.dataset.state = "error";
    C.notice("cannot show this page: " + error.message, true);
    if (error.status === 401) C.forget();
  }
};

C.whoAmI = async function () {
  C.me = await C.get("/v1/key");
  const prefix = C.me.conversation_prefix ? " · conversations " + C.me.conversation_prefix + "…" : "";
  C.$("who").textContent = "key " + C.me.name + " (" + C.me.scopes.join(", ") + ")" + prefix;
};

C.forget = function () {
  sessionStorage.removeItem("convoq-key");
  C.me = null;
  C.takeKey();
};

document.addEventListener("DOMContentLoaded", () => {
  C.$("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem("convoq-key", C.$("key").value);
    C.me = null;
    C.takeKey();
    C.show();
  });
  window.addEventListener("hashchange", () => {
    C.takeKey();
    C.show();
  });
  C.takeKey();
  C.show();
});
