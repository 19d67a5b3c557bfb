// microagent's browser view: one lane per agent, fed by the API's own SSE stream.
//
// It uses only the public API: GET /v1/models and POST /v1/chat/completions with
// stream: true, `agents` and `collaboration`. Every chunk's `collaboration_event`
// drives the lanes; the final chunk's `collaboration` object gives the answer, the
// token accounting and the timeline. No framework, no network but this server.
"use strict";

const $ = (id) => document.getElementById(id);
const DEFAULT_AGENT = { vote: "voter", debate: "debater", reflect: "worker", aggregate: "proposer" };
const KEY_STORE = "microagent.api_key";

const view = {
  lanes: new Map(),     // agent name -> lane record
  spans: [],            // timeline: {agent, label, start, end, finish}
  ticks: [],            // timeline: {agent, time, kind}
  votes: {},
  events: 0,
  started: 0,
  timer: null,
  controller: null,
  answer: "",
};

// -- the API ------------------------------------------------------------------------------

function headers() {
  const h = { "content-type": "application/json" };
  const key = sessionStorage.getItem(KEY_STORE);
  if (key) h.authorization = "Bearer " + key;
  return h;
}

async function loadModels() {
  const server = $("server");
  let response;
  try {
    response = await fetch("/v1/models", { headers: headers() });
  } catch (err) {
    server.textContent = "server unreachable";
    server.className = "server-status down";
    return;
  }
  if (response.status === 401) {
    $("key-row").hidden = false;
    server.textContent = "API key needed";
    server.className = "server-status down";
    return;
  }
  const body = await response.json();
  const select = $("model");
  const previous = select.value;
  select.replaceChildren();
  for (const model of body.data || []) {
    const option = document.createElement("option");
    option.value = option.textContent = model.id;
    select.append(option);
  }
  if (previous) select.value = previous;
  server.textContent = (body.data || []).map((m) => m.id).join(", ") || "no models";
  server.className = "server-status ok";
}

function requestBody() {
  const mode = $("mode").value;
  const messages = [];
  const context = $("context").value;
  if (context.trim()) messages.push({ role: "system", content: context });
  messages.push({ role: "user", content: $("question").value });
  const collaboration = { mode, early_stop: $("early-stop").checked };
  const choices = $("choices").value.split(",").map((c) => c.trim()).filter(Boolean);
  if (choices.length && mode === "vote") collaboration.answer = { choices };
  const tools = $("tools").value.split(",").map((t) => t.trim()).filter(Boolean);
  if (tools.length) {
    collaboration.tools = tools;
    if ($("tools-required").checked) collaboration.tool_choice = "required";
  }
  const rounds = parseInt($("rounds").value, 10);
  if (rounds > 0 && (mode === "debate" || mode === "reflect")) collaboration.rounds = rounds;
  const body = {
    model: $("model").value || undefined,
    messages,
    stream: true,
    stream_options: { include_usage: true },
    agents: readAgents(),
    collaboration,
  };
  const maxTokens = parseInt($("max-tokens").value, 10);
  if (maxTokens > 0) body.max_tokens = maxTokens;
  return body;
}

async function run(event) {
  event.preventDefault();
  resetView();
  if (!$("question").value.trim()) {
    fail("Type a question first: the agents answer it.");
    $("question").focus();
    return;
  }
  const body = requestBody();
  $("mode-label").textContent = body.collaboration.mode;
  setState("running", "running");
  view.controller = new AbortController();
  $("run").disabled = true;
  $("stop").disabled = false;
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers(),
      body: JSON.stringify(body),
      signal: view.controller.signal,
    });
    if (!response.ok) {
      const error = await response.json().catch(() => ({}));
      if (response.status === 401) $("key-row").hidden = false;
      fail((error.error && error.error.message) || "HTTP " + response.status);
      return;
    }
    await readStream(response.body);
    if ($("state").classList.contains("running")) setState("done", "done");
  } catch (err) {
    if (err.name === "AbortError") setState("stopped", "stopped");
    else fail(String(err));
  } finally {
    finishRun();
  }
}

async function readStream(stream) {
  const reader = stream.getReader();
  const decoder = new TextDecoder();
  let pending = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    pending += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = pending.indexOf("\n\n")) >= 0) {
      const frame = pending.slice(0, cut);
      pending = pending.slice(cut + 2);
      const data = frame.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
      if (!data || data === "[DONE]") continue;
      onChunk(JSON.parse(data));
    }
  }
}

