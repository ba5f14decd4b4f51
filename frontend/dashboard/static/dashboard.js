// The vllm-sr Dashboard: reads /api/v1/dashboard every second and renders it; changes
// deployments through the configuration API (plan, then PATCH with If-Match, then follow
// the activation); previews a routing in Router mode. No framework, no build step, and
// nothing fetched from anywhere but this origin (the page's Content-Security-Policy says so).
"use strict";

(() => {
  const KEY_STORE = "vllm-sr-dashboard-key";
  const REFRESH_MS = 1000;
  const READ_TIMEOUT_MS = 5000; // a read not answered by then is a problem shown, not a wait
  let key = sessionStorage.getItem(KEY_STORE) || "";
  let latest = null; // the last document read
  let latestText = null; // its text: an unchanged document is not rendered again
  let reads = 0; // refreshes started, so a change follows only documents read after it
  let change = null; // {summary, patch, basedOn, answer, hash?, after?, done?}
  let scaleEdited = false; // the operator typed a replica count: refreshes keep it
  const $ = (id) => document.getElementById(id);

  // -- small helpers ------------------------------------------------------------------------
  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(props || {})) {
      if (name === "class") node.className = value;
      else if (name.startsWith("data-")) node.setAttribute(name, value);
      else node[name] = value;
    }
    for (const child of children.flat()) {
      if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  function badge(state) {
    return el("span", { class: `badge state-${state}`, "data-state": state }, state);
  }

  function counts(table) {
    const entries = Object.entries(table || {});
    return entries.length ? entries.map(([name, value]) => `${name} ${value}`).join(", ") : "none";
  }

  async function api(method, path, body, extra, timeoutMs) {
    const headers = { ...(extra || {}) };
    if (key) headers.Authorization = `Bearer ${key}`;
    const init = { method, headers, cache: "no-store" };
    if (timeoutMs) init.signal = AbortSignal.timeout(timeoutMs);
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(path, init);
    const text = await response.text();
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch (err) {
      data = { error: { message: text } };
    }
    return { status: response.status, data, text, headers: response.headers };
  }

  function errorText(answer) {
    const error = answer.data && answer.data.error;
    if (!error) return `HTTP ${answer.status}`;
    return `${error.code || answer.status}: ${error.message}`;
  }

  // -- the refresh loop ---------------------------------------------------------------------
  // One read at a time: the next is scheduled once this one ends (answered, refused or
  // timed out), so a slow frontend never has reads piling up.
  async function refresh() {
    const read = ++reads;
    try {
      const answer = await api("GET", "/api/v1/dashboard", undefined, undefined, READ_TIMEOUT_MS);
      if (answer.status === 401) {
        showProblem(`${errorText(answer)}`);
        $("key-form").hidden = false;
      } else if (answer.status !== 200) {
        showProblem(errorText(answer));
      } else {
        $("connection").hidden = true;
        $("key-form").hidden = true;
        if (answer.text !== latestText) {
          latest = answer.data;
          latestText = answer.text;
          render(latest);
        }
        followChange(latest, read);
        $("refreshed").textContent = new Date().toLocaleTimeString();
      }
    } catch (err) {
      const why = err.name === "TimeoutError"
        ? `no answer within ${READ_TIMEOUT_MS / 1000} s` : err.message;
      showProblem(`the frontend does not answer (${why}); retrying every second`);
    }
    setTimeout(refresh, REFRESH_MS);
  }

  function showProblem(text) {
    const shown = latest ? `; what is shown was read at ${$("refreshed").textContent}` : "";
    $("connection").textContent = text + shown;
    $("connection").hidden = false;
  }

  function render(data) {
    const mode = $("mode");
    mode.textContent = data.mode === "router" ? "Router" : "Engine";
    mode.dataset.mode = data.mode;
    $("phase").textContent = data.message ? `${data.phase}: ${data.message}` : data.phase;
    $("version").textContent = data.version;
    $("config-hash").textContent = data.config.source_config_hash;
    $("config-version").textContent = data.config.config_version;
    $("activation").replaceChildren(activation(data.config));
    renderDeployments(data);
    renderFigures(data);
    renderRouting(data);
    renderListeners(data);
    renderChoices(data);
  }

  function activation(config) {
    const status = config.activation_status;
    const parts = [badge(status)];
    if (config.activation) {
      const a = config.activation;
      parts.push(` config version ${a.config_version}, started ${a.started_at}`);
      if (a.finished_at) parts.push(`, finished ${a.finished_at}`);
    }
    if (status === "failed" && config.last_rejection) {
      parts.push(el("span", { class: "problem" }, ` ${config.last_rejection.error}`));
    }
    return el("span", {}, parts);
  }

  // -- deployments --------------------------------------------------------------------------
  function renderDeployments(data) {
    const sections = data.deployments.map((d) => {
      const heads = (d.heads || []).map((h) =>
        el("li", {}, `${h.name} (${h.kind})`, h.labels && h.labels.length
          ? el("span", { class: "labels" }, `: ${h.labels.join(", ")}`) : null));
      const published = (d.published || []).map((p) => `${p.listener} (${p.grant})`).join(", ");
      const rows = (d.replicas || []).map((r) =>
        el("tr", { "data-replica": r.id, "data-state": r.state },
          el("td", {}, el("code", {}, r.id)),
          el("td", { class: "state" }, badge(r.state)),
          el("td", {}, r.reason || ""),
          el("td", { class: "inflight" }, r.inflight),
          el("td", { class: "restarts" }, r.restarts),
          el("td", {}, r.device || "")));
      const preparing = d.generation === "preparing";
      return el("div", { class: "deployment", "data-deployment": d.name, "data-generation": d.generation },
        el("h3", {}, d.name, " ", badge(preparing ? "preparing" : d.state),
          el("span", { class: "ready-count" }, ` ${d.ready_replicas}/${d.desired_replicas} ready`),
          preparing ? el("span", { class: "note" }, " (the next configuration, starting while the current one serves)") : null),
        el("p", { class: "facts" },
          `${d.artifact || d.repo || "attached"}${d.revision ? "@" + d.revision.slice(0, 12) : ""}`,
          ` · profile ${d.profile || "?"} · device ${d.device || "?"} · ${d.family || "?"} on ${d.engine || "?"}`,
          d.public_id ? ` · public id ${d.public_id}` : "",
          published ? ` · published on ${published}` : " · not published",
          d.bound && d.bound.length ? ` · bound as ${d.bound.join(", ")}` : "",
          d.editable ? "" : " · not in the saved configuration (set by the serve command line or a default): not changed from here"),
        d.reason ? el("p", { class: preparing ? "note" : "problem" }, d.reason) : null,
        heads.length ? el("ul", { class: "heads" }, heads) : null,
        el("table", { class: "replicas" },
          el("thead", {}, el("tr", {}, ["Replica", "State", "Reason", "In flight", "Restarts", "Device"].map((h) => el("th", {}, h)))),
          el("tbody", {}, rows)));
    });
    $("deployments").replaceChildren(...(sections.length ? sections : [el("p", { class: "note" }, "No deployment is in use.")]));
    const declared = data.declared || [];
    const savedOnly = data.saved_only || [];
    $("declared").replaceChildren(
      declared.length
        ? el("p", { class: "note" }, "Declared, not in use (no consumer or grant uses them, so no worker runs): ",
          declared.map((d) => `${d.name} (${d.artifact || "attached"})`).join(", "))
        : "",
      savedOnly.length
        ? el("p", { class: "problem", id: "saved-only" },
          `In the saved configuration but not serving: ${savedOnly.join(", ")}. `,
          data.config.activation_status === "failed"
            ? "The last change failed: the previous configuration keeps serving, and a restart would start the saved one. Remove or fix what failed, or apply a backup (config.yaml.backups/)."
            : "It is being activated, or was never activated.")
        : "");
  }

  function renderFigures(data) {
    const rows = Object.entries(data.figures || {}).sort().map(([name, f]) =>
      el("tr", { "data-deployment": name },
        el("td", {}, name),
        el("td", { class: "ready" }, f.ready === 1 ? "yes" : "no"),
        el("td", { class: "restarts" }, f.restarts ?? 0),
        el("td", { class: "requests" }, counts(f.requests)),
        el("td", { class: "unknown" }, counts(f.unknown_answers))));
    $("figures").tBodies[0].replaceChildren(...rows);
  }

  function renderRouting(data) {
    const routing = data.routing;
    $("routing-section").hidden = !routing;
    if (!routing) return;
    $("decisions").tBodies[0].replaceChildren(...routing.decisions.map((d) =>
      el("tr", { "data-decision": d.name },
        el("td", {}, d.name), el("td", {}, d.priority),
        el("td", {}, el("code", {}, d.conditions)),
        el("td", {}, d.models.length ? d.models.join(", ")
          : d.plugins.includes("fast_response") ? "none: answered by its fast_response, no backend"
          : `none listed: the default model (${data.default_model || "unset"})`))));
    $("signals").tBodies[0].replaceChildren(...routing.signals.map((s) =>
      el("tr", { "data-signal": `${s.kind}:${s.name}` },
        el("td", {}, s.kind), el("td", {}, s.name),
        el("td", {}, s.deployment || "the router itself"))));
  }

  function renderListeners(data) {
    $("listeners").tBodies[0].replaceChildren(...data.listeners.map((l) =>
      el("tr", { "data-listener": l.name },
        el("td", {}, l.name), el("td", {}, `${l.address}:${l.port}`),
        el("td", {}, l.api_keys ? `${l.api_keys} (hidden)` : "none: open"),
        el("td", {}, l.runtime.join(", ")), el("td", {}, l.systemone.join(", ")),
        el("td", {}, l.models.length ? l.models.join(", ")
          : data.mode === "router" ? "every model (no allow-list)" : "none: Chat is off in Engine mode"))));
  }

  // The selects keep what the operator picked across refreshes.
  function fill(select, values) {
    const picked = select.value;
    const same = select.options.length === values.length &&
      values.every((v, i) => select.options[i].value === v);
    if (!same) select.replaceChildren(...values.map((v) => el("option", { value: v }, v)));
    if (values.includes(picked)) select.value = picked;
  }

  function renderChoices(data) {
    const active = data.deployments.filter((d) => d.generation === "active");
    fill($("scale-deployment"), active.filter((d) => d.scalable).map((d) => d.name));
    fill($("remove-deployment"), [
      ...active.filter((d) => d.editable).map((d) => d.name),
      ...(data.declared || []).filter((d) => d.editable).map((d) => d.name),
      ...(data.saved_only || []),
    ]);
    const scaling = $("scale-deployment");
    const picked = active.find((d) => d.name === scaling.value);
    if (picked && !scaleEdited) $("scale-replicas").value = picked.desired_replicas;
    fill($("add-listener"), data.listeners.map((l) => l.name));
  }

  // -- changes ------------------------------------------------------------------------------
  // The saved document and its ETag: a change built from it is applied only onto it.
  async function savedDocument() {
    const answer = await api("GET", "/api/v1/config");
    if (answer.status !== 200) throw new Error(errorText(answer));
    return { doc: answer.data, etag: answer.headers.get("ETag") };
  }

  function deploymentsOf(doc) {
    return ((doc.global || {}).model_catalog || {}).deployments || {};
  }

  function catalogPatch(deployments) {
    return { global: { model_catalog: { deployments } } };
  }

  // A listener list with public_id added to (or removed from) a grant. The keys it was read
  // with are placeholders; the configuration API puts the saved ones back.
  function regranted(doc, edit) {
    return (doc.listeners || []).map((listener) => {
      const copy = JSON.parse(JSON.stringify(listener));
      edit(copy);
      return copy;
    });
  }

  // A replica count the configuration takes: a whole number from 1 to 64 (MAX_REPLICAS).
  function replicaCount(input) {
    const count = Number(input.value);
    if (!Number.isInteger(count) || count < 1 || count > 64) {
      throw new Error(`replicas must be a whole number from 1 to 64, not "${input.value}"`);
    }
    return count;
  }

  async function planScale(event) {
    event.preventDefault();
    const name = $("scale-deployment").value;
    const count = replicaCount($("scale-replicas"));
    if (!name) throw new Error("no managed deployment to scale");
    const { doc, etag } = await savedDocument();
    const saved = deploymentsOf(doc)[name];
    if (!saved) return showChange({ summary: `${name} is not in the saved configuration` });
    const placements = saved.replicas && saved.replicas.length
      ? saved.replicas : [saved.device ? { device: saved.device } : {}];
    const replicas = Array.from({ length: count }, (_, i) => placements[Math.min(i, placements.length - 1)]);
    const patch = catalogPatch({ [name]: { device: null, replicas } });
    await plan(`Scale ${name} to ${count} replica${count === 1 ? "" : "s"}`, patch, etag);
  }

  async function planAdd(event) {
    event.preventDefault();
    const name = $("add-name").value.trim();
    const deployment = { provider: "model_runtime", artifact: $("add-artifact").value.trim(), profile: $("add-profile").value };
    const revision = $("add-revision").value.trim();
    const publicName = $("add-public-name").value.trim();
    const device = $("add-device").value.trim() || "auto";
    const count = replicaCount($("add-replicas"));
    if (revision) deployment.revision = revision;
    if (publicName) deployment.public_name = publicName;
    if (count > 1) deployment.replicas = Array.from({ length: count }, () => ({ device }));
    else deployment.device = device;
    const publicId = publicName || deployment.artifact;
    const listener = $("add-listener").value;
    const grant = $("add-grant").value;
    const { doc, etag } = await savedDocument();
    if (deploymentsOf(doc)[name]) { // a merge would rewrite it, not add one
      return showChange({ summary: `${name} is already a deployment: give the new one another `
        + "name (Scale and Remove change the existing one)" });
    }
    const patch = catalogPatch({ [name]: deployment });
    patch.listeners = regranted(doc, (l) => {
      if (l.name !== listener) return;
      l[grant] = l[grant] || {};
      const models = l[grant].models || [];
      if (!models.includes(publicId)) models.push(publicId);
      l[grant].models = models;
    });
    await plan(`Add ${name} (${deployment.artifact}) and publish ${publicId} on ${listener}'s ${grant} grant`, patch, etag);
  }

  async function planRemove(event) {
    event.preventDefault();
    const name = $("remove-deployment").value;
    if (!name) throw new Error("no deployment to remove");
    const { doc, etag } = await savedDocument();
    // Its public id as the saved document gives it (public_name, else a Hub artifact), so a
    // deployment that never served (a failed change) loses its grants too.
    const saved = deploymentsOf(doc)[name] || {};
    const artifact = typeof saved.artifact === "string" ? saved.artifact : "";
    const publicId = saved.public_name || (artifact && !artifact.startsWith("/") ? artifact : null);
    const patch = catalogPatch({ [name]: null });
    if (publicId) {
      patch.listeners = regranted(doc, (l) => {
        for (const grant of ["runtime", "systemone"]) {
          if (l[grant] && l[grant].models) l[grant].models = l[grant].models.filter((m) => m !== publicId);
        }
      });
    }
    await plan(`Remove ${name}${publicId ? ` and its grants of ${publicId}` : ""}`, patch, etag);
  }

  // basedOn: the ETag of the document the patch was built from (its listeners are written
  // whole): the plan must be of that document, and the apply is sent with it as If-Match.
  async function plan(summary, patch, basedOn) {
    const answer = await api("POST", "/api/v1/config/plan", { yaml: JSON.stringify(patch), mode: "merge" });
    showChange({ summary, patch, basedOn, answer });
  }

  function showChange(next) {
    change = next;
    $("change").hidden = false;
    $("change-summary").textContent = next.summary;
    $("change-patch").textContent = next.patch ? JSON.stringify(next.patch, null, 2) : "";
    const reasons = [];
    let planText = "";
    let applicable = false;
    if (next.answer) {
      const a = next.answer;
      if (a.status === 200) {
        const p = a.data;
        planText = `Plan: valid${p.changed ? ", changes the configuration" : ", changes nothing"}` +
          (p.restart_required ? "; needs a restart (not applied from here)" : "");
        for (const w of p.warnings || []) reasons.push(`warning: ${w}`);
        for (const r of p.reasons || []) reasons.push(r.message);
        applicable = p.changed && !p.restart_required;
        if (next.basedOn && p.current_etag !== next.basedOn) {
          planText += "; the configuration changed while this was planned: plan again";
          applicable = false;
        }
      } else {
        planText = `Plan refused: ${errorText(a)}`;
        for (const r of (a.data && a.data.error && a.data.error.reasons) || []) reasons.push(r.message);
      }
    }
    $("change-plan").textContent = planText;
    $("change-reasons").replaceChildren(...reasons.map((r) => el("li", {}, r)));
    $("change-apply").disabled = !applicable;
    setStatus("", "");
  }

  function setStatus(text, kind) {
    const status = $("change-status");
    status.textContent = text;
    status.className = kind;
    status.dataset.status = kind;
  }

  async function apply() {
    if (!change || !change.answer || change.answer.status !== 200) return;
    $("change-apply").disabled = true;
    setStatus("Applying…", "pending");
    const applying = change;
    const answer = await api("PATCH", "/api/v1/config", { yaml: JSON.stringify(change.patch) },
      { "If-Match": change.basedOn || change.answer.data.current_etag });
    if (change !== applying) return; // discarded or replaced meanwhile: its outcome is not shown
    const body = answer.data || {};
    if (answer.status === 200 || answer.status === 202) {
      change.version = body.config_version;
      change.hash = body.generated_runtime_hash;
      change.after = reads; // documents of reads started from now on tell how it ends
      setStatus(answer.status === 200 ? "active" : "pending: the new workers are starting while the old ones serve",
        answer.status === 200 ? "active" : "pending");
      if (answer.status === 200) change.done = true;
    } else if (answer.status === 503) {
      change.done = true;
      setStatus(`failed: ${(body.last_rejection && body.last_rejection.error) || body.message}; the previous configuration keeps serving`, "failed");
    } else if (answer.status === 412) {
      change.done = true;
      setStatus(`refused: ${errorText(answer)} (someone else changed the configuration since `
        + "this was planned; plan the change again)", "failed");
    } else {
      setStatus(`refused: ${errorText(answer)}`, "failed");
      $("change-apply").disabled = false;
    }
  }

  // While an applied change is pending, the document's activation says how it ends (only
  // a document read after the apply answered: an older one does not know of it).
  function followChange(data, read) {
    if (!change || change.done || !change.hash || read <= change.after) return;
    const config = data.config;
    if (config.generated_runtime_hash !== change.hash) {
      change.done = true;
      setStatus("superseded: another change was applied after this one; the activation above "
        + "is the configuration's", "failed");
      return;
    }
    if (config.activation_status === "active") {
      change.done = true;
      setStatus("active", "active");
    } else if (config.activation_status === "failed") {
      change.done = true;
      const why = config.last_rejection ? config.last_rejection.error : "see /api/v1/config/hash";
      setStatus(`failed: ${why}; the previous configuration keeps serving`, "failed");
    }
  }

  // -- the routing preview --------------------------------------------------------------------
  async function preview(event) {
    event.preventDefault();
    const answer = await api("POST", "/api/v1/routing/preview", { text: $("preview-text").value });
    const problem = $("preview-problem");
    if (answer.status !== 200 && !(answer.status === 503 && answer.data && answer.data.decision_result)) {
      $("preview-result").hidden = true;
      problem.textContent = errorText(answer);
      problem.hidden = false;
      return;
    }
    problem.hidden = true;
    const body = answer.data;
    const result = body.decision_result || {};
    $("preview-decision").textContent = result.decision_name || "none (the default model)";
    $("preview-model").textContent = `${body.selected_model || ""} (${body.selection_status || ""})`;
    const matched = Object.entries(result.matched_signals || {}).map(([kind, names]) => `${kind}: ${names.join(", ")}`);
    $("preview-matched").textContent = matched.length ? matched.join("; ") : "none";
    const errors = Object.entries(body.signal_errors || {}).map(([signal, why]) => `${signal}: ${why}`);
    $("preview-errors").textContent = errors.length ? errors.join("; ") : "none";
    $("preview-result").hidden = false;
  }

  // A new plan replaces the one shown at once, so nothing stale can be applied.
  function guarded(handler) {
    return (event) => {
      showChange({ summary: "Planning…" });
      handler(event).catch((err) => showChange({ summary: `Could not plan: ${err.message}` }));
    };
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("scale-form").addEventListener("submit", guarded(planScale));
    $("scale-replicas").addEventListener("input", () => { scaleEdited = true; });
    $("scale-deployment").addEventListener("change", () => {
      scaleEdited = false;
      if (latest) renderChoices(latest);
    });
    $("add-form").addEventListener("submit", guarded(planAdd));
    $("remove-form").addEventListener("submit", guarded(planRemove));
    $("change-apply").addEventListener("click", () => apply().catch((err) => setStatus(`failed: ${err.message}`, "failed")));
    $("change-discard").addEventListener("click", () => { change = null; $("change").hidden = true; });
    $("preview-form").addEventListener("submit", (event) => preview(event).catch((err) => {
      $("preview-problem").textContent = err.message;
      $("preview-problem").hidden = false;
    }));
    $("key-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const given = $("key").value.trim();
      try {
        new Headers({ Authorization: `Bearer ${given}` }); // what a request header can carry
      } catch (err) {
        showProblem("this key cannot be sent in a request header (a character outside "
          + "Latin-1, or a line break); check what was pasted");
        return;
      }
      key = given;
      sessionStorage.setItem(KEY_STORE, key);
    });
    refresh();
  });
})();
