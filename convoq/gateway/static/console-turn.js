// The console's view of one turn: its record, the actions the key may take (cancel,
// approve, deny, discard: through the API's own turn routes) and the timeline of its steps,
// followed live over the turn's event stream while it is not final.
"use strict";

(function () {
  const C = window.convoqConsole;
  const el = C.el;
  const FINAL = ["succeeded", "failed", "cancelled", "expired"];

  C.views.turn = async function (main, route, signal) {
    const { cid, tid } = route;
    const parts = {
      head: el("div", { id: "turn-head" }),
      before: el("div", { id: "before" }),
      actions: el("div", { id: "actions" }),
      steps: el("ol", { className: "steps", id: "steps" }),
    };
    main.append(
      el("p", {}, "Conversation ", C.link(C.convHref(cid), cid, "mono conversation-link")),
      el("h2", { textContent: "Turn " + tid, tabIndex: -1 }),
      parts.head, parts.before, parts.actions,
      el("h3", { textContent: "Timeline" }), parts.steps);

    let following = false;
    let pending = null;
    async function load() {
      const turn = await C.get(C.turnPath(cid, tid) + "/timeline", signal);
      render(parts, turn, load, signal);
      if (!following && !FINAL.includes(turn.status)) {
        following = true;
        C.follow(cid, tid, turn.last_event_id, () => {
          clearTimeout(pending);
          // Outside the view's own load: a failure here shows as a notice, never uncaught.
          pending = setTimeout(() => {
            if (!signal.aborted) load().catch((error) => { if (!signal.aborted) C.notice("cannot refresh this turn: " + error.message, true); });
          }, 150);
        }, signal, false).finally(() => { following = false; });
      }
    }
    await load();
    const first = parts.head.querySelector(".status");
    if (first && !FINAL.includes(first.dataset.status)) await before(parts.before, cid, signal);
  };

  // A turn not final yet comes after every stored turn: the newest of them are the
  // conversation that led to it (what a person deciding on its tool calls reads).
  async function before(box, cid, signal) {
    const page = await C.get(C.convPath(cid) + "/transcript?limit=3", signal);
    if (!page.turns.length) return;
    box.append(el("h3", { textContent: "The conversation before it (latest stored turns)" }),
      el("ol", { className: "transcript" }, ...page.turns.reverse().map((t) => C.storedTurn(cid, t, signal))));
  }

  function render(parts, turn, reload, signal) {
    C.update(parts.head, { ...turn, steps: null }, () => renderHead(parts.head, turn));
    const asked = [turn.status, turn.pending_approvals, turn.decisions, C.me && C.me.scopes];
    C.update(parts.actions, asked, () => renderActions(parts.actions, turn, reload, signal));
    C.update(parts.steps, turn.steps, () => {
      for (const step of turn.steps) parts.steps.append(renderStep(step));
    });
  }

  function renderHead(head, turn) {
    head.append(C.facts([
      ["Status", C.status(turn.status)],
      ["Agent", turn.agent],
      ["Running on", turn.running_on],
      ["Created", C.when(turn.created_ms)],
      ["Started", turn.started_ms ? C.when(turn.started_ms) : null],
      ["Finished", turn.finished_ms ? C.when(turn.finished_ms) : null],
      ["Attempts", String(turn.attempts)],
      ["Retries", turn.retries ? String(turn.retries) : null],
      ["Usage", turn.usage.requests ? C.usage(turn.usage) : null],
      ["Cost", C.cost(turn.cost)],
      ["Options", Object.keys(turn.options).length ? el("pre", { className: "options", textContent: C.json(turn.options) }) : null],
    ]), family(turn), metadata(turn.metadata), el("h3", { textContent: "Input" }),
    el("div", { className: "message input", dataset: { role: "user" } },
      el("span", { className: "text", textContent: turn.input_text }),
      ...turn.input_attachments.map((a) => el("div", { className: "muted attachment-note",
        textContent: (a.filename || "(" + a.kind + ")") + " · " + a.mime_type }))));
    if (turn.text) head.append(el("h3", { textContent: "Answer" }), el("div", { className: "message answer", dataset: { role: "assistant" }, textContent: turn.text }));
    if (turn.error) head.append(el("h3", { textContent: "Error" }), el("pre", { className: "error", textContent: turn.error.type + ": " + turn.error.message }));
  }

  // The call this turn answers (a sub-agent's child turn) and the child turns it made,
  // each a link to its own timeline.
  function family(turn) {
    const box = el("div", { className: "family" });
    if (turn.parent) {
      box.append(el("p", { className: "parent" }, "Answers call ",
        el("span", { className: "mono", textContent: turn.parent.call_id }), " of ",
        C.link(C.turnHref(turn.parent.conversation_id, turn.parent.turn_id), turn.parent.turn_id, "mono parent-link")));
    }
    if (turn.children.length) {
      box.append(el("h3", { textContent: "Child turns" }), el("ul", { className: "children" },
        ...turn.children.map((c) => el("li", { dataset: { callId: c.call_id } },
          el("span", { className: "agent", textContent: c.agent }), " for ",
          el("span", { className: "mono", textContent: c.call_id }), ": ",
          C.link(C.turnHref(c.conversation_id, c.turn_id), c.turn_id, "mono child-link"), " ", C.status(c.status),
          c.usage.requests ? el("span", { className: "muted", textContent: " · " + C.usage(c.usage) }) : ""))));
    }
    return box;
  }

  // The turn's metadata as given at submit (whose refund is this?), values as JSON text.
  function metadata(values) {
    const entries = Object.entries(values || {});
    if (!entries.length) return el("p", { className: "muted", textContent: "No metadata." });
    const list = el("dl", { className: "metadata" });
    for (const [name, value] of entries) {
      list.append(el("dt", { textContent: name }),
        el("dd", { textContent: typeof value === "string" ? value : JSON.stringify(value) }));
    }
    return el("div", {}, el("h3", { textContent: "Metadata" }), list);
  }

  // Only what the key's scopes allow: approve/deny/discard (approve), cancel (submit).
  function renderActions(box, turn, reload) {
    if (turn.status === "awaiting_approval" && C.may("approve")) {
      for (const call of turn.pending_approvals) {
        if (!turn.decisions[call.id]) box.append(pendingCall(turn, call, reload));
      }
      box.append(el("div", { className: "actions" }, button("Discard turn", "danger", "discard",
        () => act("POST", C.turnPath(turn.conversation_id, turn.turn_id) + "/discard", undefined, "Discarded the turn.", reload))));
    }
    if (!FINAL.includes(turn.status) && C.may("submit")) {
      box.append(el("div", { className: "actions" }, button("Cancel turn", "danger", "cancel",
        () => act("POST", C.turnPath(turn.conversation_id, turn.turn_id) + "/cancel", undefined, "Cancel asked.", reload))));
    }
  }

  function pendingCall(turn, call, reload) {
    const reason = el("input", { className: "reason", placeholder: "reason (optional)" });
    reason.setAttribute("aria-label", "Reason for " + call.name);
    reason.dataset.action = "reason:" + call.id;
    const path = C.turnPath(turn.conversation_id, turn.turn_id) + "/approvals/" + encodeURIComponent(call.id);
    const decide = (decision) => act("POST", path, { decision, reason: reason.value || null },
      (decision === "approve" ? "Approved " : "Denied ") + call.name + " (" + call.id + ").", reload);
    return el("div", { className: "pending", dataset: { callId: call.id } },
      el("strong", { className: "tool", textContent: call.name }), " ",
      el("span", { className: "muted", textContent: call.id }),
      el("pre", { className: "arguments", textContent: C.json(call.arguments) }),
      el("div", { className: "actions" }, reason,
        button("Approve", "approve", "approve:" + call.id, () => decide("approve")),
        button("Deny", "deny", "deny:" + call.id, () => decide("deny"))));
  }

  function button(text, className, action, onClick) {
    const node = el("button", { type: "button", className, textContent: text });
    node.dataset.action = action;
    node.addEventListener("click", async () => {
      node.disabled = true;
      try { await onClick(); } finally { node.disabled = false; }
    });
    return node;
  }

  async function act(method, path, body, done, reload) {
    try {
      await C.api(method, path, body);
      C.notice(done, false);
    } catch (error) {
      C.notice("Not done: " + error.message, true);
    }
    await reload();
  }

  function renderStep(step) {
    const item = el("li", { className: "step", dataset: { kind: step.kind } });
    const when = el("span", { className: "when", textContent: step.at_ms ? new Date(step.at_ms).toLocaleTimeString() + " " : "" });
    item.append(when);
    const show = STEPS[step.kind] || STEPS.event;
    show(item, step);
    return item;
  }

  const STEPS = {
    status: (item, s) => item.append(el("span", { className: "kind", textContent: "status" }), C.status(s.status)),
    run: (item, s) => item.append(el("span", { className: "kind", textContent: "run " + s.run }), "started on a worker"),
    resumed: (item, s) => item.append(el("span", { className: "kind", textContent: "resumed" }),
      el("span", { className: "reason", textContent: s.reason }), s.attempt ? " · attempt " + s.attempt : ""),
    model_call: (item, s) => {
      item.append(el("span", { className: "kind", textContent: "model call " + s.index }),
        el("span", { className: "muted", textContent: [s.model, s.latency_ms !== null ? s.latency_ms + " ms" : null,
          s.finish_reason ? "finish " + s.finish_reason : null,
          s.usage ? s.usage.prompt_tokens + "+" + s.usage.completion_tokens + " tokens" : null,
          s.cost_usd !== null && s.cost_usd !== undefined ? C.usd(s.cost_usd) : null,
          s.worker ? "on " + s.worker : null].filter(Boolean).join(" · ") }));
      if (s.text) item.append(el("div", { className: "text", textContent: s.text }));
      if (s.refusal) item.append(el("div", { className: "refusal", textContent: "refused: " + s.refusal }));
      if (s.settings) item.append(el("details", {}, el("summary", { textContent: "settings" }), el("pre", { textContent: C.json(s.settings) })));
    },
    tool_call: (item, s) => {
      item.dataset.callId = s.call_id;
      item.append(el("span", { className: "kind", textContent: "tool call" }),
        el("strong", { className: "tool", textContent: s.name }), " ",
        el("span", { className: "muted", textContent: [s.call_id, s.runs > 1 ? "ran " + s.runs + " times" : null,
          s.worker ? "on " + s.worker : null].filter(Boolean).join(" · ") }),
        el("details", { className: "tool" }, el("summary", { textContent: "arguments and result" }),
          el("pre", { className: "arguments", textContent: C.json(s.arguments) }),
          el("pre", { className: "result", textContent: s.result === null ? "(no result yet)" : s.result }),
          el("div", { className: "muted idempotency", textContent: "idempotency key " + (s.idempotency_key || "—") })));
    },
    approval: (item, s) => {
      item.dataset.callId = s.call_id;
      const d = s.decision;
      const said = d ? (d.expired ? "expired" : (d.approved ? "approved" : "denied")) + (d.by ? " by " + d.by : "")
        + (d.at_ms ? " at " + new Date(d.at_ms).toLocaleString() : "") + (d.reason ? ": " + d.reason : "") : "waiting for a decision";
      item.append(el("span", { className: "kind", textContent: "approval" }),
        el("strong", { className: "tool", textContent: s.name }), " ",
        el("span", { className: "decision", textContent: said }),
        el("pre", { className: "arguments", textContent: C.json(s.arguments) }));
    },
    error: (item, s) => item.append(el("span", { className: "kind", textContent: "error" }),
      el("span", { className: "error-type", textContent: s.type }), ": ", el("span", { className: "error-message", textContent: s.message })),
    handoff: (item, s) => {
      item.dataset.callId = s.call_id;
      item.append(el("span", { className: "kind", textContent: "handoff" }),
        el("span", { className: "agents", textContent: (s.from_agent || "?") + " → " + s.to_agent }),
        el("span", { className: "muted", textContent: " (" + s.call_id + ")" }));
    },
    event: (item, s) => item.append(el("span", { className: "kind", textContent: s.type || s.kind }),
      el("span", { className: "muted", textContent: JSON.stringify(s.data || {}) })),
  };
})();