function onChunk(chunk) {
  if (chunk.error) {
    fail(chunk.error.message || JSON.stringify(chunk.error));
    return;
  }
  if (chunk.collaboration_event) onEvent(chunk.collaboration_event);
  const choice = (chunk.choices || [])[0];
  if (choice && choice.delta && choice.delta.content) {
    view.answer += choice.delta.content;
    showAnswer(view.answer);
  }
  if (chunk.collaboration) onOutcome(chunk.collaboration);
  if (chunk.usage) showUsage(chunk.usage);
}

// -- events -> lanes ------------------------------------------------------------------------

function onEvent(ev) {
  view.events += 1;
  $("event-count").textContent = "(" + view.events + ")";
  if (ev.type !== "delta") logEvent(ev);
  const lane = ev.agent ? laneFor(ev.agent) : null;
  switch (ev.type) {
    case "agent_started":
      if (ev.role) lane.role.textContent = ev.role;
      if (!lane.pruned) setLane(lane, "running", ev.label || "running");
      startTurn(lane, ev);
      view.spans.push({ agent: ev.agent, label: ev.label || "", start: ev.time, end: null, finish: null });
      break;
    case "delta":
      appendText(lane, ev.text || "");
      break;
    case "agent_finished": {
      lane.prompt += ev.prompt_tokens || 0;
      lane.cached += ev.cached_tokens || 0;
      lane.completion += ev.completion_tokens || 0;
      lane.turns += 1;
      showTokens(lane);
      const reason = ev.finish_reason || "stop";
      closeSpan(ev.agent, ev.time, reason);
      if (reason === "pruned") prune(lane, "pruned");
      else if (reason === "error") {
        setLane(lane, "error", "error");
        note(lane, ev.error || "error", "note");
      } else if (!lane.pruned) setLane(lane, "done", lane.answer ? "✓ " + lane.answer : "done");
      break;
    }
    case "vote":
      if (ev.votes) view.votes = ev.votes;
      showVotes();
      if (lane && ev.answer != null) {
        lane.answer = String(ev.answer);
        lane.answerTag.textContent = "voted " + lane.answer;
        if (lane.pruned) unprune(lane);  // its answer arrived before the prune: it counts
        if (!lane.pruned) setLane(lane, "done", "✓ " + lane.answer);
        view.ticks.push({ agent: ev.agent, time: ev.time, kind: "vote" });
      }
      break;
    case "pruned":
      prune(lane, ev.reason ? "pruned · " + ev.reason.replace("_", " ") : "pruned");
      closeSpan(ev.agent, ev.time, "pruned");
      break;
    case "round":
      $("round").textContent = "round " + ev.round;
      for (const [name, answer] of Object.entries(ev.answers || {})) {
        const other = laneFor(name);
        other.answerTag.textContent = "round " + ev.round + ": " + answer;
      }
      break;
    case "tool_call":
      note(lane, "⚙ " + ev.name + "(" + (ev.arguments || "") + ")", "tool");
      break;
    case "tool_result":
      note(
        lane,
        "→ " + (ev.output || "") + "  (" + (ev.ok ? "ok" : "error") + ", " +
          Math.round((ev.duration || 0) * 1000) + " ms)",
        ev.ok ? "tool" : "note",
      );
      view.ticks.push({ agent: ev.agent, time: ev.time, kind: "tool" });
      break;
    case "final":
      if (typeof ev.answer === "string" && !view.answer) showAnswer(ev.answer);
      if (ev.usage) showUsage(ev.usage);
      break;
    default:
      if (lane) {
        const detail = Object.entries(ev)
          .filter(([k]) => !["type", "agent", "time"].includes(k))
          .map(([k, v]) => k + "=" + (typeof v === "object" ? JSON.stringify(v) : v))
          .join(" ");
        note(lane, ev.type + " " + detail, ev.type.startsWith("tool") ? "tool" : "note");
      }
  }
}

