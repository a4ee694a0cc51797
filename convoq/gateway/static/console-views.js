// The console's views of conversations and workers: the list of conversations, one
// conversation (its transcript, turns, inbox, summary and usage, live while a turn runs)
// and the workers with the backlog per partition. Everything from the server is text.
"use strict";

(function () {
  const C = window.convoqConsole;
  const el = C.el;

  function heading(text) {
    return el("h2", { textContent: text, tabIndex: -1 });
  }

  // -- the list of conversations -------------------------------------------------------
  C.views.conversations = async function (main, route, signal) {
    const prefix = route.params.get("prefix") || "";
    const input = el("input", { id: "prefix", type: "search", value: prefix,
      placeholder: "conversation id starts with…", autocomplete: "off" });
    input.setAttribute("aria-label", "Conversation id prefix");
    const form = el("form", { className: "search", role: "search" }, input,
      el("button", { type: "submit", textContent: "Search" }));
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      location.hash = "#/conversations" + (input.value ? "?prefix=" + encodeURIComponent(input.value) : "");
    });
    const summary = el("p", { className: "muted", id: "found" });
    const body = el("tbody");
    const table = el("table", { id: "conversations" },
      el("thead", {}, el("tr", {}, ...["Conversation", "Latest turn", "Activity", "Stored turns",
        "Queued", "Now"].map((t) => el("th", { textContent: t })))), body);
    main.append(heading("Conversations"), form, summary, table);

    async function load() {
      const query = "?limit=100" + (prefix ? "&prefix=" + encodeURIComponent(prefix) : "");
      const data = await C.get("/v1/conversations" + query, signal);
      C.update(body, data.conversations, () => {
        for (const row of data.conversations) body.append(conversationRow(row));
      });
      const partial = data.complete ? "" : " (the scan stopped at its bound: narrow the prefix)";
      summary.textContent = data.found + (data.found === 1 ? " conversation" : " conversations")
        + (data.found > data.conversations.length ? ", the " + data.conversations.length + " latest shown" : "")
        + partial;
    }
    await load();
    C.every(10000, load, signal);  // each is a SCAN of the keyspace: not too often
  };

  function conversationRow(row) {
    const latest = row.latest_turn;
    const now = [];
    if (row.running) now.push(C.status("running"));
    if (row.parked) now.push(C.status("awaiting_approval"));
    const tr = el("tr", { dataset: { conversationId: row.conversation_id } },
      el("td", { className: "id" }, C.link(C.convHref(row.conversation_id), row.conversation_id)),
      el("td", {}, latest ? C.status(latest.status) : "—", " ",
        latest ? C.link(C.turnHref(row.conversation_id, latest.turn_id), latest.turn_id, "mono") : ""),
      el("td", { className: "when", textContent: C.ago(row.activity_ms),
        title: C.when(row.activity_ms) }),
      el("td", { textContent: String(row.stored_turns) }),
      el("td", { className: "queued", textContent: String(row.queued) }),
      el("td", {}, ...now));
    return tr;
  }

  // -- one conversation ----------------------------------------------------------------
  C.views.conversation = async function (main, route, signal) {
    const cid = route.cid;
    const facts = el("div", { id: "facts" });
    const live = el("div", { id: "live", className: "live", hidden: true });
    const inbox = el("div", { id: "inbox" });
    const transcript = el("ol", { className: "transcript", id: "transcript" });
    const olderMessages = el("button", { type: "button", textContent: "Older turns", hidden: true });
    const turns = el("tbody");
    const olderTurns = el("button", { type: "button", textContent: "Older turns", hidden: true });
    main.append(heading(cid), facts, live, inbox, el("div", { className: "columns" },
      el("section", { "ariaLabel": "Transcript" }, el("h3", { textContent: "Transcript (newest first)" }),
        transcript, el("div", { className: "more" }, olderMessages)),
      el("section", {}, el("h3", { textContent: "Turns (newest first)" }),
        el("table", { id: "turns" }, el("thead", {}, el("tr", {}, ...["Turn", "Status", "Agent",
          "Created"].map((t) => el("th", { textContent: t })))), turns),
        el("div", { className: "more" }, olderTurns))));

    const state = { seen: null, following: null, messagesBefore: null, turnsBefore: null };
    const path = C.convPath(cid);

    async function loadMessages(reset) {
      const before = reset ? null : state.messagesBefore;
      const page = await C.get(path + "/transcript?limit=20" + (before ? "&before=" + before : ""), signal);
      if (reset) C.clear(transcript);
      for (const turn of page.turns) transcript.append(C.storedTurn(cid, turn, signal));
      if (page.lead.length) transcript.append(C.storedTurn(cid, { index: -1, messages: page.lead }, signal));
      if (!page.total && reset) transcript.append(el("li", { className: "muted", textContent: "Nothing stored yet." }));
      state.messagesBefore = page.next_before;
      olderMessages.hidden = page.next_before === null;
    }
    async function loadTurns(reset) {
      const before = reset ? null : state.turnsBefore;
      const page = await C.get(path + "/turns?limit=50" + (before ? "&before=" + encodeURIComponent(before) : ""), signal);
      if (reset) {
        C.update(turns, page.turns, () => { for (const turn of page.turns) turns.append(turnRow(turn)); });
      } else {
        for (const turn of page.turns) turns.append(turnRow(turn));
      }
      state.turnsBefore = page.next_before;
      olderTurns.hidden = page.next_before === null;
    }
    async function loadOverview() {
      const seen = await C.get(path, signal);
      const changed = !state.seen || seen.stored_turns !== state.seen.stored_turns
        || JSON.stringify(seen.inbox) !== JSON.stringify(state.seen.inbox);
      state.seen = seen;
      C.update(facts, seen, () => facts.append(overviewFacts(seen)));
      C.update(inbox, seen.inbox, () => { if (seen.inbox.length) inbox.append(inboxList(cid, seen)); });
      followHead(seen);
      return changed;
    }
    function followHead(seen) {
      const head = seen.inbox[0];
      const running = head && seen.lease && seen.lease.state === "active" ? head.turn_id : null;
      if (running === state.following) return;
      state.following = running;
      live.hidden = !running;
      if (!running) return;
      C.clear(live);
      const said = el("span", { className: "said" });
      live.append(el("strong", { textContent: "Running now: " }), C.link(C.turnHref(cid, running), running, "mono"),
        " ", C.status("running"), el("div", {}, said));
      C.follow(cid, running, "0", (event) => {
        if (event.type === "text_delta") said.append(String(event.data.text || ""));
        // A retried model call's text streams again from its start (text_retracted).
        else if (["assistant", "tool_result", "text_retracted"].includes(event.type)) C.clear(said);
        if (event.type === "done" || event.type === "status") refresh();
      }, signal, true);
    }
    let pending = null;
    function refresh() {
      clearTimeout(pending);
      pending = setTimeout(async () => {
        if (signal.aborted) return;
        try {
          if (await loadOverview()) await Promise.all([loadMessages(true), loadTurns(true)]);
        } catch (error) {
          // Outside the view's own load: a notice, never an uncaught error; none once left.
          if (!signal.aborted) C.notice("cannot refresh this conversation: " + error.message, true);
        }
      }, 200);
    }
    olderMessages.addEventListener("click", () => loadMessages(false));
    olderTurns.addEventListener("click", () => loadTurns(false));
    await Promise.all([loadOverview(), loadMessages(true), loadTurns(true)]);
    C.every(3000, async () => {
      if (await loadOverview()) await Promise.all([loadMessages(true), loadTurns(true)]);
    }, signal);
  };

  function overviewFacts(seen) {
    const lease = seen.lease ? seen.lease.state + (seen.lease.holder ? " · " + seen.lease.holder : "") : "free";
    const summary = seen.summary ? el("span", {}, el("span", { className: "summary", textContent: seen.summary.text }),
      el("span", { className: "muted watermark", textContent: " (covers the first " + seen.summary.watermark + " turns)" })) : "none";
    return C.facts([
      ["Stored turns", String(seen.stored_turns)],
      ["Stored bytes", String(seen.stored_bytes)],
      ["Usage so far", C.usage(seen.usage)],
      ["Cost so far", C.cost(seen.cost)],
      ["Summary", summary],
      ["Inbox", seen.inbox_length + (seen.inbox_length === 1 ? " turn" : " turns")],
      ["Lease", lease],
    ]);
  }

  function inboxList(cid, seen) {
    return el("div", {}, el("h3", { textContent: "Inbox (head first)" }),
      el("ol", { className: "inbox" }, ...seen.inbox.map((t) => el("li", { dataset: { turnId: t.turn_id } },
        C.link(C.turnHref(cid, t.turn_id), t.turn_id, "mono"), " ", C.status(t.status), " ",
        el("span", { className: "muted", textContent: t.agent })))));
  }

  function turnRow(turn) {
    const error = turn.error ? el("div", { className: "muted error", textContent: turn.error.type + ": " + turn.error.message }) : null;
    return el("tr", { dataset: { turnId: turn.turn_id } },
      el("td", { className: "id" }, C.link(C.turnHref(turn.conversation_id, turn.turn_id), turn.turn_id)),
      el("td", {}, C.status(turn.status), error),
      el("td", { textContent: turn.agent }),
      el("td", { className: "when", textContent: C.when(turn.created_ms) }));
  }

  // -- the transcript ------------------------------------------------------------------
  C.storedTurn = function (cid, turn, signal) {
    const item = el("li", { className: "stored-turn", dataset: { index: String(turn.index) } });
    for (const message of turn.messages) item.append(C.message(cid, message, signal));
    return item;
  };

  C.message = function (cid, message, signal) {
    const node = el("div", { className: "message", dataset: { role: message.role } });
    if (message.role === "tool") {
      const decided = message.decision ? " · " + (message.decision.approved ? "approved" : "denied")
        + (message.decision.by ? " by " + message.decision.by : "") : "";
      node.append(el("details", { className: "tool tool-result" },
        el("summary", { textContent: "result of " + (message.name || message.tool_call_id || "a tool") + decided }),
        el("pre", { textContent: textOf(message) })));
      return node;
    }
    node.append(el("span", { className: "role", textContent: message.role }));
    const text = textOf(message);
    if (text) node.append(el("span", { className: "text", textContent: text }));
    if (message.refusal) node.append(el("div", { className: "refusal", textContent: "refused: " + message.refusal }));
    const attached = message.content.filter((p) => p.type !== "text");
    if (attached.length) node.append(el("div", { className: "attachments" }, ...attached.map((p) => attachment(cid, p, signal))));
    for (const call of message.tool_calls || []) {
      node.append(el("details", { className: "tool tool-call", dataset: { callId: call.id } },
        el("summary", { textContent: "calls " + call.name + " (" + call.id + ")" }),
        el("pre", { className: "arguments", textContent: C.json(call.arguments) })));
    }
    if (message.finish_reason || message.usage) {
      node.append(el("div", { className: "muted", textContent: [message.finish_reason,
        message.usage ? message.usage.total_tokens + " tokens" : null].filter(Boolean).join(" · ") }));
    }
    return node;
  };

  function textOf(message) {
    return message.content.filter((p) => p.type === "text").map((p) => p.text).join("");
  }

  // Images are fetched with the key and shown from a blob: URL; other files download.
  function attachment(cid, part, signal) {
    const name = part.filename || part.type;
    const size = part.size !== null && part.size !== undefined ? " · " + part.size + " bytes" : "";
    const path = C.convPath(cid) + "/attachments/" + encodeURIComponent(part.sha256 || "");
    if (part.type === "image" && /^image\/[a-z0-9.+-]+$/i.test(part.mime_type) && part.sha256) {
      const img = el("img", { alt: "image " + part.mime_type + size });
      img.dataset.sha256 = part.sha256;
      C.blob(path, part.mime_type, signal).then((blob) => {
        img.src = URL.createObjectURL(blob);
      }).catch(() => { img.alt = "image not available"; });
      return img;
    }
    const button = el("button", { type: "button", className: "download",
      textContent: "Download " + name + " (" + part.mime_type + size + ")" });
    button.dataset.sha256 = part.sha256 || "";
    button.disabled = !part.sha256;
    button.addEventListener("click", async () => {
      const blob = await C.blob(path, "application/octet-stream", signal);
      const link = el("a", { href: URL.createObjectURL(blob), download: part.filename || part.sha256 });
      document.body.append(link);
      link.click();
      link.remove();
    });
    return button;
  }

  // -- workers -------------------------------------------------------------------------
  C.views.workers = async function (main, route, signal) {
    const workers = el("tbody");
    const partitions = el("tbody");
    const note = el("p", { className: "muted", id: "elsewhere" });
    main.append(heading("Workers"),
      el("table", { id: "workers" }, el("thead", {}, el("tr", {}, ...["Worker", "State", "Last seen",
        "Slots in use", "Profiles", "Queues", "Worker id", "MCP servers"].map((t) => el("th", { textContent: t })))), workers),
      el("h3", { textContent: "Backlog per partition" }), note,
      el("table", { id: "partitions" }, el("thead", {}, el("tr", {}, ...["Partition", "Queue", "Queued",
        "Running", "Parked"].map((t) => el("th", { textContent: t })))), partitions));

    async function load() {
      const data = await C.get("/v1/workers", signal);
      C.update(workers, data.workers, () => {
        for (const w of data.workers) workers.append(workerRow(w));
        if (!data.workers.length) workers.append(el("tr", {}, el("td", { colSpan: 7, textContent: "No worker registered." })));
      });
      C.update(partitions, data.partitions, () => renderPartitions(partitions, data.partitions));
      note.textContent = (data.elsewhere ? data.elsewhere + " turns run under leases no registered worker holds (in process). " : "")
        + (data.complete ? "" : "The scan of inboxes stopped at its bound: the counts are partial.");
    }
    await load();
    C.every(2000, load, signal);
  };

  function renderPartitions(partitions, rows) {
      for (const p of rows) {
        partitions.append(el("tr", { dataset: { partition: String(p.partition) } },
          el("td", { textContent: String(p.partition) }), el("td", { className: "mono", textContent: p.queue }),
          el("td", { className: "queued", textContent: String(p.queued) }),
          el("td", { className: "running", textContent: String(p.running) }),
          el("td", { className: "parked", textContent: String(p.parked) })));
      }
  }

  function workerRow(w) {
    const slots = w.running + " of " + (w.concurrency === null ? "?" : w.concurrency);
    return el("tr", { dataset: { worker: w.name } },
      el("td", { className: "id", textContent: w.name }),
      el("td", {}, C.status(w.alive ? "alive" : "dead")),
      el("td", { className: "when", textContent: w.last_seen_s === null ? "—" : w.last_seen_s + "s ago", title: w.last_seen || "" }),
      el("td", { className: "slots", textContent: slots }),
      el("td", { textContent: w.agents.join(", ") }),
      el("td", { className: "mono", textContent: w.queues.join(", ") }),
      el("td", { className: "mono", textContent: w.worker_id || "—" }),
      el("td", { className: "mcp", textContent: mcpText(w.mcp) }));
  }

  // Each MCP server a worker uses: its state (connected, unreachable, not started: no turn
  // needed it yet), how many tools it lists, its last error.
  function mcpText(servers) {
    if (!servers.length) return "—";
    return servers.map((m) => m.name + ": " + m.state
      + (m.tools === null ? "" : " (" + m.tools + " tools)") + (m.error ? " — " + m.error : "")).join("; ");
  }
})();