function laneFor(name) {
  let lane = view.lanes.get(name);
  if (lane) return lane;
  $("empty").hidden = true;
  const el = document.createElement("article");
  el.className = "lane waiting";
  el.dataset.agent = name;
  const head = document.createElement("div");
  head.className = "lane-head";
  const title = document.createElement("span");
  title.className = "lane-name";
  title.textContent = name;
  const role = document.createElement("span");
  role.className = "lane-role";
  const badge = document.createElement("span");
  badge.className = "badge waiting";
  badge.textContent = "waiting";
  head.append(title, role, badge);
  const meta = document.createElement("div");
  meta.className = "lane-meta";
  const tokens = document.createElement("span");
  tokens.className = "tokens";
  const answerTag = document.createElement("span");
  answerTag.className = "answer-tag";
  meta.append(tokens, answerTag);
  const text = document.createElement("div");
  text.className = "text";
  el.append(head, meta, text);
  $("lanes").append(el);
  lane = { name, el, role, badge, tokens, answerTag, text, current: null,
           prompt: 0, cached: 0, completion: 0, turns: 0, pruned: false, answer: null };
  view.lanes.set(name, lane);
  return lane;
}

function setLane(lane, state, label) {
  lane.el.classList.remove("waiting", "running", "done", "error", "pruned");
  lane.el.classList.add(state);
  lane.badge.className = "badge " + state;
  lane.badge.textContent = label;
}

function prune(lane, label) {
  if (!lane) return;
  lane.pruned = true;
  setLane(lane, "pruned", label);
}

function unprune(lane) {
  lane.pruned = false;
  setLane(lane, "done", lane.answer ? "✓ " + lane.answer : "done");
}

function startTurn(lane, ev) {
  const tag = document.createElement("span");
  tag.className = "turn";
  tag.textContent = "— " + (ev.label || "turn") + (ev.round ? " · round " + ev.round : "") + " —";
  const body = document.createElement("span");
  lane.text.append(tag, body);
  lane.current = body;
}

function appendText(lane, text) {
  if (!lane.current) startTurn(lane, {});
  lane.current.textContent += text;
  lane.text.scrollTop = lane.text.scrollHeight;
}

function note(lane, text, kind) {
  const line = document.createElement("span");
  line.className = kind;
  line.textContent = text;
  lane.text.append(line);
}

function showTokens(lane) {
  lane.tokens.textContent =
    lane.prompt + " prompt · " + lane.cached + " cached · " + lane.completion + " generated";
}

function closeSpan(agent, time, finish) {
  for (let i = view.spans.length - 1; i >= 0; i--) {
    const span = view.spans[i];
    if (span.agent === agent && span.end === null) {
      span.end = time;
      span.finish = finish;
      return;
    }
  }
}

function showVotes() {
  const box = $("votes");
  box.hidden = false;
  box.replaceChildren();
  const title = document.createElement("span");
  title.className = "title";
  title.textContent = "votes";
  box.append(title);
  const entries = Object.entries(view.votes).sort((a, b) => b[1] - a[1]);
  const total = entries.reduce((n, [, c]) => n + c, 0) || 1;
  entries.forEach(([choice, count], i) => {
    const item = document.createElement("span");
    item.className = "vote" + (i === 0 ? " leader" : "");
    item.dataset.choice = choice;
    const label = document.createElement("b");
    label.textContent = choice;
    const bar = document.createElement("span");
    bar.className = "bar";
    bar.style.width = Math.round(120 * count / total) + "px";
    const n = document.createElement("span");
    n.className = "count";
    n.textContent = count;
    item.append(label, bar, n);
    box.append(item);
  });
}

function logEvent(ev) {
  const li = document.createElement("li");
  const time = typeof ev.time === "number" ? ev.time.toFixed(3) + "s " : "";
  const who = ev.agent ? " " + ev.agent : "";
  const b = document.createElement("b");
  b.textContent = ev.type + who;
  const skip = ["type", "agent", "time", "text", "sent_at", "submitted", "first_token", "finished", "request_id"];
  const rest = Object.entries(ev).filter(([k, v]) => !skip.includes(k) && v !== null)
    .map(([k, v]) => k + "=" + (typeof v === "object" ? JSON.stringify(v) : v)).join(" ");
  li.append(time, b, " " + rest);
  $("events").append(li);
}

// -- the outcome ------------------------------------------------------------------------------

function onOutcome(outcome) {
  showAnswer(outcome.answer || view.answer);
  const pruned = new Set(outcome.pruned || []);
  for (const agent of outcome.agents || []) {
    const lane = laneFor(agent.name);
    if (pruned.has(agent.name) || agent.finish_reason === "pruned") {
      if (!lane.pruned) prune(lane, "pruned");
    }
    else if (agent.finish_reason === "error") setLane(lane, "error", "error");
    else setLane(lane, "done", agent.answer ? "✓ " + agent.answer : "done");
    lane.pruned = pruned.has(agent.name) || agent.finish_reason === "pruned";
  }
  if (outcome.usage) showUsage(outcome.usage);
  showAgents(outcome);
  drawTimeline(outcome);
  const early = outcome.early_stopped ? " · stopped early" : "";
  $("round").textContent = "rounds " + outcome.rounds + early;
}

function showAnswer(text) {
  $("result").hidden = false;
  const split = splitVote();
  $("answer").classList.toggle("no-majority", split !== null);
  // a vote whose leaders tie decided nothing: say so rather than announce one of them
  $("answer").textContent = split === null ? text : "No answer won: the votes split " + split + ".";
}

// "1/1/1" when the leading answers of the vote tie (nothing won), else null.
function splitVote() {
  const counts = Object.values(view.votes).sort((a, b) => b - a);
  if (counts.length < 2 || counts[0] !== counts[1]) return null;
  return counts.join("/");
}

function row(table, cells, header, className) {
  const tr = document.createElement("tr");
  if (className) tr.className = className;
  for (const cell of cells) {
    const td = document.createElement(header ? "th" : "td");
    td.textContent = cell;
    tr.append(td);
  }
  table.append(tr);
}

function showUsage(usage) {
  const table = $("usage");
  table.replaceChildren();
  const prompt = usage.prompt_tokens || 0;
  const cached = usage.cached_tokens != null ? usage.cached_tokens
    : (usage.prompt_tokens_details || {}).cached_tokens || 0;
  const completion = usage.completion_tokens || 0;
  const saved = usage.saved_completion_tokens != null ? usage.saved_completion_tokens
    : (usage.completion_tokens_details || {}).saved_completion_tokens;
  row(table, ["prompt tokens", prompt]);
  row(table, ["  computed", prompt - cached]);
  row(table, ["  cached", cached]);
  row(table, ["completion tokens", completion]);
  if (saved != null) row(table, ["  saved by early stop", saved]);
}

function showAgents(outcome) {
  const table = $("agent-table");
  table.replaceChildren();
  row(table, ["agent", "role", "finish", "prompt", "cached", "generated", "answer"], true);
  const pruned = new Set(outcome.pruned || []);
  for (const a of outcome.agents || []) {
    const finish = pruned.has(a.name) ? "pruned" : a.finish_reason;
    row(table, [a.name, a.role, finish, a.prompt_tokens, a.cached_tokens, a.completion_tokens,
                a.answer == null ? "" : a.answer], false, finish === "pruned" ? "pruned" : "");
  }
}

function drawTimeline(outcome) {
  const names = [...view.lanes.keys()];
  const end = Math.max(outcome.wall_time || 0, ...view.spans.map((s) => s.end || s.start || 0), 0.001);
  const left = 110, right = 20, rowH = 22, top = 8;
  const width = Math.max(480, $("timeline").clientWidth || 800);
  const height = top + names.length * rowH + 24;
  const x = (t) => left + (width - left - right) * (t / end);
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", "0 0 " + width + " " + height);
  svg.setAttribute("height", height);
  const add = (tag, attrs, text) => {
    const el = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
    if (text != null) el.textContent = text;
    svg.append(el);
    return el;
  };
  names.forEach((name, i) => {
    const y = top + i * rowH;
    add("text", { x: 4, y: y + 14 }, name);
    add("line", { x1: left, x2: width - right, y1: y + rowH - 2, y2: y + rowH - 2, class: "axis" });
  });
  for (const span of view.spans) {
    const i = names.indexOf(span.agent);
    if (i < 0) continue;
    const stop = span.end == null ? end : span.end;
    const cls = "span " + (span.finish === "pruned" ? "pruned" : span.finish === "error" ? "error"
      : span.label === "answer" ? "answer" : "");
    const rect = add("rect", { x: x(span.start), y: top + i * rowH + 4, rx: 2, height: rowH - 10,
      width: Math.max(2, x(stop) - x(span.start)), class: cls });
    const title = document.createElementNS(ns, "title");
    title.textContent = span.agent + " · " + (span.label || "turn") + " · " +
      span.start.toFixed(3) + "–" + stop.toFixed(3) + " s" + (span.finish ? " · " + span.finish : "");
    rect.append(title);
  }
  for (const tick of view.ticks) {
    const i = names.indexOf(tick.agent);
    if (i < 0) continue;
    add("line", { x1: x(tick.time), x2: x(tick.time), y1: top + i * rowH + 2, y2: top + i * rowH + rowH - 4,
      class: tick.kind === "tool" ? "tick tool-tick" : "tick" });
  }
  const axisY = top + names.length * rowH + 16;
  for (let k = 0; k <= 4; k++) {
    const t = (end * k) / 4;
    add("text", { x: x(t) - (k === 4 ? 30 : 0), y: axisY }, t.toFixed(2) + " s");
  }
  $("timeline").replaceChildren(svg);
}

// -- the form -----------------------------------------------------------------------------------

function agentRow(spec) {
  const row = document.createElement("div");
  row.className = "agent-row";
  const name = document.createElement("input");
  name.className = "agent-name";
  name.value = spec.name;
  name.setAttribute("aria-label", "agent name");
  const count = document.createElement("input");
  count.className = "agent-count";
  count.type = "number";
  count.min = "1";
  count.value = spec.count;
  count.setAttribute("aria-label", "count");
  const role = document.createElement("input");
  role.className = "agent-role";
  role.placeholder = "role (optional)";
  role.value = spec.role || "";
  role.setAttribute("aria-label", "role");
  const remove = document.createElement("button");
  remove.type = "button";
  remove.className = "remove";
  remove.textContent = "×";
  remove.title = "remove";
  remove.addEventListener("click", () => {
    if ($("agents").children.length > 1) row.remove();
  });
  row.append(name, count, role, remove);
  $("agents").append(row);
  return row;
}

function readAgents() {
  return [...$("agents").querySelectorAll(".agent-row")].map((row) => {
    const spec = {
      name: row.querySelector(".agent-name").value.trim() || "agent",
      count: parseInt(row.querySelector(".agent-count").value, 10) || 1,
    };
    const role = row.querySelector(".agent-role").value.trim();
    if (role) spec.role = role;
    return spec;
  });
}

function onModeChange() {
  const mode = $("mode").value;
  const first = $("agents").querySelector(".agent-name");
  if (first && Object.values(DEFAULT_AGENT).includes(first.value)) first.value = DEFAULT_AGENT[mode];
  $("choices-field").hidden = mode !== "vote";
  $("rounds-field").hidden = !(mode === "debate" || mode === "reflect");
}

// -- state ---------------------------------------------------------------------------------------

function resetView() {
  view.lanes.clear();
  view.spans = [];
  view.ticks = [];
  view.votes = {};
  view.events = 0;
  view.answer = "";
  $("lanes").replaceChildren();
  $("events").replaceChildren();
  $("event-count").textContent = "";
  $("votes").hidden = true;
  $("result").hidden = true;
  $("error").hidden = true;
  $("round").textContent = "";
  $("empty").hidden = false;
  view.started = performance.now();
  clearInterval(view.timer);
  view.timer = setInterval(tick, 100);
}

function tick() {
  $("elapsed").textContent = ((performance.now() - view.started) / 1000).toFixed(1) + " s";
}

function setState(cls, text) {
  $("state").className = "state " + cls;
  $("state").textContent = text;
}

function fail(message) {
  setState("failed", "failed");
  $("error").hidden = false;
  $("error").textContent = message;
}

function finishRun() {
  clearInterval(view.timer);
  tick();
  $("run").disabled = false;
  $("stop").disabled = true;
  view.controller = null;
  for (const lane of view.lanes.values()) {
    if (lane.el.classList.contains("running")) setLane(lane, "done", "stopped");
  }
}

function init() {
  agentRow({ name: "voter", count: 3 });
  $("add-agent").addEventListener("click", () => agentRow({ name: "aggregator", count: 1, role: "aggregator" }));
  $("mode").addEventListener("change", onModeChange);
  $("run-form").addEventListener("submit", run);
  $("stop").addEventListener("click", () => view.controller && view.controller.abort());
  const key = $("api-key");
  key.value = sessionStorage.getItem(KEY_STORE) || "";
  key.addEventListener("change", () => {
    sessionStorage.setItem(KEY_STORE, key.value.trim());
    loadModels();
  });
  onModeChange();
  loadModels();
}

init();
